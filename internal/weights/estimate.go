package weights

import (
	"cmp"
	"maps"
	"math"
	"slices"
)

// Stage 2, estimate: one filter per pod over its log speed per core (and,
// for a pod without a CPU limit, one over its log cores), each a mean and a
// variance. A reading is weighed against the estimate by their variances
// (a Kalman filter over a random walk); the walk's step is set so that a
// settled estimate takes Smoothing of each new reading. The reading's
// noise is measured from the residuals of all pods (a robust median), and
// raised for a pod sent fewer requests than the median pod by their count
// noise (countNoise: such a reading weighs less, and such a filter
// settles to less than Smoothing of each reading); a cores reading's is
// measured from the pod's own residuals (their interquartile range). A
// change that persists past the noise (a CUSUM of the innovations in units
// of their standard deviation) or one reading far outside it restarts the
// filter: its variance is raised to the reading's, so the estimate moves
// fast, then settles. Capacity is speed per core times cores; its variance
// the sum of the two in log scale.

// filter is one estimate: log mean m and its variance v.
type filter struct {
	m, v  float64
	known bool
	// changed: the filter restarted on a change the data showed (a jump,
	// a CUSUM or a censored reading's backoff), not on its first reading,
	// nor on a restart judged against a noise not yet measured (see
	// restart).
	changed bool
	// n counts the narrow readings (narrower than the noise) since the
	// last restart: 1 after a jump's, 0 after a censored reading's
	// backoff; a settled seed starts at the filter's memory.
	n int

	up, down float64 // the CUSUM of innovations above and below, in sds
}

// restart starts f afresh at m with variance v and n narrow readings,
// after a jump, a CUSUM or a censored reading's backoff: a change the
// data showed when the readings' noise it was judged against was measured
// (measured), else the estimate's own error.
func (f *filter) restart(m, v float64, n int, measured bool) {
	f.m, f.v, f.n, f.up, f.down, f.changed = m, v, n, 0, 0, measured
}

// zSigmas is how many standard deviations make a reading news rather than
// noise: for a Gaussian, 4 is passed by chance once in 16 000 draws, once
// in a week of cycles at a 30 s cycle for each pod, which the heavier tails
// of overlapping windows and bursts bring to about a day. The same
// bound judges a jump (twice it), a CUSUM (twice it, with an allowance of
// one), a backlog and a write.
const zSigmas = 4

// minNoise is the least noise (log scale) a reading is taken to have, and
// the noise assumed before any is measured: one unit of the smallest
// weight, the finest difference the weights can express (a percent). It is
// derived, not tuned.
func minNoise() float64 { return 1.0 / smallestWeight }

// boundNoise keeps a noise figure between minNoise and 0.5 (log scale).
// The ceiling is a guard, not a measurement: at 0.5 a jump must already be
// a factor e^(2·zSigmas·0.5) ≈ 55 to show in one reading, so a scatter
// measured above it (load swinging under the windows, not the readings'
// own noise) is not allowed to blind the change tests further.
func boundNoise(x float64) float64 { return min(max(x, minNoise()), 0.5) }

// processVariance is the variance a settled estimate's walk adds per
// reading, relative to the reading's: the steady Kalman gain g of a random
// walk satisfies g²/(1-g) = q/r, so Smoothing = g gives q.
func (p Params) processVariance() float64 {
	g := p.Smoothing
	return g * g / (1 - min(g, 0.999))
}

// update folds a reading [lo, hi] (log, in the estimate's units) of
// variance r+extra into f: r is the readings' noise as measured, extra
// what this one has beyond it for resting on fewer requests (see
// countNoise); the walk's step is set from r alone (processVariance),
// since how fast a pod changes does not depend on how many requests it is
// sent. It reports whether the filter restarted. corr is how
// much more a sum of consecutive innovations varies than independent ones
// would (see overlapInflation): the CUSUM is judged in those units. A
// bounded reading (one clamped at a bound, whose distance from the
// estimate is the bound's noise, not a measurement's) is folded in but
// neither restarts the filter nor counts toward the CUSUM: only a
// measurement can show a change. A restart is marked changed only when r
// was measured (measured): a jump judged against a noise nobody measured
// may be that noise, so the estimate moves, but it is not followed as a
// change past the dead band (see followingChange), and the publish bar
// judges it as an estimate only begun (see models).
func (f *filter) update(lo, hi, r, extra, corr float64, p Params, bounded, measured bool) bool {
	q := p.processVariance() * r
	r += extra
	if !f.known {
		f.m, f.v, f.known, f.n = (lo+hi)/2, r+sq((hi-lo)/2), true, 1
		return false
	}
	f.v += q
	innov := min(max(f.m, lo), hi) - f.m // a reading moves the estimate only as far as its range forces
	s := math.Sqrt(f.v + r)
	z := innov / s
	if !bounded {
		zc := z / math.Sqrt(max(corr, 1))
		f.up = max(0, f.up+zc-1)
		f.down = max(0, f.down-zc-1)
		if math.Abs(z) > 2*zSigmas || f.up > 2*zSigmas || f.down > 2*zSigmas {
			f.restart(f.m+innov, r, 1, measured)
			return true
		}
	}
	g := f.v / (f.v + r)
	f.m += g * innov
	f.v *= 1 - g
	if hi-lo < math.Sqrt(r) { // narrower than its own noise, count noise included
		f.n++
	}
	return false
}

