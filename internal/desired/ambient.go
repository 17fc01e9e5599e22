package desired

import (
	"fmt"
	"sort"
	"strings"
)

const (
	// LabelUseWaypoint binds a Service (or every Service of a namespace) to a
	// waypoint proxy: in ambient mode the waypoint then handles the
	// Service's L7 traffic, routing included. "none" on a Service opts it
	// out of its namespace's waypoint.
	LabelUseWaypoint = "istio.io/use-waypoint"
	// LabelUseWaypointNamespace names the waypoint's namespace when it is
	// not the Service's.
	LabelUseWaypointNamespace = "istio.io/use-waypoint-namespace"
	// LabelTunnel on an endpoint says it accepts Istio's HBONE tunnel
	// ("http"): ambient pods do, through their node's ztunnel.
	LabelTunnel = "networking.istio.io/tunnel"

	// ReasonAmbientWaypointRequired: ambient pods without a waypoint.
	ReasonAmbientWaypointRequired = "AmbientWaypointRequired"
)

// Waypoint is the waypoint proxy that serves a Service.
type Waypoint struct {
	Name, Namespace string
	// From says where the binding was found, for messages.
	From string
}

// waypointFor is the waypoint bound to the Service: the Service's
// istio.io/use-waypoint, else its namespace's (as istiod resolves it); nil
// without one or when the Service opts out with "none".
func waypointFor(in Input) *Waypoint {
	from := func(labels map[string]string, where string) *Waypoint {
		name := labels[LabelUseWaypoint]
		if name == "" || name == "none" {
			return nil
		}
		ns := labels[LabelUseWaypointNamespace]
		if ns == "" {
			ns = in.Optimizer.TargetNamespace()
		}
		return &Waypoint{Name: name, Namespace: ns, From: where}
	}
	if in.Service != nil {
		if v, ok := in.Service.Labels[LabelUseWaypoint]; ok {
			if v == "none" {
				return nil
			}
			return from(in.Service.Labels, "Service "+in.Service.Name)
		}
	}
	if in.Mesh.Namespace != nil {
		return from(in.Mesh.Namespace.Labels, "namespace "+in.Mesh.Namespace.Name)
	}
	return nil
}

// ambientProblem: ambient pods are routed through their waypoint, and only
// through it. The mesh's traffic for the Kubernetes host then reaches the
// waypoint, whose route istiod builds from the operator's VirtualService
// (to the optimized host's cluster, with the ServiceEntry's weights and
// the DestinationRule's policy; test/conformance/ambient_test.go). Without
// a waypoint nothing in ambient mode applies L7 routing or weights to
// traffic that ztunnel carries, so the optimizer refuses and says how to
// add one.
func ambientProblem(in Input, eps []Endpoint) *Problem {
	pods := ambientPods(in, eps)
	if len(pods) == 0 || waypointFor(in) != nil {
		return nil
	}
	where := fmt.Sprintf("label %s=ambient on the pods", LabelDataplaneMode)
	if in.Mesh.Namespace != nil && in.Mesh.Namespace.Labels[LabelDataplaneMode] == "ambient" {
		where = fmt.Sprintf("namespace %s is labelled %s=ambient", in.Mesh.Namespace.Name, LabelDataplaneMode)
	}
	shown := pods
	if len(shown) > 5 {
		shown = append(append([]string{}, shown[:5]...), fmt.Sprintf("and %d more", len(pods)-5))
	}
	ns := in.Optimizer.TargetNamespace()
	return &Problem{Reason: ReasonAmbientWaypointRequired, Fatal: true,
		Message: fmt.Sprintf("pods %s are enrolled in Istio ambient mode (%s) and the Service uses no waypoint; without one, ztunnel carries its traffic at L4 and no weight applies, so nothing is routed. "+
			"Add a waypoint (istioctl waypoint apply -n %s --enroll-namespace, or label the Service %s=<waypoint>), or inject a sidecar",
			strings.Join(shown, ", "), where, ns, LabelUseWaypoint)}
}

// bindWaypoint binds the ServiceEntry to the Service's waypoint and marks
// the ambient pods' endpoints as reachable through HBONE. The label keeps
// the optimized host behind the same waypoint as the Service: clients that
// address it (sidecars through the operator's VirtualService, ambient
// clients through ztunnel) pass the waypoint's policies as they would for
// the Service. Endpoint labels: security.istio.io/tlsMode=istio (the pod
// has a mesh identity, served by ztunnel) and networking.istio.io/tunnel=http
// (istiod sends HBONE to it, as it does for the pod it finds in its ambient
// index by address).
func bindWaypoint(in Input, r *Result) {
	if r.ServiceEntry == nil {
		return
	}
	pods := ambientPods(in, r.Endpoints)
	if len(pods) == 0 {
		return
	}
	wp := waypointFor(in)
	if wp == nil {
		return
	}
	labels := map[string]string{}
	for k, v := range r.ServiceEntry.Labels {
		labels[k] = v
	}
	labels[LabelUseWaypoint] = wp.Name
	if wp.Namespace != r.Namespace {
		labels[LabelUseWaypointNamespace] = wp.Namespace
	}
	r.ServiceEntry.Labels = labels
	ambient := map[string]bool{}
	for _, ep := range r.Endpoints {
		if in.Pods[ep.Pod] != nil && containsSorted(pods, ep.Pod) {
			ambient[ep.Address] = true
		}
	}
	for _, we := range r.ServiceEntry.Spec.Endpoints {
		if ambient[we.Address] {
			we.Labels = map[string]string{LabelTLSMode: "istio", LabelTunnel: "http"}
		}
	}
}

func containsSorted(sorted []string, s string) bool {
	i := sort.SearchStrings(sorted, s)
	return i < len(sorted) && sorted[i] == s
}
