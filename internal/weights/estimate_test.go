package weights

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// spreadVariance measures the readings' spread, not their distance from
// the estimate, and survives a value that repeats.
func TestSpreadVariance(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gauss := make([]float64, 400)
	for i := range gauss {
		gauss[i] = 0.05 * rng.NormFloat64()
	}
	shifted := make([]float64, len(gauss))
	for i, x := range gauss {
		shifted[i] = x + 0.1 // an estimate 10% off
	}
	// Half the readings clamped at the same bound, the others below it.
	clamped := make([]float64, len(gauss))
	for i, x := range gauss {
		clamped[i] = min(x, 0)
	}
	for _, tc := range []struct {
		name   string
		xs     []float64
		lo, hi float64 // the standard deviation it must read
	}{
		{"gaussian", gauss, 0.045, 0.055},
		{"offset by twice the spread", shifted, 0.045, 0.055},
		{"half clamped at one value", clamped, 0.02, 0.05},
		{"fewer than three", []float64{0.3, -0.3}, 0, 0},
	} {
		got := math.Sqrt(spreadVariance(tc.xs))
		if got < tc.lo || got > tc.hi {
			t.Errorf("%s: spread %.4f, want %.3f-%.3f", tc.name, got, tc.lo, tc.hi)
		}
	}
	// The measure it replaces for the cores: about zero, the offset counts
	// as noise; about the median, the clamped half makes it vanish.
	if got := math.Sqrt(robustVariance(shifted)); got < 0.1 {
		t.Errorf("about zero the offset should read as noise: %.4f", got)
	}
}

// A reading clamped at a bound cannot restart a filter on its own; the
// same distance measured can.
func TestBoundedReadingDoesNotRestartAlone(t *testing.T) {
	p := DefaultParams()
	r := 1e-4
	settled := filter{m: 0, v: p.Smoothing * r, known: true, n: 20}
	for _, bounded := range []bool{false, true} {
		f := settled
		restarted := f.update(-0.15, -0.15, r, 0, 1, p, bounded, true)
		if restarted == bounded {
			t.Errorf("bounded %v: restarted %v", bounded, restarted)
		}
		if bounded && !(f.m < 0 && f.m > -0.15*p.Smoothing*2) {
			t.Errorf("bounded: moved to %.4f, want a step of about Smoothing toward -0.15", f.m)
		}
	}
}

// A no-limit pod's cores estimate that starts off (from its node's idle
// CPU, noisy and 7% high, read before its latency could show its cores)
// comes to its latency's readings once they outnumber the old ones (the
// CUSUM restarts it), not at Smoothing's pace: a steady offset is not
// taken for noise.
func TestCoresOffsetIsCorrected(t *testing.T) {
	e := New(DefaultParams())
	pod := Pod{Name: "p", Node: "n", NodeCores: 16}
	set := []Pod{pod}
	rng := rand.New(rand.NewPCG(3, 4))
	read := func(c reading) { e.updateCores(set, &cycleReadings{pods: []reading{c}}) }
	for range 10 {
		read(reading{nodeCeiling: 2.14 * math.Exp(0.07*rng.NormFloat64())})
	}
	closest := math.Inf(1)
	for range 20 { // ten minutes of cycles at 30 s
		read(reading{cores: 2 * math.Exp(0.02*rng.NormFloat64())})
		closest = min(closest, math.Abs(math.Exp(e.pods["p"].cores.m)/2-1))
	}
	// With the noise measured about the estimate it stays 6.6% off.
	if closest > 0.01 {
		t.Errorf("in ten minutes of readings at 2 cores the estimate came no closer than %.1f%%", 100*closest)
	}
}

