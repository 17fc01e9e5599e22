package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// followPods keeps a Stalled optimizer's live ServiceEntry on the ready
// pods (desired.FollowPods): the stall leaves the route to the optimized
// host in place, and without this the ServiceEntry behind it would keep
// the addresses of pods that are gone. Only its endpoints are patched.
func (r *MirrorReconciler) followPods(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, s Settings, res desired.Result, live liveObjects) error {
	eps, ok := desired.FollowPods(live.se, res, live.se != nil && desired.IsOwnedBy(live.se, opt))
	if !ok {
		return nil
	}
	// The live object is the patch's base, which MergeFrom only reads; the
	// object sent is a copy with the endpoints.
	se := live.se.DeepCopy()
	patch := client.MergeFrom(live.se)
	se.Spec.Endpoints = eps
	if err := r.Client.Patch(ctx, se, patch, client.FieldOwner(FieldManager)); err != nil {
		return fmt.Errorf("follow the pods in ServiceEntry %s/%s: %w", se.Namespace, se.Name, err)
	}
	r.Metrics.Writes.WithLabelValues(res.Namespace, opt.Spec.ServiceName, "ServiceEntry").Inc()
	r.Recorder.Eventf(opt, se, corev1.EventTypeNormal, "FollowedPods", "Patch",
		"Stalled, but ServiceEntry %s/%s follows the ready pods (%d endpoints), so the route left in place leads to live pods", se.Namespace, se.Name, len(eps))
	r.Weights.Applied(client.ObjectKeyFromObject(opt), s.Params, r.Clock.Now(), res.Endpoints)
	return nil
}

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
	if !desired.HandsTrafficBack(p) {
		return false, nil
	}
	if err := r.finalizeGateways(ctx, opt); err != nil {
		return false, err
	}
	// The status says so: no owned mesh route is left, no gateway route
	// is retargeted (the reconcile stops before the gateway step).
	opt.Status.OwnedRoutes = nil
	for i := range opt.Status.GatewayRoutes {
		opt.Status.GatewayRoutes[i].Retargeted = false
	}
	if live.vs == nil || !desired.IsOwnedBy(live.vs, opt) {
		return false, nil
	}
	if err := r.Client.Delete(ctx, live.vs); err != nil && !apierrors.IsNotFound(err) {
		return false, fmt.Errorf("delete VirtualService %s/%s: %w", live.vs.Namespace, live.vs.Name, err)
	}
	return true, nil
}
