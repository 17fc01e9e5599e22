package weights

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// saturated reports whether res names pod among those at their CPU limit.
func saturated(res Result, pod string) bool {
	for _, r := range res.Reasons {
		if r.Code == ReasonSaturated && slices.Contains(r.Pods, pod) {
			return true
		}
	}
	return false
}

// A spike of the neighbours' CPU empties a pod's node without the pod
// being any busier: a pod without a limit, well below its settled cores,
// is not taken to be at its limit (its censored reading would cut its
// speed estimate, and the operator would leave ROUND_ROBIN). Its cores
// reading still counts: the node left it no more room.
func TestNeighbourSpikeIsNotSaturation(t *testing.T) {
	s := newService(t, false, 0.6, 1)
	s.converge(100)
	s.now = s.now.Add(s.e.params.QueryWindow / 2)
	obs := s.observe(1)
	spiked := s.pods[4]
	sig := obs.Signals[spiked.Name]
	sig.NodeCPU = spiked.NodeCores // the node reads full: no idle CPU
	obs.Signals[spiked.Name] = sig
	res := s.apply(s.e.Update(s.pods, obs))
	if saturated(res, spiked.Name) {
		t.Errorf("%s taken to be at its limit on its neighbours' spike: %s", spiked.Name, res.Message)
	}
	if !res.Learned {
		t.Errorf("after the spike: not learned: %s", res.Message)
	}

	// A pod that does use all of its cores is at its limit.
	s.converge(5)
	s.now = s.now.Add(s.e.params.QueryWindow / 2)
	obs = s.observe(1)
	sig = obs.Signals[spiked.Name]
	sig.CPU, sig.NodeCPU = s.cores[4], spiked.NodeCores
	obs.Signals[spiked.Name] = sig
	if res := s.e.Update(s.pods, obs); !saturated(res, spiked.Name) {
		t.Errorf("%s using all its %v cores with its node full is not at its limit: %s", spiked.Name, s.cores[4], res.Message)
	}
}

// With request rates a pod whose CPU reaches its limit over a window but
// whose queue does not grow is busy, not behind: the results stay Learned
// (the operator keeps ROUND_ROBIN). With CPU alone, which measures no
// queue, being at its limit is all that shows a pod behind, and Learned
// ends.
func TestAtItsLimitEndsLearnedOnCPUAlone(t *testing.T) {
	for _, cpuAlone := range []bool{false, true} {
		s := newService(t, true, 0.6, 2)
		if cpuAlone {
			s.off["requests"], s.off["latency"] = true, true
		}
		s.converge(100)
		s.now = s.now.Add(s.e.params.QueryWindow / 2)
		obs := s.observe(1)
		sig := obs.Signals[s.pods[0].Name]
		sig.CPU = s.cores[0] // at its limit over the window
		obs.Signals[s.pods[0].Name] = sig
		res := s.apply(s.e.Update(s.pods, obs))
		if !saturated(res, s.pods[0].Name) {
			t.Fatalf("CPU alone %v: %s at its limit not reported: %s", cpuAlone, s.pods[0].Name, res.Message)
		}
		if res.Learned == cpuAlone {
			t.Errorf("CPU alone %v: learned %v, want %v: %s", cpuAlone, res.Learned, !cpuAlone, res.Message)
		}
	}
}

// The windows that reach back into a spell without data hold the backend's
// gap: their misfit does not raise the readings' noise, which would widen
// the publish bar and hold wrong weights for many cycles after.
func TestNoiseNotLearnedAcrossAnOutage(t *testing.T) {
	s := newService(t, true, 0.7, 3)
	s.converge(100)
	before := s.e.noise
	for range 3 {
		s.now = s.now.Add(30 * time.Second)
		s.apply(s.e.Update(s.pods, Observation{Time: s.now, Err: errors.New("backend down")}))
	}
	// Back: rates extrapolated from the few samples on either side of the
	// gap, every pod's off by a different factor.
	for k := range 2 {
		s.now = s.now.Add(30 * time.Second)
		obs := s.observe(1)
		for i, pod := range s.pods {
			sig := obs.Signals[pod.Name]
			sig.Requests *= 1 + 0.5*float64((i+k)%3-1)
			obs.Signals[pod.Name] = sig
		}
		s.apply(s.e.Update(s.pods, obs))
	}
	if s.e.noise > before*1.01 {
		t.Errorf("reading noise %v after the outage, %v before: the gap's windows taught it", s.e.noise, before)
	}
}

