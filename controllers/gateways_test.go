package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/durationpb"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// ingressVS is a user's VirtualService bound to an ingress gateway whose
// second http route sends /api to the Service (short name, port 80).
func ingressVS(ns string) *istionet.VirtualService {
	vs := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-ingress", Labels: map[string]string{"team": "shop"}}}
	vs.Spec.Hosts = []string{"shop.example.com"}
	vs.Spec.Gateways = []string{"istio-system/ingress"}
	vs.Spec.Http = []*networking.HTTPRoute{
		{Name: "static", Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "static.other.svc.cluster.local", Port: &networking.PortSelector{Number: 80}}}}},
		{Name: "api", Timeout: durationpb.New(7e9), Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "web", Port: &networking.PortSelector{Number: 80}}}}},
	}
	return vs
}

func getOptimizer(t *testing.T, ns, name string) *optv1.IstioAdaptiveRequestOptimizer {
	t.Helper()
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, o); err != nil {
		t.Fatal(err)
	}
	return o
}

// updateOpt changes the optimizer's spec, retrying when the operator wrote
// it (status, finalizer) in between.
func updateOpt(t *testing.T, ns, name string, mutate func(*optv1.IstioAdaptiveRequestOptimizer)) *optv1.IstioAdaptiveRequestOptimizer {
	t.Helper()
	var o *optv1.IstioAdaptiveRequestOptimizer
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o = getOptimizer(t, ns, name)
		mutate(o)
		return k8s.Update(context.Background(), o)
	})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func degradedReasons(o *optv1.IstioAdaptiveRequestOptimizer) string {
	c := meta.FindStatusCondition(o.Status.Conditions, optv1.ConditionDegraded)
	if c == nil || c.Status != metav1.ConditionTrue {
		return ""
	}
	return c.Reason + ": " + c.Message
}

// TestGatewayVirtualServiceReportedRetargetedAndRestored: a gateway's
// VirtualService to the Service is named in status with the exact change
// and a Degraded condition; listed in gateway_routes, only its destination
// host is changed (the user's labels, timeout and other route stay) with a
// record; unlisted, and again on deletion of the optimizer, the original
// destination comes back.
func TestGatewayVirtualServiceReportedRetargetedAndRestored(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(40, 1), "node-a-"+ns), Ready("web-1", IP(40, 2), "node-b-"+ns))
	mustCreate(t, ingressVS(ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	host := "web." + ns + ".adaptive"

	want := fmt.Sprintf("VirtualService %s/web-ingress http route 1 destination 0 web:80 → %s:80", ns, host)
	eventually(t, waitFor, "the gateway route in status", func() error {
		o := getOptimizer(t, ns, "web")
		if len(o.Status.GatewayRoutes) != 1 || o.Status.GatewayRoutes[0].Change != want || o.Status.GatewayRoutes[0].Retargeted {
			return fmt.Errorf("gatewayRoutes %+v", o.Status.GatewayRoutes)
		}
		if d := degradedReasons(o); !strings.Contains(d, "gateway route(s) send the Service's traffic to its Kubernetes host") || !strings.Contains(d, want) {
			return fmt.Errorf("degraded %q", d)
		}
		return nil
	})
	if h := getVS(t, ns, "web-ingress").Spec.Http[1].Route[0].Destination.Host; h != "web" {
		t.Fatalf("an unlisted gateway route was changed to %q", h)
	}

	setRoutes := func(routes ...optv1.GatewayRoute) {
		t.Helper()
		updateOpt(t, ns, "web", func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.GatewayRoutes = routes })
	}
	setRoutes(optv1.GatewayRoute{Kind: optv1.GatewayRouteVirtualService, Name: "web-ingress"})
	eventually(t, waitFor, "the listed route retargeted", func() error {
		vs := getVS(t, ns, "web-ingress")
		if h := vs.Spec.Http[1].Route[0].Destination.Host; h != host {
			return fmt.Errorf("destination %q", h)
		}
		if vs.Spec.Http[0].Route[0].Destination.Host != "static.other.svc.cluster.local" || vs.Spec.Http[1].Timeout.AsDuration().Seconds() != 7 || vs.Labels["team"] != "shop" {
			return fmt.Errorf("the user's fields changed: %v", vs.Spec.Http)
		}
		if vs.Annotations[desired.AnnotationRetargeted] == "" {
			return fmt.Errorf("no record of the original host")
		}
		o := getOptimizer(t, ns, "web")
		if len(o.Status.GatewayRoutes) != 1 || !o.Status.GatewayRoutes[0].Retargeted {
			return fmt.Errorf("gatewayRoutes %+v", o.Status.GatewayRoutes)
		}
		if d := degradedReasons(o); strings.Contains(d, "past the weights") {
			return fmt.Errorf("still reported as a bypass: %s", d)
		}
		return nil
	})

	setRoutes()
	eventually(t, waitFor, "the unlisted route restored", func() error {
		vs := getVS(t, ns, "web-ingress")
		if h := vs.Spec.Http[1].Route[0].Destination.Host; h != "web" {
			return fmt.Errorf("destination %q", h)
		}
		if _, ok := vs.Annotations[desired.AnnotationRetargeted]; ok {
			return fmt.Errorf("record left behind")
		}
		return nil
	})

	setRoutes(optv1.GatewayRoute{Kind: optv1.GatewayRouteVirtualService, Name: "web-ingress", Namespace: ns})
	eventually(t, waitFor, "retargeted again", func() error {
		if h := getVS(t, ns, "web-ingress").Spec.Http[1].Route[0].Destination.Host; h != host {
			return fmt.Errorf("destination %q", h)
		}
		return nil
	})
	if err := k8s.Delete(context.Background(), getOptimizer(t, ns, "web")); err != nil {
		t.Fatal(err)
	}
	eventually(t, waitFor, "restored on deletion", func() error {
		vs := getVS(t, ns, "web-ingress")
		if h := vs.Spec.Http[1].Route[0].Destination.Host; h != "web" {
			return fmt.Errorf("destination %q", h)
		}
		if _, ok := vs.Annotations[desired.AnnotationRetargeted]; ok {
			return fmt.Errorf("record left behind")
		}
		return nil
	})
}

