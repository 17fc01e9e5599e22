package controllers

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// Gateway API routes: read to find gateway bypasses and mesh-route
// conflicts; patched only when listed in gateway_routes; the mesh routes of
// routing_mode gateway_api (HTTPRoute, GRPCRoute, TCPRoute) are owned.
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=httproutes;grpcroutes;tcproutes,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=gateway.networking.k8s.io,resources=tlsroutes,verbs=get;list;watch;patch

const (
	// indexGatewayDestination indexes gateway-bound VirtualServices by the
	// FQDNs of their destinations, and Gateway API routes by the Services
	// (namespace/name) of their backendRefs and Service parents.
	indexGatewayDestination = "gateway.destination"
	// indexRetargetedBy indexes routes by the optimizers (namespace/name)
	// whose edits they carry, so an edit is found again to be undone.
	indexRetargetedBy = "gateway.retargetedBy"

	// gatewayRouteStatusLimit bounds status.gatewayRoutes (the CRD's
	// MaxItems), so a Service behind many gateways cannot grow the status
	// without bound; the condition gives the count.
	gatewayRouteStatusLimit = 20
)

// gatewayRoutes is what the gateway step found for one optimizer.
type gatewayRoutes struct {
	// found are the gateway routes with destinations of the Service.
	found []desired.GatewayRoute
	// objects by route, for patching.
	objects map[desired.RouteRef]client.Object
	// meshRoutes are the Gateway API routes with the Service as a parent.
	meshRoutes []desired.APIRoute
	// ownedMesh are the live routes of routing_mode gateway_api.
	ownedMesh map[desired.RouteRef]client.Object
	// retargeted are the routes carrying this optimizer's edits.
	retargeted map[desired.RouteRef]client.Object
}

func optimizerKey(opt *optv1.IstioAdaptiveRequestOptimizer) string {
	return opt.Namespace + "/" + opt.Name
}

// readGateways finds the routes of the Service: gateway-bound
// VirtualServices and Gateway API routes with destinations of it, Gateway
// API routes with it as parent, the owned mesh routes and the routes this
// optimizer retargeted.
func (r *MirrorReconciler) readGateways(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, t desired.GatewayTarget) (gatewayRoutes, error) {
	out := gatewayRoutes{objects: map[desired.RouteRef]client.Object{}, ownedMesh: map[desired.RouteRef]client.Object{}, retargeted: map[desired.RouteRef]client.Object{}}
	fqdn := desired.KubernetesHost(t.Service, t.Namespace, t.ClusterDomain)
	for _, kind := range r.GatewayAPI.kinds() {
		key := t.Namespace + "/" + t.Service
		if kind == optv1.GatewayRouteVirtualService {
			key = fqdn
		}
		list := newRouteList(kind)
		if err := r.Client.List(ctx, list, client.MatchingFields{indexGatewayDestination: key}); err != nil {
			return out, fmt.Errorf("list %ss of %s: %w", kind, key, err)
		}
		byRetarget := newRouteList(kind)
		if err := r.Client.List(ctx, byRetarget, client.MatchingFields{indexRetargetedBy: optimizerKey(opt)}); err != nil {
			return out, fmt.Errorf("list %ss retargeted by %s: %w", kind, optimizerKey(opt), err)
		}
		for _, o := range listItems(byRetarget) {
			out.retargeted[desired.RouteRef{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName()}] = o
		}
		objs := listItems(list)
		// A retargeted route no longer names the Service; it is read so
		// status still shows it as done.
		for _, o := range listItems(byRetarget) {
			objs = append(objs, o)
		}
		seen := map[desired.RouteRef]bool{}
		for _, o := range objs {
			ref := desired.RouteRef{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName()}
			if seen[ref] {
				continue
			}
			seen[ref] = true
			var g *desired.GatewayRoute
			if vs, ok := o.(*istionet.VirtualService); ok {
				g = desired.GatewayVirtualService(t, vs)
			} else if a, ok := asAPIRoute(o); ok {
				if desired.IsOwnedBy(o, opt) && o.GetNamespace() == t.Namespace {
					out.ownedMesh[ref] = o
					continue
				}
				if a.HasServiceParent(t.Service, t.Namespace) {
					out.meshRoutes = append(out.meshRoutes, a)
				}
				g = desired.GatewayAPIRoute(t, a)
			}
			if g != nil {
				out.found = append(out.found, *g)
				out.objects[ref] = o
			}
		}
	}
	// Owned mesh routes are found by label too: after a port change one may
	// name the Service on no port the optimizer still optimizes.
	for _, kind := range []optv1.GatewayRouteKind{optv1.GatewayRouteHTTPRoute, optv1.GatewayRouteGRPCRoute, optv1.GatewayRouteTCPRoute} {
		if !r.GatewayAPI[kind] {
			continue
		}
		list := newRouteList(kind)
		if err := r.Client.List(ctx, list, client.MatchingLabels(desired.OwnedLabels(opt))); err != nil {
			return out, fmt.Errorf("list owned %ss: %w", kind, err)
		}
		for _, o := range listItems(list) {
			if desired.IsOwnedBy(o, opt) {
				out.ownedMesh[desired.RouteRef{Kind: kind, Namespace: o.GetNamespace(), Name: o.GetName()}] = o
			}
		}
	}
	return out, nil
}