// restate keeps the filter's variance counted in readings when their
// noise is re-measured: the estimate's variance is that of the readings
// it holds, their noise over their count, and was stated in the noise r
// known at its last reading (*was; r becomes it). While the noise is
// still being measured (measuring) the count is restated in the noise as
// measured so far, so that the readings that follow outweigh the first
// ones as in a mean rather than at Smoothing's pace: the first readings
// are taken at the prior's percent, though a reading is often a tenth
// off. Upward only: a noise measured smaller does not make the readings
// already taken surer. Once the noise is measured, its own wander is not
// restated: the bar would follow it.
func (f *filter) restate(r float64, was *float64, measuring bool) {
	if f.known && *was > 0 && measuring {
		f.v *= max(r / *was, 1)
	}
	*was = r
}

// censor folds a reading that only bounds the estimate from above (log
// bound b of variance r): the mean of a Gaussian prior truncated at the
// bound (the Tobit update). One already below the bound is not moved. A
// bound below the estimate by more than zSigmas of a reading's noise (or a
// CUSUM of smaller gaps) says the pod changed by an unknown amount at least
// that gap: the filter restarts as
// far below the bound as the estimate was above it, with that gap as its
// standard deviation, so the next readings settle it (a backoff, as TCP's
// on a loss). As in update, the restart is marked changed only when r was
// measured (measured): judged against the prior's percent, a bound a few
// percent under an estimate still being learned is that estimate's error,
// not the pod changing. Followed as a change, it kept the dead band off
// for the filter's memory (longer for a pod often at its limit: bounds do
// not count toward it), and on CPU alone 2 of 224 runs (the shipped
// scenarios, 16 seeds each) wrote after settling; none do now.
func (f *filter) censor(b, r float64, p Params, measured bool) {
	if !f.known {
		f.m, f.v, f.known = b-math.Sqrt(r), r, true
		return
	}
	f.v += p.processVariance() * r
	s := math.Sqrt(f.v + r)
	alpha := (b - f.m) / s
	gap := f.m - b
	f.down = max(0, f.down-min(alpha, 0)-1)
	if gap > zSigmas*math.Sqrt(r) || f.down > 2*zSigmas {
		gap = max(gap, math.Sqrt(r))
		f.restart(b-gap, gap*gap, 0, measured)
		return
	}
	lambda := normPDF(alpha) / max(normCDF(alpha), 1e-300)
	f.m -= f.v / s * lambda
	f.v *= max(1-f.v/(s*s)*lambda*(lambda+alpha), 0.01)
}

func normPDF(x float64) float64 { return math.Exp(-x*x/2) / math.Sqrt(2*math.Pi) }
func normCDF(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }
func sq(x float64) float64      { return x * x }

