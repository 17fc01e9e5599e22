package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// noisyFleet is a metrics backend over a simulated fleet: traffic follows
// the weights live in the ServiceEntry (read from the API server, as Envoy
// gets them), each pod's CPU is its traffic times its cost per request, and
// every CPU answer carries ±20% uniform noise per pod. It gives the
// operator only what Prometheus would: CPU and requests per pod.
type noisyFleet struct {
	c      client.Client
	ns, se string
	speed  map[string]float64 // by pod
	ipPod  map[string]string
	mu     sync.Mutex
	rng    *rand.Rand
	// nodeCPU: the pods have no CPU limit, each on a node of its own, and
	// the node CPU query is answered (the pod's CPU plus a steady half core
	// of the node's other work); the latency query gets no data.
	nodeCPU bool
}

func (f *noisyFleet) Query(ctx context.Context, tmpl string, t promsource.Target, _ time.Time) (promsource.Result, error) {
	requests := tmpl == promsource.DefaultRequestQuery
	node := tmpl == promsource.DefaultNodeCPUQuery
	if f.nodeCPU && tmpl == promsource.DefaultLatencyQuery {
		return promsource.Result{Values: map[string]float64{}, Query: "fake", Chunks: 1}, nil
	}
	se := &istionet.ServiceEntry{}
	if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: f.se}, se); err != nil {
		return promsource.Result{}, &promsource.UnreachableError{URL: "fake", Err: err}
	}
	total := 0.0
	for _, e := range se.Spec.Endpoints {
		total += float64(e.Weight)
	}
	const offered = 820.0 // requests/s, 70% of the fleet's capacity (2 cores a pod)
	f.mu.Lock()
	defer f.mu.Unlock()
	res := promsource.Result{Values: map[string]float64{}, Query: "fake", Chunks: 1}
	for _, e := range se.Spec.Endpoints {
		pod := f.ipPod[e.Address]
		rps := offered * float64(e.Weight) / total
		switch {
		case requests:
			res.Values[pod] = rps // counted exactly by the sidecars
		case node && f.nodeCPU:
			res.Values[pod] = rps*work/f.speed[pod] + 0.5
		default:
			res.Values[pod] = rps * work / f.speed[pod] * (1 + 0.4*(f.rng.Float64()-0.5))
		}
	}
	return res, nil
}

// TestRestartKeepsTheLearnedState: with ±20% noise on CPU a long-running
// manager writes nothing in steady state; a new manager (new book, new
// engine) started from the persisted state must write nothing either in
// its first 5 cycles, where one without it made 2-3 moves of 30-46%.
func TestRestartKeepsTheLearnedState(t *testing.T) { testRestart(t, false) }

// TestRestartKeepsRoundRobinWithoutCPULimits: the same with pods without
// a CPU limit, whose cores are learned from their nodes' CPU: the
// restarted manager also keeps the DestinationRule on ROUND_ROBIN, where
// one that took a pod's cores from a single fresh reading flipped it to
// LEAST_REQUEST on its first cycle.
func TestRestartKeepsRoundRobinWithoutCPULimits(t *testing.T) { testRestart(t, true) }

