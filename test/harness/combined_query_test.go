package harness_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// TestCombinedQueriesWithRealPrometheus runs a cycle's six default queries
// (CPU, requests, latency, node CPU, and CPU and latency over two scrape
// intervals) and the looks' latency queries of two namespaces through a
// real Prometheus, once each alone and once combined by QueryParts, both
// evaluated at the same instant: every part gets the same per-pod values
// from the combined request as from its own, in one request per query
// length limit (and, under a limit too short for them, in several, with
// the long parts in chunks).
func TestCombinedQueriesWithRealPrometheus(t *testing.T) {
	cpu := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "container_cpu_usage_seconds_total",
		Help: "Cumulative cpu time consumed in seconds (as cAdvisor reports it).",
	}, []string{"namespace", "pod", "container", "node", "id"})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "istio_requests_total",
		Help: "Requests (as Istio's sidecar reports them).",
	}, []string{"reporter", "pod", "namespace", "destination_workload_namespace"})
	h := newSidecarHistograms()
	h.reg.MustRegister(cpu, requests)

	type pod struct {
		ns, name, node string
		cores, rps, ms float64
	}
	pods := []pod{
		{"shop", "web-0", "n1", 0.4, 100, 20},
		{"shop", "web.1", "n1", 0.3, 40, 80},
		{"shop", "web-2", "n2", 0.2, 60, 35},
		{"blog", "web-0", "n2", 0.1, 20, 10}, // same name, other namespace
		{"blog", "api-0", "n3", 0.5, 80, 50},
	}
	var cadvisor []cadvisorSeries
	var sidecars []sidecarSeries
	for _, p := range pods {
		id := "/kubepods/pod-" + p.ns + "-" + p.name
		cadvisor = append(cadvisor, cadvisorSeries{p.ns, p.name, "app", p.node, id + "/app", p.cores},
			cadvisorSeries{p.ns, p.name, "istio-proxy", p.node, id + "/istio-proxy", 0.05})
		sidecars = append(sidecars, sidecarSeries{"destination", p.name, p.ns, p.rps, p.ms})
	}
	for i, n := range []string{"n1", "n2", "n3"} {
		cadvisor = append(cadvisor, cadvisorSeries{"", "", "", n, "/", float64(i + 1)})
	}
	run := func(ctx context.Context) {
		go runCadvisor(ctx, cpu, cadvisor)
		go func() {
			tk := time.NewTicker(50 * time.Millisecond)
			defer tk.Stop()
			for {
				for _, p := range pods {
					requests.WithLabelValues("destination", p.name, p.ns, p.ns).Add(p.rps * 0.05)
				}
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
			}
		}()
		h.run(ctx, sidecars)
	}
	url := scrapedURL(t, h.reg, time.Second, run)
	src := sourceFor(t, url, 0)

	const window = 10 * time.Second
	shop := promsource.Target{Namespace: "shop", Service: "web", Pods: []string{"web-0", "web.1", "web-2"}, Window: window}
	blog := promsource.Target{Namespace: "blog", Service: "web", Pods: []string{"web-0", "api-0"}, Window: window}
	recent := func(t promsource.Target) promsource.Target { t.Window = 2 * time.Second; return t }
	parts := []promsource.Part{
		{Template: promsource.DefaultCPUQuery, Target: shop},
		{Template: promsource.DefaultRequestQuery, Target: shop},
		{Template: promsource.DefaultLatencyQuery, Target: shop},
		{Template: promsource.DefaultNodeCPUQuery, Target: shop},
		{Template: promsource.DefaultCPUQuery, Target: recent(shop)},
		{Template: promsource.DefaultLatencyQuery, Target: recent(shop)},
		// The looks of another namespace's optimizer, batched with these.
		{Template: promsource.DefaultLatencyQuery, Target: recent(blog)},
		{Template: promsource.DefaultCPUQuery, Target: blog},
	}
	time.Sleep(window + 3*time.Second)
	// One instant for every query, a little in the past so each scrape
	// it reads is in.
	now := time.Now().Add(-1500 * time.Millisecond).Truncate(time.Millisecond)

	var alone []map[string]float64
	for i, p := range parts {
		res, err := src.Query(t.Context(), p.Template, p.Target, now)
		if err != nil || res.Err() != nil || len(res.Values) != len(p.Target.Pods) {
			t.Fatalf("part %d alone: %v (err %v, issues %v), want a value per pod of %v", i, res.Values, err, res.Err(), p.Target.Pods)
		}
		alone = append(alone, res.Values)
	}
	compare := func(name string, got []promsource.PartResult) {
		t.Helper()
		for i, r := range got {
			if r.Err != nil || r.Result.Err() != nil {
				t.Fatalf("%s: part %d: %v, issues %v", name, i, r.Err, r.Result.Err())
			}
			if !maps.Equal(r.Result.Values, alone[i]) {
				t.Errorf("%s: part %d: %v, alone %v", name, i, r.Result.Values, alone[i])
			}
		}
	}
	compare("combined", src.QueryParts(t.Context(), parts, now))
	qs, err := promsource.CombinedQueries(parts, promsource.DefaultMaxQueryLength)
	if err != nil || len(qs) != 1 {
		t.Errorf("the eight parts in %d requests (%v), want 1", len(qs), err)
	}

	// Under a short limit: several requests, the long parts in chunks.
	short := sourceFor(t, url, promsource.MinMaxQueryLength)
	compare("under a 512-byte limit", short.QueryParts(t.Context(), parts, now))
	qs, _ = promsource.CombinedQueries(parts, promsource.MinMaxQueryLength)
	t.Logf("eight parts: one request of %d bytes; %d requests under a 512-byte limit", len(mustCombined(t, parts)), len(qs))
}

func mustCombined(t *testing.T, parts []promsource.Part) string {
	qs, err := promsource.CombinedQueries(parts, promsource.DefaultMaxQueryLength)
	if err != nil || len(qs) != 1 {
		t.Fatalf("combined: %d queries, %v", len(qs), err)
	}
	return qs[0]
}
