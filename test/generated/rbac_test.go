package generated

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// TestManagerRunsWithInstalledRBAC runs the real manager binary with the
// identity and RBAC that config/default installs (its ServiceAccount, nothing
// more) against a real API server with Istio's CRDs, and checks that it does
// its job: the seed's sample optimizer gets a ServiceEntry and a Ready status,
// leader election takes its Lease, no request is forbidden, and the secured
// metrics endpoint admits a scraper bound to metrics-reader and nobody else.
// Tests that run the manager as cluster admin cannot notice a missing or
// excessive rule; this one can notice a missing one.
func TestManagerRunsWithInstalledRBAC(t *testing.T) {
	root := repoRoot(t)
	runMake(t, root, "kustomize")
	install := kustomizeBuild(t, root, "config/default")
	samples := kustomizeBuild(t, root, "config/samples")
	deploy := findObject(t, install, "Deployment", "istio-adaptive-controller-manager")
	saName, _, _ := unstructured.NestedString(deploy.Object, "spec", "template", "spec", "serviceAccountName")
	saNamespace := deploy.GetNamespace()
	containers, _, _ := unstructured.NestedSlice(deploy.Object, "spec", "template", "spec", "containers")
	deployArgs, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")

	manager := buildManager(t, root)
	env, c := startAPIServerWithIstio(t, root)
	ctx := t.Context()

	// istiod's namespace, where the install puts the Role on remote secrets.
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}); err != nil {
		t.Fatal(err)
	}
	for _, obj := range install {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %s %s/%s from config/default: %v", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
		}
	}

	// The manager authenticates as its ServiceAccount: RBAC matches that
	// user name, so the install's bindings are all it has.
	user, err := env.ControlPlane.AddUser(envtest.User{
		Name:   "system:serviceaccount:" + saNamespace + ":" + saName,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace},
	}, nil)
	if err != nil {
		t.Fatalf("add ServiceAccount user: %v", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfigPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}

	// The Deployment's own arguments, with loopback listeners, and without
	// the in-cluster Prometheus placeholder (unreachable here; weights stay
	// equal). Out of a cluster the lease namespace must be given.
	metricsAddr, probeAddr := freeAddr(t), freeAddr(t)
	args := []string{"--kubeconfig=" + kubeconfigPath, "--leader-election-namespace=" + saNamespace}
	for _, a := range deployArgs {
		switch name, _, _ := strings.Cut(a, "="); name {
		case "--metrics-bind-address":
			args = append(args, name+"="+metricsAddr)
		case "--health-probe-bind-address":
			args = append(args, name+"="+probeAddr)
		case "--prometheus-url", "--vmdb-url":
		default:
			args = append(args, a)
		}
	}
	logs := startManager(t, manager, args)

	fixtures(t, c)
	for _, obj := range samples {
		obj.SetNamespace("default")
		if err := createWhenServed(ctx, c, obj); err != nil {
			t.Fatalf("create sample %s: %v", obj.GetName(), err)
		}
	}

	eventually(t, 60*time.Second, logs, "the sample optimizer is Ready with a ServiceEntry", func() error {
		opt := samples[0].DeepCopy()
		if err := c.Get(ctx, client.ObjectKeyFromObject(opt), opt); err != nil {
			return err
		}
		ready := "absent"
		conds, _, _ := unstructured.NestedSlice(opt.Object, "status", "conditions")
		for _, cond := range conds {
			if m := cond.(map[string]any); m["type"] == "Ready" {
				ready = fmt.Sprintf("%v (%v: %v)", m["status"], m["reason"], m["message"])
			}
		}
		if !strings.HasPrefix(ready, "True") {
			return fmt.Errorf("Ready condition %s", ready)
		}
		entries := &unstructured.UnstructuredList{}
		entries.SetGroupVersionKind(schema.GroupVersionKind{Group: "networking.istio.io", Version: "v1", Kind: "ServiceEntryList"})
		if err := c.List(ctx, entries, client.InNamespace("default")); err != nil {
			return err
		}
		for _, se := range entries.Items {
			if eps, _, _ := unstructured.NestedSlice(se.Object, "spec", "endpoints"); len(eps) == 2 {
				return nil
			}
		}
		return fmt.Errorf("no ServiceEntry with the 2 ready pods among %d ServiceEntries", len(entries.Items))
	})

	eventually(t, 30*time.Second, logs, "the leader election Lease", func() error {
		leases := &coordinationv1.LeaseList{}
		if err := c.List(ctx, leases, client.InNamespace(saNamespace)); err != nil {
			return err
		}
		if len(leases.Items) == 0 {
			return fmt.Errorf("no Lease in %s", saNamespace)
		}
		return nil
	})

	t.Run("remote secrets", func(t *testing.T) {
		remoteSecretsDetected(t, c, user.Config(), samples[0], logs)
	})

	t.Run("gateway routes", func(t *testing.T) {
		// A gateway's HTTPRoute to the Service, listed in gateway_routes, is
		// retargeted (patch); routing_mode gateway_api creates the mesh
		// routes (create). Both under the installed RBAC.
		route := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
			"metadata": map[string]any{"namespace": "default", "name": "myapp-ingress"},
			"spec": map[string]any{
				"parentRefs": []any{map[string]any{"name": "ingress", "namespace": "istio-system"}},
				"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": "myapp-service", "port": int64(8080)}}}},
			},
		}}
		if err := createWhenServed(ctx, c, route); err != nil {
			t.Fatal(err)
		}
		opt := samples[0].DeepCopy()
		patch := []byte(`{"spec":{"routing_mode":"gateway_api","gateway_routes":[{"kind":"HTTPRoute","name":"myapp-ingress"}]}}`)
		if err := c.Patch(ctx, opt, client.RawPatch(types.MergePatchType, patch)); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, logs, "the HTTPRoute retargeted and the mesh routes written", func() error {
			got := route.DeepCopy()
			if err := c.Get(ctx, client.ObjectKeyFromObject(got), got); err != nil {
				return err
			}
			rules, _, _ := unstructured.NestedSlice(got.Object, "spec", "rules")
			refs, _, _ := unstructured.NestedSlice(rules[0].(map[string]any), "backendRefs")
			if kind := refs[0].(map[string]any)["kind"]; kind != "Hostname" {
				return fmt.Errorf("backendRef kind %v", kind)
			}
			for _, kind := range []string{"HTTPRoute", "GRPCRoute"} {
				mesh := &unstructured.Unstructured{}
				mesh.SetGroupVersionKind(schema.GroupVersionKind{Group: "gateway.networking.k8s.io", Version: "v1", Kind: kind})
				name := map[string]string{"HTTPRoute": "myapp-service-adaptive-8080", "GRPCRoute": "myapp-service-adaptive-9090"}[kind]
				if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, mesh); err != nil {
					return fmt.Errorf("%s %s: %w", kind, name, err)
				}
			}
			return nil
		})
	})

	t.Run("metrics", func(t *testing.T) {
		reader := findObject(t, install, "ClusterRole", "istio-adaptive-metrics-reader")
		allowed := serviceAccountToken(t, c, "monitoring", "prometheus", reader.GetName())
		denied := serviceAccountToken(t, c, "monitoring", "nobody", "")
		url := "https://" + metricsAddr + "/metrics"
		var body string
		eventually(t, 30*time.Second, logs, "metrics for a metrics-reader", func() error {
			code, b, err := scrape(url, allowed)
			if err != nil {
				return err
			}
			if code != http.StatusOK {
				return fmt.Errorf("status %d: %s", code, b)
			}
			body = b
			return nil
		})
		if !strings.Contains(body, "controller_runtime_reconcile_total") {
			t.Errorf("metrics lack controller-runtime's series:\n%.2000s", body)
		}
		if code, _, err := scrape(url, denied); err != nil || code != http.StatusForbidden {
			t.Errorf("a ServiceAccount without metrics-reader got %d (%v), want 403", code, err)
		}
		if code, _, err := scrape(url, ""); err != nil || code != http.StatusUnauthorized {
			t.Errorf("an anonymous scrape got %d (%v), want 401", code, err)
		}
	})

	if msg := forbidden(logs); msg != "" {
		t.Error(msg)
	}
}

