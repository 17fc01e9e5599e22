package controllers

import (
	"context"
	"math"
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

// windowSource renders every query it is asked, as Prometheus would get
// it, and answers the CPU query by its window: cpu over the query window,
// recent over any other.
type windowSource struct {
	cpuQuery    string
	window      time.Duration
	cpu, recent map[string]float64

	mu       sync.Mutex
	rendered []string
	windows  []time.Duration // of the CPU query, in order
}

func (s *windowSource) Query(_ context.Context, tmpl string, t promsource.Target, _ time.Time) (promsource.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, err := promsource.Render(tmpl, t)
	if err != nil {
		return promsource.Result{Query: tmpl}, err
	}
	s.rendered = append(s.rendered, q)
	if tmpl != s.cpuQuery {
		return promsource.Result{Query: q}, &promsource.EmptyResultError{Query: q}
	}
	s.windows = append(s.windows, t.Window)
	v := s.recent
	if t.Window == s.window {
		v = s.cpu
	}
	if len(v) == 0 {
		return promsource.Result{Query: q}, &promsource.EmptyResultError{Query: q}
	}
	return promsource.Result{Query: q, Values: v}, nil
}

// recentCycle runs one cycle of optimizer ns/web (pods web-0 and web-1)
// with settings s against src: the observation the engine was given
// (queried once more, from a copy of src), the book and the metrics.
func recentCycle(t *testing.T, s Settings, src func() MetricsSource) (weights.Observation, *WeightBook, *metrics.Metrics) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	book := NewWeightBook()
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	book.Applied(key, s.Params, clk.Now(), []desired.Endpoint{{Pod: "web-0", Cores: 1, Weight: 1000}, {Pod: "web-1", Cores: 1, Weight: 1000}})
	m := metrics.New()
	loop := &WeightLoop{Source: src(), Book: book, Clock: clk, Metrics: m, Wake: make(chan event.GenericEvent, 1)}
	loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)

	probe := &WeightLoop{Source: src(), Book: NewWeightBook(), Clock: clk, Metrics: metrics.New()}
	obs, _, ok := probe.observe(context.Background(), logr.Discard(), key, target{"ns", "web"}, s, []string{"web-0", "web-1"}, clk.Now())
	if !ok {
		t.Fatal("observe stopped")
	}
	return obs, book, m
}

