package controllers_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// update re-reads obj, mutates it and writes it back, retrying on conflicts,
// as another client of the API (a user, kubectl) would.
func update[T client.Object](t *testing.T, obj T, mutate func(T)) {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8s.Get(context.Background(), key, obj); err != nil {
			return err
		}
		mutate(obj)
		return k8s.Update(context.Background(), obj)
	})
	if err != nil {
		t.Fatalf("update %T %s: %v", obj, key, err)
	}
}

func optKey(ns, name string) *optv1.IstioAdaptiveRequestOptimizer {
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	o.Namespace, o.Name = ns, name
	return o
}

// eventuallySE waits until ServiceEntry ns/name satisfies check.
func eventuallySE(t *testing.T, ns, name string, check func(seT) error) seT {
	t.Helper()
	var se seT
	eventually(t, waitFor, "ServiceEntry "+ns+"/"+name, func() error {
		var err error
		if se, err = getSE(ns, name); err != nil {
			return err
		}
		return check(se)
	})
	return se
}

// waitCondition waits until condition typ of optimizer ns/name is
// "<status>/<reason>" for the optimizer's current generation.
func waitCondition(t *testing.T, ns, name, typ, want string) *optv1.IstioAdaptiveRequestOptimizer {
	t.Helper()
	var o *optv1.IstioAdaptiveRequestOptimizer
	eventually(t, waitFor, fmt.Sprintf("%s %s on optimizer %s/%s", typ, want, ns, name), func() error {
		var err error
		if o, err = getOpt(ns, name); err != nil {
			return err
		}
		if o.Status.ObservedGeneration != o.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", o.Status.ObservedGeneration, o.Generation)
		}
		if got := condition(o, typ); got != want {
			return fmt.Errorf("%s is %s: %v", typ, got, o.Status.Conditions)
		}
		return nil
	})
	return o
}

func conditionMessage(o *optv1.IstioAdaptiveRequestOptimizer, typ string) string {
	if c := meta.FindStatusCondition(o.Status.Conditions, typ); c != nil {
		return c.Message
	}
	return ""
}

