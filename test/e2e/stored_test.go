package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// storedObject is an optimizer written past admission and what the manager
// must make of it.
type storedObject struct {
	name   string         // namespace and optimizer name
	spec   map[string]any // the whole stored spec
	status map[string]any // a stored status, if any
	// stalled: Stalled/InvalidSpec naming field, nothing written, counted in
	// optimizer_invalid_objects. Otherwise it converges (Ready) and, when
	// degraded is set, says so in Degraded with that reason.
	stalled  bool
	field    string
	degraded string
}

// storedObjects covers what a stored optimizer can hold that the current
// CRD refuses. The CRD has one version (v1alpha1) and no conversion; an
// object from an older release of it is one without the fields added since
// (the seed's shape), which must converge with the defaults.
func storedObjects() []storedObject {
	ports := []any{map[string]any{"number": int64(80)}}
	return []storedObject{
		// Wrong types.
		{name: "int-as-string", spec: map[string]any{"service_name": "web", "optimization": map[string]any{"dead_band_percent": "90"}}, stalled: true, field: "spec.optimization.dead_band_percent"},
		{name: "port-as-string", spec: map[string]any{"service_name": "web", "service_ports": []any{map[string]any{"number": "80"}}}, stalled: true, field: "spec.service_ports[0].number"},
		{name: "bool-as-string", spec: map[string]any{"service_name": "web", "dry_run": "yes", "service_ports": ports}, stalled: true, field: "spec.dry_run"},
		{name: "ports-as-object", spec: map[string]any{"service_name": "web", "service_ports": map[string]any{"number": int64(80)}}, stalled: true, field: "spec.service_ports"},
		// Beyond the Go type's range.
		{name: "port-overflow", spec: map[string]any{"service_name": "web", "service_ports": []any{map[string]any{"number": int64(99999999999)}}}, stalled: true, field: "spec.service_ports[0].number"},
		// Within the type, out of the CRD's range: the defaults are used.
		{name: "dead-band-90", spec: map[string]any{"service_name": "web", "service_ports": ports, "optimization": map[string]any{"dead_band_percent": int64(90)}}, degraded: "InvalidOptimization"},
		// A field the type does not have (the API server prunes it on read
		// under the structural schema, so the manager never sees it).
		{name: "unknown-field", spec: map[string]any{"service_name": "web", "service_ports": ports, "deadband": int64(5)}},
		// A status of the wrong shape: the operator's own, rewritten.
		{name: "status-garbage", spec: map[string]any{"service_name": "web", "service_ports": ports},
			status: map[string]any{"endpoints": "many", "weights": []any{map[string]any{"pod": "p", "address": "a", "weight": int64(-1)}}, "conditions": "none"}},
		// The seed's shape: no field added since.
		{name: "seed-shape", spec: map[string]any{"service_name": "web", "locality_enabled": true, "service_ports": []any{map[string]any{"number": int64(80), "protocol": "http"}}}},
	}
}

