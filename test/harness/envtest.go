// Package harness starts the real components the tests talk to: a Kubernetes
// API server (envtest, from binaries the Makefile builds into bin/), istiod
// and Prometheus. Nothing is downloaded at run time; a missing binary fails
// the test with the make target that builds it.
package harness

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// RepoRoot is the directory holding go.mod, found by walking up from the
// working directory (go test runs in the package's directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Binary returns the path of a tool built by the Makefile into bin/, or an
// error naming the make target that builds it. env overrides the path.
func Binary(name, env, makeTarget string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "bin", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s not found at %s: run `make %s` (or set %s)", name, p, makeTarget, env)
	}
	return p, nil
}

var (
	istioCRDOnce sync.Once
	istioCRDPath string
	istioCRDErr  error
)

// IstioCRDs is the path of Istio's generated CRD bundle inside the istio.io/api
// module this project is pinned to, so tests use exactly the real CRDs.
func IstioCRDs() (string, error) {
	istioCRDOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api").Output()
		if err != nil {
			istioCRDErr = fmt.Errorf("locate istio.io/api module: %w", err)
			return
		}
		istioCRDPath = filepath.Join(strings.TrimSpace(string(out)), "kubernetes", "customresourcedefinitions.gen.yaml")
		if _, err := os.Stat(istioCRDPath); err != nil {
			istioCRDErr = fmt.Errorf("istio CRDs: %w", err)
		}
	})
	return istioCRDPath, istioCRDErr
}

// Scheme knows core Kubernetes types, Istio networking types and the optimizer.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	must(clientgoscheme.AddToScheme(s))
	must(istionet.AddToScheme(s))
	must(optv1.AddToScheme(s))
	must(gwv1.Install(s))
	return s
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// APIServer is a running envtest control plane with the project's CRDs and
// Istio's installed.
type APIServer struct {
	Env        *envtest.Environment
	Config     *rest.Config
	Kubeconfig string // path of a kubeconfig file for external processes
}

var (
	gatewayAPICRDOnce sync.Once
	gatewayAPICRDPath string
	gatewayAPICRDErr  error
)

// GatewayAPICRDs is the directory of the Gateway API standard-channel CRDs
// inside the sigs.k8s.io/gateway-api module this project is pinned to (the
// version Istio's own go.mod names), so tests install exactly the released
// CRDs.
func GatewayAPICRDs() (string, error) {
	gatewayAPICRDOnce.Do(func() {
		out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api").Output()
		if err != nil {
			gatewayAPICRDErr = fmt.Errorf("locate sigs.k8s.io/gateway-api module: %w", err)
			return
		}
		gatewayAPICRDPath = filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "standard")
		if _, err := os.Stat(gatewayAPICRDPath); err != nil {
			gatewayAPICRDErr = fmt.Errorf("gateway API CRDs: %w", err)
		}
	})
	return gatewayAPICRDPath, gatewayAPICRDErr
}

// APIServerOptions tune StartAPIServerWithOptions.
type APIServerOptions struct {
	// GatewayAPI installs the Gateway API standard CRDs too.
	GatewayAPI bool
}

// StartAPIServer starts kube-apiserver and etcd from bin/ (make envtest).
func StartAPIServer() (*APIServer, error) {
	return StartAPIServerWithOptions(APIServerOptions{})
}

// StartAPIServerWithOptions is StartAPIServer with optional extra CRDs.
func StartAPIServerWithOptions(opts APIServerOptions) (*APIServer, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, fmt.Errorf("%s not found in %s: run `make envtest` (or set KUBEBUILDER_ASSETS)", b, assets)
		}
	}
	istioCRDs, err := IstioCRDs()
	if err != nil {
		return nil, err
	}
	crds := []string{filepath.Join(root, "config", "crd", "bases"), istioCRDs}
	if opts.GatewayAPI {
		gw, err := GatewayAPICRDs()
		if err != nil {
			return nil, err
		}
		crds = append(crds, gw)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crds,
		ErrorIfCRDPathMissing: true,
		Scheme:                Scheme(),
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start envtest API server: %w", err)
	}
	a := &APIServer{Env: env, Config: cfg}
	if a.Kubeconfig, err = writeKubeconfig(env); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return a, nil
}

// Stop stops the API server and etcd.
func (a *APIServer) Stop() error {
	if a.Kubeconfig != "" {
		_ = os.Remove(a.Kubeconfig)
	}
	return a.Env.Stop()
}

// writeKubeconfig gives external processes (the manager binary, istiod) an
// admin kubeconfig for the envtest API server.
func writeKubeconfig(env *envtest.Environment) (string, error) {
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "harness-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return "", fmt.Errorf("add envtest user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("render kubeconfig: %w", err)
	}
	f, err := os.CreateTemp("", "envtest-kubeconfig-*")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return "", err
	}
	return f.Name(), nil
}

// tailFile returns the last n lines of a log file, or why it cannot.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// probeReady asks a readiness endpoint once: true on 200, else what it said.
func probeReady(hc *http.Client, url string) (bool, string) {
	resp, err := hc.Get(url)
	if err != nil {
		return false, err.Error()
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		return true, ""
	}
	return false, fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body)))
}
