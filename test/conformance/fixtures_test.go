package conformance

// Fixtures: the user's side of the contract (Nodes with topology labels,
// a ServiceAccount, a Service, Pods with an injected sidecar, an
// EndpointSlice, an IstioAdaptiveRequestOptimizer) and a fake metrics
// backend. The Istio objects are never written here: the operator's real
// manager produces them. Expectations are computed from the fleet
// description (which pods are ready, where, on which ports), independently
// of the operator; only the weights are taken from the live ServiceEntry,
// since proving that the sidecar gets "exactly the ServiceEntry's weights"
// is the point.

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

const (
	demoNS         = "demo"
	clientNS       = "client"
	serviceName    = "web"
	serviceAccount = "web-sa"
	optimizerName  = "web"
	kubeHost       = "web.demo.svc.cluster.local"
	optimizedHost  = "web.demo.adaptive"
	objectName     = "web-adaptive" // the operator's ServiceEntry, VirtualService, DestinationRule
	trustDomain    = "cluster.local"
	sliceName      = "web-x7k2p"
)

type nodeSpec struct {
	Name     string
	Locality harness.Locality
}

type podSpec struct {
	Name  string
	IP    string
	Node  string
	Ready bool
	// Capacity is the pod's requests per CPU-second, what the fake metrics
	// backend reports (requests and CPU) so the weight engine can learn it.
	Capacity float64
}

type portSpec struct {
	Name     string // Service port name (also the EndpointSlice port name)
	Port     int32
	Target   intstr.IntOrString // Service targetPort
	PodPort  int32              // what the pods listen on (the resolved target)
	Protocol optv1.Protocol     // the optimizer's service_ports protocol
}

// fleet is the whole scenario: three zones of one region, four ready pods
// and one that never is, and one port of each protocol. The gRPC port has a
// named targetPort, resolved from the EndpointSlice.
type fleet struct {
	Nodes []nodeSpec
	Pods  []podSpec
	Ports []portSpec
}

func defaultFleet() fleet {
	return fleet{
		Nodes: []nodeSpec{
			{"node-a", harness.Locality{Region: "r1", Zone: "za", SubZone: "sa"}},
			{"node-b", harness.Locality{Region: "r1", Zone: "zb", SubZone: "sb"}},
			{"node-c", harness.Locality{Region: "r1", Zone: "zc", SubZone: "sc"}},
		},
		// Pod IPs are identifiers only (198.18.0.0/15): the API server
		// rejects loopback EndpointSlice addresses, and nothing is sent.
		Pods: []podSpec{
			{"web-0", fixtures.IP(1, 1), "node-a", true, 100},
			{"web-1", fixtures.IP(1, 2), "node-b", true, 200},
			{"web-2", fixtures.IP(1, 3), "node-b", true, 300},
			{"web-3", fixtures.IP(1, 4), "node-c", true, 400},
			{"web-4", fixtures.IP(1, 5), "node-a", false, 250}, // never ready: must never be routed
		},
		Ports: []portSpec{
			{"http", 80, intstr.FromInt32(8080), 8080, optv1.ProtocolHTTP},
			{"grpc", 9090, intstr.FromString("grpc-app"), 50051, optv1.ProtocolGRPC},
			{"tcp", 5432, intstr.FromInt32(6432), 6432, optv1.ProtocolTCP},
		},
	}
}

func (f fleet) node(name string) nodeSpec {
	for _, n := range f.Nodes {
		if n.Name == name {
			return n
		}
	}
	panic("unknown node " + name)
}

func (f fleet) readyPods() []podSpec {
	var out []podSpec
	for _, p := range f.Pods {
		if p.Ready {
			out = append(out, p)
		}
	}
	return out
}

func (f *fleet) setReady(name string, ready bool) {
	for i := range f.Pods {
		if f.Pods[i].Name == name {
			f.Pods[i].Ready = ready
			return
		}
	}
	panic("unknown pod " + name)
}

// ---- The user's Kubernetes objects ----

func serviceObj(f fleet) *corev1.Service {
	var ports []corev1.ServicePort
	for _, p := range f.Ports {
		ports = append(ports, fixtures.ServicePort(p.Name, p.Port, p.Target))
	}
	return fixtures.Service(demoNS, serviceName, ports...)
}

