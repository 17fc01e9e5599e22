package weights

import (
	"math"
	"slices"
	"time"
)

// Stage 1, observe: the signals of one cycle and the weight timeline become
// per-pod readings with their uncertainty. Nothing here remembers anything
// between cycles except what it is handed (the backlog a window ago, the
// latency the last cycle saw); a pod without data gives no reading, never
// a zero.

// reading is what one cycle's data says about one pod.
type reading struct {
	cpu, requests, latency          float64
	hasCPU, hasRequests, hasLatency bool
	recentLatency                   float64 // 0 = unknown
	recentCPU                       float64 // 0 = unknown
	nodeCPU                         float64 // 0 = unknown

	// limit is the most CPU the pod could use this window: its Cores, else
	// its own CPU plus its share of its node's idle CPU; 0 = unknown.
	limit float64
	// nodeCeiling is the same from the node's figures, negative idle CPU
	// included (a saturated pod's node shows idle CPU that is noise around
	// zero), for the cores filter; 0 = unknown.
	nodeCeiling float64
	// saturated: the pod used all the CPU it could (saturatedUse of its
	// limit): it shows what it could do, not what it was sent.
	saturated bool
	// windowCPU is the window's CPU rate where readRecentCPU raised cpu to
	// the recent one (the pod reached its limit within the window), else
	// 0: the rate the window's requests were served with.
	windowCPU float64

	// speed is the pod's log speed per core in this cycle's raw units, an
	// interval [lo, hi] because the span the backend's rate() averaged is
	// not known exactly (see rateWindows); ok = there is one. upper: the
	// reading is censored, the speed is at most hi (CPU alone at the
	// limit: it was sent more than it served).
	speed struct {
		ok, upper bool
		lo, hi    float64
	}
	// countVar: the speed reading's variance beyond the measured noise
	// for resting on fewer requests than the median pod's (see
	// countNoise).
	countVar float64
	// partial: the pod's rates cover only part of the window (a cycle
	// within a horizon found it without data; see noteDataGaps).
	partial bool

	// shareLo, shareHi: the pod's average traffic share over the window;
	// shareOK = it was in the set for all of it.
	shareLo, shareHi float64
	shareOK          bool

	// cores is what its latency says of the cores of a pod without a
	// limit (Erlang C), 0 = nothing. coresBounded: the reading is one of
	// its bounds (the pod's ceiling or floor, or the cores a wait within
	// the noise shows), which the latency only says the cores reach.
	cores        float64
	coresBounded bool
	// coresAtCeiling: cores was clamped at limit, the node's ceiling (see
	// readCores), not at the pod's request or node size.
	coresAtCeiling bool
	// backlog is the requests queued at the pod beyond its usual queue,
	// as measured this cycle; capRate the requests per second it can
	// serve (0 = unknown).
	backlog, capRate float64
	// served is the share of what it was sent that the pod served over
	// the last two scrape intervals, and sent that count (see
	// recentServed); sent 0 = unknown.
	served, sent float64
	// alone: the latency may ring on its own where the served share is
	// unknown (see latencyAlone).
	alone bool
}

// cycleReadings is one cycle's readings in set order, with what holds for
// the whole Service.
type cycleReadings struct {
	pods    []reading
	withCPU int
	meanCPU float64
	// fromRequests: speeds are requests per CPU-second, because at least
	// half of the pods with CPU data have request data too; else CPU alone.
	fromRequests bool
	// noData lists the pods without CPU data; newData those with data
	// over part of the window only (see noteDataGaps).
	noData, newData []string
	// loadMove is how far the Service's rate moved within the window,
	// relative (see loadSpread); 0 for none beyond the noise.
	loadMove float64
}

// saturatedUse is the share of its CPU limit above which a pod counts as
// saturated. CPU rates of a pod pinned at its limit read 97-100% of it
// (the scrape and the cgroup's accounting are not aligned), while a pod
// below 97% had idle moments.
const saturatedUse = 0.97

