package desired

import (
	"sort"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
)

// LabelDataplaneMode enrols a pod, or every pod of a namespace, in Istio's
// ambient mode ("ambient"); "none" on a pod opts it out.
const LabelDataplaneMode = "istio.io/dataplane-mode"

// MeshContext is what the mesh around the Service says about how its
// traffic may be routed: who may see it, the user's own traffic policy,
// and how its pods are enrolled.
type MeshContext struct {
	// DefaultExportTo is the mesh's defaultServiceExportTo (the manager's
	// --default-export-to); nil means Istio's default, "*".
	DefaultExportTo []string
	// Namespace is the Service's namespace (its labels tell ambient
	// enrolment); nil when unknown.
	Namespace *corev1.Namespace
	// DestinationRules are the DestinationRules of the Service's namespace
	// (the operator's own are skipped); the user's rule for the Kubernetes
	// host is carried over to the optimized host.
	DestinationRules []*istionet.DestinationRule
	// MultiCluster: the mesh's other clusters (multicluster.go).
	MultiCluster MultiCluster
}

// ambientPods names the ready pods enrolled in ambient mode: they have no
// sidecar; their traffic is weighted only through a waypoint (ambient.go).
func ambientPods(in Input, eps []Endpoint) []string {
	nsAmbient := in.Mesh.Namespace != nil && in.Mesh.Namespace.Labels[LabelDataplaneMode] == "ambient"
	var out []string
	for _, ep := range eps {
		if ep.Sidecar {
			continue // a sidecar always wins over ambient enrolment
		}
		mode := ""
		if pod := in.Pods[ep.Pod]; pod != nil {
			mode = pod.Labels[LabelDataplaneMode]
		}
		if mode == "ambient" || (nsAmbient && mode != "none") {
			out = append(out, ep.Pod)
		}
	}
	sort.Strings(out)
	return out
}

// meshProblems are the refusals that come from the mesh around the
// Service; each is Fatal.
func meshProblems(in Input, r *Result) []Problem {
	var out []Problem
	var p *Problem
	if r.ExportTo, p = exportTo(in.Service, in.Mesh.DefaultExportTo); p != nil {
		out = append(out, *p)
	}
	if p := ambientProblem(in, r.Endpoints); p != nil {
		out = append(out, *p)
	}
	if p := multiClusterProblem(in); p != nil {
		out = append(out, *p)
	}
	return out
}

// scope gives the owned objects the Service's export scope.
func scope(r *Result) {
	if r.ServiceEntry != nil {
		r.ServiceEntry.Spec.ExportTo = append([]string(nil), r.ExportTo...)
	}
	if r.DestinationRule != nil {
		r.DestinationRule.Spec.ExportTo = append([]string(nil), r.ExportTo...)
	}
	if r.VirtualService != nil {
		r.VirtualService.Spec.ExportTo = append([]string(nil), r.ExportTo...)
	}
}
