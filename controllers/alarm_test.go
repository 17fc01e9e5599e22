package controllers

import (
	"context"
	"flag"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// fleetSource answers the default queries for four equal pods at half of
// their 2 cores, 100 requests/s each at 20 ms, and the latency query over a
// window shorter than the query window (the recent latency) from recent
// (20 ms when absent). It records the latency queries it rendered.
type fleetSource struct {
	s Settings

	mu     sync.Mutex
	recent map[string]float64
	// served: the share of its requests a pod served over the recent
	// window (1 when absent).
	served    map[string]float64
	latencies []string
	// recentRequests: the request queries over a recent window.
	recentRequests []string
	recentAt       []time.Time // when each recent latency query was run
	// failRecent, when set, is the answer to the recent latency query.
	failRecent error
}

func (f *fleetSource) setFailRecent(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failRecent = err
}

func (f *fleetSource) setRecent(pod string, v float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recent[pod] = v
}

// setBehind makes pod fall behind: its recent latency v, and half of
// what it is sent served over the recent window.
func (f *fleetSource) setBehind(pod string, v float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recent[pod] = v
	if f.served == nil {
		f.served = map[string]float64{}
	}
	f.served[pod] = 0.5
}

func (f *fleetSource) Query(_ context.Context, tmpl string, t promsource.Target, at time.Time) (promsource.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q, err := promsource.Render(tmpl, t)
	if err != nil {
		return promsource.Result{Query: tmpl}, err
	}
	if tmpl == f.s.LatencyQuery && t.Window < f.s.Params.QueryWindow {
		f.recentAt = append(f.recentAt, at)
	}
	if tmpl == f.s.LatencyQuery && t.Window < f.s.Params.QueryWindow && f.failRecent != nil {
		f.latencies = append(f.latencies, q)
		return promsource.Result{Query: q}, f.failRecent
	}
	v := map[string]float64{}
	for _, p := range t.Pods {
		switch tmpl {
		case f.s.CPUQuery:
			v[p] = 1
		case f.s.RequestQuery:
			v[p] = 100
			if r, ok := f.served[p]; ok && t.Window < f.s.Params.QueryWindow {
				v[p] *= r
			}
		case f.s.LatencyQuery:
			v[p] = 0.02
			if r, ok := f.recent[p]; ok && t.Window < f.s.Params.QueryWindow {
				v[p] = r
			}
		}
	}
	if tmpl == f.s.LatencyQuery {
		f.latencies = append(f.latencies, q)
	}
	if tmpl == f.s.RequestQuery && t.Window < f.s.Params.QueryWindow {
		f.recentRequests = append(f.recentRequests, q)
	}
	if len(v) == 0 {
		return promsource.Result{Query: q}, &promsource.EmptyResultError{Query: q}
	}
	return promsource.Result{Query: q, Values: v}, nil
}

// learnedLoop returns a loop over optimizer ns/web whose engine has learned
// the fleet, with its source, key and settings.
func learnedLoop(t *testing.T, clk *clocktesting.FakeClock) (*WeightLoop, *fleetSource, types.NamespacedName, Settings) {
	t.Helper()
	s, err := settingsFor(optimizerFor("ns", "web"), DefaultEngineDefaults())
	if err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	book := NewWeightBook()
	var eps []desired.Endpoint
	for _, p := range []string{"web-0", "web-1", "web-2", "web-3"} {
		eps = append(eps, desired.Endpoint{Pod: p, Cores: 2, Weight: 1000})
	}
	book.Configure(key, clk.Now(), s)
	book.Applied(key, s.Params, clk.Now(), eps)
	src := &fleetSource{s: s, recent: map[string]float64{}}
	loop := &WeightLoop{Source: src, Book: book, Clock: clk, Metrics: metrics.New(), Wake: make(chan event.GenericEvent, 100)}
	for range 6 {
		clk.Step(2 * time.Minute)
		loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
		if out := book.Outcome(key); out != nil && out.Result.Changed {
			book.Applied(key, s.Params, clk.Now(), withWeights(book.Endpoints(key), out.Result.Weights))
		}
	}
	if out := book.Outcome(key); out == nil || !out.Result.Learned {
		t.Fatalf("the engine did not learn four equal pods: %+v", out)
	}
	return loop, src, key, s
}

// runningLoop is learnedLoop with the loop started (stopped when the test
// ends) and the channel on which its cycles wake the mirror.
func runningLoop(t *testing.T) (*clocktesting.FakeClock, *WeightLoop, *fleetSource, types.NamespacedName, Settings, chan event.GenericEvent) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	loop, src, key, s := learnedLoop(t, clk)
	wake := make(chan event.GenericEvent, 100)
	loop.Wake = wake
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = loop.Start(ctx) }()
	return clk, loop, src, key, s, wake
}

