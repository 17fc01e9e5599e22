// Package conformance proves, against a real istiod (pilot-discovery built
// into bin/ by `make istiod`) and a real API server (envtest), that the Istio
// objects the operator's manager writes make a sidecar receive what the
// product promises: routes of the Kubernetes host to the optimized host,
// exactly the ready pods with exactly the ServiceEntry's weights and
// localities, ROUND_ROBIN, auto-mTLS, locality priorities, fast propagation
// of weight and readiness changes, routing mode "none", and no TCP capture.
// The sidecar is an xDS client posing as one (test/harness/xds.go). See
// docs/conformance.md.
package conformance

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

const (
	// propagation is how fast a change must reach the sidecar ("within a
	// few seconds"), from the moment it is made in the API server.
	propagation = 5 * time.Second
	// cycle is the weight engine's period in this suite.
	cycle = time.Second
)

var suite struct {
	api     *harness.APIServer
	istiod  *harness.Istiod
	c       client.Client
	metrics *fakeMetrics
	fleet   fleet
	// clusterIP of the Kubernetes Service.
	clusterIP string
	// sidecars in zone a and zone b of region r1, namespace "client".
	zoneA, zoneB *harness.XDSClient
}

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: conformance setup:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	start := time.Now()
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(logLevel())))
	// The Gateway API CRDs are installed, as in most meshes today: every
	// test runs with them, and the Gateway API tests need them.
	api, err := harness.StartAPIServerWithOptions(harness.APIServerOptions{GatewayAPI: true})
	if err != nil {
		return 1, err
	}
	defer func() { _ = api.Stop() }()
	suite.api = api

	istiod, err := harness.StartIstiodWithOptions(api, harness.IstiodOptions{Env: []string{
		// Outside a cluster nothing would run the Deployments istiod
		// creates for Gateway API Gateways; the routes need no Deployment
		// (the gateway tests pass with it on as well).
		"PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER=false",
	}})
	if err != nil {
		return 1, err
	}
	defer func() { _ = istiod.Stop() }()
	suite.istiod = istiod
	fmt.Fprintf(os.Stderr, "conformance: API server and istiod ready in %s (istiod xDS %s)\n", time.Since(start).Round(time.Millisecond), istiod.GRPCAddr)

	if suite.c, err = client.New(api.Config, client.Options{Scheme: harness.Scheme()}); err != nil {
		return 1, err
	}
	suite.fleet = defaultFleet()

	// The operator: the real manager, in-process, with a weight engine
	// that cycles every second and takes a new estimate at once (no
	// smoothing), fed by the fake metrics backend.
	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{Scheme: harness.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, Cache: controllers.CacheOptions(nil)})
	if err != nil {
		return 1, err
	}
	engine := controllers.DefaultEngineDefaults()
	engine.Cycle = cycle
	engine.Params.QueryWindow = 2 * time.Second
	engine.Params.ScrapeInterval = 0
	engine.Params.Smoothing = 1
	// The fake backend reports a lightly loaded fleet (every pod at the same
	// request rate, no CPU limits), where the engine's default latency split
	// would favour the fast pods beyond their capacity shares. This suite
	// proves what istiod does with the weights, so it uses plain capacity
	// shares; the split itself is proven in internal/weights and test/bench.
	engine.Params.MinimizeLatency = false
	suite.metrics = newFakeMetrics(engine.CPUQuery, engine.RequestQuery, suite.fleet)
	mctx, stopManager := context.WithCancel(context.Background())
	if err := controllers.Setup(mctx, mgr, controllers.Dependencies{
		Clock: clock.RealClock{}, Metrics: metrics.New(), ClusterDomain: trustDomain, Source: suite.metrics,
		Options: controllers.Options{MaxConcurrentReconciles: 2, Engine: engine},
	}); err != nil {
		stopManager()
		return 1, err
	}
	managerDone := make(chan error, 1)
	go func() { managerDone <- mgr.Start(mctx) }()
	defer func() {
		stopManager()
		if err := <-managerDone; err != nil {
			fmt.Fprintln(os.Stderr, "conformance: manager stopped with error:", err)
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := createKubernetesObjects(ctx, suite.c, suite.fleet); err != nil {
		return 1, err
	}
	svc := &corev1.Service{}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: serviceName}, svc); err != nil {
		return 1, err
	}
	suite.clusterIP = svc.Spec.ClusterIP
	suite.metrics.weights = func() map[string]uint32 {
		se, err := liveServiceEntry(context.Background(), suite.c)
		if err != nil {
			return nil
		}
		byIP := map[string]string{}
		for _, p := range suite.fleet.Pods {
			byIP[p.IP] = p.Name
		}
		w := map[string]uint32{}
		for _, e := range se.Spec.Endpoints {
			w[byIP[e.Address]] = e.Weight
		}
		return w
	}

	// Every test starts from weights the engine learned (unequal, so a
	// duplicate or a default weight cannot pass for the right one).
	var learned map[string]uint32
	if err := poll(30*time.Second, func() error {
		learned, err = seWeights(ctx, suite.c, suite.fleet)
		if err != nil {
			return err
		}
		if err := sharesFollow(learned, suite.fleet, 0.1); err != nil {
			return err
		}
		// The policy keeps Istio's default LEAST_REQUEST until the weights
		// have been learned for a query window; the tests start from the
		// ROUND_ROBIN that follows.
		dr := &istionet.DestinationRule{}
		if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: objectName}, dr); err != nil {
			return err
		}
		if lb := dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple(); lb != networking.LoadBalancerSettings_ROUND_ROBIN {
			o := &optv1.IstioAdaptiveRequestOptimizer{}
			_ = suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: optimizerName}, o)
			var conds []string
			for _, c := range o.Status.Conditions {
				conds = append(conds, fmt.Sprintf("%s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message))
			}
			return fmt.Errorf("DestinationRule load balancer %v, want ROUND_ROBIN once learned; optimizer status: %s", lb, strings.Join(conds, "; "))
		}
		return nil
	}); err != nil {
		return 1, fmt.Errorf("the operator never wrote capacity-proportional weights under ROUND_ROBIN: %w", err)
	}
	fmt.Fprintf(os.Stderr, "conformance: operator wrote learned weights %v after %s\n", byPod(suite.fleet, learned), time.Since(start).Round(time.Millisecond))

	for _, s := range []struct {
		dst  **harness.XDSClient
		opts harness.SidecarOptions
	}{
		{&suite.zoneA, harness.SidecarOptions{IP: "127.0.9.1", Pod: "client-a", Namespace: clientNS, Locality: suite.fleet.node("node-a").Locality}},
		{&suite.zoneB, harness.SidecarOptions{IP: "127.0.9.2", Pod: "client-b", Namespace: clientNS, Locality: suite.fleet.node("node-b").Locality}},
	} {
		x, err := harness.DialXDS(ctx, istiod.GRPCAddr, s.opts)
		if err != nil {
			return 1, err
		}
		defer x.Close()
		*s.dst = x
		// Every test starts from a synced sidecar whose routes already point
		// at the optimized host, so each can also run alone (-run).
		err = x.WaitFor(60*time.Second, func(x *harness.XDSClient) error {
			if err := x.Synced(); err != nil {
				return err
			}
			for _, p := range suite.fleet.Ports {
				if got, err := target(x, p); err != nil || got != clusterName(p.Port, optimizedHost) {
					return fmt.Errorf("port %d goes to %q (%v)", p.Port, got, err)
				}
				// ... with the DestinationRule's ROUND_ROBIN, written above.
				if info, err := x.Cluster(clusterName(p.Port, optimizedHost)); err != nil || info.LbPolicy != "ROUND_ROBIN" {
					return fmt.Errorf("cluster of port %d not yet ROUND_ROBIN (%v)", p.Port, err)
				}
			}
			return nil
		})
		if err != nil {
			return 1, fmt.Errorf("sidecar %s never synced: %w\n%s", x.NodeID(), err, x.Dump())
		}
	}
	fmt.Fprintf(os.Stderr, "conformance: sidecars synced after %s\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "--- istiod log tail ---\n%s\n--- sidecar zone b ---\n%s", istiod.LogTail(60), suite.zoneB.Dump())
	}
	fmt.Fprintf(os.Stderr, "conformance: total %s (%d metrics queries answered)\n", time.Since(start).Round(time.Millisecond), suite.metrics.count())
	return code, nil
}

