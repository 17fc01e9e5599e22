package generated

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// TestExamplesDecodeStrictly keeps examples/ in step with the API: every
// optimizer in them decodes without unknown fields and names a Service.
func TestExamplesDecodeStrictly(t *testing.T) {
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found (%v)", err)
	}
	optimizers := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range strings.Split(string(data), "\n---") {
			var head struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				t.Errorf("%s document %d: %v", filepath.Base(f), i, err)
				continue
			}
			if head.Kind != "IstioAdaptiveRequestOptimizer" {
				continue
			}
			optimizers++
			var o optv1.IstioAdaptiveRequestOptimizer
			if err := yaml.UnmarshalStrict([]byte(doc), &o); err != nil {
				t.Errorf("%s document %d does not match the API: %v", filepath.Base(f), i, err)
				continue
			}
			if o.Spec.ServiceName == "" {
				t.Errorf("%s document %d has no service_name", filepath.Base(f), i)
			}
		}
	}
	if optimizers < len(files)-1 {
		t.Errorf("only %d optimizers in %d example files", optimizers, len(files))
	}
}
