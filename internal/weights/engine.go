package weights

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"time"
)

// Engine holds what has been learned between cycles. It is not safe for
// concurrent use: each optimizer owns one.
type Engine struct {
	params Params

	// history holds the weights Envoy had recently (see timeline).
	history timeline
	// live is what Envoy has now, as told by Seed or Applied. Until either is
	// called (dry run) the last computed weights stand in for it.
	live      map[string]uint32
	liveAt    time.Time
	liveKnown bool
	last      map[string]uint32
	lastAt    time.Time

	pods    map[string]*podState
	classes map[string]float64 // hardware class -> capacity per core
	// noise is the typical error of one capacity observation (log scale),
	// learned from the data, so that surprises are judged against it.
	noise       float64
	noiseCycles int // cycles that measured noise, up to a cap

	// unapplied: the last weights the engine computed differ from the live
	// ones and were not applied since (dry run, or a failed write). Drains
	// act on live weights only.
	unapplied bool

	// requestsLately counts down the cycles, from requestsGrace, since the
	// last one with data learned from request rates (lastFromRequests):
	// unlike cores are run at unlike utilisations on request rates (see
	// targets), and one window of patchy request metrics must not take
	// that away and give it back. lastWithLatency: the last cycle had
	// latency data.
	requestsLately  int
	lastWithLatency bool
	// lastLearned is the Learned of the last result: false means the
	// operator runs LEAST_REQUEST, where traffic does not follow weights.
	lastLearned bool
	// leastRequestUntil is when the operator last went from
	// LEAST_REQUEST back to the weights (the first Learned result after
	// one that was not): a query window reaching back before it holds
	// time under LEAST_REQUEST.
	leastRequestUntil time.Time
	// appliedSince is when the engine's weights first became live (Applied
	// or Seed); zero before. Before it the Service ran on whatever it had
	// (Istio's LEAST_REQUEST over equal weights, as a rule), whose traffic
	// shares no weight tells, so CPU alone measures no speed over it.
	appliedSince time.Time

	// offered is the load the pods served at the last cycle with data, in
	// busy cores times speed per core (see split.go); 0 when unknown.
	offered float64
	// splitLoad is the load the latency split is computed for this cycle,
	// 0 when it is not to be used (see targets).
	splitLoad float64

	started    bool
	lastGood   time.Time // last observation with data; starts the expiry clock
	lastUpdate time.Time // time of the previous cycle with data
	cycle      time.Duration
	mode       Mode
}