func logLevel() zapcore.Level {
	if os.Getenv("TEST_VERBOSE") != "" {
		return zapcore.InfoLevel
	}
	return zapcore.ErrorLevel
}

func clusterName(port int32, host string) string {
	return fmt.Sprintf("outbound|%d||%s", port, host)
}

// poll retries cond every 50ms until it returns nil or timeout passes.
func poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitFor fails the test when cond does not hold on x within timeout, and
// returns how long it took.
func waitFor(t *testing.T, x *harness.XDSClient, timeout time.Duration, what string, cond func(*harness.XDSClient) error) time.Duration {
	t.Helper()
	start := time.Now()
	if err := x.WaitFor(timeout, cond); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, x.Dump())
	}
	return time.Since(start)
}

// target is where the sidecar sends traffic for the Kubernetes host on port
// p: the HTTP route (HTTP, gRPC) or the TCP listener chain of the ClusterIP.
func target(x *harness.XDSClient, p portSpec) (string, error) {
	if p.Protocol == optv1.ProtocolTCP {
		return x.TCPCluster(int(p.Port), suite.clusterIP)
	}
	return x.RouteCluster(kubeHost, int(p.Port))
}

// patchOptimizer changes the user's optimizer.
// routesTo is a condition for waitFor: the sidecar's route (or TCP chain)
// for the Kubernetes host's port p goes to cluster want.
func routesTo(p portSpec, want string) func(*harness.XDSClient) error {
	return func(x *harness.XDSClient) error {
		got, err := target(x, p)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s:%d goes to %s, want %s", kubeHost, p.Port, got, want)
		}
		return nil
	}
}

