package weights

import (
	"cmp"
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
	live map[string]uint32
	last map[string]uint32
	// unapplied: the last weights computed differ from the live ones and
	// were not applied since (dry run, or a failed write).
	unapplied bool
	// appliedSince is when the engine's weights first became live (Applied
	// or Seed); zero before. Before it the Service ran on whatever it had,
	// whose traffic shares no weight tells, so CPU alone reads no speed
	// over it.
	appliedSince time.Time

	pods    map[string]*podState
	classes map[string]float64 // hardware class -> log speed per core
	// noise is the standard deviation of one speed reading (log scale),
	// measured from the residuals; noiseCycles counts the cycles in it.
	noise       float64
	noiseCycles int
	// loadMoves: the last log(recent/window) of the Service's request
	// rate at the regular cycles (see steadyLoad).
	loadMoves []float64
	// unmeasured counts the cycles since the noise was last measured.
	unmeasured int
	// lastReads: each pod's speed reading (the middle of its range, raw
	// log units) at the last regular cycle that read it (see noteSteps).
	lastReads map[string]float64
	// coresNoise is the typical noise of a cores reading (log scale) the
	// engine before this one measured (Snapshot.CoresNoise), for a pod
	// whose own readings have not yet measured it, and coresNoiseMax the
	// largest (Snapshot.CoresNoiseMax); 0 without one.
	coresNoise, coresNoiseMax float64
	// load is the offered work (busy cores times speed per core), filtered.
	load filter

	started     bool
	lastGood    time.Time // last observation with data; starts the expiry clock
	recoveredAt time.Time // first observation with data after a spell without
	// noDataAt: the last cycle, within a horizon, that found a pod
	// without CPU data (see noteDataGaps).
	noDataAt   map[string]time.Time
	lastUpdate time.Time // last regular cycle with data
	// meanCycle is the mean gap between regular cycles over the
	// estimates' memory (gaps counts them, up to it): what Snapshot
	// persists and the windows' overlap is taken from (overlapInflation).
	// One gap moves with the policy's jitter (up to a scrape interval
	// between two gaps); the mean hardly does.
	meanCycle   time.Duration
	gaps        int
	mode        Mode
	lastLearned bool
	// lastDoubtful: the last result was Result.Doubtful.
	lastDoubtful bool
}

// podState is what the engine believes about one pod.
type podState struct {
	speed filter // log speed per core, relative
	// fromData: the speed came from a reading, not only a seed.
	fromData bool
	// cores: log cores of a pod without a limit, read on coresNode.
	cores          filter
	coresResiduals []float64 // the readings' distances from the estimate
	// ceilingResiduals: the node ceiling's distances from the estimate,
	// each cycle it is read, whether or not it was the cycle's reading.
	ceilingResiduals []float64
	coresNode        string
	// coresR: the variance of a cores reading when the filter last took
	// one; the estimate's variance is restated in the next one's.
	coresR float64
	// speedR: the same for the speed filter, the readings' noise (see
	// restate).
	speedR float64
	// calibrate: the pod's live weight came from an engine that ran
	// before (SeedSettled); its first cycle with a speed reading takes
	// the capacity that makes that weight the optimum (see calibrateTo).
	// A pod without data in the first cycle after a restart waits for
	// its own: calibrated with the others, its seeded speed (the live
	// weight itself) was read as news by its first reading.
	calibrate bool
	// coresSettled: the first cores reading starts a settled estimate,
	// not a fresh one (SeedSettled: the engine before had learned it).
	coresSettled bool
	// blind: CPU alone cannot show this pod's overload (see markBlind).
	blind bool
	seen  time.Time
	// backlog is the requests queued beyond the pod's usual queue at the
	// last cycle, backlogs its history; capRate the requests per second it
	// can serve.
	backlog  float64
	backlogs []backlogPoint
	capRate  float64
	// hot: at the last cycle the pod used all the CPU it could; hotBlind:
	// and there were no request rates to measure its queue by.
	hot, hotBlind bool
	// latency is the pod's usual latency, its window's at the last cycle
	// in which it kept up (see noteLatency), 0 = none; latencyRatios the
	// pod's last log(recent/window) while it kept up (see Alarm).
	latency       float64
	latencyRatios []float64
	// latencyUnder is the balancer over the query window in which latency
	// was read (see latencyAlone).
	latencyUnder Balancer
	// servedRatios: the pod's last log(served share) over the last two
	// scrape intervals, at the cycles in which it kept up (see lagging).
	servedRatios []float64
	// provisional: latency is not yet the pod's usual (see noteLatency):
	// it was first seen at its CPU limit, and until this instant, or until
	// it is below its limit, a lower reference borrowed from the pods that
	// kept up may stand for it. Zero: latency is the pod's own. peak: the
	// highest latency read since, which set the instant.
	provisional time.Time
	peak        float64
	// recentRatios: the pod's last log(recent CPU / window CPU) while
	// below its limit (see readRecentCPU).
	recentRatios []float64
	// readSteps: the pod's last moves of its speed reading between regular
	// cycles, less the median pod's move (see noteSteps).
	readSteps []float64
	// served is the pod's request rate at the last regular cycle, 0 =
	// none: what loadSpread compares this cycle's with.
	served float64
}