// listedRoutes are the routes of gateway_routes, namespaces defaulted.
func listedRoutes(opt *optv1.IstioAdaptiveRequestOptimizer) map[desired.RouteRef]bool {
	out := map[desired.RouteRef]bool{}
	for _, g := range opt.Spec.GatewayRoutes {
		ns := g.Namespace
		if ns == "" {
			ns = opt.TargetNamespace()
		}
		out[desired.RouteRef{Kind: g.Kind, Namespace: ns, Name: g.Name}] = true
	}
	return out
}

// reconcileGateways is the mirror's gateway step, after the owned objects
// are applied (so a retargeted route never leads to a host without
// endpoints): it retargets the listed gateway routes, restores those no
// longer listed, and reports the routes that still bypass the weights.
func (r *MirrorReconciler) reconcileGateways(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, res desired.Result, gw gatewayRoutes, st *status) error {
	listed := listedRoutes(opt)
	me := optimizerKey(opt)
	// Restore what is retargeted but no longer listed.
	for ref, o := range gw.retargeted {
		if listed[ref] {
			continue
		}
		if err := r.restoreRoute(ctx, o, me); err != nil {
			return err
		}
		r.Recorder.Eventf(opt, o, corev1.EventTypeNormal, "GatewayRouteRestored", "Patch", "Restored the destinations of %s, no longer in gateway_routes", ref)
	}
	found := map[desired.RouteRef]bool{}
	var notes []string
	for i, g := range gw.found {
		found[g.Ref] = true
		if g.Stale() {
			// The edit leads to a host or port the optimizer no longer
			// serves: put the original back first; the route's update
			// brings the next reconcile, which retargets it afresh.
			if o, ok := gw.retargeted[g.Ref]; ok && listed[g.Ref] {
				if err := r.restoreRoute(ctx, o, me); err != nil {
					return err
				}
			}
			continue
		}
		if !listed[g.Ref] || !g.Bypasses() {
			continue
		}
		if g.Ref.Namespace != opt.Namespace && !r.CrossNamespace.Allows(opt.Namespace) {
			notes = append(notes, fmt.Sprintf("%s is in another namespace than the optimizer and %s", g.Ref,
				r.CrossNamespace.describe("allow-cross-namespace", "cross-namespace-namespaces")))
			continue
		}
		o := gw.objects[g.Ref]
		ops, err := desired.RetargetPatch(o, o, g, me)
		if err != nil {
			return fmt.Errorf("retarget %s: %w", g.Ref, err)
		}
		if ops == nil {
			continue
		}
		if err := r.jsonPatch(ctx, o, ops); err != nil {
			if apierrors.IsInvalid(err) || apierrors.IsNotFound(err) {
				// A tested field changed, or the route went, since it was
				// read: that change is an event, whose reconcile reads it.
				notes = append(notes, fmt.Sprintf("%s changed while it was being retargeted; it is read again", g.Ref))
				continue
			}
			return fmt.Errorf("retarget %s: %w", g.Ref, err)
		}
		for j := range g.Destinations {
			if len(g.Destinations[j].Edits) > 0 {
				gw.found[i].Destinations[j].Retargeted = true
			}
		}
		r.Recorder.Eventf(opt, o, corev1.EventTypeNormal, "GatewayRouteRetargeted", "Patch", "Retargeted %s", g.Change())
		log.FromContext(ctx).Info("Retargeted a gateway route to the optimized host", "route", g.Ref.String())
	}
	for ref := range listed {
		if !found[ref] {
			notes = append(notes, fmt.Sprintf("%s has no destination of Service %s/%s through a gateway (or does not exist)", ref, res.Namespace, opt.Spec.ServiceName))
		}
	}
	sort.Strings(notes)
	if len(notes) > 0 {
		st.degraded("GatewayRouteNotRetargeted", fmt.Sprintf("gateway_routes: %s", joinSemi(notes)))
	}
	opt.Status.GatewayRoutes, _ = desired.GatewayRouteStatus(gw.found, gatewayRouteStatusLimit)
	if p := desired.BypassProblem(gw.found); p != nil {
		st.degraded(p.Reason, p.Message)
	}
	return nil
}

