// Package conformance proves, against a real istiod (pilot-discovery built
// into bin/ by `make istiod`) and a real API server (envtest), that the Istio
// objects the operator produces make a sidecar receive what the product
// promises: routes of the Kubernetes host to the optimized host, exactly the
// ready pods with exactly their weights and localities, ROUND_ROBIN, auto-mTLS,
// locality priorities, and fast propagation of changes. The sidecar is an xDS
// client posing as one (test/harness/xds.go).
package conformance

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// propagation is how fast a change must reach the sidecar ("within a few
// seconds").
const propagation = 5 * time.Second

var suite struct {
	api      *harness.APIServer
	istiod   *harness.Istiod
	c        client.Client
	producer istioProducer
	fleet    fleet
	// clusterIP of the Kubernetes Service.
	clusterIP string
	// sidecars: in zone a and zone b of region r1, namespace "client".
	zoneA, zoneB *harness.XDSClient
}

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance setup:", err)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	start := time.Now()
	api, err := harness.StartAPIServer()
	if err != nil {
		return 1, err
	}
	defer func() { _ = api.Stop() }()
	suite.api = api

	istiod, err := harness.StartIstiod(api)
	if err != nil {
		return 1, err
	}
	defer func() { _ = istiod.Stop() }()
	suite.istiod = istiod
	fmt.Fprintf(os.Stderr, "conformance: API server and istiod ready in %s (istiod xDS %s)\n", time.Since(start).Round(time.Millisecond), istiod.GRPCAddr)

	if suite.c, err = client.New(api.Config, client.Options{Scheme: harness.Scheme()}); err != nil {
		return 1, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	suite.fleet = defaultFleet()
	if err := createKubernetesObjects(ctx, suite.c, suite.fleet, "client"); err != nil {
		return 1, err
	}
	svc := &corev1.Service{}
	if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: serviceName}, svc); err != nil {
		return 1, err
	}
	suite.clusterIP = svc.Spec.ClusterIP
	suite.producer = handMadeIstio{c: suite.c}
	if err := suite.producer.Apply(ctx, suite.fleet); err != nil {
		return 1, err
	}

	for _, s := range []struct {
		dst  **harness.XDSClient
		opts harness.SidecarOptions
	}{
		{&suite.zoneA, harness.SidecarOptions{IP: "127.0.9.1", Pod: "client-a", Namespace: "client", Locality: suite.fleet.node("node-a").Locality}},
		{&suite.zoneB, harness.SidecarOptions{IP: "127.0.9.2", Pod: "client-b", Namespace: "client", Locality: suite.fleet.node("node-b").Locality}},
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
	fmt.Fprintf(os.Stderr, "conformance: total %s\n", time.Since(start).Round(time.Millisecond))
	return code, nil
}

func clusterName(port int32, host string) string {
	return fmt.Sprintf("outbound|%d||%s", port, host)
}

// apply changes the fleet through the producer.
func apply(t *testing.T, f fleet) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := suite.producer.Apply(ctx, f); err != nil {
		t.Fatal(err)
	}
	suite.fleet = f
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

// target is where the sidecar sends traffic for the Kubernetes host on port p.
func target(x *harness.XDSClient, p portSpec) (string, error) {
	if p.Protocol == "TCP" {
		return x.TCPCluster(int(p.Port), suite.clusterIP)
	}
	return x.RouteCluster(kubeHost, int(p.Port))
}

