package scale

import (
	"testing"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
)

// BenchmarkReconcile4000 is one reconcile's own work (Compute and the
// up-to-date check) for a Service of 4000 pods.
func BenchmarkReconcile4000(b *testing.B) {
	in := serviceInput("team", "checkout", 4000)
	live := desired.Compute(in)
	b.ReportAllocs()
	for b.Loop() {
		r := desired.Compute(in)
		if !desired.UpToDate("istio-adaptive-optimizer", r.ServiceEntry, live.ServiceEntry, &r.ServiceEntry.Spec, &live.ServiceEntry.Spec) {
			b.Fatal("not up to date")
		}
	}
}
