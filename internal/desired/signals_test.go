package desired

import (
	"testing"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

func resources(limit, request string) podOpt {
	return func(p *corev1.Pod) {
		c := &p.Spec.Containers[0]
		if limit != "" {
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(limit)}
		}
		if request != "" {
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(request)}
		}
	}
}

// A sidecar's resources must never count as the application's.
func sidecarWithResources(p *corev1.Pod) {
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "istio-proxy", Resources: corev1.ResourceRequirements{
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
	}})
}

func allocatable(n *corev1.Node, cpu string) *corev1.Node {
	n.Status.Allocatable = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("8Gi")}
	return n
}

// TestEndpointsCarryCPUSignals: each endpoint carries the CPU limit, the CPU
// request of the application containers and its node's allocatable CPU, so
// the weight engine can bound the capacity of a pod without a limit.
func TestEndpointsCarryCPUSignals(t *testing.T) {
	in := webInput()
	in.Slices[0].Endpoints[0].NodeName = new("n-big")
	in.Slices[0].Endpoints[1].NodeName = new("n-unknown")
	in.Pods = podMap(
		pod("web-0", resources("", "1500m"), sidecarWithResources), // no limit: request only
		pod("web-1", resources("2", "500m"), sidecarWithResources),
	)
	in.Nodes = nodeMap(allocatable(node("n-big", nil), "7910m"), node("n-unknown", nil))
	r := Compute(in)
	want := map[string][3]float64{ // cores, request, node cores
		"web-0": {0, 1.5, 7.91},
		"web-1": {2, 0.5, 0},
	}
	if len(r.Endpoints) != len(want) {
		t.Fatalf("endpoints %+v", r.Endpoints)
	}
	for _, ep := range r.Endpoints {
		got := [3]float64{ep.Cores, ep.CPURequest, ep.NodeCores}
		if got != want[ep.Pod] {
			t.Errorf("%s: cores, request, node cores = %v, want %v", ep.Pod, got, want[ep.Pod])
		}
	}
}

func TestCPURequest(t *testing.T) {
	tests := map[string]struct {
		pod  *corev1.Pod
		want float64
	}{
		"none":                {pod("p"), 0},
		"one container":       {pod("p", resources("", "250m")), 0.25},
		"sidecar not counted": {pod("p", resources("", "250m"), sidecarWithResources), 0.25},
		"two containers, one without a request": {pod("p", resources("", "1"), func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "helper"})
		}), 1},
	}
	for name, tc := range tests {
		if got := CPURequest(tc.pod); got != tc.want {
			t.Errorf("%s: CPURequest = %v, want %v", name, got, tc.want)
		}
	}
}

// TestLoadBalancer: LEAST_REQUEST when asked for; ROUND_ROBIN (also when
// unset) only once the weights are learned, Istio's default before.
func TestLoadBalancer(t *testing.T) {
	rr, lr := networking.LoadBalancerSettings_ROUND_ROBIN, networking.LoadBalancerSettings_LEAST_REQUEST
	tests := []struct {
		requested optv1.LoadBalancer
		learned   bool
		want      networking.LoadBalancerSettings_SimpleLB
	}{
		{"", false, lr},
		{"", true, rr},
		{optv1.LoadBalancerRoundRobin, false, lr},
		{optv1.LoadBalancerRoundRobin, true, rr},
		{optv1.LoadBalancerLeastRequest, false, lr},
		{optv1.LoadBalancerLeastRequest, true, lr},
	}
	for _, tc := range tests {
		in := webInput()
		in.Optimizer.Spec.LoadBalancer = tc.requested
		in.WeightsLearned = tc.learned
		r := Compute(in)
		if got := r.DestinationRule.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple(); got != tc.want || r.LoadBalancer != tc.want {
			t.Errorf("load_balancer %q, learned %v: DestinationRule %v (result %v), want %v", tc.requested, tc.learned, got, r.LoadBalancer, tc.want)
		}
	}
}
