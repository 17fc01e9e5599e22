package weights

import (
	"maps"
	"math"
	"slices"
	"time"
)

// Update runs one cycle through the four stages: observe, estimate, decide,
// publish. pods is the current endpoint set, obs the query result.
func (e *Engine) Update(pods []Pod, obs Observation) Result {
	now := obs.Time
	set := canonicalPods(pods)
	e.start(now)
	e.forgetGone(now, set)
	e.history.prune(now.Add(-e.params.horizon() - time.Second))

	if obs.Err != nil {
		return e.unavailable(now, set, Reason{Code: ReasonQueryFailed, Detail: obs.Err.Error()})
	}
	c := readSignals(set, obs.Signals)
	e.noteDataGaps(now, set, &c)
	if c.withCPU == 0 {
		return e.unavailable(now, set, Reason{Code: ReasonNoData, Pods: c.noData})
	}
	var reasons []Reason
	if e.mode == ModeHolding || e.mode == ModeFallback || e.mode == ModeNoData {
		reasons = append(reasons, Reason{Code: ReasonRecovered})
		e.recoveredAt = now
	}
	e.lastGood = now
	if c.meanCPU < e.params.MinCPU {
		reasons = append(reasons, Reason{Code: ReasonLowLoad, Value: c.meanCPU, Limit: e.params.MinCPU})
		return e.hold(now, set, ModeLowLoad, reasons)
	}

	// Observe.
	noisyCeilings(set, &c, e.coresFloors(set))
	restartCeilings(set, &c, e.calibrateSet(set, nil))
	prior := make([][]float64, len(set))
	for i, pod := range set {
		if st := e.pods[pod.Name]; st != nil {
			prior[i] = st.recentRatios
		}
	}
	for i, d := range readRecentCPU(&c, prior) {
		if !math.IsNaN(d) && !math.IsInf(d, 0) {
			st := e.state(set[i].Name)
			st.recentRatios = appendCapped(st.recentRatios, d, e.params.memory())
		}
	}
	segs := e.segments(now, set)
	cpuWindowsValid := e.appliedSince.IsZero() || !now.Add(-e.params.horizon()).Before(e.appliedSince)
	// A window that reaches back into a spell without data holds the
	// backend's gap: its rates come from the few samples on either side,
	// and neither their misfit nor their move is a measure of anything.
	// An early cycle's readings are not taken for speeds or cores (the
	// estimate step below skips it): the load's move is read between
	// regular cycles only.
	gap := !e.recoveredAt.IsZero() && now.Sub(e.recoveredAt) < e.params.horizon()
	if !gap && !obs.Early {
		c.loadMove = e.loadSpread(now, set, &c)
	}
	readSpeeds(e.params, now, set, &c, segs, cpuWindowsValid)
	readCores(set, &c, e.noise)
	// Traffic follows the weights under ROUND_ROBIN over the engine's own
	// live weights. A caller that does not say which balancer ran is taken
	// to run the operator's default: LEAST_REQUEST until a result is
	// Learned, ROUND_ROBIN after.
	followsWeights := e.followsWeights(obs.Balancer)
	window := make([]float64, len(set))
	for i, r := range c.pods {
		if r.hasRequests {
			window[i] = r.requests
		}
	}
	served, sent := e.recentServed(set, obs, window)
	if !obs.Early {
		if move, n, _ := recentLoadMove(set, obs.Signals, window, 2*e.params.ScrapeInterval, e.params.QueryWindow); n > 0 && !math.IsInf(move, 0) && !math.IsNaN(move) {
			e.loadMoves = appendCapped(e.loadMoves, move, 16) // as latencyRatios
		}
	}
	mem := make([]backlogMemory, len(set))
	rr := e.roundRobinNow(obs)
	for i, pod := range set {
		st := e.pods[pod.Name]
		alone := st.latencyAlone(rr)
		c.pods[i].served, c.pods[i].sent, c.pods[i].alone = served[i], sent[i], alone
		if st != nil {
			mem[i] = backlogMemory{before: st.backlogAt(now.Add(-e.params.QueryWindow), e.params.QueryWindow), latency: st.latency,
				alarmed: func(ratio float64) bool { return st.alarmed(ratio) && st.lagging(served[i], sent[i], alone) }}
		}
	}
	readBacklogs(e.params, set, &c, mem, followsWeights)

	// Estimate. An early cycle sees mostly the windows of the last one:
	// its readings are not new evidence of speed, only of backlogs.
	learnedFrom := 0
	if !obs.Early {
		learnedFrom = e.estimate(set, &c, gap)
		if !e.lastUpdate.IsZero() && now.After(e.lastUpdate) {
			e.gaps = min(e.gaps+1, e.params.memory())
			e.meanCycle += (now.Sub(e.lastUpdate) - e.meanCycle) / time.Duration(e.gaps)
		}
		e.lastUpdate = now
		for i, pod := range set {
			if r := c.pods[i]; r.hasRequests && r.requests > 0 {
				e.state(pod.Name).served = r.requests
			} else if st := e.pods[pod.Name]; st != nil {
				st.served = 0
			}
		}
	}
	models := e.models(set)
	ref := e.reference()
	refShares := shares(set, ref)
	noDataShare := 0.0
	for i, r := range c.pods {
		if !r.hasCPU {
			noDataShare += refShares[i]
		}
	}
	if total := totalLoad(&c, models, noDataShare); total > 0 {
		if obs.Early {
			e.load.m = max(e.load.m, math.Log(total)) // a rising load is not averaged away
		} else {
			e.load.update(math.Log(total), math.Log(total), e.noise*e.noise, 0, e.overlapInflation(), e.params, false, true)
		}
	}
	// What a pod first seen at its CPU limit may borrow as its usual latency (see
	// noteLatency): the most a pod that kept up waits, scaled to the pod's
	// request time where that is longer (latency times requests per
	// CPU-second, over the pod's own). Only with speeds from request rates,
	// which a pod at its limit does not censor, and not while a pod's
	// speed is still its live weight after a restart (calibrate).
	keptUp, keptUpWork := 0.0, 0.0
	borrowable := func(i int) bool {
		st := e.pods[set[i].Name]
		return c.fromRequests && st != nil && !st.calibrate && models[i].known && models[i].v > 0
	}
	for i, r := range c.pods {
		if borrowable(i) && keptUpWith(r, e.pods[set[i].Name]) {
			keptUp = max(keptUp, r.latency)
			keptUpWork = max(keptUpWork, r.latency*models[i].v)
		}
	}
	for i, pod := range set {
		usual := 0.0
		if keptUp > 0 && borrowable(i) {
			usual = max(keptUp, keptUpWork/models[i].v)
		}
		st := e.state(pod.Name)
		r := c.pods[i]
		st.hot = r.saturated
		st.backlog, st.capRate = r.backlog, r.capRate
		st.hotBlind = r.saturated && !c.fromRequests
		if !obs.Early {
			st.backlogs = appendCapped(st.backlogs, backlogPoint{now, r.backlog}, e.params.memory())
		} else {
			// An early cycle follows an alarm: its served share is no
			// sample of the pod's usual one.
			r.sent = 0
		}
		st.noteLatency(r, usual, now, e.params.QueryWindow, e.balancerOr(obs.Balancer))
	}

	// Decide. Where no pod's cores are known nothing relates the load to
	// the capacity: the solver then gives capacity shares, the limit of
	// the promise near full load.
	load := 0.0
	if e.load.known && (len(models) == 0 || models[0].coresKnown) {
		load = math.Exp(e.load.m)
	}
	dp := e.decidePods(set, models, c, refShares, load)
	if cal := e.calibrateSet(set, &c); slices.Contains(cal, true) {
		load = e.calibrateTo(now, set, ref, c, refShares, noDataShare, load, cal)
		models = e.models(set)
		dp = e.decidePods(set, models, c, refShares, load)
		for i, pod := range set {
			if cal[i] {
				e.pods[pod.Name].calibrate = false
			}
		}
	}
	x, held := solveBounds(dp, load)
	proposal := e.params.proposalFrom(now, set, x)

	// Publish.
	// The bar asks whether the gap between the live weights and the
	// targets could be noise, were nothing changed: the null variance is
	// that of a settled estimate (Smoothing of a reading's, the windows'
	// overlap included), not the wider one of a filter that has just
	// restarted on a change the CUSUM or jump test already found; but a
	// speed filter that has only begun counts with its own (see barVar).
	logVar := make([]float64, len(set))
	for i, m := range models {
		logVar[i] = m.barVar
	}
	// How far one standard deviation of the load moves the targets.
	var loadShift []float64
	if load > 0 {
		sd := math.Sqrt(e.load.v * e.overlapInflation())
		x2 := solve(dp, load*math.Exp(sd))
		p2 := e.params.proposalFrom(now, set, x2)
		loadShift = make([]float64, len(set))
		for i := range set {
			if proposal[i] > 0 {
				loadShift[i] = math.Log(p2[i] / proposal[i])
			}
		}
	}
	gain, bar := e.params.judge(set, ref, proposal, dp, held, logVar, loadShift, load)
	fixed := make([]bool, len(set))
	for i, d := range dp {
		fixed[i] = d.fixed
	}
	// The weights a write would send, settled once: measured here, sent
	// below if written. settle bounds its proposal in place.
	bounded := slices.Clone(proposal)
	next, nextChanged := e.params.settle(set, ref, bounded, true, fixed)
	maxMove := offTarget(set, ref, next)
	// Weights within DeadBand of their targets are converged, as the bench
	// and the quality tests count them: after the opt-in's moves the
	// estimates settle over their memory and the targets drift by a few
	// percent as they do, which a write would chase. So a write moves some
	// pod's traffic by at least DeadBand, unless a pod is sent its capacity
	// or more (an infinite gain) or a pod's estimate is following a change
	// the data showed (its target is still moving toward it). The move is
	// measured as convergence is, on the weights the write would send
	// (offTarget): measured on the solver's targets against the live
	// weights instead, a raise of 5.0-5.3% passed it while leaving the
	// live share within 5% of the new one, a write after settling.
	write := gain > bar && (maxMove >= e.params.DeadBand || math.IsInf(gain, 1) || e.followingChange(set))
	if e.unapplied {
		write = write || !maps.Equal(e.last, ref)
	}
	weights, changed := next, nextChanged
	if write {
		proposal = bounded
	} else {
		weights, changed = e.params.settle(set, ref, proposal, false, fixed)
	}
	mode := ModeOptimizing
	if !write {
		mode = ModeSteady
	}
	reasons = append(reasons, e.cycleReasons(set, c, learnedFrom, gain, bar, maxMove, write)...)
	if share := pastCap(models, load); share > 0 {
		reasons = append(reasons, Reason{Code: ReasonPastCap, Value: share, Limit: maxUtilisation})
	}
	if over := e.params.floorOverload(set, proposal, models, dp, load); len(over) > 0 {
		reasons = append(reasons, Reason{Code: ReasonFloorOverload, Pods: over, Limit: e.params.MaxRatio})
	}
	return e.finish(set, mode, weights, changed, reasons)
}

