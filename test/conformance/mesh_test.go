package conformance

// Safety in a configured mesh (issue 9): export scope, Sidecar-scoped
// clients, sniffed HTTP, TLS by SNI, the user's DestinationRule and ambient
// pods. Each test has its own Service in its own namespace, opts it in, and
// reads what sidecars posing as clients in chosen namespaces receive from
// istiod, before and after.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// meshService is a Service with two ready, sidecar-injected pods in its own
// namespace; port targets are the same number on the pods.
type meshService struct {
	ns          string
	ports       []corev1.ServicePort
	annotations map[string]string
	nsLabels    map[string]string
	ipBlock     int // pods get fixtures.IP(ipBlock, 1..2)
	noSidecar   bool
}

func (s meshService) host() string      { return "web." + s.ns + ".svc.cluster.local" }
func (s meshService) optimized() string { return "web." + s.ns + ".adaptive" }

// create writes the namespace, Service, pods and EndpointSlice and returns
// the Service's ClusterIP.
func (s meshService) create(t *testing.T) string {
	t.Helper()
	ctx := testCtx(t)
	ns := fixtures.Namespace(s.ns)
	ns.Labels = s.nsLabels
	if err := suite.c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	svc := fixtures.Service(s.ns, serviceName, s.ports...)
	svc.Annotations = s.annotations
	if err := suite.c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	var slicePorts []fixtures.SlicePort
	for _, p := range s.ports {
		slicePorts = append(slicePorts, fixtures.SlicePort{Name: p.Name, Port: p.TargetPort.IntVal})
	}
	var eps []fixtures.Endpoint
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("web-%d", i)
		var opts []fixtures.PodOption
		if !s.noSidecar {
			opts = append(opts, fixtures.WithSidecar())
		}
		pod := fixtures.Pod(s.ns, name, serviceName, "node-a", opts...)
		if err := suite.c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = podStatus(podSpec{Name: name, IP: fixtures.IP(s.ipBlock, i), Ready: true})
		if err := suite.c.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		eps = append(eps, fixtures.Ready(name, fixtures.IP(s.ipBlock, i), "node-a"))
	}
	if err := suite.c.Create(ctx, fixtures.EndpointSlice(s.ns, serviceName+"-abcde", serviceName, slicePorts, eps...)); err != nil {
		t.Fatal(err)
	}
	if err := suite.c.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		t.Fatal(err)
	}
	return svc.Spec.ClusterIP
}

// optIn creates the optimizer for every port of the Service.
func (s meshService) optIn(t *testing.T) {
	t.Helper()
	if err := suite.c.Create(testCtx(t), fixtures.Optimizer(s.ns, optimizerName, serviceName)); err != nil {
		t.Fatal(err)
	}
}

