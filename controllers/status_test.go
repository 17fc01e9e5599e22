package controllers

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// TestStatusIsNotRewrittenEveryCycle: a weight cycle that changes nothing
// leaves the status as it is (no API write), and the fields that quote it
// are refreshed when the weights, the mode or dry run change, or after
// statusRefreshInterval.
func TestStatusIsNotRewrittenEveryCycle(t *testing.T) {
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	opt.Namespace, opt.Name = "shop", "web"
	// The first cycle at one of the optimizer's refresh instants, so the
	// next is statusRefreshInterval later.
	t0 := time.Unix(0, 0).Add(20000*statusRefreshInterval + statusRefreshPhase(opt.Namespace, opt.Name))
	w := map[string]uint32{"a": 1000, "b": 1200}
	outcome := func(at time.Duration, mode weights.Mode, changed, dryRun bool, gap float64) *Outcome {
		return &Outcome{Time: t0.Add(at), DryRun: dryRun, Result: weights.Result{
			Mode: mode, Changed: changed, Weights: w,
			Message: fmt.Sprintf("the largest gap to a target, %.1f%%, is inside the dead band", gap),
		}}
	}
	// cycle applies one reconcile after a weight cycle and says whether the
	// status changed (whether it would be written).
	cycle := func(out *Outcome) bool {
		before := opt.Status.DeepCopy()
		st := newStatus(opt)
		st.host, st.endpoints = "web.shop.adaptive", 2
		st.owned = optv1.OwnedObjects{Namespace: "shop", ServiceEntry: "web-adaptive", DestinationRule: "web-adaptive"}
		st.optimization(out, true)
		st.apply(opt, out.Time)
		return !equalStatus(before, &opt.Status)
	}
	steps := []struct {
		name  string
		out   *Outcome
		write bool
	}{
		{"first cycle", outcome(0, weights.ModeOptimizing, true, false, 9), true},
		{"steady cycle, new figures", outcome(30*time.Second, weights.ModeSteady, false, false, 1.2), true}, // mode changed
		{"steady again", outcome(60*time.Second, weights.ModeSteady, false, false, 1.7), false},
		{"steady again", outcome(90*time.Second, weights.ModeSteady, false, false, 0.4), false},
		{"low load", outcome(120*time.Second, weights.ModeLowLoad, false, false, 0), true},
		{"low load again", outcome(150*time.Second, weights.ModeLowLoad, false, false, 0), false},
		{"weights moved", outcome(180*time.Second, weights.ModeLowLoad, true, false, 0), true},
		{"dry run switched on", outcome(210*time.Second, weights.ModeLowLoad, false, true, 0), true},
		{"quiet", outcome(240*time.Second, weights.ModeLowLoad, false, true, 0), false},
		{"refresh after the interval", outcome(210*time.Second+statusRefreshInterval, weights.ModeLowLoad, false, true, 0), true},
	}
	for i, s := range steps {
		if got := cycle(s.out); got != s.write {
			t.Fatalf("step %d (%s): status changed = %v, want %v; status %+v", i, s.name, got, s.write, opt.Status)
		}
		if want := s.out.Time.Truncate(time.Second); s.write && !opt.Status.LastOptimizationTime.Time.Equal(want) {
			t.Errorf("step %d (%s): lastOptimizationTime = %v, want %v (to the second, as stored)", i, s.name, opt.Status.LastOptimizationTime, want)
		}
	}
}

// TestStatusListsAtMost100Weights: a dry run of 4096 pods lists 100 weights
// and their total count.
func TestStatusListsAtMost100Weights(t *testing.T) {
	w := map[string]uint32{}
	for i := range 4096 {
		w[fmt.Sprintf("pod-%04d", i)] = uint32(1000 + i)
	}
	for _, dryRun := range []bool{true, false} {
		opt := &optv1.IstioAdaptiveRequestOptimizer{}
		st := newStatus(opt)
		st.optimization(&Outcome{Time: time.Unix(1, 0), DryRun: dryRun, Result: weights.Result{Mode: weights.ModeOptimizing, Changed: true, Weights: w}}, true)
		st.apply(opt, time.Unix(1, 0))
		if len(opt.Status.Weights) != maxStatusWeights || opt.Status.WeightsTotal != 4096 {
			t.Errorf("dry run %v: %d weights listed, total %d; want %d and 4096", dryRun, len(opt.Status.Weights), opt.Status.WeightsTotal, maxStatusWeights)
		}
		if opt.Status.Weights[0].Pod != "pod-0000" || opt.Status.Weights[99].Pod != "pod-0099" {
			t.Errorf("dry run %v: listed %s..%s, want the first by name", dryRun, opt.Status.Weights[0].Pod, opt.Status.Weights[99].Pod)
		}
	}
}

