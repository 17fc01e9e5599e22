package desired

import (
	networking "istio.io/api/networking/v1alpha3"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// LoadBalancer decides the DestinationRule's simple policy. LEAST_REQUEST is
// what the user asked for, from the start. ROUND_ROBIN (the default) sends
// traffic in proportion to the weights, which only pays once the weights
// rest on measured capacity (learned); until then the DestinationRule keeps
// Istio's default LEAST_REQUEST, which reacts to queues within a request, so
// opting in is never worse than the plain Service was. Envoy's LEAST_REQUEST
// honours endpoint weights too (weight/(active+1)), so the weights already
// written count under either policy.
func LoadBalancer(requested optv1.LoadBalancer, learned bool) networking.LoadBalancerSettings_SimpleLB {
	if requested != optv1.LoadBalancerLeastRequest && learned {
		return networking.LoadBalancerSettings_ROUND_ROBIN
	}
	return networking.LoadBalancerSettings_LEAST_REQUEST
}