// podState is what the engine believes about one pod.
type podState struct {
	// capacity is the pod's speed per core, in relative units (the
	// geometric mean over the current pods with estimates is 1).
	capacity float64
	// known: capacity holds an estimate, from data or a seed.
	known bool
	// fromData: the estimate came from an observation, not only a seed.
	fromData bool
	// measurements counts the sharp observations (steady weights over the
	// whole window, pod not saturated) averaged into capacity since it was
	// last reset. Bounds and blurred views move the estimate but do not
	// count, so the first sharp observation after them is taken whole.
	measurements int
	// driftUp and driftDown accumulate evidence (in noise units) that the
	// observations sit persistently above or below the estimate: a CUSUM,
	// which notices a real change of a few noise levels within a few
	// cycles, while noise alone almost never gets that far.
	driftUp, driftDown float64
	// publishedGain is the gain of the estimate when the pod's weight was
	// last computed from it (1: rough, never published); see moveBands.
	publishedGain float64
	// restartedAt is when the estimate last restarted from a surprising
	// observation (see fold); zero if never.
	restartedAt     time.Time
	seen            time.Time // last time the pod was in the endpoint set
	saturatedAt     time.Time // last cycle the pod used all of its Cores
	saturatedCycles int       // consecutive cycles before that one it did too

	// backlog is the estimated number of requests queued at the pod, from
	// request rates (see drain.go), and backlogs its recent history.
	backlog  float64
	backlogs []backlogPoint
	// cores estimates the CPU a pod without a limit can use (see
	// cores.go), 0 when none; coresMeasured counts the observations in it.
	cores         float64
	coresMeasured int
	// ceiling averages the CPU the pod could have used (its own plus its
	// share of its node's idle CPU) over cycles, 0 when unknown; ceilingN
	// counts the observations in it, ceilingRatios are their last
	// distances from it (log scale, see foldCeiling), and ceilingAt is the
	// last cycle that observed it.
	ceiling       float64
	ceilingN      int
	ceilingRatios []float64
	ceilingAt     time.Time
	ceilingNode   string // the Pod.Node the ceiling was observed on
	// blind: at the last cycle with data the engine ran on CPU alone and
	// nothing showed the pod's cores (see markBlind).
	blind bool
	// recentRatios are the last cycles' |log(recent CPU / window CPU)|
	// while the pod was not at its limit (see judgeRecent).
	recentRatios []float64

	// hot: at the last cycle the pod's CPU was at its Cores limit.
	hot bool
	// latency is the latency the last cycle with data knew of for the
	// pod, 0 when it had none; latencyRatios are the last cycles'
	// |log(recent latency / window latency)| while it kept up (see Alarm
	// and noteLatency).
	latency       float64
	latencyRatios []float64
	// suspectUntil: a cycle found the pod's latency risen past the alarm
	// from suspectLatency; until then (one query window and scrape later)
	// the windows predate the change, and unless its latency falls back
	// Learned stays false (see noteSuspects).
	suspectUntil   time.Time
	suspectLatency float64
	// cut: the alarm that started the pod's spell cut its weight by
	// suspectCut; it applies while the pod is a suspect.
	cut bool
	// drain is the factor (below 1) the pod's weight is drained by this
	// cycle, liveDrain the one in the reference weights; 0 means none.
	drain, liveDrain float64
}

const (
	// initialNoise is the assumed observation noise before any is measured.
	initialNoise = 0.01
	// maxClasses bounds the hardware classes remembered.
	maxClasses = 1024
	// maxMeasurements caps the counter; beyond 1/Smoothing it no longer matters.
	maxMeasurements = 1 << 20
)

// New returns an engine with parameters p; invalid fields take their
// defaults (check p.Validate() to report them).
func New(p Params) *Engine {
	return &Engine{
		params:  p.sanitized(),
		pods:    map[string]*podState{},
		classes: map[string]float64{},
		noise:   initialNoise,
	}
}

// SetParams changes the parameters; what was learned is kept. Invalid
// fields take their defaults.
func (e *Engine) SetParams(p Params) { e.params = p.sanitized() }

// Seed records weights that are already live (read from the ServiceEntry
// when the manager restarts), so nothing learned is lost: they are taken as
// the pods' capacities until observations say otherwise, and as the weights
// Envoy has held for as long as any query can see. (Seed knows no Cores:
// the weights are taken as capacities of pods of equal size; the first
// observations correct that.)
func (e *Engine) Seed(now time.Time, w map[string]uint32) {
	e.start(now)
	clean := cleanWeights(w)
	e.history.reset(now, clean)
	e.live, e.liveAt, e.liveKnown = clean, now, true
	e.unapplied = false
	if e.appliedSince.IsZero() {
		e.appliedSince = now.Add(-e.params.horizon())
	}
	for _, st := range e.pods {
		st.drain, st.liveDrain = 0, 0
	}

	// Express the seeded weights in the units of what is already known.
	names := sortedNames(clean)
	var ratios []float64
	for _, name := range names {
		if st := e.pods[name]; st != nil && st.known {
			ratios = append(ratios, st.capacity/float64(clean[name]))
		}
	}
	unit := median(ratios)
	if len(ratios) == 0 {
		logSum := 0.0
		for _, name := range names {
			logSum += math.Log(float64(clean[name]))
		}
		unit = 1 / math.Exp(logSum/float64(max(len(names), 1)))
	}
	for _, name := range names {
		st := e.state(name)
		st.seen = now
		if !st.known {
			st.capacity = clampCapacity(float64(clean[name]) * unit)
			st.known = true
		}
	}
}

