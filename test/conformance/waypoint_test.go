package conformance

// Ambient Services behind a waypoint (last in file order: it runs its own
// API server, istiod and manager, load the suite's shared engine should not
// see while the other tests assert learned weights): istiod in ambient mode
// (PILOT_ENABLE_AMBIENT=true) with the Gateway API CRDs, a waypoint (its
// Gateway of class istio-waypoint, Service and pod) bound to the Service's
// namespace, ambient pods without sidecars, and the operator's real
// manager. An xDS client poses as the waypoint proxy, the way istiod
// recognises one (node type "waypoint", label
// gateway.istio.io/managed=istio.io-mesh-controller, its pod behind the
// waypoint's Service), and reads what the waypoint gets for the Service.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// gatewayAPICRDs is the directory of the Gateway API standard CRDs of the
// module version this project pins.
func gatewayAPICRDs(t *testing.T) string {
	t.Helper()
	dir, err := harness.GatewayAPICRDs()
	if err != nil {
		t.Fatalf("the Gateway API CRDs: %v", err)
	}
	return dir
}

func unstructuredObj(apiVersion, kind, ns, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "spec": spec}}
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

// TestWaypointGetsTheWeights: the waypoint's route for the Service goes to
// the optimized host's cluster; that cluster has the ServiceEntry's weights
// per pod with their locality, the DestinationRule's ROUND_ROBIN, and mTLS
// to the pods (HBONE through ztunnel); the ServiceEntry is bound to the
// waypoint.
func TestWaypointGetsTheWeights(t *testing.T) {
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start an API server: %v", err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	if _, err := envtest.InstallCRDs(api.Config, envtest.CRDInstallOptions{Paths: []string{gatewayAPICRDs(t)}, ErrorIfPathMissing: true}); err != nil {
		t.Fatalf("install the Gateway API CRDs: %v", err)
	}
	c, err := client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	const ns = "ambw"
	nsObj := fixtures.Namespace(ns)
	nsObj.Labels = map[string]string{desired.LabelDataplaneMode: "ambient", desired.LabelUseWaypoint: "waypoint"}
	node := fixtures.Node("node-w", "r1", "zw", "sw", "m5.large")
	mustCreateAll(t, ctx, c, nsObj, node)

	// The waypoint: its GatewayClass and Gateway, its Service and pod.
	gc := unstructuredObj("gateway.networking.k8s.io/v1", "GatewayClass", "", "istio-waypoint", map[string]any{"controllerName": "istio.io/mesh-controller"})
	gw := unstructuredObj("gateway.networking.k8s.io/v1", "Gateway", ns, "waypoint", map[string]any{
		"gatewayClassName": "istio-waypoint",
		"listeners":        []any{map[string]any{"name": "mesh", "port": int64(15008), "protocol": "HBONE"}},
	})
	gw.SetLabels(map[string]string{"istio.io/waypoint-for": "service"})
	wpLabels := map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint", "gateway.istio.io/managed": "istio.io-mesh-controller"}
	wpSvc := &corev1.Service{}
	wpSvc.Namespace, wpSvc.Name, wpSvc.Labels = ns, "waypoint", wpLabels
	wpSvc.Spec.Selector = map[string]string{"gateway.networking.k8s.io/gateway-name": "waypoint"}
	wpSvc.Spec.Ports = []corev1.ServicePort{{Name: "mesh", Port: 15008, TargetPort: intstr.FromInt32(15008), AppProtocol: ptrTo("all")}}
	mustCreateAll(t, ctx, c, gc, gw, wpSvc)
	if err := c.Get(ctx, client.ObjectKeyFromObject(wpSvc), wpSvc); err != nil {
		t.Fatal(err)
	}
	gw.Object["status"] = map[string]any{"addresses": []any{map[string]any{"type": "IPAddress", "value": wpSvc.Spec.ClusterIP}}}
	if err := c.Status().Update(ctx, gw); err != nil {
		t.Fatalf("set the waypoint Gateway's address: %v", err)
	}
	const wpIP = "198.18.60.1"
	wpPod := fixtures.Pod(ns, "waypoint-0", "waypoint", "node-w")
	for k, v := range wpLabels {
		wpPod.Labels[k] = v
	}
	mustCreateAll(t, ctx, c, wpPod)
	wpPod.Status = podStatus(podSpec{Name: "waypoint-0", IP: wpIP, Ready: true})
	if err := c.Status().Update(ctx, wpPod); err != nil {
		t.Fatal(err)
	}
	mustCreateAll(t, ctx, c, fixtures.EndpointSlice(ns, "waypoint-abcde", "waypoint", []fixtures.SlicePort{{Name: "mesh", Port: 15008}}, fixtures.Ready("waypoint-0", wpIP, "node-w")))

	// The Service: two ambient pods (no sidecar, the namespace enrols them).
	mustCreateAll(t, ctx, c, fixtures.Service(ns, serviceName, httpPort("http", 80)))
	var eps []fixtures.Endpoint
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("web-%d", i)
		pod := fixtures.Pod(ns, name, serviceName, "node-w", fixtures.WithServiceAccount(serviceAccount))
		mustCreateAll(t, ctx, c, pod)
		pod.Status = podStatus(podSpec{Name: name, IP: fixtures.IP(61, i), Ready: true})
		if err := c.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, fixtures.Ready(name, fixtures.IP(61, i), "node-w"))
	}
	mustCreateAll(t, ctx, c, fixtures.EndpointSlice(ns, serviceName+"-abcde", serviceName, []fixtures.SlicePort{{Name: "http", Port: 80}}, eps...))

	istiod, err := harness.StartIstiodWithOptions(api, harness.IstiodOptions{Env: []string{"PILOT_ENABLE_AMBIENT=true"}})
	if err != nil {
		t.Fatalf("start istiod in ambient mode: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- istiod log tail ---\n%s", istiod.LogTail(80))
		}
		_ = istiod.Stop()
	})

	// The operator, with the conformance suite's fake metrics backend.
	// A second manager in this process: its controllers have the suite's names.
	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{Scheme: harness.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, Cache: controllers.CacheOptions(nil),
		Controller: config.Controller{SkipNameValidation: ptrTo(true)}})
	if err != nil {
		t.Fatal(err)
	}
	// The suite's engine settings, and a fake backend that gives web-2 three
	// times web-1's capacity, so the weights are learned and unequal (a
	// default or duplicate weight cannot pass for them).
	engine := controllers.DefaultEngineDefaults()
	engine.Cycle = cycle
	engine.Params.QueryWindow = 2 * time.Second
	engine.Params.ScrapeInterval = 0
	engine.Params.Smoothing = 1
	engine.Params.MinimizeLatency = false
	backend := newFakeMetrics(engine.CPUQuery, engine.RequestQuery, fleet{Pods: []podSpec{
		{"web-1", fixtures.IP(61, 1), "node-w", true, 100}, {"web-2", fixtures.IP(61, 2), "node-w", true, 300},
	}})
	if err := controllers.Setup(ctx, mgr, controllers.Dependencies{Clock: clock.RealClock{}, Metrics: metrics.New(), ClusterDomain: trustDomain, Source: backend,
		Options: controllers.Options{MaxConcurrentReconciles: 1, Engine: engine}}); err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { stop(); <-done })
	mustCreateAll(t, ctx, c, fixtures.Optimizer(ns, optimizerName, serviceName))

	host, optimized := serviceName+"."+ns+".svc.cluster.local", serviceName+"."+ns+".adaptive"
	var weights map[string]uint32
	if err := poll(60*time.Second, func() error {
		se, err := getServiceEntry(ctx, c, ns)
		if err != nil {
			return err
		}
		if se.Labels[desired.LabelUseWaypoint] != "waypoint" {
			return fmt.Errorf("ServiceEntry labels %v, want it bound to the waypoint", se.Labels)
		}
		weights = map[string]uint32{}
		for _, e := range se.Spec.Endpoints {
			if e.Labels[desired.LabelTunnel] != "http" || e.Labels[desired.LabelTLSMode] != "istio" {
				return fmt.Errorf("endpoint %s labels %v", e.Address, e.Labels)
			}
			weights[e.Address] = e.Weight
		}
		if len(weights) != 2 || weights[fixtures.IP(61, 2)] < 2*weights[fixtures.IP(61, 1)] {
			return fmt.Errorf("weights %v, want web-2 learned at about 3x web-1", weights)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	wp, err := harness.DialXDS(ctx, istiod.GRPCAddr, harness.SidecarOptions{
		NodeType: "waypoint", IP: wpIP, Pod: "waypoint-0", Namespace: ns, ServiceAccount: "waypoint", Labels: wpLabels,
		Locality: harness.Locality{Region: "r1", Zone: "zw", SubZone: "sw"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wp.Close)
	// Bound to the waypoint, the optimized host is one of the waypoint's own
	// services: istiod gives it an inbound-vip cluster.
	optimizedCluster := "inbound-vip|80|http|" + optimized
	var route harness.RouteTarget
	err = wp.WaitFor(60*time.Second, func(x *harness.XDSClient) error {
		var err error
		if route, err = x.WaypointRoute(host, 80); err != nil {
			return err
		}
		if len(route.Clusters) != 1 || route.Clusters[0].Name != optimizedCluster {
			return fmt.Errorf("the waypoint routes %s:80 to %v, want %s", host, route.Clusters, optimizedCluster)
		}
		cla := x.RawEndpoints(optimizedCluster)
		if cla == nil {
			return fmt.Errorf("no endpoints for %s", optimizedCluster)
		}
		seen := 0
		for _, g := range cla.GetEndpoints() {
			if l := g.GetLocality(); l.GetRegion() != "r1" || l.GetZone() != "zw" || l.GetSubZone() != "sw" {
				return fmt.Errorf("endpoints in locality %v, want r1/zw/sw", l)
			}
			for _, lb := range g.GetLbEndpoints() {
				addr := harness.TunnelTarget(lb)
				ip, _, _ := strings.Cut(addr, ":")
				w, ok := weights[ip]
				if !ok || lb.GetLoadBalancingWeight().GetValue() != w {
					return fmt.Errorf("endpoint %q weight %d, want the ServiceEntry's %v", addr, lb.GetLoadBalancingWeight().GetValue(), weights)
				}
				if lb.GetEndpoint().GetAddress().GetEnvoyInternalAddress() == nil {
					return fmt.Errorf("endpoint %s is not reached through the HBONE tunnel", addr)
				}
				seen++
			}
		}
		if seen != len(weights) {
			return fmt.Errorf("%d endpoints, want %d", seen, len(weights))
		}
		opt, plain := x.RawCluster(optimizedCluster), x.RawCluster("inbound-vip|80|http|"+host)
		if opt.GetLbPolicy() != clusterv3.Cluster_ROUND_ROBIN || plain.GetLbPolicy() != clusterv3.Cluster_LEAST_REQUEST {
			return fmt.Errorf("lb policy: optimized %v (want the DestinationRule's ROUND_ROBIN), Kubernetes host %v (want Istio's LEAST_REQUEST)", opt.GetLbPolicy(), plain.GetLbPolicy())
		}
		if x.RawCluster("connect_originate").GetTransportSocket() == nil {
			return fmt.Errorf("the HBONE tunnel cluster connect_originate has no TLS transport socket")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("what the waypoint gets: %v\n%s\nmain_internal: %s", err, wp.Dump(), wp.DescribeListener("main_internal"))
	}
	t.Logf("waypoint: %s:80 -> %v via %s; weights %v (ServiceEntry), locality r1/zw/sw, ROUND_ROBIN, HBONE (mTLS) to the pods",
		host, route.Clusters, route.RouteConfig, weights)
}

func mustCreateAll(t *testing.T, ctx context.Context, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func getServiceEntry(ctx context.Context, c client.Client, ns string) (*istionet.ServiceEntry, error) {
	se := &istionet.ServiceEntry{}
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: objectName}, se)
	return se, err
}
