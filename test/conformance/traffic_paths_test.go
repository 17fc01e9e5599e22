package conformance

// Gateways and Gateway API (issue 26): an ingress gateway's route to the
// Service, as a gateway proxy receives it from istiod, before and after the
// operator retargets it; routing_mode gateway_api, as a client sidecar
// receives it, compared with the VirtualService; and a user's mesh
// HTTPRoute for the Service detected as a conflict.
//
// Go runs a package's tests in file-name order; this file sorts after
// loadbalancer_test.go, whose default-policy check needs the demo
// optimizer's weights as learned right after set-up (a few seconds later
// the fake backend makes the engine drain a pod, and the policy falls back
// to LEAST_REQUEST for a while).

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// gatewayPort is the ingress gateway's HTTP server port (unprivileged, so
// istiod builds the listener whatever the proxy's privileges).
const gatewayPort = 8080

// dialGateway connects an xDS client posing as an ingress gateway pod in
// istio-system: node type "router" and the labels the Gateway selects.
func dialGateway(t *testing.T, ip string, labels map[string]string) *harness.XDSClient {
	t.Helper()
	x, err := harness.DialXDS(testCtx(t), suite.istiod.GRPCAddr, harness.SidecarOptions{
		NodeType: "router", IP: ip, Pod: "ingress-gateway-0", Namespace: harness.IstioNamespace, Labels: labels,
		Locality: suite.fleet.node("node-a").Locality,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	return x
}

// weightsByAddress are the endpoints of a cluster as address -> weight.
func weightsByAddress(x *harness.XDSClient, cluster string) (map[string]uint32, error) {
	eps, err := x.Endpoints(cluster)
	if err != nil {
		return nil, err
	}
	out := map[string]uint32{}
	for _, e := range eps {
		out[e.Address] = e.Weight
	}
	return out, nil
}

// seWeightsIn reads the operator's ServiceEntry weights in ns by address.
func seWeightsIn(ctx context.Context, ns string) (map[string]uint32, error) {
	se := &istionet.ServiceEntry{}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: objectName}, se); err != nil {
		return nil, err
	}
	out := map[string]uint32{}
	for _, e := range se.Spec.Endpoints {
		out[e.Address] = e.Weight
	}
	return out, nil
}

func sortedWeights(m map[string]uint32) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, m[k])
	}
	return b.String()
}

// routedWithWeights is a waitFor condition: the proxy's route in routeConfig for
// host goes to cluster want (single destination) and, when weights is set,
// that cluster's endpoints carry exactly those weights.
func routedWithWeights(routeConfig, host string, port int, want string, weights func() (map[string]uint32, error)) func(*harness.XDSClient) error {
	return func(x *harness.XDSClient) error {
		rt, err := x.RouteIn(routeConfig, host, port)
		if err != nil {
			return err
		}
		if len(rt.Clusters) != 1 || rt.Clusters[0].Name != want {
			return fmt.Errorf("%s in %s goes to %v, want %s", host, routeConfig, rt.Clusters, want)
		}
		got, err := weightsByAddress(x, want)
		if err != nil {
			return err
		}
		if len(got) == 0 {
			return fmt.Errorf("cluster %s has no endpoints", want)
		}
		if weights != nil {
			w, err := weights()
			if err != nil {
				return err
			}
			if sortedWeights(got) != sortedWeights(w) {
				return fmt.Errorf("cluster %s endpoints %s, want the ServiceEntry's %s", want, sortedWeights(got), sortedWeights(w))
			}
		}
		return nil
	}
}

