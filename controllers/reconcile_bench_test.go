package controllers

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// The pure parts of a 4000-pod reconcile that sit in this package (see
// docs/scale.md, "The mirror's reconcile, black-box"): turning the pod
// cache's records into Pods, the weights memo's digest of the endpoints,
// and the book's record of the applied endpoints.

const benchPods = 4000

func benchEndpoints() []desired.Endpoint {
	eps := make([]desired.Endpoint, benchPods)
	for i := range eps {
		eps[i] = desired.Endpoint{Pod: fmt.Sprintf("checkout-7f9c8d6b5-%05d", i), Address: fmt.Sprintf("10.%d.%d.%d", i/65536, i/256%256, i%256),
			Node: fmt.Sprintf("node-%d", i%3), Locality: "eu-west/eu-west-a", HardwareClass: "m5.large", ServiceAccount: "checkout",
			Sidecar: true, Cores: 2, NodeCores: 2, Weight: 1000}
	}
	return eps
}

// BenchmarkPodsFromCache4000 rebuilds 4000 Pods from the pod cache's
// records: into new Pods, and into a reused slab, as a reconcile reads
// them (podslab.go).
func BenchmarkPodsFromCache4000(b *testing.B) {
	infos := make([]*podInfo, benchPods)
	for i := range infos {
		infos[i] = newPodInfo(Pod("team", fmt.Sprintf("checkout-7f9c8d6b5-%05d", i), "checkout", "node-1", WithSidecar(), WithCPULimit("2")))
	}
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pods := make(map[string]*corev1.Pod, len(infos))
			for _, p := range infos {
				pods[p.Name] = p.pod()
			}
		}
	})
	b.Run("slab", func(b *testing.B) { // as the mirror reads them
		var slabs podSlabs
		b.ReportAllocs()
		for b.Loop() {
			slab := slabs.get()
			slab.reserve(len(infos))
			for _, p := range infos {
				pod := slab.next()
				p.podInto(pod)
				slab.byName[p.Name] = pod
			}
			slabs.put(slab)
		}
	})
}

// BenchmarkEndpointsHash4000 is the weights memo's digest of 4000
// endpoints, taken at every reconcile.
func BenchmarkEndpointsHash4000(b *testing.B) {
	var m weightsMemo
	m.weightsFor(types.NamespacedName{}, 1, time.Time{}, nil, nil, func() map[string]uint32 { return nil }) // sets the seed
	eps := benchEndpoints()
	live := byPod(eps)
	b.ReportAllocs()
	for b.Loop() {
		endpointsHash(m.seed, eps, live)
	}
}

// BenchmarkBookApplied4000 records an unchanged set of 4000 endpoints as
// applied, as every reconcile does.
func BenchmarkBookApplied4000(b *testing.B) {
	book := NewWeightBook()
	key := types.NamespacedName{Namespace: "team", Name: "checkout"}
	p := weights.DefaultParams()
	eps := benchEndpoints()
	now := time.Unix(1000, 0)
	book.Applied(key, p, now, eps)
	b.ReportAllocs()
	for b.Loop() {
		book.Applied(key, p, now, eps)
	}
}
