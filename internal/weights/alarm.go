package weights

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Under weighted ROUND_ROBIN nothing steers around a queue: a pod that
// slows down suddenly is sent its old share until the next cycle moves its
// weight, and the queue it builds meanwhile is served at its new, lower
// speed. At a 30 s cycle that is thousands of requests held for tens of
// seconds. A cycle needs every query over the whole window, but seeing
// that something is wrong needs less: the pod's sidecar latency over the
// last two scrape intervals (Signal.RecentLatency). Alarm judges such a
// look between cycles, and the operator runs the cycle at once when it
// rings; that cycle hands the Service to LEAST_REQUEST (Result.Learned
// false) at once, since its windows are mostly from before the change
// (see noteSuspects), and drains the pod as soon as they show it behind.
//
// Only an overload the last cycle did not know of rings: a pod already
// hot or drained is being handled, and the next cycle follows it up. And
// only while the last result was Learned: before that the operator runs
// LEAST_REQUEST, which steers around a queue within a request.
//
// The pods' recent CPU does not ring it. A pod at 80% of its limit that
// reaches 100% shows it over two scrape intervals no sooner than its
// latency does, and on CPU alone (no latency) the extra cycles it caused
// moved the CPU-only learning more than they helped (a pod slowing to a
// third, CPU alone, in the bench: 1.02-2.7x the oracle's p99 with them,
// 1.36-1.55x without).

// alarmLatency: a pod's latency over the last two scrape intervals at this
// multiple of the latency the last cycle knew of (see noteLatency), and
// beyond recentSigmas of how the two usually differ for that pod, rings
// the alarm. A pod that cannot keep up adds to its queue with every
// request, so its latency grows without bound within seconds; at 90% load
// a busy pod's latency over 30 s is still up to 3x its mean now and then,
// which costs an early cycle that changes nothing (bench: 3 in 20 minutes
// on hetero3-90, none on hetero3-60).
const alarmLatency = 2

// suspectCut is the factor a suspect's weight is cut by when its alarm
// rings (see noteSuspects), for as long as it stays a suspect. LEAST_REQUEST
// steers around a queue by each sidecar's own count of its active
// requests: with many clients each sees a small part of the pod's queue,
// and a pod weighted at k times its new speed keeps a queue of about k-1
// requests per client (the slowdown with 128 clients, k = 2.4: p99.9
// 4.5-15 s). Only its weight sends it less. A pod whose latency doubled
// cannot keep up with what it is sent: halving it stops its queue growing
// for a slowdown of up to 2x, and leaves a pod slowed to a third at 80%
// load weighted at 1.2x its speed, a seventh of the excess. The windows then show the
// pod's speed and backlog, and the drain takes over (see drainProposal).
// A passing surge costs the other pods half its share until its latency
// is back under the alarm, so the cut takes only the room they have below
// suspectUtil. The cut applies whatever the load balancer (a regular cycle
// marks suspects under LEAST_REQUEST too), and only while the weights are
// the engine's own (not in a dry run, nor after a failed write).
//
// A cut that brings the pod's latency back under the alarm ends the spell
// and the cut with it; if the pod is still slower, its latency rings again
// and it is cut again, until the windows show its speed.
//
// Only one pod's own change is cut: when it is the only one that rings and
// no other pod was already drained, cut or a suspect. A pod whose latency rises
// while another is held may be taking that pod's traffic, and cutting it
// too moves the overload around (in the bench, a pod slowing to a third
// with 128 clients: p99 1.15x without the cut, 1.92x cutting every ringing
// pod).
const suspectCut = 0.5

// Alarm reports whether the recent latencies of obs (Signal.RecentLatency;
// the other fields are ignored) show a pod overloaded that the last cycle
// did not know of, which one, and why, for the log. It changes nothing:
// the caller runs a cycle (Update, with the full window) when it rings.
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

// rings reports whether a recent latency r rings the alarm for the pod:
// one the last cycle knew of (st not nil, with a latency), neither at its
// limit nor drained, and r past the alarm against that latency.
func (st *podState) rings(r float64) bool {
	if st == nil || st.hot || st.drainOr1() < 1 || !(st.latency > 0) {
		return false
	}
	return usable(r) && st.alarmed(r/st.latency)
}

