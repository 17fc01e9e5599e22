package main

import (
	"math"
	"slices"
)

// Anchors: balancers a user could pick instead of this operator, each in
// every client sidecar on its own, modelled from its public description.
// Like lr and cswrr they see only what a client can see (its own requests
// in flight and their latencies; for Prequal, probe answers), and react
// within a request, which weights set by a control plane cannot.

// --- Linkerd: power of two choices over peak EWMA -------------------------

// Linkerd's proxy balances HTTP requests with tower's p2c over PeakEwma
// (linkerd2-proxy, app/outbound: EWMA_DEFAULT_RTT 30 ms, EWMA_DECAY 10 s),
// derived from Finagle's PeakEwma. Modelling choices, from tower's
// load/peak_ewma.rs and p2c:
//   - per client and endpoint, an RTT estimate; a new endpoint starts at
//     the default RTT;
//   - on a response, the peak rule: an RTT above the estimate replaces it
//     at once; one below moves it there by 1 - exp(-elapsed/decay), elapsed
//     the time since the estimate's last update;
//   - reading the load decays the estimate towards zero the same way (an
//     update with RTT 0, as tower does), and the load is estimate x
//     (requests in flight from this client + 1);
//   - p2c samples two distinct endpoints uniformly and sends to the one of
//     lower load (the first on a tie).
//
// The RTT is the request's time from the client's pick to its response:
// the simulation has no network, so that is the pod's queue and service.
const (
	linkerdDefaultRTT = 0.030 // linkerd2-proxy EWMA_DEFAULT_RTT
	linkerdDecay      = 10.0  // linkerd2-proxy EWMA_DECAY, seconds
)

// ewmaUpdate is tower's RttEstimate.update at now with a sample rtt.
func ewmaUpdate(est, at *float64, now, rtt float64) float64 {
	if *est < rtt {
		*est = rtt
	} else {
		decay := math.Exp(-(now - *at) / linkerdDecay)
		*est = *est*decay + rtt*(1-decay)
	}
	*at = now
	return *est
}

func (s *sim) pickLinkerd(c *simClient, ci int32) int32 {
	n := uint64(len(s.hosts))
	if n == 1 {
		return s.hosts[0]
	}
	i := c.lb.Uint64() % n
	j := c.lb.Uint64() % (n - 1)
	if j >= i {
		j++
	}
	row := s.active[int(ci)*s.P : int(ci+1)*s.P]
	load := func(h int32) float64 {
		return ewmaUpdate(&c.ewma[h], &c.ewmaAt[h], s.now, 0) * float64(row[h]+1)
	}
	a, b := s.hosts[i], s.hosts[j]
	if load(b) < load(a) {
		return b
	}
	return a
}

// linkerdResponse feeds a response's RTT to the client's estimate.
func (s *sim) linkerdResponse(ci, h int32, rtt float64) {
	c := &s.clients[ci]
	ewmaUpdate(&c.ewma[h], &c.ewmaAt[h], s.now, rtt)
}

// --- Prequal ---------------------------------------------------------------

// Prequal (Wydrowski, Kleinberg, Rumble, Archer: "Load is not what you
// should balance: Introducing Prequal", NSDI 2024). Each client keeps a pool
// of probe answers; a replica answers a probe with its requests in flight
// (RIF) and its estimated latency, the median of its recent latencies at
// that RIF. A query goes to the best replica of the pool by the hot-cold
// lexicographic rule: the replicas whose RIF is at most the pool's Q_RIF
// quantile are cold, and the cold one of lowest estimated latency is
// picked; when none is cold, the one of lowest RIF. Modelling choices:
//   - probes are asynchronous: each query triggers prequalProbesPerQuery
//     probes to distinct replicas drawn uniformly, sent after the pick, so
//     they inform later queries only; the simulation has no network, so an
//     answer is in the pool at once;
//   - the pool holds prequalPool answers, one per replica (a newer answer
//     replaces an older one; when full, the oldest goes); an answer older
//     than prequalMaxAge, or used prequalReuse times, is dropped;
//   - a replica's RIF is every request at the pod (queued or in service,
//     from all clients); its latency history is the last prequalHistory
//     latencies (arrival at the pod to response) of requests that found
//     each RIF on arrival, up to prequalMaxRIF; the nearest RIF with data
//     stands in for one without;
//   - with no usable answer the client picks a replica uniformly.
const (
	// prequalProbesPerQuery: the paper makes the probe rate per query a
	// parameter; 3 is our choice, enough that a query finds a pool of
	// fresh answers without probing every replica.
	prequalProbesPerQuery = 3
	// prequalPool: the paper's maximum pool size (16).
	prequalPool = 16
	// prequalQRIF: the hot-cold threshold as a quantile of the pool's
	// RIFs, in the middle of the range the paper recommends (0.6-0.9).
	prequalQRIF = 0.75
	// prequalReuse: an answer serves one query; at 3 probes per query the
	// pool never runs dry, so the paper's reuse budget is not needed.
	prequalReuse = 1
	// prequalMaxAge: answers older than this are stale; 1 s is a hundred
	// mean service times of the shipped scenarios and far longer than the
	// pool lives at their request rates (16 answers at 3 per query).
	prequalMaxAge = 1.0
	// prequalHistory and prequalMaxRIF bound a replica's latency history.
	prequalHistory = 8
	prequalMaxRIF  = 64
)

