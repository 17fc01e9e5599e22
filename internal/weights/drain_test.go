package weights

import (
	"math"
	"strings"
	"testing"
	"time"
)

// drainPods are four pods of 2 cores each, CPU limits known.
func drainPods() []Pod {
	pods := podsNamed("a", "b", "c", "d")
	for i := range pods {
		pods[i].Cores = 2
	}
	return pods
}

// servedObs is what the backend reports when the clients send total
// requests per second split by the live weights, and each pod serves
// served[name] of its share (its whole share when absent), at speed
// perCPU[name] requests per CPU-second (100 when absent), CPU capped at
// cpuCap[name] (its Cores when absent).
func servedObs(at time.Time, live map[string]uint32, total float64, served, perCPU map[string]float64) Observation {
	sum := 0.0
	for _, w := range live {
		sum += float64(w)
	}
	obs := Observation{Time: at, Signals: map[string]Signal{}}
	for name, w := range live {
		req := total * float64(w) / sum
		if s, ok := served[name]; ok {
			req = s
		}
		speed := 100.0
		if v, ok := perCPU[name]; ok {
			speed = v
		}
		obs.Signals[name] = Signal{CPU: min(req/speed, 2), Requests: req}
	}
	return obs
}

// learnedDrainEngine returns an engine that has learned four equal pods at
// half of their CPU, and the time of its last cycle.
func learnedDrainEngine(t *testing.T, p Params) (*Engine, time.Time) {
	t.Helper()
	e := New(p)
	now := t0
	pods := drainPods()
	e.Applied(now, e.Weights(now, pods))
	for range 4 {
		now = now.Add(quiet)
		res := cycle(e, pods, servedObs(now, e.live, 400, nil, nil))
		if res.Changed {
			t.Fatalf("equal pods at half load: weights changed: %s", res.Message)
		}
	}
	return e, now
}

// A pod that slowed down and fell behind is drained below its new
// capacity until its backlog is gone, then gets its capacity weight back.
func TestDrainsABacklogThenRestores(t *testing.T) {
	pods := drainPods()
	e, now := learnedDrainEngine(t, capacityParams())

	// a's speed fell to 30 requests per CPU-second: at its limit it serves
	// 60 of the 100 it is sent. 40/s over the 1m window: ~2400 queued.
	now = now.Add(quiet)
	res := cycle(e, pods, servedObs(now, e.live, 400, map[string]float64{"a": 60}, map[string]float64{"a": 30}))
	capacityWeight := float64(res.Weights["b"]) * math.Pow(0.3, 1+DefaultParams().SpeedTilt)
	if !res.Changed || !strings.Contains(res.Message, "draining") {
		t.Fatalf("changed %v, message %q: want a drain", res.Changed, res.Message)
	}
	if got := float64(res.Weights["a"]); got > capacityWeight/2 {
		t.Errorf("a drained to %.0f, want well below its capacity weight %.0f", got, capacityWeight)
	}
	if q := res.Capacity["a"] / res.Capacity["b"]; !near(q, 0.3, 0.01) {
		t.Errorf("capacity of a relative to b = %.3f, want 0.3: draining must not touch the estimate", q)
	}

	// Drained, it serves its 60/s and is sent far less: the queue empties
	// and, no longer at its limit, it gets its capacity weight back.
	now = now.Add(quiet)
	res = cycle(e, pods, servedObs(now, e.live, 400, map[string]float64{"a": 55}, map[string]float64{"a": 30}))
	if !res.Changed || strings.Contains(res.Message, "draining") {
		t.Fatalf("changed %v, message %q: want the drain to end", res.Changed, res.Message)
	}
	if got := float64(res.Weights["a"]) / float64(res.Weights["b"]); !near(got, math.Pow(0.3, 1+DefaultParams().SpeedTilt), 0.02) {
		t.Errorf("after the drain a/b = %.3f, want its capacity ratio", got)
	}
	// And it stays there.
	now = now.Add(quiet)
	if res = cycle(e, pods, servedObs(now, e.live, 400, nil, map[string]float64{"a": 30})); res.Changed {
		t.Errorf("steady after the drain: changed (%s)", res.Message)
	}
}

// A pod at its CPU limit is overloaded by an unknown amount even when no
// backlog was measured: it gets less than its capacity until its CPU
// drops.
func TestPodAtItsLimitIsDrainedUntilItsCPUDrops(t *testing.T) {
	pods := drainPods()
	e, now := learnedDrainEngine(t, capacityParams())
	now = now.Add(quiet)
	obs := servedObs(now, e.live, 400, nil, nil)
	// Busy all the time at its usual speed, serving more than it is sent:
	// it is working off a queue the engine did not see grow.
	obs.Signals["a"] = Signal{CPU: 2, Requests: 200}
	res := cycle(e, pods, obs)
	if got := float64(res.Weights["a"]) / float64(res.Weights["b"]); !res.Changed || !near(got, hotDrain, 0.02) {
		t.Fatalf("changed %v, a/b = %.3f, want %.2f (%s)", res.Changed, got, hotDrain, res.Message)
	}
	now = now.Add(quiet)
	res = cycle(e, pods, servedObs(now, e.live, 400, nil, nil))
	if !res.Changed || res.Weights["a"] != res.Weights["b"] {
		t.Errorf("CPU back below the limit: changed %v weights %v, want a back to b's weight", res.Changed, res.Weights)
	}
}

