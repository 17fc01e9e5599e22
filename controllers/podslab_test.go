package controllers

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// TestReusedPodsAreRebuiltWhole: a Pod read into the memory of another
// (podslab.go) is exactly the Pod read fresh, whatever the earlier one
// held (more containers, labels, a sidecar, a Ready time), and a slab taken back and
// handed out again starts empty.
func TestReusedPodsAreRebuiltWhole(t *testing.T) {
	rich := Pod("shop", "rich", "web", "node-1", WithSidecar(), WithCPULimit("2"), WithServiceAccount("web"), WithContainerPort("http", 8080))
	rich.Spec.Containers = append(rich.Spec.Containers, corev1.Container{Name: "worker"})
	rich.Labels[desired.LabelDataplaneMode] = "ambient"
	rich.CreationTimestamp = metav1.Unix(1_700_000_000, 0)
	rich.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Unix(1_700_000_060, 0)},
	}
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

// The pod cache keeps when a pod was created and when it last became Ready
// (a restart tells pods new since the last write by them), and only while
// it is Ready.
func TestCachedPodKeepsItsCreationAndReadyTimes(t *testing.T) {
	pod := Pod("shop", "web-0", "web", "node-1")
	pod.CreationTimestamp = metav1.Unix(1_700_000_000, 0)
	readyAt := metav1.Unix(1_700_000_060, 0)
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: readyAt}}
	got, err := TrimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := got.(*corev1.Pod)
	if at := podReadyAt(trimmed); !trimmed.CreationTimestamp.Equal(&pod.CreationTimestamp) || !at.Equal(&readyAt) {
		t.Errorf("trimmed pod created %v, ready at %v; want %v, %v", trimmed.CreationTimestamp, podReadyAt(trimmed), pod.CreationTimestamp, readyAt)
	}
	pod.Status.Conditions[0].Status = corev1.ConditionFalse
	got, _ = TrimPod(pod)
	if at := podReadyAt(got.(*corev1.Pod)); !at.IsZero() {
		t.Errorf("a pod that is not Ready has a Ready time %v", at)
	}
}