// usable reports whether a signal value is data: NaN, Inf and negative
// values are what broken exporters and counter resets produce.
func usable(v float64) bool { return v >= 0 && !math.IsInf(v, 1) }

// usableCPU reports whether a pod's CPU rate is data: usable, and not more
// CPU than one pod has (maxCores), which only a lying exporter reports; the
// pod then has no CPU data, as with none at all.
func usableCPU(v float64) bool { return usable(v) && v <= maxCores }

// readSignals reduces the observation to the set, in set order.
func readSignals(set []Pod, obs map[string]Signal) cycleReadings {
	out := cycleReadings{pods: make([]reading, len(set))}
	total, withRequests := 0.0, 0
	for i, pod := range set {
		raw, ok := obs[pod.Name]
		r := &out.pods[i]
		if ok && usableCPU(raw.CPU) {
			r.cpu, r.hasCPU = raw.CPU, true
			out.withCPU++
			total += raw.CPU
		} else {
			out.noData = append(out.noData, pod.Name)
		}
		if !ok {
			continue
		}
		if usable(raw.Requests) {
			r.requests, r.hasRequests = raw.Requests, true
		}
		if usable(raw.Latency) && raw.Latency > 0 {
			r.latency, r.hasLatency = raw.Latency, true
		}
		if usable(raw.NodeCPU) && raw.NodeCPU > 0 {
			r.nodeCPU = raw.NodeCPU
		}
		if usable(raw.RecentLatency) {
			r.recentLatency = raw.RecentLatency
		}
		if usableCPU(raw.RecentCPU) {
			r.recentCPU = raw.RecentCPU
		}
		if r.hasCPU && r.cpu > 0 && r.hasRequests && r.requests > 0 {
			withRequests++
		}
	}
	if out.withCPU > 0 {
		out.meanCPU = total / float64(out.withCPU)
	}
	out.fromRequests = withRequests > 0 && 2*withRequests >= out.withCPU
	ceilings(set, out.pods)
	for i := range out.pods {
		r := &out.pods[i]
		r.saturated = r.hasCPU && r.limit > 0 && r.cpu >= saturatedUse*r.limit
	}
	return out
}

// noisyCeilings clears the saturation of a pod without a limit whose CPU
// is below its settled cores: its ceiling is its own CPU plus its node's
// idle CPU, and a spike of its neighbours' CPU empties the node without
// the pod being any busier. floors holds the least each pod's cores can be
// (zSigmas of its estimate's own uncertainty below it), 0 for none. A pod
// that did reach its cores uses them.
func noisyCeilings(set []Pod, c *cycleReadings, floors []float64) {
	for i, pod := range set {
		r := &c.pods[i]
		if r.saturated && !knownCores(pod) && floors[i] > 0 && r.cpu < saturatedUse*floors[i] {
			r.saturated = false
		}
	}
}

// restartCeilings drops, in the first cycle after a restart (see
// SeedSettled), the ceilings a node's CPU puts on pods without a limit:
// such a pod is not taken as saturated, and the cores its queue shows are
// bounded by its CPU request and node size only. The engine before judged
// each node's CPU against its estimate of the pod's cores (noisyCeilings)
// and set the live weights with it; this engine has no estimate yet to
// judge one cycle's node CPU by, and near full load a neighbour's burst
// empties a node often (±20% on the CPU of a node with one core of other
// work puts a pod at 93% of its cores at its ceiling in two cycles of
// five): taken as saturated, the pod was left out of the calibration and
// its first cores reading, clamped at the ceiling, started its estimate
// as settled (a 4-core pod at 3.4), so the second cycle moved weights by
// up to 12% (6 of 8 restarts of the calm tests' Service without limits at
// 80-90% load with the node CPU ±20%). A pod whose queue is not read (no
// latency, or no request rates, or speeds from CPU alone) keeps its
// ceiling's limit: its only cores reading, and with CPU alone what tells
// its overload from blindness (see markBlind). A pod that is really
// starved shows it in its queue, and the next cycle's ceiling is judged
// against its estimate.
func restartCeilings(set []Pod, c *cycleReadings, calibrating []bool) {
	if calibrating == nil {
		return
	}
	for i, pod := range set {
		r := &c.pods[i]
		if knownCores(pod) || !calibrating[i] {
			continue
		}
		r.saturated = false
		if c.fromRequests && r.hasLatency && r.hasRequests {
			r.limit = 0
		}
	}
}

