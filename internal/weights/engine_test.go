package weights

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// quiet is the spacing of cycles in these tests: longer than any rate
// window reaches back, so every observation sees steady weights.
const quiet = 2 * time.Minute

func podsNamed(names ...string) []Pod {
	out := make([]Pod, len(names))
	for i, n := range names {
		out[i] = Pod{Name: n, Locality: "r/z/s"}
	}
	return out
}

// steadyObs is what the backend reports once weights w have held for a
// while: each pod's traffic follows its weight share, and its CPU is that
// traffic divided by its speed. Requests are included when withRequests.
func steadyObs(at time.Time, w map[string]uint32, speed map[string]float64, totalCPU float64, withRequests bool) Observation {
	// Sums in name order, so that two engines given the same weights get
	// the same observation to the last bit.
	sum := 0.0
	for _, name := range sortedNames(w) {
		sum += float64(w[name])
	}
	raw := map[string]float64{}
	rawSum := 0.0
	for _, name := range sortedNames(w) {
		raw[name] = float64(w[name]) / sum / speed[name]
		rawSum += raw[name]
	}
	obs := Observation{Time: at, Signals: map[string]Signal{}}
	for name, v := range w {
		sig := Signal{CPU: totalCPU * raw[name] / rawSum, Requests: math.NaN()}
		if withRequests {
			sig.Requests = sig.CPU * speed[name] * 100
		}
		obs.Signals[name] = sig
		_ = v
	}
	return obs
}

// cycle runs Update and applies the result when it changed, as the
// controller does.
func cycle(e *Engine, pods []Pod, obs Observation) Result {
	res := e.Update(pods, obs)
	if res.Changed {
		e.Applied(obs.Time, res.Weights)
	}
	return res
}

// learned returns an engine that has learned the given speeds over a few
// quiet cycles, and the time of the last one.
func learned(t *testing.T, p Params, pods []Pod, speed map[string]float64) (*Engine, time.Time) {
	t.Helper()
	e := New(p)
	now := t0
	e.Applied(now, e.Weights(now, pods))
	for range 4 {
		now = now.Add(quiet)
		cycle(e, pods, steadyObs(now, e.live, speed, 4, true))
	}
	return e, now
}

// capacityParams are the defaults without MinimizeLatency: weights are
// capacity shares (tilted), which is what tests of learning assert.
func capacityParams() Params {
	p := DefaultParams()
	p.MinimizeLatency = false
	return p
}

func ratio(w map[string]uint32, a, b string) float64 { return float64(w[a]) / float64(w[b]) }

func near(got, want, tolerance float64) bool { return math.Abs(got/want-1) <= tolerance }

func TestDefaultParamsAreValid(t *testing.T) {
	if err := DefaultParams().Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestValidateRejectsNonsense(t *testing.T) {
	tests := map[string]struct {
		change func(*Params)
		want   string // part of the error
	}{
		"zero window":            {func(p *Params) { p.QueryWindow = 0 }, "query window"},
		"window below 2 scrapes": {func(p *Params) { p.QueryWindow = 20 * time.Second }, "twice the scrape interval"},
		"negative scrape":        {func(p *Params) { p.ScrapeInterval = -time.Second }, "scrape interval"},
		"NaN dead band":          {func(p *Params) { p.DeadBand = math.NaN() }, "dead band"},
		"huge dead band":         {func(p *Params) { p.DeadBand = 0.9 }, "dead band"},
		"zero step":              {func(p *Params) { p.MaxStep = 0 }, "max step"},
		"ratio below 1":          {func(p *Params) { p.MaxRatio = 0.5 }, "max ratio"},
		"infinite ratio":         {func(p *Params) { p.MaxRatio = math.Inf(1) }, "max ratio"},
		"zero smoothing":         {func(p *Params) { p.Smoothing = 0 }, "smoothing"},
		"smoothing above 1":      {func(p *Params) { p.Smoothing = 1.5 }, "smoothing"},
		"negative min CPU":       {func(p *Params) { p.MinCPU = -1 }, "min CPU"},
		"negative slow start":    {func(p *Params) { p.SlowStart = -time.Second }, "slow start"},
		"zero expiry":            {func(p *Params) { p.Expiry = 0 }, "expiry"},
		"zero mean weight":       {func(p *Params) { p.MeanWeight = 0 }, "mean weight"},
		"coarse small weights":   {func(p *Params) { p.MeanWeight = 100; p.MaxRatio = 50 }, "rounding"},
		"sum overflow":           {func(p *Params) { p.MeanWeight = 1 << 20; p.MaxRatio = 10 }, "2^32-1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := DefaultParams()
			tc.change(&p)
			err := p.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error about %q", err, tc.want)
			}
			// An engine given nonsense still works, on defaults.
			e := New(p)
			w := e.Weights(t0, podsNamed("a", "b"))
			if w["a"] == 0 || w["b"] == 0 {
				t.Fatalf("weights %v", w)
			}
		})
	}
}

