package main

import (
	"math"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// The best static weights: the promise solved exactly with what only the
// simulation knows, every pod's true cores and speed and the Service's true
// offered load. Each pod i is an M/M/c queue (c its cores, mu its service
// rate per core); the Service's expected request time is
// sum_i x_i T_i(x_i) / lambda, T_i the M/M/c mean time of a request (Erlang
// C) at arrival rate x_i. Minimising sum_i x_i T_i(x_i), that is the mean
// number of requests in the system (Little's law), subject to sum_i x_i =
// lambda and x_i <= bestCap * c_i mu_i, gives every pod that gets traffic
// below its cap the same marginal cost d(x T)/dx; pods whose marginal cost
// at zero load (their service time) is above it get nothing. The water level
// is found by bisection.
//
// The oracle runs the engine's own solver (weights.Split) on the true
// capacities and load. The engine also keeps every weight within MaxRatio
// of the mean, so a second oracle (oracle_bounded) clamps the same answer
// as the engine does: the optimizer's gap to it is what the estimates
// cost. bestSplit below solves the same problem with the exact Erlang C
// wait instead of the engine's approximation; the tests check that the
// engine's answer costs within a percent of the exact one.

// bestCap is the utilisation no pod is loaded past: the engine's cap
// (internal/weights, maxUtilisation).
const bestCap = 0.93

// mmcInSystem is the mean number of requests in an M/M/c queue of c
// servers at offered load a (in servers, a < c): a + the mean queue length
// C(c, a) (a/c)/(1 - a/c), Erlang C from the stable Erlang B recursion.
func mmcInSystem(c int, a float64) float64 {
	if a <= 0 {
		return 0
	}
	rho := a / float64(c)
	if rho >= 1 {
		return math.Inf(1)
	}
	b := 1.0
	for k := 1; k <= c; k++ {
		b = a * b / (float64(k) + a*b)
	}
	erlangC := b / (1 - rho*(1-b))
	return a + erlangC*rho/(1-rho)
}

// mmcMarginal is d(x T(x))/dx for a pod of c cores at service rate mu per
// core, at arrival rate x: (1/mu) dL/da, L the mean number in the system,
// by a central difference (one-sided at zero).
func mmcMarginal(c int, mu, x float64) float64 {
	a := x / mu
	h := 1e-6 * float64(c)
	lo := max(0, a-h)
	return (mmcInSystem(c, a+h) - mmcInSystem(c, lo)) / (a + h - lo) / mu
}

// bestRateAt is the arrival rate at which the pod's marginal cost is m,
// at most its cap; 0 when its cost at zero load (1/mu) is above m.
func bestRateAt(c int, mu, m float64) float64 {
	top := bestCap * float64(c) * mu
	if mmcMarginal(c, mu, 0) >= m {
		return 0
	}
	if mmcMarginal(c, mu, top) <= m {
		return top
	}
	lo, hi := 0.0, top
	for range 60 {
		mid := (lo + hi) / 2
		if mmcMarginal(c, mu, mid) < m {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// bestSplit returns the arrival rate each pod should get (cores c, service
// rate per core mu) for a total of lambda. When lambda exceeds every pod
// at its cap, the rates are the caps scaled up to lambda (capacity shares).
func bestSplit(c []int, mu []float64, lambda float64) []float64 {
	out := make([]float64, len(c))
	capSum := 0.0
	for i := range c {
		capSum += bestCap * float64(c[i]) * mu[i]
	}
	if lambda >= capSum {
		for i := range c {
			out[i] = bestCap * float64(c[i]) * mu[i] * lambda / capSum
		}
		return out
	}
	total := func(m float64) float64 {
		s := 0.0
		for i := range c {
			s += bestRateAt(c[i], mu[i], m)
		}
		return s
	}
	lo, hi := 0.0, 1.0
	for total(hi) < lambda {
		hi *= 2
	}
	for range 60 {
		m := (lo + hi) / 2
		if total(m) < lambda {
			lo = m
		} else {
			hi = m
		}
	}
	s := 0.0
	for i := range c {
		out[i] = bestRateAt(c[i], mu[i], hi)
		s += out[i]
	}
	for i := range out {
		out[i] *= lambda / s // the last bisection step's rounding
	}
	return out
}

// bestWeights are the best static weights: the bound on what weights
// alone can do, given perfect knowledge (see staticCtl).
func bestWeights(s *sim) []float64 { return bestWeightsWithin(s, math.Inf(1)) }

// boundedWeights are the best static weights within the ratio of the mean
// the optimizer's engine keeps its weights in (Params.MaxRatio): what the
// engine converges to when its estimates are right, so that the optimizer's
// gap to them is what the estimates cost and theirs to bestWeights is the
// bound's.
func boundedWeights(s *sim) []float64 { return bestWeightsWithin(s, benchEngineParams().MaxRatio) }

func bestWeightsWithin(s *sim, ratio float64) []float64 {
	c := make([]float64, len(s.hosts))
	mu := make([]float64, len(s.hosts))
	for i, h := range s.hosts {
		c[i] = float64(s.pods[h].cores)
		mu[i] = s.pods[h].speed / s.workMean
	}
	x := weights.SplitWithin(c, mu, s.lambdaC*float64(len(s.clients)), ratio)
	mean := 0.0
	for _, v := range x {
		mean += v / float64(len(x))
	}
	// Within a ratio, the mean weight the engine scales to (its floor
	// rounds by at most half a percent); 1000 unbounded, where a starved
	// pod's weight rounds to 0.
	scale := 1000.0
	if ratio >= 1 && !math.IsInf(ratio, 1) {
		scale = weights.Params{MaxRatio: ratio}.MeanWeight()
	}
	w := make([]float64, s.P)
	for i, h := range s.hosts {
		w[h] = math.Round(scale * x[i] / mean) // below 1 is published as 1
	}
	return w
}
