package controllers

import (
	"context"
	"fmt"
	"strings"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// readMesh reads what the mesh around the Service says: its namespace (for
// ambient enrolment) and the DestinationRules next to it (the user's rule
// for the Kubernetes host is carried to the optimized host).
func (r *MirrorReconciler) readMesh(ctx context.Context, namespace string) (desired.MeshContext, error) {
	m := desired.MeshContext{DefaultExportTo: r.DefaultExportTo}
	ns := &corev1.Namespace{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Name: namespace}, ns); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return m, fmt.Errorf("get Namespace %s: %w", namespace, err)
	default:
		m.Namespace = ns
	}
	drs := &istionet.DestinationRuleList{}
	if err := r.Client.List(ctx, drs, client.InNamespace(namespace)); err != nil {
		return m, fmt.Errorf("list DestinationRules in %s: %w", namespace, err)
	}
	m.DestinationRules = drs.Items
	var err error
	m.MultiCluster, err = r.multiCluster(ctx)
	return m, err
}

// destinationRuleRequests maps a DestinationRule to its owner (an owned
// one) and to the optimizers of the Service whose host it names (a user's).
func destinationRuleRequests(byService func(ctx context.Context, namespace, service string) []reconcile.Request, domain string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		dr, ok := o.(*istionet.DestinationRule)
		if !ok {
			return nil
		}
		out := ownerRequest(o)
		host := dr.Spec.Host
		if host != "" && !strings.Contains(host, ".") {
			host = desired.KubernetesHost(host, dr.Namespace, domain)
		}
		if ns, svc, ok := splitFQDN(host, domain); ok && ns == dr.Namespace {
			out = append(out, byService(ctx, ns, svc)...)
		}
		return out
	})
}

// namespaceRequests maps a Namespace (its ambient label changed) to the
// optimizers of Services in it.
func namespaceRequests(c client.Client) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		// By index: at start-up every namespace is an event, and listing
		// every optimizer for each copied them namespaces x optimizers times.
		list := &optv1.IstioAdaptiveRequestOptimizerList{}
		if err := c.List(ctx, list, client.MatchingFields{indexTargetNamespace: o.GetName()}); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for _, opt := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&opt)})
		}
		return out
	})
}