func updateOptimizer(t *testing.T, ns, name string, mutate func(*optv1.IstioAdaptiveRequestOptimizer)) {
	t.Helper()
	err := poll(propagation, func() error {
		o := &optv1.IstioAdaptiveRequestOptimizer{}
		if err := suite.c.Get(testCtx(t), client.ObjectKey{Namespace: ns, Name: name}, o); err != nil {
			return err
		}
		mutate(o)
		return suite.c.Update(testCtx(t), o)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestIngressGatewayRetargeted: an ingress gateway (Istio Gateway and a
// VirtualService bound to it) routes the Service's host to the Kubernetes
// cluster, past the weights, while sidecars get the optimized host; the
// optimizer names the route in status. Listed in gateway_routes, the
// gateway's route goes to outbound|80||<optimized host> with the
// ServiceEntry's learned weights; unlisted, it goes back to the Kubernetes
// cluster.
func TestIngressGatewayRetargeted(t *testing.T) {
	ctx := testCtx(t)
	labels := map[string]string{"istio": "ingressgateway"}
	gw := &istionet.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: "ingress"}}
	gw.Spec.Selector = labels
	gw.Spec.Servers = []*networking.Server{{Port: &networking.Port{Number: gatewayPort, Name: "http", Protocol: "HTTP"}, Hosts: []string{"shop.example.com"}}}
	vs := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: "web-ingress"}}
	vs.Spec.Hosts = []string{"shop.example.com"}
	vs.Spec.Gateways = []string{"ingress"}
	vs.Spec.Http = []*networking.HTTPRoute{{Name: "web", Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: serviceName, Port: &networking.PortSelector{Number: 80}}}}}}
	for _, o := range []client.Object{gw, vs} {
		if err := suite.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		updateOptimizer(t, demoNS, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.GatewayRoutes = nil })
		_ = suite.c.Delete(context.Background(), vs)
		_ = suite.c.Delete(context.Background(), gw)
	})

	x := dialGateway(t, "127.0.9.200", labels)
	kube, opt := clusterName(80, "web.demo.svc.cluster.local"), clusterName(80, optimizedHost)
	routeConfig := fmt.Sprintf("http.%d", gatewayPort)
	learned := func() (map[string]uint32, error) { return seWeights(ctx, suite.c, suite.fleet) }

	d := waitFor(t, x, 30*time.Second, "before: the gateway routes to the Kubernetes cluster", routedWithWeights(routeConfig, "shop.example.com", gatewayPort, kube, nil))
	t.Logf("before: shop.example.com:%d -> %s (after %s)", gatewayPort, kube, d.Round(time.Millisecond))
	if w, _ := weightsByAddress(x, kube); slices.ContainsFunc(mapValues(w), func(v uint32) bool { return v > 1 }) {
		t.Errorf("the Kubernetes cluster carries weights %v", w)
	}

	want := "VirtualService demo/web-ingress http route 0 destination 0 web:80 → web.demo.adaptive:80"
	if err := poll(propagation, func() error {
		o := &optv1.IstioAdaptiveRequestOptimizer{}
		if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: optimizerName}, o); err != nil {
			return err
		}
		if len(o.Status.GatewayRoutes) != 1 || o.Status.GatewayRoutes[0].Change != want {
			return fmt.Errorf("status.gatewayRoutes %+v", o.Status.GatewayRoutes)
		}
		for _, c := range o.Status.Conditions {
			if c.Type == optv1.ConditionDegraded && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, want) {
				return nil
			}
		}
		return fmt.Errorf("no Degraded condition naming the route: %+v", o.Status.Conditions)
	}); err != nil {
		t.Fatal(err)
	}

	updateOptimizer(t, demoNS, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) {
		o.Spec.GatewayRoutes = []optv1.GatewayRoute{{Kind: optv1.GatewayRouteVirtualService, Name: "web-ingress"}}
	})
	d = waitFor(t, x, propagation, "retargeted: the gateway routes to the optimized host with the ServiceEntry's weights", routedWithWeights(routeConfig, "shop.example.com", gatewayPort, opt, learned))
	w, _ := weightsByAddress(x, opt)
	t.Logf("retargeted: shop.example.com:%d -> %s weights %s (after %s)", gatewayPort, opt, sortedWeights(w), d.Round(time.Millisecond))

	updateOptimizer(t, demoNS, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.GatewayRoutes = nil })
	d = waitFor(t, x, propagation, "restored: the gateway routes to the Kubernetes cluster", routedWithWeights(routeConfig, "shop.example.com", gatewayPort, kube, nil))
	t.Logf("restored: shop.example.com:%d -> %s (after %s)", gatewayPort, kube, d.Round(time.Millisecond))
	live := &istionet.VirtualService{}
	if err := suite.c.Get(ctx, client.ObjectKeyFromObject(vs), live); err != nil {
		t.Fatal(err)
	}
	if h := live.Spec.Http[0].Route[0].Destination.Host; h != serviceName || live.Annotations[desired.AnnotationRetargeted] != "" {
		t.Errorf("restored VirtualService has host %q and annotations %v", h, live.Annotations)
	}
}