func withWeights(eps []desired.Endpoint, w map[string]uint32) []desired.Endpoint {
	out := append([]desired.Endpoint(nil), eps...)
	for i := range out {
		out[i].Weight = w[out[i].Pod]
	}
	return out
}

// By default (ROUND_ROBIN, the default queries, 15 s scrapes) the look
// between cycles runs once a scrape interval, every 15 s; it does not
// where it would not help or could not run.
func TestProbeIntervalFollowsTheSpec(t *testing.T) {
	d := DefaultEngineDefaults()
	cases := []struct {
		name string
		edit func(*optv1.IstioAdaptiveRequestOptimizer)
		want time.Duration
	}{
		{"defaults", func(*optv1.IstioAdaptiveRequestOptimizer) {}, 15 * time.Second},
		{"LEAST_REQUEST steers around queues itself", func(o *optv1.IstioAdaptiveRequestOptimizer) {
			o.Spec.LoadBalancer = optv1.LoadBalancerLeastRequest
		}, 0},
		{"dry run applies nothing", func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.DryRun = true }, 0},
		{"no latency query", func(o *optv1.IstioAdaptiveRequestOptimizer) {
			o.Spec.Optimization = &optv1.Optimization{LatencyQuery: "-"}
		}, 0},
		{"no scrape interval", func(o *optv1.IstioAdaptiveRequestOptimizer) {
			o.Spec.Optimization = &optv1.Optimization{ScrapeInterval: &optv1.Duration{}}
		}, 0},
		{"15ms scrapes (a typo): at most one look a second", func(o *optv1.IstioAdaptiveRequestOptimizer) {
			o.Spec.Optimization = &optv1.Optimization{ScrapeInterval: &optv1.Duration{Duration: 15 * time.Millisecond}}
		}, time.Second},
		{"30 s scrapes", func(o *optv1.IstioAdaptiveRequestOptimizer) {
			o.Spec.Optimization = &optv1.Optimization{ScrapeInterval: &optv1.Duration{Duration: 30 * time.Second},
				QueryWindow: &optv1.Duration{Duration: 2 * time.Minute}}
		}, 30 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := optimizerFor("ns", "web")
			tc.edit(o)
			s, err := settingsFor(o, d)
			if err != nil {
				t.Fatal(err)
			}
			if s.ProbeInterval != tc.want {
				t.Errorf("probe interval %v, want %v (recent latency window %v)", s.ProbeInterval, tc.want, s.RecentLatencyWindow)
			}
		})
	}
}

// --looks-between-cycles=false turns the looks off for every optimizer,
// and the manager's flags set it.
func TestLooksCanBeTurnedOff(t *testing.T) {
	var d EngineDefaults
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	d.BindFlags(fs)
	if !d.Looks {
		t.Fatal("looks are off by default")
	}
	if err := fs.Parse([]string{"--looks-between-cycles=false"}); err != nil {
		t.Fatal(err)
	}
	s, err := settingsFor(optimizerFor("ns", "web"), d)
	if err != nil {
		t.Fatal(err)
	}
	if s.ProbeInterval != 0 || s.RecentLatencyWindow == 0 {
		t.Errorf("looks off: look interval %v (want 0), recent latency window %v (want the cycle's query kept)", s.ProbeInterval, s.RecentLatencyWindow)
	}
}

