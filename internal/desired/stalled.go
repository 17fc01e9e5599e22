package desired

import (
	"slices"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
)

// HandsTrafficBack reports whether a problem takes the operator's routes to
// the optimized host away, so the Kubernetes Service carries the traffic
// again: the ServiceEntry cannot hold every pod (TooManyEndpoints, or other
// clusters' pods), and a route to a part of them would leave the others
// without mesh traffic.
func HandsTrafficBack(p Problem) bool {
	return p.Reason == ReasonTooManyEndpoints || p.Reason == ReasonMultiCluster
}

// FollowPods returns the endpoints a Stalled optimizer writes into its live
// ServiceEntry, and whether there are any to write. A stall writes nothing
// else and deletes nothing, so the route to the optimized host stays where
// it is; without this, the ServiceEntry behind it would stop following the
// pods, and a rollout during the stall would send requests to pods that
// are gone. Only the endpoints move (the ready pods now, with their
// weights), and only when the problem left them readable
// (r.StalledEndpoints), the live ServiceEntry is the optimizer's with the
// ports r would give it, and they differ from the live ones. Ports that
// changed, or no ready pod, write nothing: the live object stays as it is.
func FollowPods(live *istionet.ServiceEntry, r Result, owned bool) ([]*networking.WorkloadEntry, bool) {
	if live == nil || !owned || len(r.StalledEndpoints) == 0 || !samePorts(live.Spec.Ports, r.Ports) {
		return nil, false
	}
	if slices.EqualFunc(live.Spec.Endpoints, r.StalledEndpoints, workloadEntryEqual) {
		return nil, false
	}
	return r.StalledEndpoints, true
}

// samePorts reports whether a ServiceEntry's ports are those of ports, as
// serviceEntry writes them.
func samePorts(live []*networking.ServicePort, ports []Port) bool {
	if len(live) != len(ports) {
		return false
	}
	for i, p := range ports {
		l := live[i]
		if l.GetNumber() != uint32(p.Number) || l.GetName() != p.Name || l.GetProtocol() != p.Protocol || l.GetTargetPort() != p.TargetPort {
			return false
		}
	}
	return true
}
