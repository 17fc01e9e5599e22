package harness_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// requestSeries is one istio_requests_total series as a sidecar exposes it
// (the pod and namespace labels stand for the scrape target's, as in Istio's
// kubernetes-pods job), growing at rps requests per second.
type requestSeries struct {
	reporter, pod, namespace string
	// destinationService and destinationServiceNamespace: what the client's
	// sidecar reports (the host it sent to and that host's namespace).
	destinationService, destinationServiceNamespace string
	sourceWorkload, sourceNamespace                 string
	rps                                             float64
}

// requestCounters exposes requestSeries as counters read exactly at scrape
// time, so rates over any window are known.
type requestCounters struct {
	start  time.Time
	series []requestSeries
	desc   *prometheus.Desc
}

var requestLabels = []string{"reporter", "pod", "namespace", "destination_workload_namespace", "destination_service", "destination_service_namespace", "source_workload", "source_workload_namespace", "response_code"}

func newRequestCounters(series []requestSeries) *requestCounters {
	return &requestCounters{start: time.Now(), series: series,
		desc: prometheus.NewDesc("istio_requests_total", "Requests, as Istio's sidecars count them.", requestLabels, nil)}
}

func (c *requestCounters) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *requestCounters) Collect(ch chan<- prometheus.Metric) {
	elapsed := time.Since(c.start).Seconds()
	for _, s := range c.series {
		destNS := ""
		if s.reporter == "destination" {
			destNS = s.namespace
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, s.rps*elapsed,
			s.reporter, s.pod, s.namespace, destNS, s.destinationService, s.destinationServiceNamespace, s.sourceWorkload, s.sourceNamespace, "200")
	}
}

