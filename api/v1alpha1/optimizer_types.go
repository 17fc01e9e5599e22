package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Protocol of an optimized port.
// +kubebuilder:validation:Enum=http;grpc;tcp
type Protocol string

const (
	ProtocolHTTP Protocol = "http"
	ProtocolGRPC Protocol = "grpc"
	ProtocolTCP  Protocol = "tcp"
)

// RoutingMode says which routing objects the operator manages.
// +kubebuilder:validation:Enum=virtual_service;gateway_api;none
type RoutingMode string

const (
	// RoutingVirtualService: the operator owns a VirtualService that sends the
	// mesh's traffic for the Kubernetes Service host to the optimized host.
	RoutingVirtualService RoutingMode = "virtual_service"
	// RoutingGatewayAPI: the operator owns Gateway API routes (GAMMA: an
	// HTTPRoute, a GRPCRoute, a TCPRoute) whose parent is the Service and
	// whose backend is the optimized host, instead of a VirtualService.
	RoutingGatewayAPI RoutingMode = "gateway_api"
	// RoutingNone: only the ServiceEntry and DestinationRule are written; users
	// route to the optimized host themselves.
	RoutingNone RoutingMode = "none"
)

// LoadBalancer is the DestinationRule's load-balancing policy for the
// optimized host.
// +kubebuilder:validation:Enum=ROUND_ROBIN;LEAST_REQUEST
type LoadBalancer string

const (
	// LoadBalancerRoundRobin: weighted ROUND_ROBIN, traffic in proportion to
	// the weights. Until the weights rest on measured capacity the operator
	// keeps Istio's default LEAST_REQUEST in place.
	LoadBalancerRoundRobin LoadBalancer = "ROUND_ROBIN"
	// LoadBalancerLeastRequest: Envoy's weighted LEAST_REQUEST, which picks
	// by weight/(active requests+1) and so also reacts to queues.
	LoadBalancerLeastRequest LoadBalancer = "LEAST_REQUEST"
)

// ServicePort selects one port of the Service to optimize.
type ServicePort struct {
	// number is the Service port number.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Number int32 `json:"number"`

	// protocol of the port. When empty it is taken from the Service port's
	// appProtocol, else from its name prefix (http-, grpc-, ...), else the
	// port is sniffed (both HTTP and TCP are routed), as istiod does.
	// +optional
	Protocol Protocol `json:"protocol,omitempty"`

	// The name pattern applies on every supported Kubernetes version; the
	// integer range needs CEL (controller-gen puts no minimum on an
	// int-or-string), and where CEL does not run the optimizer reports an
	// out-of-range number as Stalled/InvalidSpec instead.

	// targetPort overrides the port the pods listen on. A name is resolved
	// through the EndpointSlice ports. Defaults to the Service's targetPort.
	// A number must be 1-65535; a name must be an IANA service name (at most
	// 15 lower-case letters, digits and single inner hyphens, at least one
	// letter), as Kubernetes requires of port names.
	// +optional
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) != int || (self >= 1 && self <= 65535)",message="a target port number must be between 1 and 65535"
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:Pattern=`^([a-z0-9]+-)*[a-z0-9]*[a-z][a-z0-9]*(-[a-z0-9]+)*$`
	TargetPort *intstr.IntOrString `json:"targetPort,omitempty"`
}

// GatewayRouteKind is a kind of gateway route the operator can retarget.
// +kubebuilder:validation:Enum=VirtualService;HTTPRoute;GRPCRoute;TCPRoute;TLSRoute
type GatewayRouteKind string

const (
	GatewayRouteVirtualService GatewayRouteKind = "VirtualService"
	GatewayRouteHTTPRoute      GatewayRouteKind = "HTTPRoute"
	GatewayRouteGRPCRoute      GatewayRouteKind = "GRPCRoute"
	GatewayRouteTCPRoute       GatewayRouteKind = "TCPRoute"
	GatewayRouteTLSRoute       GatewayRouteKind = "TLSRoute"
)

