package main

import (
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/test/edf"
)

// The simulator: a discrete-event model of N pods (FCFS queue in front of
// `cores` parallel workers, service time = work/speed) and K client sidecars
// (own Poisson arrival stream, own load balancer, own active-request counts),
// driven by one binary-heap event queue. Time is float64 seconds.

// lbMode is the client-side load-balancing algorithm.
type lbMode uint8

const (
	lbRR       lbMode = iota // ROUND_ROBIN without weights
	lbLR                     // LEAST_REQUEST without weights (power of two choices)
	lbWRR                    // ROUND_ROBIN with weights (EDF; unweighted when all equal)
	lbWLR                    // LEAST_REQUEST with weights (EDF on weight/(active+1); P2C when all equal)
	lbPeakEWMA               // Linkerd: P2C over peak-EWMA latency x (in flight + 1), see anchors.go
	lbPrequal                // Prequal: probes and the hot-cold lexicographic pick, see anchors.go
)

// ctlKind is who sets the weights.
type ctlKind uint8

const (
	ctlNone ctlKind = iota
	ctlOracle
	ctlBest
	ctlBounded
	ctlCSWRR
	ctlSeedDev
	ctlSeedMain
	ctlOptimizer
	ctlOptimizerCPU
	ctlOptimizerLR
)

type strategyDef struct {
	name string
	lb   lbMode
	ctl  ctlKind
	desc string
}

var strategyDefs = []strategyDef{
	{"rr", lbRR, ctlNone, "Envoy ROUND_ROBIN, equal weights"},
	{"lr", lbLR, ctlNone, "Envoy LEAST_REQUEST, equal weights (P2C on the client's own active counts)"},
	{"wrr_oracle", lbWRR, ctlOracle, "Envoy weighted ROUND_ROBIN (EDF), weights = true capacity"},
	{"wlr_oracle", lbWLR, ctlOracle, "Envoy weighted LEAST_REQUEST, weight/(active+1), weights = true capacity"},
	{"oracle_best", lbWRR, ctlBest, "Envoy weighted ROUND_ROBIN, the best static weights: the promise solved with the true capacities and load (M/M/c cost per pod)"},
	{"oracle_bounded", lbWRR, ctlBounded, "Envoy weighted ROUND_ROBIN, the best static weights kept within max_weight_ratio of the mean as the engine keeps its own: what the engine converges to with the true capacities and load"},
	{"linkerd", lbPeakEWMA, ctlNone, "Linkerd's balancer per client: power of two choices over peak-EWMA latency x (requests in flight + 1)"},
	{"prequal", lbPrequal, ctlNone, "Prequal per client: asynchronous probes of requests in flight and latency, hot-cold lexicographic pick"},
	{"cswrr", lbWRR, ctlCSWRR, "Envoy client_side_weighted_round_robin, defaults, per-response backend reports"},
	{"seed_dev", lbWRR, ctlSeedDev, "seed operator, dev rule, ROUND_ROBIN"},
	{"seed_main", lbWRR, ctlSeedMain, "seed operator, main rule, ROUND_ROBIN"},
	{"optimizer", lbWRR, ctlOptimizer, "this project's weight package, CPU + request rates + sidecar latency; the operator's default: LEAST_REQUEST until Result.Learned, then weighted ROUND_ROBIN (LEAST_REQUEST kept while the load is past the utilisation cap)"},
	{"optimizer_lr", lbWLR, ctlOptimizerLR, "this project's weight package, CPU + request rates + sidecar latency, weighted LEAST_REQUEST throughout (load_balancer: LEAST_REQUEST)"},
	{"optimizer_cpu", lbWRR, ctlOptimizerCPU, "this project's weight package, CPU only; LEAST_REQUEST until Result.Learned, then weighted ROUND_ROBIN"},
}

// StrategyNames lists every strategy in output order.
func StrategyNames() []string {
	out := make([]string, len(strategyDefs))
	for i, d := range strategyDefs {
		out[i] = d.name
	}
	return out
}

func strategyByName(name string) (strategyDef, bool) {
	for _, d := range strategyDefs {
		if d.name == name {
			return d, true
		}
	}
	return strategyDef{}, false
}

const (
	evArrival uint8 = iota
	evCompletion
	evScrape     // Prometheus scrapes one pod
	evCycle      // central weight cycle
	evClientTick // cswrr weight update timer of one client
	evOrcaTick   // a pod closes its load-report window
	evScenario   // a scenario event
	evWarmup
	evOptIn // the optimizer is applied (Scenario.OptIn)
	// evPolicy: the operator's policy has an action due ([policy]: see
	// scheduler).
	evPolicy
	evEnd
)

type event struct {
	t      float64
	seq    uint64
	arr    float64 // completion: arrival time of the request
	client int32
	pod    int32
	rif    int32 // completion: requests at the pod when it arrived (Prequal)
	kind   uint8
}

type queued struct {
	arr    float64
	work   float64
	client int32
	rif    int32
}

type promSample struct{ t, cpu, req, latSum, node float64 }

// promSeries names a scraped counter of a pod.
type promSeries uint8

const (
	seriesCPU    promSeries = iota // container_cpu_usage_seconds_total
	seriesReqs                     // istio_requests_total (reporter=destination)
	seriesLatSum                   // istio_request_duration_milliseconds_sum (in seconds here)
	seriesNode                     // container_cpu_usage_seconds_total{id="/"} of the pod's node
)

const promRing = 32

