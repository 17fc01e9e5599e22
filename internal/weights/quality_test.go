package weights

import (
	"fmt"
	"testing"
	"time"
)

// convergedWithin is the quality target: every pod's weight share within
// 5% (relative) of its capacity share.
const convergedWithin = 0.05

// trackedWithin is what following a change is judged by: a weight that is
// off by less than the dead band is left alone on purpose, so after a
// change the error settles anywhere below about the dead band.
const trackedWithin = 0.075

// runUntilConverged steps the loop up to maxCycles and returns the first
// cycle (1-based) after which the share error is within convergedWithin,
// or -1.
func runUntilConverged(l *closedLoop, maxCycles int) int {
	return runUntilWithin(l, maxCycles, convergedWithin)
}

func runUntilWithin(l *closedLoop, maxCycles int, within float64) int {
	for k := 1; k <= maxCycles; k++ {
		l.step()
		if l.shareError() <= within {
			return k
		}
	}
	return -1
}

// slowAndRecover runs the loop 10 cycles, slows its first pod to a third,
// runs until the weights track it within trackedWithin (at most 12
// cycles), runs 10 more, restores the pod, and runs until they track it
// again: the cycles each took, -1 for never.
func slowAndRecover(l *closedLoop) (slowed, recovered int) {
	for range 10 {
		l.step()
	}
	l.speed[0] /= 3
	slowed = runUntilWithin(l, 12, trackedWithin)
	for range 10 {
		l.step()
	}
	l.speed[0] *= 3
	return slowed, runUntilWithin(l, 12, trackedWithin)
}

// phases are offsets of the scrape schedule against the query schedule:
// which samples a rate() sees, and how stale the newest one is, depends
// on them.
var phases = []time.Duration{0, 5 * time.Second, 10 * time.Second}

func TestConvergesFromEqualWeightsWithinThreeCyclesOrSixOnCPUAlone(t *testing.T) {
	tests := map[string]loopConfig{
		// Istio request metrics: speed is requests per CPU-second, exact.
		"request rates": {useRequests: true},
		// CPU only, CPU limits known: a saturated pod is recognised.
		"CPU only": {knownCores: true},
		// Request rates work without CPU limits too.
		"request rates, limits unknown": {useRequests: true, knownCores: false},
	}
	for name, cfg := range tests {
		for _, phase := range phases {
			t.Run(fmt.Sprintf("%s/phase %v", name, phase), func(t *testing.T) {
				cfg.speeds, cfg.load, cfg.phase = hetero12(), 0.8, phase
				l := newClosedLoop(t, cfg)
				// On CPU alone a pod the equal weights overloaded shows
				// only a bound on its speed (a censored reading): the
				// filter backs off below the bound by the gap it found
				// and the next readings settle it, two or three cycles
				// more than with request rates.
				budget := 3
				if !cfg.useRequests {
					budget = 6
				}
				cycles := runUntilConverged(l, budget)
				t.Logf("within 5%% after %d cycle(s), error %.3f", cycles, l.shareError())
				if cycles < 0 {
					t.Fatalf("share error %.3f after %d cycles, want <= %.2f", l.shareError(), budget, convergedWithin)
				}
				for ; cycles < budget; cycles++ {
					l.step()
				}
				if l.shareError() > convergedWithin {
					t.Fatalf("share error %.3f after %d cycles, want <= %.2f", l.shareError(), budget, convergedWithin)
				}
				// It stays converged, and steady state is quiet.
				writes := 0
				for k := range 40 {
					res := l.step()
					if l.shareError() > convergedWithin {
						t.Fatalf("cycle %d: share error %.3f after converging", k+cycles+1, l.shareError())
					}
					if res.Changed && k >= 10 {
						writes++
					}
				}
				if writes > 3 {
					t.Errorf("%d writes in 30 steady cycles, want at most one per 10", writes)
				}
			})
		}
	}
}

// Without CPU limits a saturated pod's CPU cannot show how far it is
// overloaded, so the first estimate of the slow pods is too high and it
// takes a few more cycles. This pins the behaviour and reports it.
func TestConvergesWithCPUOnlyAndUnknownLimits(t *testing.T) {
	for _, phase := range phases {
		l := newClosedLoop(t, loopConfig{speeds: hetero12(), load: 0.8, phase: phase})
		cycles := runUntilConverged(l, 12)
		t.Logf("phase %v: within 5%% after %d cycles", phase, cycles)
		if cycles < 0 || cycles > 10 {
			t.Errorf("phase %v: converged after %d cycles, want at most 10", phase, cycles)
		}
	}
}

// Below saturation, CPU alone is exact from the first cycle.
func TestConvergesInOneCycleWithCPUOnlyBelowSaturation(t *testing.T) {
	l := newClosedLoop(t, loopConfig{speeds: hetero12(), load: 0.45, phase: 5 * time.Second})
	if cycles := runUntilConverged(l, 3); cycles != 1 {
		t.Errorf("converged after %d cycles, want 1", cycles)
	}
}

