package generated

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestInstallManifests renders config/default (what `make deploy` and
// `make build-installer` install), config/samples and config/prometheus with
// kustomize and checks the properties of the manager's Deployment that users
// rely on. TestManagerRunsWithInstalledRBAC creates them on a real API server.
func TestInstallManifests(t *testing.T) {
	root := repoRoot(t)
	runMake(t, root, "kustomize")
	install := kustomizeBuild(t, root, "config/default")
	kustomizeBuild(t, root, "config/samples")
	kustomizeBuild(t, root, "config/prometheus")

	t.Run("deployment", func(t *testing.T) {
		deploy := findObject(t, install, "Deployment", "istio-adaptive-controller-manager")
		if ns := deploy.GetNamespace(); ns != "istio-adaptive-system" {
			t.Errorf("manager namespace = %q, want istio-adaptive-system", ns)
		}
		containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
		if len(containers) != 1 {
			t.Fatalf("want one container, got %d", len(containers))
		}
		c := containers[0].(map[string]any)
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		for _, want := range []string{"--leader-elect", "--metrics-bind-address=:8443", "--health-probe-bind-address=:8081"} {
			if !slices.Contains(args, want) {
				t.Errorf("manager args %q lack %q", args, want)
			}
		}
		if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--prometheus-url=") }) {
			t.Errorf("manager args %q lack --prometheus-url", args)
		}
		// The seed's deployment watched no namespace and so did nothing: the
		// default install must watch the whole cluster.
		for _, a := range args {
			if name, value, _ := strings.Cut(a, "="); strings.HasPrefix(name, "--watch-namespace") && value != "" {
				t.Errorf("default install restricts namespaces with %q; it must watch the whole cluster", a)
			}
		}
		for path, want := range map[string]any{
			"securityContext.allowPrivilegeEscalation": false,
			"securityContext.readOnlyRootFilesystem":   true,
		} {
			got, _, _ := unstructured.NestedFieldNoCopy(c, strings.Split(path, ".")...)
			if got != want {
				t.Errorf("container %s = %v, want %v", path, got, want)
			}
		}
		drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop")
		if !slices.Equal(drop, []string{"ALL"}) {
			t.Errorf("container drops capabilities %q, want [ALL]", drop)
		}
		if nonRoot, _, _ := unstructured.NestedBool(deploy.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot"); !nonRoot {
			t.Error("pod securityContext.runAsNonRoot is not true")
		}
		image, _, _ := unstructured.NestedString(c, "image")
		if image != "controller:latest" {
			t.Errorf("committed image = %q: config/ must stay at controller:latest; set IMG with make deploy/build-installer", image)
		}
		checkManagerFlags(t, root, args)
	})
}

// checkManagerFlags makes sure every flag the Deployment passes is one the
// manager defines, so a renamed flag cannot ship a crash-looping install.
func checkManagerFlags(t *testing.T, root string, args []string) {
	t.Helper()
	bin := buildManager(t, root)
	// -h prints the usage and exits without connecting anywhere.
	help, _ := exec.CommandContext(t.Context(), bin, "-h").CombinedOutput()
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !regexp.MustCompile(`(?m)^\s+--?` + regexp.QuoteMeta(name) + `(\s|$)`).Match(help) {
			t.Errorf("the Deployment passes %q but the manager has no flag %q; its usage:\n%s", a, name, help)
		}
	}
}

func kustomizeBuild(t *testing.T, root, dir string) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "bin", "kustomize"), "build", dir)
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.String())
	}
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decode kustomize build %s: %v", dir, err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, obj)
		}
	}
	if len(objs) == 0 {
		t.Fatalf("kustomize build %s rendered nothing", dir)
	}
	return objs
}

func findObject(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s in the rendered install", kind, name)
	return nil
}

// createWhenServed creates obj, retrying for a while when its kind is not
// served yet (a CRD created a moment ago).
func createWhenServed(ctx context.Context, c client.Client, obj client.Object) error {
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = c.Create(ctx, obj); err == nil || !(meta.IsNoMatchError(err) || apierrors.IsNotFound(err)) {
			return err
		}
	}
	return err
}
