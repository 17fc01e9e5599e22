package desired

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// Traffic that enters the mesh through a gateway is routed by the gateway's
// own routes: an Istio VirtualService bound to a gateway, or a Gateway API
// route whose parent is a Gateway. The operator's mesh VirtualService does
// not apply there, so a destination of the Kubernetes host reaches the
// Service's pods past the weights. This file finds those destinations and
// says the exact edit that weights them; retarget.go computes that edit (a
// JSON patch of only the destination fields, with a record of what was
// there) for the routes the user lists in gateway_routes, and meshroutes.go
// the Gateway API routes of routing_mode gateway_api.

const (
	// AnnotationRetargeted records, on a gateway route the operator edited,
	// every field it changed and what the field held before, so the edit
	// can be undone exactly (entry removed from gateway_routes, optimizer
	// deleted) without touching the user's other fields.
	AnnotationRetargeted = "optimization.liorfranko.github.io/retargeted"

	// istioGroup and hostnameKind are the Gateway API backendRef Istio reads
	// as "this host of the mesh registry" (a ServiceEntry host); istiod
	// refuses a namespace on it.
	istioGroup   = "networking.istio.io"
	hostnameKind = "Hostname"

	// gatewayGroup is the Gateway API group.
	gatewayGroup = "gateway.networking.k8s.io"

	// ReasonGatewayRoutesBypassWeights: gateway routes send the Service's
	// traffic to its Kubernetes host, past the weights.
	ReasonGatewayRoutesBypassWeights = "GatewayRoutesBypassWeights"
	// ReasonMeshRouteConflict: a Gateway API route has the Service as its
	// parent (GAMMA) and competes with the operator's route for the host.
	ReasonMeshRouteConflict = "MeshRouteConflict"
)

// GatewayTarget is the Service whose gateway traffic is looked for.
type GatewayTarget struct {
	Service, Namespace, ClusterDomain string
	// Host is the optimized host.
	Host string
	// Ports are the optimized port numbers: a destination on another port
	// has no cluster on the optimized host and cannot be retargeted.
	Ports []int32
}

func (t GatewayTarget) fqdn() string { return KubernetesHost(t.Service, t.Namespace, t.ClusterDomain) }

func (t GatewayTarget) hasPort(p int32) bool {
	for _, q := range t.Ports {
		if q == p {
			return true
		}
	}
	return false
}

// RouteRef names a gateway route.
type RouteRef struct {
	Kind      optv1.GatewayRouteKind
	Namespace string
	Name      string
}

func (r RouteRef) String() string { return fmt.Sprintf("%s %s/%s", r.Kind, r.Namespace, r.Name) }

// FieldEdit changes one string field of a route, addressed by a JSON
// pointer. A nil From or To means the field is absent.
type FieldEdit struct {
	Path string  `json:"path"`
	From *string `json:"from,omitempty"`
	To   *string `json:"to,omitempty"`
}

// Destination is one destination of a gateway route that leads to the
// Service's Kubernetes host (or, once retargeted, to the optimized host).
type Destination struct {
	// Where is the destination inside the route, e.g. "http route 0
	// destination 1" or "rule 0 backendRef 0".
	Where string
	// From and To spell the destination before and after the change.
	From, To string
	// Edits are the field changes that retarget it; empty when it cannot be
	// retargeted (Blocked says why).
	Edits   []FieldEdit
	Blocked string
	// Retargeted: it already leads to the optimized host by the operator's
	// recorded edit.
	Retargeted bool
	// Stale: the operator's recorded edit leads to a host or port the
	// optimizer no longer serves (spec.host or service_ports changed); the
	// edit must be undone before it can be made again.
	Stale bool
}

// GatewayRoute is a gateway route with destinations of the Service.
type GatewayRoute struct {
	Ref          RouteRef
	Gateways     []string // namespace/name
	Destinations []Destination
}

