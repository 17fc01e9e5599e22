package controllers

import (
	"hash/maphash"
	"maps"
	"math"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// weightsMemo keeps, per optimizer, the weights the engine gave for the
// last endpoint set, so a reconcile that finds the same endpoints, the same
// spec and no new weight cycle does not ask the engine again. The engine's
// answer is a function of those (and of the clock, for slow start: a
// ramping pod's weight then moves with each weight cycle and each change of
// the endpoints rather than with every reconcile), and computing it grows
// faster than the pod count: it was half of a 4000-pod reconcile (see
// docs/scale.md), while most reconciles are of an unchanged Service (a
// weight cycle's wake, a change elsewhere in the namespace).
type weightsMemo struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]memoEntry
	seed    maphash.Seed // of endpointsHash, set with the first entry
}

type memoEntry struct {
	key     memoKey
	weights map[string]uint32
}

// memoKey is everything the engine's answer depends on but the clock.
type memoKey struct {
	generation int64     // the spec, hence the engine's parameters
	cycle      time.Time // the last weight cycle's outcome
	endpoints  uint64    // the endpoints and the live weights they are seeded from
}

// weightsFor returns the memoised weights for the same key, else asks
// compute and keeps its answer.
func (m *weightsMemo) weightsFor(opt types.NamespacedName, generation int64, cycle time.Time, eps []desired.Endpoint, live map[string]uint32, compute func() map[string]uint32) map[string]uint32 {
	m.mu.Lock()
	if m.entries == nil {
		m.entries = map[types.NamespacedName]memoEntry{}
		m.seed = maphash.MakeSeed()
	}
	seed := m.seed
	m.mu.Unlock()
	key := memoKey{generation: generation, cycle: cycle, endpoints: endpointsHash(seed, eps, live)}
	m.mu.Lock()
	if e, ok := m.entries[opt]; ok && e.key == key {
		m.mu.Unlock()
		return e.weights
	}
	m.mu.Unlock()
	// Computed outside the lock: optimizers reconcile in parallel. The map
	// is copied, so the engine may keep and change its own.
	w := maps.Clone(compute())
	m.mu.Lock()
	defer m.mu.Unlock()
	m.entries[opt] = memoEntry{key: key, weights: w}
	return w
}

// forget drops what is kept for a deleted optimizer.
func (m *weightsMemo) forget(opt types.NamespacedName) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.entries, opt)
}

// endpointsHash digests every field of the endpoints the engine reads (in
// their order, which desired keeps sorted) and the live weight of each.
// maphash, not FNV: FNV's byte-at-a-time loop took a millisecond of a
// 4000-endpoint reconcile; the digest lives only in this process.
func endpointsHash(seed maphash.Seed, eps []desired.Endpoint, live map[string]uint32) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	num := func(v uint64) {
		// Fixed width, so field boundaries cannot shift.
		var b [8]byte
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		_, _ = h.Write(b[:])
	}
	str := func(s string) {
		num(uint64(len(s)))
		_, _ = h.WriteString(s)
	}
	num(uint64(len(eps)))
	for _, ep := range eps {
		str(ep.Pod)
		str(ep.Address)
		str(ep.Node)
		str(ep.Locality)
		str(ep.HardwareClass)
		str(ep.ServiceAccount)
		if ep.Sidecar {
			num(1)
		} else {
			num(0)
		}
		num(math.Float64bits(ep.Cores))
		num(math.Float64bits(ep.CPURequest))
		num(math.Float64bits(ep.NodeCores))
		num(uint64(live[ep.Address]))
	}
	return h.Sum64()
}