// followingChange reports whether a pod's estimate restarted on a change
// the data showed within the filter's memory: its target is still moving
// toward the change.
func (e *Engine) followingChange(set []Pod) bool {
	for _, pod := range set {
		st := e.pods[pod.Name]
		if st == nil {
			continue
		}
		if (st.speed.changed && st.speed.n < e.params.memory()) || (st.cores.changed && st.cores.n < e.params.memory()) {
			return true
		}
	}
	return false
}

// decidePods models every pod for the solver: its cores and speed, a
// backlog as capacity owed over DrainTime (and no more than it has now), a
// pod without data fixed at the traffic it has.
func (e *Engine) decidePods(set []Pod, models []podModel, c cycleReadings, refShares []float64, load float64) []decidePod {
	dp := make([]decidePod, len(set))
	drain := e.params.DrainTime.Seconds()
	for i, pod := range set {
		m := models[i]
		d := decidePod{c: m.c, v: m.v, upper: math.Inf(1)}
		r := c.pods[i]
		if !r.hasCPU && refShares[i] > 0 {
			// Its traffic as it is: in units of work at a known load, as
			// a share of the total where the load is unknown (see solve).
			d.fixed, d.x = true, refShares[i]
			if load > 0 {
				d.x *= load
			}
		}
		st := e.pods[pod.Name]
		// With request rates a backlog is measured; with CPU alone being
		// at its limit is all that shows a pod behind.
		d.overloaded = st != nil && (st.backlog > 0 || (st.hot && !c.fromRequests))
		if st != nil && st.backlog > 0 && drain > 0 && st.capRate > 0 && !d.fixed {
			owed := min(st.backlog/drain/st.capRate, 1-1/(e.params.MaxRatio*e.params.MaxRatio))
			d.v *= 1 - owed
			if refShares[i] > 0 && load > 0 {
				d.upper = refShares[i] * load
			}
		}
		dp[i] = d
	}
	return dp
}

