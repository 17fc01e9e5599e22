// Package e2e runs the manager binary as a user would, against a real API
// server through a kubeconfig, and inspects what it writes.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

func freePort(t *testing.T) string {
	t.Helper()
	addr, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func TestManagerBinaryAgainstKubeconfig(t *testing.T) {
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	defer api.Stop()

	bin := harness.BuildBinary(t, "./cmd")

	metricsAddr, probeAddr := freePort(t), freePort(t)
	// KUBECONFIG (not --kubeconfig) to prove the environment variable works;
	// --vmdb-url is the seed's alias of --prometheus-url (nothing listens there:
	// the mirror must work regardless and the weights stay as they are).
	cmd := exec.Command(bin,
		"--metrics-bind-address", metricsAddr, "--metrics-secure=false",
		"--health-probe-bind-address", probeAddr,
		"--leader-elect=false", // one manager, outside a cluster
		"--vmdb-url", "http://127.0.0.1:1/select/0/prometheus",
		// A restricted watch must still read cluster-scoped Nodes.
		"--watch-namespaces", "shop,other",
	)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+api.Kubeconfig)
	logFile, err := os.Create(filepath.Join(t.TempDir(), "manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("manager did not stop within 10s of SIGINT")
		}
		if t.Failed() {
			data, _ := os.ReadFile(logFile.Name())
			t.Logf("manager log:\n%s", tail(string(data), 4000))
		}
	}()

	c, err := client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ns := "shop"
	for _, o := range []client.Object{
		Namespace(ns),
		Node("node-1", "us-east", "us-east-1a", "", "c5.xlarge"),
		Service(ns, "cart", ServicePort("http-web", 80, intstr.FromString("web")), ServicePort("grpc", 9000, intstr.FromInt32(9000))),
		Pod(ns, "cart-0", "cart", "node-1", WithSidecar(), WithServiceAccount("cart"), WithContainerPort("web", 8080)),
		Pod(ns, "cart-1", "cart", "node-1", WithSidecar(), WithServiceAccount("cart"), WithContainerPort("web", 8080)),
		EndpointSlice(ns, "cart-abc", "cart", []SlicePort{{Name: "http-web", Port: 8080}, {Name: "grpc", Port: 9000}},
			Ready("cart-0", IP(9, 1), "node-1"), Ready("cart-1", IP(9, 2), "node-1")),
		Optimizer(ns, "cart", "cart"),
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}

	// One 30s budget for the ServiceEntry and the Ready status together.
	deadline := time.Now().Add(30 * time.Second)
	var se istionet.ServiceEntry
	harness.Eventually(t, time.Until(deadline), "ServiceEntry with 2 endpoints", func() error {
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cart-adaptive"}, &se); err != nil {
			return err
		}
		if len(se.Spec.Endpoints) != 2 {
			return fmt.Errorf("%d endpoints", len(se.Spec.Endpoints))
		}
		return nil
	})
	// Ready is written after all the routing objects are applied: once it
	// is True, the VirtualService and DestinationRule exist too.
	harness.Eventually(t, time.Until(deadline), "optimizer Ready", func() error {
		var opt optv1.IstioAdaptiveRequestOptimizer
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cart"}, &opt); err != nil {
			t.Fatal(err) // the optimizer was created above: no retry
		}
		if c := meta.FindStatusCondition(opt.Status.Conditions, "Ready"); c == nil || c.Status != "True" {
			return fmt.Errorf("status %+v", opt.Status)
		}
		return nil
	})
	if se.Spec.Hosts[0] != "cart.shop.adaptive" {
		t.Errorf("host = %v", se.Spec.Hosts)
	}
	for _, p := range se.Spec.Ports {
		if p.Number == 80 && (p.Protocol != "HTTP" || p.TargetPort != 8080) {
			t.Errorf("port 80 = %s/%d, want HTTP/8080 (named target port resolved)", p.Protocol, p.TargetPort)
		}
	}
	for _, e := range se.Spec.Endpoints {
		if e.Locality != "us-east/us-east-1a" || e.ServiceAccount != "cart" || e.Weight == 0 {
			t.Errorf("endpoint %+v", e)
		}
	}
	var vs istionet.VirtualService
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cart-adaptive"}, &vs); err != nil {
		t.Errorf("VirtualService: %v", err)
	} else {
		if len(vs.Spec.Hosts) != 1 || vs.Spec.Hosts[0] != "cart.shop.svc.cluster.local" {
			t.Errorf("VirtualService hosts = %v", vs.Spec.Hosts)
		}
		for _, r := range vs.Spec.Http {
			if d := r.Route[0].Destination; d.Host != "cart.shop.adaptive" || d.Port.GetNumber() != r.Match[0].Port {
				t.Errorf("route %s goes to %s:%d", r.Name, d.Host, d.Port.GetNumber())
			}
		}
		if len(vs.Spec.Http) != 2 {
			t.Errorf("VirtualService has %d http routes, want 2 (http and grpc)", len(vs.Spec.Http))
		}
	}
	var dr istionet.DestinationRule
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cart-adaptive"}, &dr); err != nil {
		t.Errorf("DestinationRule: %v", err)
	} else if dr.Spec.Host != "cart.shop.adaptive" || dr.Spec.TrafficPolicy.GetLoadBalancer().GetSimple().String() != "LEAST_REQUEST" {
		// The metrics backend is unreachable, so no weight is ever learned:
		// Istio's default LEAST_REQUEST stays.
		t.Errorf("DestinationRule host %s policy %v", dr.Spec.Host, dr.Spec.TrafficPolicy)
	}

	body := get(t, "http://"+probeAddr+"/readyz")
	if !strings.Contains(body, "ok") {
		t.Errorf("/readyz = %q", body)
	}
	metrics := get(t, "http://"+metricsAddr+"/metrics")
	for _, want := range []string{
		`endpoint_weight{locality="us-east/us-east-1a",pod_ip="` + IP(9, 1) + `",service_name="cart",service_namespace="shop"}`,
		`controller_runtime_reconcile_total{controller="optimizer.mirror"`,
		`workqueue_adds_total{controller="optimizer.mirror"`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fmt.Sprintf("...%s", s[len(s)-n:])
}
