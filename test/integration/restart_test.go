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
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	// cpuOnly: the request-rate and latency queries get no data.
	cpuOnly bool
	// hot: a pod that reads at its limit of 2 cores ("" for none).
	hot string
}

func (f *noisyFleet) Query(ctx context.Context, tmpl string, t promsource.Target, _ time.Time) (promsource.Result, error) {
	requests := tmpl == promsource.DefaultRequestQuery
	node := tmpl == promsource.DefaultNodeCPUQuery
	if (f.nodeCPU || f.cpuOnly) && tmpl == promsource.DefaultLatencyQuery || f.cpuOnly && requests {
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
		case pod == f.hot:
			res.Values[pod] = 2
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

// restartEnv is a Service of nine pods of three speeds behind an
// optimizer on a real API server, its metrics from a noisyFleet, and
// managers started and stopped at will.
type restartEnv struct {
	c     client.Client
	ns    string
	fleet *noisyFleet
	// start runs a manager until the returned stop is called.
	start func() (*metrics.Metrics, func())
}

func newRestartEnv(t *testing.T, noLimits, cpuOnly bool, tune ...func(*controllers.EngineDefaults)) *restartEnv {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(logLevel())))
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	c, err := client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	ns := "shop"
	speeds := []float64{1, 1, 1, 0.6, 0.6, 0.6, 0.35, 0.35, 0.35}
	fleet := &noisyFleet{c: c, ns: ns, se: "api-adaptive", speed: map[string]float64{}, ipPod: map[string]string{},
		rng: rand.New(rand.NewPCG(1, 2)), nodeCPU: noLimits, cpuOnly: cpuOnly}
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
	for _, f := range tune {
		f(&defaults)
	}
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
	return &restartEnv{c: c, ns: ns, fleet: fleet, start: startManager}
}

// cycles is the number of weight cycles m has counted.
func (e *restartEnv) cycles(m *metrics.Metrics) float64 {
	total := 0.0
	for _, mode := range []string{"Optimizing", "Steady", "LowLoad", "Holding", "Fallback", "NoData"} {
		total += testutil.ToFloat64(m.Cycles.WithLabelValues(e.ns, "api", mode))
	}
	return total
}

// waitCycles waits for n more weight cycles of m.
func (e *restartEnv) waitCycles(t *testing.T, m *metrics.Metrics, n float64) {
	t.Helper()
	start := e.cycles(m)
	if err := harness.Poll(60*time.Second, 20*time.Millisecond, func() error {
		if got := e.cycles(m) - start; got < n {
			return fmt.Errorf("%v cycles", got)
		}
		return nil
	}); err != nil {
		t.Fatalf("waiting for %v cycles: %v", n, err)
	}
}

func (e *restartEnv) seGeneration(t *testing.T) int64 {
	t.Helper()
	se := &istionet.ServiceEntry{}
	if err := e.c.Get(t.Context(), client.ObjectKey{Namespace: e.ns, Name: "api-adaptive"}, se); err != nil {
		t.Fatal(err)
	}
	return se.Generation
}

// balancer is the DestinationRule's load balancer and generation.
func (e *restartEnv) balancer(t *testing.T) (string, int64) {
	t.Helper()
	dr := &istionet.DestinationRule{}
	if err := e.c.Get(t.Context(), client.ObjectKey{Namespace: e.ns, Name: "api-adaptive"}, dr); err != nil {
		t.Fatal(err)
	}
	return dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple().String(), dr.Generation
}

