package weights

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

// withLatency gives every pod of obs a latency of 20 ms over the window
// and recent[name] over the last scrapes (20 ms when absent).
func withLatency(obs Observation, recent map[string]float64) Observation {
	for name, s := range obs.Signals {
		s.Latency, s.RecentLatency = 0.02, 0.02
		if v, ok := recent[name]; ok {
			s.RecentLatency = v
		}
		obs.Signals[name] = s
	}
	return obs
}

// alarmEngine returns an engine that has learned four equal pods at half
// of their CPU with their latencies, and the time of its last cycle.
func alarmEngine(t *testing.T) (*Engine, time.Time) {
	t.Helper()
	return alarmEngineAt(t, 400)
}

// alarmEngineAt is alarmEngine with the clients sending total requests a
// second (at 100 per CPU-second: 800 keep the four pods' 8 cores busy).
func alarmEngineAt(t *testing.T, total float64) (*Engine, time.Time) {
	t.Helper()
	e := New(capacityParams())
	now := t0
	pods := drainPods()
	e.Applied(now, e.Weights(now, pods))
	for range 6 {
		now = now.Add(quiet)
		res := cycle(e, pods, withLatency(servedObs(now, e.live, total, nil, nil), nil))
		if res.Changed || !res.Learned {
			t.Fatalf("equal pods at half load: changed %v, learned %v: %s", res.Changed, res.Learned, res.Message)
		}
	}
	return e, now
}

func TestAlarm(t *testing.T) {
	recent := func(v map[string]float64) Observation {
		obs := Observation{Signals: map[string]Signal{}}
		for _, p := range drainPods() {
			obs.Signals[p.Name] = Signal{CPU: math.NaN(), Requests: math.NaN(), Latency: math.NaN(), RecentLatency: 0.02}
		}
		for name, l := range v {
			s := obs.Signals[name]
			s.RecentLatency = l
			obs.Signals[name] = s
		}
		return obs
	}
	cases := []struct {
		name string
		obs  Observation
		pod  string // "" = no alarm
	}{
		{"as usual", recent(nil), ""},
		{"a pod's latency tenfold", recent(map[string]float64{"c": 0.2}), "c"},
		{"the first pod in name order", recent(map[string]float64{"d": 0.2, "b": 0.3}), "b"},
		{"half again is noise", recent(map[string]float64{"a": 0.03}), ""},
		{"just below alarmLatency", recent(map[string]float64{"a": 0.0399}), ""},
		{"faster is no alarm", recent(map[string]float64{"a": 0.001}), ""},
		{"no recent latency", recent(map[string]float64{"a": math.NaN(), "b": math.Inf(1), "c": -1}), ""},
		{"a pod the engine does not know", func() Observation {
			o := recent(nil)
			o.Signals["zz"] = Signal{RecentLatency: 10}
			return o
		}(), ""},
		{"the query failed", func() Observation { o := recent(map[string]float64{"a": 1}); o.Err = errString("down"); return o }(), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, now := alarmEngine(t)
			tc.obs.Time = now.Add(5 * time.Second)
			pods := append(drainPods(), Pod{Name: "zz"}) // zz: in the set, never in a cycle
			pod, why, ring := e.Alarm(pods, tc.obs)
			if ring != (tc.pod != "") || pod != tc.pod {
				t.Fatalf("Alarm = %q, %v (%s); want pod %q", pod, ring, why, tc.pod)
			}
			if ring && !strings.Contains(why, "20ms of the last cycle") {
				t.Errorf("reason %q does not name the pod's usual latency", why)
			}
		})
	}
}

type errString string

func (e errString) Error() string { return string(e) }

