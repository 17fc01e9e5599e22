// Package integration runs the manager's weight loop against a real API
// server and a real Prometheus that scrapes simulated pods on loopback.
package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap/zapcore"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	"github.com/liorfranko/istio-adaptive-least-request/test/fakepod"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// fleet: two fast pods and two slow ones, one core each.
var fleet = []struct {
	name  string
	speed float64
}{{"api-fast-0", 1.0}, {"api-fast-1", 1.0}, {"api-slow-0", 0.4}, {"api-slow-1", 0.4}}

const (
	work  = 0.01 // CPU-seconds per request at speed 1
	cycle = 2 * time.Second
)

// TestWeightsFollowCapacityAndSurvivePrometheusOutage is the weight engine
// end to end: simulated pods export cAdvisor and Istio counters, a real
// Prometheus scrapes them, the manager queries it and writes weights, and the
// simulated traffic follows the weights in the ServiceEntry.
func TestWeightsFollowCapacityAndSurvivePrometheusOutage(t *testing.T) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr), zap.Level(logLevel())))
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	defer api.Stop()

	ns := "shop"
	var pods []fakepod.Pod
	totalCapacity := 0.0
	for _, p := range fleet {
		pods = append(pods, fakepod.Pod{Name: p.name, Namespace: ns, Speed: p.speed, Cores: 1})
		totalCapacity += p.speed / work
	}
	exporter, err := fakepod.New(pods...)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := exporter.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer exporter.Close()
	// Stopped by the harness at cleanup, after printing its log on failure.
	prom := harness.MustStartPrometheus(t, harness.PrometheusOptions{Targets: []string{addr}, ScrapeInterval: time.Second})

	source, err := promsource.New(promsource.Config{URL: prom.URL, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{Scheme: harness.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, Cache: controllers.CacheOptions(nil)})
	if err != nil {
		t.Fatal(err)
	}
	testMetrics := metrics.New()
	defaults := controllers.DefaultEngineDefaults()
	defaults.Cycle = cycle
	defaults.Params.QueryWindow = 6 * time.Second
	defaults.Params.ScrapeInterval = time.Second
	defaults.Params.Expiry = 10 * time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := controllers.Setup(ctx, mgr, controllers.Dependencies{
		Clock: clock.RealClock{}, Metrics: testMetrics, ClusterDomain: "cluster.local", Source: source,
		Options: controllers.Options{MaxConcurrentReconciles: 2, Engine: defaults},
	}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()

	c, err := client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		Namespace(ns), Node("node-1", "r", "z", "", "m5.large"),
		Service(ns, "api", ServicePort("http", 80, intstr.FromInt32(8080))),
	}
	var eps []Endpoint
	for i, p := range fleet {
		objs = append(objs, Pod(ns, p.name, "api", "node-1", WithSidecar(), WithCPULimit("1")))
		eps = append(eps, Ready(p.name, IP(20, i+1), "node-1"))
	}
	// The optimizer starts in dry run: weights are computed and published,
	// not applied.
	opt := Optimizer(ns, "api", "api")
	opt.Spec.DryRun = true
	objs = append(objs, EndpointSlice(ns, "api-1", "api", []SlicePort{{Name: "http", Port: 8080}}, eps...), opt)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}

	// Traffic follows the weights in the ServiceEntry, as Envoy's weighted
	// round robin would, at 80% of the fleet's total capacity.
	podByIP := map[string]string{}
	for i, p := range fleet {
		podByIP[IP(20, i+1)] = p.name
	}
	readWeights := func() map[string]float64 {
		se := &istionet.ServiceEntry{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "api-adaptive"}, se); err != nil {
			return nil
		}
		w := map[string]float64{}
		for _, e := range se.Spec.Endpoints {
			w[podByIP[e.Address]] = float64(e.Weight)
		}
		return w
	}
	go exporter.Run(ctx, 100*time.Millisecond)
	go func() {
		for ctx.Err() == nil {
			if w := readWeights(); w != nil {
				exporter.SetLoad(fakepod.Load{RPS: 0.8 * totalCapacity, Work: work, Shares: w})
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// The promise solved on the true capacities at 80% load: capacity
	// shares would be 1 : 1 : 0.4 : 0.4; below full load the slow pods get
	// less (weights.Split, the engine's own solver).
	cores, speeds := make([]float64, len(fleet)), make([]float64, len(fleet))
	for i, p := range fleet {
		cores[i], speeds[i] = 1, p.speed/work
	}
	split := weights.Split(cores, speeds, 0.8*totalCapacity)
	wantShare := map[string]float64{}
	for i, p := range fleet {
		wantShare[p.name] = split[i]
	}
	t.Logf("the promise's shares at 80%% load: %v", wantShare)
	// The engine reads speeds and load from 6 s rate windows of a real
	// Prometheus: within 8% of the promise's shares, which tells them
	// from capacity shares (the slow pods' 0.143, 10% above).
	const shareTolerance = 0.08
	// Dry run: status and metrics carry the computed weights while the
	// ServiceEntry keeps equal ones.
	harness.Eventually(t, 60*time.Second, "dry-run weights in status", func() error {
		o := getOpt(t, c, ns)
		w := map[string]float64{}
		for _, e := range o.Status.Weights {
			w[e.Pod] = float64(e.Weight)
		}
		if len(w) != len(fleet) {
			return fmt.Errorf("status weights %v", o.Status.Weights)
		}
		if err := sharesWithin(w, wantShare, shareTolerance); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(o.Status.Conditions, "Ready"); c == nil || !strings.Contains(c.Message, "dry run") {
			return fmt.Errorf("Ready does not say dry run: %+v", c)
		}
		return nil
	})
	if err := sharesWithin(readWeights(), map[string]float64{"api-fast-0": .25, "api-fast-1": .25, "api-slow-0": .25, "api-slow-1": .25}, 0.001); err != nil {
		t.Fatalf("dry run changed the ServiceEntry: %v", err)
	}
	if got, ok := testMetrics.EndpointWeightValue(ns, "api", IP(20, 1), "r/z"); !ok || got < 1200 {
		t.Errorf("endpoint_weight of the fast pod in dry run = %v (series present: %v), want the computed weight (> 1200)", got, ok)
	}
	patch := client.MergeFrom(getOpt(t, c, ns))
	live := getOpt(t, c, ns)
	live.Spec.DryRun = false
	if err := c.Patch(ctx, live, patch); err != nil {
		t.Fatal(err)
	}

	converged := func() error {
		w := readWeights()
		if len(w) != len(fleet) {
			return fmt.Errorf("weights %v", w)
		}
		return sharesWithin(w, wantShare, shareTolerance)
	}
	start := time.Now()
	harness.Eventually(t, 60*time.Second, "weights at the promise's shares", converged)
	t.Logf("weights converged in %s: %v", time.Since(start).Round(time.Second), readWeights())
	harness.Eventually(t, 10*time.Second, "status reports the optimization", func() error {
		o := getOpt(t, c, ns)
		if o.Status.LastOptimizationTime == nil || o.Status.WeightSpread == "" {
			return fmt.Errorf("status %+v", o.Status)
		}
		if cond := meta.FindStatusCondition(o.Status.Conditions, "Degraded"); cond == nil || cond.Status != "False" {
			return fmt.Errorf("Degraded = %+v", cond)
		}
		return nil
	})

	// Steady state: the weights hold still, so the ServiceEntry is not
	// rewritten (every write is a mesh-wide xDS push): at most one write in
	// ten cycles.
	seWrites := func() float64 {
		return testutil.ToFloat64(testMetrics.Writes.WithLabelValues(ns, "api", "ServiceEntry"))
	}
	before := seWrites()
	time.Sleep(10 * cycle)
	if w := seWrites() - before; w > 1 {
		t.Errorf("%v ServiceEntry writes in 10 cycles at steady state, want at most 1", w)
	}

	// Prometheus dies: the last good weights are held, with a condition.
	held := readWeights()
	if err := prom.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	harness.Eventually(t, 5*cycle, "Degraded MetricsUnavailable", func() error {
		return wantCondition(getOpt(t, c, ns), "Degraded", "True", "MetricsUnavailable")
	})
	if w := readWeights(); sharesWithin(w, normalize(held), 0.001) != nil {
		t.Errorf("weights changed while holding: %v -> %v", held, w)
	}
	// After the expiry, weights fall back to equal, with a condition.
	harness.Eventually(t, defaults.Params.Expiry+5*cycle, "Degraded WeightsFallback", func() error {
		return wantCondition(getOpt(t, c, ns), "Degraded", "True", "WeightsFallback")
	})
	// The expiry runs from the last good observation, at most one cycle
	// before the kill.
	if time.Since(killed) < defaults.Params.Expiry-cycle {
		t.Errorf("fell back %s after the kill, before the expiry of %s", time.Since(killed), defaults.Params.Expiry)
	}
	harness.Eventually(t, 3*cycle, "equal weights in fallback", func() error {
		return sharesWithin(readWeights(), map[string]float64{"api-fast-0": .25, "api-fast-1": .25, "api-slow-0": .25, "api-slow-1": .25}, 0.001)
	})

	// Prometheus returns: weights move back to the promise's shares, the
	// condition clears.
	if err := prom.Restart(); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 60*time.Second, "weights at the promise's shares after recovery", converged)
	harness.Eventually(t, 10*time.Second, "Degraded cleared", func() error {
		return wantCondition(getOpt(t, c, ns), "Degraded", "False", "")
	})
}

func getOpt(t *testing.T, c client.Client, ns string) *optv1.IstioAdaptiveRequestOptimizer {
	t.Helper()
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "api"}, o); err != nil {
		t.Fatal(err)
	}
	return o
}

func wantCondition(o *optv1.IstioAdaptiveRequestOptimizer, typ, status, reason string) error {
	cond := meta.FindStatusCondition(o.Status.Conditions, typ)
	if cond == nil || string(cond.Status) != status || (reason != "" && cond.Reason != reason) {
		return fmt.Errorf("%s = %+v, want %s/%s", typ, cond, status, reason)
	}
	return nil
}

func normalize(w map[string]float64) map[string]float64 {
	sum := 0.0
	for _, v := range w {
		sum += v
	}
	out := map[string]float64{}
	for k, v := range w {
		out[k] = v / sum
	}
	return out
}

// sharesWithin checks each weight's share is within rel of the wanted share.
func sharesWithin(w, want map[string]float64, rel float64) error {
	got := normalize(w)
	var bad []string
	for k, s := range want {
		if math.Abs(got[k]-s) > rel*s {
			bad = append(bad, fmt.Sprintf("%s %.3f (want %.3f)", k, got[k], s))
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		return fmt.Errorf("shares off: %s", strings.Join(bad, ", "))
	}
	return nil
}

func logLevel() zapcore.Level {
	if os.Getenv("TEST_VERBOSE") != "" {
		return zapcore.InfoLevel
	}
	return zapcore.ErrorLevel
}
