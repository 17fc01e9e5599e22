// Package replay holds the trace-replay test: one recorded signal trace
// (testdata/trace.json, recorded by the bench from testdata/scenario.yaml)
// replayed through the operator's weight loop (controllers.WeightLoop on a
// fake clock, with a metrics source answering from the trace) and through
// the bench's driver (test/bench/driver), which must decide the same cycles
// and looks at the same instants, write the same weights and set the same
// load balancer. The trace's manager restarts: the operator's path (a new
// WeightBook and WeightLoop, seeded through the mirror's Restore from the
// live weights, the learned state as the mirror wrote it, the
// DestinationRule's balancer and the status's reason) must take the same
// decisions as the bench's (driver.Restart).
package replay

import (
	"context"
	"encoding/json"
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
	At     time.Duration // since the opt-in
	Action policy.Action
	// Restart: a new manager's first reconcile (Action is then unset).
	Restart  bool
	Balancer weights.Balancer // after a cycle or a restart
	Written  map[string]uint32
}

func (s step) String() string {
	switch {
	case s.Restart:
		return fmt.Sprintf("%v restart, %s, wrote %v", s.At, s.Balancer, s.Written)
	case s.Action == policy.Look:
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

	looks, early, switches, restarts, afterRestart := 0, 0, 0, 0, 0
	for i, s := range viaBench {
		if s.Action == policy.Look {
			looks++
		}
		if i > 0 && s.Action == policy.Cycle && viaBench[i-1].Action == policy.Look && viaBench[i-1].At == s.At {
			early++
		}
		if s.Restart {
			restarts++
		} else if restarts > 0 && s.Action == policy.Cycle {
			afterRestart++
		}
	}
	last := weights.BalancerLeastRequest
	for _, s := range viaBench {
		if (s.Action == policy.Cycle || s.Restart) && s.Balancer != last {
			switches, last = switches+1, s.Balancer
		}
	}
	// The trace must exercise what it is for: the opt-in's first cycle,
	// the switch to ROUND_ROBIN, looks, an alarm's early cycle, and a
	// restart after which cycles run.
	if len(viaBench) == 0 || viaBench[0].Action != policy.Cycle || viaBench[0].At != 0 {
		t.Fatalf("the bench's first action: %v, want a cycle at the opt-in", viaBench[:min(1, len(viaBench))])
	}
	if looks == 0 || early == 0 || switches < 2 || restarts != len(tr.Restarts) || restarts == 0 || afterRestart == 0 {
		t.Fatalf("the trace exercises %d looks, %d early cycles, %d switches, %d of its %d restarts and %d cycles after one; want each at least 1 (switches 2, every restart)",
			looks, early, switches, restarts, len(tr.Restarts), afterRestart)
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
	t.Logf("%d actions (%d looks, %d early cycles, %d load-balancer switches, %d restarts) alike", len(viaBench), looks, early, switches, restarts)
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
	restarts := tr.Restarts
	for {
		act, at := d.Next(now)
		if act == policy.Wait {
			t.Fatal("bench: the policy waits with pods known")
		}
		if len(restarts) > 0 && !at.Before(time.Unix(0, restarts[0].Stop)) {
			// The manager stops before the action; a new one takes over,
			// drawing its jitter afresh as the bench's does.
			now = time.Unix(0, restarts[0].Resume)
			restarts = restarts[1:]
			if now.After(end) {
				return out
			}
			cfg.Jitter = policy.NewJitter(policy.JitterSeed(tr.Optimizer))
			w := d.Restart(now, cfg, tr.Pods)
			lb, _ := d.P.Balancer()
			out = append(out, step{At: now.Sub(optIn), Restart: true, Balancer: lb, Written: w})
			continue
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
	src := &traceSource{tr: tr, s: s}

	// What the cluster holds, which outlives a manager: the ServiceEntry's
	// weights, the learned state on the optimizer (as JSON, as the mirror
	// writes it), the DestinationRule's load balancer and the reason the
	// status gives for it.
	var live map[string]uint32
	var annotation []byte
	var liveBalancer weights.Balancer
	var liveWhy policy.Reason

	// One manager: its book, its weight loop, and the mirror's part of it.
	var (
		book   *controllers.WeightBook
		wake   chan event.GenericEvent
		cancel context.CancelFunc
		done   chan struct{}
	)
	var writes []step
	// reconcile is the mirror's reconcile: the weights (seeded from what
	// the cluster holds at a manager's first), the write, Applied, the
	// learned state persisted when the policy says so. woken: it answers
	// the loop's wake after a cycle; only those record the cycle's
	// outcome (the worker may run the first cycle while the mirror's
	// first reconcile is still applying).
	reconcile := func(woken bool) step {
		now := clk.Now()
		byAddress := map[string]uint32{}
		for _, ep := range eps {
			if w, ok := live[ep.Pod]; ok {
				byAddress[ep.Address] = w
			}
		}
		w := book.WeightsFor(key, s.Params, now, eps, controllers.LiveEndpoints{Weights: byAddress}, true)
		applied := append([]desired.Endpoint(nil), eps...)
		for i := range applied {
			applied[i].Weight = w[applied[i].Pod]
		}
		st := step{At: now.Sub(optIn), Action: policy.Cycle}
		if !maps.Equal(w, live) {
			live, st.Written = w, w
		}
		book.Applied(key, s.Params, now, applied)
		if snap, ok := book.SnapshotToPersist(key); ok {
			raw, err := json.Marshal(snap)
			if err != nil {
				t.Fatalf("controllers: encode the learned state: %v", err)
			}
			annotation = raw
			book.Persisted(key, snap)
		}
		if lb, why, ok := book.Balancer(key); ok {
			liveBalancer, liveWhy, st.Balancer = lb, why, lb
		}
		if out := book.Outcome(key); woken && out != nil && out.Time.Equal(now) {
			st.Balancer = out.Balancer
			writes = append(writes, st)
		}
		return st
	}
	// start is a manager's start at the clock's instant: a new book and
	// weight loop, the optimizer's settings, what an earlier manager left
	// restored, the first reconcile, the poke.
	start := func() step {
		book = controllers.NewWeightBook()
		wake = make(chan event.GenericEvent, 100)
		loop := &controllers.WeightLoop{Source: src, Book: book, Clock: clk, Metrics: metrics.New(), Wake: wake}
		var ctx context.Context
		ctx, cancel = context.WithCancel(context.Background())
		done = make(chan struct{})
		go func() { _ = loop.Start(ctx); close(done) }()
		loop.Ensure(opt, s)
		var snap weights.Snapshot
		if annotation != nil {
			if err := json.Unmarshal(annotation, &snap); err != nil || !snap.Valid() {
				t.Fatalf("controllers: the learned state written does not read back: %v", err)
			}
		}
		book.Restore(key, s.Params, snap, liveBalancer, liveWhy)
		st := reconcile(false)
		loop.Poke(key)
		return st
	}
	// stop ends the manager and waits until its worker has let go of the
	// clock.
	stop := func() {
		cancel()
		<-done
		deadline := time.Now().Add(20 * time.Second)
		for clk.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatalf("controllers: a stopped weight loop still waits on the clock at %v", clk.Now().Sub(optIn))
			}
			time.Sleep(time.Millisecond)
		}
	}
	start()
	defer func() { cancel() }()

	var restartSteps []step
	restarts := tr.Restarts
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
		if len(restarts) > 0 && !at.Before(time.Unix(0, restarts[0].Stop)) {
			stop()
			resume := time.Unix(0, restarts[0].Resume)
			restarts = restarts[1:]
			if resume.After(end) {
				break
			}
			clk.SetTime(resume)
			st := start()
			restartSteps = append(restartSteps, step{At: st.At, Restart: true, Balancer: st.Balancer, Written: st.Written})
			continue
		}
		if at.After(end) {
			break
		}
		clk.SetTime(at)
	}
	cancel()
	// Merge the actions the source saw with what the mirror wrote and the
	// restarts, in time order (a restart's reconcile comes before the
	// actions at its instant).
	src.mu.Lock()
	defer src.mu.Unlock()
	var out []step
	k := 0
	for _, a := range src.actions {
		for len(restartSteps) > 0 && restartSteps[0].At <= a.At {
			out, restartSteps = append(out, restartSteps[0]), restartSteps[1:]
		}
		if a.Action == policy.Cycle {
			if k >= len(writes) || writes[k].At != a.At {
				t.Fatalf("controllers: the cycle at %v reached no reconcile", a.At)
			}
			a = writes[k]
			k++
		}
		out = append(out, a)
	}
	return append(out, restartSteps...)
}