type simPod struct {
	name, class, locality string
	cores                 int32
	speed                 float64
	present               bool
	// noLimit: the pod has no CPU limit; the operator reads Cores = 0 and
	// sees only cpuRequest and nodeCores (cores stays the truth).
	noLimit               bool
	cpuRequest, nodeCores float64
	addedAt, removedAt    float64 // seconds; addedAt 0 for initial pods
	initial               bool

	busy  int32
	q     []queued
	qHead int

	cpu  float64 // CPU-seconds counter (cAdvisor)
	cpuT float64
	reqs float64 // served requests counter (istio_requests_total)
	// latSum is the sidecar's latency histogram _sum (seconds): the time
	// from a request's arrival at the pod to its response, queue included.
	latSum float64
	phase  float64 // scrape / report phase
	// neighbours counts the CPU-seconds the other tenants of the pod's
	// node used (nodeCores - cores on average, see scrape); with cpu it
	// makes the node's root-cgroup counter.
	neighbours, neighRate, neighT float64
	neighRNG                      *rand.Rand

	// measurement window (utilisation)
	mStart, mEnd       float64
	mStartCPU, mEndCPU float64
	mOpen, mDone       bool

	// Prometheus samples (ring)
	samples [promRing]promSample
	sN      int

	// backend load report (cswrr)
	orcaReqs, orcaCPU float64
	report            float64 // weight from the last report; 0 = invalid

	lat *prequalLat // latency history by requests in flight (Prequal)
}

func (p *simPod) advance(now float64) {
	p.cpu += float64(p.busy) * (now - p.cpuT)
	p.cpuT = now
}

func (p *simPod) qlen() int { return len(p.q) - p.qHead }

func (p *simPod) enqueue(x queued) {
	if p.qHead > 0 && p.qHead*2 >= len(p.q) && len(p.q) == cap(p.q) {
		n := copy(p.q, p.q[p.qHead:])
		p.q = p.q[:n]
		p.qHead = 0
	}
	p.q = append(p.q, x)
}

func (p *simPod) dequeue() queued {
	x := p.q[p.qHead]
	p.qHead++
	if p.qHead == len(p.q) {
		p.q = p.q[:0]
		p.qHead = 0
	}
	return x
}

type csHost struct {
	weight        float64
	nonEmptySince float64 // -1: unset
	lastUpdate    float64
	valid         bool
}

type simClient struct {
	arr      *rand.Rand // arrival stream: identical for every strategy
	lb       *rand.Rand // load balancer's own randomness
	nextWork float64
	seed     uint64 // Envoy's per-LB random seed
	rrIdx    uint64
	w        []float64 // weights by pod index (shared for central strategies)
	equal    bool
	edf      edf.Scheduler
	cs       []csHost // cswrr, by pod index
	csTmp    []float64
	// Linkerd: peak-EWMA RTT estimate and its last update, by pod index.
	ewma, ewmaAt []float64
	// Prequal: the probe pool.
	pool   []prequalProbe
	rifTmp []int32
}

// controller is a central weight publisher.
type controller interface {
	start(s *sim)
	cycle(s *sim)
	podsChanged(s *sim)
	// truthChanged: a pod's speed or the offered load changed (an event);
	// the oracles, which know both, publish again.
	truthChanged(s *sim)
}

// scheduler is a controller whose own policy decides when its cycles and
// looks run (the optimizer strategies: internal/policy, as the operator
// runs it). [policy] start is the opt-in; wake runs what is due now; both
// report when the next action is due (+Inf: none).
type scheduler interface {
	next(s *sim) float64
	wake(s *sim) float64
}

// restarter is a controller that runs as the operator's manager, which can
// stop and be replaced (EventRestart).
type restarter interface {
	// stop stops the manager now; a new one takes over after downtime.
	stop(s *sim, downtime float64)
}

type sim struct {
	sc  *Scenario
	def strategyDef

	now    float64
	evq    []event
	seq    uint64
	warmup float64
	end    float64
	afterT float64 // first scenario event (p99 after the change)
	// optIn is when the optimizer or a static oracle is applied
	// (Scenario.OptIn): before it, the clients run Istio's default
	// LEAST_REQUEST over equal weights and no cycle runs.
	optIn float64

	pods    []simPod
	byName  map[string]int32
	hosts   []int32
	P       int
	clients []simClient
	active  []int32 // client*P + pod

	weights []float64 // centrally published weights, by pod
	ctl     controller
	// lb is the load balancer in force; the optimizer's default mode
	// switches it from LEAST_REQUEST to ROUND_ROBIN (see setLB).
	lb lbMode

	workMean, workMu, workSigma float64
	lognormal                   bool
	lambdaC                     float64

	scrapeEvery, rateWindow, cycleLen float64
	orcaWindow                        float64 // backend load-report window (cswrr)
	needProm                          bool
	events                            []int // scenario events, time order

	// measurement
	lat, latAfter *histogram
	// perMinute holds one histogram per minute of arrival time, from t=0
	// (Scenario.PerMinute).
	perMinute    []*histogram
	arrivals     uint64
	arrHash      uint64
	maxQueue     int
	publications int
	switches     int // load-balancer changes (DestinationRule writes)
	// restarts: when the operator's manager stopped (EventRestart).
	restarts []float64
	// cycleTimes, writeTimes and switchTimes: when each regular cycle
	// ran, each weight change and each load-balancer change was sent.
	cycleTimes, writeTimes, switchTimes []float64
	alarms                              int // cycles an alarm ran between the regular ones
	cycleIdx                            int
	snaps                               []shareSnap // weight shares after each cycle
	// learnedCycle: the cycle of the run's first balancer change when it
	// was into ROUND_ROBIN (the end of the opt-in's learning spell), -1
	// before or without one.
	learnedCycle int
	modes        map[string]int
	notes        []string
	inEvent      bool // a scenario event rebuilds the clients once at its end
	trace        io.Writer
}