// condition waits until the optimizer's condition typ has status and
// reason, and returns its message.
func (s meshService) condition(t *testing.T, typ string, status metav1.ConditionStatus, reason string) string {
	t.Helper()
	var msg string
	err := poll(propagation, func() error {
		opt := &optv1.IstioAdaptiveRequestOptimizer{}
		if err := suite.c.Get(context.Background(), client.ObjectKey{Namespace: s.ns, Name: optimizerName}, opt); err != nil {
			return err
		}
		c := meta.FindStatusCondition(opt.Status.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("condition %s is %+v, want %s/%s", typ, c, status, reason)
		}
		msg = c.Message
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// dialClient connects a sidecar in namespace ns and waits for its first sync.
func dialClient(t *testing.T, ns, ip string) *harness.XDSClient {
	t.Helper()
	ctx := testCtx(t)
	if err := suite.c.Create(ctx, fixtures.Namespace(ns)); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	x, err := harness.DialXDS(ctx, suite.istiod.GRPCAddr, harness.SidecarOptions{IP: ip, Pod: "client-" + ns, Namespace: ns, Locality: suite.fleet.node("node-a").Locality})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(x.Close)
	waitFor(t, x, 30*time.Second, "sync of client in "+ns, func(x *harness.XDSClient) error { return x.Synced() })
	return x
}

// reaches is a waitFor condition: the client's HTTP route for host:port
// leads to cluster want, which it has, with endpoints, and no route of the
// client leads to a cluster it lacks.
func reaches(host string, port int, want string) func(*harness.XDSClient) error {
	return func(x *harness.XDSClient) error {
		got, err := x.RouteCluster(host, port)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s:%d goes to %s, want %s", host, port, got, want)
		}
		if eps, err := x.Endpoints(want); err != nil || len(eps) == 0 {
			return fmt.Errorf("cluster %s has no endpoints (%v)", want, err)
		}
		if d := x.DanglingRoutes(); len(d) > 0 {
			return fmt.Errorf("routes to missing clusters: %v", d)
		}
		return nil
	}
}

// blind checks that the client has no virtual host and no cluster for the
// Service, its optimized host, and no route to a missing cluster.
func blind(x *harness.XDSClient, s meshService) error {
	if vh := x.VirtualHostsFor(s.host()); len(vh) > 0 {
		return fmt.Errorf("client %s has virtual hosts %v for %s", x.NodeID(), vh, s.host())
	}
	for _, c := range x.ClusterNames() {
		if strings.HasSuffix(c, "|"+s.host()) || strings.HasSuffix(c, "|"+s.optimized()) {
			return fmt.Errorf("client %s has cluster %s", x.NodeID(), c)
		}
	}
	if d := x.DanglingRoutes(); len(d) > 0 {
		return fmt.Errorf("client %s routes to missing clusters: %v", x.NodeID(), d)
	}
	return nil
}

func httpPort(name string, port int32) corev1.ServicePort {
	return fixtures.ServicePort(name, port, intstr.FromInt32(port))
}

// TestExportScopeIsKept: a Service annotated exportTo "." or a namespace
// list is seen by exactly the same clients after opting in as before;
// clients that could not reach it get neither a route nor a cluster for it,
// clients that could are routed to the optimized host.
func TestExportScopeIsKept(t *testing.T) {
	cases := []struct {
		name     string
		svc      meshService
		seeing   []string // client namespaces that see the Service
		blindNSs []string // client namespaces that must not
	}{
		{
			name:     "private",
			svc:      meshService{ns: "priv", ports: []corev1.ServicePort{httpPort("http", 80)}, annotations: map[string]string{desired.AnnotationExportTo: "."}, ipBlock: 20},
			seeing:   []string{"priv"},
			blindNSs: []string{clientNS},
		},
		{
			name: "namespace-list",
			// The own namespace is not in the list, so it does not see it.
			svc:      meshService{ns: "listed", ports: []corev1.ServicePort{httpPort("http", 80)}, annotations: map[string]string{desired.AnnotationExportTo: "team-a,team-b"}, ipBlock: 21},
			seeing:   []string{"team-a", "team-b"},
			blindNSs: []string{"listed", clientNS},
		},
	}
	ip := 10
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.svc
			s.create(t)
			seeing := map[string]*harness.XDSClient{}
			blinds := map[string]*harness.XDSClient{}
			for _, ns := range tc.seeing {
				ip++
				seeing[ns] = dialClient(t, ns, fmt.Sprintf("127.0.9.%d", ip))
			}
			for _, ns := range tc.blindNSs {
				if ns == clientNS {
					blinds[ns] = suite.zoneB
					continue
				}
				ip++
				blinds[ns] = dialClient(t, ns, fmt.Sprintf("127.0.9.%d", ip))
			}
			kubeCluster, optCluster := clusterName(80, s.host()), clusterName(80, s.optimized())
			for ns, x := range seeing {
				waitFor(t, x, propagation, "before: "+ns+" reaches the Service", reaches(s.host(), 80, kubeCluster))
			}
			for ns, x := range blinds {
				if err := blind(x, s); err != nil {
					t.Fatalf("before opting in, %s: %v", ns, err)
				}
			}
			s.optIn(t)
			for ns, x := range seeing {
				d := waitFor(t, x, propagation, "after: "+ns+" reaches the optimized host", reaches(s.host(), 80, optCluster))
				t.Logf("%s: %s:80 -> %s after %s", ns, s.host(), optCluster, d.Round(time.Millisecond))
			}
			// Every seeing client got the push that carries the new objects;
			// the blind ones were pushed at the same time.
			for ns, x := range blinds {
				if err := blind(x, s); err != nil {
					t.Errorf("after opting in, %s: %v", ns, err)
				}
			}
			se := &istionet.ServiceEntry{}
			if err := suite.c.Get(testCtx(t), client.ObjectKey{Namespace: s.ns, Name: objectName}, se); err != nil {
				t.Fatal(err)
			}
			t.Logf("ServiceEntry exportTo %v; seeing %v, blind %v", se.Spec.ExportTo, tc.seeing, tc.blindNSs)
		})
	}
}