// At a first opt-in nothing has measured how noisy a pod's cores readings
// are, and its first readings are taken at the speed readings' noise (a
// percent), though the node's ceiling they may come from is often a tenth
// off. The estimate's variance counts readings in the units of their
// noise: as the pod's own residuals show their scatter, it is restated in
// it, and the readings that follow outweigh the first ones as in a mean.
// Without that, the first readings weighed as many, and the estimate crept
// at Smoothing's pace. The readings below are a fast pod's of 2 cores in a
// Service at 90% load without limits, as the bench recorded them: three
// ceilings while the weights moved, then its latency's. It stayed 3% high
// for ten minutes, was sent more than its peers, and fell behind twice.
func TestFirstCoresReadingsAreRestatedInTheMeasuredNoise(t *testing.T) {
	e := New(DefaultParams())
	pod := Pod{Name: "p", Node: "n", NodeCores: 16}
	set := []Pod{pod}
	e.meanCycle = 28 * time.Second // a cycle every 30 s or so over a 1 min window: readings overlap
	for i, r := range []struct {
		cores, ceiling float64
		bounded        bool
	}{
		{1.085, 3.058, false}, {0, 2.221, false}, {0, 2.077, false}, {0, 2.081, false},
		{2.062, 2.070, false}, {2.013, 2.046, false}, {2.005, 2.077, false}, {2.002, 2.002, true},
		{1.922, 1.876, true}, {1.989, 1.989, true}, {2.045, 2.061, false}, {1.927, 1.921, true},
		{1.921, 1.921, true}, {2.046, 2.053, false}, {2.059, 2.122, false}, {2.049, 2.078, false},
	} {
		if i == 4 {
			e.noise = 0.025 // the speed readings' noise, measured by then
		}
		e.updateCores(set, &cycleReadings{pods: []reading{{cores: r.cores, coresBounded: r.bounded, nodeCeiling: r.ceiling}}})
	}
	if off := math.Exp(e.pods["p"].cores.m)/2 - 1; math.Abs(off) > 0.02 {
		t.Errorf("after twelve readings of its latency at about 2 cores, the estimate is %+.1f%% off", 100*off)
	}
}

// A pod at its limit serves all it can, so sent minus served is its queue's
// growth; but a shortfall within a Poisson count's noise starts no backlog
// there, while one that started is followed until it clears.
func TestSaturatedBacklogStartsOnlyOnASignificantShortfall(t *testing.T) {
	p := DefaultParams()
	p.ScrapeInterval = 0 // rates aligned: only the count's noise
	w := p.QueryWindow.Seconds()
	// Ten pods of equal share 0.1; nine keep up and serve 100/s each.
	reads := func(served float64) *cycleReadings {
		c := &cycleReadings{fromRequests: true}
		for i := range 10 {
			r := reading{hasCPU: true, cpu: 1, hasRequests: true, requests: 100, shareOK: true, shareLo: 0.1, shareHi: 0.1, limit: 2}
			if i == 0 {
				r.requests, r.cpu, r.saturated = served, 2, true
			}
			c.pods = append(c.pods, r)
		}
		return c
	}
	set := make([]Pod, 10)
	for i := range set {
		set[i] = Pod{Name: string(rune('a' + i))}
	}
	for _, tc := range []struct {
		name   string
		served float64 // requests/s at the saturated pod, sent 100/s
		before float64
		want   func(q float64) bool
	}{
		// 0.5/s short over a minute is 30 requests, against a Poisson
		// spread of about 77: noise. 10/s short is 600, 8 spreads.
		{"noise, none before", 99.5, 0, func(q float64) bool { return q == 0 }},
		{"noise, one already", 99.5, 200, func(q float64) bool { return math.Abs(q-(200+0.5*w)) < 1e-6 }},
		{"a real shortfall", 90, 0, func(q float64) bool { return math.Abs(q-10*w) < 1e-6 }},
	} {
		c := reads(tc.served)
		mem := make([]backlogMemory, 10)
		mem[0].before = tc.before
		readBacklogs(p, set, c, mem, true)
		if q := c.pods[0].backlog; !tc.want(q) {
			t.Errorf("%s: backlog %.1f", tc.name, q)
		}
	}
}

