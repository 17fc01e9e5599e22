// Package desired computes, without I/O, the Istio objects the operator wants
// for one optimizer: a ServiceEntry on the optimized host mirroring the
// Service's ready pods with per-pod weight and locality, a DestinationRule
// with ROUND_ROBIN (and locality load balancing on request), and a
// VirtualService that sends the mesh's traffic for the Kubernetes host to the
// optimized host. Controllers read the cluster, call Compute, and apply.
package desired

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
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
	Cores  float64
	Weight uint32
	Ports  map[string]uint32 // per-endpoint port overrides, by SE port name
}

// Port is one optimized port.
type Port struct {
	Name       string // ServiceEntry port name, e.g. http-80
	Number     int32
	Protocol   string // Istio protocol: HTTP, HTTP2, GRPC, TCP
	TargetPort uint32
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
	Host            string
	KubernetesHost  string
	Name            string // name of the owned objects
	Namespace       string // namespace of the owned objects (the Service's)
	Ports           []Port
	Endpoints       []Endpoint // sorted by pod name, at most MaxEndpoints
	ServiceEntry    *istionet.ServiceEntry
	DestinationRule *istionet.DestinationRule
	VirtualService  *istionet.VirtualService // nil with routing_mode none
	Problems        []Problem
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
	r.Ports, portProblems = resolvePorts(opt, in.Service, in.Slices, in.Pods)
	r.Problems = append(r.Problems, portProblems...)
	if len(r.Ports) == 0 {
		r.Problems = append(r.Problems, Problem{Reason: "NoPorts", Fatal: true,
			Message: fmt.Sprintf("no port of Service %s/%s can be optimized", ns, opt.Spec.ServiceName)})
		return r
	}
	var epProblems []Problem
	r.Endpoints, epProblems = endpoints(in, r.Ports)
	r.Problems = append(r.Problems, epProblems...)

	labels := OwnedLabels(opt)
	r.ServiceEntry = serviceEntry(r, labels)
	r.DestinationRule = destinationRule(r, opt, labels)
	if opt.Routing() == optv1.RoutingVirtualService {
		r.VirtualService = virtualService(r, passThroughPorts(in.Service, r.Ports), labels)
	}
	return r
}

// OwnedLabels are put on every owned object; they map events back to the optimizer.
func OwnedLabels(opt *optv1.IstioAdaptiveRequestOptimizer) map[string]string {
	return map[string]string{
		LabelManagedBy:          ManagedByValue,
		LabelOptimizerName:      opt.Name,
		LabelOptimizerNamespace: opt.Namespace,
	}
}

// IsOwnedBy says whether an object carries the labels of this optimizer.
func IsOwnedBy(obj metav1.Object, opt *optv1.IstioAdaptiveRequestOptimizer) bool {
	l := obj.GetLabels()
	return l[LabelManagedBy] == ManagedByValue && l[LabelOptimizerName] == opt.Name && l[LabelOptimizerNamespace] == opt.Namespace
}

func serviceEntry(r Result, labels map[string]string) *istionet.ServiceEntry {
	se := &istionet.ServiceEntry{
		TypeMeta:   metav1.TypeMeta{APIVersion: istionet.SchemeGroupVersion.String(), Kind: "ServiceEntry"},
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, Labels: labels},
	}
	se.Spec.Hosts = []string{r.Host}
	// Without an address, istiod gives every sidecar a wildcard listener
	// 0.0.0.0_<port> for each TCP port of a STATIC ServiceEntry, which would
	// capture all TCP traffic on that port to any destination. A fixed
	// virtual address scopes the listener; clients still reach the pods
	// through the Kubernetes Service, whose VirtualService routes to this host.
	se.Spec.Addresses = []string{VirtualAddress(r.Host)}
	se.Spec.Location = networking.ServiceEntry_MESH_INTERNAL
	se.Spec.Resolution = networking.ServiceEntry_STATIC
	for _, p := range r.Ports {
		se.Spec.Ports = append(se.Spec.Ports, &networking.ServicePort{
			Number: uint32(p.Number), Protocol: p.Protocol, Name: p.Name, TargetPort: p.TargetPort,
		})
	}
	for _, ep := range r.Endpoints {
		we := &networking.WorkloadEntry{
			Address:        ep.Address,
			Locality:       ep.Locality,
			Weight:         ep.Weight,
			ServiceAccount: ep.ServiceAccount,
		}
		if ep.Sidecar {
			we.Labels = map[string]string{LabelTLSMode: "istio"}
		}
		if len(ep.Ports) > 0 {
			we.Ports = ep.Ports
		}
		se.Spec.Endpoints = append(se.Spec.Endpoints, we)
	}
	return se
}

