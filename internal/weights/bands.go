package weights

import "math"

// moveBands returns, per pod, the relative move that justifies a write:
// the dead band, plus what the estimate's own noise could explain
// (noiseSigmas standard deviations of the smoothed estimate). A smaller
// move is not evidence that the weight is wrong, and writing it would only
// publish noise.
//
// A weight computed from a rough estimate (just after a change, few
// observations) may be off by up to that wider band. Once the estimate has
// matured, the weight is refined, once, against a quarter of the dead
// band, so that the early error is corrected at a known moment rather than
// by chance much later, when noise happens to carry it past the band.
func (e *Engine) moveBands(set []Pod) []float64 {
	return e.bands(set, true)
}

// poolBands returns, per pod, the scale on which the split tells its
// speed from another's (see poolSpeeds): the dead band plus the estimate's
// noise, as for a write, without the refinement's narrower band (a pod
// would be pooled less for the one cycle it is refined in).
func (e *Engine) poolBands(set []Pod) []float64 {
	return e.bands(set, false)
}

// bands is the dead band plus noiseSigmas standard deviations of each
// pod's smoothed estimate; with refine, a quarter of the dead band for a
// pod whose weight is due its refinement.
func (e *Engine) bands(set []Pod, refine bool) []float64 {
	out := make([]float64, len(set))
	inflation := e.overlapInflation()
	for i, pod := range set {
		band, g := e.params.DeadBand, 1.0
		if st := e.pods[pod.Name]; st != nil && st.known {
			g = e.gain(st)
			if refine && e.refinable(st) {
				band /= 4
			}
		}
		out[i] = band + noiseSigmas*e.noise*math.Sqrt(smoothedVariance(g)*inflation)
	}
	return out
}

// refinable reports whether the pod's weight was computed from an estimate
// much rougher than the current one: from a bound or a blurred view while
// there is now a sharp measurement, or from few observations while the
// estimate has now matured (it averages 1/Smoothing observations, and its
// variance is refineRatio times smaller).
func (e *Engine) refinable(st *podState) bool {
	g := e.gain(st)
	if st.publishedGain >= 1 && st.measurements > 0 {
		return true
	}
	return g <= e.params.Smoothing && smoothedVariance(st.publishedGain) >= refineRatio*smoothedVariance(g)
}

// refineRatio: see refinable.
const refineRatio = 2.5

// overlapInflation is how much more a smoothed estimate wanders because
// consecutive observations share data: a 1m rate queried every 30s sees
// half of the previous window again, so its errors are correlated (the
// variance of an average of AR(1) errors grows by (1+rho)/(1-rho)).
func (e *Engine) overlapInflation() float64 {
	if e.cycle <= 0 {
		return 1
	}
	rho := min(max(1-float64(e.cycle)/float64(e.params.QueryWindow), 0), 0.9)
	return (1 + rho) / (1 - rho)
}

// smoothedVariance is the variance of an exponential average with gain g
// relative to that of one observation.
func smoothedVariance(g float64) float64 {
	g = min(max(g, 0), 1)
	return g / (2 - g)
}

// notePublished records, for every pod with an estimate, how rough that
// estimate was when its weight was computed from it. Without a write,
// matured pods whose weights were within a quarter of the dead band count as
// refined.
func (e *Engine) notePublished(set []Pod, written bool) {
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.known && (written || e.refinable(st)) {
			st.publishedGain = e.gain(st)
		}
	}
}

// noiseSigmas: see moveBands.
const noiseSigmas = 3
