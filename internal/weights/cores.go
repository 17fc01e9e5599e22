package weights

import (
	"math"
	"time"
)

// Pods without a CPU limit (Pod.Cores = 0) can use what their node leaves
// them, which no API reports. Their speed per core still shows (requests
// per CPU-second), but a pod's capacity is that speed times its cores, so
// the cores must be estimated.
//
// The sidecar's latency shows them. Over a window a pod serves r requests
// per second using u cores (u busy workers on average), so each request
// takes s = u/r CPU-seconds, and the mean time a request waited in the pod
// before being served is W = latency - s. For a pod of c cores fed about
// r requests per second (the sum of many clients' streams is close to
// Poisson), queueing theory (Erlang C) ties the three: W/s =
// ErlangC(c, u)/(c - u), which falls steeply as c grows past u. The
// engine solves it for c. The answer does not depend on how loaded the pod
// is, only on how its queue behaves at that load: a pod with spare cores
// shows almost no wait at a CPU use where a pod without them queues.
//
// The estimate is bounded below by the pod's CPU request and by the CPU it
// was seen to use, and above by its node's allocatable CPU. A tiny wait
// only says the pod has at least the cores that would show that wait; the
// wait is floored at minWaitRatio for that. Estimates are averaged in log
// scale over cycles (coresGain), from windows over which the pod's share of
// the traffic held (a mean wait over a window whose load changed says
// little). Until a pod has one, its cores are the geometric mean of its
// bounds; without latency data (CPU only), that is all there is.

const (
	// minWaitRatio is the least wait, relative to the CPU time per
	// request, taken as measured: below it the latency and CPU series, which
	// are scraped apart, cannot tell a wait from noise.
	minWaitRatio = 0.02
	// coresGain is the weight of a new cores observation once a few are in.
	coresGain = 0.25
	// ceilingGain is the least weight of a new ceiling observation (see
	// foldCeiling): the ceilings are averaged plainly over the first
	// cycles and then with this gain (about the last ten cycles), since
	// the node's idle CPU of one window is noisy (its neighbours' use
	// varies from scrape to scrape) and the weights of pods near their
	// limit follow every error of it. A jump beyond the pod's usual noise
	// (a neighbour that came or went) restarts the average.
	ceilingGain = 0.1
	// steadyShare: a window in which the pod's traffic share moved by more
	// than this ratio does not measure its cores.
	steadyShare = 1.1
	// maxSolveCores bounds the cores the solver considers.
	maxSolveCores = 1024
)

// ceilings sets every pod's limit for this cycle: its Cores when it has a
// limit; else, when its node's CPU in use is known (Signal.NodeCPU), its
// own CPU plus its share of what the node left idle (the node's
// allocatable CPU minus its CPU in use), which is all it could have used:
// pods of the set on one node share that idle CPU in proportion to the
// CPU they use (equally when they use none).
func ceilings(set []Pod, pods []podSignal) {
	type node struct {
		idle, busy float64
		n          int
	}
	nodes := map[string]*node{}
	counted := make([]bool, len(set)) // in its node's sums
	key := func(i int) string {
		if set[i].Node == "" {
			return "\x00" + set[i].Name // a pod of an unknown node is alone on it
		}
		return set[i].Node
	}
	for i, pod := range set {
		ps := &pods[i]
		if knownCores(pod) {
			ps.limit = pod.Cores
			continue
		}
		_, hi := coresBounds(pod)
		if !ps.hasCPU || ps.nodeCPU <= 0 || hi <= 0 {
			continue
		}
		nd := nodes[key(i)]
		if nd == nil {
			nd = &node{idle: math.Inf(-1)}
			nodes[key(i)] = nd
		}
		// The node's figures come with each of its pods; they are one
		// series, so they agree but for the scrape that read them.
		nd.idle = max(nd.idle, hi-ps.nodeCPU)
		nd.busy += ps.cpu
		nd.n++
		counted[i] = true
	}
	for i := range set {
		ps := &pods[i]
		if !counted[i] {
			continue // a limit, or no data to share its node's idle CPU by
		}
		nd := nodes[key(i)]
		share := 1 / float64(nd.n)
		if nd.busy > 0 {
			share = ps.cpu / nd.busy
		}
		ps.limit = ps.cpu + max(0, nd.idle)*share
		ps.nodeCeiling = max(ps.cpu+nd.idle*share, ps.cpu/2)
	}
}