func destinationRule(r Result, opt *optv1.IstioAdaptiveRequestOptimizer, labels map[string]string) *istionet.DestinationRule {
	dr := &istionet.DestinationRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: istionet.SchemeGroupVersion.String(), Kind: "DestinationRule"},
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, Labels: labels},
	}
	dr.Spec.Host = r.Host
	lb := &networking.LoadBalancerSettings{
		LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_ROUND_ROBIN},
	}
	policy := &networking.TrafficPolicy{LoadBalancer: lb}
	if opt.Spec.LocalityEnabled {
		// Istio applies locality failover only when outlier detection can
		// eject unhealthy endpoints; without it every locality stays at
		// priority 0.
		lb.LocalityLbSetting = &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(true)}
		policy.OutlierDetection = &networking.OutlierDetection{
			Consecutive_5XxErrors: wrapperspb.UInt32(5),
			Interval:              durationpb.New(10e9),
			BaseEjectionTime:      durationpb.New(30e9),
			MaxEjectionPercent:    50,
		}
	}
	dr.Spec.TrafficPolicy = policy
	return dr
}

// passThroughPorts are the Service's TCP ports that are not optimized. A
// VirtualService takes over its host on every port, so these get routes to
// the Kubernetes Service itself, exactly where they went before.
func passThroughPorts(svc *corev1.Service, optimized []Port) []Port {
	done := map[int32]bool{}
	for _, p := range optimized {
		done[p.Number] = true
	}
	var out []Port
	for _, sp := range svc.Spec.Ports {
		if done[sp.Port] || sp.Protocol == corev1.ProtocolUDP || sp.Protocol == corev1.ProtocolSCTP {
			continue
		}
		done[sp.Port] = true
		proto := istioProtocol("", sp)
		out = append(out, Port{Name: strings.ToLower(proto) + "-" + fmt.Sprint(sp.Port) + "-passthrough", Number: sp.Port, Protocol: proto})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Number < out[j].Number })
	return out
}

func virtualService(r Result, passThrough []Port, labels map[string]string) *istionet.VirtualService {
	vs := &istionet.VirtualService{
		TypeMeta:   metav1.TypeMeta{APIVersion: istionet.SchemeGroupVersion.String(), Kind: "VirtualService"},
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, Labels: labels},
	}
	vs.Spec.Hosts = []string{r.KubernetesHost}
	type route struct {
		Port
		host string
	}
	var routes []route
	for _, p := range r.Ports {
		routes = append(routes, route{p, r.Host})
	}
	for _, p := range passThrough {
		routes = append(routes, route{p, r.KubernetesHost})
	}
	for _, rt := range routes {
		p := rt.Port
		dest := &networking.Destination{Host: rt.host, Port: &networking.PortSelector{Number: uint32(p.Number)}}
		switch p.Protocol {
		case "TCP":
			vs.Spec.Tcp = append(vs.Spec.Tcp, &networking.TCPRoute{
				Match: []*networking.L4MatchAttributes{{Port: uint32(p.Number)}},
				Route: []*networking.RouteDestination{{Destination: dest}},
			})
		default:
			vs.Spec.Http = append(vs.Spec.Http, &networking.HTTPRoute{
				Name:  p.Name,
				Match: []*networking.HTTPMatchRequest{{Port: uint32(p.Number)}},
				Route: []*networking.HTTPRouteDestination{{Destination: dest}},
			})
		}
	}
	return vs
}