// waitGone waits until obj no longer exists.
func waitGone(t *testing.T, obj client.Object) {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	eventually(t, waitFor, fmt.Sprintf("%T %s deleted", obj, key), func() error {
		err := k8s.Get(context.Background(), key, obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there (finalizers %v)", obj.GetFinalizers())
	})
}

func named(obj client.Object, ns, name string) client.Object {
	obj.SetNamespace(ns)
	obj.SetName(name)
	return obj
}

func mustNotExist(t *testing.T, obj client.Object) {
	t.Helper()
	err := k8s.Get(context.Background(), client.ObjectKeyFromObject(obj), obj)
	if !apierrors.IsNotFound(err) {
		t.Fatalf("%T %s/%s exists (err %v)", obj, obj.GetNamespace(), obj.GetName(), err)
	}
}

func seWith(ports map[uint32]string) func(seT) error {
	return func(se seT) error {
		got := map[uint32]string{}
		for _, p := range se.Spec.Ports {
			got[p.Number] = fmt.Sprintf("%s/%d %s", p.Protocol, p.TargetPort, p.Name)
		}
		if fmt.Sprint(got) != fmt.Sprint(ports) {
			return fmt.Errorf("ports %v, want %v", got, ports)
		}
		return nil
	}
}

// reconciles is the number of reconciles the mirror controller has finished,
// from controller-runtime's own metric.
func reconciles(t *testing.T) float64 {
	t.Helper()
	families, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "optimizer.mirror" {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// writes is the number of applies of owned objects the operator counted for
// Service ns/web (optimizer_writes_total). A server-side apply of identical
// content does not bump the resourceVersion, so this also catches writes
// the API server turned into no-ops.
func writes(t *testing.T, ns string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(testMetrics.Writes); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["service_namespace"] == ns && labels["service_name"] == "web" {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

func TestServicePortChangeReachesServiceEntryAndVirtualService(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(10, 1), "node-a-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	mustEventuallySE(t, ns, seWith(map[uint32]string{80: "HTTP/8080 http-80", 9090: "GRPC/9090 grpc-9090", 5432: "TCP/5432 tcp-5432"}))

	svc := &corev1.Service{}
	svc.Namespace, svc.Name = ns, "web"
	update(t, svc, func(s *corev1.Service) { s.Spec.Ports[0].Port = 8081 })

	mustEventuallySE(t, ns, seWith(map[uint32]string{8081: "HTTP/8080 http-8081", 9090: "GRPC/9090 grpc-9090", 5432: "TCP/5432 tcp-5432"}))
	eventually(t, waitFor, "VirtualService routes port 8081", func() error {
		vs := getVS(t, ns, "web-adaptive")
		var routes []string
		for _, h := range vs.Spec.Http {
			routes = append(routes, fmt.Sprintf("%d->%s:%d", h.Match[0].Port, h.Route[0].Destination.Host, h.Route[0].Destination.Port.GetNumber()))
		}
		want := fmt.Sprintf("8081->web.%s.adaptive:8081,9090->web.%[1]s.adaptive:9090", ns)
		if got := strings.Join(routes, ","); got != want {
			return fmt.Errorf("http routes %s, want %s", got, want)
		}
		return nil
	})
}

func TestNamedTargetPortResolvedFromEndpointSlice(t *testing.T) {
	ns := newNamespace(t)
	// The pods declare no container ports: only the EndpointSlices know
	// what the name "web-http" resolves to, and it differs between them.
	mustCreate(t,
		Service(ns, "web", ServicePort("http", 80, intstr.FromString("web-http"))),
		Pod(ns, "web-0", "web", ""), Pod(ns, "web-1", "web", ""),
		EndpointSlice(ns, "web-a", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-0", IP(11, 1), "")),
		EndpointSlice(ns, "web-b", "web", []SlicePort{{Name: "http", Port: 8081}}, Ready("web-1", IP(11, 2), "")),
		Optimizer(ns, "web", "web"),
	)
	se := mustEventuallySE(t, ns, seWith(map[uint32]string{80: "HTTP/8080 http-80"}))
	ports := map[string]string{}
	for _, e := range se.Spec.Endpoints {
		ports[e.Address] = fmt.Sprint(e.Ports)
	}
	want := map[string]string{IP(11, 1): "map[]", IP(11, 2): "map[http-80:8081]"}
	if fmt.Sprint(ports) != fmt.Sprint(want) {
		t.Errorf("per-endpoint ports %v, want %v", ports, want)
	}
	waitCondition(t, ns, "web", "Ready", "True/Reconciled")
}

func TestLocalityEnabledSetsLocalityLoadBalancing(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(12, 1), "node-a-"+ns), Ready("web-1", IP(12, 2), "node-b-"+ns))
	opt := Optimizer(ns, "web", "web")
	opt.Spec.LocalityEnabled = true
	mustCreate(t, opt)

	eventually(t, waitFor, "DestinationRule with locality load balancing", func() error {
		dr := getDR(t, ns, "web-adaptive")
		tp := dr.Spec.GetTrafficPolicy()
		if tp.GetLoadBalancer().GetSimple() != networking.LoadBalancerSettings_LEAST_REQUEST { // no metrics backend: never learned
			return fmt.Errorf("load balancer %v", tp.GetLoadBalancer())
		}
		if !tp.GetLoadBalancer().GetLocalityLbSetting().GetEnabled().GetValue() {
			return fmt.Errorf("localityLbSetting %v", tp.GetLoadBalancer().GetLocalityLbSetting())
		}
		if od := tp.GetOutlierDetection(); od == nil || od.GetConsecutive_5XxErrors().GetValue() == 0 || od.GetBaseEjectionTime() == nil {
			return fmt.Errorf("outlierDetection %v", od)
		}
		return nil
	})
	mustEventuallySE(t, ns, func(se seT) error {
		loc := map[string]string{}
		for _, e := range se.Spec.Endpoints {
			loc[e.Address] = e.Locality
		}
		want := map[string]string{IP(12, 1): "eu-west/eu-west-a/rack1", IP(12, 2): "eu-west/eu-west-b"}
		if fmt.Sprint(loc) != fmt.Sprint(want) {
			return fmt.Errorf("localities %v, want %v", loc, want)
		}
		return nil
	})

	// Turning it off removes both again (server-side apply drops fields the
	// operator no longer sends).
	update(t, optKey(ns, "web"), func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.LocalityEnabled = false })
	eventually(t, waitFor, "DestinationRule without locality load balancing", func() error {
		dr := getDR(t, ns, "web-adaptive")
		tp := dr.Spec.GetTrafficPolicy()
		if tp.GetLoadBalancer().GetLocalityLbSetting() != nil || tp.GetOutlierDetection() != nil {
			return fmt.Errorf("traffic policy %v", tp)
		}
		if tp.GetLoadBalancer().GetSimple() != networking.LoadBalancerSettings_LEAST_REQUEST { // no metrics backend: never learned
			return fmt.Errorf("load balancer %v", tp.GetLoadBalancer())
		}
		return nil
	})
}

// The seed's example resource, applied exactly as users have it, works.
func TestSeedSampleResource(t *testing.T) {
	const ns = "default"
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "samples", "optimization_v1alpha1_istioadaptiverequestoptimizer.yaml"))
	if err != nil {
		t.Fatalf("read the sample: %v", err)
	}
	// Every field of the sample is a field of the API (no typo, no drift).
	var typed optv1.IstioAdaptiveRequestOptimizer
	if err := yaml.UnmarshalStrict(data, &typed); err != nil {
		t.Fatalf("the sample does not decode strictly into the API type: %v", err)
	}
	sample := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &sample.Object); err != nil {
		t.Fatal(err)
	}
	if sample.GetName() != "myapp-optimizer" || sample.GetAPIVersion() != "optimization.liorfranko.github.io/v1alpha1" {
		t.Fatalf("unexpected sample %s %s", sample.GetAPIVersion(), sample.GetName())
	}
	sample.SetNamespace(ns) // as `kubectl apply -n default -f` does

	nodeName := "node-sample-" + fmt.Sprint(time.Now().UnixNano()%100000)
	svc := Service(ns, "myapp-service",
		ServicePort("http", 8080, intstr.FromInt32(8080)),
		ServicePort("grpc", 9090, intstr.FromInt32(9090)),
	)
	pod := Pod(ns, "myapp-0", "myapp-service", nodeName, WithSidecar(), WithServiceAccount("myapp"))
	slice := EndpointSlice(ns, "myapp-service-1", "myapp-service", []SlicePort{{Name: "http", Port: 8080}, {Name: "grpc", Port: 9090}},
		Ready("myapp-0", IP(13, 1), nodeName))
	node := Node(nodeName, "us-east-1", "us-east-1a", "", "c7g.large")
	mustCreate(t, node, svc, pod, slice)
	t.Cleanup(func() {
		ctx := context.Background()
		o := optKey(ns, "myapp-optimizer")
		if err := k8s.Delete(ctx, o); err == nil || !apierrors.IsNotFound(err) {
			waitGone(t, o)
		}
		// Grace period 0: without a kubelet a pod would stay terminating.
		for _, obj := range []client.Object{slice, pod, svc, node} {
			if err := k8s.Delete(ctx, obj, client.GracePeriodSeconds(0)); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("clean up %T %s: %v", obj, obj.GetName(), err)
			}
			waitGone(t, obj)
		}
	})
	if err := k8s.Create(context.Background(), sample); err != nil {
		t.Fatalf("the sample does not apply: %v", err)
	}

	eventuallySE(t, ns, "myapp-service-adaptive", func(se seT) error {
		if err := seWith(map[uint32]string{8080: "HTTP/8080 http-8080", 9090: "GRPC/9090 grpc-9090"})(se); err != nil {
			return err
		}
		if len(se.Spec.Endpoints) != 1 || se.Spec.Endpoints[0].Address != IP(13, 1) || se.Spec.Endpoints[0].Locality != "us-east-1/us-east-1a" {
			return fmt.Errorf("endpoints %v", se.Spec.Endpoints)
		}
		if got := se.Spec.Hosts; len(got) != 1 || got[0] != "myapp-service.default.adaptive" {
			return fmt.Errorf("hosts %v", got)
		}
		return nil
	})
	dr := getDR(t, ns, "myapp-service-adaptive")
	if !dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetLocalityLbSetting().GetEnabled().GetValue() || dr.Spec.GetTrafficPolicy().GetOutlierDetection() == nil {
		t.Errorf("locality_enabled: true did not reach the DestinationRule: %v", dr.Spec.GetTrafficPolicy())
	}
	vs := getVS(t, ns, "myapp-service-adaptive")
	if len(vs.Spec.Http) != 2 || vs.Spec.Hosts[0] != "myapp-service.default.svc.cluster.local" {
		t.Errorf("VirtualService %v", &vs.Spec)
	}
	waitCondition(t, ns, "myapp-optimizer", "Ready", "True/Reconciled")
}

