package weights

import (
	"maps"
	"math"
	"slices"
	"time"
)

// podSignal is one pod's usable signals.
type podSignal struct {
	cpu, requests, latency          float64
	hasCPU, hasRequests, hasLatency bool
	// limit is the most CPU the pod could use this cycle: its Cores
	// limit, else (see ceilings) its own CPU plus its share of what its
	// node left idle; 0 when unknown.
	limit float64
	// nodeCeiling is what this window's node CPU says the pod could use:
	// its own CPU plus its share of its node's idle CPU, negative idle
	// included (down to half its own CPU), 0 when unknown. A saturated
	// pod's node shows idle CPU that is noise around zero: limit clamps
	// that at the pod's own CPU, which is right for one window, but an
	// average of only its positive half would sit above the pod's cores.
	nodeCeiling float64
	// nodeCPU is the CPU in use on its node (Signal.NodeCPU), 0 if unknown.
	nodeCPU float64
	// recentCPU is its CPU over the end of the window (Signal.RecentCPU),
	// 0 if unknown.
	recentCPU float64
	// recentLatency is its latency over the end of the window
	// (Signal.RecentLatency), 0 if unknown.
	recentLatency float64
}

// judgeRecent keeps a pod's recent CPU as a sign of saturation only when
// it stands out from the window's CPU by more than recentSigmas of what
// the two usually differ by for that pod (2.5: a pod already near its
// limit must still be caught, and one far from it needs more than that
// to reach it): over two scrape intervals a pod
// that serves few, long requests shows its limit by chance (at 80% of one
// core and 100 ms a request, 240 requests in 30 s, the busy share of such
// a window varies by about 15%), and each false alarm is a drain and a
// switch of the load balancer. It then learns that difference from the
// cycles in which the pod was not at its limit.
func (e *Engine) judgeRecent(set []Pod, sig signals) {
	for i, pod := range set {
		ps := &sig.pods[i]
		if !(ps.recentCPU > 0) || !(ps.cpu > 0) {
			ps.recentCPU = 0
			continue
		}
		st := e.state(pod.Name)
		r := math.Log(ps.recentCPU / ps.cpu)
		if r < recentSigmas*recentNoise(st.recentRatios) {
			ps.recentCPU = 0 // no news beyond the window's own CPU
		}
		if ps.limit > 0 && ps.cpu >= saturatedUse*ps.limit {
			continue // at its limit over the window: says nothing of the noise
		}
		st.recentRatios = noteRatio(st.recentRatios, r)
	}
}

// recentNoise is the deviation of log(recent / window) for a pod, from the
// last cycles' absolute ratios: a robust one (1.4826 times the median),
// so the start of a window and a real change do not inflate it;
// recentNoisePrior until minRecentRatios are in.
func recentNoise(ratios []float64) float64 {
	if len(ratios) < minRecentRatios {
		return recentNoisePrior
	}
	// median sorts, so it gets a copy.
	return max(1.4826*median(slices.Clone(ratios)), minRecentNoise)
}

// noteRatio appends |r| to a pod's ratios, keeping the last maxRecentRatios.
func noteRatio(ratios []float64, r float64) []float64 {
	ratios = append(ratios, math.Abs(r))
	if len(ratios) > maxRecentRatios {
		ratios = slices.Delete(ratios, 0, len(ratios)-maxRecentRatios)
	}
	return ratios
}

// saturated reports whether the pod used all the CPU it could, over the
// window or lately.
func (ps podSignal) saturated() bool {
	return ps.hasCPU && ps.limit > 0 && max(ps.cpu, ps.recentCPU) >= saturatedUse*ps.limit
}

// signals is the observation reduced to the current set, in set order.
type signals struct {
	pods         []podSignal
	withCPU      int     // pods with a CPU value (zero included)
	withRequests int     // pods with positive CPU and positive requests
	withLatency  int     // pods with a positive latency
	meanCPU      float64 // over pods with a CPU value
	// fromRequests: speeds come from request rates, because at least half
	// of the pods with CPU data have request data too; else from CPU alone.
	fromRequests bool
}