// Alarm only looks: an engine asked it behaves exactly as one not asked.
func TestAlarmChangesNothing(t *testing.T) {
	pods := drainPods()
	asked, now := alarmEngine(t)
	twin, _ := alarmEngine(t)
	if _, _, ring := asked.Alarm(pods, Observation{Time: now, Signals: map[string]Signal{"a": {RecentLatency: 5}}}); !ring {
		t.Fatal("want an alarm for a's 5 s latency")
	}
	now = now.Add(quiet)
	obs := withLatency(servedObs(now, asked.live, 400, map[string]float64{"a": 60}, map[string]float64{"a": 30}), nil)
	got, want := cycle(asked, pods, obs), cycle(twin, pods, obs)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after Alarm: %+v\nwithout: %+v", got, want)
	}
}

// Under LEAST_REQUEST (not Learned: before any cycle, or after a drain)
// or while no fresh data speaks (Holding), the alarm stays silent: the
// queue is steered around, or nothing can be judged.
func TestAlarmSilentWhenHandled(t *testing.T) {
	pods := drainPods()
	slow := func(at time.Time) Observation {
		return Observation{Time: at, Signals: map[string]Signal{"a": {RecentLatency: 5}, "b": {RecentLatency: 5}}}
	}

	fresh := New(capacityParams())
	fresh.Applied(t0, fresh.Weights(t0, pods))
	if pod, _, ring := fresh.Alarm(pods, slow(t0)); ring {
		t.Errorf("an engine without a cycle rang for %s", pod)
	}

	e, now := alarmEngine(t)
	now = now.Add(quiet)
	// a fell behind: drained, and Learned false (LEAST_REQUEST).
	res := cycle(e, pods, withLatency(servedObs(now, e.live, 400, map[string]float64{"a": 60}, map[string]float64{"a": 30}), nil))
	if !strings.Contains(res.Message, "draining") || res.Learned {
		t.Fatalf("want a drained and not Learned: learned %v, %s", res.Learned, res.Message)
	}
	if pod, _, ring := e.Alarm(pods, slow(now.Add(5*time.Second))); ring {
		t.Errorf("not Learned: rang for %s", pod)
	}

	e, now = alarmEngine(t)
	now = now.Add(quiet)
	cycle(e, pods, Observation{Time: now, Err: errString("down")})
	if pod, _, ring := e.Alarm(pods, slow(now.Add(5*time.Second))); ring {
		t.Errorf("Holding: rang for %s", pod)
	}
}

// A pod whose latency over the last scrapes routinely differs from its
// window's (few, long requests) needs more than alarmLatency to ring. Only
// the swings that would not ring teach it (here the ones down), so an
// overload does not teach the alarm to ignore the next one.
func TestAlarmLearnsEachPodsNoise(t *testing.T) {
	pods := drainPods()
	e, now := alarmEngine(t)
	for k := range 16 {
		now = now.Add(quiet)
		f := 3.0
		if k%2 == 1 {
			f = 1 / 3.0
		}
		cycle(e, pods, withLatency(servedObs(now, e.live, 400, nil, nil), map[string]float64{"a": 0.02 * f}))
	}
	at := now.Add(5 * time.Second)
	if pod, why, ring := e.Alarm(pods, Observation{Time: at, Signals: map[string]Signal{"a": {RecentLatency: 0.2}}}); ring {
		t.Errorf("a swings 3x every cycle; 10x rang for %s (%s)", pod, why)
	}
	if _, _, ring := e.Alarm(pods, Observation{Time: at, Signals: map[string]Signal{"b": {RecentLatency: 0.2}}}); !ring {
		t.Error("b is steady; 10x did not ring")
	}
	if _, _, ring := e.Alarm(pods, Observation{Time: at, Signals: map[string]Signal{"a": {RecentLatency: 20}}}); !ring {
		t.Error("a at 1000x did not ring")
	}
}

// A pod at its limit or drained is being handled: no alarm for it, while
// another pod in the same state as before still rings.
func TestAlarmSilentForAPodAlreadyHandled(t *testing.T) {
	pods := drainPods()
	slow := Observation{Signals: map[string]Signal{"a": {RecentLatency: 0.2}, "b": {RecentLatency: 0.2}}}
	for name, handle := range map[string]func(*podState){
		"at its limit": func(st *podState) { st.hot = true },
		"drained":      func(st *podState) { st.drain = 0.5 },
	} {
		t.Run(name, func(t *testing.T) {
			e, now := alarmEngine(t)
			handle(e.pods["a"])
			slow.Time = now.Add(5 * time.Second)
			if pod, _, ring := e.Alarm(pods, slow); !ring || pod != "b" {
				t.Errorf("Alarm = %q, %v; want b (a is %s)", pod, ring, name)
			}
		})
	}
}