// TestVirtualServiceOfNarrowerReach: a VirtualService for the Service's
// host in another team's namespace, exported only there (exportTo "."),
// is what istiod routes that namespace's clients by: it selects the
// VirtualServices exported privately to a client's namespace before the
// public ones. The clients of every other namespace follow the operator's
// VirtualService to the optimized host, so the operator writes it, and the
// optimizer's condition names the namespace that keeps its own route.
func TestVirtualServiceOfNarrowerReach(t *testing.T) {
	ctx := testCtx(t)
	s := meshService{ns: "vs-reach", ports: []corev1.ServicePort{httpPort("http", 80)}, ipBlock: 32}
	s.create(t)
	const team = "vs-reach-team"
	x := dialClient(t, team, "127.0.9.204")
	user := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "web-own"}}
	user.Spec.Hosts = []string{s.host()}
	user.Spec.ExportTo = []string{"."}
	user.Spec.Http = []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: s.host()}}}}}
	if err := suite.c.Create(ctx, user); err != nil {
		t.Fatal(err)
	}
	s.optIn(t)
	msg := s.condition(t, optv1.ConditionDegraded, metav1.ConditionTrue, "VirtualServiceOfNarrowerReach")
	if !strings.Contains(msg, team+"/web-own") || !strings.Contains(msg, team) {
		t.Errorf("condition message %q does not name the VirtualService and its namespace", msg)
	}
	kube, opt := clusterName(80, s.host()), clusterName(80, s.optimized())
	d := waitFor(t, suite.zoneB, propagation, "another namespace's client follows the operator's route", reaches(s.host(), 80, opt))
	// The push that carried the operator's VirtualService reached the
	// team's client too; it keeps its own route.
	waitFor(t, x, propagation, "the team's client follows its own route", reaches(s.host(), 80, kube))
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err := reaches(s.host(), 80, kube)(x); err != nil {
			t.Fatalf("the team's client, whose own VirtualService is exported only to its namespace: %v", err)
		}
	}
	t.Logf("%s:80 -> %s for %s after %s; -> %s for %s", s.host(), opt, clientNS, d.Round(time.Millisecond), kube, team)

	// Written after the operator's, it takes the team's clients all the
	// same: the order is by reach, not by age.
	if err := suite.c.Delete(ctx, user); err != nil {
		t.Fatal(err)
	}
	waitFor(t, x, propagation, "without its own route, the team's client follows the operator's", reaches(s.host(), 80, opt))
	user = &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "web-own"}, Spec: *user.Spec.DeepCopy()}
	if err := suite.c.Create(ctx, user); err != nil {
		t.Fatal(err)
	}
	waitFor(t, x, propagation, "its own route, newer than the operator's, takes the team's client back", reaches(s.host(), 80, kube))
	if err := reaches(s.host(), 80, opt)(suite.zoneB); err != nil {
		t.Errorf("another namespace's client, after the team's route came back: %v", err)
	}
}