// TestStatusRefreshSpread: optimizers whose status was written in the same
// cycle (they learned together) refresh it spread over the interval, cycle
// after cycle, and none goes longer than statusRefreshInterval without one.
func TestStatusRefreshSpread(t *testing.T) {
	const n = 200
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := make([]time.Time, n)
	for i := range prev {
		prev[i] = t0
	}
	busiest := 0
	// Two hours of cycles of 30 s, give or take 7.5 s of jitter (half
	// a 15 s scrape interval, as the policy's).
	now := t0
	for c := 1; c <= 240; c++ {
		now = now.Add(30*time.Second + time.Duration((c*7919)%15-7)*time.Second)
		written := 0
		for i := range n {
			st := &optv1.IstioAdaptiveRequestOptimizerStatus{
				LastOptimizationTime: &metav1.Time{Time: prev[i]}, WeightsMode: string(weights.ModeSteady),
				Conditions: []metav1.Condition{{Type: optv1.ConditionReady, Message: "weights steady: nothing to do"}},
			}
			out := &Outcome{Time: now, Result: weights.Result{Mode: weights.ModeSteady}}
			if !quietCycle(st, out, statusRefreshPhase("team", fmt.Sprintf("svc-%d", i))) {
				if gap := now.Sub(prev[i]); gap > statusRefreshInterval+45*time.Second {
					t.Fatalf("svc-%d refreshed after %v", i, gap)
				}
				prev[i] = now
				written++
			}
		}
		busiest = max(busiest, written)
	}
	// Spread evenly, a cycle of at most 37.5 s holds an eighth of them;
	// all in one cycle is what the phases remove.
	if busiest > n/5 {
		t.Errorf("%d of %d optimizers refreshed their status in one cycle, want at most %d", busiest, n, n/5)
	}
	for i := range n {
		if t0.Sub(prev[i]) > 0 || now.Sub(prev[i]) > statusRefreshInterval {
			t.Errorf("svc-%d last refreshed at %v, more than %v before the end", i, prev[i], statusRefreshInterval)
		}
	}
}

// TestStatusSurvivesItsOwnRoundTrip: the API server keeps status times to
// the second, so a reconcile that applies the same weight outcome and the
// same coverage record to the status as stored (read back through JSON)
// finds nothing to write; times kept to the nanosecond made every
// reconcile write the status again.
func TestStatusSurvivesItsOwnRoundTrip(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 7, 123456789, time.UTC)
	out := &Outcome{Time: at, Result: weights.Result{Mode: weights.ModeOptimizing, Changed: true,
		Weights: map[string]uint32{"a": 1000, "b": 1500}, Message: "moved"}}
	cov := &CoverageRecord{Time: at.Add(-time.Minute), Window: time.Minute, Host: "web.shop.adaptive", Err: fmt.Errorf("the backend said no")}
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	opt.Namespace, opt.Name, opt.Generation = "shop", "web", 1
	reconcile := func(now time.Time) {
		st := newStatus(opt)
		st.host, st.endpoints = "web.shop.adaptive", 2
		st.owned = optv1.OwnedObjects{Namespace: "shop", ServiceEntry: "web-adaptive", DestinationRule: "web-adaptive"}
		st.optimization(out, true)
		opt.Status.Coverage, _ = coverageStatus(cov, 0.9)
		st.apply(opt, now)
	}
	reconcile(at)
	for k := range 3 {
		// What the next reconcile reads: the status as the API server stored it.
		raw, err := json.Marshal(opt.Status)
		if err != nil {
			t.Fatal(err)
		}
		stored := optv1.IstioAdaptiveRequestOptimizerStatus{}
		if err := json.Unmarshal(raw, &stored); err != nil {
			t.Fatal(err)
		}
		opt.Status = stored
		reconcile(at.Add(time.Duration(k+1) * 1700 * time.Millisecond))
		if !equalStatus(&stored, &opt.Status) {
			t.Fatalf("reconcile %d after the write: the same outcome changed the stored status:\nstored %+v\nnow    %+v", k+1, stored, opt.Status)
		}
	}
}

