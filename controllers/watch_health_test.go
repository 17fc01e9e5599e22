package controllers

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

func TestWatchHealthFailsReadyzWhileAnInformerFails(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1000, 0))
	m := metrics.New()
	h := &WatchHealth{Clock: clk, Metrics: m}
	if err := h.Check(nil); err != nil {
		t.Fatalf("Check with no error = %v", err)
	}
	// Routine ends of a watch are not failures.
	h.Record("*v1.Pod", io.EOF)
	h.Record("*v1.Pod", apierrors.NewResourceExpired("too old"))
	h.Record("*v1.Pod", apierrors.NewGone("gone"))
	if err := h.Check(nil); err != nil {
		t.Fatalf("Check after routine watch ends = %v", err)
	}
	decodeErr := errors.New(`failed to list *v1alpha1.IstioAdaptiveRequestOptimizer: json: cannot unmarshal number -1 into Go struct field EndpointWeight.status.weights.weight of type uint32`)
	h.Record("*v1alpha1.IstioAdaptiveRequestOptimizer", decodeErr)
	err := h.Check(nil)
	if err == nil || !strings.Contains(err.Error(), "v1alpha1.IstioAdaptiveRequestOptimizer") || !strings.Contains(err.Error(), "cannot unmarshal") {
		t.Fatalf("Check while the optimizer list fails = %v, want an error naming it", err)
	}
	if got := testutil.ToFloat64(m.WatchErrors.WithLabelValues("v1alpha1.IstioAdaptiveRequestOptimizer")); got != 1 {
		t.Errorf("optimizer_watch_errors_total = %v, want 1", got)
	}
	if got := testutil.CollectAndCount(m.WatchErrors); got != 1 {
		t.Errorf("watch error series = %d, want 1 (routine ends not counted)", got)
	}
	clk.SetTime(clk.Now().Add(watchFailingFor - time.Second))
	if h.Check(nil) == nil {
		t.Errorf("Check passed before the failing window ended")
	}
	clk.SetTime(clk.Now().Add(2 * time.Second))
	if err := h.Check(nil); err != nil {
		t.Errorf("Check a minute after the last error = %v, want ok (the informer recovered)", err)
	}
}