// A no-limit pod's cores estimate that rests on one reading (the first, or
// the first after a restart of its filter) is not confidence for Learned;
// after a second reading it is. The publish bar's settled variance does not
// change with it.
func TestOneCoresReadingIsNotConfidence(t *testing.T) {
	pod := Pod{Name: "p", Node: "n", CPURequest: 1, NodeCores: 4}
	e := New(DefaultParams())
	st := e.state(pod.Name)
	st.speed = filter{m: 0, v: 1e-5, known: true, n: 20}
	st.fromData = true
	st.coresNode = pod.Node
	r := e.noise * e.noise
	st.cores = filter{}
	st.cores.update(math.Log(2), math.Log(2), r, 0, 1, e.params, false, true)
	one := e.models([]Pod{pod})[0]
	if math.Sqrt(one.logVar) <= e.params.DeadBand {
		t.Errorf("one cores reading: sd %.4f within the dead band %.2f", math.Sqrt(one.logVar), e.params.DeadBand)
	}
	st.cores.update(math.Log(2), math.Log(2), r, 0, 1, e.params, false, true)
	two := e.models([]Pod{pod})[0]
	if math.Sqrt(two.logVar) > e.params.DeadBand {
		t.Errorf("two cores readings: sd %.4f past the dead band %.2f", math.Sqrt(two.logVar), e.params.DeadBand)
	}
	if one.barVar != two.barVar {
		t.Errorf("the bar's variance moved with the count: %g -> %g", one.barVar, two.barVar)
	}
}

// A pod without a limit reads its cores from its latency, or, over a
// window whose share moved, from its node's ceiling (its CPU plus what the
// node leaves idle), which carries the noise of every neighbour on the
// node. A ceiling reading one of its own standard deviations off a
// settled estimate is noise: judged by the latency readings' spread
// (a hundredth) it was a jump of 16 of theirs and restarted the estimate
// at the ceiling. In the calm harness (six pods, ±20% on the node CPU,
// recent CPU queried, 200 cycles after 200) that was a cascade, each write
// moving the next window's share so that its reading was a ceiling again:
// 13 and 14 writes in 16 runs each at 70% and 80% load, up to 9 in one;
// judged by its own spread: 6 and 6, at most 3 (what is left: latency
// readings clamped at the noisy ceiling, docs/troubleshooting.md).
func TestCeilingReadingJudgedByItsOwnScatter(t *testing.T) {
	set := []Pod{{Name: "p", Node: "n", CPURequest: 4, NodeCores: 9}}
	e := New(DefaultParams())
	rng := rand.New(rand.NewPCG(1, 2))
	for range 40 {
		c := cycleReadings{pods: []reading{{
			cores:       8 * math.Exp(0.01*rng.NormFloat64()),
			nodeCeiling: 8 * math.Exp(0.2*rng.NormFloat64()),
		}}}
		e.updateCores(set, &c)
	}
	before := e.pods["p"].cores
	c := cycleReadings{pods: []reading{{nodeCeiling: math.Exp(before.m + 0.2)}}}
	e.updateCores(set, &c)
	after := e.pods["p"].cores
	if after.changed && !before.changed || after.n < before.n {
		t.Fatalf("a ceiling reading within its own noise restarted the cores estimate: %.2f -> %.2f cores", math.Exp(before.m), math.Exp(after.m))
	}
	if move := math.Abs(after.m - before.m); move > 0.02 {
		t.Errorf("a ceiling reading within its own noise moved the cores estimate by %.1f%%", 100*move)
	}
	// A ceiling that stays at half the estimate (the node's neighbours
	// took half of it) is a change, found by the CUSUM within the
	// estimates' memory (about six readings of three of their standard
	// deviations each, against twice zSigmas).
	half := math.Exp(after.m) / 2
	for k := range DefaultParams().memory() {
		c = cycleReadings{pods: []reading{{nodeCeiling: half}}}
		e.updateCores(set, &c)
		if got := e.pods["p"].cores; got.changed && math.Exp(got.m) < 0.6*math.Exp(after.m) {
			t.Logf("followed a halved ceiling at reading %d", k+1)
			return
		}
	}
	t.Errorf("a ceiling at half the estimate for %d readings left it at %.2f cores", DefaultParams().memory(), math.Exp(e.pods["p"].cores.m))
}