// estimate folds this cycle's readings into the estimates and returns how
// many pods it learned from. With keepNoise their misfit does not update
// the readings' noise.
func (e *Engine) estimate(set []Pod, c *cycleReadings, keepNoise bool) int {
	e.markBlind(set, c)
	scale := e.fitScale(set, c)
	e.noteSteps(set, c, keepNoise)
	e.noiseFloor(set)
	r := e.noise * e.noise
	countNoise(c, e.params.QueryWindow.Seconds(), r, e.speedNoiseUnmeasured())
	var residuals []float64
	learned, started := 0, 0 // started: readings taken as a restart's starting speeds
	typical := e.typicalSpeed(set)
	for i, pod := range set {
		rd := c.pods[i]
		st := e.pods[pod.Name]
		if !rd.speed.ok || (st != nil && st.blind) {
			continue
		}
		st = e.state(pod.Name)
		lo, hi := rd.speed.lo-scale, rd.speed.hi-scale
		learned++
		st.fromData = true
		if st.calibrate {
			// The first cycle after SeedSettled: the seeded speeds are the
			// live weights (capacities, not speeds per core). Judged
			// against them a reading would read as a jump, restarting the
			// filter on one noisy reading, and its misfit as noise; it is
			// taken as the speed instead, settled, for calibrateTo to
			// start from (a pod the live weights hold at the MaxRatio
			// floor keeps this reading, in the others' units: its share
			// does not show its speed).
			started++
			st.speed.m, st.speed.up, st.speed.down, st.speed.changed = hi, 0, 0, false
			if !rd.speed.upper {
				st.speed.m = (lo + hi) / 2
			}
			continue
		}
		// The readings' noise is measured over the cycles (measureNoise).
		st.speed.restate(r, &st.speedR, e.noiseCycles < e.params.memory())
		if rd.speed.upper {
			if !st.speed.known && typical != nil {
				hi = min(hi, *typical)
			}
			st.speed.censor(hi, r, e.params, !e.speedNoiseUnmeasured())
			continue
		}
		// A reading measures the noise only when its range is narrower
		// than the noise known so far: a wide one's distance from the
		// estimate understates it. Counting such distances too raised
		// the runs with more than two policy switches from 40 to 44 of
		// 224 (the shipped scenarios, 16 seeds each), and on CPU alone
		// without noise took 11 cycles to converge instead of 7:
		// the distances of estimates still converging are not noise.
		// The price is that while the weights move every cycle no
		// reading is narrow, so a CPU rate far noisier than the 1% prior
		// can go unmeasured: noiseFloor then takes it from the readings'
		// own scatter. Judging no jump or CUSUM before the noise is
		// measured would end that loop too, but the first readings'
		// jumps are how CPU-alone estimates reach a pod's speed at
		// opt-in: without them CPU alone on a 1-2-4-8-core mix without
		// limits went from 2.3x to 8.7x the capacity oracle's p99
		// (median of 16 runs).
		if st.speed.known && st.speed.n >= 2 && hi-lo < math.Sqrt(r) {
			d := min(max(st.speed.m, lo), hi) - st.speed.m
			residuals = append(residuals, d*d)
		}
		// The readings' noise is measured once a cycle (or a snapshot)
		// has: a restart before then is no change to follow (see update).
		// A Service with fewer than three pods of narrow readings never
		// measures it (measureNoise): counted as changes, its readings'
		// restarts kept the dead band off for the filter's memory, and
		// refinements of a few percent were written long after the
		// weights had settled. The price: a two-pod Service follows a real
		// slowdown in up to 7 cycles instead of 5
		// (TestTwoPodsFollowASlowdown).
		st.speed.update(lo, hi, r, rd.countVar, e.overlapInflation(), e.params, false, !e.speedNoiseUnmeasured())
	}
	if !keepNoise && started == 0 {
		e.measureNoise(residuals)
	}
	e.updateCores(set, c)
	e.rememberClasses(set)
	e.normalize(set)
	return learned
}

// countNoise sets each speed reading's countVar: the variance it has
// beyond the median pod's for resting on fewer requests. A speed read from
// request rates is requests over the CPU they took, and that CPU is the
// sum of the requests' work, so it varies as one over their number n times
// the work's squared coefficient of variation: cv²/n in log scale. cv² is
// taken as at most 1, the exponential work the solver's M/M/c cost
// assumes (heavier-tailed work is noisier than the engine then takes it
// to be). The noise measured over the pods (r, measureNoise's median)
// holds the median pod's cv²/n with the rest of a reading's noise (scrapes
// misaligned with the windows, load moving under them), which does not
// fall with n; a pod sent fewer requests adds the difference. So r bounds
// cv² too: at most r·n of the median pod (work that varies less shows a
// smaller noise). A pod held at the MaxRatio floor is sent a MaxRatio-th
// of the mean pod's requests: at 1.3 requests a second (twelve pods at 312
// a second in all), 78 over a 1 m window, and its readings scatter by 11%
// from their count alone. A reading is taken to rest on at least one
// request (a rate extrapolated from a counter that barely moved can show
// less), so that its variance stays finite. 0 with CPU alone (the
// requests are not known, and a censored reading, CPU alone's, has none),
// and while no noise is measured (unmeasured: the prior bounds nothing).
// The noise is measured over the readings as they are, the noisier ones
// included, which raises it where many pods are sent few requests:
// rescaled to the median pod's, they read it lower than it is where the
// noise does not fall with n, and noise passed the publish bar.
func countNoise(c *cycleReadings, window, r float64, unmeasured bool) {
	n := make([]float64, len(c.pods)) // 0: no reading from request rates
	var ns []float64
	for i, rd := range c.pods {
		c.pods[i].countVar = 0
		if !unmeasured && c.fromRequests && rd.speed.ok && rd.requests > 0 {
			n[i] = max(rd.requests*window, 1)
			ns = append(ns, n[i])
		}
	}
	typical := median(ns)
	cv2 := min(1, r*typical)
	for i := range c.pods {
		if n[i] > 0 && n[i] < typical {
			c.pods[i].countVar = cv2 * (1/n[i] - 1/typical)
		}
	}
}

// typicalSpeed is the median log speed of the pods known, nil for none: a
// pod first seen at its limit starts no higher.
func (e *Engine) typicalSpeed(set []Pod) *float64 {
	var ms []float64
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.speed.known {
			ms = append(ms, st.speed.m)
		}
	}
	if len(ms) == 0 {
		return nil
	}
	m := median(ms)
	return &m
}