// readRecentCPU marks as saturated the pods whose CPU over the last two
// scrape intervals (Signal.RecentCPU) is at their limit and stands out of
// the window's by zSigmas of how the two usually differ for that pod
// (ratios: its last |log(recent/window)| while below its limit): a pod that
// just reached its limit shows it there a cycle before the window does,
// while one serving few, long requests reaches it over two scrapes by
// chance now and then. The bar is half a reading's (zSigmas/2): the pod is
// at its limit besides, and the costs are lopsided, a false alarm one cycle
// of LEAST_REQUEST and a drop of the pod's estimate the next reading
// undoes, a miss a queue of a window's excess traffic. It returns each
// pod's ratio to remember, NaN for none.
func readRecentCPU(c *cycleReadings, ratios [][]float64) []float64 {
	out := make([]float64, len(c.pods))
	for i := range c.pods {
		r := &c.pods[i]
		out[i] = math.NaN()
		if !r.hasCPU || !(r.cpu > 0) || !(r.recentCPU > 0) || !(r.limit > 0) {
			continue
		}
		d := math.Log(r.recentCPU / r.cpu)
		if !r.saturated {
			out[i] = d
		}
		if len(ratios[i]) >= 3 && r.recentCPU >= saturatedUse*r.limit && d > zSigmas/2*math.Sqrt(robustVariance(ratios[i])) {
			r.saturated = true
			r.windowCPU = r.cpu
			r.cpu = max(r.cpu, r.recentCPU) // its share per CPU now bounds its speed
		}
	}
	return out
}

// ceilings sets every pod's limit: its Cores when it has a limit; else,
// when its node's CPU in use is known, its own CPU plus its share of what
// the node left idle (allocatable minus in use), shared by the set's pods
// on that node in proportion to their CPU.
func ceilings(set []Pod, pods []reading) {
	type node struct {
		idle, busy float64
		n          int
	}
	nodes := map[string]*node{}
	key := func(i int) string {
		if set[i].Node == "" {
			return "\x00" + set[i].Name // a pod of an unknown node is alone on it
		}
		return set[i].Node
	}
	counted := make([]bool, len(set))
	for i, pod := range set {
		r := &pods[i]
		if knownCores(pod) {
			r.limit = pod.Cores
			continue
		}
		_, hi := coresBounds(pod)
		if !r.hasCPU || r.nodeCPU <= 0 || hi <= 0 {
			continue
		}
		nd := nodes[key(i)]
		if nd == nil {
			nd = &node{idle: math.Inf(-1)}
			nodes[key(i)] = nd
		}
		nd.idle = max(nd.idle, hi-r.nodeCPU)
		nd.busy += r.cpu
		nd.n++
		counted[i] = true
	}
	for i := range set {
		if !counted[i] {
			continue
		}
		r := &pods[i]
		nd := nodes[key(i)]
		share := 1 / float64(nd.n)
		if nd.busy > 0 {
			share = r.cpu / nd.busy
		}
		r.limit = r.cpu + max(0, nd.idle)*share
		r.nodeCeiling = max(r.cpu+nd.idle*share, r.cpu/2)
	}
}

