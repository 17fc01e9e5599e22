package weights

import "math"

// Stage 3, decide: one solver for the promise. Minimise the Service's
// total time in system, sum of x_i T_i(x_i), subject to sum x_i = load and
// x_i <= maxUtilisation * mu_i, where x_i is pod i's traffic in units of
// work (busy cores times speed per core), mu_i = c_i v_i its capacity and
// T_i its mean time per request as an M/M/c queue of c_i cores of speed
// v_i: (1/v_i)(1 + w(c_i, rho_i)), w the wait over the service time by
// Sakasegawa's approximation, rho^(sqrt(2(c+1))-1) / (c(1-rho)), which is
// convex and holds for the non-integer cores of estimates. A pod whose
// cores are unknown takes the median's: the same convex cost, scaled.
//
// At the optimum every pod below its cap has the same marginal cost,
// (1/v_i)(1 + d(rho w)/d rho); water-filling on it finds it. Near full
// load every pod's marginal cost is dominated by its queue and pods of one
// core count tend to capacity shares (every pod equally busy, the
// ROUND_ROBIN contract); below it the rule sends less to slower pods (those
// whose time at zero load is above the common marginal cost get nothing
// but the MaxRatio floor); with unlike cores it runs many-core pods fuller,
// since their queues are shorter at one utilisation.
//
// A backlog is capacity the pod owes: while it drains, the pod's capacity
// is mu_i minus its backlog over DrainTime, and it is sent no more than it
// has now. A pod without data keeps the traffic it has.

// maxUtilisation caps the utilisation the solver gives any pod: below
// saturatedUse by the few percent an estimate is off after it has settled,
// so a pod run fullest by the rule is not judged saturated by its noise.
const maxUtilisation = 0.93

// decidePod is one pod as the solver sees it.
type decidePod struct {
	c, v float64 // cores and (effective) speed per core, both > 0
	// fixed: the pod keeps x (no data); else upper bounds its traffic
	// (+Inf for none) besides the utilisation cap.
	fixed    bool
	x, upper float64
	// overloaded: the data shows the pod behind (a backlog, or at its
	// limit), for publish.
	overloaded bool
}

// Split is the promise solved on known capacities: the traffic the engine's
// solver gives pods of cores[i] cores of speed speeds[i] per core (any
// consistent unit) at a total load in the same unit (busy cores times
// speed), as shares that sum to 1, with no bound on how little a pod gets:
// what a benchmark's oracle of the best static weights or a test compares
// with. Pods with no valid cores or speed get 0.
func Split(cores, speeds []float64, load float64) []float64 {
	pods := make([]decidePod, len(cores))
	for i := range pods {
		pods[i] = decidePod{c: cores[i], v: speeds[i], upper: math.Inf(1)}
	}
	return normalized(solve(pods, load))
}

// SplitWithin is Split kept within ratio of the mean share, as the engine
// keeps the weights it publishes (Params.MaxRatio): what the engine
// converges to when its estimates are right. Split's gap to it is the
// bound's price; the engine's gap to it is what the estimates cost (and
// the time it takes to learn them). It clamps Split as the engine does,
// rather than solving again under the bound. Pods with no valid cores or
// speed get the least share the ratio allows. A ratio of 1 or less (or
// NaN) gives equal shares, +Inf Split's.
func SplitWithin(cores, speeds []float64, load, ratio float64) []float64 {
	x := Split(cores, speeds, load)
	clampRatio(x, ratio)
	return normalized(x)
}

// solve returns each pod's traffic for a total load. Pods with no valid
// cores or speed get nothing; a load the free pods cannot take below their
// caps is split in proportion to their capacities (everyone equally busy),
// within their upper bounds.
func solve(pods []decidePod, load float64) []float64 {
	x, _ := solveBounds(pods, load)
	return x
}

// bounds is what solve held: the pods it gave their cap or upper bound
// (at; nil where no cap applies: the load unknown, or taken by the pods
// without data), and the marginal cost the others share (level; 0 where
// every pod is held, past every cap).
type bounds struct {
	at    []bool
	level float64
}

