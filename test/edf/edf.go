// Package edf is Envoy's earliest-deadline-first scheduler, the core of its
// weighted ROUND_ROBIN and weighted LEAST_REQUEST, shared by the benchmark
// and the demo so that both balance exactly as Envoy does.
package edf

// Scheduler is Envoy's EdfScheduler: every entry has a deadline; a pick takes the
// entry with the smallest (deadline, insertion order), advances the
// scheduler's current time to that deadline and re-adds the entry with
// deadline current + 1/weight, where the weight is read at re-add time (which
// is what makes weighted LEAST_REQUEST use the active count seen at pick time).
type Scheduler struct {
	h     []edfEntry
	cur   float64
	order uint64
}

type edfEntry struct {
	deadline float64
	order    uint64
	host     int32
}

func edfLess(a, b *edfEntry) bool {
	return a.deadline < b.deadline || (a.deadline == b.deadline && a.order < b.order)
}

// Reset empties the scheduler, as a rebuild does.
func (e *Scheduler) Reset() {
	e.h = e.h[:0]
	e.cur = 0
	e.order = 0
}

// Add inserts host at deadline current + 1/weight.
func (e *Scheduler) Add(host int32, weight float64) {
	e.h = append(e.h, edfEntry{deadline: e.cur + 1/weight, order: e.order, host: host})
	e.order++
	// sift up
	i := len(e.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !edfLess(&e.h[i], &e.h[p]) {
			break
		}
		e.h[i], e.h[p] = e.h[p], e.h[i]
		i = p
	}
}

// Top returns the host to pick and advances the current time to its
// deadline. It must be followed by Readd.
func (e *Scheduler) Top() int32 {
	e.cur = e.h[0].deadline
	return e.h[0].host
}

// Readd re-inserts the host returned by Top with the given weight.
func (e *Scheduler) Readd(weight float64) {
	h := e.h
	h[0].deadline = e.cur + 1/weight
	h[0].order = e.order
	e.order++
	// sift down
	n := len(h)
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && edfLess(&h[r], &h[l]) {
			m = r
		}
		if !edfLess(&h[m], &h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// Pick is Envoy's pickAndAdd with a static weight per host (indexed by host).
func (e *Scheduler) Pick(w []float64) int32 {
	host := e.Top()
	e.Readd(w[host])
	return host
}

// Rebuild is Envoy's EDF rebuild after a host-set or weight change: the
// scheduler is reset, hosts are added in order at 1/weight, then skip picks
// are thrown away (each re-added with its weight read at re-add time) so
// that schedulers built from the same hosts do not move in lock step.
func (e *Scheduler) Rebuild(hosts []int32, weight func(int32) float64, skip int) {
	e.Reset()
	for _, h := range hosts {
		e.Add(h, weight(h))
	}
	for ; skip > 0; skip-- {
		h := e.Top()
		e.Readd(weight(h))
	}
}
