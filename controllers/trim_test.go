package controllers_test

import (
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

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

// TestTrimmedPodsComputeTheSameObjects: everything the mirror derives from
// a pod (sidecar, CPU limit and request, named target ports, service
// account, node, ambient enrolment) is the same from the trimmed copy the
// cache keeps as from the full pod.
func TestTrimmedPodsComputeTheSameObjects(t *testing.T) {
	full := func() map[string]*corev1.Pod {
		withResources := func(limit, request string) PodOption {
			return func(p *corev1.Pod) {
				r := &p.Spec.Containers[0].Resources
				r.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(request), corev1.ResourceMemory: resource.MustParse("1Gi")}
				if limit != "" {
					r.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limit)}
				}
			}
		}
		named := func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "web", ContainerPort: 8080}}
			p.Labels["pod-template-hash"] = "7f9c8d6b5"
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, Reason: "Ready"}}
		}
		sidecarResources := func(p *corev1.Pod) {
			for i := range p.Spec.Containers {
				if p.Spec.Containers[i].Name == "istio-proxy" {
					p.Spec.Containers[i].Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}
					p.Spec.Containers[i].Ports = []corev1.ContainerPort{{Name: "http-envoy-prom", ContainerPort: 15090}}
				}
			}
		}
		return map[string]*corev1.Pod{
			"web-0": Pod("ns", "web-0", "web", "node-a", WithSidecar(), WithServiceAccount("web-sa"), withResources("2", "1"), named, sidecarResources),
			"web-1": Pod("ns", "web-1", "web", "node-b", WithSidecar(), WithServiceAccount("web-sa"), withResources("", "500m"), named, sidecarResources),
			"web-2": Pod("ns", "web-2", "web", "node-b", withResources("4", "4"), named),
		}
	}
	ambient := func(pods map[string]*corev1.Pod) map[string]*corev1.Pod {
		pods["web-2"].Labels[desired.LabelDataplaneMode] = "ambient"
		return pods
	}
	for name, pods := range map[string]map[string]*corev1.Pod{"sidecars and limits": full(), "an ambient pod": ambient(full())} {
		t.Run(name, func(t *testing.T) {
			trimmed := map[string]*corev1.Pod{}
			for n, p := range pods {
				out, err := controllers.TrimPod(p.DeepCopy())
				if err != nil {
					t.Fatal(err)
				}
				trimmed[n] = out.(*corev1.Pod)
			}
			input := func(pods map[string]*corev1.Pod) desired.Input {
				return desired.Input{
					Optimizer: Optimizer("ns", "web", "web"),
					Service:   Service("ns", "web", ServicePort("http", 80, intstr.FromString("web"))),
					Slices: []discoveryv1.EndpointSlice{*EndpointSlice("ns", "web-1", "web", []SlicePort{{Name: "http", Port: 8080}},
						Ready("web-0", IP(0, 1), "node-a"), Ready("web-1", IP(0, 2), "node-b"), Ready("web-2", IP(0, 3), "node-b"))},
					Pods: pods,
					Nodes: map[string]*corev1.Node{
						"node-a": Node("node-a", "eu", "eu-a", "", "m5.large"),
						"node-b": Node("node-b", "eu", "eu-b", "", "c5.xlarge"),
					},
				}
			}
			want, got := desired.Compute(input(pods)), desired.Compute(input(trimmed))
			if !reflect.DeepEqual(got.Endpoints, want.Endpoints) {
				t.Errorf("endpoints from trimmed pods:\n%+v\nfrom full pods:\n%+v", got.Endpoints, want.Endpoints)
			}
			if !reflect.DeepEqual(got.Ports, want.Ports) || !reflect.DeepEqual(got.Problems, want.Problems) {
				t.Errorf("ports/problems from trimmed pods %+v %+v, from full pods %+v %+v", got.Ports, got.Problems, want.Ports, want.Problems)
			}
			for _, objs := range [][2]any{{got.ServiceEntry, want.ServiceEntry}, {got.DestinationRule, want.DestinationRule}, {got.VirtualService, want.VirtualService}} {
				g, _ := json.Marshal(objs[0])
				w, _ := json.Marshal(objs[1])
				if string(g) != string(w) {
					t.Errorf("object from trimmed pods:\n%s\nfrom full pods:\n%s", g, w)
				}
			}
			// The case must exercise what it claims to.
			if name == "sidecars and limits" {
				e := want.Endpoints
				if len(e) != 3 || !e[0].Sidecar || e[0].ServiceAccount != "web-sa" || e[0].Cores != 2 || e[1].Cores != 0 || e[1].CPURequest != 0.5 || e[2].Sidecar || len(want.Ports) != 1 || want.Ports[0].TargetPort != 8080 {
					t.Errorf("the full pods do not give what the case checks: endpoints %+v ports %+v", e, want.Ports)
				}
			}
			if name == "an ambient pod" && len(want.Problems) == 0 {
				t.Errorf("an ambient pod gave no problem: the case tests nothing")
			}
		})
	}
}
