package controllers

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// Options are the operator-wide settings, bound to manager flags.
type Options struct {
	// MaxConcurrentReconciles of the mirror.
	MaxConcurrentReconciles int
	// Engine holds the defaults of every optimization setting.
	Engine EngineDefaults
	// CrossNamespace: which optimizers may name a Service in another
	// namespace (the operator then writes routing objects there). Off by
	// default: in a cluster shared by teams, whoever may create an optimizer
	// would otherwise reroute any team's Service.
	CrossNamespace NamespaceGate
	// AllowedHostSuffixes are DNS suffixes any team may name its optimized
	// host under, besides <service_namespace>.adaptive.
	AllowedHostSuffixes []string
	// CustomQueries: which optimizers may set their own query templates
	// (cpu_query, request_query). They run with the operator's metrics
	// credentials, so they are off by default.
	CustomQueries NamespaceGate
	// DefaultExportTo is the mesh's defaultServiceExportTo, comma-separated:
	// the export scope of Services without a networking.istio.io/exportTo
	// annotation, which the owned objects then keep.
	DefaultExportTo string
	// Coverage configures the traffic coverage figure (coverage.go).
	Coverage CoverageOptions
	// MultiCluster configures the detection of other clusters (multicluster.go).
	MultiCluster MultiClusterOptions
}

// BindFlags registers the options as flags.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.IntVar(&o.MaxConcurrentReconciles, "max-concurrent-reconciles", 4, "Optimizers mirrored in parallel.")
	fs.BoolVar(&o.CrossNamespace.All, "allow-cross-namespace", false, "Let every optimizer name a Service in another namespace (service_namespace); the operator then writes routing objects in that namespace.")
	fs.Func("cross-namespace-namespaces", "Comma-separated namespaces whose optimizers may name a Service in another namespace (for example a platform team's).", listFlag(&o.CrossNamespace.Namespaces))
	fs.BoolFunc("deny-cross-namespace", "Deprecated: cross-namespace targeting is off unless --allow-cross-namespace; --deny-cross-namespace=false acts as --allow-cross-namespace.", func(s string) error {
		deny, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		o.CrossNamespace.All = !deny
		return nil
	})
	fs.Func("allowed-host-suffixes", "Comma-separated DNS suffixes (e.g. mesh.example.com) under which any team may name its optimized host (spec.host), besides <service_namespace>.adaptive.", listFlag(&o.AllowedHostSuffixes))
	fs.BoolVar(&o.CustomQueries.All, "allow-custom-queries", false, "Let every optimizer set its own query templates (spec.optimization.*_query); they run with the operator's metrics credentials.")
	fs.Func("custom-query-namespaces", "Comma-separated namespaces whose optimizers may set their own query templates.", listFlag(&o.CustomQueries.Namespaces))
	fs.StringVar(&o.DefaultExportTo, "default-export-to", "*", "The mesh's meshConfig.defaultServiceExportTo, comma-separated (\".\", \"*\" or namespaces): the export scope of Services without a networking.istio.io/exportTo annotation. The operator's objects never reach further than the Service, so set this to what the mesh uses.")
	o.Engine.BindFlags(fs)
	o.Coverage.BindFlags(fs)
	o.MultiCluster.BindFlags(fs)
}

// Validate reports nonsense settings.
func (o *Options) Validate() error {
	if o.MaxConcurrentReconciles < 1 {
		return fmt.Errorf("--max-concurrent-reconciles must be at least 1, got %d", o.MaxConcurrentReconciles)
	}
	if _, err := desired.ParseExportTo(o.DefaultExportTo); err != nil {
		return fmt.Errorf("--default-export-to: %w", err)
	}
	for _, s := range o.AllowedHostSuffixes {
		if msg := desired.SuffixProblem(s); msg != "" {
			return fmt.Errorf("--allowed-host-suffixes: %s", msg)
		}
	}
	if err := o.MultiCluster.Validate(); err != nil {
		return err
	}
	if err := o.Coverage.Validate(); err != nil {
		return err
	}
	return o.Engine.Validate()
}

// Dependencies are what the controllers need from the manager's main.
type Dependencies struct {
	Clock         clock.Clock
	Metrics       *metrics.Metrics
	ClusterDomain string
	// Source answers the weight queries; nil leaves weights equal.
	Source MetricsSource
	// CoverageSource answers the coverage query; nil uses Source when it
	// can (a *promsource.Source does), else nothing is measured.
	CoverageSource CoverageSource
	Options        Options
	// Namespaces the manager watches (empty: all), for the PodCache.
	Namespaces []string
	// WatchErrors receives the PodCache's list and watch errors (may be
	// nil), like the manager cache's DefaultWatchErrorHandler.
	WatchErrors toolscache.WatchErrorHandlerWithContext
}

