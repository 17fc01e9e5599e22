package harness_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/test/fakepod"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// The simulated pods: every pod is offered 100 requests/s costing 4 ms of CPU at
// speed 1, so a pod's true CPU rate is 0.4/speed cores and its request rate 100/s.
const (
	podRPS  = 100.0
	podWork = 0.004
)

var (
	// The Service's pods. "web.1" has a regex metacharacter: unescaped, it would
	// also select the decoy "webx1".
	servicePods = []fakepod.Pod{
		{Name: "web-0", Namespace: "shop", Speed: 1},   // 0.4 cores
		{Name: "web.1", Namespace: "shop", Speed: 0.5}, // 0.8 cores
		{Name: "web-2", Namespace: "shop", Speed: 0.8}, // 0.5 cores
	}
	decoys = []fakepod.Pod{
		{Name: "webx1", Namespace: "shop", Speed: 0.1},  // same namespace, matched only by a bad regex
		{Name: "web-0", Namespace: "other", Speed: 0.1}, // same name, other namespace
	}
)

func trueCPU(p fakepod.Pod) float64 { return podRPS * podWork / p.Speed }

// startExporters serves the service's pods plus the decoys on two loopback
// exporters, driven by the model in wall-clock time until the test ends.
func startExporters(t *testing.T) []string {
	t.Helper()
	shop, err := fakepod.New(append(append([]fakepod.Pod{}, servicePods...), decoys[0])...)
	if err != nil {
		t.Fatal(err)
	}
	other, err := fakepod.New(decoys[1])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var addrs []string
	for _, e := range []*fakepod.Exporter{shop, other} {
		addr, err := e.Start("")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, addr)
		e.SetLoad(fakepod.Load{
			RPS: podRPS * float64(len(e.Pods())), Work: podWork,
			// The sidecar (0.5 ms/request: 0.05 cores) and an unrealistically busy
			// pause container (0.05 cores) each add over 6% to any pod's CPU if a
			// query fails to exclude them; the pod-level aggregate doubles it.
			PauseCPU: 0.05,
		})
		done := make(chan struct{})
		go func() { e.Run(ctx, 50*time.Millisecond); close(done) }()
		t.Cleanup(func() { cancel(); <-done; _ = e.Close() })
	}
	return addrs
}

func serviceTarget(window time.Duration) promsource.Target {
	t := promsource.Target{Namespace: "shop", Service: "web", Window: window}
	for _, p := range servicePods {
		t.Pods = append(t.Pods, p.Name)
	}
	return t
}

