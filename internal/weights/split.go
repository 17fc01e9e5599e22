package weights

import (
	"cmp"
	"math"
	"slices"
	"sort"
)

// Capacity shares give every pod the same utilisation, which is what a
// busy Service needs. A Service with room to spare is better served by
// sending more to the pods that finish a request sooner: at 20% load a
// request on a pod of speed 0.35 takes three times as long as on a pod of
// speed 1, and the queue it would have waited in on the fast pod is
// short. The split that minimises the mean time of a request gives every
// pod in use the same marginal cost: for pod i with speed per core v,
// c cores and utilisation rho, the time of a request is (1/v)(1 + w(rho)),
// w the mean wait over the service time; the marginal cost of sending it
// one more request is (1/v)(1 + d(rho w)/d rho). Pods whose cost at zero
// load (1/v) is above the common marginal cost get nothing (the MaxRatio
// floor). w is Sakasegawa's approximation of the M/M/c wait,
// rho^(sqrt(2(c+1))-1) / (c(1-rho)). As the load nears the capacity,
// every pod's marginal cost is dominated by its queue and, for pods of
// one core count, the split tends to capacity shares; at low load it
// favours the fast pods.
//
// Unlike core counts need more than capacity shares at any load: at one
// utilisation a pod's queue is the shorter the more cores it has (at 85%,
// Sakasegawa's wait is 5.7 service times on one core and 0.5 on eight),
// so equal utilisation leaves the few-core pods to set the tail. Above
// the split's range the weights therefore give each pod the utilisation
// at which one more unit of load adds the same wait in units of its own
// service time, d(rho w)/d rho equal across pods (queueUtilisations):
// the many-core pods run fuller, the few-core ones emptier, and pods of
// one core count, whatever their speeds, keep capacity shares exactly
// (the product's contract for ROUND_ROBIN; the speed part of the full
// optimum is the split's, at low load only). Cores that are estimated
// (pods without a limit) are pooled first, as speeds are (poolSpeeds,
// within coresPool), so that noise in the estimates of pods with equal
// cores does not spread their utilisations.
//
// The offered load is measured each cycle as the pods' busy cores times
// their speed per core (requests served, in units of work), so it does
// not depend on how the traffic was split.

const (
	// splitIterations bounds the bisections of the split.
	splitIterations = 48
	// splitFullBelow and splitNoneFrom: the split is used in full below
	// this share of the capacity, not at all from that one up, blended in
	// between (see targets).
	splitFullBelow = 0.4
	splitNoneFrom  = 0.6
	// offeredGain is the weight of a new measurement of the offered load.
	offeredGain = 0.25
	// maxSplitLoad: above this share of the capacity the split is plain
	// capacity shares (the optimum there is within noise of them), and so
	// are the utilisations of unlike cores (queueUtilisations): a Service
	// that full has no headroom to move between its pods.
	maxSplitLoad = 0.98
	// fillGrid is the log-scale step within which fillTo takes cores (and
	// speeds) as equal while it solves for the marginal cost (each pod's
	// own utilisation is then computed from its own).
	fillGrid = 0.01
	// queueFadeFrom: see queueUtilisations. At 90% load the fullest of
	// 1- to 8-core pods is at 93%; at 96% it would be at the saturation
	// threshold (saturatedUse).
	queueFadeFrom = 0.9
	// queueFullest bounds the utilisation queueUtilisations gives any pod,
	// below saturatedUse with room for the speed tilt (about 1%): with
	// many few-core pods beside one large one, the large one is past 96%
	// before the load reaches queueFadeFrom (one 32-core pod beside a
	// hundred 1-core ones: 97.5% at 89% load).
	queueFullest = 0.95
	// coresPool is the log-scale band within which estimated cores are
	// pooled before queueUtilisations (see poolSpeeds; the split takes
	// them as they are):
	// the node's idle CPU of one window strays by 10-30% of a pod's cores,
	// and the cores read from the latency by up to 15% under heavy-tailed
	// work, so pods whose estimates are within about a fifth are taken as
	// alike (2 and 2.2 cores come out 2.09 and 2.10), pods 1.5 times
	// apart partly (2 and 3 cores: 2.19 and 2.74), and pods 1.82 times
	// apart or more (2 and 4 cores) not at all.
	coresPool = 0.2
	// requestsGrace is how many cycles without request rates (a patchy
	// window, a failed scrape) keep unlike cores at unlike utilisations
	// before CPU alone's rule takes over (see targets).
	requestsGrace = 3
)

