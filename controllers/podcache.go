package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// PodCache watches the cluster's Pods and keeps of each only what the mirror
// reads (podInfo, about 0.4 KiB), not a corev1.Pod: a Pod struct is 1.2 KiB
// however much of it is trimmed, and at 10 000 pods the Pods were a third
// of the manager's heap. Reads get a *corev1.Pod rebuilt from the record
// (what TrimPod would keep), so desired.Compute sees the same pod.
type PodCache struct {
	informers map[string]toolscache.SharedIndexInformer // by namespace ("" = all)
	started   chan struct{}
	startOnce sync.Once
}

// podInfo is a cached pod. Only Name, Namespace and ResourceVersion of the
// metadata are set (the informer keys on them), and CreationTimestamp (a
// restart tells pods created while it was down by it).
type podInfo struct {
	metav1.ObjectMeta
	serviceAccount, node string
	// labels holds the istio.io/dataplane-mode label alone (nil when the
	// pod has none), annotations Istio's sidecar status annotation alone
	// (nil without a sidecar): both shared between pods (internedPodMaps),
	// so a rebuilt pod allocates no map.
	labels, annotations map[string]string
	// containers are the application's (not the sidecar).
	containers []podContainer
	// readyAt is when the pod last became Ready (its Ready condition's
	// last transition, while True); zero when not Ready or unknown. A
	// restart tells pods created while it was down by it (podReadyAt).
	readyAt metav1.Time
}

// podContainer is what the mirror reads of a container: a corev1.Container
// is 0.4 KiB. The CPU lists are shared between pods (see interned).
type podContainer struct {
	name             string
	ports            []corev1.ContainerPort
	limits, requests corev1.ResourceList
}

// NewPodCache builds informers over Pods, cluster-wide or in the given
// namespaces. onError receives list and watch errors (may be nil).
func NewPodCache(cfg *rest.Config, namespaces []string, onError toolscache.WatchErrorHandlerWithContext) (*PodCache, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("pod cache client: %w", err)
	}
	c := &PodCache{informers: map[string]toolscache.SharedIndexInformer{}, started: make(chan struct{})}
	var nss []string
	for _, ns := range namespaces {
		if ns = strings.TrimSpace(ns); ns != "" {
			nss = append(nss, ns)
		}
	}
	if len(nss) == 0 {
		nss = []string{metav1.NamespaceAll}
	}
	for _, ns := range nss {
		lw := toolscache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, fields.Everything())
		inf := toolscache.NewSharedIndexInformerWithOptions(lw, &corev1.Pod{}, toolscache.SharedIndexInformerOptions{ObjectDescription: "*v1.Pod"})
		if err := inf.SetTransform(podInfoTransform); err != nil {
			return nil, err
		}
		if onError != nil {
			if err := inf.SetWatchErrorHandlerWithContext(onError); err != nil {
				return nil, err
			}
		}
		c.informers[ns] = inf
	}
	return c, nil
}

// Start runs the informers until ctx ends (manager.Runnable). Every replica
// runs it, like the manager's cache, so a newly elected leader is warm.
func (c *PodCache) Start(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, inf := range c.informers {
		wg.Go(func() { inf.RunWithContext(ctx) })
	}
	c.startOnce.Do(func() { close(c.started) })
	wg.Wait()
	return nil
}

// NeedLeaderElection is false: the cache runs on every replica.
func (c *PodCache) NeedLeaderElection() bool { return false }

// WaitForSync blocks until every informer has listed, or ctx ends.
func (c *PodCache) WaitForSync(ctx context.Context) bool {
	select {
	case <-c.started:
	case <-ctx.Done():
		return false
	}
	for _, inf := range c.informers {
		if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return false
		}
	}
	return true
}

// Pod returns a pod as the mirror reads it; ok is false when there is none.
// Before the informers have listed it waits up to 30 s, then fails.
func (c *PodCache) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, bool, error) {
	pod := &corev1.Pod{}
	ok, err := c.PodInto(ctx, namespace, name, pod)
	if !ok || err != nil {
		return nil, ok, err
	}
	return pod, true, nil
}

