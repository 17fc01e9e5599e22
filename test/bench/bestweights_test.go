package main

import (
	"fmt"
	"testing"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// inSystem is the exact mean number of requests in the system (Erlang C)
// for traffic x over pods of c cores of rate mu per core.
func inSystem(c []int, mu, x []float64) float64 {
	sum := 0.0
	for i := range x {
		sum += mmcInSystem(c[i], x[i]/mu[i])
	}
	return sum
}

// The oracle runs the engine's solver, whose M/M/c wait is Sakasegawa's
// approximation; solved with the exact Erlang C wait, the same problem
// gives a split whose expected request time is what this prints. The
// engine's answer must cost within a percent of it.
func TestEngineSplitNearExactOptimum(t *testing.T) {
	mixes := map[string]struct {
		c  []int
		mu []float64
	}{
		"three generations": {[]int{2, 2, 2, 2, 2, 2}, []float64{100, 100, 60, 60, 35, 35}},
		"1-2-4-8 cores":     {[]int{1, 2, 4, 8}, []float64{100, 100, 100, 100}},
		"four classes":      {[]int{1, 2, 4, 8}, []float64{100, 70, 50, 30}},
	}
	for name, m := range mixes {
		for _, load := range []float64{0.2, 0.5, 0.8, 0.9} {
			capacity := 0.0
			cores := make([]float64, len(m.c))
			for i := range m.c {
				capacity += float64(m.c[i]) * m.mu[i]
				cores[i] = float64(m.c[i])
			}
			lambda := load * capacity
			share := weights.Split(cores, m.mu, lambda)
			x := make([]float64, len(share))
			for i := range share {
				x[i] = share[i] * lambda
			}
			exact := bestSplit(m.c, m.mu, lambda)
			got, best := inSystem(m.c, m.mu, x), inSystem(m.c, m.mu, exact)
			t.Logf("%s at %.0f%%: engine's split %.4f, exact optimum %.4f requests in system (%+.2f%%)", name, 100*load, got, best, 100*(got/best-1))
			if got > 1.01*best {
				t.Errorf("%s at %.0f%%: the engine's split costs %s more than the exact optimum", name, 100*load, fmt.Sprintf("%.1f%%", 100*(got/best-1)))
			}
		}
	}
}
