package edf

import (
	"math"
	"testing"
)

// fresh is a scheduler with hosts added in order at 1/weight and picks
// picks made from it one by one.
func fresh(hosts []int32, w []float64, picks int) *Scheduler {
	var e Scheduler
	for _, h := range hosts {
		e.Add(h, w[h])
	}
	for range picks {
		e.Pick(w)
	}
	return &e
}

// deadlines is each host's next deadline.
func (e *Scheduler) deadlines() map[int32]float64 {
	out := map[int32]float64{}
	for _, x := range e.h {
		out[x.host] = x.deadline
	}
	return out
}

// A rebuild from seed is the scheduler after seed picks one by one (Envoy's
// createWithPicks), up to the order of hosts due at the same instant, which
// Envoy's does not keep either: every host's next deadline is the same or
// one pick of its own away, and so its count over the picks that follow is
// the same or one apart.
func TestRebuildIsTheSchedulerAfterSeedPicks(t *testing.T) {
	for _, w := range [][]float64{
		{3, 1},
		{25, 75},
		{1900, 1880, 1005, 981, 110, 108},
		{7, 13, 29, 101, 1000},
	} {
		hosts := make([]int32, len(w))
		for i := range hosts {
			hosts[i] = int32(i)
		}
		for _, seed := range []uint64{0, 1, 2, 23, 117, 1000, 4321} {
			want := fresh(hosts, w, int(seed))
			var got Scheduler
			got.Rebuild(hosts, func(h int32) float64 { return w[h] }, seed)
			wd, gd := want.deadlines(), got.deadlines()
			for h, d := range wd {
				if math.Abs(gd[h]-d) > 1/w[h]+1e-9*max(1, d) {
					t.Errorf("weights %v, seed %d: host %d next due at %v, want %v (after %d picks one by one)", w, seed, h, gd[h], d, seed)
				}
			}
			a, b := map[int32]int{}, map[int32]int{}
			for range 500 {
				a[want.Pick(w)]++
				b[got.Pick(w)]++
			}
			for _, h := range hosts {
				if d := a[h] - b[h]; d < -1 || d > 1 {
					t.Errorf("weights %v, seed %d: the next 500 picks by host %v, want %v", w, seed, b, a)
					break
				}
			}
		}
	}
}

// Sidecars with different seeds start at unrelated points of the rotation:
// a host of a tenth of the mean weight is first picked at every point of
// it, not within the first rotation's end as when only seed % hosts picks
// were thrown away.
func TestRebuildSpreadsTheFirstPickOfALightHost(t *testing.T) {
	w := []float64{1900, 1900, 1000, 1000, 100, 100}
	hosts := []int32{0, 1, 2, 3, 4, 5}
	total := 0.0
	for _, v := range w {
		total += v
	}
	rotation := int(total / w[4]) // picks between two picks of host 4
	early := 0
	const sidecars = 256
	for seed := range uint64(sidecars) {
		var e Scheduler
		e.Rebuild(hosts, func(h int32) float64 { return w[h] }, seed*0x9e3779b97f4a7c15)
		for i := 0; ; i++ {
			if e.Pick(w) == 4 {
				if i < rotation/4 {
					early++
				}
				break
			}
		}
	}
	// Spread over the rotation, about a quarter first pick host 4 within
	// its first quarter; 4 standard deviations of a binomial above that
	// would be 36%.
	if early > sidecars*36/100 {
		t.Errorf("%d of %d sidecars first pick the light host within the first quarter of its rotation (%d picks)", early, sidecars, rotation/4)
	}
	if early == 0 {
		t.Errorf("no sidecar picks the light host within the first quarter of its rotation (%d picks)", rotation/4)
	}
}