// usable reports whether a signal value is data: NaN, Inf and negative
// values are what broken exporters and counter resets produce.
func usable(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

func readSignals(set []Pod, obs map[string]Signal) signals {
	s := signals{pods: make([]podSignal, len(set))}
	total := 0.0
	for i, pod := range set {
		raw, ok := obs[pod.Name]
		if !ok {
			continue
		}
		ps := &s.pods[i]
		if usable(raw.CPU) {
			ps.cpu, ps.hasCPU = raw.CPU, true
			s.withCPU++
			total += raw.CPU
		}
		if usable(raw.Requests) {
			ps.requests, ps.hasRequests = raw.Requests, true
		}
		if usable(raw.Latency) && raw.Latency > 0 {
			ps.latency, ps.hasLatency = raw.Latency, true
			s.withLatency++
		}
		if usable(raw.NodeCPU) && raw.NodeCPU > 0 {
			ps.nodeCPU = raw.NodeCPU
		}
		if usable(raw.RecentCPU) {
			ps.recentCPU = raw.RecentCPU
		}
		if usable(raw.RecentLatency) {
			ps.recentLatency = raw.RecentLatency
		}
		if ps.hasCPU && ps.cpu > 0 && ps.hasRequests && ps.requests > 0 {
			s.withRequests++
		}
	}
	if s.withCPU > 0 {
		s.meanCPU = total / float64(s.withCPU)
	}
	s.fromRequests = s.withRequests > 0 && 2*s.withRequests >= s.withCPU
	ceilings(set, s.pods)
	return s
}

const (
	// recentSigmas: a recent CPU counts as news when it stands this many
	// standard deviations (of the pod's usual recent-to-window ratio)
	// above the window's CPU; recentNoisePrior is the deviation assumed
	// before any is measured.
	recentSigmas     = 2.5
	recentNoisePrior = 0.1
	// minRecentRatios and maxRecentRatios: the cycles the deviation is
	// measured over, at least and at most.
	minRecentRatios = 4
	maxRecentRatios = 16
	// minRecentNoise is the least deviation assumed, so that a pod whose
	// two rates agreed closely for a while is not alarmed by a little.
	minRecentNoise = 0.02
	// saturatedUse is the share of its Cores above which a pod is taken as
	// saturated: its CPU then shows what it could do, not what it was sent.
	saturatedUse = 0.97
	// saturationOnlyBelow: when the pods use this much of their cores on
	// average, the whole Service is overloaded and saturation says nothing
	// about how to split the traffic.
	saturationOnlyBelow = 0.9
	// saturatedDiscount is how far below its upper bound a saturated pod's
	// capacity is put: its overload is unknown, and erring low is safe, as
	// the first cycle it is not saturated measures it exactly.
	saturatedDiscount = 0.8
	// minSaturatedDiscount bounds how deep repeated cuts go in one cycle.
	minSaturatedDiscount = 0.25
	// An observation more than twice the dead band (at least minSurprise)
	// and twice surpriseSigmas times the noise away from the estimate (log
	// scale) is a change, not noise: the estimate restarts from it.
	minSurprise    = 0.02
	surpriseSigmas = 4
	// driftAllowance and driftLimit tune the CUSUM (in noise units): each
	// observation adds its distance beyond driftAllowance; past driftLimit
	// the estimate restarts. A shift of d noise levels is caught in about
	// driftLimit/(d-driftAllowance) cycles.
	driftAllowance = 1
	driftLimit     = 8
	// minNoise is the least noise assumed when judging drift, so that a
	// tiny bias of a perfect model does not restart estimates all the time.
	minNoise = 0.005
	// sharpRange: a sighting whose range is narrower than this ratio came
	// from steady weights, and measures the pod rather than bounding it.
	sharpRange = 1.02
	// minEstimate and maxEstimate bound raw estimates, which only matter
	// relative to each other, away from underflow and overflow.
	minEstimate = 1e-30
	maxEstimate = 1e30
)

// sighting is what one cycle says about one pod's speed per core: a range,
// in the raw units of this cycle, that is certain to hold the truth (up to
// noise), because the window the backend averaged is not known exactly.
type sighting struct {
	index     int // in the set
	lo, hi    float64
	saturated bool
}

// learn folds one observation into the capacity estimates.
//
// A pod's speed per core shows in two ways. With request rates, it is
// requests served per CPU-second. Without them, it is its traffic share per
// CPU-second, since traffic follows weights; the share is the average over
// the window the backend saw, taken from the timeline. Either way the
// numbers are in units that change with the total load, so each cycle
// first finds the one scale that best fits the current estimates (a median,
// so one pod that really changed does not drag the rest), and then moves
// each estimate only as far as its range forces it. It returns how many
// pods it learned from. An early cycle (Observation.Early) does not measure
// the noise: its window is mostly the last cycle's, so its residuals are
// not a new sample of it.
func (e *Engine) learn(now time.Time, set []Pod, sig signals, shares []shareSpan, early bool) int {
	sightings := e.sight(now, set, sig, shares)
	if len(sightings) == 0 {
		return 0
	}
	scale := e.fitScale(set, sightings)
	// A saturated pod seen for the first time shows only a bound, which its
	// own (too large) share sets: it starts no higher than the pods known.
	var knownCaps []float64
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.known {
			knownCaps = append(knownCaps, st.capacity)
		}
	}
	typical := median(knownCaps)

	var residuals []float64
	for _, s := range sightings {
		st := e.state(set[s.index].Name)
		st.seen = now
		st.fromData = true
		// An observation whose window reaches back past the last restart
		// of the estimate may still mix the pod's speed before and after
		// the change: it moves the estimate, but does not count.
		settled := st.restartedAt.IsZero() || !now.Before(st.restartedAt.Add(e.params.QueryWindow))
		sharp := !s.saturated && s.hi <= sharpRange*s.lo && settled
		if !st.known {
			st.capacity = clampCapacity(pointOf(s) / scale)
			if s.saturated && typical > 0 {
				st.capacity = min(st.capacity, typical)
			}
			st.known = true
			if sharp {
				st.measurements = 1
			}
			continue
		}
		target := min(max(st.capacity, s.lo/scale), s.hi/scale)
		r := math.Log(target / st.capacity)
		if s.saturated {
			// The pod is overloaded now: act on the bound at once.
			st.capacity = clampCapacity(target)
			continue
		}
		if sharp && st.measurements >= 2 {
			residuals = append(residuals, r*r)
		}
		if e.fold(st, target, r, sharp) {
			st.restartedAt = now
		}
	}
	if !early {
		e.measureNoise(residuals)
	}
	e.rememberClasses(set)
	e.normalize(set)
	return len(sightings)
}