// calibrateTo takes, after a restart, the capacities that make the live
// weights the solver's answer at the load now measured, and returns that
// load: they are what the engine before this one decided, and taking them
// so means that a restart moves nothing the data does not show. It starts
// from this cycle's readings of the speeds (see estimate). The load
// is measured in the speeds' units (busy cores times speed), so it is
// measured again with every step's speeds: held at the first step's, a
// step that raised every speed would read as a lighter load, which the
// solver leans further to fast pods at, and the steps would find speeds
// unlike the pods' own that the next cycle's readings undo (weights moved
// by up to 280% in the second cycle after a restart). Each step moves a
// pod's speed by the log ratio of its live share to the solver's; near
// full load a share moves in proportion to the speed and one step
// suffices, but below it the solver leans to faster pods and a share
// moves by more (for one core at utilisation u, (1+u)/(2u) times: about 2
// at 30%), so a full step overshoots and the slow pods' speeds swing
// further every step. A pod's step is halved each time its gap changes
// sign, which damps the swing whatever the slope, until every share is the
// live one to a unit of its weight. A pod without a limit has each step
// shared with its cores, within their bounds (see coresShare). Only the
// pods marked in cal move (see calibrateSet: a pod without data this cycle
// waits for its first cycle with data). A pod behind (a backlog or at its
// limit) is left: the solver bounds its traffic, so its speed does not
// set its share. A pod held at the MaxRatio floor throughout keeps its
// reading, moved by the median of the others' moves into their units.
func (e *Engine) calibrateTo(now time.Time, set []Pod, ref map[string]uint32, c cycleReadings, refShares []float64, noDataShare, load float64, cal []bool) float64 {
	step := make([]float64, len(set))
	prev := make([]float64, len(set))
	moved := make([]float64, len(set))  // each pod's log speed moved in all
	stepped := make([]bool, len(set))   // the steps judged its share
	shown := make([]bool, len(set))     // its solved share was above the MaxRatio floor in some round
	shownLast := make([]bool, len(set)) // and in the last
	floor := 1 / (float64(len(set)) * e.params.MaxRatio)
	for i := range step {
		step[i] = 1
	}
	// A bound on the rounds: 9 of the 93 calibrations of the engine's
	// restart tests reach it, and at 20% load in the bench nearly all,
	// their shares by then within 0.1-2.5% of the live ones (0.5% at 20%
	// load), which the publish bar's noise covers.
	for range 64 {
		models := e.models(set)
		if total := totalLoad(&c, models, noDataShare); load > 0 && total > 0 {
			load = total
		}
		dp := e.decidePods(set, models, c, refShares, load)
		ps := normalized(e.params.proposalFrom(now, set, solve(dp, load)))
		done := true
		for i, pod := range set {
			st := e.pods[pod.Name]
			if !cal[i] || st == nil || !st.speed.known || !(refShares[i] > 0) || !(ps[i] > 0) || dp[i].fixed || dp[i].overloaded || !math.IsInf(dp[i].upper, 1) {
				continue
			}
			stepped[i] = true
			gap := math.Log(refShares[i] / ps[i])
			// At the floor (to float rounding: clampRatio sets it
			// exactly, and normalizing errs by ulps, far below the
			// hundredth a weight unit is at the floor), the solved share
			// cannot fall: a live share below it (the live weights'
			// floor rounded to whole units, their mean not exactly the
			// engine's) is no gap a step closes, and stepping on it
			// drifted the speed by up to a factor of 2.5 over the rounds.
			atFloor := ps[i] <= floor*(1+1e-9)
			if atFloor && shown[i] && prev[i] != 0 {
				// Stepped onto the floor from above it: the solved share
				// is flat below the speed at which it reaches the floor,
				// so the share bounds the speed and measures no gap. Taken
				// as a gap of the last one's size, of the sign of a speed
				// too low, the steps bisect for the speed at which the
				// share leaves the floor. Taken as measured, a step that
				// overshot stayed where it landed: below 30% load a share
				// moves by twice the speed or more, a full step overshoots
				// as much, and a pod at the floor was left at a sixth of
				// its speed, which its next reading undid (a write in the
				// second cycle after a restart).
				gap = math.Abs(prev[i])
			}
			shownLast[i] = !atFloor
			shown[i] = shown[i] || !atFloor
			if atFloor && gap <= 0 {
				continue
			}
			if gap*prev[i] < 0 {
				step[i] /= 2
			}
			prev[i] = gap
			if math.Abs(gap) > 1/float64(ref[pod.Name]) {
				done = false
			}
			d := min(max(step[i]*gap, -1), 1)
			if share := e.coresShare(pod, st); share > 0 {
				m := math.Log(clampCores(pod, math.Exp(st.cores.m+share*d)))
				d -= m - st.cores.m
				st.cores.m = m
			}
			st.speed.m += d
			moved[i] += d
		}
		if done {
			break
		}
	}
	// A pod whose share sat at the floor in every round keeps its
	// reading (see estimate), in the readings' units, while the steps put
	// the others in the live weights'. The two units differ by one
	// offset, which the pods whose shares show their speeds measure, each
	// with its own reading's error: the median of their speeds' moves
	// (not their cores': fitScale's units are the speeds'). A pod that
	// ended at the floor after rounds above it has a move that only
	// bounds its speed, and is left out of the median. Left in the
	// readings' units, a floored pod stood apart from the others by that
	// offset, the more the lower the load (the solver leans to fast pods,
	// so their steps are long): after restarts at 20% load, slow pods
	// calibrated at half their speed beside the fast ones, and their next
	// readings read as jumps.
	var offsets []float64
	for i := range set {
		if shownLast[i] { // set only for pods the steps judged
			offsets = append(offsets, moved[i])
		}
	}
	offset := median(offsets)
	for i, pod := range set {
		if stepped[i] && !shown[i] {
			e.pods[pod.Name].speed.m += offset - moved[i]
		}
	}
	// The steps may move every speed alike, which the load follows and
	// the shares do not show; the speeds' units are kept centred (as
	// normalize keeps them each cycle), and the load in them, or the
	// next cycles would read the old units' load against the new units'
	// speeds.
	e.normalize(set)
	if load > 0 {
		if total := totalLoad(&c, e.models(set), noDataShare); total > 0 {
			load = total
		}
		e.load.m = math.Log(load)
	}
	return load
}

