package weights

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// BenchmarkUpdate4096 times one cycle for the largest ServiceEntry Istio
// accepts, with CPU-only signals (the costlier path: shares over windows).
func BenchmarkUpdate4096(b *testing.B) {
	const n = MaxEndpoints
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

// BenchmarkPoolSpeeds4096 times poolSpeeds for the largest ServiceEntry,
// every speed within reach of the 2047 others of its class (the costliest
// case).
func BenchmarkPoolSpeeds4096(b *testing.B) {
	v, tol := make([]float64, MaxEndpoints), make([]float64, MaxEndpoints)
	for i := range v {
		v[i] = 0.6 + 0.4*float64(i%2) + 0.001*float64(i%17)
		tol[i] = 0.05
	}
	for b.Loop() {
		poolSpeeds(v, tol)
	}
}

// BenchmarkQueueUtilisations4096 times queueUtilisations for the largest
// ServiceEntry at 85% load, every pod's cores and speed a different
// estimate (the costliest case: pods with limits share a few core counts).
func BenchmarkQueueUtilisations4096(b *testing.B) {
	c, v := make([]float64, MaxEndpoints), make([]float64, MaxEndpoints)
	capacity := 0.0
	for i := range c {
		// Estimated cores and speeds: every pod's its own.
		c[i] = 1 + 7*float64(i)/MaxEndpoints
		v[i] = 0.5 + 0.5*math.Mod(float64(i)*0.618034, 1)
		capacity += c[i] * v[i]
	}
	for b.Loop() {
		if _, ok := queueUtilisations(c, v, 0.85*capacity); !ok {
			b.Fatal("no utilisations")
		}
	}
}
