package controllers

import (
	"context"
	"fmt"
	"strings"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

const (
	// indexOptimizedHost indexes optimizers by their optimized host.
	indexOptimizedHost = "spec.optimizedHost"
	// indexServiceEntryHost indexes ServiceEntries by each of their hosts.
	indexServiceEntryHost = "spec.hosts"
)

// HostClaims decides whether an optimizer may use its optimized host: it
// reads who else uses the host (other optimizers, ServiceEntries, a
// Kubernetes Service) and leaves the decision to desired.CheckHost. It is a
// step of the mirror, so an optimizer that loses its host never writes.
type HostClaims struct {
	Client client.Reader
	Rules  desired.HostRules
	// Barred says an optimizer's claim does not count because the manager
	// refuses it for another reason (cross-namespace targeting).
	Barred func(*optv1.IstioAdaptiveRequestOptimizer) bool
}

// Check returns nil when opt may use its host, else the Fatal problem.
func (h *HostClaims) Check(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer) (*desired.Problem, error) {
	if h == nil {
		return nil, nil
	}
	host := opt.OptimizedHost()
	if p := desired.CheckHost(h.claim(opt, nil), h.Rules, nil, nil); p != nil && p.Reason == desired.ReasonInvalidHost {
		return p, nil // not a name anyone could hold: nothing to read
	}
	opts := &optv1.IstioAdaptiveRequestOptimizerList{}
	if err := h.Client.List(ctx, opts, client.MatchingFields{indexOptimizedHost: host}); err != nil {
		return nil, fmt.Errorf("list optimizers of host %s: %w", host, err)
	}
	ses := &istionet.ServiceEntryList{}
	// The cache's own objects (a list without deep copy holds pointers to
	// them): only their metadata is read, never the spec, whose protobuf
	// state others set lazily (liveserviceentry.go). Copying them was a
	// tenth of a 4000-endpoint reconcile.
	if err := h.Client.List(ctx, ses, client.MatchingFields{indexServiceEntryHost: host}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list ServiceEntries of host %s: %w", host, err)
	}

	holds := map[types.NamespacedName]bool{}
	var holders []desired.HostHolder
	for _, se := range ses.Items {
		l := se.Labels
		if l[desired.LabelManagedBy] == desired.ManagedByValue && l[desired.LabelOptimizerName] != "" {
			// Written by the operator: it counts through its optimizer's
			// claim. A name too long for a label value is hashed there and
			// kept whole in an annotation (desired.OwnerName).
			holds[types.NamespacedName{Namespace: l[desired.LabelOptimizerNamespace], Name: desired.OwnerName(se)}] = true
			continue
		}
		holders = append(holders, desired.HostHolder{Kind: "ServiceEntry", Namespace: se.Namespace, Name: se.Name, Note: "not written by the operator"})
	}
	if ns, svc, ok := desired.ServiceHostName(host, h.Rules.ClusterDomain); ok {
		switch err := h.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: svc}, &corev1.Service{}); {
		case err == nil:
			holders = append(holders, desired.HostHolder{Kind: "Service", Namespace: ns, Name: svc, Note: "sidecars resolve the host to that Kubernetes Service"})
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("get Service %s/%s for host %s: %w", ns, svc, host, err)
		}
	}

	others := make([]desired.HostClaim, 0, len(opts.Items))
	for i := range opts.Items {
		o := &opts.Items[i]
		if o.Namespace == opt.Namespace && o.Name == opt.Name {
			continue
		}
		others = append(others, h.claim(o, holds))
	}
	return desired.CheckHost(h.claim(opt, holds), h.Rules, others, holders), nil
}

func (h *HostClaims) claim(o *optv1.IstioAdaptiveRequestOptimizer, holds map[types.NamespacedName]bool) desired.HostClaim {
	return desired.HostClaim{
		Namespace: o.Namespace, Name: o.Name,
		ServiceNamespace: o.TargetNamespace(), ServiceName: o.Spec.ServiceName,
		Host:     o.OptimizedHost(),
		Created:  o.CreationTimestamp.Time,
		Holds:    holds[client.ObjectKeyFromObject(o)],
		Deleting: !o.DeletionTimestamp.IsZero(),
		Barred:   h.Barred != nil && h.Barred(o),
	}
}

// setup indexes optimizers and ServiceEntries by host and makes the mirror
// reconcile the other claimants of a host when its holder goes away or
// changes: an optimizer deleted or moved to another host, a ServiceEntry or
// a Service of that host deleted.
func (h *HostClaims) setup(ctx context.Context, mgr ctrl.Manager, b *builder.Builder) (*builder.Builder, error) {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &optv1.IstioAdaptiveRequestOptimizer{}, indexOptimizedHost, func(o client.Object) []string {
		return []string{o.(*optv1.IstioAdaptiveRequestOptimizer).OptimizedHost()}
	}); err != nil {
		return nil, err
	}
	if err := idx.IndexField(ctx, &istionet.ServiceEntry{}, indexServiceEntryHost, func(o client.Object) []string {
		var out []string
		for _, host := range o.(*istionet.ServiceEntry).Spec.Hosts {
			out = append(out, strings.ToLower(host))
		}
		return out
	}); err != nil {
		return nil, err
	}
	c := mgr.GetClient()
	byHost := func(ctx context.Context, hosts ...string) []reconcile.Request {
		var out []reconcile.Request
		for _, host := range hosts {
			list := &optv1.IstioAdaptiveRequestOptimizerList{}
			if err := c.List(ctx, list, client.MatchingFields{indexOptimizedHost: host}); err != nil {
				continue
			}
			for i := range list.Items {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
		return out
	}
	add := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], reqs []reconcile.Request) {
		for _, r := range reqs {
			q.Add(r)
		}
	}
	hostOf := func(o client.Object) string { return o.(*optv1.IstioAdaptiveRequestOptimizer).OptimizedHost() }
	optimizers := handler.Funcs{
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			add(q, byHost(ctx, hostOf(e.Object)))
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			oldHost, newHost := hostOf(e.ObjectOld), hostOf(e.ObjectNew)
			if oldHost != newHost || !e.ObjectNew.GetDeletionTimestamp().IsZero() {
				add(q, byHost(ctx, oldHost, newHost))
			}
		},
	}
	domain := h.Rules.ClusterDomain
	if domain == "" {
		domain = "cluster.local"
	}
	return b.
		Watches(&optv1.IstioAdaptiveRequestOptimizer{}, optimizers).
		Watches(&istionet.ServiceEntry{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var hosts []string
			for _, host := range o.(*istionet.ServiceEntry).Spec.Hosts {
				hosts = append(hosts, strings.ToLower(host))
			}
			return byHost(ctx, hosts...)
		})).
		Watches(&corev1.Service{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			base := o.GetName() + "." + o.GetNamespace()
			return byHost(ctx, base, base+".svc", base+".svc."+domain)
		})), nil
}