// calibrateSet marks the pods still to be calibrated after a restart:
// with c, those with a speed reading this cycle (estimate took it as their
// starting speed); without, all of them. nil when there are none, as on
// every cycle once each pod has had one with data.
func (e *Engine) calibrateSet(set []Pod, c *cycleReadings) []bool {
	var out []bool
	for i, pod := range set {
		st := e.pods[pod.Name]
		if st != nil && st.calibrate && (c == nil || c.pods[i].speed.ok) {
			if out == nil {
				out = make([]bool, len(set))
			}
			out[i] = true
		}
	}
	return out
}

// coresShare is the share of a calibration step that goes to the pod's
// cores rather than its speed: a pod's capacity is its speed times its
// cores, and with independent errors the likeliest correction of a
// product moves each factor in proportion to its variance. 0 for a pod
// whose cores are its limit or not yet read on its node. A speed is read to
// the speed readings' noise every cycle (1-2%); the cores of a pod without
// a limit rest, after a restart, on one reading of its queue or node,
// whose noise (Snapshot.CoresNoise) the calm tests measure at 5-18% with
// ±20% on the latency or the node's CPU. A step given to the wrong factor
// is undone by that factor's next reading: a speed moved in place of a
// cores reading 12% low came out 58% high (at 30% load the solver leans
// to fast pods, so a share moves by more than the capacity behind it),
// and the next speed reading moved weights by up to 711% (restarts of the
// calm tests' Service). The cores move only within the pod's bounds (its
// CPU request and node size), past which they would not change its share;
// the rest of a step goes to the speed.
func (e *Engine) coresShare(pod Pod, st *podState) float64 {
	if knownCores(pod) || !st.cores.known || st.coresNode != pod.Node {
		return 0
	}
	vc, vs := e.coresReadingVar(st), e.noise*e.noise
	return vc / (vc + vs)
}