// fitScale finds the offset from this cycle's raw log units to the
// estimates': the one that puts the most estimates inside their readings
// (a median of the readings' ends), so that one pod that changed does not
// move the others. A bound at a pod's CPU limit (its share over the limit,
// or over its CPU where that read between saturatedUse of the limit and
// the limit; see readSpeeds) says the reading, had the CPU not been
// clamped, would lie at or below it: it counts with both its ends, its
// bound and minus infinity, a vote below where the bound is below the
// median and none either way where it is above. Left out, the readings
// that set the scale were those of the pods not read at their limit, and a
// pod near its limit is read there when its CPU reads high: the ones left
// read it low, so its speed high, and the scale came out high by up to a
// fifth (six pods at 90% load, ±20% on the CPU rate). A censored pod's
// bound then stood that far under its estimate, its filter backed off, the
// weights moved, and moved back a cycle later.
//
// Two kinds of bound are left out. A pod without a limit is judged against
// its node's idle CPU, and its bound is its own CPU reading, flagged
// because it read high: counted, it carries that selection into the scale
// (at 95% load without limits, ±20% on the CPU rate, the writes after
// convergence went from 17 to 114 in 40 runs). A pod whose estimate rests
// on bounds alone (n = 0: no narrow reading since it began or last backed
// off), as every overloaded pod's does at opt-in, says nothing of the
// scale: counted, it slowed convergence from equal weights on CPU alone by
// up to three cycles. Where every reading counted is a bound, the bounds
// set it. The price: where the bounds are as many as the other readings,
// as in a set of two or three pods, they set the scale, and a pod that
// changed moves the others' readings too. Over 27 runs of two or three
// pods with limits at 60-90% load on CPU alone, following a slowdown of
// one pod to a third and its recovery (each to within 7.5%, counted up to
// 12 cycles) took 345 cycles in all, against 320 with the bounds left out.
func (e *Engine) fitScale(set []Pod, c *cycleReadings) float64 {
	var ends, points []float64
	bounds := 0
	for i, pod := range set {
		rd := c.pods[i]
		if !rd.speed.ok {
			continue
		}
		points = append(points, (rd.speed.lo+rd.speed.hi)/2)
		st := e.pods[pod.Name]
		if st == nil || !st.speed.known {
			continue
		}
		if rd.speed.upper {
			if knownCores(pod) && st.speed.n > 0 {
				ends = append(ends, rd.speed.hi-st.speed.m)
				bounds++
			}
			continue
		}
		ends = append(ends, rd.speed.lo-st.speed.m, rd.speed.hi-st.speed.m)
	}
	if len(ends) == 0 {
		return median(points)
	}
	if bounds < len(ends) { // some reading is not a bound
		for range bounds {
			ends = append(ends, math.Inf(-1))
		}
	}
	return median(ends)
}

// noteSteps records each pod's move of its speed reading since the last
// regular cycle, less the median of the other pods' moves: a move every
// pod makes is the load's or the units' (CPU alone reads shares per CPU),
// not a pod's. A speed is a rate per CPU and both rates follow the share,
// so two readings are draws of the readings' noise whatever the weights
// did in between, and a move varies by twice its variance; less a median
// of m other moves, by about 1+π/(2m) times that (a sample median's
// variance, π/2 of a mean's; less for a few pods). Each step is stored
// scaled to twice the noise's variance.
//
// Where consecutive windows share samples their errors share them too,
// and the steps read the noise low (by the overlap's share of its
// variance, a half at a 30 s cycle over a 1 m window): a floor, which a
// measurement replaces. Taken as that much higher (the windows' overlap
// as overlapInflation models it), the floor stood above the noise where
// the errors do not share samples, and on CPU alone at 90% with limits
// and ±20% on the CPU rate the writes after convergence went from 1 to 5
// in 12 runs.
//
// A bound is no reading, nor is a blind pod's (estimate skips it). A cycle
// whose windows reach into a spell without data (keepNoise) reads nothing;
// one in which the Service's rate moved (loadMove) takes no step, for its
// ranges already carry the rates' misalignment, which a step would count
// again. Steps are taken only while the noise goes unmeasured, the cycles
// noiseFloor reads them after: a measured noise needs no floor, and the
// steps' leave-one-out medians are the cycle's one sort of every pod.
// Those of an earlier unmeasured spell are kept (dropped at each
// measurement, CPU alone without the recent CPU at 90-95% with limits
// wrote 15 times in 24 runs instead of 12). The readings are kept every
// cycle, for the first unmeasured one to step from: in place, except in
// the cycles that step from them.
func (e *Engine) noteSteps(set []Pod, c *cycleReadings, keepNoise bool) {
	take := !keepNoise && e.unmeasured > 0 && !(c.loadMove > 0)
	was := e.lastReads
	if take || was == nil {
		e.lastReads = make(map[string]float64, len(set))
	} else {
		clear(e.lastReads) // the last readings are read only to step from
	}
	if keepNoise {
		return
	}
	var names []string
	var moves []float64
	for i, pod := range set {
		rd := c.pods[i]
		if st := e.pods[pod.Name]; !rd.speed.ok || rd.speed.upper || (st != nil && st.blind) {
			continue
		}
		x := (rd.speed.lo + rd.speed.hi) / 2
		if math.IsNaN(x) || math.IsInf(x, 0) {
			continue
		}
		e.lastReads[pod.Name] = x
		if !take {
			continue
		}
		if w, ok := was[pod.Name]; ok {
			names, moves = append(names, pod.Name), append(moves, x-w)
		}
	}
	if len(moves) < 3 {
		return
	}
	scale := math.Sqrt(1 + math.Pi/(2*float64(len(moves)-1)))
	for k, m := range mediansWithout(moves) {
		st := e.state(names[k])
		st.readSteps = appendCapped(st.readSteps, (moves[k]-m)/scale, e.params.memory())
	}
}