// GatewayRoute names a gateway route (an Istio VirtualService bound to a
// gateway, or a Gateway API route whose parent is a Gateway) whose
// destinations for the Service the operator may point at the optimized
// host.
type GatewayRoute struct {
	// kind of the route.
	Kind GatewayRouteKind `json:"kind"`
	// name of the route.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
	// namespace of the route; defaults to the Service's namespace. Another
	// namespace than the optimizer's needs the administrator's
	// cross-namespace opt-in, as service_namespace does.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace,omitempty"`
}

// Optimization tunes the weight engine. Every field has an operator-wide
// default (a manager flag); set a field here to override it for one Service.
//
// The integer fields are int64 in Go although their ranges are small: any
// integer the API server stores decodes into int64, so a value stored before
// a range was enforced cannot fail the manager's list of every optimizer (an
// int32 would overflow). Ranges are checked by the CRD and again by the
// manager.
type Optimization struct {
	// cycle is how often weights are recomputed.
	// +optional
	Cycle *Duration `json:"cycle,omitempty"`

	// query_window is the range of the rate() in the default queries.
	// +optional
	QueryWindow *Duration `json:"query_window,omitempty"`

	// scrape_interval is how often the metrics backend scrapes the pods; the
	// engine allows for that lag when it relates weights to observed load.
	// +optional
	ScrapeInterval *Duration `json:"scrape_interval,omitempty"`

	// dead_band_percent is the cost of a ServiceEntry write: new weights are
	// written only when the request time they are predicted to save beats
	// (dead_band_percent/100)² of it plus what the estimates' own noise could
	// show, so noise causes no writes. Near full load, where a weight a few
	// percent high is a queue, a smaller gap is worth a write, but a write
	// always moves some pod's traffic by at least dead_band_percent (weights
	// that close to their targets are converged: each pod's live share is
	// judged against the share the write would send), unless a pod is sent more
	// than it can serve or its estimate is following a change.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=50
	// +optional
	DeadBandPercent *int64 `json:"dead_band_percent,omitempty"`

	// max_step_percent bounds how far one weight may move in one write, so
	// one bad reading cannot swing the traffic.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	// +optional
	MaxStepPercent *int64 `json:"max_step_percent,omitempty"`

	// max_weight_ratio keeps every weight within [mean/ratio, mean*ratio]
	// (by default 0.05x-20x; Envoy does not clip weights). A higher ratio lets
	// slow pods get less at low load, at the price of estimates read from few
	// requests: more writes before the weights settle.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxWeightRatio *int64 `json:"max_weight_ratio,omitempty"`

	// smoothing_percent is the share of a new reading in a settled capacity
	// estimate (100 = no smoothing); after a change the estimate restarts
	// and averages its first readings plainly until their share falls to
	// this.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	SmoothingPercent *int64 `json:"smoothing_percent,omitempty"`

	// min_cpu_millicores: when the pods use less CPU than this on average,
	// weights are held (nothing to learn at low load).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	// +optional
	MinCPUMillicores *int64 `json:"min_cpu_millicores,omitempty"`

	// slow_start ramps the weight of a new pod up over this duration.
	// +optional
	SlowStart *Duration `json:"slow_start,omitempty"`

	// drain_time: a pod that fell behind (served fewer requests than it was
	// sent, or its latency shows a queue) owes its backlog: it is sent its
	// capacity less the backlog over this time, and no more than it has,
	// until the backlog clears.
	// +optional
	DrainTime *Duration `json:"drain_time,omitempty"`

	// speed_tilt_percent is accepted for compatibility and has no effect:
	// the weights minimise the Service's expected request time, which leans
	// to faster pods below full load by itself (see the README's "Weights").
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=50
	// +optional
	SpeedTiltPercent *int64 `json:"speed_tilt_percent,omitempty"`

	// weight_expiry is how long the last good weights are held while the
	// metrics backend fails; after it, weights fall back to equal.
	// +optional
	WeightExpiry *Duration `json:"weight_expiry,omitempty"`

	// share_by_hardware pools capacity estimates of pods on the same node
	// instance type, so a new pod on known hardware starts near its weight.
	// +optional
	ShareByHardware *bool `json:"share_by_hardware,omitempty"`

	// cpu_query overrides the PromQL template of per-pod CPU usage (cores).
	// Go text/template with .Namespace, .Service, .Pods (a regex of pod
	// names, escaped), .Window. The result must carry a "pod" label.
	// +optional
	CPUQuery string `json:"cpu_query,omitempty"`

	// request_query overrides the PromQL template of per-pod request rates
	// (requests per second), same variables as cpu_query. Set to "-" to use
	// CPU only.
	// +optional
	RequestQuery string `json:"request_query,omitempty"`

	// latency_query overrides the PromQL template of each pod's mean request
	// duration in seconds as its own sidecar measures it, same variables as
	// cpu_query. Set to "-" to go without latency.
	// +optional
	LatencyQuery string `json:"latency_query,omitempty"`

	// node_cpu_query overrides the PromQL template of the CPU in use on each
	// pod's node, in cores (every container and the system), same variables
	// as cpu_query. Used only for pods without a CPU limit: with the node's
	// allocatable CPU it gives the pod's ceiling, its own CPU plus what its
	// node leaves idle. Set to "-" to go without it.
	// +optional
	NodeCPUQuery string `json:"node_cpu_query,omitempty"`

	// coverage_query overrides the PromQL template of the traffic coverage
	// figure: variables of cpu_query and .Host (the optimized host); the
	// answer's series carry path="received", path="weighted" and, per
	// bypassing source, path="bypass". Set to "-" to measure nothing.
	// +optional
	CoverageQuery string `json:"coverage_query,omitempty"`
}

