package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// A spec field another field manager (a mutating webhook, another
// controller) adds to the operator's ServiceEntry is not the operator's: it
// causes no apply and no write count, and survives the operator's next real
// write. (The Applied event is emitted on the same branch as the write
// count.) The field is subjectAltNames, one the operator never sets.
func TestFieldOfAnotherManagerCausesNoWrite(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(48, 1), "node-a-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	mustEventuallySE(t, ns, wantAddrs(IP(48, 1)))
	waitCondition(t, ns, "web", "Ready", "True/Reconciled")

	se, err := getSE(ns, "web-adaptive")
	if err != nil {
		t.Fatal(err)
	}
	patch := client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"subjectAltNames":["spiffe://cluster.local/ns/`+ns+`/sa/web-sa"]}}`))
	if err := k8s.Patch(context.Background(), se, patch, client.FieldOwner("mesh-webhook")); err != nil {
		t.Fatalf("patch as another field manager: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // the patch's own reconcile
	writesBefore := writes(t, ns)
	se, _ = getSE(ns, "web-adaptive")
	rv := se.ResourceVersion

	for i := range 3 {
		n := reconciles(t)
		updateSlice(t, ns, "web-1", func(s *sliceT) { s.Labels["touched"] = fmt.Sprint(i) })
		eventually(t, waitFor, "a reconcile after touching the EndpointSlice", func() error {
			if got := reconciles(t); got <= n {
				return fmt.Errorf("%v reconciles, was %v", got, n)
			}
			return nil
		})
	}
	time.Sleep(300 * time.Millisecond)
	if got := writes(t, ns); got != writesBefore {
		t.Errorf("%v applies because another manager added a field", got-writesBefore)
	}
	if now, _ := getSE(ns, "web-adaptive"); now.ResourceVersion != rv {
		t.Errorf("ServiceEntry rewritten: resourceVersion %s, was %s", now.ResourceVersion, rv)
	}

	// A real change of ours is still applied, and the other field stays.
	mustCreate(t, Pod(ns, "web-1", "web", "node-b-"+ns, WithSidecar(), WithServiceAccount("web-sa")))
	updateSlice(t, ns, "web-1", func(s *sliceT) {
		s.Endpoints = append(s.Endpoints, EndpointSlice(ns, "x", "web", nil, Ready("web-1", IP(48, 2), "node-b-"+ns)).Endpoints...)
	})
	se = mustEventuallySE(t, ns, wantAddrs(IP(48, 1), IP(48, 2)))
	if got := strings.Join(se.Spec.SubjectAltNames, ","); !strings.Contains(got, "/sa/web-sa") {
		t.Errorf("the other manager's subjectAltNames are gone after our apply: %q", got)
	}
	if got := writes(t, ns); got <= writesBefore {
		t.Errorf("the new endpoint was applied without a counted write")
	}
}
