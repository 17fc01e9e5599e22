package controllers

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// AnnotationLearnedState holds, on the optimizer, what its weight engine
// learned that the live weights do not show (weights.Snapshot, as JSON: a
// few numbers whatever the pod count). A restarted or newly elected manager
// seeds its engine from it and from the live weights, so it makes no move
// the manager before it would not have made.
const AnnotationLearnedState = "optimization.liorfranko.github.io/learned-state"

// learnedSnapshot reads the annotation; anything unreadable counts as none
// (the engine then starts as on first sight).
func learnedSnapshot(opt *optv1.IstioAdaptiveRequestOptimizer) weights.Snapshot {
	raw, ok := opt.Annotations[AnnotationLearnedState]
	if !ok || len(raw) > 1024 {
		return weights.Snapshot{}
	}
	var s weights.Snapshot
	if json.Unmarshal([]byte(raw), &s) != nil || !s.Valid() {
		return weights.Snapshot{}
	}
	return s
}

// persistLearned writes the engine's snapshot to the optimizer when it
// moved enough since the last write (rarely: the noise settles within a
// few cycles). A merge patch of one annotation: it does not touch the spec
// and needs no lock, as only the leader writes it.
func (r *MirrorReconciler) persistLearned(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer) error {
	key := types.NamespacedName{Namespace: opt.Namespace, Name: opt.Name}
	s, ok := r.Weights.SnapshotToPersist(key)
	if !ok {
		return nil
	}
	if err := r.writeLearned(ctx, opt, s); err != nil {
		return err
	}
	r.Weights.Persisted(key, s)
	return nil
}

// writeLearned patches s into the optimizer's annotation. The patch answers
// with the stored object, whose status is the one before this reconcile:
// what the reconcile has put in opt.Status so far (coverage, gateway and
// mesh routes) is kept for its status write.
func (r *MirrorReconciler) writeLearned(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, s weights.Snapshot) error {
	raw, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode learned state: %w", err)
	}
	patch := client.MergeFrom(opt.DeepCopy())
	if opt.Annotations == nil {
		opt.Annotations = map[string]string{}
	}
	opt.Annotations[AnnotationLearnedState] = string(raw)
	status := opt.Status.DeepCopy()
	if err := r.Client.Patch(ctx, opt, patch); err != nil {
		return fmt.Errorf("persist learned state: %w", err)
	}
	opt.Status = *status
	return nil
}
