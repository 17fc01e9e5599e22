package main

import (
	"fmt"
	"math"
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

// oracle_bounded is oracle_best within the engine's MaxRatio: at low load
// on unlike speeds the best static weights starve the slow pods, and the
// bounded ones hold them at the mean over the ratio, as the engine would;
// benchParams' ratio (bench --max-ratio) is the one they keep.
func TestBoundedOracleKeepsTheEnginesRatio(t *testing.T) {
	sc := mustParse(t, `
pods:
  - {name: fast, count: 4, cores: 2, speed: 1.0}
  - {name: slow, count: 4, cores: 2, speed: 0.35}
clients: 4
load: 0.2
duration: 60s
warmup: 0s
work: {mean: 10ms}
seed: 1
`)
	spread := func(w []float64) (lo, mean float64) {
		lo = math.Inf(1)
		for _, v := range w {
			lo, mean = min(lo, v), mean+v/float64(len(w))
		}
		return lo, mean
	}
	def, _ := strategyByName("oracle_best")
	s := newSim(sc, def)
	if lo, mean := spread(bestWeights(s)); lo >= mean/10 {
		t.Fatalf("oracle_best's least weight %.0f of a mean %.0f: the case needs a pod below a tenth of the mean", lo, mean)
	}
	t.Cleanup(func() { benchParams = nil })
	for _, ratio := range []float64{10, 30} {
		benchParams = func(p *weights.Params) { p.MaxRatio = ratio }
		lo, mean := spread(boundedWeights(s))
		if math.Abs(lo-mean/ratio) > 0.5 { // rounded to a whole weight
			t.Errorf("ratio %v: oracle_bounded's least weight %.0f, want the mean %.0f over the ratio", ratio, lo, mean)
		}
	}
}
