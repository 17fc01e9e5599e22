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
// pod's smoothed estimate; with refine (for a write), the dead band is
// narrowed by the load (see loadNarrowing), and a quarter of it for a pod whose
// weight is due its refinement.
func (e *Engine) bands(set []Pod, refine bool) []float64 {
	out := make([]float64, len(set))
	inflation := e.overlapInflation()
	dead := e.params.DeadBand
	if refine {
		dead *= loadNarrowing(e.serviceLoad(set))
	}
	for i, pod := range set {
		band, g := dead, 1.0
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

// A weight a few percent over a pod's capacity costs little at moderate
// load and much near capacity: at utilisation rho, a pod sent e more than
// its share waits about e*rho/(1-rho) longer (M/M/1): 2.3e at 70% load,
// 5.7e at 85%. The dead band of a write narrows by that factor against its
// value at loadBandFrom, down to minLoadBand of it (see loadNarrowing,
// which bands applies to a write's band): at 80% load a gap of
// 2.9% (plus the noise term) is written, from about 82% one of 2.5%
// (plus the noise term). The noise term of the band is
// untouched, so noise is still not written, and below loadBandFrom
// nothing changes. The load is the Service's offered work over its
// capacity, both as estimated (see serviceLoad).
//
// Measured in the bench: on 1, 2, 4 and 8 core mixes without limits at
// 85% load with 32 and 64 clients, p99 went from 0.995-1.117x the
// oracle's to 0.978-1.045x; after a pod slows to a third (87.5% load)
// from 1.045x to 1.036x on average, every run at or below 1.1x; at the
// cost of more writes near capacity (four hardware classes at 85% load:
// 19 in 20 minutes instead of 9). With CPU alone it applies too: three
// CPU generations without limits at 90% load, whose miss was a weight a
// few percent high inside the dead band, went from 0.85-1.00x to
// 0.85-0.99x.
const (
	loadBandFrom = 0.7
	minLoadBand  = 0.5
)

// loadNarrowing is the factor the dead band is narrowed by at load rho
// (see loadBandFrom): 1 for a load that is not above loadBandFrom
// (unknown included).
func loadNarrowing(rho float64) float64 {
	if !(rho > loadBandFrom) || math.IsInf(rho, 0) {
		return 1
	}
	f := ((1 - rho) / rho) / ((1 - loadBandFrom) / loadBandFrom)
	return min(max(f, minLoadBand), 1)
}

// serviceLoad is the Service's offered work (Engine.offered: busy cores
// times speed per core) over its capacity (cores times speed per core),
// both as estimated; 0 when either is unknown, as for a pod whose cores
// nothing bounds.
func (e *Engine) serviceLoad(set []Pod) float64 {
	if !(e.offered > 0) {
		return 0
	}
	_, perCore := e.capacitiesPerCore(set)
	sum := 0.0
	for i, pod := range set {
		c := e.coresOf(pod)
		if !(c > 0) {
			return 0
		}
		sum += c * perCore[i]
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		return 0
	}
	return e.offered / sum
}