func TestLearnsCapacityFromRequestsAndFromCPU(t *testing.T) {
	pods := podsNamed("fast", "slow")
	speed := map[string]float64{"fast": 2, "slow": 1}
	p := capacityParams()
	p.SpeedTilt = 0 // plain capacity shares; TestSpeedTilt covers the tilt
	for _, withRequests := range []bool{true, false} {
		e := New(p)
		e.Applied(t0, e.Weights(t0, pods))
		res := cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 2, withRequests))
		if res.Mode != ModeOptimizing || !res.Changed {
			t.Fatalf("requests %v: mode %s changed %v: %s", withRequests, res.Mode, res.Changed, res.Message)
		}
		if r := ratio(res.Weights, "fast", "slow"); !near(r, 2, 0.01) {
			t.Errorf("requests %v: fast/slow weight ratio %.3f, want 2", withRequests, r)
		}
		if c := res.Capacity["fast"] / res.Capacity["slow"]; !near(c, 2, 0.01) {
			t.Errorf("requests %v: capacity ratio %.3f, want 2", withRequests, c)
		}
	}
}

func TestLowLoadHoldsWeights(t *testing.T) {
	pods := podsNamed("fast", "slow")
	e, now := learned(t, DefaultParams(), pods, map[string]float64{"fast": 2, "slow": 1})
	before := e.live
	// Now the pods nearly idle, and their CPU says nothing about speed.
	obs := Observation{Time: now.Add(quiet), Signals: map[string]Signal{
		"fast": {CPU: 0.01, Requests: 1}, "slow": {CPU: 0.03, Requests: 1},
	}}
	res := cycle(e, pods, obs)
	if res.Mode != ModeLowLoad || res.Changed {
		t.Fatalf("mode %s changed %v, want LowLoad without change", res.Mode, res.Changed)
	}
	if res.Weights["fast"] != before["fast"] || res.Weights["slow"] != before["slow"] {
		t.Errorf("weights %v, want the held %v", res.Weights, before)
	}
	if !strings.Contains(res.Message, "Low load") {
		t.Errorf("message %q", res.Message)
	}
}

