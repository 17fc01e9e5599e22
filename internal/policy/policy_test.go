package policy

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

var t0 = time.Unix(1_700_000_000, 0)

// fleet is four equal pods of 2 cores.
func fleet() []weights.Pod {
	var out []weights.Pod
	for _, n := range []string{"web-0", "web-1", "web-2", "web-3"} {
		out = append(out, weights.Pod{Name: n, Cores: 2})
	}
	return out
}

// steady is what the queries return for the fleet at half load: 1 core, 100
// requests/s at 20 ms each; recent overrides a pod's recent latency.
func steady(recent map[string]float64) weights.Observation {
	obs := weights.Observation{Signals: map[string]weights.Signal{}}
	for _, p := range fleet() {
		r := 0.02
		if v, ok := recent[p.Name]; ok {
			r = v
		}
		obs.Signals[p.Name] = weights.Signal{CPU: 1, Requests: 100, Latency: 0.02, NodeCPU: math.NaN(), RecentCPU: 1, RecentLatency: r}
	}
	return obs
}

func config() Config {
	return Config{Cycle: 30 * time.Second, LookInterval: LookInterval(15 * time.Second), Balancer: weights.BalancerRoundRobin,
		Engine: weights.DefaultParams(), Jitter: NewJitter(7)}
}

// runUntil performs every action due up to end, answering cycles with obs
// (recent latencies of looks from the same), applying the weights as the
// mirror does, and returns the actions' instants and the decisions.
func runUntil(t *testing.T, p *Policy, end time.Time, obs func(time.Time) weights.Observation) (acts []Action, at []time.Time, ds []Decision) {
	t.Helper()
	for i := 0; i < 10000; i++ {
		act, when := p.Next(end)
		if act == Wait || when.After(end) {
			return
		}
		switch act {
		case Look:
			p.Look(when, obs(when))
		case Cycle:
			d := p.Cycle(when, obs(when), fleet())
			ds = append(ds, d)
			p.Applied(when, p.Weights(when, fleet()))
		}
		acts, at = append(acts, act), append(at, when)
	}
	t.Fatal("no end of actions")
	return
}

func TestNothingIsDueBeforeTheOptIn(t *testing.T) {
	p := New(config())
	if act, _ := p.Next(t0); act != Wait {
		t.Fatalf("before the opt-in: %v, want Wait", act)
	}
	if p.OptIn(t0, nil, nil, "", "", weights.Snapshot{}) {
		t.Fatal("OptIn without pods succeeded")
	}
	if act, _ := p.Next(t0); act != Wait {
		t.Fatalf("after an opt-in without pods: %v, want Wait", act)
	}
}