// A pod's first speed reading is taken at the prior's percent of noise,
// though the readings turn out ten times noisier (few requests per window,
// long ones). As the noise is measured the estimate's variance is restated
// in it, so the readings that follow outweigh the first one as in a mean.
// Without that the first reading weighed as about eighty, the estimate crept
// at a percent a cycle, and the weights were held about 15% off on a pod
// no different from its peers while the bar, measured in the real noise,
// kept them there (1-core pods at 50 ms a request: 1.54x the best static
// weights' p99 instead of 1.32x).
func TestFirstSpeedReadingsAreRestatedInTheMeasuredNoise(t *testing.T) {
	e := New(DefaultParams())
	set := []Pod{{Name: "a"}, {Name: "b"}, {Name: "c"}, {Name: "d"}, {Name: "p"}}
	at := func(p float64) *cycleReadings { return speedReadings(len(set), 4, p) }
	e.estimate(set, at(0.15), true) // 15% high: one draw of a noisy reading
	e.noise = 0.09                  // the readings' noise, measured by the next cycles
	for _, p := range []float64{0.08, -0.1, 0.05, -0.07, 0.1, -0.06, 0.02, -0.03} {
		e.estimate(set, at(p), true)
	}
	others := 0.0
	for _, name := range []string{"a", "b", "c", "d"} {
		others += e.pods[name].speed.m / 4
	}
	if off := e.pods["p"].speed.m - others; math.Abs(off) > 0.04 {
		t.Errorf("after eight readings about its peers' speed, the pod is estimated %+.1f%% off (log)", 100*off)
	}
}

// The load is past the cap when it is at least maxUtilisation of the
// models' capacity, and only where the load is known.
func TestPastCap(t *testing.T) {
	models := []podModel{{c: 2, v: 1}, {c: 2, v: 0.5}} // capacity 3
	for _, c := range []struct {
		load, want float64
	}{
		{0, 0}, {math.NaN(), 0}, {0.9 * 3, 0}, {maxUtilisation * 3, maxUtilisation}, {0.95 * 3, 0.95}, {4, 4.0 / 3},
	} {
		if got := pastCap(models, c.load); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("load %v of capacity 3: %v, want %v", c.load, got, c.want)
		}
	}
	if got := pastCap(nil, 1); got != 0 {
		t.Errorf("no pods: %v", got)
	}
}