// An alarm's cycle is Early: the engine's cycle length and noise (its
// bands, its Snapshot) stay those the regular cycles measured. While the
// pod that rang is a suspect (see TestAlarmKeepsLeastRequest) the Service
// is on LEAST_REQUEST and the alarm is silent; the cycle that finds its
// latency back makes that latency the reference again, so the same rise
// rings again.
func TestAlarmCycleIsEarly(t *testing.T) {
	pods := drainPods()
	e, now := alarmEngine(t)
	snap := e.Snapshot()
	if before := snap.CycleSeconds; before != quiet.Seconds() {
		t.Fatalf("cycle %vs, want the %v between the regular cycles", before, quiet)
	}
	at := now.Add(5 * time.Second)
	if _, _, ring := e.Alarm(pods, Observation{Time: at, Signals: map[string]Signal{"c": {RecentLatency: 0.2}}}); !ring {
		t.Fatal("c at 10x did not ring")
	}
	obs := withLatency(servedObs(at, e.live, 400, nil, nil), map[string]float64{"c": 0.2})
	obs.Early = true
	cycle(e, pods, obs)
	if got := e.Snapshot(); got != snap {
		t.Errorf("after an early cycle 5 s on, the learned state is %+v, want %+v (its window is mostly the last cycle's)", got, snap)
	}
	at = at.Add(5 * time.Second)
	if pod, _, ring := e.Alarm(pods, Observation{Time: at, Signals: map[string]Signal{"c": {RecentLatency: 0.5}}}); ring {
		t.Errorf("c is a suspect (LEAST_REQUEST): rang for %s", pod)
	}
	// A cycle finds c back at 0.03, under 2x its 0.02 from before: the
	// spell ends.
	at = at.Add(5 * time.Second)
	obs = withLatency(servedObs(at, e.live, 400, nil, nil), map[string]float64{"c": 0.03})
	obs.Early = true
	if res := cycle(e, pods, obs); !res.Learned {
		t.Fatalf("c back under the alarm: not Learned: %s", res.Message)
	}
	if pod, why, ring := e.Alarm(pods, Observation{Time: at.Add(5 * time.Second), Signals: map[string]Signal{"c": {RecentLatency: 0.05}}}); ring {
		t.Errorf("c at 0.05, under 2x the 0.03 of the last cycle, rang for %s: %s", pod, why)
	}
	if _, _, ring := e.Alarm(pods, Observation{Time: at.Add(5 * time.Second), Signals: map[string]Signal{"c": {RecentLatency: 0.2}}}); !ring {
		t.Error("c at 0.2 again after its latency was back did not ring")
	}
	cycle(e, pods, withLatency(servedObs(now.Add(quiet), e.live, 400, nil, nil), nil))
	if got := e.Snapshot().CycleSeconds; got != quiet.Seconds() {
		t.Errorf("the next regular cycle measured %vs, want %v from the last regular one", got, quiet)
	}
}

