package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestForgetOptimizerDeletesItsReconcilerErrors(t *testing.T) {
	m := New()
	m.ReconcileError("optimizer.mirror", "conflict", "cart", "shop")
	m.ReconcileError("optimizer.weights", "query", "cart", "shop")
	m.ReconcileError("optimizer.mirror", "other", "cart", "other-team")
	m.ReconcileError("optimizer.mirror", "other", "web", "shop")
	m.ForgetOptimizer("shop", "cart")
	if got := testutil.CollectAndCount(m.ReconcilerErrors); got != 2 {
		t.Errorf("reconciler_errors series = %d, want 2 (the other optimizers')", got)
	}
	if got := testutil.ToFloat64(m.ReconcilerErrors.WithLabelValues("optimizer.mirror", "other", "web", "shop")); got != 1 {
		t.Errorf("another optimizer's count = %v, want 1", got)
	}
}