// TestSidecarScopedClient: a client whose Sidecar imports only
// */*.svc.cluster.local still gets the optimized host's cluster, with its
// endpoints, because istiod adds the destinations of the VirtualServices it
// imports; so its route never leads to a missing cluster.
func TestSidecarScopedClient(t *testing.T) {
	ctx := testCtx(t)
	s := meshService{ns: "side", ports: []corev1.ServicePort{httpPort("http", 80)}, ipBlock: 22}
	s.create(t)
	const scoped = "scoped"
	if err := suite.c.Create(ctx, fixtures.Namespace(scoped)); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sc := &istionet.Sidecar{ObjectMeta: metav1.ObjectMeta{Namespace: scoped, Name: "default"}}
	sc.Spec.Egress = []*networking.IstioEgressListener{{Hosts: []string{"*/*.svc.cluster.local"}}}
	if err := suite.c.Create(ctx, sc); err != nil {
		t.Fatal(err)
	}
	x := dialClient(t, scoped, "127.0.9.40")
	waitFor(t, x, propagation, "before: scoped client reaches the Service", reaches(s.host(), 80, clusterName(80, s.host())))
	s.optIn(t)
	opt := clusterName(80, s.optimized())
	d := waitFor(t, x, propagation, "after: scoped client reaches the optimized host", reaches(s.host(), 80, opt))
	eps, _ := x.Endpoints(opt)
	t.Logf("Sidecar */*.svc.cluster.local: %s:80 -> %s (%d endpoints) after %s; %d clusters, none missing", s.host(), opt, len(eps), d.Round(time.Millisecond), len(x.ClusterNames()))
}

// TestSniffedHTTPReachesWeights: a port with no declared protocol is
// sniffed by the client's sidecar. Both its HTTP chain (RDS route named
// after the port) and its TCP chain must lead to the optimized cluster,
// or HTTP traffic would bypass the weights.
func TestSniffedHTTPReachesWeights(t *testing.T) {
	s := meshService{ns: "sniff", ports: []corev1.ServicePort{httpPort("web", 8080)}, ipBlock: 23}
	vip := s.create(t)
	x := suite.zoneB
	both := func(want string) func(*harness.XDSClient) error {
		return func(x *harness.XDSClient) error {
			got, err := x.SniffedHTTPCluster(vip, 8080, s.host())
			if err != nil || got != want {
				return fmt.Errorf("sniffed HTTP chain of %s:8080 goes to %q (%v), want %s", vip, got, err, want)
			}
			if d := x.DanglingRoutes(); len(d) > 0 {
				return fmt.Errorf("routes to missing clusters: %v", d)
			}
			got, err = x.TCPCluster(8080, vip)
			if err != nil || got != want {
				return fmt.Errorf("TCP chain of %s:8080 goes to %q (%v), want %s", vip, got, err, want)
			}
			return nil
		}
	}
	waitFor(t, x, propagation, "before: both chains to the Service", both(clusterName(8080, s.host())))
	if !slices.Contains(x.ListenerNames(), vip+"_8080") {
		t.Fatalf("no listener %s_8080", vip)
	}
	s.optIn(t)
	opt := clusterName(8080, s.optimized())
	d := waitFor(t, x, propagation, "after: both chains to the optimized host", both(opt))
	cl := x.RawCluster(opt)
	if cl == nil {
		t.Fatalf("no cluster %s", opt)
	}
	// The ServiceEntry port is sniffed too, so the cluster speaks the
	// client's HTTP version (HTTP/1.1 or h2) upstream.
	if _, ok := cl.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]; !ok {
		t.Errorf("cluster %s has no HttpProtocolOptions (use_downstream_protocol): %v", opt, cl.GetTypedExtensionProtocolOptions())
	}
	s.condition(t, optv1.ConditionReady, metav1.ConditionTrue, "Reconciled")
	t.Logf("sniffed port 8080: listener %s_8080's HTTP chain and TCP chain -> %s after %s", vip, opt, d.Round(time.Millisecond))

	// Control: what the operator used to write, a tcp route only, moves the
	// TCP chain but leaves sniffed HTTP on the Kubernetes cluster. This is
	// the bypass the check above would catch.
	t.Run("control-tcp-route-only", func(t *testing.T) {
		ctx := testCtx(t)
		c := meshService{ns: "sniffctl", ports: []corev1.ServicePort{httpPort("web", 8080)}, ipBlock: 27}
		cvip := c.create(t)
		vs := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: c.ns, Name: "tcp-only"}}
		vs.Spec.Hosts = []string{c.host()}
		vs.Spec.Tcp = []*networking.TCPRoute{{
			Match: []*networking.L4MatchAttributes{{Port: 8080}},
			Route: []*networking.RouteDestination{{Destination: &networking.Destination{Host: s.optimized(), Port: &networking.PortSelector{Number: 8080}}}},
		}}
		if err := suite.c.Create(ctx, vs); err != nil {
			t.Fatal(err)
		}
		kube := clusterName(8080, c.host())
		waitFor(t, x, propagation, "control: TCP chain moved, sniffed HTTP not", func(x *harness.XDSClient) error {
			if got, err := x.TCPCluster(8080, cvip); err != nil || got != opt {
				return fmt.Errorf("TCP chain goes to %q (%v), want %s", got, err, opt)
			}
			if got, err := x.SniffedHTTPCluster(cvip, 8080, c.host()); err != nil || got != kube {
				return fmt.Errorf("sniffed HTTP chain goes to %q (%v); with a tcp route only it should stay on %s", got, err, kube)
			}
			return nil
		})
		got := kube
		t.Logf("control: a tcp route alone moves the TCP chain to %s, sniffed HTTP stays on %s", opt, got)
	})
}

