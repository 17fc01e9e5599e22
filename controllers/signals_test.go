package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// capacityMetrics is a metrics backend that knows each pod's capacity
// (requests per CPU-second): every pod serves 50 requests/s and uses CPU in
// inverse proportion to its capacity, as in the conformance suite. It has
// no data until released, and none for the request rates of the Services in
// noRequests.
type capacityMetrics struct {
	cpuQuery, requestQuery string
	noRequests             map[string]bool

	mu       sync.Mutex
	released bool
	capacity map[string]float64
	// queried counts the queries by Service, cycles the CPU queries (one
	// a weight cycle).
	queried, cycles map[string]int
}

// setCapacity sets a pod's capacity: its CPU answers 50/c cores.
func (m *capacityMetrics) setCapacity(pod string, c float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.capacity[pod] = c
}

// cyclesOf is how many weight cycles have queried service's CPU.
func (m *capacityMetrics) cyclesOf(service string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cycles[service]
}

func (m *capacityMetrics) release() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = true
}

func (m *capacityMetrics) Query(_ context.Context, tmpl string, t promsource.Target, _ time.Time) (promsource.Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.queried == nil {
		m.queried, m.cycles = map[string]int{}, map[string]int{}
	}
	m.queried[t.Service]++
	if tmpl == m.cpuQuery {
		m.cycles[t.Service]++
	}
	res := promsource.Result{Values: map[string]float64{}, Query: tmpl}
	if m.released && (tmpl == m.cpuQuery || tmpl == m.requestQuery && !m.noRequests[t.Service]) {
		for _, pod := range t.Pods {
			if c := m.capacity[pod]; c > 0 && tmpl == m.cpuQuery {
				res.Values[pod] = 50 / c
			} else if c > 0 {
				res.Values[pod] = 50
			}
		}
	}
	if len(res.Values) == 0 {
		return res, &promsource.EmptyResultError{Query: tmpl}
	}
	return res, nil
}

// signalsEnv is a manager of its own, with a metrics backend, on an API
// server of its own (the suite's manager has none, and would reconcile the
// same optimizers).
type signalsEnv struct {
	c       client.Client
	metrics *metrics.Metrics
	source  *capacityMetrics
}

func startSignalsEnv(t *testing.T) *signalsEnv {
	t.Helper()
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	mgr, err := ctrl.NewManager(api.Config, ctrl.Options{
		Scheme: harness.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"}, Cache: controllers.CacheOptions(nil),
		// The suite's manager already registered the mirror in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	engine := controllers.DefaultEngineDefaults()
	engine.Cycle = time.Second
	engine.Params.QueryWindow = 2 * time.Second
	engine.Params.ScrapeInterval = 0
	engine.Params.Smoothing = 1
	env := &signalsEnv{metrics: metrics.New(), source: &capacityMetrics{
		cpuQuery: engine.CPUQuery, requestQuery: engine.RequestQuery,
		noRequests: map[string]bool{"cpu": true, "blind": true}, capacity: map[string]float64{},
	}}
	ctx, cancel := context.WithCancel(context.Background())
	if err := controllers.Setup(ctx, mgr, controllers.Dependencies{
		Clock: clock.RealClock{}, Metrics: env.metrics, ClusterDomain: "cluster.local", Source: env.source,
		Options: controllers.Options{MaxConcurrentReconciles: 2, Engine: engine},
	}); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if env.c, err = client.New(api.Config, client.Options{Scheme: harness.Scheme()}); err != nil {
		t.Fatal(err)
	}
	return env
}

// service creates a Service with one HTTP port and pods of the given
// capacities (one per node), all ready.
func (env *signalsEnv) service(t *testing.T, ns, name string, capacities ...float64) {
	t.Helper()
	env.serviceOf(t, ns, name, WithCPULimit("1"), capacities...)
}

// serviceOf is service with the pods' option (a CPU limit or none).
func (env *signalsEnv) serviceOf(t *testing.T, ns, name string, opt PodOption, capacities ...float64) {
	t.Helper()
	ctx := context.Background()
	objs := []client.Object{Service(ns, name, ServicePort("http", 80, intstr.FromInt32(8080)))}
	var eps []Endpoint
	for i, c := range capacities {
		pod, node := fmt.Sprintf("%s-%d", name, i), fmt.Sprintf("%s-node-%d", name, i)
		objs = append(objs, Node(node, "r1", "z1", "", "m5.large"), Pod(ns, pod, name, node, WithSidecar(), opt))
		eps = append(eps, Ready(pod, IP(40+len(name), i+1), node))
		env.source.setCapacity(pod, c)
	}
	objs = append(objs, EndpointSlice(ns, name+"-1", name, []SlicePort{{Name: "http", Port: 8080}}, eps...))
	for _, o := range objs {
		if err := env.c.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
	}
}

// cycles waits for n more weight cycles of service (1 s each here).
func (env *signalsEnv) cycles(t *testing.T, service string, n int) {
	t.Helper()
	want := env.source.cyclesOf(service) + n
	harness.Eventually(t, 20*time.Second, fmt.Sprintf("%d more cycles of %s", n, service), func() error {
		if got := env.source.cyclesOf(service); got < want {
			return fmt.Errorf("%d of %d", got, want)
		}
		return nil
	})
}

func (env *signalsEnv) optimizer(t *testing.T, ns, name string) *optv1.IstioAdaptiveRequestOptimizer {
	t.Helper()
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := env.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, o); err != nil {
		t.Fatal(err)
	}
	return o
}

func (env *signalsEnv) policy(ns, service string) (networking.LoadBalancerSettings_SimpleLB, error) {
	dr := &istionet.DestinationRule{}
	if err := env.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: service + "-adaptive"}, dr); err != nil {
		return 0, err
	}
	return dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple(), nil
}