// A pod whose latency rings the alarm while its windows still show it
// keeping up is a suspect: the cycle that sees it (the alarm's, or a
// regular one) reports Learned false, so the Service runs LEAST_REQUEST,
// until the pod's latency is back under the alarm or one query window and
// scrape have passed; from then on the weights follow what the windows
// show.
func TestAlarmKeepsLeastRequest(t *testing.T) {
	pods := drainPods()
	calm := func(e *Engine, at time.Time, recent map[string]float64, early bool) Result {
		obs := withLatency(servedObs(at, e.live, 400, nil, nil), recent)
		obs.Early = early
		return cycle(e, pods, obs)
	}
	slow := map[string]float64{"c": 0.2}
	// spell starts one with an alarm's cycle for c, 5 s after the last cycle.
	spell := func(t *testing.T) (*Engine, time.Time) {
		t.Helper()
		e, now := alarmEngine(t)
		at := now.Add(5 * time.Second)
		res := calm(e, at, slow, true)
		if res.Learned || !strings.Contains(res.Message, "latency of 1 pod(s) rose past the alarm (c first)") ||
			!strings.Contains(res.Message, "LEAST_REQUEST for up to 1m15s") {
			t.Fatalf("the alarm's cycle: learned %v, %s; want not Learned, naming c", res.Learned, res.Message)
		}
		return e, at
	}
	t.Run("until the window covers the change", func(t *testing.T) {
		e, at := spell(t)
		if _, _, ring := e.Alarm(pods, Observation{Time: at.Add(5 * time.Second), Signals: map[string]Signal{"d": {RecentLatency: 1}}}); ring {
			t.Error("under LEAST_REQUEST the alarm rang")
		}
		res := calm(e, at.Add(30*time.Second), slow, false)
		if res.Learned || !strings.Contains(res.Message, "c's latency rang the alarm") || !strings.Contains(res.Message, "at most 45s from now") {
			t.Errorf("30 s on, c still slow: learned %v, %s; want not Learned for 45s more", res.Learned, res.Message)
		}
		// The windows now cover the time since the alarm and show c
		// keeping up (its latency is just higher): the weights follow them.
		res = calm(e, at.Add(e.params.horizon()), slow, false)
		if !res.Learned || strings.Contains(res.Message, "alarm") {
			t.Errorf("a window and a scrape on: learned %v, %s; want Learned", res.Learned, res.Message)
		}
	})
	t.Run("then the windows show the pod behind", func(t *testing.T) {
		e, at := spell(t)
		// c now serves a third of its share at its limit: at the end of
		// the spell it is drained, which keeps LEAST_REQUEST.
		var res Result
		for k := 1; k <= 3; k++ {
			obs := withLatency(servedObs(at.Add(time.Duration(k)*30*time.Second), e.live, 400, map[string]float64{"c": 33}, map[string]float64{"c": 16.5}), slow)
			res = cycle(e, pods, obs)
			if res.Learned {
				t.Fatalf("%d s into the spell, c behind: Learned: %s", 30*k, res.Message)
			}
		}
		if e.pods["c"].suspectUntil.After(at.Add(90*time.Second)) || !strings.Contains(res.Message, "draining") {
			t.Errorf("after the spell: %s; want c drained, not a suspect", res.Message)
		}
	})
	t.Run("a passing surge", func(t *testing.T) {
		e, at := spell(t)
		if res := calm(e, at.Add(10*time.Second), map[string]float64{"c": 0.039}, false); !res.Learned {
			t.Errorf("c back under 2x its latency from before: not Learned: %s", res.Message)
		}
	})
	t.Run("no latency is not a latency back", func(t *testing.T) {
		for _, v := range []float64{0, math.NaN()} {
			e, at := spell(t)
			if res := calm(e, at.Add(10*time.Second), map[string]float64{"c": v}, false); res.Learned {
				t.Errorf("c's recent latency %v ended the spell: %s", v, res.Message)
			}
		}
	})
	t.Run("a second pod during the spell", func(t *testing.T) {
		e, at := spell(t)
		res := calm(e, at.Add(30*time.Second), map[string]float64{"c": 0.02, "d": 0.2}, false)
		if res.Learned || !strings.Contains(res.Message, "(d first)") {
			t.Fatalf("d at 10x while c was a suspect: learned %v, %s; want d held", res.Learned, res.Message)
		}
		if e.pods["c"].suspectUntil.After(at.Add(30*time.Second)) || e.pods["d"].suspectLatency != 0.02 {
			t.Errorf("c back: still held until %v; d held against %v, want its 0.02 from before",
				e.pods["c"].suspectUntil, e.pods["d"].suspectLatency)
		}
	})
	t.Run("a regular cycle sees it first", func(t *testing.T) {
		e, now := alarmEngine(t)
		if res := calm(e, now.Add(quiet), slow, false); res.Learned || !strings.Contains(res.Message, "(c first)") {
			t.Errorf("c at 10x in a regular cycle: learned %v, %s", res.Learned, res.Message)
		}
	})
	t.Run("a cycle without fresh data says why", func(t *testing.T) {
		e, at := spell(t)
		res := cycle(e, pods, Observation{Time: at.Add(10 * time.Second), Err: errString("down")})
		if res.Learned || !strings.Contains(res.Message, "c's latency rang the alarm") {
			t.Errorf("a failed query during the spell: learned %v, %s; want not Learned, saying why", res.Learned, res.Message)
		}
		// The next cycle judges nobody against references from before the
		// failure (as Alarm does not): d's rise is not held, c's spell goes on.
		at = at.Add(20 * time.Second)
		res = calm(e, at, map[string]float64{"c": 0.2, "d": 0.2}, false)
		if e.pods["d"].suspectUntil.After(at) || !strings.Contains(res.Message, "c's latency") {
			t.Errorf("the cycle after a failed one: %s; want d not held, c still held", res.Message)
		}
	})
}

