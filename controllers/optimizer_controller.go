// Package controllers holds the operator's reconcilers. They are thin: they
// read the cluster, call the pure packages (internal/desired for objects,
// internal/weights for weights) and apply the result.
package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

const (
	// FieldManager is the one server-side-apply field manager of the operator.
	FieldManager = "istio-adaptive-optimizer"
	// Finalizer deletes the owned objects when the optimizer is deleted.
	Finalizer = "optimization.liorfranko.github.io/cleanup"

	mirrorControllerName = "optimizer.mirror"
)

// MirrorReconciler mirrors a Service's ready pods into the optimized
// ServiceEntry and keeps the routing objects next to it.
type MirrorReconciler struct {
	Client client.Client
	// Pods serves the Pods the mirror reads; nil reads them through Client.
	Pods          *PodCache
	Scheme        *runtime.Scheme
	Recorder      events.EventRecorder
	Clock         clock.PassiveClock
	Metrics       *metrics.Metrics
	Weights       *WeightBook
	Loop          *WeightLoop // nil without a metrics backend
	Wake          <-chan event.GenericEvent
	Defaults      EngineDefaults
	ClusterDomain string
	MaxConcurrent int
	// CrossNamespace says which optimizers may name a Service in another
	// namespace.
	CrossNamespace NamespaceGate
	// CustomQueries says which optimizers may bring their own queries.
	CustomQueries NamespaceGate
	// Hosts decides whether an optimizer may use its optimized host.
	Hosts *HostClaims
	// DefaultExportTo is the mesh's defaultServiceExportTo (nil: "*").
	DefaultExportTo []string
	// Coverage holds the traffic coverage figures (nil: none measured);
	// below CoverageThreshold the optimizer is Degraded.
	Coverage          *CoverageBook
	CoverageThreshold float64
	// Clusters watches the mesh's remote secrets (nil: detection off).
	Clusters *RemoteClusters
	// GatewayAPI: the Gateway API route kinds the cluster serves.
	GatewayAPI GatewayAPI

	memo     weightsMemo        // the engine's last weights per optimizer (weightsmemo.go)
	liveSE   liveServiceEntries // the live ServiceEntry per optimizer (liveserviceentry.go)
	podSlabs podSlabs           // the Pods a reconcile reads, reused (podslab.go)
}