const (
	csBlackout   = 10.0  // client_side_weighted_round_robin defaults
	csExpiration = 180.0 //
	csUpdate     = 1.0   //
)

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func newSim(sc *Scenario, def strategyDef) *sim {
	s := &sim{
		sc:           sc,
		def:          def,
		warmup:       sc.Warmup.Seconds(),
		end:          sc.Duration.Seconds(),
		afterT:       math.Inf(1),
		byName:       map[string]int32{},
		workMean:     sc.Work.Mean.Seconds(),
		lognormal:    sc.Work.Distribution == "lognormal",
		scrapeEvery:  sc.Prometheus.ScrapeInterval.Seconds(),
		rateWindow:   sc.Prometheus.RateWindow.Seconds(),
		cycleLen:     sc.Cycle.Seconds(),
		orcaWindow:   sc.ReportWindow.Seconds(),
		lat:          newHistogram(),
		modes:        map[string]int{},
		lb:           def.lb,
		learnedCycle: -1,
	}
	if sc.PerMinute {
		n := int(math.Ceil((s.end - s.warmup) / 60))
		for range n {
			s.perMinute = append(s.perMinute, newHistogram())
		}
	}
	if s.lognormal {
		s.workSigma = sc.Work.Sigma
		s.workMu = math.Log(s.workMean) - s.workSigma*s.workSigma/2
	}
	s.events = sortedEventIndex(sc.Events)
	if len(s.events) > 0 {
		s.afterT = sc.Events[s.events[0]].At.Seconds()
		s.latAfter = newHistogram()
	}
	// All pods that will ever exist, initial ones first.
	phases := rand.New(rand.NewPCG(splitmix(sc.Seed), 0x70d5))
	addGroup := func(g PodGroup, initial bool) {
		for _, n := range g.names() {
			s.byName[n] = int32(len(s.pods))
			s.pods = append(s.pods, simPod{
				name: n, class: g.HardwareClass, locality: g.Locality,
				cores: int32(g.Cores), speed: g.Speed, initial: initial,
				noLimit: g.NoLimit, cpuRequest: g.CPURequest, nodeCores: g.NodeCores,
				phase: phases.Float64(),
				// The node's other tenants ran before the simulation
				// starts: their CPU is there from the first sample.
				neighRate: max(0, g.NodeCores-float64(g.Cores)),
				neighRNG:  rand.New(rand.NewPCG(splitmix(sc.Seed^0x9e1b), splitmix(uint64(len(s.pods))))),
			})
		}
	}
	for _, g := range sc.Pods {
		addGroup(g, true)
	}
	for _, i := range s.events {
		for _, g := range sc.Events[i].Pods {
			addGroup(g, false)
		}
	}
	s.P = len(s.pods)
	for i := range s.pods {
		if s.pods[i].initial {
			s.pods[i].present = true
			s.hosts = append(s.hosts, int32(i))
		}
	}
	s.weights = make([]float64, s.P)
	for i := range s.weights {
		s.weights[i] = 1
	}
	K := sc.Clients
	s.lambdaC = perClientRate(sc, sc.Load)
	s.clients = make([]simClient, K)
	s.active = make([]int32, K*s.P)
	for i := range s.clients {
		c := &s.clients[i]
		c.arr = rand.New(rand.NewPCG(splitmix(sc.Seed^0xa441), splitmix(uint64(i))))
		c.lb = rand.New(rand.NewPCG(splitmix(sc.Seed^0x1b1b), splitmix(uint64(i)+1<<40)))
		c.seed = c.lb.Uint64()
		c.rrIdx = c.seed
		if def.ctl == ctlCSWRR {
			c.w = make([]float64, s.P)
			for j := range c.w {
				c.w[j] = 1
			}
			c.cs = make([]csHost, s.P)
			for j := range c.cs {
				c.cs[j].nonEmptySince = -1
			}
		} else {
			c.w = s.weights
		}
		c.equal = true
		if def.lb == lbPeakEWMA {
			c.ewma = make([]float64, s.P)
			c.ewmaAt = make([]float64, s.P)
			for j := range c.ewma {
				c.ewma[j] = linkerdDefaultRTT
			}
		}
	}
	if def.lb == lbPrequal {
		for i := range s.pods {
			s.pods[i].lat = &prequalLat{}
		}
	}
	switch def.ctl {
	case ctlOracle:
		s.ctl = staticCtl{oracleWeights}
	case ctlBest:
		s.ctl = staticCtl{bestWeights}
	case ctlBounded:
		s.ctl = staticCtl{boundedWeights}
	case ctlSeedDev:
		s.ctl = &seedDevCtl{}
		s.needProm = true
	case ctlSeedMain:
		s.ctl = &seedMainCtl{}
		s.needProm = true
	case ctlOptimizer, ctlOptimizerCPU:
		// The operator's default: Istio's LEAST_REQUEST (over the weights
		// the ServiceEntry carries, equal at first) until the engine has
		// learned, then weighted ROUND_ROBIN.
		s.lb = lbWLR
		s.ctl = newOptimizerCtl(sc, def.ctl == ctlOptimizerCPU, true)
		s.needProm = true
	case ctlOptimizerLR:
		s.ctl = newOptimizerCtl(sc, false, false)
		s.needProm = true
	}
	switch def.ctl {
	case ctlOptimizer, ctlOptimizerCPU, ctlOptimizerLR:
		s.optIn = sc.OptIn.Seconds()
	case ctlOracle, ctlBest, ctlBounded:
		// An oracle measured from opt-in starts where the optimizer
		// does: from the queues Istio's default left (after a meltdown,
		// its backlog), not from a Service that never had them.
		if s.optIn = sc.OptIn.Seconds(); s.optIn > 0 {
			s.lb = lbWLR
		}
	}
	return s
}

// The event queue is a 4-ary min-heap on (t, seq): shallower than a binary
// heap, fewer cache misses; seq makes ties first-in first-out.
func evLess(a, b *event) bool { return a.t < b.t || (a.t == b.t && a.seq < b.seq) }

func (s *sim) push(e event) {
	e.seq = s.seq
	s.seq++
	q := append(s.evq, e)
	i := len(q) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !evLess(&e, &q[p]) {
			break
		}
		q[i] = q[p]
		i = p
	}
	q[i] = e
	s.evq = q
}