// fixtures: the Service of the seed's sample (myapp-service, ports 8080 http
// and 9090 grpc) with two ready pods on a zoned node. The pod IPs are only
// data for the API server (which rejects loopback endpoint addresses); no
// traffic is sent to them.
func fixtures(t *testing.T, c client.Client) {
	t.Helper()
	ctx := t.Context()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{
		corev1.LabelTopologyRegion: "region-1", corev1.LabelTopologyZone: "zone-a",
	}}}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "myapp-service"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "myapp"},
			Ports: []corev1.ServicePort{
				{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080)},
				{Name: "grpc", Port: 9090, TargetPort: intstr.FromInt32(9090)},
			},
		},
	}
	objs := []client.Object{node, svc}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "myapp-service-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: "myapp-service",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("grpc"), Port: ptr.To[int32](9090), Protocol: ptr.To(corev1.ProtocolTCP)},
		},
	}
	var pods []*corev1.Pod
	for i, ip := range []string{"192.0.2.1", "192.0.2.2"} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("myapp-%d", i), Labels: map[string]string{"app": "myapp"}},
			Spec:       corev1.PodSpec{NodeName: node.Name, Containers: []corev1.Container{{Name: "app", Image: "myapp"}}},
		}
		objs = append(objs, pod)
		pods = append(pods, pod)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(node.Name),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: pod.Name},
		})
	}
	objs = append(objs, slice)
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
	for i, pod := range pods {
		pod.Status = corev1.PodStatus{
			Phase:      corev1.PodRunning,
			PodIP:      slice.Endpoints[i].Addresses[0],
			PodIPs:     []corev1.PodIP{{IP: slice.Endpoints[i].Addresses[0]}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		}
		if err := c.Status().Update(ctx, pod); err != nil {
			t.Fatalf("set status of pod %s: %v", pod.Name, err)
		}
	}
}