// What an overload shows does not teach the alarm its noise: the
// difference is learned only while the pod keeps up and the difference
// would not ring.
func TestNoteLatencyLearnsOnlyFromPodsThatKeepUp(t *testing.T) {
	ps := podSignal{latency: 0.02, hasLatency: true, recentLatency: 0.025}
	for name, st := range map[string]*podState{
		"at its limit":      {hot: true},
		"drained":           {drain: 0.5},
		"past the alarm":    {},
		"without a latency": {},
	} {
		p := ps
		switch name {
		case "past the alarm":
			p.recentLatency = 0.2
		case "without a latency":
			p.hasLatency, p.latency = false, 0
		}
		st.noteLatency(p)
		if len(st.latencyRatios) != 0 {
			t.Errorf("%s: learned %v", name, st.latencyRatios)
		}
	}
	st := &podState{}
	st.noteLatency(ps)
	if len(st.latencyRatios) != 1 || st.latency != 0.025 {
		t.Errorf("a pod that keeps up: ratios %v, reference %v; want one ratio and the higher latency 0.025", st.latencyRatios, st.latency)
	}
}

// A pod whose latency rings the alarm alone, while no other pod is held,
// has its weight halved for its spell, into the room the other pods have
// below suspectUtil; a pod that rings with another, or while another is
// held, and a busy Service, get LEAST_REQUEST only.
func TestSuspectCut(t *testing.T) {
	pods := drainPods()
	ring := func(e *Engine, at time.Time, total float64, recent map[string]float64) Result {
		obs := withLatency(servedObs(at, e.live, total, nil, nil), recent)
		obs.Early = true
		res := cycle(e, pods, obs)
		if res.Learned {
			t.Fatalf("an alarm's cycle reported Learned: %s", res.Message)
		}
		return res
	}
	t.Run("one pod alone is halved", func(t *testing.T) {
		e, now := alarmEngine(t)
		res := ring(e, now.Add(5*time.Second), 400, map[string]float64{"c": 0.2})
		if r := float64(res.Weights["c"]) / float64(res.Weights["a"]); math.Abs(r-suspectCut) > 0.02 {
			t.Errorf("c's weight is %.3f of a's, want %v: %v", r, suspectCut, res.Weights)
		}
		if !strings.Contains(res.Message, "the weight of c, whose latency rang the alarm alone, cut to 50% of its capacity") {
			t.Errorf("message does not say c was cut: %s", res.Message)
		}
		// Its latency is back under the alarm: the spell and the cut end.
		res = cycle(e, pods, withLatency(servedObs(now.Add(10*time.Second), e.live, 400, nil, nil), map[string]float64{"c": 0.03}))
		if !res.Learned || res.Weights["c"] != res.Weights["a"] {
			t.Errorf("c back under the alarm: learned %v, weights %v; want Learned and c's weight back", res.Learned, res.Weights)
		}
	})
	t.Run("two pods at once", func(t *testing.T) {
		e, now := alarmEngine(t)
		res := ring(e, now.Add(5*time.Second), 400, map[string]float64{"c": 0.2, "d": 0.2})
		if res.Weights["c"] != res.Weights["a"] || res.Weights["d"] != res.Weights["a"] {
			t.Errorf("c and d rang together: weights %v, want none cut", res.Weights)
		}
	})
	t.Run("while another is held", func(t *testing.T) {
		e, now := alarmEngine(t)
		ring(e, now.Add(5*time.Second), 400, map[string]float64{"c": 0.2})
		res := ring(e, now.Add(10*time.Second), 400, map[string]float64{"c": 0.2, "d": 0.2})
		if res.Weights["d"] != res.Weights["a"] || res.Weights["c"] >= res.Weights["a"] {
			t.Errorf("d rang while c was cut: weights %v, want c cut and d not", res.Weights)
		}
	})
	t.Run("no room in a busy Service", func(t *testing.T) {
		// The pods run at 90% of their 2 cores, above suspectUtil.
		e, now := alarmEngineAt(t, 720)
		res := ring(e, now.Add(5*time.Second), 720, map[string]float64{"c": 0.2})
		if !strings.Contains(res.Message, "(c first)") {
			t.Fatalf("c at 10x did not ring: %s", res.Message)
		}
		if res.Weights["c"] != res.Weights["a"] || strings.Contains(res.Message, "cut to") {
			t.Errorf("c rang with the others at 90%%: weights %v, %s; want no cut", res.Weights, res.Message)
		}
	})
	t.Run("as far as the others have room", func(t *testing.T) {
		// At 80% the others (three quarters of the traffic) may take
		// 0.75*(0.85/0.8-1) = 4.7% of it; half of c's quarter is 12.5%:
		// c keeps 1-0.5*4.7/12.5 = 0.8125 of its weight.
		e, now := alarmEngineAt(t, 640)
		res := ring(e, now.Add(5*time.Second), 640, map[string]float64{"c": 0.2})
		if r := float64(res.Weights["c"]) / float64(res.Weights["a"]); math.Abs(r-0.8125) > 0.02 {
			t.Errorf("c's weight is %.3f of a's, want 0.8125: %v, %s", r, res.Weights, res.Message)
		}
	})
	t.Run("until the spell ends", func(t *testing.T) {
		e, now := alarmEngine(t)
		at := now.Add(5 * time.Second)
		ring(e, at, 400, map[string]float64{"c": 0.2})
		// Still slow, but the windows now cover the time since the alarm
		// and show c keeping up: the spell ends, and the cut with it.
		res := cycle(e, pods, withLatency(servedObs(at.Add(e.params.horizon()), e.live, 400, nil, nil), map[string]float64{"c": 0.2}))
		if res.Weights["c"] != res.Weights["a"] || strings.Contains(res.Message, "cut to") {
			t.Errorf("after the spell: weights %v, %s; want c's weight back", res.Weights, res.Message)
		}
	})
	t.Run("not in a dry run", func(t *testing.T) {
		// Nothing is ever applied: the weights are computed, not live.
		e := New(capacityParams())
		now := t0
		live := map[string]uint32{"a": 100, "b": 100, "c": 100, "d": 100}
		for range 6 {
			now = now.Add(quiet)
			e.Update(pods, withLatency(servedObs(now, live, 400, nil, nil), nil))
		}
		obs := withLatency(servedObs(now.Add(5*time.Second), live, 400, nil, nil), map[string]float64{"c": 0.2})
		obs.Early = true
		res := e.Update(pods, obs)
		if res.Weights["c"] != res.Weights["a"] || strings.Contains(res.Message, "cut to") {
			t.Errorf("dry run: c's weight cut: %v, %s", res.Weights, res.Message)
		}
		if !strings.Contains(res.Message, "(c first)") {
			t.Errorf("dry run: c not held: %s", res.Message)
		}
	})
}
