package harness_test

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// scrapedSource serves reg on a loopback port, runs run (when not nil)
// until the test ends, has a real Prometheus scrape the port every scrape,
// and returns a promsource reading that Prometheus once the target is up.
func scrapedSource(t *testing.T, reg prometheus.Gatherer, scrape time.Duration, run func(ctx context.Context)) *promsource.Source {
	t.Helper()
	return sourceFor(t, scrapedURL(t, reg, scrape, run), 0)
}

// scrapedURL starts what scrapedSource does and returns Prometheus's URL.
func scrapedURL(t *testing.T, reg prometheus.Gatherer, scrape time.Duration, run func(ctx context.Context)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	wg.Go(func() { _ = srv.Serve(ln) })
	if run != nil {
		wg.Go(func() { run(ctx) })
	}
	t.Cleanup(func() { cancel(); _ = srv.Close(); wg.Wait() })

	addr := ln.Addr().String()
	prom := harness.MustStartPrometheus(t, harness.PrometheusOptions{Targets: []string{addr}, ScrapeInterval: scrape})
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	if err := prom.WaitForTargets(wctx, []string{addr}); err != nil {
		t.Fatal(err)
	}
	return prom.URL
}

// sourceFor is a source on url with a query length limit (0: the default).
func sourceFor(t *testing.T, url string, maxQuery int) *promsource.Source {
	t.Helper()
	src, err := promsource.New(promsource.Config{URL: url, Timeout: 5 * time.Second, MaxQueryLength: maxQuery})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	return src
}