func patchOptimizer(t *testing.T, mut func(*optv1.IstioAdaptiveRequestOptimizer)) {
	t.Helper()
	ctx := testCtx(t)
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: optimizerName}, o); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(o.DeepCopy())
	mut(o)
	if err := suite.c.Patch(ctx, o, patch); err != nil {
		t.Fatal(err)
	}
}

// sidecarMatchesServiceEntry checks every port's optimized cluster against
// the fleet's ready pods and the live ServiceEntry's weights.
func sidecarMatchesServiceEntry(ctx context.Context, x *harness.XDSClient, f fleet) error {
	w, err := seWeights(ctx, suite.c, f)
	if err != nil {
		return err
	}
	for _, p := range f.Ports {
		if err := checkEndpoints(x, clusterName(p.Port, optimizedHost), f.expectedEndpoints(p, w)); err != nil {
			return err
		}
	}
	return nil
}

// checkEndpoints compares a cluster's endpoints with the expected ones:
// same set (no duplicates, nothing missing or extra), same weight, same
// locality, each locality in one priority group, healthy.
func checkEndpoints(x *harness.XDSClient, cluster string, want []expectedEndpoint) error {
	eps, err := x.Endpoints(cluster)
	if err != nil {
		return err
	}
	var problems []string
	groupOf := map[harness.Locality]uint32{} // locality -> priority, must be one group
	got := map[string]harness.Endpoint{}
	for _, e := range eps {
		if _, dup := got[e.Key()]; dup {
			problems = append(problems, "duplicate endpoint "+e.Key())
		}
		got[e.Key()] = e
		if pr, ok := groupOf[e.Locality]; ok && pr != e.Priority {
			problems = append(problems, fmt.Sprintf("locality %s split over priorities %d and %d", e.Locality, pr, e.Priority))
		}
		groupOf[e.Locality] = e.Priority
	}
	for _, w := range want {
		e, ok := got[w.Key]
		if !ok {
			problems = append(problems, "missing "+w.Key)
			continue
		}
		if e.Weight != w.Weight {
			problems = append(problems, fmt.Sprintf("%s weight %d, want %d", w.Key, e.Weight, w.Weight))
		}
		if e.Locality != w.Locality {
			problems = append(problems, fmt.Sprintf("%s locality %s, want %s", w.Key, e.Locality, w.Locality))
		}
		if e.Health != "HEALTHY" && e.Health != "UNKNOWN" {
			problems = append(problems, fmt.Sprintf("%s health %s", w.Key, e.Health))
		}
		delete(got, w.Key)
	}
	for k := range got {
		problems = append(problems, "unexpected endpoint "+k)
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("cluster %s: %s (got %+v)", cluster, strings.Join(problems, "; "), eps)
	}
	return nil
}

// checkLocalityGroups asserts that the ClusterLoadAssignment has exactly
// one group (Envoy's LocalityLbEndpoints) per locality of the ready pods,
// weighted by the sum of its endpoints' weights.
func checkLocalityGroups(t *testing.T, x *harness.XDSClient, cluster string, f fleet) []string {
	t.Helper()
	cla := x.RawEndpoints(cluster)
	if cla == nil {
		t.Fatalf("no ClusterLoadAssignment for %s", cluster)
	}
	want := map[string]bool{}
	for _, p := range f.readyPods() {
		want[f.node(p.Node).Locality.String()] = true
	}
	var groups []string
	seen := map[string]bool{}
	for _, g := range cla.GetEndpoints() {
		loc := harness.Locality{Region: g.GetLocality().GetRegion(), Zone: g.GetLocality().GetZone(), SubZone: g.GetLocality().GetSubZone()}.String()
		if seen[loc] {
			t.Errorf("%s: locality %s appears in two groups", cluster, loc)
		}
		seen[loc] = true
		var sum uint32
		for _, e := range g.GetLbEndpoints() {
			sum += e.GetLoadBalancingWeight().GetValue()
		}
		if lw := g.GetLoadBalancingWeight().GetValue(); lw != sum {
			t.Errorf("%s: locality %s group weight %d, its endpoints' weights sum to %d", cluster, loc, lw, sum)
		}
		groups = append(groups, fmt.Sprintf("%s=%d endpoints/weight %d", loc, len(g.GetLbEndpoints()), sum))
	}
	if !maps.Equal(seen, want) {
		t.Errorf("%s: locality groups %v, want one per locality of the ready pods %v", cluster, slices.Sorted(maps.Keys(seen)), slices.Sorted(maps.Keys(want)))
	}
	return groups
}

// sharesFollow says whether each ready pod's share of the total weight is
// within tol (relative) of its share of the total capacity.
func sharesFollow(w map[string]uint32, f fleet, tol float64) error {
	var wsum, csum float64
	for _, p := range f.readyPods() {
		wsum += float64(w[p.IP])
		csum += p.Capacity
	}
	for _, p := range f.readyPods() {
		got, want := float64(w[p.IP])/wsum, p.Capacity/csum
		if math.Abs(got-want) > tol*want {
			return fmt.Errorf("%s has %.3f of the weight, %.3f of the capacity (weights %v)", p.Name, got, want, byPod(f, w))
		}
	}
	return nil
}

