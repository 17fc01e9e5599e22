package chart

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The CRDs of the optional objects, read from the projects' own Go modules
// (pinned here, fetched through the module proxy into the module cache):
// the Prometheus Operator's ServiceMonitor and PrometheusRule, cert-manager's
// Certificate and Issuer.
var foreignCRDs = []struct {
	module, version string
	files           []string
}{
	{"github.com/prometheus-operator/prometheus-operator", "v0.85.0", []string{
		"example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
		"example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
	}},
	{"github.com/cert-manager/cert-manager", "v1.21.2", []string{
		"deploy/crds/cert-manager.io_certificates.yaml",
		"deploy/crds/cert-manager.io_issuers.yaml",
	}},
}

// moduleFiles downloads a module (outside this repository's go.mod, so
// nothing here changes) and returns the paths of files inside it.
func moduleFiles(t *testing.T, module, version string, files []string) []string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "mod", "download", "-json", module+"@"+version)
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v\n%s", module, version, err, out)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s@%s: %v %s", module, version, err, info.Error)
	}
	var paths []string
	for _, f := range files {
		p := filepath.Join(info.Dir, filepath.FromSlash(f))
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s@%s: %v", module, version, err)
		}
		paths = append(paths, p)
	}
	return paths
}

// TestChartAppliesToAPIServer renders the chart with its default values and
// with every option set, plus the kustomize monitoring overlays
// (config/prometheus, config/grafana), and applies every rendered object to
// a real kube-apiserver as a server-side dry run: the API server validates
// each against its schema (the CRDs' OpenAPI schemas included), defaults it
// and runs admission, without storing anything.
func TestChartAppliesToAPIServer(t *testing.T) {
	root := repoRoot(t)
	var crds []string
	for _, m := range foreignCRDs {
		crds = append(crds, moduleFiles(t, m.module, m.version, m.files)...)
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		// The chart's own copy of the CRD: it is what a Helm install creates.
		CRDDirectoryPaths:     append([]string{filepath.Join(root, chartDir, "crds")}, crds...),
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest API server (make envtest): %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}

	renders := map[string][]*unstructured.Unstructured{
		"helm default":               helmTemplate(t, root, releaseNamespace),
		"helm all-options":           helmTemplate(t, root, "iawo-system", allOptions),
		"helm README values":         helmTemplate(t, root, releaseNamespace, readmeValues(t, root)),
		"kustomize default":          kustomizeBuild(t, root, "config/default"),
		"kustomize prometheus":       kustomizeBuild(t, root, "config/prometheus"),
		"kustomize grafana":          kustomizeBuild(t, root, "config/grafana"),
		"kustomize network-policy":   kustomizeBuild(t, root, "config/network-policy"),
		"kustomize verified-metrics": kustomizeBuild(t, root, "config/overlays/verified-metrics"),
	}
	// Namespaces the renders put objects in (a dry run cannot create them).
	namespaces := map[string]bool{}
	for _, objs := range renders {
		for _, o := range objs {
			if ns := o.GetNamespace(); ns != "" {
				namespaces[ns] = true
			}
		}
	}
	for ns := range namespaces {
		if err := c.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
	}

	// Control: the dry run does validate. A ServiceMonitor endpoint with a
	// misspelt field and a PodDisruptionBudget with a wrong type must fail.
	for _, bad := range []string{
		`{"apiVersion":"monitoring.coreos.com/v1","kind":"ServiceMonitor","metadata":{"name":"bad","namespace":"` + releaseNamespace + `"},` +
			`"spec":{"selector":{},"endpoints":[{"port":"https","authorisation":{"type":"Bearer"}}]}}`,
		`{"apiVersion":"policy/v1","kind":"PodDisruptionBudget","metadata":{"name":"bad","namespace":"` + releaseNamespace + `"},` +
			`"spec":{"maxUnavailable":{"one":1}}}`,
	} {
		o := decode(t, "control", []byte(bad))[0]
		if err := c.Patch(t.Context(), o, client.Apply, client.FieldOwner("chart-test"), client.ForceOwnership, client.DryRunAll); err == nil {
			t.Fatalf("the dry run accepted the invalid %s; it would not catch a broken chart either", describe(o))
		}
	}

	for name, objs := range renders {
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.GetKind()]++
				if o.GetKind() == "Namespace" {
					continue // created above
				}
				err := c.Patch(t.Context(), o.DeepCopy(), client.Apply, client.FieldOwner("chart-test"), client.ForceOwnership, client.DryRunAll)
				if err != nil {
					t.Errorf("server-side dry run of %s: %v", describe(o), err)
				}
			}
			t.Logf("%d objects accepted: %s", len(objs), fmt.Sprint(kinds))
		})
	}
}

// readmeValues writes the production values file the README shows (the YAML
// block after "A production values file:") to a temporary file, so what a
// user copies is what the test installs.
func readmeValues(t *testing.T, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "A production values file:")
	if !ok {
		t.Fatal(`README.md has no "A production values file:" block`)
	}
	_, block, ok := strings.Cut(after, "```yaml\n")
	if ok {
		block, _, ok = strings.Cut(block, "```")
	}
	if !ok {
		t.Fatal("README.md: no yaml block after \"A production values file:\"")
	}
	p := filepath.Join(t.TempDir(), "readme-values.yaml")
	if err := os.WriteFile(p, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
