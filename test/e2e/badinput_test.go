package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"testing"
	"time"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

const crdName = "istioadaptiverequestoptimizers.optimization.liorfranko.github.io"

// badSpec is one invalid value of issue 8 (items 1 and 2), as a patch of an
// optimizer's spec.
type badSpec struct {
	name  string         // namespace and optimizer name
	spec  map[string]any // merged into spec
	field string         // what the refusal and the condition must name
}

func badSpecs() []badSpec {
	opt := func(k string, v any) map[string]any { return map[string]any{"optimization": map[string]any{k: v}} }
	port := func(v any) map[string]any {
		return map[string]any{"service_ports": []any{map[string]any{"number": int64(80), "targetPort": v}}}
	}
	return []badSpec{
		{"cycle-soon", opt("cycle", "soon"), "cycle"},
		{"window-negative", opt("query_window", "-5s"), "query_window"},
		{"slow-start-unit", opt("slow_start", "5 minutes"), "slow_start"},
		{"target-port-zero", port(int64(0)), "targetPort"},
		{"target-port-99999", port(int64(99999)), "targetPort"},
		{"target-port-bad-name", port("Bad_Name"), "targetPort"},
		{"target-port-digits", port("8080"), "targetPort"},
	}
}

// admittedButInvalid are values the API server cannot refuse without CEL
// rules whose evaluation errors would block every write of a stored object:
// the manager reports them.
func admittedButInvalid() []badSpec {
	return []badSpec{{"expiry-overflow", map[string]any{"optimization": map[string]any{"weight_expiry": "9999999999999h"}}, "weight_expiry"}}
}

// TestInvalidOptimizersCannotStopTheOperator is issue 8 items 1 and 2, run as
// a user would: the invalid values are refused at admission with a message;
// objects stored anyway (under a CRD without the validation, as a cluster
// upgraded from an older release has them) neither stop the manager binary
// from mirroring the valid optimizers nor get anything written, and each
// says why in a Stalled condition.
func TestInvalidOptimizersCannotStopTheOperator(t *testing.T) {
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	t.Cleanup(func() { _ = api.Stop() }) // after the manager's cleanup
	scheme := harness.Scheme()
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(api.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// 1. Admission refuses every invalid value with a message naming the field.
	mustApply(t, c, Namespace("admission"))
	for _, b := range badSpecs() {
		err := c.Create(ctx, badOptimizer("admission", b))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), b.field) {
			t.Errorf("%s: create = %v, want Invalid naming %s", b.name, err, b.field)
		}
	}

	// 2. Store them anyway, under the CRD of a release without validation.
	strict := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: crdName}, strict); err != nil {
		t.Fatal(err)
	}
	strictSchema := strict.Spec.Versions[0].Schema.OpenAPIV3Schema.DeepCopy()
	setSchema(t, c, func(s *apiextensionsv1.JSONSchemaProps) { stripValidation(s) })
	probe := badOptimizer("admission", badSpecs()[0])
	harness.Eventually(t, 30*time.Second, "the lax CRD accepts cycle: soon", func() error {
		return c.Create(ctx, probe)
	})
	_ = c.Delete(ctx, probe)
	stored := append(badSpecs(), admittedButInvalid()...)
	for _, b := range stored {
		mustApply(t, c, Namespace(b.name))
		mustApply(t, c, service(b.name)...)
		if err := c.Create(ctx, badOptimizer(b.name, b)); err != nil {
			t.Fatalf("%s: store under the lax CRD: %v", b.name, err)
		}
	}
	setSchema(t, c, func(s *apiextensionsv1.JSONSchemaProps) { *s = *strictSchema.DeepCopy() })
	harness.Eventually(t, 30*time.Second, "the strict CRD is back", func() error {
		if err := c.Create(ctx, probe); !apierrors.IsInvalid(err) {
			_ = c.Delete(ctx, probe)
			return fmt.Errorf("cycle: soon accepted again (%v)", err)
		}
		return nil
	})

	// 3. Valid optimizers next to them, one with a name of the longest legal length.
	longName := strings.Repeat("l", 240) + ".optimizer"
	valid := []struct{ ns, name string }{{"team-a", "web"}, {"team-b", "web"}, {"team-long", longName}}
	for _, v := range valid {
		mustApply(t, c, Namespace(v.ns))
		mustApply(t, c, service(v.ns)...)
		mustApply(t, c, Optimizer(v.ns, v.name, "web", optv1.ServicePort{Number: 80, TargetPort: ptrIntOrString(intstr.FromInt32(8080))}))
	}

	_, probeAddr, _ := startManager(t, api, "--leader-elect=false")

	for _, v := range valid {
		waitEndpoints(t, c, v.ns, 1)
		waitCondition(t, c, v.ns, v.name, optv1.ConditionReady, "Reconciled")
	}
	for _, b := range stored {
		opt := waitCondition(t, c, b.name, b.name, optv1.ConditionStalled, controllersReasonInvalidSpec)
		msg := meta.FindStatusCondition(opt.Status.Conditions, optv1.ConditionStalled).Message
		if !strings.Contains(msg, b.field) {
			t.Errorf("%s: Stalled message %q does not name %s", b.name, msg, b.field)
		}
		var se istionet.ServiceEntry
		if err := c.Get(ctx, client.ObjectKey{Namespace: b.name, Name: "web-adaptive"}, &se); !apierrors.IsNotFound(err) {
			t.Errorf("%s: ServiceEntry written for an invalid spec (%v)", b.name, err)
		}
	}

	// The manager still sees changes: a new pod of every valid Service is mirrored.
	for _, v := range valid {
		mustApply(t, c, Pod(v.ns, "web-1", "web", "node-1", WithContainerPort("http", 8080)))
		mustApply(t, c, EndpointSlice(v.ns, "web-new", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-1", IP(7, 2), "node-1")))
	}
	for _, v := range valid {
		waitEndpoints(t, c, v.ns, 2)
	}
	var se istionet.ServiceEntry
	if err := c.Get(ctx, client.ObjectKey{Namespace: "team-long", Name: "web-adaptive"}, &se); err != nil {
		t.Fatal(err)
	}
	if got := se.Labels[desired.LabelOptimizerName]; len(got) > 63 || se.Annotations[desired.AnnotationOptimizerName] != longName {
		t.Errorf("long-named optimizer's ServiceEntry: label %q, annotation %q", got, se.Annotations[desired.AnnotationOptimizerName])
	}

	if body := get(t, "http://"+probeAddr+"/readyz"); !strings.Contains(body, "ok") {
		t.Errorf("/readyz = %q", body)
	}

	// Fixing a bad optimizer brings it back without a restart.
	fix := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "cycle-soon", Name: "cycle-soon"}, fix); err != nil {
		t.Fatal(err)
	}
	fix.Spec.Optimization.Cycle = optv1.NewDuration(time.Minute)
	if err := c.Update(ctx, fix); err != nil {
		t.Fatalf("fix cycle: %v", err)
	}
	waitEndpoints(t, c, "cycle-soon", 1)
}