// checkEndpoints compares a cluster's endpoints with the fleet's ready pods.
func checkEndpoints(x *harness.XDSClient, cluster string, want []expectedEndpoint) error {
	eps, err := x.Endpoints(cluster)
	if err != nil {
		return err
	}
	var problems []string
	seen := map[string]bool{}
	groupOf := map[harness.Locality]uint32{} // locality -> priority, must be one group
	got := map[string]harness.Endpoint{}
	for _, e := range eps {
		if seen[e.Key()] {
			problems = append(problems, "duplicate endpoint "+e.Key())
		}
		seen[e.Key()] = true
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

// checkLocalityGroups asserts that the ClusterLoadAssignment has one group per
// locality (Envoy's LocalityLbEndpoints) whose weight is the sum of its
// endpoints' weights.
func checkLocalityGroups(t *testing.T, x *harness.XDSClient, cluster string) {
	t.Helper()
	cla := x.RawEndpoints(cluster)
	if cla == nil {
		t.Fatalf("no ClusterLoadAssignment for %s", cluster)
	}
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
			t.Logf("%s: locality %s group weight %d, endpoint weights sum to %d", cluster, loc, lw, sum)
		}
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
				waitFor(t, x, 30*time.Second, "route for "+p.Name, func(x *harness.XDSClient) error {
					got, err := target(x, p)
					if err != nil {
						return err
					}
					if got != want {
						return fmt.Errorf("%s:%d goes to %s, want %s", kubeHost, p.Port, got, want)
					}
					return nil
				})
			}
			if p.Protocol == "TCP" {
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
	wantSAN := fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, demoNS, serviceAccount)
	for _, p := range suite.fleet.Ports {
		t.Run(p.Name, func(t *testing.T) {
			cluster := clusterName(p.Port, optimizedHost)
			want := suite.fleet.expectedEndpoints(p)
			x := suite.zoneB
			waitFor(t, x, 30*time.Second, "endpoints of "+cluster, func(x *harness.XDSClient) error {
				return checkEndpoints(x, cluster, want)
			})
			checkLocalityGroups(t, x, cluster)
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
			if info.LbPolicy != "ROUND_ROBIN" {
				t.Errorf("lb_policy %s, want ROUND_ROBIN", info.LbPolicy)
			}
			if info.AutoMTLS == nil {
				t.Errorf("no auto-mTLS transport socket match (matches: %v)", info.TransportSocketMatches)
			} else if !slices.Equal(info.AutoMTLS.SANs, []string{wantSAN}) {
				t.Errorf("auto-mTLS SANs %v, want [%s]", info.AutoMTLS.SANs, wantSAN)
			}
			t.Logf("%s: type %s lb %s mTLS SANs %v SNI %q endpoints %d", cluster, info.Type, info.LbPolicy, info.AutoMTLS.SANs, info.AutoMTLS.SNI, len(eps))
		})
	}
}

// TestIstiodEndpointIndex: istiod's own index (/debug/endpointShardz) holds
// the ServiceEntry's endpoints once per port, with weight and locality.
func TestIstiodEndpointIndex(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	z, err := suite.istiod.EndpointShardz(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eps := z.Endpoints(optimizedHost, demoNS)
	if want := len(suite.fleet.readyPods()) * len(suite.fleet.Ports); len(eps) != want {
		t.Fatalf("endpointShardz has %d endpoints for %s, want %d: %+v", len(eps), optimizedHost, want, eps)
	}
	wantSA := fmt.Sprintf("spiffe://%s/ns/%s/sa/%s", trustDomain, demoNS, serviceAccount)
	weights := map[string]uint32{}
	for _, p := range suite.fleet.readyPods() {
		weights[p.IP] = p.Weight
	}
	for _, e := range eps {
		if len(e.Addresses) != 1 || weights[e.Addresses[0]] != e.LbWeight {
			t.Errorf("endpoint %v weight %d, want %d", e.Addresses, e.LbWeight, weights[e.Addresses[0]])
		}
		// istiod stores the service account as its SPIFFE identity.
		if e.Locality.Label == "" || e.ServiceAccount != wantSA || e.TLSMode != "istio" {
			t.Errorf("endpoint %v: locality %q sa %q tlsMode %q", e.Addresses, e.Locality.Label, e.ServiceAccount, e.TLSMode)
		}
	}
}

// TestLocalityPriorities: with localityLbSetting enabled and outlier
// detection, a client in zone b gets zone b at priority 0 and the other zones
// after it; a client in zone a sees zone a first.
func TestLocalityPriorities(t *testing.T) {
	f := suite.fleet
	f.LocalityEnabled = true
	apply(t, f)
	defer apply(t, func() fleet { g := f; g.LocalityEnabled = false; return g }())

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
					return nil
				})
				info, err := c.x.Cluster(cluster)
				if err != nil {
					t.Fatal(err)
				}
				if !info.OutlierDetection || info.LbPolicy != "ROUND_ROBIN" {
					t.Errorf("cluster %s: outlier detection %v, lb %s", cluster, info.OutlierDetection, info.LbPolicy)
				}
				if err := checkEndpoints(c.x, cluster, f.expectedEndpoints(p)); err != nil {
					t.Error(err)
				}
			}
			eps, _ := suite.zoneB.Endpoints(cluster)
			var prios []string
			for _, e := range eps {
				prios = append(prios, fmt.Sprintf("%s=%d", e.Locality, e.Priority))
			}
			t.Logf("client in r1/zb/sb: %s", strings.Join(slices.Compact(prios), " "))
		})
	}
}