// IstioAdaptiveRequestOptimizerSpec is what the user asks for.
type IstioAdaptiveRequestOptimizerSpec struct {
	// service_name is the Service to optimize.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	ServiceName string `json:"service_name"`

	// service_namespace is the Service's namespace; defaults to the
	// optimizer's own namespace.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	ServiceNamespace string `json:"service_namespace,omitempty"`

	// locality_enabled turns on Istio locality load balancing (with outlier
	// detection) for the optimized host. Endpoints carry their locality
	// either way.
	// +optional
	LocalityEnabled bool `json:"locality_enabled,omitempty"`

	// service_ports lists the ports to optimize; empty means all ports.
	// Port numbers are unique (a list map keyed by number, which the API
	// server enforces without CEL, so Kubernetes 1.22 works too).
	// +optional
	// +listType=map
	// +listMapKey=number
	// +kubebuilder:validation:MaxItems=100
	ServicePorts []ServicePort `json:"service_ports,omitempty"`

	// host is the optimized host of the ServiceEntry. Defaults to
	// <service>.<namespace>.adaptive. Another host must be a DNS name (lower
	// case, no port, labels of 1-63 characters) under
	// <service_namespace>.adaptive or a suffix the administrator allows
	// (--allowed-host-suffixes), and not used by anyone else.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)+$`
	Host string `json:"host,omitempty"`

	// routing_mode: virtual_service (default) sends the mesh's traffic for the
	// Service to the optimized host with a VirtualService; gateway_api does
	// it with Gateway API routes whose parent is the Service (GAMMA); none
	// writes no route.
	// +optional
	RoutingMode RoutingMode `json:"routing_mode,omitempty"`

	// gateway_routes lists the gateway routes whose destinations for the
	// Service the operator may retarget to the optimized host, so traffic
	// entering through those gateways is weighted too. Only the destination
	// fields are changed; the original host is recorded on the route and put
	// back when the entry is removed or the optimizer is deleted.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=50
	GatewayRoutes []GatewayRoute `json:"gateway_routes,omitempty"`

	// load_balancer is the DestinationRule's policy: ROUND_ROBIN (default;
	// Istio's LEAST_REQUEST is kept until the weights rest on measured
	// capacity) or LEAST_REQUEST (weighted least request, from the start).
	// +optional
	LoadBalancer LoadBalancer `json:"load_balancer,omitempty"`

	// dry_run computes and publishes weights (status, metrics) but does not
	// write them into the ServiceEntry.
	// +optional
	DryRun bool `json:"dry_run,omitempty"`

	// optimization tunes the weight engine.
	// +optional
	Optimization *Optimization `json:"optimization,omitempty"`
}