// solveBounds is solve, with the bounds it held.
func solveBounds(pods []decidePod, load float64) ([]float64, bounds) {
	x := make([]float64, len(pods))
	free := load
	var open []int
	capacity := 0.0
	for i, p := range pods {
		if p.fixed {
			x[i] = p.x
			free -= p.x
			continue
		}
		if !(p.c > 0) || !(p.v > 0) || math.IsInf(p.c*p.v, 0) {
			continue
		}
		open = append(open, i)
		capacity += p.c * p.v
	}
	if len(open) == 0 {
		return x, bounds{}
	}
	if !(load > 0) || math.IsInf(load, 0) {
		// Unknown load: capacity shares of what the fixed pods leave,
		// their x being shares of the total.
		fixedShare := 0.0
		for i, p := range pods {
			if p.fixed {
				fixedShare += p.x
				x[i] = p.x
			}
		}
		sum := 0.0
		for _, i := range open {
			x[i] = min(pods[i].c*pods[i].v, pods[i].upper)
			sum += x[i]
		}
		if sum > 0 && fixedShare > 0 && fixedShare < 1 {
			for _, i := range open {
				x[i] *= (1 - fixedShare) / sum
			}
		}
		return x, bounds{}
	}
	if !(free > 0) || math.IsInf(free, 0) {
		// No load left for the free pods: capacity shares, of a nominal
		// total.
		for _, i := range open {
			x[i] = min(pods[i].c*pods[i].v, pods[i].upper)
		}
		return x, bounds{}
	}
	limit := func(i int) float64 { return min(maxUtilisation*pods[i].c*pods[i].v, pods[i].upper) }
	room := 0.0
	for _, i := range open {
		room += limit(i)
	}
	held := bounds{at: make([]bool, len(pods))}
	if free >= room {
		// Past every cap: everyone equally busy within their bounds.
		for _, i := range open {
			x[i] = min(free*pods[i].c*pods[i].v/capacity, max(pods[i].upper, 0))
			held.at[i] = true
		}
		return x, held
	}
	at := func(i int, m float64) float64 {
		p := pods[i]
		return min(p.c*p.v*utilisationAt(p.c, p.v, m), limit(i))
	}
	// Pods of equal cores and speed (to a percent) fill alike: sum them as
	// one group unless bounded.
	type group struct {
		pod int
		n   float64
	}
	var groups []group
	index := map[[2]int64]int{}
	for _, i := range open {
		if !math.IsInf(pods[i].upper, 1) {
			groups = append(groups, group{i, 1})
			continue
		}
		key := [2]int64{int64(math.Round(math.Log(pods[i].c) * 100)), int64(math.Round(math.Log(pods[i].v) * 100))}
		g, ok := index[key]
		if !ok {
			g = len(groups)
			index[key] = g
			groups = append(groups, group{pod: i})
		}
		groups[g].n++
	}
	total := func(m float64) float64 {
		s := 0.0
		for _, g := range groups {
			s += g.n * at(g.pod, m)
		}
		return s
	}
	lo := math.Inf(1)
	for _, i := range open {
		lo = min(lo, 1/pods[i].v)
	}
	hi := 2 * lo
	for k := 0; total(hi) < free; k++ {
		if k > 1000 {
			break
		}
		hi *= 2
	}
	// Bisect the common marginal cost in log scale to float precision.
	for range 60 {
		mid := math.Sqrt(lo * hi)
		if total(mid) < free {
			lo = mid
		} else {
			hi = mid
		}
	}
	got := 0.0
	for _, i := range open {
		x[i] = at(i, hi)
		got += x[i]
		// at gives exactly the limit where it holds the pod there.
		if held.at[i] = x[i] >= limit(i); !held.at[i] {
			held.level = hi
		}
	}
	if got > 0 {
		for _, i := range open {
			x[i] *= free / got // the bisection's last fraction of a percent
		}
	}
	return x, held
}

// marginalCost is d(x T(x))/dx of one pod at x, on timeInSystem's curve
// (its tangent past 0.99); 0 for a pod without traffic or model.
func marginalCost(p decidePod, x float64) float64 {
	if !(x > 0) || !(p.c > 0) || !(p.v > 0) {
		return 0
	}
	rho := x / (p.c * p.v)
	if rho <= 0.99 {
		return (1 + sakasegawaCost(p.c, rho)) / p.v
	}
	// d(rho (1 + w(rho)))/d rho on the tangent: 1 + w + rho w'.
	w, slope := tangentWait(p.c, rho)
	return (1 + w + rho*slope) / p.v
}

// tangentWait is timeInSystem's wait over the service time for c cores at
// utilisation rho past 0.99, continued along its tangent (the secant over
// the last percent), with the tangent's slope.
func tangentWait(c, rho float64) (w, slope float64) {
	w = sakasegawaWait(c, 0.99)
	slope = (w - sakasegawaWait(c, 0.98)) / 0.01
	return w + slope*(rho-0.99), slope
}

// sakasegawaCost is d(rho w)/d rho for c cores at utilisation rho.
func sakasegawaCost(c, rho float64) float64 {
	if rho <= 0 {
		return 0
	}
	k := math.Sqrt(2*(c+1)) - 1
	return math.Pow(rho, k) * ((k+1)*(1-rho) + rho) / (c * (1 - rho) * (1 - rho))
}

// sakasegawaWait is w, the mean wait over the service time, for c cores at
// utilisation rho; +Inf at or past 1.
func sakasegawaWait(c, rho float64) float64 {
	if rho >= 1 {
		return math.Inf(1)
	}
	if rho <= 0 {
		return 0
	}
	return math.Pow(rho, math.Sqrt(2*(c+1))-1) / (c * (1 - rho))
}

// utilisationAt is the rho in [0, 1) where (1/v)(1 + cost(rho)) = m.
func utilisationAt(c, v, m float64) float64 {
	target := m*v - 1
	if target <= 0 {
		return 0
	}
	lo, hi := 0.0, 1.0
	for range 48 {
		mid := (lo + hi) / 2
		if sakasegawaCost(c, mid) < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// timeInSystem is the objective, sum x_i T_i(x_i). Past a utilisation of
// 0.99 the wait is continued along its tangent, so that weights that
// overload a pod compare as very bad rather than as infinite (two
// overloads can then still be told apart).
func timeInSystem(pods []decidePod, x []float64) float64 {
	sum := 0.0
	for i, p := range pods {
		if !(x[i] > 0) || !(p.c > 0) || !(p.v > 0) {
			continue
		}
		rho := x[i] / (p.c * p.v)
		w := 0.0
		if rho > 0.99 {
			w, _ = tangentWait(p.c, rho)
		} else {
			w = sakasegawaWait(p.c, rho)
		}
		sum += x[i] / p.v * (1 + w)
	}
	return sum
}

// curvature is d²(x T(x))/dx² of one pod at x: how much a misplaced unit
// of its traffic costs, to second order.
func curvature(p decidePod, x float64) float64 {
	mu := p.c * p.v
	rho := x / mu
	if !(rho > 0) {
		rho = 1e-6
	}
	if rho >= 1 {
		return math.Inf(1)
	}
	h := min(1e-4, (1-rho)/4)
	d := (sakasegawaCost(p.c, rho+h) - sakasegawaCost(p.c, max(rho-h, 0))) / (rho + h - max(rho-h, 0))
	return d / (p.v * mu)
}