// A VirtualService for the host in another namespace, exported only
// there, takes the host for that namespace's clients alone: the operator
// still writes its own for everyone else and says which clients keep
// their route. Counted as a conflict, one team's private route turned the
// optimization off for every namespace.
func TestVirtualServiceOfNarrowerReachKeepsOurs(t *testing.T) {
	ns, team := newNamespace(t), newNamespace(t)
	webService(t, ns, Ready("web-0", IP(14, 2), "node-a-"+ns))
	user := &istionet.VirtualService{}
	user.Namespace, user.Name = team, "web-own"
	user.Spec.Hosts = []string{"web." + ns + ".svc.cluster.local"}
	user.Spec.ExportTo = []string{"."}
	user.Spec.Http = []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "web." + ns + ".svc.cluster.local"}}}}}
	mustCreate(t, user)

	mustCreate(t, Optimizer(ns, "web", "web"))
	o := waitCondition(t, ns, "web", "Degraded", "True/VirtualServiceOfNarrowerReach")
	if msg := conditionMessage(o, "Degraded"); !strings.Contains(msg, team+"/web-own (clients in "+team+")") || !strings.Contains(msg, "web."+ns+".adaptive") {
		t.Errorf("Degraded message %q does not name the VirtualService, its namespace and the optimized host", msg)
	}
	getVS(t, ns, "web-adaptive")
	if condition(o, "Ready") != "True/Reconciled" {
		t.Errorf("Ready = %s", condition(o, "Ready"))
	}
	// Exported everywhere, it is a conflict again.
	live := &istionet.VirtualService{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(user), live); err != nil {
		t.Fatal(err)
	}
	live.Spec.ExportTo = []string{"*"}
	if err := k8s.Update(context.Background(), live); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "web", "Degraded", "True/VirtualServiceConflict")
}