// TestTLSRoutedBySNI: an https port gets SNI filter chains only (istiod
// builds no TCP chain for HTTPS/TLS ports, so a tcp route would be
// ignored). A tls route can only name the Service's FQDN as SNI, and a
// client sending another SNI then matches no chain and goes to
// PassthroughCluster. So by default the port is left on the Service's own
// route for every SNI (Degraded/TLSPortNotOptimized); listed in
// service_ports, TLS with the FQDN as SNI reaches the optimized host
// (Degraded/TLSRoutedBySNI says what happens to the rest).
func TestTLSRoutedBySNI(t *testing.T) {
	s := meshService{ns: "tls", ports: []corev1.ServicePort{httpPort("http", 80), httpPort("https", 443)}, ipBlock: 24}
	vip := s.create(t)
	x := suite.zoneB
	sniTo := func(sni, want string) func(*harness.XDSClient) error {
		return func(x *harness.XDSClient) error {
			got, err := x.TLSCluster(443, vip, sni)
			if err != nil || got != want {
				return fmt.Errorf("TLS to %s:443 with SNI %q goes to %q (%v), want %s", vip, sni, got, err, want)
			}
			return nil
		}
	}
	kube, opt := clusterName(443, s.host()), clusterName(443, s.optimized())
	snis := []string{s.host(), "web.tls", "web", ""}
	for _, sni := range snis {
		waitFor(t, x, propagation, "before: TLS to the Service", sniTo(sni, kube))
	}

	// Default: every port, the https one left alone.
	s.optIn(t)
	waitFor(t, x, propagation, "http port optimized", reaches(s.host(), 80, clusterName(80, s.optimized())))
	msg := s.condition(t, optv1.ConditionDegraded, metav1.ConditionTrue, "TLSPortNotOptimized")
	for _, sni := range snis {
		if err := sniTo(sni, kube)(x); err != nil {
			t.Errorf("default opt-in moved TLS: %v", err)
		}
	}
	t.Logf("default: %s; TLS for SNI %q still -> %s", msg, snis, kube)

	// Listed: SNI routing to the optimized host.
	updateOptimizer(t, s.ns, optimizerName, func(o *optv1.IstioAdaptiveRequestOptimizer) {
		o.Spec.ServicePorts = []optv1.ServicePort{{Number: 80}, {Number: 443}}
	})
	d := waitFor(t, x, propagation, "listed: TLS with the Service's SNI to the optimized host", sniTo(s.host(), opt))
	waitFor(t, x, propagation, "endpoints of the optimized cluster", func(x *harness.XDSClient) error {
		if eps, err := x.Endpoints(opt); err != nil || len(eps) == 0 {
			return fmt.Errorf("cluster %s has no endpoints (%v)", opt, err)
		}
		return nil
	})
	msg = s.condition(t, optv1.ConditionDegraded, metav1.ConditionTrue, "TLSRoutedBySNI")
	for _, sni := range snis[1:] {
		if err := sniTo(sni, "PassthroughCluster")(x); err != nil {
			t.Errorf("what the TLSRoutedBySNI message says no longer holds: %v", err)
		}
	}
	t.Logf("listed: SNI %s -> %s after %s; other SNI -> PassthroughCluster; %s", s.host(), opt, d.Round(time.Millisecond), msg)
}

