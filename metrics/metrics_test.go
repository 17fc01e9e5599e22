package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func f(v float64) *float64 { return &v }

func TestSetPodsDeletesSeriesOfGonePods(t *testing.T) {
	m := New()
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	m.SetPods("shop", "cart", []PodSample{
		{Pod: "a", IP: "198.18.0.1", Locality: "r/z", Weight: 900, Signals: true, CPU: f(0.5), Capacity: f(1.2)},
		{Pod: "b", IP: "198.18.0.2", Locality: "r/z", Weight: 1100, Signals: true, CPU: f(0.7)},
	})
	m.SetPods("shop", "other", []PodSample{{Pod: "x", IP: "198.18.1.1", Weight: 1000}})
	if got := testutil.CollectAndCount(m.EndpointWeight); got != 3 {
		t.Fatalf("endpoint_weight series = %d, want 3", got)
	}
	// Pod a goes away: all its series go with it, b's and the other
	// service's stay.
	m.SetPods("shop", "cart", []PodSample{{Pod: "b", IP: "198.18.0.2", Locality: "r/z", Weight: 1000}})
	want := `
# HELP endpoint_weight Weight of a ServiceEntry endpoint as computed by the optimizer (applied unless dry run).
# TYPE endpoint_weight gauge
endpoint_weight{locality="",pod_ip="198.18.1.1",service_name="other",service_namespace="shop"} 1000
endpoint_weight{locality="r/z",pod_ip="198.18.0.2",service_name="cart",service_namespace="shop"} 1000
`
	if err := testutil.CollectAndCompare(m.EndpointWeight, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if got := testutil.CollectAndCount(m.PodCPU); got != 1 {
		t.Errorf("optimizer_pod_cpu_cores series = %d, want 1 (pod b)", got)
	}
	if got := testutil.CollectAndCount(m.PodCapacity); got != 0 {
		t.Errorf("optimizer_pod_capacity_estimate series = %d, want 0 (only a had one)", got)
	}
}

func TestForgetServiceDeletesEverySeriesOfTheService(t *testing.T) {
	m := New()
	m.SetPods("shop", "cart", []PodSample{{Pod: "a", IP: "198.18.0.1", Weight: 1}})
	m.SetPods("shop", "keep", []PodSample{{Pod: "k", IP: "198.18.0.9", Weight: 1}})
	m.QueryLatency.WithLabelValues("cart", "shop").Set(0.1)
	m.Cycles.WithLabelValues("shop", "cart", "Optimizing").Inc()
	m.SetMode("shop", "cart", "Optimizing")
	m.SetMode("shop", "cart", "Holding")
	if got := testutil.ToFloat64(m.Mode.WithLabelValues("shop", "cart", "Holding")); got != 1 {
		t.Errorf("mode Holding = %v", got)
	}
	if got := testutil.CollectAndCount(m.Mode); got != 1 {
		t.Errorf("optimizer_mode is one-hot: %d series", got)
	}
	m.ForgetService("shop", "cart")
	for name, c := range map[string]prometheus.Collector{"endpoint_weight": m.EndpointWeight, "query_latency": m.QueryLatency, "cycles": m.Cycles, "mode": m.Mode} {
		n := testutil.CollectAndCount(c)
		if name == "endpoint_weight" && n != 1 || name != "endpoint_weight" && n != 0 {
			t.Errorf("%s: %d series left after ForgetService", name, n)
		}
	}
}

func TestContractNames(t *testing.T) {
	m := New()
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	m.SetPods("ns", "svc", []PodSample{{Pod: "p", IP: "ip", Locality: "loc", Weight: 1}})
	m.ReconcileError("optimizer.mirror", "conflict", "o", "ns")
	m.QueryLatency.WithLabelValues("svc", "ns").Set(1)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, mf := range mfs {
		var names []string
		for _, l := range mf.GetMetric()[0].GetLabel() {
			names = append(names, l.GetName())
		}
		labels[mf.GetName()] = strings.Join(names, ",")
	}
	// The user's contract: exact names and label sets.
	for name, want := range map[string]string{
		"endpoint_weight":   "locality,pod_ip,service_name,service_namespace",
		"reconciler_errors": "controller,name,namespace,type",
		"query_latency":     "service_name,service_namespace",
	} {
		if labels[name] != want {
			t.Errorf("%s labels = %q, want %q", name, labels[name], want)
		}
	}
}

func TestConditionSeriesReplaceAndForget(t *testing.T) {
	m := New()
	m.SetCondition("ns", "web", "Stalled", "True", "ServiceNotFound")
	m.SetCondition("ns", "web", "Stalled", "False", "Reconciled")
	m.SetCondition("ns", "web", "Ready", "True", "Reconciled")
	if got := testutil.CollectAndCount(m.Condition); got != 2 {
		t.Fatalf("series = %d, want one per condition type", got)
	}
	if got := testutil.ToFloat64(m.Condition.WithLabelValues("ns", "web", "Stalled", "False", "Reconciled")); got != 1 {
		t.Errorf("Stalled False = %v", got)
	}
	m.ForgetOptimizer("ns", "web")
	if got := testutil.CollectAndCount(m.Condition); got != 0 {
		t.Errorf("series left after ForgetOptimizer: %d", got)
	}
}

// A new pod that takes a gone pod's IP keeps its endpoint_weight series
// (both have the same labels).
func TestSetPodsReusedIPKeepsTheNewPodsSeries(t *testing.T) {
	m := New()
	m.SetPods("shop", "cart", []PodSample{{Pod: "a", IP: "198.18.0.1", Locality: "r/z", Weight: 900}})
	m.SetPods("shop", "cart", []PodSample{{Pod: "b", IP: "198.18.0.1", Locality: "r/z", Weight: 1100}})
	want := `
# HELP endpoint_weight Weight of a ServiceEntry endpoint as computed by the optimizer (applied unless dry run).
# TYPE endpoint_weight gauge
endpoint_weight{locality="r/z",pod_ip="198.18.0.1",service_name="cart",service_namespace="shop"} 1100
`
	if err := testutil.CollectAndCompare(m.EndpointWeight, strings.NewReader(want)); err != nil {
		t.Errorf("endpoint_weight of the new pod: %v", err)
	}
	// Both in one set (the old pod not yet gone from the slice): one
	// series, the later one's, and the scrape does not fail.
	m.SetPods("shop", "cart", []PodSample{{Pod: "a", IP: "198.18.0.1", Locality: "r/z", Weight: 900}, {Pod: "b", IP: "198.18.0.1", Locality: "r/z", Weight: 1100}})
	if err := testutil.CollectAndCompare(m.EndpointWeight, strings.NewReader(want)); err != nil {
		t.Errorf("endpoint_weight with a shared address: %v", err)
	}
	if v, ok := m.EndpointWeightValue("shop", "cart", "198.18.0.1", "r/z"); !ok || v != 1100 {
		t.Errorf("EndpointWeightValue = %v, %v; want 1100, true", v, ok)
	}
	if _, ok := m.EndpointWeightValue("shop", "cart", "198.18.0.9", "r/z"); ok {
		t.Errorf("EndpointWeightValue found a series for an address with none")
	}
}

// A set without Signals (the mirror's, between cycles) keeps each pod's
// last CPU, request rate and capacity; a new pod has none yet.
func TestSetPodsWithoutSignalsKeepsTheLastValues(t *testing.T) {
	m := New()
	m.SetPods("shop", "cart", []PodSample{{Pod: "a", IP: "198.18.0.1", Weight: 900, Signals: true, CPU: f(0.5), RequestRate: f(10), Capacity: f(1.2)}})
	m.SetPods("shop", "cart", []PodSample{{Pod: "a", IP: "198.18.0.1", Weight: 1000}, {Pod: "c", IP: "198.18.0.3", Weight: 1000}})
	want := `
# HELP optimizer_pod_cpu_cores CPU cores each pod used over the query window, as the metrics backend reported.
# TYPE optimizer_pod_cpu_cores gauge
optimizer_pod_cpu_cores{locality="",pod="a",pod_ip="198.18.0.1",service_name="cart",service_namespace="shop"} 0.5
# HELP optimizer_pod_capacity_estimate Relative capacity estimate of each pod (mean 1).
# TYPE optimizer_pod_capacity_estimate gauge
optimizer_pod_capacity_estimate{locality="",pod="a",pod_ip="198.18.0.1",service_name="cart",service_namespace="shop"} 1.2
`
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.PodCPU, m.PodCapacity)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if got := testutil.CollectAndCount(m.EndpointWeight); got != 2 {
		t.Errorf("endpoint_weight series = %d, want 2", got)
	}
}