// mediansWithout returns, for each of xs, the median of the others (xs has
// at least two), sorting once: the others' j-th smallest is the j-th of
// the sorted values below the left-out one's place, the next one from it.
func mediansWithout(xs []float64) []float64 {
	order := make([]int, len(xs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(xs[a], xs[b]) })
	out := make([]float64, len(xs))
	m := len(xs) - 1
	for place, i := range order {
		nth := func(j int) float64 {
			if j >= place {
				j++
			}
			return xs[order[j]]
		}
		if m%2 == 1 {
			out[i] = nth(m / 2)
		} else {
			out[i] = (nth(m/2-1) + nth(m/2)) / 2
		}
	}
	return out
}

// noiseFloor raises the reading noise to what the readings' own scatter
// shows when no cycle has measured it over the estimates' memory: the
// windows never held a steady share (the weights moved every cycle), and
// judged against a noise that low every reading looks like a change, which
// moves the weights again. Two scatters show it, each of two draws of the
// noise, so each varies by about twice its variance (more where the load
// itself varies: an upper bound), and the larger is taken: each pod's
// recent CPU against its window's (the CPU rate's noise, with the recent
// CPU queried), and each pod's speed reading against its last
// (noteSteps: any signal's noise, with three pods or more).
func (e *Engine) noiseFloor(set []Pod) {
	if e.unmeasured < e.params.memory() {
		return
	}
	var recent, steps []float64
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil {
			recent = append(recent, st.recentRatios...)
			steps = append(steps, st.readSteps...)
		}
	}
	if v := max(robustVariance(recent), robustVariance(steps)); v > 0 && math.Sqrt(v/2) > e.noise {
		e.noise = boundNoise(math.Sqrt(v / 2))
		// A guess, not a measurement: the next cycle that measures the
		// noise replaces half of it, not a memory's share.
		e.noiseCycles = min(e.noiseCycles, 1)
	}
}

// measureNoise updates the reading noise from this cycle's squared
// residuals (0.455 is the median of a squared standard normal), averaged
// over cycles plainly and then with Smoothing.
func (e *Engine) measureNoise(squares []float64) {
	if len(squares) < 3 {
		e.unmeasured++
		return
	}
	e.unmeasured = 0
	variance := median(squares) / 0.455
	e.noiseCycles = min(e.noiseCycles+1, e.params.memory())
	g := 1 / float64(e.noiseCycles)
	e.noise = boundNoise(math.Sqrt((1-g)*e.noise*e.noise + g*variance))
}

// memory is the number of readings a settled estimate averages over.
func (p Params) memory() int { return int(math.Ceil(1 / p.Smoothing)) }

