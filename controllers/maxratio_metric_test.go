package controllers

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// optimizer_max_weight_ratio is the ratio the engine bounds the weights
// with, the default's or the resource's: the spread alert reads it next to
// the capacity estimates, not the live weights' scale, which keeps a
// changed ratio's old one until the next write.
func TestMaxWeightRatioIsExported(t *testing.T) {
	for _, ratio := range []int64{0, 50} {
		clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
		book := NewWeightBook()
		d := DefaultEngineDefaults()
		key := types.NamespacedName{Namespace: "ns", Name: "web"}
		book.Applied(key, d.Params, clk.Now(), []desired.Endpoint{{Pod: "web-0", Node: "n1", Weight: 1000}, {Pod: "web-1", Node: "n2", Weight: 1000}})
		src := &signalSource{asked: map[string]bool{}, answers: map[string]map[string]float64{
			d.CPUQuery:     {"web-0": 0.5, "web-1": 0.5},
			d.RequestQuery: {"web-0": 50, "web-1": 50},
		}}
		m := metrics.New()
		loop := &WeightLoop{Source: src, Book: book, Clock: clk, Metrics: m, Wake: make(chan event.GenericEvent, 1)}
		opt := optimizerFor("ns", "web")
		want := d.Params.MaxRatio
		if ratio > 0 {
			opt.Spec.Optimization = &optv1.Optimization{MaxWeightRatio: &ratio}
			want = float64(ratio)
		}
		s, err := settingsFor(opt, d)
		if err != nil {
			t.Fatal(err)
		}
		loop.cycle(context.Background(), logr.Discard(), key, target{"ns", "web"}, s)
		if got := testutil.ToFloat64(m.MaxWeightRatio.WithLabelValues("ns", "web")); got != want {
			t.Errorf("max_weight_ratio %d: optimizer_max_weight_ratio = %v, want %v", ratio, got, want)
		}
	}
}
