package weights

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// closedLoop models a Service under the engine, the way the operator sees
// it: every pod has a true speed, clients send traffic in proportion to the
// published weights, each pod serves what it can (the rest queues), and
// the engine only sees per-pod counters scraped every scrapeEvery and
// turned into rates over a window exactly as Prometheus' rate() does.
type closedLoop struct {
	t      *testing.T
	engine *Engine
	pods   []Pod
	speed  []float64 // requests per core-second, relative

	cores       float64 // CPU of every pod; a pod never uses more
	work        float64 // CPU-seconds per request at speed 1
	offered     float64 // total requests per second sent by clients
	scrapeEvery time.Duration
	scrapePhase time.Duration // first scrape after start
	window      time.Duration
	cycle       time.Duration
	cpuNoise    float64 // relative error of the CPU counted in each scrape interval
	uniform     bool    // error uniform in ±cpuNoise, else normal with std cpuNoise
	useRequests bool    // the engine gets request rates too
	maxQueue    time.Duration

	rng       *rand.Rand
	t0        time.Time
	now       time.Time
	nextCycle time.Time
	live      map[string]uint32

	backlog  []float64
	cpu      []float64 // true CPU-seconds used
	served   []float64 // requests completed
	scraped  []float64 // CPU counter as scraped (noise included)
	lastSeen []float64 // true CPU at the previous scrape
	scrapes  []scrape
	writes   int
}

type scrape struct {
	at       time.Time
	cpu, req []float64
}

type loopConfig struct {
	speeds      []float64
	load        float64 // offered load as a fraction of total capacity
	phase       time.Duration
	cpuNoise    float64
	uniform     bool
	useRequests bool
	knownCores  bool // the engine is told each pod's cores
	params      *Params
	seed        uint64
	// maxQueue is how long requests queue before clients give up (0: 2s).
	maxQueue time.Duration
}