// Applied records that weights w became live at now; the caller calls it
// after each successful write. Capacity estimates from CPU alone depend on
// the weights each pod really held over the query window.
func (e *Engine) Applied(now time.Time, w map[string]uint32) {
	e.start(now)
	clean := cleanWeights(w)
	e.history.record(now, clean, e.mergeBucket())
	e.history.prune(now.Add(-e.params.horizon() - time.Second))
	e.live, e.liveAt, e.liveKnown = clean, now, true
	if e.appliedSince.IsZero() {
		e.appliedSince = now
	}
	if e.unapplied && sameWeights(clean, e.last) {
		e.unapplied = false
	}
}

// sameWeights reports whether a and b hold the same weights for the same pods.
func sameWeights(a, b map[string]uint32) bool { return maps.Equal(a, b) }

// mergeBucket is the finest time resolution the timeline keeps: fine enough
// to place the writes of a cycle, coarse enough to stay small.
func (e *Engine) mergeBucket() time.Duration {
	return max(time.Second, e.params.horizon()/128)
}

// Weights returns weights for a (possibly changed) set of pods without a
// new observation, for the endpoint mirror: pods that stay keep their
// weight (the last computed one while it is not applied yet: what the
// caller should write), new pods get their initial weight (the estimate for their
// hardware class when pooling, else the median capacity, scaled by slow
// start). In fallback every pod gets the same weight.
func (e *Engine) Weights(now time.Time, pods []Pod) map[string]uint32 {
	set := canonicalPods(pods)
	if e.mode == ModeFallback {
		w, _, _, _ := e.settle(now, set, e.equalProposal(now, set), false, moveRules{})
		return w
	}
	w, _, _, _ := e.settle(now, set, e.holdProposal(now, set, false), false, moveRules{})
	if e.unapplied {
		// The last cycle's weights are not live yet: they are what the
		// caller should write for the pods that stay.
		for name := range w {
			if t, ok := e.last[name]; ok {
				w[name] = t
			}
		}
	}
	return w
}