func TestInvalidSignalsMeanNoData(t *testing.T) {
	pods := podsNamed("a", "b", "c", "d")
	speed := map[string]float64{"a": 1, "b": 2, "c": 3, "d": 1}
	bad := map[string]Signal{
		"NaN":      {CPU: math.NaN(), Requests: math.NaN()},
		"Inf":      {CPU: math.Inf(1), Requests: math.Inf(1)},
		"negative": {CPU: -1, Requests: -5},
	}
	for name, sig := range bad {
		t.Run(name, func(t *testing.T) {
			e := New(DefaultParams())
			e.Applied(t0, e.Weights(t0, pods))
			obs := steadyObs(t0.Add(quiet), e.live, speed, 4, true)
			obs.Signals["d"] = sig
			res := cycle(e, pods, obs)
			// d has no data: it gets the median capacity, that of a..c.
			if r := ratio(res.Weights, "d", "b"); !near(r, 1, 0.01) {
				t.Errorf("d/b = %.3f, want 1 (d gets the median)", r)
			}
			for _, pod := range pods {
				if c := res.Capacity[pod.Name]; !(c > 0) || math.IsInf(c, 0) {
					t.Errorf("capacity of %s is %v", pod.Name, c)
				}
			}

			// When every pod's data is bad, nothing is learned: weights hold.
			for n := range obs.Signals {
				obs.Signals[n] = sig
			}
			obs.Time = obs.Time.Add(quiet)
			held := e.live
			res = cycle(e, pods, obs)
			if res.Mode != ModeNoData || res.Changed || res.Weights["a"] != held["a"] {
				t.Errorf("mode %s changed %v weights %v, want NoData holding %v", res.Mode, res.Changed, res.Weights, held)
			}
		})
	}
}

func TestPodMissingFromTheQueryGetsTheMedian(t *testing.T) {
	pods := podsNamed("a", "b", "c", "new")
	e := New(DefaultParams())
	e.Applied(t0, e.Weights(t0, pods))
	obs := steadyObs(t0.Add(quiet), e.live, map[string]float64{"a": 1, "b": 2, "c": 4, "new": 1}, 4, false)
	delete(obs.Signals, "new")
	res := cycle(e, pods, obs)
	if res.Weights["new"] != res.Weights["b"] {
		t.Errorf("weights %v: the pod without data should have the median weight (b's)", res.Weights)
	}
}

func TestAllZeroCPU(t *testing.T) {
	pods := podsNamed("a", "b", "c")
	zero := Observation{Time: t0.Add(quiet), Signals: map[string]Signal{
		"a": {CPU: 0, Requests: 0}, "b": {CPU: 0, Requests: 0}, "c": {CPU: 0, Requests: 0},
	}}
	for _, minCPU := range []float64{0.05, 0} {
		p := DefaultParams()
		p.MinCPU = minCPU
		e := New(p)
		e.Applied(t0, e.Weights(t0, pods))
		res := cycle(e, pods, zero)
		want := ModeLowLoad
		if minCPU == 0 {
			want = ModeSteady // nothing to learn from idle pods, nothing moves
		}
		if res.Mode != want || res.Changed {
			t.Errorf("min CPU %v: mode %s changed %v, want %s unchanged", minCPU, res.Mode, res.Changed, want)
		}
		for name, w := range res.Weights {
			if w != p.MeanWeight {
				t.Errorf("min CPU %v: %s = %d, want %d", minCPU, name, w, p.MeanWeight)
			}
			if c := res.Capacity[name]; math.IsNaN(c) || c <= 0 {
				t.Errorf("min CPU %v: capacity %v", minCPU, c)
			}
		}
	}
}

