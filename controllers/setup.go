package controllers

import (
	"context"
	"strings"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

const (
	// indexTargetService indexes optimizers by "<namespace>/<service>".
	indexTargetService = "spec.targetService"
	// indexVirtualServiceHost indexes VirtualServices by the FQDNs they
	// could serve, for conflict detection.
	indexVirtualServiceHost = "spec.hostFQDN"
	// indexTargetNamespace: optimizers by the namespace of their Service.
	indexTargetNamespace = "spec.targetNamespace"
)

// SetupWithManager registers the mirror: it reconciles an optimizer when the
// optimizer, its Service, its EndpointSlices, its owned objects or a
// VirtualService for its host change, so a pod turning ready or unready
// reaches the ServiceEntry within about a second.
func (r *MirrorReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &optv1.IstioAdaptiveRequestOptimizer{}, indexTargetService, func(o client.Object) []string {
		opt := o.(*optv1.IstioAdaptiveRequestOptimizer)
		return []string{opt.TargetNamespace() + "/" + opt.Spec.ServiceName}
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &optv1.IstioAdaptiveRequestOptimizer{}, indexTargetNamespace, func(o client.Object) []string {
		return []string{o.(*optv1.IstioAdaptiveRequestOptimizer).TargetNamespace()}
	}); err != nil {
		return err
	}
	if err := idx.IndexField(ctx, &istionet.ServiceEntry{}, indexObjectName, func(o client.Object) []string {
		return []string{o.GetName()}
	}); err != nil {
		return err
	}
	domain := r.ClusterDomain
	if err := idx.IndexField(ctx, &istionet.VirtualService{}, indexVirtualServiceHost, func(o client.Object) []string {
		return virtualServiceFQDNs(o.(*istionet.VirtualService), domain)
	}); err != nil {
		return err
	}

	byService := func(ctx context.Context, namespace, service string) []reconcile.Request {
		list := &optv1.IstioAdaptiveRequestOptimizerList{}
		if err := mgr.GetClient().List(ctx, list, client.MatchingFields{indexTargetService: namespace + "/" + service}); err != nil {
			return nil
		}
		reqs := make([]reconcile.Request, 0, len(list.Items))
		for _, o := range list.Items {
			reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&o)})
		}
		return reqs
	}
	owned := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		return ownerRequest(o)
	})

	b := ctrl.NewControllerManagedBy(mgr).
		Named(mirrorControllerName).
		WithOptions(controller.Options{MaxConcurrentReconciles: max(1, r.MaxConcurrent)}).
		For(&optv1.IstioAdaptiveRequestOptimizer{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{}, deletionPredicate()))).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return byService(ctx, o.GetNamespace(), o.GetName())
		})).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			svc := o.GetLabels()[discoveryv1.LabelServiceName]
			if svc == "" {
				return nil
			}
			return byService(ctx, o.GetNamespace(), svc)
		})).
		Watches(&istionet.ServiceEntry{}, owned).
		Watches(&istionet.DestinationRule{}, destinationRuleRequests(byService, domain)).
		Watches(&corev1.Namespace{}, namespaceRequests(mgr.GetClient()), builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&istionet.VirtualService{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			out := ownerRequest(o)
			for _, fqdn := range virtualServiceFQDNs(o.(*istionet.VirtualService), domain) {
				ns, svc, ok := splitFQDN(fqdn, domain)
				if ok {
					out = append(out, byService(ctx, ns, svc)...)
				}
			}
			return out
		})).
		WatchesRawSource(source.Channel(r.Wake, &handler.EnqueueRequestForObject{}))
	if r.Clusters != nil {
		b = r.Clusters.setup(mgr, b)
	}
	if r.Hosts != nil {
		var err error
		if b, err = r.Hosts.setup(ctx, mgr, b); err != nil {
			return err
		}
	}
	b, err := r.setupGateways(ctx, mgr, b, byService)
	if err != nil {
		return err
	}
	return b.Complete(r)
}

func deletionPredicate() predicate.Funcs {
	return predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		return !e.ObjectNew.GetDeletionTimestamp().IsZero()
	}}
}

// ownerRequest maps an owned object back to its optimizer through its labels.
func ownerRequest(o client.Object) []reconcile.Request {
	l := o.GetLabels()
	if l[desired.LabelManagedBy] != desired.ManagedByValue || l[desired.LabelOptimizerName] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: l[desired.LabelOptimizerNamespace], Name: desired.OwnerName(o)}}}
}

// virtualServiceFQDNs lists the Kubernetes Service hosts a VirtualService
// names, with short names resolved in its namespace. Wildcards are skipped.
func virtualServiceFQDNs(vs *istionet.VirtualService, domain string) []string {
	if domain == "" {
		domain = "cluster.local"
	}
	var out []string
	for _, h := range vs.Spec.Hosts {
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if h == "" || strings.Contains(h, "*") {
			continue
		}
		parts := strings.Split(h, ".")
		switch {
		case len(parts) == 1:
			out = append(out, h+"."+vs.Namespace+".svc."+domain)
		case len(parts) == 2:
			out = append(out, h+".svc."+domain)
		case len(parts) == 3 && parts[2] == "svc":
			out = append(out, h+"."+domain)
		case strings.HasSuffix(h, ".svc."+domain):
			out = append(out, h)
		}
	}
	return out
}

// splitFQDN is the inverse of desired.KubernetesHost.
func splitFQDN(fqdn, domain string) (namespace, service string, ok bool) {
	if domain == "" {
		domain = "cluster.local"
	}
	rest, found := strings.CutSuffix(fqdn, ".svc."+domain)
	if !found {
		return "", "", false
	}
	service, namespace, ok = strings.Cut(rest, ".")
	if !ok || strings.Contains(namespace, ".") {
		return "", "", false
	}
	return namespace, service, true
}