// readSpeeds sets each pod's traffic share over the window and its speed
// reading. With request rates the speed is requests per CPU-second, which
// does not depend on the traffic share except through the misalignment of
// the two rates' scrapes; with CPU alone it is the traffic share per
// CPU-second, censored from above for a pod at its limit. Pods the data
// cannot speak for give none: no CPU, warming up within the window, or
// (with CPU alone) a window reaching back before the engine's weights
// were live.
//
// The Service's own rate moving within the window (c.loadMove, see
// loadSpread) misaligns the two rates' scrapes as a change of the pod's
// share does.
func readSpeeds(p Params, now time.Time, set []Pod, c *cycleReadings, segs []segment, cpuWindowsValid bool) {
	windows := rateWindows(p, segs)
	misalignment := p.misalignment()
	for i, pod := range set {
		r := &c.pods[i]
		r.shareLo, r.shareHi, r.shareOK = shareRange(pod.Name, segs, windows)
		if !r.hasCPU || r.cpu <= 0 || !r.shareOK || r.partial || warming(p, pod, now) {
			continue
		}
		switch {
		case c.fromRequests:
			if !r.hasRequests || r.requests <= 0 {
				continue
			}
			// Both rates over the window: a pod that reached its limit
			// within it served the window's requests with the window's
			// CPU, not with the recent one, and was not busy all along.
			cpu := r.cpu
			if r.windowCPU > 0 {
				cpu = r.windowCPU
			}
			perCPU := r.requests / cpu
			spread := (r.shareHi/r.shareLo*(1+c.loadMove) - 1) * misalignment
			if r.saturated && !(r.windowCPU > 0) {
				spread = 0 // busy all the time: serves at its speed however the rates align
			}
			r.speed.lo, r.speed.hi = math.Log(perCPU/(1+spread)), math.Log(perCPU*(1+spread))
		case !cpuWindowsValid:
			continue
		default:
			// A pod at its CPU limit used the limit: a reading above it is
			// the rate's noise (rate() extrapolates over misaligned
			// scrapes), and its speed is at most its share over the
			// limit, not over that reading. A node's ceiling is itself a
			// reading, and is not put above the pod's own. With request
			// rates nothing is clamped: two rates over the same scrapes
			// share that noise, and their ratio cancels it.
			cpu := r.cpu
			if r.saturated && knownCores(pod) {
				cpu = min(cpu, pod.Cores)
			}
			r.speed.lo, r.speed.hi = math.Log(r.shareLo/cpu), math.Log(r.shareHi/cpu)
			r.speed.upper = r.saturated
		}
		r.speed.ok = !math.IsNaN(r.speed.lo) && !math.IsInf(r.speed.lo, 0) && !math.IsInf(r.speed.hi, 0)
	}
}

// loadSpread is how far the Service's rate moved within this cycle's
// window, relative, judged from the move between the last regular cycle's
// window and this one's (the pods with a rate in both: a pod that lacks
// data once is no move): a change inside their overlap moves the two
// means by gap/QueryWindow of itself, so the move is scaled back up by
// QueryWindow/gap (and taken whole when the windows do not overlap). A
// request rate and a CPU rate scraped apart then cover spans that saw
// different loads, and their ratio errs as it does when the pod's share
// moves: after a step from 30% to 90% load, by 35-45% in the first cycle
// (pods of relative speeds 1, 0.6 and 0.35, 15 s scrapes, a 1 m window),
// which restarted speed filters on readings that far off. A move within zSigmas of the
// readings' noise is not taken for one.
func (e *Engine) loadSpread(now time.Time, set []Pod, c *cycleReadings) float64 {
	if e.lastUpdate.IsZero() || !now.After(e.lastUpdate) {
		return 0
	}
	was, is := 0.0, 0.0
	for i, pod := range set {
		if st, r := e.pods[pod.Name], c.pods[i]; st != nil && st.served > 0 && r.hasRequests && r.requests > 0 {
			was, is = was+st.served, is+r.requests
		}
	}
	if !(was > 0) || !(is > 0) {
		return 0
	}
	move := math.Abs(math.Log(is / was))
	if move <= zSigmas*e.noise {
		return 0
	}
	overlap := max(e.params.QueryWindow.Seconds()/now.Sub(e.lastUpdate).Seconds(), 1)
	return math.Expm1(move) * overlap
}