func newClosedLoop(t *testing.T, cfg loopConfig) *closedLoop {
	t.Helper()
	p := capacityParams()
	if cfg.params != nil {
		p = *cfg.params
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &closedLoop{
		t:           t,
		engine:      New(p),
		speed:       cfg.speeds,
		cores:       2,
		work:        0.01,
		scrapeEvery: 15 * time.Second,
		scrapePhase: cfg.phase,
		window:      p.QueryWindow,
		cycle:       30 * time.Second,
		cpuNoise:    cfg.cpuNoise,
		uniform:     cfg.uniform,
		useRequests: cfg.useRequests,
		maxQueue:    cfg.maxQueue,
		rng:         rand.New(rand.NewPCG(cfg.seed, 42)),
		now:         start,
		t0:          start,
	}
	n := len(cfg.speeds)
	total := 0.0
	for i, s := range cfg.speeds {
		pod := Pod{Name: fmt.Sprintf("pod-%02d", i), Locality: "r/z/s"}
		if cfg.knownCores {
			pod.Cores = l.cores
		}
		l.pods = append(l.pods, pod)
		total += s * l.cores / l.work
	}
	l.offered = cfg.load * total
	l.backlog = make([]float64, n)
	l.cpu = make([]float64, n)
	l.served = make([]float64, n)
	l.scraped = make([]float64, n)
	l.lastSeen = make([]float64, n)

	// Equal weights have been live for a while before the engine starts.
	if l.maxQueue == 0 {
		l.maxQueue = defaultMaxQueue
	}
	// They are the engine's own (the operator's first write), so CPU
	// alone may learn from the traffic shares they set.
	l.live = l.engine.Weights(l.now, l.pods)
	l.engine.Applied(l.now, l.live)
	l.run(2 * time.Minute)
	l.nextCycle = l.now.Add(l.cycle)
	return l
}

// defaultMaxQueue is how long a request waits before its client times out.
const defaultMaxQueue = 2 * time.Second

// run advances the model by d in one-second steps, scraping on schedule.
func (l *closedLoop) run(d time.Duration) {
	const dt = time.Second
	end := l.now.Add(d)
	for l.now.Before(end) {
		sum := 0.0
		for _, pod := range l.pods {
			sum += float64(l.live[pod.Name])
		}
		for i, pod := range l.pods {
			l.backlog[i] += l.offered * float64(l.live[pod.Name]) / sum * dt.Seconds()
			can := l.cores * l.speed[i] / l.work * dt.Seconds()
			done := min(l.backlog[i], can)
			// Clients give up on requests queued longer than maxQueue.
			l.backlog[i] = min(l.backlog[i]-done, can*l.maxQueue.Seconds()/dt.Seconds())
			l.served[i] += done
			l.cpu[i] += done * l.work / l.speed[i]
		}
		l.now = l.now.Add(dt)
		if (l.now.Sub(l.t0)-l.scrapePhase)%l.scrapeEvery == 0 {
			l.scrape()
		}
	}
}

func (l *closedLoop) scrape() {
	s := scrape{at: l.now, cpu: make([]float64, len(l.pods)), req: make([]float64, len(l.pods))}
	for i := range l.pods {
		used := l.cpu[i] - l.lastSeen[i]
		l.lastSeen[i] = l.cpu[i]
		e := l.rng.NormFloat64()
		if l.uniform {
			e = 2*l.rng.Float64() - 1
		}
		l.scraped[i] += max(0, used*(1+l.cpuNoise*e))
		s.cpu[i] = l.scraped[i]
		s.req[i] = l.served[i]
	}
	l.scrapes = append(l.scrapes, s)
}

// rate is Prometheus' rate over (at-window, at]: the increase between the
// first and the last sample in the window, extrapolated to the window's
// ends (samples are regular here, so extrapolation keeps the slope).
func (l *closedLoop) rate(at time.Time, value func(scrape) float64) (float64, bool) {
	var first, last *scrape
	for k := range l.scrapes {
		s := &l.scrapes[k]
		if s.at.After(at.Add(-l.window)) && !s.at.After(at) {
			if first == nil {
				first = s
			}
			last = s
		}
	}
	if first == nil || first == last {
		return 0, false
	}
	return (value(*last) - value(*first)) / last.at.Sub(first.at).Seconds(), true
}

// step runs until the next cycle, queries, updates and applies.
func (l *closedLoop) step() Result {
	l.run(l.nextCycle.Sub(l.now))
	obs := Observation{Time: l.now, Signals: map[string]Signal{}}
	for i, pod := range l.pods {
		cpu, ok := l.rate(l.now, func(s scrape) float64 { return s.cpu[i] })
		if !ok {
			continue
		}
		sig := Signal{CPU: cpu, Requests: math.NaN()}
		if l.useRequests {
			sig.Requests, _ = l.rate(l.now, func(s scrape) float64 { return s.req[i] })
		}
		obs.Signals[pod.Name] = sig
	}
	res := l.engine.Update(l.pods, obs)
	if res.Changed {
		l.live = res.Weights
		l.engine.Applied(l.now, res.Weights)
		l.writes++
	}
	l.nextCycle = l.nextCycle.Add(l.cycle)
	// Keep only the scrapes a query can still reach.
	for len(l.scrapes) > 0 && l.scrapes[0].at.Before(l.now.Add(-2*l.window)) {
		l.scrapes = l.scrapes[1:]
	}
	return res
}

// shareError is the largest relative gap between a pod's weight share and
// the share the promise gives it: the solver's optimum with the true cores
// and speeds at the true load when the engine is told the cores, else
// (nothing shows utilisation) capacity shares.
func (l *closedLoop) shareError() float64 {
	want := l.wantShares()
	wsum := 0.0
	for _, pod := range l.pods {
		wsum += float64(l.live[pod.Name])
	}
	worst := 0.0
	for i, pod := range l.pods {
		got := float64(l.live[pod.Name]) / wsum
		worst = max(worst, math.Abs(got/want[i]-1))
	}
	return worst
}

// wantShares is the share each pod should carry (see shareError), floored
// at the MaxRatio bound as the engine's weights are.
func (l *closedLoop) wantShares() []float64 {
	if l.pods[0].Cores > 0 {
		cores := make([]float64, len(l.pods))
		for i := range cores {
			cores[i] = l.cores
		}
		return SplitWithin(cores, l.speed, l.offered*l.work, l.engine.params.MaxRatio)
	}
	x := make([]float64, len(l.pods))
	copy(x, l.speed)
	p := l.engine.params.proposalFrom(l.now, l.pods, x)
	sum := 0.0
	for _, v := range p {
		sum += v
	}
	for i := range p {
		p[i] /= sum
	}
	return p
}

// hetero12 is the reference scenario: 4 pods each at speeds 1.0, 0.6, 0.35.
func hetero12() []float64 {
	var s []float64
	for _, v := range []float64{1.0, 0.6, 0.35} {
		for range 4 {
			s = append(s, v)
		}
	}
	return s
}

// capacityParams are the defaults the loop tests run with.
func capacityParams() Params { return DefaultParams() }