// TestUserDestinationRuleCarried: the user's DestinationRule for the
// Kubernetes host (TLS origination, connection pool) applies to the
// optimized cluster too, and follows its changes; one with subsets stalls
// the optimizer and leaves routing alone.
func TestUserDestinationRuleCarried(t *testing.T) {
	ctx := testCtx(t)
	s := meshService{ns: "userdr", ports: []corev1.ServicePort{httpPort("http", 80)}, ipBlock: 25}
	s.create(t)
	dr := &istionet.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: s.ns, Name: "web-policy"}}
	dr.Spec.Host = serviceName
	dr.Spec.TrafficPolicy = &networking.TrafficPolicy{
		// The user's load balancer is the one thing not carried.
		LoadBalancer: &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_RANDOM}},
		Tls:          &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: "web.example.internal"},
		ConnectionPool: &networking.ConnectionPoolSettings{
			Tcp:  &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: 7, ConnectTimeout: durationpb.New(3 * time.Second)},
			Http: &networking.ConnectionPoolSettings_HTTPSettings{Http1MaxPendingRequests: 11},
		},
		OutlierDetection: &networking.OutlierDetection{Consecutive_5XxErrors: nil, Interval: durationpb.New(7 * time.Second)},
	}
	if err := suite.c.Create(ctx, dr); err != nil {
		t.Fatal(err)
	}
	x := suite.zoneB
	policy := func(cluster string, maxConn uint32) func(*harness.XDSClient) error {
		return func(x *harness.XDSClient) error {
			info, err := x.Cluster(cluster)
			if err != nil {
				return err
			}
			if info.TLS == nil || info.TLS.SNI != "web.example.internal" {
				return fmt.Errorf("cluster %s TLS %+v, want SNI web.example.internal", cluster, info.TLS)
			}
			cl := x.RawCluster(cluster)
			th := cl.GetCircuitBreakers().GetThresholds()
			if len(th) == 0 || th[0].GetMaxConnections().GetValue() != maxConn || th[0].GetMaxPendingRequests().GetValue() != 11 {
				return fmt.Errorf("cluster %s circuit breakers %v, want max connections %d, pending 11", cluster, th, maxConn)
			}
			if cl.GetConnectTimeout().AsDuration() != 3*time.Second || !info.OutlierDetection {
				return fmt.Errorf("cluster %s connect timeout %v outlier %v", cluster, cl.GetConnectTimeout().AsDuration(), info.OutlierDetection)
			}
			return nil
		}
	}
	kube, opt := clusterName(80, s.host()), clusterName(80, s.optimized())
	waitFor(t, x, propagation, "before: the user's policy on the Service's cluster", policy(kube, 7))
	s.optIn(t)
	waitFor(t, x, propagation, "after: route to the optimized host", reaches(s.host(), 80, opt))
	d := waitFor(t, x, propagation, "after: the user's policy on the optimized cluster", policy(opt, 7))
	// No metrics for this Service, so no weights are learned and the
	// operator's policy is still Istio's LEAST_REQUEST: not the user's RANDOM.
	if info, _ := x.Cluster(opt); info.LbPolicy != "LEAST_REQUEST" {
		t.Errorf("optimized cluster lb %s, want the operator's LEAST_REQUEST, not the user's RANDOM", info.LbPolicy)
	}
	t.Logf("user DestinationRule carried to %s after %s", opt, d.Round(time.Millisecond))

	// Kept in sync.
	if err := suite.c.Get(ctx, client.ObjectKeyFromObject(dr), dr); err != nil {
		t.Fatal(err)
	}
	dr.Spec.TrafficPolicy.ConnectionPool.Tcp.MaxConnections = 9
	if err := suite.c.Update(ctx, dr); err != nil {
		t.Fatal(err)
	}
	d = waitFor(t, x, propagation, "the user's change reaches the optimized cluster", policy(opt, 9))
	t.Logf("max connections 7 -> 9 on %s after %s", opt, d.Round(time.Millisecond))

	// Subsets cannot be carried: the optimizer stalls, routing stays.
	if err := suite.c.Get(ctx, client.ObjectKeyFromObject(dr), dr); err != nil {
		t.Fatal(err)
	}
	dr.Spec.Subsets = []*networking.Subset{{Name: "v1", Labels: map[string]string{"version": "v1"}}}
	if err := suite.c.Update(ctx, dr); err != nil {
		t.Fatal(err)
	}
	msg := s.condition(t, optv1.ConditionStalled, metav1.ConditionTrue, "UserDestinationRuleNotCarried")
	if !strings.Contains(msg, "userdr/web-policy") || !strings.Contains(msg, "subsets") {
		t.Errorf("message %q does not name the rule and the subsets", msg)
	}
	if err := reaches(s.host(), 80, opt)(x); err != nil {
		t.Errorf("a stalled optimizer changed live routing: %v", err)
	}
	t.Logf("subsets: Stalled/UserDestinationRuleNotCarried: %s", msg)
}