// shareSpan is the least and greatest average traffic share a pod can have
// had over the window the backend's rate covered (see shareRange); ok is
// false when the pod was not in the set for all of it.
type shareSpan struct {
	lo, hi float64
	ok     bool
}

// windowShares returns every pod's shareSpan for an observation at now.
func (e *Engine) windowShares(now time.Time, set []Pod) []shareSpan {
	segs := e.history.segmentsSince(now, -e.params.horizon().Seconds())
	if len(e.history.epochs) == 0 {
		// Nothing was ever applied (dry run): Envoy spreads traffic evenly.
		virtual := timeline{}
		virtual.reset(now, equalOver(set))
		segs = virtual.segmentsSince(now, -e.params.horizon().Seconds())
	}
	windows := rateWindows(e.params, segs)
	out := make([]shareSpan, len(set))
	for i, pod := range set {
		out[i].lo, out[i].hi, out[i].ok = shareRange(pod.Name, segs, windows)
	}
	return out
}

// warming reports whether the pod's rates over the window at now include
// time before it was ready or warm, so they cannot speak for it.
func (e *Engine) warming(pod Pod, now time.Time) bool {
	return !pod.ReadySince.IsZero() && pod.ReadySince.Add(e.params.SlowStart).After(now.Add(-e.params.horizon()))
}