// Stale says whether an earlier edit of the operator must be undone.
func (g GatewayRoute) Stale() bool {
	for _, d := range g.Destinations {
		if d.Stale {
			return true
		}
	}
	return false
}

// Bypasses says whether traffic through the route still escapes the weights.
func (g GatewayRoute) Bypasses() bool {
	for _, d := range g.Destinations {
		if !d.Retargeted {
			return true
		}
	}
	return false
}

// Change is the exact edit that weights the route's traffic, for status.
func (g GatewayRoute) Change() string {
	var parts []string
	for _, d := range g.Destinations {
		s := fmt.Sprintf("%s %s → %s", d.Where, d.From, d.To)
		switch {
		case d.Retargeted:
			s += " (done by the operator)"
		case d.Stale:
			s += " (the operator's earlier change leads to a host or port no longer optimized; it is being undone)"
		case d.Blocked != "":
			s += " (" + d.Blocked + ")"
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("%s %s", g.Ref, strings.Join(parts, "; "))
}

// resolveHost spells an Istio destination host as a FQDN the way Istio
// resolves short names: in the namespace of the route.
func resolveHost(h, routeNamespace, domain string) string {
	if domain == "" {
		domain = "cluster.local"
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	parts := strings.Split(h, ".")
	switch {
	case len(parts) == 1:
		return h + "." + routeNamespace + ".svc." + domain
	case len(parts) == 2:
		return h + ".svc." + domain
	case len(parts) == 3 && parts[2] == "svc":
		return h + "." + domain
	}
	return h
}

// VirtualServiceGateways are the gateways (namespace/name) a VirtualService
// is bound to, "mesh" left out.
func VirtualServiceGateways(vs *istionet.VirtualService) []string {
	var out []string
	for _, g := range vs.Spec.Gateways {
		if g == "mesh" || g == "" {
			continue
		}
		if !strings.Contains(g, "/") {
			g = vs.Namespace + "/" + g
		}
		out = append(out, g)
	}
	sort.Strings(out)
	return out
}

// VirtualServiceDestinationHosts are the FQDNs of every destination of a
// VirtualService bound to a gateway (nil for a mesh-only one), for an index.
func VirtualServiceDestinationHosts(vs *istionet.VirtualService, domain string) []string {
	if len(VirtualServiceGateways(vs)) == 0 {
		return nil
	}
	set := map[string]bool{}
	for _, h := range vs.Spec.Http {
		for _, r := range h.Route {
			if r.Destination != nil {
				set[resolveHost(r.Destination.Host, vs.Namespace, domain)] = true
			}
		}
	}
	for _, t := range vs.Spec.Tcp {
		for _, r := range t.Route {
			if r.Destination != nil {
				set[resolveHost(r.Destination.Host, vs.Namespace, domain)] = true
			}
		}
	}
	for _, t := range vs.Spec.Tls {
		for _, r := range t.Route {
			if r.Destination != nil {
				set[resolveHost(r.Destination.Host, vs.Namespace, domain)] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for h := range set {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// GatewayVirtualService finds the destinations of the Service in a
// VirtualService bound to a gateway; nil when it has none. Records are the
// operator's recorded edits on it (RetargetRecords).
func GatewayVirtualService(t GatewayTarget, vs *istionet.VirtualService) *GatewayRoute {
	gws := VirtualServiceGateways(vs)
	if len(gws) == 0 {
		return nil
	}
	recorded := recordedPaths(vs.Annotations)
	g := &GatewayRoute{Ref: RouteRef{Kind: optv1.GatewayRouteVirtualService, Namespace: vs.Namespace, Name: vs.Name}, Gateways: gws}
	visit := func(section string, i, j int, host string, port uint32) {
		path := fmt.Sprintf("/spec/%s/%d/route/%d/destination/host", section, i, j)
		fqdn := resolveHost(host, vs.Namespace, t.ClusterDomain)
		portText := ""
		if port != 0 {
			portText = ":" + strconv.Itoa(int(port))
		}
		where := fmt.Sprintf("%s route %d destination %d", section, i, j)
		switch {
		case fqdn == t.fqdn():
			d := Destination{Where: where, From: host + portText, To: t.Host + portText}
			switch {
			case port != 0 && !t.hasPort(int32(port)):
				d.Blocked = fmt.Sprintf("port %d is not optimized", port)
			case port == 0 && len(t.Ports) != 1:
				d.Blocked = "the destination names no port and the optimized host has several"
			default:
				to := t.Host
				d.Edits = []FieldEdit{{Path: path, From: &host, To: &to}}
			}
			g.Destinations = append(g.Destinations, d)
		case recorded[path] != nil && resolveHost(*recorded[path], vs.Namespace, t.ClusterDomain) == t.fqdn():
			// Retargeted for this Service by the operator.
			from := *recorded[path]
			d := Destination{Where: where, From: from + portText, To: t.Host + portText, Retargeted: true}
			if !strings.EqualFold(host, t.Host) || (port != 0 && !t.hasPort(int32(port))) || (port == 0 && len(t.Ports) != 1) {
				d.Retargeted, d.Stale = false, true
			}
			g.Destinations = append(g.Destinations, d)
		}
	}
	for i, h := range vs.Spec.Http {
		for j, r := range h.Route {
			if r.Destination != nil {
				visit("http", i, j, r.Destination.Host, r.Destination.GetPort().GetNumber())
			}
		}
	}
	for i, tr := range vs.Spec.Tcp {
		for j, r := range tr.Route {
			if r.Destination != nil {
				visit("tcp", i, j, r.Destination.Host, r.Destination.GetPort().GetNumber())
			}
		}
	}
	for i, tr := range vs.Spec.Tls {
		for j, r := range tr.Route {
			if r.Destination != nil {
				visit("tls", i, j, r.Destination.Host, r.Destination.GetPort().GetNumber())
			}
		}
	}
	if len(g.Destinations) == 0 {
		return nil
	}
	return g
}

// APIRoute is a Gateway API route (HTTPRoute, GRPCRoute, TCPRoute,
// TLSRoute) reduced to what routing decisions need.
type APIRoute struct {
	Kind        optv1.GatewayRouteKind
	Namespace   string
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	Parents     []gwv1.ParentReference
	// Backends are each rule's backendRefs.
	Backends [][]gwv1.BackendRef
}

// FromHTTPRoute and its siblings reduce a typed route to an APIRoute.
func FromHTTPRoute(r *gwv1.HTTPRoute) APIRoute {
	a := apiRoute(optv1.GatewayRouteHTTPRoute, r.ObjectMeta, r.Spec.ParentRefs)
	for _, rule := range r.Spec.Rules {
		a.Backends = append(a.Backends, backendRefs(rule.BackendRefs, func(b gwv1.HTTPBackendRef) gwv1.BackendRef { return b.BackendRef }))
	}
	return a
}

func FromGRPCRoute(r *gwv1.GRPCRoute) APIRoute {
	a := apiRoute(optv1.GatewayRouteGRPCRoute, r.ObjectMeta, r.Spec.ParentRefs)
	for _, rule := range r.Spec.Rules {
		a.Backends = append(a.Backends, backendRefs(rule.BackendRefs, func(b gwv1.GRPCBackendRef) gwv1.BackendRef { return b.BackendRef }))
	}
	return a
}

// backendRefs returns a rule's backendRefs without their filters.
func backendRefs[B any](refs []B, ref func(B) gwv1.BackendRef) []gwv1.BackendRef {
	var out []gwv1.BackendRef
	for _, b := range refs {
		out = append(out, ref(b))
	}
	return out
}

func FromTCPRoute(r *gwv1.TCPRoute) APIRoute {
	a := apiRoute(optv1.GatewayRouteTCPRoute, r.ObjectMeta, r.Spec.ParentRefs)
	for _, rule := range r.Spec.Rules {
		a.Backends = append(a.Backends, rule.BackendRefs)
	}
	return a
}

func FromTLSRoute(r *gwv1.TLSRoute) APIRoute {
	a := apiRoute(optv1.GatewayRouteTLSRoute, r.ObjectMeta, r.Spec.ParentRefs)
	for _, rule := range r.Spec.Rules {
		a.Backends = append(a.Backends, rule.BackendRefs)
	}
	return a
}

func apiRoute(kind optv1.GatewayRouteKind, m metav1.ObjectMeta, parents []gwv1.ParentReference) APIRoute {
	return APIRoute{Kind: kind, Namespace: m.Namespace, Name: m.Name, Labels: m.Labels, Annotations: m.Annotations, Parents: parents}
}

func strOr[T ~string](p *T, def string) string {
	if p == nil {
		return def
	}
	return string(*p)
}

// gatewayParents are the Gateways (namespace/name) among a route's parents.
func (a APIRoute) gatewayParents() []string {
	var out []string
	for _, p := range a.Parents {
		if strOr(p.Group, gatewayGroup) == gatewayGroup && strOr(p.Kind, "Gateway") == "Gateway" {
			out = append(out, strOr(p.Namespace, a.Namespace)+"/"+string(p.Name))
		}
	}
	sort.Strings(out)
	return out
}

// HasServiceParent says whether the route has the Service as a parent
// (GAMMA mesh routing: kind Service, core group).
func (a APIRoute) HasServiceParent(service, namespace string) bool {
	for _, p := range a.Parents {
		if p.Group != nil && *p.Group == "" && p.Kind != nil && *p.Kind == "Service" &&
			string(p.Name) == service && strOr(p.Namespace, a.Namespace) == namespace {
			return true
		}
	}
	return false
}

// BackendServices are the Services (namespace/name) a route's backendRefs
// name, for an index.
func (a APIRoute) BackendServices() []string {
	set := map[string]bool{}
	for _, rule := range a.Backends {
		for _, b := range rule {
			if strOr(b.Group, "") == "" && strOr(b.Kind, "Service") == "Service" {
				set[strOr(b.Namespace, a.Namespace)+"/"+string(b.Name)] = true
			}
		}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// MeshRouteConflict is the problem of Gateway API routes that have the
// Service as their parent; nil when there are none. Istio merges such a
// route and the operator's route for the same host and keeps only the
// older, silently.
func MeshRouteConflict(t GatewayTarget, routes []APIRoute, owned func(APIRoute) bool) *Problem {
	var names []string
	for _, r := range routes {
		if r.HasServiceParent(t.Service, t.Namespace) && !owned(r) {
			names = append(names, RouteRef{r.Kind, r.Namespace, r.Name}.String())
		}
	}
	if len(names) == 0 {
		return nil
	}
	sort.Strings(names)
	return &Problem{Reason: ReasonMeshRouteConflict, Message: fmt.Sprintf(
		"%s has Service %s/%s as its parent (Gateway API mesh routing) and routes %s next to the operator's route; Istio uses only the older of the two. "+
			"Point its backendRefs at group %s kind %s name %s (same port) and set routing_mode: none, or delete it",
		strings.Join(names, ", "), t.Namespace, t.Service, t.fqdn(), istioGroup, hostnameKind, t.Host)}
}

// GatewayAPIRoute finds the backendRefs of the Service in a Gateway API
// route whose parent is a Gateway; nil when it has none.
func GatewayAPIRoute(t GatewayTarget, a APIRoute) *GatewayRoute {
	gws := a.gatewayParents()
	if len(gws) == 0 {
		return nil
	}
	recorded := recordedPaths(a.Annotations)
	g := &GatewayRoute{Ref: RouteRef{a.Kind, a.Namespace, a.Name}, Gateways: gws}
	for i, rule := range a.Backends {
		for j, b := range rule {
			base := fmt.Sprintf("/spec/rules/%d/backendRefs/%d", i, j)
			where := fmt.Sprintf("rule %d backendRef %d", i, j)
			port := ""
			if b.Port != nil {
				port = ":" + strconv.Itoa(int(*b.Port))
			}
			to := fmt.Sprintf("%s/%s %s%s", istioGroup, hostnameKind, t.Host, port)
			group, kind, ns := strOr(b.Group, ""), strOr(b.Kind, "Service"), strOr(b.Namespace, a.Namespace)
			switch {
			case group == "" && kind == "Service" && string(b.Name) == t.Service && ns == t.Namespace:
				d := Destination{Where: where, From: fmt.Sprintf("Service %s/%s%s", ns, b.Name, port), To: to}
				if b.Port == nil || !t.hasPort(int32(*b.Port)) {
					d.Blocked = "its port is not optimized"
					g.Destinations = append(g.Destinations, d)
					continue
				}
				name := t.Host
				d.Edits = []FieldEdit{
					{Path: base + "/group", From: (*string)(b.Group), To: ptrTo(istioGroup)},
					{Path: base + "/kind", From: (*string)(b.Kind), To: ptrTo(hostnameKind)},
					{Path: base + "/name", From: ptrTo(string(b.Name)), To: &name},
					// istiod refuses a namespace on a Hostname backend.
					{Path: base + "/namespace", From: (*string)(b.Namespace), To: nil},
				}
				g.Destinations = append(g.Destinations, d)
			case group == istioGroup && kind == hostnameKind && recorded[base+"/name"] != nil && *recorded[base+"/name"] == t.Service:
				// Retargeted for this Service by the operator.
				d := Destination{Where: where, From: fmt.Sprintf("Service %s/%s%s", t.Namespace, *recorded[base+"/name"], port), To: to, Retargeted: true}
				if string(b.Name) != t.Host || b.Port == nil || !t.hasPort(int32(*b.Port)) {
					d.Retargeted, d.Stale = false, true
				}
				g.Destinations = append(g.Destinations, d)
			}
		}
	}
	if len(g.Destinations) == 0 {
		return nil
	}
	return g
}

func ptrTo(s string) *string { return &s }

// GatewayRouteStatus turns found routes into status entries, the first
// limit by kind, namespace and name, and says how many bypass the weights.
func GatewayRouteStatus(routes []GatewayRoute, limit int) ([]optv1.GatewayRouteStatus, int) {
	sort.Slice(routes, func(i, j int) bool {
		a, b := routes[i].Ref, routes[j].Ref
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	var out []optv1.GatewayRouteStatus
	bypassing := 0
	for _, g := range routes {
		if g.Bypasses() {
			bypassing++
		}
		if len(out) >= limit {
			continue
		}
		gws := g.Gateways
		if len(gws) > 16 {
			gws = gws[:16]
		}
		out = append(out, optv1.GatewayRouteStatus{Kind: g.Ref.Kind, Namespace: g.Ref.Namespace, Name: g.Ref.Name,
			Gateways: gws, Change: g.Change(), Retargeted: !g.Bypasses()})
	}
	return out, bypassing
}

// BypassProblem is the Degraded condition of gateway routes that still send
// the Service's traffic past the weights; nil when none do.
func BypassProblem(routes []GatewayRoute) *Problem {
	var msgs []string
	n := 0
	for _, g := range routes {
		if !g.Bypasses() {
			continue
		}
		n++
		if len(msgs) < 3 {
			msgs = append(msgs, g.Change())
		}
	}
	if n == 0 {
		return nil
	}
	more := ""
	if n > len(msgs) {
		more = fmt.Sprintf(" (and %d more in status.gatewayRoutes)", n-len(msgs))
	}
	return &Problem{Reason: ReasonGatewayRoutesBypassWeights, Message: fmt.Sprintf(
		"%d gateway route(s) send the Service's traffic to its Kubernetes host, past the weights: %s%s. "+
			"Make the change, or list the route in gateway_routes to let the operator make it and undo it on deletion",
		n, strings.Join(msgs, "; "), more)}
}