// TestAmbientPodsRefused: pods of a namespace enrolled in ambient mode,
// without sidecars, are refused with a reason naming the namespace, and no
// routing object is written: the client keeps reaching the Service.
func TestAmbientPodsRefused(t *testing.T) {
	s := meshService{ns: "amb", ports: []corev1.ServicePort{httpPort("http", 80)}, ipBlock: 26,
		nsLabels: map[string]string{desired.LabelDataplaneMode: "ambient"}, noSidecar: true}
	s.create(t)
	s.optIn(t)
	msg := s.condition(t, optv1.ConditionStalled, metav1.ConditionTrue, desired.ReasonAmbientWaypointRequired)
	if !strings.Contains(msg, "namespace amb") || !strings.Contains(msg, "web-1") {
		t.Errorf("message %q does not name the namespace and pods", msg)
	}
	for _, obj := range []client.Object{&istionet.ServiceEntry{}, &istionet.VirtualService{}, &istionet.DestinationRule{}} {
		if err := suite.c.Get(testCtx(t), client.ObjectKey{Namespace: s.ns, Name: objectName}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T written for ambient pods (%v)", obj, err)
		}
	}
	waitFor(t, suite.zoneB, propagation, "client still reaches the Service", reaches(s.host(), 80, clusterName(80, s.host())))
	t.Logf("ambient: %s", msg)
}