// resolvePorts picks the optimized ports, their protocol and target port.
func resolvePorts(opt *optv1.IstioAdaptiveRequestOptimizer, svc *corev1.Service, slices []discoveryv1.EndpointSlice, pods map[string]*corev1.Pod) ([]Port, []Problem) {
	var problems []Problem
	byNumber := map[int32]corev1.ServicePort{}
	for _, sp := range svc.Spec.Ports {
		// A number may be declared twice, once per protocol (53/TCP and
		// 53/UDP): the TCP one is the port that can be optimized.
		if prev, ok := byNumber[sp.Port]; ok && routable(prev) {
			continue
		}
		byNumber[sp.Port] = sp
	}
	type want struct {
		number   int32
		protocol optv1.Protocol
		target   *intstr.IntOrString
	}
	var wants []want
	if len(opt.Spec.ServicePorts) == 0 {
		for _, sp := range svc.Spec.Ports {
			wants = append(wants, want{number: sp.Port})
		}
	} else {
		for _, p := range opt.Spec.ServicePorts {
			wants = append(wants, want{number: p.Number, protocol: p.Protocol, target: p.TargetPort})
		}
	}
	var ports []Port
	seen := map[int32]bool{}
	for _, w := range wants {
		if seen[w.number] {
			continue
		}
		seen[w.number] = true
		sp, ok := byNumber[w.number]
		if !ok {
			problems = append(problems, Problem{Reason: "PortNotFound",
				Message: fmt.Sprintf("Service %s/%s has no port %d", svc.Namespace, svc.Name, w.number)})
			continue
		}
		if !routable(sp) {
			problems = append(problems, Problem{Reason: "UnsupportedProtocol",
				Message: fmt.Sprintf("port %d of Service %s/%s is %s; Istio routes TCP only", w.number, svc.Namespace, svc.Name, sp.Protocol)})
			continue
		}
		proto := istioProtocol(w.protocol, sp)
		target := sp.TargetPort
		if w.target != nil {
			target = *w.target
		}
		if target.Type == intstr.Int && target.IntVal == 0 && target.StrVal == "" {
			target = intstr.FromInt32(sp.Port)
		}
		p := Port{
			Name:        strings.ToLower(proto) + "-" + fmt.Sprint(w.number),
			Number:      w.number,
			Protocol:    proto,
			serviceName: sp.Name,
			target:      target,
		}
		if target.Type == intstr.Int {
			p.TargetPort = uint32(target.IntVal)
		} else {
			n := namedTargetFromSlices(sp.Name, slices)
			if n == 0 || w.target != nil {
				n = namedTargetFromPods(target.StrVal, pods)
			}
			if n == 0 {
				problems = append(problems, Problem{Reason: "TargetPortUnresolved",
					Message: fmt.Sprintf("target port %q of port %d is not declared by any pod yet", target.StrVal, w.number)})
				continue
			}
			p.TargetPort = n
		}
		ports = append(ports, p)
	}
	return ports, problems
}

// routable says whether Istio can route the Service port (TCP only).
func routable(sp corev1.ServicePort) bool {
	return sp.Protocol != corev1.ProtocolUDP && sp.Protocol != corev1.ProtocolSCTP
}

// istioProtocol picks the protocol: the optimizer's choice, else the Service
// port's appProtocol, else its name prefix (Istio's convention), else TCP.
func istioProtocol(explicit optv1.Protocol, sp corev1.ServicePort) string {
	if explicit != "" {
		return strings.ToUpper(string(explicit))
	}
	if sp.AppProtocol != nil {
		if p := protocolOf(*sp.AppProtocol); p != "" {
			return p
		}
	}
	name := strings.ToLower(sp.Name)
	prefix, _, _ := strings.Cut(name, "-")
	if p := protocolOf(prefix); p != "" {
		return p
	}
	return "TCP"
}

func protocolOf(s string) string {
	switch strings.ToLower(s) {
	case "http":
		return "HTTP"
	case "http2", "kubernetes.io/h2c":
		return "HTTP2"
	case "grpc", "grpc-web":
		return "GRPC"
	case "tcp", "https", "tls", "kubernetes.io/wss", "kubernetes.io/ws":
		// Encrypted or upgraded traffic is routed as opaque TCP.
		return "TCP"
	}
	return ""
}

// namedTargetFromSlices finds the number a named target port resolved to:
// EndpointSlice ports are named after the Service port.
func namedTargetFromSlices(servicePortName string, slices []discoveryv1.EndpointSlice) uint32 {
	for _, s := range sortedSlices(slices) {
		for _, p := range s.Ports {
			if p.Port != nil && ptrString(p.Name) == servicePortName {
				return uint32(*p.Port)
			}
		}
	}
	return 0
}

func namedTargetFromPods(name string, pods map[string]*corev1.Pod) uint32 {
	names := make([]string, 0, len(pods))
	for n := range pods {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, c := range pods[n].Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == name {
					return uint32(cp.ContainerPort)
				}
			}
		}
	}
	return 0
}

