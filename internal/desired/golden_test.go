package desired

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/istio-objects.yaml")

// goldenObjectsFile holds every object Compute writes for a set of inputs
// that covers each rule (protocols, export scopes, a carried DestinationRule,
// locality). The istiod tools module validates it with Istio's own
// validation (hack/tools/istiod/validate_test.go), so an object Istio would
// reject cannot pass `make test`.
const goldenObjectsFile = "testdata/istio-objects.yaml"

func goldenInputs() map[string]Input {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	all := func(mut ...func(*Input)) Input {
		in := webInput()
		in.Service = service(
			svcPort("http", 80, intstr.FromInt32(8080)),
			svcPort("grpc-api", 9090, intstr.FromInt32(9090)),
			svcPort("tcp-db", 5432, intstr.FromInt32(5432)),
			svcPort("web", 8081, intstr.FromInt32(8081)),
			svcPort("https", 443, intstr.FromInt32(8443)),
			svcPort("tls-x", 444, intstr.FromInt32(8444)),
		)
		in.Pods = podMap(pod("web-0", sidecarContainer, serviceAccount("web-sa")), pod("web-1", sidecarContainer, serviceAccount("web-sa")))
		for _, m := range mut {
			m(&in)
		}
		return in
	}
	return map[string]Input{
		"default": all(),
		"tls-listed-private": all(func(in *Input) {
			in.Optimizer = optimizer(withPorts(optv1.ServicePort{Number: 443}, optv1.ServicePort{Number: 8081, Protocol: optv1.ProtocolHTTP}))
			in.Optimizer.Name = "tls-listed"
			in.Service.Annotations = map[string]string{AnnotationExportTo: "."}
		}),
		"namespace-list-locality-user-dr": all(func(in *Input) {
			in.Optimizer = optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.LocalityEnabled = true })
			in.Optimizer.Name = "list"
			in.Service.Annotations = map[string]string{AnnotationExportTo: "team-a,shop"}
			dr := &istionet.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "web-policy", CreationTimestamp: metav1.NewTime(t0)}}
			dr.Spec.Host = "web"
			dr.Spec.TrafficPolicy = &networking.TrafficPolicy{
				Tls:            &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: "web.example.internal"},
				ConnectionPool: &networking.ConnectionPoolSettings{Tcp: &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: 7}},
				PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{
					{Port: &networking.PortSelector{Number: 80}, ConnectionPool: &networking.ConnectionPoolSettings{Http: &networking.ConnectionPoolSettings_HTTPSettings{Http1MaxPendingRequests: 3}}},
				},
			}
			in.Mesh.DestinationRules = []*istionet.DestinationRule{dr}
		}),
	}
}

func renderGolden(t *testing.T) []byte {
	t.Helper()
	ins := goldenInputs()
	var buf bytes.Buffer
	for _, name := range []string{"default", "tls-listed-private", "namespace-list-locality-user-dr"} {
		in := ins[name]
		r := Compute(in)
		if hasFatal(r.Problems) {
			t.Fatalf("%s: %+v", name, r.Problems)
		}
		// Each scenario's objects get their own name so that a validator
		// sees every one.
		objs := []metav1.Object{r.ServiceEntry, r.VirtualService, r.DestinationRule}
		for _, o := range objs {
			o.SetName(o.GetName() + "-" + name)
			out, err := yaml.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			buf.WriteString("---\n# scenario: " + name + "\n")
			buf.Write(out)
		}
	}
	return buf.Bytes()
}

// TestGoldenObjects fails when the committed objects differ from what
// Compute writes (run with -update to rewrite them), so the objects Istio's
// validation checks are always the current ones.
func TestGoldenObjects(t *testing.T) {
	got := renderGolden(t)
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(goldenObjectsFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenObjectsFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenObjectsFile)
	if err != nil {
		t.Fatalf("%v (run: go test ./internal/desired -run TestGoldenObjects -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is stale: run go test ./internal/desired -run TestGoldenObjects -update, then the Istio validation in hack/tools/istiod", goldenObjectsFile)
	}
}
