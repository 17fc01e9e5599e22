package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// WeightBook is the in-memory record, per optimizer, of the weights the
// mirror should write. The weight engine fills it; the mirror reads it and
// records what it applied. Weights of pods it does not know come from the
// live ServiceEntry, so a restart of the manager loses nothing.
type WeightBook struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]*bookEntry
}

type bookEntry struct {
	weights   map[string]uint32 // by pod name: what the mirror should write
	applied   map[string]uint32 // by pod name: what is live
	endpoints []desired.Endpoint
	appliedAt time.Time
}

// NewWeightBook returns an empty book.
func NewWeightBook() *WeightBook {
	return &WeightBook{entries: map[types.NamespacedName]*bookEntry{}}
}

func (b *WeightBook) entry(key types.NamespacedName) *bookEntry {
	e := b.entries[key]
	if e == nil {
		e = &bookEntry{}
		b.entries[key] = e
	}
	return e
}

// Known returns a copy of the weights to write, by pod name.
func (b *WeightBook) Known(key types.NamespacedName) map[string]uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil {
		return nil
	}
	out := make(map[string]uint32, len(e.weights))
	for k, v := range e.weights {
		out[k] = v
	}
	return out
}

// Applied records the endpoints (with weights) that are now live.
func (b *WeightBook) Applied(key types.NamespacedName, now time.Time, eps []desired.Endpoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(key)
	e.applied = make(map[string]uint32, len(eps))
	for _, ep := range eps {
		e.applied[ep.Pod] = ep.Weight
	}
	e.endpoints = append(e.endpoints[:0:0], eps...)
	e.appliedAt = now
}

// Set replaces the weights the mirror should write.
func (b *WeightBook) Set(key types.NamespacedName, w map[string]uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(key)
	e.weights = make(map[string]uint32, len(w))
	for k, v := range w {
		e.weights[k] = v
	}
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