// OwnedObjects names the Istio objects the operator writes for this optimizer.
type OwnedObjects struct {
	Namespace       string `json:"namespace,omitempty"`
	ServiceEntry    string `json:"serviceEntry,omitempty"`
	VirtualService  string `json:"virtualService,omitempty"`
	DestinationRule string `json:"destinationRule,omitempty"`
}

// GatewayRouteStatus is a gateway route that sends the Service's traffic
// past the weights, or that the operator retargeted.
type GatewayRouteStatus struct {
	Kind      GatewayRouteKind `json:"kind"`
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	// gateways the route is bound to (namespace/name).
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Gateways []string `json:"gateways,omitempty"`
	// change is the exact edit that weights the route's traffic.
	Change string `json:"change"`
	// retargeted: the operator made the change (the route is listed in
	// gateway_routes).
	// +optional
	Retargeted bool `json:"retargeted,omitempty"`
}

// EndpointWeight is one pod's weight, as computed (and in dry run not applied).
type EndpointWeight struct {
	Pod      string `json:"pod"`
	Address  string `json:"address"`
	Locality string `json:"locality,omitempty"`
	// weight is the endpoint's weight, an Envoy uint32 (format int64: the
	// API server refuses a maximum above 2^31-1 under format int32).
	// +kubebuilder:validation:Format=int64
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4294967295
	Weight uint32 `json:"weight"`
}

// IstioAdaptiveRequestOptimizerStatus is what the operator observed and did.
type IstioAdaptiveRequestOptimizerStatus struct {
	// observedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready, Reconciling, Stalled, Degraded.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// host is the optimized host.
	// +optional
	Host string `json:"host,omitempty"`

	// endpoints is the number of ready pods in the ServiceEntry.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	Endpoints int32 `json:"endpoints,omitempty"`

	// ownedObjects names the objects the operator writes.
	// +optional
	OwnedObjects OwnedObjects `json:"ownedObjects,omitempty"`

	// lastOptimizationTime is when weights were last computed and found to
	// change; a cycle that changes nothing refreshes it (with weightSpread
	// and weights) at most every 5 minutes, so the status is not rewritten
	// every cycle.
	// +optional
	LastOptimizationTime *metav1.Time `json:"lastOptimizationTime,omitempty"`

	// weightsMode is the weight engine's mode at the cycle
	// lastOptimizationTime names: Optimizing, Steady, LowLoad, Holding,
	// Fallback or NoData (README, "Metrics"); empty when the weights are
	// not optimized.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	WeightsMode string `json:"weightsMode,omitempty"`

	// weightsDryRun: that cycle's weights were computed but not applied
	// (dry_run).
	// +optional
	WeightsDryRun bool `json:"weightsDryRun,omitempty"`

	// weightSpread is max weight / min weight, as a decimal string.
	// +optional
	WeightSpread string `json:"weightSpread,omitempty"`

	// loadBalancer is the policy the DestinationRule carries now.
	// +optional
	LoadBalancer string `json:"loadBalancer,omitempty"`

	// loadBalancerReason is why the weight loop's policy chose
	// loadBalancer, one of UserChoice, Learning, Learned, Restored, Alarm,
	// Unsettled, Fallback, CPUAtLimit and AtCapacity (README, "Load
	// balancer"); empty
	// when the weights are not optimized (no metrics backend, or dry run).
	// A restarted manager reads it to keep a LEAST_REQUEST its predecessor
	// chose after learning.
	// +optional
	// +kubebuilder:validation:MaxLength=32
	LoadBalancerReason string `json:"loadBalancerReason,omitempty"`

	// weights are the last computed weights, the first 100 by pod name
	// (endpoint_weight has them all).
	// +optional
	// +kubebuilder:validation:MaxItems=100
	Weights []EndpointWeight `json:"weights,omitempty"`

	// weightsTotal is the number of computed weights; weights lists at most
	// 100 of them.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	WeightsTotal int32 `json:"weightsTotal,omitempty"`

	// coverage is the measured share of the Service's requests that went
	// through the weights, and the largest sources that bypass them.
	// +optional
	Coverage *TrafficCoverage `json:"coverage,omitempty"`
	// ownedRoutes are the Gateway API routes of routing_mode gateway_api,
	// as Kind/name in ownedObjects.namespace (one per optimized port).
	// +optional
	// +kubebuilder:validation:MaxItems=100
	OwnedRoutes []string `json:"ownedRoutes,omitempty"`

	// gatewayRoutes are the gateway routes that send the Service's traffic
	// to its Kubernetes host (past the weights) and those the operator
	// retargeted, the first 20 by kind, namespace and name.
	// +optional
	// +kubebuilder:validation:MaxItems=20
	GatewayRoutes []GatewayRouteStatus `json:"gatewayRoutes,omitempty"`
}

