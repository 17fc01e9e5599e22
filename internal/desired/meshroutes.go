package desired

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// MeshRoute is one Gateway API route of routing_mode gateway_api.
type MeshRoute struct {
	Kind   optv1.GatewayRouteKind
	Object interface {
		metav1.Object
		runtime.Object
	}
	// Route is the object reduced, for comparison with the live one.
	Route APIRoute
}

// MeshRouteName is the name of the owned route of one port.
func MeshRouteName(service string, port int32) string {
	return fmt.Sprintf("%s-%d", ObjectName(service), port)
}

// MeshRoutes are the routes of routing_mode gateway_api: for each optimized
// port, a route whose parent is the Service on that port (GAMMA: istiod
// applies it to every sidecar that sees the Service, as a VirtualService of
// the Kubernetes host on that port) and whose backend is the optimized host
// on the same port (a networking.istio.io Hostname, which istiod resolves to
// the ServiceEntry). One route per port because istiod requires a port on
// every backendRef and a route has one backend list for all its parents.
// HTTP, HTTP2 and sniffed ports get an HTTPRoute, gRPC ports a GRPCRoute,
// TCP ports a TCPRoute; TLS ports stay on the Kubernetes Service (a mesh
// TLSRoute must name SNI hostnames, and istiod builds no TCP chain there).
//
// A Gateway API route carries no export scope: istiod exports the routes it
// derives to every namespace. So a Service whose scope is narrower than "*"
// gets no routes (a non-fatal problem), which keeps its visibility as it is.
func MeshRoutes(r Result, opt *optv1.IstioAdaptiveRequestOptimizer) ([]MeshRoute, []Problem) {
	if len(r.ExportTo) != 1 || r.ExportTo[0] != "*" {
		return nil, []Problem{{Reason: "GatewayAPIRouteNotScoped", Message: fmt.Sprintf(
			"Service %s/%s is exported only to %s, and a Gateway API route cannot carry an export scope (istiod exports it to every namespace); "+
				"no route is written. Use routing_mode: virtual_service, whose VirtualService keeps the Service's scope",
			r.Namespace, opt.Spec.ServiceName, strings.Join(r.ExportTo, ","))}}
	}
	labels := OwnedLabels(opt)
	annotations := ownedAnnotations(opt.Name)
	var out []MeshRoute
	var problems []Problem
	for _, p := range r.Ports {
		port := gwv1.PortNumber(p.Number)
		meta := metav1.ObjectMeta{Name: MeshRouteName(opt.Spec.ServiceName, p.Number), Namespace: r.Namespace, Labels: labels, Annotations: annotations}
		parent := gwv1.ParentReference{Group: ptrOf(gwv1.Group("")), Kind: ptrOf(gwv1.Kind("Service")), Name: gwv1.ObjectName(opt.Spec.ServiceName), Port: &port}
		backend := gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{
			Group: ptrOf(gwv1.Group(istioGroup)), Kind: ptrOf(gwv1.Kind(hostnameKind)), Name: gwv1.ObjectName(r.Host), Port: &port}}
		common := gwv1.CommonRouteSpec{ParentRefs: []gwv1.ParentReference{parent}}
		var mr MeshRoute
		switch {
		case p.meshProtocol == protoGRPC:
			o := &gwv1.GRPCRoute{TypeMeta: metav1.TypeMeta{APIVersion: gwv1.GroupVersion.String(), Kind: "GRPCRoute"}, ObjectMeta: meta}
			o.Spec.CommonRouteSpec = common
			o.Spec.Rules = []gwv1.GRPCRouteRule{{BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: backend}}}}
			mr = MeshRoute{Kind: optv1.GatewayRouteGRPCRoute, Object: o, Route: FromGRPCRoute(o)}
		case routeKindOf(p.meshProtocol) == routeHTTP || routeKindOf(p.meshProtocol) == routeSniffed:
			o := &gwv1.HTTPRoute{TypeMeta: metav1.TypeMeta{APIVersion: gwv1.GroupVersion.String(), Kind: "HTTPRoute"}, ObjectMeta: meta}
			o.Spec.CommonRouteSpec = common
			o.Spec.Rules = []gwv1.HTTPRouteRule{{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: backend}}}}
			mr = MeshRoute{Kind: optv1.GatewayRouteHTTPRoute, Object: o, Route: FromHTTPRoute(o)}
			if routeKindOf(p.meshProtocol) == routeSniffed {
				problems = append(problems, Problem{Reason: "SniffedPortHTTPOnly", Message: fmt.Sprintf(
					"port %d has no declared protocol; with routing_mode gateway_api only the HTTP requests istiod recognises on it take the HTTPRoute to the weights, other traffic stays on the Kubernetes Service. Name the port (http-, tcp-) or set appProtocol", p.Number)})
			}
		case routeKindOf(p.meshProtocol) == routeTCP:
			o := &gwv1.TCPRoute{TypeMeta: metav1.TypeMeta{APIVersion: gwv1.GroupVersion.String(), Kind: "TCPRoute"}, ObjectMeta: meta}
			o.Spec.CommonRouteSpec = common
			o.Spec.Rules = []gwv1.TCPRouteRule{{BackendRefs: []gwv1.BackendRef{backend}}}
			mr = MeshRoute{Kind: optv1.GatewayRouteTCPRoute, Object: o, Route: FromTCPRoute(o)}
		default:
			problems = append(problems, Problem{Reason: "TLSPortNotRouted", Message: fmt.Sprintf(
				"port %d carries TLS; with routing_mode gateway_api it stays on the Kubernetes Service (a mesh TLSRoute must name SNI hostnames). Use routing_mode virtual_service to weight it", p.Number)})
			continue
		}
		out = append(out, mr)
	}
	return out, problems
}

func ptrOf[T any](v T) *T { return &v }

// MeshRouteUpToDate says whether a live route already has the desired
// parents, backends and labels (fields the API server defaults, such as a
// rule's path match or a backend's weight, do not count).
func MeshRouteUpToDate(want, live APIRoute) bool {
	for k, v := range want.Labels {
		if live.Labels[k] != v {
			return false
		}
	}
	norm := func(a APIRoute) string {
		var b strings.Builder
		for _, p := range a.Parents {
			fmt.Fprintf(&b, "p:%s/%s/%s/%s/%v;", strOr(p.Group, gatewayGroup), strOr(p.Kind, "Gateway"), strOr(p.Namespace, a.Namespace), p.Name, portOf(p.Port))
		}
		for _, rule := range a.Backends {
			b.WriteString("r:")
			for _, be := range rule {
				w := int32(1)
				if be.Weight != nil {
					w = *be.Weight
				}
				fmt.Fprintf(&b, "%s/%s/%s/%s/%v/%d,", strOr(be.Group, ""), strOr(be.Kind, "Service"), strOr(be.Namespace, a.Namespace), be.Name, portOf(be.Port), w)
			}
		}
		return b.String()
	}
	return norm(want) == norm(live)
}

func portOf(p *gwv1.PortNumber) int32 {
	if p == nil {
		return 0
	}
	return int32(*p)
}