// noteDataGaps marks the pods whose rates cover only part of the window.
// A cycle that finds a pod without CPU data means its series had at most
// one sample over that cycle's window: its data starts after that cycle,
// less a scrape. Until a horizon has passed since, a window holds a
// fraction of the samples of a whole one, and a rate from a few samples
// is as far off as its few requests make it (at a first opt-in on a new
// Service, the first cycle with data reads its rates from one scrape
// interval: identical pods then read speeds 6% apart, which the estimates,
// taking them at the noise of whole windows, carried for ten minutes).
// Such a pod gives no speed reading, as a pod that became ready within
// the window does not (warming): its weight is kept until its window is
// whole (ReasonNewData). A query that failed outright says nothing of any
// pod's samples.
func (e *Engine) noteDataGaps(now time.Time, set []Pod, c *cycleReadings) {
	for name, t := range e.noDataAt {
		if now.Sub(t) >= e.params.horizon() {
			delete(e.noDataAt, name)
		}
	}
	for i, pod := range set {
		r := &c.pods[i]
		if !r.hasCPU {
			e.noDataAt[pod.Name] = now
			continue
		}
		// A pod still to be calibrated after a restart takes its first
		// reading however partial: calibrateTo sets its speed from its
		// live weight, and without that reading its seeded weight would
		// stand as its speed.
		_, r.partial = e.noDataAt[pod.Name]
		if st := e.pods[pod.Name]; st != nil && st.calibrate {
			r.partial = false
		}
		if r.partial {
			c.newData = append(c.newData, pod.Name)
		}
	}
}

// warming reports whether the pod's rates over the window at now include
// time before it was ready or warm.
func warming(p Params, pod Pod, now time.Time) bool {
	return !pod.ReadySince.IsZero() && pod.ReadySince.Add(p.SlowStart).After(now.Add(-p.horizon()))
}

// readCores solves, for every pod without a limit with latency data over a
// window of steady traffic (its share and the Service's load, c.loadMove,
// held; it did not reach its limit within it), the cores its queue shows: with u busy cores, s =
// u/requests CPU-seconds per request and mean latency L, the wait over the
// service time (L-s)/s is what an M/M/c queue of c cores shows at u busy
// cores, ErlangC(c, u)/(c-u). A wait within the readings' noise of the
// service time only says the pod has at least the cores that would show
// that much: the latency and CPU series are scraped apart, and cannot tell
// less from noise.
func readCores(set []Pod, c *cycleReadings, noise float64) {
	for i, pod := range set {
		r := &c.pods[i]
		if knownCores(pod) || !r.hasCPU || r.cpu <= 0 || !r.hasRequests || r.requests <= 0 || !r.hasLatency || !r.shareOK {
			continue
		}
		if math.Log(r.shareHi/r.shareLo*(1+c.loadMove)) > max(noise, minNoise()) || r.windowCPU > 0 {
			continue // the load changed within the window: its mean wait says little
		}
		lo, hi := coresBounds(pod)
		if r.limit > 0 {
			hi = min(hi, r.limit)
		}
		lo = max(lo, r.cpu)
		if hi <= 0 {
			hi = maxCores
		}
		hi = max(hi, lo)
		perRequest := r.cpu / r.requests
		wait := r.latency/perRequest - 1
		floor := max(noise, minNoise())
		seen := coresForWait(r.cpu, max(wait, floor), hi)
		r.cores = min(max(seen, lo), hi)
		r.coresBounded = wait <= floor || seen >= hi || seen <= lo
		r.coresAtCeiling = seen >= hi && r.limit > 0 && hi == r.limit
	}
}

