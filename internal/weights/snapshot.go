package weights

import (
	"math"
	"slices"
	"time"
)

// Snapshot is what an engine has learned that the live weights do not
// show: how noisy the observations are, and how sure its estimates. It is
// a few numbers whatever the number of pods, so the operator can persist
// it next to the optimizer and give it to the engine of a restarted or
// newly elected manager (see SeedSettled and SeedLearning). The
// capacities themselves are in the live weights.
type Snapshot struct {
	// Noise is the typical error of one capacity observation (log scale).
	Noise float64 `json:"noise"`
	// NoiseCycles is how many cycles measured it (capped).
	NoiseCycles int `json:"noiseCycles"`
	// CycleSeconds is the time between cycles with data.
	CycleSeconds float64 `json:"cycleSeconds,omitempty"`
	// CoresNoise is the typical noise of one cores reading of a pod
	// without a CPU limit (log scale): the median over such pods of their
	// residuals' spread; 0 when no pod has measured one.
	CoresNoise float64 `json:"coresNoise,omitempty"`
	// CoresNoiseMax is the largest of those spreads: how noisy a pod's
	// cores readings can be in this Service (a pod whose cores are a
	// small part of its node reads them noisier), for a restart's
	// readings of a pod before they measure its own. Written with the
	// others, never a reason to write (see Similar).
	CoresNoiseMax float64 `json:"coresNoiseMax,omitempty"`
	// Spread is the uncertainty of the engine's least sure capacity
	// estimate (log scale, its standard deviation, at most 1); 0 when no
	// pod has one. A restart that finds the manager before still learning
	// takes the live weights with it (SeedLearning): every pod as unsure
	// as that one, for the live weights do not say which pods were unsure,
	// and a typical pod's uncertainty given to the pods that kept the
	// manager before from Learned would declare them learned.
	Spread float64 `json:"spread,omitempty"`
}

// Snapshot returns the engine's learned noise and its estimates' spread.
// Zero (Valid false) before the engine measured any noise.
func (e *Engine) Snapshot() Snapshot {
	if e.speedNoiseUnmeasured() {
		return Snapshot{}
	}
	var spreads []float64
	spread := 0.0 // the least sure capacity estimate's standard deviation
	for _, st := range e.pods {
		if st.cores.known && len(st.coresResiduals) >= 3 {
			spreads = append(spreads, math.Sqrt(spreadVariance(st.coresResiduals)))
		}
		if st.speed.known {
			v := st.speed.v
			if st.cores.known {
				v += st.cores.v
			}
			spread = max(spread, math.Sqrt(v))
		}
	}
	// Until the pods measure their own (after a restart), the noises the
	// engine before measured stand: reported as none, they were written
	// over the persisted ones, and a second restart lost them.
	cores, coresMax := e.coresNoise, e.coresNoiseMax
	if len(spreads) > 0 {
		cores, coresMax = boundNoise(median(spreads)), boundNoise(slices.Max(spreads))
	}
	return Snapshot{Noise: e.noise, NoiseCycles: e.noiseCycles, CycleSeconds: e.meanCycle.Seconds(), CoresNoise: cores, CoresNoiseMax: coresMax, Spread: min(spread, 1)}
}

// Valid reports whether s holds a measured noise in the engine's range
// (positive, and at most boundNoise's ceiling).
func (s Snapshot) Valid() bool {
	return s.NoiseCycles > 0 && !math.IsNaN(s.Noise) && s.Noise > 0 && s.Noise <= boundNoise(s.Noise)
}

// Similar reports whether s and o differ by less than persisting is
// worth: noise within 20% (the noise's own estimate, averaged over a few
// cycles, moves by that much), the cycle within 10% (a mean over the
// estimates' memory: a policy's jitter of up to half a scrape interval
// either way moves one gap by up to 25% of a 30 s cycle, its mean over 20
// gaps by about 2%, while a changed cycle setting moves it by more), and the
// same count of cycles up to the few the noise is first averaged over,
// and the cores readings' noise measured or not and within a factor of two
// (a median of spreads over 20 readings a pod, it wanders by a quarter;
// within 20% it was worth writing 5-15 times in 200 cycles, and as the
// prior of a restart's first three readings a factor of two is close
// enough), and the estimates' spread likewise (it falls by more than a
// factor of two only in the first cycles of learning). The noisiest pod's
// cores readings' noise is not compared: one pod's spread, compared as
// the typical one it made the snapshot worth writing 9 times in 16 runs of
// 200 cycles of pods without limits, against 6 without it
// (TestSnapshotStillUnderCycleJitter), and as a bound on a restart's first
// readings it is fresh enough written with the others (the first time
// with the typical one). Noise keeps moving a little every
// cycle; persisting each move would write every cycle.
func (s Snapshot) Similar(o Snapshot) bool {
	if s.Valid() != o.Valid() {
		return false
	}
	if !s.Valid() {
		return true
	}
	near := func(a, b, tol float64) bool { return math.Abs(math.Log(max(a, 1e-9)/max(b, 1e-9))) <= tol }
	prior := func(a, b float64) bool { return (a > 0) == (b > 0) && (a == 0 || near(a, b, math.Ln2)) }
	return near(s.Noise, o.Noise, 0.2) && near(s.CycleSeconds, o.CycleSeconds, 0.1) &&
		min(s.NoiseCycles, 5) == min(o.NoiseCycles, 5) &&
		prior(s.CoresNoise, o.CoresNoise) && prior(s.Spread, o.Spread)
}

