package controllers

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// partsFleet is fleetSource behind QueryParts: it records each call's
// parts and answers each part as fleetSource would alone, or with fail[i]
// for the part at index i of a call.
type partsFleet struct {
	*fleetSource
	mu    sync.Mutex
	calls [][]promsource.Part
	fail  map[string]error // by template
	// single counts the one-query calls (Query), which should not come.
	single int
}

func (p *partsFleet) QueryParts(ctx context.Context, parts []promsource.Part, now time.Time) []promsource.PartResult {
	p.mu.Lock()
	p.calls = append(p.calls, parts)
	fail := p.fail
	p.mu.Unlock()
	out := make([]promsource.PartResult, len(parts))
	for i, part := range parts {
		if err := fail[part.Template]; err != nil {
			out[i].Err = err
			continue
		}
		out[i].Result, out[i].Err = p.fleetSource.Query(ctx, part.Template, part.Target, now)
	}
	return out
}

func (p *partsFleet) Query(ctx context.Context, tmpl string, t promsource.Target, now time.Time) (promsource.Result, error) {
	p.mu.Lock()
	p.single++
	p.mu.Unlock()
	return p.fleetSource.Query(ctx, tmpl, t, now)
}

// A cycle asks a source that combines queries for all its signals in one
// call, at one instant: the six default signals, each over its own window.
func TestCycleAsksForEverySignalAtOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	loop, fleet, key, s := learnedLoop(t, clk)
	src := &partsFleet{fleetSource: fleet}
	loop.Source = src
	clk.Step(time.Minute)
	loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
	if len(src.calls) != 1 || src.single != 0 {
		t.Fatalf("%d combined calls and %d single queries for one cycle, want 1 and 0", len(src.calls), src.single)
	}
	var windows []time.Duration
	var tmpls []string
	for _, p := range src.calls[0] {
		windows = append(windows, p.Target.Window)
		tmpls = append(tmpls, p.Template)
	}
	wantT := []string{s.CPUQuery, s.RequestQuery, s.LatencyQuery, s.NodeCPUQuery, s.CPUQuery, s.LatencyQuery, s.RequestQuery}
	w := s.Params.QueryWindow
	wantW := []time.Duration{w, w, w, w, s.RecentCPUWindow, s.RecentLatencyWindow, s.RecentRequestsWindow}
	if !slices.Equal(tmpls, wantT) || !slices.Equal(windows, wantW) {
		t.Errorf("parts over windows %v, want the seven signals over %v", windows, wantW)
	}
	out := loop.Book.Outcome(key)
	if !out.Signals.CPU || !out.Signals.Requests || !out.Signals.Latency || !out.Signals.RecentLatency || !out.Signals.RecentRequests {
		t.Errorf("signals %+v after the combined cycle", out.Signals)
	}
}

// A failed optional part leaves the cycle going without that signal, and
// is counted under its own signal and reason, as a query of its own was; a
// failed CPU part fails the cycle's query and counts nothing for the
// others.
func TestFailedPartStaysWithItsSignal(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	loop, fleet, key, s := learnedLoop(t, clk)
	bad := &promsource.ServerError{StatusCode: 400, Type: "bad_data", Message: "parse error"}
	src := &partsFleet{fleetSource: fleet, fail: map[string]error{s.RequestQuery: bad}}
	loop.Source = src
	errs := func(signal, reason string) float64 {
		return testutil.ToFloat64(loop.Metrics.QueryErrors.WithLabelValues("ns", "web", signal, reason))
	}
	clk.Step(time.Minute)
	loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
	out := loop.Book.Outcome(key)
	if out.QueryErr != nil || !out.Signals.CPU || out.Signals.Requests || !out.Signals.Latency {
		t.Errorf("a failed request part: query error %v, signals %+v; want the cycle on CPU and latency", out.QueryErr, out.Signals)
	}
	if errs("requests", "server_error") != 1 || errs("cpu", "server_error") != 0 {
		t.Errorf("errors: requests %v, cpu %v; want 1 and 0", errs("requests", "server_error"), errs("cpu", "server_error"))
	}

	src.fail = map[string]error{s.CPUQuery: bad, s.LatencyQuery: bad}
	clk.Step(time.Minute)
	loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
	if out := loop.Book.Outcome(key); out.QueryErr == nil {
		t.Error("a failed CPU part did not fail the cycle's query")
	}
	if errs("cpu", "server_error") != 1 || errs("latency", "server_error") != 0 {
		t.Errorf("errors: cpu %v, latency %v; want 1 and 0 (without CPU the others count nothing)", errs("cpu", "server_error"), errs("latency", "server_error"))
	}
}