func testRestart(t *testing.T, noLimits bool) {
	env := newRestartEnv(t, noLimits, false)
	c, ns, ctx := env.c, env.ns, t.Context()

	// The long-running manager: learns, then holds still on noise.
	m, stop := env.start()
	env.waitCycles(t, m, 60)
	gen := env.seGeneration(t)
	env.waitCycles(t, m, 10)
	if g := env.seGeneration(t); g != gen {
		t.Fatalf("the long-running manager wrote the ServiceEntry %d times in 10 steady cycles; the test needs a steady state", g-gen)
	}
	lb, drGen := env.balancer(t)
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
	m, stop = env.start()
	env.waitCycles(t, m, 5)
	stop()
	if g := env.seGeneration(t); g != gen {
		t.Errorf("the restarted manager wrote the ServiceEntry %d times in its first 5 cycles, want 0", g-gen)
	}
	if lb2, g := env.balancer(t); lb2 != lb || g != drGen {
		t.Errorf("the restarted manager wrote the DestinationRule %d times in its first 5 cycles (%s, then %s), want 0", g-drGen, lb, lb2)
	}

	// For comparison, a restart without the persisted state (logged only).
	opt = getOpt(t, c, ns)
	delete(opt.Annotations, controllers.AnnotationLearnedState)
	if err := c.Update(ctx, opt); err != nil {
		t.Fatal(err)
	}
	gen = env.seGeneration(t)
	m, stop = env.start()
	env.waitCycles(t, m, 5)
	stop()
	t.Logf("without the persisted state, a restart wrote the ServiceEntry %d times in 5 cycles", env.seGeneration(t)-gen)
}

// TestRestartKeepsLeastRequestForAPodAtItsLimit: on CPU alone, a pod at its
// limit after learning puts the DestinationRule on LEAST_REQUEST until
// request rates measure the pods (policy.ReasonCPUAtLimit). A restarted
// manager reads that reason from the status and keeps it, although no pod
// is at its limit any more: one that learned again switched to ROUND_ROBIN
// after a query window, and back at the next pod at its limit.
func TestRestartKeepsLeastRequestForAPodAtItsLimit(t *testing.T) {
	env := newRestartEnv(t, false, true)
	reason := func() (string, string) {
		o := getOpt(t, env.c, env.ns)
		return o.Status.LoadBalancer, o.Status.LoadBalancerReason
	}
	onBalancer := func(want, why string) func() error {
		return func() error {
			dr := &istionet.DestinationRule{}
			if err := env.c.Get(t.Context(), client.ObjectKey{Namespace: env.ns, Name: "api-adaptive"}, dr); err != nil {
				return err
			}
			if lb := dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple().String(); lb != want {
				return fmt.Errorf("DestinationRule on %s", lb)
			}
			if lb, r := reason(); lb != want || r != why {
				return fmt.Errorf("status.loadBalancer %q, loadBalancerReason %q", lb, r)
			}
			return nil
		}
	}
	m, stop := env.start()
	harness.Eventually(t, 60*time.Second, "ROUND_ROBIN learned from CPU alone", onBalancer("ROUND_ROBIN", "Learned"))
	env.fleet.mu.Lock()
	env.fleet.hot = "api-a"
	env.fleet.mu.Unlock()
	harness.Eventually(t, 30*time.Second, "LEAST_REQUEST for a pod at its limit", onBalancer("LEAST_REQUEST", "CPUAtLimit"))
	env.fleet.mu.Lock()
	env.fleet.hot = ""
	env.fleet.mu.Unlock()
	env.waitCycles(t, m, 5)
	stop()
	_, drGen := env.balancer(t)

	// A query window is 1 s, a cycle 0.3 s: 10 cycles are three windows
	// of results Learned on CPU alone with no pod at its limit.
	m, stop = env.start()
	env.waitCycles(t, m, 10)
	stop()
	if lb, g := env.balancer(t); lb != "LEAST_REQUEST" || g != drGen {
		t.Errorf("the restarted manager wrote the DestinationRule %d times in 10 cycles, now %s; want none, LEAST_REQUEST", g-drGen, lb)
	}
	if lb, r := reason(); lb != "LEAST_REQUEST" || r != "CPUAtLimit" {
		t.Errorf("after the restart: status.loadBalancer %q, loadBalancerReason %q; want LEAST_REQUEST, CPUAtLimit", lb, r)
	}
}

