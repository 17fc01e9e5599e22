package controllers

// Which Gateway API route kinds the cluster serves, and the indexes and
// watches of the routes the gateway step reads.

import (
	"context"
	"fmt"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// gatewayAPIGroup is the Gateway API group the operator reads at v1.
var gatewayAPIGroup = gwv1.GroupVersion

// GatewayAPI says which Gateway API route kinds the cluster serves at v1.
// The operator starts and works without them; it reads and watches only
// the kinds found at start-up (a CRD installed later needs a restart).
type GatewayAPI map[optv1.GatewayRouteKind]bool

// DetectGatewayAPI asks the API server's discovery (through the manager's
// REST mapper) which route kinds are served.
func DetectGatewayAPI(mapper meta.RESTMapper) (GatewayAPI, error) {
	out := GatewayAPI{}
	for _, kind := range []optv1.GatewayRouteKind{optv1.GatewayRouteHTTPRoute, optv1.GatewayRouteGRPCRoute, optv1.GatewayRouteTCPRoute, optv1.GatewayRouteTLSRoute} {
		_, err := mapper.RESTMapping(schema.GroupKind{Group: gatewayAPIGroup.Group, Kind: string(kind)}, gatewayAPIGroup.Version)
		switch {
		case err == nil:
			out[kind] = true
		case meta.IsNoMatchError(err):
		default:
			return nil, fmt.Errorf("discover Gateway API %s: %w", kind, err)
		}
	}
	return out, nil
}

func newRouteObject(kind optv1.GatewayRouteKind) client.Object {
	switch kind {
	case optv1.GatewayRouteVirtualService:
		return &istionet.VirtualService{}
	case optv1.GatewayRouteHTTPRoute:
		return &gwv1.HTTPRoute{}
	case optv1.GatewayRouteGRPCRoute:
		return &gwv1.GRPCRoute{}
	case optv1.GatewayRouteTCPRoute:
		return &gwv1.TCPRoute{}
	case optv1.GatewayRouteTLSRoute:
		return &gwv1.TLSRoute{}
	}
	return nil
}

func newRouteList(kind optv1.GatewayRouteKind) client.ObjectList {
	switch kind {
	case optv1.GatewayRouteVirtualService:
		return &istionet.VirtualServiceList{}
	case optv1.GatewayRouteHTTPRoute:
		return &gwv1.HTTPRouteList{}
	case optv1.GatewayRouteGRPCRoute:
		return &gwv1.GRPCRouteList{}
	case optv1.GatewayRouteTCPRoute:
		return &gwv1.TCPRouteList{}
	case optv1.GatewayRouteTLSRoute:
		return &gwv1.TLSRouteList{}
	}
	return nil
}

// asAPIRoute reduces a Gateway API route; ok is false for other objects.
func asAPIRoute(o client.Object) (desired.APIRoute, bool) {
	switch r := o.(type) {
	case *gwv1.HTTPRoute:
		return desired.FromHTTPRoute(r), true
	case *gwv1.GRPCRoute:
		return desired.FromGRPCRoute(r), true
	case *gwv1.TCPRoute:
		return desired.FromTCPRoute(r), true
	case *gwv1.TLSRoute:
		return desired.FromTLSRoute(r), true
	}
	return desired.APIRoute{}, false
}

// listItems returns the items of a route list as objects.
func listItems(l client.ObjectList) []client.Object {
	var out []client.Object
	_ = meta.EachListItem(l, func(o runtime.Object) error {
		if co, ok := o.(client.Object); ok {
			out = append(out, co)
		}
		return nil
	})
	return out
}

// kinds are the route kinds the operator reads: VirtualServices always,
// Gateway API kinds when served.
func (g GatewayAPI) kinds() []optv1.GatewayRouteKind {
	out := []optv1.GatewayRouteKind{optv1.GatewayRouteVirtualService}
	for _, k := range []optv1.GatewayRouteKind{optv1.GatewayRouteHTTPRoute, optv1.GatewayRouteGRPCRoute, optv1.GatewayRouteTCPRoute, optv1.GatewayRouteTLSRoute} {
		if g[k] {
			out = append(out, k)
		}
	}
	return out
}

// setupGateways indexes the routes and watches them, each kind only when
// the cluster serves it.
func (r *MirrorReconciler) setupGateways(ctx context.Context, mgr ctrl.Manager, b *builder.Builder, byService func(ctx context.Context, namespace, service string) []reconcile.Request) (*builder.Builder, error) {
	if r.GatewayAPI == nil {
		r.GatewayAPI = GatewayAPI{}
	}
	domain := r.ClusterDomain
	idx := mgr.GetFieldIndexer()
	for _, kind := range r.GatewayAPI.kinds() {
		obj := newRouteObject(kind)
		if err := idx.IndexField(ctx, obj, indexGatewayDestination, func(o client.Object) []string {
			if vs, ok := o.(*istionet.VirtualService); ok {
				return desired.VirtualServiceDestinationHosts(vs, domain)
			}
			a, _ := asAPIRoute(o)
			return routeServices(a)
		}); err != nil {
			return nil, err
		}
		if err := idx.IndexField(ctx, obj, indexRetargetedBy, func(o client.Object) []string {
			set := map[string]bool{}
			for _, rec := range desired.RetargetRecords(o.GetAnnotations()) {
				set[rec.Optimizer] = true
			}
			out := make([]string, 0, len(set))
			for k := range set {
				out = append(out, k)
			}
			return out
		}); err != nil {
			return nil, err
		}
		b = b.Watches(obj, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			out := ownerRequest(o)
			for _, rec := range desired.RetargetRecords(o.GetAnnotations()) {
				if ns, name, ok := cutKey(rec.Optimizer); ok {
					out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: ns, Name: name}})
				}
			}
			var keys []string
			if vs, ok := o.(*istionet.VirtualService); ok {
				for _, h := range desired.VirtualServiceDestinationHosts(vs, domain) {
					if ns, svc, ok := splitFQDN(h, domain); ok {
						keys = append(keys, ns+"/"+svc)
					}
				}
			} else if a, ok := asAPIRoute(o); ok {
				keys = routeServices(a)
			}
			for _, k := range keys {
				if ns, svc, ok := cutKey(k); ok {
					out = append(out, byService(ctx, ns, svc)...)
				}
			}
			return out
		}))
	}
	return b, nil
}