// Where the Service itself is exported to its own namespace only, so is
// the operator's VirtualService, and a private one of a user's there is
// ordered against it by age: a conflict, as before.
func TestVirtualServiceOfNarrowerReachBesideAPrivateService(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(14, 3), "node-a-"+ns))
	svc := &corev1.Service{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web"}, svc); err != nil {
		t.Fatal(err)
	}
	svc.Annotations = map[string]string{desired.AnnotationExportTo: "."}
	if err := k8s.Update(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	user := &istionet.VirtualService{}
	user.Namespace, user.Name = ns, "web-own"
	user.Spec.Hosts = []string{"web"}
	user.Spec.ExportTo = []string{"."}
	user.Spec.Http = []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "web"}}}}}
	mustCreate(t, user)
	mustCreate(t, Optimizer(ns, "web", "web"))
	waitCondition(t, ns, "web", "Degraded", "True/VirtualServiceConflict")
	if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, &istionet.VirtualService{}); !apierrors.IsNotFound(err) {
		t.Errorf("the operator wrote a VirtualService beside a private one of the same reach (err %v)", err)
	}
}

func TestUserVirtualServiceIsLeftAloneWithACondition(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(14, 1), "node-a-"+ns))
	user := &istionet.VirtualService{}
	user.Namespace, user.Name = ns, "user-web"
	user.Spec.Hosts = []string{"web"} // short name: the same host in this namespace
	user.Spec.Http = []*networking.HTTPRoute{{Route: []*networking.HTTPRouteDestination{{Destination: &networking.Destination{Host: "web"}}}}}
	mustCreate(t, user)
	before := user.ResourceVersion

	mustCreate(t, Optimizer(ns, "web", "web"))
	o := waitCondition(t, ns, "web", "Degraded", "True/VirtualServiceConflict")
	msg := conditionMessage(o, "Degraded")
	if !strings.Contains(msg, ns+"/user-web") || !strings.Contains(msg, "web."+ns+".adaptive") {
		t.Errorf("Degraded message %q does not name the VirtualService and the optimized host", msg)
	}
	if o.Status.OwnedObjects.VirtualService != "" {
		t.Errorf("status claims VirtualService %q", o.Status.OwnedObjects.VirtualService)
	}
	if condition(o, "Ready") != "True/Reconciled" {
		t.Errorf("Ready = %s; the ServiceEntry and DestinationRule work without the VirtualService", condition(o, "Ready"))
	}
	mustEventuallySE(t, ns, wantAddrs(IP(14, 1)))
	getDR(t, ns, "web-adaptive")
	consistently(t, time.Second, "no VirtualService of ours, the user's unchanged", func() error {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, &istionet.VirtualService{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("our VirtualService exists (err %v)", err)
		}
		now := &istionet.VirtualService{}
		if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(user), now); err != nil {
			return err
		}
		if now.ResourceVersion != before || len(now.Labels) != 0 || len(now.ManagedFields) != 1 {
			return fmt.Errorf("user's VirtualService changed: resourceVersion %s (was %s), labels %v, managers %d", now.ResourceVersion, before, now.Labels, len(now.ManagedFields))
		}
		return nil
	})
}