// A pod that Istio's default balancer overloaded before the opt-in holds a
// queue of minutes, and the first readings are all the engine has of it:
// they are the queue, not its usual latency. The pod shows a backlog from
// the second cycle (the first has no reference to read one against), so
// the operator keeps LEAST_REQUEST, which steers new requests around the
// queue, instead of a ROUND_ROBIN that would send the pod its share of
// them to wait behind it. A restart while it drains finds it again: at
// once after a manager that had not learned (Restore, Seed), a cycle later
// after one that had (SeedSettled: its first cycle reads no speeds).
func TestBacklogFromBeforeTheOptInShows(t *testing.T) {
	for _, restart := range []string{"none", "seed", "settled"} {
		t.Run(restart, func(t *testing.T) {
			s := newService(t, true, 0.6, 4)
			behind := s.pods[1]
			var res Result
			from := 1
			for k := range 9 {
				if k == 4 && restart != "none" {
					snap := s.e.Snapshot()
					s.e = New(DefaultParams())
					if restart == "seed" {
						s.e.Restore(snap)
						s.e.Seed(s.now, s.live)
						from = 5
					} else {
						s.e.SeedSettled(s.now, s.live, snap)
						from = 6
					}
				}
				s.now = s.now.Add(30 * time.Second)
				obs := s.observe(1)
				obs.Balancer = BalancerLeastRequest
				sig := obs.Signals[behind.Name]
				sig.CPU = s.cores[1]                      // busy on its queue
				sig.Requests = s.cores[1] * s.speed[1]    // serving all it can
				sig.Latency, sig.RecentLatency = 300, 300 // five minutes behind
				obs.Signals[behind.Name] = sig
				res = s.apply(s.e.Update(s.pods, obs))
				if k < from || (k >= 4 && k < from+1 && restart != "none") {
					continue
				}
				if r, ok := Has(res.Reasons, ReasonBacklog); !ok || !slices.Contains(r.Pods, behind.Name) || res.Learned {
					t.Fatalf("cycle %d: %s, five minutes behind, shows no backlog (learned %v): %s", k+1, behind.Name, res.Learned, res.Message)
				}
			}
			if w, mean := float64(res.Weights[behind.Name]), meanWeight(res.Weights); w > mean/2 {
				t.Errorf("%s five minutes behind keeps weight %v, the mean is %v", behind.Name, w, mean)
			}
		})
	}
}

func meanWeight(w map[string]uint32) float64 {
	sum := 0.0
	for _, v := range w {
		sum += float64(v)
	}
	return sum / float64(len(w))
}

// A pod far past its capacity (a backlog owed) and held at the MaxRatio
// floor by both the live weights and the targets is not moved by them:
// its share differs only by the others' weights and the floor's rounding.
// Weighed by its cost far past capacity, that difference passed for a gain,
// and the weights were rewritten every cycle while the backlog drained.
func TestFloorRoundingIsNoGain(t *testing.T) {
	p := DefaultParams()
	set := []Pod{{Name: "fast-0"}, {Name: "fast-1"}, {Name: "fast-2"}, {Name: "behind"}}
	fast := decidePod{c: 8, v: 1, upper: math.Inf(1)}
	dp := []decidePod{fast, fast, fast, {c: 1, v: 0.01, upper: 0.05, overloaded: true}} // the one behind owes all but 1% of its capacity
	proposal := p.proposalFrom(time.Time{}, set, []float64{7, 7, 7, 0})
	// The live weights: the same targets, written as whole weights (the
	// floor exactly, the others rounded).
	ref := map[string]uint32{}
	for i, pod := range set {
		ref[pod.Name] = uint32(math.Round(proposal[i]))
	}
	logVar := []float64{1e-4, 1e-4, 1e-4, 1e-4}
	gain, bar := p.judge(set, ref, slices.Clone(proposal), dp, bounds{}, logVar, nil, 18)
	if gain > bar {
		t.Errorf("targets %v over live %v: gain %.3g passes the bar %.3g on the floor's rounding", proposal, ref, gain, bar)
	}
	// A pod cut to the floor from above is a move.
	ref["behind"] = ref["fast-0"] / 2
	if gain, bar := p.judge(set, ref, slices.Clone(proposal), dp, bounds{}, logVar, nil, 18); gain <= bar {
		t.Errorf("cutting the pod behind from %d to %.0f: gain %.3g within the bar %.3g", ref["behind"], proposal[3], gain, bar)
	}
}

