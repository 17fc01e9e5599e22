package weights

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// A pod that was sent more than it could serve keeps the excess in a
// queue. At capacity-proportional weights that queue drains only at the
// spare capacity the load leaves (1-load of the pod's capacity: a tenth at
// 90% load), so a backlog built in the minute it takes to notice a change
// lasts for many minutes, and every request sent to the pod meanwhile waits
// behind it. Draining weights the pod below its capacity until the backlog
// is gone.
//
// A pod at its CPU limit is overloaded by an amount its CPU cannot show; it
// is drained by hotDrain until its CPU drops (with or without request
// rates). The backlog itself is measured when request rates exist. Traffic
// follows the weights, so over the window of a rate the pod was sent its
// average weight share of the total; the total is what the pods that keep
// up serve per unit of share (a median, so pods with a backlog do not pull
// it down). Sent minus served, times the window, is how much the backlog
// grew over that window: the backlog now is the one a window ago plus that
// growth. A pod whose CPU stayed below its limit over the window was idle
// at some moment of it, so if its backlog did not grow meanwhile it has
// none.

const (
	// drainUtil is the utilisation up to which the other pods may be
	// loaded to take a draining pod's traffic.
	drainUtil = 0.95
	// minDeficit is the share of the traffic a pod was sent that it must
	// fall short of serving before a backlog is believed: below it, the
	// difference can come from how the two rates were sampled.
	minDeficit = 0.05
	// deficitSigmas: the shortfall must also exceed this many standard
	// deviations of a Poisson count of the requests served in the window.
	deficitSigmas = 4
	// hotDrain is the weight factor of a pod whose CPU is at its limit
	// while no backlog was measured (no request rates, or the backlog
	// built before the engine saw it): it is overloaded by an unknown
	// amount, so it gets a fifth less than its capacity until its CPU
	// drops.
	//
	// Without request rates a hot drain is released by halves: a pod at its
	// limit at its full weight and below it at the drained one has its
	// capacity somewhere between, which CPU alone cannot measure, so it gets
	// back half the cut each cycle (in log terms: 0.8, 0.89, 0.95, then 1)
	// while it stays below its limit. Released at once, a pod whose estimate
	// is a few percent high (CPU alone reads the cores of a pod without a
	// limit from its node's noisy idle CPU) is back at its limit the next
	// cycle, drained again, and so on: at 85-90% load a 1-core pod 10% over
	// its share runs at 93-99% (measured in the bench on a 1-8 core mix at
	// 90% load with CPU alone: 1.13-1.75x the oracle's p99 released at
	// once, 1.00-1.29x by halves; on three CPU generations without limits
	// at 90%: 0.87-1.07x and 0.85-1.00x). With request rates the backlog
	// says when the drain can end.
	hotDrain = 0.8
	// minDrain is the least factor a drain applies; MaxRatio bounds the
	// weight further.
	minDrain = 0.02
	// negligibleDrain: a drain factor above this is not worth a write.
	negligibleDrain = 0.95
	// maxBacklogSeconds caps a backlog estimate at this many seconds of
	// the pod's capacity: clients time out long before, so a larger
	// shortfall was dropped, not queued.
	maxBacklogSeconds = 60
	// suspectUtil is the utilisation up to which the other pods may be
	// loaded to take a suspect's cut (see suspectCut): below drainUtil,
	// since a suspicion is sometimes a passing surge, where a measured
	// backlog is not. When the others' cores are unknown their use is
	// taken as 0.855 (see fitDrains), above it: no cut. At 90% load there is no room, and a surge there
	// rings now and then (up to 6.7x in the bench at 90% load), which a
	// cut made costly (three CPU generations without limits at 90% load:
	// 0.90x the oracle's p99 on average without a cut, 0.95x cutting at
	// any load).
	suspectUtil = 0.85
	// maxBacklogPoints bounds the backlog history kept per pod.
	maxBacklogPoints = 16
)

// backlogPoint is a pod's estimated backlog (requests) at a cycle.
type backlogPoint struct {
	at time.Time
	q  float64
}

