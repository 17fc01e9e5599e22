package controllers

import (
	"context"
	"fmt"
	"sync"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// indexObjectName indexes ServiceEntries by their own name, so the mirror
// can find the cache's object without copying it (liveServiceEntries).
// The API server serves the same field selector, so a reader without the
// cache answers alike.
const indexObjectName = "metadata.name"

// keepCopyEndpoints is the size from which a ServiceEntry's copy is kept;
// smaller ones are copied at each reconcile. A kept copy costs about 0.85 KiB an endpoint for as long as the optimizer
// lives, as much as the cache's own object; keeping every one at 200
// optimizers x 50 pods was 8.5 MiB of a 57 MiB heap, while copying 50
// endpoints takes about 50 µs. From 1000 endpoints a copy takes a
// millisecond or more of every reconcile.
const keepCopyEndpoints = 1000

// liveServiceEntries keeps, per optimizer whose ServiceEntry has at least
// keepCopyEndpoints endpoints, a private deep copy of it and the weights
// read from it, for as long as the cache holds the same version of the
// object. Most reconciles find the ServiceEntry unchanged (a weight cycle's
// wake, a change elsewhere in the namespace), and copying it cost a tenth
// of a 4000-endpoint reconcile, with the garbage it left (docs/scale.md).
//
// The copy must still be made: an Istio object holds protobuf messages
// whose internal state (the message info, the size cache) proto.Clone,
// proto.Equal and the encoders set lazily, with atomic writes, while a
// plain struct copy of the object, as a Get without deep copy makes, reads
// it without; the race detector finds that. Here the cache's object is
// only found through a list without deep copy (pointers, never a struct
// copy) and only its metadata is read; the spec is read from a copy made
// by the object's own DeepCopy, as a deep-copying Get would, and each copy
// belongs to one optimizer, whose reconciles never run at once.
type liveServiceEntries struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]liveServiceEntry // by optimizer
}

type liveServiceEntry struct {
	name    types.NamespacedName
	uid     types.UID
	version string
	se      *istionet.ServiceEntry
	weights map[string]uint32
}

// get returns the live ServiceEntry called name (nil when there is none)
// and its weights by address. Callers must not change either.
func (l *liveServiceEntries) get(ctx context.Context, c client.Reader, opt, name types.NamespacedName) (*istionet.ServiceEntry, map[string]uint32, error) {
	list := &istionet.ServiceEntryList{}
	if err := c.List(ctx, list, client.InNamespace(name.Namespace), client.MatchingFields{indexObjectName: name.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, nil, fmt.Errorf("get ServiceEntry %s: %w", name, err)
	}
	var cached *istionet.ServiceEntry
	for _, se := range list.Items {
		if se.Name == name.Name && se.Namespace == name.Namespace {
			cached = se
		}
	}
	if cached == nil {
		l.forget(opt)
		return nil, nil, nil
	}
	l.mu.Lock()
	e, ok := l.entries[opt]
	l.mu.Unlock()
	if ok && e.name == name && e.uid == cached.UID && e.version == cached.ResourceVersion {
		return e.se, e.weights, nil
	}
	// Copied outside the lock: optimizers reconcile in parallel.
	se := cached.DeepCopy()
	e = liveServiceEntry{name: name, uid: se.UID, version: se.ResourceVersion, se: se, weights: desired.LiveWeights(se)}
	if len(se.Spec.Endpoints) < keepCopyEndpoints {
		if ok {
			l.forget(opt)
		}
		return e.se, e.weights, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.entries == nil {
		l.entries = map[types.NamespacedName]liveServiceEntry{}
	}
	l.entries[opt] = e
	return e.se, e.weights, nil
}

// forget drops the copy kept for a deleted optimizer.
func (l *liveServiceEntries) forget(opt types.NamespacedName) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.entries, opt)
}
