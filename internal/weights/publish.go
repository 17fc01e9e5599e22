package weights

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// Stage 4, publish: write only when the targets are predicted to serve the
// Service better than the live weights by more than the estimates'
// uncertainty and a write's cost. Both sides are in the solver's
// objective, the total time in system T: the gain is T(live) -
// T(targets), with the solver's bounds priced in (capPenalty); the bar is
// what the same objective charges for targets each off by
// chance past zSigmas (each pod's noise gain is ½ T''_i x_i² times the
// variance of the gap of its target, the capacity's carried through the
// solver: a scaled chi-square), plus the cost of a write,
// DeadBand² of the request time (0.25% at the default 5%: every weight 5%
// off at about half load costs that much). Noise alone moves the targets
// by about their standard deviation, so it does not pass; near full load a
// misplaced unit of traffic costs more (T'' grows with the utilisation),
// and a smaller gap is worth a write, down to the dead band: a write moves
// some pod's traffic by at least DeadBand, for weights within it of their
// targets are converged (see Update). A pod sent its capacity
// or more makes the gain infinite. Then the step bounds (MaxStep), the
// ratio bounds (MaxRatio: 0.05x-20x of the mean by default, see
// Params.MaxRatio), and
// integers of at least 1 whose sum per locality stays below 2^32-1.

// proposalFrom turns traffic into weights of mean MeanWeight, scaled by
// slow start, within MaxRatio of the mean.
func (p Params) proposalFrom(now time.Time, set []Pod, x []float64) []float64 {
	sum := 0.0
	for _, v := range x {
		sum += v
	}
	out := make([]float64, len(set))
	for i, pod := range set {
		if sum > 0 {
			out[i] = p.MeanWeight() * float64(len(set)) * x[i] / sum
		} else {
			out[i] = p.MeanWeight()
		}
		out[i] *= p.rampFactor(pod, now)
	}
	clampRatio(out, p.MaxRatio)
	return out
}

// judge decides whether proposal is worth writing over the reference
// weights ref, for pods modelled by dp at load (0 = unknown) with
// log-capacity variances logVar; held is what the solver held at their cap
// or upper bound (see solveBounds). Pods in fixed are not compared.
//
// loadShift is each pod's relative change of target for one standard
// deviation of the load estimate (nil: none).
func (p Params) judge(set []Pod, ref map[string]uint32, proposal []float64, dp []decidePod, held bounds, logVar, loadShift []float64, load float64) (gain, bar float64) {
	refSum, propSum, common := 0.0, 0.0, 0
	for i, pod := range set {
		if w, ok := ref[pod.Name]; ok {
			refSum += float64(w)
			propSum += proposal[i]
			common++
		}
	}
	if common == 0 || !(refSum > 0) || !(propSum > 0) {
		return 0, 0
	}
	capacity := 0.0
	for _, d := range dp {
		capacity += d.c * d.v
	}
	total := min(load, maxUtilisation*capacity)
	if !(total > 0) {
		total = capacity / 2 // unknown load: judged at half load
	}
	xl := make([]float64, len(set))
	xt := make([]float64, len(set))
	for i, pod := range set {
		if w, ok := ref[pod.Name]; ok {
			xl[i] = total * float64(w) / refSum
			xt[i] = total * proposal[i] / propSum
		}
	}
	p.holdFloors(set, ref, proposal, refSum/float64(common), xl, xt)
	var mean, sumSq, largest float64
	for i, pod := range set {
		if _, ok := ref[pod.Name]; !ok {
			continue
		}
		if dp[i].fixed {
			continue
		}
		k := curvature(dp[i], xt[i])
		if math.IsInf(k, 0) || math.IsNaN(k) {
			continue
		}
		s := sensitivity(dp[i], xt[i])
		// The live weights came from an estimate as noisy as this one:
		// the gap between the two has twice the variance.
		shift := 0.0
		if loadShift != nil {
			shift = loadShift[i]
		}
		if dp[i].overloaded && xt[i] < xl[i] {
			// The data shows this pod's live weight too high, not through
			// its estimate: cutting it carries no estimate's noise.
			continue
		}
		a := k * xt[i] * xt[i] * 2 * (logVar[i]*s*s + shift*shift) / 2
		mean += a
		sumSq += a * a
		largest = max(largest, a)
	}
	// The noise gain is a sum of scaled chi-squares of one degree each, of
	// mean sum(a) and variance 2 sum(a²): its zSigmas tail, by the normal
	// approximation, and at least one pod's own zSigmas².
	bar = max(mean+zSigmas*math.Sqrt(2*sumSq), zSigmas*zSigmas*largest)
	lt := timeInSystem(dp, xt)
	gain = timeInSystem(dp, xl) - lt + capPenalty(dp, held, xl, xt)
	if lt > 0 {
		gain, bar = gain/lt, bar/lt
	}
	bar += p.DeadBand * p.DeadBand
	return gain, bar
}