func TestSteadyStateIgnoresNoise(t *testing.T) {
	identical := make([]float64, 12)
	for i := range identical {
		identical[i] = 1
	}
	for _, speeds := range [][]float64{hetero12(), identical} {
		for _, useRequests := range []bool{true, false} {
			for seed := range uint64(3) {
				name := fmt.Sprintf("speeds %v requests %v seed %d", speeds[8], useRequests, seed)
				t.Run(name, func(t *testing.T) {
					// Every CPU sample (each scrape interval's CPU time) is off
					// by a random error of up to 10%.
					l := newClosedLoop(t, loopConfig{speeds: speeds, load: 0.8, phase: 5 * time.Second,
						useRequests: useRequests, knownCores: true, cpuNoise: 0.1, uniform: true, seed: seed})
					// Learning: the first writes rest on rough estimates,
					// and each is refined once the filters have settled
					// (their variance reaches Smoothing's floor after
					// about 1/Smoothing readings) and show it off by more
					// than their noise, which at 0.8 load on a 1-0.35 speed mix took up to
					// 175 cycles.
					early := 0
					for range 200 {
						if l.step().Changed {
							early++
						}
					}
					for k := range 200 {
						res := l.step()
						if res.Changed {
							t.Fatalf("steady cycle %d: weights moved past the dead band on noise (%s)", k+1, res.Message)
						}
						// Without writes, what is left is the early error, up
						// to the dead band plus the estimate's noise.
						if err := l.shareError(); err > 0.10 {
							t.Fatalf("steady cycle %d: share error %.3f", k+1, err)
						}
					}
					t.Logf("%d writes while learning (200 cycles), none in 200 steady cycles; noise measured %.3f, share error %.3f",
						early, l.engine.noise, l.shareError())
				})
			}
		}
	}
}

func TestIdenticalPodsStayEqual(t *testing.T) {
	identical := make([]float64, 12)
	for i := range identical {
		identical[i] = 1
	}
	for _, useRequests := range []bool{true, false} {
		for _, phase := range phases {
			l := newClosedLoop(t, loopConfig{speeds: identical, load: 0.8, phase: phase, useRequests: useRequests, knownCores: true})
			for k := range 40 {
				res := l.step()
				if res.Changed {
					t.Fatalf("requests %v phase %v cycle %d: Changed on identical pods: %v", useRequests, phase, k+1, res.Weights)
				}
				for name, w := range res.Weights {
					if w != uint32(DefaultParams().MeanWeight()) {
						t.Fatalf("cycle %d: %s has weight %d, want %d", k+1, name, w, uint32(DefaultParams().MeanWeight()))
					}
				}
			}
		}
	}
}

// A pod that slows down (noisy neighbour, thermal throttling) loses
// traffic within a few cycles; one that recovers gets it back. With
// request rates the change shows at once; with CPU only, an overloaded pod
// just shows its limit, and weights are cut step by step until it is not.
func TestFollowsAPodThatSlowsDown(t *testing.T) {
	tests := map[string]struct {
		useRequests bool
		maxCycles   int
	}{
		"request rates": {useRequests: true, maxCycles: 3},
		"CPU only":      {useRequests: false, maxCycles: 8},
	}
	for name, tc := range tests {
		for _, phase := range phases {
			l := newClosedLoop(t, loopConfig{speeds: hetero12(), load: 0.8, phase: phase, useRequests: tc.useRequests, knownCores: true})
			slowed, recovered := slowAndRecover(l)
			t.Logf("%s, phase %v: within 7.5%% %d cycles after a pod slowed to a third, %d after it recovered",
				name, phase, slowed, recovered)
			if slowed < 0 || slowed > tc.maxCycles || recovered < 0 || recovered > tc.maxCycles {
				t.Errorf("%s, phase %v: took %d and %d cycles, want at most %d", name, phase, slowed, recovered, tc.maxCycles)
			}
		}
	}
}

// Two pods never measure their readings' noise (measureNoise needs three
// narrow readings a cycle), so a restart of either's speed estimate is not
// followed as a change (see estimate): the dead band holds, and the bar
// judges the restarted estimate as only begun. A real slowdown is still
// followed, within TestFollowsAPodThatSlowsDown's bound for CPU alone (8
// cycles), where followed as a change it took up to 5 (at request rates;
// CPU alone on two pods does not come within 7.5% in 12 cycles either way,
// and is not asserted).
func TestTwoPodsFollowASlowdown(t *testing.T) {
	const maxCycles = 8
	for _, phase := range phases {
		l := newClosedLoop(t, loopConfig{speeds: []float64{1, 0.6}, load: 0.8, phase: phase, useRequests: true, knownCores: true})
		slowed, recovered := slowAndRecover(l)
		t.Logf("phase %v: within 7.5%% %d cycles after a pod slowed to a third, %d after it recovered (noise measured in %d cycles)",
			phase, slowed, recovered, l.engine.noiseCycles)
		if slowed < 0 || slowed > maxCycles || recovered < 0 || recovered > maxCycles {
			t.Errorf("phase %v: took %d and %d cycles, want at most %d", phase, slowed, recovered, maxCycles)
		}
	}
}

// Identical pods whose CPU readings carry a few percent of noise, from
// opt-in: the first estimates rest on a reading or two, and the gaps
// between them are noise that the bar judges by those estimates' own
// variance, not a settled one's, so no weight moves. (Judged as settled,
// the gaps passed the bar once a run near full load.)
func TestIdenticalNoisyPodsStayEqualFromOptIn(t *testing.T) {
	identical := make([]float64, 12)
	for i := range identical {
		identical[i] = 1
	}
	for _, load := range []float64{0.8, 0.9} {
		for _, useRequests := range []bool{true, false} {
			for seed := range uint64(8) {
				l := newClosedLoop(t, loopConfig{speeds: identical, load: load, phase: 5 * time.Second,
					useRequests: useRequests, knownCores: true, cpuNoise: 0.03, seed: seed})
				for k := range 40 {
					if res := l.step(); res.Changed {
						t.Fatalf("load %v requests %v seed %d cycle %d: weights moved on noise: %s", load, useRequests, seed, k+1, res.Message)
					}
				}
			}
		}
	}
}