// A pod whose requests wait longer than the others' for reasons of its own
// (a far zone, a slow disk: here six and ten times what its speed
// explains), overloaded at the opt-in, is cut while it is at its limit,
// and no longer: once below it, its own latency is its usual, its backlog
// clears and the results are Learned again. A pod whose CPU stays at its
// limit whatever it is sent (work of its own) keeps a borrowed reference
// no longer than its highest reading's queue takes to serve.
func TestSlowForItsOwnReasonsIsNotKeptBehind(t *testing.T) {
	for _, tc := range []struct {
		factor float64
		pinned bool // its CPU at its limit whatever it is sent (work of its own)
	}{{6, false}, {10, false}, {6, true}, {10, true}} {
		factor := tc.factor
		t.Run(fmt.Sprintf("%vx pinned %v", factor, tc.pinned), func(t *testing.T) {
			s := newService(t, true, 0.7, 5)
			slow := s.pods[1]
			behindCycles, learned := 0, false
			for k := range 60 {
				s.now = s.now.Add(30 * time.Second)
				obs := s.observe(1)
				obs.Balancer = BalancerLeastRequest
				sig := obs.Signals[slow.Name]
				sig.Latency *= factor
				sig.RecentLatency *= factor
				if tc.pinned {
					sig.CPU = s.cores[1]
				}
				if k == 0 {
					// Overloaded at the opt-in: a queue of 20 s, served
					// within the next cycle once it is sent little.
					sig.CPU = s.cores[1]
					sig.Latency, sig.RecentLatency = 20, 20
				}
				obs.Signals[slow.Name] = sig
				res := s.apply(s.e.Update(s.pods, obs))
				if r, ok := Has(res.Reasons, ReasonBacklog); ok && slices.Contains(r.Pods, slow.Name) {
					behindCycles++
				}
				learned = res.Learned
			}
			// Pinned, the closed form's latency at the limit reads 50 s
			// once, and the borrowed reference holds for that and a
			// query window: five cycles.
			most := 3
			if tc.pinned {
				most = 6
			}
			if behindCycles > most || !learned {
				t.Errorf("%s, slow for its own reasons: a backlog in %d of 60 cycles, learned at the end %v", slow.Name, behindCycles, learned)
			}
		})
	}
}

// A pod too small for the least weight the ratio allows (MaxRatio: the
// mean over 20 by default, 1% of the traffic among five pods: 0.032 of a
// fast pod's capacity at 80% load) is sent more than it can serve however
// the others are weighted; the result says so, naming it. One that can
// serve its floor share is not named.
func TestFloorOverloadIsReported(t *testing.T) {
	for _, tc := range []struct {
		small float64
		named bool
	}{{0.02, true}, {0.2, false}} {
		l := newClosedLoop(t, loopConfig{speeds: []float64{1, 1, 1, 1, tc.small}, load: 0.8, useRequests: true, knownCores: true})
		var res Result
		for range 12 {
			res = l.step()
		}
		r, ok := Has(res.Reasons, ReasonFloorOverload)
		if ok != tc.named || (ok && (len(r.Pods) != 1 || r.Pods[0] != l.pods[4].Name || r.Limit != DefaultParams().MaxRatio)) {
			t.Errorf("a pod of speed %v among four of 1 at 80%% load: floor overload %v (%+v), want %v: %s", tc.small, ok, r, tc.named, res.Message)
		}
	}
}

// The dead band is judged as the bench and the quality tests judge
// convergence: each pod's live share against the share a write would
// send, relative to the latter, on the whole weights written. A raise
// from 0.0697 to 0.0733 of the traffic is 5.2% of the live share but
// leaves the live share within 5% of the new one: converged, no move.
func TestOffTargetIsTheLiveShareAgainstTheWrittenOne(t *testing.T) {
	set := []Pod{{Name: "a"}, {Name: "b"}}
	tests := []struct {
		name      string
		live, out map[string]uint32
		want      float64
	}{
		{"raise within 5% of the new share", map[string]uint32{"a": 697, "b": 9303}, map[string]uint32{"a": 733, "b": 9267}, 1 - 0.0697/0.0733},
		{"cut", map[string]uint32{"a": 100, "b": 100}, map[string]uint32{"a": 90, "b": 110}, 0.5/0.45 - 1},
		{"scale alone is no move", map[string]uint32{"a": 100, "b": 300}, map[string]uint32{"a": 200, "b": 600}, 0},
		{"a pod new to the weights is not compared", map[string]uint32{"a": 100}, map[string]uint32{"a": 100, "b": 100}, 0},
	}
	for _, tc := range tests {
		got := offTarget(set, tc.live, tc.out)
		if math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: offTarget %.5f, want %.5f", tc.name, got, tc.want)
		}
	}
}
