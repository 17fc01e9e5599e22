package desired

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
)

// userDestinationRules are the user's DestinationRules for the Kubernetes
// host in the Service's namespace, oldest first (creation time, then name):
// Istio merges them and applies the traffic policy of the oldest.
func userDestinationRules(in Input, kubeHost string) []*istionet.DestinationRule {
	var matches []*istionet.DestinationRule
	for _, dr := range in.Mesh.DestinationRules {
		if dr == nil || dr.Labels[LabelManagedBy] == ManagedByValue || !dr.DeletionTimestamp.IsZero() {
			continue
		}
		if resolveShortName(dr.Spec.Host, dr.Namespace, in.ClusterDomain) == kubeHost {
			matches = append(matches, dr)
		}
	}
	sort.Slice(matches, func(i, j int) bool {
		a, b := matches[i], matches[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	return matches
}

// resolveShortName turns a short host ("web") into its FQDN in namespace,
// as Istio does for DestinationRule hosts; names with a dot stay as they are.
func resolveShortName(host, namespace, clusterDomain string) string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "" || strings.Contains(host, ".") || host == "*" {
		return host
	}
	return KubernetesHost(host, namespace, clusterDomain)
}

// carryUserDestinationRule puts the user's traffic policy for the
// Kubernetes host (connection pool, outlier detection, TLS, port-level
// settings, ...) on the optimized host's DestinationRule, so it keeps
// applying once traffic goes there. The load balancer stays the operator's:
// the weights only work with it. A rule that cannot be carried faithfully
// (subsets, a workload selector, a narrower export scope) is a Fatal
// problem: the optimizer stalls instead of silently dropping the user's
// policy for some clients.
func carryUserDestinationRule(in Input, r *Result) []Problem {
	rules := userDestinationRules(in, r.KubernetesHost)
	if len(rules) == 0 || r.DestinationRule == nil {
		return nil
	}
	var problems []Problem
	for _, dr := range rules {
		var why []string
		if len(dr.Spec.Subsets) > 0 {
			why = append(why, fmt.Sprintf("it defines subsets (%d), which only a VirtualService of the user's routes to", len(dr.Spec.Subsets)))
		}
		if dr.Spec.WorkloadSelector != nil {
			why = append(why, "it has a workloadSelector, so it applies to some clients only")
		}
		if !coversScope(dr.Spec.ExportTo, r.ExportTo, dr.Namespace) {
			why = append(why, fmt.Sprintf("its exportTo %v is narrower than the Service's %v, so it applies to some clients only", dr.Spec.ExportTo, r.ExportTo))
		}
		if len(why) > 0 {
			problems = append(problems, Problem{Reason: "UserDestinationRuleNotCarried", Fatal: true,
				Message: fmt.Sprintf("DestinationRule %s/%s for %s cannot be carried to the optimized host %s: %s. Move those settings out of it, or leave this Service out of optimization",
					dr.Namespace, dr.Name, r.KubernetesHost, r.Host, strings.Join(why, "; "))})
		}
	}
	if len(problems) > 0 {
		return problems
	}
	user := rules[0]
	r.CarriedDestinationRule = user.Namespace + "/" + user.Name
	ours := r.DestinationRule.Spec.TrafficPolicy
	if user.Spec.TrafficPolicy == nil {
		return nil
	}
	merged := proto.Clone(user.Spec.TrafficPolicy).(*networking.TrafficPolicy)
	merged.LoadBalancer = nil
	if ours != nil {
		merged.LoadBalancer = ours.LoadBalancer
		if merged.OutlierDetection == nil {
			merged.OutlierDetection = ours.OutlierDetection
		}
	}
	optimized := map[uint32]bool{}
	for _, p := range r.Ports {
		optimized[uint32(p.Number)] = true
	}
	var levels []*networking.TrafficPolicy_PortTrafficPolicy
	for _, pl := range merged.PortLevelSettings {
		// The optimized host has the Service's port numbers. Istio
		// replaces the top-level policy wholesale on a port with settings,
		// so the operator's load balancer (and, with locality failover, an
		// outlier detection) is repeated there.
		if pl.GetPort() == nil || !optimized[pl.GetPort().GetNumber()] {
			continue
		}
		pl.LoadBalancer = nil
		if ours != nil {
			pl.LoadBalancer = ours.LoadBalancer
			if pl.OutlierDetection == nil {
				pl.OutlierDetection = ours.OutlierDetection
			}
		}
		levels = append(levels, pl)
	}
	merged.PortLevelSettings = levels
	r.DestinationRule.Spec.TrafficPolicy = merged
	return nil
}

// coversScope says whether an object exported to have is seen by every
// namespace that sees an object exported to want (both in Istio's
// spelling, "." or namespace the own namespace). An empty have is the mesh default,
// taken as "*" (Istio's default for DestinationRules).
func coversScope(have, want []string, namespace string) bool {
	if len(have) == 0 {
		return true
	}
	set := map[string]bool{}
	for _, h := range have {
		if h == namespace {
			h = "."
		}
		set[h] = true
	}
	if set["*"] {
		return true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}