func (s *sim) pop() event {
	q := s.evq
	top := q[0]
	n := len(q) - 1
	last := q[n]
	q = q[:n]
	if n > 0 {
		i := 0
		for {
			c := 4*i + 1
			if c >= n {
				break
			}
			m := c
			for j := c + 1; j < c+4 && j < n; j++ {
				if evLess(&q[j], &q[m]) {
					m = j
				}
			}
			if !evLess(&q[m], &last) {
				break
			}
			q[i] = q[m]
			i = m
		}
		q[i] = last
	}
	s.evq = q
	return top
}

func (s *sim) drawWork(r *rand.Rand) float64 {
	if s.lognormal {
		return math.Exp(s.workMu + s.workSigma*r.NormFloat64())
	}
	return s.workMean * r.ExpFloat64()
}

// run simulates the scenario and returns the measurements.
func (s *sim) run() StrategyResult {
	started := time.Now()
	for i := range s.clients {
		c := &s.clients[i]
		t := c.arr.ExpFloat64() / s.lambdaC
		c.nextWork = s.drawWork(c.arr)
		if t < s.end {
			s.push(event{t: t, kind: evArrival, client: int32(i)})
		}
		if s.def.ctl == ctlCSWRR {
			s.push(event{t: c.lb.Float64() * csUpdate, kind: evClientTick, client: int32(i)})
		}
		s.rebuild(int32(i))
	}
	for _, h := range s.hosts {
		s.podTimers(h, 0)
	}
	sched, policyDriven := s.ctl.(scheduler)
	if policyDriven {
		// [policy] Opt-in (at 0 without Scenario.OptIn): the policy
		// decides every instant from there (evPolicy).
		s.push(event{t: s.optIn, kind: evOptIn})
	} else if s.optIn > 0 {
		// Opt-in: the operator starts and runs its first cycle at once.
		s.push(event{t: s.optIn, kind: evOptIn})
		for k := 1; s.optIn+float64(k)*s.cycleLen <= s.end; k++ {
			s.push(event{t: s.optIn + float64(k)*s.cycleLen, kind: evCycle})
		}
	} else {
		for k := 1; float64(k)*s.cycleLen <= s.end; k++ {
			s.push(event{t: float64(k) * s.cycleLen, kind: evCycle})
		}
	}
	for _, i := range s.events {
		s.push(event{t: s.sc.Events[i].At.Seconds(), kind: evScenario, pod: int32(i)})
	}
	s.push(event{t: s.warmup, kind: evWarmup})
	s.push(event{t: s.end, kind: evEnd})
	if s.ctl != nil && s.optIn == 0 && !policyDriven {
		s.ctl.start(s)
	}
	s.measureConvergence()

	for len(s.evq) > 0 {
		e := s.pop()
		s.now = e.t
		switch e.kind {
		case evArrival:
			s.arrival(e.client)
		case evCompletion:
			s.completion(e)
		case evScrape:
			s.scrape(e.pod)
		case evCycle:
			s.regularCycle()
			if s.ctl != nil {
				s.ctl.cycle(s)
			}
			s.measureConvergence()
		case evClientTick:
			s.cswrrUpdate(e.client)
			if next := s.now + csUpdate; next <= s.end {
				s.push(event{t: next, kind: evClientTick, client: e.client})
			}
		case evOrcaTick:
			s.orcaTick(e.pod)
		case evScenario:
			s.applyEvent(&s.sc.Events[e.pod])
		case evOptIn:
			s.ctl.start(s)
			if policyDriven {
				if next := sched.next(s); next <= s.end {
					s.push(event{t: next, kind: evPolicy})
				}
			} else {
				s.setLB(s.def.lb) // a static oracle's DestinationRule
				s.ctl.cycle(s)
			}
			s.measureConvergence()
		case evPolicy:
			if next := sched.wake(s); next <= s.end {
				s.push(event{t: next, kind: evPolicy})
			}
			s.measureConvergence()
		case evWarmup:
			for _, h := range s.hosts {
				s.openMeasure(h)
			}
		case evEnd:
			for _, h := range s.hosts {
				s.closeMeasure(h)
			}
		}
	}
	return s.result(time.Since(started))
}

func (s *sim) podTimers(h int32, from float64) {
	p := &s.pods[h]
	if s.needProm {
		t := from + p.phase*s.scrapeEvery
		if t <= s.end {
			s.push(event{t: t, kind: evScrape, pod: h})
		}
	}
	if s.def.ctl == ctlCSWRR {
		p.orcaReqs, p.orcaCPU = p.reqs, p.cpu
		t := from + p.phase*s.orcaWindow
		if t <= s.end {
			s.push(event{t: t, kind: evOrcaTick, pod: h})
		}
	}
}

func (s *sim) arrival(ci int32) {
	c := &s.clients[ci]
	t := s.now
	work := c.nextWork
	s.arrivals++
	s.arrHash = splitmix(s.arrHash ^ math.Float64bits(t) ^ math.Float64bits(work)*31 ^ uint64(ci)<<48)

	p := s.pick(c, ci)
	if s.lb == lbPrequal {
		s.prequalProbe(c)
	}
	s.active[int(ci)*s.P+int(p)]++
	pod := &s.pods[p]
	rif := s.podRIF(p)
	if pod.busy < pod.cores {
		pod.advance(t)
		pod.busy++
		s.push(event{t: t + work/pod.speed, kind: evCompletion, client: ci, pod: p, arr: t, rif: rif})
	} else {
		pod.enqueue(queued{arr: t, work: work, client: ci, rif: rif})
		if t >= s.warmup && pod.qlen() > s.maxQueue {
			s.maxQueue = pod.qlen()
		}
	}

	next := t + c.arr.ExpFloat64()/s.lambdaC
	c.nextWork = s.drawWork(c.arr)
	if next < s.end {
		s.push(event{t: next, kind: evArrival, client: ci})
	}
}

