package desired

import (
	"strings"
	"testing"
)

// TestComputeInAMultiClusterMesh: a mesh with remote clusters gets nothing
// written and a Fatal MultiClusterEndpointsNotMirrored naming the clusters
// and the risk, unless the administrator accepts local-only routing: then
// the objects are written and a non-fatal LocalOnlyRouting says so.
func TestComputeInAMultiClusterMesh(t *testing.T) {
	tests := map[string]struct {
		mc         MultiCluster
		wantReason string // "" for no multi-cluster problem
		wantFatal  bool
		wantWords  []string
	}{
		"single cluster": {},
		"remote cluster, refused": {
			mc:         MultiCluster{RemoteClusters: []string{"cluster-2"}},
			wantReason: ReasonMultiCluster, wantFatal: true,
			wantWords: []string{"cluster-2", "web." + testNS + ".svc.cluster.local", "cross-cluster failover", "--allow-local-only-routing"},
		},
		"remote cluster, accepted": {
			mc:         MultiCluster{RemoteClusters: []string{"cluster-2"}, AllowLocalOnly: true},
			wantReason: ReasonLocalOnlyRouting,
			wantWords:  []string{"cluster-2", "drops the other clusters' endpoints", "accepted local-only routing"},
		},
		"many clusters named briefly": {
			mc:         MultiCluster{RemoteClusters: []string{"c1", "c2", "c3", "c4", "c5", "c6", "c7"}},
			wantReason: ReasonMultiCluster, wantFatal: true,
			wantWords: []string{"c1, c2, c3, c4, c5, and 2 more"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := webInput()
			in.Mesh.MultiCluster = tc.mc
			r := Compute(in)
			var got *Problem
			for i, p := range r.Problems {
				if p.Reason == ReasonMultiCluster || p.Reason == ReasonLocalOnlyRouting {
					got = &r.Problems[i]
				}
			}
			if tc.wantReason == "" {
				if got != nil {
					t.Fatalf("problem %+v in a single-cluster mesh", got)
				}
				return
			}
			if got == nil || got.Reason != tc.wantReason || got.Fatal != tc.wantFatal {
				t.Fatalf("problems %+v, want %s fatal=%v", r.Problems, tc.wantReason, tc.wantFatal)
			}
			for _, w := range tc.wantWords {
				if !strings.Contains(got.Message, w) {
					t.Errorf("message lacks %q: %s", w, got.Message)
				}
			}
			if written := r.ServiceEntry != nil && r.VirtualService != nil && r.DestinationRule != nil; written == tc.wantFatal {
				t.Errorf("objects written %v with a fatal=%v problem", written, tc.wantFatal)
			}
		})
	}
}
