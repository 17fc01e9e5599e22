package controllers_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// TestTrimKeepsCPUSignals: the cache trims keep what bounds the capacity of
// a pod without a CPU limit (its CPU request, its node's allocatable CPU),
// and drop the other resources.
func TestTrimKeepsCPUSignals(t *testing.T) {
	pod := Pod("ns", "p", "app", "n", WithSidecar())
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m"), corev1.ResourceMemory: resource.MustParse("1Gi")}
	out, err := controllers.TrimPod(pod)
	if err != nil {
		t.Fatal(err)
	}
	trimmed := out.(*corev1.Pod)
	if got := desired.CPURequest(trimmed); got != 1.5 {
		t.Errorf("CPU request after trim %v, want 1.5", got)
	}
	if _, ok := trimmed.Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]; ok {
		t.Errorf("memory request kept: %v", trimmed.Spec.Containers[0].Resources.Requests)
	}

	node := Node("n", "r", "z", "", "m5.large")
	node.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3920m"), corev1.ResourcePods: resource.MustParse("110")}
	out, err = controllers.TrimNode(node)
	if err != nil {
		t.Fatal(err)
	}
	tn := out.(*corev1.Node)
	if got := desired.NodeCores(tn); got != 3.92 {
		t.Errorf("node cores after trim %v, want 3.92", got)
	}
	if len(tn.Status.Allocatable) != 1 || tn.Labels[corev1.LabelInstanceTypeStable] != "m5.large" {
		t.Errorf("trimmed node %+v", tn)
	}
}
