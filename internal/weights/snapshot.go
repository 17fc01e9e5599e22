package weights

import (
	"math"
	"time"
)

// Snapshot is what an engine has learned that the live weights do not
// show: how noisy the observations are. It is a few numbers whatever the
// number of pods, so the operator can persist it next to the optimizer and
// give it to the engine of a restarted or newly elected manager (see
// SeedSettled). The capacities themselves are in the live weights.
type Snapshot struct {
	// Noise is the typical error of one capacity observation (log scale).
	Noise float64 `json:"noise"`
	// NoiseCycles is how many cycles measured it (capped).
	NoiseCycles int `json:"noiseCycles"`
	// CycleSeconds is the time between cycles with data.
	CycleSeconds float64 `json:"cycleSeconds,omitempty"`
}

// Snapshot returns the engine's learned noise. Zero (Valid false) before
// the engine measured any.
func (e *Engine) Snapshot() Snapshot {
	if e.noiseCycles == 0 {
		return Snapshot{}
	}
	return Snapshot{Noise: e.noise, NoiseCycles: e.noiseCycles, CycleSeconds: e.cycle.Seconds()}
}

// Valid reports whether s holds a measured noise in the engine's range.
func (s Snapshot) Valid() bool {
	return s.NoiseCycles > 0 && !math.IsNaN(s.Noise) && s.Noise >= minNoise && s.Noise <= 0.5
}

// Similar reports whether s and o differ by less than a persisting is
// worth: noise within 20%, the cycle within 10%. Noise keeps moving a little
// every cycle; persisting each move would write every cycle.
func (s Snapshot) Similar(o Snapshot) bool {
	if s.Valid() != o.Valid() {
		return false
	}
	if !s.Valid() {
		return true
	}
	near := func(a, b, tol float64) bool { return math.Abs(math.Log(max(a, 1e-9)/max(b, 1e-9))) <= tol }
	return near(s.Noise, o.Noise, 0.2) && near(s.CycleSeconds, o.CycleSeconds, 0.1) &&
		min(s.NoiseCycles, maxNoiseCycles) == min(o.NoiseCycles, maxNoiseCycles)
}

// maxNoiseCycles is the cap of Engine.noiseCycles (see measureNoise).
const maxNoiseCycles = 5

// SeedSettled is Seed for a manager that takes over from one that ran
// before: the live weights are taken as settled estimates, averaged over
// as many observations as the smoothing keeps (not as rough first guesses,
// which the next noisy observation would move), and the noise s measured
// is restored, so that noise inside the dead band moves nothing, as it
// moved nothing for the manager before. A real change of a pod is still
// found by the jump and drift tests, as in a long-running engine. An
// invalid s (none persisted yet) leaves the noise unmeasured.
func (e *Engine) SeedSettled(now time.Time, w map[string]uint32, s Snapshot) {
	e.Seed(now, w)
	if s.Valid() {
		e.noise = s.Noise
		e.noiseCycles = min(s.NoiseCycles, maxNoiseCycles)
		if c := time.Duration(s.CycleSeconds * float64(time.Second)); c > 0 && !math.IsInf(s.CycleSeconds, 0) {
			e.cycle = c
		}
	}
	settled := int(math.Ceil(1 / e.params.Smoothing))
	for name := range w {
		if st := e.pods[name]; st != nil && st.measurements < settled {
			st.measurements = settled
			st.publishedGain = e.gain(st)
		}
	}
}
