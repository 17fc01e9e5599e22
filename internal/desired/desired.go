// Package desired computes, without I/O, the Istio objects the operator wants
// for one optimizer: a ServiceEntry on the optimized host mirroring the
// Service's ready pods with per-pod weight and locality, a DestinationRule
// with the load-balancing policy of LoadBalancer (and locality load balancing
// on request), and a
// VirtualService that sends the mesh's traffic for the Kubernetes host to the
// optimized host. Controllers read the cluster, call Compute, and apply.
package desired

import (
	"fmt"
	"slices"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

const (
	// MaxEndpoints is Istio's limit of endpoints in one ServiceEntry.
	MaxEndpoints = 4096

	// DefaultWeight is the weight of a pod the weight engine has not seen yet
	// when no other pod has a weight either.
	DefaultWeight uint32 = 1000

	// LabelManagedBy marks objects this operator writes.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is the value of LabelManagedBy.
	ManagedByValue = "istio-adaptive-optimizer"
	// LabelOptimizerName and LabelOptimizerNamespace name the owning optimizer
	// (owner references cannot cross namespaces).
	LabelOptimizerName      = "optimization.liorfranko.github.io/optimizer-name"
	LabelOptimizerNamespace = "optimization.liorfranko.github.io/optimizer-namespace"

	// LabelTLSMode turns on Istio auto-mTLS for an endpoint.
	LabelTLSMode = "security.istio.io/tlsMode"

	labelRegion  = "topology.kubernetes.io/region"
	labelZone    = "topology.kubernetes.io/zone"
	labelSubzone = "topology.istio.io/subzone"
)

// Input is everything Compute needs, read by the controller.
type Input struct {
	Optimizer *optv1.IstioAdaptiveRequestOptimizer
	Service   *corev1.Service
	// Slices are the EndpointSlices labelled kubernetes.io/service-name=<service>.
	Slices []discoveryv1.EndpointSlice
	// Pods and Nodes by name; a missing entry only loses the fields it provides.
	Pods  map[string]*corev1.Pod
	Nodes map[string]*corev1.Node
	// Weights by pod name, from the weight engine. A pod without one keeps
	// the weight it has in the live ServiceEntry (LiveWeights, by address),
	// else gets the median of the others: a change of the endpoint set never
	// resets the weights of the pods that stay.
	Weights     map[string]uint32
	LiveWeights map[string]uint32
	// WeightsFor, when set, is asked for the weights by pod of the ready
	// endpoints (whose Weight is not set yet) and replaces Weights; it lets
	// the weight engine give new pods their initial weight. It must not
	// keep or change the slice.
	WeightsFor func(eps []Endpoint) map[string]uint32
	// ClusterDomain of the Kubernetes host, default cluster.local.
	ClusterDomain string
	// Mesh: export scope, the user's DestinationRules, ambient enrolment.
	Mesh MeshContext
	// WeightsLearned: the weights written rest on measured capacity (the
	// weight engine's Result.Learned, outside dry run). It decides when a
	// ROUND_ROBIN optimizer leaves Istio's default LEAST_REQUEST.
	WeightsLearned bool
}

// Endpoint is one ready pod as it is routed.
type Endpoint struct {
	Pod            string
	Address        string
	Node           string
	Locality       string
	HardwareClass  string
	ServiceAccount string
	Sidecar        bool
	// Cores is the CPU limit of the pod's application containers (not the
	// sidecar), 0 when unknown; the weight engine uses it to see saturation.
	Cores float64
	// CPURequest is the CPU the application containers request, in cores,
	// and NodeCores the allocatable CPU of the pod's node; 0 when unknown.
	// Bounds on what a pod without a limit can use.
	CPURequest float64
	NodeCores  float64
	Weight     uint32
	Ports      map[string]uint32 // per-endpoint port overrides, by SE port name
}

// Port is one optimized port.
type Port struct {
	Name       string // ServiceEntry port name, e.g. http-80
	Number     int32
	Protocol   string // ServiceEntry protocol: HTTP, HTTP2, GRPC, TCP, TLS, ... or "" (sniffed)
	TargetPort uint32
	// meshProtocol is what istiod makes of the Kubernetes Service port; it
	// decides which routes the client's listener reads.
	meshProtocol string
	// serviceName is the Service port's name, the key of EndpointSlice ports.
	serviceName string
	// target is what the pods listen on, before resolution.
	target intstr.IntOrString
}

// Problem is something the user should know; Fatal means nothing can be written.
type Problem struct {
	Reason  string
	Message string
	Fatal   bool
}

// Result is what Compute decided.
type Result struct {
	Host           string
	KubernetesHost string
	Name           string // name of the owned objects
	Namespace      string // namespace of the owned objects (the Service's)
	Ports          []Port
	Endpoints      []Endpoint // sorted by pod name, at most MaxEndpoints (more is a fatal problem)
	// LoadBalancer is the DestinationRule's simple policy.
	LoadBalancer    networking.LoadBalancerSettings_SimpleLB
	ServiceEntry    *istionet.ServiceEntry
	DestinationRule *istionet.DestinationRule
	VirtualService  *istionet.VirtualService // nil with routing_mode none
	Problems        []Problem
	// ExportTo is the export scope of the owned objects (the Service's).
	ExportTo []string
	// CarriedDestinationRule names (namespace/name) the user's
	// DestinationRule whose traffic policy the owned one carries.
	CarriedDestinationRule string
	// StalledEndpoints are the ServiceEntry's endpoints as the ready pods
	// are now, when a Fatal problem leaves the pods readable (a mesh
	// setting or the user's DestinationRule, not the Service, its ports or
	// the host): see FollowPods. Nil otherwise.
	StalledEndpoints []*networking.WorkloadEntry
}

// ObjectName is the name of the objects owned for a Service.
func ObjectName(service string) string { return service + "-adaptive" }

// KubernetesHost is the Service's in-mesh host name.
func KubernetesHost(service, namespace, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	return service + "." + namespace + ".svc." + clusterDomain
}

// Compute builds the desired objects. It never fails: problems that prevent
// a write are returned as Fatal problems with no objects.
func Compute(in Input) Result {
	opt := in.Optimizer
	ns := opt.TargetNamespace()
	r := Result{
		Host:           opt.OptimizedHost(),
		KubernetesHost: KubernetesHost(opt.Spec.ServiceName, ns, in.ClusterDomain),
		Name:           ObjectName(opt.Spec.ServiceName),
		Namespace:      ns,
	}
	if msg := invalidHost(r.Host, in.ClusterDomain); msg != "" {
		r.Problems = append(r.Problems, Problem{Reason: "InvalidHost", Fatal: true, Message: msg})
		return r
	}
	if in.Service == nil {
		r.Problems = append(r.Problems, Problem{Reason: "ServiceNotFound", Fatal: true,
			Message: fmt.Sprintf("Service %s/%s not found", ns, opt.Spec.ServiceName)})
		return r
	}
	if in.Service.Spec.Type == corev1.ServiceTypeExternalName {
		r.Problems = append(r.Problems, Problem{Reason: "UnsupportedService", Fatal: true,
			Message: fmt.Sprintf("Service %s/%s is of type ExternalName and has no pods", ns, opt.Spec.ServiceName)})
		return r
	}
	var portProblems []Problem
	r.Ports, portProblems = resolvePorts(opt, in.Service, in.Slices, in.Pods, in.ClusterDomain)
	r.Problems = append(r.Problems, portProblems...)
	if len(r.Ports) == 0 {
		r.Problems = append(r.Problems, Problem{Reason: "NoPorts", Fatal: true,
			Message: fmt.Sprintf("no port of Service %s/%s can be optimized", ns, opt.Spec.ServiceName)})
		return r
	}
	var epProblems []Problem
	r.Endpoints, epProblems = endpoints(in, r.Ports)
	r.Problems = append(r.Problems, epProblems...)
	if anyFatal(epProblems) {
		return r
	}
	mp := meshProblems(in, &r)
	r.Problems = append(r.Problems, mp...)

	labels := OwnedLabels(opt)
	r.LoadBalancer = LoadBalancer(opt.Spec.LoadBalancer, in.WeightsLearned)
	r.ServiceEntry = serviceEntry(r, labels)
	r.DestinationRule = destinationRule(r, opt, labels)
	if opt.Routing() == optv1.RoutingVirtualService {
		r.VirtualService = virtualService(r, passThroughPorts(in.Service, r.Ports), labels)
	}
	if a := ownedAnnotations(opt.Name); a != nil {
		r.ServiceEntry.Annotations, r.DestinationRule.Annotations = a, a
		if r.VirtualService != nil {
			r.VirtualService.Annotations = a
		}
	}
	scope(&r)
	bindWaypoint(in, &r)
	if anyFatal(mp) {
		r.stall()
		if slices.ContainsFunc(mp, HandsTrafficBack) {
			// No route is left to the ServiceEntry: nothing to follow.
			r.StalledEndpoints = nil
		}
		return r
	}
	if p := carryUserDestinationRule(in, &r); len(p) > 0 {
		r.Problems = append(r.Problems, p...)
		r.stall()
	}
	return r
}

// stall drops the objects of a Result with a Fatal problem, keeping the
// ServiceEntry's endpoints as StalledEndpoints.
func (r *Result) stall() {
	r.StalledEndpoints = r.ServiceEntry.Spec.Endpoints
	r.ServiceEntry, r.DestinationRule, r.VirtualService = nil, nil, nil
}

// OwnedLabels are put on every owned object; they map events back to the optimizer.
func OwnedLabels(opt *optv1.IstioAdaptiveRequestOptimizer) map[string]string {
	return map[string]string{
		LabelManagedBy:          ManagedByValue,
		LabelOptimizerName:      NameLabelValue(opt.Name),
		LabelOptimizerNamespace: opt.Namespace,
	}
}

// IsOwnedBy says whether an object carries the labels of this optimizer.
func IsOwnedBy(obj metav1.Object, opt *optv1.IstioAdaptiveRequestOptimizer) bool {
	l := obj.GetLabels()
	return l[LabelManagedBy] == ManagedByValue && l[LabelOptimizerName] == NameLabelValue(opt.Name) && l[LabelOptimizerNamespace] == opt.Namespace
}

func anyFatal(ps []Problem) bool {
	for _, p := range ps {
		if p.Fatal {
			return true
		}
	}
	return false
}