func (s *sim) completion(e event) {
	t := s.now
	pod := &s.pods[e.pod]
	pod.advance(t)
	pod.busy--
	pod.reqs++
	pod.latSum += t - e.arr
	if s.perMinute != nil {
		if m := int((e.arr - s.warmup) / 60); e.arr >= s.warmup && m < len(s.perMinute) {
			s.perMinute[m].add(t - e.arr)
		}
	}
	if e.arr >= s.warmup {
		lat := t - e.arr
		s.lat.add(lat)
		if e.arr >= s.afterT {
			s.latAfter.add(lat)
		}
	}
	s.active[int(e.client)*s.P+int(e.pod)]--
	switch s.lb {
	case lbPeakEWMA:
		s.linkerdResponse(e.client, e.pod, t-e.arr)
	case lbPrequal:
		pod.lat.add(e.rif, t-e.arr)
	}
	if pod.report > 0 && s.def.ctl == ctlCSWRR {
		ch := &s.clients[e.client].cs[e.pod]
		if ch.nonEmptySince < 0 {
			ch.nonEmptySince = t
		}
		ch.lastUpdate = t
		ch.weight = pod.report
	}
	if pod.qlen() > 0 {
		x := pod.dequeue()
		pod.busy++
		s.push(event{t: t + x.work/pod.speed, kind: evCompletion, client: x.client, pod: e.pod, arr: x.arr, rif: x.rif})
	}
}

// pick is the client's load balancer.
func (s *sim) pick(c *simClient, ci int32) int32 {
	switch s.lb {
	case lbPeakEWMA:
		return s.pickLinkerd(c, ci)
	case lbPrequal:
		return s.pickPrequal(c)
	case lbWRR:
		if !c.equal {
			return c.edf.Pick(c.w)
		}
		fallthrough
	case lbRR:
		h := s.hosts[c.rrIdx%uint64(len(s.hosts))]
		c.rrIdx++
		return h
	case lbWLR:
		if !c.equal {
			h := c.edf.Top()
			c.edf.Readd(c.w[h] / float64(s.active[int(ci)*s.P+int(h)]+1))
			return h
		}
		fallthrough
	default: // lbLR: power of two choices, first sample wins ties
		n := uint64(len(s.hosts))
		row := s.active[int(ci)*s.P : int(ci+1)*s.P]
		cand := s.hosts[c.lb.Uint64()%n]
		other := s.hosts[c.lb.Uint64()%n]
		if row[other] < row[cand] {
			cand = other
		}
		return cand
	}
}

// rebuild is Envoy's refresh after a host-set or weight change: with unequal
// weights the EDF scheduler is rebuilt at the client's own point of the
// weighted rotation (edf.Rebuild, from the load balancer's seed); with equal
// weights the unweighted path is used.
func (s *sim) rebuild(ci int32) {
	c := &s.clients[ci]
	c.equal = true
	w0 := c.w[s.hosts[0]]
	for _, h := range s.hosts[1:] {
		if c.w[h] != w0 {
			c.equal = false
			break
		}
	}
	if c.equal || (s.lb != lbWRR && s.lb != lbWLR) {
		return
	}
	row := s.active[int(ci)*s.P : int(ci+1)*s.P]
	weight := func(h int32) float64 {
		if s.lb == lbWLR {
			return c.w[h] / float64(row[h]+1)
		}
		return c.w[h]
	}
	c.edf.Rebuild(s.hosts, weight, c.seed)
}

// setLB switches every client's load balancer (a DestinationRule change:
// Envoy builds a new load balancer, so the schedulers are rebuilt).
func (s *sim) setLB(lb lbMode) {
	if s.lb == lb {
		return
	}
	s.lb = lb
	if s.switches == 0 && lb == lbWRR {
		s.learnedCycle = s.cycleIdx
	}
	s.switches++
	s.switchTimes = append(s.switchTimes, s.now)
	for ci := range s.clients {
		s.rebuild(int32(ci))
	}
}

// publish sends centrally computed weights (by pod index) to every client.
func (s *sim) publish(w []float64) {
	s.publications++
	changed := false
	for _, h := range s.hosts {
		if w[h] < 1 || math.IsNaN(w[h]) {
			w[h] = 1 // istiod sends 0 as 1; never below
		}
		if s.weights[h] != w[h] {
			changed = true
		}
		s.weights[h] = w[h]
	}
	if changed {
		s.writeTimes = append(s.writeTimes, s.now)
	}
	if changed && !s.inEvent {
		for ci := range s.clients {
			s.rebuild(int32(ci))
		}
	}
}

// perClientRate is each client's arrival rate (requests per second) for
// an offered load given as a fraction of the initial pods' capacity.
func perClientRate(sc *Scenario, load float64) float64 {
	return load * sc.initialCapacity() / float64(sc.Clients)
}