// serviceAccountToken creates a ServiceAccount, binds it to clusterRole when
// one is given, and returns a token for it.
func serviceAccountToken(t *testing.T, c client.Client, namespace, name, clusterRole string) string {
	t.Helper()
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if err := c.Create(ctx, ns); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	if clusterRole != "" {
		binding := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: namespace + "-" + name + "-" + clusterRole},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: namespace, Name: name}},
		}
		if err := c.Create(ctx, binding); err != nil {
			t.Fatal(err)
		}
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("request a token for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

func scrape(url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	// The manager serves a self-signed certificate unless given one.
	httpClient := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // test against a self-signed loopback server
	}}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func buildManager(t *testing.T, root string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "manager")
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, "./cmd")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd: %v\n%s", err, out)
	}
	return bin
}

// syncBuffer collects a process's output while tests read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startManager runs the manager until the test ends, then stops it with
// SIGTERM (SIGKILL after 10 s).
func startManager(t *testing.T, bin string, args []string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &syncBuffer{}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start manager: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-done
		if t.Failed() {
			t.Logf("manager output:\n%s", logs.String())
		}
	})
	return logs
}

// eventually polls check until it succeeds or the timeout passes; a failure
// explains the RBAC refusals found in the manager's output.
func eventually(t *testing.T, timeout time.Duration, logs *syncBuffer, what string, check func() error) {
	t.Helper()
	if err := harness.Poll(timeout, 250*time.Millisecond, check); err != nil {
		t.Fatalf("%s: %v%s", what, err, forbidden(logs))
	}
}

