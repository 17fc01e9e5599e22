package controllers

import (
	"fmt"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// weightsLearned says whether the weights the mirror writes rest on measured
// capacity, which lets a ROUND_ROBIN optimizer leave Istio's default
// LEAST_REQUEST (desired.LoadBalancer). Without the engine (no metrics
// backend, or dry run) they never do. Before this manager's first cycle
// (just after a restart) the live DestinationRule's policy is kept, so a
// restart does not flip the mesh's load balancer back and forth.
func weightsLearned(out *Outcome, useEngine bool, live *istionet.DestinationRule) bool {
	if !useEngine {
		return false
	}
	if out == nil {
		return live != nil && live.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple() == networking.LoadBalancerSettings_ROUND_ROBIN
	}
	return out.Result.Learned
}

// balancer records the policy written into the DestinationRule and, when it
// is not the one asked for, why.
func (s *status) balancer(requested optv1.LoadBalancer, written networking.LoadBalancerSettings_SimpleLB, useEngine bool) {
	s.loadBalancer = written.String()
	switch {
	case string(requested) == s.loadBalancer:
	case useEngine:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default) until the weights rest on measured capacity and no pod is falling behind, then %s", s.loadBalancer, requested)
	default:
		s.balancerNote = fmt.Sprintf("load balancer %s (Istio's default) instead of %s, since the weights are not optimized", s.loadBalancer, requested)
	}
}