// totalLoad is the Service's offered work in the speeds of models (busy
// cores times speed per core): what the pods with data did, scaled up by
// the reference share of those without; 0 when nothing measures it (or
// the figure is not finite: the load's filter would keep a NaN for good).
func totalLoad(c *cycleReadings, models []podModel, noDataShare float64) float64 {
	perCore := make([]float64, len(models))
	for i, m := range models {
		perCore[i] = m.v
	}
	if seen := offeredLoad(c, perCore); seen > 0 && noDataShare < 1 {
		if total := seen / (1 - noDataShare); !math.IsInf(total, 0) {
			return total
		}
	}
	return 0
}

// normalized returns xs over their sum (unchanged when it is not
// positive).
func normalized(xs []float64) []float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	if sum > 0 {
		for i := range xs {
			xs[i] /= sum
		}
	}
	return xs
}

// shares returns each pod's share of w (0 for pods not in it).
func shares(set []Pod, w map[string]uint32) []float64 {
	out := make([]float64, len(set))
	sum := 0.0
	for _, pod := range set {
		sum += float64(w[pod.Name])
	}
	if sum > 0 {
		for i, pod := range set {
			out[i] = float64(w[pod.Name]) / sum
		}
	}
	return out
}

// segments returns the timeline as the observation at now sees it; before
// anything was applied (dry run) Envoy spreads the traffic evenly.
func (e *Engine) segments(now time.Time, set []Pod) []segment {
	if len(e.history.epochs) == 0 {
		virtual := timeline{}
		virtual.reset(now, equalOver(set))
		return virtual.segmentsSince(now, -e.params.horizon().Seconds())
	}
	return e.history.segmentsSince(now, -e.params.horizon().Seconds())
}