// sight turns the signals into sightings, skipping pods the data cannot
// speak for: no CPU, joined or warming up within the window, or (with
// request rates) no requests.
func (e *Engine) sight(now time.Time, set []Pod, sig signals, shares []shareSpan) []sighting {
	fromRequests := sig.fromRequests
	// With CPU alone a pod's speed is its traffic share per CPU-second,
	// and the share follows the engine's weights only once they are live:
	// not over the Service's history before them, when Istio's
	// LEAST_REQUEST sent more to the pods that keep up. (A dry run never
	// applies weights: Envoy is taken to balance evenly, see windowShares.)
	if !fromRequests && !e.appliedSince.IsZero() && now.Add(-e.params.horizon()).Before(e.appliedSince) {
		return nil
	}

	// The most of a window that two rates of one query may disagree on.
	misalignment := 0.0
	if w, sc := e.params.QueryWindow, e.params.ScrapeInterval; sc > 0 {
		misalignment = float64(sc) / float64(w-sc)
	}

	// Saturation is only meaningful when some pods have room to spare.
	useSum, useCount := 0.0, 0
	for i := range set {
		if ps := sig.pods[i]; ps.hasCPU && ps.limit > 0 {
			useSum += ps.cpu / ps.limit
			useCount++
		}
	}
	judgeSaturation := useCount > 0 && useSum/float64(useCount) < saturationOnlyBelow

	var out []sighting
	for i, pod := range set {
		ps := sig.pods[i]
		if !ps.hasCPU || ps.cpu <= 0 {
			continue
		}
		if e.warming(pod, now) {
			continue // its window includes time before it was ready or warm
		}
		if st := e.pods[pod.Name]; st != nil && st.blind {
			continue // its cores are a guess and its saturation unseen
		}
		shareLo, shareHi := shares[i].lo, shares[i].hi
		if !shares[i].ok {
			continue
		}
		s := sighting{index: i}
		switch {
		case fromRequests:
			if !ps.hasRequests || ps.requests <= 0 {
				continue
			}
			// Requests per CPU-second do not depend on the traffic share,
			// except that requests and CPU may be scraped up to one
			// interval apart: if the share changed inside the window, the
			// two rates then saw it for different lengths of time.
			// A pod busy all the time serves at its speed whatever it
			// is sent, so then the two rates agree however they align.
			perCPU := ps.requests / ps.cpu
			spread := (shareHi/shareLo - 1) * misalignment
			if ps.saturated() {
				spread = 0
			}
			s.lo, s.hi = perCPU/(1+spread), perCPU*(1+spread)
		case judgeSaturation && ps.saturated():
			// Busy all the time: it was sent more than it could serve, so
			// share/CPU only bounds its speed from above. A pod already
			// estimated must look saturated twice in a row, since noise
			// alone can show a busy pod at its limit once.
			// While it stays saturated, each cycle cuts deeper (as TCP
			// backs off), since the overload is unknown.
			// Saturated again within a query window counts as staying
			// saturated: while the operator keeps LEAST_REQUEST (not
			// Learned) a saturated pod gets relief in between, and its
			// weight must still come down before ROUND_ROBIN returns.
			st := e.state(pod.Name)
			if !st.saturatedAt.IsZero() && !e.lastUpdate.IsZero() && !st.saturatedAt.Before(e.lastUpdate.Add(-e.params.horizon())) {
				st.saturatedCycles++
			} else {
				st.saturatedCycles = 0
			}
			st.saturatedAt = now
			if st.known && st.saturatedCycles == 0 {
				continue
			}
			discount := math.Pow(saturatedDiscount, float64(max(st.saturatedCycles, 1)))
			s.hi = max(discount, minSaturatedDiscount) * shareHi / ps.cpu
			s.lo = s.hi * minEstimate
			s.saturated = true
		default:
			s.lo, s.hi = shareLo/ps.cpu, shareHi/ps.cpu
		}
		if !(s.lo > 0 && s.hi < math.Inf(1)) {
			continue
		}
		s.lo = min(max(s.lo, minEstimate), maxEstimate)
		s.hi = min(max(s.hi, s.lo), maxEstimate)
		out = append(out, s)
	}
	return out
}