func joinSemi(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += "; "
		}
		out += v
	}
	return out
}

// jsonPatch sends a JSON patch; a failed test (the route changed since it
// was read) comes back as an error and the next reconcile reads it again.
func (r *MirrorReconciler) jsonPatch(ctx context.Context, o client.Object, ops []desired.PatchOp) error {
	data, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	return r.Client.Patch(ctx, o, client.RawPatch(types.JSONPatchType, data), client.FieldOwner(FieldManager))
}

func (r *MirrorReconciler) restoreRoute(ctx context.Context, o client.Object, optimizer string) error {
	ops, err := desired.RestorePatch(o, o, optimizer)
	if err != nil || ops == nil {
		return err
	}
	if err := r.jsonPatch(ctx, o, ops); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("restore %s %s/%s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetNamespace(), o.GetName(), err)
	}
	return nil
}

// applyMeshRoutes writes the routes of routing_mode gateway_api (none in
// another mode) and deletes owned routes that are no longer desired. It
// returns the names written, for status.
func (r *MirrorReconciler) applyMeshRoutes(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, want []desired.MeshRoute, gw gatewayRoutes) ([]string, error) {
	keep := map[desired.RouteRef]bool{}
	var names []string
	for _, mr := range want {
		ref := desired.RouteRef{Kind: mr.Kind, Namespace: mr.Object.GetNamespace(), Name: mr.Object.GetName()}
		keep[ref] = true
		names = append(names, string(mr.Kind)+"/"+ref.Name)
		if live, ok := gw.ownedMesh[ref]; ok {
			if a, ok := asAPIRoute(live); ok && desired.MeshRouteUpToDate(mr.Route, a) {
				continue
			}
		}
		obj := mr.Object.(client.Object)
		if opt.TargetNamespace() == opt.Namespace {
			if err := controllerutil.SetControllerReference(opt, obj, r.Scheme); err != nil {
				return nil, err
			}
		}
		if err := r.serverSideApply(ctx, obj); err != nil {
			return nil, fmt.Errorf("apply %s: %w", ref, err)
		}
		r.Metrics.Writes.WithLabelValues(opt.TargetNamespace(), opt.Spec.ServiceName, string(mr.Kind)).Inc()
		r.Recorder.Eventf(opt, obj, corev1.EventTypeNormal, "Applied", "Apply", "Applied %s", ref)
	}
	for ref, o := range gw.ownedMesh {
		if keep[ref] {
			continue
		}
		if err := r.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("delete %s: %w", ref, err)
		}
	}
	sort.Strings(names)
	return names, nil
}

// finalizeGateways puts back every gateway route this optimizer retargeted
// and deletes its mesh routes, before the ServiceEntry goes.
func (r *MirrorReconciler) finalizeGateways(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer) error {
	if r.GatewayAPI == nil {
		return nil
	}
	for _, kind := range r.GatewayAPI.kinds() {
		list := newRouteList(kind)
		if err := r.Client.List(ctx, list, client.MatchingFields{indexRetargetedBy: optimizerKey(opt)}); err != nil {
			return fmt.Errorf("list %ss retargeted by %s: %w", kind, optimizerKey(opt), err)
		}
		for _, o := range listItems(list) {
			if err := r.restoreRoute(ctx, o, optimizerKey(opt)); err != nil {
				return err
			}
		}
		if kind == optv1.GatewayRouteVirtualService || kind == optv1.GatewayRouteTLSRoute {
			continue
		}
		owned := newRouteList(kind)
		if err := r.Client.List(ctx, owned, client.MatchingLabels(desired.OwnedLabels(opt))); err != nil {
			return fmt.Errorf("list owned %ss: %w", kind, err)
		}
		for _, o := range listItems(owned) {
			if desired.IsOwnedBy(o, opt) {
				if err := r.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
					return fmt.Errorf("delete %s %s/%s: %w", kind, o.GetNamespace(), o.GetName(), err)
				}
			}
		}
	}
	return nil
}