// orderedLike says whether the ready pods' weights are strictly ordered
// like their capacities.
func orderedLike(w map[string]uint32, f fleet) bool {
	pods := f.readyPods()
	sort.Slice(pods, func(i, j int) bool { return pods[i].Capacity < pods[j].Capacity })
	for i := 1; i < len(pods); i++ {
		if w[pods[i-1].IP] >= w[pods[i].IP] {
			return false
		}
	}
	return true
}

// byPod renders weights by address as pod=weight.
func byPod(f fleet, w map[string]uint32) string {
	var out []string
	for _, p := range f.Pods {
		if v, ok := w[p.IP]; ok {
			out = append(out, fmt.Sprintf("%s=%d", p.Name, v))
		}
	}
	return strings.Join(out, " ")
}

// TestOperatorObjects: what the operator wrote into the API server, read as
// Istio reads it: the ServiceEntry on its own host with a virtual address,
// MESH_INTERNAL, STATIC, one port per Service port with the resolved target
// port (the gRPC one named), one endpoint per ready pod with locality,
// service account and the tlsMode label; a ROUND_ROBIN DestinationRule; a
// VirtualService for the Kubernetes host.
func TestOperatorObjects(t *testing.T) {
	ctx := testCtx(t)
	f := suite.fleet
	se, err := liveServiceEntry(ctx, suite.c)
	if err != nil {
		t.Fatal(err)
	}
	s := &se.Spec
	if !slices.Equal(s.Hosts, []string{optimizedHost}) || !slices.Equal(s.Addresses, []string{desired.VirtualAddress(optimizedHost)}) ||
		s.Location != networking.ServiceEntry_MESH_INTERNAL || s.Resolution != networking.ServiceEntry_STATIC {
		t.Errorf("ServiceEntry hosts %v addresses %v location %s resolution %s", s.Hosts, s.Addresses, s.Location, s.Resolution)
	}
	var gotPorts, wantPorts []string
	for _, p := range s.Ports {
		gotPorts = append(gotPorts, fmt.Sprintf("%d/%s->%d", p.Number, p.Protocol, p.TargetPort))
	}
	for _, p := range f.Ports {
		wantPorts = append(wantPorts, fmt.Sprintf("%d/%s->%d", p.Port, strings.ToUpper(string(p.Protocol)), p.PodPort))
	}
	if !slices.Equal(gotPorts, wantPorts) {
		t.Errorf("ServiceEntry ports %v, want %v", gotPorts, wantPorts)
	}
	if _, err := seWeights(ctx, suite.c, f); err != nil {
		t.Error(err)
	}
	ips := map[string]podSpec{}
	for _, p := range f.Pods {
		ips[p.IP] = p
	}
	for _, e := range s.Endpoints {
		p := ips[e.Address]
		if e.Locality != f.node(p.Node).Locality.String() || e.ServiceAccount != serviceAccount || e.Labels[desired.LabelTLSMode] != "istio" || e.Weight == 0 || len(e.Ports) != 0 {
			t.Errorf("endpoint %s: locality %q sa %q labels %v weight %d ports %v", e.Address, e.Locality, e.ServiceAccount, e.Labels, e.Weight, e.Ports)
		}
	}
	t.Logf("ServiceEntry %s: host %s addresses %v ports %v endpoints %d", objectName, optimizedHost, s.Addresses, gotPorts, len(s.Endpoints))

	dr := &istionet.DestinationRule{}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: objectName}, dr); err != nil {
		t.Fatal(err)
	}
	if dr.Spec.Host != optimizedHost || dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple() != networking.LoadBalancerSettings_ROUND_ROBIN {
		t.Errorf("DestinationRule host %s policy %v", dr.Spec.Host, dr.Spec.GetTrafficPolicy())
	}
	vs := &istionet.VirtualService{}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: objectName}, vs); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vs.Spec.Hosts, []string{kubeHost}) || len(vs.Spec.Http) != 2 || len(vs.Spec.Tcp) != 1 {
		t.Errorf("VirtualService hosts %v, %d HTTP and %d TCP routes, want [%s], 2 and 1", vs.Spec.Hosts, len(vs.Spec.Http), len(vs.Spec.Tcp), kubeHost)
	}
}

