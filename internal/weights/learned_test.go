package weights

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLearned(t *testing.T) {
	pods := podsNamed("a", "b", "c", "d")
	speed := map[string]float64{"a": 1, "b": 1, "c": 0.5, "d": 0.5}
	tests := map[string]struct {
		// run drives a fresh engine and returns the last result.
		run  func(e *Engine) Result
		want bool
	}{
		"nothing observed yet": {
			run: func(e *Engine) Result {
				return e.Update(pods, Observation{Time: t0, Signals: map[string]Signal{}})
			},
			want: false,
		},
		"first observation with request rates over steady weights": {
			run: func(e *Engine) Result {
				e.Applied(t0, e.Weights(t0, pods))
				return cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 4, true))
			},
			want: true,
		},
		"first observation with request rates right after a weight change": {
			run: func(e *Engine) Result {
				e.Applied(t0, e.Weights(t0, pods))
				cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 4, true))
				e.Applied(t0.Add(quiet+time.Second), map[string]uint32{"a": 1000, "b": 1000, "c": 1000, "d": 1000})
				// A surprise restarts every estimate: the next window mixes
				// the old and the new speeds.
				slower := map[string]float64{"a": 0.25, "b": 0.25, "c": 1, "d": 1}
				return cycle(e, pods, steadyObs(t0.Add(quiet+30*time.Second), e.live, slower, 4, true))
			},
			want: false,
		},
		"CPU alone: traffic follows the weights only under ROUND_ROBIN, so the first estimates count": {
			run: func(e *Engine) Result {
				e.Applied(t0, e.Weights(t0, pods))
				return cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 4, false))
			},
			want: true,
		},
		"failures past expiry fall back to equal weights": {
			run: func(e *Engine) Result {
				e.Applied(t0, e.Weights(t0, pods))
				cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 4, true))
				return e.Update(pods, Observation{Time: t0.Add(quiet + time.Hour), Err: errors.New("down")})
			},
			want: false,
		},
		"a query failure holds what was learned": {
			run: func(e *Engine) Result {
				e.Applied(t0, e.Weights(t0, pods))
				cycle(e, pods, steadyObs(t0.Add(quiet), e.live, speed, 4, true))
				return e.Update(pods, Observation{Time: t0.Add(quiet + time.Minute), Err: errors.New("down")})
			},
			want: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.run(New(DefaultParams())).Learned; got != tc.want {
				t.Errorf("Learned = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNotLearnedWhileAPodCarryingTrafficIsDrained(t *testing.T) {
	pods := drainPods()
	e, now := learnedDrainEngine(t, DefaultParams())
	// a slowed to 30 requests per CPU-second and fell behind: drained.
	now = now.Add(quiet)
	res := cycle(e, pods, servedObs(now, e.live, 400, map[string]float64{"a": 60}, map[string]float64{"a": 30}))
	if !strings.Contains(res.Message, "draining") {
		t.Fatalf("want a drain, got %q", res.Message)
	}
	if res.Learned {
		t.Errorf("Learned while pod a, a quarter of the traffic, is drained: %s", res.Message)
	}
	// The backlog is gone: learned again.
	now = now.Add(quiet)
	res = cycle(e, pods, servedObs(now, e.live, 400, map[string]float64{"a": 55}, map[string]float64{"a": 30}))
	if !res.Learned {
		t.Errorf("not Learned after the drain ended: %s", res.Message)
	}
}

// While not Learned the operator runs LEAST_REQUEST, under which traffic
// does not follow the weights: a pod serving less than its weight share is
// no evidence of a backlog; the sidecar's latency is.
func TestUnderLeastRequestBacklogsComeFromLatency(t *testing.T) {
	pods := drainPods()
	for _, tc := range []struct {
		name      string
		latency   float64 // seconds per request, 10 ms of it CPU
		wantDrain bool
	}{
		{"no wait: no backlog", 0.0105, false},
		{"seconds of wait: a backlog", 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, now := learnedDrainEngine(t, capacityParams())
			e.lastLearned = false // the last result said: not learned
			now = now.Add(quiet)
			obs := servedObs(now, e.live, 400, map[string]float64{"a": 60}, nil)
			for name, sig := range obs.Signals {
				sig.Latency = tc.latency
				if name != "a" {
					sig.Latency = 0.0105
				}
				obs.Signals[name] = sig
			}
			res := cycle(e, pods, obs)
			if got := strings.Contains(res.Message, "backlog"); got != tc.wantDrain {
				t.Errorf("drained for a backlog: %v, want %v (%s)", got, tc.wantDrain, res.Message)
			}
		})
	}
}