// +kubebuilder:rbac:groups=optimization.liorfranko.github.io,resources=istioadaptiverequestoptimizers,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=optimization.liorfranko.github.io,resources=istioadaptiverequestoptimizers/status,verbs=get;update
// +kubebuilder:rbac:groups=optimization.liorfranko.github.io,resources=istioadaptiverequestoptimizers/finalizers,verbs=update
// +kubebuilder:rbac:groups="",resources=services;pods;nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch
// +kubebuilder:rbac:groups=networking.istio.io,resources=serviceentries;destinationrules;virtualservices,verbs=get;list;watch;create;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings the owned Istio objects of one optimizer in line with the
// cluster. Status is written once, at the end, and only when it changed.
func (r *MirrorReconciler) Reconcile(ctx context.Context, req ctrl.Request) (result ctrl.Result, err error) {
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := r.Client.Get(ctx, req.NamespacedName, opt); err != nil {
		if apierrors.IsNotFound(err) {
			r.Loop.Stop(req.NamespacedName)
			r.Weights.Forget(req.NamespacedName)
			r.memo.forget(req.NamespacedName)
			r.liveSE.forget(req.NamespacedName)
			r.Metrics.ForgetOptimizer(req.Namespace, req.Name)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("get optimizer: %w", err)
	}
	if !opt.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.finalize(ctx, opt)
	}
	before := opt.Status.DeepCopy()
	st := newStatus(opt)
	defer func() {
		st.apply(opt, r.Clock.Now())
		if st.stall != nil {
			r.Loop.Stop(req.NamespacedName) // a Stalled optimizer does not query
		}
		for _, c := range opt.Status.Conditions {
			r.Metrics.SetCondition(opt.Namespace, opt.Name, c.Type, string(c.Status), c.Reason)
		}
		if !equalStatus(before, &opt.Status) {
			switch uerr := r.Client.Status().Update(ctx, opt); {
			case uerr == nil, apierrors.IsNotFound(uerr):
			case apierrors.IsConflict(uerr) && err == nil:
				// The cache was behind; the next reconcile sees the new object.
				result.RequeueAfter = 100 * time.Millisecond
			default:
				err = errors.Join(err, fmt.Errorf("update status: %w", uerr))
			}
		}
		if err != nil {
			r.Metrics.ReconcileError(mirrorControllerName, errorType(err), opt.Name, opt.Namespace)
		}
	}()

	r.reportDecodeProblems(ctx, opt, st)
	if msg := invalidSpec(opt); msg != "" {
		// Checked before the finalizer is added: nothing is written for
		// this spec, so nothing needs cleaning up. Not retried: the
		// optimizer is reconciled again when its spec changes.
		r.Loop.Stop(req.NamespacedName)
		st.stalled(ReasonInvalidSpec, msg)
		r.Recorder.Eventf(opt, nil, corev1.EventTypeWarning, ReasonInvalidSpec, "Reconcile", "%s", msg)
		return ctrl.Result{}, nil
	}
	if !controllerutil.ContainsFinalizer(opt, Finalizer) {
		// Owned objects live in the Service's namespace, where owner
		// references cannot reach from another namespace; and a cluster
		// without a garbage collector would keep them. The finalizer deletes
		// them explicitly either way.
		// The optimistic lock makes a patch from a stale cache fail with a
		// conflict instead of overwriting finalizers others added.
		patch := client.MergeFromWithOptions(opt.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(opt, Finalizer)
		if err := r.Client.Patch(ctx, opt, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}

	if err := r.retarget(ctx, opt); err != nil {
		st.failed("RetargetFailed", err.Error())
		return ctrl.Result{}, err
	}
	if msg := crossNamespaceDenied(opt, r.CrossNamespace); msg != "" {
		st.stalled("CrossNamespaceDenied", msg)
		return ctrl.Result{}, nil
	}
	if p, err := r.Hosts.Check(ctx, opt); err != nil {
		st.failed("ReadFailed", err.Error())
		return ctrl.Result{}, err
	} else if p != nil {
		// The loser never writes: what is live stays as it is.
		st.stalled(p.Reason, p.Message)
		r.Recorder.Eventf(opt, nil, corev1.EventTypeWarning, p.Reason, "Reconcile", "%s", p.Message)
		return ctrl.Result{}, nil
	}
	withQueries, qmsg := withAllowedQueries(opt, r.CustomQueries)
	if qmsg != "" {
		st.degraded(ReasonCustomQueryNotAllowed, qmsg)
	}
	settings, serr := settingsFor(withQueries, r.Defaults)
	if serr != nil {
		st.degraded("InvalidOptimization", serr.Error())
	}
	r.Loop.Ensure(opt, settings)
	st.optimization(r.Weights.Outcome(req.NamespacedName), r.Loop.enabled())
	r.coverage(opt, st)

	slab := r.podSlabs.get()
	defer r.podSlabs.put(slab) // after the last read of in.Pods (desired.Compute)
	in, live, err := r.read(ctx, opt, slab)
	if err != nil {
		st.failed("ReadFailed", err.Error())
		return ctrl.Result{}, err
	}
	useEngine := r.Loop.enabled() && !settings.DryRun
	r.Weights.Restore(req.NamespacedName, settings.Params, learnedSnapshot(opt), liveBalancer(live.dr), liveBalancerReason(opt, live.dr))
	in.WeightsLearned = weightsLearned(r.Weights, req.NamespacedName, useEngine, live.dr)
	in.WeightsFor = func(eps []desired.Endpoint) map[string]uint32 {
		compute := func() map[string]uint32 {
			return r.Weights.WeightsFor(req.NamespacedName, settings.Params, r.Clock.Now(), eps, liveEndpoints(in, live.se), useEngine)
		}
		if !useEngine {
			return compute()
		}
		var cycle time.Time
		if out := r.Weights.Outcome(req.NamespacedName); out != nil {
			cycle = out.Time
		}
		return r.memo.weightsFor(req.NamespacedName, opt.Generation, cycle, eps, in.LiveWeights, compute)
	}
	res := desired.Compute(in)
	st.host = res.Host
	_, why, _ := r.Weights.Balancer(req.NamespacedName)
	st.balancer(opt.Balancer(), res.LoadBalancer, useEngine, why)
	st.endpointsByPod = make(map[string]desired.Endpoint, len(res.Endpoints))
	for _, ep := range res.Endpoints {
		st.endpointsByPod[ep.Pod] = ep
	}
	st.owned = optv1.OwnedObjects{Namespace: res.Namespace, ServiceEntry: res.Name, DestinationRule: res.Name}
	if res.VirtualService != nil {
		st.owned.VirtualService = res.Name
	}

	for _, p := range res.Problems {
		if p.Fatal {
			// Nothing is written and nothing live is deleted: the last
			// good routing stays in place until the problem is fixed
			// (except a route to a partial endpoint set: endpoint_limit.go).
			if deleted, err := r.leaveTrafficOnService(ctx, opt, p, live); err != nil {
				st.failed("DeleteFailed", err.Error())
				return ctrl.Result{}, err
			} else if deleted {
				st.owned.VirtualService = ""
			}
			if err := r.followPods(ctx, opt, settings, res, live); err != nil {
				st.failed("ApplyFailed", err.Error())
				return ctrl.Result{}, err
			}
			st.stalled(p.Reason, p.Message)
			r.Recorder.Eventf(opt, nil, corev1.EventTypeWarning, p.Reason, "Reconcile", "%s", p.Message)
			return ctrl.Result{}, nil
		}
		st.degraded(p.Reason, p.Message)
	}
	if msg := live.conflicts(opt, res); msg != "" {
		st.stalled("ObjectConflict", msg)
		r.Recorder.Eventf(opt, nil, corev1.EventTypeWarning, "ObjectConflict", "Reconcile", "%s", msg)
		return ctrl.Result{}, nil
	}
	if !slices.Equal(res.ExportTo, []string{"*"}) {
		// A narrower reach takes its namespaces from the operator's
		// VirtualService only where that one is public: exported to them
		// privately or by name too, istiod orders the two by age there.
		for _, n := range live.narrowerVirtualServices {
			live.otherVirtualServices = append(live.otherVirtualServices, n.ref)
		}
		live.narrowerVirtualServices = nil
	}
	if others := live.otherVirtualServices; res.VirtualService != nil && len(others) > 0 {
		var msg string
		if live.vs != nil {
			// Ours came first; removing it would change live routing. Both
			// now claim the host and Istio keeps only one of them.
			msg = fmt.Sprintf("VirtualService %s also routes %s, next to the operator's %s/%s; Istio uses only one of them. "+
				"Delete one, or set routing_mode: none and point that route's destination host at %s",
				others[0], res.KubernetesHost, live.vs.Namespace, live.vs.Name, res.Host)
		} else {
			msg = fmt.Sprintf("VirtualService %s already routes %s; the operator writes no VirtualService of its own. "+
				"Point that route's destination host at %s to use the optimized weights, or set routing_mode: none",
				others[0], res.KubernetesHost, res.Host)
			res.VirtualService = nil
			st.owned.VirtualService = ""
		}
		st.degraded("VirtualServiceConflict", msg)
		r.Recorder.Eventf(opt, nil, corev1.EventTypeWarning, "VirtualServiceConflict", "Reconcile", "%s", msg)
	}
	if n := live.narrowerVirtualServices; len(n) > 0 && res.VirtualService != nil {
		refs := make([]string, len(n))
		for i, v := range n {
			refs[i] = fmt.Sprintf("%s (clients in %s)", v.ref, strings.Join(v.reach, ", "))
		}
		st.degraded("VirtualServiceOfNarrowerReach", fmt.Sprintf("VirtualService %s routes %s and is exported to those namespaces only; "+
			"Istio routes their clients by it, so they do not use the optimized weights, and every other client does. "+
			"To include them, point that route's destination host at %s", strings.Join(refs, "; "), res.KubernetesHost, res.Host))
	}
	gw, err := r.planGateways(ctx, opt, &res, live, st)
	if err != nil {
		st.failed("ReadFailed", err.Error())
		return ctrl.Result{}, err
	}

	if err := r.apply(ctx, opt, res, live); err != nil {
		st.failed("ApplyFailed", err.Error())
		return ctrl.Result{}, err
	}
	if err := r.applyGateways(ctx, opt, res, live, gw, st); err != nil {
		st.failed("ApplyFailed", err.Error())
		return ctrl.Result{}, err
	}
	r.Weights.Applied(req.NamespacedName, settings.Params, r.Clock.Now(), res.Endpoints)
	r.Loop.Poke(req.NamespacedName)
	if err := r.persistLearned(ctx, opt); err != nil {
		// Only a restart loses by it (it re-learns the noise); not a failure.
		log.FromContext(ctx).Info("Could not persist the learned state", "error", err.Error())
	}
	st.endpoints = int32(len(res.Endpoints))
	r.publish(opt, res)
	return ctrl.Result{}, nil
}

// liveEndpoints is what the live ServiceEntry tells a restart (see
// LiveEndpoints): its weights, when this operator last wrote it (the
// latest time among its managed fields entries: apply, and the
// endpoint-limit patch), and when the pods were created and became Ready.
func liveEndpoints(in desired.Input, se *istionet.ServiceEntry) LiveEndpoints {
	l := LiveEndpoints{Weights: in.LiveWeights, PodTimes: func(name string) (created, ready time.Time) {
		pod := in.Pods[name]
		if pod == nil {
			return time.Time{}, time.Time{}
		}
		return pod.CreationTimestamp.Time, podReadyAt(pod).Time
	}}
	if se != nil {
		for _, mf := range se.ManagedFields {
			if mf.Manager == FieldManager && mf.Time != nil && mf.Time.After(l.Written) {
				l.Written = mf.Time.Time
			}
		}
	}
	return l
}

// liveObjects are the objects that exist now.
type liveObjects struct {
	se                   *istionet.ServiceEntry
	dr                   *istionet.DestinationRule
	vs                   *istionet.VirtualService
	otherVirtualServices []string // namespace/name of VirtualServices of others for the host
	// narrowerVirtualServices: VirtualServices of others for the host that
	// reach only some namespaces' clients (see desired.VirtualServiceReach).
	narrowerVirtualServices []narrowerVirtualService
}

type narrowerVirtualService struct {
	ref   string   // namespace/name
	reach []string // the namespaces whose clients it reaches
}

// conflicts names an object of our name that someone else owns.
func (l liveObjects) conflicts(opt *optv1.IstioAdaptiveRequestOptimizer, res desired.Result) string {
	check := func(kind string, obj metav1.Object) string {
		if obj == nil || desired.IsOwnedBy(obj, opt) {
			return ""
		}
		owner := obj.GetLabels()[desired.LabelOptimizerNamespace] + "/" + desired.OwnerName(obj)
		if obj.GetLabels()[desired.LabelManagedBy] == desired.ManagedByValue {
			return fmt.Sprintf("%s %s/%s belongs to optimizer %s, which already optimizes Service %s/%s",
				kind, obj.GetNamespace(), obj.GetName(), owner, res.Namespace, opt.Spec.ServiceName)
		}
		return fmt.Sprintf("%s %s/%s exists and is not managed by this operator; it is left untouched. Delete or rename it to let the optimizer proceed",
			kind, obj.GetNamespace(), obj.GetName())
	}
	for _, c := range []struct {
		kind string
		obj  metav1.Object
	}{{"ServiceEntry", nilIfTyped(l.se)}, {"DestinationRule", nilIfTyped(l.dr)}, {"VirtualService", nilIfTyped(l.vs)}} {
		if msg := check(c.kind, c.obj); msg != "" {
			return msg
		}
	}
	return ""
}

func nilIfTyped[T any, P interface {
	*T
	metav1.Object
}](p P) metav1.Object {
	if p == nil {
		return nil
	}
	return p
}

// pod reads one pod, nil when there is none; from the pod cache into the
// slab's memory.
func (r *MirrorReconciler) pod(ctx context.Context, namespace, name string, slab *podSlab) (*corev1.Pod, error) {
	if r.Pods != nil {
		pod := slab.next()
		if ok, err := r.Pods.PodInto(ctx, namespace, name, pod); !ok || err != nil {
			slab.unused(pod)
			return nil, err
		}
		return pod, nil
	}
	pod := &corev1.Pod{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, pod); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return pod, nil
}

// read gathers the inputs of desired.Compute and the live owned objects.
func (r *MirrorReconciler) read(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, slab *podSlab) (desired.Input, liveObjects, error) {
	ns := opt.TargetNamespace()
	in := desired.Input{Optimizer: opt, ClusterDomain: r.ClusterDomain, Pods: slab.byName, Nodes: map[string]*corev1.Node{}}
	var live liveObjects

	svc := &corev1.Service{}
	switch err := r.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: opt.Spec.ServiceName}, svc); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return in, live, fmt.Errorf("get Service %s/%s: %w", ns, opt.Spec.ServiceName, err)
	default:
		in.Service = svc
	}

	slices := &discoveryv1.EndpointSliceList{}
	// Read only (desired.Compute copies what it keeps), so not deep-copied.
	if err := r.Client.List(ctx, slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: opt.Spec.ServiceName}, client.UnsafeDisableDeepCopy); err != nil {
		return in, live, fmt.Errorf("list EndpointSlices of %s/%s: %w", ns, opt.Spec.ServiceName, err)
	}
	in.Slices = slices.Items
	n := 0
	for _, s := range slices.Items {
		n += len(s.Endpoints)
	}
	slab.reserve(n)
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
				if _, seen := in.Pods[e.TargetRef.Name]; !seen {
					pod, err := r.pod(ctx, ns, e.TargetRef.Name, slab)
					if err != nil {
						return in, live, fmt.Errorf("get Pod %s/%s: %w", ns, e.TargetRef.Name, err)
					}
					if pod != nil {
						in.Pods[pod.Name] = pod
					}
				}
			}
			node := ""
			if e.NodeName != nil {
				node = *e.NodeName
			} else if e.TargetRef != nil && in.Pods[e.TargetRef.Name] != nil {
				node = in.Pods[e.TargetRef.Name].Spec.NodeName
			}
			if _, seen := in.Nodes[node]; node != "" && !seen {
				n := &corev1.Node{}
				if err := r.Client.Get(ctx, types.NamespacedName{Name: node}, n); err == nil {
					in.Nodes[node] = n
				} else if !apierrors.IsNotFound(err) {
					return in, live, fmt.Errorf("get Node %s: %w", node, err)
				}
			}
		}
	}

	name := types.NamespacedName{Namespace: ns, Name: desired.ObjectName(opt.Spec.ServiceName)}
	var err error
	// A deep copy made once per version of the object (liveserviceentry.go).
	if live.se, in.LiveWeights, err = r.liveSE.get(ctx, r.Client, client.ObjectKeyFromObject(opt), name); err != nil {
		return in, live, err
	}
	if live.dr, err = getOptional(ctx, r.Client, name, &istionet.DestinationRule{}); err != nil {
		return in, live, err
	}
	if live.vs, err = getOptional(ctx, r.Client, name, &istionet.VirtualService{}); err != nil {
		return in, live, err
	}
	if in.Mesh, err = r.readMesh(ctx, ns); err != nil {
		return in, live, err
	}

	if opt.Routing() != optv1.RoutingNone {
		vss := &istionet.VirtualServiceList{}
		if err := r.Client.List(ctx, vss, client.MatchingFields{indexVirtualServiceHost: desired.KubernetesHost(opt.Spec.ServiceName, ns, r.ClusterDomain)}); err != nil {
			return in, live, fmt.Errorf("list VirtualServices: %w", err)
		}
		for _, vs := range vss.Items {
			if desired.IsOwnedBy(vs, opt) {
				continue
			}
			if !desired.ServesHost(vs, opt.Spec.ServiceName, ns, r.ClusterDomain) {
				continue
			}
			// One exported to some namespaces only takes the host in those
			// alone: the operator's VirtualService still serves every
			// other client (istiod's order, proven by the conformance
			// suite; not for the mesh routes of gateway_api, which it does
			// not prove).
			switch reach, everywhere := desired.VirtualServiceReach(vs); {
			case everywhere || opt.Routing() != optv1.RoutingVirtualService:
				live.otherVirtualServices = append(live.otherVirtualServices, vs.Namespace+"/"+vs.Name)
			case len(reach) > 0:
				live.narrowerVirtualServices = append(live.narrowerVirtualServices, narrowerVirtualService{vs.Namespace + "/" + vs.Name, reach})
			}
		}
	}
	return in, live, nil
}