// The look between cycles queries the latency over the last two scrape
// intervals; a pod at 10x its usual latency rings the engine's alarm,
// which optimizer_alarms_total counts; the usual latency does not.
func TestProbeRingsForAPodThatFellBehind(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	loop, src, key, s := learnedLoop(t, clk)
	tgt := target{"ns", "web"}
	alarms := func() float64 { return testutil.ToFloat64(loop.Metrics.Alarms.WithLabelValues("ns", "web")) }

	clk.Step(5 * time.Second)
	if loop.probe(context.Background(), logr.Discard(), key, tgt, s) || alarms() != 0 {
		t.Fatalf("usual latencies rang the alarm (%v counted)", alarms())
	}
	last := src.latencies[len(src.latencies)-1]
	if !strings.Contains(last, "[30s]") {
		t.Errorf("the look queried %s, want the latency query over [30s]", last)
	}

	// At 10x its latency but serving all it is sent: a chance queue.
	src.setRecent("web-2", 0.2)
	clk.Step(5 * time.Second)
	if loop.probe(context.Background(), logr.Discard(), key, tgt, s) || alarms() != 0 {
		t.Fatalf("web-2 at 10x its latency, serving all it is sent, rang the alarm (%v counted)", alarms())
	}
	src.mu.Lock()
	asked := slices.Clone(src.recentRequests)
	src.mu.Unlock()
	if len(asked) == 0 || !strings.Contains(asked[len(asked)-1], "[30s]") {
		t.Errorf("the look did not ask for the requests over [30s]: %v", asked)
	}

	src.setBehind("web-2", 0.2)
	clk.Step(5 * time.Second)
	if !loop.probe(context.Background(), logr.Discard(), key, tgt, s) {
		t.Fatal("web-2 at 10x its latency, serving half of what it is sent, did not ring the alarm")
	}
	if alarms() != 1 {
		t.Errorf("optimizer_alarms_total = %v, want 1", alarms())
	}
}

// Under the running worker, an alarm runs the cycle at once, long before
// the cycle's timer.
func TestAlarmRunsTheCycleBetweenCycles(t *testing.T) {
	clk, loop, src, key, s, wake := runningLoop(t)
	opt := optimizerFor("ns", "web")
	snap, ok := loop.Book.SnapshotToPersist(key)
	if !ok {
		t.Fatal("no snapshot to persist after learning")
	}
	loop.Book.Persisted(key, snap)
	loop.Ensure(opt, s)
	before := loop.Book.Outcome(key).Time

	// web-2 falls behind: its queue shows in its latency first.
	src.setBehind("web-2", 2)
	waitFor(t, func() bool { return clk.HasWaiters() })
	clk.Step(s.ProbeInterval)
	select {
	case <-wake:
	case <-time.After(5 * time.Second):
		t.Fatalf("no cycle within %v of the slowdown (the cycle is %v)", s.ProbeInterval, s.Cycle)
	}
	out := loop.Book.Outcome(key)
	if !out.Time.After(before) || out.Time.Sub(before) > s.ProbeInterval {
		t.Errorf("the cycle ran at %v, want %v after the last one", out.Time.Sub(before), s.ProbeInterval)
	}
	// Its windows are from before the slowdown and show web-2 keeping up;
	// only the recent latency shows it behind. The Service goes to
	// LEAST_REQUEST until they cover the change.
	behind, named := weights.Has(out.Result.Reasons, weights.ReasonBacklog)
	if out.Balancer != weights.BalancerLeastRequest || !named || !slices.Contains(behind.Pods, "web-2") {
		t.Errorf("the alarm's cycle: learned %v, %q; want not Learned (LEAST_REQUEST), naming web-2", out.Result.Learned, out.Result.Message)
	}
	if got := testutil.ToFloat64(loop.Metrics.Alarms.WithLabelValues("ns", "web")); got != 1 {
		t.Errorf("optimizer_alarms_total = %v, want 1", got)
	}
	// The engine was told the cycle was early: what it learned of the
	// cycle length and the noise, persisted on the optimizer, has not
	// changed, so there is nothing new to write there.
	if now, changed := loop.Book.SnapshotToPersist(key); changed {
		t.Errorf("the early cycle changed the learned state to persist: %+v, was %+v", now, snap)
	}
}