func (s *sim) applyEvent(ev *Event) {
	switch ev.Type {
	case EventRestart:
		if r, ok := s.ctl.(restarter); ok {
			r.stop(s, ev.Downtime.Seconds())
		}
		return
	case EventSetLoad:
		// From each client's next arrival on (the one already drawn keeps
		// the old rate).
		s.lambdaC = perClientRate(s.sc, ev.Load)
		if s.ctl != nil {
			s.ctl.truthChanged(s)
		}
		return
	case EventSetSpeed:
		h := s.byName[ev.Pod]
		s.pods[h].speed = ev.Speed
		if s.ctl != nil {
			s.ctl.truthChanged(s)
		}
		return
	case EventAddPods:
		for _, g := range ev.Pods {
			for _, n := range g.names() {
				h := s.byName[n]
				p := &s.pods[h]
				p.present = true
				p.addedAt = s.now
				for ci := range s.clients {
					if c := &s.clients[ci]; c.ewma != nil {
						c.ewma[h], c.ewmaAt[h] = linkerdDefaultRTT, s.now // a new endpoint
					}
				}
				p.cpuT = s.now
				s.hosts = append(s.hosts, h)
				s.podTimers(h, s.now)
				if s.now >= s.warmup {
					s.openMeasure(h)
				}
			}
		}
	case EventRemovePods:
		for _, n := range ev.Names {
			h := s.byName[n]
			s.closeMeasure(h)
			s.pods[h].present = false
			s.pods[h].removedAt = s.now
			s.hosts = slices.DeleteFunc(s.hosts, func(x int32) bool { return x == h })
		}
	}
	slices.Sort(s.hosts)
	if s.ctl != nil {
		s.inEvent = true
		s.ctl.podsChanged(s) // may publish; one rebuild below
		s.inEvent = false
	}
	for ci := range s.clients {
		s.rebuild(int32(ci))
	}
}

func (s *sim) openMeasure(h int32) {
	p := &s.pods[h]
	if p.mOpen || !p.present {
		return
	}
	p.advance(s.now)
	p.mOpen, p.mStart, p.mStartCPU = true, s.now, p.cpu
}

func (s *sim) closeMeasure(h int32) {
	p := &s.pods[h]
	if !p.mOpen || p.mDone {
		return
	}
	p.advance(s.now)
	p.mDone, p.mEnd, p.mEndCPU = true, s.now, p.cpu
}

// --- simulated Prometheus --------------------------------------------------

func (s *sim) scrape(h int32) {
	p := &s.pods[h]
	if !p.present {
		return
	}
	p.advance(s.now)
	// The node's other tenants use what the pod's cores leave of the
	// node, give or take NodeNoise, redrawn at every scrape: the node's
	// idle CPU is no exact measure of the pod's cores.
	p.neighbours += p.neighRate * (s.now - p.neighT)
	p.neighT = s.now
	p.neighRate = max(0, p.nodeCores-float64(p.cores)) * (1 + s.sc.nodeNoise()*(2*p.neighRNG.Float64()-1))
	p.samples[p.sN%promRing] = promSample{t: s.now, cpu: p.cpu, req: p.reqs, latSum: p.latSum, node: p.neighbours + p.cpu}
	p.sN++
	if next := s.now + s.scrapeEvery; next <= s.end {
		s.push(event{t: next, kind: evScrape, pod: h})
	}
}

// promRate is PromQL rate(counter[window]) evaluated now for one pod: the
// samples in (now-window, now], extrapolated like Prometheus does. ok=false
// with fewer than two samples.
func (s *sim) promRate(h int32, series promSeries) (float64, bool) {
	return s.promRateOver(h, series, s.rateWindow)
}

// promRateOver is promRate over another window.
func (s *sim) promRateOver(h int32, series promSeries, window float64) (float64, bool) {
	p := &s.pods[h]
	var ts, vs [promRing]float64
	n := 0
	lo := s.now - window
	first := max(0, p.sN-promRing)
	for i := first; i < p.sN; i++ {
		x := p.samples[i%promRing]
		if x.t > lo && x.t <= s.now {
			ts[n] = x.t
			switch series {
			case seriesCPU:
				vs[n] = x.cpu
			case seriesReqs:
				vs[n] = x.req
			case seriesNode:
				vs[n] = x.node
			default:
				vs[n] = x.latSum
			}
			n++
		}
	}
	if n < 2 {
		return math.NaN(), false
	}
	return extrapolatedRate(ts[:n], vs[:n], lo, s.now), true
}

// extrapolatedRate follows Prometheus's rate() for a counter without resets:
// the increase between the first and last sample is extrapolated towards the
// window edges (fully when the gap is below 1.1x the mean sample interval,
// else by half an interval; never below a zero counter value), divided by the
// window length.
func extrapolatedRate(ts, vs []float64, start, end float64) float64 {
	n := len(ts)
	increase := vs[n-1] - vs[0]
	sampled := ts[n-1] - ts[0]
	if sampled <= 0 {
		return math.NaN()
	}
	toStart := ts[0] - start
	toEnd := end - ts[n-1]
	avg := sampled / float64(n-1)
	if increase > 0 && vs[0] >= 0 {
		if toZero := sampled * (vs[0] / increase); toZero < toStart {
			toStart = toZero
		}
	}
	threshold := avg * 1.1
	interval := sampled
	if toStart < threshold {
		interval += toStart
	} else {
		interval += avg / 2
	}
	if toEnd < threshold {
		interval += toEnd
	} else {
		interval += avg / 2
	}
	return increase * (interval / sampled) / (end - start)
}

// --- client_side_weighted_round_robin ------------------------------------

// orcaTick closes a pod's load-report window: qps and CPU utilisation over
// the last report window; every later response carries weight =
// qps/utilisation (truncated to an integer, at least 1; no errors, so no
// error penalty).
func (s *sim) orcaTick(h int32) {
	p := &s.pods[h]
	if !p.present {
		return
	}
	p.advance(s.now)
	qps := (p.reqs - p.orcaReqs) / s.orcaWindow
	util := (p.cpu - p.orcaCPU) / (s.orcaWindow * float64(p.cores))
	p.orcaReqs, p.orcaCPU = p.reqs, p.cpu
	p.report = 0
	if qps > 0 && util > 0 {
		p.report = math.Max(1, math.Floor(math.Min(qps/util, math.MaxUint32)))
	}
	if next := s.now + s.orcaWindow; next <= s.end {
		s.push(event{t: next, kind: evOrcaTick, pod: h})
	}
}