// updateCores folds each pod's cores reading into its cores filter: from
// its latency (Erlang C) when it has one, else from its node's idle CPU
// (the ceiling). The readings' noise is the spread of the pod's recent
// residuals (see spreadVariance); a reading that restarts the filter is
// left out of them, as one that may show a change rather than noise. The ceiling is a
// reading of its own kind, as noisy as the node's CPU under the pod's
// neighbours: where it stands in for the latency's (a window whose share
// moved gives none), it is judged by the ceiling's own spread too, kept
// each cycle the ceiling is read. Judged by the latency readings' alone, a
// neighbour's burst read as a change of cores, restarted the estimate,
// moved the weights, and the moved window's next reading was a ceiling
// again (TestCeilingReadingJudgedByItsOwnScatter has the figures). So is a
// latency reading clamped at the ceiling: judged by the latency readings'
// spread it moved a fast pod's estimate by 5% in a cycle under the same
// noise (TestNoisyNodeCPUWritesNothing). An engine before this one found
// that judging it so let pods at their ceiling near full load queue
// longer; over the bench's scenarios with this one, the no-limit ones'
// median p99 moved by 0 to -1.6% and no scenario's writes or switches
// changed.
func (e *Engine) updateCores(set []Pod, c *cycleReadings) {
	for i, pod := range set {
		if knownCores(pod) {
			continue
		}
		rd := c.pods[i]
		seen, bounded := rd.cores, rd.coresBounded
		fromCeiling := !(seen > 0)
		if fromCeiling {
			seen, bounded = rd.nodeCeiling, false
		}
		if !(seen > 0) {
			continue
		}
		st := e.state(pod.Name)
		if st.coresNode != pod.Node {
			st.cores, st.coresResiduals, st.ceilingResiduals, st.coresNode, st.coresR = filter{}, nil, nil, pod.Node, 0
		}
		x := math.Log(seen)
		noise := e.coresReadingVar(st)
		r := noise
		// A reading of the node's ceiling, or one clamped at it, carries
		// the ceiling's noise (its node's CPU reading's), not a queue's:
		// clamped readings judged by the queue readings' spread moved a
		// fast pod's estimate by 5% a cycle toward a node that read busy
		// by chance (±20% on the node CPU at 70% load).
		if fromCeiling || rd.coresAtCeiling {
			r = max(r, spreadVariance(st.ceilingResiduals))
		}
		settled := e.params.Smoothing * r
		if len(st.coresResiduals) < e.params.memory() {
			// Until the pod's own residuals measure their noise over a
			// memory (as coresReadingVar's floor), a change must stand
			// out of the noisiest pod's the engine before measured: the
			// typical pod's can be a third of a pod's whose cores are a
			// small part of its node, and judged by it, the second
			// reading after a restart read as a jump (a weight moved by
			// 47% on CPU alone at 80% load); judged by a spread of its
			// first three or four residuals, often small by chance, the
			// fifth did. A restart's settled estimate, the calibration's
			// split and the bar keep the typical noise: they stand for
			// the Service's pods, and as wide as the noisiest pod's, a
			// settled estimate could fall short of Learned and flip the
			// balancer on a restart.
			r = max(r, e.coresNoiseMax*e.coresNoiseMax)
		}
		known, d := st.cores.known, x-st.cores.m
		ceiling := math.NaN()
		if rd.nodeCeiling > 0 {
			ceiling = math.Log(rd.nodeCeiling) - st.cores.m
		}
		// The cores readings' noise is measured from the pod's own
		// residuals (see restate). Without the restatement, a fast pod
		// without a limit at 90% load read 11% high at opt-in was still
		// 3% high ten minutes on and fell behind twice. Over the bench's
		// no-limit scenarios (16 seeds each) the runs with a write after
		// settling went from 17 to 10, the median p99 at 90% load fell
		// 3.6%, and on CPU alone on a 1-2-4-8-core mix by a quarter.
		st.cores.restate(noise, &st.coresR, len(st.coresResiduals) < e.params.memory())
		// The pod's cores noise is measured once it has its own spread
		// or a snapshot's (see update). Counted as changes, every no-limit
		// pod's second reading at opt-in (and a pod's on a new node) kept
		// the dead band off for the filter's whole memory, and
		// refinements of a few percent were written ten minutes on. Three
		// residuals end it, as they start the spread; a spread measured
		// from so few can still be small by chance (see coresReadingVar),
		// and a jump judged by it then is followed.
		restarted := st.cores.update(x, x, r, 0, e.overlapInflation(), e.params, bounded, !e.coresNoiseUnmeasured(st))
		if !known && st.coresSettled {
			st.cores.v, st.cores.n = settled, e.params.memory()
		}
		st.coresSettled = false
		if restarted || !known {
			continue
		}
		st.coresResiduals = appendCapped(st.coresResiduals, d, e.params.memory())
		if !math.IsNaN(ceiling) {
			st.ceilingResiduals = appendCapped(st.ceilingResiduals, ceiling, e.params.memory())
		}
	}
}

// speedNoiseUnmeasured reports whether no cycle has measured the speed
// readings' noise (see measureNoise), nor a snapshot brought one.
func (e *Engine) speedNoiseUnmeasured() bool { return e.noiseCycles == 0 }

// coresNoiseUnmeasured reports whether nothing has measured the noise of
// the pod's cores readings: no spread of its own residuals yet, and no
// snapshot's (Snapshot.CoresNoise).
func (e *Engine) coresNoiseUnmeasured(st *podState) bool {
	return spreadVariance(st.coresResiduals) == 0 && !(e.coresNoise > 0)
}

// coresReadingVar is the variance of one cores reading of the pod: its
// residuals' spread, at least the speed readings' noise. Until it has a
// memory of residuals (after a restart, or on a new node), the spread the
// engine before a restart measured over the Service's pods
// (Snapshot.CoresNoise, a median over pods of spreads of a memory of
// readings each) is its floor: without it the first readings after a
// restart were judged by the speed readings' noise alone, which at low
// load is far below that of cores read from a latency that barely queues,
// and their drift passed the publish bar; and an interquartile range of
// three or four residuals is small by chance often enough that, taken
// alone once there were three, the bar fell by two thirds in one cycle
// under the same drift (±20% on the latency at 40% load).
func (e *Engine) coresReadingVar(st *podState) float64 {
	v := max(spreadVariance(st.coresResiduals), e.noise*e.noise)
	if len(st.coresResiduals) < e.params.memory() {
		v = max(v, e.coresNoise*e.coresNoise)
	}
	return v
}

