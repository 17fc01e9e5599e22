package controllers

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// queryRateTarget is issue 27's bound on the metrics backend's load: at
// the defaults (a cycle every 30 s, under ROUND_ROBIN a look every scrape
// interval of 15 s) at most 0.1 queries per second per optimizer, so 1000
// opted-in Services cost the backend at most 100 queries a second.
const queryRateTarget = 0.1

// TestQueryLoadAtScale runs the weight loop of 1000 optimizers (3 pods
// each, the default settings and queries) against a real Prometheus that
// scrapes every pod's cAdvisor and sidecar series every 15 s (the default
// scrape interval), until the engines have learned and ROUND_ROBIN is live
// with its looks between cycles, and then measures, over a window of
// cycles, the backend's queries per second from Prometheus's own counters
// (prometheus_http_requests_total{handler="/api/v1/query"} and
// prometheus_engine_query_duration_seconds_count{slice="inner_eval"}), its
// CPU (process_cpu_seconds_total) and the cycles' lateness
// (optimizer_cycle_lateness_seconds). It asserts the per-optimizer rate,
// a count of queries over the window divided by it.
//
// The loop is driven directly, with the mirror's part (applying the
// weights each cycle computed) played by the test: a thousand optimizers
// through the whole manager would need a thousand Services, 3000
// EndpointSlices and pods in the API server and the mirror's reconciles,
// which measure the API server, not the query load (test/scale does that).
//
// SCALE=full runs it (about 8 minutes); QUERYLOAD_OPTIMIZERS,
// QUERYLOAD_NAMESPACES and QUERYLOAD_WINDOW change the fleet and the window.
func TestQueryLoadAtScale(t *testing.T) {
	if os.Getenv("SCALE") != "full" {
		t.Skip("run with SCALE=full: about 8 minutes with 1000 optimizers and a real Prometheus (see docs/scale.md)")
	}
	n := envInt(t, "QUERYLOAD_OPTIMIZERS", 1000)
	namespaces := envInt(t, "QUERYLOAD_NAMESPACES", 100)
	window := 2 * time.Minute
	if v := os.Getenv("QUERYLOAD_WINDOW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("QUERYLOAD_WINDOW=%s: %v", v, err)
		}
		window = d
	}
	const podsPer = 3
	s, err := settingsFor(optimizerFor("ns", "web"), DefaultEngineDefaults())
	if err != nil {
		t.Fatal(err)
	}

	// The fleet: every pod half busy on its 2-core limit, 100 requests/s
	// at 20 ms, on one of 50 nodes.
	type fleetOpt struct {
		key types.NamespacedName
		eps []desired.Endpoint
	}
	exp := &fleetExporter{start: time.Now()}
	var opts []fleetOpt
	for i := range n {
		ns := fmt.Sprintf("team-%03d", i%namespaces)
		svc := fmt.Sprintf("svc-%04d", i)
		o := fleetOpt{key: types.NamespacedName{Namespace: ns, Name: svc}}
		for p := range podsPer {
			pod := fmt.Sprintf("%s-7f9c8d6b5-%05d", svc, p)
			exp.pods = append(exp.pods, loadPod{ns: ns, name: pod, node: fmt.Sprintf("node-%02d", (i*podsPer+p)%50), cores: 1, rps: 100, ms: 20})
			o.eps = append(o.eps, desired.Endpoint{Pod: pod, Address: fmt.Sprintf("127.%d.%d.%d", 1+i/250, i%250, p+1), Cores: 2, Weight: 1000})
		}
		opts = append(opts, o)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: exp, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	prom := harness.MustStartPrometheus(t, harness.PrometheusOptions{Targets: []string{ln.Addr().String()}, ScrapeInterval: s.Params.ScrapeInterval})
	wctx, wcancel := context.WithTimeout(t.Context(), time.Minute)
	defer wcancel()
	if err := prom.WaitForTargets(wctx, []string{ln.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	src, err := promsource.New(promsource.Config{URL: prom.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()

	m := metrics.New()
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	book := NewWeightBook()
	wake := make(chan event.GenericEvent, n)
	loop := &WeightLoop{Source: src, Book: book, Clock: clock.RealClock{}, Metrics: m, Wake: wake}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	byKey := map[types.NamespacedName]fleetOpt{}
	for _, o := range opts {
		byKey[o.key] = o
		book.Configure(o.key, time.Now(), s)
		book.Applied(o.key, s.Params, time.Now(), o.eps)
	}
	// The mirror's part: after each cycle, the weights it computed are
	// applied.
	var mirror sync.WaitGroup
	mirror.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-wake:
				key := types.NamespacedName{Namespace: ev.Object.GetNamespace(), Name: ev.Object.GetName()}
				eps := byKey[key].eps
				w := book.WeightsFor(key, s.Params, time.Now(), eps, LiveEndpoints{}, true)
				applied := append([]desired.Endpoint(nil), eps...)
				for i := range applied {
					applied[i].Weight = w[applied[i].Pod]
				}
				book.Applied(key, s.Params, time.Now(), applied)
			}
		}
	})
	defer mirror.Wait()
	defer cancel()
	go func() { _ = loop.Start(ctx) }()
	for _, o := range opts {
		loop.Ensure(optimizerFor(o.key.Namespace, o.key.Name), s)
	}

	// Until ROUND_ROBIN is live on learned weights (looks wanted) for
	// nearly all of them.
	looking := func() int {
		k := 0
		for _, o := range opts {
			if book.LookWanted(o.key) {
				k++
			}
		}
		return k
	}
	warm := time.Now()
	for looking() < n*95/100 {
		if time.Since(warm) > 8*time.Minute {
			t.Fatalf("after %v only %d of %d optimizers look between cycles (learned, ROUND_ROBIN)", time.Since(warm).Round(time.Second), looking(), n)
		}
		time.Sleep(5 * time.Second)
	}
	t.Logf("%d of %d optimizers learned and looking after %v", looking(), n, time.Since(warm).Round(time.Second))

	before, err := promSelf(prom)
	if err != nil {
		t.Fatal(err)
	}
	ours0 := gatherLoad(t, reg)
	start := time.Now()
	time.Sleep(window)
	after, err := promSelf(prom)
	if err != nil {
		t.Fatal(err)
	}
	elapsed := time.Since(start).Seconds()
	ours1 := gatherLoad(t, reg)
	stillLooking := looking()

	requests := after.requests - before.requests
	evals := after.evals - before.evals
	cpu := after.cpu - before.cpu
	cycles := ours1.cycles - ours0.cycles
	perOpt := requests / elapsed / float64(n)
	late := ours1.lateness.minus(ours0.lateness)
	t.Logf("%d optimizers in %d namespaces, %d pods, window %.0fs: %d query requests (%.1f/s, %.4f/s per optimizer), %d evaluations (%.1f/s), Prometheus CPU %.2f cores, %d cycles (%.1f/s), cycle lateness p50 <= %s, p99 <= %s, max <= %s (%d cycles); %d looking at the end",
		n, namespaces, n*podsPer, elapsed, int(requests), requests/elapsed, perOpt, int(evals), evals/elapsed, cpu/elapsed,
		int(cycles), cycles/elapsed, late.quantile(0.5), late.quantile(0.99), late.quantile(1), late.count, stillLooking)
	if perOpt > queryRateTarget {
		t.Errorf("%.4f queries/s per optimizer, want at most %v", perOpt, queryRateTarget)
	}
	// Not fewer queries by doing less: every optimizer cycled about once
	// per cycle (30 s plus a jitter of up to a tenth), and the looks ran.
	if want := float64(n) * elapsed / (s.Cycle.Seconds() * 1.1) * 0.9; cycles < want {
		t.Errorf("%d cycles in %.0fs, want at least %.0f", int(cycles), elapsed, want)
	}
	if stillLooking < n*9/10 {
		t.Errorf("only %d of %d optimizers looking between cycles at the end of the window", stillLooking, n)
	}
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	i, err := strconv.Atoi(v)
	if err != nil || i <= 0 {
		t.Fatalf("%s=%s: want a positive integer", name, v)
	}
	return i
}

