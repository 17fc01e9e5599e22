package main

import (
	"math"
	"slices"
	"testing"
)

// The best static weights: the sum of the rates is the load, no pod is
// past the cap, and every pod with traffic below its cap has the same
// marginal cost, no higher than the cost at zero load of a pod left out.
func TestBestSplitEqualisesMarginalCost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		c      []int
		speed  []float64
		load   float64 // fraction of the capacity
		unused int     // pods that get no traffic
	}{
		{"three generations at 0.8", []int{2, 2, 2}, []float64{1, 0.6, 0.35}, 0.8, 0},
		{"three generations at 0.2", []int{2, 2, 2}, []float64{1, 0.6, 0.35}, 0.2, 2},
		{"four per generation at 0.2", []int{2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, []float64{1, 1, 1, 1, 0.6, 0.6, 0.6, 0.6, 0.35, 0.35, 0.35, 0.35}, 0.2, 8},
		{"1-2-8 cores at 0.9", []int{1, 2, 8}, []float64{1, 1, 1}, 0.9, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu := make([]float64, len(tc.c))
			capSum := 0.0
			for i := range mu {
				mu[i] = tc.speed[i] / 0.010
				capSum += float64(tc.c[i]) * mu[i]
			}
			lambda := tc.load * capSum
			x := bestSplit(tc.c, mu, lambda)
			sum, m, unused := 0.0, math.NaN(), 0
			for i := range x {
				sum += x[i]
				if x[i] > bestCap*float64(tc.c[i])*mu[i]*(1+1e-9) {
					t.Errorf("pod %d at %.3f utilisation, past the cap", i, x[i]/(float64(tc.c[i])*mu[i]))
				}
				if x[i] == 0 {
					unused++
					continue
				}
				mi := mmcMarginal(tc.c[i], mu[i], x[i])
				if math.IsNaN(m) {
					m = mi
				} else if math.Abs(mi/m-1) > 1e-3 {
					t.Errorf("pod %d marginal cost %.6g, pod 0's %.6g", i, mi, m)
				}
			}
			for i := range x {
				if x[i] == 0 && mmcMarginal(tc.c[i], mu[i], 0) < m {
					t.Errorf("pod %d gets nothing although its cost at zero load %.4g is below %.4g", i, mmcMarginal(tc.c[i], mu[i], 0), m)
				}
			}
			if math.Abs(sum/lambda-1) > 1e-9 {
				t.Errorf("rates sum to %.4f, want %.4f", sum, lambda)
			}
			if unused != tc.unused {
				t.Errorf("%d pods without traffic (%v), want %d", unused, x, tc.unused)
			}
		})
	}
}

// Like pods get like traffic; the M/M/c cost is Erlang C's (Little's law on
// the sojourn time of erlangC in sim_test.go).
func TestBestSplitLikePodsAndErlangC(t *testing.T) {
	x := bestSplit([]int{2, 2, 2}, []float64{100, 100, 100}, 480)
	for _, v := range x {
		if math.Abs(v-160) > 1e-6 {
			t.Fatalf("like pods: %v, want 160 each", x)
		}
	}
	lambda, mu := 150.0, 100.0
	if got, want := mmcInSystem(2, lambda/mu), lambda*erlangC(lambda, mu, 2); math.Abs(got/want-1) > 1e-9 {
		t.Fatalf("mean in system %.6f, Erlang C gives %.6f", got, want)
	}
}

// Peak EWMA, as tower's: a slower response replaces the estimate at once, a
// faster one moves it by 1 - exp(-elapsed/decay); a read decays it.
func TestLinkerdPeakEWMA(t *testing.T) {
	est, at := 0.030, 0.0
	if got := ewmaUpdate(&est, &at, 1, 0.200); got != 0.200 {
		t.Fatalf("peak: %v, want 0.2", got)
	}
	got := ewmaUpdate(&est, &at, 1+linkerdDecay, 0.010)
	want := 0.200*math.Exp(-1) + 0.010*(1-math.Exp(-1))
	if math.Abs(got-want) > 1e-12 {
		t.Fatalf("decay: %v, want %v", got, want)
	}
	if read := ewmaUpdate(&est, &at, 1+2*linkerdDecay, 0); math.Abs(read-want*math.Exp(-1)) > 1e-12 {
		t.Fatalf("read after one decay time: %v, want %v", read, want*math.Exp(-1))
	}
}

// Linkerd's p2c sends to the lower of latency x (in flight + 1).
func TestLinkerdPicksLowerCost(t *testing.T) {
	s := twoPodSim(t, "linkerd")
	c := &s.clients[0]
	c.ewma[0], c.ewma[1] = 0.010, 0.010
	s.active[0], s.active[1] = 2, 0 // costs 0.03 and 0.01
	if got := pickShares(s, 1000); got[1] != 1 {
		t.Fatalf("shares %v, want all to the idle pod", got)
	}
	c.ewma[0], c.ewma[1] = 0.010, 0.050
	s.active[0], s.active[1] = 2, 0 // 0.03 against 0.05
	if got := pickShares(s, 1000); got[0] != 1 {
		t.Fatalf("shares %v, want all to the faster pod", got)
	}
}