// Between two cycles the running worker looks every look interval, on the
// injected clock, up to the next cycle (the policy's timing,
// internal/policy): the looks after a cycle come one scrape interval (15 s)
// apart on the interval's multiples, the last within one interval of the
// next cycle, which comes a cycle after the last, give or take half a
// scrape interval.
func TestLooksRunUpToTheCycle(t *testing.T) {
	clk, loop, src, key, s, wake := runningLoop(t)
	interval := s.ProbeInterval
	if interval != 15*time.Second {
		t.Fatalf("look interval %v, want 15s (a 15s scrape interval)", interval)
	}
	// The last cycle ran as the worker starts; looks until the next.
	cycleAt := loop.Book.Outcome(key).Time
	loop.Ensure(optimizerFor("ns", "web"), s)
	src.mu.Lock()
	src.recentAt = nil
	src.mu.Unlock()
	for len(wake) == 0 {
		waitFor(t, func() bool { return clk.HasWaiters() })
		clk.Step(time.Second)
		if clk.Now().Sub(cycleAt) > 2*s.Cycle {
			t.Fatalf("no cycle within %v", 2*s.Cycle)
		}
	}
	next := loop.Book.Outcome(key).Time
	src.mu.Lock()
	defer src.mu.Unlock()
	var looks []time.Time
	for _, at := range src.recentAt {
		if at.Before(next) {
			looks = append(looks, at)
		}
	}
	// Looks fall on the interval's multiples on the clock (shared by all
	// optimizers), one interval apart, the first within one interval of
	// the cycle, the last within one interval of the next.
	first := cycleAt.Add(interval).Truncate(interval)
	var want []time.Time
	for at := first; at.Before(next); at = at.Add(interval) {
		want = append(want, at)
	}
	if len(looks) != len(want) {
		t.Fatalf("looks at %v, want at %v (cycles at %v and %v)", looks, want, cycleAt, next)
	}
	for i := range looks {
		if !looks[i].Equal(want[i]) {
			t.Errorf("looks at %v, want at %v", looks, want)
			break
		}
	}
	if d := next.Sub(cycleAt); d < s.Cycle-7500*time.Millisecond || d > s.Cycle+7500*time.Millisecond+time.Second {
		t.Errorf("the next cycle %v after the last, want the cycle %v give or take half a scrape interval", d, s.Cycle)
	}
}

// A look that fails counts in optimizer_query_errors_total; an empty answer
// (no pod served anything lately) does not. While the backend fails and the
// weights are held (Holding), there is no look at all.
func TestProbeFailuresAndHeldWeights(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	loop, src, key, s := learnedLoop(t, clk)
	tgt := target{"ns", "web"}
	errs := func(reason string) float64 {
		return testutil.ToFloat64(loop.Metrics.QueryErrors.WithLabelValues("ns", "web", "recent_latency", reason))
	}

	src.setFailRecent(&promsource.ServerError{StatusCode: 503, Type: "server_error", Message: "overloaded"})
	clk.Step(5 * time.Second)
	if loop.probe(context.Background(), logr.Discard(), key, tgt, s) {
		t.Error("a failed look rang the alarm")
	}
	if got := errs("server_error"); got != 1 {
		t.Errorf(`query_errors{signal="recent_latency",reason="server_error"} = %v, want 1`, got)
	}
	src.setFailRecent(&promsource.EmptyResultError{Query: "q"})
	clk.Step(5 * time.Second)
	if loop.probe(context.Background(), logr.Discard(), key, tgt, s) || errs("empty") != 0 {
		t.Errorf("an empty look rang or counted (%v)", errs("empty"))
	}

	// The backend fails a whole cycle: weights held, no more looks.
	src.setFailRecent(nil)
	loop.Source = failingSource{&promsource.ServerError{StatusCode: 503, Type: "server_error", Message: "down"}}
	clk.Step(30 * time.Second)
	loop.cycle(context.Background(), logr.Discard(), key, tgt, s)
	if out := loop.Book.Outcome(key); out.Result.Mode != "Holding" {
		t.Fatalf("mode %s after a failed cycle, want Holding", out.Result.Mode)
	}
	loop.Source = src
	src.setBehind("web-2", 2)
	n := len(src.latencies)
	clk.Step(5 * time.Second)
	if loop.probe(context.Background(), logr.Discard(), key, tgt, s) || len(src.latencies) != n {
		t.Errorf("looked (%d queries) or rang while the weights are held", len(src.latencies)-n)
	}
}