// TestRoutesGoToOptimizedHost: the sidecar's route (HTTP, gRPC) or TCP
// listener chain for the Kubernetes host goes to the optimized host's
// cluster, and the Service's ClusterIP stays among the virtual host's domains.
func TestRoutesGoToOptimizedHost(t *testing.T) {
	for _, p := range suite.fleet.Ports {
		t.Run(p.Name, func(t *testing.T) {
			want := clusterName(p.Port, optimizedHost)
			for _, x := range []*harness.XDSClient{suite.zoneA, suite.zoneB} {
				waitFor(t, x, propagation, "route for "+p.Name, routesTo(p, want))
			}
			if p.Protocol == optv1.ProtocolTCP {
				tr, _ := suite.zoneB.TCPRoute(int(p.Port), suite.clusterIP)
				t.Logf("TCP %s:%d -> listener %s chain %q -> %v", suite.clusterIP, p.Port, tr.Listener, tr.FilterChain, tr.Clusters)
				return
			}
			rt, err := suite.zoneB.Route(kubeHost, int(p.Port))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("HTTP %s:%d -> route config %q vhost %q route %q -> %v", kubeHost, p.Port, rt.RouteConfig, rt.VirtualHost, rt.RouteName, rt.Clusters)
			if !slices.Contains(rt.Domains, suite.clusterIP) && !slices.Contains(rt.Domains, fmt.Sprintf("%s:%d", suite.clusterIP, p.Port)) {
				t.Errorf("virtual host %s lost the Service's ClusterIP %s from its domains %v", rt.VirtualHost, suite.clusterIP, rt.Domains)
			}
		})
	}
}

// TestOptimizedClusterEndpoints: the optimized cluster of each port has exactly
// the ready pods on the target port with exactly the ServiceEntry weights,
// grouped by locality, no duplicates; lb_policy ROUND_ROBIN; auto-mTLS with
// the pods' service account SAN.
func TestOptimizedClusterEndpoints(t *testing.T) {
	ctx := testCtx(t)
	wantSAN := fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, demoNS, serviceAccount)
	for _, p := range suite.fleet.Ports {
		t.Run(p.Name, func(t *testing.T) {
			cluster := clusterName(p.Port, optimizedHost)
			x := suite.zoneB
			var w map[string]uint32
			waitFor(t, x, propagation, "endpoints of "+cluster, func(x *harness.XDSClient) error {
				var err error
				if w, err = seWeights(ctx, suite.c, suite.fleet); err != nil {
					return err
				}
				return checkEndpoints(x, cluster, suite.fleet.expectedEndpoints(p, w))
			})
			groups := checkLocalityGroups(t, x, cluster, suite.fleet)
			eps, _ := x.Endpoints(cluster)
			for _, e := range eps {
				if e.Priority != 0 {
					t.Errorf("%s priority %d without locality load balancing, want 0", e.Key(), e.Priority)
				}
				if e.TLSMode != "istio" {
					t.Errorf("%s tlsMode %q, want istio", e.Key(), e.TLSMode)
				}
			}
			info, err := x.Cluster(cluster)
			if err != nil {
				t.Fatal(err)
			}
			if info.Type != "EDS" {
				t.Errorf("cluster type %s, want EDS", info.Type)
			}
			if info.LbPolicy != "ROUND_ROBIN" {
				t.Errorf("lb_policy %s, want ROUND_ROBIN", info.LbPolicy)
			}
			if info.AutoMTLS == nil {
				t.Fatalf("no auto-mTLS transport socket match (matches: %v)", info.TransportSocketMatches)
			}
			if !slices.Equal(info.AutoMTLS.SANs, []string{wantSAN}) {
				t.Errorf("auto-mTLS SANs %v, want [%s]", info.AutoMTLS.SANs, wantSAN)
			}
			t.Logf("%s: type %s lb %s mTLS SANs %v SNI %q; %d endpoints on port %d, weights %s; groups %v",
				cluster, info.Type, info.LbPolicy, info.AutoMTLS.SANs, info.AutoMTLS.SNI, len(eps), p.PodPort, byPod(suite.fleet, w), groups)
		})
	}
}

// TestIstiodEndpointIndex: istiod's own index (/debug/endpointShardz) holds
// the ServiceEntry's endpoints once per port, with weight, locality, the
// SPIFFE identity of the service account and tlsMode.
func TestIstiodEndpointIndex(t *testing.T) {
	ctx := testCtx(t)
	weights, err := seWeights(ctx, suite.c, suite.fleet)
	if err != nil {
		t.Fatal(err)
	}
	z, err := suite.istiod.EndpointShardz(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eps := z.Endpoints(optimizedHost, demoNS)
	if want := len(suite.fleet.readyPods()) * len(suite.fleet.Ports); len(eps) != want {
		t.Fatalf("endpointShardz has %d endpoints for %s, want %d: %+v", len(eps), optimizedHost, want, eps)
	}
	wantSA := fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, demoNS, serviceAccount)
	for _, e := range eps {
		if len(e.Addresses) != 1 || weights[e.Addresses[0]] != e.LbWeight {
			t.Errorf("endpoint %v weight %d, want %d", e.Addresses, e.LbWeight, weights[e.Addresses[0]])
		}
		if e.Locality.Label == "" || e.ServiceAccount != wantSA || e.TLSMode != "istio" {
			t.Errorf("endpoint %v: locality %q sa %q tlsMode %q", e.Addresses, e.Locality.Label, e.ServiceAccount, e.TLSMode)
		}
	}
	t.Logf("endpointShardz: %d endpoints for %s (%d pods x %d ports)", len(eps), optimizedHost, len(suite.fleet.readyPods()), len(suite.fleet.Ports))
}