// A no-limit pod's second cores reading, judged against the prior's
// percent because nothing has measured its own noise yet, often jumps:
// the estimate follows it, but it is not a change the weights must
// follow past the dead band. Once the pod's residuals show its noise, a
// jump past it is one.
func TestCoresJumpAgainstAnUnmeasuredNoiseIsNoChange(t *testing.T) {
	e := New(DefaultParams())
	pod := Pod{Name: "p", Node: "n", NodeCores: 16}
	set := []Pod{pod}
	read := func(cores float64) { e.updateCores(set, &cycleReadings{pods: []reading{{cores: cores}}}) }
	read(2)
	read(2.8) // 40% off, judged against a percent's noise: restarts the filter
	st := e.pods["p"]
	if got := math.Exp(st.cores.m); math.Abs(got/2.8-1) > 0.01 {
		t.Fatalf("after a jump to 2.8 cores the estimate is %.2f, want it restarted at the reading", got)
	}
	if st.cores.changed {
		t.Errorf("a jump judged against the prior's noise counts as a change")
	}
	if e.followingChange(set) {
		t.Errorf("the weights follow a jump judged against the prior's noise past the dead band")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 12 {
		read(2.8 * math.Exp(0.02*rng.NormFloat64()))
	}
	if st.cores.changed {
		t.Fatalf("steady readings restarted the filter")
	}
	read(2.8 * 2) // a jump past the measured noise: the pod changed
	if !st.cores.changed || !e.followingChange(set) {
		t.Errorf("a jump to twice the cores past the measured noise is not followed as a change (changed %v)", st.cores.changed)
	}

	// After a restart the snapshot's noise (measured over the Service's
	// pods by the engine before) is a measured one: the same jump at a
	// second reading is a change.
	e = New(DefaultParams())
	e.coresNoise = 0.02
	read(2)
	read(2.8)
	if st := e.pods["p"]; !st.cores.changed {
		t.Errorf("a jump of 40%% judged against the snapshot's 2%% noise is not a change")
	}
}

// A speed estimate restarted against the prior's noise, before any cycle
// measured the readings' noise, is no change to follow past the dead band;
// once a cycle has measured it (or a snapshot brought it), the same
// restart is one. Two restarts: a jump, and a bound far under the estimate
// from a pod at its limit (CPU alone), which restarts it below the bound.
// Two pods never measure the noise (measureNoise needs three narrow
// readings), so without the rule every restart of their estimates kept the
// dead band off for the filter's memory. Near full load on CPU alone the
// first cycles put pods at their limit with bounds 4-10% under estimates
// still being learned: followed as changes, they let small refinements be
// written after the weights had settled. (The scale fit splits a jump
// between the two pods: each moves by half of it.)
func TestRestartAgainstAnUnmeasuredNoiseIsNoChange(t *testing.T) {
	set := []Pod{{Name: "a"}, {Name: "p"}}
	bound := func() *cycleReadings {
		c := speedReadings(len(set), 1, -0.1) // at its limit: at most 10% slower
		c.pods[1].speed.upper = true
		return c
	}
	for _, tc := range []struct {
		name string
		last func() *cycleReadings // the fifth cycle's, after four at 0
		dir  float64               // which side of its peer the restart puts p
		gap  float64               // how far, at least (log)
	}{
		{"a jump 35% faster", func() *cycleReadings { return speedReadings(len(set), 1, 0.3) }, 1, 0.25},
		{"a bound 10% slower at its limit", bound, -1, 0.05},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(e *Engine) (gap float64, changed, following bool) {
				for range 4 {
					e.estimate(set, speedReadings(len(set), 1, 0), false)
				}
				e.estimate(set, tc.last(), false)
				st := e.pods["p"]
				return tc.dir * (st.speed.m - e.pods["a"].speed.m), st.speed.changed, e.followingChange(set)
			}
			e := New(DefaultParams())
			gap, changed, following := run(e)
			if e.noiseCycles != 0 {
				t.Fatalf("two pods measured the noise (%d cycles): no test", e.noiseCycles)
			}
			if gap < tc.gap {
				t.Fatalf("the estimate is %.3f from its peer's, want it restarted at least %.2f away", gap, tc.gap)
			}
			if changed || following {
				t.Errorf("judged against the prior's noise it is followed as a change (changed %v, following %v)", changed, following)
			}

			e = New(DefaultParams())
			e.noiseCycles = 1 // the same 1%, measured by a cycle (or a snapshot's)
			gap, changed, following = run(e)
			if !changed || !following {
				t.Errorf("against a measured 1%% noise it is not followed as a change (%.3f from its peer, changed %v, following %v)", gap, changed, following)
			}
		})
	}
}

// speedReadings is a cycle's readings for n pods, each with a speed
// reading of 0 (log) but pod i's, at p.
func speedReadings(n, i int, p float64) *cycleReadings {
	c := &cycleReadings{pods: make([]reading, n)}
	for k := range c.pods {
		c.pods[k].speed.ok = true
	}
	c.pods[i].speed.lo, c.pods[i].speed.hi = p, p
	return c
}