// Prequal's hot-cold rule: among the replicas at or below the pool's
// Q_RIF quantile of requests in flight, the lowest latency; with none of
// them usable, the lowest RIF.
func TestPrequalHotColdPick(t *testing.T) {
	s := twoPodSim(t, "prequal")
	c := &s.clients[0]
	pool := func(ps ...prequalProbe) { c.pool = append(c.pool[:0], ps...) }
	// RIFs 1, 2, 3, 9: the 0.75 quantile is 3; the cold ones are 1, 2, 3
	// and the one of lowest latency among them wins, not the lowest RIF.
	pool(prequalProbe{pod: 0, rif: 1, lat: 0.050}, prequalProbe{pod: 1, rif: 3, lat: 0.010},
		prequalProbe{pod: 0, rif: 2, lat: 0.040}, prequalProbe{pod: 1, rif: 9, lat: 0.001})
	if h := s.pickPrequal(c); h != 1 || c.pool[1].uses != 1 {
		t.Fatalf("picked %d (pool %+v), want pod 1 by its cold probe of latency 10 ms", h, c.pool)
	}
	// A used probe is gone; stale ones too.
	pool(prequalProbe{pod: 0, rif: 5, lat: 0.001, uses: prequalReuse}, prequalProbe{pod: 1, rif: 4, lat: 0.002})
	if h := s.pickPrequal(c); h != 1 {
		t.Fatalf("picked %d, want pod 1 (the other probe was used up)", h)
	}
	s.now = 10
	pool(prequalProbe{pod: 0, rif: 0, lat: 0.001, t: 10 - 2*prequalMaxAge}, prequalProbe{pod: 1, rif: 4, lat: 0.002, t: 10})
	if h := s.pickPrequal(c); h != 1 {
		t.Fatalf("picked %d, want pod 1 (pod 0's probe is stale)", h)
	}
}

// A replica's latency estimate is the median of its recent latencies at
// the RIF asked for, else at the nearest RIF with data.
func TestPrequalLatencyEstimate(t *testing.T) {
	var p prequalLat
	for _, v := range []float64{0.003, 0.001, 0.002} {
		p.add(2, v)
	}
	p.add(7, 0.009)
	for rif, want := range map[int32]float64{2: 0.002, 0: 0.002, 6: 0.009, 200: 0.009} {
		if got := p.estimate(rif); got != want {
			t.Errorf("estimate at RIF %d: %v, want %v", rif, got, want)
		}
	}
}

// settled: the first cycle from which the shares stay within 5% of the
// strategy's own final shares, not of the capacity shares.
func TestSettledCycleIsOwnTargets(t *testing.T) {
	s := &sim{}
	hosts := []int32{0, 1}
	for i, sh := range [][]float64{{0.5, 0.5}, {0.9, 0.1}, {0.7, 0.3}, {0.71, 0.29}, {0.70, 0.30}, {0.70, 0.30}} {
		s.snaps = append(s.snaps, shareSnap{cycle: i, hosts: hosts, shares: sh})
	}
	if got := s.settledCycle(); got != 2 {
		t.Fatalf("settled at %d, want 2", got)
	}
	s.snaps = append(s.snaps, shareSnap{cycle: 6, hosts: hosts, shares: []float64{0.5, 0.5}})
	if got := s.settledCycle(); got != -1 {
		t.Fatalf("settled at %d after a late move, want -1", got)
	}
}

// After settling, the switch into ROUND_ROBIN that ends the opt-in's
// learning spell is convergence; a spell after it counts, as do writes.
func TestLateChangesSkipTheEndOfLearning(t *testing.T) {
	s := &sim{learnedCycle: -1, lb: lbWLR}
	switchTo := map[int]lbMode{5: lbWRR, 10: lbWLR, 12: lbWRR}
	for c := 1; c <= 12; c++ {
		s.now = float64(c)
		s.regularCycle()
		if slices.Contains([]int{1, 2, 4, 9}, c) {
			s.writeTimes = append(s.writeTimes, s.now)
		}
		if lb, ok := switchTo[c]; ok {
			s.setLB(lb)
		}
	}
	if w, sw := s.lateChanges(3); w != 2 || sw != 2 {
		t.Errorf("settled at 3, learned at 5: %d writes, %d switches after; want 2, 2", w, sw)
	}
	if w, sw := s.lateChanges(11); w != 0 || sw != 1 {
		t.Errorf("settled at 11: %d writes, %d switches after; want 0, 1", w, sw)
	}
	// A run whose first change was out of ROUND_ROBIN has no learning
	// spell to end: every change after settling counts.
	r := &sim{learnedCycle: -1, lb: lbWRR}
	for range 5 {
		r.now++
		r.regularCycle()
	}
	r.setLB(lbWLR)
	if _, sw := r.lateChanges(3); sw != 1 {
		t.Errorf("a first change into LEAST_REQUEST: %d switches after, want 1", sw)
	}
}