// TestGatewayRouteInAnotherNamespaceNeedsTheGate: a listed route outside
// the optimizer's namespace is not edited without the administrator's
// cross-namespace opt-in, and the condition says so.
func TestGatewayRouteInAnotherNamespaceNeedsTheGate(t *testing.T) {
	ns := newNamespace(t)
	edge := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(41, 1), "node-a-"+ns))
	vs := ingressVS(edge)
	vs.Spec.Http[1].Route[0].Destination.Host = "web." + ns + ".svc.cluster.local"
	mustCreate(t, vs)
	opt := Optimizer(ns, "web", "web")
	opt.Spec.GatewayRoutes = []optv1.GatewayRoute{{Kind: optv1.GatewayRouteVirtualService, Name: "web-ingress", Namespace: edge}}
	mustCreate(t, opt)
	eventually(t, waitFor, "the refusal in status", func() error {
		d := degradedReasons(getOptimizer(t, ns, "web"))
		if !strings.Contains(d, "VirtualService "+edge+"/web-ingress is in another namespace than the optimizer") {
			return fmt.Errorf("degraded %q", d)
		}
		return nil
	})
	if h := getVS(t, edge, "web-ingress").Spec.Http[1].Route[0].Destination.Host; h != "web."+ns+".svc.cluster.local" {
		t.Errorf("a route of another namespace was changed to %q", h)
	}
}

// TestGatewayAPIRoutingWithoutTheCRDs: this suite's API server has no
// Gateway API CRDs; the manager runs, and routing_mode gateway_api says
// what is missing while the ServiceEntry is still written.
func TestGatewayAPIRoutingWithoutTheCRDs(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(42, 1), "node-a-"+ns))
	opt := Optimizer(ns, "web", "web")
	opt.Spec.RoutingMode = optv1.RoutingGatewayAPI
	mustCreate(t, opt)
	mustEventuallySE(t, ns, wantAddrs(IP(42, 1)))
	eventually(t, waitFor, "the missing CRDs in status", func() error {
		o := getOptimizer(t, ns, "web")
		if d := degradedReasons(o); !strings.Contains(d, "routing_mode gateway_api needs the Gateway API CRDs") {
			return fmt.Errorf("degraded %q", d)
		}
		if o.Status.OwnedObjects.VirtualService != "" {
			return fmt.Errorf("a VirtualService is owned in gateway_api mode: %+v", o.Status.OwnedObjects)
		}
		return nil
	})
}

// TestRetargetedRouteFollowsTheHost: when the optimized host changes, a
// retargeted gateway route is restored and retargeted to the new host, so
// it never keeps leading to a host that is gone.
func TestRetargetedRouteFollowsTheHost(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(43, 1), "node-a-"+ns))
	mustCreate(t, ingressVS(ns))
	opt := Optimizer(ns, "web", "web")
	opt.Spec.GatewayRoutes = []optv1.GatewayRoute{{Kind: optv1.GatewayRouteVirtualService, Name: "web-ingress"}}
	mustCreate(t, opt)
	eventually(t, waitFor, "retargeted", func() error {
		if h := getVS(t, ns, "web-ingress").Spec.Http[1].Route[0].Destination.Host; h != "web."+ns+".adaptive" {
			return fmt.Errorf("destination %q", h)
		}
		return nil
	})
	o := updateOpt(t, ns, "web", func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.Host = "web2." + ns + ".adaptive" })
	eventually(t, waitFor, "retargeted to the new host", func() error {
		vs := getVS(t, ns, "web-ingress")
		if h := vs.Spec.Http[1].Route[0].Destination.Host; h != o.Spec.Host {
			return fmt.Errorf("destination %q", h)
		}
		if n := strings.Count(vs.Annotations[desired.AnnotationRetargeted], `"path"`); n != 1 {
			return fmt.Errorf("%d records: %s", n, vs.Annotations[desired.AnnotationRetargeted])
		}
		return nil
	})
	if err := k8s.Delete(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	eventually(t, waitFor, "restored to the Service", func() error {
		if h := getVS(t, ns, "web-ingress").Spec.Http[1].Route[0].Destination.Host; h != "web" {
			return fmt.Errorf("destination %q", h)
		}
		return nil
	})
}
