// Package replay holds the trace-replay test: one recorded signal trace
// (testdata/trace.json, recorded by the bench from testdata/scenario.yaml)
// replayed through the operator's weight loop (controllers.WeightLoop on a
// fake clock, with a metrics source answering from the trace) and through
// the bench's driver (test/bench/driver), which must decide the same cycles
// and looks at the same instants, write the same weights and set the same
// load balancer.
package replay

import (
	"context"
	"fmt"
	"maps"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	"github.com/liorfranko/istio-adaptive-least-request/test/bench/driver"
)

// step is one action as either path took it.
type step struct {
	At       time.Duration // since the opt-in
	Action   policy.Action
	Balancer weights.Balancer // after a cycle
	Written  map[string]uint32
}

func (s step) String() string {
	if s.Action == policy.Look {
		return fmt.Sprintf("%v look", s.At)
	}
	return fmt.Sprintf("%v cycle, %s, wrote %v", s.At, s.Balancer, s.Written)
}

func TestTraceReplaysTheSameThroughControllersAndBench(t *testing.T) {
	tr, err := driver.ReadTrace("testdata/trace.json")
	if err != nil {
		t.Fatal(err)
	}
	viaBench := replayBench(t, tr)
	viaOperator := replayControllers(t, tr)

	looks, early, switches := 0, 0, 0
	for i, s := range viaBench {
		if s.Action == policy.Look {
			looks++
		}
		if i > 0 && s.Action == policy.Cycle && viaBench[i-1].Action == policy.Look && viaBench[i-1].At == s.At {
			early++
		}
	}
	last := weights.BalancerLeastRequest
	for _, s := range viaBench {
		if s.Action == policy.Cycle && s.Balancer != last {
			switches, last = switches+1, s.Balancer
		}
	}
	// The trace must exercise what it is for: the opt-in's first cycle,
	// the switch to ROUND_ROBIN, looks, and an alarm's early cycle.
	if len(viaBench) == 0 || viaBench[0].Action != policy.Cycle || viaBench[0].At != 0 {
		t.Fatalf("the bench's first action: %v, want a cycle at the opt-in", viaBench[:min(1, len(viaBench))])
	}
	if looks == 0 || early == 0 || switches < 2 {
		t.Fatalf("the trace exercises %d looks, %d early cycles, %d switches; want each at least 1 (switches 2)", looks, early, switches)
	}
	for i := range max(len(viaBench), len(viaOperator)) {
		var b, o string
		if i < len(viaBench) {
			b = viaBench[i].String()
		}
		if i < len(viaOperator) {
			o = viaOperator[i].String()
		}
		if b != o {
			t.Fatalf("action %d differs:\n bench:       %s\n controllers: %s\n(%d bench actions, %d controllers actions)", i, b, o, len(viaBench), len(viaOperator))
		}
	}
	t.Logf("%d actions (%d looks, %d early cycles, %d load-balancer switches) alike", len(viaBench), looks, early, switches)
}

// replayBench runs the bench's driver on the trace, configured as the
// bench configures it.
func replayBench(t *testing.T, tr *driver.Trace) []step {
	p := weights.DefaultParams()
	p.QueryWindow, p.ScrapeInterval = tr.QueryWindow.Duration, tr.ScrapeInterval.Duration
	cfg := policy.Config{Cycle: tr.Cycle.Duration, Engine: p, Balancer: tr.Balancer, Jitter: policy.NewJitter(policy.JitterSeed(tr.Optimizer))}
	if tr.Balancer == weights.BalancerRoundRobin {
		cfg.LookInterval = policy.LookInterval(p.ScrapeInterval)
	}
	d := driver.New(cfg)
	optIn, end := time.Unix(0, tr.OptIn), time.Unix(0, tr.End)
	d.OptIn(optIn, tr.Pods, nil, "", "", weights.Snapshot{})
	var out []step
	now := optIn
	for {
		act, at := d.Next(now)
		if act == policy.Wait {
			t.Fatal("bench: the policy waits with pods known")
		}
		if at.After(end) {
			return out
		}
		now = at
		st := d.Run(now, act, driver.Replay{T: tr})
		s := step{At: now.Sub(optIn), Action: act}
		if act == policy.Cycle {
			s.Balancer, s.Written = st.Balancer, st.Written
		}
		out = append(out, s)
	}
}

// traceSource is the operator's metrics backend answering from the trace:
// a cycle's queries (its CPU query over the query window first) get the
// trace's cycle answer at that instant, a look's recent latency query the
// trace's look answer. It logs the actions it saw.
type traceSource struct {
	tr *driver.Trace
	s  controllers.Settings

	mu      sync.Mutex
	cycleAt time.Time
	actions []step
}