// robustVariance is the variance of residuals by their median absolute
// value (1.4826 makes it a standard deviation for a Gaussian); 0 for fewer
// than three.
func robustVariance(xs []float64) float64 {
	if len(xs) < 3 {
		return 0
	}
	abs := make([]float64, len(xs))
	for i, x := range xs {
		abs[i] = math.Abs(x)
	}
	return sq(1.4826 * median(abs))
}

// spreadVariance is the variance of residuals by their interquartile
// range (1.349 standard deviations for a Gaussian), which needs no centre:
// an estimate off by a steady amount is off, not noisy, and measured about
// zero the offset would count as noise and keep the readings that correct
// it from moving it. Unlike a median absolute deviation, it does not
// vanish when one value repeats in up to three quarters of the readings,
// as a cores reading clamped at the pod's ceiling does. 0 for fewer than
// three.
func spreadVariance(xs []float64) float64 {
	if len(xs) < 3 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return sq((quantile(s, 0.75) - quantile(s, 0.25)) / 1.349)
}

// quantile is the q quantile of sorted xs, interpolated linearly.
func quantile(sorted []float64, q float64) float64 {
	pos := q * float64(len(sorted)-1)
	i := int(pos)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (pos-float64(i))*(sorted[i+1]-sorted[i])
}

// appendCapped appends x, keeping the last n.
func appendCapped[T any](xs []T, x T, n int) []T {
	xs = append(xs, x)
	if len(xs) > n {
		xs = slices.Delete(xs, 0, len(xs)-n)
	}
	return xs
}

// markBlind marks the pods CPU alone cannot learn from: no request rates,
// no CPU limit but a CPU request or node size (so the cores are somewhere
// in a range), and no node CPU this cycle. Past its cores such a pod's CPU
// stops growing with its share, which reads as a faster pod, and its weight
// would run away; nothing in CPU alone tells that from a fast pod. It is
// weighted at its guessed cores and the speed of the pods measured, and
// Learned stays false while it is in the set (the operator keeps
// LEAST_REQUEST, which steers around its queue). A pod without CPU data
// this cycle stays as it was.
func (e *Engine) markBlind(set []Pod, c *cycleReadings) {
	for i, pod := range set {
		rd := c.pods[i]
		if !rd.hasCPU {
			continue
		}
		lo, hi := coresBounds(pod)
		blind := !c.fromRequests && !knownCores(pod) && (lo > 0 || hi > 0) && rd.limit <= 0
		st := e.pods[pod.Name]
		switch {
		case blind:
			st = e.state(pod.Name)
			st.blind, st.speed, st.fromData = true, filter{}, false
		case st != nil:
			st.blind = false
		}
	}
}

// rememberClasses keeps, per hardware class, the mean log speed of its
// pods with estimates, so a new pod of that class starts from it.
func (e *Engine) rememberClasses(set []Pod) {
	sums := map[string]float64{}
	counts := map[string]int{}
	for _, pod := range set {
		st := e.pods[pod.Name]
		if pod.HardwareClass == "" || st == nil || !st.speed.known {
			continue
		}
		sums[pod.HardwareClass] += st.speed.m
		counts[pod.HardwareClass]++
	}
	for _, class := range slices.Sorted(maps.Keys(counts)) {
		if _, known := e.classes[class]; known || len(e.classes) < len(set) {
			e.classes[class] = sums[class] / float64(counts[class])
		}
	}
}

// normalize shifts every log speed so that their mean over the current
// pods with estimates is 0: only ratios matter.
func (e *Engine) normalize(set []Pod) {
	sum, n := 0.0, 0
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.speed.known {
			sum += st.speed.m
			n++
		}
	}
	if n == 0 {
		return
	}
	g := sum / float64(n)
	for _, st := range e.pods {
		st.speed.m -= g
	}
	for class := range e.classes {
		e.classes[class] -= g
	}
}

// podModel is what the decide and publish stages know of one pod: cores c,
// speed per core v (relative), and the variance of log capacity.
type podModel struct {
	c, v, logVar float64
	// barVar is the variance the publish stage's bar tests the gap
	// against. A speed filter that has only begun counts with its own
	// variance: its first readings are all it knows, and judged as a
	// settled estimate their noise would pass for a gap near full load
	// (identical pods were moved on it). One settled, or restarted on a
	// change the data showed (the change is known, only its size is not),
	// counts as settled, so that a real change is followed at once. The
	// cores filter counts as settled: a no-limit pod's first cores readings
	// are what shows it overloaded, and held to their own variance too the
	// writes that relieve it came later (median p99 over 16 runs 1% higher
	// on a 1-2-4-8-core mix and on three generations at 90% load).
	barVar float64
	known  bool // the speed is an estimate of its own
	// coresKnown: c comes from the pod's limit, estimate or bounds, or
	// from the median of pods that have one; false when no pod's cores
	// are known (c is then 1, and the utilisation unknown).
	coresKnown bool
}

