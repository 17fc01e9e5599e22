package controllers_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// The suite runs the real manager against a real API server (envtest) with
// Istio's CRDs; each test works in its own namespace.
var (
	k8s         client.Client
	testMetrics *metrics.Metrics
	// testCoverage answers the coverage loop's queries (coverage_test.go).
	testCoverage = &coverageAnswers{byNamespace: map[string]promsource.Coverage{}}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	api, err := harness.StartAPIServer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: cannot start the envtest API server:", err)
		return 1
	}
	defer api.Stop()
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr), zap.Level(zapLevel())))

	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{
		Scheme:  harness.Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		// The binary's cache settings, so a field the Pod/Node trim drops fails here.
		Cache: controllers.CacheOptions(nil),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: manager:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	testMetrics = metrics.New()
	if err := controllers.Setup(ctx, mgr, controllers.Dependencies{
		Clock: clock.RealClock{}, Metrics: testMetrics, ClusterDomain: "cluster.local",
		CoverageSource: testCoverage,
		Options: controllers.Options{
			// Measured every second here so tests need not wait minutes.
			Coverage: controllers.CoverageOptions{Threshold: 0.9, Interval: time.Second, Query: promsource.DefaultCoverageQuery},
			// Remote secrets are watched in a namespace of their own, so
			// the one test that adds one affects nobody else.
			MultiCluster:            controllers.MultiClusterOptions{IstioNamespace: meshSecretsNamespace},
			MaxConcurrentReconciles: 2,
			// Cross-namespace targeting and custom queries stay off (the
			// defaults) except for one namespace each, so tests see both.
			CrossNamespace:      controllers.NamespaceGate{Namespaces: []string{platformNamespace}},
			CustomQueries:       controllers.NamespaceGate{Namespaces: []string{customQueryNamespace}},
			AllowedHostSuffixes: []string{sharedHostSuffix},
		},
	}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: setup:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	k8s, err = client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: client:", err)
		return 1
	}
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager stopped with error:", err)
	}
	return code
}

func zapLevel() zapcore.Level {
	if os.Getenv("TEST_VERBOSE") != "" {
		return zapcore.DebugLevel
	}
	return zapcore.ErrorLevel
}

func nsObj(name string) *corev1.Namespace { return fixtures.Namespace(name) }

// eventually polls cond until it returns nil or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	harness.Eventually(t, timeout, what, cond)
}

// consistently checks cond holds for the whole duration.
func consistently(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := cond(); err != nil {
			t.Fatalf("%s: stopped holding: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var nsCounter int

// newNamespace creates a fresh namespace for one test.
func newNamespace(t *testing.T) string {
	t.Helper()
	nsCounter++
	name := fmt.Sprintf("t%d-%d", nsCounter, time.Now().UnixNano()%100000)
	mustCreate(t, nsObj(name))
	return name
}

func mustCreate(t *testing.T, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := k8s.Create(context.Background(), o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

func getSE(ns, name string) (*istionet.ServiceEntry, error) {
	se := &istionet.ServiceEntry{}
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, se)
	return se, err
}

func getOpt(ns, name string) (*optv1.IstioAdaptiveRequestOptimizer, error) {
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, o)
	return o, err
}