func mapValues(m map[string]uint32) []uint32 {
	out := make([]uint32, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestGatewayAPIRoutingMatchesVirtualService: with routing_mode
// gateway_api the operator writes an HTTPRoute whose parent is the Service
// and whose backend is the optimized host (Istio's Hostname), and no
// VirtualService; a client sidecar gets the same weighted cluster as with
// routing_mode virtual_service, switching both ways; on deletion the
// HTTPRoute goes and the client is back on the Kubernetes cluster.
func TestGatewayAPIRoutingMatchesVirtualService(t *testing.T) {
	ctx := testCtx(t)
	s := meshService{ns: "gamma", ports: []corev1.ServicePort{httpPort("http", 80), httpPort("grpc-api", 9090), httpPort("tcp-db", 5432)}, ipBlock: 30}
	clusterIP := s.create(t)
	x := dialClient(t, "gamma-client", "127.0.9.201")
	kube, opt := clusterName(80, s.host()), clusterName(80, s.optimized())
	seW := func() (map[string]uint32, error) { return seWeightsIn(ctx, s.ns) }
	waitFor(t, x, propagation, "before: the Kubernetes cluster", reaches(s.host(), 80, kube))
	// The gRPC port (its GRPCRoute) and the TCP port (its TCPRoute, read
	// on the client's listener for the ClusterIP) go to the optimized host
	// with the same weights.
	otherPorts := func(want func(port int32, host string) string) func(*harness.XDSClient) error {
		return func(x *harness.XDSClient) error {
			if err := routedWithWeights("9090", s.host(), 9090, want(9090, s.optimized()), seW)(x); err != nil {
				return err
			}
			got, err := x.TCPCluster(5432, clusterIP)
			if err != nil {
				return err
			}
			if w := want(5432, s.optimized()); got != w {
				return fmt.Errorf("TCP to %s:5432 goes to %s, want %s", clusterIP, got, w)
			}
			return nil
		}
	}

	o := fixtures.Optimizer(s.ns, optimizerName, serviceName)
	o.Spec.RoutingMode = optv1.RoutingGatewayAPI
	if err := suite.c.Create(ctx, o); err != nil {
		t.Fatal(err)
	}
	d := waitFor(t, x, propagation, "gateway_api: the optimized host with the ServiceEntry's weights", routedWithWeights("80", s.host(), 80, opt, seW))
	waitFor(t, x, propagation, "gateway_api: gRPC and TCP ports on the optimized host", otherPorts(clusterName))
	seBefore, _ := seW()
	w, _ := weightsByAddress(x, opt)
	t.Logf("gateway_api: %s:80 -> %s weights %s (after %s)", s.host(), opt, sortedWeights(w), d.Round(time.Millisecond))
	route := &gwv1.HTTPRoute{}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: desired.MeshRouteName(serviceName, 80)}, route); err != nil {
		t.Fatalf("the operator's HTTPRoute: %v", err)
	}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: objectName}, &istionet.VirtualService{}); !apierrors.IsNotFound(err) {
		t.Errorf("a VirtualService exists in gateway_api mode (%v)", err)
	}
	if err := poll(propagation, func() error {
		live := &optv1.IstioAdaptiveRequestOptimizer{}
		if err := suite.c.Get(ctx, client.ObjectKeyFromObject(o), live); err != nil {
			return err
		}
		if !slices.Equal(live.Status.OwnedRoutes, []string{"GRPCRoute/web-adaptive-9090", "HTTPRoute/web-adaptive-80", "TCPRoute/web-adaptive-5432"}) {
			return fmt.Errorf("status.ownedRoutes %v", live.Status.OwnedRoutes)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	updateOptimizer(t, s.ns, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = optv1.RoutingVirtualService })
	waitFor(t, x, propagation, "virtual_service: the same cluster and weights", routedWithWeights("80", s.host(), 80, opt, seW))
	waitFor(t, x, propagation, "virtual_service: gRPC and TCP ports on the optimized host", otherPorts(clusterName))
	if err := poll(propagation, func() error {
		err := suite.c.Get(ctx, client.ObjectKeyFromObject(route), &gwv1.HTTPRoute{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the HTTPRoute stays in virtual_service mode (%v)", err)
	}); err != nil {
		t.Error(err)
	}
	// Each mode was waited for with the ServiceEntry's weights of its
	// moment; the operator's first cycle may write new ones between the
	// two, so the two modes' weights are compared only when it did not
	// (the log says when the comparison was left to the waits).
	vw, _ := weightsByAddress(x, opt)
	switch seAfter, _ := seW(); {
	case sortedWeights(seAfter) != sortedWeights(seBefore):
		t.Logf("the ServiceEntry's weights moved between the two modes (%s, then %s): each mode was checked against its own", sortedWeights(seBefore), sortedWeights(seAfter))
	case sortedWeights(vw) != sortedWeights(w):
		t.Errorf("weights with the VirtualService %s, with the HTTPRoute %s (the ServiceEntry's %s throughout)", sortedWeights(vw), sortedWeights(w), sortedWeights(seAfter))
	}

	updateOptimizer(t, s.ns, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = optv1.RoutingGatewayAPI })
	waitFor(t, x, propagation, "back to gateway_api: the same cluster and weights", routedWithWeights("80", s.host(), 80, opt, seW))
	if err := poll(propagation, func() error {
		err := suite.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: objectName}, &istionet.VirtualService{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the operator's VirtualService stays in gateway_api mode (%v)", err)
	}); err != nil {
		t.Error(err)
	}

	if err := suite.c.Delete(ctx, o); err != nil {
		t.Fatal(err)
	}
	waitFor(t, x, propagation, "deleted: back to the Kubernetes cluster", reaches(s.host(), 80, kube))
	if err := poll(propagation, func() error {
		err := suite.c.Get(ctx, client.ObjectKeyFromObject(route), &gwv1.HTTPRoute{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("the HTTPRoute outlives the optimizer (%v)", err)
	}); err != nil {
		t.Error(err)
	}
}

// TestUserMeshHTTPRouteIsAConflict: a user's HTTPRoute with the Service as
// parent (GAMMA) competes with the operator's VirtualService for the host;
// the optimizer says so (Degraded/MeshRouteConflict) and adds no
// VirtualService next to it, so the client keeps what the user's route
// says.
func TestUserMeshHTTPRouteIsAConflict(t *testing.T) {
	ctx := testCtx(t)
	s := meshService{ns: "gamma-user", ports: []corev1.ServicePort{httpPort("http", 80)}, ipBlock: 31}
	s.create(t)
	x := dialClient(t, "gamma-user-client", "127.0.9.202")
	port := gwv1.PortNumber(80)
	user := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "web-canary"}}
	user.Spec.ParentRefs = []gwv1.ParentReference{{Group: ptrTo(gwv1.Group("")), Kind: ptrTo(gwv1.Kind("Service")), Name: serviceName}}
	user.Spec.Rules = []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: serviceName, Port: &port}}}}}}
	if err := suite.c.Create(ctx, user); err != nil {
		t.Fatal(err)
	}
	s.optIn(t)
	msg := s.condition(t, optv1.ConditionDegraded, metav1.ConditionTrue, desired.ReasonMeshRouteConflict)
	if !strings.Contains(msg, "HTTPRoute gamma-user/web-canary has Service gamma-user/web as its parent") {
		t.Errorf("condition message %q", msg)
	}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: objectName}, &istionet.VirtualService{}); !apierrors.IsNotFound(err) {
		t.Errorf("the operator wrote a VirtualService next to the user's mesh route (%v)", err)
	}
	waitFor(t, x, propagation, "the client follows the user's route", reaches(s.host(), 80, clusterName(80, s.host())))
}