// A speed reading resting on fewer requests than the median pod's has the
// count noise of the difference (1/n for exponential work), at most what
// the measured noise allows the median pod's work to vary; none on CPU
// alone, for a pod sent more than the median, or before any noise is
// measured.
func TestCountNoise(t *testing.T) {
	const window = 60.0
	pods := func(fromRequests bool, rates ...float64) *cycleReadings {
		c := &cycleReadings{fromRequests: fromRequests}
		for _, rate := range rates {
			rd := reading{requests: rate, hasRequests: true}
			rd.speed.ok = true
			c.pods = append(c.pods, rd)
		}
		return c
	}
	tests := map[string]struct {
		c          *cycleReadings
		r          float64
		unmeasured bool
		noSpeed    int // a pod without a speed reading, when above 0
		want       []float64
	}{
		// 100, 100 and 1 request a second: 6000, 6000 and 60 a window.
		"a pod at the floor": {c: pods(true, 100, 100, 1), r: 0.0009,
			want: []float64{0, 0, 1.0/60 - 1.0/6000}},
		// The median pod's noise, 1e-4 (the least the engine takes), is
		// less than its 1/6000: its work varies less than exponential
		// (cv² 0.6), and so the floored pod's.
		"work steadier than exponential": {c: pods(true, 100, 100, 1), r: 1e-4,
			want: []float64{0, 0, 0.6 * (1.0/60 - 1.0/6000)}},
		"a pod sent more than the median": {c: pods(true, 10, 100, 1000), r: 0.0009,
			want: []float64{1.0/600 - 1.0/6000, 0, 0}},
		// A rate extrapolated below one request a window rests on one.
		"less than a request a window": {c: pods(true, 100, 100, 1e-300), r: 0.0009,
			want: []float64{0, 0, 1 - 1.0/6000}},
		// A pod without a speed reading is not in the median (with it, the
		// median would be 33 000, not 60 000) and gets no count noise.
		"a pod without a reading": {c: pods(true, 1000, 1000, 100, 1), r: 0.0009, noSpeed: 3,
			want: []float64{0, 0, 1.0/6000 - 1.0/60000, 0}},
		"CPU alone":         {c: pods(false, 100, 100, 1), r: 0.0009, want: []float64{0, 0, 0}},
		"no noise measured": {c: pods(true, 100, 100, 1), r: 0.0009, unmeasured: true, want: []float64{0, 0, 0}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.noSpeed > 0 {
				tc.c.pods[tc.noSpeed].speed.ok = false
			}
			countNoise(tc.c, window, tc.r, tc.unmeasured)
			for i, want := range tc.want {
				if got := tc.c.pods[i].countVar; math.Abs(got-want) > 1e-12 {
					t.Errorf("pod %d: countVar %g, want %g", i, got, want)
				}
			}
		})
	}
}