// TestAnyStoredObjectIsSurvivable is issue 27's first point, run on the
// manager binary: optimizers holding values the CRD refuses (stored under
// a relaxed schema that keeps any value, which is then replaced by the real
// one) sit beside valid ones. The valid ones converge, optimizers created
// later are mirrored, /readyz stays ok, each bad object is reported (a
// Stalled condition naming the field, a Warning event, the metric), and a
// restarted manager does all of it again.
func TestAnyStoredObjectIsSurvivable(t *testing.T) {
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	scheme := harness.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(api.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// Relax the schema: spec and status keep whatever is written.
	real := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: crdName}, real); err != nil {
		t.Fatal(err)
	}
	realSchema := real.Spec.Versions[0].Schema.OpenAPIV3Schema.DeepCopy()
	anything := apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptrTo(true)}
	setSchema(t, c, func(s *apiextensionsv1.JSONSchemaProps) {
		s.Properties["spec"], s.Properties["status"] = anything, anything
		s.Required = nil
	})
	probe := storedOptimizer("default", storedObjects()[0])
	harness.Eventually(t, 30*time.Second, "the relaxed CRD accepts dead_band_percent: \"90\"", func() error {
		return c.Create(ctx, probe)
	})
	_ = c.Delete(ctx, probe)
	stored := storedObjects()
	for _, b := range stored {
		mustApply(t, c, Namespace(b.name))
		mustApply(t, c, service(b.name)...)
		u := storedOptimizer(b.name, b)
		if err := c.Create(ctx, u); err != nil {
			t.Fatalf("%s: store under the relaxed CRD: %v", b.name, err)
		}
		if b.status != nil {
			u.Object["status"] = b.status
			if err := c.Status().Update(ctx, u); err != nil {
				t.Fatalf("%s: store the status: %v", b.name, err)
			}
		}
	}
	setSchema(t, c, func(s *apiextensionsv1.JSONSchemaProps) { *s = *realSchema.DeepCopy() })
	harness.Eventually(t, 30*time.Second, "the real CRD is back", func() error {
		if err := c.Create(ctx, probe); !apierrors.IsInvalid(err) {
			_ = c.Delete(ctx, probe)
			return fmt.Errorf("dead_band_percent: \"90\" accepted again (%v)", err)
		}
		return nil
	})

	valid := []string{"valid-a", "valid-b"}
	for _, ns := range valid {
		mustApply(t, c, Namespace(ns))
		mustApply(t, c, service(ns)...)
		mustApply(t, c, Optimizer(ns, "web", "web", optv1.ServicePort{Number: 80, TargetPort: ptrIntOrString(intstr.FromInt32(8080))}))
	}

	// check is what must hold for every manager: first, then restarted.
	endpoints := map[string]int{"valid-a": 1, "valid-b": 1}
	check := func(t *testing.T, metricsAddr, probeAddr, late string) {
		for _, ns := range valid {
			waitEndpoints(t, c, ns, endpoints[ns])
			waitCondition(t, c, ns, "web", optv1.ConditionReady, "Reconciled")
		}
		for _, b := range stored {
			if !b.stalled {
				waitEndpoints(t, c, b.name, 1)
				opt := waitCondition(t, c, b.name, b.name, optv1.ConditionReady, "Reconciled")
				d := meta.FindStatusCondition(opt.Status.Conditions, optv1.ConditionDegraded)
				switch {
				case b.degraded == "" && (d == nil || d.Status != metav1.ConditionFalse):
					t.Errorf("%s: Degraded %+v, want False", b.name, d)
				case b.degraded != "" && (d == nil || d.Status != metav1.ConditionTrue || d.Reason != b.degraded):
					t.Errorf("%s: Degraded %+v, want True/%s", b.name, d, b.degraded)
				}
				continue
			}
			opt := waitCondition(t, c, b.name, b.name, optv1.ConditionStalled, controllersReasonInvalidSpec)
			if msg := meta.FindStatusCondition(opt.Status.Conditions, optv1.ConditionStalled).Message; !strings.Contains(msg, b.field) {
				t.Errorf("%s: Stalled message %q does not name %s", b.name, msg, b.field)
			}
			if !hasEvent(t, c, b.name, b.name, controllersReasonInvalidSpec) {
				t.Errorf("%s: no Warning event %s", b.name, controllersReasonInvalidSpec)
			}
			if err := c.Get(ctx, client.ObjectKey{Namespace: b.name, Name: "web-adaptive"}, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "networking.istio.io/v1alpha3", "kind": "ServiceEntry"}}); !apierrors.IsNotFound(err) {
				t.Errorf("%s: ServiceEntry written for a spec that did not decode (%v)", b.name, err)
			}
		}
		m := get(t, "http://"+metricsAddr+"/metrics")
		for _, b := range stored {
			series := fmt.Sprintf(`optimizer_invalid_objects{name=%q,namespace=%q}`, b.name, b.name)
			if got := strings.Contains(m, series); got != b.stalled {
				t.Errorf("/metrics has %s: %v, want %v", series, got, b.stalled)
			}
		}
		if strings.Contains(m, `optimizer_watch_errors_total{resource="v1alpha1.IstioAdaptiveRequestOptimizer"}`) {
			t.Errorf("the optimizer informer failed to list or watch")
		}
		if code, body := status(t, "http://"+probeAddr+"/readyz"); code != http.StatusOK {
			t.Errorf("/readyz = %d %q", code, body)
		}
		// An optimizer created now is mirrored.
		mustApply(t, c, Namespace(late))
		mustApply(t, c, service(late)...)
		mustApply(t, c, Optimizer(late, "web", "web"))
		waitEndpoints(t, c, late, 1)
	}

	metricsAddr, probeAddr, proc := startManager(t, api, "--leader-elect=false")
	check(t, metricsAddr, probeAddr, "late-first")

	// A restart changes nothing.
	if err := proc.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 15*time.Second, "the first manager stopped", func() error {
		if _, err := http.Get("http://" + probeAddr + "/readyz"); err == nil {
			return fmt.Errorf("still serving")
		}
		return nil
	})
	metricsAddr, probeAddr, _ = startManager(t, api, "--leader-elect=false")
	// A pod added while no manager ran reaches a valid optimizer.
	mustApply(t, c, Pod("valid-a", "web-1", "web", "node-1", WithContainerPort("http", 8080)))
	mustApply(t, c, EndpointSlice("valid-a", "web-new", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-1", IP(7, 2), "node-1")))
	endpoints["valid-a"] = 2
	waitEndpoints(t, c, "valid-a", 2)
	check(t, metricsAddr, probeAddr, "late-second")

	// Fixing a bad object brings it back, without a restart.
	fix := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "int-as-string", Name: "int-as-string"}, fix); err != nil {
		t.Fatal(err)
	}
	if len(fix.DecodeProblems()) != 1 || fix.Spec.Optimization != nil {
		t.Errorf("read back: problems %v, optimization %+v; want dead_band_percent alone dropped", fix.DecodeProblems(), fix.Spec.Optimization)
	}
	fix.Spec.Optimization = &optv1.Optimization{DeadBandPercent: ptrTo(int64(5))}
	if err := c.Update(ctx, fix); err != nil {
		t.Fatalf("fix dead_band_percent: %v", err)
	}
	waitEndpoints(t, c, "int-as-string", 1)
	harness.Eventually(t, 30*time.Second, "the fixed optimizer leaves optimizer_invalid_objects", func() error {
		if m := get(t, "http://"+metricsAddr+"/metrics"); strings.Contains(m, `optimizer_invalid_objects{name="int-as-string"`) {
			return fmt.Errorf("still counted")
		}
		return nil
	})
}

func storedOptimizer(ns string, b storedObject) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": optv1.GroupVersion.String(),
		"kind":       "IstioAdaptiveRequestOptimizer",
		"metadata":   map[string]any{"namespace": ns, "name": b.name},
		"spec":       b.spec,
	}}
}

// hasEvent says whether a Warning event of reason is recorded about the
// optimizer ns/name.
func hasEvent(t *testing.T, c client.Client, ns, name, reason string) bool {
	t.Helper()
	found := false
	_ = harness.Poll(30*time.Second, 200*time.Millisecond, func() error {
		evs := &eventsv1.EventList{}
		if err := c.List(context.Background(), evs, client.InNamespace(ns)); err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Regarding.Name == name && e.Reason == reason && e.Type == "Warning" {
				found = true
				return nil
			}
		}
		return fmt.Errorf("no event")
	})
	return found
}

func status(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b := make([]byte, 4096)
	n, _ := resp.Body.Read(b)
	return resp.StatusCode, string(b[:n])
}

func ptrTo[T any](v T) *T { return &v }