// coresForWait solves ErlangC(c, a)/(c-a) = wait for c in (a, hi]: the
// cores of a pod that, busy a cores on average, makes requests wait wait
// times their service time. Between integers, 1/wait is interpolated
// linearly (from 0 at c = a). It returns hi when even hi cores would make
// requests wait that long or longer.
func coresForWait(a, wait, hi float64) float64 {
	if !(a > 0) || !(wait > 0) {
		return hi
	}
	limit := min(hi, maxCores)
	b := 1.0 // Erlang B by its stable recursion, B(0) = 1
	prevC, prevInv := a, 0.0
	for n := 1; float64(n) <= limit+1; n++ {
		b = a * b / (float64(n) + a*b)
		c := float64(n)
		if c <= a {
			continue
		}
		erlangC := c * b / (c - a*(1-b))
		inv := (c - a) / erlangC
		if inv >= 1/wait {
			t := (1/wait - prevInv) / (inv - prevInv)
			return min(prevC+t*(c-prevC), limit)
		}
		prevC, prevInv = c, inv
	}
	return limit
}

// backlogMemory is what the backlog reading needs from before: the pod's
// backlog one query window ago and the latency the last cycle saw.
type backlogMemory struct {
	before  float64
	latency float64
	alarmed func(ratio float64) bool
}

// readBacklogs measures each pod's backlog: the requests queued at it
// beyond its usual queue.
//
//   - With request rates and weights the clients follow (ROUND_ROBIN over
//     the engine's own live weights), over the window a pod was sent its
//     average share of the total, the total being what the pods that keep
//     up serve per unit of share (a median). Sent minus served, times the
//     window, is how much its queue grew: the backlog is the one a window
//     ago plus that growth, when the shortfall stands out of a Poisson
//     count's and the rates' misalignment's noise by zSigmas. A pod below
//     its limit whose queue did not grow had idle moments: none. A pod at
//     its limit had none, so its backlog, once started, is followed until
//     it clears; but a shortfall within the noise starts none there
//     either: a Poisson count's noise is no queue. (With a scrape interval
//     a quarter of the window, the misalignment's share, a third of what
//     the pod was sent, keeps any shortfall from standing out: the queue
//     is first read from the latency below.)
//   - Whatever the balancer, by Little's law a pod's latency beyond the
//     usual shows a queue: requests times the extra wait. The recent
//     latency that rings the alarm (see alarmed) gives it a cycle, or a
//     look, after the first scrape that shows it.
//
// A backlog is capped at one query window of the pod's capacity: clients
// time out long before a larger one would be served.
func readBacklogs(p Params, set []Pod, c *cycleReadings, mem []backlogMemory, followsWeights bool) {
	w := p.QueryWindow.Seconds()
	misalignment := p.misalignment()
	var perShare []float64
	if c.fromRequests && followsWeights {
		for _, r := range c.pods {
			if r.hasCPU && r.cpu > 0 && r.hasRequests && r.shareOK && !r.saturated {
				perShare = append(perShare, r.requests/math.Sqrt(r.shareLo*r.shareHi))
			}
		}
	}
	total := median(perShare)
	for i := range set {
		r := &c.pods[i]
		if !r.hasCPU || r.cpu <= 0 || !r.hasRequests || r.requests <= 0 {
			continue
		}
		r.capRate = r.requests
		if r.limit > 0 {
			r.capRate = max(r.requests, r.requests/r.cpu*r.limit)
		}
		q := 0.0
		if total > 0 && r.shareOK {
			sent := math.Sqrt(r.shareLo*r.shareHi) * total
			sd := math.Sqrt(r.requests*w+1) + misalignment*sent*w
			grew := (r.shareLo*total-r.requests)*w >= zSigmas*sd
			shrank := (r.requests-r.shareHi*total)*w >= zSigmas*sd
			switch {
			case r.limit > 0 && !r.saturated && !grew:
				q = 0
			case grew || shrank || (r.saturated && mem[i].before > 0):
				q = max(0, mem[i].before+(sent-r.requests)*w)
			}
		}
		if ref := mem[i].latency; ref > 0 && r.recentLatency > 0 && mem[i].alarmed != nil && mem[i].alarmed(r.recentLatency/ref) {
			q = max(q, r.requests*(r.recentLatency-ref))
		}
		q = min(q, r.capRate*w)
		if !(q >= 0) || math.IsInf(q, 0) {
			q = 0
		}
		r.backlog = q
	}
}