// backlogAt returns the backlog estimate from the cycle nearest before at
// (with some slack for jitter), or 0 when there is none within a window of
// it.
func (st *podState) backlogAt(at time.Time, window time.Duration) float64 {
	slack := window / 8
	for k := len(st.backlogs) - 1; k >= 0; k-- {
		p := st.backlogs[k]
		if p.at.After(at.Add(slack)) {
			continue
		}
		if p.at.Before(at.Add(-window)) {
			return 0
		}
		return p.q
	}
	return 0
}

// drainState is what one cycle measured for draining.
type drainState struct {
	active  bool    // draining applies this cycle
	total   float64 // requests per second sent to all pods, estimated
	capRate []float64
	hot     []bool // CPU at the pod's Cores limit
}

// draining reports whether weights may be drained: DrainTime is on and the
// live weights are the engine's own (not a dry run, where they are not
// applied, nor a write that failed), since a drain corrects what the live
// weights did.
func (e *Engine) draining() bool {
	return e.params.DrainTime > 0 && e.liveKnown && !e.unapplied
}

// trackBacklogs updates every pod's backlog estimate from this cycle's
// signals and returns what drainProposal needs.
func (e *Engine) trackBacklogs(now time.Time, set []Pod, sig signals, shares []shareSpan) drainState {
	ds := drainState{
		active:  e.draining(),
		capRate: make([]float64, len(set)),
		hot:     make([]bool, len(set)),
	}
	for i := range set {
		ps := sig.pods[i]
		ds.hot[i] = ps.saturated()
	}
	if !ds.active || !sig.fromRequests {
		for _, pod := range set {
			if st := e.pods[pod.Name]; st != nil {
				st.backlog, st.backlogs = 0, nil
			}
		}
		// Without request rates no backlog is measured; pods at their limit
		// are still drained (by hotDrain), and the traffic moved is
		// counted in shares of the total.
		ds.total = 1
		return ds
	}

	// Which pods the data speaks for, and what they were sent per share.
	eligible := make([]bool, len(set))
	var perShare, perShareCool []float64
	for i, pod := range set {
		ps := sig.pods[i]
		if !ps.hasCPU || ps.cpu <= 0 || !ps.hasRequests || !shares[i].ok || e.warming(pod, now) {
			continue
		}
		eligible[i] = true
		mid := math.Sqrt(shares[i].lo * shares[i].hi)
		perShare = append(perShare, ps.requests/mid)
		if !ds.hot[i] {
			perShareCool = append(perShareCool, ps.requests/mid)
		}
	}
	if len(perShareCool) > 0 {
		ds.total = median(perShareCool)
	} else {
		ds.total = median(perShare)
	}
	if !(ds.total > 0) || math.IsInf(ds.total, 0) {
		ds.active = false
		return ds
	}

	w := e.params.QueryWindow.Seconds()
	for i, pod := range set {
		st := e.state(pod.Name)
		if !eligible[i] {
			st.backlog = 0
			continue
		}
		ps := sig.pods[i]
		ds.capRate[i] = ps.requests
		if ps.limit > 0 {
			ds.capRate[i] = max(ps.requests, ps.requests/ps.cpu*ps.limit)
		}
		sent := math.Sqrt(shares[i].lo*shares[i].hi) * ds.total
		threshold := max(minDeficit*shares[i].lo*ds.total*w, deficitSigmas*math.Sqrt(ps.requests*w+1))
		grew := (shares[i].lo*ds.total-ps.requests)*w >= threshold
		shrank := (ps.requests-shares[i].hi*ds.total)*w >= threshold
		before := st.backlogAt(now.Add(-e.params.QueryWindow), e.params.QueryWindow)
		var q float64
		switch {
		case ps.limit > 0 && !ds.hot[i] && !grew:
			// It had idle moments in the window, when its queue was empty,
			// and it was not sent more than it served: no queue now.
			q = 0
		case grew || shrank || ds.hot[i]:
			// The queue grew or shrank, or the pod was busy all the time
			// (where a queue, if there was one, still is).
			q = max(0, before+(sent-ps.requests)*w)
		default:
			// It served what it was sent: no queue.
			q = 0
		}
		if e.underLeastRequest(now) && ps.hasLatency {
			// Not learned over some of the window: the operator ran
			// LEAST_REQUEST, under which traffic does not follow the
			// weights (it steers away from the pods with the most
			// requests in flight, such as many-core pods run full), so
			// sent-minus-served is no measure. The sidecar's latency
			// is: by Little's law the mean queue over the window was
			// requests times the mean wait, and a queue that grew
			// steadily ends at twice its mean.
			waiting := ps.requests * max(0, ps.latency-ps.cpu/ps.requests)
			q = min(q, 2*waiting)
		}
		q = min(q, ds.capRate[i]*maxBacklogSeconds)
		if !(q >= 0) || math.IsInf(q, 0) {
			q = 0
		}
		st.backlog = q
		st.backlogs = append(st.backlogs, backlogPoint{at: now, q: q})
		if len(st.backlogs) > maxBacklogPoints {
			st.backlogs = slices.Delete(st.backlogs, 0, len(st.backlogs)-maxBacklogPoints)
		}
	}
	return ds
}

