package controllers

import (
	"context"
	"flag"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// The node CPU query is an optional signal like latency: on by default,
// "-" turns it off (flag or spec), a custom template replaces it, and a
// template that does not parse is reported with the defaults used instead.
func TestNodeCPUQuerySettings(t *testing.T) {
	d := DefaultEngineDefaults()
	if d.NodeCPUQuery != promsource.DefaultNodeCPUQuery {
		t.Fatalf("default node CPU query %q", d.NodeCPUQuery)
	}
	opt := optimizerFor("ns", "web")
	s, err := settingsFor(opt, d)
	if err != nil || s.NodeCPUQuery != promsource.DefaultNodeCPUQuery {
		t.Errorf("without a spec: %q, %v", s.NodeCPUQuery, err)
	}
	opt.Spec.Optimization = &optv1.Optimization{NodeCPUQuery: "-"}
	if s, err = settingsFor(opt, d); err != nil || s.NodeCPUQuery != "" {
		t.Errorf(`node_cpu_query "-": %q, %v; want disabled`, s.NodeCPUQuery, err)
	}
	const custom = `max by (pod) (up{namespace="{{.Namespace}}", pod=~"{{.Pods}}"})`
	opt.Spec.Optimization = &optv1.Optimization{NodeCPUQuery: custom}
	if s, err = settingsFor(opt, d); err != nil || s.NodeCPUQuery != custom {
		t.Errorf("custom node_cpu_query: %q, %v", s.NodeCPUQuery, err)
	}
	opt.Spec.Optimization = &optv1.Optimization{NodeCPUQuery: "max({{.Nope"}
	s, err = settingsFor(opt, d)
	if err == nil || !strings.Contains(err.Error(), "node_cpu_query") || s.NodeCPUQuery != promsource.DefaultNodeCPUQuery {
		t.Errorf("broken node_cpu_query: %q, %v; want an error naming it and the default", s.NodeCPUQuery, err)
	}

	var flags EngineDefaults
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	flags.BindFlags(fs)
	if err := fs.Parse([]string{"--default-node-cpu-query=-"}); err != nil {
		t.Fatal(err)
	}
	if err := flags.Validate(); err != nil {
		t.Fatal(err)
	}
	if s := flags.settings(false, true); s.NodeCPUQuery != "" {
		t.Errorf(`--default-node-cpu-query=-: %q, want disabled`, s.NodeCPUQuery)
	}
	fs = flag.NewFlagSet("test", flag.ContinueOnError)
	flags.BindFlags(fs)
	if err := fs.Parse([]string{"--default-node-cpu-query={{.Nope}}"}); err != nil {
		t.Fatal(err)
	}
	if err := flags.Validate(); err == nil || !strings.Contains(err.Error(), "node_cpu_query") {
		t.Errorf("a broken --default-node-cpu-query was accepted: %v", err)
	}
}

// signalSource answers each template with fixed per-pod values, and records
// which templates it was asked.
type signalSource struct {
	mu      sync.Mutex
	answers map[string]map[string]float64
	asked   map[string]bool
}

func (s *signalSource) Query(_ context.Context, tmpl string, _ promsource.Target, _ time.Time) (promsource.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked[tmpl] = true
	v, ok := s.answers[tmpl]
	if !ok || len(v) == 0 {
		return promsource.Result{Query: tmpl}, &promsource.EmptyResultError{Query: tmpl}
	}
	return promsource.Result{Query: tmpl, Values: v}, nil
}

// Each cycle runs the node CPU query and exports
// optimizer_signal_available{signal="node_cpu"}: 1 with data, 0 when "-"
// (and then the query is not run).
func TestNodeCPUSignalIsQueriedAndExported(t *testing.T) {
	for _, disabled := range []bool{false, true} {
		d := DefaultEngineDefaults()
		opt := optimizerFor("ns", "web")
		if disabled {
			opt.Spec.Optimization = &optv1.Optimization{NodeCPUQuery: "-"}
		}
		m, book, src := cycleOnce(t, opt, map[string]map[string]float64{
			d.CPUQuery:     {"web-0": 0.5, "web-1": 0.5},
			d.RequestQuery: {"web-0": 50, "web-1": 50},
			d.NodeCPUQuery: {"web-0": 3.5, "web-1": 1.25},
		})
		if src.asked[d.NodeCPUQuery] == disabled {
			t.Errorf("disabled=%v: node CPU query asked=%v", disabled, src.asked[d.NodeCPUQuery])
		}
		out := book.Outcome(types.NamespacedName{Namespace: "ns", Name: "web"})
		if out == nil || out.Signals.NodeCPU == disabled || out.Signals.NodeCPUDisabled != disabled {
			t.Fatalf("disabled=%v: outcome signals %+v", disabled, out)
		}
		want := 1.0
		if disabled {
			want = 0
		}
		if got := testutil.ToFloat64(m.SignalAvailable.WithLabelValues("ns", "web", "node_cpu")); got != want {
			t.Errorf(`disabled=%v: optimizer_signal_available{signal="node_cpu"} = %v, want %v`, disabled, got, want)
		}
	}
}

// optimizer_max_weight_ratio is the ratio the engine bounds the weights
// with, the default's or the resource's: the spread alert reads it next to
// the capacity estimates, not the live weights' scale, which keeps a
// changed ratio's old one until the next write.
func TestMaxWeightRatioIsExported(t *testing.T) {
	for _, ratio := range []int64{0, 50} {
		d := DefaultEngineDefaults()
		opt := optimizerFor("ns", "web")
		want := d.Params.MaxRatio
		if ratio > 0 {
			opt.Spec.Optimization = &optv1.Optimization{MaxWeightRatio: &ratio}
			want = float64(ratio)
		}
		m, _, _ := cycleOnce(t, opt, map[string]map[string]float64{
			d.CPUQuery:     {"web-0": 0.5, "web-1": 0.5},
			d.RequestQuery: {"web-0": 50, "web-1": 50},
		})
		if got := testutil.ToFloat64(m.MaxWeightRatio.WithLabelValues("ns", "web")); got != want {
			t.Errorf("max_weight_ratio %d: optimizer_max_weight_ratio = %v, want %v", ratio, got, want)
		}
	}
}

// cycleOnce runs one weight cycle of opt (for ns/web) over two pods at
// weight 1000 on nodes n1 and n2, the metrics backend answering each query
// with answers[query], and returns the loop's metrics, book and source.
func cycleOnce(t *testing.T, opt *optv1.IstioAdaptiveRequestOptimizer, answers map[string]map[string]float64) (*metrics.Metrics, *WeightBook, *signalSource) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	book := NewWeightBook()
	d := DefaultEngineDefaults()
	key := types.NamespacedName{Namespace: "ns", Name: "web"}
	book.Applied(key, d.Params, clk.Now(), []desired.Endpoint{{Pod: "web-0", Node: "n1", Weight: 1000}, {Pod: "web-1", Node: "n2", Weight: 1000}})
	src := &signalSource{asked: map[string]bool{}, answers: answers}
	m := metrics.New()
	loop := &WeightLoop{Source: src, Book: book, Clock: clk, Metrics: m, Wake: make(chan event.GenericEvent, 1)}
	s, err := settingsFor(opt, d)
	if err != nil {
		t.Fatal(err)
	}
	loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
	return m, book, src
}

