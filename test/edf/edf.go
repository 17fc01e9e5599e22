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
	e.push(edfEntry{deadline: e.cur + 1/weight, order: e.order, host: host})
	e.order++
}

// push inserts x into the heap.
func (e *Scheduler) push(x edfEntry) {
	e.h = append(e.h, x)
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

// maxPrePicks bounds the picks a rebuild emulates (Envoy's UINT_MAX/10).
const maxPrePicks = 429496729

// Rebuild is Envoy's EDF rebuild after a host-set or weight change
// (EdfScheduler::createWithPicks; envoyproxy/envoy#32233, Envoy 1.30): the
// scheduler starts as if seed % maxPrePicks picks had been made from one
// with every host added in order at 1/weight. Envoy draws seed at random
// once per load balancer (each sidecar and worker), so schedulers built
// from the same hosts start at unrelated points of the weighted rotation,
// however unequal the weights; before 1.30 it threw away only seed % hosts
// picks, which left every sidecar's first picks of a light host within one
// rotation of each other's. Each host's share of the picks,
// floor(picks*w/W), is taken at once (its next deadline then (floor+1)/w);
// the few left are picked one by one, each re-added with its weight read at
// re-add time. A tiny epsilon on the weights keeps hosts whose weights are
// multiples of each other in the order one-by-one picks would give, as
// Envoy's does.
func (e *Scheduler) Rebuild(hosts []int32, weight func(int32) float64, seed uint64) {
	e.Reset()
	if len(hosts) == 0 {
		return
	}
	const epsilon = 1e-13
	picks := seed % maxPrePicks
	sum := 0.0
	for _, h := range hosts {
		sum += weight(h) + epsilon
	}
	var taken uint64
	for _, h := range hosts {
		w := weight(h) + epsilon
		floor := uint64(w * float64(picks) / sum)
		if floor > 0 && float64(floor)/w >= float64(picks)/sum {
			floor-- // floating point put floor(A*B) above A*B
		}
		e.cur = max(e.cur, float64(floor)/w)
		e.push(edfEntry{deadline: float64(floor+1) / w, order: e.order, host: h})
		e.order++
		taken += floor
	}
	for ; taken < picks; taken++ {
		h := e.Top()
		e.Readd(weight(h))
	}
}
