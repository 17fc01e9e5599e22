package desired

import (
	"fmt"
	"strings"
)

// ReasonMultiCluster: the mesh spans clusters and the optimizer would drop
// the other clusters' endpoints.
const ReasonMultiCluster = "MultiClusterEndpointsNotMirrored"

// ReasonLocalOnlyRouting: the administrator accepted local-only routing in a
// multi-cluster mesh.
const ReasonLocalOnlyRouting = "LocalOnlyRouting"

// MultiCluster is what the operator knows of the mesh's other clusters.
type MultiCluster struct {
	// RemoteClusters names the clusters istiod reads through remote secrets
	// (empty: a single-cluster mesh).
	RemoteClusters []string
	// AllowLocalOnly: the administrator accepts that the optimized host
	// carries this cluster's pods only (--allow-local-only-routing).
	AllowLocalOnly bool
}

// multiClusterProblem refuses to route a Service of a multi-cluster mesh
// through a host that holds this cluster's pods only. In a multi-primary or
// primary-remote mesh istiod merges every cluster's endpoints of the
// Service into its Kubernetes host; the ServiceEntry is local config and
// holds the pods the operator sees, so opting in would drop the other
// clusters' endpoints and with them cross-cluster failover. Measured with a
// real istiod and a second API server registered through a remote secret
// (test/conformance/multicluster_test.go).
func multiClusterProblem(in Input) *Problem {
	mc := in.Mesh.MultiCluster
	if len(mc.RemoteClusters) == 0 {
		return nil
	}
	names := mc.RemoteClusters
	if len(names) > 5 {
		names = append(append([]string{}, names[:5]...), fmt.Sprintf("and %d more", len(mc.RemoteClusters)-5))
	}
	risk := fmt.Sprintf("the mesh spans other clusters (%s, read by istiod through remote secrets); istiod merges their endpoints of the Service into %s, "+
		"but the optimized host holds this cluster's pods only, so routing through it drops the other clusters' endpoints and cross-cluster failover",
		strings.Join(names, ", "), KubernetesHost(in.Optimizer.Spec.ServiceName, in.Optimizer.TargetNamespace(), in.ClusterDomain))
	if mc.AllowLocalOnly {
		return &Problem{Reason: ReasonLocalOnlyRouting, Message: risk + "; the administrator accepted local-only routing (--allow-local-only-routing)"}
	}
	return &Problem{Reason: ReasonMultiCluster, Fatal: true,
		Message: risk + ". Nothing is routed (an existing operator VirtualService is removed so the Service routes every cluster again). " +
			"Ask the administrator for --allow-local-only-routing to accept it"}
}
