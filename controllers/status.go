package controllers

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
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

	weightsEnabled bool
	outcome        *Outcome
	endpointsByPod map[string]desired.Endpoint
	note           string // what the weight engine is doing, for Ready's message
	// quiet: the weight cycle brought nothing worth a status write (see
	// statusRefreshInterval), so the messages that quote it stay as they are.
	quiet        bool
	refreshPhase time.Duration // this optimizer's statusRefreshPhase
	loadBalancer string        // the DestinationRule's policy
	balancerNote string        // why it is not the one asked for
	// balancerWhy is the policy's reason for loadBalancer ("" without the
	// engine); balancerWhyKnown is false while the policy is not seeded,
	// when the reason recorded last stays.
	balancerWhy      policy.Reason
	balancerWhyKnown bool
}

type reasonMessage struct{ reason, message string }

func newStatus(opt *optv1.IstioAdaptiveRequestOptimizer) *status {
	return &status{generation: opt.Generation, endpoints: opt.Status.Endpoints, refreshPhase: statusRefreshPhase(opt.Namespace, opt.Name)}
}

func (s *status) stalled(reason, msg string) { s.stall = &reasonMessage{reason, msg} }
func (s *status) failed(reason, msg string)  { s.fail = &reasonMessage{reason, msg} }
func (s *status) degraded(reason, msg string) {
	s.degrade = append(s.degrade, reasonMessage{reason, msg})
}

// apply writes the conditions and fields into opt.Status.
func (s *status) apply(opt *optv1.IstioAdaptiveRequestOptimizer, now time.Time) {
	st := &opt.Status
	prevReady := meta.FindStatusCondition(st.Conditions, optv1.ConditionReady)
	prevDegraded := meta.FindStatusCondition(st.Conditions, optv1.ConditionDegraded)
	var prevReadyMsg, prevDegradedMsg string
	if prevReady != nil {
		prevReadyMsg = prevReady.Message
	}
	if prevDegraded != nil {
		prevDegradedMsg = prevDegraded.Message
	}
	prevShape := [5]any{st.Host, st.Endpoints, st.OwnedObjects, st.LoadBalancer, st.LoadBalancerReason}
	s.applyOptimization(opt)
	st.ObservedGeneration = s.generation
	if s.host != "" {
		st.Host = s.host
	}
	if s.owned != (optv1.OwnedObjects{}) {
		st.OwnedObjects = s.owned
	}
	if s.loadBalancer != "" {
		st.LoadBalancer = s.loadBalancer
		if s.balancerWhyKnown {
			st.LoadBalancerReason = string(s.balancerWhy)
		}
	}
	st.Endpoints = s.endpoints
	// The shape is what Ready's message says besides the cycle's figures:
	// the objects, the endpoints and the load balancer with the policy's
	// reason for it, which the note on a balancer other than the one asked
	// for follows (the policy switches it in cycles that move no weight).
	unchangedShape := prevShape == [5]any{st.Host, st.Endpoints, st.OwnedObjects, st.LoadBalancer, st.LoadBalancerReason}
	set := func(t string, status metav1.ConditionStatus, reason, msg string) {
		if s.quiet {
			// Keep a message that differs only in this cycle's figures.
			if c := meta.FindStatusCondition(st.Conditions, t); c != nil && c.Status == status && c.Reason == reason {
				switch {
				case t == optv1.ConditionReady && unchangedShape:
					msg = prevReadyMsg
				case t == optv1.ConditionDegraded && len(s.degrade) == 1 && weightReason(reason):
					msg = prevDegradedMsg
				}
			}
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{
			Type: t, Status: status, Reason: reason, Message: msg,
			ObservedGeneration: s.generation, LastTransitionTime: *statusTime(now),
		})
	}
	switch {
	case s.stall != nil:
		set(optv1.ConditionReady, metav1.ConditionFalse, s.stall.reason, s.stall.message)
		set(optv1.ConditionStalled, metav1.ConditionTrue, s.stall.reason, s.stall.message)
		set(optv1.ConditionReconciling, metav1.ConditionFalse, s.stall.reason, "Waiting for the problem Stalled names to be fixed")
	case s.fail != nil:
		// A transient error: retried with backoff, so still reconciling.
		set(optv1.ConditionReady, metav1.ConditionFalse, s.fail.reason, s.fail.message)
		set(optv1.ConditionReconciling, metav1.ConditionTrue, s.fail.reason, "Retrying: "+s.fail.message)
		set(optv1.ConditionStalled, metav1.ConditionFalse, "Retrying", "The last error is being retried")
	default:
		msg := fmt.Sprintf("%d ready endpoints mirrored into ServiceEntry %s/%s on host %s; %s", s.endpoints, s.owned.Namespace, s.owned.ServiceEntry, s.host, s.note)
		if s.balancerNote != "" {
			msg += "; " + s.balancerNote
		}
		set(optv1.ConditionReady, metav1.ConditionTrue, "Reconciled", msg)
		set(optv1.ConditionReconciling, metav1.ConditionFalse, "Reconciled", "Up to date")
		set(optv1.ConditionStalled, metav1.ConditionFalse, "Reconciled", "No problem found")
	}
	degrade := s.degrade
	if s.stall != nil {
		// Nothing is optimized as asked while stalled: Degraded says so
		// too, first, so no condition claims everything is routed.
		degrade = append([]reasonMessage{*s.stall}, degrade...)
	}
	if len(degrade) > 0 {
		reasons := make([]string, 0, len(degrade))
		msgs := make([]string, 0, len(degrade))
		for _, d := range degrade {
			reasons = append(reasons, d.reason)
			msgs = append(msgs, d.message)
		}
		set(optv1.ConditionDegraded, metav1.ConditionTrue, reasons[0], strings.Join(msgs, "; "))
	} else if s.fail == nil {
		set(optv1.ConditionDegraded, metav1.ConditionFalse, "AsExpected", "All requested ports and endpoints are routed")
	}
}