// queueUtilisations returns the utilisation of each pod, of cores c and
// speed per core v, at which its marginal queueing cost d(rho w)/d rho
// (w the Sakasegawa wait over the service time) is the same as every
// other pod's, for a Service doing load units of work; ok is false when
// it does not apply (cores or speeds not positive and finite, no load, or
// the load at maxSplitLoad of the capacity or more). Pods of equal cores
// get equal utilisations, load over capacity; a pod with more cores gets
// a higher one.
func queueUtilisations(c, v []float64, load float64) (rho []float64, ok bool) {
	if !splittable(c, v, load) {
		return nil, false
	}
	// The utilisation of a pod at marginal cost m is utilisationAt with
	// speed 1 and cost 1+m (the cost of a request of unit work).
	at := func(i int, m float64) float64 { return utilisationAt(c[i], 1, 1+m) }
	m, ok := fillTo(c, v, load, at, false, 0, 1, func(lo, hi float64) float64 { return (lo + hi) / 2 })
	if !ok {
		return nil, false
	}
	// From queueFadeFrom of the capacity up to maxSplitLoad the
	// utilisations fade to the Service's own, so that the fullest pod
	// stays below saturatedUse (which would take the split away, and the
	// fade back, next cycle) and nothing jumps at maxSplitLoad. The fade
	// keeps the load met: sum c v (u + f(rho-u)) = load.
	capacity := 0.0
	for i := range c {
		capacity += c[i] * v[i]
	}
	// The fade is also bound so that the fullest pod stays at most
	// queueFullest, whatever the mix; both bounds are continuous in the
	// load, and both keep the load met.
	u := load / capacity
	f := min(1, (maxSplitLoad-u)/(maxSplitLoad-queueFadeFrom))
	rho = make([]float64, len(c))
	fullest := 0.0
	for i := range c {
		rho[i] = at(i, m)
		fullest = max(fullest, rho[i])
	}
	if fullest > queueFullest {
		f = min(f, max(0, (queueFullest-u)/(fullest-u)))
	}
	for i := range c {
		rho[i] = u + f*(rho[i]-u)
	}
	return rho, true
}

// splittable reports whether the split and queueUtilisations apply: every
// pod's cores and speed per core positive and finite, and a load above
// zero and below maxSplitLoad of their capacity.
func splittable(c, v []float64, load float64) bool {
	capacity := 0.0
	for i := range c {
		if !(c[i] > 0) || !(v[i] > 0) || math.IsInf(c[i]*v[i], 0) {
			return false
		}
		capacity += c[i] * v[i]
	}
	return load > 0 && load < maxSplitLoad*capacity
}

// fillTo returns the common marginal cost m at which the pods, each at
// utilisation at(i, m), do load units of work: hi is doubled from the
// given value until they do at least that much, then [lo, hi] is
// bisected at mid(lo, hi); ok is false when 61 doublings do not reach it.
// at(i, m) depends on pod i's cores only, or on its cores and speed when
// bySpeed, so pods whose cores (and speeds) round to the same step of
// fillGrid in log scale are summed as one (the first of them stands for
// all): a Service of 4096 pods with as many estimated cores took a second
// a cycle, pod by pod.
func fillTo(c, v []float64, load float64, at func(i int, m float64) float64, bySpeed bool, lo, hi float64, mid func(lo, hi float64) float64) (m float64, ok bool) {
	type group struct {
		pod  int
		work float64 // the group's cores times speed
	}
	var groups []group
	index := map[[2]int64]int{}
	for i := range c {
		key := [2]int64{int64(math.Round(math.Log(c[i]) / fillGrid)), 0}
		if bySpeed {
			key[1] = int64(math.Round(math.Log(v[i]) / fillGrid))
		}
		g, seen := index[key]
		if !seen {
			g = len(groups)
			index[key] = g
			groups = append(groups, group{pod: i})
		}
		groups[g].work += c[i] * v[i]
	}
	work := func(m float64) float64 {
		sum := 0.0
		for _, g := range groups {
			sum += g.work * at(g.pod, m)
		}
		return sum
	}
	for k := 0; work(hi) < load; k++ {
		if k > 60 {
			return 0, false
		}
		hi *= 2
	}
	for range splitIterations {
		if m := mid(lo, hi); work(m) < load {
			lo = m
		} else {
			hi = m
		}
	}
	return hi, true
}

// sakasegawaCost is d(rho w)/d rho for c cores at utilisation rho.
func sakasegawaCost(c, rho float64) float64 {
	if rho <= 0 {
		return 0
	}
	k := math.Sqrt(2*(c+1)) - 1
	return math.Pow(rho, k) * ((k+1)*(1-rho) + rho) / (c * (1 - rho) * (1 - rho))
}