// Ready's message says why the DestinationRule's load balancer is not the
// one asked for, in the words of the policy's reason.
func TestBalancerNoteNamesThePolicysReason(t *testing.T) {
	for _, c := range []struct {
		why  policy.Reason
		want string
	}{
		{policy.ReasonAlarm, "after a pod fell behind"},
		{policy.ReasonFallback, "fallen back to equal"},
		{policy.ReasonCPUAtLimit, "on CPU alone a pod reached its limit"},
		{policy.ReasonAtCapacity, "past the utilisation cap"},
		{policy.ReasonUnsettled, "until the weights rest on measured capacity"},
		{policy.ReasonLearning, "until the weights rest on measured capacity"},
	} {
		opt := &optv1.IstioAdaptiveRequestOptimizer{}
		st := newStatus(opt)
		st.balancer(optv1.LoadBalancerRoundRobin, networking.LoadBalancerSettings_LEAST_REQUEST, true, c.why)
		if !strings.Contains(st.balancerNote, c.want) || !strings.HasSuffix(st.balancerNote, "then ROUND_ROBIN") {
			t.Errorf("%s: note %q, want it to say %q and what follows", c.why, st.balancerNote, c.want)
		}
	}
	st := newStatus(&optv1.IstioAdaptiveRequestOptimizer{})
	st.balancer(optv1.LoadBalancerRoundRobin, networking.LoadBalancerSettings_ROUND_ROBIN, true, policy.ReasonLearned)
	if st.balancerNote != "" {
		t.Errorf("the balancer asked for is live, yet the note says %q", st.balancerNote)
	}
}

// A cycle that moves no weight still rewrites Ready's message when the
// policy switched the load balancer in it: the note saying why is not one
// of the cycle's figures, which a quiet cycle may leave as they were.
func TestQuietCycleStillSaysWhyTheBalancerChanged(t *testing.T) {
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	opt.Namespace, opt.Name = "shop", "web"
	// A second past one of the optimizer's refresh instants: the next is
	// statusRefreshInterval later (status times are whole seconds).
	t0 := time.Unix(0, 0).Add(20000*statusRefreshInterval + statusRefreshPhase(opt.Namespace, opt.Name) + time.Second)
	w := map[string]uint32{"a": 1000, "b": 1200}
	cycle := func(at time.Duration, changed bool, lb networking.LoadBalancerSettings_SimpleLB, why policy.Reason) string {
		out := &Outcome{Time: t0.Add(at), Result: weights.Result{Mode: weights.ModeSteady, Changed: changed, Weights: w, Message: fmt.Sprintf("figures of %v", at)}}
		st := newStatus(opt)
		st.host, st.endpoints = "web.shop.adaptive", 2
		st.owned = optv1.OwnedObjects{Namespace: "shop", ServiceEntry: "web-adaptive", DestinationRule: "web-adaptive"}
		st.optimization(out, true)
		st.balancer(optv1.LoadBalancerRoundRobin, lb, true, why)
		st.apply(opt, out.Time)
		return meta.FindStatusCondition(opt.Status.Conditions, optv1.ConditionReady).Message
	}
	cycle(0, true, networking.LoadBalancerSettings_ROUND_ROBIN, policy.ReasonLearned)
	if msg := cycle(30*time.Second, false, networking.LoadBalancerSettings_ROUND_ROBIN, policy.ReasonLearned); strings.Contains(msg, "figures of 30s") {
		t.Fatalf("a quiet cycle rewrote the figures: %q", msg)
	}
	msg := cycle(60*time.Second, false, networking.LoadBalancerSettings_LEAST_REQUEST, policy.ReasonCPUAtLimit)
	if !strings.Contains(msg, "on CPU alone a pod reached its limit") || opt.Status.LoadBalancer != "LEAST_REQUEST" {
		t.Fatalf("the balancer switched in a quiet cycle: loadBalancer %s, Ready %q", opt.Status.LoadBalancer, msg)
	}
	if msg := cycle(90*time.Second, false, networking.LoadBalancerSettings_LEAST_REQUEST, policy.ReasonCPUAtLimit); !strings.Contains(msg, "figures of 1m0s") {
		t.Errorf("the next quiet cycle rewrote the figures: %q", msg)
	}
	if msg := cycle(120*time.Second, false, networking.LoadBalancerSettings_ROUND_ROBIN, policy.ReasonLearned); strings.Contains(msg, "load balancer") {
		t.Errorf("back on the balancer asked for, Ready still has a note: %q", msg)
	}
}