// Without request rates nothing measures how far over its capacity a pod
// at its limit was: its drain is released by halves (in log terms) while
// its CPU stays below the limit.
func TestHotDrainReleasedByHalvesOnCPUAlone(t *testing.T) {
	pods := drainPods()
	cpuAlone := func(obs Observation) Observation {
		for name, s := range obs.Signals {
			s.Requests = math.NaN()
			obs.Signals[name] = s
		}
		return obs
	}
	e := New(capacityParams())
	now := t0
	e.Applied(now, e.Weights(now, pods))
	for range 6 {
		now = now.Add(quiet)
		cycle(e, pods, cpuAlone(servedObs(now, e.live, 400, nil, nil)))
	}
	now = now.Add(quiet)
	obs := cpuAlone(servedObs(now, e.live, 400, nil, nil))
	obs.Signals["a"] = Signal{CPU: 2, Requests: math.NaN()}
	res := cycle(e, pods, obs)
	if got := float64(res.Weights["a"]) / float64(res.Weights["b"]); !near(got, hotDrain, 0.02) {
		t.Fatalf("a at its limit: a/b = %.3f, want %.2f (%s)", got, hotDrain, res.Message)
	}
	for _, want := range []float64{math.Sqrt(hotDrain), math.Sqrt(math.Sqrt(hotDrain)), 1} {
		now = now.Add(quiet)
		res = cycle(e, pods, cpuAlone(servedObs(now, e.live, 400, nil, nil)))
		if got := float64(res.Weights["a"]) / float64(res.Weights["b"]); !near(got, want, 0.02) {
			t.Errorf("a below its limit: a/b = %.3f, want %.3f (%s)", got, want, res.Message)
		}
	}
}

// Shortfalls the sampling of two rates can explain are not backlogs.
func TestSmallShortfallsAreNotBacklogs(t *testing.T) {
	pods := drainPods()
	e, now := learnedDrainEngine(t, capacityParams())
	for k, short := range []float64{0.97, 0.98, 1.0, 0.97} {
		now = now.Add(quiet)
		res := cycle(e, pods, servedObs(now, e.live, 400, map[string]float64{"a": 100 * short}, nil))
		if res.Changed || strings.Contains(res.Message, "draining") {
			t.Fatalf("cycle %d, a serves %.0f%% of its share: %s", k+1, 100*short, res.Message)
		}
	}
}

// The others take a drained pod's traffic only up to drainUtil: when they
// are as busy, nothing is drained (the whole Service is overloaded).
func TestNoDrainWithoutRoom(t *testing.T) {
	pods := drainPods()
	e, now := learnedDrainEngine(t, capacityParams())
	now = now.Add(quiet)
	obs := servedObs(now, e.live, 400, nil, nil)
	for _, name := range []string{"b", "c", "d"} {
		obs.Signals[name] = Signal{CPU: 1.92, Requests: 100} // 96% of 2 cores
	}
	obs.Signals["a"] = Signal{CPU: 2, Requests: 60}
	res := cycle(e, pods, obs)
	if strings.Contains(res.Message, "draining") {
		t.Errorf("drained with the others at 96%%: %s", res.Message)
	}
}

// In a dry run the computed weights are not applied: the live weights are
// not the engine's, and it drains nothing.
func TestNoDrainInDryRun(t *testing.T) {
	pods := drainPods()
	e := New(capacityParams())
	live := map[string]uint32{"a": 1000, "b": 1000, "c": 1000, "d": 1000}
	e.Seed(t0, live)
	now := t0
	for k := range 4 {
		now = now.Add(quiet)
		// a is slower and behind; the weights computed are never applied.
		// (The first cycle cannot know that yet.)
		res := e.Update(pods, servedObs(now, live, 400, map[string]float64{"a": 60}, map[string]float64{"a": 50}))
		if k > 0 && strings.Contains(res.Message, "draining") {
			t.Fatalf("cycle %d of a dry run drains: %s", k+1, res.Message)
		}
		if got := float64(res.Weights["a"]) / float64(res.Weights["b"]); k > 0 && !near(got, math.Pow(0.5, 1+DefaultParams().SpeedTilt), 0.02) {
			t.Errorf("cycle %d: a/b = %.3f, want the capacity ratio", k+1, got)
		}
	}
}

