package weights

import (
	"fmt"
	"math"
	"testing"
)

// A pod that reaches its CPU limit within the window served the window's
// requests with the window's CPU: its speed reading is their ratio, and its
// estimate holds. Divided by the recent CPU (the limit), the reading put
// the pod at the share of the window it was busy: after a step from 30% to
// 90% load the bench's slowest pods read 30-40% slower than they were, and
// the solver cut them while every pod was behind.
func TestReachingItsLimitWithinTheWindowKeepsItsSpeed(t *testing.T) {
	s := newService(t, true, 0.6, 1)
	s.recentCPU = true
	s.converge(100)
	pod := s.pods[0]
	before := s.e.pods[pod.Name].speed.m

	s.now = s.now.Add(s.e.params.QueryWindow / 2)
	obs := s.observe(1)
	sig := obs.Signals[pod.Name]
	// Busy at its limit for the last half of the window: the window's
	// CPU is halfway between its old rate and the limit, its requests
	// what that CPU serves.
	sig.CPU = (sig.CPU + s.cores[0]) / 2
	sig.Requests = sig.CPU * s.speed[0]
	sig.RecentCPU = s.cores[0]
	obs.Signals[pod.Name] = sig
	res := s.apply(s.e.Update(s.pods, obs))
	if !saturated(res, pod.Name) {
		t.Fatalf("%s at its limit over the last scrapes not reported: %s", pod.Name, res.Message)
	}
	if moved := math.Abs(s.e.pods[pod.Name].speed.m - before); moved > 0.01 {
		t.Errorf("%s's speed estimate moved by %.1f%% on a reading of its own speed: %s", pod.Name, 100*math.Expm1(moved), res.Message)
	}
}

// A step of the Service's load seen through scrapes taken apart: the
// request and CPU rates of one window cover spans that saw different
// loads, and each pod's requests per CPU-second errs by up to the load's
// change times ScrapeInterval over the shortest span (in the bench, +35% to
// +45% and -27% after a step from 30% to 90%). Those readings are not a
// change of speed: no filter restarts on them, and no estimate moves by
// more than the readings' noise.
func TestLoadStepIsNotAChangeOfSpeed(t *testing.T) {
	for _, seed := range []uint64{1, 2} {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			s := newService(t, true, 0.3, seed)
			s.converge(100)
			before := map[string]float64{}
			for _, pod := range s.pods {
				before[pod.Name] = s.e.pods[pod.Name].speed.m
			}
			s.rate *= 3
			s.now = s.now.Add(30e9)
			obs := s.observe(1)
			// A pod busy at its limit all along serves at its speed
			// however the rates align; the others err either way.
			distorted := 0
			for i, pod := range s.pods {
				sig := obs.Signals[pod.Name]
				if sig.CPU >= saturatedUse*s.cores[i] {
					continue
				}
				if distorted%2 == 0 {
					sig.Requests *= 1.4
				} else {
					sig.Requests *= 0.73
				}
				distorted++
				obs.Signals[pod.Name] = sig
			}
			if distorted < 3 {
				t.Fatalf("only %d pods below their limit after the step: no test", distorted)
			}
			res := s.apply(s.e.Update(s.pods, obs))
			for _, pod := range s.pods {
				st := s.e.pods[pod.Name]
				if st.speed.changed {
					t.Errorf("%s's speed filter restarted on the step: %s", pod.Name, res.Message)
				}
				if moved := math.Abs(st.speed.m - before[pod.Name]); moved > zSigmas*s.e.noise {
					t.Errorf("%s's speed estimate moved by %.1f%% on the step (noise %.1f%%)", pod.Name, 100*math.Expm1(moved), 100*s.e.noise)
				}
			}
		})
	}
}
