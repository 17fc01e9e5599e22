package main

import (
	"math"
	"slices"
)

// staticCtl publishes the weights its rule computes from the truth, at
// its start and, once applied, whenever the capacities, the load or the
// pod set change: the oracles, the limits for static weights. oracleWeights
// gives capacity-proportional weights, bestWeights the best static ones.
type staticCtl struct{ weights func(s *sim) []float64 }

func oracleWeights(s *sim) []float64 {
	w := make([]float64, s.P)
	sum := 0.0
	for _, h := range s.hosts {
		sum += float64(s.pods[h].cores) * s.pods[h].speed
	}
	mean := sum / float64(len(s.hosts))
	for _, h := range s.hosts {
		w[h] = math.Round(1000 * float64(s.pods[h].cores) * s.pods[h].speed / mean)
	}
	return w
}

func (c staticCtl) start(s *sim)       { s.publish(c.weights(s)) }
func (staticCtl) cycle(*sim)           {}
func (c staticCtl) podsChanged(s *sim) { c.truthChanged(s) }
func (c staticCtl) truthChanged(s *sim) {
	if s.applied() {
		s.publish(c.weights(s))
	}
}

// cpuSignals reads rate(cpu[window]) for every host; NaN when no data.
func cpuSignals(s *sim) []float64 {
	out := make([]float64, len(s.hosts))
	for i, h := range s.hosts {
		out[i], _ = s.promRate(h, seriesCPU)
	}
	return out
}

// seedInitialWeight is the weight the seed operator gives a pod it has not
// weighted yet.
const seedInitialWeight = 1000

// seedDevCtl is the seed operator's "dev" rule, run every cycle on the
// measured CPU (cores) of each pod:
//
//	avg = mean CPU of pods with CPU > 0
//	alpha = 0 if |cpu-avg|/avg < 0.05 else (cpu-avg)*0.01/avg; multiplier = 1-alpha
//	w = trunc(clamp(w * multiplier of the previous cycle, 100, 600))
//	w = trunc(w * 350 / median(w))
//
// A pod without data keeps multiplier 1. When no pod has CPU > 0 the seed
// computes NaN and its write fails: nothing is published. It writes every
// cycle otherwise, changed or not.
type seedDevCtl struct {
	w, mult []float64 // by pod index
}

func (c *seedDevCtl) start(s *sim) {
	c.w = make([]float64, s.P)
	c.mult = make([]float64, s.P)
	for _, h := range s.hosts {
		c.w[h], c.mult[h] = seedInitialWeight, 1
	}
	s.publish(slices.Clone(c.w))
}

func (c *seedDevCtl) cycle(s *sim) {
	w, mult := gather(c.w, s.hosts), gather(c.mult, s.hosts)
	if !seedDevStep(w, mult, cpuSignals(s)) {
		return // NaN: failed write
	}
	scatter(c.w, s.hosts, w)
	scatter(c.mult, s.hosts, mult)
	s.publish(slices.Clone(c.w))
}

// seedDevStep applies the dev rule in place to the weights and multipliers
// of the current pods given their CPU (NaN = no data). false when no pod has
// CPU > 0 (the seed computes NaN and fails to write).
func seedDevStep(w, mult, cpu []float64) bool {
	sum, n := 0.0, 0
	for _, v := range cpu {
		if v > 0 {
			sum += v
			n++
		}
	}
	if n == 0 {
		return false
	}
	avg := sum / float64(n)
	for i := range w {
		w[i] = math.Trunc(min(max(w[i]*mult[i], 100), 600))
		alpha := 0.0
		if v := cpu[i]; !math.IsNaN(v) && math.Abs(v-avg)/avg >= 0.05 {
			alpha = (v - avg) * 0.01 / avg
		}
		mult[i] = 1 - alpha
	}
	med := median(w)
	for i := range w {
		w[i] = math.Trunc(w[i] * 350 / med)
	}
	return true
}

func gather(byPod []float64, hosts []int32) []float64 {
	out := make([]float64, len(hosts))
	for i, h := range hosts {
		out[i] = byPod[h]
	}
	return out
}

func scatter(byPod []float64, hosts []int32, v []float64) {
	for i, h := range hosts {
		byPod[h] = v[i]
	}
}

func (c *seedDevCtl) podsChanged(s *sim) {
	for _, h := range s.hosts {
		if c.w[h] == 0 {
			c.w[h], c.mult[h] = seedInitialWeight, 1
		}
	}
	s.publish(slices.Clone(c.w))
}

func (c *seedDevCtl) truthChanged(*sim) {}

// seedMainCtl is the seed operator's "main" rule, every cycle:
//
//	T = sum of weights
//	if mean CPU < 0.2 cores: every weight = 600
//	else share_i = (avg/cpu_i) w_i / sum_j (avg/cpu_j) w_j x T
//	     w_i += 0.15 (share_i - w_i), an increase capped at (T/N)/4
//
// over pods with CPU > 0 (the others keep their weight); weights are
// integers (truncated). Written every cycle.
type seedMainCtl struct {
	w []float64
}

func (c *seedMainCtl) start(s *sim) {
	c.w = make([]float64, s.P)
	for _, h := range s.hosts {
		c.w[h] = seedInitialWeight
	}
	s.publish(slices.Clone(c.w))
}

func (c *seedMainCtl) cycle(s *sim) {
	w := gather(c.w, s.hosts)
	if !seedMainStep(w, cpuSignals(s)) {
		return // NaN: failed write
	}
	scatter(c.w, s.hosts, w)
	s.publish(slices.Clone(c.w))
}

// seedMainStep applies the main rule in place; false when no pod has CPU > 0.
func seedMainStep(w, cpu []float64) bool {
	T := 0.0
	for _, v := range w {
		T += v
	}
	sum, n := 0.0, 0
	for _, v := range cpu {
		if v > 0 {
			sum += v
			n++
		}
	}
	if n == 0 {
		return false
	}
	avg := sum / float64(n)
	if avg < 0.2 {
		for i := range w {
			w[i] = 600
		}
		return true
	}
	R := 0.0
	for i := range w {
		if cpu[i] > 0 {
			R += avg / cpu[i] * w[i]
		}
	}
	capInc := T / float64(len(w)) / 4
	for i := range w {
		if !(cpu[i] > 0) {
			continue
		}
		share := avg / cpu[i] * w[i] / R * T
		d := 0.15 * (share - w[i])
		if d > capInc {
			d = capInc
		}
		w[i] = math.Max(1, math.Trunc(w[i]+d))
	}
	return true
}

func (c *seedMainCtl) podsChanged(s *sim) {
	for _, h := range s.hosts {
		if c.w[h] == 0 {
			c.w[h] = seedInitialWeight
		}
	}
	s.publish(slices.Clone(c.w))
}

func (c *seedMainCtl) truthChanged(*sim) {}

// median of a copy; the mean of the two middle values for an even count.
func median(v []float64) float64 {
	x := slices.Clone(v)
	slices.Sort(x)
	n := len(x)
	if n%2 == 1 {
		return x[n/2]
	}
	return (x[n/2-1] + x[n/2]) / 2
}