// unavailable handles a cycle without usable data: hold the weights until
// Expiry has passed since the last good observation, then fall back to
// equal weights, which are right on average and wrong by a known amount.
func (e *Engine) unavailable(now time.Time, set []Pod, why Reason) Result {
	mode := ModeHolding
	if why.Code == ReasonNoData {
		mode = ModeNoData
	}
	down := now.Sub(e.lastGood)
	if down <= e.params.Expiry {
		why.Until = e.params.Expiry - down
		return e.hold(now, set, mode, []Reason{why})
	}
	reasons := []Reason{why, {Code: ReasonExpired, Until: down}}
	// Equal weights at once: no step bound holds a fallback back.
	w, _ := e.params.settle(set, nil, e.params.proposalFrom(now, set, nil), true, nil)
	return e.finish(set, ModeFallback, w, !maps.Equal(w, e.reference()), reasons)
}

// hold keeps the live weights; pods that joined get their estimate's.
func (e *Engine) hold(now time.Time, set []Pod, mode Mode, reasons []Reason) Result {
	w, changed := e.params.settle(set, e.reference(), e.holdProposal(now, set), false, nil)
	return e.finish(set, mode, w, changed, reasons)
}

// finish records the weights and builds the result.
func (e *Engine) finish(set []Pod, mode Mode, weights map[string]uint32, changed bool, reasons []Reason) Result {
	models := e.models(set)
	learned, doubtful := e.learned(set, weights, mode, models)
	e.unapplied = changed && !maps.Equal(weights, e.reference())
	e.mode, e.last, e.lastLearned, e.lastDoubtful = mode, weights, learned, doubtful
	caps := make(map[string]float64, len(set))
	mean := totalCapacity(models) / float64(max(len(models), 1))
	for i, pod := range set {
		caps[pod.Name] = models[i].c * models[i].v / mean
	}
	unlearned := 0
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.blind {
			unlearned++
		}
	}
	return Result{Weights: weights, Changed: changed, Mode: mode, Capacity: caps, Learned: learned, Doubtful: doubtful,
		Unlearned: unlearned, Reasons: reasons, Message: render(reasons)}
}

