package desired

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// Traffic that enters the mesh through a gateway is routed by the gateway's
// own routes: an Istio VirtualService bound to a gateway, or a Gateway API
// route whose parent is a Gateway. The operator's mesh VirtualService does
// not apply there, so a destination of the Kubernetes host reaches the
// Service's pods past the weights. This file finds those destinations, says
// the exact edit that weights them, and computes that edit (a JSON patch of
// only the destination fields, with a record of what was there) for the
// routes the user lists in gateway_routes.

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
		var refs []gwv1.BackendRef
		for _, b := range rule.BackendRefs {
			refs = append(refs, b.BackendRef)
		}
		a.Backends = append(a.Backends, refs)
	}
	return a
}

func FromGRPCRoute(r *gwv1.GRPCRoute) APIRoute {
	a := apiRoute(optv1.GatewayRouteGRPCRoute, r.ObjectMeta, r.Spec.ParentRefs)
	for _, rule := range r.Spec.Rules {
		var refs []gwv1.BackendRef
		for _, b := range rule.BackendRefs {
			refs = append(refs, b.BackendRef)
		}
		a.Backends = append(a.Backends, refs)
	}
	return a
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

// RetargetRecord is one recorded edit of a gateway route, kept in
// AnnotationRetargeted.
type RetargetRecord struct {
	// Optimizer is namespace/name of the optimizer that made the edit.
	Optimizer string `json:"optimizer"`
	FieldEdit
}

// RetargetRecords reads AnnotationRetargeted; a value that does not parse
// reads as no records (it was not written by the operator).
func RetargetRecords(annotations map[string]string) []RetargetRecord {
	var out []RetargetRecord
	if v := annotations[AnnotationRetargeted]; v != "" {
		if json.Unmarshal([]byte(v), &out) != nil {
			return nil
		}
	}
	return out
}

// recordedPaths maps each recorded path to its original value.
func recordedPaths(annotations map[string]string) map[string]*string {
	out := map[string]*string{}
	for _, r := range RetargetRecords(annotations) {
		from := r.From
		if from == nil {
			from = ptrTo("")
		}
		out[r.Path] = from
	}
	return out
}

// PatchOp is one JSON patch (RFC 6902) operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// annotationPath is the JSON pointer of AnnotationRetargeted ("/" is ~1).
var annotationPath = "/metadata/annotations/" + strings.ReplaceAll(AnnotationRetargeted, "/", "~1")

// RetargetPatch is the JSON patch that applies the edits of route g for
// optimizer (namespace/name) to the live object obj and records them: each
// field change preceded by a test that the field still holds what was read
// (a destination changed meanwhile fails the patch and is read again rather
// than overwritten; changes elsewhere in the route, such as the status
// istiod writes on Gateway API routes, do not), then the record. Nil when
// there is nothing to change.
func RetargetPatch(obj runtime.Object, meta metav1.Object, g GatewayRoute, optimizer string) ([]PatchOp, error) {
	var edits []FieldEdit
	for _, d := range g.Destinations {
		edits = append(edits, d.Edits...)
	}
	if len(edits) == 0 {
		return nil, nil
	}
	doc, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	var ops []PatchOp
	records := RetargetRecords(meta.GetAnnotations())
	for _, e := range edits {
		ops = append(ops, testOp(doc, e.Path)...)
		ops = append(ops, setOp(doc, e.Path, e.To)...)
		records = append(records, RetargetRecord{Optimizer: optimizer, FieldEdit: e})
	}
	return append(ops, recordOps(meta.GetAnnotations(), records)...), nil
}

// RestorePatch is the JSON patch that undoes the recorded edits of
// optimizer on the live object: each field still holding what the operator
// wrote gets its original value back (a field the user changed since is
// left as the user set it), and the records go. Nil when it has none.
func RestorePatch(obj runtime.Object, meta metav1.Object, optimizer string) ([]PatchOp, error) {
	records := RetargetRecords(meta.GetAnnotations())
	var keep, mine []RetargetRecord
	for _, r := range records {
		if r.Optimizer == optimizer {
			mine = append(mine, r)
		} else {
			keep = append(keep, r)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	doc, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	var ops []PatchOp
	for _, r := range mine {
		cur, present := pointerGet(doc, r.Path)
		if !sameValue(cur, present, r.To) {
			continue
		}
		ops = append(ops, testOp(doc, r.Path)...)
		ops = append(ops, setOp(doc, r.Path, r.From)...)
	}
	return append(ops, recordOps(meta.GetAnnotations(), keep)...), nil
}

func sameValue(cur any, present bool, want *string) bool {
	if want == nil {
		return !present
	}
	s, ok := cur.(string)
	return present && ok && s == *want
}

// testOp checks that the field at path still holds what doc says (a field
// that is absent cannot be tested in JSON patch, and gets no test).
func testOp(doc map[string]any, path string) []PatchOp {
	if cur, present := pointerGet(doc, path); present {
		return []PatchOp{{Op: "test", Path: path, Value: cur}}
	}
	return nil
}

// setOp sets (value non-nil) or removes (nil) the field at path.
func setOp(doc map[string]any, path string, value *string) []PatchOp {
	_, present := pointerGet(doc, path)
	switch {
	case value == nil && present:
		return []PatchOp{{Op: "remove", Path: path}}
	case value == nil:
		return nil // already absent
	case present:
		return []PatchOp{{Op: "replace", Path: path, Value: *value}}
	}
	return []PatchOp{{Op: "add", Path: path, Value: *value}}
}

// recordOps writes records into AnnotationRetargeted (removes it when empty).
func recordOps(annotations map[string]string, records []RetargetRecord) []PatchOp {
	_, had := annotations[AnnotationRetargeted]
	if len(records) == 0 {
		if had {
			return []PatchOp{{Op: "remove", Path: annotationPath}}
		}
		return nil
	}
	data, _ := json.Marshal(records)
	if annotations == nil {
		return []PatchOp{{Op: "add", Path: "/metadata/annotations", Value: map[string]string{AnnotationRetargeted: string(data)}}}
	}
	return []PatchOp{{Op: "add", Path: annotationPath, Value: string(data)}}
}

// pointerGet reads a JSON pointer (RFC 6901) from a decoded document.
func pointerGet(doc any, path string) (any, bool) {
	cur := doc
	for _, tok := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}

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