func getOptional[T client.Object](ctx context.Context, c client.Client, key types.NamespacedName, obj T, opts ...client.GetOption) (T, error) {
	var zero T
	if err := c.Get(ctx, key, obj, opts...); err != nil {
		if apierrors.IsNotFound(err) {
			return zero, nil
		}
		return zero, fmt.Errorf("get %T %s: %w", obj, key, err)
	}
	return obj, nil
}

// apply server-side-applies each desired object that differs from what is
// live; an object that is already right is not written (every write of an
// Istio object is a mesh-wide xDS push).
func (r *MirrorReconciler) apply(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, res desired.Result, live liveObjects) error {
	sameNamespace := opt.TargetNamespace() == opt.Namespace
	own := func(obj client.Object) error {
		if !sameNamespace {
			return nil
		}
		return controllerutil.SetControllerReference(opt, obj, r.Scheme)
	}
	type item struct {
		kind     string
		obj      client.Object
		upToDate bool
	}
	var items []item
	if err := own(res.ServiceEntry); err != nil {
		return err
	}
	items = append(items, item{"ServiceEntry", res.ServiceEntry, live.se != nil && desired.UpToDate(FieldManager, res.ServiceEntry, live.se, &res.ServiceEntry.Spec, &live.se.Spec)})
	if err := own(res.DestinationRule); err != nil {
		return err
	}
	items = append(items, item{"DestinationRule", res.DestinationRule, live.dr != nil && desired.UpToDate(FieldManager, res.DestinationRule, live.dr, &res.DestinationRule.Spec, &live.dr.Spec)})
	if res.VirtualService != nil {
		if err := own(res.VirtualService); err != nil {
			return err
		}
		items = append(items, item{"VirtualService", res.VirtualService, live.vs != nil && desired.UpToDate(FieldManager, res.VirtualService, live.vs, &res.VirtualService.Spec, &live.vs.Spec)})
	}
	// The ServiceEntry goes first and the VirtualService last, so traffic is
	// only routed to the optimized host once it has endpoints.
	for _, it := range items {
		if it.upToDate {
			continue
		}
		if err := r.serverSideApply(ctx, it.obj); err != nil {
			return fmt.Errorf("apply %s %s/%s: %w", it.kind, it.obj.GetNamespace(), it.obj.GetName(), err)
		}
		r.Metrics.Writes.WithLabelValues(res.Namespace, opt.Spec.ServiceName, it.kind).Inc()
		r.Recorder.Eventf(opt, it.obj, corev1.EventTypeNormal, "Applied", "Apply", "Applied %s %s/%s", it.kind, it.obj.GetNamespace(), it.obj.GetName())
		log.FromContext(ctx).Info("Applied owned object", "kind", it.kind, "object", client.ObjectKeyFromObject(it.obj))
	}
	if res.VirtualService == nil && live.vs != nil && desired.IsOwnedBy(live.vs, opt) && opt.Routing() == optv1.RoutingNone {
		// The user switched to routing_mode none: our own VirtualService goes.
		if err := r.Client.Delete(ctx, live.vs); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete VirtualService %s/%s: %w", live.vs.Namespace, live.vs.Name, err)
		}
	}
	return nil
}