// TestLoadBalancerFollowsLearned: with the default load_balancer
// (ROUND_ROBIN) the DestinationRule keeps Istio's LEAST_REQUEST, and status
// says why, until the weight engine's estimates rest on data; then it
// switches to ROUND_ROBIN. With load_balancer LEAST_REQUEST it stays.
func TestLoadBalancerFollowsLearned(t *testing.T) {
	env := startSignalsEnv(t)
	ns := "lb"
	if err := env.c.Create(context.Background(), Namespace(ns)); err != nil {
		t.Fatal(err)
	}
	env.service(t, ns, "web", 100, 300)
	env.service(t, ns, "lr", 100, 300)
	lr := Optimizer(ns, "lr", "lr")
	lr.Spec.LoadBalancer = optv1.LoadBalancerLeastRequest
	for _, o := range []client.Object{Optimizer(ns, "web", "web"), lr} {
		if err := env.c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}

	// No data yet: nothing is learned.
	harness.Eventually(t, 10*time.Second, "LEAST_REQUEST before anything is learned", func() error {
		for _, svc := range []string{"web", "lr"} {
			if p, err := env.policy(ns, svc); err != nil || p != networking.LoadBalancerSettings_LEAST_REQUEST {
				return fmt.Errorf("%s: policy %v (%v)", svc, p, err)
			}
		}
		o := env.optimizer(t, ns, "web")
		ready := meta.FindStatusCondition(o.Status.Conditions, optv1.ConditionReady)
		if o.Status.LoadBalancer != "LEAST_REQUEST" || o.Status.LoadBalancerReason != "Learning" || ready == nil || !strings.Contains(ready.Message, "LEAST_REQUEST (Istio's default) until the weights rest on measured capacity and no pod is falling behind, then ROUND_ROBIN") {
			return fmt.Errorf("status.loadBalancer %q (%q), Ready %v", o.Status.LoadBalancer, o.Status.LoadBalancerReason, ready)
		}
		return nil
	})
	// Several cycles without data: still LEAST_REQUEST.
	time.Sleep(3 * time.Second)
	if p, err := env.policy(ns, "web"); err != nil || p != networking.LoadBalancerSettings_LEAST_REQUEST {
		t.Fatalf("without data: policy %v (%v), want LEAST_REQUEST", p, err)
	}

	env.source.release()
	harness.Eventually(t, 30*time.Second, "ROUND_ROBIN once learned", func() error {
		p, err := env.policy(ns, "web")
		if err != nil || p != networking.LoadBalancerSettings_ROUND_ROBIN {
			return fmt.Errorf("policy %v (%v)", p, err)
		}
		if o := env.optimizer(t, ns, "web"); o.Status.LoadBalancer != "ROUND_ROBIN" || o.Status.LoadBalancerReason != "Learned" || (o.Status.WeightsMode != "Optimizing" && o.Status.WeightsMode != "Steady") {
			return fmt.Errorf("status.loadBalancer %q (%q), weightsMode %q", o.Status.LoadBalancer, o.Status.LoadBalancerReason, o.Status.WeightsMode)
		}
		return nil
	})
	if p, err := env.policy(ns, "lr"); err != nil || p != networking.LoadBalancerSettings_LEAST_REQUEST {
		t.Errorf("load_balancer LEAST_REQUEST: policy %v (%v)", p, err)
	}
	if o := env.optimizer(t, ns, "lr"); o.Status.LoadBalancer != "LEAST_REQUEST" || o.Status.LoadBalancerReason != "UserChoice" {
		t.Errorf("load_balancer LEAST_REQUEST: status.loadBalancer %q (%q)", o.Status.LoadBalancer, o.Status.LoadBalancerReason)
	}

	t.Run("CPUOnly", func(t *testing.T) { testCPUOnly(t, env, ns) })
}