// Restore takes back what an engine that ran before measured of the
// metrics and the cycles, whatever it had learned of the pods: the noise
// of a speed reading (with the count of cycles it rests on), the mean
// cycle, and the noise of a cores reading of a pod without a limit
// (typical and largest). They are properties of the Service's metrics
// pipeline and schedule, not of any estimate. An invalid s (none persisted yet) leaves the priors. Call
// it before Seed, whose weights then meet the publish bar the manager
// before had measured rather than the prior's.
func (e *Engine) Restore(s Snapshot) {
	if !s.Valid() {
		return
	}
	e.noise = boundNoise(s.Noise)
	e.noiseCycles = min(s.NoiseCycles, e.params.memory())
	if c := time.Duration(s.CycleSeconds * float64(time.Second)); c > 0 && !math.IsInf(s.CycleSeconds, 0) {
		e.meanCycle, e.gaps = c, e.params.memory()
	}
	if s.CoresNoise > 0 && !math.IsInf(s.CoresNoise, 0) {
		e.coresNoise = boundNoise(s.CoresNoise)
	}
	if s.CoresNoiseMax > 0 && !math.IsInf(s.CoresNoiseMax, 0) {
		e.coresNoiseMax = boundNoise(s.CoresNoiseMax)
	}
}

// SeedSettled is Seed for a manager that takes over from one that ran
// before: the live weights are what that engine decided, so each pod's
// first cycle with data takes the capacity that makes its weight the
// solver's answer at the load it measures, with the variances of
// estimates that have settled (a settled filter's variance is Smoothing
// times a reading's), and with the noises s measured restored (of a
// speed reading, and of a cores reading of a pod without a limit). The
// live weights do not show a pod's cores apart from its speed, so a pod
// without a CPU limit takes its cores from its first reading, as a settled
// estimate too: the engine before had learned them, and an estimate
// resting on one fresh reading would not be confident enough for Learned,
// which would flip the mesh to LEAST_REQUEST and back on every restart.
// Noise then moves nothing, as it moved nothing for the manager before; a
// real change is still found by the CUSUM and jump tests. An invalid s
// (none persisted yet) leaves the noise at its prior.
func (e *Engine) SeedSettled(now time.Time, w map[string]uint32, s Snapshot) {
	e.Restore(s)
	e.seedCalibrated(now, w, e.params.Smoothing*e.noise*e.noise)
}

// SeedLearning is SeedSettled for a manager that takes over from one
// still learning: the live weights are that engine's estimates as far as
// they had come, so they are calibrated as SeedSettled's are, every pod
// with the uncertainty of that engine's least sure estimate (s.Spread) in
// place of a settled estimate's, and the learning goes on from there.
// Seeded with the variance of knowing nothing (Seed), the first cycle's
// readings replaced weights a few percent off their targets: on CPU alone
// without CPU limits at 80-90% load, restarts halfway through bench runs
// moved them by up to 103%. An invalid s, or one without a Spread
// (persisted before it was measured), leaves Seed's.
func (e *Engine) SeedLearning(now time.Time, w map[string]uint32, s Snapshot) {
	e.Restore(s)
	if !s.Valid() || !(s.Spread > 0) || math.IsInf(s.Spread, 0) {
		e.Seed(now, w)
		return
	}
	e.seedCalibrated(now, w, max(e.params.Smoothing*e.noise*e.noise, min(s.Spread*s.Spread, 1)))
}

// seedCalibrated seeds the live weights w as estimates of the given
// variance, each to be calibrated at its pod's first cycle with data
// (see calibrateTo).
func (e *Engine) seedCalibrated(now time.Time, w map[string]uint32, variance float64) {
	e.seed(now, w, variance)
	for name := range w {
		if st := e.pods[name]; st != nil {
			st.speed.n = e.params.memory()
			st.coresSettled = true
			st.calibrate = true
		}
	}
}
