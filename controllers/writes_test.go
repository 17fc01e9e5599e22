package controllers

import (
	"context"
	"testing"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// An optimizer deleted after its spec was moved to another Service, before
// a reconcile retargeted it, leaves no routing objects behind: those of the
// Service its status says it wrote go as well as those its spec names, and
// nothing of another optimizer's.
func TestFinalizeRemovesWhatTheStatusSaysWasWritten(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, istionet.AddToScheme, optv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	opt := &optv1.IstioAdaptiveRequestOptimizer{ObjectMeta: metav1.ObjectMeta{Namespace: "platform", Name: "web", Finalizers: []string{Finalizer}}}
	opt.Spec.ServiceName, opt.Spec.ServiceNamespace = "web", "shop-b" // moved from shop-a
	opt.Status.OwnedObjects = optv1.OwnedObjects{Namespace: "shop-a", ServiceEntry: "web-adaptive", DestinationRule: "web-adaptive", VirtualService: "web-adaptive"}
	other := &optv1.IstioAdaptiveRequestOptimizer{ObjectMeta: metav1.ObjectMeta{Namespace: "platform", Name: "other"}}

	routing := func(ns string, owner *optv1.IstioAdaptiveRequestOptimizer) []client.Object {
		meta := func() metav1.ObjectMeta {
			return metav1.ObjectMeta{Namespace: ns, Name: "web-adaptive", Labels: desired.OwnedLabels(owner)}
		}
		return []client.Object{&istionet.ServiceEntry{ObjectMeta: meta()}, &istionet.DestinationRule{ObjectMeta: meta()}, &istionet.VirtualService{ObjectMeta: meta()}}
	}
	old, current, others := routing("shop-a", opt), routing("shop-b", opt), routing("shop-c", other)
	objs := append(append(append([]client.Object{opt}, old...), current...), others...)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(opt).Build()
	r := &MirrorReconciler{Client: c, Scheme: scheme, Metrics: metrics.New(), Weights: NewWeightBook(), Recorder: events.NewFakeRecorder(10)}

	if err := r.finalize(context.Background(), opt); err != nil {
		t.Fatal(err)
	}
	for _, o := range append(old, current...) {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s/%s left behind (get: %v)", o, o.GetNamespace(), o.GetName(), err)
		}
	}
	for _, o := range others {
		if err := c.Get(context.Background(), client.ObjectKeyFromObject(o), o); err != nil {
			t.Errorf("%T %s/%s of another optimizer: %v", o, o.GetNamespace(), o.GetName(), err)
		}
	}
}

// Persisting the learned state patches one annotation; what the reconcile
// has already put in the status (here the coverage) stays for its status
// write, though the patch answers with the status stored before.
func TestLearnedStateKeepsTheReconcilesStatus(t *testing.T) {
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, istionet.AddToScheme, optv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	opt := &optv1.IstioAdaptiveRequestOptimizer{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web"}}
	opt.Spec.ServiceName = "web"
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(opt).WithStatusSubresource(opt).Build()
	r := &MirrorReconciler{Client: c, Scheme: scheme}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(opt), opt); err != nil {
		t.Fatal(err)
	}
	opt.Status.Coverage = &optv1.TrafficCoverage{Message: "measured in this reconcile"}
	snap := weights.Snapshot{Noise: 0.05, NoiseCycles: 12, CycleSeconds: 30}
	if err := r.writeLearned(context.Background(), opt, snap); err != nil {
		t.Fatal(err)
	}
	if opt.Status.Coverage == nil || opt.Status.Coverage.Message != "measured in this reconcile" {
		t.Errorf("the reconcile's coverage is gone after the patch: %+v", opt.Status.Coverage)
	}
	stored := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(opt), stored); err != nil {
		t.Fatal(err)
	}
	if got := learnedSnapshot(stored); got != snap {
		t.Errorf("stored learned state %+v, want %+v", got, snap)
	}
	if stored.ResourceVersion != opt.ResourceVersion {
		t.Errorf("resourceVersion %s in hand, %s stored: the status write would conflict", opt.ResourceVersion, stored.ResourceVersion)
	}
}