// In the closed loop, with clients that wait rather than give up: after a
// pod slows to a third, its backlog is gone within a few cycles, and far
// sooner than without draining (where it drains only at the spare
// capacity the load leaves).
func TestBacklogDrainsSoonAfterASlowdown(t *testing.T) {
	cyclesToDrain := func(drain time.Duration, phase time.Duration) (int, float64) {
		p := capacityParams()
		p.DrainTime = drain
		l := newClosedLoop(t, loopConfig{speeds: hetero12(), load: 0.8, phase: phase, useRequests: true,
			knownCores: true, params: &p, maxQueue: time.Hour})
		for range 10 {
			l.step()
		}
		l.speed[0] /= 3
		peak := 0.0
		for k := 1; k <= 40; k++ {
			l.step()
			peak = max(peak, l.backlog[0])
			if k > 1 && l.backlog[0] < 1 && l.shareError() <= trackedWithin {
				return k, peak
			}
		}
		return -1, peak
	}
	for _, phase := range phases {
		with, peak := cyclesToDrain(DefaultParams().DrainTime, phase)
		without, peakWithout := cyclesToDrain(0, phase)
		t.Logf("phase %v: backlog (peak %.0f) gone and weights within 7.5%% after %d cycles; without draining %d cycles (peak %.0f)",
			phase, peak, with, without, peakWithout)
		if with < 0 || with > 4 {
			t.Errorf("phase %v: with draining, %d cycles, want at most 4", phase, with)
		}
		if without >= 0 && without <= with {
			t.Errorf("phase %v: without draining %d cycles, with %d: draining does not help", phase, without, with)
		}
	}
}

// The tilt gives faster pods a little more than their capacity share, and
// nothing changes for identical pods.
func TestSpeedTilt(t *testing.T) {
	pods := podsNamed("fast", "slow", "slow2")
	speed := map[string]float64{"fast": 2, "slow": 1, "slow2": 1}
	for _, tilt := range []float64{0, 0.03, 0.2} {
		p := capacityParams()
		p.SpeedTilt = tilt
		e, _ := learned(t, p, pods, speed)
		if got, want := ratio(e.live, "fast", "slow"), math.Pow(2, 1+tilt); !near(got, want, 0.01) {
			t.Errorf("tilt %v: fast/slow = %.3f, want %.3f", tilt, got, want)
		}
		if e.live["slow"] != e.live["slow2"] {
			t.Errorf("tilt %v: equal pods differ: %v", tilt, e.live)
		}
	}
	if err := (Params{SpeedTilt: 0.6}).Validate(); err == nil || !strings.Contains(err.Error(), "speed tilt") {
		t.Errorf("tilt 0.6: %v", err)
	}
	if err := (Params{DrainTime: -time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "drain time") {
		t.Errorf("negative drain time: %v", err)
	}
}

// A query window that reaches back into a spell of LEAST_REQUEST (the
// operator switched back to the weights less than a window ago) does not
// show traffic by the weights: LEAST_REQUEST sends a pod with more
// requests in flight less than its share. Such a shortfall is no backlog
// while the pod's latency shows no queue (Little's law); once the window
// is all ROUND_ROBIN again, the same shortfall is one.
func TestNoBacklogFromAWindowUnderLeastRequest(t *testing.T) {
	pods := drainPods()
	withLatency := func(obs Observation) Observation {
		for name, sig := range obs.Signals {
			sig.Latency = 1.05 * sig.CPU / sig.Requests // no queue to speak of
			obs.Signals[name] = sig
		}
		return obs
	}
	short := func(e *Engine, now time.Time) Result {
		sum := 0.0
		for _, w := range e.live {
			sum += float64(w)
		}
		sent := 400 * float64(e.live["b"]) / sum
		return cycle(e, pods, withLatency(servedObs(now, e.live, 400, map[string]float64{"b": 0.85 * sent}, nil)))
	}
	for _, tc := range []struct {
		name        string
		after       time.Duration // from the switch back to the weights
		wantBacklog bool
	}{
		{"window holds LEAST_REQUEST", 30 * time.Second, false},
		{"window all ROUND_ROBIN", 2 * time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, now := learnedDrainEngine(t, capacityParams())
			// a falls behind: drained, and LEAST_REQUEST (not Learned).
			now = now.Add(quiet)
			res := cycle(e, pods, withLatency(servedObs(now, e.live, 400, map[string]float64{"a": 60}, map[string]float64{"a": 30})))
			if res.Learned || !strings.Contains(res.Message, "draining") {
				t.Fatalf("learned %v, %q: want a drained and LEAST_REQUEST", res.Learned, res.Message)
			}
			// Its queue gone, a is back at its capacity and the weights
			// are Learned again.
			now = now.Add(30 * time.Second)
			res = cycle(e, pods, withLatency(servedObs(now, e.live, 400, nil, map[string]float64{"a": 30})))
			if !res.Learned {
				t.Fatalf("%q: want Learned once a's queue is gone", res.Message)
			}
			now = now.Add(tc.after)
			res = short(e, now)
			// 15% of b's 100 requests a second over the minute's window
			// is about 900; its latency shows a queue of about 1.
			if q := e.pods["b"].backlog; (q > 500) != tc.wantBacklog || (!tc.wantBacklog && q > 10) {
				t.Errorf("b served 85%% of its share %v after the switch back: backlog %.1f (%s), want one: %v",
					tc.after, q, res.Message, tc.wantBacklog)
			}
		})
	}
}