func TestOutOfBandServiceEntryEditIsPutBack(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(15, 1), "node-a-"+ns), Ready("web-1", IP(15, 2), "node-b-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	want := mustEventuallySE(t, ns, wantAddrs(IP(15, 1), IP(15, 2))).Spec.DeepCopy()

	edited := named(seObj(), ns, "web-adaptive").(seT)
	update(t, edited, func(se seT) {
		se.Spec.Hosts = []string{"web.evil.example"}
		se.Spec.Endpoints[0].Weight = 7
	})
	mustEventuallySE(t, ns, func(se seT) error {
		if se.ResourceVersion == edited.ResourceVersion {
			return fmt.Errorf("still the edited version")
		}
		if got := strings.Join(se.Spec.Hosts, ","); got != "web."+ns+".adaptive" {
			return fmt.Errorf("hosts %s", got)
		}
		for _, e := range se.Spec.Endpoints {
			if e.Weight != 1000 {
				return fmt.Errorf("%s has weight %d", e.Address, e.Weight)
			}
		}
		return nil
	})
	if got := mustEventuallySE(t, ns, func(seT) error { return nil }); !proto.Equal(&got.Spec, want) {
		t.Errorf("ServiceEntry after the restore differs from before the edit:\n%v\n%v", &got.Spec, want)
	}
}

func TestDeletionRemovesOwnedObjects(t *testing.T) {
	tests := map[string]struct {
		otherNamespace bool // service_namespace differs from the optimizer's
	}{
		"same namespace":        {},
		"service_namespace set": {otherNamespace: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svcNS := newNamespace(t)
			optNS := svcNS
			webService(t, svcNS, Ready("web-0", IP(16, 1), "node-a-"+svcNS))
			opt := Optimizer(svcNS, "web", "web")
			if tc.otherNamespace {
				// Only the platform namespace may target others (suite_test.go).
				optNS = sharedNamespace(t, platformNamespace)
				opt = Optimizer(optNS, "web-"+svcNS, "web")
				opt.Spec.ServiceNamespace = svcNS
			}
			mustCreate(t, opt)
			se := mustEventuallySE(t, svcNS, wantAddrs(IP(16, 1)))
			getVS(t, svcNS, "web-adaptive")
			getDR(t, svcNS, "web-adaptive")
			if got := se.Labels["optimization.liorfranko.github.io/optimizer-namespace"]; got != optNS {
				t.Errorf("ServiceEntry names optimizer namespace %q, want %q", got, optNS)
			}
			if !tc.otherNamespace && (len(se.OwnerReferences) != 1 || se.OwnerReferences[0].UID != opt.UID) {
				t.Errorf("owner references %v, want the optimizer", se.OwnerReferences)
			}
			eventually(t, waitFor, "finalizer", func() error {
				o, err := getOpt(opt.Namespace, opt.Name)
				if err != nil {
					return err
				}
				if len(o.Finalizers) == 0 {
					return fmt.Errorf("no finalizer")
				}
				return nil
			})

			if err := k8s.Delete(context.Background(), opt); err != nil {
				t.Fatal(err)
			}
			// envtest runs no garbage collector: the finalizer alone cleans up.
			for _, obj := range []client.Object{seObj(), vsObj(), drObj()} {
				waitGone(t, named(obj, svcNS, "web-adaptive"))
			}
			waitGone(t, optKey(opt.Namespace, opt.Name))
			// The user's objects stay.
			if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: svcNS, Name: "web"}, &corev1.Service{}); err != nil {
				t.Errorf("Service: %v", err)
			}
		})
	}
}

