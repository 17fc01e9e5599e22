package desired

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

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
	// Keys are built once, not per comparison: at 4000 endpoints building
	// them in the comparator was a quarter of a reconcile. Indices are
	// sorted, not the endpoints, which are ten times larger to swap.
	type keyed struct {
		key string
		i   int
	}
	ks := make([]keyed, len(eps))
	for i, e := range eps {
		ks[i] = keyed{key(e), i}
	}
	slices.SortStableFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	out := make([]discoveryv1.Endpoint, len(ks))
	for i, k := range ks {
		out[i] = eps[k.i]
	}
	return out
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// ReasonTooManyEndpoints is the Stalled reason when the ready pods do not
// fit in one ServiceEntry.
const ReasonTooManyEndpoints = "TooManyEndpoints"

// PrimaryAddressType is the address family whose EndpointSlices are routed:
// the Service's first IP family (its ClusterIP's), IPv4 when unset. A
// dual-stack Service has a slice per family for the same pods; routing both
// would list every pod twice, doubling its share of the weights.
func PrimaryAddressType(svc *corev1.Service) discoveryv1.AddressType {
	if svc != nil && len(svc.Spec.IPFamilies) > 0 && svc.Spec.IPFamilies[0] == corev1.IPv6Protocol {
		return discoveryv1.AddressTypeIPv6
	}
	return discoveryv1.AddressTypeIPv4
}

// endpoints lists the ready pods of the slices of the Service's primary
// address family, one per address.
func endpoints(in Input, ports []Port) ([]Endpoint, []Problem) {
	var problems []Problem
	n := 0
	for _, s := range in.Slices {
		n += len(s.Endpoints)
	}
	eps := make([]Endpoint, 0, n)
	// seen holds each address taken, with the ordinal of its slice.
	seen := make(map[string]int, n)
	nodes := map[nodeZone]nodeFacts{}
	family := PrimaryAddressType(in.Service)
	for k, s := range sortedSlices(in.Slices) {
		if s.AddressType != family {
			continue
		}
		slicePorts := map[string]int32{}
		for _, p := range s.Ports {
			if p.Port != nil {
				slicePorts[ptrString(p.Name)] = *p.Port
			}
		}
		add := func(e discoveryv1.Endpoint) (repeated bool) {
			if !isReady(e) || len(e.Addresses) == 0 {
				return false
			}
			addr := e.Addresses[0]
			if from, dup := seen[addr]; dup {
				return from == k
			}
			seen[addr] = k
			eps = append(eps, endpoint(in, ports, e, addr, slicePorts, nodes))
			return false
		}
		// Which copy of an address repeated within a slice is kept must not
		// depend on the order the API listed them, so such a slice is read
		// in a canonical order (sortedEndpoints). Slices seldom repeat an
		// address, and ordering 4000 endpoints was a tenth of a reconcile:
		// a slice is read as listed, and read again in order only when it
		// repeats one.
		first := len(eps)
		for _, e := range s.Endpoints {
			if add(e) {
				for _, ep := range eps[first:] {
					delete(seen, ep.Address)
				}
				eps = eps[:first]
				for _, e := range sortedEndpoints(s.Endpoints) {
					add(e)
				}
				break
			}
		}
	}
	// Addresses are unique, so the order is total.
	slices.SortFunc(eps, func(a, b Endpoint) int {
		if c := strings.Compare(a.Pod, b.Pod); c != 0 {
			return c
		}
		return strings.Compare(a.Address, b.Address)
	})
	if len(eps) > MaxEndpoints {
		// Routing the first MaxEndpoints would leave the other ready pods
		// without mesh traffic. The Kubernetes Service routes them all:
		// the mirror leaves traffic there (it removes its VirtualService)
		// until the Service is back under the limit.
		problems = append(problems, Problem{Reason: ReasonTooManyEndpoints, Fatal: true,
			Message: fmt.Sprintf("%d ready endpoints exceed the limit of %d per ServiceEntry; traffic stays on the Kubernetes Service %s, which routes every pod, until the Service has at most %d ready endpoints",
				len(eps), MaxEndpoints, KubernetesHost(in.Service.Name, in.Service.Namespace, in.ClusterDomain), MaxEndpoints)})
		return nil, problems
	}
	byPod := in.Weights
	if in.WeightsFor != nil {
		byPod = in.WeightsFor(eps)
	}
	assignWeights(eps, byPod, in.LiveWeights)
	capLocalitySums(eps)
	return eps, problems
}

// nodeZone and nodeFacts: what an endpoint takes from its node, read once
// per node (and EndpointSlice zone) in a reconcile rather than per endpoint.
type nodeZone struct{ node, zone string }

type nodeFacts struct {
	locality, hardwareClass string
	cores                   float64
}

// endpoint is one ready address of a slice as the mirror routes it.
func endpoint(in Input, ports []Port, e discoveryv1.Endpoint, addr string, slicePorts map[string]int32, nodes map[nodeZone]nodeFacts) Endpoint {
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
		ep.CPURequest = CPURequest(pod)
		if ep.Node == "" {
			ep.Node = pod.Spec.NodeName
		}
	}
	key := nodeZone{ep.Node, ptrString(e.Zone)}
	f, ok := nodes[key]
	if !ok {
		node := in.Nodes[ep.Node]
		f.locality = locality(node, e.Zone)
		if node != nil {
			f.hardwareClass = node.Labels[corev1.LabelInstanceTypeStable]
			f.cores = NodeCores(node)
		}
		nodes[key] = f
	}
	ep.Locality, ep.HardwareClass, ep.NodeCores = f.locality, f.hardwareClass, f.cores
	for _, p := range ports {
		if n, ok := slicePorts[p.serviceName]; ok && uint32(n) != p.TargetPort && !explicitTarget(in.Optimizer, p.Number) {
			if ep.Ports == nil {
				ep.Ports = map[string]uint32{}
			}
			ep.Ports[p.Name] = uint32(n)
		}
	}
	return ep
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
		slices.Sort(ws)
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

const (
	// SidecarContainer is the name of Istio's proxy container.
	SidecarContainer = "istio-proxy"
	// SidecarStatusAnnotation is set by Istio's injector on every pod it
	// injected.
	SidecarStatusAnnotation = "sidecar.istio.io/status"
)

// HasSidecar says whether Istio injected a proxy into the pod.
func HasSidecar(pod *corev1.Pod) bool {
	if _, ok := pod.Annotations[SidecarStatusAnnotation]; ok {
		return true
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == SidecarContainer {
			return true
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name == SidecarContainer {
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

// CPURequest sums the CPU requests of the application containers (not the
// sidecar), in cores; a container without a request adds nothing, so the
// sum is a floor of what the pod may use, 0 when none requests CPU.
func CPURequest(pod *corev1.Pod) float64 {
	total := 0.0
	for _, c := range pod.Spec.Containers {
		if c.Name == SidecarContainer {
			continue
		}
		if q, ok := c.Resources.Requests[corev1.ResourceCPU]; ok {
			total += q.AsApproximateFloat64()
		}
	}
	return total
}

// NodeCores is a node's allocatable CPU in cores, 0 when unknown.
func NodeCores(node *corev1.Node) float64 {
	if q, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		return q.AsApproximateFloat64()
	}
	return 0
}

// CPULimit sums the CPU limits of the application containers, in cores; 0
// when any of them has none (the pod can then use more than the sum).
func CPULimit(pod *corev1.Pod) float64 {
	total := 0.0
	for _, c := range pod.Spec.Containers {
		if c.Name == SidecarContainer {
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