func TestFailedQueriesHoldThenFallBackThenRecover(t *testing.T) {
	pods := podsNamed("fast", "slow")
	speed := map[string]float64{"fast": 3, "slow": 1}
	p := DefaultParams()
	e, now := learned(t, p, pods, speed)
	good := e.live
	if !near(ratio(good, "fast", "slow"), 3, 0.01) {
		t.Fatalf("did not learn: %v", good)
	}
	lastGood := now
	down := Observation{Err: errors.New("connection refused")}

	// Within Expiry: the learned weights hold.
	for _, after := range []time.Duration{30 * time.Second, 4 * time.Minute, p.Expiry} {
		down.Time = lastGood.Add(after)
		res := cycle(e, pods, down)
		if res.Mode != ModeHolding || res.Changed || res.Weights["fast"] != good["fast"] {
			t.Fatalf("after %v: mode %s changed %v weights %v, want Holding %v", after, res.Mode, res.Changed, res.Weights, good)
		}
		if !strings.Contains(res.Message, "connection refused") || !strings.Contains(res.Message, "holding") {
			t.Errorf("after %v: message %q", after, res.Message)
		}
	}

	// Past Expiry: equal weights, written once.
	down.Time = lastGood.Add(p.Expiry + time.Second)
	res := cycle(e, pods, down)
	if res.Mode != ModeFallback || !res.Changed || res.Weights["fast"] != res.Weights["slow"] {
		t.Fatalf("mode %s changed %v weights %v, want Fallback to equal", res.Mode, res.Changed, res.Weights)
	}
	if !strings.Contains(res.Message, "equal weights") {
		t.Errorf("message %q", res.Message)
	}
	down.Time = down.Time.Add(30 * time.Second)
	if res := cycle(e, pods, down); res.Mode != ModeFallback || res.Changed {
		t.Fatalf("second fallback cycle: mode %s changed %v", res.Mode, res.Changed)
	}
	// A pod that comes and goes during the outage gets an equal weight too.
	if w := e.Weights(down.Time, podsNamed("fast", "slow", "other")); w["other"] != w["fast"] {
		t.Errorf("in fallback, new pod weights %v", w)
	}

	// Metrics return: what was learned comes back at once (within MaxStep).
	now = down.Time.Add(quiet)
	res = cycle(e, pods, steadyObs(now, e.live, speed, 4, true))
	if res.Mode != ModeOptimizing || !res.Changed || !near(ratio(res.Weights, "fast", "slow"), 3, 0.02) {
		t.Fatalf("after recovery: mode %s weights %v, want fast/slow = 3", res.Mode, res.Weights)
	}
	if !strings.Contains(res.Message, "back") {
		t.Errorf("message %q", res.Message)
	}
}

func TestMissingDataExpiresToo(t *testing.T) {
	pods := podsNamed("fast", "slow")
	p := DefaultParams()
	e, now := learned(t, p, pods, map[string]float64{"fast": 3, "slow": 1})
	empty := Observation{Time: now.Add(time.Minute), Signals: map[string]Signal{}}
	if res := cycle(e, pods, empty); res.Mode != ModeNoData || res.Changed {
		t.Fatalf("mode %s changed %v", res.Mode, res.Changed)
	}
	empty.Time = now.Add(p.Expiry + time.Minute)
	if res := cycle(e, pods, empty); res.Mode != ModeFallback || res.Weights["fast"] != res.Weights["slow"] {
		t.Fatalf("mode %s weights %v, want Fallback to equal", res.Mode, res.Weights)
	}
}

func TestSlowStartRampsNewPods(t *testing.T) {
	p := DefaultParams()
	p.SlowStart = 2 * time.Minute
	pods := podsNamed("a", "b")
	speed := map[string]float64{"a": 1, "b": 1, "new": 1}
	e, now := learned(t, p, pods, speed)

	ready := now
	pods = append(pods, Pod{Name: "new", ReadySince: ready})
	w := e.Weights(now, pods)
	e.Applied(now, w)
	if got := float64(w["new"]) / float64(w["a"]); !near(got, slowStartFloor, 0.02) {
		t.Fatalf("just ready: new/a = %.3f, want %.2f", got, slowStartFloor)
	}
	last := w["new"]
	for _, at := range []time.Duration{30 * time.Second, time.Minute, 90 * time.Second, 2 * time.Minute, 3 * time.Minute} {
		res := cycle(e, pods, steadyObs(ready.Add(at), e.live, speed, 3, true))
		want := min(1, slowStartFloor+(1-slowStartFloor)*at.Seconds()/p.SlowStart.Seconds())
		got := float64(res.Weights["new"]) / float64(res.Weights["a"])
		if !near(got, want, 0.03) {
			t.Errorf("%v after ready: new/a = %.3f, want %.3f", at, got, want)
		}
		if res.Weights["new"] < last {
			t.Errorf("%v after ready: weight fell from %d to %d", at, last, res.Weights["new"])
		}
		last = res.Weights["new"]
	}
}

