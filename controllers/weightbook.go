package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// WeightBook is the in-memory record, per optimizer, shared by the mirror
// (which writes the ServiceEntry) and the weight loop (which computes
// weights). Each optimizer has its own weight engine here. The engine is
// seeded from the live ServiceEntry the first time the mirror sees it, so a
// restart of the manager loses nothing learned that was applied.
type WeightBook struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]*bookEntry
}

type bookEntry struct {
	engine    *weights.Engine
	seeded    bool
	endpoints []desired.Endpoint
	// readySince is when the mirror first saw each pod, for slow start.
	// Pods present at the first sight are taken as long-ready.
	readySince map[string]time.Time
	outcome    *Outcome
	// target is the last weights the engine asked for (not in dry run);
	// the mirror writes them.
	target map[string]uint32
}

// Outcome is the result of the last weight cycle, for status and metrics.
type Outcome struct {
	Time     time.Time
	Result   weights.Result
	DryRun   bool
	QueryErr error
}

// NewWeightBook returns an empty book.
func NewWeightBook() *WeightBook {
	return &WeightBook{entries: map[types.NamespacedName]*bookEntry{}}
}

func (b *WeightBook) entry(key types.NamespacedName, p weights.Params) *bookEntry {
	e := b.entries[key]
	if e == nil {
		e = &bookEntry{engine: weights.New(p), readySince: map[string]time.Time{}}
		b.entries[key] = e
	}
	return e
}

// SetParams updates the engine parameters of an optimizer.
func (b *WeightBook) SetParams(key types.NamespacedName, p weights.Params) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.entry(key, p).engine.SetParams(p)
}

// Weights returns the weights the mirror should write for eps: the engine's
// weights for pods that stay, initial weights (slow start, hardware class,
// median) for new ones. On first sight the engine is seeded with the
// endpoints' current (live) weights.
func (b *WeightBook) Weights(key types.NamespacedName, p weights.Params, now time.Time, eps []desired.Endpoint) map[string]uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(key, p)
	if !e.seeded {
		live := make(map[string]uint32, len(eps))
		for _, ep := range eps {
			live[ep.Pod] = ep.Weight
			e.readySince[ep.Pod] = time.Time{}
		}
		e.engine.Seed(now, live)
		e.seeded = true
	}
	w := e.engine.Weights(now, e.pods(now, eps))
	for pod := range w {
		if t, ok := e.target[pod]; ok {
			w[pod] = t
		}
	}
	return w
}

// pods turns endpoints into engine pods, remembering when each first appeared.
func (e *bookEntry) pods(now time.Time, eps []desired.Endpoint) []weights.Pod {
	out := make([]weights.Pod, 0, len(eps))
	seen := make(map[string]bool, len(eps))
	for _, ep := range eps {
		since, ok := e.readySince[ep.Pod]
		if !ok {
			since = now
			e.readySince[ep.Pod] = now
		}
		seen[ep.Pod] = true
		out = append(out, weights.Pod{Name: ep.Pod, Locality: ep.Locality, HardwareClass: ep.HardwareClass, Cores: ep.Cores, ReadySince: since})
	}
	for pod := range e.readySince {
		if !seen[pod] {
			delete(e.readySince, pod)
		}
	}
	return out
}

// Applied records the endpoints (with weights) that are now live.
func (b *WeightBook) Applied(key types.NamespacedName, p weights.Params, now time.Time, eps []desired.Endpoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(key, p)
	w := make(map[string]uint32, len(eps))
	for _, ep := range eps {
		w[ep.Pod] = ep.Weight
	}
	if !e.seeded {
		e.engine.Seed(now, w)
		e.seeded = true
		for _, ep := range eps {
			e.readySince[ep.Pod] = time.Time{}
		}
	} else {
		e.engine.Applied(now, w)
	}
	e.endpoints = append(e.endpoints[:0:0], eps...)
}

// Update runs one engine cycle over the last applied endpoint set and
// records the outcome. It returns false when no endpoint set is known yet.
func (b *WeightBook) Update(key types.NamespacedName, p weights.Params, obs weights.Observation, dryRun bool) (Outcome, []desired.Endpoint, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || len(e.endpoints) == 0 {
		return Outcome{}, nil, false
	}
	e.engine.SetParams(p)
	res := e.engine.Update(e.pods(obs.Time, e.endpoints), obs)
	out := Outcome{Time: obs.Time, Result: res, DryRun: dryRun, QueryErr: obs.Err}
	e.outcome = &out
	if dryRun {
		e.target = nil
	} else if res.Changed || e.target == nil {
		e.target = res.Weights
	}
	return out, append([]desired.Endpoint(nil), e.endpoints...), true
}

// Outcome returns the last weight cycle's outcome, if any.
func (b *WeightBook) Outcome(key types.NamespacedName) *Outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil && e.outcome != nil {
		o := *e.outcome
		return &o
	}
	return nil
}

// Endpoints returns the last applied endpoint set.
func (b *WeightBook) Endpoints(key types.NamespacedName) []desired.Endpoint {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		return append([]desired.Endpoint(nil), e.endpoints...)
	}
	return nil
}

// Forget drops everything about a deleted optimizer.
func (b *WeightBook) Forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.entries, key)
}
