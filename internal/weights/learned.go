package weights

import "time"

// Result.Learned tells the operator whether weighted ROUND_ROBIN can be
// trusted with the weights. It can when the weights rest on what the data
// measured, for nearly all of the traffic: until then (the first cycles
// after opt-in, new pods, a pod whose speed just changed, a pod being
// drained of a backlog, a pod whose overload CPU alone cannot show: see
// markBlind) a queue-aware LEAST_REQUEST is never worse than Istio's
// default, which is what the Service had before.

// learnedShare is the share of the weight that must rest on settled
// estimates for Learned: the rest may be new or changing pods, which
// LEAST_REQUEST handles by their queues.
const learnedShare = 0.9

// settled reports whether a pod's weight rests on a measurement: its
// estimate is from data (with request rates: a sharp observation since the
// last restart), its core count is known or, with latency data, measured
// (see cores.go), and no drain holds its weight off its capacity.
func (e *Engine) settled(pod Pod, fromRequests bool) bool {
	st := e.pods[pod.Name]
	if st == nil || !st.known || !st.fromData {
		return false
	}
	if fromRequests && st.measurements < 1 {
		return false
	}
	if st.drainOr1() < 1 {
		return false // held off its capacity
	}
	if !knownCores(pod) && fromRequests && e.lastWithLatency && st.coresMeasured == 0 && st.ceiling <= 0 {
		return false // its cores are a guess until the latency measures them
	}
	return true
}

// learned reports Result.Learned for new weights w over set. A pod's
// share of the traffic is the larger of its share of the live weights
// (what it carried over the window) and of w (what it will carry).
func (e *Engine) learned(now time.Time, set []Pod, w map[string]uint32, mode Mode) bool {
	switch mode {
	case ModeFallback, ModeNoData:
		return false
	}
	ref, _ := e.reference()
	liveTotal, newTotal := 0.0, 0.0
	for _, pod := range set {
		liveTotal += float64(ref[pod.Name])
		newTotal += float64(w[pod.Name])
	}
	if newTotal <= 0 {
		return false
	}
	unsettled := 0.0
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && (st.hot || st.drainOr1() < 1 || st.blind || st.suspect(now)) {
			// Overloaded, with a backlog, or where an overload would not
			// show (CPU alone and no ceiling, see markBlind): whatever its
			// share, a queue grows or may grow there, which LEAST_REQUEST
			// steers around within a request and weights only within a
			// cycle. Or its latency rang the alarm and the windows do not
			// cover the change yet (see noteSuspects).
			return false
		}
		if e.settled(pod, e.lastFromRequests()) {
			continue
		}
		share := float64(w[pod.Name]) / newTotal
		if liveTotal > 0 {
			share = max(share, float64(ref[pod.Name])/liveTotal)
		}
		unsettled += share
	}
	return unsettled <= 1-learnedShare
}
