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
// multi-cluster mesh): every route of ours to the optimized host would send
// traffic to a partial endpoint set, so they are taken away and the
// Kubernetes Service, which routes every pod, carries the traffic again:
// our VirtualService is removed, and so are the mesh routes of
// routing_mode gateway_api, and the gateway routes retargeted to the
// optimized host are put back (as when the optimizer is deleted). The
// ServiceEntry and DestinationRule stay (nothing routes to them) so that
// nothing learned is lost when the Service shrinks back; then the routes
// are written and retargeted again. Reports whether it deleted our
// VirtualService.
func (r *MirrorReconciler) leaveTrafficOnService(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, p desired.Problem, live liveObjects) (bool, error) {
	if p.Reason != desired.ReasonTooManyEndpoints && p.Reason != desired.ReasonMultiCluster {
		return false, nil
	}
	if err := r.finalizeGateways(ctx, opt); err != nil {
		return false, err
	}
	if live.vs == nil || !desired.IsOwnedBy(live.vs, opt) {
		return false, nil
	}
	if err := r.Client.Delete(ctx, live.vs); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("delete VirtualService %s/%s: %w", live.vs.Namespace, live.vs.Name, err)
	}
	return true, nil
}