// learned reports Result.Learned: the pods whose capacity's standard
// deviation is within the dead band (the estimate is as good as a write
// is worth), or within the readings' noise where that is larger, carry
// all the traffic but what the cap's headroom could absorb
// (1-maxUtilisation: were the rest misplaced entirely, the other pods would
// take it within the room the cap keeps on them; the larger of the unsure
// pods' share of the live and of the new weights), and no pod has a
// queue that weights would keep feeding: a backlog, or, with CPU alone,
// which measures no backlog, being at its limit; nor an overload CPU
// alone cannot show (blind). With request rates a pod at its limit whose
// queue does not grow is merely busy: the cap runs pods at up to
// maxUtilisation, and their CPU reaches their limit over a window now and
// then by chance (the same rule as decidePods').
//
// doubtful reports that only the estimates' confidence keeps the result
// from Learned: no pod is behind or blind, and the pods that are unsure
// all have estimates from data, merely wider than the dead band.
func (e *Engine) learned(set []Pod, w map[string]uint32, mode Mode, models []podModel) (learned, doubtful bool) {
	switch mode {
	case ModeFallback, ModeNoData:
		return false, false
	}
	live, next := shares(set, e.reference()), shares(set, w)
	unsure, doubt := 0.0, 0.0
	for i, pod := range set {
		st := e.pods[pod.Name]
		if st != nil && (st.hotBlind || st.backlog > 0 || st.blind) {
			return false, false
		}
		if st != nil && st.speed.known && (st.fromData || st.speed.v < 1) && math.Sqrt(models[i].logVar) <= max(e.params.DeadBand, e.noise) {
			continue
		}
		share := max(live[i], next[i])
		unsure += share
		if st != nil && st.speed.known && st.fromData {
			doubt += share
		}
	}
	learned = unsure <= 1-maxUtilisation
	return learned, !learned && unsure-doubt <= 1-maxUtilisation
}

// cycleReasons explains an optimizing cycle.
func (e *Engine) cycleReasons(set []Pod, c cycleReadings, learnedFrom int, gain, bar, maxMove float64, write bool) []Reason {
	var out []Reason
	if len(c.noData) > 0 {
		out = append(out, Reason{Code: ReasonPartialData, Pods: c.noData})
	}
	if len(c.newData) > 0 {
		out = append(out, Reason{Code: ReasonNewData, Pods: c.newData})
	}
	code := ReasonSteady
	if write {
		code = ReasonMoved
	}
	source := SpeedsFromCPU
	if c.fromRequests {
		source = SpeedsFromRequests
	}
	r := Reason{Code: code, Value: maxMove, Gain: gain, Bar: bar, Count: learnedFrom, Of: len(set), Detail: source}
	if !write && gain > bar {
		r.Limit = e.params.DeadBand // held by the dead band, not by the bar
	}
	out = append(out, r)
	var backlog, hot, blind []string
	for i, pod := range set {
		st := e.pods[pod.Name]
		if st == nil {
			continue
		}
		if st.backlog > 0 {
			backlog = append(backlog, pod.Name)
		}
		if c.pods[i].saturated {
			hot = append(hot, pod.Name)
		}
		if st.blind {
			blind = append(blind, pod.Name)
		}
	}
	if len(backlog) > 0 {
		out = append(out, Reason{Code: ReasonBacklog, Pods: backlog})
	}
	if len(hot) > 0 {
		out = append(out, Reason{Code: ReasonSaturated, Pods: hot})
	}
	if len(blind) > 0 {
		out = append(out, Reason{Code: ReasonCPUOnly, Pods: blind})
	}
	return out
}

// pastCap returns the load as a share of the pods' estimated capacity when
// it is past maxUtilisation, 0 otherwise (or where the load is unknown):
// then no weights keep every pod below the cap, and the solver's capacity
// shares run each one above it.
func pastCap(models []podModel, load float64) float64 {
	capacity := totalCapacity(models)
	if !(load > 0) || !(capacity > 0) || load < maxUtilisation*capacity {
		return 0
	}
	return load / capacity
}

// totalCapacity is the sum of the models' capacities (cores times speed).
func totalCapacity(models []podModel) float64 {
	sum := 0.0
	for _, m := range models {
		sum += m.c * m.v
	}
	return sum
}
