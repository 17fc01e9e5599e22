package controllers

import "k8s.io/apimachinery/pkg/types"

// Park stops the optimizer's cycles and looks until the mirror applies
// endpoints again (Applied): the weight loop parks an optimizer it stops,
// so that a worker ensured again while the optimizer is Stalled (which
// the mirror reconciles at every change of its Service) finds nothing due
// and sends no query. What the policy learned is kept for when it resumes.
func (b *WeightBook) Park(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		e.parked = true
	}
}