// Each pod's node CPU reaches the engine's signal; a pod the query did not
// answer for has none (NaN), whatever the other signals.
func TestPodSignalsCarryNodeCPU(t *testing.T) {
	sigs := map[string]weights.Signal{}
	podSignals(sigs, []string{"a", "b"}, answers{
		cpu:     promsource.Result{Values: map[string]float64{"a": 0.5, "b": 0.7}},
		nodeCPU: promsource.Result{Values: map[string]float64{"a": 3.5}},
	}, true)
	if a, b := sigs["a"], sigs["b"]; a.NodeCPU != 3.5 || a.CPU != 0.5 || !math.IsNaN(b.NodeCPU) || b.CPU != 0.7 {
		t.Errorf("signals %+v, want a with node CPU 3.5 and b without", sigs)
	}
}

// The engine learns each pod's node from the endpoints.
func TestEnginePodsCarryTheNode(t *testing.T) {
	e := &bookEntry{}
	pods := e.pods(time.Unix(1_700_000_000, 0), []desired.Endpoint{{Pod: "a", Node: "n1", NodeCores: 4}, {Pod: "b"}})
	if len(pods) != 2 || pods[0].Node != "n1" || pods[0].NodeCores != 4 || pods[1].Node != "" {
		t.Errorf("engine pods %+v, want a on n1 and b on no known node", pods)
	}
}