// The first cycle runs at the opt-in, not a period later; the regular
// cycles follow one period plus at most a tenth of it apart.
func TestFirstCycleAtOptInThenPeriodWithJitter(t *testing.T) {
	p := New(config())
	if !p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{}) {
		t.Fatal("OptIn failed")
	}
	if act, at := p.Next(t0); act != Cycle || !at.Equal(t0) {
		t.Fatalf("after the opt-in: %v at %v, want Cycle at once", act, at.Sub(t0))
	}
	acts, at, _ := runUntil(t, p, t0.Add(10*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	cycles := cycleTimes(acts, at)
	if len(cycles) < 15 || !cycles[0].Equal(t0) {
		t.Fatalf("cycles at %v", cycles)
	}
	jittered := false
	for i := 1; i < len(cycles); i++ {
		gap := cycles[i].Sub(cycles[i-1])
		// Give or take half a scrape interval (15 s).
		if gap < 22500*time.Millisecond || gap >= 37500*time.Millisecond {
			t.Errorf("cycle %d came %v after the one before, want 22.5s to 37.5s", i, gap)
		}
		jittered = jittered || gap != 30*time.Second
	}
	if !jittered {
		t.Error("no cycle was jittered")
	}
}

// At a first opt-in the pods had equal traffic under LEAST_REQUEST: the
// engine is seeded with equal weights over the whole query window (not an
// empty history), and told LEAST_REQUEST was live.
func TestOptInSeedsEqualWeightsUnderLeastRequest(t *testing.T) {
	p := New(config())
	p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
	w := p.Weights(t0, fleet())
	if len(w) != 4 {
		t.Fatalf("weights %v, want four", w)
	}
	for n, v := range w {
		if v != w["web-0"] {
			t.Errorf("%s has %d, want the same as web-0's %d", n, v, w["web-0"])
		}
	}
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonLearning {
		t.Errorf("balancer %s (%s), want LEAST_REQUEST (Learning)", lb, why)
	}
	if got := p.liveOver(t0.Add(30 * time.Second)); got != weights.BalancerLeastRequest {
		t.Errorf("live over the first window: %s, want LEAST_REQUEST", got)
	}
}

// LEAST_REQUEST until the results have been Learned for a query window,
// then the user's ROUND_ROBIN, one switch; steady signals switch nothing
// more.
func TestLeastRequestUntilLearnedThenRoundRobinOnce(t *testing.T) {
	p := New(config())
	p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
	_, at, ds := runUntil(t, p, t0.Add(20*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	learned := -1
	var since time.Time
	for i, d := range ds {
		if d.Result.Learned && since.IsZero() {
			since = at[i]
		}
		if d.Result.Learned && learned < 0 && at[i].Sub(since) >= time.Minute {
			learned = i
		}
		want := weights.BalancerLeastRequest
		if learned >= 0 {
			want = weights.BalancerRoundRobin
		}
		if d.Balancer != want {
			t.Errorf("cycle %d (at %v, learned %v): %s, want %s", i, at[i].Sub(t0), d.Result.Learned, d.Balancer, want)
		}
	}
	if learned < 0 {
		t.Fatal("never Learned on steady signals")
	}
	if p.Switches() != 1 {
		t.Errorf("%d switches, want 1", p.Switches())
	}
	if lb, why := p.Balancer(); lb != weights.BalancerRoundRobin || why != ReasonLearned {
		t.Errorf("ends on %s (%s), want ROUND_ROBIN (Learned)", lb, why)
	}
}

// learned returns a policy whose engine has learned the steady fleet, at the
// returned instant.
func learned(t *testing.T, cfg Config) (*Policy, time.Time) {
	t.Helper()
	p := New(cfg)
	p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
	end := t0.Add(10 * time.Minute)
	runUntil(t, p, end, func(time.Time) weights.Observation { return steady(nil) })
	if lb, _ := p.Balancer(); lb != weights.BalancerRoundRobin {
		t.Fatalf("not on ROUND_ROBIN after 10 steady minutes: %s", lb)
	}
	return p, end
}

// Looks run every look interval between cycles while ROUND_ROBIN is live,
// up to the regular cycle, which they do not move.
func TestLooksBetweenCyclesRunUpToTheCycle(t *testing.T) {
	cfg := config()
	cfg.Cycle = time.Minute // room for several looks at one a scrape interval
	p, now := learned(t, cfg)
	interval := cfg.LookInterval
	next := p.nextCycle
	var looks []time.Time
	for {
		act, at := p.Next(now)
		if act != Look {
			if act != Cycle {
				t.Fatalf("%v between looks", act)
			}
			break
		}
		p.Look(at, steady(nil))
		looks = append(looks, at)
		now = at
	}
	if len(looks) < 2 {
		t.Fatalf("looks at %v", looks)
	}
	for i := 1; i < len(looks); i++ {
		if looks[i].Sub(looks[i-1]) != interval {
			t.Errorf("looks %v apart, want %v", looks[i].Sub(looks[i-1]), interval)
		}
	}
	_, cycle := p.Next(now)
	if !cycle.Equal(next) {
		t.Errorf("the looks moved the cycle from %v to %v", next, cycle)
	}
	if last := looks[len(looks)-1]; cycle.Sub(last) > interval || !cycle.After(last) {
		t.Errorf("last look %v before the cycle, want within one interval", cycle.Sub(last))
	}
}

// No looks under LEAST_REQUEST (the user's choice), nor with looks off.
func TestNoLooksUnderLeastRequestOrWhenOff(t *testing.T) {
	for name, cfg := range map[string]Config{
		"user LEAST_REQUEST": func() Config { c := config(); c.Balancer = weights.BalancerLeastRequest; return c }(),
		"looks off":          func() Config { c := config(); c.LookInterval = 0; return c }(),
	} {
		t.Run(name, func(t *testing.T) {
			p := New(cfg)
			p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
			acts, _, ds := runUntil(t, p, t0.Add(10*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
			for _, a := range acts {
				if a == Look {
					t.Fatal("a look ran")
				}
			}
			if cfg.Balancer == weights.BalancerLeastRequest {
				for _, d := range ds {
					if d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonUserChoice {
						t.Fatalf("%s (%s), want LEAST_REQUEST (UserChoice)", d.Balancer, d.Why)
					}
				}
				if p.Switches() != 0 {
					t.Errorf("%d switches, want 0", p.Switches())
				}
			}
		})
	}
}

// An alarm at a look makes the cycle due at once; that cycle is early, puts
// the Service on LEAST_REQUEST for a spell, and the next regular cycle comes
// a full period after it (never on the same scrapes). The spell ends once
// the results have been Learned for a query window.
func TestAlarmRunsAnEarlyCycleAndASpell(t *testing.T) {
	p, now := learned(t, config())
	act, at := p.Next(now)
	if act != Look {
		t.Fatalf("%v, want a look", act)
	}
	slow := steady(map[string]float64{"web-2": 2})
	a, ring := p.Look(at, slow)
	if !ring || a.Pod != "web-2" {
		t.Fatalf("look: %+v %v, want an alarm for web-2", a, ring)
	}
	if act, due := p.Next(at); act != Cycle || !due.Equal(at) {
		t.Fatalf("after the alarm: %v at %v, want Cycle at once", act, due.Sub(at))
	}
	d := p.Cycle(at, slow, fleet())
	p.Applied(at, p.Weights(at, fleet()))
	if !d.Early || d.Result.Learned {
		t.Fatalf("the alarm's cycle: early %v learned %v, want early, not Learned", d.Early, d.Result.Learned)
	}
	if d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonAlarm || !d.Switched {
		t.Errorf("the alarm's cycle: %s (%s) switched %v, want a switch to LEAST_REQUEST (Alarm)", d.Balancer, d.Why, d.Switched)
	}
	if _, due := p.Next(at); due.Sub(at) < 22500*time.Millisecond {
		t.Errorf("the next cycle %v after the early one, want a period, give or take half a scrape interval", due.Sub(at))
	}
	if got := p.liveOver(at.Add(time.Second)); got != weights.BalancerLeastRequest {
		t.Errorf("engine told %s, want LEAST_REQUEST", got)
	}
	// The pod recovers: Learned again, back on ROUND_ROBIN a window later.
	_, when, ds := runUntil(t, p, at.Add(10*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	firstLearned, back := -1, -1
	for i, d := range ds {
		if d.Result.Learned && firstLearned < 0 {
			firstLearned = i
		}
		if d.Balancer == weights.BalancerRoundRobin && back < 0 {
			back = i
		}
	}
	if firstLearned < 0 || back < 0 {
		t.Fatalf("never back: learned at cycle %d, ROUND_ROBIN at %d", firstLearned, back)
	}
	_ = when
	if back == firstLearned {
		t.Errorf("back on ROUND_ROBIN at the first Learned result, want a query window later")
	}
	if p.Switches() != 3 {
		t.Errorf("%d switches, want 3 (learned, spell, end of spell)", p.Switches())
	}
}

// Once learned, a result that is not Learned (here: a new pod without
// data) starts a spell of LEAST_REQUEST; one Learned result does not end
// it, a query window of them does.
func TestNotLearnedStartsASpellThatEndsAfterAWindow(t *testing.T) {
	p, now := learned(t, config())
	before := p.Switches()
	act, at := p.Next(now)
	for act == Look {
		p.Look(at, steady(nil))
		act, at = p.Next(at)
	}
	// A new pod without data joins the set.
	grown := append(fleet(), weights.Pod{Name: "web-4", Cores: 2, ReadySince: at})
	d := p.Cycle(at, steady(nil), grown)
	if d.Result.Learned {
		t.Fatalf("the engine calls a set with a pod it never measured Learned (%s); this test needs another not-Learned result", d.Result.Message)
	}
	if d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonUnsettled || p.Switches() != before+1 {
		t.Fatalf("not Learned: %s (%s), %d switches (was %d); want a spell of LEAST_REQUEST", d.Balancer, d.Why, p.Switches(), before)
	}
	at = at.Add(30 * time.Second)
	d = p.Cycle(at, steady(nil), fleet())
	if d.Result.Learned && d.Balancer != weights.BalancerLeastRequest {
		t.Errorf("one Learned result ended the spell")
	}
	for i := 0; i < 4; i++ {
		at = at.Add(30 * time.Second)
		d = p.Cycle(at, steady(nil), fleet())
	}
	if d.Balancer != weights.BalancerRoundRobin {
		t.Errorf("after two minutes of Learned results: %s (%s), want ROUND_ROBIN", d.Balancer, d.Why)
	}
}

// cpuOnly is steady without request rates, hot's pod at its CPU limit.
func cpuOnly(hot string) weights.Observation {
	obs := steady(nil)
	for name, sig := range obs.Signals {
		sig.Requests = math.NaN()
		if name == hot {
			sig.CPU, sig.RecentCPU = 2, 2
		}
		obs.Signals[name] = sig
	}
	return obs
}

// With CPU alone, a pod at its limit after learning keeps LEAST_REQUEST
// (ReasonCPUAtLimit) however long the results are Learned again, and
// request rates that measure the speeds end it after a query window.
// Before learning, a pod at its limit is the opt-in's own overload and
// changes nothing.
func TestAPodAtItsLimitOnCPUAloneKeepsLeastRequest(t *testing.T) {
	p := New(config())
	p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
	d := p.Cycle(t0, cpuOnly("web-1"), fleet())
	if _, hot := weights.Has(d.Result.Reasons, weights.ReasonSaturated); !hot {
		t.Fatalf("web-1 at its limit is not reported Saturated: %s", d.Result.Message)
	}
	if d.Why != ReasonLearning {
		t.Fatalf("a pod at its limit before learning: %s (%s), want Learning", d.Balancer, d.Why)
	}
	now := t0.Add(10 * time.Minute)
	runUntil(t, p, now, func(time.Time) weights.Observation { return cpuOnly("") })
	if lb, why := p.Balancer(); lb != weights.BalancerRoundRobin {
		t.Fatalf("not on ROUND_ROBIN after 10 steady minutes on CPU alone: %s (%s)", lb, why)
	}
	before := p.Switches()
	_, at := p.Next(now)
	d = p.Cycle(at, cpuOnly("web-1"), fleet())
	if d.Balancer != weights.BalancerLeastRequest || p.Switches() != before+1 {
		t.Fatalf("a pod at its limit on CPU alone: %s (%s), want LEAST_REQUEST", d.Balancer, d.Why)
	}
	now = at.Add(10 * time.Minute)
	_, _, ds := runUntil(t, p, now, func(time.Time) weights.Observation { return cpuOnly("") })
	for _, d := range ds {
		if d.Balancer != weights.BalancerLeastRequest || (d.Result.Learned && d.Why != ReasonCPUAtLimit) {
			t.Fatalf("10 minutes of Learned results on CPU alone after a pod at its limit: %s (%s), want LEAST_REQUEST (CPUAtLimit)", d.Balancer, d.Why)
		}
	}
	if p.Switches() != before+1 {
		t.Fatalf("%d switches after a pod at its limit, want 1", p.Switches()-before)
	}
	// The user asks for LEAST_REQUEST and back: nothing switches.
	cfg := config()
	cfg.Balancer = weights.BalancerLeastRequest
	p.Configure(now, cfg)
	p.Configure(now, config())
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonCPUAtLimit || p.Switches() != before+1 {
		t.Fatalf("the user's choice there and back: %s (%s), %d switches; want LEAST_REQUEST (CPUAtLimit), none", lb, why, p.Switches()-before-1)
	}
	// Request rates measure the speeds again: a spell that ends once
	// their results have been Learned for a query window.
	_, at = p.Next(now)
	if d = p.Cycle(at, steady(nil), fleet()); d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonUnsettled {
		t.Fatalf("the first cycle with request rates: %s (%s), want LEAST_REQUEST (Unsettled) for a query window", d.Balancer, d.Why)
	}
	now = at.Add(5 * time.Minute)
	runUntil(t, p, now, func(time.Time) weights.Observation { return steady(nil) })
	if lb, why := p.Balancer(); lb != weights.BalancerRoundRobin || why != ReasonLearned {
		t.Fatalf("request rates measure the speeds again: %s (%s), want ROUND_ROBIN (Learned)", lb, why)
	}
}

// After a restart the live weights are learned ones: with CPU alone, a pod
// at its limit under them keeps the live LEAST_REQUEST at once, without
// waiting to learn again and switching to ROUND_ROBIN in between.
func TestRestartOnCPUAloneWithAPodAtItsLimitKeepsLeastRequest(t *testing.T) {
	old, now := learned(t, config())
	live := old.Weights(now, fleet())
	p := New(config())
	p.OptIn(now, fleet(), live, weights.BalancerLeastRequest, "", old.Snapshot())
	d := p.Cycle(now, cpuOnly("web-1"), fleet())
	if d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonCPUAtLimit {
		t.Fatalf("first cycle after a restart, a pod at its limit on CPU alone: %s (%s), want LEAST_REQUEST (CPUAtLimit)", d.Balancer, d.Why)
	}
	p.Applied(now, p.Weights(now, fleet()))
	runUntil(t, p, now.Add(10*time.Minute), func(time.Time) weights.Observation { return cpuOnly("") })
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonCPUAtLimit || p.Switches() != 0 {
		t.Errorf("10 minutes on: %s (%s), %d switches; want LEAST_REQUEST (CPUAtLimit), none", lb, why, p.Switches())
	}
}

// Live weights that nobody learned are only a start: equal weights the
// mirror wrote without the engine (a dry run's first opt-in: no
// DestinationRule yet, no learned state), or a restart while the manager
// before was still learning. A pod at its limit under them on CPU alone is
// the equal weights' own overload, not a reason to keep LEAST_REQUEST for
// good: the policy learns and goes to ROUND_ROBIN.
func TestUnlearnedLiveWeightsDoNotLatchCPUAtLimit(t *testing.T) {
	old, now := learned(t, config())
	equal := map[string]uint32{}
	for _, pod := range fleet() {
		equal[pod.Name] = 1000
	}
	for name, seed := range map[string]struct {
		live map[string]uint32
		lb   weights.Balancer
		why  Reason
		snap weights.Snapshot
	}{
		"equal weights, no DestinationRule, no learned state": {live: equal},
		"the manager before was still learning":               {live: equal, lb: weights.BalancerLeastRequest, why: ReasonLearning, snap: old.Snapshot()},
	} {
		t.Run(name, func(t *testing.T) {
			p := New(config())
			p.OptIn(now, fleet(), seed.live, seed.lb, seed.why, seed.snap)
			if d := p.Cycle(now, cpuOnly("web-1"), fleet()); d.Why == ReasonCPUAtLimit {
				t.Fatalf("first cycle, a pod at its limit under unlearned weights: %s (%s), want no CPUAtLimit", d.Balancer, d.Why)
			}
			p.Applied(now, p.Weights(now, fleet()))
			runUntil(t, p, now.Add(10*time.Minute), func(time.Time) weights.Observation { return cpuOnly("") })
			if lb, why := p.Balancer(); lb != weights.BalancerRoundRobin || why != ReasonLearned {
				t.Errorf("10 minutes on: %s (%s), want ROUND_ROBIN (Learned)", lb, why)
			}
		})
	}
}

// A restart under a LEAST_REQUEST the manager before chose because a pod
// reached its limit on CPU alone keeps it, with its reason, although no pod
// is at its limit now: learning again would switch to ROUND_ROBIN after a
// query window and back at the next pod at its limit. Request rates end it
// as they would have.
func TestRestartKeepsCPUAtLimitWithoutAPodAtItsLimit(t *testing.T) {
	old, now := learned(t, config())
	live := old.Weights(now, fleet())
	p := New(config())
	p.OptIn(now, fleet(), live, weights.BalancerLeastRequest, ReasonCPUAtLimit, old.Snapshot())
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonCPUAtLimit {
		t.Fatalf("after the restart: %s (%s), want LEAST_REQUEST (CPUAtLimit)", lb, why)
	}
	end := now.Add(10 * time.Minute)
	_, _, ds := runUntil(t, p, end, func(time.Time) weights.Observation { return cpuOnly("") })
	for i, d := range ds {
		if d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonCPUAtLimit {
			t.Fatalf("cycle %d after the restart, no pod at its limit: %s (%s), want LEAST_REQUEST (CPUAtLimit)", i, d.Balancer, d.Why)
		}
	}
	runUntil(t, p, end.Add(5*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	if lb, why := p.Balancer(); lb != weights.BalancerRoundRobin || why != ReasonLearned || p.Switches() != 1 {
		t.Errorf("5 minutes of request rates: %s (%s), %d switches; want ROUND_ROBIN (Learned), 1", lb, why, p.Switches())
	}
	// The reason of a spell is kept too; one from before learning is not
	// evidence that the manager before had learned.
	for _, c := range []struct{ why, want Reason }{{ReasonAlarm, ReasonAlarm}, {ReasonUnsettled, ReasonUnsettled}, {ReasonLearning, ReasonLearning}, {ReasonFallback, ReasonLearning}, {"", ReasonLearning}} {
		q := New(config())
		q.OptIn(now, fleet(), live, weights.BalancerLeastRequest, c.why, old.Snapshot())
		if lb, why := q.Balancer(); lb != weights.BalancerLeastRequest || why != c.want {
			t.Errorf("restart under LEAST_REQUEST (%q): %s (%s), want LEAST_REQUEST (%s)", c.why, lb, why, c.want)
		}
	}
}

// Live weights under LEAST_REQUEST that the manager before had fallen back
// to (equal) are not its verdict: a restart's first cycle reads the
// capacities from the readings, though a snapshot was persisted (its noise
// and cycle are restored all the same). Weights it had learned are kept at
// the first cycle (the readings calibrate the estimates to them), and so
// are weights it wrote while still Learning: they are its estimates as far
// as they had come, and readings that contradict them move them within a
// few cycles.
func TestRestartTakesOnlyLearnedWeightsAsSettled(t *testing.T) {
	old, now := learned(t, config())
	live := map[string]uint32{"web-0": 300, "web-1": 100, "web-2": 100, "web-3": 100}
	for _, c := range []struct {
		lb      weights.Balancer
		why     Reason
		settled bool
	}{
		{weights.BalancerLeastRequest, ReasonLearning, true},
		{weights.BalancerLeastRequest, ReasonFallback, false},
		{weights.BalancerLeastRequest, ReasonAlarm, true},
		{weights.BalancerLeastRequest, "", true},
		{weights.BalancerRoundRobin, ReasonLearned, true},
	} {
		p := New(config())
		p.OptIn(now, fleet(), live, c.lb, c.why, old.Snapshot())
		// What the manager before measured of the metrics is kept
		// whether or not it had learned the pods (the estimates' spread
		// is of the pods: after Fallback they are unknown).
		metrics := func(s weights.Snapshot) weights.Snapshot { s.Spread = 0; return s }
		if got := p.Snapshot(); !metrics(got).Similar(metrics(old.Snapshot())) {
			t.Errorf("restart under %s (%q): the engine's noise and cycle %+v, want the persisted %+v", c.lb, c.why, got, old.Snapshot())
		}
		// The readings say the four pods are alike.
		d := p.Cycle(now, steady(nil), fleet())
		w := p.Weights(now, fleet())
		ratio := float64(w["web-0"]) / float64(w["web-1"])
		if c.settled && (d.Result.Changed || ratio != 3) {
			t.Errorf("restart under %s (%q): the first cycle moved the learned weights (web-0 at %.2fx web-1's, was 3x)", c.lb, c.why, ratio)
		}
		if !c.settled && ratio > 1.1 {
			t.Errorf("restart under %s (%q): after the first cycle web-0 has %.2fx web-1's weight; the readings show them alike", c.lb, c.why, ratio)
		}
		if c.why != ReasonLearning {
			continue
		}
		for k := 1; k <= 3; k++ {
			at := now.Add(time.Duration(k) * config().Cycle)
			p.Cycle(at, steady(nil), fleet())
			w = p.Weights(at, fleet())
		}
		if ratio := float64(w["web-0"]) / float64(w["web-1"]); ratio > 1.1 {
			t.Errorf("restart under %s (%q): three cycles on, web-0 has %.2fx web-1's weight; the readings show them alike", c.lb, c.why, ratio)
		}
	}
}

// After a restart with live weights under ROUND_ROBIN, the balancer is kept
// and the first cycle still runs at once.
func TestRestartKeepsTheLiveBalancer(t *testing.T) {
	old, now := learned(t, config())
	live := old.Weights(now, fleet())
	p := New(config())
	p.OptIn(now, fleet(), live, weights.BalancerRoundRobin, "", old.Snapshot())
	if lb, why := p.Balancer(); lb != weights.BalancerRoundRobin || why != ReasonRestored {
		t.Fatalf("after a restart: %s (%s), want ROUND_ROBIN (Restored)", lb, why)
	}
	if act, at := p.Next(now); act != Cycle || !at.Equal(now) {
		t.Fatalf("%v at %v, want the first cycle at once", act, at.Sub(now))
	}
	_, _, ds := runUntil(t, p, now.Add(5*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	for i, d := range ds {
		if d.Balancer != weights.BalancerRoundRobin {
			t.Errorf("cycle %d after the restart: %s (%s)", i, d.Balancer, d.Why)
		}
	}
	if p.Switches() != 0 {
		t.Errorf("%d switches after a restart, want 0", p.Switches())
	}
	// Live weights under LEAST_REQUEST: the manager before had not
	// learned, and neither has this one yet.
	q := New(config())
	q.OptIn(now, fleet(), live, weights.BalancerLeastRequest, "", weights.Snapshot{})
	if lb, why := q.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonLearning {
		t.Errorf("restart under LEAST_REQUEST: %s (%s)", lb, why)
	}
}

// Failed queries past the expiry fall back to equal weights: LEAST_REQUEST
// until the weights are learned again.
func TestFallbackRunsLeastRequest(t *testing.T) {
	p, now := learned(t, config())
	failing := func(time.Time) weights.Observation { return weights.Observation{Err: errFailed} }
	_, _, ds := runUntil(t, p, now.Add(10*time.Minute), failing)
	last := ds[len(ds)-1]
	if last.Result.Mode != weights.ModeFallback || last.Balancer != weights.BalancerLeastRequest || last.Why != ReasonFallback {
		t.Fatalf("after 10 failing minutes: %s, %s (%s); want Fallback on LEAST_REQUEST", last.Result.Mode, last.Balancer, last.Why)
	}
	_, _, ds = runUntil(t, p, now.Add(30*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	if lb, _ := p.Balancer(); lb != weights.BalancerRoundRobin {
		t.Errorf("after recovery: %s (%d cycles), want ROUND_ROBIN", lb, len(ds))
	}
}

type failed struct{}

func (failed) Error() string { return "backend down" }

var errFailed = failed{}

// The same inputs give the same actions at the same instants.
func TestDeterministic(t *testing.T) {
	run := func() ([]Action, []time.Time, []Decision) {
		p := New(config())
		p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
		return runUntil(t, p, t0.Add(15*time.Minute), func(at time.Time) weights.Observation {
			if at.Sub(t0) > 8*time.Minute && at.Sub(t0) < 9*time.Minute {
				return steady(map[string]float64{"web-1": 1})
			}
			return steady(nil)
		})
	}
	a1, t1, d1 := run()
	a2, t2, d2 := run()
	if len(a1) != len(a2) {
		t.Fatalf("%d and %d actions", len(a1), len(a2))
	}
	for i := range a1 {
		if a1[i] != a2[i] || !t1[i].Equal(t2[i]) {
			t.Fatalf("action %d: %v at %v and %v at %v", i, a1[i], t1[i], a2[i], t2[i])
		}
	}
	for i := range d1 {
		if d1[i].Balancer != d2[i].Balancer || d1[i].Result.Changed != d2[i].Result.Changed {
			t.Fatalf("decision %d differs", i)
		}
	}
}

func TestLookInterval(t *testing.T) {
	for scrape, want := range map[time.Duration]time.Duration{
		15 * time.Second: 15 * time.Second, 30 * time.Second: 30 * time.Second,
		15 * time.Millisecond: time.Second, 0: 0,
	} {
		if got := LookInterval(scrape); got != want {
			t.Errorf("LookInterval(%v) = %v, want %v", scrape, got, want)
		}
	}
}

// Once learned, a result kept from Learned only by the estimates'
// confidence (here a pod whose limit was lifted, so that its cores are
// read afresh; kept unsure by reading them on a new node each cycle)
// starts no spell, however long it lasts: doubt is not evidence. The looks
// between cycles go on, as under any ROUND_ROBIN on the weights, and a
// queue (here an alarm at a look) still starts a spell at once.
func TestDoubtStartsNoSpellAQueueDoes(t *testing.T) {
	p, now := learned(t, config())
	before := p.Switches()
	at := now
	unsure := func(i int) []weights.Pod {
		pods := fleet()
		pods[3].Cores, pods[3].Node, pods[3].NodeCores = 0, fmt.Sprintf("node-%d", i), 8
		return pods
	}
	var d Decision
	for i := 0; i < 10; i++ { // five minutes: several query windows
		at = at.Add(30 * time.Second)
		if d = p.Cycle(at, steady(nil), unsure(i)); !d.Result.Doubtful {
			t.Fatalf("cycle %d: the result is not Doubtful (Learned %v: %s); this test needs another", i, d.Result.Learned, d.Result.Message)
		}
		p.Applied(at, p.Weights(at, unsure(i)))
		if d.Balancer != weights.BalancerRoundRobin || p.Switches() != before {
			t.Fatalf("cycle %d, %v into the doubt: %s (%s), %d switches; want ROUND_ROBIN kept", i, at.Sub(now), d.Balancer, d.Why, p.Switches()-before)
		}
		if !p.LookWanted() {
			t.Fatalf("cycle %d: no looks between cycles while ROUND_ROBIN is kept through the doubt", i)
		}
	}
	at = at.Add(15 * time.Second)
	slow := steady(map[string]float64{"web-3": 2})
	if a, ring := p.Look(at, slow); !ring || a.Pod != "web-3" {
		t.Fatalf("look: %+v %v, want an alarm for web-3", a, ring)
	}
	if d = p.Cycle(at, slow, unsure(10)); d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonAlarm || !d.Switched {
		t.Fatalf("an alarm during the doubt: %s (%s) switched %v; want a spell of LEAST_REQUEST at once", d.Balancer, d.Why, d.Switched)
	}
}

// The snapshot worth a write to the optimizer: none before the opt-in or
// before the engine has measured anything; then the engine's, once, until
// it moves. After a restart the optimizer already carries the snapshot the
// policy was seeded with: nothing is written while the engine's stays
// Similar to it.
func TestSnapshotToPersistOnlyWhenItMoved(t *testing.T) {
	p := New(config())
	if _, ok := p.SnapshotToPersist(); ok {
		t.Fatal("a snapshot to persist before the opt-in")
	}
	old, now := learned(t, config())
	s, ok := old.SnapshotToPersist()
	if !ok {
		t.Fatal("nothing to persist after learning from a first opt-in")
	}
	old.Persisted(s)
	if again, ok := old.SnapshotToPersist(); ok {
		t.Fatalf("persisted %+v, then asked again: %+v", s, again)
	}

	q := New(config())
	q.OptIn(now, fleet(), old.Weights(now, fleet()), weights.BalancerRoundRobin, ReasonLearned, s)
	if got, ok := q.SnapshotToPersist(); ok {
		t.Errorf("a restart seeded with the optimizer's snapshot %+v wants to write %+v", s, got)
	}
	runUntil(t, q, now.Add(5*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	if got, ok := q.SnapshotToPersist(); ok {
		t.Errorf("five steady minutes after the restart: wants to write %+v over %+v", got, s)
	}

	// A restart with no snapshot on the optimizer writes one once it has
	// measured the noise.
	r := New(config())
	r.OptIn(now, fleet(), old.Weights(now, fleet()), weights.BalancerRoundRobin, ReasonLearned, weights.Snapshot{})
	runUntil(t, r, now.Add(5*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	if _, ok := r.SnapshotToPersist(); !ok {
		t.Error("a restart without a snapshot on the optimizer: nothing to persist after five minutes")
	}
}

// Results Learned in dry run rest on weights no client followed (the
// DestinationRule keeps LEAST_REQUEST, the ServiceEntry equal weights).
// Leaving dry run learns anew, as at an opt-in: LEAST_REQUEST at once, and
// ROUND_ROBIN only once the results have been Learned for a whole query
// window after it, not at the reconcile that leaves dry run.
func TestLeavingDryRunLearnsAnew(t *testing.T) {
	cfg := config()
	cfg.Balancer, cfg.DryRun = weights.BalancerLeastRequest, true
	p := New(cfg)
	p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
	end := t0.Add(10 * time.Minute)
	_, _, ds := runUntil(t, p, end, func(time.Time) weights.Observation { return steady(nil) })
	if !ds[len(ds)-1].Result.Learned {
		t.Fatal("never Learned in dry run on steady signals; the test needs it")
	}
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonUserChoice {
		t.Fatalf("in dry run: %s (%s), want LEAST_REQUEST (UserChoice)", lb, why)
	}
	cfg.Balancer, cfg.DryRun = weights.BalancerRoundRobin, false
	p.Configure(end, cfg)
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonLearning {
		t.Errorf("leaving dry run: %s (%s), want LEAST_REQUEST (Learning)", lb, why)
	}
	_, at, ds := runUntil(t, p, end.Add(5*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	var since time.Time
	for i, d := range ds {
		if d.Result.Learned && since.IsZero() {
			since = at[i]
		}
		want := weights.BalancerLeastRequest
		if !since.IsZero() && at[i].Sub(since) >= cfg.Engine.QueryWindow {
			want = weights.BalancerRoundRobin
		}
		if d.Balancer != want {
			t.Errorf("cycle %d after leaving dry run (at %v, learned since %v): %s, want %s", i, at[i].Sub(end), since.Sub(end), d.Balancer, want)
		}
	}
	if lb, _ := p.Balancer(); lb != weights.BalancerRoundRobin {
		t.Errorf("ends on %s, want ROUND_ROBIN once Learned for a query window", lb)
	}
}

// A wall clock stepped back an hour finds the last cycle and look in the
// future. Whatever is due then is due at once, not an hour later, and
// after that cycle the schedule runs on the new clock.
func TestClockSteppedBackDelaysNoCycle(t *testing.T) {
	for _, looks := range []bool{true, false} {
		cfg := config()
		if !looks {
			cfg.LookInterval = 0
		}
		p, now := learned(t, cfg)
		back := now.Add(-time.Hour)
		act, at := p.Next(back)
		if act != Cycle || at.After(back) {
			t.Errorf("looks %v: after a step back, %v due at %v past the new now, want a cycle at once", looks, act, at.Sub(back))
			continue
		}
		p.Cycle(back, steady(nil), fleet())
		act, at = p.Next(back)
		if d := at.Sub(back); d <= 0 || d > cfg.Cycle {
			t.Errorf("looks %v: after the cycle on the new clock, %v due in %v, want within a cycle", looks, act, d)
		}
	}
}

// busy is steady at 95% of the fleet's capacity: 1.9 of 2 cores per pod,
// the same 10 ms of CPU per request.
func busy() weights.Observation {
	obs := steady(nil)
	for name, sig := range obs.Signals {
		sig.CPU, sig.RecentCPU, sig.Requests = 1.9, 1.9, 190
		obs.Signals[name] = sig
	}
	return obs
}

// Past the utilisation cap, the LEAST_REQUEST of the opt-in is kept once
// the weights are learned (ReasonAtCapacity), with no switch; when the
// load falls below the cap, the user's ROUND_ROBIN comes, once.
func TestPastTheCapKeepsLeastRequest(t *testing.T) {
	p := New(config())
	p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
	_, _, ds := runUntil(t, p, t0.Add(15*time.Minute), func(time.Time) weights.Observation { return busy() })
	learnedAt := -1
	for i, d := range ds {
		if _, past := weights.Has(d.Result.Reasons, weights.ReasonPastCap); !past && d.Result.Learned {
			t.Fatalf("cycle %d at 95%% load: no PastCap reason (%s)", i, d.Result.Message)
		}
		if d.Balancer != weights.BalancerLeastRequest {
			t.Fatalf("cycle %d at 95%% load: %s (%s), want LEAST_REQUEST kept", i, d.Balancer, d.Why)
		}
		if d.Why == ReasonAtCapacity && learnedAt < 0 {
			learnedAt = i
		}
	}
	if learnedAt < 0 {
		t.Fatal("never AtCapacity: the weights were never learned at 95% load")
	}
	if p.Switches() != 0 {
		t.Errorf("%d switches past the cap, want 0", p.Switches())
	}
	end := t0.Add(15 * time.Minute)
	_, _, ds = runUntil(t, p, end.Add(15*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	last := ds[len(ds)-1]
	if last.Balancer != weights.BalancerRoundRobin || last.Why != ReasonLearned || p.Switches() != 1 {
		t.Errorf("at half load again: %s (%s) after %d switches, want ROUND_ROBIN (Learned) after 1", last.Balancer, last.Why, p.Switches())
	}
	if _, past := weights.Has(last.Result.Reasons, weights.ReasonPastCap); past {
		t.Errorf("PastCap at half load: %s", last.Result.Message)
	}
}

// ROUND_ROBIN that is live gives way to LEAST_REQUEST once the results
// have said the load is past the cap for a whole query window, and comes
// back once they have said it is below for one: two switches, each after a
// window.
func TestPastTheCapTurnsLeastRequestOnAfterAWindow(t *testing.T) {
	p, now := learned(t, config())
	before := p.Switches()
	window := config().Engine.QueryWindow
	acts, at, ds := runUntil(t, p, now.Add(10*time.Minute), func(time.Time) weights.Observation { return busy() })
	at = cycleTimes(acts, at)
	var pastSince time.Time
	for i, d := range ds {
		_, past := weights.Has(d.Result.Reasons, weights.ReasonPastCap)
		if past && pastSince.IsZero() {
			pastSince = at[i]
		}
		want := weights.BalancerRoundRobin
		if past && at[i].Sub(pastSince) >= window {
			want = weights.BalancerLeastRequest
		}
		if d.Balancer != want || (want == weights.BalancerLeastRequest && d.Why != ReasonAtCapacity) {
			t.Errorf("cycle %d, %v after the first result past the cap (past now: %v): %s (%s), want %s", i, at[i].Sub(pastSince), past, d.Balancer, d.Why, want)
		}
	}
	if pastSince.IsZero() {
		t.Fatal("the engine never said the load is past the cap at 95%")
	}
	if p.Switches() != before+1 {
		t.Errorf("%d switches past the cap, want 1", p.Switches()-before)
	}
	now = now.Add(10 * time.Minute)
	acts, at, ds = runUntil(t, p, now.Add(10*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	at = cycleTimes(acts, at)
	var belowSince time.Time
	for i, d := range ds {
		if _, past := weights.Has(d.Result.Reasons, weights.ReasonPastCap); past || !d.Result.Learned {
			continue
		}
		if belowSince.IsZero() {
			belowSince = at[i]
		}
		if at[i].Sub(belowSince) < window && d.Balancer != weights.BalancerLeastRequest {
			t.Errorf("cycle %d, %v after the first result below the cap: %s (%s), want LEAST_REQUEST kept for a query window", i, at[i].Sub(belowSince), d.Balancer, d.Why)
		}
	}
	if last := ds[len(ds)-1]; last.Balancer != weights.BalancerRoundRobin || last.Why != ReasonLearned || p.Switches() != before+2 {
		t.Errorf("at half load again: %s (%s) after %d switches, want ROUND_ROBIN (Learned) after 2", last.Balancer, last.Why, p.Switches()-before)
	}
}

// cycleTimes is the instants of the cycles among runUntil's actions.
func cycleTimes(acts []Action, at []time.Time) []time.Time {
	var out []time.Time
	for i, a := range acts {
		if a == Cycle {
			out = append(out, at[i])
		}
	}
	return out
}

// atCapacity returns a policy opted in at 95% load 15 minutes ago, on
// LEAST_REQUEST (AtCapacity), and the instant.
func atCapacity(t *testing.T) (*Policy, time.Time) {
	t.Helper()
	p := New(config())
	p.OptIn(t0, fleet(), nil, "", "", weights.Snapshot{})
	now := t0.Add(15 * time.Minute)
	runUntil(t, p, now, func(time.Time) weights.Observation { return busy() })
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonAtCapacity {
		t.Fatalf("at 95%% load: %s (%s), want LEAST_REQUEST (AtCapacity)", lb, why)
	}
	return p, now
}

// Cycles without fresh data (failed queries) say nothing of the load: an
// AtCapacity spell holds through them, with no switch.
func TestAtCapacityHoldsThroughFailedQueries(t *testing.T) {
	p, now := atCapacity(t)
	before := p.Switches()
	_, _, ds := runUntil(t, p, now.Add(3*time.Minute), func(time.Time) weights.Observation {
		return weights.Observation{Err: errors.New("prometheus down")}
	})
	for i, d := range ds {
		if d.Balancer != weights.BalancerLeastRequest || d.Why != ReasonAtCapacity {
			t.Errorf("failed query %d: %s (%s, mode %s), want LEAST_REQUEST (AtCapacity) kept", i, d.Balancer, d.Why, d.Result.Mode)
		}
	}
	if p.Switches() != before {
		t.Errorf("%d switches through failed queries, want none", p.Switches()-before)
	}
}

// A restarted manager keeps a LEAST_REQUEST recorded as AtCapacity: the
// manager before had learned, and the load is still past the cap.
func TestRestartKeepsAtCapacity(t *testing.T) {
	old, now := atCapacity(t)
	p := New(config())
	p.OptIn(now, fleet(), old.Weights(now, fleet()), weights.BalancerLeastRequest, ReasonAtCapacity, old.Snapshot())
	if lb, why := p.Balancer(); lb != weights.BalancerLeastRequest || why != ReasonAtCapacity {
		t.Fatalf("after a restart: %s (%s), want LEAST_REQUEST (AtCapacity)", lb, why)
	}
	_, _, ds := runUntil(t, p, now.Add(5*time.Minute), func(time.Time) weights.Observation { return busy() })
	for i, d := range ds {
		if d.Balancer != weights.BalancerLeastRequest {
			t.Errorf("cycle %d after the restart: %s (%s)", i, d.Balancer, d.Why)
		}
	}
	if p.Switches() != 0 {
		t.Errorf("%d switches after the restart, want 0", p.Switches())
	}
	// The load falls below the cap: ROUND_ROBIN at once, the weights
	// having been learned.
	_, _, ds = runUntil(t, p, now.Add(15*time.Minute), func(time.Time) weights.Observation { return steady(nil) })
	if d := ds[len(ds)-1]; d.Balancer != weights.BalancerRoundRobin || p.Switches() != 1 {
		t.Errorf("below the cap after the restart: %s (%s), %d switches; want ROUND_ROBIN after 1", d.Balancer, d.Why, p.Switches())
	}
}
