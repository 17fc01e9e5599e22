package controllers

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

const (
	// LabelMultiCluster marks the remote secrets through which istiod reads
	// the API servers of the mesh's other clusters (istioctl
	// create-remote-secret writes it; istiod watches its own namespace for
	// Secrets with it).
	LabelMultiCluster = "istio/multiCluster"
	// AnnotationCluster is the cluster ID istioctl create-remote-secret
	// writes on the Secret (the Secret's data key is the same ID).
	AnnotationCluster = "networking.istio.io/cluster"
	// remoteSecretPrefix is the name istioctl gives remote secrets.
	remoteSecretPrefix = "istio-remote-secret-"
)

// MultiClusterOptions configure the detection of a multi-cluster mesh.
type MultiClusterOptions struct {
	// IstioNamespace is where istiod reads remote secrets; "" turns
	// detection off (and with it the read of Secret metadata there).
	IstioNamespace string
	// AllowLocalOnly accepts that an optimized Service of a multi-cluster
	// mesh routes this cluster's pods only.
	AllowLocalOnly bool
}

// BindFlags registers the multi-cluster flags.
func (o *MultiClusterOptions) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.IstioNamespace, "istio-namespace", "istio-system", `Namespace of istiod, where it reads remote secrets (labelled istio/multiCluster=true) of the mesh's other clusters; the operator watches their metadata there (a Role in that namespace) to refuse local-only routing in a multi-cluster mesh. "" turns the detection off.`)
	fs.BoolVar(&o.AllowLocalOnly, "allow-local-only-routing", false, "In a multi-cluster mesh, optimize Services anyway: the optimized host carries this cluster's pods only, so routing through it drops the other clusters' endpoints and cross-cluster failover (the optimizers say so in Degraded).")
}

// Validate reports nonsense settings.
func (o *MultiClusterOptions) Validate() error {
	if o.IstioNamespace != "" {
		if errs := validation.IsDNS1123Label(o.IstioNamespace); len(errs) > 0 {
			return fmt.Errorf("--istio-namespace %q: %s", o.IstioNamespace, strings.Join(errs, "; "))
		}
	}
	return nil
}

// RemoteClusters watches the metadata of the remote secrets in istiod's
// namespace, and nothing else: its own cache, restricted to that namespace
// and to Secrets labelled istio/multiCluster=true, holds names and labels,
// never the kubeconfigs.
type RemoteClusters struct {
	namespace string
	cache     cache.Cache
	allow     bool
}

// NewRemoteClusters returns the watcher; add it to the manager (its cache
// starts with the manager's caches) and call setup on the mirror's builder.
func NewRemoteClusters(mgr ctrl.Manager, o MultiClusterOptions) (*RemoteClusters, error) {
	c, err := cache.New(mgr.GetConfig(), cache.Options{
		Scheme:               mgr.GetScheme(),
		Mapper:               mgr.GetRESTMapper(),
		DefaultNamespaces:    map[string]cache.Config{o.IstioNamespace: {}},
		DefaultLabelSelector: labels.SelectorFromSet(labels.Set{LabelMultiCluster: "true"}),
	})
	if err != nil {
		return nil, fmt.Errorf("remote secret cache: %w", err)
	}
	return &RemoteClusters{namespace: o.IstioNamespace, cache: c, allow: o.AllowLocalOnly}, nil
}

// Start runs the cache (manager.Runnable).
func (c *RemoteClusters) Start(ctx context.Context) error { return c.cache.Start(ctx) }

// GetCache makes the manager start the cache with its own caches, before
// the controllers.
func (c *RemoteClusters) GetCache() cache.Cache { return c.cache }

func secretMetadata() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "Secret"})
	return m
}

// Names are the remote clusters' IDs, sorted.
func (c *RemoteClusters) Names(ctx context.Context) ([]string, error) {
	list := &metav1.PartialObjectMetadataList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "SecretList"})
	if err := c.cache.List(ctx, list, client.InNamespace(c.namespace)); err != nil {
		return nil, fmt.Errorf("list remote secrets in %s: %w", c.namespace, err)
	}
	out := make([]string, 0, len(list.Items))
	for _, s := range list.Items {
		if s.Labels[LabelMultiCluster] != "true" {
			continue
		}
		out = append(out, remoteClusterName(s.ObjectMeta))
	}
	sort.Strings(out)
	return out, nil
}

// remoteClusterName is the cluster a remote secret registers: its
// annotation, else its name without istioctl's prefix.
func remoteClusterName(m metav1.ObjectMeta) string {
	if id := m.Annotations[AnnotationCluster]; id != "" {
		return id
	}
	if id, ok := strings.CutPrefix(m.Name, remoteSecretPrefix); ok && id != "" {
		return id
	}
	return m.Name
}

// setup reconciles every optimizer when a remote secret comes or goes.
func (c *RemoteClusters) setup(mgr ctrl.Manager, b *builder.Builder) *builder.Builder {
	all := handler.TypedEnqueueRequestsFromMapFunc(func(ctx context.Context, _ *metav1.PartialObjectMetadata) []reconcile.Request {
		list := &optv1.IstioAdaptiveRequestOptimizerList{}
		if err := mgr.GetClient().List(ctx, list); err != nil {
			return nil
		}
		out := make([]reconcile.Request, 0, len(list.Items))
		for _, o := range list.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&o)})
		}
		return out
	})
	return b.WatchesRawSource(source.Kind(c.cache, secretMetadata(), all))
}

// multiCluster is what the mirror tells desired.Compute about other
// clusters (nothing when detection is off).
func (r *MirrorReconciler) multiCluster(ctx context.Context) (desired.MultiCluster, error) {
	if r.Clusters == nil {
		return desired.MultiCluster{}, nil
	}
	names, err := r.Clusters.Names(ctx)
	return desired.MultiCluster{RemoteClusters: names, AllowLocalOnly: r.Clusters.allow}, err
}

// setupMultiCluster adds the remote secret watcher unless detection is off.
func setupMultiCluster(mgr ctrl.Manager, o MultiClusterOptions, mirror *MirrorReconciler) error {
	if o.IstioNamespace == "" {
		return nil
	}
	rc, err := NewRemoteClusters(mgr, o)
	if err != nil {
		return err
	}
	if err := mgr.Add(rc); err != nil {
		return fmt.Errorf("add remote secret cache: %w", err)
	}
	mirror.Clusters = rc
	return nil
}
