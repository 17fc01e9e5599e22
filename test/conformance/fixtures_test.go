package conformance

// Fixtures: the user's Kubernetes objects (Service, EndpointSlice, Pods,
// Nodes) and, for now, hand-made copies of the Istio objects the operator
// will produce (ServiceEntry on the optimized host, VirtualService for the
// Kubernetes host, DestinationRule). Everything is derived from one fleet
// description, so the expectations in conformance_test.go are computed from
// the same data independently of how the Istio objects come to exist.
//
// The seam for the operator is istioProducer: handMadeIstio writes the
// objects itself; a producer backed by the operator's manager will create
// an optimizer instead and wait for its objects.

import (
	"context"
	"fmt"
	"sort"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

const (
	demoNS         = "demo"
	serviceName    = "web"
	serviceAccount = "web"
	kubeHost       = "web.demo.svc.cluster.local"
	optimizedHost  = "web.demo.adaptive"
	objectName     = "web-adaptive" // name of the SE, VS and DR
	trustDomain    = "cluster.local"

	labelRegion  = "topology.kubernetes.io/region"
	labelZone    = "topology.kubernetes.io/zone"
	labelSubzone = "topology.istio.io/subzone"
	labelTLSMode = "security.istio.io/tlsMode"
)

type nodeSpec struct {
	Name     string
	Locality harness.Locality
}

type podSpec struct {
	Name   string
	IP     string
	Node   string
	Ready  bool
	Weight uint32 // the weight the ServiceEntry carries for this pod
}

type portSpec struct {
	Name       string // Service port name; its prefix gives Istio the protocol
	Port       int32
	TargetPort int32
	Protocol   string // Istio protocol: HTTP, GRPC, TCP
}

// fleet is the whole scenario.
type fleet struct {
	Nodes []nodeSpec
	Pods  []podSpec
	Ports []portSpec
	// LocalityEnabled adds localityLbSetting and outlierDetection to the DR.
	LocalityEnabled bool
	// Routing: a VirtualService sends the Kubernetes host to the optimized
	// host (false = routing mode "none").
	Routing bool
	// SEAddresses, when set, become the ServiceEntry's spec.addresses (see
	// TestTCPPortCapture for why this matters for TCP ports).
	SEAddresses []string
}

func defaultFleet() fleet {
	return fleet{
		Nodes: []nodeSpec{
			{"node-a", harness.Locality{Region: "r1", Zone: "za", SubZone: "sa"}},
			{"node-b", harness.Locality{Region: "r1", Zone: "zb", SubZone: "sb"}},
			{"node-c", harness.Locality{Region: "r1", Zone: "zc", SubZone: "sc"}},
		},
		// Pod IPs are not loopback: the API server rejects EndpointSlice
		// addresses in 127.0.0.0/8 ("may not be in the loopback range").
		// Nothing here sends traffic, so any non-loopback address works.
		Pods: []podSpec{
			{"web-0", "10.244.1.1", "node-a", true, 100},
			{"web-1", "10.244.1.2", "node-b", true, 200},
			{"web-2", "10.244.1.3", "node-b", true, 300},
			{"web-3", "10.244.1.4", "node-c", true, 400},
			{"web-4", "10.244.1.5", "node-a", false, 500}, // not ready: must never be routed
		},
		Ports: []portSpec{
			{"http", 80, 8080, "HTTP"},
			{"grpc", 9090, 9090, "GRPC"},
			{"tcp", 5432, 5432, "TCP"},
		},
		Routing: true,
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

func (f *fleet) setPod(name string, mut func(*podSpec)) {
	for i := range f.Pods {
		if f.Pods[i].Name == name {
			mut(&f.Pods[i])
			return
		}
	}
	panic("unknown pod " + name)
}

// expectedEndpoint is what the sidecar must see for one ready pod on one port.
type expectedEndpoint struct {
	Key      string // ip:targetPort
	Weight   uint32
	Locality harness.Locality
}

func (f fleet) expectedEndpoints(p portSpec) []expectedEndpoint {
	var out []expectedEndpoint
	for _, pod := range f.readyPods() {
		out = append(out, expectedEndpoint{
			Key:      fmt.Sprintf("%s:%d", pod.IP, p.TargetPort),
			Weight:   pod.Weight,
			Locality: f.node(pod.Node).Locality,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// ---- The user's Kubernetes objects ----

func namespaceObj(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func nodeObj(n nodeSpec) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: n.Name,
		Labels: map[string]string{
			labelRegion:              n.Locality.Region,
			labelZone:                n.Locality.Zone,
			labelSubzone:             n.Locality.SubZone,
			"kubernetes.io/hostname": n.Name,
		},
	}}
}

func serviceAccountObj() *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount, Namespace: demoNS}}
}

func serviceObj(f fleet) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: serviceName, Namespace: demoNS, Labels: map[string]string{"app": serviceName}},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeClusterIP,
			Selector: map[string]string{"app": serviceName},
		},
	}
	for _, p := range f.Ports {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Port: p.Port, TargetPort: intstr.FromInt32(p.TargetPort), Protocol: corev1.ProtocolTCP,
		})
	}
	return svc
}