// utilisationAt is the rho in [0, 1) where (1/v)(1 + cost(rho)) = m.
func utilisationAt(c, v, m float64) float64 {
	target := m*v - 1
	if target <= 0 {
		return 0
	}
	lo, hi := 0.0, 1.0
	for range splitIterations {
		mid := (lo + hi) / 2
		if sakasegawaCost(c, mid) < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// latencySplit returns the traffic each pod should get (in units of work
// per time) to minimise the mean time of a request, for pods of cores c
// and speed per core v at an offered load; ok is false when it does not
// apply (no load known, cores unknown, or the load near the capacity).
func latencySplit(c, v []float64, load float64) (out []float64, ok bool) {
	if !splittable(c, v, load) {
		return nil, false
	}
	// The common marginal cost lies between the fastest pod's time at
	// zero load and a cost high enough to fill every pod to the load.
	lo := math.Inf(1)
	for i := range v {
		lo = min(lo, 1/v[i])
	}
	at := func(i int, m float64) float64 { return utilisationAt(c[i], v[i], m) }
	m, ok := fillTo(c, v, load, at, true, lo, 2*lo, func(lo, hi float64) float64 { return math.Sqrt(lo * hi) })
	if !ok {
		return nil, false
	}
	out = make([]float64, len(c))
	for i := range c {
		out[i] = c[i] * v[i] * at(i, m)
	}
	return out, true
}

// offeredLoad is the work the pods did over the window: the sum of busy
// cores times speed per core, over pods with CPU data; 0 unless every pod
// has it (a partial sum would understate the load).
func (e *Engine) offeredLoad(set []Pod, sig signals) float64 {
	_, perCore := e.capacitiesPerCore(set)
	sum := 0.0
	for i := range set {
		ps := sig.pods[i]
		if !ps.hasCPU {
			return 0
		}
		sum += ps.cpu * perCore[i]
	}
	return sum
}

// poolSpeeds returns the speeds per core drawn together where the
// estimates cannot tell them apart: each is replaced by a weighted
// geometric mean of the speeds near it, pod j weighing (1-(d/3)²)² (zero
// from d = 3: poolReach) for d the log distance of the two speeds over the
// narrower of the two pods' bands (tol, see poolBands). The split is a
// threshold rule: a pod whose time at zero load is above the common
// marginal cost gets nothing, so among pods of one hardware class, whose
// estimates differ only by noise, it would send the traffic the fast pods
// should not take to whichever estimate is a hair faster, and to another
// one the next cycle: a write each time, for a few percent of the traffic
// (the bench's hetero3-20-lowload wrote 34 times in 20 minutes). Speeds a
// fraction of a band apart come out all but equal, so such pods share that
// traffic evenly; speeds three bands apart or more are untouched. The
// weights are smooth in the speeds, so a speed drifting across a band
// moves the pooled speeds a little, not a class from one pool to another
// (a hard cut did, on classes 7% apart); the narrower band keeps a young
// pod's wide band from pulling well-measured pods. A speed that is not
// positive and finite is left as it is and pools with none. The cost is
// the pairs within reach: all of them for a Service of one class.
func poolSpeeds(v []float64, tol []float64) []float64 {
	out := slices.Clone(v)
	type speed struct {
		log, tol float64
		i        int
	}
	sorted := make([]speed, 0, len(v))
	for i := range v {
		if v[i] > 0 && !math.IsInf(v[i], 0) && tol[i] > 0 {
			sorted = append(sorted, speed{math.Log(v[i]), tol[i], i})
		}
	}
	slices.SortStableFunc(sorted, func(a, b speed) int { return cmp.Compare(a.log, b.log) })
	for _, s := range sorted {
		// Only pods within poolReach of its own band can weigh anything.
		reach := poolReach * s.tol
		lo := sort.Search(len(sorted), func(k int) bool { return s.log-sorted[k].log <= reach })
		sum, logSum := 0.0, 0.0
		for b := lo; b < len(sorted) && sorted[b].log-s.log <= reach; b++ {
			d := (s.log - sorted[b].log) / min(s.tol, sorted[b].tol) / poolReach
			k := max(0, 1-d*d)
			k *= k
			sum += k
			logSum += k * sorted[b].log
		}
		out[s.i] = math.Exp(logSum / sum)
	}
	return out
}

// poolReach: see poolSpeeds.
const poolReach = 3