func TestHardwarePoolingStartsNewPodsNearTheirClass(t *testing.T) {
	for _, pool := range []bool{true, false} {
		p := capacityParams()
		p.PoolByHardware = pool
		p.SpeedTilt = 0
		pods := []Pod{
			{Name: "big-1", HardwareClass: "c6i.4xlarge"}, {Name: "big-2", HardwareClass: "c6i.4xlarge"},
			{Name: "mid-1", HardwareClass: "m5.large"},
			{Name: "small-1", HardwareClass: "t3.medium"}, {Name: "small-2", HardwareClass: "t3.medium"},
		}
		speed := map[string]float64{"big-1": 3, "big-2": 3, "mid-1": 2, "small-1": 1, "small-2": 1}
		e, now := learned(t, p, pods, speed)
		withNew := append(pods, Pod{Name: "small-3", HardwareClass: "t3.medium"})
		w := e.Weights(now, withNew)
		got := float64(w["small-3"]) / float64(w["small-1"])
		if pool && !near(got, 1, 0.01) {
			t.Errorf("pooling: new small pod has %.2f of a small pod's weight, want 1", got)
		}
		if !pool && !near(got, 2, 0.01) {
			t.Errorf("no pooling: new small pod has %.2f of a small pod's weight, want 2 (the median)", got)
		}
	}
}

func TestSetChangeKeepsTheWeightsOfPodsThatStay(t *testing.T) {
	pods := podsNamed("a", "b", "c")
	e, now := learned(t, DefaultParams(), pods, map[string]float64{"a": 1, "b": 2, "c": 4})
	before := e.live
	w := e.Weights(now.Add(time.Second), podsNamed("b", "c", "d"))
	if len(w) != 3 {
		t.Fatalf("weights %v, want b, c, d", w)
	}
	for _, name := range []string{"b", "c"} {
		if w[name] != before[name] {
			t.Errorf("%s: %d, was %d", name, w[name], before[name])
		}
	}
	if _, ok := w["a"]; ok {
		t.Errorf("a is gone but has a weight")
	}
	if median := (float64(w["b"]) + float64(w["c"])) / 2; !near(float64(w["d"]), median, 0.002) {
		t.Errorf("new pod d has %d, want the median %.0f", w["d"], median)
	}
	// The next cycle sees the set changed, even if no weight moved.
	e.Applied(now.Add(time.Second), w)
	res := cycle(e, podsNamed("b", "c", "d", "e"), steadyObs(now.Add(quiet), e.live, map[string]float64{"b": 2, "c": 4, "d": 4}, 4, true))
	if !res.Changed || len(res.Weights) != 4 {
		t.Errorf("changed %v weights %v, want a write for the new set", res.Changed, res.Weights)
	}
}

func TestSeedKeepsWhatWasLearned(t *testing.T) {
	pods := podsNamed("fast", "slow")
	speed := map[string]float64{"fast": 3, "slow": 1}
	live := map[string]uint32{"fast": 450, "slow": 150} // written by an earlier manager, another scale
	e := New(DefaultParams())
	e.Seed(t0, live)
	if w := e.Weights(t0, pods); w["fast"] != 450 || w["slow"] != 150 {
		t.Fatalf("after seed: %v, want the live weights", w)
	}
	res := cycle(e, pods, steadyObs(t0.Add(30*time.Second), live, speed, 4, false))
	if res.Changed {
		t.Errorf("first cycle after a restart rewrote weights: %v (%s)", res.Weights, res.Message)
	}
}

func TestStepAndRatioBounds(t *testing.T) {
	p := DefaultParams()
	p.MaxStep = 0.5
	p.MaxRatio = 4
	pods := podsNamed("a", "b", "c", "d")
	speed := map[string]float64{"a": 100, "b": 1, "c": 1, "d": 1}
	e := New(p)
	e.Applied(t0, e.Weights(t0, pods))
	res := cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 4, true))
	// One cycle moves a weight at most 1.5x (after rescaling the sum).
	if r := ratio(res.Weights, "a", "b"); r > 1.5*1.5+0.01 {
		t.Errorf("after one cycle a/b = %.2f, want at most %.2f", r, 1.5*1.5)
	}
	for range 10 {
		res = cycle(e, pods, steadyObs(e.liveAt.Add(quiet), e.live, speed, 4, true))
	}
	mean := 0.0
	for _, w := range res.Weights {
		mean += float64(w)
	}
	mean /= 4
	for name, w := range res.Weights {
		if float64(w) > mean*p.MaxRatio*1.01 || float64(w) < mean/p.MaxRatio*0.99 {
			t.Errorf("%s = %d outside [%.0f, %.0f]", name, w, mean/p.MaxRatio, mean*p.MaxRatio)
		}
	}
}

