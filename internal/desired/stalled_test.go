package desired

import (
	"slices"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// A Stalled optimizer's ServiceEntry keeps following the pods when the
// problem leaves them readable, and only then: the live object's other
// fields, the other problems and a change of ports write nothing.
func TestFollowPods(t *testing.T) {
	healthy := Compute(webInput())
	if healthy.ServiceEntry == nil || len(healthy.StalledEndpoints) != 0 {
		t.Fatalf("a healthy result: ServiceEntry %v, stalled endpoints %v", healthy.ServiceEntry != nil, healthy.StalledEndpoints)
	}
	live := healthy.ServiceEntry // as written before the stall: pods web-0 and web-1

	subsets := func(in *Input) {
		in.Mesh.DestinationRules = []*istionet.DestinationRule{userDR("web-dr", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), func(d *istionet.DestinationRule) {
			d.Spec.Subsets = []*networking.Subset{{Name: "v1"}}
		})}
	}
	rollout := func(in *Input) { // web-1 replaced by web-2
		in.Slices = []discoveryv1.EndpointSlice{slice("web-1", map[string]int32{"http": 8080}, readyEP("web-0", 1, ""), readyEP("web-2", 3, ""))}
	}
	for name, tc := range map[string]struct {
		change func(*Input)
		follow []string // addresses written; nil: nothing
	}{
		"user DestinationRule stall, pods unchanged": {change: subsets},
		"user DestinationRule stall, a rollout":      {change: func(in *Input) { subsets(in); rollout(in) }, follow: []string{ip(1), ip(3)}},
		"not exported, a rollout": {change: func(in *Input) {
			rollout(in)
			in.Service.Annotations = map[string]string{AnnotationExportTo: "~"}
		}, follow: []string{ip(1), ip(3)}},
		"multi-cluster, a rollout": {change: func(in *Input) { rollout(in); in.Mesh.MultiCluster.RemoteClusters = []string{"east"} }},
		"Service gone":             {change: func(in *Input) { rollout(in); in.Service = nil }},
		"ports changed, a rollout": {change: func(in *Input) {
			subsets(in)
			rollout(in)
			in.Service.Spec.Ports[0].Port = 81
		}},
		"no ready pod": {change: func(in *Input) { subsets(in); in.Slices = nil }},
	} {
		t.Run(name, func(t *testing.T) {
			in := webInput()
			tc.change(&in)
			r := Compute(in)
			if !hasFatal(r.Problems) || r.ServiceEntry != nil {
				t.Fatalf("problems %v, ServiceEntry %v: want a stall and no objects", reasons(r.Problems), r.ServiceEntry != nil)
			}
			eps, ok := FollowPods(live, r, true)
			if tc.follow == nil {
				if ok {
					t.Fatalf("writes %v, want nothing", eps)
				}
				return
			}
			if !ok {
				t.Fatalf("writes nothing, want %v", tc.follow)
			}
			var got []string
			for _, e := range eps {
				got = append(got, e.Address)
				if e.Weight == 0 {
					t.Errorf("endpoint %s has no weight", e.Address)
				}
			}
			if !slices.Equal(got, tc.follow) {
				t.Errorf("writes %v, want %v", got, tc.follow)
			}
			if _, ok := FollowPods(live, r, false); ok {
				t.Error("writes into a ServiceEntry the optimizer does not own")
			}
			after := live.DeepCopy()
			after.Spec.Endpoints = eps
			if _, ok := FollowPods(after, r, true); ok {
				t.Error("writes again once the live endpoints are the pods'")
			}
		})
	}
}
