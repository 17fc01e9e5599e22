package desired

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	jsonpatch "github.com/evanphx/json-patch/v5"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

var webTarget = GatewayTarget{Service: "web", Namespace: "shop", Host: "web.shop.adaptive", Ports: []int32{80}}

func gatewayVS(ns string, gateways []string, dests ...*networking.Destination) *istionet.VirtualService {
	vs := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-ingress", ResourceVersion: "7"}}
	vs.Spec.Hosts = []string{"shop.example.com"}
	vs.Spec.Gateways = gateways
	for _, d := range dests {
		vs.Spec.Http = append(vs.Spec.Http, &networking.HTTPRoute{Route: []*networking.HTTPRouteDestination{{Destination: d}}})
	}
	return vs
}

func dest(host string, port uint32) *networking.Destination {
	d := &networking.Destination{Host: host}
	if port != 0 {
		d.Port = &networking.PortSelector{Number: port}
	}
	return d
}

// TestGatewayVirtualService: the destinations of the Service in a
// VirtualService bound to a gateway are found however the host is spelled,
// with the exact change; mesh-only routes and other hosts are not gateway
// bypasses; a port that is not optimized is named, not retargeted.
func TestGatewayVirtualService(t *testing.T) {
	cases := map[string]struct {
		vs     *istionet.VirtualService
		target GatewayTarget
		want   string // Change(), "" for nil
		edits  int
	}{
		"fqdn": {vs: gatewayVS("shop", []string{"istio-system/ingress"}, dest("web.shop.svc.cluster.local", 80)),
			want:  "VirtualService shop/web-ingress http route 0 destination 0 web.shop.svc.cluster.local:80 → web.shop.adaptive:80",
			edits: 1},
		"short name in the Service's namespace": {vs: gatewayVS("shop", []string{"ingress"}, dest("web", 80)),
			want: "VirtualService shop/web-ingress http route 0 destination 0 web:80 → web.shop.adaptive:80", edits: 1},
		"short name elsewhere is another Service": {vs: gatewayVS("edge", []string{"ingress"}, dest("web", 80))},
		"name.namespace from another namespace": {vs: gatewayVS("edge", []string{"ingress"}, dest("other", 80), dest("web.shop", 80)),
			want: "VirtualService edge/web-ingress http route 1 destination 0 web.shop:80 → web.shop.adaptive:80", edits: 1},
		"mesh only":              {vs: gatewayVS("shop", []string{"mesh"}, dest("web", 80))},
		"no gateways means mesh": {vs: gatewayVS("shop", nil, dest("web", 80))},
		"bound to mesh and a gateway": {vs: gatewayVS("shop", []string{"mesh", "ingress"}, dest("web", 80)),
			want: "VirtualService shop/web-ingress http route 0 destination 0 web:80 → web.shop.adaptive:80", edits: 1},
		"port not optimized": {vs: gatewayVS("shop", []string{"ingress"}, dest("web", 9090)),
			want: "VirtualService shop/web-ingress http route 0 destination 0 web:9090 → web.shop.adaptive:9090 (port 9090 is not optimized)"},
		"no port, one optimized port": {vs: gatewayVS("shop", []string{"ingress"}, dest("web", 0)),
			want: "VirtualService shop/web-ingress http route 0 destination 0 web → web.shop.adaptive", edits: 1},
		"no port, several optimized ports": {vs: gatewayVS("shop", []string{"ingress"}, dest("web", 0)),
			target: GatewayTarget{Service: "web", Namespace: "shop", Host: "web.shop.adaptive", Ports: []int32{80, 81}},
			want:   "VirtualService shop/web-ingress http route 0 destination 0 web → web.shop.adaptive (the destination names no port and the optimized host has several)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			target := tc.target
			if target.Service == "" {
				target = webTarget
			}
			g := GatewayVirtualService(target, tc.vs)
			got := ""
			edits := 0
			if g != nil {
				got = g.Change()
				for _, d := range g.Destinations {
					edits += len(d.Edits)
				}
				if !g.Bypasses() {
					t.Error("a route that was not retargeted does not bypass")
				}
			}
			if got != tc.want || edits != tc.edits {
				t.Errorf("change %q with %d edits, want %q with %d", got, edits, tc.want, tc.edits)
			}
		})
	}
}