// PodInto is Pod writing into dst, which it overwrites whole (reusing the
// backing array of its containers): the mirror reuses its Pods from one
// reconcile to the next (podslab.go).
func (c *PodCache) PodInto(ctx context.Context, namespace, name string, dst *corev1.Pod) (bool, error) {
	inf := c.informers[namespace]
	if inf == nil {
		inf = c.informers[metav1.NamespaceAll]
	}
	if inf == nil {
		return false, nil // not watched: like a pod that is not there
	}
	if !inf.HasSynced() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if !c.WaitForSync(wctx) {
			return false, fmt.Errorf("the pod cache has not synced yet")
		}
	}
	obj, ok, err := inf.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return false, err
	}
	p, isInfo := obj.(*podInfo)
	if !isInfo {
		return false, fmt.Errorf("pod cache holds %T for %s/%s", obj, namespace, name)
	}
	p.podInto(dst)
	return true, nil
}

// podInfoTransform turns a Pod from the API server into a podInfo.
func podInfoTransform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return newPodInfo(o), nil
	default:
		// Tombstones (DeletedFinalStateUnknown) and podInfos already
		// transformed pass as they are.
		return obj, nil
	}
}

// internedPodMaps holds the label and annotation maps of rebuilt pods, one
// per value: building them for 4000 pods at every reconcile was 8000
// allocations and 1.3 MB (BenchmarkPodsFromCache4000).
var internedPodMaps interned[map[string]string]

func newPodInfo(pod *corev1.Pod) *podInfo {
	p := &podInfo{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, ResourceVersion: pod.ResourceVersion,
			CreationTimestamp: pod.CreationTimestamp},
		serviceAccount: pod.Spec.ServiceAccountName,
		node:           pod.Spec.NodeName,
	}
	if mode, ok := pod.Labels[desired.LabelDataplaneMode]; ok {
		p.labels = internedPodMaps.get("label="+mode, func() map[string]string {
			return map[string]string{desired.LabelDataplaneMode: mode}
		})
	}
	if desired.HasSidecar(pod) {
		p.annotations = internedPodMaps.get("sidecar", func() map[string]string {
			return map[string]string{desired.SidecarStatusAnnotation: ""}
		})
	}
	p.readyAt = podReadyAt(pod)
	for _, c := range pod.Spec.Containers {
		if c.Name == desired.SidecarContainer {
			continue
		}
		p.containers = append(p.containers, podContainer{name: c.Name, ports: c.Ports,
			limits: cpuOnly(c.Resources.Limits), requests: cpuOnly(c.Resources.Requests)})
	}
	return p
}

// pod rebuilds what the mirror reads of the pod. Its ports, resource
// lists, labels and annotations are shared with the cache: callers must
// not modify them.
func (p *podInfo) pod() *corev1.Pod {
	pod := &corev1.Pod{}
	p.podInto(pod)
	return pod
}

// podInto is pod writing into dst, whose every field it sets; the backing
// array of dst's containers is reused when it is large enough.
func (p *podInfo) podInto(dst *corev1.Pod) {
	containers := dst.Spec.Containers[:0]
	conditions := dst.Status.Conditions[:0]
	*dst = corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, ResourceVersion: p.ResourceVersion, CreationTimestamp: p.CreationTimestamp,
			Labels: p.labels, Annotations: p.annotations},
		Spec: corev1.PodSpec{ServiceAccountName: p.serviceAccount, NodeName: p.node},
	}
	if len(p.containers) > 0 {
		for _, c := range p.containers {
			containers = append(containers, corev1.Container{Name: c.name, Ports: c.ports,
				Resources: corev1.ResourceRequirements{Limits: c.limits, Requests: c.requests}})
		}
		dst.Spec.Containers = containers
	}
	if !p.readyAt.IsZero() {
		dst.Status.Conditions = append(conditions, corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: p.readyAt})
	}
}

// podReadyAt is when the pod last became Ready: its Ready condition's last
// transition while it is True; zero when it is not Ready or the time is
// unknown.
func podReadyAt(pod *corev1.Pod) metav1.Time {
	if pod == nil {
		return metav1.Time{}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			if c.Status == corev1.ConditionTrue {
				return c.LastTransitionTime
			}
			break
		}
	}
	return metav1.Time{}
}