// TestRestartGivesAPodReadyWhileDownNoLiveWeight: ServiceEntry endpoints
// carry no pod identity, so a restarted manager matches the live weights to
// pods by address. A pod created while it was down, at the address of a
// fast pod that left, must not take that pod's learned weight: it was
// created and became Ready after the operator last wrote the ServiceEntry
// (its managed fields' time), so it is new and starts its slow start from
// its Ready time. The other pods keep their live weights.
func TestRestartGivesAPodReadyWhileDownNoLiveWeight(t *testing.T) {
	env := newRestartEnv(t, false, false, func(d *controllers.EngineDefaults) { d.Params.SlowStart = 5 * time.Minute })
	c, ns, ctx := env.c, env.ns, t.Context()
	m, stop := env.start()
	env.waitCycles(t, m, 60)
	stop()
	se := &istionet.ServiceEntry{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-adaptive"}, se); err != nil {
		t.Fatal(err)
	}
	before := map[string]uint32{}
	sum := 0.0
	for _, e := range se.Spec.Endpoints {
		before[e.Address] = e.Weight
		sum += float64(e.Weight)
	}
	mean := sum / float64(len(se.Spec.Endpoints))
	addr := IP(30, 1) // api-a's, one of the fast pods
	if float64(before[addr]) < 1.2*mean {
		t.Fatalf("api-a's learned weight %d is not above the mean %.0f; the test needs a fast pod's weight", before[addr], mean)
	}
	var written time.Time
	for _, mf := range se.ManagedFields {
		if mf.Manager == controllers.FieldManager && mf.Time != nil && mf.Time.After(written) {
			written = mf.Time.Time
		}
	}
	if written.IsZero() {
		t.Fatalf("the ServiceEntry has no managed fields entry of %s", controllers.FieldManager)
	}

	// While the manager is down, api-a goes and a slow pod comes up at its
	// address.
	if err := c.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "api-a"}}); err != nil {
		t.Fatal(err)
	}
	pod := Pod(ns, "api-new", "api", "node-1", WithSidecar(), WithCPULimit("2"))
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	// Ready now, and after the write (the times are at whole seconds).
	readyAt := metav1.NewTime(time.Now())
	if !readyAt.After(written) {
		readyAt = metav1.NewTime(written.Add(time.Second))
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: readyAt}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-1"}, slice); err != nil {
		t.Fatal(err)
	}
	for i := range slice.Endpoints {
		if r := slice.Endpoints[i].TargetRef; r != nil && r.Name == "api-a" {
			r.Name = "api-new"
		}
	}
	if err := c.Update(ctx, slice); err != nil {
		t.Fatal(err)
	}
	env.fleet.mu.Lock()
	env.fleet.speed["api-new"], env.fleet.ipPod[addr] = 0.35, "api-new"
	env.fleet.mu.Unlock()

	// The restart: within its first cycles the new pod is at the start of
	// its slow start (the smallest weight, a twentieth of the mean, rising to
	// the median's over five minutes: below a third of the mean for more
	// than a minute, however slowly the manager starts), not at api-a's
	// weight.
	m, stop = env.start()
	defer stop()
	env.waitCycles(t, m, 5)
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-adaptive"}, se); err != nil {
		t.Fatal(err)
	}
	after := map[string]uint32{}
	for _, e := range se.Spec.Endpoints {
		after[e.Address] = e.Weight
	}
	if float64(after[addr]) > mean/3 {
		t.Errorf("the pod Ready after the last write has weight %d at its address (api-a's was %d, the mean %.0f); want a slow start's, below a third of the mean", after[addr], before[addr], mean)
	}
	for a, w := range before {
		if a != addr && after[a] == 0 {
			t.Errorf("endpoint %s lost its weight (%d before)", a, w)
		}
	}
	t.Logf("weights before %v, after the restart %v", before, after)
}
