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
// seeded with the live weights the first time the mirror sees the
// optimizer, so a restart of the manager loses nothing learned that was
// applied.
type WeightBook struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]*bookEntry
}

type bookEntry struct {
	engine *weights.Engine
	seeded bool
	// endpoints is the set the mirror applied last, with its weights.
	endpoints []desired.Endpoint
	// readySince is when the mirror first saw each pod, for slow start.
	// Pods present at the first sight are taken as long-ready.
	readySince map[string]time.Time
	outcome    *Outcome
	// restore is what an earlier manager learned (persisted on the
	// optimizer), given to the engine when it is seeded; persisted is the
	// snapshot last written there (see learned_state.go).
	restore, persisted weights.Snapshot
}

// Outcome is the result of the last weight cycle, for status and metrics.
type Outcome struct {
	Time     time.Time
	Result   weights.Result
	DryRun   bool
	QueryErr error
	// Signals says which signals the cycle had data for.
	Signals Signals
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

// seed gives the engine the weights that are live when the book first meets
// an optimizer; every pod there counts as long-ready.
func (e *bookEntry) seed(now time.Time, eps []desired.Endpoint, w map[string]uint32) {
	if e.seeded {
		return
	}
	for _, ep := range eps {
		e.readySince[ep.Pod] = time.Time{}
	}
	if e.restore.Valid() && len(w) > 0 {
		// An engine ran before this one and its weights are live: they
		// are settled estimates, not first guesses.
		e.engine.SeedSettled(now, w, e.restore)
		e.persisted = e.restore
	} else {
		e.engine.Seed(now, w)
	}
	e.seeded = true
}

// WeightsFor returns, by pod, the weights the mirror should write for eps.
// Without the engine (no metrics backend, or dry run) they are the weights
// the mirror applied last, so an out-of-band edit is put back; nil after a
// restart, when the live ServiceEntry's weights count. With the engine they
// are the engine's weights: its latest for pods that stay, initial ones
// (slow start, hardware class, median) for new pods.
func (b *WeightBook) WeightsFor(key types.NamespacedName, p weights.Params, now time.Time, eps []desired.Endpoint, live map[string]uint32, useEngine bool) map[string]uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !useEngine {
		e := b.entries[key]
		if e == nil || len(e.endpoints) == 0 {
			return nil
		}
		return byPod(e.endpoints)
	}
	e := b.entry(key, p)
	seed := make(map[string]uint32, len(eps))
	for _, ep := range eps {
		if w := live[ep.Address]; w > 0 {
			seed[ep.Pod] = w
		}
	}
	e.seed(now, eps, seed)
	return e.engine.Weights(now, e.pods(now, eps))
}

func byPod(eps []desired.Endpoint) map[string]uint32 {
	w := make(map[string]uint32, len(eps))
	for _, ep := range eps {
		w[ep.Pod] = ep.Weight
	}
	return w
}

// pods turns endpoints into engine pods, remembering when each first
// appeared; a pod that left and returns starts its slow start again.
func (e *bookEntry) pods(now time.Time, eps []desired.Endpoint) []weights.Pod {
	out := make([]weights.Pod, 0, len(eps))
	since := make(map[string]time.Time, len(eps))
	for _, ep := range eps {
		t, ok := e.readySince[ep.Pod]
		if !ok {
			t = now
		}
		since[ep.Pod] = t
		out = append(out, weights.Pod{Name: ep.Pod, Locality: ep.Locality, HardwareClass: ep.HardwareClass, Cores: ep.Cores,
			CPURequest: ep.CPURequest, NodeCores: ep.NodeCores, Node: ep.Node, ReadySince: t})
	}
	e.readySince = since
	return out
}

// Applied records the endpoints (with weights) that are now live.
func (b *WeightBook) Applied(key types.NamespacedName, p weights.Params, now time.Time, eps []desired.Endpoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(key, p)
	w := byPod(eps)
	if e.seeded {
		e.engine.Applied(now, w)
	} else {
		e.seed(now, eps, w)
	}
	// A new slice each time, so callers may keep the one they got.
	e.endpoints = append([]desired.Endpoint(nil), eps...)
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
	return out, e.endpoints, true
}

// Alarming reports whether the engine's Alarm can ring at all
// (weights.Engine.Alarming), so that a look is worth a query.
func (b *WeightBook) Alarming(key types.NamespacedName) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	return e != nil && len(e.endpoints) > 0 && e.engine.Alarming()
}

// Alarm asks the engine whether the recent signals in obs show a pod that
// fell behind since the last cycle (weights.Engine.Alarm).
func (b *WeightBook) Alarm(key types.NamespacedName, obs weights.Observation) (pod, why string, ring bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || len(e.endpoints) == 0 {
		return "", "", false
	}
	pods := make([]weights.Pod, 0, len(e.endpoints))
	for _, ep := range e.endpoints {
		pods = append(pods, weights.Pod{Name: ep.Pod})
	}
	return e.engine.Alarm(pods, obs)
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

// Endpoints returns the last applied endpoint set; callers must not change it.
func (b *WeightBook) Endpoints(key types.NamespacedName) []desired.Endpoint {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		return e.endpoints
	}
	return nil
}

// Forget drops everything about a deleted optimizer.
func (b *WeightBook) Forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.entries, key)
}

// Restore hands the book what an earlier manager learned about an
// optimizer, for its engine's seed. It has no effect once the engine is
// seeded.
func (b *WeightBook) Restore(key types.NamespacedName, p weights.Params, s weights.Snapshot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entry(key, p); !e.seeded {
		e.restore = s
	}
}

// SnapshotToPersist returns the engine's snapshot when it differs enough
// from the one persisted last to be worth a write.
func (b *WeightBook) SnapshotToPersist(key types.NamespacedName) (weights.Snapshot, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || !e.seeded {
		return weights.Snapshot{}, false
	}
	s := e.engine.Snapshot()
	if !s.Valid() || s.Similar(e.persisted) {
		return weights.Snapshot{}, false
	}
	return s, true
}

// Persisted records that s was written to the optimizer.
func (b *WeightBook) Persisted(key types.NamespacedName, s weights.Snapshot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		e.persisted = s
	}
}
