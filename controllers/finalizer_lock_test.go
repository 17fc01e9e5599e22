package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrl "sigs.k8s.io/controller-runtime/pkg/reconcile"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// staleClient serves one optimizer from a snapshot taken earlier, as an
// informer cache that has not seen the latest writes yet; everything else
// goes to the API server.
type staleClient struct {
	client.Client
	snapshot *optv1.IstioAdaptiveRequestOptimizer
}

func (c staleClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if o, ok := obj.(*optv1.IstioAdaptiveRequestOptimizer); ok && key == client.ObjectKeyFromObject(c.snapshot) {
		c.snapshot.DeepCopyInto(o)
		return nil
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// TestFinalizerPatchFromAStaleCacheConflicts: a reconcile that works from a
// stale copy of a deleted optimizer must not remove a finalizer another
// controller added since (a plain merge patch would replace the whole list
// and let the object go while that controller still has work to do). The
// patch carries the copy's resourceVersion, so the API server refuses it.
func TestFinalizerPatchFromAStaleCacheConflicts(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(16, 1), "node-a-"+ns))
	opt := Optimizer(ns, "web", "web")
	mustCreate(t, opt)
	mustEventuallySE(t, ns, wantAddrs(IP(16, 1)))
	var stale *optv1.IstioAdaptiveRequestOptimizer
	eventually(t, waitFor, "the operator's finalizer", func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if !slices.Contains(o.Finalizers, controllers.Finalizer) {
			return fmt.Errorf("finalizers %v", o.Finalizers)
		}
		stale = o
		return nil
	})

	// Another controller adds its finalizer; then the optimizer is deleted
	// and the running manager removes only its own.
	const other = "example.com/keep-until-drained"
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		o.Finalizers = append(o.Finalizers, other)
		return k8s.Update(context.Background(), o)
	})
	if err != nil {
		t.Fatalf("add another finalizer: %v", err)
	}
	t.Cleanup(func() {
		_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			o, err := getOpt(ns, "web")
			if err != nil {
				return client.IgnoreNotFound(err)
			}
			o.Finalizers = slices.DeleteFunc(o.Finalizers, func(f string) bool { return f == other })
			return k8s.Update(context.Background(), o)
		})
	})
	if err := k8s.Delete(context.Background(), opt); err != nil {
		t.Fatal(err)
	}

	// A second reconciler reads the copy from before the other finalizer
	// (only the deletion timestamp is new to it) and finalizes.
	now := metav1.Now()
	stale.DeletionTimestamp = &now
	r := &controllers.MirrorReconciler{
		Client:  staleClient{Client: k8s, snapshot: stale},
		Scheme:  k8s.Scheme(),
		Clock:   clock.RealClock{},
		Metrics: metrics.New(),
		Weights: controllers.NewWeightBook(),
	}
	_, err = r.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(stale)})
	if !apierrors.IsConflict(err) {
		t.Errorf("reconcile from a stale copy: err = %v, want a conflict", err)
	}
	o, err := getOpt(ns, "web")
	if err != nil {
		t.Fatalf("the optimizer is gone although %s was still on it: %v", other, err)
	}
	if !slices.Contains(o.Finalizers, other) {
		t.Errorf("finalizers %v: the stale patch removed %s", o.Finalizers, other)
	}
}