func (f *traceSource) Query(_ context.Context, tmpl string, t promsource.Target, at time.Time) (promsource.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var field func(weights.Signal) float64
	look := false
	switch {
	case tmpl == f.s.CPUQuery && t.Window == f.s.Params.QueryWindow:
		f.cycleAt = at
		f.actions = append(f.actions, step{At: at.Sub(time.Unix(0, f.tr.OptIn)), Action: policy.Cycle})
		field = func(s weights.Signal) float64 { return s.CPU }
	case tmpl == f.s.RequestQuery:
		field = func(s weights.Signal) float64 { return s.Requests }
	case tmpl == f.s.LatencyQuery && t.Window == f.s.Params.QueryWindow:
		field = func(s weights.Signal) float64 { return s.Latency }
	case tmpl == f.s.NodeCPUQuery:
		field = func(s weights.Signal) float64 { return s.NodeCPU }
	case tmpl == f.s.CPUQuery && t.Window == f.s.RecentCPUWindow:
		field = func(s weights.Signal) float64 { return s.RecentCPU }
	case tmpl == f.s.LatencyQuery && t.Window == f.s.RecentLatencyWindow:
		field = func(s weights.Signal) float64 { return s.RecentLatency }
		if !f.cycleAt.Equal(at) {
			look = true
			f.actions = append(f.actions, step{At: at.Sub(time.Unix(0, f.tr.OptIn)), Action: policy.Look})
		}
	default:
		return promsource.Result{}, fmt.Errorf("the trace has no answer for query %q over %v", tmpl, t.Window)
	}
	answer := f.tr.CycleAt(at)
	if look {
		answer = f.tr.LookAt(at)
	}
	v := map[string]float64{}
	for _, pod := range t.Pods {
		if x := field(answer[pod]); !math.IsNaN(x) {
			v[pod] = x
		}
	}
	return promsource.Result{Query: tmpl, Values: v}, nil
}

// replayControllers runs the operator's weight loop on a fake clock against
// the trace, with the mirror's part (opt-in, writing the weights the book
// says after each cycle, Applied) done as MirrorReconciler does it.
func replayControllers(t *testing.T, tr *driver.Trace) []step {
	ns, name, ok := strings.Cut(tr.Optimizer, "/")
	if !ok {
		t.Fatalf("optimizer %q is not namespace/name", tr.Optimizer)
	}
	key := types.NamespacedName{Namespace: ns, Name: name}
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	opt.Namespace, opt.Name, opt.Spec.ServiceName = ns, name, name
	if tr.Balancer == weights.BalancerLeastRequest {
		opt.Spec.LoadBalancer = optv1.LoadBalancerLeastRequest
	}
	defaults := controllers.DefaultEngineDefaults()
	defaults.Cycle = tr.Cycle.Duration
	defaults.Params.QueryWindow, defaults.Params.ScrapeInterval = tr.QueryWindow.Duration, tr.ScrapeInterval.Duration
	s, err := controllers.SettingsFor(opt, defaults)
	if err != nil {
		t.Fatal(err)
	}
	var eps []desired.Endpoint
	for i, p := range tr.Pods {
		eps = append(eps, desired.Endpoint{Pod: p.Name, Address: fmt.Sprintf("127.0.1.%d", i+1), Node: p.Node, Locality: p.Locality,
			HardwareClass: p.HardwareClass, Cores: p.Cores, CPURequest: p.CPURequest, NodeCores: p.NodeCores})
	}
	optIn, end := time.Unix(0, tr.OptIn), time.Unix(0, tr.End)
	clk := clocktesting.NewFakeClock(optIn)
	book := controllers.NewWeightBook()
	src := &traceSource{tr: tr, s: s}
	wake := make(chan event.GenericEvent, 100)
	loop := &controllers.WeightLoop{Source: src, Book: book, Clock: clk, Metrics: metrics.New(), Wake: wake}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = loop.Start(ctx) }()

	// The mirror's first reconcile: settings, restore (nothing to
	// restore at a first opt-in), the weights, the write, the poke.
	var live map[string]uint32
	var writes []step
	// woken: the reconcile answers the loop's wake after a cycle; only
	// those record the cycle's outcome (the worker may run the first
	// cycle while the mirror's first reconcile is still applying).
	reconcile := func(woken bool) {
		now := clk.Now()
		w := book.WeightsFor(key, s.Params, now, eps, nil, true)
		applied := append([]desired.Endpoint(nil), eps...)
		for i := range applied {
			applied[i].Weight = w[applied[i].Pod]
		}
		st := step{At: now.Sub(optIn), Action: policy.Cycle}
		if !maps.Equal(w, live) {
			live, st.Written = w, w
		}
		book.Applied(key, s.Params, now, applied)
		if out := book.Outcome(key); woken && out != nil && out.Time.Equal(now) {
			st.Balancer = out.Balancer
			writes = append(writes, st)
		}
	}
	loop.Ensure(opt, s)
	book.Restore(key, s.Params, weights.Snapshot{}, "", "")
	reconcile(false)
	loop.Poke(key)

	for {
		deadline := time.Now().Add(20 * time.Second)
		for !clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatalf("controllers: the weight loop did not come back to wait at %v after the opt-in", clk.Now().Sub(optIn))
			}
			time.Sleep(time.Millisecond)
		}
		for len(wake) > 0 {
			<-wake
			reconcile(true)
		}
		act, at := book.Next(key, clk.Now())
		if act == policy.Wait {
			t.Fatal("controllers: the policy waits with endpoints applied")
		}
		if at.After(end) {
			break
		}
		clk.SetTime(at)
	}
	cancel()
	// Merge the actions the source saw with what the mirror wrote.
	src.mu.Lock()
	defer src.mu.Unlock()
	var out []step
	k := 0
	for _, a := range src.actions {
		if a.Action == policy.Cycle {
			if k >= len(writes) || writes[k].At != a.At {
				t.Fatalf("controllers: the cycle at %v reached no reconcile", a.At)
			}
			a = writes[k]
			k++
		}
		out = append(out, a)
	}
	return out
}
