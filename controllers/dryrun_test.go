package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// In dry run the weights are not applied and the DestinationRule keeps
// Istio's LEAST_REQUEST: the policy, and through it the engine, must not
// take ROUND_ROBIN as live, however long it learns. Out of dry run the
// same optimizer goes to ROUND_ROBIN.
func TestDryRunKeepsLeastRequestLive(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	s, err := settingsFor(optimizerFor(key.Namespace, key.Name), DefaultEngineDefaults())
	if err != nil {
		t.Fatal(err)
	}
	s.DryRun = true
	book := NewWeightBook()
	var eps []desired.Endpoint
	for i := range 4 {
		eps = append(eps, desired.Endpoint{Pod: fmt.Sprintf("web-%d", i), Cores: 2, Weight: 1000})
	}
	book.Configure(key, clk.Now(), s)
	book.Applied(key, s.Params, clk.Now(), eps)
	src := &fleetSource{s: s, recent: map[string]float64{}}
	loop := &WeightLoop{Source: src, Book: book, Clock: clk, Metrics: metrics.New(), Wake: make(chan event.GenericEvent, 100)}
	run := func(cycles int) {
		for range cycles {
			clk.Step(s.Cycle)
			loop.cycle(context.Background(), logr.Discard(), key, target{key.Namespace, key.Name}, s)
			if out := book.Outcome(key); out == nil || out.Balancer != weights.BalancerLeastRequest && s.DryRun {
				t.Fatalf("in dry run a cycle's outcome says %v live, want LEAST_REQUEST", out)
			}
		}
	}
	run(20)
	if lb, _, _ := book.Balancer(key); lb != weights.BalancerLeastRequest {
		t.Fatalf("after 20 cycles in dry run the policy has %s, want LEAST_REQUEST", lb)
	}
	s.DryRun = false
	book.Configure(key, clk.Now(), s)
	// The weights learned in dry run never carried traffic: they go live
	// under LEAST_REQUEST, as at an opt-in.
	if lb, why, _ := book.Balancer(key); lb != weights.BalancerLeastRequest || why != policy.ReasonLearning {
		t.Fatalf("leaving dry run: %s (%s), want LEAST_REQUEST (Learning) until Learned for a query window", lb, why)
	}
	run(20)
	if lb, _, _ := book.Balancer(key); lb != weights.BalancerRoundRobin {
		t.Fatalf("out of dry run: %s, want ROUND_ROBIN", lb)
	}
}
