package chart

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

const (
	chartDir = "charts/istio-adaptive-weight-optimizer"
	// The release that reproduces config/default's names: kustomize's
	// namePrefix is "istio-adaptive-" and its namespace istio-adaptive-system.
	releaseName      = "istio-adaptive"
	releaseNamespace = "istio-adaptive-system"
	allOptions       = "test/chart/testdata/all-options.yaml"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func tool(t *testing.T, name, env string) string {
	t.Helper()
	p, err := harness.Binary(name, env, name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// kubeVersion is the version of the envtest kube-apiserver in bin/, which the
// chart is rendered for (helm template otherwise assumes its own default).
func kubeVersion(t *testing.T) string {
	t.Helper()
	target, err := os.Readlink(filepath.Join(repoRoot(t), "bin", "kube-apiserver"))
	if err != nil {
		t.Fatalf("bin/kube-apiserver: %v (run `make envtest`)", err)
	}
	v := regexp.MustCompile(`v\d+\.\d+\.\d+`).FindString(target)
	if v == "" {
		t.Fatalf("no version in bin/kube-apiserver -> %s", target)
	}
	return v
}

// run runs a tool in the repository root and returns its standard output.
func run(t *testing.T, root, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String(), out)
	}
	return out
}

// helmTemplate renders the chart as `helm template` does, CRDs included.
func helmTemplate(t *testing.T, root, namespace string, valueFiles ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", releaseName, chartDir, "--namespace", namespace, "--include-crds", "--kube-version", kubeVersion(t)}
	for _, f := range valueFiles {
		args = append(args, "-f", f)
	}
	return decode(t, "helm template", run(t, root, tool(t, "helm", "HELM"), args...))
}

func kustomizeBuild(t *testing.T, root, dir string) []*unstructured.Unstructured {
	t.Helper()
	return decode(t, "kustomize build "+dir, run(t, root, tool(t, "kustomize", "KUSTOMIZE"), "build", dir))
}

func decode(t *testing.T, what string, data []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode %s: %v", what, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
	if len(objs) == 0 {
		t.Fatalf("%s rendered nothing", what)
	}
	return objs
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func mustFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	o := find(objs, kind, name)
	if o == nil {
		t.Fatalf("no %s %s among %s", kind, name, names(objs))
	}
	return o
}

func names(objs []*unstructured.Unstructured) string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// managerContainer returns the manager container of the Deployment in objs.
func managerContainer(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range containers {
			if m := c.(map[string]any); m["name"] == "manager" {
				return m
			}
		}
	}
	t.Fatalf("no manager container among %s", names(objs))
	return nil
}

// flagArgs maps each --flag of args to its values; a bare boolean flag
// counts as "true".
func flagArgs(args []string) map[string][]string {
	out := map[string][]string{}
	for _, a := range args {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok {
			value = "true"
		}
		out[name] = append(out[name], value)
	}
	return out
}

func containerArgs(c map[string]any) []string {
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	return args
}

// managerFlags lists the flags the manager binary defines, from its usage,
// and returns the binary.
func managerFlags(t *testing.T, root string) (map[string]bool, string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "manager")
	run(t, root, "go", "build", "-o", bin, "./cmd")
	// -h prints the usage and exits without connecting anywhere.
	cmd := exec.CommandContext(t.Context(), bin, "-h")
	help, _ := cmd.CombinedOutput()
	flags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-{1,2}([a-zA-Z0-9][a-zA-Z0-9._-]*)`).FindAllSubmatch(help, -1) {
		flags[string(m[1])] = true
	}
	if !flags["prometheus-url"] || !flags["leader-elect"] {
		t.Fatalf("could not read the manager's flags from its usage:\n%s", help)
	}
	return flags, bin
}

func toJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func describe(o *unstructured.Unstructured) string {
	return fmt.Sprintf("%s %s/%s", o.GetKind(), o.GetNamespace(), o.GetName())
}

// firstLines returns the first n lines of out.
func firstLines(out []byte, n int) string {
	lines := strings.SplitN(string(out), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}