// testCPUOnly: an optimizer whose request-rate query has no data, and one
// whose request_query is "-", run on CPU alone and say so (Degraded/CPUOnly
// and optimizer_signal_available{signal="requests"} 0); one with request
// rates does not. Deleting the optimizer deletes its series.
func testCPUOnly(t *testing.T, env *signalsEnv, ns string) {
	env.service(t, ns, "cpu", 100, 300)
	env.service(t, ns, "dash", 100, 300)
	// Pods without a CPU limit, and no node CPU: their cores are a guess.
	env.serviceOf(t, ns, "nolimit", func(*corev1.Pod) {}, 100, 300)
	if err := env.c.Create(context.Background(), Optimizer(ns, "nolimit", "nolimit")); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, "nolimit: Degraded CoresUnknown", func() error {
		d := meta.FindStatusCondition(env.optimizer(t, ns, "nolimit").Status.Conditions, optv1.ConditionDegraded)
		if d == nil || d.Status != "True" || d.Reason != "CoresUnknown" || !strings.Contains(d.Message, "2 pod(s) have no CPU limit") {
			return fmt.Errorf("Degraded %v", d)
		}
		return nil
	})
	dash := Optimizer(ns, "dash", "dash")
	dash.Spec.Optimization = &optv1.Optimization{RequestQuery: "-"}
	for _, o := range []client.Object{Optimizer(ns, "cpu", "cpu"), dash} {
		if err := env.c.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	available := func(svc, signal string) float64 {
		return testutil.ToFloat64(env.metrics.SignalAvailable.WithLabelValues(ns, svc, signal))
	}
	for svc, want := range map[string]string{
		"cpu":  "The request-rate query returned no data for the pods: weights rest on CPU alone",
		"dash": `request_query is "-": weights rest on CPU alone`,
	} {
		harness.Eventually(t, 20*time.Second, svc+": Degraded CPUOnly", func() error {
			d := meta.FindStatusCondition(env.optimizer(t, ns, svc).Status.Conditions, optv1.ConditionDegraded)
			if d == nil || d.Status != "True" || d.Reason != "CPUOnly" || !strings.Contains(d.Message, want) {
				return fmt.Errorf("Degraded %v", d)
			}
			if r, c := available(svc, "requests"), available(svc, "cpu"); r != 0 || c != 1 {
				return fmt.Errorf("signal_available requests %v cpu %v, want 0 and 1", r, c)
			}
			return nil
		})
	}
	// CPU alone with pods without a limit (a CPU request, no node CPU):
	// nothing would show them overloaded, so the weights are not learned
	// from and LEAST_REQUEST stays, while "cpu" (limits) is learned.
	env.serviceOf(t, ns, "blind", func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}
	}, 100, 300)
	if err := env.c.Create(context.Background(), Optimizer(ns, "blind", "blind")); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 20*time.Second, "cpu: ROUND_ROBIN once learned from CPU alone", func() error {
		if p, err := env.policy(ns, "cpu"); err != nil || p != networking.LoadBalancerSettings_ROUND_ROBIN {
			return fmt.Errorf("policy %v (%v)", p, err)
		}
		return nil
	})
	harness.Eventually(t, 20*time.Second, "blind: Degraded CoresUnknown, LEAST_REQUEST kept", func() error {
		o := env.optimizer(t, ns, "blind")
		d := meta.FindStatusCondition(o.Status.Conditions, optv1.ConditionDegraded)
		if d == nil || d.Status != "True" || !strings.Contains(d.Message, "LEAST_REQUEST is kept instead of ROUND_ROBIN") {
			return fmt.Errorf("Degraded %v", d)
		}
		if o.Status.LastOptimizationTime == nil {
			return fmt.Errorf("no optimization cycle yet")
		}
		return nil
	})
	// Cycles go on; the policy does not move.
	env.cycles(t, "blind", 3)
	if p, err := env.policy(ns, "blind"); err != nil || p != networking.LoadBalancerSettings_LEAST_REQUEST {
		t.Errorf("blind: policy %v (%v), want LEAST_REQUEST", p, err)
	}
	if o := env.optimizer(t, ns, "blind"); o.Status.LoadBalancer != "LEAST_REQUEST" {
		t.Errorf("blind: status.loadBalancer %q, want LEAST_REQUEST", o.Status.LoadBalancer)
	}

	// On CPU alone, a pod at its limit after learning: LEAST_REQUEST, and
	// it stays when the pod is below its limit again (until request rates
	// come), with Ready saying why.
	env.source.setCapacity("cpu-0", 50) // CPU 50/50 = 1 core, its limit
	harness.Eventually(t, 20*time.Second, "cpu: LEAST_REQUEST once a pod is at its limit", func() error {
		if p, err := env.policy(ns, "cpu"); err != nil || p != networking.LoadBalancerSettings_LEAST_REQUEST {
			return fmt.Errorf("policy %v (%v)", p, err)
		}
		ready := meta.FindStatusCondition(env.optimizer(t, ns, "cpu").Status.Conditions, optv1.ConditionReady)
		if ready == nil || !strings.Contains(ready.Message, "on CPU alone a pod reached its limit") {
			return fmt.Errorf("Ready %v", ready)
		}
		return nil
	})
	env.source.setCapacity("cpu-0", 100)
	env.cycles(t, "cpu", 4) // two query windows below the limit
	if p, err := env.policy(ns, "cpu"); err != nil || p != networking.LoadBalancerSettings_LEAST_REQUEST {
		t.Errorf("cpu: the pod below its limit again: policy %v (%v), want LEAST_REQUEST kept", p, err)
	}

	if d := meta.FindStatusCondition(env.optimizer(t, ns, "web").Status.Conditions, optv1.ConditionDegraded); d == nil || d.Status != "False" {
		t.Errorf("with request rates: Degraded %v, want False", d)
	}
	if r := available("web", "requests"); r != 1 {
		t.Errorf("with request rates: signal_available requests %v, want 1", r)
	}

	if err := env.c.Delete(context.Background(), env.optimizer(t, ns, "cpu")); err != nil {
		t.Fatal(err)
	}
	harness.Eventually(t, 10*time.Second, "series of the deleted optimizer gone", func() error {
		out, err := testutil.CollectAndFormat(env.metrics.SignalAvailable, expfmt.TypeTextPlain, "optimizer_signal_available")
		if err != nil {
			return err
		}
		if strings.Contains(string(out), `service_name="cpu"`) {
			return fmt.Errorf("still there:\n%s", out)
		}
		return nil
	})
}