// models returns every pod's model in set order. A pod without an
// estimate takes its hardware class's (with PoolByHardware) or the median
// speed, and the median cores of the pods with cores known.
func (e *Engine) models(set []Pod) []podModel {
	out := make([]podModel, len(set))
	var cores []float64
	for _, pod := range set {
		if c := e.coresOf(pod); c > 0 {
			cores = append(cores, c)
		}
	}
	typicalSpeed, typicalCores := 0.0, median(cores) // 0: the speeds' scale, when no pod has one
	if t := e.typicalSpeed(set); t != nil {
		typicalSpeed = *t
	}
	coresKnown := typicalCores > 0
	if !coresKnown {
		typicalCores = 1
	}
	unknownVar := 1.0 // a factor of e either way: nothing is known
	inflation := e.overlapInflation()
	settledSpeed := e.params.Smoothing * e.noise * e.noise * inflation
	for i, pod := range set {
		m := &out[i]
		st := e.pods[pod.Name]
		logV, varV := typicalSpeed, unknownVar
		m.barVar = settledSpeed
		if st != nil && st.speed.known {
			logV, varV, m.known = st.speed.m, min(st.speed.v*inflation, unknownVar), true
			if st.speed.changed {
				m.barVar = min(varV, settledSpeed)
			} else {
				m.barVar = max(varV, settledSpeed) // only begun: never surer than settled
			}
		} else if cl, ok := e.classes[pod.HardwareClass]; ok && e.params.PoolByHardware && pod.HardwareClass != "" {
			logV = cl
		}
		m.v = math.Exp(min(max(logV, -700), 700))
		m.c, m.logVar, m.coresKnown = typicalCores, varV, coresKnown
		if c := e.coresOf(pod); c > 0 {
			m.c = c
			if !knownCores(pod) && st != nil && st.cores.known {
				m.logVar += st.cores.v
				if st.cores.n < 2 {
					// One reading is not yet confidence: it cannot be told
					// from a passing queue or a window the balancer shaped,
					// and its variance is the speed readings' noise, not
					// this pod's own (that needs residuals). Learned waits
					// for a second; the bar's variance is untouched.
					m.logVar += unknownVar
				}
				m.barVar += min(st.cores.v, e.params.Smoothing*e.coresReadingVar(st)*inflation)
			} else if !knownCores(pod) {
				m.logVar += unknownVar
				m.barVar += unknownVar
			}
		} else if coresKnown {
			m.logVar += unknownVar // the median's cores: a guess next to pods with their own
			m.barVar += unknownVar
		}
	}
	return out
}

// coresFloors returns, for each pod without a limit whose cores estimate
// has seen readings on its node, the least its cores can be: zSigmas of
// the estimate's own uncertainty below it; 0 for the others.
func (e *Engine) coresFloors(set []Pod) []float64 {
	out := make([]float64, len(set))
	for i, pod := range set {
		st := e.pods[pod.Name]
		if knownCores(pod) || st == nil || !st.cores.known || st.coresNode != pod.Node {
			continue
		}
		out[i] = math.Exp(st.cores.m - zSigmas*math.Sqrt(st.cores.v))
	}
	return out
}

// coresOf returns the cores the engine takes the pod to have: its limit,
// else its cores estimate, else the middle of its bounds; 0 when nothing is
// known.
func (e *Engine) coresOf(pod Pod) float64 {
	if knownCores(pod) {
		return pod.Cores
	}
	if st := e.pods[pod.Name]; st != nil && st.cores.known {
		return clampCores(pod, math.Exp(st.cores.m))
	}
	lo, hi := coresBounds(pod)
	switch {
	case lo > 0 && hi > 0:
		return math.Sqrt(lo * hi)
	case lo > 0:
		return lo
	default:
		return hi
	}
}

// median of xs (0 for none); xs is reordered.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// overlapInflation is how much more a filtered estimate wanders because
// consecutive readings share data: a 1m rate read every 30s sees half of
// the previous window again, so its errors are correlated (an AR(1) with
// rho the shared fraction, whose averages' variance grows by
// (1+rho)/(1-rho)). The averages span many readings, so rho is that of
// the mean gap: one gap moves with the policy's jitter, which would make
// the publish stage's bar swing by up to a factor of two from one cycle to
// the next.
func (e *Engine) overlapInflation() float64 {
	if e.meanCycle <= 0 {
		return 1
	}
	rho := min(max(1-float64(e.meanCycle)/float64(e.params.QueryWindow), 0), 0.9)
	return (1 + rho) / (1 - rho)
}