func (r *MirrorReconciler) serverSideApply(ctx context.Context, obj client.Object) error {
	data, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{Object: data}
	// Only the fields the operator means to own are sent.
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return r.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership)
}

// publish exports the per-pod series of the mirrored endpoints.
func (r *MirrorReconciler) publish(opt *optv1.IstioAdaptiveRequestOptimizer, res desired.Result) {
	// In dry run endpoint_weight shows what the engine computed, not what
	// is applied, so dashboards can compare before switching it off.
	var computed map[string]uint32
	if out := r.Weights.Outcome(client.ObjectKeyFromObject(opt)); out != nil && opt.Spec.DryRun {
		computed = out.Result.Weights
	}
	samples := make([]metrics.PodSample, 0, len(res.Endpoints))
	for _, ep := range res.Endpoints {
		w := ep.Weight
		if c, ok := computed[ep.Pod]; ok {
			w = c
		}
		samples = append(samples, metrics.PodSample{Pod: ep.Pod, IP: ep.Address, Locality: ep.Locality, Weight: w})
	}
	r.Metrics.SetPods(res.Namespace, opt.Spec.ServiceName, samples)
	r.Metrics.ServiceEndpoints.WithLabelValues(res.Namespace, opt.Spec.ServiceName).Set(float64(len(res.Endpoints)))
}