func apply(t *testing.T, doc []byte, ops []PatchOp) []byte {
	t.Helper()
	raw, err := json.Marshal(ops)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Apply(doc)
	if err != nil {
		t.Fatalf("apply %s: %v", raw, err)
	}
	return out
}

// TestRetargetAndRestoreVirtualService: the patch changes only the
// destination host, records it, and the restore gives back exactly the
// original route; a record makes the route read as retargeted.
func TestRetargetAndRestoreVirtualService(t *testing.T) {
	vs := gatewayVS("shop", []string{"ingress"}, dest("other", 80), dest("web", 80))
	vs.Annotations = map[string]string{"team": "shop"}
	orig, _ := json.Marshal(vs)
	g := GatewayVirtualService(webTarget, vs)
	ops, err := RetargetPatch(vs, vs, *g, "shop/web")
	if err != nil {
		t.Fatal(err)
	}
	patched := apply(t, orig, ops)
	after := &istionet.VirtualService{}
	if err := json.Unmarshal(patched, after); err != nil {
		t.Fatal(err)
	}
	if h := after.Spec.Http[1].Route[0].Destination.Host; h != "web.shop.adaptive" {
		t.Fatalf("destination host %q after retargeting", h)
	}
	if h := after.Spec.Http[0].Route[0].Destination.Host; h != "other" {
		t.Fatalf("another destination changed to %q", h)
	}
	if after.Annotations["team"] != "shop" || after.Annotations[AnnotationRetargeted] == "" {
		t.Fatalf("annotations %v", after.Annotations)
	}
	g2 := GatewayVirtualService(webTarget, after)
	if g2 == nil || g2.Bypasses() || !strings.Contains(g2.Change(), "web:80 → web.shop.adaptive:80 (done by the operator)") {
		t.Fatalf("retargeted route reads as %+v", g2)
	}
	if again, _ := RetargetPatch(after, after, *g2, "shop/web"); again != nil {
		t.Errorf("a retargeted route is patched again: %+v", again)
	}

	rops, err := RestorePatch(after, after, "shop/web")
	if err != nil {
		t.Fatal(err)
	}
	restored := &istionet.VirtualService{}
	if err := json.Unmarshal(apply(t, patched, rops), restored); err != nil {
		t.Fatal(err)
	}
	want := vs.DeepCopy()
	if restored.Spec.Http[1].Route[0].Destination.Host != "web" || !equalJSON(t, restored.Annotations, want.Annotations) {
		t.Errorf("restored %v annotations %v", restored.Spec.Http[1].Route[0].Destination, restored.Annotations)
	}
	// Another optimizer's records are left alone.
	if none, _ := RestorePatch(after, after, "other/opt"); none != nil {
		t.Errorf("another optimizer restores %+v", none)
	}
	if rops[0].Op != "test" || rops[0].Path != "/spec/http/1/route/0/destination/host" || rops[0].Value != "web.shop.adaptive" {
		t.Errorf("restore does not test the field first: %+v", rops[0])
	}
	// A destination changed after it was read fails the patch instead of
	// being overwritten; a change elsewhere does not.
	moved := vs.DeepCopy()
	moved.Spec.Http[1].Route[0].Destination.Host = "web-v2"
	movedDoc, _ := json.Marshal(moved)
	if raw, _ := json.Marshal(ops); true {
		p, _ := jsonpatch.DecodePatch(raw)
		if _, err := p.Apply(movedDoc); err == nil {
			t.Error("a retarget patch applied over a destination changed since it was read")
		}
	}
	relabelled := vs.DeepCopy()
	relabelled.Labels = map[string]string{"new": "label"}
	relabelledDoc, _ := json.Marshal(relabelled)
	apply(t, relabelledDoc, ops)
}

