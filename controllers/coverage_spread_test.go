package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// clockedCoverage answers every coverage query without traffic and records,
// for the namespaces it watches, the loop's clock each time it was asked.
type clockedCoverage struct {
	clk   *testingclock.FakeClock
	watch map[string]bool
	mu    sync.Mutex
	at    map[string][]time.Time
}

func (c *clockedCoverage) QueryCoverage(_ context.Context, _ string, t promsource.Target, _ time.Time) (promsource.Coverage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.watch[t.Namespace] {
		c.at[t.Namespace] = append(c.at[t.Namespace], c.clk.Now())
	}
	return promsource.Coverage{}, nil
}

// TestCoverageRoundIsSpreadOverItsInterval: one round of the coverage loop
// measures the optimizers one after the other, evenly spread on the loop's
// clock from its start until the end it is given, not all at once: each
// measurement changes its optimizer's status (status.coverage's time), and
// optimizers measured in one go would all write their status in one cycle.
func TestCoverageRoundIsSpreadOverItsInterval(t *testing.T) {
	var namespaces []string
	for range 3 {
		ns := newNamespace(t)
		webService(t, ns, Ready("web-0", IP(3, 1), "node-a-"+ns))
		mustCreate(t, Optimizer(ns, "web", "web"))
		namespaces = append(namespaces, ns)
	}
	for _, ns := range namespaces {
		eventually(t, waitFor, "optimizer routed in "+ns, func() error {
			opt, err := getOpt(ns, "web")
			if err != nil {
				return err
			}
			if opt.Status.Host == "" || opt.Status.OwnedObjects.ServiceEntry == "" {
				return fmt.Errorf("host %q, ServiceEntry %q", opt.Status.Host, opt.Status.OwnedObjects.ServiceEntry)
			}
			return nil
		})
	}
	all := &optv1.IstioAdaptiveRequestOptimizerList{}
	if err := k8s.List(t.Context(), all); err != nil {
		t.Fatal(err)
	}
	n := len(all.Items)

	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(start)
	src := &clockedCoverage{clk: clk, watch: map[string]bool{}, at: map[string][]time.Time{}}
	for _, ns := range namespaces {
		src.watch[ns] = true
	}
	loop := &controllers.CoverageLoop{Client: k8s, Source: src, Book: controllers.NewCoverageBook(), Clock: clk, Metrics: testMetrics,
		Options: controllers.CoverageOptions{Threshold: 0.9, Interval: time.Minute, Query: promsource.DefaultCoverageQuery}}

	const span, step = time.Minute, 50 * time.Millisecond
	done := make(chan struct{})
	go func() {
		defer close(done)
		loop.MeasureAll(t.Context(), start.Add(span))
	}()
	// Time moves only while the round waits for it.
	deadline := time.Now().Add(waitFor)
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			if time.Now().After(deadline) {
				t.Fatalf("the round did not end; the clock is at %v", clk.Now().Sub(start))
			}
			if clk.HasWaiters() {
				clk.Step(step)
			} else {
				time.Sleep(time.Millisecond)
			}
		}
	}

	var at []time.Duration
	for _, ns := range namespaces {
		asked := src.at[ns]
		if len(asked) != 1 {
			t.Fatalf("the round measured the optimizer in %s %d times, want once", ns, len(asked))
		}
		at = append(at, asked[0].Sub(start))
	}
	slices.Sort(at)
	t.Logf("%d optimizers in the round; ours measured at %v", n, at)
	if at[len(at)-1] >= span {
		t.Errorf("measured at %v, past the round's end %v", at, span)
	}
	// Each optimizer has a slot of span/n; ours are measured at least half
	// a slot apart (the clock moves in steps of 50 ms).
	for i := 1; i < len(at); i++ {
		if gap := at[i] - at[i-1]; gap < span/time.Duration(n)/2 {
			t.Errorf("measured at %v: %v apart, want at least half a slot (%v of %v for %d optimizers)", at, gap, span/time.Duration(n), span, n)
		}
	}
}