// offTarget is how far the live weights ref are from the weights next a
// write would send, as the quality tests and the bench judge convergence:
// the largest gap between a pod's live share of the traffic and its share
// under next, relative to the latter. Measured on the whole weights
// written (integers, after the step bounds and rounding), not on the
// solver's targets: a move the rounding takes under the dead band is no
// move.
func offTarget(set []Pod, ref, next map[string]uint32) float64 {
	refSum, nextSum := 0.0, 0.0
	for _, pod := range set {
		w, ok := ref[pod.Name]
		v, ok2 := next[pod.Name]
		if ok && ok2 {
			refSum += float64(w)
			nextSum += float64(v)
		}
	}
	if !(refSum > 0) || !(nextSum > 0) {
		return 0
	}
	off := 0.0
	for _, pod := range set {
		w, ok := ref[pod.Name]
		v, ok2 := next[pod.Name]
		if ok && ok2 && v > 0 {
			off = max(off, math.Abs(float64(w)/refSum/(float64(v)/nextSum)-1))
		}
	}
	return off
}

// capPenalty is the solver's bounds' part of its Lagrangian at the live
// traffic: for each pod the solver held at its cap or upper bound, the
// bound's price (the marginal cost the free pods share, the solver's
// water level, less the pod's own; where every pod is held, the highest
// one's) times the live traffic's excess over the target. The cap stands
// for what the model cannot see near saturation, an estimate a few
// percent off, so T alone must not judge weights past it. T prefers
// running a many-core pod past it, where its queue is still short: after
// a load step past the cap, weights solved for the lower load were kept,
// with many-core pods at 98%, while an opt-in at the new load went to
// capacity shares. The targets minimise T plus this term over all weights
// of the same total, so the gain is, to second order, half T's second
// derivative times the gap squared, what the bar charges for noise,
// moving traffic between two held pods included. The MaxRatio floor is no
// such bound: a move towards it gains what T says.
func capPenalty(dp []decidePod, held bounds, xl, xt []float64) float64 {
	if held.at == nil {
		return 0
	}
	nu := held.level
	if !(nu > 0) {
		for i, d := range dp {
			if held.at[i] && !d.fixed {
				nu = max(nu, marginalCost(d, xt[i]))
			}
		}
	}
	pen := 0.0
	for i, d := range dp {
		if held.at[i] && !d.fixed {
			pen += max(nu-marginalCost(d, xt[i]), 0) * (xl[i] - xt[i])
		}
	}
	return pen
}