// pointOf is the single value a sighting suggests when nothing is known.
func pointOf(s sighting) float64 {
	if s.saturated {
		return s.hi
	}
	return math.Sqrt(s.lo * s.hi)
}

// fitScale finds the factor from this cycle's raw units to the estimates'
// units: the one that puts the most estimates inside their sightings (it
// minimises the summed log distance to the ranges, a median of their ends).
func (e *Engine) fitScale(set []Pod, sightings []sighting) float64 {
	var ends, ratios []float64
	for _, s := range sightings {
		st := e.pods[set[s.index].Name]
		if st == nil || !st.known {
			continue
		}
		ratios = append(ratios, math.Log(pointOf(s)/st.capacity))
		if !s.saturated {
			ends = append(ends, math.Log(s.lo/st.capacity), math.Log(s.hi/st.capacity))
		}
	}
	switch {
	case len(ends) > 0:
		slices.Sort(ends)
		n := len(ends) / 2
		return math.Exp((ends[n-1] + ends[n]) / 2)
	case len(ratios) > 0:
		return math.Exp(median(ratios))
	}
	// Nothing known yet: any scale will do; pick the one that makes the
	// estimates about 1.
	logs := make([]float64, 0, len(sightings))
	for _, s := range sightings {
		logs = append(logs, math.Log(pointOf(s)))
	}
	return math.Exp(median(logs))
}

// fold moves an estimate toward target (r = log(target/estimate)).
// Observations are averaged (1/n, down to Smoothing), which filters noise;
// a large jump, or a drift that persists, means the pod really changed,
// and the estimate restarts from the new value. Only sharp observations
// count towards the average; a blurred one moves the estimate as far as
// the average would, but weighs nothing later.
//
// It reports whether the estimate restarted.
func (e *Engine) fold(st *podState, target, r float64, sharp bool) bool {
	jump := 2 * max(e.params.DeadBand, minSurprise, surpriseSigmas*e.noise)
	z := r / max(e.noise, minNoise)
	st.driftUp = max(0, st.driftUp+z-driftAllowance)
	st.driftDown = max(0, st.driftDown-z-driftAllowance)
	if math.Abs(r) > jump || st.driftUp > driftLimit || st.driftDown > driftLimit {
		// The observation that shows the change may mix the speeds before
		// and after it: it counts for nothing, and the next ones (until
		// their windows no longer reach back to it) replace it.
		st.capacity = clampCapacity(target)
		st.measurements = 0
		st.driftUp, st.driftDown = 0, 0
		return true
	}
	st.capacity = clampCapacity(st.capacity * math.Exp(e.gain(st)*r))
	if sharp {
		st.measurements = min(st.measurements+1, maxMeasurements)
	}
	return false
}

// gain is the weight of a new observation: a plain average of the
// measurements so far, down to Smoothing.
func (e *Engine) gain(st *podState) float64 {
	return max(e.params.Smoothing, 1/float64(st.measurements+1))
}

// measureNoise updates the noise level from this cycle's squared residuals
// of pods at steady weights. The median makes it robust to a pod that
// really changed; 0.455 is the median of a squared standard normal.
func (e *Engine) measureNoise(squares []float64) {
	if len(squares) < 3 {
		return
	}
	variance := median(squares) / 0.455
	// Average the first few cycles plainly, so the prior is soon forgotten.
	e.noiseCycles = min(e.noiseCycles+1, 5)
	g := 1 / float64(e.noiseCycles)
	blended := (1-g)*e.noise*e.noise + g*variance
	e.noise = min(max(math.Sqrt(blended), minNoise), 0.5)
}

