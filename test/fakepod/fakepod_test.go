package fakepod

import (
	"context"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// series gathers the exporter's registry: metric name -> label text -> value.
func series(t *testing.T, e *Exporter) map[string]map[string]float64 {
	t.Helper()
	mfs, err := e.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		m := map[string]float64{}
		for _, metric := range mf.GetMetric() {
			m[labelKey(metric.GetLabel())] = metric.GetCounter().GetValue()
		}
		out[mf.GetName()] = m
	}
	return out
}

func labelKey(lps []*dto.LabelPair) string {
	vals := map[string]string{}
	for _, lp := range lps {
		vals[lp.GetName()] = lp.GetValue()
	}
	key := "namespace=" + vals["namespace"] + ",pod=" + vals["pod"]
	if c, ok := vals["container"]; ok {
		key += ",container=" + c
	}
	if r, ok := vals["reporter"]; ok {
		key += ",reporter=" + r
	}
	return key
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

func TestManualCounters(t *testing.T) {
	e, err := New(Pod{Name: "p0", Namespace: "ns"}, Pod{Name: "p1", Namespace: "ns", Container: "server"})
	if err != nil {
		t.Fatal(err)
	}
	must(t, e.AddCPU("p0", 2))
	must(t, e.AddProxyCPU("p0", 0.5))
	must(t, e.AddPauseCPU("p0", 0.25))
	must(t, e.AddRequests("p0", 10))
	must(t, e.AddCPU("p1", 1))

	s := series(t, e)
	cpu := s["container_cpu_usage_seconds_total"]
	for key, want := range map[string]float64{
		"namespace=ns,pod=p0,container=app":         2,
		"namespace=ns,pod=p0,container=istio-proxy": 0.5,
		"namespace=ns,pod=p0,container=POD":         0.25,
		"namespace=ns,pod=p0,container=":            2.75, // pod cgroup aggregate
		"namespace=ns,pod=p1,container=server":      1,
		"namespace=ns,pod=p1,container=istio-proxy": 0,
	} {
		if got, ok := cpu[key]; !ok || !near(got, want) {
			t.Errorf("cpu[%s] = %v (present %v), want %v", key, got, ok, want)
		}
	}
	if got := s["istio_requests_total"]["namespace=ns,pod=p0,reporter=destination"]; got != 10 {
		t.Errorf("requests p0 = %v, want 10", got)
	}
	if tot, _ := e.Totals("p0"); tot != (Totals{AppCPU: 2, ProxyCPU: 0.5, PauseCPU: 0.25, Requests: 10}) {
		t.Errorf("Totals(p0) = %+v", tot)
	}

	for _, err := range []error{
		e.AddCPU("nope", 1), e.AddCPU("p0", -1), e.AddRequests("p0", math.NaN()), e.AddRequests("p0", math.Inf(1)),
		e.AddPod(Pod{Name: "p0", Namespace: "ns"}), e.AddPod(Pod{Name: "x"}), e.AddPod(Pod{Name: "y", Namespace: "ns", Container: "istio-proxy"}),
		e.AddPod(Pod{Name: "z", Namespace: "ns", Speed: -1}),
	} {
		if err == nil {
			t.Error("expected an error")
		}
	}
}

func TestAdvanceModel(t *testing.T) {
	e, err := New(
		Pod{Name: "fast", Namespace: "ns", Speed: 1},
		Pod{Name: "mid", Namespace: "ns", Speed: 0.5},
		Pod{Name: "capped", Namespace: "ns", Speed: 0.25, Cores: 1},
	)
	if err != nil {
		t.Fatal(err)
	}
	// 300 rps, equal shares: 100 rps each; work 0.01 s -> fast 1 core, mid 2 cores;
	// capped can serve 1*0.25/0.01 = 25 rps, using its 1 core.
	rates := e.Advance(10*time.Second, Load{RPS: 300, Work: 0.01})
	want := map[string]Rates{
		"fast":   {Offered: 100, Served: 100, AppCPU: 1},
		"mid":    {Offered: 100, Served: 100, AppCPU: 2},
		"capped": {Offered: 100, Served: 25, AppCPU: 1},
	}
	for pod, w := range want {
		g := rates[pod]
		if !near(g.Offered, w.Offered) || !near(g.Served, w.Served) || !near(g.AppCPU, w.AppCPU) {
			t.Errorf("%s: rates %+v, want %+v", pod, g, w)
		}
	}
	tot, _ := e.Totals("mid")
	if !near(tot.AppCPU, 20) || !near(tot.Requests, 1000) || !near(tot.ProxyCPU, 1000*DefaultProxyCPUPerRequest) || !near(tot.PauseCPU, 10*DefaultPauseCPU) {
		t.Errorf("Totals(mid) = %+v", tot)
	}

	// Shares: only fast and mid, 3:1; negative shares count as 0; no proxy or pause cost.
	rates = e.Advance(time.Second, Load{RPS: 40, Shares: map[string]float64{"fast": 3, "mid": 1, "capped": -5}, ProxyCPUPerRequest: -1, PauseCPU: -1})
	if !near(rates["fast"].Served, 30) || !near(rates["mid"].Served, 10) || rates["capped"].Served != 0 {
		t.Errorf("shared rates = %+v", rates)
	}
	if tot2, _ := e.Totals("mid"); !near(tot2.ProxyCPU, tot.ProxyCPU) || !near(tot2.AppCPU, tot.AppCPU+10*0.01/0.5) {
		t.Errorf("Totals(mid) after no-overhead step = %+v", tot2)
	}
}

func TestRemoveAndRestart(t *testing.T) {
	e, err := New(Pod{Name: "a", Namespace: "ns"}, Pod{Name: "b", Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	must(t, e.AddCPU("a", 5))
	must(t, e.AddRequests("a", 5))
	must(t, e.RestartPod("a"))
	s := series(t, e)
	if got := s["container_cpu_usage_seconds_total"]["namespace=ns,pod=a,container=app"]; got != 0 {
		t.Errorf("after restart cpu = %v, want 0", got)
	}
	if tot, _ := e.Totals("a"); tot != (Totals{}) {
		t.Errorf("after restart totals = %+v", tot)
	}
	must(t, e.RemovePod("b"))
	for name, m := range series(t, e) {
		for key := range m {
			if strings.Contains(key, "pod=b") {
				t.Errorf("%s{%s} still exported after RemovePod", name, key)
			}
		}
	}
	if got := e.Pods(); len(got) != 1 || got[0] != "a" {
		t.Errorf("Pods() = %v", got)
	}
	if e.RemovePod("b") == nil || e.RestartPod("b") == nil {
		t.Error("removing or restarting a missing pod succeeded")
	}
}

func TestServeAndRun(t *testing.T) {
	e, err := New(Pod{Name: "web-0", Namespace: "ns", Workload: "web", Service: "web"})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := e.Start("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	if !strings.HasPrefix(addr, "127.0.0.1:") || e.Addr() != addr {
		t.Fatalf("Start() = %q, Addr() = %q", addr, e.Addr())
	}
	if _, err := e.Start(""); err == nil {
		t.Error("second Start succeeded")
	}

	e.SetLoad(Load{RPS: 100})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { e.Run(ctx, 10*time.Millisecond); close(done) }()
	time.Sleep(100 * time.Millisecond)
	cancel()
	<-done
	if tot, _ := e.Totals("web-0"); tot.Requests <= 0 || tot.AppCPU <= 0 {
		t.Errorf("Run integrated nothing: %+v", tot)
	}

	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		"# TYPE container_cpu_usage_seconds_total counter",
		`container_cpu_usage_seconds_total{container="istio-proxy",namespace="ns",pod="web-0"}`,
		`container_cpu_usage_seconds_total{container="POD",namespace="ns",pod="web-0"}`,
		`container_cpu_usage_seconds_total{container="",namespace="ns",pod="web-0"}`,
		`istio_requests_total{connection_security_policy="mutual_tls",destination_service_name="web",destination_service_namespace="ns",destination_workload="web",destination_workload_namespace="ns",namespace="ns",pod="web-0",reporter="destination",request_protocol="http",response_code="200",source_workload="client"}`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %s\n%s", want, text)
		}
	}

	must(t, e.Close())
	if _, err := http.Get("http://" + addr + "/metrics"); err == nil {
		t.Error("still serving after Close")
	}
	if _, err := e.Start(addr); err != nil {
		t.Errorf("restart on the same address: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