// After a restart a pod's cores readings are judged by the noisiest pod's
// noise the manager before measured (Snapshot.CoresNoiseMax) until the
// pod's own readings measure its own: the typical pod's can be a third of
// a pod's whose cores are a small part of its node. Five pods without a
// limit, four read to 2%, one to 12%; after a restart the noisy pod's
// second reading, 30% above its first (within 4 standard deviations of
// the difference of two of its readings at the noise measured of them),
// is noise, not a change of cores. Judged by the typical pod's noise it
// was a jump, and on CPU alone at 80% load such a jump moved a weight by
// 47% in the restart's third cycle. The restart's settled estimate keeps
// the typical noise. Over 200 runs of a memory of readings after a
// restart, the noisy pod's cores restart in 11 (none without a restart:
// the snapshot's spread of its residuals, 0.06, is half its true noise,
// for the readings that restarted the filter are left out of them);
// judged by the typical noise, in 165; judged by the noisiest pod's only
// until the pod's first three residuals, whose spread is often small by
// chance, in 34.
func TestRestartJudgesCoresByTheNoisiestPod(t *testing.T) {
	var set []Pod
	live := map[string]uint32{}
	for i := range 5 {
		name := fmt.Sprintf("p%d", i)
		set = append(set, Pod{Name: name, Node: "n" + name, CPURequest: 2, NodeCores: 16})
		live[name] = 1000
	}
	noise := []float64{0.02, 0.02, 0.02, 0.02, 0.12}
	rng := rand.New(rand.NewPCG(3, 4))
	readings := func() *cycleReadings {
		c := &cycleReadings{pods: make([]reading, len(set))}
		for i := range set {
			c.pods[i].cores = 4 * math.Exp(noise[i]*rng.NormFloat64())
		}
		return c
	}
	e := New(DefaultParams())
	e.noise, e.noiseCycles = 0.02, 20
	for range 40 {
		e.updateCores(set, readings())
	}
	snap := e.Snapshot()
	if snap.CoresNoise > 0.03 || snap.CoresNoiseMax < 2*snap.CoresNoise {
		t.Fatalf("snapshot's cores noise %.3f (typical) and %.3f (noisiest), want the quiet pods' and the noisy one's", snap.CoresNoise, snap.CoresNoiseMax)
	}
	for _, c := range []struct {
		name  string
		max   float64
		jumps bool
	}{{"noisiest pod's noise kept", snap.CoresNoiseMax, false}, {"typical noise only", 0, true}} {
		s := snap
		s.CoresNoiseMax = c.max
		r := New(DefaultParams())
		r.SeedSettled(time.Unix(0, 0), live, s)
		first := &cycleReadings{pods: make([]reading, len(set))}
		for i := range set {
			first.pods[i].cores = 4
		}
		r.updateCores(set, first)
		// The settled estimate is as sure as the typical pod's: as wide
		// as the noisiest pod's, it could fall short of Learned and flip
		// the balancer on a restart.
		if v, typical := r.pods["p4"].cores.v, r.params.Smoothing*max(sq(r.noise), sq(s.CoresNoise)); v > typical*1.001 {
			t.Errorf("%s: the restart's settled cores estimate has variance %.2g, want the typical pod's %.2g", c.name, v, typical)
		}
		first.pods[4].cores = 4 * math.Exp(0.3)
		r.updateCores(set, first)
		st := r.pods["p4"].cores
		if restarted := st.n == 1; restarted != c.jumps {
			t.Errorf("%s: a reading 30%% above the first restarted the noisy pod's cores %v, want %v (now %.2f cores)", c.name, restarted, c.jumps, math.Exp(st.m))
		}
	}

	// Over many runs, in the memory of readings after a restart.
	const runs = 200
	restarts := map[string]int{}
	for seed := range uint64(runs) {
		rng = rand.New(rand.NewPCG(seed, 5))
		e := New(DefaultParams())
		e.noise, e.noiseCycles = 0.02, 20
		for range 40 {
			e.updateCores(set, readings())
		}
		snap := e.Snapshot()
		typical := snap
		typical.CoresNoiseMax = 0
		engines := []*Engine{e, New(DefaultParams()), New(DefaultParams())}
		engines[1].SeedSettled(time.Unix(0, 0), live, snap)
		engines[2].SeedSettled(time.Unix(0, 0), live, typical)
		for k, how := range []string{"no restart", "restart", "restart, typical noise only"} {
			for range DefaultParams().memory() {
				engines[k].updateCores(set, readings())
				if engines[k].pods["p4"].cores.n == 1 {
					restarts[how]++
					break
				}
			}
		}
	}
	t.Logf("of %d runs, the noisy pod's cores restarted within a memory in %v", runs, restarts)
	if restarts["restart"] > runs/10 || restarts["restart"] > restarts["restart, typical noise only"]/4 {
		t.Errorf("of %d runs, the noisy pod's cores restarted within a memory after a restart in %d, want at most %d and a quarter of the %d judged by the typical noise (%d without a restart)",
			runs, restarts["restart"], runs/10, restarts["restart, typical noise only"], restarts["no restart"])
	}
}

