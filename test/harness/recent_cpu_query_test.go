package harness_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// cpuCounter is a container's CPU-seconds counter that grows at cores per
// second, read exactly at scrape time; step changes the rate from now on.
type cpuCounter struct {
	mu    sync.Mutex
	at    time.Time // when cores last changed
	total float64   // CPU-seconds until at
	cores float64
}

func newCPUCounter(cores float64) *cpuCounter {
	return &cpuCounter{at: time.Now(), cores: cores}
}

func (c *cpuCounter) value() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total + c.cores*time.Since(c.at).Seconds()
}

func (c *cpuCounter) step(cores float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.total += c.cores * now.Sub(c.at).Seconds()
	c.at, c.cores = now, cores
}

// checkRecentQuery is checkValues for a window of two scrape intervals: it
// holds two samples of a series only while the scrapes keep their
// schedule, so a late scrape leaves a pod out for a moment (the operator
// then has no recent value for it that cycle). An answer without every pod
// is asked again; a value off by more than tol (relative) fails.
func checkRecentQuery(t *testing.T, src *promsource.Source, tmpl string, target promsource.Target, want map[string]float64, tol float64) promsource.Result {
	t.Helper()
	var (
		res promsource.Result
		err error
	)
	for i := range 10 {
		if i > 0 {
			time.Sleep(300 * time.Millisecond)
		}
		// An empty answer (every pod between two samples) is an error.
		if res, err = src.Query(t.Context(), tmpl, target, time.Time{}); err == nil && len(res.Values) == len(want) {
			break
		}
	}
	if err != nil || len(res.Values) != len(want) {
		t.Fatalf("query %s: values %v (error %v, issues %v), want pods of %v", res.Query, res.Values, err, res.Err(), want)
	}
	for pod, w := range want {
		if v := res.Values[pod]; math.Abs(v-w) > tol*w {
			t.Fatalf("query %s: %s = %v, want %v ± %.0f%% (all values %v)", res.Query, pod, v, w, 100*tol, res.Values)
		}
	}
	return res
}

// checkRecent is checkRecentQuery for the CPU query, within 3%.
func checkRecent(t *testing.T, src *promsource.Source, target promsource.Target, want map[string]float64) promsource.Result {
	t.Helper()
	return checkRecentQuery(t, src, promsource.DefaultCPUQuery, target, want, 0.03)
}

// TestRecentCPUQueryWithRealPrometheus runs DefaultCPUQuery through a real
// Prometheus twice, as each weight cycle does: over the query window and over
// two scrape intervals (the recent CPU). A pod whose CPU has just risen to
// its limit shows the new rate over the two scrape intervals while the
// window's rate still averages in the old one; a steady pod gets the same
// from both. The sidecar and the pod-level aggregate are left out of both.
func TestRecentCPUQueryWithRealPrometheus(t *testing.T) {
	const (
		scrape = time.Second
		window = 10 * time.Second
	)
	reg := prometheus.NewRegistry()
	series := map[[3]string]*cpuCounter{
		{"shop", "web-0", "app"}:         newCPUCounter(0.5),
		{"shop", "web-0", "istio-proxy"}: newCPUCounter(0.05),
		{"shop", "web-0", ""}:            newCPUCounter(0.55), // the pod-level aggregate
		{"shop", "web-1", "app"}:         newCPUCounter(0.2),
		{"shop", "web-1", "istio-proxy"}: newCPUCounter(0.05),
		{"shop", "web-1", ""}:            newCPUCounter(0.25),
	}
	for labels, c := range series {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "container_cpu_usage_seconds_total",
			Help:        "Cumulative cpu time consumed in seconds (as cAdvisor reports it).",
			ConstLabels: prometheus.Labels{"namespace": labels[0], "pod": labels[1], "container": labels[2]},
		}, c.value))
	}

	src := scrapedSource(t, reg, scrape, nil)
	full := promsource.Target{Namespace: "shop", Service: "web", Pods: []string{"web-0", "web-1"}, Window: window}
	recent := full
	recent.Window = 2 * scrape

	// Both windows full of samples at the first rates: the two agree.
	time.Sleep(window + 2*scrape)
	checkValues(t, src, promsource.DefaultCPUQuery, full, map[string]float64{"web-0": 0.5, "web-1": 0.2}, 0.03)
	res := checkRecent(t, src, recent, map[string]float64{"web-0": 0.5, "web-1": 0.2})
	t.Logf("steady: recent CPU %v via %s", res.Values, res.Query)

	// web-1 reaches its limit of 1 core. Three scrape intervals later the
	// last two hold only samples at the new rate; the window's mostly old.
	series[[3]string{"shop", "web-1", "app"}].step(1)
	series[[3]string{"shop", "web-1", ""}].step(1.05)
	time.Sleep(3*scrape + scrape/2)
	long, err := src.Query(t.Context(), promsource.DefaultCPUQuery, full, time.Time{})
	if err != nil || long.Err() != nil {
		t.Fatalf("query %s: %v %v", long.Query, err, long.Err())
	}
	res = checkRecent(t, src, recent, map[string]float64{"web-0": 0.5, "web-1": 1})
	if v := long.Values["web-1"]; !(v > 0.25 && v < 0.75) {
		t.Errorf("web-1 over the %v window: %v cores, want between the old 0.2 and the new 1 (a mix of both)", window, v)
	}
	if v := long.Values["web-0"]; math.Abs(v-0.5) > 0.015 {
		t.Errorf("web-0 over the %v window: %v cores, want 0.5", window, v)
	}
	if res.Values["web-1"]-long.Values["web-1"] < 0.25 {
		t.Errorf("web-1: recent %v, window %v: the recent CPU does not show the rise", res.Values["web-1"], long.Values["web-1"])
	}
	t.Logf("after the rise: recent CPU %v via %s; over the window %v via %s", res.Values, res.Query, long.Values, long.Query)
}