// smoothCeilings averages each pod's ceiling (its own CPU plus its share
// of its node's idle CPU, podSignal.nodeCeiling) over cycles, since the
// node's other tenants' use varies and its idle CPU is read from another
// series than the pod's. With CPU alone the pod's limit this cycle is the
// lower of the average and this window's ceiling (but no less than its
// use); with request rates the pod has none (the average bounds its
// cores, see coresOf). A pod whose node CPU is
// missing this cycle (a failed scrape, a restarted exporter) keeps its
// average for up to Expiry, as weights do when the query fails: a gap in
// one series is no news about the pod, and without it a pod would turn
// blind (see markBlind), and the load balancer flip, for one cycle.
func (e *Engine) smoothCeilings(now time.Time, set []Pod, sig signals) {
	for i, pod := range set {
		ps := &sig.pods[i]
		if knownCores(pod) {
			continue
		}
		st := e.pods[pod.Name]
		if st != nil && (st.ceilingNode != pod.Node || now.Sub(st.ceilingAt) > e.params.Expiry) {
			// Another node's, or too old to speak for it.
			st.ceiling, st.ceilingN, st.ceilingRatios = 0, 0, nil
		}
		// No ceiling this window: the average stands. (A positive
		// nodeCeiling comes with a positive limit.)
		window := math.Inf(1)
		if ps.nodeCeiling > 0 {
			window = ps.limit
			st = e.state(pod.Name)
			st.ceilingAt, st.ceilingNode = now, pod.Node
			st.foldCeiling(ps.nodeCeiling)
		}
		if st == nil || st.ceiling <= 0 {
			continue
		}
		if sig.fromRequests {
			// With request rates a backlog is measured, and a pod near its
			// ceiling judged saturated by the node's noise would be drained
			// and LEAST_REQUEST kept for nothing: the ceiling only bounds
			// its cores (coresOf).
			ps.limit = 0
			continue
		}
		// With CPU alone, being at its limit is the only sign that a pod
		// is overloaded, so saturation is judged against the lower of
		// this window's ceiling and the average: the idle CPU a saturated
		// pod's node shows is noise around zero, which the average holds
		// above its use. It used what it used, whatever either says.
		ps.limit = max(min(st.ceiling, window), ps.cpu)
	}
}

// foldCeiling averages a ceiling observation into the pod's ceiling: a
// plain average of the observations so far, down to ceilingGain. One
// farther from the average than surpriseSigmas of the pod's usual
// distance (recentNoise of its last ceilingRatios) is a real change, a
// neighbour that came or went, and the average restarts from it. A
// drift is followed at ceilingGain a cycle: an average that lags a rising
// ceiling holds a pod near it below its use, saturated by the lag alone
// (with CPU alone it is then drained by a fifth and LEAST_REQUEST kept
// until the average catches up). A CUSUM on the distances, as fold has,
// was tried: the distances grow with the lag, so the drift never stood
// out of them, and measuring the noise on the steps between windows
// instead (which overlap, as the query window is longer than the cycle)
// restarted the average on noise and cost the nolimits files up to 6%.
func (st *podState) foldCeiling(seen float64) {
	if st.ceiling <= 0 {
		st.ceiling, st.ceilingN = seen, 1
		return
	}
	r := math.Log(seen / st.ceiling)
	if math.Abs(r) > surpriseSigmas*recentNoise(st.ceilingRatios) {
		st.ceiling, st.ceilingN = seen, 1
	} else {
		st.ceiling *= math.Exp(max(ceilingGain, 1/float64(st.ceilingN+1)) * r)
		st.ceilingN = min(st.ceilingN+1, maxMeasurements)
	}
	st.ceilingRatios = noteRatio(st.ceilingRatios, r)
}

// markBlind marks the pods the engine cannot learn from with CPU alone
// (unlearned counts them): no request rates (so no backlog and no
// latency), no CPU limit but a CPU request or a node's allocatable CPU (so
// the cores are known to be somewhere in a range: a pod of which nothing
// about its cores is known is taken to have as many as the others, as
// Pod.Cores says), and no ceiling from their node's CPU. Such a
// pod's speed would be read as its traffic share per CPU-second, but once
// it is past its cores its CPU stops growing with its share, so it looks
// the faster the more it is sent, and its weight runs away (the bench's
// nolimits scenarios without node CPU went to thousands of times the
// oracle's p99). Nothing in CPU alone tells that from a fast pod. So a
// blind pod is not sighted (see sight) and has no estimate of its own
// (one from a Seed, or learned before it turned blind, would hold whatever
// weight it had, a runaway one included), so it is weighted like any pod
// without an estimate: the speed of the pods measured, at its guessed
// cores (see coresOf). Result.Learned stays false while it is in the set:
// the operator keeps LEAST_REQUEST, which steers around its queue if the
// guess is high. That is Istio's default and what the Service had
// before, never worse. A pod without CPU data this cycle stays as it was:
// a gap is no news.
func (e *Engine) markBlind(set []Pod, sig signals) {
	for i, pod := range set {
		ps := sig.pods[i]
		if !ps.hasCPU {
			continue
		}
		lo, hi := coresBounds(pod)
		blind := !sig.fromRequests && !knownCores(pod) && (lo > 0 || hi > 0) && ps.limit <= 0
		st := e.pods[pod.Name]
		switch {
		case blind:
			st = e.state(pod.Name)
			st.blind, st.known, st.fromData, st.measurements = true, false, false, 0
		case st != nil:
			st.blind = false
		}
	}
}