func TestSecondOptimizerForTheSameServiceStalls(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(17, 1), "node-a-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	first := waitCondition(t, ns, "web", "Ready", "True/Reconciled")
	rv := map[string]string{}
	for kind, obj := range map[string]client.Object{"se": seObj(), "vs": vsObj(), "dr": drObj()} {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, obj); err != nil {
			t.Fatal(err)
		}
		rv[kind] = obj.GetResourceVersion()
	}

	mustCreate(t, Optimizer(ns, "web-again", "web"))
	second := waitCondition(t, ns, "web-again", "Stalled", "True/ObjectConflict")
	if msg := conditionMessage(second, "Stalled"); !strings.Contains(msg, ns+"/web") || !strings.Contains(msg, "web-adaptive") {
		t.Errorf("Stalled message %q does not name the object and the optimizer that owns it", msg)
	}
	if condition(second, "Ready") != "False/ObjectConflict" {
		t.Errorf("second Ready = %s", condition(second, "Ready"))
	}

	untouched := func() error {
		for kind, obj := range map[string]client.Object{"se": seObj(), "vs": vsObj(), "dr": drObj()} {
			if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, obj); err != nil {
				return err
			}
			if obj.GetResourceVersion() != rv[kind] || obj.GetLabels()["optimization.liorfranko.github.io/optimizer-name"] != "web" {
				return fmt.Errorf("%T rewritten: resourceVersion %s (was %s) labels %v", obj, obj.GetResourceVersion(), rv[kind], obj.GetLabels())
			}
		}
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if condition(o, "Ready") != "True/Reconciled" || o.Status.ObservedGeneration != first.Status.ObservedGeneration {
			return fmt.Errorf("first optimizer changed: %v", o.Status.Conditions)
		}
		return nil
	}
	consistently(t, 500*time.Millisecond, "first optimizer's objects untouched", untouched)

	// Deleting the second one leaves the first's objects alone.
	if err := k8s.Delete(context.Background(), optKey(ns, "web-again")); err != nil {
		t.Fatal(err)
	}
	waitGone(t, optKey(ns, "web-again"))
	if err := untouched(); err != nil {
		t.Error(err)
	}
}

func TestNoWriteWhenNothingChanged(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(18, 1), "node-a-"+ns), Ready("web-1", IP(18, 2), "node-b-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	mustEventuallySE(t, ns, wantAddrs(IP(18, 1), IP(18, 2)))
	getVS(t, ns, "web-adaptive")
	getDR(t, ns, "web-adaptive")
	waitCondition(t, ns, "web", "Ready", "True/Reconciled")

	versions := func() string {
		var out []string
		for _, obj := range []client.Object{seObj(), vsObj(), drObj()} {
			if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, obj); err != nil {
				t.Fatal(err)
			}
			out = append(out, fmt.Sprintf("%T=%s", obj, obj.GetResourceVersion()))
		}
		return strings.Join(out, " ")
	}
	before := versions()
	writesBefore := writes(t, ns)
	if writesBefore < 3 {
		t.Fatalf("%v writes counted for the first apply of the ServiceEntry, VirtualService and DestinationRule", writesBefore)
	}

	triggers := map[string]func(){
		"EndpointSlice label": func() {
			updateSlice(t, ns, "web-1", func(s *sliceT) { s.Labels["touched"] = "1" })
		},
		"Service annotation": func() {
			svc := &corev1.Service{}
			svc.Namespace, svc.Name = ns, "web"
			update(t, svc, func(s *corev1.Service) { s.Annotations = map[string]string{"touched": "1"} })
		},
		"optimizer label": func() {
			update(t, optKey(ns, "web"), func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Labels = map[string]string{"touched": "1"} })
		},
	}
	for _, what := range []string{"EndpointSlice label", "Service annotation", "optimizer label"} {
		n := reconciles(t)
		triggers[what]()
		eventually(t, waitFor, "a reconcile after touching the "+what, func() error {
			if got := reconciles(t); got <= n {
				return fmt.Errorf("%v reconciles, was %v", got, n)
			}
			return nil
		})
	}
	// Let any reconcile still queued finish, then nothing may have been written.
	time.Sleep(300 * time.Millisecond)
	if after := versions(); after != before {
		t.Errorf("owned objects were written although nothing changed:\nbefore %s\nafter  %s", before, after)
	}
	if after := writes(t, ns); after != writesBefore {
		t.Errorf("%v applies of owned objects although nothing changed", after-writesBefore)
	}
	waitCondition(t, ns, "web", "Ready", "True/Reconciled")
}

