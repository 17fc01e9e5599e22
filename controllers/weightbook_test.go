package controllers

import (
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
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