// Setup registers every controller of the operator with the manager.
func Setup(ctx context.Context, mgr ctrl.Manager, d Dependencies) error {
	book := NewWeightBook()
	if d.Options.Engine.Cycle == 0 {
		d.Options.Engine = DefaultEngineDefaults()
	}
	wake := make(chan event.GenericEvent, 64)
	var loop *WeightLoop
	if d.Source != nil {
		loop = &WeightLoop{Source: d.Source, Book: book, Clock: d.Clock, Metrics: d.Metrics, Wake: wake}
		if err := mgr.Add(loop); err != nil {
			return fmt.Errorf("add weight loop: %w", err)
		}
	}
	pods, err := NewPodCache(mgr.GetConfig(), d.Namespaces, d.WatchErrors)
	if err != nil {
		return err
	}
	if err := mgr.Add(pods); err != nil {
		return fmt.Errorf("add pod cache: %w", err)
	}
	mirror := &MirrorReconciler{
		Pods:           pods,
		Client:         mgr.GetClient(),
		Scheme:         mgr.GetScheme(),
		Recorder:       mgr.GetEventRecorder(FieldManager),
		Clock:          d.Clock,
		Metrics:        d.Metrics,
		Weights:        book,
		Loop:           loop,
		Defaults:       d.Options.Engine,
		Wake:           wake,
		ClusterDomain:  d.ClusterDomain,
		MaxConcurrent:  d.Options.MaxConcurrentReconciles,
		CrossNamespace: d.Options.CrossNamespace,
		CustomQueries:  d.Options.CustomQueries,
	}
	mirror.Hosts = &HostClaims{
		Client: mgr.GetClient(),
		Rules:  desired.HostRules{AllowedSuffixes: d.Options.AllowedHostSuffixes, ClusterDomain: d.ClusterDomain},
		Barred: func(o *optv1.IstioAdaptiveRequestOptimizer) bool {
			return crossNamespaceDenied(o, mirror.CrossNamespace) != ""
		},
	}
	if mirror.DefaultExportTo, err = desired.ParseExportTo(d.Options.DefaultExportTo); err != nil {
		return fmt.Errorf("--default-export-to: %w", err)
	}
	if err := setupMultiCluster(mgr, d.Options.MultiCluster, mirror); err != nil {
		return err
	}
	if err := setupCoverage(mgr, d, mirror, wake); err != nil {
		return err
	}
	if mirror.GatewayAPI, err = gatewayAPIFor(mgr); err != nil {
		return err
	}
	if err := mirror.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("set up mirror controller: %w", err)
	}
	return nil
}

// CacheOptions are the manager's cache settings: Pods and Nodes trimmed to
// the fields the mirror reads, and, when namespaces are given, a watch
// restricted to them (Nodes are cluster-scoped and stay cluster-wide). Every
// manager of this operator, in tests too, uses them, so a field the trim
// drops cannot go unnoticed.
func CacheOptions(namespaces []string) cache.Options {
	o := cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:  {Transform: TrimPod},
			&corev1.Node{}: {Transform: TrimNode},
		},
	}
	for _, ns := range namespaces {
		if ns = strings.TrimSpace(ns); ns != "" {
			if o.DefaultNamespaces == nil {
				o.DefaultNamespaces = map[string]cache.Config{}
			}
			o.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	return o
}

// TrimPod keeps only the Pod fields the mirror reads, the same as the
// PodCache keeps: of the labels only the data-plane mode, of the sidecar
// only that it is there (as the injector's status annotation, without its
// value), of the containers the application's names, ports and CPU. The
// mirror reads Pods through the PodCache; this trim keeps the manager's
// cache small should anything read Pods from it.
func TrimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	trimmed := newPodInfo(pod).pod()
	trimmed.TypeMeta, trimmed.UID, trimmed.DeletionTimestamp = pod.TypeMeta, pod.UID, pod.DeletionTimestamp
	return trimmed, nil
}

// interned shares equal small maps between cached objects: the pods of a
// Deployment have the same CPU limit and request, and a map is about 600
// bytes however small. At most internLimit values are kept; beyond them
// maps are not shared.
type interned[M any] struct {
	mu sync.Mutex
	m  map[string]M
}

const internLimit = 1024

func (i *interned[M]) get(key string, build func() M) M {
	i.mu.Lock()
	defer i.mu.Unlock()
	if v, ok := i.m[key]; ok {
		return v
	}
	v := build()
	if i.m == nil {
		i.m = map[string]M{}
	}
	if len(i.m) < internLimit {
		i.m[key] = v
	}
	return v
}

var internedResources interned[corev1.ResourceList]

// TrimNode keeps only a Node's labels (topology and instance type) and its
// allocatable CPU (a ceiling on what a pod without a CPU limit can use).
func TrimNode(obj any) (any, error) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		TypeMeta:   node.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: node.Name, UID: node.UID, ResourceVersion: node.ResourceVersion, Labels: node.Labels},
		Status:     corev1.NodeStatus{Allocatable: cpuOnly(node.Status.Allocatable)},
	}, nil
}

// cpuOnly is the CPU of a resource list alone, shared between equal values.
func cpuOnly(l corev1.ResourceList) corev1.ResourceList {
	if q, ok := l[corev1.ResourceCPU]; ok {
		return internedResources.get(q.String(), func() corev1.ResourceList {
			return corev1.ResourceList{corev1.ResourceCPU: q}
		})
	}
	return nil
}
