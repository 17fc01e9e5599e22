package promsource

import (
	"strings"
	"testing"
	"time"
)

func TestDefaultNodeCPUQueryRenders(t *testing.T) {
	got, err := Render(DefaultNodeCPUQuery, Target{Namespace: "shop", Service: "cart", Pods: []string{"cart-0", "cart.1"}, Window: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := `max by (pod) (max by (pod, node) (container_cpu_usage_seconds_total{namespace="shop", pod=~"cart-0|cart\\.1", container!="", container!="POD"}) * 0 + on (node) group_left () max by (node) (rate(container_cpu_usage_seconds_total{id="/"}[90s])))`
	if got != want {
		t.Fatalf("Render()\n got %s\nwant %s", got, want)
	}
	if err := Validate(DefaultNodeCPUQuery); err != nil {
		t.Errorf("Validate(DefaultNodeCPUQuery) = %v", err)
	}
	// The answer is one number per pod: the outer aggregation keeps only pod.
	if !strings.HasPrefix(got, "max by (pod) (") {
		t.Errorf("the query is not reduced to one series per pod: %s", got)
	}
}
