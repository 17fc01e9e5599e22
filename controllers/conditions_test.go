package controllers

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// stalledReasons are every reason the mirror stalls with: its own steps
// and the Fatal problems of desired.Compute and desired.CheckHost.
var stalledReasons = []string{
	ReasonInvalidSpec, "CrossNamespaceDenied", "ObjectConflict",
	desired.ReasonInvalidHost, desired.ReasonHostNotAllowed, desired.ReasonHostTaken,
	desired.ReasonTooManyEndpoints, "ServiceNotFound", "UnsupportedService", "NoPorts",
	"ServiceNotExported", "AmbientNotSupported", "UserDestinationRuleNotCarried",
}

// TestConditionsAgreeInEveryStalledState walks each Stalled reason, from
// each state an optimizer can be in before it (new, Ready, Ready with a
// caveat, retrying, stalled for another reason), with and without a
// caveat of its own and a weight engine outcome, and checks the four
// conditions tell one story: Stalled=True, Ready=False and Degraded=True
// with the stall's reason, Reconciling=False, and no message claiming
// everything is routed.
func TestConditionsAgreeInEveryStalledState(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	before := map[string]func(*optv1.IstioAdaptiveRequestOptimizer){
		"new": func(*optv1.IstioAdaptiveRequestOptimizer) {},
		"ready": func(o *optv1.IstioAdaptiveRequestOptimizer) {
			readyStatus(nil).apply(o, t0)
		},
		"ready with a caveat": func(o *optv1.IstioAdaptiveRequestOptimizer) {
			s := readyStatus(nil)
			s.degraded("CPUOnly", "no request rates")
			s.apply(o, t0)
		},
		"retrying": func(o *optv1.IstioAdaptiveRequestOptimizer) {
			readyStatus(nil).apply(o, t0)
			s := newStatus(o)
			s.failed("ApplyFailed", "connection refused")
			s.apply(o, t0)
		},
		"stalled for another reason": func(o *optv1.IstioAdaptiveRequestOptimizer) {
			s := newStatus(o)
			s.stalled("NoPorts", "no port")
			s.apply(o, t0)
		},
	}
	outcome := &Outcome{Time: t0, Result: weights.Result{Mode: weights.ModeHolding, Changed: true, Weights: map[string]uint32{"a": 1}, Message: "backend down"}}
	for _, reason := range stalledReasons {
		for prev, setup := range before {
			for _, caveat := range []bool{false, true} {
				for _, out := range []*Outcome{nil, outcome} {
					opt := &optv1.IstioAdaptiveRequestOptimizer{}
					opt.Generation = 2
					setup(opt)
					s := newStatus(opt)
					if caveat {
						s.degraded(ReasonUnknownFields, "spec.colour is ignored")
					}
					s.optimization(out, out != nil)
					s.stalled(reason, "the "+reason+" message")
					s.apply(opt, t0.Add(time.Minute))

					name := reason + " after " + prev
					conds := map[string]*metav1.Condition{}
					for _, typ := range []string{optv1.ConditionReady, optv1.ConditionStalled, optv1.ConditionReconciling, optv1.ConditionDegraded} {
						c := meta.FindStatusCondition(opt.Status.Conditions, typ)
						if c == nil {
							t.Fatalf("%s: no %s condition", name, typ)
						}
						if c.ObservedGeneration != 2 {
							t.Errorf("%s: %s observedGeneration %d, want 2", name, typ, c.ObservedGeneration)
						}
						if strings.Contains(c.Message, "All requested ports and endpoints are routed") || strings.Contains(c.Message, "mirrored into ServiceEntry") {
							t.Errorf("%s: %s says it works: %q", name, typ, c.Message)
						}
						conds[typ] = c
					}
					want := map[string]metav1.ConditionStatus{
						optv1.ConditionStalled: metav1.ConditionTrue, optv1.ConditionReady: metav1.ConditionFalse,
						optv1.ConditionReconciling: metav1.ConditionFalse, optv1.ConditionDegraded: metav1.ConditionTrue,
					}
					for typ, st := range want {
						if conds[typ].Status != st || conds[typ].Reason != reason {
							t.Errorf("%s: %s = %s/%s, want %s/%s", name, typ, conds[typ].Status, conds[typ].Reason, st, reason)
						}
					}
					if !strings.Contains(conds[optv1.ConditionDegraded].Message, "the "+reason+" message") {
						t.Errorf("%s: Degraded message %q lacks the stall's", name, conds[optv1.ConditionDegraded].Message)
					}
					if caveat && !strings.Contains(conds[optv1.ConditionDegraded].Message, "spec.colour is ignored") {
						t.Errorf("%s: Degraded message %q lacks the caveat", name, conds[optv1.ConditionDegraded].Message)
					}
				}
			}
		}
	}
}

// TestConditionsAgreeWhenReadyOrRetrying: the states beside Stalled.
func TestConditionsAgreeWhenReadyOrRetrying(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	get := func(o *optv1.IstioAdaptiveRequestOptimizer, typ string) string {
		c := meta.FindStatusCondition(o.Status.Conditions, typ)
		if c == nil {
			return "absent"
		}
		return string(c.Status) + "/" + c.Reason
	}
	// Stalled, then fixed: Ready, nothing stalled or degraded.
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	s := newStatus(opt)
	s.stalled(desired.ReasonTooManyEndpoints, "too many")
	s.apply(opt, t0)
	readyStatus(nil).apply(opt, t0)
	for typ, want := range map[string]string{
		optv1.ConditionReady: "True/Reconciled", optv1.ConditionStalled: "False/Reconciled",
		optv1.ConditionReconciling: "False/Reconciled", optv1.ConditionDegraded: "False/AsExpected",
	} {
		if got := get(opt, typ); got != want {
			t.Errorf("fixed: %s = %s, want %s", typ, got, want)
		}
	}
	// Retrying: not Ready, Reconciling, not Stalled.
	s = newStatus(opt)
	s.failed("ReadFailed", "timeout")
	s.apply(opt, t0)
	for typ, want := range map[string]string{
		optv1.ConditionReady: "False/ReadFailed", optv1.ConditionStalled: "False/Retrying", optv1.ConditionReconciling: "True/ReadFailed",
	} {
		if got := get(opt, typ); got != want {
			t.Errorf("retrying: %s = %s, want %s", typ, got, want)
		}
	}
}

func readyStatus(out *Outcome) *status {
	s := &status{host: "web.shop.adaptive", endpoints: 2, generation: 1,
		owned: optv1.OwnedObjects{Namespace: "shop", ServiceEntry: "web-adaptive", DestinationRule: "web-adaptive"}}
	s.optimization(out, out != nil)
	return s
}