// Each cycle runs the latency query over two scrape intervals too: the
// engine gets each pod's RecentLatency (what it learns the pods' noise
// from), and optimizer_signal_available{signal="recent_latency"} says so.
func TestCycleQueriesTheRecentLatency(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	loop, src, key, s := learnedLoop(t, clk)
	src.setRecent("web-1", 0.03)
	obs, avail, ok := loop.observe(context.Background(), logr.Discard(), key, target{"ns", "web"}, s, []string{"web-0", "web-1"}, clk.Now())
	if !ok || !avail.RecentLatency || s.RecentLatencyWindow == 0 {
		t.Fatalf("observe: ok %v, signals %+v; want the recent latency", ok, avail)
	}
	if a, b := obs.Signals["web-0"], obs.Signals["web-1"]; a.RecentLatency != 0.02 || b.RecentLatency != 0.03 || b.Latency != 0.02 {
		t.Errorf("signals %+v, want web-1's recent latency 0.03 beside its window's 0.02", obs.Signals)
	}
	var recent int
	for _, q := range src.latencies {
		if strings.Contains(q, "[30s]") {
			recent++
		}
	}
	if recent == 0 {
		t.Errorf("latency queries %q: none over [30s]", src.latencies)
	}
	if got := testutil.ToFloat64(loop.Metrics.SignalAvailable.WithLabelValues("ns", "web", "recent_latency")); got != 1 {
		t.Errorf(`optimizer_signal_available{signal="recent_latency"} = %v, want 1`, got)
	}
	s.LatencyQuery = "-"
	s.complete()
	if s.RecentLatencyWindow != 0 || s.ProbeInterval != 0 {
		t.Errorf("latency_query \"-\": recent window %v, look interval %v; want neither", s.RecentLatencyWindow, s.ProbeInterval)
	}
}

// Switching an optimizer to ROUND_ROBIN reaches its running worker at once:
// the looks start without waiting for the next cycle.
func TestLooksStartWhenTheSettingsAllowThem(t *testing.T) {
	clk, loop, src, _, s, wake := runningLoop(t)
	opt := optimizerFor("ns", "web")
	lr := s
	lr.RoundRobin = false
	lr.complete()
	if lr.ProbeInterval != 0 {
		t.Fatalf("LEAST_REQUEST: look interval %v, want none", lr.ProbeInterval)
	}
	loop.Ensure(opt, lr)
	waitFor(t, func() bool { return clk.HasWaiters() })
	src.setBehind("web-2", 2)
	loop.Ensure(opt, s)
	var stepped time.Duration
	for stepped < s.Cycle/2 {
		waitFor(t, func() bool { return clk.HasWaiters() })
		clk.Step(s.ProbeInterval)
		stepped += s.ProbeInterval
		select {
		case <-wake:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	t.Errorf("no early cycle within %v of the switch to ROUND_ROBIN (cycle %v)", stepped, s.Cycle)
}