// podObj is a pod with an (as if injected) Istio sidecar.
func podObj(f fleet, p podSpec) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: demoNS,
			Labels: map[string]string{
				"app":                                 serviceName,
				labelTLSMode:                          "istio",
				"service.istio.io/canonical-name":     serviceName,
				"service.istio.io/canonical-revision": "v1",
			},
			Annotations: map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`},
		},
		Spec: corev1.PodSpec{
			NodeName:           p.Node,
			ServiceAccountName: serviceAccount,
			Containers: []corev1.Container{
				{Name: "app", Image: "example.invalid/web:1"},
				{Name: "istio-proxy", Image: "example.invalid/proxyv2:1"},
			},
		},
	}
	for _, port := range f.Ports {
		pod.Spec.Containers[0].Ports = append(pod.Spec.Containers[0].Ports, corev1.ContainerPort{Name: port.Name, ContainerPort: port.TargetPort})
	}
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
		HostIP: "127.0.0.1",
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: ready},
			{Type: corev1.ContainersReady, Status: ready},
		},
	}
}

func endpointSliceObj(f fleet) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: serviceName + "-abcde", Namespace: demoNS,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: serviceName,
				discoveryv1.LabelManagedBy:   "endpointslice-controller.k8s.io",
			},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	for _, p := range f.Ports {
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{
			Name: ptr.To(p.Name), Port: ptr.To(p.TargetPort), Protocol: ptr.To(corev1.ProtocolTCP),
		})
	}
	for _, p := range f.Pods {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{p.IP},
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr.To(p.Ready), Serving: ptr.To(p.Ready), Terminating: ptr.To(false),
			},
			NodeName:  ptr.To(p.Node),
			Zone:      ptr.To(f.node(p.Node).Locality.Zone),
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: demoNS, Name: p.Name},
		})
	}
	return es
}

// createKubernetesObjects creates the namespaces, Nodes, ServiceAccount,
// Service, Pods (with a running status) and the EndpointSlice.
func createKubernetesObjects(ctx context.Context, c client.Client, f fleet, extraNamespaces ...string) error {
	for _, ns := range append([]string{demoNS}, extraNamespaces...) {
		if err := createIgnoreExists(ctx, c, namespaceObj(ns)); err != nil {
			return err
		}
	}
	for _, n := range f.Nodes {
		if err := createIgnoreExists(ctx, c, nodeObj(n)); err != nil {
			return err
		}
	}
	if err := createIgnoreExists(ctx, c, serviceAccountObj()); err != nil {
		return err
	}
	if err := c.Create(ctx, serviceObj(f)); err != nil {
		return fmt.Errorf("create service: %w", err)
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
	return nil
}

// updatePodReadiness writes a pod's readiness to its status and the
// EndpointSlice, as the kubelet and the EndpointSlice controller would.
func updatePodReadiness(ctx context.Context, c client.Client, f fleet, name string) error {
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

func createIgnoreExists(ctx context.Context, c client.Client, obj client.Object) error {
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// ---- The Istio objects the operator will produce (hand-made for now) ----

func serviceEntryObj(f fleet) *istionet.ServiceEntry {
	se := &istionet.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Name: objectName, Namespace: demoNS}}
	se.Spec.Hosts = []string{optimizedHost}
	se.Spec.Location = networking.ServiceEntry_MESH_INTERNAL
	se.Spec.Resolution = networking.ServiceEntry_STATIC
	se.Spec.Addresses = f.SEAddresses
	for _, p := range f.Ports {
		se.Spec.Ports = append(se.Spec.Ports, &networking.ServicePort{
			Number: uint32(p.Port), Name: p.Name, Protocol: p.Protocol, TargetPort: uint32(p.TargetPort),
		})
	}
	for _, p := range f.readyPods() {
		se.Spec.Endpoints = append(se.Spec.Endpoints, &networking.WorkloadEntry{
			Address:        p.IP,
			Weight:         p.Weight,
			Locality:       f.node(p.Node).Locality.String(),
			Labels:         map[string]string{"app": serviceName, labelTLSMode: "istio"},
			ServiceAccount: serviceAccount,
		})
	}
	return se
}

func virtualServiceObj(f fleet) *istionet.VirtualService {
	vs := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Name: objectName, Namespace: demoNS}}
	vs.Spec.Hosts = []string{kubeHost}
	for _, p := range f.Ports {
		dest := &networking.Destination{Host: optimizedHost, Port: &networking.PortSelector{Number: uint32(p.Port)}}
		if p.Protocol == "TCP" {
			vs.Spec.Tcp = append(vs.Spec.Tcp, &networking.TCPRoute{
				Match: []*networking.L4MatchAttributes{{Port: uint32(p.Port)}},
				Route: []*networking.RouteDestination{{Destination: dest}},
			})
			continue
		}
		vs.Spec.Http = append(vs.Spec.Http, &networking.HTTPRoute{
			Name:  p.Name,
			Match: []*networking.HTTPMatchRequest{{Port: uint32(p.Port)}},
			Route: []*networking.HTTPRouteDestination{{Destination: dest}},
		})
	}
	return vs
}

func destinationRuleObj(f fleet) *istionet.DestinationRule {
	dr := &istionet.DestinationRule{ObjectMeta: metav1.ObjectMeta{Name: objectName, Namespace: demoNS}}
	dr.Spec.Host = optimizedHost
	lb := &networking.LoadBalancerSettings{
		LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_ROUND_ROBIN},
	}
	dr.Spec.TrafficPolicy = &networking.TrafficPolicy{LoadBalancer: lb}
	if f.LocalityEnabled {
		lb.LocalityLbSetting = &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(true)}
		dr.Spec.TrafficPolicy.OutlierDetection = &networking.OutlierDetection{
			Consecutive_5XxErrors: wrapperspb.UInt32(5),
			Interval:              durationpb.New(10 * time.Second),
			BaseEjectionTime:      durationpb.New(30 * time.Second),
		}
	}
	return dr
}

// istioProducer makes the live Istio objects match the fleet.
type istioProducer interface {
	Apply(ctx context.Context, f fleet) error
}

// handMadeIstio writes the Istio objects directly with the test's client.
type handMadeIstio struct{ c client.Client }

func (h handMadeIstio) Apply(ctx context.Context, f fleet) error {
	if err := upsert(ctx, h.c, serviceEntryObj(f), &istionet.ServiceEntry{}); err != nil {
		return err
	}
	if err := upsert(ctx, h.c, destinationRuleObj(f), &istionet.DestinationRule{}); err != nil {
		return err
	}
	if f.Routing {
		return upsert(ctx, h.c, virtualServiceObj(f), &istionet.VirtualService{})
	}
	vs := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Name: objectName, Namespace: demoNS}}
	if err := h.c.Delete(ctx, vs); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete virtualservice: %w", err)
	}
	return nil
}

// upsert creates want, or replaces the live object's spec with want's.
func upsert(ctx context.Context, c client.Client, want, live client.Object) error {
	err := c.Get(ctx, client.ObjectKeyFromObject(want), live)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, want); err != nil {
			return fmt.Errorf("create %T %s: %w", want, want.GetName(), err)
		}
		return nil
	case err != nil:
		return err
	}
	want.SetResourceVersion(live.GetResourceVersion())
	if err := c.Update(ctx, want); err != nil {
		return fmt.Errorf("update %T %s: %w", want, want.GetName(), err)
	}
	return nil
}
