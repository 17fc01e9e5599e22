package weights

import (
	"math"
	"time"
)

// capacityProposal is the weight each pod deserves from its capacity:
// proportional to it with mean MeanWeight, within MaxRatio of the mean,
// then scaled down by slow start.
func (e *Engine) capacityProposal(now time.Time, set []Pod) []float64 {
	caps := e.targets(set)
	mean := 0.0
	for _, c := range caps {
		mean += c
	}
	mean /= float64(max(len(caps), 1))
	out := make([]float64, len(set))
	for i := range caps {
		out[i] = float64(e.params.MeanWeight) * caps[i] / mean
	}
	clampRatio(out, e.params.MaxRatio)
	for i, pod := range set {
		out[i] *= e.params.rampFactor(pod, now)
	}
	return out
}

// holdProposal keeps the weights of pods that stay and gives new pods the
// weight their capacity estimate implies next to them. With undoDrains,
// drained pods get back the weight they had before the drain.
func (e *Engine) holdProposal(now time.Time, set []Pod, undoDrains bool) []float64 {
	ref, refAt := e.reference()
	caps := e.targets(set)
	var perCapacity []float64
	for i, pod := range set {
		if w, ok := ref[pod.Name]; ok && !e.ramping(pod, now, refAt) && e.liveDrain(pod.Name) == 1 {
			perCapacity = append(perCapacity, float64(w)/caps[i])
		}
	}
	unit := median(perCapacity)
	if unit == 0 {
		mean := 0.0
		for _, c := range caps {
			mean += c
		}
		unit = float64(e.params.MeanWeight) / (mean / float64(max(len(caps), 1)))
	}
	out := make([]float64, len(set))
	for i, pod := range set {
		if w, ok := ref[pod.Name]; ok && !e.ramping(pod, now, refAt) {
			out[i] = float64(w)
			if undoDrains {
				out[i] /= e.liveDrain(pod.Name)
			}
			continue
		}
		out[i] = unit * caps[i] * e.params.rampFactor(pod, now)
	}
	return out
}

// liveDrain is the drain factor in the pod's reference weight (1: none).
func (e *Engine) liveDrain(name string) float64 {
	if st := e.pods[name]; st != nil {
		return st.liveDrainOr1()
	}
	return 1
}

// moveRules says, per pod, what justifies writing its weight.
type moveRules struct {
	// bands: the relative move that justifies a write (nil: DeadBand).
	bands []float64
	// forced: written whatever the band (a drain starts, ends or changes).
	forced []bool
	// hot: the pod's CPU is at its limit, so its weight is too high: a move
	// down needs only a quarter of the dead band, never noise.
	hot []bool
	// offCapacity: the weight is deliberately off the pod's capacity, now
	// or in the reference (drains), so it does not say how the proposal's
	// scale relates to the reference's.
	offCapacity []bool
}

// moveRules collects the rules of an optimizing cycle.
func (e *Engine) moveRules(set []Pod) moveRules {
	r := moveRules{bands: e.moveBands(set), forced: e.drainForced(set), hot: make([]bool, len(set))}
	for i, pod := range set {
		if st := e.pods[pod.Name]; st != nil {
			r.hot[i] = st.hot
		}
	}
	r.offCapacity = e.offCapacity(set)
	return r
}

// offCapacity flags pods drained now or in the reference.
func (e *Engine) offCapacity(set []Pod) []bool {
	out := make([]bool, len(set))
	for i, pod := range set {
		if st := e.pods[pod.Name]; st != nil {
			out[i] = st.offCapacity()
		}
	}
	return out
}

// equalProposal is the fallback: the same weight for every pod, except
// that slow start still protects pods that are warming up.
func (e *Engine) equalProposal(now time.Time, set []Pod) []float64 {
	out := make([]float64, len(set))
	for i, pod := range set {
		out[i] = float64(e.params.MeanWeight) * e.params.rampFactor(pod, now)
	}
	return out
}

