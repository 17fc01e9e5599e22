package weights

import "testing"

// BenchmarkPoolSpeeds4096 times poolSpeeds for the largest ServiceEntry,
// every speed within a band of many others (the costliest case).
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
