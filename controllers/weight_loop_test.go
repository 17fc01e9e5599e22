package controllers

import (
	"context"
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

// stallingSource never answers for Service "slow" (a backend that hangs
// until the query times out) and answers at once for the others.
type stallingSource struct {
	queried chan string
}

func (s *stallingSource) Query(ctx context.Context, _ string, t promsource.Target, _ time.Time) (promsource.Result, error) {
	s.queried <- t.Service
	if t.Service == "slow" {
		<-ctx.Done()
		return promsource.Result{}, ctx.Err()
	}
	v := map[string]float64{}
	for i, p := range t.Pods {
		v[p] = 0.2 * float64(i+1)
	}
	return promsource.Result{Values: v}, nil
}

func optimizerFor(ns, name string) *optv1.IstioAdaptiveRequestOptimizer {
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	o.Namespace, o.Name, o.Spec.ServiceName = ns, name, name
	return o
}

// TestWeightLoopSlowBackendDoesNotStallOthers runs the loop on an injected
// clock: the optimizer whose backend hangs keeps hanging while the other
// completes cycle after cycle.
func TestWeightLoopSlowBackendDoesNotStallOthers(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	book := NewWeightBook()
	defaults := DefaultEngineDefaults()
	for _, name := range []string{"slow", "fast"} {
		key := types.NamespacedName{Namespace: "ns", Name: name}
		book.Applied(key, defaults.Params, clk.Now(), []desired.Endpoint{
			{Pod: name + "-0", Address: "198.18.0.1", Weight: 1000},
			{Pod: name + "-1", Address: "198.18.0.2", Weight: 1000},
		})
	}
	src := &stallingSource{queried: make(chan string, 100)}
	wake := make(chan event.GenericEvent, 100)
	loop := &WeightLoop{Source: src, Book: book, Clock: clk, Metrics: metrics.New(), Wake: wake}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = loop.Start(ctx) }()
	settings, err := settingsFor(optimizerFor("ns", "slow"), defaults)
	if err != nil {
		t.Fatal(err)
	}
	// The slow optimizer first, until its query hangs, so that afterwards
	// the only timer on the fake clock is the fast optimizer's. The first
	// cycle of each runs at once: their endpoints are known.
	loop.Ensure(optimizerFor("ns", "slow"), settings)
	select {
	case got := <-src.queried:
		if got != "slow" {
			t.Fatalf("queried %s, want slow", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the slow optimizer never queried")
	}
	loop.Ensure(optimizerFor("ns", "fast"), settings)

	fastCycles := 0
	for step := 0; step < 5; step++ {
		if step > 0 {
			waitFor(t, func() bool { return clk.HasWaiters() })
			// Past the cycle plus the largest jitter.
			clk.Step(defaults.Cycle * 12 / 10)
		}
		deadline := time.After(5 * time.Second)
	cycle:
		for {
			select {
			case ev := <-wake:
				if ev.Object.GetName() != "fast" {
					t.Fatalf("woke the mirror for %s, whose backend never answered", ev.Object.GetName())
				}
				fastCycles++
				break cycle
			case <-deadline:
				t.Fatalf("cycle %d of the fast optimizer did not complete while the slow backend hangs", step)
			}
		}
	}
	if out := book.Outcome(types.NamespacedName{Namespace: "ns", Name: "fast"}); out == nil || out.Result.Weights["fast-0"] == 0 {
		t.Errorf("no outcome recorded for the fast optimizer: %+v", out)
	}
	if out := book.Outcome(types.NamespacedName{Namespace: "ns", Name: "slow"}); out != nil {
		t.Errorf("the slow optimizer recorded an outcome without an answer: %+v", out)
	}
	if fastCycles != 5 {
		t.Errorf("fast cycles = %d, want 5", fastCycles)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSettingsForMergesSpecOverDefaults(t *testing.T) {
	d := DefaultEngineDefaults()
	pct := func(v int64) *int64 { return &v }
	opt := optimizerFor("ns", "web")
	opt.Spec.DryRun = true
	opt.Spec.Optimization = &optv1.Optimization{DeadBandPercent: pct(10), MaxWeightRatio: pct(4), RequestQuery: "-", MinCPUMillicores: pct(100)}
	s, err := settingsFor(opt, d)
	if err != nil {
		t.Fatal(err)
	}
	if s.Params.DeadBand != 0.10 || s.Params.MaxRatio != 4 || s.Params.MinCPU != 0.1 || s.RequestQuery != "" || !s.DryRun {
		t.Errorf("settings = %+v", s)
	}
	if s.Cycle != d.Cycle || s.Params.QueryWindow != d.Params.QueryWindow || s.CPUQuery != d.CPUQuery {
		t.Errorf("unset fields did not keep the defaults: %+v", s)
	}

	// A template that does not parse is reported and the defaults are used,
	// so a bad edit never stops optimization.
	opt.Spec.Optimization = &optv1.Optimization{CPUQuery: "sum({{.Nope"}
	s, err = settingsFor(opt, d)
	if err == nil {
		t.Fatal("a broken cpu_query was accepted")
	}
	if s.CPUQuery != d.CPUQuery {
		t.Errorf("fallback settings use %q", s.CPUQuery)
	}
}

// emptySource answers every query with no series for the pods.
type emptySource struct{}

func (emptySource) Query(_ context.Context, _ string, _ promsource.Target, _ time.Time) (promsource.Result, error) {
	return promsource.Result{Query: "q"}, &promsource.EmptyResultError{Query: "q"}
}

// A backend that answers with nothing for the pods is a query or scrape
// problem (NoData, "check the queries"), not an outage (Holding).
func TestEmptyAnswerIsNoDataNotAnOutage(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	book := NewWeightBook()
	d := DefaultEngineDefaults()
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	book.Applied(key, d.Params, clk.Now(), []desired.Endpoint{{Pod: "web-0", Weight: 1000}, {Pod: "web-1", Weight: 1000}})
	wake := make(chan event.GenericEvent, 1)
	loop := &WeightLoop{Source: emptySource{}, Book: book, Clock: clk, Metrics: metrics.New(), Wake: wake}
	s, _ := settingsFor(optimizerFor("ns", "web"), d)
	loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
	out := book.Outcome(key)
	if out == nil || out.Result.Mode != weights.ModeNoData {
		t.Fatalf("outcome %+v, want mode NoData", out)
	}
}

// TestCycleEndedByDeletionCountsNoError: a cycle whose query is cut short
// because the optimizer was deleted (its worker's context cancelled) must
// not count an error: the series would outlive ForgetOptimizer, which the
// deletion already ran.
func TestCycleEndedByDeletionCountsNoError(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	book := NewWeightBook()
	defaults := DefaultEngineDefaults()
	key := types.NamespacedName{Namespace: "ns", Name: "slow"}
	book.Applied(key, defaults.Params, clk.Now(), []desired.Endpoint{{Pod: "slow-0", Address: "198.18.0.1", Weight: 1000}})
	m := metrics.New()
	loop := &WeightLoop{Source: &stallingSource{queried: make(chan string, 1)}, Book: book, Clock: clk, Metrics: m,
		Wake: make(chan event.GenericEvent, 1)}
	settings, err := settingsFor(optimizerFor("ns", "slow"), defaults)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // deleted while the query was in flight
	loop.cycle(ctx, logr.Discard(), key, target{namespace: "ns", service: "slow"}, settings)
	if n := testutil.CollectAndCount(m.ReconcilerErrors); n != 0 {
		t.Errorf("%d reconciler_errors series after a cycle ended by deletion, want 0", n)
	}
	if n := testutil.CollectAndCount(m.QueryErrors); n != 0 {
		t.Errorf("%d query error series after a cycle ended by deletion, want 0", n)
	}
}