// recentServed returns, for each pod of set, the requests it served over
// span (the last two scrape intervals: Signal.RecentRequests) as a share
// of what it was sent, and what it was sent over span, a count; sent 0
// where unknown. What a pod was sent is its share of the live weights
// (which the caller knows the clients followed over span) times the
// Service's requests per unit of share, the median over the pods as in
// readBacklogs: a pod that falls behind does not move it (of two pods,
// the other's).
func recentServed(set []Pod, sig map[string]Signal, live map[string]uint32, span time.Duration) (served, sent []float64) {
	served, sent = make([]float64, len(set)), make([]float64, len(set))
	if live == nil {
		return served, sent
	}
	sum := 0.0
	for _, pod := range set {
		w, ok := live[pod.Name]
		if !ok || w == 0 {
			return served, sent
		}
		sum += float64(w)
	}
	var perShare []float64
	for _, pod := range set {
		if v, ok := sig[pod.Name]; ok && usable(v.RecentRequests) {
			perShare = append(perShare, v.RecentRequests/(float64(live[pod.Name])/sum))
		}
	}
	if len(perShare) < 2 {
		return served, sent
	}
	// Of two pods, each is read against the other: the median of two is
	// their mean, which a pod that fell behind would pull down with it.
	pair := len(perShare) == 2
	total := median(slices.Clone(perShare))
	k := 0
	for i, pod := range set {
		v, ok := sig[pod.Name]
		if !ok || !usable(v.RecentRequests) {
			continue
		}
		t := total
		if pair {
			t = perShare[1-k]
		}
		k++
		if !(t > 0) || math.IsInf(t, 0) {
			continue
		}
		expected := float64(live[pod.Name]) / sum * t
		served[i], sent[i] = v.RecentRequests/expected, expected*span.Seconds()
	}
	return served, sent
}

// offeredLoad is the work the pods did over the window, in busy cores
// times speed per core, over the pods with CPU data.
func offeredLoad(c *cycleReadings, perCore []float64) float64 {
	sum := 0.0
	for i, r := range c.pods {
		if r.hasCPU {
			sum += r.cpu * perCore[i]
		}
	}
	return sum
}

// coresBounds returns the range the pod's cores can be in, from its CPU
// request and its node's allocatable CPU (0 for an unknown end).
func coresBounds(pod Pod) (lo, hi float64) {
	if pod.CPURequest > 0 && pod.CPURequest <= maxCores {
		lo = pod.CPURequest
	}
	if pod.NodeCores > 0 && pod.NodeCores <= maxCores {
		hi = pod.NodeCores
	}
	if hi > 0 && lo > hi {
		lo = hi
	}
	return lo, hi
}

// clampCores returns c within the pod's cores bounds (coresBounds).
func clampCores(pod Pod, c float64) float64 {
	lo, hi := coresBounds(pod)
	if hi > 0 {
		c = min(c, hi)
	}
	return max(c, lo)
}

// knownCores reports whether the pod's Cores is a plausible CPU limit.
func knownCores(pod Pod) bool { return pod.Cores > 0 && pod.Cores <= maxCores }

// maxCores is more CPU than one pod has (the largest machines have a few
// hundred cores); larger values are taken as noise.
const maxCores = 1024