// routeServices are the Services (namespace/name) a Gateway API route
// names as backend or parent.
func routeServices(a desired.APIRoute) []string {
	out := a.BackendServices()
	for _, p := range a.Parents {
		if p.Group != nil && *p.Group == "" && p.Kind != nil && *p.Kind == "Service" {
			ns := a.Namespace
			if p.Namespace != nil {
				ns = string(*p.Namespace)
			}
			out = append(out, ns+"/"+string(p.Name))
		}
	}
	return out
}

func cutKey(k string) (string, string, bool) {
	for i := 0; i < len(k); i++ {
		if k[i] == '/' {
			return k[:i], k[i+1:], i > 0 && i < len(k)-1
		}
	}
	return "", "", false
}

// gatewayAPIFor detects the Gateway API kinds the cluster serves and
// registers the Gateway API types with the manager's scheme when it serves
// any.
func gatewayAPIFor(mgr ctrl.Manager) (GatewayAPI, error) {
	g, err := DetectGatewayAPI(mgr.GetRESTMapper())
	if err != nil {
		return nil, err
	}
	if len(g) > 0 && !mgr.GetScheme().Recognizes(gwv1.SchemeGroupVersion.WithKind("HTTPRoute")) {
		if err := gwv1.Install(mgr.GetScheme()); err != nil {
			return nil, fmt.Errorf("register the Gateway API types: %w", err)
		}
	}
	return g, nil
}