// statusTime is t as the API server stores it in a status: to the second
// (RFC 3339). A time kept to the nanosecond differs from its own stored
// copy, so every later reconcile would find the status changed and write
// it again (at 200 optimizers, one write in two reconciles).
func statusTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

// equalStatus ignores condition transition times that SetStatusCondition
// keeps stable anyway.
func equalStatus(a, b *optv1.IstioAdaptiveRequestOptimizerStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}

// optimization folds the last weight cycle into the status.
func (s *status) optimization(out *Outcome, enabled bool) {
	s.weightsEnabled = enabled
	s.outcome = out
}

// applyOptimization writes the weight engine's part of the status.
func (s *status) applyOptimization(opt *optv1.IstioAdaptiveRequestOptimizer) {
	st := &opt.Status
	if !s.weightsEnabled {
		s.note = "weights are not optimized: the manager has no --prometheus-url"
		st.WeightsMode, st.WeightsDryRun = "", false
		return
	}
	out := s.outcome
	if out == nil {
		s.note = "waiting for the first optimization cycle"
		return
	}
	s.note = fmt.Sprintf("weights %s: %s", strings.ToLower(string(out.Result.Mode)), out.Result.Message)
	if out.DryRun {
		s.note = "dry run, weights computed but not applied: " + s.note
	}
	s.quiet = quietCycle(st, out, s.refreshPhase)
	if !s.quiet {
		st.LastOptimizationTime = statusTime(out.Time)
		st.WeightsMode, st.WeightsDryRun = string(out.Result.Mode), out.DryRun
		st.WeightSpread = strconv.FormatFloat(spread(out.Result.Weights), 'f', 2, 64)
		st.Weights, st.WeightsTotal = statusWeights(out, s.endpointsByPod)
	}
	switch out.Result.Mode {
	case weights.ModeHolding:
		s.degraded("MetricsUnavailable", "The metrics backend failed; the last good weights are held until they expire: "+out.Result.Message)
	case weights.ModeFallback:
		s.degraded("WeightsFallback", "The metrics backend failed for longer than the weight expiry; weights fell back to equal: "+out.Result.Message)
	case weights.ModeNoData:
		s.degraded("MetricsMissing", "The metrics backend has no data for the pods; check the queries and the scrape configuration: "+out.Result.Message)
	}
	if msg := cpuOnlyReason(out.Signals); msg != "" {
		s.degraded("CPUOnly", msg)
	}
	if msg := coresUnknownReason(out.Signals, out.Result.Unlearned); msg != "" {
		s.degraded("CoresUnknown", msg)
	}
	if r, ok := weights.Has(out.Result.Reasons, weights.ReasonFloorOverload); ok {
		s.degraded("WeightFloorOverload", r.String()+" (spec.optimization.max_weight_ratio, at most 100; Envoy sidecars do not clip weights)")
	}
}

