package controllers

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
)

// podSlabs hands each reconcile the Pods it reads from the pod cache, and
// takes them back when it ends, so the next reconcile rebuilds its Pods in
// the same memory. A Pod is 1.2 KiB however little of it is set: at 4000
// pods the rebuilt Pods were 7 MB a reconcile, nearly half of what it
// allocated and so of the garbage collector's work, whose assists and
// background marking slowed the reconciles themselves (docs/scale.md).
//
// Safe because nothing keeps a read Pod past its reconcile: desired.Compute
// copies what it keeps (strings, numbers), and the Pods are reached only
// through desired.Input.Pods. A slab is used by one reconcile at a time.
type podSlabs struct{ pool sync.Pool }

// podSlab is one reconcile's Pods, by name.
type podSlab struct {
	pods   []corev1.Pod
	used   int
	byName map[string]*corev1.Pod
}

// get returns a slab with an empty map.
func (s *podSlabs) get() *podSlab {
	slab, _ := s.pool.Get().(*podSlab)
	if slab == nil {
		slab = &podSlab{byName: map[string]*corev1.Pod{}}
	}
	return slab
}

// reserve makes room for n pods (before any is taken).
func (slab *podSlab) reserve(n int) {
	if len(slab.pods) < n {
		slab.pods = make([]corev1.Pod, n)
	}
}

// put takes a slab back once its reconcile no longer reads its Pods.
func (s *podSlabs) put(slab *podSlab) {
	if slab == nil {
		return
	}
	clear(slab.byName)
	slab.used = 0
	s.pool.Put(slab)
}

// unused gives back the Pod next returned last, when no pod was read into
// it.
func (slab *podSlab) unused(pod *corev1.Pod) {
	if slab.used > 0 && pod == &slab.pods[slab.used-1] {
		slab.used--
	}
}

// next is the slab's next free Pod (a new one when the slab is full).
func (slab *podSlab) next() *corev1.Pod {
	if slab.used == len(slab.pods) {
		return &corev1.Pod{}
	}
	slab.used++
	return &slab.pods[slab.used-1]
}
