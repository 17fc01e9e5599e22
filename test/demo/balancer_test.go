package main

import (
	"context"
	"testing"
	"time"
)

// fixedSource serves a fixed endpoint set and policy.
type fixedSource struct {
	eps    []endpointWeight
	policy string
}

func (f *fixedSource) Endpoints(context.Context) ([]endpointWeight, string, error) {
	return f.eps, f.policy, nil
}
func (f *fixedSource) Close() {}

func testSidecar(t *testing.T, policy string, weights ...uint32) *sidecar {
	t.Helper()
	src := &fixedSource{policy: policy}
	byAddr := map[string]int{}
	pods := make([]*simPod, len(weights))
	for i, w := range weights {
		addr := string(rune('a' + i))
		src.eps = append(src.eps, endpointWeight{Address: addr, Weight: w})
		byAddr[addr] = i
	}
	s := newSidecar(0, 1, src, byAddr, pods, time.Second, &recorder{}, 1)
	s.refresh(context.Background())
	if !s.Synced() || s.Policy() != policy {
		t.Fatalf("sidecar not synced with %s: %v", policy, s.LastErr())
	}
	return s
}

// TestSidecarLeastRequest: the load generators balance as Envoy's
// LEAST_REQUEST does. Equal weights: of two random pods the one with fewer
// requests in flight, so a pod with a queue gets (almost) nothing while the
// others have none. Unequal weights: EDF over weight/(active+1), so the
// shares follow the weights when nothing is in flight.
func TestSidecarLeastRequest(t *testing.T) {
	s := testSidecar(t, "LEAST_REQUEST", 1, 1, 1, 1)
	// A long queue on pod 0.
	s.mu.Lock()
	s.active = []int{50, 0, 0, 0}
	s.mu.Unlock()
	got := make([]int, 4)
	for range 300 {
		p := s.pick()
		got[p]++
		s.done(p)
	}
	if got[0] > 300/16+15 { // only when both random draws are pod 0
		t.Errorf("pod with 50 in flight got %d of 300 picks, want about 1/16: %v", got[0], got)
	}

	s = testSidecar(t, "LEAST_REQUEST", 100, 300)
	got = make([]int, 2)
	for range 400 {
		p := s.pick()
		got[p]++
		s.done(p)
	}
	if got[0] != 100 || got[1] != 300 {
		t.Errorf("weights 100:300 with nothing in flight: picks %v, want [100 300]", got)
	}

	s = testSidecar(t, "ROUND_ROBIN", 100, 300)
	s.mu.Lock()
	s.active = []int{0, 1000}
	s.mu.Unlock()
	got = make([]int, 2)
	for range 400 {
		got[s.pick()]++
	}
	if got[0] != 100 || got[1] != 300 {
		t.Errorf("ROUND_ROBIN 100:300 ignores what is in flight: picks %v, want [100 300]", got)
	}
}