func TestCRDValidationRejectsBadInput(t *testing.T) {
	ns := newNamespace(t)
	tests := map[string]struct {
		spec map[string]any
		want string // in the API server's message
	}{
		"port 0": {
			spec: map[string]any{"service_name": "web", "service_ports": []any{map[string]any{"number": int64(0)}}},
			want: "should be greater than or equal to 1",
		},
		"port 65536": {
			spec: map[string]any{"service_name": "web", "service_ports": []any{map[string]any{"number": int64(65536)}}},
			want: "should be less than or equal to 65535",
		},
		"protocol udp": {
			spec: map[string]any{"service_name": "web", "service_ports": []any{map[string]any{"number": int64(53), "protocol": "udp"}}},
			want: `Unsupported value: "udp"`,
		},
		"duplicate port numbers": {
			spec: map[string]any{"service_name": "web", "service_ports": []any{
				map[string]any{"number": int64(80), "protocol": "http"},
				map[string]any{"number": int64(80), "protocol": "grpc"},
			}},
			want: "Duplicate value",
		},
		"missing service_name": {
			spec: map[string]any{"locality_enabled": true},
			want: "spec.service_name: Required value",
		},
		"empty service_name": {
			spec: map[string]any{"service_name": ""},
			want: "spec.service_name",
		},
		"unknown routing_mode": {
			spec: map[string]any{"service_name": "web", "routing_mode": "gateway"},
			want: `Unsupported value: "gateway"`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "optimization.liorfranko.github.io/v1alpha1",
				"kind":       "IstioAdaptiveRequestOptimizer",
				"metadata":   map[string]any{"name": "bad", "namespace": ns},
				"spec":       tc.spec,
			}}
			err := k8s.Create(context.Background(), u, client.DryRunAll)
			if err == nil {
				t.Fatalf("created: %v", tc.spec)
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want an Invalid error containing %q", err, tc.want)
			}
		})
	}
	// The shape users write is accepted.
	ok := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "optimization.liorfranko.github.io/v1alpha1",
		"kind":       "IstioAdaptiveRequestOptimizer",
		"metadata":   map[string]any{"name": "good", "namespace": ns},
		"spec": map[string]any{"service_name": "web", "service_ports": []any{
			map[string]any{"number": int64(1), "protocol": "tcp"},
			map[string]any{"number": int64(65535), "targetPort": "http"},
		}},
	}}
	if err := k8s.Create(context.Background(), ok, client.DryRunAll); err != nil {
		t.Errorf("a valid optimizer is rejected: %v", err)
	}
}