const controllersReasonInvalidSpec = "InvalidSpec"

func ptrIntOrString(v intstr.IntOrString) *intstr.IntOrString { return &v }

// service is a Service "web" with one ready pod in namespace ns.
func service(ns string) []client.Object {
	return []client.Object{
		Node("node-1", "us-east", "us-east-1a", "", "c5.xlarge"),
		Service(ns, "web", ServicePort("http", 80, intstr.FromInt32(8080))),
		Pod(ns, "web-0", "web", "node-1", WithContainerPort("http", 8080)),
		EndpointSlice(ns, "web-abc", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-0", IP(7, 1), "node-1")),
	}
}

func badOptimizer(ns string, b badSpec) *unstructured.Unstructured {
	spec := map[string]any{"service_name": "web"}
	for k, v := range b.spec {
		spec[k] = v
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": optv1.GroupVersion.String(),
		"kind":       "IstioAdaptiveRequestOptimizer",
		"metadata":   map[string]any{"namespace": ns, "name": b.name},
		"spec":       spec,
	}}
	return u
}

// mustApply creates objects, tolerating ones that exist (the shared Node).
func mustApply(t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// setSchema rewrites the optimizer CRD's schema.
func setSchema(t *testing.T, c client.Client, edit func(*apiextensionsv1.JSONSchemaProps)) {
	t.Helper()
	harness.Eventually(t, 10*time.Second, "update the CRD", func() error {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(context.Background(), client.ObjectKey{Name: crdName}, crd); err != nil {
			return err
		}
		edit(crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
		return c.Update(context.Background(), crd)
	})
}

// stripValidation drops every pattern, length, range and CEL rule, as the
// CRD of a release before issue 8 had for these fields.
func stripValidation(s *apiextensionsv1.JSONSchemaProps) {
	s.Pattern, s.MaxLength, s.XValidations = "", nil, nil
	if s.Type == "integer" {
		s.Minimum, s.Maximum = nil, nil
	}
	for k, p := range s.Properties {
		stripValidation(&p)
		s.Properties[k] = p
	}
	if s.Items != nil && s.Items.Schema != nil {
		stripValidation(s.Items.Schema)
	}
}

func waitEndpoints(t *testing.T, c client.Client, ns string, want int) {
	t.Helper()
	harness.Eventually(t, 30*time.Second, fmt.Sprintf("ServiceEntry %s/web-adaptive with %d endpoints", ns, want), func() error {
		var se istionet.ServiceEntry
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, &se); err != nil {
			return err
		}
		if len(se.Spec.Endpoints) != want {
			return fmt.Errorf("%d endpoints", len(se.Spec.Endpoints))
		}
		return nil
	})
}

func waitCondition(t *testing.T, c client.Client, ns, name, typ, reason string) *optv1.IstioAdaptiveRequestOptimizer {
	t.Helper()
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	harness.Eventually(t, 30*time.Second, fmt.Sprintf("%s/%s %s=True (%s)", ns, name, typ, reason), func() error {
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, opt); err != nil {
			return err
		}
		cond := meta.FindStatusCondition(opt.Status.Conditions, typ)
		if cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != reason {
			return fmt.Errorf("conditions %+v", opt.Status.Conditions)
		}
		return nil
	})
	return opt
}

// startManager builds and runs the manager binary against api until the
// test ends, and prints its log if the test failed.
func startManager(t *testing.T, api *harness.APIServer, args ...string) (metricsAddr, probeAddr string, proc *os.Process) {
	t.Helper()
	bin := harness.BuildBinary(t, "./cmd")
	metricsAddr, probeAddr = freePort(t), freePort(t)
	cmd := exec.Command(bin, append([]string{
		"--kubeconfig", api.Kubeconfig,
		"--metrics-bind-address", metricsAddr, "--metrics-secure=false",
		"--health-probe-bind-address", probeAddr,
	}, args...)...)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("manager did not stop within 10s of SIGINT")
		}
		if t.Failed() {
			data, _ := os.ReadFile(logFile.Name())
			t.Logf("manager log:\n%s", tail(string(data), 20000))
		}
	})
	return metricsAddr, probeAddr, cmd.Process
}