// statusRefreshInterval is how long a weight cycle that changed nothing
// may leave lastOptimizationTime, weightSpread, the weights list and the
// engine's note in Ready's message as they are. The loop runs every cycle
// (30s by default); writing the status each time would cost one API write
// per optimizer per cycle and wake every watcher of the object for nothing.
// These fields are refreshed at once when the weights change, the engine's
// mode or dry run changes, and otherwise at most this often.
const statusRefreshInterval = 5 * time.Minute

// statusRefreshPhase places one optimizer's quiet refreshes: at the
// instants phase + k * statusRefreshInterval since the Unix epoch, the phase
// drawn from its namespace and name. Optimizers that learned in the same
// minute (a Helm release, a manager restart) would otherwise refresh in the
// same cycle every five minutes, a burst of status writes that each wait for
// the API server; on phases of their own they spread evenly over the
// interval and stay so (periods of their own would fall back into step:
// cycles round every period to a whole number of cycles).
func statusRefreshPhase(namespace, name string) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(namespace + "/" + name))
	return time.Duration(h.Sum64() % uint64(statusRefreshInterval))
}

// refreshDue reports whether a quiet cycle at now refreshes a status last
// written at prev: one of the optimizer's refresh instants (see
// statusRefreshPhase) lies in (prev, now]. They come every
// statusRefreshInterval, so no status goes longer without one.
func refreshDue(prev, now time.Time, phase time.Duration) bool {
	slot := func(t time.Time) int64 { return (t.UnixNano() - int64(phase)) / int64(statusRefreshInterval) }
	return slot(now) > slot(prev)
}

// quietCycle says whether the last weight cycle is not worth a status
// write: nothing changed that the status quotes and no refresh is due.
func quietCycle(st *optv1.IstioAdaptiveRequestOptimizerStatus, out *Outcome, phase time.Duration) bool {
	prev := st.LastOptimizationTime
	if prev == nil || out.Result.Changed || out.Time.Before(prev.Time) || refreshDue(prev.Time, out.Time, phase) {
		return false
	}
	if meta.FindStatusCondition(st.Conditions, optv1.ConditionReady) == nil {
		return false
	}
	// The mode and dry run are the words of the note Ready's message
	// carries, recorded beside it.
	return st.WeightsMode == string(out.Result.Mode) && st.WeightsDryRun == out.DryRun
}

// weightReasons are the Degraded reasons of the weight engine, whose
// messages quote each cycle's figures.
func weightReason(reason string) bool {
	switch reason {
	case "MetricsUnavailable", "WeightsFallback", "MetricsMissing":
		return true
	}
	return false
}

// maxStatusWeights bounds the weights listed in status (dry run included),
// so the object stays small for large Services; weightsTotal has the count
// and the endpoint_weight metric every weight.
const maxStatusWeights = 100

// statusWeights lists the first maxStatusWeights weights by pod name, and
// how many there are.
func statusWeights(out *Outcome, eps map[string]desired.Endpoint) ([]optv1.EndpointWeight, int32) {
	names := make([]string, 0, len(out.Result.Weights))
	for n := range out.Result.Weights {
		names = append(names, n)
	}
	sort.Strings(names)
	total := int32(len(names))
	if len(names) > maxStatusWeights {
		names = names[:maxStatusWeights]
	}
	ws := make([]optv1.EndpointWeight, 0, len(names))
	for _, n := range names {
		ep := eps[n]
		ws = append(ws, optv1.EndpointWeight{Pod: n, Address: ep.Address, Locality: ep.Locality, Weight: out.Result.Weights[n]})
	}
	return ws, total
}
