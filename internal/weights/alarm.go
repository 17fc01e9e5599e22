package weights

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Under weighted ROUND_ROBIN a pod that slows down just after a cycle is
// sent its old share until the next. Between cycles the operator looks at
// the pods' sidecar latency and request rates over the last two scrape
// intervals (Signal.RecentLatency, RecentRequests), and Alarm says whether
// they show a pod falling behind that the last cycle did not know of: its
// latency far above its usual, while it serves less than it is sent
// (lagging). The operator then runs a cycle at once, which reads the same
// latency as a backlog (Little's law: requests times the extra wait, see
// readBacklogs) and sends the pod less until it clears.

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
// chance rings it rarely below 90% load, and where request rates tell
// (lagging), a chance queue rings it only if the pod also served less
// than it was sent. Raising it trades those spells
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

// Alarm reports whether the recent latencies and request rates of obs
// (Signal.RecentLatency, RecentRequests; the other fields are ignored)
// show a pod falling behind that the last cycle did not know of, which
// one, and why, for the log. It changes nothing.
func (e *Engine) Alarm(pods []Pod, obs Observation) (pod, reason string, ring bool) {
	if obs.Err != nil || !e.Alarming() {
		return "", "", false
	}
	set := canonicalPods(pods)
	// The Service's rate over a query window, for the surge guard: this
	// cycle's where obs is a cycle's (as Update reads it, so that the two
	// judge the same scrapes alike), else the last regular cycle's.
	window := make([]float64, len(set))
	for i, p := range set {
		if v := obs.Signals[p.Name].Requests; usable(v) && v > 0 {
			window[i] = v
		} else if st := e.pods[p.Name]; st != nil {
			window[i] = st.served
		}
	}
	served, sent := e.recentServed(set, obs, window)
	rr := e.roundRobinNow(obs)
	for i, p := range set {
		st := e.pods[p.Name]
		if r := obs.Signals[p.Name].RecentLatency; st.rings(r, served[i], sent[i], st.latencyAlone(rr)) {
			why := fmt.Sprintf("its latency over the last scrapes, %v, is %.1fx the %v of the last cycle",
				roundLatency(r), r/st.latency, roundLatency(st.latency))
			if sent[i] > 0 {
				why += fmt.Sprintf(", and it served %.0f%% of the requests it was sent", 100*served[i])
			}
			return p.Name, why, true
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
// one with a usual latency, not already behind, r past the alarm, and
// the pod lagging by what it served (served, sent: see recentServed;
// alone: see lagging).
func (st *podState) rings(r, served, sent float64, alone bool) bool {
	if st == nil || st.hot || st.backlog > 0 || !(st.latency > 0) {
		return false
	}
	return usable(r) && st.alarmed(r/st.latency) && st.lagging(served, sent, alone)
}

// latencyAlone reports whether the pod's latency may ring the alarm on
// its own, where what it served is unknown: unless its usual latency was
// read while the clients ran LEAST_REQUEST and ROUND_ROBIN is live now
// (rr, see roundRobinNow), so the recent latencies show it.
// LEAST_REQUEST steers each request to a short queue, so the latencies it
// shows are the floor of what any weights give at the same load; under
// ROUND_ROBIN a pod run near the cap queues as chance has it.
// Against a reference read under LEAST_REQUEST, a busy pod's first
// readings under ROUND_ROBIN stand out by the balancer's change alone:
// at 90% load on three hardware generations, a fast two-core pod read
// 4.4x its reference 31 s after the switch (the solver runs it near
// 93%, where an M/M/2 queue's mean response is 7.4 request times), and
// the spell it started switched the mesh twice more. What it served
// tells a pod that fell behind from a chance queue once the recent span
// lies under ROUND_ROBIN on steady weights (see recentServed), and a
// cycle under ROUND_ROBIN for a whole query window gives the reference
// of its own. The other way round (a reference read under ROUND_ROBIN,
// LEAST_REQUEST now) the ratio can only read low.
func (st *podState) latencyAlone(rr bool) bool {
	return st == nil || !(st.latencyUnder == BalancerLeastRequest && rr)
}

// lagging reports whether a pod whose recent latency is past the alarm
// serves less than it is sent: its served share (see recentServed) stands
// zSigmas below its usual one, by the larger of a Poisson count's noise on
// what it was sent and the spread of its own shares at the cycles in
// which it kept up (misaligned scrapes, bursts, a locality's skew). A pod
// that cannot keep up serves at its new capacity, less than it is sent,
// and its queue grows without bound; a busy pod's chance queue is served
// within seconds, and the pod goes on serving about what it is sent. Near
// full load the latency cannot tell them apart (see alarmLatency); what
// was served can: at the first look after a pod slowed to a third at 80%
// load, it had served 43-87% of what it was sent (16 runs), while the
// chance queues that rang the latency alarm at 85-95% load had served
// 85-105% of it, at most 3.5 Poisson deviations short (66 alarms). Unknown
// (sent 0: no request rates, another balancer, weights written within the
// span): the latency decides alone where it can (alone, see latencyAlone).
func (st *podState) lagging(served, sent float64, alone bool) bool {
	if !(sent > 0) {
		return alone
	}
	// Written so that a NaN (a spread of absurd readings) counts as
	// lagging: the latency then decides alone, as where the share is
	// unknown, rather than silencing the pod's alarm.
	return !(-deviations(math.Log(served), 1/sent, st.servedRatios) < zSigmas)
}

// deviations is how many standard deviations x (a log) stands from its
// usual value, the median of history (0 until it holds three): by the
// larger of a count's Poisson variance and history's robust spread, which
// carries what the count does not (misaligned scrapes, bursts, skew).
func deviations(x, poissonVar float64, history []float64) float64 {
	usual := 0.0
	if len(history) >= 3 {
		usual = median(slices.Clone(history))
	}
	return (x - usual) / math.Sqrt(max(poissonVar, spreadVariance(history)))
}

// recentServed is recentServed for the observation, when the clients
// followed the live weights over the last two scrape intervals (and the
// scrape before them): ROUND_ROBIN, and the weights written before then;
// and when the Service's load held (steadyLoad against window, the pods'
// request rates over a query window, in set order, 0 = unknown).
func (e *Engine) recentServed(set []Pod, obs Observation, window []float64) (served, sent []float64) {
	span := 2 * e.params.ScrapeInterval
	var live map[string]uint32
	if e.followsWeights(e.recentBalancer(obs, span+e.params.ScrapeInterval)) && span > 0 && e.steadyLoad(recentLoadMove(set, obs.Signals, window, span, e.params.QueryWindow)) {
		live = e.history.steady(obs.Time, span+e.params.ScrapeInterval)
	}
	return recentServed(set, obs.Signals, live, span)
}

// steadyLoad reports whether the Service's recent request rate matches
// its rate over a query window (move: the log of their ratio, n and m the
// request counts behind them, see recentLoadMove): within zSigmas of the
// larger of their Poisson noise and the spread of the same move at the
// regular cycles (loadMoves: windows of different length, scrapes,
// bursts), about its median. A served share reads against the median
// per-share total of the same two scrape intervals, which lags the pods'
// sends while the load moves: after a surge, pods scraped before it read
// short and pods scraped after it long, the fast pods reading 1.1-1.4 of
// their share, so a pod that fell behind in the surge did not look short
// and the alarm waited for a cycle. While the load moves, the served share
// is unknown and the latency decides alone.
func (e *Engine) steadyLoad(move, n, m float64) bool {
	if !(n > 0) || !(m > 0) {
		return false
	}
	return math.Abs(deviations(move, 1/n+1/m, e.loadMoves)) <= zSigmas
}

// recentLoadMove is the log of the ratio of the Service's recent request rate
// (Signal.RecentRequests over span) to its rate over a query window
// (window, per pod in set order, 0 = unknown), over the pods with both,
// and the request counts they stand for (n recent, m in the window; 0 =
// no pod has both).
func recentLoadMove(set []Pod, sig map[string]Signal, window []float64, span, queryWindow time.Duration) (move, n, m float64) {
	recent, was := 0.0, 0.0
	for i, pod := range set {
		if v, ok := sig[pod.Name]; ok && usable(v.RecentRequests) && i < len(window) && window[i] > 0 && !math.IsInf(window[i], 1) {
			recent, was = recent+v.RecentRequests, was+window[i]
		}
	}
	if !(recent > 0) || !(was > 0) {
		return 0, 0, 0
	}
	return math.Log(recent / was), recent * span.Seconds(), was * queryWindow.Seconds()
}

// recentBalancer is the balancer the clients ran over the span of
// samples that reach back by horizon from obs.Time: ROUND_ROBIN if it
// was live over all of it (see Observation.RoundRobinSince), else the
// window's (Observation.Balancer, see balancerOr).
func (e *Engine) recentBalancer(obs Observation, horizon time.Duration) Balancer {
	if since := obs.RoundRobinSince; !since.IsZero() {
		if obs.Time.Sub(since) >= horizon {
			return BalancerRoundRobin
		}
		return BalancerLeastRequest
	}
	return e.balancerOr(obs.Balancer)
}

// roundRobinNow reports whether ROUND_ROBIN is live now: it took over
// (Observation.RoundRobinSince), or ran over the whole window.
func (e *Engine) roundRobinNow(obs Observation) bool {
	return !obs.RoundRobinSince.IsZero() || e.balancerOr(obs.Balancer) == BalancerRoundRobin
}

// balancerOr is balancer, or where the caller did not say, the
// operator's default: LEAST_REQUEST until a result is Learned,
// ROUND_ROBIN after.
func (e *Engine) balancerOr(balancer Balancer) Balancer {
	if balancer == "" {
		balancer = BalancerLeastRequest
		if e.lastLearned {
			balancer = BalancerRoundRobin
		}
	}
	return balancer
}

// followsWeights reports whether traffic follows the engine's live
// weights under the balancer the caller says ran (see
// Observation.Balancer): ROUND_ROBIN over weights that are live.
func (e *Engine) followsWeights(balancer Balancer) bool {
	return e.balancerOr(balancer) == BalancerRoundRobin && e.live != nil && !e.unapplied
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
// under is the balancer over the query window the reading comes from,
// which a reference read from it keeps (see latencyAlone).
func (st *podState) noteLatency(r reading, usual float64, now time.Time, window time.Duration, under Balancer) {
	switch {
	case !r.hasLatency:
		st.latency, st.provisional = 0, time.Time{}
		return
	case keptUpWith(r, st):
		st.latency, st.provisional, st.latencyUnder = r.latency, time.Time{}, under
		if l := math.Log(r.recentLatency / r.latency); r.recentLatency > 0 && !math.IsInf(l, 0) && !math.IsNaN(l) {
			st.latencyRatios = appendCapped(st.latencyRatios, l, 16) // enough for a robust median, recent enough to follow the pod
		}
		if l := math.Log(r.served); r.sent > 0 && r.served > 0 && !math.IsInf(l, 0) {
			st.servedRatios = appendCapped(st.servedRatios, l, 16) // as latencyRatios
		}
		return
	case !(st.latency > 0):
		st.latency, st.latencyUnder = r.latency, under
		if !r.saturated {
			return
		}
		// First seen at its limit: provisional from now on.
	case st.provisional.IsZero():
		return // behind: its usual stays
	case !r.saturated || now.After(st.provisional):
		st.latency, st.provisional, st.latencyUnder = r.latency, time.Time{}, under
		return
	}
	// Provisional: a higher reading moves the deadline on (a day bounds
	// the conversion: no queue is served that slowly), and the borrowed
	// reference stands where it is lower.
	if st.provisional.IsZero() || r.latency > st.peak {
		st.provisional = now.Add(time.Duration(min(r.latency, 86400)*float64(time.Second)) + window)
		st.peak = r.latency
	}
	if usual > 0 && usual < st.latency {
		st.latency, st.latencyUnder = usual, under
	}
}

// keptUpWith reports whether the reading shows the pod keeping up: a
// latency, no backlog, not at its limit, and its recent latency not past
// the alarm.
func keptUpWith(r reading, st *podState) bool {
	return r.hasLatency && r.latency > 0 && !r.saturated && r.backlog == 0 &&
		!(r.recentLatency > 0 && st.alarmed(r.recentLatency/r.latency) && st.lagging(r.served, r.sent, r.alone))
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
