package controllers_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// An optimizer Stalled on TooManyEndpoints sends no query, however often
// its Service changes (each change reconciles it, and the reconcile ensures
// its weight worker before it finds the problem); back under the limit, it
// queries again. With a one-second cycle, three seconds of churn would
// otherwise show three cycles.
func TestStalledOptimizerSendsNoQuery(t *testing.T) {
	env := startSignalsEnv(t)
	ctx := context.Background()
	ns := "stalled"
	if err := env.c.Create(ctx, Namespace(ns)); err != nil {
		t.Fatal(err)
	}
	env.service(t, ns, "web", 100, 300)
	if err := env.c.Create(ctx, Optimizer(ns, "web", "web")); err != nil {
		t.Fatal(err)
	}
	env.source.release()
	queried := func() int {
		env.source.mu.Lock()
		defer env.source.mu.Unlock()
		return env.source.queried["web"]
	}
	harness.Eventually(t, 30*time.Second, "the optimizer queries", func() error {
		if queried() == 0 {
			return fmt.Errorf("no query yet")
		}
		return nil
	})

	// Over the ServiceEntry's limit, in slices of at most 1000 endpoints.
	const total = 4500
	var extra []client.Object
	for s := 0; s*1000 < total; s++ {
		var eps []Endpoint
		for i := s * 1000; i < min(total, (s+1)*1000); i++ {
			eps = append(eps, Ready(fmt.Sprintf("web-x%05d", i), IP(100+i/250, i%250+1), ""))
		}
		sl := EndpointSlice(ns, fmt.Sprintf("web-x%d", s), "web", []SlicePort{{Name: "http", Port: 8080}}, eps...)
		if err := env.c.Create(ctx, sl); err != nil {
			t.Fatal(err)
		}
		extra = append(extra, sl)
	}
	stalled := func() error {
		o := env.optimizer(t, ns, "web")
		c := meta.FindStatusCondition(o.Status.Conditions, optv1.ConditionStalled)
		if c == nil || c.Status != "True" || c.Reason != desired.ReasonTooManyEndpoints {
			return fmt.Errorf("Stalled: %v", c)
		}
		return nil
	}
	harness.Eventually(t, 30*time.Second, "Stalled/TooManyEndpoints", stalled)
	time.Sleep(500 * time.Millisecond) // a cycle under way when it stalled ends
	before := queried()
	for i := range 6 {
		// Churn: each change of the Service reconciles the optimizer.
		svc := &corev1.Service{}
		if err := env.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "web"}, svc); err != nil {
			t.Fatal(err)
		}
		if svc.Annotations == nil {
			svc.Annotations = map[string]string{}
		}
		svc.Annotations["churn"] = fmt.Sprint(i)
		if err := env.c.Update(ctx, svc); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := stalled(); err != nil {
		t.Fatal(err)
	}
	if n := queried() - before; n != 0 {
		t.Errorf("%d queries in 3 s while Stalled (a one-second cycle), want none", n)
	}

	for _, sl := range extra {
		if err := env.c.Delete(ctx, sl); err != nil {
			t.Fatal(err)
		}
	}
	harness.Eventually(t, 30*time.Second, "queries again under the limit", func() error {
		if queried() == before {
			return fmt.Errorf("no query since the stall")
		}
		return nil
	})
}