// IstioAdaptiveRequestOptimizer mirrors a Service's ready pods into a weighted
// Istio ServiceEntry and keeps the weights proportional to pod capacity.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=iaro;optimizer
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.spec.service_name`
// +kubebuilder:printcolumn:name="Host",type=string,JSONPath=`.status.host`
// +kubebuilder:printcolumn:name="Endpoints",type=integer,JSONPath=`.status.endpoints`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type IstioAdaptiveRequestOptimizer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +kubebuilder:validation:Required
	Spec   IstioAdaptiveRequestOptimizerSpec   `json:"spec"`
	Status IstioAdaptiveRequestOptimizerStatus `json:"status,omitempty"`

	// decodeProblems: what did not decode when the object was read (decode.go).
	decodeProblems []DecodeProblem `json:"-"`
}

// IstioAdaptiveRequestOptimizerList is a list of optimizers.
// +kubebuilder:object:root=true
type IstioAdaptiveRequestOptimizerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IstioAdaptiveRequestOptimizer `json:"items"`
}

func init() {
	SchemeBuilder.Register(&IstioAdaptiveRequestOptimizer{}, &IstioAdaptiveRequestOptimizerList{})
}

// Condition types.
const (
	ConditionReady       = "Ready"
	ConditionReconciling = "Reconciling"
	ConditionStalled     = "Stalled"
	ConditionDegraded    = "Degraded"
)

// TargetNamespace is the namespace of the Service to optimize.
func (o *IstioAdaptiveRequestOptimizer) TargetNamespace() string {
	if o.Spec.ServiceNamespace != "" {
		return o.Spec.ServiceNamespace
	}
	return o.Namespace
}

// OptimizedHost is the host of the ServiceEntry.
func (o *IstioAdaptiveRequestOptimizer) OptimizedHost() string {
	if o.Spec.Host != "" {
		return o.Spec.Host
	}
	return o.Spec.ServiceName + "." + o.TargetNamespace() + ".adaptive"
}

// Balancer is the requested load-balancing policy (ROUND_ROBIN when unset).
func (o *IstioAdaptiveRequestOptimizer) Balancer() LoadBalancer {
	if o.Spec.LoadBalancer == "" {
		return LoadBalancerRoundRobin
	}
	return o.Spec.LoadBalancer
}

// Routing is the effective routing mode.
func (o *IstioAdaptiveRequestOptimizer) Routing() RoutingMode {
	if o.Spec.RoutingMode == "" {
		return RoutingVirtualService
	}
	return o.Spec.RoutingMode
}
