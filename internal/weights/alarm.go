package weights

import (
	"fmt"
	"math"
	"time"
)

// Under weighted ROUND_ROBIN a pod that slows down just after a cycle is
// sent its old share until the next. Between cycles the operator looks at
// the pods' sidecar latency over the last two scrape intervals
// (Signal.RecentLatency), and Alarm says whether it shows a pod falling
// behind that the last cycle did not know of; the operator then runs a
// cycle at once, which reads the same latency as a backlog (Little's law:
// requests times the extra wait, see readBacklogs) and sends the pod less
// until it clears.

// alarmLatency: a recent latency at this multiple of the last cycle's
// rings the alarm (and is read as a backlog) when it also stands zSigmas
// out of the pod's usual recent-to-window ratio. A pod that cannot keep up
// adds to its queue with every request, so its latency grows without bound
// within seconds: a pod slowed to a third at 80% load showed 6.6x to 380x
// at the first look or cycle whose scrapes covered it (16 runs). A busy
// pod's chance queues do not, below 90% load: the largest ratio of a run
// (looks and cycles, 15-20 simulated minutes, exponential request times)
// stayed under 2.2 over 128 runs at up to 80% load and under 4 at 85%.
// They do at 90%, where the solver runs the fastest pods at its cap (4x in
// 7 of 56 runs, 7.1x at most), at 95-97% load in most runs (up to 9.8x),
// and with heavy-tailed request times on one-core pods even at 80% (about
// 20x). Each alarm that is read as a backlog starts a spell of
// LEAST_REQUEST (two DestinationRule writes), so the alarm sits where
// chance rings it rarely below 90% load. Raising it trades those spells
// for later cuts: at 6 the runs with a spell at 90% load went from 7 of 32
// to 1 (at 8, to none), while a pod slowed to a half or to 0.7 of its
// speed at 80% load was cut later, its p99.9 after the change up by a
// quarter to a third (medians over 16 runs). A spell costs two writes and
// a minute of Istio's default balancer; a late cut, seconds of queue at
// the slowed pod. The zSigmas test does not separate them either: these
// ratios' tails are far heavier than their robust spread suggests (chance
// ratios stood up to 15 robust standard deviations out, a slowdown's first
// reading 13).
const alarmLatency = 4

// Alarm reports whether the recent latencies of obs (Signal.RecentLatency;
// the other fields are ignored) show a pod falling behind that the last
// cycle did not know of, which one, and why, for the log. It changes
// nothing.
func (e *Engine) Alarm(pods []Pod, obs Observation) (pod, reason string, ring bool) {
	if obs.Err != nil || !e.Alarming() {
		return "", "", false
	}
	for _, p := range canonicalPods(pods) {
		st := e.pods[p.Name]
		if r := obs.Signals[p.Name].RecentLatency; st.rings(r) {
			return p.Name, fmt.Sprintf("its latency over the last scrapes, %v, is %.1fx the %v of the last cycle",
				roundLatency(r), r/st.latency, roundLatency(st.latency)), true
		}
	}
	return "", "", false
}

// Alarming reports whether Alarm can ring at all: the last result was
// Learned, or Doubtful (the operator runs ROUND_ROBIN on the weights, and
// keeps it through doubt), and rests on fresh data
// (Optimizing or Steady).
func (e *Engine) Alarming() bool {
	return (e.lastLearned || e.lastDoubtful) && (e.mode == ModeOptimizing || e.mode == ModeSteady)
}

// rings reports whether a recent latency r rings the alarm for the pod:
// one with a usual latency, not already behind, and r past the alarm.
func (st *podState) rings(r float64) bool {
	if st == nil || st.hot || st.backlog > 0 || !(st.latency > 0) {
		return false
	}
	return usable(r) && st.alarmed(r/st.latency)
}

// alarmed reports whether a latency at ratio times the reference is past
// the alarm: at least alarmLatency, and zSigmas of the pod's usual
// recent-to-window ratio.
func (st *podState) alarmed(ratio float64) bool {
	return ratio >= alarmLatency && math.Log(ratio) >= zSigmas*math.Sqrt(robustVariance(st.latencyRatios))
}

// noteLatency records what Alarm and the backlog reading compare with:
// the pod's usual latency, its window's latency at the last cycle in which
// it kept up (keptUpWith). While it is behind, the reference stays what it
// was before, so the extra wait keeps showing as a backlog until it
// clears.
//
// A pod first seen at its CPU limit has no usual latency of its own: its
// reading then may be the queue, not the reference (a pod that Istio's
// default balancer had overloaded before the opt-in waits minutes). Its
// reference is provisional: it borrows the most that any pod that kept up
// waits, scaled to its own request time (usual, 0 = unknown), when that is
// lower, at this cycle or a later one (after a restart the speeds it is
// scaled by are not read until the second). The borrowed reference holds
// while the pod stays at its limit, and no longer than the queue its
// highest reading shows takes to serve, plus a query window (window) for
// the readings to show it served: the pod is sent almost nothing while it
// is behind, since a backlog holds the Service on LEAST_REQUEST. A queue
// that is still growing shows in readings that lag it (a request's latency
// is read when it completes), so each higher reading moves that instant
// on. Then, or once the pod is below its limit, its own reading is its
// usual, so a pod whose requests wait longer than the others' for reasons
// of its own (a far zone, a slow disk) is cut while it is overloaded and
// no longer. The usual recent-to-window ratio learns from the cycles it
// kept up, so an overload does not teach the alarm to ignore the next one.
func (st *podState) noteLatency(r reading, usual float64, now time.Time, window time.Duration) {
	switch {
	case !r.hasLatency:
		st.latency, st.provisional = 0, time.Time{}
		return
	case keptUpWith(r, st):
		st.latency, st.provisional = r.latency, time.Time{}
		if r.recentLatency > 0 {
			st.latencyRatios = appendCapped(st.latencyRatios, math.Log(r.recentLatency/r.latency), 16) // enough for a robust median, recent enough to follow the pod
		}
		return
	case !(st.latency > 0):
		st.latency = r.latency
		if !r.saturated {
			return
		}
		// First seen at its limit: provisional from now on.
	case st.provisional.IsZero():
		return // behind: its usual stays
	case !r.saturated || now.After(st.provisional):
		st.latency, st.provisional = r.latency, time.Time{}
		return
	}
	// Provisional: a higher reading moves the deadline on (a day bounds
	// the conversion: no queue is served that slowly), and the borrowed
	// reference stands where it is lower.
	if st.provisional.IsZero() || r.latency > st.peak {
		st.provisional = now.Add(time.Duration(min(r.latency, 86400)*float64(time.Second)) + window)
		st.peak = r.latency
	}
	if usual > 0 {
		st.latency = min(st.latency, usual)
	}
}

// keptUpWith reports whether the reading shows the pod keeping up: a
// latency, no backlog, not at its limit, and its recent latency not past
// the alarm.
func keptUpWith(r reading, st *podState) bool {
	return r.hasLatency && r.latency > 0 && !r.saturated && r.backlog == 0 &&
		!(r.recentLatency > 0 && st.alarmed(r.recentLatency/r.latency))
}

func roundLatency(s float64) time.Duration {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d >= 10*time.Second:
		return d.Round(time.Second)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}