// loadPod is one pod of the synthetic fleet.
type loadPod struct {
	ns, name, node string
	cores, rps, ms float64
}

// fleetExporter exposes, for every pod, the series the default queries
// read, as counters growing at the pod's rates since start: cAdvisor's
// container_cpu_usage_seconds_total (with the node label, and each node's
// root cgroup) and the sidecar's istio_requests_total and
// istio_request_duration_milliseconds _sum and _count, with the pod and
// namespace labels of the scrape target.
type fleetExporter struct {
	start time.Time
	pods  []loadPod
}

func (f *fleetExporter) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	el := time.Since(f.start).Seconds()
	var b strings.Builder
	nodes := map[string]float64{}
	b.WriteString("# TYPE container_cpu_usage_seconds_total counter\n")
	for _, p := range f.pods {
		fmt.Fprintf(&b, "container_cpu_usage_seconds_total{namespace=%q,pod=%q,container=\"app\",node=%q,id=\"/kubepods/%s\"} %g\n", p.ns, p.name, p.node, p.name, p.cores*el)
		nodes[p.node] += p.cores
	}
	for node, cores := range nodes {
		fmt.Fprintf(&b, "container_cpu_usage_seconds_total{id=\"/\",node=%q} %g\n", node, (cores+0.5)*el)
	}
	b.WriteString("# TYPE istio_requests_total counter\n")
	for _, p := range f.pods {
		fmt.Fprintf(&b, "istio_requests_total{reporter=\"destination\",pod=%q,namespace=%q,destination_workload_namespace=%q} %g\n", p.name, p.ns, p.ns, p.rps*el)
	}
	for _, p := range f.pods {
		fmt.Fprintf(&b, "istio_request_duration_milliseconds_sum{reporter=\"destination\",pod=%q,namespace=%q,destination_workload_namespace=%q} %g\n", p.name, p.ns, p.ns, p.rps*p.ms*el)
		fmt.Fprintf(&b, "istio_request_duration_milliseconds_count{reporter=\"destination\",pod=%q,namespace=%q,destination_workload_namespace=%q} %g\n", p.name, p.ns, p.ns, p.rps*el)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = w.Write([]byte(b.String()))
}