// gatewayPlan is the gateway step's reading and decision, between the
// conflict checks and the apply.
type gatewayPlan struct {
	target desired.GatewayTarget
	routes gatewayRoutes
	// mesh are the routes of routing_mode gateway_api to write.
	mesh []desired.MeshRoute
	// keepMesh: a conflict holds the mesh routes where they are (the live
	// ones stay, none are added).
	keepMesh bool
}

// planGateways reads the routes of the Service and decides, before
// anything is applied, what a Gateway API route with the Service as parent
// means for the operator's own route: like a user's VirtualService, it
// competes for the host, so the operator adds no route of its own next to
// it (one it already has stays: removing it would change live routing).
func (r *MirrorReconciler) planGateways(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, res *desired.Result, live liveObjects, st *status) (*gatewayPlan, error) {
	p := &gatewayPlan{target: desired.GatewayTarget{Service: opt.Spec.ServiceName, Namespace: res.Namespace, ClusterDomain: r.ClusterDomain, Host: res.Host}}
	if r.GatewayAPI == nil {
		return p, nil // not set up with a manager: no route indexes to read
	}
	for _, port := range res.Ports {
		p.target.Ports = append(p.target.Ports, port.Number)
	}
	var err error
	if p.routes, err = r.readGateways(ctx, opt, p.target); err != nil {
		return nil, err
	}
	mode := opt.Routing()
	if mode == optv1.RoutingGatewayAPI {
		if !r.GatewayAPI[optv1.GatewayRouteHTTPRoute] {
			st.degraded("GatewayAPINotInstalled", "routing_mode gateway_api needs the Gateway API CRDs (gateway.networking.k8s.io/v1 HTTPRoute), which the cluster did not serve when the manager started; no route is written. Install them and restart the manager, or use routing_mode virtual_service")
		} else {
			var problems []desired.Problem
			p.mesh, problems = desired.MeshRoutes(*res, opt)
			for _, pr := range problems {
				st.degraded(pr.Reason, pr.Message)
			}
		}
		if len(live.otherVirtualServices) > 0 {
			st.degraded("VirtualServiceConflict", fmt.Sprintf("VirtualService %s already routes %s; with it Istio uses only one of it and the operator's routes. "+
				"Point that route's destination host at %s to use the optimized weights, or set routing_mode: none", live.otherVirtualServices[0], res.KubernetesHost, res.Host))
			p.keepMesh = true
		}
	}
	if mode == optv1.RoutingNone {
		return p, nil
	}
	owned := func(a desired.APIRoute) bool {
		_, ok := p.routes.ownedMesh[desired.RouteRef{Kind: a.Kind, Namespace: a.Namespace, Name: a.Name}]
		return ok
	}
	if c := desired.MeshRouteConflict(p.target, p.routes.meshRoutes, owned); c != nil {
		st.degraded(c.Reason, c.Message)
		r.Recorder.Eventf(opt, nil, corev1.EventTypeWarning, c.Reason, "Reconcile", "%s", c.Message)
		if mode == optv1.RoutingVirtualService && live.vs == nil {
			res.VirtualService = nil
			st.owned.VirtualService = ""
		}
		p.keepMesh = true
	}
	return p, nil
}

// applyGateways runs after the owned ServiceEntry, DestinationRule and
// VirtualService are applied: the mesh routes of routing_mode gateway_api,
// the operator's VirtualService removed once they are in place, then the
// gateway routes.
func (r *MirrorReconciler) applyGateways(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, res desired.Result, live liveObjects, p *gatewayPlan, st *status) error {
	want := p.mesh
	if p.keepMesh {
		// Keep exactly the owned routes that exist; write no new ones.
		want = nil
		for _, mr := range p.mesh {
			if _, ok := p.routes.ownedMesh[desired.RouteRef{Kind: mr.Kind, Namespace: mr.Object.GetNamespace(), Name: mr.Object.GetName()}]; ok {
				want = append(want, mr)
			}
		}
	}
	if r.GatewayAPI == nil {
		return nil
	}
	names, err := r.applyMeshRoutes(ctx, opt, want, p.routes)
	if err != nil {
		return err
	}
	opt.Status.OwnedRoutes = names
	if opt.Routing() == optv1.RoutingGatewayAPI && len(names) > 0 && live.vs != nil && desired.IsOwnedBy(live.vs, opt) {
		// The mesh routes now carry the Service's traffic: the operator's
		// VirtualService of routing_mode virtual_service goes.
		if err := r.Client.Delete(ctx, live.vs); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete VirtualService %s/%s: %w", live.vs.Namespace, live.vs.Name, err)
		}
	}
	return r.reconcileGateways(ctx, opt, res, p.routes, st)
}