// TestWeightChangeReachesSidecar: a weight written into the ServiceEntry
// reaches the sidecar within a few seconds, on every port.
func TestWeightChangeReachesSidecar(t *testing.T) {
	f := suite.fleet
	f.Pods = slices.Clone(f.Pods)
	f.setPod("web-1", func(p *podSpec) { p.Weight = 777 })
	f.setPod("web-3", func(p *podSpec) { p.Weight = 50 })
	start := time.Now()
	apply(t, f)
	for _, p := range f.Ports {
		cluster := clusterName(p.Port, optimizedHost)
		waitFor(t, suite.zoneB, propagation, "new weights on "+cluster, func(x *harness.XDSClient) error {
			return checkEndpoints(x, cluster, f.expectedEndpoints(p))
		})
	}
	t.Logf("new weights on all ports after %s", time.Since(start).Round(time.Millisecond))
}

// TestPodUnreadyLeavesSidecar: a pod that turns unready leaves the
// ServiceEntry (as the operator mirrors it) and the sidecar's endpoints
// within a few seconds, and the Kubernetes Service's own cluster drops it too.
func TestPodUnreadyLeavesSidecar(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := suite.fleet
	f.Pods = slices.Clone(f.Pods)
	f.setPod("web-2", func(p *podSpec) { p.Ready = false })
	start := time.Now()
	if err := updatePodReadiness(ctx, suite.c, f, "web-2"); err != nil {
		t.Fatal(err)
	}
	apply(t, f)
	for _, p := range f.Ports {
		cluster := clusterName(p.Port, optimizedHost)
		waitFor(t, suite.zoneB, propagation, "web-2 gone from "+cluster, func(x *harness.XDSClient) error {
			return checkEndpoints(x, cluster, f.expectedEndpoints(p))
		})
	}
	t.Logf("web-2 gone from the optimized clusters after %s", time.Since(start).Round(time.Millisecond))

	// Back to ready.
	f.Pods = slices.Clone(f.Pods)
	f.setPod("web-2", func(p *podSpec) { p.Ready = true })
	if err := updatePodReadiness(ctx, suite.c, f, "web-2"); err != nil {
		t.Fatal(err)
	}
	apply(t, f)
	for _, p := range f.Ports {
		cluster := clusterName(p.Port, optimizedHost)
		waitFor(t, suite.zoneB, propagation, "web-2 back in "+cluster, func(x *harness.XDSClient) error {
			return checkEndpoints(x, cluster, f.expectedEndpoints(p))
		})
	}
}

// TestRoutingModeNone: without the VirtualService the Kubernetes host's route
// and TCP chain go to the plain Service's cluster again. Runs last among the
// routing tests and restores the VirtualService.
func TestRoutingModeNone(t *testing.T) {
	f := suite.fleet
	f.Routing = false
	apply(t, f)
	defer func() {
		g := f
		g.Routing = true
		apply(t, g)
		for _, p := range g.Ports {
			waitFor(t, suite.zoneB, propagation, "route restored for "+p.Name, func(x *harness.XDSClient) error {
				got, err := target(x, p)
				if err == nil && got != clusterName(p.Port, optimizedHost) {
					err = fmt.Errorf("goes to %s", got)
				}
				return err
			})
		}
	}()
	for _, p := range f.Ports {
		t.Run(p.Name, func(t *testing.T) {
			want := clusterName(p.Port, kubeHost)
			d := waitFor(t, suite.zoneB, propagation, "route without VirtualService for "+p.Name, func(x *harness.XDSClient) error {
				got, err := target(x, p)
				if err != nil {
					return err
				}
				if got != want {
					return fmt.Errorf("%s:%d goes to %s, want %s", kubeHost, p.Port, got, want)
				}
				return nil
			})
			t.Logf("%s:%d -> %s after %s", kubeHost, p.Port, want, d.Round(time.Millisecond))
		})
	}
}