// cswrrUpdate is the weight_update_period timer of one client: a host's
// weight is valid when its first report is older than the blackout period
// and its last report younger than the expiration period (an expired host
// starts a new blackout); hosts without a valid weight get the median of the
// valid ones (all 1 when none). A change rebuilds the scheduler.
func (s *sim) cswrrUpdate(ci int32) {
	c := &s.clients[ci]
	now := s.now
	valid := c.csTmp[:0]
	for _, h := range s.hosts {
		ch := &c.cs[h]
		ch.valid = false
		if ch.nonEmptySince < 0 {
			continue
		}
		if ch.lastUpdate < now-csExpiration {
			ch.nonEmptySince = -1
			continue
		}
		if ch.nonEmptySince > now-csBlackout {
			continue
		}
		ch.valid = true
		valid = append(valid, ch.weight)
	}
	def := 1.0
	if len(valid) > 0 {
		slices.Sort(valid)
		def = valid[len(valid)/2]
	}
	c.csTmp = valid
	changed := false
	for _, h := range s.hosts {
		w := def
		if c.cs[h].valid {
			w = c.cs[h].weight
		}
		if c.w[h] != w {
			c.w[h] = w
			changed = true
		}
	}
	if changed {
		s.rebuild(ci)
	}
}

// --- settling ----------------------------------------------------------------

// shareSnap is the weight shares of the hosts at one regular cycle.
type shareSnap struct {
	cycle  int
	hosts  []int32
	shares []float64
}

// shares are every host's weight share (mean over clients for cswrr), in
// host order; nil for strategies that set no weights.
func (s *sim) shares() []float64 {
	if s.ctl == nil && s.def.ctl != ctlCSWRR {
		return nil
	}
	share := make([]float64, len(s.hosts))
	if s.def.ctl == ctlCSWRR {
		for ci := range s.clients {
			c := &s.clients[ci]
			sum := 0.0
			for _, h := range s.hosts {
				sum += c.w[h]
			}
			for i, h := range s.hosts {
				share[i] += c.w[h] / sum / float64(len(s.clients))
			}
		}
		return share
	}
	sum := 0.0
	for _, h := range s.hosts {
		sum += s.weights[h]
	}
	for i, h := range s.hosts {
		share[i] = s.weights[h] / sum
	}
	return share
}

// measureConvergence records the shares after a cycle (or an early one);
// settledCycle reads them at the end.
func (s *sim) measureConvergence() {
	if sh := s.shares(); sh != nil {
		s.snaps = append(s.snaps, shareSnap{cycle: s.cycleIdx, hosts: slices.Clone(s.hosts), shares: sh})
	}
}

// settleTol is how far (relative) a share may be from the strategy's own
// final share and count as settled: the 5% of the engine's quality tests.
const settleTol = 0.05

// settledCycle is the first regular cycle from which every recorded share
// stays within settleTol of the strategy's own final shares (its targets as
// far as the run shows them); -1 when it never settles, or for strategies
// that set no weights.
func (s *sim) settledCycle() int {
	if len(s.snaps) == 0 {
		return -1
	}
	final := s.snaps[len(s.snaps)-1]
	settled := final.cycle
	for i := len(s.snaps) - 1; i >= 0; i-- {
		x := s.snaps[i]
		if !slices.Equal(x.hosts, final.hosts) {
			break
		}
		near := true
		for k := range x.shares {
			if math.Abs(x.shares[k]/final.shares[k]-1) > settleTol {
				near = false
				break
			}
		}
		if !near {
			break
		}
		settled = x.cycle
	}
	if settled > final.cycle-settleCycles {
		return -1 // still moving near the end: not settled
	}
	return settled
}

// lateChanges counts the weight writes after the settled cycle, and the
// balancer changes after it and after the one that ended the opt-in's
// learning spell: that switch is the balancer converging, not a change
// after convergence.
func (s *sim) lateChanges(settled int) (writes, switches int) {
	for _, t := range s.writeTimes {
		if s.cycleAt(t) > settled {
			writes++
		}
	}
	converged := max(settled, s.learnedCycle)
	for _, t := range s.switchTimes {
		if s.cycleAt(t) > converged {
			switches++
		}
	}
	return writes, switches
}

// cycleAt is the index of the last regular cycle run at or before t (0:
// none), the cycle a change sent at t belongs to.
func (s *sim) cycleAt(t float64) int {
	i, found := slices.BinarySearch(s.cycleTimes, t)
	for found && i < len(s.cycleTimes) && s.cycleTimes[i] == t {
		i++
	}
	return i
}

// regularCycle counts a regular cycle (not an early one) run now.
func (s *sim) regularCycle() {
	s.cycleIdx++
	s.cycleTimes = append(s.cycleTimes, s.now)
}

// restartWindow is the number of regular cycles after a restart over which
// its writes are counted: the new manager must keep what the one before it
// learned, and five cycles is what the restart tests of controllers/ hold
// it to.
const restartWindow = 5

// changesAfter counts the weight and load-balancer changes sent from t
// through the n-th regular cycle after it (to the run's end when fewer
// ran).
func (r *StrategyResult) changesAfter(t float64, n int) (writes, switches int) {
	end := math.Inf(1)
	if i, _ := slices.BinarySearch(r.CycleTimes, t); i+n-1 < len(r.CycleTimes) {
		end = r.CycleTimes[i+n-1]
	}
	within := func(ts []float64) (k int) {
		for _, x := range ts {
			if x >= t && x <= end {
				k++
			}
		}
		return k
	}
	return within(r.WriteTimes), within(r.SwitchTimes)
}

// settleCycles: shares must hold for this many cycles before the run's end
// to count as settled (one is no evidence; two show a repeat).
const settleCycles = 2

// --- results -----------------------------------------------------------------