// noteSuspects marks, at a cycle, the pods whose recent latency rings the
// alarm (whether a look rang it or the cycle is the first to see it), and
// returns them. Such a pod's windows are mostly from before the change:
// they may still show it keeping up (a slowdown 5 s old is a twelfth of
// a one-minute window), so nothing else would keep it off ROUND_ROBIN,
// and under ROUND_ROBIN its queue grows by the difference between its old
// share and its new speed. While it is a suspect Learned stays false and
// the operator runs LEAST_REQUEST, which steers around the queue within a
// request. It stays one until its recent latency is back under the alarm
// against the latency from before (a passing surge: at 90% load a busy
// pod's latency over 30 s is now and then 2-3x its mean), or until one
// query window and scrape have passed (Params.horizon): from then on the
// windows show the pod as it is now, and a pod still behind is hot or
// drained. Holding LEAST_REQUEST through a surge costs p99 at high load
// (there the weights do better than LEAST_REQUEST), hence the early end.
//
// It runs before this cycle's drains and hot pods are known, so it judges
// a pod by the state Alarm would have judged it by between the cycles.
// Pods are marked while the last result rested on fresh data, Learned or
// not: a second pod that falls behind during one pod's spell is held too,
// instead of its latency becoming the reference the alarm compares with.
func (e *Engine) noteSuspects(now time.Time, set []Pod, obs Observation) []string {
	fresh := e.fresh()
	var names, held []string // held: already drained, cut or a suspect
	for _, p := range set {
		st := e.pods[p.Name]
		if st == nil {
			continue
		}
		if st.offCapacity() || st.suspect(now) {
			held = append(held, p.Name)
		}
		r := obs.Signals[p.Name].RecentLatency
		if fresh && st.rings(r) {
			st.suspectUntil, st.suspectLatency, st.cut = now.Add(e.params.horizon()), st.latency, false
			names = append(names, p.Name)
			continue
		}
		if st.suspect(now) && usable(r) && r > 0 && !st.alarmed(r/st.suspectLatency) {
			st.suspectUntil = time.Time{}
		}
	}
	if len(names) == 1 && !slices.ContainsFunc(held, func(n string) bool { return n != names[0] }) {
		e.pods[names[0]].cut = true
	}
	return names
}

// suspect reports whether the pod is a suspect at now (see noteSuspects).
func (st *podState) suspect(now time.Time) bool {
	return now.Before(st.suspectUntil)
}

// suspectMessage explains the pods held as suspects (see noteSuspects):
// those just marked, or else the first still held.
func (e *Engine) suspectMessage(now time.Time, set []Pod, marked []string) string {
	if len(marked) > 0 {
		return fmt.Sprintf("; the latency of %d pod(s) rose past the alarm (%s first) before the query window could show why: LEAST_REQUEST for up to %v",
			len(marked), marked[0], e.params.horizon())
	}
	for _, p := range set {
		if st := e.pods[p.Name]; st != nil && st.suspect(now) {
			return fmt.Sprintf("; %s's latency rang the alarm: LEAST_REQUEST until it is back under the alarm or the query window covers the change, at most %v from now",
				p.Name, st.suspectUntil.Sub(now).Round(time.Second))
		}
	}
	return ""
}

// Alarming reports whether Alarm can ring at all: the last result was
// Learned (the operator runs ROUND_ROBIN on the weights) and rests on
// fresh data (Optimizing or Steady: not held through failed queries, low
// load or a fallback). The operator looks between cycles only then.
func (e *Engine) Alarming() bool {
	return e.lastLearned && e.fresh()
}

// fresh reports whether the last result rests on fresh data (Optimizing
// or Steady), so the latencies it noted are a reference to judge by.
func (e *Engine) fresh() bool {
	return e.mode == ModeOptimizing || e.mode == ModeSteady
}

// alarmed reports whether a pod's latency at ratio times the reference is
// past the alarm: at least alarmLatency, and recentSigmas of the pod's
// usual recent-to-window difference.
func (st *podState) alarmed(ratio float64) bool {
	return ratio >= alarmLatency && math.Log(ratio) >= recentSigmas*recentNoise(st.latencyRatios)
}

// noteLatency records, at the end of a cycle with data, what Alarm compares
// with until the next one. The reference is the higher of the window's
// latency and the recent one: a look that finds the latency risen past
// the alarm rings once, and again only when it has risen as much again
// (an alarm's cycle sees the recent latency that rang). The pod's usual
// difference between the two learns only from cycles in which the pod kept
// up (not at its limit, not drained) and that difference was not itself
// past the alarm, so an overload does not teach the alarm to ignore the
// next one.
func (st *podState) noteLatency(ps podSignal) {
	st.latency = 0
	if !ps.hasLatency {
		return
	}
	st.latency = max(ps.latency, ps.recentLatency)
	if ps.recentLatency > 0 && !st.hot && st.drainOr1() == 1 && !st.alarmed(ps.recentLatency/ps.latency) {
		st.latencyRatios = noteRatio(st.latencyRatios, math.Log(ps.recentLatency/ps.latency))
	}
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
