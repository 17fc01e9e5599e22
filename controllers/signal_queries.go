package controllers

import (
	"context"
	"errors"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// PartsSource answers several queries evaluated at one instant, in as few
// requests as it can (promsource.Source.QueryParts combines them). A
// MetricsSource without it is asked one query at a time.
type PartsSource interface {
	QueryParts(ctx context.Context, parts []promsource.Part, now time.Time) []promsource.PartResult
}

// signalQuery is one signal's query of a cycle.
type signalQuery struct {
	signal string
	part   promsource.Part
}

// cycleQueries are the queries of one cycle for qt, CPU first: the
// optional signals that are on (a "-" template is off; a recent window of
// 0 is not run, see recentWindow), each under the name it has in
// optimizer_query_errors_total.
func cycleQueries(s Settings, qt promsource.Target) []signalQuery {
	qs := []signalQuery{{"cpu", promsource.Part{Template: s.CPUQuery, Target: qt}}}
	add := func(signal, tmpl string, window time.Duration) {
		if tmpl == "" || window <= 0 {
			return
		}
		t := qt
		t.Window = window
		qs = append(qs, signalQuery{signal, promsource.Part{Template: tmpl, Target: t}})
	}
	add("requests", s.RequestQuery, qt.Window)
	add("latency", s.LatencyQuery, qt.Window)
	add("node_cpu", s.NodeCPUQuery, qt.Window)
	// The CPU, latency and request queries again, over the last two
	// scrape intervals. From the recent latency the engine learns how it
	// usually differs from the window's, and from the recent requests how
	// a pod's served share usually differs from its weight's, which Alarm
	// needs between cycles.
	add("recent_cpu", s.CPUQuery, s.RecentCPUWindow)
	add("recent_latency", s.LatencyQuery, s.RecentLatencyWindow)
	add("recent_requests", s.RequestQuery, s.RecentRequestsWindow)
	return qs
}

// errNotRun: the query was not sent, because the first one (the CPU
// query, without which the cycle uses none of the others) failed.
var errNotRun = errors.New("not run: an earlier query failed")

// queryParts runs parts at now: in as few requests as the source can
// combine them into, or, from a source that answers one query at a time,
// one by one. firstDecides: a cycle's, whose first part (the CPU query)
// decides whether the others count; such a source then stops after it
// fails.
func (l *WeightLoop) queryParts(ctx context.Context, parts []promsource.Part, now time.Time, firstDecides bool) []promsource.PartResult {
	if ps, ok := l.Source.(PartsSource); ok {
		return ps.QueryParts(ctx, parts, now)
	}
	out := make([]promsource.PartResult, len(parts))
	for i, p := range parts {
		if firstDecides && i > 0 && out[0].Err != nil {
			var empty *promsource.EmptyResultError
			if !errors.As(out[0].Err, &empty) {
				out[i].Err = errNotRun
				continue
			}
		}
		if ctx.Err() != nil {
			out[i].Err = ctx.Err()
			continue
		}
		out[i].Result, out[i].Err = l.Source.Query(ctx, p.Template, p.Target, now)
	}
	return out
}

// set records the answer of a cycle's optional signal.
func (a *answers) set(signal string, r promsource.Result) {
	switch signal {
	case "requests":
		a.requests = r
	case "latency":
		a.latency = r
	case "node_cpu":
		a.nodeCPU = r
	case "recent_cpu":
		a.recentCPU = r
	case "recent_latency":
		a.recentLatency = r
	case "recent_requests":
		a.recentRequests = r
	}
}