func TestDryRunAssumesEnvoyBalancesEvenly(t *testing.T) {
	// Nothing is ever applied: Envoy keeps balancing evenly, and the engine
	// must read CPU that way, cycle after cycle, without drifting.
	pods := podsNamed("fast", "slow")
	speed := map[string]float64{"fast": 3, "slow": 1}
	equal := map[string]uint32{"fast": 1, "slow": 1}
	p := DefaultParams()
	p.SpeedTilt = 0
	e := New(p)
	for k := range 5 {
		res := e.Update(pods, steadyObs(t0.Add(time.Duration(k+1)*quiet), equal, speed, 4, false))
		if !near(ratio(res.Weights, "fast", "slow"), 3, 0.02) {
			t.Fatalf("cycle %d: %v, want fast/slow = 3", k+1, res.Weights)
		}
		if res.Changed != (k == 0) {
			t.Errorf("cycle %d: changed %v", k+1, res.Changed)
		}
	}
}

func TestCoresScaleCapacity(t *testing.T) {
	pods := []Pod{{Name: "big", Cores: 4}, {Name: "small", Cores: 2}, {Name: "unknown"}}
	speed := map[string]float64{"big": 1, "small": 1, "unknown": 1}
	e := New(capacityParams())
	e.Applied(t0, e.Weights(t0, pods))
	res := cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 3, true))
	if r := ratio(res.Weights, "big", "small"); !near(r, 2, 0.01) {
		t.Errorf("big/small = %.2f, want 2 (same speed, twice the cores)", r)
	}
	if r := ratio(res.Weights, "unknown", "small"); !near(r, 1.5, 0.01) {
		t.Errorf("unknown/small = %.2f, want 1.5 (the median of 4 and 2 cores)", r)
	}
}

func TestWeightsStayWithinUint32Sums(t *testing.T) {
	p := DefaultParams()
	p.MeanWeight = maxMeanTimesRatio / 10
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	pods := make([]Pod, MaxEndpoints)
	speed := map[string]float64{}
	for i := range pods {
		pods[i] = Pod{Name: fmt.Sprintf("p%04d", i)}
		speed[pods[i].Name] = 1
	}
	speed["p0000"] = 1000 // would be far above the mean
	e := New(p)
	e.Applied(t0, e.Weights(t0, pods))
	for k := range 3 {
		res := cycle(e, pods, steadyObs(t0.Add(time.Duration(k+1)*quiet), e.live, speed, 100, true))
		sum := uint64(0)
		for _, w := range res.Weights {
			sum += uint64(w)
		}
		if sum >= math.MaxUint32 {
			t.Fatalf("cycle %d: sum %d reaches 2^32-1", k+1, sum)
		}
	}
}

func TestOrderOfPodsDoesNotMatter(t *testing.T) {
	pods := []Pod{{Name: "c", HardwareClass: "x"}, {Name: "a", HardwareClass: "y"}, {Name: "b"}, {Name: "a", HardwareClass: "y"}}
	reversed := []Pod{pods[3], pods[2], pods[1], pods[0]}
	speed := map[string]float64{"a": 1, "b": 2, "c": 3}
	e1, e2 := New(DefaultParams()), New(DefaultParams())
	e1.Applied(t0, e1.Weights(t0, pods))
	e2.Applied(t0, e2.Weights(t0, reversed))
	for k := range 4 {
		at := t0.Add(time.Duration(k+1) * 40 * time.Second)
		r1 := cycle(e1, pods, steadyObs(at, e1.live, speed, 2, k%2 == 0))
		r2 := cycle(e2, reversed, steadyObs(at, e2.live, speed, 2, k%2 == 0))
		if fmt.Sprint(r1) != fmt.Sprint(r2) {
			t.Fatalf("cycle %d differs:\n%v\n%v", k+1, r1, r2)
		}
	}
}