func ptrTo[T any](v T) *T { return &v }

// TestGatewayAPIIngressRetargeted: a Gateway API Gateway (class istio) and
// an HTTPRoute bound to it with a backendRef to the Service. An xDS client
// posing as that gateway's pod (node type router, the gateway-name label
// its Service selects) routes to the Kubernetes cluster; with the HTTPRoute
// listed in gateway_routes its backendRef becomes Istio's Hostname backend
// of the optimized host and the gateway routes to the optimized cluster
// with the ServiceEntry's weights; unlisted, back to the Kubernetes cluster.
func TestGatewayAPIIngressRetargeted(t *testing.T) {
	ctx := testCtx(t)
	const gwName, gwPort, hostname = "web-gw", 8081, "shop-api.example.com"
	labels := map[string]string{"gateway.networking.k8s.io/gateway-name": gwName}
	class := &gwv1.GatewayClass{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Spec: gwv1.GatewayClassSpec{ControllerName: "istio.io/gateway-controller"}}
	if err := suite.c.Create(ctx, class); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	gw := &gwv1.Gateway{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: gwName}}
	gw.Spec.GatewayClassName = "istio"
	gw.Spec.Listeners = []gwv1.Listener{{Name: "http", Port: gwPort, Protocol: gwv1.HTTPProtocolType, Hostname: ptrTo(gwv1.Hostname(hostname))}}
	// The Service istio would deploy for the Gateway (<name>-<class>); the
	// gateway proxy is its workload by labels.
	gwSvc := fixtures.Service(demoNS, gwName+"-istio", httpPort("http", gwPort))
	gwSvc.Spec.Selector = labels
	port := gwv1.PortNumber(80)
	route := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: demoNS, Name: "web-api"}}
	route.Spec.ParentRefs = []gwv1.ParentReference{{Name: gwName}}
	route.Spec.Hostnames = []gwv1.Hostname{hostname}
	route.Spec.Rules = []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: serviceName, Port: &port}}}}}}
	for _, o := range []client.Object{gwSvc, gw, route} {
		if err := suite.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		updateOptimizer(t, demoNS, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.GatewayRoutes = nil })
		for _, o := range []client.Object{route, gw, gwSvc} {
			_ = suite.c.Delete(context.Background(), o)
		}
	})

	x, err := harness.DialXDS(ctx, suite.istiod.GRPCAddr, harness.SidecarOptions{
		NodeType: "router", IP: "127.0.9.203", Pod: gwName + "-istio-0", Namespace: demoNS, Labels: labels,
		Locality: suite.fleet.node("node-a").Locality,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	kube, opt := clusterName(80, "web.demo.svc.cluster.local"), clusterName(80, optimizedHost)
	routeConfig := fmt.Sprintf("http.%d", gwPort)
	learned := func() (map[string]uint32, error) { return seWeights(ctx, suite.c, suite.fleet) }

	d := waitFor(t, x, 30*time.Second, "before: the gateway routes to the Kubernetes cluster", routedWithWeights(routeConfig, hostname, gwPort, kube, nil))
	t.Logf("before: %s:%d -> %s (after %s)", hostname, gwPort, kube, d.Round(time.Millisecond))

	updateOptimizer(t, demoNS, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) {
		o.Spec.GatewayRoutes = []optv1.GatewayRoute{{Kind: optv1.GatewayRouteHTTPRoute, Name: "web-api"}}
	})
	d = waitFor(t, x, propagation, "retargeted: the gateway routes to the optimized host with the ServiceEntry's weights", routedWithWeights(routeConfig, hostname, gwPort, opt, learned))
	w, _ := weightsByAddress(x, opt)
	t.Logf("retargeted: %s:%d -> %s weights %s (after %s)", hostname, gwPort, opt, sortedWeights(w), d.Round(time.Millisecond))

	updateOptimizer(t, demoNS, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.GatewayRoutes = nil })
	d = waitFor(t, x, propagation, "restored: the gateway routes to the Kubernetes cluster", routedWithWeights(routeConfig, hostname, gwPort, kube, nil))
	t.Logf("restored: %s:%d -> %s (after %s)", hostname, gwPort, kube, d.Round(time.Millisecond))
	live := &gwv1.HTTPRoute{}
	if err := suite.c.Get(ctx, client.ObjectKeyFromObject(route), live); err != nil {
		t.Fatal(err)
	}
	b := live.Spec.Rules[0].BackendRefs[0].BackendObjectReference
	if b.Name != serviceName || (b.Kind != nil && *b.Kind != "Service") || live.Annotations[desired.AnnotationRetargeted] != "" {
		t.Errorf("restored backendRef %+v, annotations %v", b, live.Annotations)
	}
}
