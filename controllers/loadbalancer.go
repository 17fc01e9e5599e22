package controllers

import (
	"fmt"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"

	"k8s.io/apimachinery/pkg/types"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// weightsLearned says whether the optimizer's policy lets a ROUND_ROBIN
// optimizer leave Istio's default LEAST_REQUEST (desired.LoadBalancer):
// policy.Policy decides, from the engine's Learned and its alarms. Without
// the engine (no metrics backend, or dry run) never. Before the policy is
// seeded (the first reconcile after a restart) the live DestinationRule's
// policy is kept, so a restart does not flip the mesh's load balancer back
// and forth.
func weightsLearned(book *WeightBook, key types.NamespacedName, useEngine bool, live *istionet.DestinationRule) bool {
	if !useEngine {
		return false
	}
	if lb, _, ok := book.Balancer(key); ok {
		return lb == weights.BalancerRoundRobin
	}
	return liveBalancer(live) == weights.BalancerRoundRobin
}

// liveBalancer is the load balancer of the live DestinationRule, "" when
// there is none or it sets none the policy knows.
func liveBalancer(live *istionet.DestinationRule) weights.Balancer {
	if live == nil {
		return ""
	}
	switch live.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple() {
	case networking.LoadBalancerSettings_ROUND_ROBIN:
		return weights.BalancerRoundRobin
	case networking.LoadBalancerSettings_LEAST_REQUEST:
		return weights.BalancerLeastRequest
	}
	return ""
}

// liveBalancerReason is the reason the status gives for the live
// DestinationRule's load balancer, "" when the status speaks of another
// (a status written before the DestinationRule was changed by hand, or
// never written).
func liveBalancerReason(opt *optv1.IstioAdaptiveRequestOptimizer, live *istionet.DestinationRule) policy.Reason {
	lb := liveBalancer(live)
	if lb == "" || opt.Status.LoadBalancer != string(lb) {
		return ""
	}
	return policy.Reason(opt.Status.LoadBalancerReason)
}

// balancer records the policy written into the DestinationRule, the
// optimizer's policy's reason for it (why: "" while the policy has not
// chosen yet, when the reason recorded last stays) and, when it is not the
// one asked for, a note saying why.
func (s *status) balancer(requested optv1.LoadBalancer, written networking.LoadBalancerSettings_SimpleLB, useEngine bool, why policy.Reason) {
	s.loadBalancer = written.String()
	s.balancerWhy, s.balancerWhyKnown = why, why != ""
	if !useEngine {
		s.balancerWhy, s.balancerWhyKnown = "", true
	}
	switch {
	case string(requested) == s.loadBalancer:
	case useEngine && why == policy.ReasonAlarm:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default) for a spell after a pod fell behind, until the query window shows it, then %s", s.loadBalancer, requested)
	case useEngine && why == policy.ReasonCPUAtLimit:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default, with the weights): on CPU alone a pod reached its limit, which cannot be told from a pod falling behind; kept until request rates measure the pods, then %s", s.loadBalancer, requested)
	case useEngine && why == policy.ReasonAtCapacity:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default, with the weights) while the load is past the utilisation cap: every pod runs above it on any weights, and least request steers around their chance queues; kept until the load has been below the cap for a query window, then %s", s.loadBalancer, requested)
	case useEngine && why == policy.ReasonFallback:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default) while the weights have fallen back to equal, then %s", s.loadBalancer, requested)
	case useEngine:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default) until the weights rest on measured capacity and no pod is falling behind, then %s", s.loadBalancer, requested)
	default:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default) instead of %s, since the weights are not optimized", s.loadBalancer, requested)
	}
}