// finalize removes owned objects in another namespace, then the finalizer.
// Those are the objects of the Service the spec names and, when the spec
// was changed to name another Service and no reconcile has retargeted yet,
// those the status says were written (nothing else would remove them:
// owner references reach only the optimizer's own namespace).
func (r *MirrorReconciler) finalize(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer) error {
	key := client.ObjectKeyFromObject(opt)
	owned := false
	if controllerutil.ContainsFinalizer(opt, Finalizer) {
		name := types.NamespacedName{Namespace: opt.TargetNamespace(), Name: desired.ObjectName(opt.Spec.ServiceName)}
		// Gateway routes go back to the Service before its optimized host goes.
		if err := r.finalizeGateways(ctx, opt); err != nil {
			return err
		}
		var err error
		if owned, err = r.deleteOwned(ctx, opt, name); err != nil {
			return err
		}
		if err := r.retarget(ctx, opt); err != nil {
			return err
		}
		patch := client.MergeFromWithOptions(opt.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.RemoveFinalizer(opt, Finalizer)
		if err := r.Client.Patch(ctx, opt, patch); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove finalizer: %w", err)
		}
	}
	r.Loop.Stop(key)
	r.Weights.Forget(key)
	r.memo.forget(key)
	r.liveSE.forget(key)
	r.Metrics.ForgetOptimizer(key.Namespace, key.Name)
	if owned {
		// Only the optimizer that owned the objects publishes the Service's
		// series; a stalled duplicate must not wipe them.
		r.Metrics.ForgetService(opt.TargetNamespace(), opt.Spec.ServiceName)
	}
	return nil
}