// Update runs one cycle: pods is the current endpoint set, obs the query
// result.
func (e *Engine) Update(pods []Pod, obs Observation) Result {
	now := obs.Time
	set := canonicalPods(pods)
	e.start(now)
	e.forgetGone(now, set)
	e.history.prune(now.Add(-e.params.horizon() - time.Second))

	if obs.Err != nil {
		return e.unavailable(now, set, ModeHolding, fmt.Sprintf("Metrics query failed: %v", obs.Err))
	}
	sig := readSignals(set, obs.Signals)
	if sig.withCPU == 0 {
		return e.unavailable(now, set, ModeNoData,
			fmt.Sprintf("The query returned no CPU data for any of the %d pods", len(set)))
	}
	recovered := e.mode == ModeHolding || e.mode == ModeFallback || e.mode == ModeNoData
	e.lastGood = now
	if sig.meanCPU < e.params.MinCPU {
		msg := fmt.Sprintf("Low load: the pods use %.3f cores on average, below the %.3f needed to learn from; weights held",
			sig.meanCPU, e.params.MinCPU)
		return e.finish(now, set, ModeLowLoad, e.holdProposal(now, set, true), false, msg).Result
	}

	e.smoothCeilings(now, set, sig)
	e.markBlind(set, sig)
	e.judgeRecent(set, sig)
	shares := e.windowShares(now, set)
	learnedFrom := e.learn(now, set, sig, shares, obs.Early)
	if sig.fromRequests {
		e.requestsLately = requestsGrace
	} else {
		e.requestsLately = max(0, e.requestsLately-1)
	}
	e.lastWithLatency = sig.withLatency > 0
	e.estimateCores(now, set, sig, shares)
	load := e.offeredLoad(set, sig)
	if load > 0 && e.offered > 0 {
		// Averaged, so that the noise of one window does not move weights.
		e.offered = math.Exp((1-offeredGain)*math.Log(e.offered) + offeredGain*math.Log(load))
	} else {
		e.offered = load
	}
	// The latency split is for a Service with room to spare: by the
	// average and by this window (a load that rises is not averaged
	// away), and with no pod at its limit.
	e.splitLoad = max(e.offered, load)
	if slices.ContainsFunc(sig.pods, podSignal.saturated) {
		e.splitLoad = 0
	}
	ds := e.trackBacklogs(now, set, sig, shares)
	if !obs.Early {
		if !e.lastUpdate.IsZero() && now.After(e.lastUpdate) {
			e.cycle = now.Sub(e.lastUpdate)
		}
		e.lastUpdate = now
	}
	suspects := e.noteSuspects(now, set, obs)
	proposal := e.capacityProposal(now, set)
	drained, cut, worst, worstQ := e.drainProposal(now, set, sig, ds, proposal)
	for i, pod := range set {
		st := e.state(pod.Name)
		st.hot = ds.hot[i]
		st.noteLatency(sig.pods[i])
	}
	res := e.finish(now, set, ModeOptimizing, proposal, true, "")
	source := "CPU and the weights held"
	if sig.fromRequests {
		source = "requests per CPU-second"
	}
	prefix := ""
	if recovered {
		prefix = "Metrics are back. "
	}
	if res.Mode == ModeSteady {
		band := fmt.Sprintf("%.3g%% dead band", 100*e.params.DeadBand)
		if rho := e.serviceLoad(set); loadNarrowing(rho) < 1 && e.params.DeadBand > 0 {
			band = fmt.Sprintf("%.3g%% dead band (%.3g%% narrowed at %.0f%% load)", 100*e.params.DeadBand*loadNarrowing(rho), 100*e.params.DeadBand, 100*rho)
		}
		res.Message = fmt.Sprintf("%sSteady: the largest gap to a target, %.1f%%, is inside the %s plus measured noise; learned from %d of %d pods using %s",
			prefix, 100*res.maxMove, band, learnedFrom, len(set), source)
	} else {
		res.Message = fmt.Sprintf("%sOptimizing: weights moved by up to %.1f%%; learned from %d of %d pods using %s",
			prefix, 100*res.maxMove, learnedFrom, len(set), source)
	}
	res.Message += e.drainMessage(drained, cut, worst, worstQ)
	res.Message += e.suspectMessage(now, set, suspects)
	if res.Unlearned > 0 {
		res.Message += fmt.Sprintf("; %d pod(s) without a CPU limit or node CPU data are weighted by their guessed cores, not learned from CPU alone, and LEAST_REQUEST is kept", res.Unlearned)
	}
	return res.Result
}

// unavailable handles a cycle without usable data: hold the weights until
// Expiry has passed since the last good observation, then fall back to
// equal weights, which are right on average and wrong by a known amount.
func (e *Engine) unavailable(now time.Time, set []Pod, mode Mode, reason string) Result {
	down := now.Sub(e.lastGood)
	if down <= e.params.Expiry {
		msg := fmt.Sprintf("%s; holding the last weights, equal weights in %v unless data returns",
			reason, (e.params.Expiry - down).Round(time.Second))
		return e.finish(now, set, mode, e.holdProposal(now, set, true), false, msg).Result
	}
	msg := fmt.Sprintf("%s; no usable data for %v, longer than the %v expiry: equal weights",
		reason, down.Round(time.Second), e.params.Expiry)
	return e.finish(now, set, ModeFallback, e.equalProposal(now, set), false, msg).Result
}

// outcome is a Result plus what the messages need.
type outcome struct {
	Result
	maxMove float64
}

