package controllers

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// leaveTrafficOnService handles a Service with more ready pods than one
// ServiceEntry holds, or whose other clusters' pods it cannot hold (a
// multi-cluster mesh): our VirtualService would send the mesh to a partial
// endpoint set, so it is removed and the Kubernetes Service, which routes
// every pod, carries the traffic again. The ServiceEntry and
// DestinationRule stay (nothing routes to them) so that nothing learned is
// lost when the Service shrinks back. Reports whether it deleted anything.
func (r *MirrorReconciler) leaveTrafficOnService(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, p desired.Problem, live liveObjects) (bool, error) {
	if (p.Reason != desired.ReasonTooManyEndpoints && p.Reason != desired.ReasonMultiCluster) || live.vs == nil || !desired.IsOwnedBy(live.vs, opt) {
		return false, nil
	}
	if err := r.Client.Delete(ctx, live.vs); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("delete VirtualService %s/%s: %w", live.vs.Namespace, live.vs.Name, err)
	}
	return true, nil
}