// podObj is a pod with an (as if injected) Istio sidecar and a service account.
func podObj(f fleet, p podSpec) *corev1.Pod {
	opts := []fixtures.PodOption{fixtures.WithSidecar(), fixtures.WithServiceAccount(serviceAccount)}
	for _, port := range f.Ports {
		name := port.Name
		if port.Target.Type == intstr.String {
			name = port.Target.StrVal
		}
		opts = append(opts, fixtures.WithContainerPort(name, port.PodPort))
	}
	pod := fixtures.Pod(demoNS, p.Name, serviceName, p.Node, opts...)
	pod.Labels["security.istio.io/tlsMode"] = "istio"
	return pod
}

func podStatus(p podSpec) corev1.PodStatus {
	ready := corev1.ConditionFalse
	if p.Ready {
		ready = corev1.ConditionTrue
	}
	return corev1.PodStatus{
		Phase:  corev1.PodRunning,
		PodIP:  p.IP,
		PodIPs: []corev1.PodIP{{IP: p.IP}},
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()},
			{Type: corev1.ContainersReady, Status: ready, LastTransitionTime: metav1.Now()},
		},
	}
}

// endpointSliceObj is the slice the EndpointSlice controller would write.
func endpointSliceObj(f fleet) *discoveryv1.EndpointSlice {
	var ports []fixtures.SlicePort
	for _, p := range f.Ports {
		ports = append(ports, fixtures.SlicePort{Name: p.Name, Port: p.PodPort})
	}
	var eps []fixtures.Endpoint
	for _, p := range f.Pods {
		if p.Ready {
			eps = append(eps, fixtures.Ready(p.Name, p.IP, p.Node))
		} else {
			eps = append(eps, fixtures.NotReady(p.Name, p.IP, p.Node))
		}
	}
	s := fixtures.EndpointSlice(demoNS, sliceName, serviceName, ports, eps...)
	s.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	for i, p := range f.Pods {
		s.Endpoints[i].Zone = ptr.To(f.node(p.Node).Locality.Zone)
	}
	return s
}

// optimizerObj is the user's resource, in the seed's spelling: all three
// ports with their protocols, default routing, locality off.
func optimizerObj(f fleet) *optv1.IstioAdaptiveRequestOptimizer {
	var ports []optv1.ServicePort
	for _, p := range f.Ports {
		ports = append(ports, optv1.ServicePort{Number: p.Port, Protocol: p.Protocol})
	}
	return fixtures.Optimizer(demoNS, optimizerName, serviceName, ports...)
}

// createKubernetesObjects creates namespaces, Nodes, the ServiceAccount,
// Service, Pods (with a running status), the EndpointSlice and the optimizer.
func createKubernetesObjects(ctx context.Context, c client.Client, f fleet) error {
	objs := []client.Object{fixtures.Namespace(demoNS), fixtures.Namespace(clientNS)}
	for _, n := range f.Nodes {
		node := fixtures.Node(n.Name, n.Locality.Region, n.Locality.Zone, n.Locality.SubZone, "m5.large")
		node.Labels["kubernetes.io/hostname"] = n.Name
		objs = append(objs, node)
	}
	objs = append(objs, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: serviceAccount}}, serviceObj(f))
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	for _, p := range f.Pods {
		pod := podObj(f, p)
		if err := c.Create(ctx, pod); err != nil {
			return fmt.Errorf("create pod %s: %w", p.Name, err)
		}
		pod.Status = podStatus(p)
		if err := c.Status().Update(ctx, pod); err != nil {
			return fmt.Errorf("pod %s status: %w", p.Name, err)
		}
	}
	if err := c.Create(ctx, endpointSliceObj(f)); err != nil {
		return fmt.Errorf("create endpointslice: %w", err)
	}
	if err := c.Create(ctx, optimizerObj(f)); err != nil {
		return fmt.Errorf("create optimizer: %w", err)
	}
	return nil
}

// setPodReadiness writes a pod's readiness to its status and to the
// EndpointSlice's conditions, as the kubelet and the EndpointSlice
// controller would.
func setPodReadiness(ctx context.Context, c client.Client, f fleet, name string) error {
	for _, p := range f.Pods {
		if p.Name != name {
			continue
		}
		pod := &corev1.Pod{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: name}, pod); err != nil {
			return err
		}
		pod.Status = podStatus(p)
		if err := c.Status().Update(ctx, pod); err != nil {
			return err
		}
	}
	want := endpointSliceObj(f)
	live := &discoveryv1.EndpointSlice{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(want), live); err != nil {
		return err
	}
	live.Endpoints = want.Endpoints
	return c.Update(ctx, live)
}

// ---- What the operator wrote ----

// liveServiceEntry reads the operator's ServiceEntry.
func liveServiceEntry(ctx context.Context, c client.Client) (*istionet.ServiceEntry, error) {
	se := &istionet.ServiceEntry{}
	err := c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: objectName}, se)
	return se, err
}