// TestTCPPortCapture documents and guards how Istio keys the sidecar's
// outbound listener for the optimized host's TCP port.
//
// Observed with this istiod: a ServiceEntry with resolution STATIC and no
// addresses gets a wildcard listener 0.0.0.0_<port> in every sidecar that
// imports it (sidecars without DNS capture, Istio's default). A TCP
// connection on that port to any IP that has no listener of its own (an
// external database at 192.0.2.10:5432, say) then goes to the optimized
// pods. Istio's IP auto-allocation does write 240.240.x.y into the
// ServiceEntry's status, but only sidecars with ISTIO_META_DNS_CAPTURE=true
// key the listener by it. With spec.addresses set, the listener is keyed by
// that address, the wildcard disappears and other destinations pass through;
// the Kubernetes host's ClusterIP listener still routes to the optimized host.
func TestTCPPortCapture(t *testing.T) {
	const stranger = "192.0.2.10" // TEST-NET-1: not a service in the mesh
	for _, p := range suite.fleet.Ports {
		if p.Protocol != "TCP" {
			continue
		}
		optimized := clusterName(p.Port, optimizedHost)
		t.Run(fmt.Sprintf("%s/addresses=%v", p.Name, suite.fleet.SEAddresses), func(t *testing.T) {
			tr, err := suite.zoneB.TCPRoute(int(p.Port), stranger)
			if err != nil {
				t.Fatal(err)
			}
			captured := slices.Contains(tr.Clusters, harness.WeightedCluster{Name: optimized})
			if len(suite.fleet.SEAddresses) > 0 && captured {
				t.Errorf("TCP to %s:%d is captured by %s (listener %s)", stranger, p.Port, optimized, tr.Listener)
			}
			if captured {
				t.Logf("OBSERVED: the ServiceEntry has no addresses, so TCP to any unlisted IP on port %d (e.g. %s) goes to %s via listener %s", p.Port, stranger, optimized, tr.Listener)
			} else {
				t.Logf("TCP to %s:%d -> listener %s -> %v", stranger, p.Port, tr.Listener, tr.Clusters)
			}
		})
		t.Run(p.Name+"/with-address", func(t *testing.T) {
			f := suite.fleet
			f.SEAddresses = []string{"240.240.250.1"}
			apply(t, f)
			defer apply(t, func() fleet { g := f; g.SEAddresses = nil; return g }())
			waitFor(t, suite.zoneB, propagation, "listener keyed by the ServiceEntry address", func(x *harness.XDSClient) error {
				tr, err := x.TCPRoute(int(p.Port), stranger)
				if err != nil {
					return err
				}
				if len(tr.Clusters) != 1 || tr.Clusters[0].Name != "PassthroughCluster" {
					return fmt.Errorf("TCP to %s:%d goes to %v via %s, want PassthroughCluster", stranger, p.Port, tr.Clusters, tr.Listener)
				}
				if got, err := x.TCPCluster(int(p.Port), suite.clusterIP); err != nil || got != optimized {
					return fmt.Errorf("ClusterIP %s:%d goes to %q (%v), want %s", suite.clusterIP, p.Port, got, err, optimized)
				}
				if got, err := x.TCPCluster(int(p.Port), f.SEAddresses[0]); err != nil || got != optimized {
					return fmt.Errorf("%s:%d goes to %q (%v), want %s", f.SEAddresses[0], p.Port, got, err, optimized)
				}
				return nil
			})
		})
	}
}