// underLeastRequest reports whether the query window ending now holds
// time when the operator ran LEAST_REQUEST: the last result was not
// Learned, or the switch back to the weights is within the window. (With
// load_balancer: LEAST_REQUEST the engine is not told, see the docs.)
func (e *Engine) underLeastRequest(now time.Time) bool {
	return !e.lastLearned || now.Sub(e.leastRequestUntil) < e.params.horizon()
}

// drainProposal lowers the proposal of every pod with a backlog, or with
// its CPU at its limit, below its capacity, so that the backlog would
// clear within DrainTime: the pod is sent its capacity minus the backlog
// over DrainTime (at least a little). The traffic taken off goes to the
// other pods, at most as much as keeps them below drainUtil. A suspect
// whose alarm cut its weight (see suspectCut) is then cut, into the room
// the others have left below suspectUtil. It returns the drained pods, the
// cut ones and the largest backlog, for the message.
func (e *Engine) drainProposal(now time.Time, set []Pod, sig signals, ds drainState, proposal []float64) (drained, cut []string, worst string, worstQ float64) {
	factors := make([]float64, len(set)) // the drains
	cuts := make([]float64, len(set))    // the cuts on top of them, 0 for none
	for i := range factors {
		factors[i] = 1
	}
	if ds.active {
		sum := 0.0
		for _, p := range proposal {
			sum += p
		}
		sendsAtCapacity := make([]float64, len(set))
		for i, pod := range set {
			st := e.pods[pod.Name]
			if st == nil || sum <= 0 {
				continue
			}
			sendsAtCapacity[i] = ds.total * proposal[i] / sum
			f := 1.0
			if st.backlog > 0 && sendsAtCapacity[i] > 0 {
				// What it can serve: from its speed and CPU limit, else at
				// least what it serves, or would be sent at its capacity
				// weight (unless the whole Service is overloaded).
				capRate := max(ds.capRate[i], sendsAtCapacity[i])
				rate := capRate - st.backlog/e.params.DrainTime.Seconds()
				f = rate / sendsAtCapacity[i]
			}
			if ds.hot[i] {
				f = min(f, hotDrain)
			} else if !sig.fromRequests && st.liveDrainOr1() < 1 {
				f = min(f, math.Sqrt(st.liveDrain))
			}
			if math.IsNaN(f) {
				f = 1
			}
			factors[i] = drainFactor(f)
		}
		// What the others can take: the drains up to drainUtil, then a
		// suspect's cut, where it goes below its drain, up to suspectUtil,
		// less what the drains gave them.
		taken := e.fitDrains(set, sig, sendsAtCapacity, factors, nil, drainUtil, 0)
		drainedSends := make([]float64, len(set))
		for i, pod := range set {
			drainedSends[i] = sendsAtCapacity[i] * factors[i]
			if st := e.pods[pod.Name]; st != nil && st.cut && st.suspect(now) && suspectCut < factors[i] {
				cuts[i] = suspectCut / factors[i]
			}
		}
		e.fitDrains(set, sig, drainedSends, cuts, factors, suspectUtil, taken)
	}
	for i, pod := range set {
		st := e.pods[pod.Name]
		if st == nil {
			continue
		}
		f := factors[i]
		if g := drainFactor(f * cuts[i]); cuts[i] > 0 && g < f {
			f = g
			cut = append(cut, pod.Name)
		}
		st.drain = f
		proposal[i] *= f
		if factors[i] < 1 {
			drained = append(drained, pod.Name)
			if st.backlog > worstQ || worst == "" {
				worst, worstQ = pod.Name, st.backlog
			}
		}
	}
	return drained, cut, worst, worstQ
}