// backlogPoint is a pod's backlog (requests) at a cycle.
type backlogPoint struct {
	at time.Time
	q  float64
}

// backlogAt returns the backlog from the cycle nearest before at (with an
// eighth of a window of slack for jitter), 0 when none within a window.
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

// New returns an engine with parameters p; invalid fields take their
// defaults (check p.Validate() to report them).
func New(p Params) *Engine {
	return &Engine{params: p.sanitized(), pods: map[string]*podState{}, classes: map[string]float64{}, noDataAt: map[string]time.Time{}, noise: minNoise()}
}

// SetParams changes the parameters; what was learned is kept.
func (e *Engine) SetParams(p Params) { e.params = p.sanitized() }

// Seed records weights that are already live (read from the ServiceEntry
// when the manager restarts): they are taken as the pods' capacities until
// readings say otherwise (with the variance of knowing nothing, so the
// first reading replaces them), and as the weights Envoy has held for as
// long as any query can see.
func (e *Engine) Seed(now time.Time, w map[string]uint32) {
	e.seed(now, w, 1)
}

func (e *Engine) seed(now time.Time, w map[string]uint32, variance float64) {
	e.start(now)
	clean := cleanWeights(w)
	e.history.reset(now, clean)
	e.live = clean
	e.unapplied = false
	if e.appliedSince.IsZero() {
		e.appliedSince = now.Add(-e.params.horizon())
	}
	names := sortedNames(clean)
	sum := 0.0
	for _, name := range names {
		sum += math.Log(float64(clean[name]))
	}
	mean := sum / float64(max(len(names), 1))
	for _, name := range names {
		st := e.state(name)
		st.seen = now
		if !st.speed.known {
			st.speed = filter{m: math.Log(float64(clean[name])) - mean, v: variance, known: true}
		}
	}
}

// Applied records that weights w became live at now; the caller calls it
// after each successful write.
func (e *Engine) Applied(now time.Time, w map[string]uint32) {
	e.start(now)
	clean := cleanWeights(w)
	e.history.record(now, clean, max(time.Second, e.params.horizon()/128))
	e.history.prune(now.Add(-e.params.horizon() - time.Second))
	e.live = clean
	if e.appliedSince.IsZero() {
		e.appliedSince = now
	}
	if e.unapplied && maps.Equal(clean, e.last) {
		e.unapplied = false
	}
}

// Weights returns weights for a (possibly changed) set of pods without a
// new observation, for the endpoint mirror: pods that stay keep their
// weight (the last computed one while it is not applied yet), new pods
// get the weight their estimate implies next to them (hardware class or
// median, scaled by slow start). In fallback every pod gets the same.
func (e *Engine) Weights(now time.Time, pods []Pod) map[string]uint32 {
	set := canonicalPods(pods)
	ref := e.reference()
	if e.unapplied {
		ref = e.last
	}
	if e.mode == ModeFallback {
		w, _ := e.params.settle(set, nil, e.params.proposalFrom(now, set, nil), true, nil)
		return w
	}
	w, _ := e.params.settle(set, ref, e.holdProposal(now, set), false, nil)
	return w
}

// holdProposal is the weight each pod's estimate implies at capacity
// shares, for pods that join while the weights are held.
func (e *Engine) holdProposal(now time.Time, set []Pod) []float64 {
	models := e.models(set)
	x := make([]float64, len(set))
	for i, m := range models {
		x[i] = m.c * m.v
	}
	return e.params.proposalFrom(now, set, x)
}

// reference is what the weights are compared against: the live weights,
// or in dry run (nothing ever applied) the last computed ones.
func (e *Engine) reference() map[string]uint32 {
	if e.live != nil {
		return e.live
	}
	return e.last
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
		st = &podState{}
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