// Two pods of one name that differ in any field of Pod resolve to the same
// one whatever their order: every field is part of canonicalPods' key (a
// field added without it made results depend on pod order, which
// FuzzUpdate found).
func TestCanonicalPodsIgnoresOrderForEveryField(t *testing.T) {
	typ := reflect.TypeFor[Pod]()
	for i := range typ.NumField() {
		field := typ.Field(i)
		if field.Name == "Name" {
			continue
		}
		t.Run(field.Name, func(t *testing.T) {
			a, b := Pod{Name: "dup"}, Pod{Name: "dup"}
			f := reflect.ValueOf(&b).Elem().Field(i)
			switch f.Kind() {
			case reflect.String:
				f.SetString("x")
			case reflect.Float64:
				f.SetFloat(2)
			case reflect.Struct: // time.Time
				f.Set(reflect.ValueOf(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
			default:
				t.Fatalf("field %s of kind %s: teach this test to set it", field.Name, f.Kind())
			}
			one, other := canonicalPods([]Pod{a, b}), canonicalPods([]Pod{b, a})
			if len(one) != 1 || !reflect.DeepEqual(one, other) {
				t.Errorf("canonicalPods kept %+v for one order and %+v for the other", one, other)
			}
		})
	}
}

func TestLoadNarrowing(t *testing.T) {
	for _, tc := range []struct {
		rho  float64
		want float64
	}{
		{0, 1},
		{0.5, 1},
		{0.7, 1},
		{0.75, (0.25 / 0.75) / (0.3 / 0.7)},
		{0.8, (0.2 / 0.8) / (0.3 / 0.7)},
		{0.85, 0.5}, // 0.41, floored at minLoadBand
		{0.95, 0.5},
		{1.3, 0.5}, // overloaded
		{math.NaN(), 1},
		{math.Inf(1), 1},
		{-1, 1},
	} {
		if got := loadNarrowing(tc.rho); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("loadNarrowing(%v) = %v, want %v", tc.rho, got, tc.want)
		}
	}
}

// TestDeadBandNarrowsNearCapacity: a capacity change smaller than the dead
// band is left alone at moderate load and written near capacity, where a
// weight a few percent high is a queue.
func TestDeadBandNarrowsNearCapacity(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	pods := podsNamed(names...)
	for i := range pods {
		pods[i].Cores = 2
	}
	speed := map[string]float64{"a": 1, "b": 1, "c": 0.5, "d": 0.5}
	for _, tc := range []struct {
		name         string
		cpu          float64 // of the pods' 8 cores
		withRequests bool
		wantWrite    bool
		wantBand     string
	}{
		{"50% load", 4, true, false, "inside the 5% dead band"},
		{"85% load", 6.8, true, true, "2.5% dead band (5% narrowed at 85% load)"},
		{"50% load, CPU alone", 4, false, false, "inside the 5% dead band"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := New(capacityParams())
			now := t0
			e.Applied(now, e.Weights(now, pods))
			for range 12 {
				now = now.Add(quiet)
				cycle(e, pods, steadyObs(now, e.live, speed, tc.cpu, tc.withRequests))
			}
			res := cycle(e, pods, steadyObs(now.Add(quiet), e.live, speed, tc.cpu, tc.withRequests))
			now = now.Add(quiet)
			if res.Mode != ModeSteady || !strings.Contains(res.Message, tc.wantBand) {
				t.Fatalf("before the change: %s %q, want Steady with %q", res.Mode, res.Message, tc.wantBand)
			}
			// a's capacity rises by 3.5%: its target moves up by about
			// 2.4% and the others' down by about 1.2%. Near capacity with
			// request rates that is written (past the narrowed band, or a
			// quarter of it once the new estimates are due their
			// refinement); at 50% load it is not.
			drifted := maps.Clone(speed)
			drifted["a"] *= 1.035
			wrote := false
			for range 12 {
				now = now.Add(quiet)
				if res := cycle(e, pods, steadyObs(now, e.live, drifted, tc.cpu, tc.withRequests)); res.Changed {
					wrote = true
				}
			}
			if wrote != tc.wantWrite {
				t.Errorf("a 3.5%% capacity change written: %v, want %v", wrote, tc.wantWrite)
			}
		})
	}
}