// TestCoverageQueryWithRealPrometheus runs DefaultCoverageQuery through a
// real Prometheus scraping the series sidecars report for a Service whose
// clients take several paths: a sidecar client through the optimized host
// (60 rps), an ingress gateway straight to the Kubernetes host (30 rps),
// clients without a sidecar (10 rps) and six small clients (1 rps each).
// The answer has the received and weighted totals and the five largest
// bypassing sources, largest first; the same names in another namespace and
// traffic to another Service's optimized host are not mixed in.
func TestCoverageQueryWithRealPrometheus(t *testing.T) {
	const (
		host    = "web.shop.adaptive"
		k8sHost = "web.shop.svc.cluster.local"
	)
	dest := func(pod, srcWL, srcNS string, rps float64) requestSeries {
		return requestSeries{reporter: "destination", pod: pod, namespace: "shop", destinationService: host, destinationServiceNamespace: "shop",
			sourceWorkload: srcWL, sourceNamespace: srcNS, rps: rps}
	}
	src := func(pod, ns, dst, dstNS string, rps float64) requestSeries {
		wl, _, _ := strings.Cut(pod, "-")
		return requestSeries{reporter: "source", pod: pod, namespace: ns, destinationService: dst, destinationServiceNamespace: dstNS,
			sourceWorkload: wl, sourceNamespace: ns, rps: rps}
	}
	series := []requestSeries{
		// frontend: 60 rps through the weights.
		src("frontend-0", "shop", host, "shop", 60),
		dest("web-0", "frontend", "shop", 30), dest("web.1", "frontend", "shop", 30),
		// The ingress gateway: 30 rps to the Kubernetes host.
		src("gateway-0", "istio-system", k8sHost, "shop", 30),
		dest("web-0", "gateway", "istio-system", 15), dest("web.1", "gateway", "istio-system", 15),
		// Clients without a sidecar: only the server side reports them.
		dest("web-0", "unknown", "unknown", 10),
		// Another Service's optimized host and another namespace's pod of the
		// same name, and a regex look-alike of web.1.
		src("frontend-0", "shop", "api.other.adaptive", "other", 500),
		{reporter: "destination", pod: "web-0", namespace: "other", sourceWorkload: "batch", sourceNamespace: "other", rps: 400},
		dest("webx1", "batch", "shop", 300),
	}
	for _, wl := range []string{"a", "b", "c", "d", "e", "f"} {
		series = append(series, dest("web-0", "small-"+wl, "jobs", 1))
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newRequestCounters(series))
	source := scrapedSource(t, reg, time.Second, nil)
	target := promsource.Target{Namespace: "shop", Service: "web", Host: host, Pods: []string{"web-0", "web.1"}, Window: 10 * time.Second}
	time.Sleep(target.Window + 2*time.Second)

	c, err := source.QueryCoverage(t.Context(), promsource.DefaultCoverageQuery, target, time.Time{})
	if err != nil {
		t.Fatalf("coverage query %s: %v", c.Query, err)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 0.1*want {
			t.Errorf("%s = %.2f, want %.2f ± 10%% (query %s)", what, got, want, c.Query)
		}
	}
	near("received rps", c.Received, 106)
	near("weighted rps", c.Weighted, 60)
	ratio, ok := c.Ratio()
	if !ok {
		t.Fatalf("no ratio from %+v", c)
	}
	near("coverage ratio", ratio, 60.0/106)
	if len(c.Bypass) != promsource.MaxBypassSources {
		t.Fatalf("bypassing sources %v, want the %d largest", c.Bypass, promsource.MaxBypassSources)
	}
	if got := c.Bypass[0]; got.Namespace != "istio-system" || got.Workload != "gateway" {
		t.Errorf("largest bypassing source %v, want istio-system/gateway", got)
	}
	near("gateway bypass rps", c.Bypass[0].Rate, 30)
	if got := c.Bypass[1]; got.Workload != "unknown" {
		t.Errorf("second bypassing source %v, want unknown (clients without a sidecar)", got)
	}
	near("sidecarless bypass rps", c.Bypass[1].Rate, 10)
	for _, b := range c.Bypass {
		if b.Workload == "frontend" || b.Workload == "batch" {
			t.Errorf("source %v listed as bypassing; frontend goes through the weights and batch is another namespace's or another pod's", b)
		}
	}
	t.Logf("coverage %.3f: received %.1f rps, weighted %.1f rps, bypassing %v, in %v via %s", ratio, c.Received, c.Weighted, c.Bypass, c.Latency, c.Query)

	// A Service of 500 pods (498 of them Deployment pods without traffic):
	// the query names them three times, over the 12 KiB limit, and is sent
	// with their names factored by prefix; the figures are the same.
	large := target
	large.Pods = append([]string(nil), target.Pods...)
	for i := range 498 {
		large.Pods = append(large.Pods, fmt.Sprintf("web-5d8f7c9b4-%05x", i*7919))
	}
	c, err = source.QueryCoverage(t.Context(), promsource.DefaultCoverageQuery, large, time.Time{})
	if err != nil {
		t.Fatalf("coverage query of 500 pods (%d bytes): %v", len(c.Query), err)
	}
	if plain, _ := promsource.Render(promsource.DefaultCoverageQuery, large); len(plain) <= promsource.DefaultMaxQueryLength {
		t.Fatalf("the plain query of 500 pods is %d bytes, within the limit: the test needs one over it", len(plain))
	}
	if !strings.Contains(c.Query, "web-5d8f7c9b4-(?:") {
		t.Errorf("the query of 500 pods does not factor their names: %.300s", c.Query)
	}
	near("received rps of 500 pods", c.Received, 106)
	near("weighted rps of 500 pods", c.Weighted, 60)
	if len(c.Bypass) == 0 || c.Bypass[0].Workload != "gateway" {
		t.Errorf("bypassing sources of 500 pods %v, want istio-system/gateway first", c.Bypass)
	}

	// A Service nobody calls has no figure rather than 0.
	quiet := target
	quiet.Pods, quiet.Host = []string{"idle-0"}, "idle.shop.adaptive"
	c, err = source.QueryCoverage(t.Context(), promsource.DefaultCoverageQuery, quiet, time.Time{})
	if err != nil {
		t.Fatalf("coverage query %s: %v", c.Query, err)
	}
	if r, ok := c.Ratio(); ok {
		t.Errorf("idle Service: coverage %v, want none", r)
	}
}