func sortedSlices(slices []discoveryv1.EndpointSlice) []discoveryv1.EndpointSlice {
	out := append([]discoveryv1.EndpointSlice(nil), slices...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// sortedEndpoints orders a slice's endpoints canonically, so which copy of
// a repeated address is kept never depends on the order the API listed them.
func sortedEndpoints(eps []discoveryv1.Endpoint) []discoveryv1.Endpoint {
	key := func(e discoveryv1.Endpoint) string {
		var b strings.Builder
		b.WriteString(strings.Join(e.Addresses, ","))
		if e.TargetRef != nil {
			b.WriteString("\x00" + e.TargetRef.Kind + "\x00" + e.TargetRef.Name)
		}
		b.WriteString("\x00" + ptrString(e.NodeName) + "\x00" + ptrString(e.Zone))
		return b.String()
	}
	out := append([]discoveryv1.Endpoint(nil), eps...)
	sort.SliceStable(out, func(i, j int) bool { return key(out[i]) < key(out[j]) })
	return out
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// endpoints lists the ready pods of the slices, one per address.
func endpoints(in Input, ports []Port) ([]Endpoint, []Problem) {
	var problems []Problem
	byAddr := map[string]Endpoint{}
	for _, s := range sortedSlices(in.Slices) {
		if s.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		slicePorts := map[string]int32{}
		for _, p := range s.Ports {
			if p.Port != nil {
				slicePorts[ptrString(p.Name)] = *p.Port
			}
		}
		for _, e := range sortedEndpoints(s.Endpoints) {
			if !isReady(e) || len(e.Addresses) == 0 {
				continue
			}
			addr := e.Addresses[0]
			if _, dup := byAddr[addr]; dup {
				continue
			}
			ep := Endpoint{Address: addr, Node: ptrString(e.NodeName)}
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				ep.Pod = e.TargetRef.Name
			} else {
				ep.Pod = addr
			}
			if pod := in.Pods[ep.Pod]; pod != nil {
				ep.ServiceAccount = pod.Spec.ServiceAccountName
				ep.Sidecar = HasSidecar(pod)
				ep.Cores = CPULimit(pod)
				if ep.Node == "" {
					ep.Node = pod.Spec.NodeName
				}
			}
			node := in.Nodes[ep.Node]
			ep.Locality = locality(node, e.Zone)
			if node != nil {
				ep.HardwareClass = node.Labels[corev1.LabelInstanceTypeStable]
			}
			for _, p := range ports {
				if n, ok := slicePorts[p.serviceName]; ok && uint32(n) != p.TargetPort && !explicitTarget(in.Optimizer, p.Number) {
					if ep.Ports == nil {
						ep.Ports = map[string]uint32{}
					}
					ep.Ports[p.Name] = uint32(n)
				}
			}
			byAddr[addr] = ep
		}
	}
	eps := make([]Endpoint, 0, len(byAddr))
	for _, ep := range byAddr {
		eps = append(eps, ep)
	}
	sort.Slice(eps, func(i, j int) bool {
		if eps[i].Pod != eps[j].Pod {
			return eps[i].Pod < eps[j].Pod
		}
		return eps[i].Address < eps[j].Address
	})
	if len(eps) > MaxEndpoints {
		problems = append(problems, Problem{Reason: "TooManyEndpoints",
			Message: fmt.Sprintf("%d ready endpoints exceed Istio's limit of %d per ServiceEntry; only the first %d pods by name are routed through the optimized host", len(eps), MaxEndpoints, MaxEndpoints)})
		eps = eps[:MaxEndpoints]
	}
	byPod := in.Weights
	if in.WeightsFor != nil {
		byPod = in.WeightsFor(eps)
	}
	assignWeights(eps, byPod, in.LiveWeights)
	capLocalitySums(eps)
	return eps, problems
}

func explicitTarget(opt *optv1.IstioAdaptiveRequestOptimizer, number int32) bool {
	for _, p := range opt.Spec.ServicePorts {
		if p.Number == number && p.TargetPort != nil {
			return true
		}
	}
	return false
}

// assignWeights gives each endpoint its known weight and a pod without one
// the median of the known weights, so a new pod starts at a typical share.
func assignWeights(eps []Endpoint, byPod, byAddress map[string]uint32) {
	known := func(ep Endpoint) uint32 {
		if w := byPod[ep.Pod]; w > 0 {
			return w
		}
		return byAddress[ep.Address]
	}
	var ws []uint32
	for _, ep := range eps {
		if w := known(ep); w > 0 {
			ws = append(ws, w)
		}
	}
	fallback := DefaultWeight
	if len(ws) > 0 {
		sort.Slice(ws, func(i, j int) bool { return ws[i] < ws[j] })
		fallback = ws[len(ws)/2]
	}
	for i := range eps {
		if w := known(eps[i]); w > 0 {
			eps[i].Weight = w
		} else {
			eps[i].Weight = fallback
		}
	}
}

// maxLocalityWeight is what the weights of one locality may sum to: Envoy
// rejects an endpoint update whose locality sum exceeds 2^32-1. The margin
// leaves room for weights that scaling raises back to 1.
const maxLocalityWeight = math.MaxUint32 - MaxEndpoints

// capLocalitySums scales every weight by one factor when the weights of a
// locality would sum past Envoy's limit, so the ratios between pods (also
// across localities) hold and no weight drops below 1.
func capLocalitySums(eps []Endpoint) {
	sums := map[string]uint64{}
	var largest uint64
	for _, ep := range eps {
		sums[ep.Locality] += uint64(ep.Weight)
		largest = max(largest, sums[ep.Locality])
	}
	if largest <= maxLocalityWeight {
		return
	}
	for i := range eps {
		eps[i].Weight = uint32(max(1, uint64(eps[i].Weight)*maxLocalityWeight/largest))
	}
}

// isReady follows the EndpointSlice API: a nil ready condition means ready,
// and a terminating endpoint is never ready.
func isReady(e discoveryv1.Endpoint) bool {
	if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
		return false
	}
	return e.Conditions.Ready == nil || *e.Conditions.Ready
}

// HasSidecar says whether Istio injected a proxy into the pod.
func HasSidecar(pod *corev1.Pod) bool {
	if _, ok := pod.Annotations["sidecar.istio.io/status"]; ok {
		return true
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "istio-proxy" {
			return true
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name == "istio-proxy" {
			return true
		}
	}
	return false
}

// locality is region/zone/subzone from the node's topology labels, falling
// back to the EndpointSlice's zone.
func locality(node *corev1.Node, sliceZone *string) string {
	var region, zone, subzone string
	if node != nil {
		region = node.Labels[labelRegion]
		zone = node.Labels[labelZone]
		subzone = node.Labels[labelSubzone]
	}
	if zone == "" {
		zone = ptrString(sliceZone)
	}
	if region == "" && zone == "" && subzone == "" {
		return ""
	}
	return strings.TrimRight(region+"/"+zone+"/"+subzone, "/")
}

// CPULimit sums the CPU limits of the application containers, in cores; 0
// when any of them has none (the pod can then use more than the sum).
func CPULimit(pod *corev1.Pod) float64 {
	total := 0.0
	for _, c := range pod.Spec.Containers {
		if c.Name == "istio-proxy" {
			continue
		}
		q, ok := c.Resources.Limits[corev1.ResourceCPU]
		if !ok {
			return 0
		}
		total += q.AsApproximateFloat64()
	}
	return total
}

// VirtualAddress is the ServiceEntry's address: a stable hash of the host in
// 240.241.0.0/16, reserved address space (class E) that no pod or Service
// uses and that Istio's own auto-allocation (240.240.0.0/16) does not touch.
func VirtualAddress(host string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(host))
	v := h.Sum32() % 65534
	v++ // never 240.241.0.0
	return fmt.Sprintf("240.241.%d.%d", v>>8, v&0xff)
}

// invalidHost refuses an optimized host that would shadow a Kubernetes
// Service: Istio prefers the Service over a ServiceEntry of the same host and
// the mix sends pods twice, and a host of another Service would let an
// optimizer capture that Service's traffic.
func invalidHost(host, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if strings.Contains(h, "*") {
		return fmt.Sprintf("host %q: wildcards are not allowed for the optimized host", host)
	}
	if strings.HasSuffix(h, ".svc") || strings.HasSuffix(h, ".svc."+clusterDomain) || !strings.Contains(h, ".") {
		return fmt.Sprintf("host %q looks like a Kubernetes Service host; the optimized host must be a name of its own, such as <service>.<namespace>.adaptive", host)
	}
	return ""
}