// Beyond the ServiceEntry's endpoint limit, routing a part of the pods
// would leave the others without mesh traffic: the optimizer stalls, its
// VirtualService goes, the gateway route it retargeted is put back, and
// the Kubernetes Service carries every pod again; back under the limit, it
// routes and retargets again.
func TestTooManyEndpointsLeaveTrafficOnTheService(t *testing.T) {
	ns := newNamespace(t)
	mustCreate(t, Service(ns, "web", ServicePort("http", 80, intstr.FromInt32(8080))))
	mustCreate(t, EndpointSlice(ns, "web-0", "web", []SlicePort{{Name: "http", Port: 8080}},
		Ready("web-a", IP(99, 1), ""), Ready("web-b", IP(99, 2), "")))
	mustCreate(t, ingressVS(ns))
	opt := Optimizer(ns, "web", "web")
	opt.Spec.GatewayRoutes = []optv1.GatewayRoute{{Kind: optv1.GatewayRouteVirtualService, Name: "web-ingress"}}
	mustCreate(t, opt)
	waitCondition(t, ns, "web", "Ready", "True/Reconciled")
	getVS(t, ns, "web-adaptive")
	host := "web." + ns + ".adaptive"
	gatewayTo := func(want string) func() error {
		return func() error {
			if h := getVS(t, ns, "web-ingress").Spec.Http[1].Route[0].Destination.Host; h != want {
				return fmt.Errorf("the gateway route leads to %q, want %q", h, want)
			}
			return nil
		}
	}
	eventually(t, waitFor, "the gateway route retargeted", gatewayTo(host))

	// 5 more slices of at most 1000 endpoints (the EndpointSlice limit), no pods.
	const total = 4500
	var extra []client.Object
	for s := 0; s*1000 < total; s++ {
		var eps []Endpoint
		for i := s * 1000; i < min(total, (s+1)*1000); i++ {
			eps = append(eps, Ready(fmt.Sprintf("web-%05d", i), IP(100+i/250, i%250+1), ""))
		}
		sl := EndpointSlice(ns, fmt.Sprintf("web-%d", s+1), "web", []SlicePort{{Name: "http", Port: 8080}}, eps...)
		mustCreate(t, sl)
		extra = append(extra, sl)
	}

	o := waitCondition(t, ns, "web", "Stalled", "True/TooManyEndpoints")
	if msg := conditionMessage(o, "Stalled"); !strings.Contains(msg, "4502") || !strings.Contains(msg, "4096") {
		t.Errorf("Stalled message %q does not give the count and the limit", msg)
	}
	waitGone(t, named(vsObj(), ns, "web-adaptive"))
	// The ServiceEntry is never cut to the first 4096 pods: it keeps the
	// last complete set (the slices were created one by one, so a set of
	// up to 4002 pods may have been routed on the way).
	se, err := getSE(ns, "web-adaptive")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(se.Spec.Endpoints); n >= 4096 {
		t.Errorf("ServiceEntry has %d endpoints, a part of the %d ready pods", n, total+2)
	}
	if o.Status.OwnedObjects.VirtualService != "" {
		t.Errorf("status still names VirtualService %q", o.Status.OwnedObjects.VirtualService)
	}
	eventually(t, waitFor, "the gateway route back on the Service", gatewayTo("web"))
	eventually(t, waitFor, "the status says no route is retargeted", func() error {
		for _, g := range getOptimizer(t, ns, "web").Status.GatewayRoutes {
			if g.Retargeted {
				return fmt.Errorf("status: %s/%s still retargeted", g.Namespace, g.Name)
			}
		}
		return nil
	})

	for _, sl := range extra {
		if err := k8s.Delete(context.Background(), sl); err != nil {
			t.Fatal(err)
		}
	}
	waitCondition(t, ns, "web", "Ready", "True/Reconciled")
	getVS(t, ns, "web-adaptive")
	eventually(t, waitFor, "the gateway route retargeted again", gatewayTo(host))
	if err := k8s.Delete(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	waitGone(t, o)
}

func TestRoutingModeNone(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(19, 1), "node-a-"+ns))
	opt := Optimizer(ns, "web", "web")
	opt.Spec.RoutingMode = optv1.RoutingNone
	mustCreate(t, opt)
	o := waitCondition(t, ns, "web", "Ready", "True/Reconciled")
	// Ready is written after every apply of the reconcile: by now a
	// VirtualService would exist.
	mustEventuallySE(t, ns, wantAddrs(IP(19, 1)))
	getDR(t, ns, "web-adaptive")
	mustNotExist(t, named(vsObj(), ns, "web-adaptive"))
	if o.Status.OwnedObjects.VirtualService != "" {
		t.Errorf("status names VirtualService %q with routing_mode none", o.Status.OwnedObjects.VirtualService)
	}

	// Switching to a managed VirtualService and back deletes ours again.
	update(t, optKey(ns, "web"), func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = optv1.RoutingVirtualService })
	getVS(t, ns, "web-adaptive")
	update(t, optKey(ns, "web"), func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = optv1.RoutingNone })
	waitGone(t, named(vsObj(), ns, "web-adaptive"))
	o = waitCondition(t, ns, "web", "Ready", "True/Reconciled")
	if o.Status.OwnedObjects.VirtualService != "" {
		t.Errorf("status still names VirtualService %q", o.Status.OwnedObjects.VirtualService)
	}
	mustEventuallySE(t, ns, wantAddrs(IP(19, 1)))
	getDR(t, ns, "web-adaptive")
}