// seWeights is the ServiceEntry's weight of each endpoint address. It fails
// when the ServiceEntry's endpoints are not exactly the fleet's ready pods.
func seWeights(ctx context.Context, c client.Client, f fleet) (map[string]uint32, error) {
	se, err := liveServiceEntry(ctx, c)
	if err != nil {
		return nil, err
	}
	w := map[string]uint32{}
	for _, e := range se.Spec.Endpoints {
		if _, dup := w[e.Address]; dup {
			return nil, fmt.Errorf("ServiceEntry lists %s twice", e.Address)
		}
		w[e.Address] = e.Weight
	}
	var want, got []string
	for _, p := range f.readyPods() {
		want = append(want, p.IP)
	}
	for a := range w {
		got = append(got, a)
	}
	sort.Strings(want)
	sort.Strings(got)
	if fmt.Sprint(want) != fmt.Sprint(got) {
		return nil, fmt.Errorf("ServiceEntry endpoints %v, want the ready pods %v", got, want)
	}
	return w, nil
}

// expectedEndpoint is what the sidecar must see for one ready pod on one port.
type expectedEndpoint struct {
	Key      string // ip:targetPort
	Weight   uint32
	Locality harness.Locality
}

// expectedEndpoints: every ready pod, on the port's resolved target port, in
// its node's locality, with the ServiceEntry's weight.
func (f fleet) expectedEndpoints(p portSpec, weights map[string]uint32) []expectedEndpoint {
	var out []expectedEndpoint
	for _, pod := range f.readyPods() {
		out = append(out, expectedEndpoint{
			Key:      fmt.Sprintf("%s:%d", pod.IP, p.PodPort),
			Weight:   weights[pod.IP],
			Locality: f.node(pod.Node).Locality,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// ---- A fake metrics backend ----

// fakeMetrics answers the weight loop's two queries (CPU cores and requests
// per second, by pod) from each pod's capacity: the pods serve requestRate
// each on average, split as the live weights split the traffic (equally
// without them), so that what a pod serves is what it is sent, as in a
// Service below capacity; each uses CPU in inverse proportion to its
// capacity. How the queries reach Prometheus is proven in
// test/integration; here only the weights' way from the engine to the
// sidecar matters.
type fakeMetrics struct {
	cpuQuery, requestQuery string
	// weights, when set, reads the live weights by pod.
	weights func() map[string]uint32

	mu       sync.Mutex
	capacity map[string]float64
	queries  int
}

// shares is each pod's share of the traffic under the live weights; equal
// where a pod has no weight.
func (m *fakeMetrics) shares(pods []string) map[string]float64 {
	var w map[string]uint32
	if m.weights != nil {
		w = m.weights()
	}
	out := make(map[string]float64, len(pods))
	sum := 0.0
	for _, p := range pods {
		if v, ok := w[p]; ok && v > 0 && len(w) == len(pods) {
			out[p] = float64(v)
		} else {
			out[p] = 1
		}
		sum += out[p]
	}
	for p := range out {
		out[p] /= sum
	}
	return out
}

const requestRate = 50.0 // per pod, requests per second

func newFakeMetrics(cpuQuery, requestQuery string, f fleet) *fakeMetrics {
	m := &fakeMetrics{cpuQuery: cpuQuery, requestQuery: requestQuery}
	m.set(f)
	return m
}

// set makes the backend report the fleet's capacities from now on.
func (m *fakeMetrics) set(f fleet) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.capacity = map[string]float64{}
	for _, p := range f.Pods {
		m.capacity[p.Name] = p.Capacity
	}
}

func (m *fakeMetrics) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.queries
}

func (m *fakeMetrics) Query(_ context.Context, tmpl string, t promsource.Target, _ time.Time) (promsource.Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.queries++
	res := promsource.Result{Values: map[string]float64{}, Query: tmpl, Latency: time.Millisecond}
	share := m.shares(t.Pods)
	for _, pod := range t.Pods {
		c, ok := m.capacity[pod]
		if !ok || c <= 0 {
			res.Missing = append(res.Missing, pod)
			continue
		}
		rate := requestRate * float64(len(t.Pods)) * share[pod]
		switch tmpl {
		case m.cpuQuery:
			res.Values[pod] = rate / c
		case m.requestQuery:
			res.Values[pod] = rate
		default:
			return res, fmt.Errorf("fake metrics: unexpected query %q", tmpl)
		}
	}
	if len(res.Values) == 0 {
		return res, &promsource.EmptyResultError{Query: tmpl}
	}
	return res, nil
}
