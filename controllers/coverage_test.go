package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// coverageAnswers stands in for the metrics backend of the coverage query
// (test/harness/coverage_query_test.go runs the real query through a real
// Prometheus): per namespace, the figure it answers. Namespaces without one
// get an answer without traffic. It records what it was asked.
type coverageAnswers struct {
	mu          sync.Mutex
	byNamespace map[string]promsource.Coverage
	asked       map[string]promsource.Target
}

func (c *coverageAnswers) QueryCoverage(_ context.Context, tmpl string, t promsource.Target, _ time.Time) (promsource.Coverage, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.asked == nil {
		c.asked = map[string]promsource.Target{}
	}
	c.asked[t.Namespace] = t
	q, err := promsource.Render(tmpl, t)
	if err != nil {
		return promsource.Coverage{}, err
	}
	out := c.byNamespace[t.Namespace]
	out.Query = q
	return out, nil
}

func (c *coverageAnswers) set(ns string, cov promsource.Coverage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byNamespace[ns] = cov
}

func (c *coverageAnswers) target(ns string) (promsource.Target, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.asked[ns]
	return t, ok
}

// TestCoverageBelowThresholdDegradesAndNamesTheBypassingSources: with 57%
// of the traffic through the optimized host, the optimizer stays Ready,
// turns Degraded/TrafficBypassesWeights naming the gateway and the
// sidecar-less clients, publishes the ratio, and lists the sources in
// status; when the gateway moves to the optimized host (95%) the condition
// clears. The loop asks about the optimized host and the ready pods only.
func TestCoverageBelowThresholdDegradesAndNamesTheBypassingSources(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(3, 1), "node-a-"+ns), Ready("web-1", IP(3, 2), "node-b-"+ns), NotReady("web-2", IP(3, 3), "node-b-"+ns))
	testCoverage.set(ns, promsource.Coverage{Received: 106, Weighted: 60, Bypass: []promsource.SourceRate{
		{Namespace: "istio-system", Workload: "istio-ingressgateway", Rate: 30},
		{Namespace: "unknown", Workload: "unknown", Rate: 10},
	}})
	mustCreate(t, Optimizer(ns, "web", "web"))

	var opt *optv1.IstioAdaptiveRequestOptimizer
	eventually(t, waitFor, "Degraded/TrafficBypassesWeights", func() error {
		var err error
		if opt, err = getOpt(ns, "web"); err != nil {
			return err
		}
		if got := condition(opt, optv1.ConditionDegraded); got != "True/TrafficBypassesWeights" {
			return fmt.Errorf("Degraded %s", got)
		}
		return nil
	})
	if got := condition(opt, optv1.ConditionReady); got != "True/Reconciled" {
		t.Errorf("Ready %s, want True/Reconciled (the weights still work for the traffic that reaches them)", got)
	}
	msg := meta.FindStatusCondition(opt.Status.Conditions, optv1.ConditionDegraded).Message
	for _, want := range []string{"0.57", "istio-system/istio-ingressgateway (30.0 rps)", "unknown (clients without a sidecar) (10.0 rps)", "web." + ns + ".adaptive", "threshold 0.90"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Degraded message lacks %q: %s", want, msg)
		}
	}
	cov := opt.Status.Coverage
	if cov == nil || cov.Ratio != "0.57" || cov.ReceivedRate != "106.0" || cov.Window != "1s" || len(cov.Bypassing) != 2 ||
		cov.Bypassing[0] != (optv1.BypassingSource{Namespace: "istio-system", Workload: "istio-ingressgateway", Rate: "30.0"}) {
		t.Errorf("status.coverage %+v", cov)
	}
	if got := testutil.ToFloat64(testMetrics.TrafficCoverage.WithLabelValues(ns, "web")); got < 0.56 || got > 0.57 {
		t.Errorf("optimizer_traffic_coverage_ratio %v, want 60/106", got)
	}
	asked, ok := testCoverage.target(ns)
	if !ok || asked.Host != "web."+ns+".adaptive" || strings.Join(asked.Pods, ",") != "web-0,web-1" || asked.Service != "web" {
		t.Errorf("coverage asked about %+v, want host web.%s.adaptive and the ready pods web-0,web-1", asked, ns)
	}

	// The gateway now routes to the optimized host.
	testCoverage.set(ns, promsource.Coverage{Received: 100, Weighted: 95, Bypass: []promsource.SourceRate{{Namespace: "unknown", Workload: "unknown", Rate: 5}}})
	eventually(t, waitFor, "Degraded cleared", func() error {
		var err error
		if opt, err = getOpt(ns, "web"); err != nil {
			return err
		}
		if got := condition(opt, optv1.ConditionDegraded); got != "False/AsExpected" {
			return fmt.Errorf("Degraded %s", got)
		}
		if opt.Status.Coverage == nil || opt.Status.Coverage.Ratio != "0.95" {
			return fmt.Errorf("status.coverage %+v", opt.Status.Coverage)
		}
		return nil
	})
}

// TestCoverageWithoutTrafficSaysNothing: a Service nobody calls has no
// figure, no condition and no series.
func TestCoverageWithoutTrafficSaysNothing(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(3, 11), "node-a-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	eventually(t, waitFor, "coverage asked", func() error {
		if _, ok := testCoverage.target(ns); !ok {
			return fmt.Errorf("not asked yet")
		}
		return nil
	})
	consistently(t, 1500*time.Millisecond, "no coverage figure", func() error {
		opt, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if opt.Status.Coverage != nil || condition(opt, optv1.ConditionDegraded) == "True/TrafficBypassesWeights" {
			return fmt.Errorf("coverage %+v, Degraded %s", opt.Status.Coverage, condition(opt, optv1.ConditionDegraded))
		}
		return nil
	})
}