// unlearned counts the pods of the set marked blind (Result.Unlearned).
func (e *Engine) unlearned(set []Pod) int {
	n := 0
	for _, pod := range set {
		if st := e.pods[pod.Name]; st != nil && st.blind {
			n++
		}
	}
	return n
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
		lo = hi // a request above the node's CPU: trust the node
	}
	return lo, hi
}

// coresOf returns the cores the engine takes the pod to have: its limit,
// else its estimate from the latency, else its ceiling (what its node
// leaves it), else the middle of its bounds; 0 when nothing is known.
func (e *Engine) coresOf(pod Pod) float64 {
	if knownCores(pod) {
		return pod.Cores
	}
	if st := e.pods[pod.Name]; st != nil {
		// The latency's measure first: the node's idle CPU is noisier
		// (the neighbours' use varies) and only stands in without it.
		if st.cores > 0 {
			return st.cores
		}
		if st.ceiling > 0 {
			return st.ceiling
		}
	}
	lo, hi := coresBounds(pod)
	switch {
	case lo > 0 && hi > 0:
		return math.Sqrt(lo * hi)
	case lo > 0:
		return lo
	default:
		return hi
	}
}

// estimateCores updates the cores estimate of every pod without a limit
// from this cycle's signals.
func (e *Engine) estimateCores(now time.Time, set []Pod, sig signals, shares []shareSpan) {
	for i, pod := range set {
		if knownCores(pod) {
			continue
		}
		ps := sig.pods[i]
		if !ps.hasCPU || ps.cpu <= 0 || !ps.hasRequests || ps.requests <= 0 || !ps.hasLatency {
			continue
		}
		if !shares[i].ok || shares[i].hi > steadyShare*shares[i].lo || e.warming(pod, now) {
			continue
		}
		lo, hi := coresBounds(pod)
		if ps.limit > 0 {
			hi = min(hi, ps.limit)
		}
		lo = max(lo, ps.cpu)
		if hi <= 0 {
			hi = maxSolveCores
		}
		hi = max(hi, lo)
		perRequest := ps.cpu / ps.requests
		wait := max(ps.latency/perRequest-1, minWaitRatio)
		c := min(max(coresForWait(ps.cpu, wait, hi), lo), hi)

		st := e.state(pod.Name)
		if st.cores <= 0 || st.coresMeasured == 0 {
			st.cores = c
		} else {
			g := max(coresGain, 1/float64(st.coresMeasured+1))
			st.cores = math.Exp((1-g)*math.Log(st.cores) + g*math.Log(c))
		}
		st.cores = min(max(st.cores, lo), hi)
		st.coresMeasured = min(st.coresMeasured+1, maxMeasurements)
	}
}

// coresForWait solves ErlangC(c, a)/(c-a) = wait for c in (a, hi]: the
// cores of a pod that, busy a cores on average, makes requests wait wait
// times their service time. The left side falls as c grows; between
// integers, 1/wait is interpolated linearly (from 0 at c = a). It returns hi
// when even hi cores would make requests wait that long or longer.
func coresForWait(a, wait, hi float64) float64 {
	if !(a > 0) || !(wait > 0) {
		return hi
	}
	limit := min(hi, maxSolveCores)
	// Erlang B by its stable recursion, B(0) = 1.
	b := 1.0
	prevC, prevInv := a, 0.0 // at c = a the wait is infinite
	for n := 1; float64(n) <= limit+1; n++ {
		b = a * b / (float64(n) + a*b)
		c := float64(n)
		if c <= a {
			continue
		}
		erlangC := c * b / (c - a*(1-b))
		inv := (c - a) / erlangC // 1/(wait ratio) at c cores
		if inv >= 1/wait {
			// Between prevC and c.
			t := (1/wait - prevInv) / (inv - prevInv)
			return min(prevC+t*(c-prevC), limit)
		}
		prevC, prevInv = c, inv
	}
	return limit
}