// The status records the policy's reason for the load balancer, keeps it
// while the policy has not chosen (the first reconcile after a restart,
// before the pods are seen), and clears it without the engine; a restarted
// manager reads it back only for the balancer the DestinationRule carries.
func TestLoadBalancerReasonIsRecordedAndReadBack(t *testing.T) {
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	lr := &istionet.DestinationRule{}
	lr.Spec.TrafficPolicy = &networking.TrafficPolicy{LoadBalancer: &networking.LoadBalancerSettings{
		LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_LEAST_REQUEST}}}
	rr := lr.DeepCopy()
	rr.Spec.TrafficPolicy.LoadBalancer.LbPolicy = &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_ROUND_ROBIN}
	for i, c := range []struct {
		useEngine bool
		why       policy.Reason // "": the policy is not seeded
		want      string
	}{
		{true, policy.ReasonCPUAtLimit, "CPUAtLimit"},
		{true, "", "CPUAtLimit"},
		{false, "", ""},
	} {
		st := newStatus(opt)
		st.balancer(optv1.LoadBalancerRoundRobin, networking.LoadBalancerSettings_LEAST_REQUEST, c.useEngine, c.why)
		st.apply(opt, time.Unix(0, 0))
		if opt.Status.LoadBalancer != "LEAST_REQUEST" || opt.Status.LoadBalancerReason != c.want {
			t.Fatalf("step %d: loadBalancer %q, loadBalancerReason %q; want LEAST_REQUEST, %q", i, opt.Status.LoadBalancer, opt.Status.LoadBalancerReason, c.want)
		}
	}
	opt.Status.LoadBalancerReason = string(policy.ReasonCPUAtLimit)
	for _, c := range []struct {
		live *istionet.DestinationRule
		want policy.Reason
	}{{lr, policy.ReasonCPUAtLimit}, {rr, ""}, {nil, ""}} {
		if got := liveBalancerReason(opt, c.live); got != c.want {
			t.Errorf("status LEAST_REQUEST (CPUAtLimit), live %s: read back %q, want %q", liveBalancer(c.live), got, c.want)
		}
	}
}

// A cycle that changed no weight is quiet only when the engine's mode and
// dry run are those the status records (and Ready's note says): a change
// of either is written at once.
func TestQuietCycleNeedsTheRecordedModeAndDryRun(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	phase := statusRefreshPhase("shop", "web")
	for _, c := range []struct {
		mode   weights.Mode
		dryRun bool
		quiet  bool
	}{
		{weights.ModeSteady, false, true},
		{weights.ModeLowLoad, false, false},
		{weights.ModeSteady, true, false},
	} {
		st := &optv1.IstioAdaptiveRequestOptimizerStatus{
			LastOptimizationTime: &metav1.Time{Time: t0}, WeightsMode: string(weights.ModeSteady),
			Conditions: []metav1.Condition{{Type: optv1.ConditionReady, Message: "weights steady: nothing to do"}},
		}
		out := &Outcome{Time: t0.Add(time.Second), DryRun: c.dryRun, Result: weights.Result{Mode: c.mode}}
		if refreshDue(t0, out.Time, phase) {
			t.Fatal("the test needs a cycle with no refresh due")
		}
		if got := quietCycle(st, out, phase); got != c.quiet {
			t.Errorf("recorded Steady, cycle %s (dry run %v): quiet %v, want %v", c.mode, c.dryRun, got, c.quiet)
		}
	}
}

// A pod that the weight floor alone overloads makes the optimizer Degraded,
// naming the pod and the field that sets the floor; without it the
// optimizer is not Degraded.
func TestFloorOverloadIsDegraded(t *testing.T) {
	for _, overloaded := range []bool{true, false} {
		opt := &optv1.IstioAdaptiveRequestOptimizer{}
		opt.Namespace, opt.Name = "shop", "web"
		res := weights.Result{Mode: weights.ModeSteady, Weights: map[string]uint32{"big": 1234, "tiny": 101}}
		if overloaded {
			res.Reasons = []weights.Reason{{Code: weights.ReasonFloorOverload, Pods: []string{"tiny"}, Limit: 10}}
		}
		st := newStatus(opt)
		st.host, st.endpoints = "web.shop.adaptive", 2
		st.optimization(&Outcome{Time: time.Unix(1e9, 0), Result: res}, true)
		st.apply(opt, time.Unix(1e9, 0))
		d := meta.FindStatusCondition(opt.Status.Conditions, optv1.ConditionDegraded)
		degraded := d != nil && d.Status == metav1.ConditionTrue && d.Reason == "WeightFloorOverload"
		if degraded != overloaded || (overloaded && (!strings.Contains(d.Message, "(tiny)") || !strings.Contains(d.Message, "spec.optimization.max_weight_ratio"))) {
			t.Errorf("floor overload %v: Degraded %+v", overloaded, d)
		}
	}
}