// drainFactor clamps a drain factor: at least minDrain, and 1 when the
// drain is too small to be worth a write.
func drainFactor(f float64) float64 {
	f = min(max(f, minDrain), 1)
	if f > negligibleDrain {
		return 1
	}
	return f
}

// fitDrains scales the factors below 1 (each takes sends[i] times 1
// minus its factor off its pod; 0 stands for none) toward 1 until what
// they take fits the room the other pods have below util, less the
// traffic placed on them already. The others are the pods with no factor
// below 1 in factors nor in also (nil for none). It returns the traffic
// the factors take after scaling.
func (e *Engine) fitDrains(set []Pod, sig signals, sends, factors, also []float64, util, placed float64) float64 {
	taking := func(i int) float64 {
		if f := factors[i]; f > 0 && f < 1 {
			return (1 - f) * sends[i]
		}
		return 0
	}
	taken, othersSend, cpu, cores := 0.0, 0.0, 0.0, 0.0
	for i, pod := range set {
		if f := factors[i]; f > 0 && f < 1 {
			taken += taking(i)
			continue
		}
		if also != nil && also[i] > 0 && also[i] < 1 {
			continue
		}
		othersSend += sends[i]
		if c := e.coresOf(pod); sig.pods[i].hasCPU && c > 0 {
			cpu += sig.pods[i].cpu
			cores += c
		}
	}
	use := drainUtil * 0.9 // unknown: assume a little room
	if cores > 0 {
		use = cpu / cores
	}
	room := 0.0
	if use > 0 {
		room = max(0, othersSend*(util/use-1)-placed)
	}
	if taken <= room {
		return taken
	}
	scale := room / taken
	if !(scale >= 0) {
		scale = 0
	}
	taken = 0
	for i := range factors {
		if f := factors[i]; f > 0 && f < 1 {
			factors[i] = drainFactor(1 - (1-f)*scale)
			taken += taking(i)
		}
	}
	return taken
}

// drainForced reports, per pod, whether its weight must be written
// whatever the dead band says: a drain starts, ends, or changes by more
// than the dead band.
func (e *Engine) drainForced(set []Pod) []bool {
	out := make([]bool, len(set))
	for i, pod := range set {
		st := e.pods[pod.Name]
		if st == nil {
			continue
		}
		now, live := st.drainOr1(), st.liveDrainOr1()
		switch {
		case (now < 1) != (live < 1):
			out[i] = true
		case now < 1 && math.Abs(now/live-1) >= e.params.DeadBand:
			out[i] = true
		}
	}
	return out
}

// offCapacity reports whether the pod is drained now or in the reference
// weights.
func (st *podState) offCapacity() bool {
	return st.drainOr1() < 1 || st.liveDrainOr1() < 1
}

func (st *podState) drainOr1() float64 {
	if st.drain > 0 {
		return st.drain
	}
	return 1
}

func (st *podState) liveDrainOr1() float64 {
	if st.liveDrain > 0 {
		return st.liveDrain
	}
	return 1
}

// drainMessage describes the drains and cuts of this cycle.
func (e *Engine) drainMessage(drained, cut []string, worst string, worstQ float64) string {
	msg := ""
	if len(cut) > 0 {
		msg = fmt.Sprintf("; the weight of %s, whose latency rang the alarm alone, cut to %.0f%% of its capacity",
			cut[0], 100*e.pods[cut[0]].drain)
	}
	if len(drained) == 0 {
		return msg
	}
	if worstQ > 0 {
		return msg + fmt.Sprintf("; draining %d pod(s) with a backlog or at their CPU limit (largest backlog: %s, about %.0f requests)",
			len(drained), worst, worstQ)
	}
	return msg + fmt.Sprintf("; draining %d pod(s) at their CPU limit (%s first)", len(drained), worst)
}