// promLoad is what Prometheus says of its own load.
type promLoad struct{ requests, evals, cpu float64 }

// promSelf reads Prometheus's own /metrics (not a query: it adds nothing
// to what it counts).
func promSelf(p *harness.Prometheus) (promLoad, error) {
	resp, err := http.Get("http://" + p.Addr + strings.TrimSuffix(strings.TrimPrefix(p.URL, "http://"+p.Addr), "/") + "/metrics")
	if err != nil {
		return promLoad{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return promLoad{}, err
	}
	var l promLoad
	label := func(m *dto.Metric, name string) string {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == name {
				return lp.GetValue()
			}
		}
		return ""
	}
	for _, m := range fams["prometheus_http_requests_total"].GetMetric() {
		if label(m, "handler") == "/api/v1/query" {
			l.requests += m.GetCounter().GetValue()
		}
	}
	for _, m := range fams["prometheus_engine_query_duration_seconds"].GetMetric() {
		if label(m, "slice") == "inner_eval" {
			l.evals += float64(m.GetSummary().GetSampleCount())
		}
	}
	for _, m := range fams["process_cpu_seconds_total"].GetMetric() {
		l.cpu += m.GetCounter().GetValue()
	}
	if fams["prometheus_http_requests_total"] == nil {
		return l, fmt.Errorf("no prometheus_http_requests_total on Prometheus's /metrics")
	}
	return l, nil
}

// loopLoad is what the loop's own metrics say: cycles run, and the
// lateness histogram (read by name).
type loopLoad struct {
	cycles   float64
	lateness histo
}

type histo struct {
	bounds []float64
	counts []uint64 // cumulative, per bound
	count  uint64
}

func (h histo) minus(o histo) histo {
	out := histo{bounds: h.bounds, counts: make([]uint64, len(h.counts)), count: h.count - o.count}
	for i := range h.counts {
		out.counts[i] = h.counts[i]
		if i < len(o.counts) {
			out.counts[i] -= o.counts[i]
		}
	}
	return out
}

// quantile is the upper bound of the bucket holding quantile q ("+Inf"
// past the last).
func (h histo) quantile(q float64) string {
	if h.count == 0 {
		return "n/a"
	}
	rank := uint64(math.Ceil(q * float64(h.count)))
	for i, c := range h.counts {
		if c >= rank {
			return strconv.FormatFloat(h.bounds[i], 'g', -1, 64) + "s"
		}
	}
	return "+Inf"
}

func gatherLoad(t *testing.T, reg *prometheus.Registry) loopLoad {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var l loopLoad
	for _, f := range fams {
		switch f.GetName() {
		case "optimizer_cycles_total":
			for _, m := range f.GetMetric() {
				l.cycles += m.GetCounter().GetValue()
			}
		case "optimizer_cycle_lateness_seconds":
			for _, m := range f.GetMetric() {
				h := m.GetHistogram()
				l.lateness.count = h.GetSampleCount()
				for _, b := range h.GetBucket() {
					l.lateness.bounds = append(l.lateness.bounds, b.GetUpperBound())
					l.lateness.counts = append(l.lateness.counts, b.GetCumulativeCount())
				}
			}
		}
	}
	return l
}
