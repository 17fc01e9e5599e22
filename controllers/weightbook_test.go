package controllers

import (
	"math"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// TestReadySinceFollowsThePodSet: a pod keeps the time it was first seen
// while it stays, and one that left and returns starts its slow start
// again, also when the set keeps its size (one pod for another) and when
// one pod has two endpoints.
func TestReadySinceFollowsThePodSet(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Minute) }
	eps := func(pods ...string) []desired.Endpoint {
		out := make([]desired.Endpoint, len(pods))
		for i, p := range pods {
			out[i] = desired.Endpoint{Pod: p, Address: "10.0.0." + string(rune('1'+i))}
		}
		return out
	}
	e := &bookEntry{readySince: map[string]time.Time{}}
	since := func(now time.Time, set []desired.Endpoint) map[string]time.Time {
		out := map[string]time.Time{}
		for _, p := range e.pods(now, set) {
			out[p.Name] = p.ReadySince
		}
		return out
	}
	steps := []struct {
		now  time.Time
		eps  []desired.Endpoint
		want map[string]time.Time
	}{
		{at(0), eps("a", "b"), map[string]time.Time{"a": at(0), "b": at(0)}},
		{at(1), eps("a", "b"), map[string]time.Time{"a": at(0), "b": at(0)}},
		{at(2), eps("a", "c"), map[string]time.Time{"a": at(0), "c": at(2)}}, // b left, c came
		{at(3), eps("a", "b"), map[string]time.Time{"a": at(0), "b": at(3)}}, // b is back: anew
		{at(4), eps("a", "a"), map[string]time.Time{"a": at(0)}},             // as many endpoints, b gone
		{at(5), eps("a", "b"), map[string]time.Time{"a": at(0), "b": at(5)}}, // b anew
		{at(6), eps("b", "a"), map[string]time.Time{"a": at(0), "b": at(5)}}, // another order
		{at(7), eps("b", "a", "c"), map[string]time.Time{"a": at(0), "b": at(5), "c": at(7)}},
	}
	for i, s := range steps {
		got := since(s.now, s.eps)
		if len(got) != len(s.want) {
			t.Fatalf("step %d: %v, want %v", i, got, s.want)
		}
		for p, w := range s.want {
			if !got[p].Equal(w) {
				t.Errorf("step %d: pod %s ready since %v, want %v", i, p, got[p], w)
			}
		}
		if len(e.readySince) != len(s.want) {
			t.Errorf("step %d: the record holds %d pods, want %d", i, len(e.readySince), len(s.want))
		}
	}
}

// After a restart the live ServiceEntry's weights are matched to pods by
// address, and a pod takes one only if it was there when the operator last
// wrote the ServiceEntry. A pod created later (while the manager was down,
// here at the address of a pod that left) is new: it takes an initial
// weight, not the old pod's, and its slow start counts from its Ready
// time; so is a pod whose slow start had not ended at the write (its
// weight was a ramp's). A pod whose readiness blinked after the write
// keeps its weight. Without the write time, the address decides, as
// before.
func TestRestartSeedSkipsPodsNewSinceTheLastWrite(t *testing.T) {
	written := time.Unix(1_700_000_000, 0)
	now := written.Add(2 * time.Minute)
	eps := []desired.Endpoint{
		{Pod: "web-a", Address: "10.0.0.1", Cores: 2},
		{Pod: "web-b", Address: "10.0.0.2", Cores: 2},
		{Pod: "web-new", Address: "10.0.0.3", Cores: 2}, // the address of a pod that left
	}
	created := map[string]time.Time{
		"web-a":   written.Add(-2 * time.Hour),
		"web-b":   written.Add(-2 * time.Hour),
		"web-new": written.Add(50 * time.Second),
	}
	ready := map[string]time.Time{
		"web-a":   written.Add(-time.Hour),
		"web-b":   written.Add(-time.Hour),
		"web-new": written.Add(time.Minute),
	}
	times := func(pod string) (time.Time, time.Time) { return created[pod], ready[pod] }
	live := map[string]uint32{"10.0.0.1": 2000, "10.0.0.2": 1000, "10.0.0.3": 9000}
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	p := weights.DefaultParams()
	p.SlowStart = 2 * time.Minute
	snap := weights.Snapshot{Noise: 0.05, NoiseCycles: 20, CycleSeconds: 30}

	restart := func(l LiveEndpoints) (map[string]uint32, map[string]time.Time) {
		b := NewWeightBook()
		b.Restore(key, p, snap, weights.BalancerRoundRobin, policy.ReasonLearned)
		w := b.WeightsFor(key, p, now, eps, l, true)
		return w, b.entries[key].readySince
	}

	w, since := restart(LiveEndpoints{Weights: live, Written: written, PodTimes: times})
	if r := float64(w["web-a"]) / float64(w["web-b"]); math.Abs(r-2) > 0.01 {
		t.Errorf("web-a has %.3fx web-b's weight, want the live 2x: %v", r, w)
	}
	// Half way through its slow start, from the smallest weight up.
	if hi := (w["web-a"] + w["web-b"]) / 2; w["web-new"] >= hi || w["web-new"] == 0 {
		t.Errorf("the pod Ready after the last write has weight %d, want an initial one within its slow start, below the others' mean %d: %v", w["web-new"], hi, w)
	}
	if !since["web-new"].Equal(ready["web-new"]) || !since["web-a"].IsZero() {
		t.Errorf("ready since %v, want web-new's Ready time %v and the others long ready", since, ready["web-new"])
	}

	w, _ = restart(LiveEndpoints{Weights: live, PodTimes: times})
	if r := float64(w["web-new"]) / float64(w["web-b"]); math.Abs(r-9) > 0.01 {
		t.Errorf("without the write time the address decides: web-new has %.3fx web-b's weight, want the live 9x: %v", r, w)
	}

	// A pod whose slow start had not ended at the last write carries a
	// ramp's weight, not a capacity's: its slow start counts from its Ready
	// time (over by now), rather than the ramp's weight being held as a
	// settled capacity.
	created["web-new"], ready["web-new"] = written.Add(-2*time.Minute), written.Add(-time.Minute) // half way at the write
	live["10.0.0.3"] = 500
	w, since = restart(LiveEndpoints{Weights: live, Written: written, PodTimes: times})
	if !since["web-new"].Equal(ready["web-new"]) {
		t.Errorf("ready since %v, want web-new's Ready time %v: its slow start goes on", since, ready["web-new"])
	}
	if hi := (w["web-a"] + w["web-b"]) / 2; w["web-new"] >= hi || w["web-new"] <= 500 {
		t.Errorf("the pod ramping at the last write has weight %d, want an initial one above the ramp's live 500 and below the others' mean %d: %v", w["web-new"], hi, w)
	}

	// Without slow start, a pod created before the write whose readiness
	// blinked after it keeps its live weight.
	p.SlowStart = 0
	ready["web-b"] = written.Add(30 * time.Second)
	w, since = restart(LiveEndpoints{Weights: live, Written: written, PodTimes: times})
	if r := float64(w["web-a"]) / float64(w["web-b"]); math.Abs(r-2) > 0.01 || !since["web-b"].IsZero() {
		t.Errorf("a pod whose readiness blinked after the write: web-a has %.3fx its weight (want the live 2x), ready since %v (want long ready)", r, since["web-b"])
	}
}