func testRestart(t *testing.T, noLimits bool) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(logLevel())))
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	defer api.Stop()
	c, err := client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := "shop"
	speeds := []float64{1, 1, 1, 0.6, 0.6, 0.6, 0.35, 0.35, 0.35}
	fleet := &noisyFleet{c: c, ns: ns, se: "api-adaptive", speed: map[string]float64{}, ipPod: map[string]string{},
		rng: rand.New(rand.NewPCG(1, 2)), nodeCPU: noLimits}
	objs := []client.Object{Namespace(ns), Service(ns, "api", ServicePort("http", 80, intstr.FromInt32(8080)))}
	var nodes []*corev1.Node
	var eps []Endpoint
	for i, s := range speeds {
		name := "api-" + string(rune('a'+i))
		fleet.speed[name], fleet.ipPod[IP(30, i+1)] = s, name
		node, cpu := "node-1", WithCPULimit("2")
		if noLimits {
			// A node of 3 cores each, the pod requesting 1 (so between
			// 1 and 3 cores).
			node, cpu = fmt.Sprintf("node-%d", i+1), WithCPURequest("1")
		}
		if i == 0 || noLimits {
			n := Node(node, "r", "z", "", "m5.large")
			nodes = append(nodes, n)
			objs = append(objs, n)
		}
		objs = append(objs, Pod(ns, name, "api", node, WithSidecar(), cpu))
		eps = append(eps, Ready(name, IP(30, i+1), node))
	}
	objs = append(objs, EndpointSlice(ns, "api-1", "api", []SlicePort{{Name: "http", Port: 8080}}, eps...), Optimizer(ns, "api", "api"))
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
	if noLimits {
		for _, n := range nodes {
			n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3")}
			if err := c.Status().Update(ctx, n); err != nil {
				t.Fatalf("node %s allocatable: %v", n.Name, err)
			}
		}
	}

	defaults := controllers.DefaultEngineDefaults()
	defaults.Cycle = 300 * time.Millisecond
	defaults.Params.QueryWindow = time.Second
	defaults.Params.ScrapeInterval = 0
	defaults.Params.SlowStart = 0
	// startManager runs a manager until the returned stop is called.
	startManager := func() (*metrics.Metrics, func()) {
		mgr, err := ctrl.NewManager(api.Config, ctrl.Options{
			Scheme: harness.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, Cache: controllers.CacheOptions(nil),
			Controller: config.Controller{SkipNameValidation: ptr.To(true)},
		})
		if err != nil {
			t.Fatal(err)
		}
		m := metrics.New()
		mctx, cancel := context.WithCancel(ctx)
		if err := controllers.Setup(mctx, mgr, controllers.Dependencies{
			Clock: clock.RealClock{}, Metrics: m, ClusterDomain: "cluster.local", Source: fleet,
			Options: controllers.Options{MaxConcurrentReconciles: 1, Engine: defaults},
		}); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = mgr.Start(mctx); close(done) }()
		return m, func() { cancel(); <-done }
	}
	cycles := func(m *metrics.Metrics) float64 {
		total := 0.0
		for _, mode := range []string{"Optimizing", "Steady", "LowLoad", "Holding", "Fallback", "NoData"} {
			total += testutil.ToFloat64(m.Cycles.WithLabelValues(ns, "api", mode))
		}
		return total
	}
	waitCycles := func(m *metrics.Metrics, n float64) {
		t.Helper()
		start := cycles(m)
		if err := harness.Poll(60*time.Second, 20*time.Millisecond, func() error {
			if got := cycles(m) - start; got < n {
				return fmt.Errorf("%v cycles", got)
			}
			return nil
		}); err != nil {
			t.Fatalf("waiting for %v cycles: %v", n, err)
		}
	}
	seGeneration := func() int64 {
		se := &istionet.ServiceEntry{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-adaptive"}, se); err != nil {
			t.Fatal(err)
		}
		return se.Generation
	}
	balancer := func() (string, int64) {
		dr := &istionet.DestinationRule{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-adaptive"}, dr); err != nil {
			t.Fatal(err)
		}
		return dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple().String(), dr.Generation
	}

	// The long-running manager: learns, then holds still on noise.
	m, stop := startManager()
	waitCycles(m, 60)
	gen := seGeneration()
	waitCycles(m, 10)
	if g := seGeneration(); g != gen {
		t.Fatalf("the long-running manager wrote the ServiceEntry %d times in 10 steady cycles; the test needs a steady state", g-gen)
	}
	lb, drGen := balancer()
	stop()
	if noLimits && lb != "ROUND_ROBIN" {
		t.Fatalf("the long-running manager's DestinationRule is on %s; the test needs ROUND_ROBIN", lb)
	}
	opt := getOpt(t, c, ns)
	if opt.Annotations[controllers.AnnotationLearnedState] == "" {
		t.Fatalf("no learned state persisted on the optimizer")
	}
	t.Logf("persisted: %s", opt.Annotations[controllers.AnnotationLearnedState])

	// A restart: new manager, new book, new engine.
	m, stop = startManager()
	waitCycles(m, 5)
	stop()
	if g := seGeneration(); g != gen {
		t.Errorf("the restarted manager wrote the ServiceEntry %d times in its first 5 cycles, want 0", g-gen)
	}
	if lb2, g := balancer(); lb2 != lb || g != drGen {
		t.Errorf("the restarted manager wrote the DestinationRule %d times in its first 5 cycles (%s, then %s), want 0", g-drGen, lb, lb2)
	}

	// For comparison, a restart without the persisted state (logged only).
	opt = getOpt(t, c, ns)
	delete(opt.Annotations, controllers.AnnotationLearnedState)
	if err := c.Update(ctx, opt); err != nil {
		t.Fatal(err)
	}
	gen = seGeneration()
	m, stop = startManager()
	waitCycles(m, 5)
	stop()
	t.Logf("without the persisted state, a restart wrote the ServiceEntry %d times in 5 cycles", seGeneration()-gen)
}