// holdFloors compares a pod held at the MaxRatio floor by both the live
// weights and the proposal at its live traffic: its weight is no decision
// of the solver but the clamp's, and its share moves only with the
// others' weights and the floor's rounding to a whole weight. Counted, a
// move that small weighed as a large gain where the pod is far past its
// capacity (a backlog), and the weights were rewritten every cycle while
// it drained. The other pods' targets share the rest of the traffic.
func (p Params) holdFloors(set []Pod, ref map[string]uint32, proposal []float64, refMean float64, xl, xt []float64) {
	propMean := 0.0
	for _, v := range proposal {
		propMean += v
	}
	propMean /= float64(max(len(proposal), 1))
	held, rest, others := 0.0, 0.0, 0.0
	hold := make([]bool, len(set))
	for i, pod := range set {
		w, ok := ref[pod.Name]
		if !ok {
			continue
		}
		hold[i] = p.atFloor(proposal[i], propMean) && p.atFloor(float64(w), refMean)
		if hold[i] {
			held += xl[i] - xt[i]
		} else {
			others += xt[i]
		}
	}
	rest = others - held
	if held == 0 || !(others > 0) || !(rest > 0) {
		return
	}
	for i := range set {
		switch {
		case hold[i]:
			xt[i] = xl[i]
		case xt[i] > 0:
			xt[i] *= rest / others
		}
	}
}

// atFloor reports whether a weight w of weights averaging mean is at the
// MaxRatio floor: within the half unit that rounding to a whole weight
// moves it by (for the floor's own rounding, and the others' moving the
// mean, are far less than a unit at the weights' scale; weights kept in
// small units, such as 1 and 2, are not at a floor of 0.15).
func (p Params) atFloor(w, mean float64) bool {
	return w <= mean/p.MaxRatio+0.5
}

// floorOverload returns the pods of set that the proposal holds at the
// MaxRatio floor and that the floor alone sends more than their capacity,
// at a known load: no weight the ratio allows keeps their queue from
// growing, so the promise's cap cannot hold, and the user must hear it.
// The capacity is the pod's own (models), not what a backlog leaves of it
// while it drains (dp), which passes.
func (p Params) floorOverload(set []Pod, proposal []float64, models []podModel, dp []decidePod, load float64) []string {
	if !(load > 0) || len(proposal) == 0 {
		return nil
	}
	sum := 0.0
	for _, w := range proposal {
		sum += w
	}
	mean := sum / float64(len(proposal))
	var out []string
	for i, pod := range set {
		if dp[i].fixed || !p.atFloor(proposal[i], mean) {
			continue
		}
		if load*proposal[i]/sum > models[i].c*models[i].v {
			out = append(out, pod.Name)
		}
	}
	return out
}

// settle turns a proposal into the weights to publish against the
// reference. With write false, pods that stay keep their reference weights
// exactly and only new pods get a weight (scaled to the reference);
// otherwise each weight that stays moves at most MaxStep (in shares), and
// the pods in fixed (no data) keep their reference weights exactly, the
// others written in the reference's units.
func (p Params) settle(set []Pod, ref map[string]uint32, proposal []float64, write bool, fixed []bool) (map[string]uint32, bool) {
	n := len(set)
	refSum, propSum := 0.0, 0.0
	common := 0
	anyFixed := false
	for i, pod := range set {
		if w, ok := ref[pod.Name]; ok {
			refSum += float64(w)
			propSum += proposal[i]
			common++
			anyFixed = anyFixed || (fixed != nil && fixed[i])
		}
	}
	scale := 1.0
	if refSum > 0 && propSum > 0 {
		scale = propSum / refSum
	}
	if write {
		factor := 1 + p.MaxStep
		for i, pod := range set {
			if w, ok := ref[pod.Name]; ok {
				was := float64(w) * scale
				proposal[i] = min(max(proposal[i], was/factor), was*factor)
			}
		}
		clampRatio(proposal, p.MaxRatio)
		if anyFixed {
			for i := range proposal {
				proposal[i] /= scale
			}
		}
	}
	perPodCap := uint32(maxWeightSum / uint64(max(n, 1)))
	out := make(map[string]uint32, n)
	changed := common != n || common != len(ref)
	for i, pod := range set {
		w, ok := ref[pod.Name]
		var v uint32
		switch {
		case ok && (!write || (fixed != nil && fixed[i])):
			v = w
		case write:
			v = roundWeight(proposal[i])
		default:
			v = roundWeight(proposal[i] / scale)
		}
		v = min(max(v, 1), perPodCap)
		if !ok || v != w {
			changed = true
		}
		out[pod.Name] = v
	}
	return out, changed
}

