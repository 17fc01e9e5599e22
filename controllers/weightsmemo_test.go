package controllers

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// TestWeightsMemoAsksTheEngineOnlyWhenSomethingChanged: the engine is asked
// again when the endpoints (any field it reads), their live weights, the
// spec or the weight cycle changed, and not otherwise.
func TestWeightsMemoAsksTheEngineOnlyWhenSomethingChanged(t *testing.T) {
	var m weightsMemo
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	t0 := time.Unix(100, 0)
	eps := []desired.Endpoint{{Pod: "a", Address: "10.0.0.1", Node: "n1", Cores: 2}, {Pod: "b", Address: "10.0.0.2", Node: "n2", Cores: 2}}
	live := map[string]uint32{"10.0.0.1": 1000}
	calls := 0
	compute := func() map[string]uint32 {
		calls++
		return map[string]uint32{"a": uint32(calls), "b": 7}
	}
	ask := func(gen int64, cycle time.Time, eps []desired.Endpoint, live map[string]uint32) uint32 {
		return m.weightsFor(key, gen, cycle, eps, live, compute)["a"]
	}
	changed := func(f func(*desired.Endpoint)) []desired.Endpoint {
		c := append([]desired.Endpoint(nil), eps...)
		f(&c[1])
		return c
	}
	steps := []struct {
		name  string
		gen   int64
		cycle time.Time
		eps   []desired.Endpoint
		live  map[string]uint32
		want  uint32 // the compute call whose answer is returned
	}{
		{"first", 1, t0, eps, live, 1},
		{"unchanged", 1, t0, eps, live, 1},
		{"unchanged, a copy", 1, t0, changed(func(*desired.Endpoint) {}), map[string]uint32{"10.0.0.1": 1000}, 1},
		{"a new weight cycle", 1, t0.Add(30 * time.Second), eps, live, 2},
		{"a new spec", 2, t0.Add(30 * time.Second), eps, live, 3},
		{"a live weight moved", 2, t0.Add(30 * time.Second), eps, map[string]uint32{"10.0.0.1": 1001}, 4},
		{"a pod's cores", 2, t0.Add(30 * time.Second), changed(func(e *desired.Endpoint) { e.Cores = 4 }), map[string]uint32{"10.0.0.1": 1001}, 5},
		{"a pod's locality", 2, t0.Add(30 * time.Second), changed(func(e *desired.Endpoint) { e.Locality = "r/z" }), map[string]uint32{"10.0.0.1": 1001}, 6},
		{"a pod gone", 2, t0.Add(30 * time.Second), eps[:1], map[string]uint32{"10.0.0.1": 1001}, 7},
		{"and back", 2, t0.Add(30 * time.Second), eps[:1], map[string]uint32{"10.0.0.1": 1001}, 7},
	}
	for _, s := range steps {
		if got := ask(s.gen, s.cycle, s.eps, s.live); got != s.want {
			t.Fatalf("%s: answer of call %d, want call %d", s.name, got, s.want)
		}
	}
	m.forget(key)
	if got := ask(2, t0.Add(30*time.Second), eps[:1], map[string]uint32{"10.0.0.1": 1001}); got != 8 {
		t.Errorf("after forget: answer of call %d, want a new call", got)
	}
}
