package scale

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// The scale runs' backend answers the manager's combined queries part by
// part, as Prometheus would: each part gets 0.5 cores for each of its
// pods, and the recent latency parts of a look batch are counted one by one.
func TestCPUBackendAnswersCombinedQueries(t *testing.T) {
	var n queryCounts
	srv := httptest.NewServer(cpuBackend(&n))
	defer srv.Close()
	src, err := promsource.New(promsource.Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	target := func(ns string, w time.Duration, pods ...string) promsource.Target {
		return promsource.Target{Namespace: ns, Service: "checkout", Pods: pods, Window: w}
	}
	parts := []promsource.Part{
		{Template: promsource.DefaultCPUQuery, Target: target("a", time.Minute, "a-0", "a-1")},
		{Template: promsource.DefaultLatencyQuery, Target: target("a", 30*time.Second, "a-0", "a-1")},
		{Template: promsource.DefaultLatencyQuery, Target: target("b", 30*time.Second, "b-0")},
	}
	got := src.QueryParts(t.Context(), parts, time.Time{})
	for i, r := range got {
		if r.Err != nil || len(r.Result.Values) != len(parts[i].Target.Pods) || r.Result.Values[parts[i].Target.Pods[0]] != 0.5 {
			t.Errorf("part %d: %+v", i, r)
		}
	}
	if n.all.Load() != 1 || n.recentLatency.Load() != 2 {
		t.Errorf("%d requests, %d recent latency parts counted; want 1 and 2", n.all.Load(), n.recentLatency.Load())
	}
}
