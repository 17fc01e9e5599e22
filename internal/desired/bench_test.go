package desired_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// The pure part of a reconcile, by Service size: Compute, and the check
// that an unchanged live ServiceEntry needs no write (UpToDate), both when
// the live spec is exactly the desired one and when another writer added a
// field, so the operator's owned fields must be read. docs/scale.md has
// the figures (go test ./internal/desired -run - -bench . -benchmem).

// input is what the mirror reads for one Service of n ready pods with
// sidecars, CPU limits and zoned nodes, with the engine's weights.
func input(n int) desired.Input {
	ns, svc := "team", "checkout"
	in := desired.Input{
		Optimizer: Optimizer(ns, svc, svc),
		Service:   Service(ns, svc, ServicePort("http", 80, intstr.FromInt32(8080))),
		Pods:      map[string]*corev1.Pod{},
		Nodes:     map[string]*corev1.Node{},
		Weights:   map[string]uint32{},
	}
	for z := range 3 {
		node := fmt.Sprintf("node-%d", z)
		in.Nodes[node] = Node(node, "eu-west", fmt.Sprintf("eu-west-%c", 'a'+z), "", "m5.large")
	}
	for s := 0; s*1000 < n; s++ {
		var eps []Endpoint
		for i := s * 1000; i < min(n, (s+1)*1000); i++ {
			name, node := fmt.Sprintf("%s-7f9c8d6b5-%05d", svc, i), fmt.Sprintf("node-%d", i%3)
			in.Pods[name] = Pod(ns, name, svc, node, WithSidecar(), WithCPULimit("2"))
			in.Weights[name] = uint32(500 + i%1000)
			eps = append(eps, Ready(name, IP(i/250, i%250+1), node))
		}
		in.Slices = append(in.Slices, *EndpointSlice(ns, fmt.Sprintf("%s-%d", svc, s), svc, []SlicePort{{Name: "http", Port: 8080}}, eps...))
	}
	return in
}

var sizes = []int{50, 500, 4000}

func BenchmarkCompute(b *testing.B) {
	for _, n := range sizes {
		in := input(n)
		b.Run(fmt.Sprintf("pods=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if r := desired.Compute(in); len(r.Endpoints) != n {
					b.Fatalf("%d endpoints", len(r.Endpoints))
				}
			}
		})
	}
}

func BenchmarkUpToDate(b *testing.B) {
	const manager = "istio-adaptive-optimizer"
	// What server-side apply records for the operator's ServiceEntry spec.
	owned := metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationApply, FieldsType: "FieldsV1",
		FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:hosts":{},"f:ports":{},"f:location":{},"f:resolution":{},"f:endpoints":{}}}`)}}
	for _, n := range sizes {
		want := desired.Compute(input(n))
		for _, c := range []struct {
			name  string
			other bool // another writer added a field the operator does not set
		}{{"same", false}, {"other-writer", true}} {
			live := desired.Compute(input(n)).ServiceEntry
			live.ManagedFields = []metav1.ManagedFieldsEntry{owned}
			if c.other {
				live.Spec.SubjectAltNames = []string{"spiffe://cluster.local/ns/team/sa/other"}
			}
			b.Run(fmt.Sprintf("pods=%d/%s", n, c.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if !desired.UpToDate(manager, want.ServiceEntry, live, &want.ServiceEntry.Spec, &live.Spec) {
						b.Fatal("an unchanged ServiceEntry is not up to date")
					}
				}
			})
		}
	}
}