// rememberClasses keeps, per hardware class, the geometric mean capacity of
// its pods that have estimates, so a new pod of that class (or a whole new
// generation of pods after a rollout) starts from it.
func (e *Engine) rememberClasses(set []Pod) {
	sums := map[string]float64{}
	counts := map[string]int{}
	for _, pod := range set {
		st := e.pods[pod.Name]
		if pod.HardwareClass == "" || st == nil || !st.known {
			continue
		}
		sums[pod.HardwareClass] += math.Log(st.capacity)
		counts[pod.HardwareClass]++
	}
	// Once per class, in a fixed order, so which classes are admitted when
	// maxClasses is reached does not depend on map iteration.
	for _, class := range slices.Sorted(maps.Keys(counts)) {
		if _, known := e.classes[class]; known || len(e.classes) < maxClasses {
			e.classes[class] = math.Exp(sums[class] / float64(counts[class]))
		}
	}
}

// normalize rescales every estimate so the geometric mean over the current
// pods with estimates is 1: only ratios matter, and this keeps the numbers
// from drifting with the load.
func (e *Engine) normalize(set []Pod) {
	logSum, n := 0.0, 0
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.known {
			logSum += math.Log(st.capacity)
			n++
		}
	}
	if n == 0 {
		return
	}
	g := math.Exp(logSum / float64(n))
	for _, st := range e.pods {
		st.capacity = clampCapacity(st.capacity / g)
	}
	for class, c := range e.classes {
		e.classes[class] = clampCapacity(c / g)
	}
}

// clampCapacity keeps an estimate finite and positive.
func clampCapacity(c float64) float64 {
	if !(c > 1e-9) {
		return 1e-9
	}
	return min(c, 1e9)
}

// knownCores reports whether the pod's Cores is a plausible CPU limit.
func knownCores(pod Pod) bool { return pod.Cores > 0 && pod.Cores <= maxCores }

// maxCores is more CPU than any one pod has; larger values are noise.
const maxCores = 1 << 16

// capacities returns each pod's capacity (speed per core times cores) in
// set order. A pod without an estimate gets its hardware class's when
// pooling, else the median of the pods with estimates.
func (e *Engine) capacities(set []Pod) []float64 {
	caps, _ := e.capacitiesPerCore(set)
	return caps
}

// targets returns what each pod's weight is proportional to: its
// capacity, tilted towards faster pods by (speed per core)^SpeedTilt; with
// MinimizeLatency and a known load, moved to the utilisations of
// queueUtilisations where the pods' cores differ, and at low load to the
// split of split.go. Speeds per core are relative (their geometric mean is
// about 1); only ratios matter.
func (e *Engine) targets(set []Pod) []float64 {
	caps, perCore := e.capacitiesPerCore(set)
	if tilt := e.params.SpeedTilt; tilt > 0 {
		for i := range caps {
			caps[i] = min(max(caps[i]*math.Pow(perCore[i], tilt), 1e-12), 1e12)
		}
	}
	if !e.params.MinimizeLatency || !(e.splitLoad > 0) {
		return caps
	}
	cores := e.splitCores(set)
	capacity := 0.0
	for i := range set {
		capacity += cores[i] * perCore[i]
	}
	// Unlike cores run at unlike utilisations, at every load the split
	// leaves to capacity shares (see split.go); pods of one core count
	// keep their shares. A pod run fuller must be watched: by its backlog
	// (request rates) or against a CPU limit. With CPU alone and cores
	// read from the node's noisy idle CPU, a fuller pod is judged at its
	// limit by that noise and drained, and back, every cycle; so then
	// only a Service whose pods all have limits is moved.
	// Request rates count until requestsGrace cycles have gone by
	// without them.
	if (e.requestsLately > 0 || allKnownCores(set)) && !allEqual(cores) {
		if pooled := poolCores(set, cores); !allEqual(pooled) {
			if rho, ok := queueUtilisations(pooled, perCore, e.splitLoad); ok {
				for i := range caps {
					caps[i] = min(max(caps[i]*rho[i], 1e-12), 1e12)
				}
			}
		}
	}
	// The split is used in full while the Service has room to spare and
	// not at all from splitNoneFrom of its capacity up; in between, the
	// two are blended linearly.
	use := e.splitLoad / capacity
	if !(use < splitNoneFrom) {
		return caps
	}
	// Speeds the estimates cannot tell apart split alike (poolSpeeds).
	split, ok := latencySplit(cores, poolSpeeds(perCore, e.poolBands(set)), e.splitLoad)
	if !ok {
		return caps
	}
	b := min(1, (splitNoneFrom-use)/(splitNoneFrom-splitFullBelow))
	capSum, splitSum := 0.0, 0.0
	for i := range caps {
		capSum += caps[i]
		splitSum += split[i]
	}
	for i := range caps {
		caps[i] = min(max((1-b)*caps[i]/capSum+b*split[i]/splitSum, 1e-12), 1e12)
	}
	return caps
}

