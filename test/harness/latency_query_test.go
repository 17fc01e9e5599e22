package harness_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// sidecarHistograms serves Istio's istio_request_duration_milliseconds the
// way sidecars expose it, for several pods on one endpoint (the pod and
// namespace labels in the exposition stand for the scrape target's): each
// series gets rps observations per second of a fixed duration.
type sidecarHistograms struct {
	hist *prometheus.HistogramVec
	reg  *prometheus.Registry

	mu     sync.Mutex
	series []sidecarSeries // what run observes, set by run and setMillis
}

type sidecarSeries struct {
	reporter, pod, namespace string
	rps, millis              float64
}

func newSidecarHistograms() *sidecarHistograms {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "istio_request_duration_milliseconds",
		Help: "Duration of requests (as Istio's sidecar reports it).",
		// Istio's default buckets.
		Buckets: []float64{0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 600000, 1800000, 3600000},
	}, []string{"reporter", "pod", "namespace", "destination_workload_namespace", "destination_workload", "response_code"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	return &sidecarHistograms{hist: h, reg: reg}
}

// run observes every series at its rate until ctx ends.
func (s *sidecarHistograms) run(ctx context.Context, series []sidecarSeries) {
	const tick = 50 * time.Millisecond
	s.mu.Lock()
	s.series = append([]sidecarSeries(nil), series...)
	s.mu.Unlock()
	owed := make([]float64, len(series))
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		for i, sr := range s.series {
			o := s.hist.WithLabelValues(sr.reporter, sr.pod, sr.namespace, sr.namespace, "web", "200")
			owed[i] += sr.rps * tick.Seconds()
			for ; owed[i] >= 1; owed[i]-- {
				o.Observe(sr.millis)
			}
		}
		s.mu.Unlock()
	}
}

// setMillis changes the duration of series i's requests from now on.
func (s *sidecarHistograms) setMillis(i int, millis float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.series[i].millis = millis
}

// TestLatencyQueryWithRealPrometheus runs DefaultLatencyQuery through a real
// Prometheus scraping sidecar histograms: each of the Service's pods gets
// its own mean request duration in seconds; series of the client side
// (reporter="source"), of a same-named pod in another namespace and of a
// regex look-alike are not mixed in; a pod that served nothing in the
// window is absent rather than NaN.
func TestLatencyQueryWithRealPrometheus(t *testing.T) {
	h := newSidecarHistograms()
	series := []sidecarSeries{
		{"destination", "web-0", "shop", 100, 20},  // 20 ms
		{"destination", "web.1", "shop", 40, 80},   // 80 ms
		{"source", "web-0", "shop", 100, 900},      // the client's view of another call
		{"destination", "web-0", "other", 50, 700}, // same name, other namespace
		{"destination", "webx1", "shop", 50, 500},  // matched only by an unescaped regex
	}
	// web-2 exists but serves nothing.
	h.hist.WithLabelValues("destination", "web-2", "shop", "shop", "web", "200")

	src := scrapedSource(t, h.reg, time.Second, func(ctx context.Context) { h.run(ctx, series) })
	target := promsource.Target{Namespace: "shop", Service: "web", Pods: []string{"web-0", "web.1", "web-2"}, Window: 10 * time.Second}
	time.Sleep(target.Window + 2*time.Second)

	// A ratio of two rates over the same window: exact whatever the
	// extrapolation, so a tight tolerance.
	res := checkValues(t, src, promsource.DefaultLatencyQuery, target, map[string]float64{"web-0": 0.020, "web.1": 0.080}, 0.01)
	if len(res.Missing) != 1 || res.Missing[0] != "web-2" {
		t.Errorf("missing %v, want [web-2] (it served nothing)", res.Missing)
	}
	t.Logf("latency (s): %v, missing %v, via %s", res.Values, res.Missing, res.Query)
}

// TestRecentLatencyQueryWithRealPrometheus runs DefaultLatencyQuery through
// a real Prometheus over the query window and over two scrape intervals, as
// each cycle and each look between cycles do. A pod whose requests have
// just become slow (it fell behind) shows the new latency over the two
// scrape intervals while the window still averages in the old; a steady pod
// gets the same from both.
func TestRecentLatencyQueryWithRealPrometheus(t *testing.T) {
	const (
		scrape = time.Second
		window = 10 * time.Second
	)
	h := newSidecarHistograms()
	series := []sidecarSeries{
		{"destination", "web-0", "shop", 100, 20},
		{"destination", "web-1", "shop", 100, 20},
	}
	src := scrapedSource(t, h.reg, scrape, func(ctx context.Context) { h.run(ctx, series) })
	full := promsource.Target{Namespace: "shop", Service: "web", Pods: []string{"web-0", "web-1"}, Window: window}
	recent := full
	recent.Window = 2 * scrape
	time.Sleep(window + 2*scrape)
	before := checkValues(t, src, promsource.DefaultLatencyQuery, full, map[string]float64{"web-0": 0.020, "web-1": 0.020}, 0.01)
	res := checkRecentQuery(t, src, promsource.DefaultLatencyQuery, recent, map[string]float64{"web-0": 0.020, "web-1": 0.020}, 0.01)
	if !strings.Contains(res.Query, "[2s]") {
		t.Errorf("recent latency query %s has no [2s] window", res.Query)
	}

	// web-1 falls behind: its requests now take 400 ms. Three scrape
	// intervals later the last two hold only the new ones.
	h.setMillis(1, 400)
	time.Sleep(3*scrape + scrape/2)
	long, err := src.Query(t.Context(), promsource.DefaultLatencyQuery, full, time.Time{})
	if err != nil || long.Err() != nil {
		t.Fatalf("query %s: %v %v", long.Query, err, long.Err())
	}
	res = checkRecentQuery(t, src, promsource.DefaultLatencyQuery, recent, map[string]float64{"web-0": 0.020, "web-1": 0.400}, 0.03)
	if v := long.Values["web-1"]; !(v > 0.05 && v < 0.3) {
		t.Errorf("web-1 over the %v window: %v s, want between the old 0.02 and the new 0.4 (a mix of both)", window, v)
	}
	// A look compares the recent latency with the window's at the last
	// cycle in which the pod kept up (before the slowdown) and rings at 4x.
	if got := res.Values["web-1"] / before.Values["web-1"]; got < 4 {
		t.Errorf("web-1: recent %v s is %.1fx the %v s of the window before; the look between cycles would miss it (it rings at 4x)", res.Values["web-1"], got, before.Values["web-1"])
	}
	t.Logf("after the slowdown: recent latency %v via %s; over the window %v via %s", res.Values, res.Query, long.Values, long.Query)
}