// TestPromsourceWithRealPrometheus runs the default queries through a real
// Prometheus scraping the fake pods, with and without a path prefix.
func TestPromsourceWithRealPrometheus(t *testing.T) {
	addrs := startExporters(t)
	for _, prefix := range []string{"", "/prometheus"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			t.Parallel()
			prom := harness.MustStartPrometheus(t, harness.PrometheusOptions{
				Targets: addrs, ScrapeInterval: time.Second, RoutePrefix: prefix,
			})
			if want := "/prometheus"; prefix != "" && !strings.HasSuffix(prom.URL, want) {
				t.Fatalf("URL %s lacks the prefix", prom.URL)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			if err := prom.WaitForTargets(ctx, addrs); err != nil {
				t.Fatal(err)
			}
			src, err := promsource.New(promsource.Config{URL: prom.URL, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			target := serviceTarget(10 * time.Second)
			// Rates are exact only once the window is full of samples: early on,
			// extrapolation over a partly filled window is off by several percent,
			// enough to hide a wrong query (the sidecar's CPU is 12% of web-0's).
			time.Sleep(target.Window + 2*time.Second)

			cpu := map[string]float64{}
			reqs := map[string]float64{}
			for _, p := range servicePods {
				cpu[p.Name] = trueCPU(p)
				reqs[p.Name] = podRPS
			}
			res := checkValues(t, src, promsource.DefaultCPUQuery, target, cpu, 0.03)
			if !strings.Contains(res.Query, `web\\.1`) {
				t.Errorf("query does not escape the dot for PromQL: %s", res.Query)
			}
			t.Logf("CPU via %s: %v (truth %v), latency %v", prom.URL, res.Values, cpu, res.Latency)
			res = checkValues(t, src, promsource.DefaultRequestQuery, target, reqs, 0.03)
			t.Logf("requests/s: %v (truth %v)", res.Values, reqs)

			// A pod that has no series yet is reported missing, not fatal.
			withNew := target
			withNew.Pods = append(append([]string{}, target.Pods...), "web-3")
			res, err = src.Query(t.Context(), promsource.DefaultCPUQuery, withNew, time.Time{})
			if err != nil || len(res.Missing) != 1 || res.Missing[0] != "web-3" || len(res.Values) != 3 {
				t.Errorf("with a new pod: values %v, missing %v, err %v", res.Values, res.Missing, err)
			}

			if prefix != "" {
				// The prefix matters: without it the API is not there.
				bare, err := promsource.New(promsource.Config{URL: "http://" + prom.Addr})
				if err != nil {
					t.Fatal(err)
				}
				_, err = bare.Query(t.Context(), promsource.DefaultCPUQuery, target, time.Time{})
				var se *promsource.ServerError
				if !errors.As(err, &se) || se.StatusCode != 404 {
					t.Errorf("query without the prefix: %v, want a 404 ServerError", err)
				}
				return
			}
			outage(t, prom, src, target)
		})
	}
}

// outage checks what the operator's hold-then-fallback logic relies on: a frozen
// Prometheus gives timeouts, a dead one refused connections, and a restarted one
// answers again with its earlier samples.
func outage(t *testing.T, prom *harness.Prometheus, src *promsource.Source, target promsource.Target) {
	fast, err := promsource.New(promsource.Config{URL: prom.URL, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer fast.Close()

	if err := prom.Pause(); err != nil {
		t.Fatal(err)
	}
	res, err := fast.Query(t.Context(), promsource.DefaultCPUQuery, target, time.Time{})
	var ue *promsource.UnreachableError
	if !errors.As(err, &ue) || !ue.Timeout {
		t.Errorf("paused Prometheus: %v, want a timeout", err)
	}
	if res.Latency < 300*time.Millisecond || res.Latency > 3*time.Second {
		t.Errorf("paused Prometheus: latency %v, want about the 300ms timeout", res.Latency)
	}
	if err := prom.Resume(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Query(t.Context(), promsource.DefaultCPUQuery, target, time.Time{}); err != nil {
		t.Errorf("resumed Prometheus: %v", err)
	}

	if err := prom.Kill(); err != nil {
		t.Fatal(err)
	}
	_, err = fast.Query(t.Context(), promsource.DefaultCPUQuery, target, time.Time{})
	if !errors.As(err, &ue) || ue.Timeout {
		t.Errorf("killed Prometheus: %v, want unreachable (refused)", err)
	}
	if err := prom.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Query(t.Context(), promsource.DefaultCPUQuery, target, time.Time{}); err != nil {
		t.Errorf("restarted Prometheus (samples from before the kill should be back): %v", err)
	}
}

// checkValues runs the query a few times, half a second apart, and requires
// every answer to have exactly the pods of want, each within tol (relative) of
// its true value, and no issues.
func checkValues(t *testing.T, src *promsource.Source, tmpl string, target promsource.Target, want map[string]float64, tol float64) promsource.Result {
	t.Helper()
	var res promsource.Result
	for i := range 3 {
		if i > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		var err error
		res, err = src.Query(t.Context(), tmpl, target, time.Time{})
		if err != nil {
			t.Fatalf("query %s: %v", res.Query, err)
		}
		if res.Err() != nil {
			t.Fatalf("query %s: issues %v", res.Query, res.Err())
		}
		if len(res.Values) != len(want) {
			t.Fatalf("query %s: values %v, want pods of %v", res.Query, res.Values, want)
		}
		for pod, w := range want {
			if v, found := res.Values[pod]; !found || math.Abs(v-w) > tol*w {
				t.Fatalf("query %s: %s = %v, want %v ± %.0f%% (all values %v)", res.Query, pod, v, w, tol*100, res.Values)
			}
		}
	}
	return res
}