// TestMoveBandsNarrowByLoad: one engine's write bands at 85% and at 60%
// load differ by exactly the narrowed part of the dead band (a quarter of
// it for a pod due its refinement), with request rates or CPU alone; the
// noise term is the same.
func TestMoveBandsNarrowByLoad(t *testing.T) {
	pods := podsNamed("a", "b", "c", "d")
	for i := range pods {
		pods[i].Cores = 2
	}
	speed := map[string]float64{"a": 1, "b": 1, "c": 0.5, "d": 0.5}
	e, now := learned(t, capacityParams(), pods, speed)
	for range 30 { // until the averaged load has settled
		now = now.Add(quiet)
		cycle(e, pods, steadyObs(now, e.live, speed, 4, true))
	}
	// 4 busy cores of 8: 50% load.
	if got := e.serviceLoad(pods); math.Abs(got-0.5) > 0.01 {
		t.Fatalf("serviceLoad = %v, want 0.5", got)
	}
	e.offered *= 0.85 / 0.5
	high := e.moveBands(pods)
	if f := loadNarrowing(e.serviceLoad(pods)); f != minLoadBand {
		t.Fatalf("factor at 85%% = %v, want %v", f, minLoadBand)
	}
	e.offered *= 0.6 / 0.85
	low := e.moveBands(pods)
	for i, pod := range pods {
		want := e.params.DeadBand * (1 - minLoadBand)
		if e.refinable(e.pods[pod.Name]) {
			want /= 4
		}
		if d := low[i] - high[i]; math.Abs(d-want) > 1e-12 {
			t.Errorf("%s: band at 60%% minus band at 85%% = %v, want %v", pod.Name, d, want)
		}
	}
	e.requestsLately = 0 // CPU alone
	e.offered *= 0.85 / 0.6
	for i, b := range e.moveBands(pods) {
		if b != high[i] {
			t.Errorf("CPU alone at 85%%: %s's band %v, want %v as with request rates", pods[i].Name, b, high[i])
		}
	}
}

// TestServiceLoadNeedsEveryPodsCores: the load is busy cores over cores
// (weighted by speed per core) across pods of unequal cores, and unknown
// (0, so no narrowing) while any pod's cores are.
func TestServiceLoadNeedsEveryPodsCores(t *testing.T) {
	pods := podsNamed("a", "b", "c")
	pods[0].Cores, pods[1].Cores, pods[2].Cores = 1, 2, 4
	speed := map[string]float64{"a": 1, "b": 1, "c": 1}
	e, _ := learned(t, capacityParams(), pods, speed)
	// learned ran at 4 busy cores of 7.
	if got := e.serviceLoad(pods); math.Abs(got-4.0/7) > 1e-6 {
		t.Errorf("serviceLoad = %v, want %v", got, 4.0/7)
	}
	unknown := slices.Clone(pods)
	unknown[2].Cores = 0 // no limit, no request, no node: nothing bounds it
	if got := e.serviceLoad(unknown); got != 0 {
		t.Errorf("serviceLoad with a pod of unknown cores = %v, want 0", got)
	}
	if f := loadNarrowing(e.serviceLoad(unknown)); f != 1 {
		t.Errorf("factor with a pod of unknown cores = %v, want 1", f)
	}
}