// Each cycle runs the CPU query a second time over two scrape intervals
// (30s with the default 15s), and its answer is each pod's RecentCPU;
// optimizer_signal_available{signal="recent_cpu"} says it had data.
func TestRecentCPUIsTheCPUQueryOverTwoScrapeIntervals(t *testing.T) {
	d := DefaultEngineDefaults()
	s, err := settingsFor(optimizerFor("ns", "web"), d)
	if err != nil {
		t.Fatal(err)
	}
	if s.Params.ScrapeInterval != 15*time.Second || s.Params.QueryWindow != time.Minute {
		t.Fatalf("defaults changed (scrape interval %v, window %v): adjust the rendered windows below", s.Params.ScrapeInterval, s.Params.QueryWindow)
	}
	var src *windowSource
	obs, book, m := recentCycle(t, s, func() MetricsSource {
		src = &windowSource{cpuQuery: s.CPUQuery, window: time.Minute,
			cpu:    map[string]float64{"web-0": 0.6, "web-1": 0.5},
			recent: map[string]float64{"web-0": 0.99, "web-1": 0.5}}
		return src
	})

	if len(src.windows) != 2 || src.windows[0] != time.Minute || src.windows[1] != 30*time.Second {
		t.Fatalf("CPU query windows %v, want [1m0s 30s]", src.windows)
	}
	full, err := promsource.Render(s.CPUQuery, promsource.Target{Namespace: "ns", Service: "web", Pods: []string{"web-0", "web-1"}, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	recent, err := promsource.Render(s.CPUQuery, promsource.Target{Namespace: "ns", Service: "web", Pods: []string{"web-0", "web-1"}, Window: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var sawFull, sawRecent bool
	for _, q := range src.rendered {
		sawFull = sawFull || q == full
		sawRecent = sawRecent || q == recent
	}
	if !sawFull || !sawRecent {
		t.Errorf("queries %q, want both %q and %q", src.rendered, full, recent)
	}
	if want := "[30s]"; !strings.Contains(recent, want) {
		t.Errorf("recent CPU query %q has no %s", recent, want)
	}

	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	if a, b := obs.Signals["web-0"], obs.Signals["web-1"]; a.RecentCPU != 0.99 || a.CPU != 0.6 || b.RecentCPU != 0.5 || b.CPU != 0.5 {
		t.Errorf("signals %+v, want web-0 recent 0.99 over 0.6 and web-1 0.5 both", obs.Signals)
	}
	out := book.Outcome(key)
	if out == nil || !out.Signals.RecentCPU || s.RecentCPUWindow == 0 {
		t.Fatalf("outcome signals %+v, want recent CPU available", out)
	}
	if got := testutil.ToFloat64(m.SignalAvailable.WithLabelValues("ns", "web", "recent_cpu")); got != 1 {
		t.Errorf(`optimizer_signal_available{signal="recent_cpu"} = %v, want 1`, got)
	}
}

// Without a known scrape interval, with a query window no longer than two
// scrape intervals, or with a CPU query that has no window (a recording
// rule), the recent query would be unbounded or the CPU query again: it is
// not run, RecentCPU stays unknown, and its availability is 0.
func TestRecentCPUSkipped(t *testing.T) {
	for name, edit := range map[string]func(*Settings){
		"scrape interval 0": func(s *Settings) { s.Params.ScrapeInterval = 0 },
		"window of two scrape intervals": func(s *Settings) {
			s.Params.ScrapeInterval, s.Params.QueryWindow = 30*time.Second, time.Minute
		},
		"no window in the CPU query": func(s *Settings) {
			s.CPUQuery = `sum by (pod) (pod:cpu_usage:rate5m{namespace="{{.Namespace}}", pod=~"{{.Pods}}"})`
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := settingsFor(optimizerFor("ns", "web"), DefaultEngineDefaults())
			if err != nil {
				t.Fatal(err)
			}
			edit(&s)
			s.complete() // as settingsFor does after its edits
			if w := s.RecentCPUWindow; w != 0 {
				t.Fatalf("recent window %v, want none", w)
			}
			var src *windowSource
			obs, book, m := recentCycle(t, s, func() MetricsSource {
				src = &windowSource{cpuQuery: s.CPUQuery, window: s.Params.QueryWindow,
					cpu: map[string]float64{"web-0": 0.6, "web-1": 0.5}, recent: map[string]float64{"web-0": 0.99, "web-1": 0.5}}
				return src
			})
			if len(src.windows) != 1 {
				t.Errorf("CPU query run over %v, want once over the query window", src.windows)
			}
			key := types.NamespacedName{Namespace: "ns", Name: "web"}
			if len(obs.Signals) != 2 {
				t.Fatalf("signals %+v, want both pods", obs.Signals)
			}
			for pod, sig := range obs.Signals {
				if sig.CPU != src.cpu[pod] {
					t.Errorf("%s: CPU %v, want %v", pod, sig.CPU, src.cpu[pod])
				}
				if !math.IsNaN(sig.RecentCPU) {
					t.Errorf("%s: recent CPU %v, want NaN (unknown)", pod, sig.RecentCPU)
				}
			}
			if out := book.Outcome(key); out == nil || out.Signals.RecentCPU {
				t.Errorf("outcome signals %+v, want no recent CPU", out)
			}
			if got := testutil.ToFloat64(m.SignalAvailable.WithLabelValues("ns", "web", "recent_cpu")); got != 0 {
				t.Errorf(`optimizer_signal_available{signal="recent_cpu"} = %v, want 0`, got)
			}
		})
	}
}

// A recent CPU query that fails is counted under its own signal and the
// cycle goes on with the window's CPU.
func TestRecentCPUFailureDoesNotFailTheCycle(t *testing.T) {
	s, err := settingsFor(optimizerFor("ns", "web"), DefaultEngineDefaults())
	if err != nil {
		t.Fatal(err)
	}
	obs, book, m := recentCycle(t, s, func() MetricsSource {
		return &recentFailingSource{windowSource: windowSource{cpuQuery: s.CPUQuery, window: s.Params.QueryWindow,
			cpu: map[string]float64{"web-0": 0.6, "web-1": 0.5}}}
	})
	if a := obs.Signals["web-0"]; a.CPU != 0.6 || !math.IsNaN(a.RecentCPU) {
		t.Errorf("web-0 signal %+v, want CPU 0.6 and no recent CPU", a)
	}
	out := book.Outcome(types.NamespacedName{Namespace: "ns", Name: "web"})
	if out == nil || out.QueryErr != nil || !out.Signals.CPU || out.Signals.RecentCPU {
		t.Fatalf("outcome %+v, want a cycle on CPU without recent CPU", out)
	}
	if got := testutil.ToFloat64(m.QueryErrors.WithLabelValues("ns", "web", "recent_cpu", "server_error")); got != 1 {
		t.Errorf(`optimizer_query_errors_total{signal="recent_cpu",reason="server_error"} = %v, want 1`, got)
	}
	if got := testutil.ToFloat64(m.QueryErrors.WithLabelValues("ns", "web", "cpu", "server_error")); got != 0 {
		t.Errorf(`optimizer_query_errors_total{signal="cpu"} = %v, want 0`, got)
	}
}

// recentFailingSource fails the CPU query over any window but the query
// window.
type recentFailingSource struct{ windowSource }

func (s *recentFailingSource) Query(ctx context.Context, tmpl string, t promsource.Target, now time.Time) (promsource.Result, error) {
	if tmpl == s.cpuQuery && t.Window != s.window {
		return promsource.Result{Query: tmpl}, &promsource.ServerError{StatusCode: 503, Message: "overloaded"}
	}
	return s.windowSource.Query(ctx, tmpl, t, now)
}

// A spec's query window and scrape interval set the recent window (two
// scrape intervals), rendered exactly in milliseconds when need be.
func TestRecentCPUWindowFollowsTheSpec(t *testing.T) {
	opt := optimizerFor("ns", "web")
	opt.Spec.Optimization = &optv1.Optimization{
		QueryWindow:    &optv1.Duration{Duration: 10 * time.Second},
		ScrapeInterval: &optv1.Duration{Duration: 2500 * time.Millisecond},
	}
	s, err := settingsFor(opt, DefaultEngineDefaults())
	if err != nil {
		t.Fatal(err)
	}
	if w := s.RecentCPUWindow; w != 5*time.Second {
		t.Errorf("recent window %v, want 5s", w)
	}
}