// clampRatio keeps every value within ratio of the mean, keeping the
// mean: each becomes clamp(l*x, mean/ratio, mean*ratio), with the one
// scale l that leaves the mean where it was, so that the values between
// the bounds keep their proportions. Where no scale does (values of 0
// beside others that all reach the upper bound), the upper ones sit at
// it and the zeros share the rest. l is found exactly: the sum is linear
// in l between the points where a value reaches a bound. A ratio below 1
// (or NaN) is 1: every value the mean.
func clampRatio(xs []float64, ratio float64) {
	n := float64(len(xs))
	mean := 0.0
	for _, x := range xs {
		mean += x / n
	}
	if !(ratio >= 1) {
		ratio = 1 // no value can be nearer the mean than equal to it
	}
	if len(xs) == 0 || !(mean > 0) || math.IsInf(mean, 0) {
		return
	}
	lo, hi := mean/ratio, mean*ratio
	if math.IsInf(hi, 0) || !slices.ContainsFunc(xs, func(x float64) bool { return x < lo || x > hi }) {
		return
	}
	// A value x > 0 is lo below l = lo/x, l*x between, hi above hi/x.
	type point struct {
		l      float64
		x      float64 // the value joining (at lo/x) or leaving (at hi/x) the linear part
		leaves bool
	}
	points := make([]point, 0, 2*len(xs))
	zeros := 0.0
	for _, x := range xs {
		if x > 0 {
			points = append(points, point{lo / x, x, false}, point{hi / x, x, true})
		} else {
			zeros++
		}
	}
	slices.SortFunc(points, func(a, b point) int { return cmp.Compare(a.l, b.l) })
	// Walking up l: sum(l) = atLo*lo + l*linear + atHi*hi.
	atLo, atHi, linear := n, 0.0, 0.0
	want := n * mean
	scale := math.NaN()
	for k, pt := range points {
		next := math.Inf(1)
		if k+1 < len(points) {
			next = points[k+1].l
		}
		if pt.leaves {
			linear -= pt.x
			atHi++
		} else {
			linear += pt.x
			atLo--
		}
		if atLo+atHi == n {
			linear = 0 // every value at a bound: no rounding residue left
		}
		if linear > 0 {
			if l := (want - atLo*lo - atHi*hi) / linear; l >= pt.l && l <= next {
				scale = l
				break
			}
		}
	}
	if math.IsNaN(scale) && zeros == 0 {
		// Only rounding can miss every segment: the nearest clamp.
		for i, x := range xs {
			xs[i] = min(max(x, lo), hi)
		}
		return
	}
	if math.IsNaN(scale) {
		// Every value above 0 at hi: the zeros share the rest.
		rest := (want - (n-zeros)*hi) / zeros
		for i, x := range xs {
			if x > 0 {
				xs[i] = hi
			} else {
				xs[i] = rest
			}
		}
		return
	}
	for i, x := range xs {
		xs[i] = min(max(scale*x, lo), hi)
	}
}

// roundWeight rounds to a weight: at least 1, never past uint32.
func roundWeight(x float64) uint32 {
	switch {
	case !(x >= 1):
		return 1
	case x >= math.MaxUint32:
		return math.MaxUint32
	}
	return uint32(math.Round(x))
}

// sensitivity is d log x / d log mu of a pod's target at the common
// marginal cost: 1 at capacity shares, more where the pod sits on the
// steep part of the split (at low load a slower pod's traffic turns on a
// small change of its speed), so that the targets' own noise is judged
// as the estimates' noise carried through the solver.
func sensitivity(p decidePod, x float64) float64 {
	rho := x / (p.c * p.v)
	if !(rho > 0) || rho >= maxUtilisation {
		return 1
	}
	h := min(1e-4, rho/4, (1-rho)/4)
	d := (sakasegawaCost(p.c, rho+h) - sakasegawaCost(p.c, rho-h)) / (2 * h)
	if !(d > 0) {
		return 1
	}
	mv := 1 + sakasegawaCost(p.c, rho)
	return min(1+mv/(rho*d), 10)
}