// forbidden explains RBAC refusals found in the manager's output, if any.
func forbidden(logs *syncBuffer) string {
	lines := grepLines(logs.String(), "forbidden")
	if lines == "" {
		return ""
	}
	return "\nThe manager was refused requests with the installed RBAC (add the rule as a +kubebuilder:rbac marker, then make manifests):\n" + lines
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func grepLines(text, substr string) string {
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// startAPIServerWithIstio starts an API server with Istio's CRDs (from the
// pinned istio.io/api module) and returns an admin client.
func startAPIServerWithIstio(t *testing.T, root string) (*envtest.Environment, client.Client) {
	t.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = filepath.Join(root, "bin")
	}
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			t.Fatalf("%s not found in %s: run `make envtest` (or set KUBEBUILDER_ASSETS)", b, assets)
		}
	}
	list := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api")
	list.Dir = root
	dir, err := list.Output()
	if err != nil {
		t.Fatalf("locate the istio.io/api module: %v", err)
	}
	// The Gateway API CRDs too, so the manager reads and writes the routes
	// under the installed RBAC as well.
	gwList := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/gateway-api")
	gwList.Dir = root
	gwDir, err := gwList.Output()
	if err != nil {
		t.Fatalf("locate the sigs.k8s.io/gateway-api module: %v", err)
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths: []string{
			filepath.Join(strings.TrimSpace(string(dir)), "kubernetes", "customresourcedefinitions.gen.yaml"),
			filepath.Join(strings.TrimSpace(string(gwDir)), "config", "crd", "standard"),
		},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("start envtest API server: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("stop envtest: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return env, c
}

// remoteSecretsDetected: with the installed Role the manager sees a remote
// secret in istio-system (the sample optimizer turns
// Stalled/MultiClusterEndpointsNotMirrored, then Ready again when the
// Secret goes), and the manager's identity can neither read a Secret's
// contents by name there nor list Secrets anywhere else.
func remoteSecretsDetected(t *testing.T, c client.Client, managerConfig *rest.Config, sample *unstructured.Unstructured, logs *syncBuffer) {
	ctx := t.Context()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "istio-system", Name: "istio-remote-secret-cluster-2",
			Labels:      map[string]string{"istio/multiCluster": "true"},
			Annotations: map[string]string{"networking.istio.io/cluster": "cluster-2"}},
		StringData: map[string]string{"cluster-2": "apiVersion: v1\nkind: Config\n"},
	}
	if err := c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	readyReason := func() (string, error) {
		opt := sample.DeepCopy()
		if err := c.Get(ctx, client.ObjectKeyFromObject(opt), opt); err != nil {
			return "", err
		}
		conds, _, _ := unstructured.NestedSlice(opt.Object, "status", "conditions")
		for _, cond := range conds {
			if m := cond.(map[string]any); m["type"] == "Ready" {
				return fmt.Sprintf("%v/%v", m["status"], m["reason"]), nil
			}
		}
		return "absent", nil
	}
	eventually(t, 30*time.Second, logs, "the sample optimizer refuses a multi-cluster mesh", func() error {
		got, err := readyReason()
		if err == nil && got != "False/MultiClusterEndpointsNotMirrored" {
			err = fmt.Errorf("Ready %s", got)
		}
		return err
	})
	if err := c.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, logs, "the sample optimizer is Ready again", func() error {
		got, err := readyReason()
		if err == nil && got != "True/Reconciled" {
			err = fmt.Errorf("Ready %s", got)
		}
		return err
	})

	as, err := client.New(managerConfig, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := as.Get(ctx, client.ObjectKey{Namespace: "istio-system", Name: "istio-ca-secret"}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("the manager's identity got a Secret by name in istio-system: %v, want forbidden", err)
	}
	if err := as.List(ctx, &corev1.SecretList{}, client.InNamespace("default")); !apierrors.IsForbidden(err) {
		t.Errorf("the manager's identity listed Secrets in default: %v, want forbidden", err)
	}
}