// ramping reports whether the pod is in slow start now or was when the
// reference weights were set; its weight then follows the ramp, not the
// reference.
func (e *Engine) ramping(pod Pod, now, refAt time.Time) bool {
	if e.params.rampFactor(pod, now) < 1 {
		return true
	}
	return !refAt.IsZero() && e.params.rampFactor(pod, refAt) < 1
}

// settle turns a proposal into weights to publish, against the reference
// (the weights Envoy has). Proposals are compared in shares, not absolute
// numbers, so a reference with another mean (seeded from an older version)
// is not rewritten for that alone. With stepBound, each pod that stays
// moves at most by MaxStep. If no pod moves past the dead band, pods that
// stay keep their reference weight exactly, so nothing needs writing unless
// the set of pods changed.
func (e *Engine) settle(now time.Time, set []Pod, proposal []float64, stepBound bool, rules moveRules) (weights map[string]uint32, changed, moved bool, maxMove float64) {
	flag := func(xs []bool, i int) bool { return xs != nil && xs[i] }
	ref, refAt := e.reference()
	n := len(set)
	inRef := make([]bool, n)
	steady := make([]bool, n)
	common := 0
	propSum, refSum := 0.0, 0.0
	for i, pod := range set {
		w, ok := ref[pod.Name]
		if !ok {
			continue
		}
		inRef[i] = true
		common++
		if !e.ramping(pod, now, refAt) && !flag(rules.offCapacity, i) {
			steady[i] = true
			propSum += proposal[i]
			refSum += float64(w)
		}
	}
	scale := 1.0
	if propSum > 0 && refSum > 0 {
		scale = propSum / refSum
	}

	if stepBound {
		factor := 1 + e.params.MaxStep
		for i, pod := range set {
			if steady[i] && !flag(rules.forced, i) {
				was := float64(ref[pod.Name]) * scale
				proposal[i] = min(max(proposal[i], was/factor), was*factor)
			}
		}
	}
	clampRatio(proposal, e.params.MaxRatio)

	for i, pod := range set {
		if !inRef[i] {
			continue
		}
		was := float64(ref[pod.Name]) * scale
		move := math.Abs(proposal[i]/was - 1)
		maxMove = max(maxMove, move)
		band := e.params.DeadBand
		if rules.bands != nil {
			band = rules.bands[i]
		}
		if flag(rules.hot, i) && proposal[i] < was {
			band = min(band, e.params.DeadBand/4)
		}
		if flag(rules.forced, i) {
			band = 0
		}
		if move >= band && roundWeight(proposal[i]) != roundWeight(was) {
			moved = true
		}
	}

	perPodCap := uint32(maxWeightSum / uint64(max(n, 1)))
	weights = make(map[string]uint32, n)
	for i, pod := range set {
		var w uint32
		switch {
		case moved:
			w = roundWeight(proposal[i])
		case inRef[i]:
			w = ref[pod.Name]
		default:
			w = roundWeight(proposal[i] / scale)
		}
		capped := min(max(w, 1), perPodCap)
		if inRef[i] && capped != ref[pod.Name] {
			changed = true // only capping can change a kept weight
		}
		weights[pod.Name] = capped
	}
	setChanged := common != n || common != len(ref)
	return weights, changed || moved || setChanged, moved, maxMove
}

// clampRatio keeps every value within ratio of the mean. Clamping moves the
// mean, so it repeats a few times; what remains is far below rounding.
func clampRatio(xs []float64, ratio float64) {
	if len(xs) == 0 {
		return
	}
	for range 8 {
		mean := 0.0
		for _, x := range xs {
			mean += x
		}
		mean /= float64(len(xs))
		lo, hi := mean/ratio, mean*ratio
		clamped := false
		for i, x := range xs {
			if x < lo {
				xs[i], clamped = lo, true
			} else if x > hi {
				xs[i], clamped = hi, true
			}
		}
		if !clamped {
			return
		}
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