// TestLocalityPriorities: with locality_enabled the operator's
// DestinationRule turns on locality load balancing and outlier detection,
// and a client in zone b gets zone b at priority 0 and the other zones
// after it; a client in zone a sees zone a first. Turning it off puts every
// locality back at priority 0.
func TestLocalityPriorities(t *testing.T) {
	ctx := testCtx(t)
	f := suite.fleet
	start := time.Now()
	patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.LocalityEnabled = true })
	defer func() {
		start := time.Now()
		patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.LocalityEnabled = false })
		for _, p := range f.Ports {
			cluster := clusterName(p.Port, optimizedHost)
			waitFor(t, suite.zoneB, propagation, "priority 0 everywhere after locality_enabled=false on "+cluster, func(x *harness.XDSClient) error {
				eps, err := x.Endpoints(cluster)
				if err != nil {
					return err
				}
				for _, e := range eps {
					if e.Priority != 0 {
						return fmt.Errorf("%s still at priority %d", e.Key(), e.Priority)
					}
				}
				return nil
			})
		}
		t.Logf("locality_enabled=false: every locality back at priority 0 after %s", time.Since(start).Round(time.Millisecond))
	}()

	for _, p := range f.Ports {
		t.Run(p.Name, func(t *testing.T) {
			cluster := clusterName(p.Port, optimizedHost)
			for _, c := range []struct {
				x    *harness.XDSClient
				zone string
			}{{suite.zoneB, "zb"}, {suite.zoneA, "za"}} {
				waitFor(t, c.x, propagation, "locality priorities for a client in "+c.zone, func(x *harness.XDSClient) error {
					eps, err := x.Endpoints(cluster)
					if err != nil {
						return err
					}
					for _, e := range eps {
						local := e.Locality.Zone == c.zone
						if local && e.Priority != 0 {
							return fmt.Errorf("%s in own zone %s at priority %d", e.Key(), c.zone, e.Priority)
						}
						if !local && e.Priority == 0 {
							return fmt.Errorf("%s in zone %s at priority 0 for a client in %s", e.Key(), e.Locality.Zone, c.zone)
						}
					}
					return sidecarMatchesServiceEntry(ctx, x, f)
				})
				info, err := c.x.Cluster(cluster)
				if err != nil {
					t.Fatal(err)
				}
				if !info.OutlierDetection || info.LbPolicy != "ROUND_ROBIN" {
					t.Errorf("cluster %s: outlier detection %v, lb %s", cluster, info.OutlierDetection, info.LbPolicy)
				}
				eps, _ := c.x.Endpoints(cluster)
				var prios []string
				for _, e := range eps {
					prios = append(prios, fmt.Sprintf("%s=%d", e.Locality, e.Priority))
				}
				t.Logf("client in zone %s: %s (%s after the patch)", c.zone, strings.Join(slices.Compact(prios), " "), time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// TestWeightChangeReachesSidecar: the weight engine learns new capacities
// (the fake backend now reports them reversed) and writes new weights; every
// weight set the operator writes into the ServiceEntry reaches the sidecar,
// on every port, within a few seconds of being written.
func TestWeightChangeReachesSidecar(t *testing.T) {
	ctx := testCtx(t)
	f := suite.fleet
	f.Pods = slices.Clone(f.Pods)
	caps := map[string]float64{"web-0": 400, "web-1": 300, "web-2": 200, "web-3": 100}
	for i := range f.Pods {
		if c, ok := caps[f.Pods[i].Name]; ok {
			f.Pods[i].Capacity = c
		}
	}
	before, err := seWeights(ctx, suite.c, f)
	if err != nil {
		t.Fatal(err)
	}
	type version struct {
		weights map[string]uint32
		written time.Duration // since the capacities changed
		lag     time.Duration // until the sidecar had it (or a later version); -1 = not yet
	}
	versions := []*version{{weights: before, lag: 0}}
	matches := func(w map[string]uint32) bool {
		for _, p := range f.Ports {
			if checkEndpoints(suite.zoneB, clusterName(p.Port, optimizedHost), f.expectedEndpoints(p, w)) != nil {
				return false
			}
		}
		return true
	}
	start := time.Now()
	suite.metrics.set(f)
	suite.fleet = f
	deadline := start.Add(30 * time.Second)
	for {
		now := time.Since(start)
		w, err := seWeights(ctx, suite.c, f)
		if err != nil {
			t.Fatal(err)
		}
		if last := versions[len(versions)-1]; !maps.Equal(w, last.weights) {
			versions = append(versions, &version{weights: w, written: now, lag: -1})
		}
		for i := len(versions) - 1; i >= 0; i-- {
			if versions[i].lag >= 0 || !matches(versions[i].weights) {
				continue
			}
			// The sidecar holds version i: it and every earlier version
			// not seen yet (superseded before istiod pushed) are done.
			for _, v := range versions[:i+1] {
				if v.lag < 0 {
					v.lag = now - v.written
				}
			}
			break
		}
		for _, v := range versions {
			if v.lag < 0 && now-v.written > propagation {
				t.Fatalf("ServiceEntry weights %s, written %s after the change, not at the sidecar %s later\n%s",
					byPod(f, v.weights), v.written.Round(time.Millisecond), propagation, suite.zoneB.Dump())
			}
		}
		last := versions[len(versions)-1]
		// Done once the sidecar has weights ordered like the new
		// capacities and roughly proportional to them (how exactly the
		// engine converges is tested in internal/weights and test/integration).
		if last.lag >= 0 && orderedLike(last.weights, f) && sharesFollow(last.weights, f, 0.2) == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("weights did not follow the new capacities within 30s: %s", byPod(f, last.weights))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(versions) < 2 {
		t.Fatal("the weights never changed")
	}
	var maxLag time.Duration
	for i, v := range versions[1:] {
		maxLag = max(maxLag, v.lag)
		t.Logf("ServiceEntry write %d at +%s: %s; at the sidecar (all 3 ports) %s later",
			i+1, v.written.Round(time.Millisecond), byPod(f, v.weights), v.lag.Round(time.Millisecond))
	}
	t.Logf("weights %s -> %s in %d writes; slowest write reached the sidecar in %s",
		byPod(f, before), byPod(f, versions[len(versions)-1].weights), len(versions)-1, maxLag.Round(time.Millisecond))
}

// TestPodUnreadyLeavesSidecar: a pod whose EndpointSlice condition turns
// unready leaves the ServiceEntry (as the operator mirrors it) and the
// sidecar's endpoints on every port within a few seconds; when it turns
// ready again it comes back.
func TestPodUnreadyLeavesSidecar(t *testing.T) {
	ctx := testCtx(t)
	for _, ready := range []bool{false, true} {
		f := suite.fleet
		f.Pods = slices.Clone(f.Pods)
		f.setReady("web-2", ready)
		start := time.Now()
		if err := setPodReadiness(ctx, suite.c, f, "web-2"); err != nil {
			t.Fatal(err)
		}
		suite.fleet = f
		if err := poll(propagation, func() error {
			_, err := seWeights(ctx, suite.c, f)
			return err
		}); err != nil {
			t.Fatalf("ServiceEntry with web-2 ready=%v: %v", ready, err)
		}
		inSE := time.Since(start)
		waitFor(t, suite.zoneB, propagation, fmt.Sprintf("sidecar with web-2 ready=%v", ready), func(x *harness.XDSClient) error {
			return sidecarMatchesServiceEntry(ctx, x, f)
		})
		t.Logf("web-2 ready=%v: ServiceEntry after %s, sidecar (all 3 ports) after %s", ready, inSE.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
}

// TestRoutingModeNone: with routing_mode none the operator deletes its
// VirtualService and the Kubernetes host's route and TCP chain go to the
// plain Service's cluster. Switching back restores the routes.
func TestRoutingModeNone(t *testing.T) {
	ctx := testCtx(t)
	f := suite.fleet
	start := time.Now()
	patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = optv1.RoutingNone })
	defer func() {
		start := time.Now()
		patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = "" })
		for _, p := range f.Ports {
			waitFor(t, suite.zoneB, propagation, "route restored for "+p.Name, routesTo(p, clusterName(p.Port, optimizedHost)))
		}
		t.Logf("routing_mode back to default: every port to the optimized host after %s", time.Since(start).Round(time.Millisecond))
	}()
	if err := poll(propagation, func() error {
		vss := &istionet.VirtualServiceList{}
		if err := suite.c.List(ctx, vss, client.InNamespace(demoNS)); err != nil {
			return err
		}
		if len(vss.Items) != 0 {
			return fmt.Errorf("%d VirtualServices in %s", len(vss.Items), demoNS)
		}
		return nil
	}); err != nil {
		t.Fatalf("a VirtualService remains with routing_mode none: %v", err)
	}
	t.Logf("no VirtualService in %s after %s", demoNS, time.Since(start).Round(time.Millisecond))
	for _, p := range f.Ports {
		t.Run(p.Name, func(t *testing.T) {
			want := clusterName(p.Port, kubeHost)
			waitFor(t, suite.zoneB, propagation, "route without VirtualService for "+p.Name, routesTo(p, want))
			eps, _ := suite.zoneB.Endpoints(want)
			var seen []string
			keys := map[string]bool{}
			for _, e := range eps {
				if keys[e.Key()] {
					t.Errorf("%s lists %s twice", want, e.Key())
				}
				keys[e.Key()] = true
				seen = append(seen, fmt.Sprintf("%s w%d %s", e.Key(), e.Weight, e.Health))
			}
			t.Logf("%s:%d -> %s after %s; Istio's own endpoints there: %v", kubeHost, p.Port, want, time.Since(start).Round(time.Millisecond), seen)
		})
	}
	// The ServiceEntry and DestinationRule stay, for users who route to the
	// optimized host themselves.
	if err := sidecarMatchesServiceEntry(ctx, suite.zoneB, f); err != nil {
		t.Errorf("optimized clusters without routing: %v", err)
	}
}

// TestTCPPortCapture: the operator's ServiceEntry carries a virtual address,
// so its TCP port gets a listener keyed by that address and no wildcard
// 0.0.0.0_<port> listener: a TCP connection on that port to any other
// destination (an external database at 192.0.2.10:5432, say) passes through
// untouched, while the Kubernetes Service's ClusterIP still routes to the
// optimized host. The control case proves the lookup does see a wildcard
// listener when one exists: a ServiceEntry without addresses gets one.
func TestTCPPortCapture(t *testing.T) {
	const stranger = "192.0.2.10" // TEST-NET-1: not a service in the mesh
	vip := desired.VirtualAddress(optimizedHost)
	for _, p := range suite.fleet.Ports {
		if p.Protocol != optv1.ProtocolTCP {
			continue
		}
		optimized := clusterName(p.Port, optimizedHost)
		t.Run(p.Name, func(t *testing.T) {
			x := suite.zoneB
			wildcard := fmt.Sprintf("0.0.0.0_%d", p.Port)
			if slices.Contains(x.ListenerNames(), wildcard) {
				t.Errorf("the sidecar has a wildcard listener %s", wildcard)
			}
			tr, err := x.TCPRoute(int(p.Port), stranger)
			if err != nil {
				t.Fatal(err)
			}
			if len(tr.Clusters) != 1 || tr.Clusters[0].Name != "PassthroughCluster" {
				t.Errorf("TCP to %s:%d goes to %v via listener %s, want PassthroughCluster", stranger, p.Port, tr.Clusters, tr.Listener)
			}
			for _, dst := range []string{suite.clusterIP, vip} {
				if got, err := x.TCPCluster(int(p.Port), dst); err != nil || got != optimized {
					t.Errorf("TCP to %s:%d goes to %q (%v), want %s", dst, p.Port, got, err, optimized)
				}
			}
			t.Logf("TCP to %s:%d -> listener %s -> %v; ClusterIP %s and ServiceEntry address %s -> %s; no %s listener",
				stranger, p.Port, tr.Listener, tr.Clusters, suite.clusterIP, vip, optimized, wildcard)
		})
	}
	t.Run("control-without-addresses", func(t *testing.T) {
		ctx := testCtx(t)
		const port = 7432
		ns := fixtures.Namespace("control")
		if err := suite.c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		se := &istionet.ServiceEntry{ObjectMeta: metav1.ObjectMeta{Namespace: "control", Name: "no-address"}}
		se.Spec = networking.ServiceEntry{
			Hosts: []string{"db.control.internal"}, Location: networking.ServiceEntry_MESH_INTERNAL, Resolution: networking.ServiceEntry_STATIC,
			Ports:     []*networking.ServicePort{{Number: port, Name: "tcp", Protocol: "TCP"}},
			Endpoints: []*networking.WorkloadEntry{{Address: fixtures.IP(9, 1)}},
		}
		if err := suite.c.Create(ctx, se); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := suite.c.Delete(ctx, se); err != nil {
				t.Error(err)
			}
			waitFor(t, suite.zoneB, propagation, "control listener gone", func(x *harness.XDSClient) error {
				if slices.Contains(x.ListenerNames(), fmt.Sprintf("0.0.0.0_%d", port)) {
					return fmt.Errorf("0.0.0.0_%d still there", port)
				}
				return nil
			})
		}()
		waitFor(t, suite.zoneB, propagation, "wildcard listener of a ServiceEntry without addresses", func(x *harness.XDSClient) error {
			got, err := x.TCPCluster(port, stranger)
			if err != nil {
				return err
			}
			if want := clusterName(port, "db.control.internal"); got != want {
				return fmt.Errorf("TCP to %s:%d goes to %s, want %s", stranger, port, got, want)
			}
			return nil
		})
		tr, _ := suite.zoneB.TCPRoute(port, stranger)
		t.Logf("control: a ServiceEntry without addresses captures TCP to %s:%d via listener %s -> %v", stranger, port, tr.Listener, tr.Clusters)
	})
}

// TestPortsNotOptimizedKeepTheirRoutes: the operator's VirtualService takes
// over the whole Kubernetes host, so a Service port left out of
// service_ports must still reach the plain Service, as it did before.
func TestPortsNotOptimizedKeepTheirRoutes(t *testing.T) {
	f := suite.fleet
	optimized := f.Ports[0]
	start := time.Now()
	patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) {
		o.Spec.ServicePorts = []optv1.ServicePort{{Number: optimized.Port, Protocol: optimized.Protocol}}
	})
	defer func() {
		patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.ServicePorts = optimizerObj(f).Spec.ServicePorts })
		for _, p := range f.Ports {
			waitFor(t, suite.zoneB, propagation, "route restored for "+p.Name, routesTo(p, clusterName(p.Port, optimizedHost)))
		}
	}()
	for _, p := range f.Ports {
		want := clusterName(p.Port, kubeHost)
		if p.Port == optimized.Port {
			want = clusterName(p.Port, optimizedHost)
		}
		waitFor(t, suite.zoneB, propagation, "route of "+p.Name, routesTo(p, want))
		t.Logf("%s %s:%d -> %s after %s", p.Name, kubeHost, p.Port, want, time.Since(start).Round(time.Millisecond))
	}
}
