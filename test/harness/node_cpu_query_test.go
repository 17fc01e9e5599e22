package harness_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// cadvisorSeries is one container_cpu_usage_seconds_total series as the
// kubelet's cAdvisor exposes it, with the node label the Prometheus
// Operator's kubelet ServiceMonitor adds (put in the exposition here, since
// one exporter stands in for every node), growing at cores CPU-seconds per
// second. The root cgroup (id="/") has no namespace, pod or container.
type cadvisorSeries struct {
	namespace, pod, container, node, id string
	cores                               float64
}

// runCadvisor advances every series at its rate until ctx ends.
func runCadvisor(ctx context.Context, cpu *prometheus.CounterVec, series []cadvisorSeries) {
	const tick = 50 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		for _, s := range series {
			cpu.WithLabelValues(s.namespace, s.pod, s.container, s.node, s.id).Add(s.cores * tick.Seconds())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// TestNodeCPUQueryWithRealPrometheus runs DefaultNodeCPUQuery through a real
// Prometheus scraping cAdvisor-style series: each of the Service's pods gets
// the CPU in use on its own node (the root cgroup's rate), so two pods on one
// node get the same value and a pod on another node that node's; pods of the
// same name in another namespace and regex look-alikes on a busier node are
// not mixed in, nor are other pod-less cgroups (system.slice); a pod whose
// node has no root-cgroup series is absent (unknown), not 0.
func TestNodeCPUQueryWithRealPrometheus(t *testing.T) {
	cpu := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "container_cpu_usage_seconds_total",
		Help: "Cumulative cpu time consumed in seconds (as cAdvisor reports it).",
	}, []string{"namespace", "pod", "container", "node", "id"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(cpu)

	pod := func(ns, name, node string, cores float64) []cadvisorSeries {
		id := "/kubepods/burstable/pod-" + ns + "-" + name
		return []cadvisorSeries{
			{ns, name, "app", node, id + "/app", cores},
			{ns, name, "istio-proxy", node, id + "/istio-proxy", 0.05},
			{ns, name, "", node, id, cores + 0.05}, // the pod-level aggregate
		}
	}
	series := slices.Concat(
		pod("shop", "web-0", "n1", 0.4),
		pod("shop", "web.1", "n1", 0.3),
		pod("shop", "web-2", "n2", 0.2),
		pod("shop", "web-3", "n4", 0.2),  // n4 exposes no root cgroup
		pod("shop", "webx1", "n3", 0.1),  // matched only by an unescaped regex
		pod("other", "web-0", "n3", 0.1), // same name, other namespace, busier node
		[]cadvisorSeries{
			{"", "", "", "n1", "/", 2.5},
			{"", "", "", "n2", "/", 0.75},
			{"", "", "", "n3", "/", 7},
			{"", "", "", "n2", "/system.slice", 0.5},                  // part of the root, not added to it
			{"", "", "", "n2", "/system.slice/kubelet.service", 0.25}, // likewise
		},
	)

	src := scrapedSource(t, reg, time.Second, func(ctx context.Context) { runCadvisor(ctx, cpu, series) })
	target := promsource.Target{Namespace: "shop", Service: "web", Pods: []string{"web-0", "web.1", "web-2", "web-3"}, Window: 10 * time.Second}
	// Rates are exact only once the window is full of samples.
	time.Sleep(target.Window + 2*time.Second)

	res := checkValues(t, src, promsource.DefaultNodeCPUQuery, target, map[string]float64{"web-0": 2.5, "web.1": 2.5, "web-2": 0.75}, 0.03)
	if res.Values["web-0"] != res.Values["web.1"] {
		t.Errorf("two pods on one node got %v and %v, want the same node CPU", res.Values["web-0"], res.Values["web.1"])
	}
	if len(res.Missing) != 1 || res.Missing[0] != "web-3" {
		t.Errorf("missing %v, want [web-3] (its node has no root-cgroup series)", res.Missing)
	}
	t.Logf("node CPU (cores): %v, missing %v, via %s", res.Values, res.Missing, res.Query)
}
