package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/textutil"
)

// Signals says which signals one weight cycle had data for. Request rates
// are what lets the engine learn capacity within a few cycles and see a
// backlog; without them it runs on CPU alone, which the optimizer must say
// (Degraded/CPUOnly and optimizer_signal_available) rather than hide.
type Signals struct {
	CPU, Requests, Latency bool
	// NodeCPU: the CPU in use on the pods' nodes, which bounds what a pod
	// without a CPU limit can use (its own CPU plus its node's idle CPU).
	NodeCPU bool
	// RecentCPU: the pods' CPU over the last two scrape intervals (the CPU
	// query over that window), which shows a pod that has just reached its
	// CPU limit a cycle sooner.
	RecentCPU bool
	// RecentLatency: the pods' latency over the last two scrape intervals,
	// from which the engine learns what Alarm compares with between cycles.
	RecentLatency bool
	// RecentRequests: the pods' request rates over the same window, which
	// show whether a pod whose recent latency rings the alarm serves less
	// than it is sent.
	RecentRequests bool
	// RequestsDisabled, LatencyDisabled and NodeCPUDisabled: the query is "-".
	RequestsDisabled, LatencyDisabled, NodeCPUDisabled bool
	// NoLimitPods counts the pods of the cycle without a CPU limit, whose
	// cores only the node CPU or, with request rates, the sidecars'
	// latency can show.
	NoLimitPods int
}

func signalsOf(s Settings, cpu bool, a answers) Signals {
	return Signals{
		CPU:              cpu,
		Requests:         len(a.requests.Values) > 0,
		Latency:          len(a.latency.Values) > 0,
		NodeCPU:          len(a.nodeCPU.Values) > 0,
		RecentCPU:        len(a.recentCPU.Values) > 0,
		RecentLatency:    len(a.recentLatency.Values) > 0,
		RecentRequests:   len(a.recentRequests.Values) > 0,
		RequestsDisabled: s.RequestQuery == "",
		LatencyDisabled:  s.LatencyQuery == "",
		NodeCPUDisabled:  s.NodeCPUQuery == "",
	}
}

// recentSignal runs a query over window (Settings.RecentCPUWindow or
// RecentLatencyWindow) instead of qt's, as optionalSignal does; an empty
// Result when window is 0 (not run, see recentWindow). The cycle and the
// looks between cycles run the recent latency through it alike.
func (l *WeightLoop) recentSignal(ctx context.Context, logger logr.Logger, tgt target, signal, tmpl string, qt promsource.Target, window time.Duration, now time.Time) promsource.Result {
	if window <= 0 {
		return promsource.Result{}
	}
	qt.Window = window
	return l.optionalSignal(ctx, logger, tgt, signal, tmpl, qt, now)
}

// optionalSignal runs the query of a signal the engine can do without. A
// failed or empty answer leaves every pod without that signal this cycle
// (an empty Result); it is counted and logged, and the cycle goes on. An
// empty template means the signal is disabled.
func (l *WeightLoop) optionalSignal(ctx context.Context, logger logr.Logger, tgt target, signal, tmpl string, qt promsource.Target, now time.Time) promsource.Result {
	if tmpl == "" {
		return promsource.Result{}
	}
	res, err := l.Source.Query(ctx, tmpl, qt, now)
	return l.optionalAnswer(ctx, logger, tgt, signal, res, err)
}

// optionalAnswer is what an optional signal's answer (res, err) leaves the
// cycle, as optionalSignal documents it.
func (l *WeightLoop) optionalAnswer(ctx context.Context, logger logr.Logger, tgt target, signal string, res promsource.Result, err error) promsource.Result {
	if err == nil || ctx.Err() != nil {
		// Stopped mid-query: the cycle ends without counting (see cycle).
		return res
	}
	var empty *promsource.EmptyResultError
	if errors.As(err, &empty) {
		// The backend answered with nothing for these pods: status and
		// optimizer_signal_available say so; no error to count.
		return promsource.Result{Query: res.Query}
	}
	l.Metrics.QueryErrors.WithLabelValues(tgt.namespace, tgt.service, signal, queryErrorReason(err)).Inc()
	logger.Info("Query of an optional signal failed; the cycle goes on without it", "signal", signal, "error", textutil.Printable(err.Error(), textutil.LogLimit))
	return promsource.Result{Query: res.Query}
}

// noteSignals records which signals the last cycle had, and returns them.
func (b *WeightBook) noteSignals(key types.NamespacedName, s Signals) Signals {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil && e.outcome != nil {
		e.outcome.Signals = s
	}
	return s
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// coresUnknownReason explains, for Degraded, that some pods have no CPU
// limit and no signal of the last cycle showed their cores, or returns "".
// Their cores are then a guess between their CPU request and their node's
// allocatable CPU, which can send them more than they can serve; unlearned
// is how many of them the engine weights by that guess alone and keeps
// LEAST_REQUEST for (weights.Result.Unlearned).
func coresUnknownReason(s Signals, unlearned int) string {
	const (
		format = "%d pod(s) have no CPU limit and %s: their cores are guessed between their CPU request and their node's allocatable CPU, %s. " +
			"Enable node_cpu_query (cAdvisor's root cgroup with a node label), or the sidecars' request rates and latency together (istio_requests_total and istio_request_duration_milliseconds), or set CPU limits"
		overload = "which can send them more than they serve"
	)
	if unlearned > 0 {
		// See weights.markBlind: with CPU alone their overload would not
		// show. Said whatever the other pods' node CPU: a node pool
		// without the series is enough.
		return fmt.Sprintf(format, unlearned, "no node CPU data",
			"and, with CPU alone, nothing shows when they get more than they serve: they are weighted by that guess, not learned from, and LEAST_REQUEST is kept instead of ROUND_ROBIN")
	}
	if s.NoLimitPods == 0 || !s.CPU || s.NodeCPU || (s.Requests && s.Latency) {
		return ""
	}
	missing := "the node CPU query has no data for them"
	if s.NodeCPUDisabled {
		missing = "node_cpu_query is \"-\""
	}
	if s.Requests {
		missing += ", nor the sidecars' latency"
	} else {
		missing += ", nor the sidecars' request rates"
	}
	return fmt.Sprintf(format, s.NoLimitPods, missing, overload)
}

// cpuOnlyReason explains, for Degraded, why the last cycle's weights rest on CPU
// alone, or returns "" when request rates were there (or CPU was not either,
// which other reasons report).
func cpuOnlyReason(s Signals) string {
	switch {
	case !s.CPU || s.Requests:
		return ""
	case s.RequestsDisabled:
		return "request_query is \"-\": weights rest on CPU alone, which takes more cycles to learn capacity and cannot see a pod's backlog"
	}
	return "The request-rate query returned no data for the pods: weights rest on CPU alone, which takes more cycles to learn capacity and cannot see a pod's backlog. " +
		"Check request_query and that Prometheus scrapes the sidecars' istio_requests_total with a pod label"
}