// finish turns a proposal into the published weights and remembers them.
func (e *Engine) finish(now time.Time, set []Pod, mode Mode, proposal []float64, stepBound bool, msg string) outcome {
	var rules moveRules
	if mode == ModeOptimizing {
		rules = e.moveRules(set)
	} else {
		// Without fresh data no drain is started or kept: holdProposal
		// gives drained pods their capacity weight back.
		for _, pod := range set {
			if st := e.pods[pod.Name]; st != nil {
				st.drain = 0
			}
		}
		rules.offCapacity = e.offCapacity(set)
		// Update writes an optimizing cycle's message itself, with the
		// suspects it just marked; here the spell still running is named.
		msg += e.suspectMessage(now, set, nil)
	}
	weights, changed, moved, maxMove := e.settle(now, set, proposal, stepBound, rules)
	if mode == ModeOptimizing {
		e.notePublished(set, moved)
	}
	if moved {
		for _, pod := range set {
			if st := e.pods[pod.Name]; st != nil {
				st.liveDrain = st.drain
			}
		}
	}
	if mode == ModeOptimizing && !moved {
		mode = ModeSteady
	}
	ref, _ := e.reference()
	learned := e.learned(now, set, weights, mode)
	if learned && !e.lastLearned {
		e.leastRequestUntil = now
	}
	e.lastLearned = learned
	e.unapplied = changed && !sameWeights(weights, ref)
	e.mode = mode
	e.last, e.lastAt = weights, now
	return outcome{
		Result: Result{
			Weights:   weights,
			Changed:   changed,
			Mode:      mode,
			Capacity:  e.relativeCapacities(set),
			Message:   msg,
			Learned:   learned,
			Unlearned: e.unlearned(set),
		},
		maxMove: maxMove,
	}
}

// start begins the expiry clock at the first thing the engine hears.
func (e *Engine) start(now time.Time) {
	if !e.started {
		e.started = true
		e.lastGood = now
	}
}

// state returns the pod's state, creating an empty one.
func (e *Engine) state(name string) *podState {
	st := e.pods[name]
	if st == nil {
		st = &podState{publishedGain: 1}
		e.pods[name] = st
	}
	return st
}

// forgetGone drops what was learned about pods that left the set longer
// than Expiry ago; a pod that only flapped out of readiness keeps it.
func (e *Engine) forgetGone(now time.Time, set []Pod) {
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil {
			st.seen = now
		}
	}
	forgetAfter := max(e.params.Expiry, e.params.horizon())
	for name, st := range e.pods {
		if now.Sub(st.seen) > forgetAfter {
			delete(e.pods, name)
		}
	}
}

// reference is what the weights are compared against: the live weights,
// or in dry run (nothing ever applied) the last computed ones.
func (e *Engine) reference() (map[string]uint32, time.Time) {
	if e.liveKnown {
		return e.live, e.liveAt
	}
	return e.last, e.lastAt
}

// canonicalPods sorts pods by name and drops duplicate names, keeping one
// chosen by content, so that the result never depends on input order.
func canonicalPods(pods []Pod) []Pod {
	set := slices.Clone(pods)
	slices.SortFunc(set, func(a, b Pod) int {
		return cmp.Or(
			cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.Locality, b.Locality),
			cmp.Compare(a.HardwareClass, b.HardwareClass),
			a.ReadySince.Compare(b.ReadySince),
			cmp.Compare(a.Cores, b.Cores),
			cmp.Compare(a.CPURequest, b.CPURequest),
			cmp.Compare(a.NodeCores, b.NodeCores),
			cmp.Compare(a.Node, b.Node),
		)
	})
	return slices.CompactFunc(set, func(a, b Pod) bool { return a.Name == b.Name })
}

// cleanWeights copies w, raising zeros to 1 (istiod sends weight 0 as 1).
func cleanWeights(w map[string]uint32) map[string]uint32 {
	out := make(map[string]uint32, len(w))
	for name, v := range w {
		out[name] = max(v, 1)
	}
	return out
}

// relativeCapacities reports each pod's capacity estimate, mean 1.
func (e *Engine) relativeCapacities(set []Pod) map[string]float64 {
	caps := e.capacities(set)
	out := make(map[string]float64, len(set))
	mean := 0.0
	for _, c := range caps {
		mean += c
	}
	mean /= float64(max(len(caps), 1))
	for i, pod := range set {
		out[pod.Name] = caps[i] / mean
	}
	return out
}

// median of xs (0 for none); xs is reordered.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// lastFromRequests reports whether the last cycle with data learned the
// pods' capacities from request rates.
func (e *Engine) lastFromRequests() bool { return e.requestsLately == requestsGrace }