// TestRestoreLeavesUserChanges: a destination the user changed after the
// operator retargeted it keeps the user's value.
func TestRestoreLeavesUserChanges(t *testing.T) {
	vs := gatewayVS("shop", []string{"ingress"}, dest("web", 80))
	orig, _ := json.Marshal(vs)
	ops, _ := RetargetPatch(vs, vs, *GatewayVirtualService(webTarget, vs), "shop/web")
	after := &istionet.VirtualService{}
	_ = json.Unmarshal(apply(t, orig, ops), after)
	after.Spec.Http[0].Route[0].Destination.Host = "web-v2"
	rops, _ := RestorePatch(after, after, "shop/web")
	doc, _ := json.Marshal(after)
	restored := &istionet.VirtualService{}
	_ = json.Unmarshal(apply(t, doc, rops), restored)
	if h := restored.Spec.Http[0].Route[0].Destination.Host; h != "web-v2" {
		t.Errorf("restore overwrote the user's %q with %q", "web-v2", h)
	}
	if _, ok := restored.Annotations[AnnotationRetargeted]; ok {
		t.Error("the record stays after the restore")
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func httpRoute(ns string, parents []gwv1.ParentReference, backends ...gwv1.BackendObjectReference) *gwv1.HTTPRoute {
	r := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-route", ResourceVersion: "3"}}
	r.Spec.ParentRefs = parents
	var refs []gwv1.HTTPBackendRef
	for _, b := range backends {
		refs = append(refs, gwv1.HTTPBackendRef{BackendRef: gwv1.BackendRef{BackendObjectReference: b}})
	}
	r.Spec.Rules = []gwv1.HTTPRouteRule{{BackendRefs: refs}}
	return r
}

func port(n int32) *gwv1.PortNumber { p := gwv1.PortNumber(n); return &p }

var (
	gatewayParent = gwv1.ParentReference{Name: "ingress", Namespace: ptrOf(gwv1.Namespace("istio-system"))}
	serviceParent = gwv1.ParentReference{Group: ptrOf(gwv1.Group("")), Kind: ptrOf(gwv1.Kind("Service")), Name: "web"}
)

// TestGatewayAPIRoute: a route whose parent is a Gateway and whose
// backendRef is the Service is a bypass; its retarget turns the backendRef
// into Istio's Hostname backend of the optimized host (no namespace, as
// istiod requires) and the restore gives back the Service backendRef.
func TestGatewayAPIRoute(t *testing.T) {
	r := httpRoute("edge", []gwv1.ParentReference{gatewayParent},
		gwv1.BackendObjectReference{Group: ptrOf(gwv1.Group("")), Kind: ptrOf(gwv1.Kind("Service")), Name: "web", Namespace: ptrOf(gwv1.Namespace("shop")), Port: port(80)})
	g := GatewayAPIRoute(webTarget, FromHTTPRoute(r))
	if g == nil {
		t.Fatal("no bypass found")
	}
	want := "HTTPRoute edge/web-route rule 0 backendRef 0 Service shop/web:80 → networking.istio.io/Hostname web.shop.adaptive:80"
	if g.Change() != want || !slices.Equal(g.Gateways, []string{"istio-system/ingress"}) {
		t.Fatalf("change %q gateways %v, want %q", g.Change(), g.Gateways, want)
	}
	orig, _ := json.Marshal(r)
	ops, err := RetargetPatch(r, r, *g, "shop/web")
	if err != nil {
		t.Fatal(err)
	}
	patched := apply(t, orig, ops)
	after := &gwv1.HTTPRoute{}
	_ = json.Unmarshal(patched, after)
	b := after.Spec.Rules[0].BackendRefs[0].BackendObjectReference
	if strOr(b.Group, "") != istioGroup || strOr(b.Kind, "") != hostnameKind || b.Name != "web.shop.adaptive" || b.Namespace != nil || portOf(b.Port) != 80 {
		t.Fatalf("backendRef after retargeting: %+v", b)
	}
	if g2 := GatewayAPIRoute(webTarget, FromHTTPRoute(after)); g2 == nil || g2.Bypasses() {
		t.Fatalf("retargeted route reads as %+v", g2)
	}
	rops, _ := RestorePatch(after, after, "shop/web")
	restored := &gwv1.HTTPRoute{}
	_ = json.Unmarshal(apply(t, patched, rops), restored)
	if !equalJSON(t, restored.Spec, r.Spec) || len(restored.Annotations) != 0 {
		t.Errorf("restored spec %+v annotations %v, want the original", restored.Spec, restored.Annotations)
	}

	// A mesh route (the Service as parent) is not a gateway bypass but a
	// conflict; the operator's own is neither.
	mesh := FromHTTPRoute(httpRoute("shop", []gwv1.ParentReference{serviceParent},
		gwv1.BackendObjectReference{Name: "web", Port: port(80)}))
	if GatewayAPIRoute(webTarget, mesh) != nil {
		t.Error("a mesh route read as a gateway route")
	}
	p := MeshRouteConflict(webTarget, []APIRoute{mesh}, func(APIRoute) bool { return false })
	if p == nil || p.Reason != ReasonMeshRouteConflict || !strings.Contains(p.Message, "HTTPRoute shop/web-route has Service shop/web as its parent") {
		t.Errorf("conflict %+v", p)
	}
	if MeshRouteConflict(webTarget, []APIRoute{mesh}, func(APIRoute) bool { return true }) != nil {
		t.Error("the operator's own route is a conflict")
	}
	other := mesh
	other.Namespace = "edge" // a parent of another namespace's Service "web"
	if MeshRouteConflict(webTarget, []APIRoute{other}, func(APIRoute) bool { return false }) != nil {
		t.Error("a route of another namespace's Service is a conflict")
	}
}

// TestMeshRoutes: routing_mode gateway_api writes one route per port,
// whose parent is the Service on that port and whose backend is the
// optimized host on the same port, of the kind the port's protocol needs;
// a Service exported narrower than "*" gets none.
func TestMeshRoutes(t *testing.T) {
	in := webInput()
	in.Optimizer.Spec.RoutingMode = optv1.RoutingGatewayAPI
	in.Service = service(svcPort("http", 80, intstr.FromInt32(8080)), svcPort("grpc", 90, intstr.FromInt32(9090)), svcPort("tcp-db", 5432, intstr.FromInt32(5432)))
	r := Compute(in)
	if r.VirtualService != nil {
		t.Fatal("gateway_api wrote a VirtualService")
	}
	routes, problems := MeshRoutes(r, in.Optimizer)
	if len(problems) != 0 {
		t.Fatalf("problems %+v", problems)
	}
	var got []string
	for _, mr := range routes {
		a := mr.Route
		p, b := a.Parents[0], a.Backends[0][0]
		got = append(got, strings.Join([]string{string(mr.Kind), mr.Object.GetName(),
			strOr(p.Kind, "") + "/" + string(p.Name) + ":" + itoa(uint32(portOf(p.Port))),
			strOr(b.Group, "") + "/" + strOr(b.Kind, "") + "/" + string(b.Name) + ":" + itoa(uint32(portOf(b.Port)))}, " "))
		if !IsOwnedBy(mr.Object, in.Optimizer) {
			t.Errorf("%s is not labelled as owned", mr.Object.GetName())
		}
		if !MeshRouteUpToDate(mr.Route, mr.Route) {
			t.Errorf("%s is not up to date with itself", mr.Object.GetName())
		}
	}
	want := []string{
		"HTTPRoute web-adaptive-80 Service/web:80 networking.istio.io/Hostname/web.shop.adaptive:80",
		"GRPCRoute web-adaptive-90 Service/web:90 networking.istio.io/Hostname/web.shop.adaptive:90",
		"TCPRoute web-adaptive-5432 Service/web:5432 networking.istio.io/Hostname/web.shop.adaptive:5432",
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes\n%q\nwant\n%q", got, want)
	}
	changed := routes[0].Route
	changed.Backends = [][]gwv1.BackendRef{{{BackendObjectReference: gwv1.BackendObjectReference{Name: "web", Port: port(80)}}}}
	if MeshRouteUpToDate(routes[0].Route, changed) {
		t.Error("a route to the Service reads as up to date")
	}

	in.Service.Annotations = map[string]string{AnnotationExportTo: "."}
	r = Compute(in)
	if routes, problems := MeshRoutes(r, in.Optimizer); len(routes) != 0 || len(problems) != 1 || problems[0].Reason != "GatewayAPIRouteNotScoped" {
		t.Errorf("a private Service got routes %d, problems %+v", len(routes), problems)
	}
}

// TestBypassProblem: the condition names the routes and the change, and
// routes the operator retargeted do not count.
func TestBypassProblem(t *testing.T) {
	vs := gatewayVS("shop", []string{"ingress"}, dest("web", 80))
	g := GatewayVirtualService(webTarget, vs)
	p := BypassProblem([]GatewayRoute{*g})
	if p == nil || p.Reason != ReasonGatewayRoutesBypassWeights || !strings.Contains(p.Message, g.Change()) {
		t.Fatalf("problem %+v", p)
	}
	done := *g
	done.Destinations = []Destination{{Where: "x", Retargeted: true}}
	if BypassProblem([]GatewayRoute{done}) != nil {
		t.Error("a retargeted route still bypasses")
	}
	st, n := GatewayRouteStatus([]GatewayRoute{*g, done}, 20)
	if n != 1 || len(st) != 2 {
		t.Errorf("status %+v bypassing %d", st, n)
	}
	_ = corev1.ProtocolTCP
}

// TestStaleRetarget: a route the operator retargeted reads as stale when
// the optimized host or the optimized ports changed since, so the edit is
// undone before it is made again; one of another Service is not ours.
func TestStaleRetarget(t *testing.T) {
	vs := gatewayVS("shop", []string{"ingress"}, dest("web", 80))
	orig, _ := json.Marshal(vs)
	ops, _ := RetargetPatch(vs, vs, *GatewayVirtualService(webTarget, vs), "shop/web")
	after := &istionet.VirtualService{}
	_ = json.Unmarshal(apply(t, orig, ops), after)

	cases := map[string]struct {
		target GatewayTarget
		stale  bool
		found  bool
	}{
		"unchanged":       {target: webTarget, found: true},
		"host changed":    {target: GatewayTarget{Service: "web", Namespace: "shop", Host: "web.fast.shop.adaptive", Ports: []int32{80}}, stale: true, found: true},
		"port dropped":    {target: GatewayTarget{Service: "web", Namespace: "shop", Host: "web.shop.adaptive", Ports: []int32{81}}, stale: true, found: true},
		"another service": {target: GatewayTarget{Service: "api", Namespace: "shop", Host: "web.shop.adaptive", Ports: []int32{80}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := GatewayVirtualService(tc.target, after)
			if (g != nil) != tc.found {
				t.Fatalf("found %v, want %v", g != nil, tc.found)
			}
			if g == nil {
				return
			}
			if g.Stale() != tc.stale || g.Bypasses() != tc.stale {
				t.Errorf("stale %v bypasses %v, want %v: %s", g.Stale(), g.Bypasses(), tc.stale, g.Change())
			}
		})
	}
}

// FuzzRetargetRestore: for any destination hosts and ports, retargeting
// then restoring gives back the route's spec exactly, and the patches only
// touch destination hosts and the record.
func FuzzRetargetRestore(f *testing.F) {
	f.Add("web", uint32(80), "other", uint32(0), "web.shop.svc.cluster.local", uint32(80))
	f.Add("web.shop", uint32(0), "web", uint32(9090), "x", uint32(1))
	f.Fuzz(func(t *testing.T, h1 string, p1 uint32, h2 string, p2 uint32, h3 string, p3 uint32) {
		if !utf8.ValidString(h1) || !utf8.ValidString(h2) || !utf8.ValidString(h3) {
			return // not an input: the API server holds only UTF-8 strings
		}
		vs := gatewayVS("shop", []string{"ingress"}, dest(h1, p1), dest(h2, p2), dest(h3, p3))
		orig, err := json.Marshal(vs)
		if err != nil {
			return // not an input: a route that cannot be encoded cannot be stored
		}
		g := GatewayVirtualService(webTarget, vs)
		if g == nil {
			return
		}
		ops, err := RetargetPatch(vs, vs, *g, "shop/web")
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range ops {
			if op.Op != "test" && !strings.HasSuffix(op.Path, "/destination/host") && !strings.HasPrefix(op.Path, "/metadata/annotations") {
				t.Fatalf("patch touches %s", op.Path)
			}
		}
		if ops == nil {
			return
		}
		patched := apply(t, orig, ops)
		after := &istionet.VirtualService{}
		if err := json.Unmarshal(patched, after); err != nil {
			t.Fatal(err)
		}
		rops, err := RestorePatch(after, after, "shop/web")
		if err != nil {
			t.Fatal(err)
		}
		restored := &istionet.VirtualService{}
		if err := json.Unmarshal(apply(t, patched, rops), restored); err != nil {
			t.Fatal(err)
		}
		if !equalJSON(t, restored.Spec.Http, vs.Spec.Http) || len(restored.Annotations) != 0 {
			t.Errorf("restored %s, want %s", mustJSON(restored.Spec.Http), mustJSON(vs.Spec.Http))
		}
	})
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// TestFromRoutesKeepEachRulesBackends: the typed HTTP and gRPC routes reduce
// to the same APIRoute, one slice of backendRefs per rule (filters dropped,
// a rule without backends kept as an empty one).
func TestFromRoutesKeepEachRulesBackends(t *testing.T) {
	web := gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: "web", Port: port(80)}, Weight: ptrOf(int32(3))}
	other := gwv1.BackendRef{BackendObjectReference: gwv1.BackendObjectReference{Name: "other", Port: port(81)}}
	h := &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "r"}}
	h.Spec.ParentRefs = []gwv1.ParentReference{gatewayParent}
	h.Spec.Rules = []gwv1.HTTPRouteRule{
		{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: web, Filters: []gwv1.HTTPRouteFilter{{Type: gwv1.HTTPRouteFilterRequestHeaderModifier}}}, {BackendRef: other}}},
		{},
		{BackendRefs: []gwv1.HTTPBackendRef{{BackendRef: other}}},
	}
	g := &gwv1.GRPCRoute{ObjectMeta: h.ObjectMeta}
	g.Spec.ParentRefs = h.Spec.ParentRefs
	g.Spec.Rules = []gwv1.GRPCRouteRule{
		{BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: web, Filters: []gwv1.GRPCRouteFilter{{Type: gwv1.GRPCRouteFilterRequestHeaderModifier}}}, {BackendRef: other}}},
		{},
		{BackendRefs: []gwv1.GRPCBackendRef{{BackendRef: other}}},
	}
	want := [][]gwv1.BackendRef{{web, other}, nil, {other}}
	for _, a := range []APIRoute{FromHTTPRoute(h), FromGRPCRoute(g)} {
		if len(a.Backends) != len(want) {
			t.Fatalf("%s: %d rules, want %d", a.Kind, len(a.Backends), len(want))
		}
		for i := range want {
			if !slices.EqualFunc(a.Backends[i], want[i], func(x, y gwv1.BackendRef) bool {
				return x.Name == y.Name && *x.Port == *y.Port && (x.Weight == nil) == (y.Weight == nil)
			}) {
				t.Errorf("%s rule %d: %+v, want %+v", a.Kind, i, a.Backends[i], want[i])
			}
		}
		if a.Namespace != "shop" || a.Name != "r" || len(a.Parents) != 1 {
			t.Errorf("%s: %s/%s parents %v", a.Kind, a.Namespace, a.Name, a.Parents)
		}
	}
	if FromHTTPRoute(h).Kind != optv1.GatewayRouteHTTPRoute || FromGRPCRoute(g).Kind != optv1.GatewayRouteGRPCRoute {
		t.Error("kinds not kept")
	}
}