// allKnownCores reports whether every pod has a CPU limit.
func allKnownCores(set []Pod) bool {
	for _, pod := range set {
		if !knownCores(pod) {
			return false
		}
	}
	return true
}

// splitCores returns the cores the split and queueUtilisations take each
// pod to have: coresOf, or the median of the others' (as
// capacitiesPerCore takes it) when nothing is known of its own; when
// nothing is known of any pod's, 1 each.
func (e *Engine) splitCores(set []Pod) []float64 {
	cores := make([]float64, len(set))
	var seen []float64
	for i, pod := range set {
		if c := e.coresOf(pod); c > 0 {
			cores[i] = c
			seen = append(seen, c)
		}
	}
	typical := median(seen)
	for i := range set {
		if !(cores[i] > 0) {
			cores[i] = typical
			if !(typical > 0) {
				cores[i] = 1 // all alike, as capacitiesPerCore takes them
			}
		}
	}
	return cores
}

// poolCores returns the cores with the estimated ones (pods without a
// limit) within coresPool of each other pooled (poolSpeeds); cores from a
// limit are exact and left alone. queueUtilisations takes them pooled;
// the split takes them as they are (at low load a few percent of cores
// matter little against the speeds).
func poolCores(set []Pod, cores []float64) []float64 {
	tol := make([]float64, len(set))
	for i, pod := range set {
		if !knownCores(pod) {
			tol[i] = coresPool
		}
	}
	return poolSpeeds(cores, tol)
}

// allEqual reports whether every value is the first.
func allEqual(xs []float64) bool {
	return !slices.ContainsFunc(xs, func(x float64) bool { return x != xs[0] })
}

// capacitiesPerCore returns each pod's capacity and its speed per core.
func (e *Engine) capacitiesPerCore(set []Pod) (caps, perCores []float64) {
	var known, cores []float64
	podCoresOf := make([]float64, len(set))
	for i, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.known {
			known = append(known, st.capacity)
		}
		if c := e.coresOf(pod); c > 0 {
			podCoresOf[i] = c
			cores = append(cores, c)
		}
	}
	fallback := median(known)
	if fallback == 0 {
		fallback = 1
	}
	typicalCores := median(cores)
	caps = make([]float64, len(set))
	perCores = make([]float64, len(set))
	for i, pod := range set {
		perCore := fallback
		if st := e.pods[pod.Name]; st != nil && st.known {
			perCore = st.capacity
		} else if c, ok := e.classes[pod.HardwareClass]; ok && e.params.PoolByHardware && pod.HardwareClass != "" {
			perCore = c
		}
		podCores := 1.0
		if typicalCores > 0 {
			podCores = typicalCores
			if podCoresOf[i] > 0 {
				podCores = podCoresOf[i]
			}
			podCores /= typicalCores
		}
		caps[i] = min(max(perCore*podCores, 1e-12), 1e12)
		perCores[i] = perCore
	}
	return caps, perCores
}
