package controllers

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// status collects what one reconcile found; apply turns it into conditions
// that kstatus-aware tools (kubectl wait, Flux, Argo CD) understand:
// Ready=True only when everything was applied; Stalled=True when the user
// must act; Degraded=True when it works with a caveat.
type status struct {
	generation int64
	host       string
	endpoints  int32
	owned      optv1.OwnedObjects
	stall      *reasonMessage
	fail       *reasonMessage
	degrade    []reasonMessage
	done       bool
}

type reasonMessage struct{ reason, message string }

func newStatus(opt *optv1.IstioAdaptiveRequestOptimizer) *status {
	return &status{generation: opt.Generation, endpoints: opt.Status.Endpoints}
}

func (s *status) stalled(reason, msg string) { s.stall = &reasonMessage{reason, msg} }
func (s *status) failed(reason, msg string)  { s.fail = &reasonMessage{reason, msg} }
func (s *status) degraded(reason, msg string) {
	s.degrade = append(s.degrade, reasonMessage{reason, msg})
}

// apply writes the conditions and fields into opt.Status.
func (s *status) apply(opt *optv1.IstioAdaptiveRequestOptimizer, now time.Time) {
	st := &opt.Status
	st.ObservedGeneration = s.generation
	if s.host != "" {
		st.Host = s.host
	}
	if s.owned != (optv1.OwnedObjects{}) {
		st.OwnedObjects = s.owned
	}
	st.Endpoints = s.endpoints
	set := func(t string, status metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: s.generation, LastTransitionTime: metav1.NewTime(now),
		})
	}
	switch {
	case s.stall != nil:
		set(optv1.ConditionReady, metav1.ConditionFalse, s.stall.reason, s.stall.message)
		set(optv1.ConditionStalled, metav1.ConditionTrue, s.stall.reason, s.stall.message)
		set(optv1.ConditionReconciling, metav1.ConditionFalse, s.stall.reason, "Waiting for the problem to be fixed; live routing objects are left as they are")
	case s.fail != nil:
		// A transient error: retried with backoff, so still reconciling.
		set(optv1.ConditionReady, metav1.ConditionFalse, s.fail.reason, s.fail.message)
		set(optv1.ConditionReconciling, metav1.ConditionTrue, s.fail.reason, "Retrying: "+s.fail.message)
		set(optv1.ConditionStalled, metav1.ConditionFalse, "Retrying", "The last error is being retried")
	default:
		msg := fmt.Sprintf("%d ready endpoints mirrored into ServiceEntry %s/%s on host %s", s.endpoints, s.owned.Namespace, s.owned.ServiceEntry, s.host)
		set(optv1.ConditionReady, metav1.ConditionTrue, "Reconciled", msg)
		set(optv1.ConditionReconciling, metav1.ConditionFalse, "Reconciled", "Up to date")
		set(optv1.ConditionStalled, metav1.ConditionFalse, "Reconciled", "No problem found")
	}
	if len(s.degrade) > 0 {
		reasons := make([]string, 0, len(s.degrade))
		msgs := make([]string, 0, len(s.degrade))
		for _, d := range s.degrade {
			reasons = append(reasons, d.reason)
			msgs = append(msgs, d.message)
		}
		set(optv1.ConditionDegraded, metav1.ConditionTrue, reasons[0], strings.Join(msgs, "; "))
	} else if s.stall == nil && s.fail == nil {
		set(optv1.ConditionDegraded, metav1.ConditionFalse, "AsExpected", "All requested ports and endpoints are routed")
	}
}

// equalStatus ignores condition transition times that SetStatusCondition
// keeps stable anyway.
func equalStatus(a, b *optv1.IstioAdaptiveRequestOptimizerStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}
