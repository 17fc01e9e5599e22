package controllers

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// TestReusedPodsAreRebuiltWhole: a Pod read into the memory of another
// (podslab.go) is exactly the Pod read fresh, whatever the earlier one
// held (more containers, labels, a sidecar), and a slab taken back and
// handed out again starts empty.
func TestReusedPodsAreRebuiltWhole(t *testing.T) {
	rich := Pod("shop", "rich", "web", "node-1", WithSidecar(), WithCPULimit("2"), WithServiceAccount("web"), WithContainerPort("http", 8080))
	rich.Spec.Containers = append(rich.Spec.Containers, corev1.Container{Name: "worker"})
	rich.Labels[desired.LabelDataplaneMode] = "ambient"
	plain := Pod("shop", "plain", "web", "node-2")
	bare := Pod("shop", "bare", "web", "node-3")
	bare.Spec.Containers = nil

	var slabs podSlabs
	slab := slabs.get()
	slab.reserve(1)
	for _, order := range [][]*corev1.Pod{{rich, plain}, {plain, rich}, {rich, bare}, {bare, rich}} {
		dst := slab.next()
		for _, p := range order {
			newPodInfo(p).podInto(dst)
			if want := newPodInfo(p).pod(); !reflect.DeepEqual(dst, want) {
				t.Errorf("%s read over another pod:\n got %+v\nwant %+v", p.Name, dst, want)
			}
		}
		slab.byName[dst.Name] = dst
		slabs.put(slab)
		if slab = slabs.get(); len(slab.byName) != 0 || slab.used != 0 {
			t.Fatalf("a slab handed out again holds %d pods, %d used", len(slab.byName), slab.used)
		}
		slab.reserve(1)
	}
}