// StrategyResult is one strategy's measurements on one scenario.
type StrategyResult struct {
	Name         string  `json:"name"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	P999Ms       float64 `json:"p999_ms"`
	MaxMeanUtil  float64 `json:"max_mean_util"`
	Publications int     `json:"publications"`
	// PolicySwitches: changes between LEAST_REQUEST and ROUND_ROBIN
	// (optimizer in its default mode), each a DestinationRule write.
	PolicySwitches int `json:"policy_switches"`
	// Alarms: cycles run between the regular ones because Engine.Alarm
	// rang (optimizer strategies under ROUND_ROBIN).
	Alarms int `json:"alarms"`
	// SettledCycle: the first cycle from which every weight share stays
	// within 5% of the strategy's own final share; -1 never, or no weights.
	SettledCycle int `json:"settled_cycle"`
	// Writes: weight changes sent to the clients (ServiceEntry writes);
	// WritesAfterSettled counts those in cycles after SettledCycle,
	// SwitchesAfterSettled the balancer changes after it and after the
	// change that ended the opt-in's learning spell (a calm control plane
	// makes none).
	Writes               int `json:"writes"`
	WritesAfterSettled   int `json:"writes_after_settled"`
	SwitchesAfterSettled int `json:"switches_after_settled"`
	// Restarts: how many times the operator's manager stopped
	// (EventRestart); WritesAfterRestart and SwitchesAfterRestart count
	// the weight and balancer changes from each stop through the fifth
	// regular cycle after it (restartWindow; a restart that keeps what
	// was learned makes none).
	Restarts             int      `json:"restarts,omitempty"`
	WritesAfterRestart   int      `json:"writes_after_restart,omitempty"`
	SwitchesAfterRestart int      `json:"switches_after_restart,omitempty"`
	MinMeanUtil          float64  `json:"min_mean_util"`
	MeanMs               float64  `json:"mean_ms"`
	MaxQueue             int      `json:"max_queue"`
	P99AfterMs           *float64 `json:"p99_after_event_ms,omitempty"`
	P999AfterMs          *float64 `json:"p999_after_event_ms,omitempty"`
	// P99PerMinuteMs: p99 of the requests that arrived in each minute
	// after the warm-up (Scenario.PerMinute).
	P99PerMinuteMs []float64 `json:"p99_per_minute_ms,omitempty"`
	// LearnedAt: first cycle time (s) the engine reported Learned; -1 never.
	LearnedAt   float64        `json:"learned_at_s,omitempty"`
	Requests    uint64         `json:"requests"`
	Modes       map[string]int `json:"optimizer_modes,omitempty"`
	Notes       []string       `json:"notes,omitempty"`
	ElapsedSec  float64        `json:"-"`
	Arrivals    uint64         `json:"-"`
	ArrivalHash uint64         `json:"-"`
	Utilisation []float64      `json:"-"` // by pod index, NaN when never measured
	// CycleTimes, WriteTimes and SwitchTimes (s): when each regular
	// cycle ran and each weight and load-balancer change was sent.
	CycleTimes, WriteTimes, SwitchTimes []float64 `json:"-"`
}

func (s *sim) result(elapsed time.Duration) StrategyResult {
	r := StrategyResult{
		Name:           s.def.name,
		P50Ms:          s.lat.quantile(0.50) * 1e3,
		P99Ms:          s.lat.quantile(0.99) * 1e3,
		P999Ms:         s.lat.quantile(0.999) * 1e3,
		MeanMs:         s.lat.mean() * 1e3,
		MaxQueue:       s.maxQueue,
		Publications:   s.publications,
		PolicySwitches: s.switches,
		Alarms:         s.alarms,
		SettledCycle:   s.settledCycle(),
		Writes:         len(s.writeTimes),
		Requests:       s.lat.n,
		ElapsedSec:     elapsed.Seconds(),
		Arrivals:       s.arrivals,
		ArrivalHash:    s.arrHash,
		Notes:          s.notes,
	}
	if r.SettledCycle >= 0 {
		r.WritesAfterSettled, r.SwitchesAfterSettled = s.lateChanges(r.SettledCycle)
	}
	r.CycleTimes, r.WriteTimes, r.SwitchTimes = s.cycleTimes, s.writeTimes, s.switchTimes
	r.Restarts = len(s.restarts)
	for _, t := range s.restarts {
		w, sw := r.changesAfter(t, restartWindow)
		r.WritesAfterRestart += w
		r.SwitchesAfterRestart += sw
	}
	if len(s.modes) > 0 {
		r.Modes = s.modes
	}
	if o, ok := s.ctl.(*optimizerCtl); ok {
		r.LearnedAt = o.learnedAt
	}
	for _, h := range s.perMinute {
		r.P99PerMinuteMs = append(r.P99PerMinuteMs, h.quantile(0.99)*1e3)
	}
	if s.latAfter != nil {
		v := s.latAfter.quantile(0.99) * 1e3
		r.P99AfterMs = &v
		v9 := s.latAfter.quantile(0.999) * 1e3
		r.P999AfterMs = &v9
	}
	sum, n, mx, mn := 0.0, 0, 0.0, math.Inf(1)
	r.Utilisation = make([]float64, s.P)
	for i := range s.pods {
		p := &s.pods[i]
		r.Utilisation[i] = math.NaN()
		if !p.mDone || p.mEnd <= p.mStart {
			continue
		}
		u := (p.mEndCPU - p.mStartCPU) / (float64(p.cores) * (p.mEnd - p.mStart))
		r.Utilisation[i] = u
		sum += u
		n++
		mx = max(mx, u)
		mn = min(mn, u)
	}
	if n > 0 && sum > 0 {
		mean := sum / float64(n)
		r.MaxMeanUtil = mx / mean
		r.MinMeanUtil = mn / mean
	}
	return r
}

// note records an anomaly for the report (first few only).
func (s *sim) note(msg string) {
	if len(s.notes) < 8 {
		s.notes = append(s.notes, msg)
	}
}

// applied: the strategy is in force (it has no opt-in, or it has passed).
// Before it, a static oracle leaves the pods to Istio's default.
func (s *sim) applied() bool { return s.now >= s.optIn }