type prequalProbe struct {
	pod    int32
	rif    int32
	lat, t float64
	uses   int32
}

// prequalLat is a pod's latency history by RIF found on arrival.
type prequalLat struct {
	ring [prequalMaxRIF][prequalHistory]float64
	n    [prequalMaxRIF]int
}

func (p *prequalLat) add(rif int32, lat float64) {
	r := min(int(rif), prequalMaxRIF-1)
	p.ring[r][p.n[r]%prequalHistory] = lat
	p.n[r]++
}

// estimate is the median of the recent latencies at rif, or at the
// nearest RIF with data; 0 without any.
func (p *prequalLat) estimate(rif int32) float64 {
	r := min(int(rif), prequalMaxRIF-1)
	for d := 0; d < prequalMaxRIF; d++ {
		for _, k := range []int{r - d, r + d} {
			if k < 0 || k >= prequalMaxRIF || p.n[k] == 0 {
				continue
			}
			m := min(p.n[k], prequalHistory)
			var tmp [prequalHistory]float64
			copy(tmp[:], p.ring[k][:m])
			x := tmp[:m]
			slices.Sort(x)
			if m%2 == 1 {
				return x[m/2]
			}
			return (x[m/2-1] + x[m/2]) / 2
		}
	}
	return 0
}

func (s *sim) podRIF(h int32) int32 { return s.pods[h].busy + int32(s.pods[h].qlen()) }

func (s *sim) pickPrequal(c *simClient) int32 {
	pool := c.pool[:0]
	for _, p := range c.pool {
		if s.pods[p.pod].present && s.now-p.t <= prequalMaxAge && p.uses < prequalReuse {
			pool = append(pool, p)
		}
	}
	c.pool = pool
	if len(pool) == 0 {
		return s.hosts[c.lb.Uint64()%uint64(len(s.hosts))]
	}
	rifs := c.rifTmp[:0]
	for _, p := range pool {
		rifs = append(rifs, p.rif)
	}
	slices.Sort(rifs)
	c.rifTmp = rifs
	q := rifs[max(0, int(math.Ceil(prequalQRIF*float64(len(rifs))))-1)]
	best, bestCold := -1, false
	for i, p := range pool {
		cold := p.rif <= q
		switch {
		case best < 0:
			best, bestCold = i, cold
		case cold && !bestCold:
			best, bestCold = i, true
		case cold && bestCold && p.lat < pool[best].lat:
			best = i
		case !cold && !bestCold && p.rif < pool[best].rif:
			best = i
		}
	}
	h := pool[best].pod
	pool[best].uses++
	return h
}

// prequalProbe sends the query's probes: distinct replicas, uniformly.
func (s *sim) prequalProbe(c *simClient) {
	n := len(s.hosts)
	k := min(prequalProbesPerQuery, n)
	var picked [prequalProbesPerQuery]int32
	for i := 0; i < k; {
		h := s.hosts[c.lb.Uint64()%uint64(n)]
		if slices.Contains(picked[:i], h) {
			continue
		}
		picked[i] = h
		i++
		rif := s.podRIF(h)
		ans := prequalProbe{pod: h, rif: rif, lat: s.pods[h].lat.estimate(rif), t: s.now}
		if j := slices.IndexFunc(c.pool, func(p prequalProbe) bool { return p.pod == h }); j >= 0 {
			c.pool = slices.Delete(c.pool, j, j+1)
		}
		if len(c.pool) >= prequalPool {
			oldest := 0
			for j := range c.pool {
				if c.pool[j].t < c.pool[oldest].t {
					oldest = j
				}
			}
			c.pool = slices.Delete(c.pool, oldest, oldest+1)
		}
		c.pool = append(c.pool, ans)
	}
}