// deleteOwned deletes the routing objects of this optimizer named name, and
// says whether there were any. Objects of others are left alone.
func (r *MirrorReconciler) deleteOwned(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, name types.NamespacedName) (bool, error) {
	owned := false
	for _, obj := range []client.Object{&istionet.VirtualService{}, &istionet.DestinationRule{}, &istionet.ServiceEntry{}} {
		if err := r.Client.Get(ctx, name, obj); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return owned, fmt.Errorf("get %T %s for cleanup: %w", obj, name, err)
		}
		if !desired.IsOwnedBy(obj, opt) {
			continue
		}
		owned = true
		if err := r.Client.Delete(ctx, obj); err != nil && !apierrors.IsNotFound(err) {
			return owned, fmt.Errorf("delete %T %s: %w", obj, name, err)
		}
	}
	return owned, nil
}

// retarget removes the objects of a Service the optimizer no longer names
// (service_name or service_namespace changed): nobody would keep them in
// line with that Service's pods any more, so its traffic goes back to plain
// Kubernetes routing.
func (r *MirrorReconciler) retarget(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer) error {
	old := opt.Status.OwnedObjects
	if old.ServiceEntry == "" || (old.Namespace == opt.TargetNamespace() && old.ServiceEntry == desired.ObjectName(opt.Spec.ServiceName)) {
		return nil
	}
	if err := r.finalizeGateways(ctx, opt); err != nil {
		return err
	}
	owned, err := r.deleteOwned(ctx, opt, types.NamespacedName{Namespace: old.Namespace, Name: old.ServiceEntry})
	if err != nil {
		return err
	}
	if owned {
		log.FromContext(ctx).Info("Removed the routing objects of the Service the optimizer no longer names", "namespace", old.Namespace, "name", old.ServiceEntry)
		r.Recorder.Eventf(opt, nil, corev1.EventTypeNormal, "Retargeted", "Delete", "Removed %s/%s of the Service the optimizer no longer names", old.Namespace, old.ServiceEntry)
		r.Metrics.ForgetService(old.Namespace, strings.TrimSuffix(old.ServiceEntry, "-adaptive"))
	}
	r.Weights.Forget(client.ObjectKeyFromObject(opt))
	return nil
}

func errorType(err error) string {
	switch {
	case apierrors.IsConflict(err):
		return "conflict"
	case apierrors.IsForbidden(err):
		return "forbidden"
	case apierrors.IsInvalid(err):
		return "invalid"
	case errors.Is(err, context.DeadlineExceeded), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return "timeout"
	}
	return "other"
}