// A bound at a pod's CPU limit counts in the scale with both its ends:
// the bound and minus infinity. Four pods read 0-15% above their
// estimates (their CPU read low), two read at their limit with bounds 10%
// under theirs: the scale is the median of all the ends, 2.5%, not the
// unbounded readings' 7.5%, which would put the bounds 17.5% under their
// estimates. A bound of a pod whose estimate rests on bounds alone (no
// narrow reading since its last restart) says nothing of the scale and is
// left out, as is a pod's without a limit (its bound is its own reading,
// flagged because it read high); where every reading is a bound, the
// bounds set it, and they do where they are as many as the readings.
func TestFitScaleCountsBoundsAtALimit(t *testing.T) {
	scale := func(offsets []float64, bounds []float64, limited, measured bool) float64 {
		e := New(DefaultParams())
		var set []Pod
		c := &cycleReadings{}
		add := func(lo, hi float64, upper bool) {
			name := fmt.Sprintf("pod-%d", len(set))
			pod := Pod{Name: name}
			if limited {
				pod.Cores = 2
			} else {
				pod.CPURequest, pod.NodeCores = 1, 4
			}
			set = append(set, pod)
			st := e.state(name)
			st.speed.known, st.speed.m = true, 0.3*float64(len(set)%3) // the estimates differ; the readings are relative to them
			if !upper || measured {
				st.speed.n = 5
			}
			var rd reading
			rd.speed.ok, rd.speed.upper = true, upper
			rd.speed.lo, rd.speed.hi = st.speed.m+lo, st.speed.m+hi
			c.pods = append(c.pods, rd)
		}
		for _, d := range offsets {
			add(d, d, false)
		}
		for _, b := range bounds {
			add(b, b, true)
		}
		return e.fitScale(set, c)
	}
	readings, bounds := []float64{0, 0.05, 0.1, 0.15}, []float64{-0.1, -0.1}
	for _, tc := range []struct {
		name              string
		readings          []float64
		limited, measured bool
		want              float64
	}{
		{"bounds at a limit of measured estimates count", readings, true, true, 0.025},
		{"bounds of estimates from bounds alone do not", readings, true, false, 0.075},
		{"bounds of pods without a limit do not", readings, false, true, 0.075},
		{"every reading a bound", nil, true, true, -0.1},
		// As many bounds as readings: the bounds set it (see fitScale).
		{"bounds as many as the readings", []float64{0.1}, true, true, -0.1},
	} {
		if got := scale(tc.readings, bounds, tc.limited, tc.measured); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s: scale %.4f, want %.4f", tc.name, got, tc.want)
		}
	}
}

// A cores reading clamped at a no-limit pod's node ceiling is marked so
// (updateCores judges it by the ceiling's noise), and one clamped at the
// pod's CPU request or node size is not: a request above the ceiling
// (a pod using less than its request on a busy node) is a floor the
// reading is held to, not the node's noisy figure.
func TestCoresClampedAtTheCeiling(t *testing.T) {
	for _, tc := range []struct {
		name      string
		request   float64
		node      float64
		limit     float64 // the ceiling: the pod's CPU plus its share of the node's idle CPU
		want      float64
		atCeiling bool
	}{
		{"clamped at the ceiling", 2, 9, 3.5, 3.5, true},
		{"held at a request above the ceiling", 4, 9, 3.5, 4, false},
		{"clamped at the node's size, no ceiling read", 2, 5, 0, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := Pod{Name: "a", CPURequest: tc.request, NodeCores: tc.node}
			cpu, requests := 3.0, 300.0
			c := cycleReadings{pods: []reading{{
				cpu: cpu, hasCPU: true, requests: requests, hasRequests: true,
				latency: cpu / requests * 1.001, hasLatency: true, // no queue to speak of
				shareOK: true, shareLo: 0.5, shareHi: 0.5, limit: tc.limit,
			}}}
			readCores([]Pod{pod}, &c, 0.01)
			r := c.pods[0]
			if r.cores != tc.want || r.coresAtCeiling != tc.atCeiling || !r.coresBounded {
				t.Errorf("cores %v, at the ceiling %v, bounded %v; want %v, %v, true", r.cores, r.coresAtCeiling, r.coresBounded, tc.want, tc.atCeiling)
			}
		})
	}
}

// mediansWithout gives each value the median of the others, as leaving it
// out and taking the median would, for odd and even counts and ties.
func TestMediansWithout(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 2; n <= 9; n++ {
		for range 50 {
			xs := make([]float64, n)
			for i := range xs {
				xs[i] = float64(rng.IntN(5)) // ties often
			}
			got := mediansWithout(xs)
			for i := range xs {
				want := median(slices.Concat(xs[:i], xs[i+1:]))
				if got[i] != want {
					t.Fatalf("%v without %d: %v, want %v", xs, i, got[i], want)
				}
			}
		}
	}
}
