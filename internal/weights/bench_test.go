package weights

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkUpdate4096 times one cycle for the largest ServiceEntry Istio
// accepts, with CPU-only signals (the costlier path: shares over windows).
func BenchmarkUpdate4096(b *testing.B) {
	const n = 4096 // Istio's most endpoints in one ServiceEntry
	pods := make([]Pod, n)
	for i := range pods {
		pods[i] = Pod{Name: fmt.Sprintf("pod-%04d", i), Locality: fmt.Sprintf("r/z%d/", i%3), HardwareClass: fmt.Sprintf("m%d", i%4)}
	}
	speed := func(i int) float64 { return 0.4 + 0.2*float64(i%4) }
	e := New(DefaultParams())
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.Applied(now, e.Weights(now, pods))
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(30 * time.Second)
		obs := Observation{Time: now, Signals: make(map[string]Signal, n)}
		live := e.live
		sum := 0.0
		for _, w := range live {
			sum += float64(w)
		}
		for i, pod := range pods {
			share := float64(live[pod.Name]) / sum
			obs.Signals[pod.Name] = Signal{CPU: 2000 * share / speed(i), Requests: -1}
		}
		res := e.Update(pods, obs)
		if res.Changed {
			e.Applied(now, res.Weights)
		}
	}
}
