package harness_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/test/fakepod"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// TestChunkedQueryWithRealPrometheus: a query over many pods, split into
// chunks under a small length limit, gives every pod exactly the value the
// same query sent whole gives, from a real Prometheus.
func TestChunkedQueryWithRealPrometheus(t *testing.T) {
	var pods []fakepod.Pod
	target := promsource.Target{Namespace: "shop", Service: "checkout", Window: 10 * time.Second}
	for i := range 300 {
		name := fmt.Sprintf("checkout-7f9c8d6b5-%05d", i)
		if i%10 == 0 {
			name = fmt.Sprintf("checkout.v2-%05d", i) // a regexp metacharacter
		}
		pods = append(pods, fakepod.Pod{Name: name, Namespace: "shop", Speed: 0.5 + float64(i%5)/10})
		target.Pods = append(target.Pods, name)
	}
	exp, err := fakepod.New(pods...)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := exp.Start("")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	exp.SetLoad(fakepod.Load{RPS: podRPS * float64(len(pods)), Work: podWork})
	done := make(chan struct{})
	go func() { exp.Run(ctx, 50*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done; _ = exp.Close() })

	prom := harness.MustStartPrometheus(t, harness.PrometheusOptions{Targets: []string{addr}, ScrapeInterval: time.Second})
	wctx, wcancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer wcancel()
	if err := prom.WaitForTargets(wctx, []string{addr}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(target.Window + 2*time.Second)

	whole, err := promsource.New(promsource.Config{URL: prom.URL, MaxQueryLength: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	chunked, err := promsource.New(promsource.Config{URL: prom.URL, MaxQueryLength: 1024})
	if err != nil {
		t.Fatal(err)
	}
	// One evaluation time, so both see the same samples.
	now := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	for _, tmpl := range []string{promsource.DefaultCPUQuery, promsource.DefaultRequestQuery} {
		ref, err := whole.Query(t.Context(), tmpl, target, now)
		if err != nil {
			t.Fatal(err)
		}
		got, err := chunked.Query(t.Context(), tmpl, target, now)
		if err != nil {
			t.Fatal(err)
		}
		if ref.Chunks != 1 || got.Chunks < 5 {
			t.Errorf("chunks: whole %d, chunked %d; want 1 and at least 5", ref.Chunks, got.Chunks)
		}
		if len(ref.Values) != len(pods) || len(got.Values) != len(pods) || got.Err() != nil {
			t.Fatalf("values: whole %d, chunked %d of %d pods; issues %v", len(ref.Values), len(got.Values), len(pods), got.Err())
		}
		for pod, v := range ref.Values {
			if got.Values[pod] != v {
				t.Errorf("%s: chunked %v, whole %v", pod, got.Values[pod], v)
			}
		}
		t.Logf("%d pods: one query of %d bytes or %d chunks under 1024 bytes, %v", len(pods), len(ref.Query), got.Chunks, got.Latency)
	}
}
