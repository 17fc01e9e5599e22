package main

import (
	"fmt"
	"math"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// optimizerCtl drives the project's weight package exactly as the operator
// does: one Observation per cycle built from the simulated Prometheus
// (rate of the per-pod CPU-seconds and served-requests counters over the
// rate window), publication to every client when the engine says Changed,
// Applied after each publication, Weights when the pod set changes.
// cpuOnly sends Requests = NaN and Latency = NaN (no Istio metrics).
// Latency is what the operator's default query returns: rate of the
// sidecar's latency histogram _sum over rate of its _count, both over the
// rate window. With lrUntilLearned (the operator's default load_balancer,
// ROUND_ROBIN) the clients use LEAST_REQUEST until the engine reports
// Learned, and weighted ROUND_ROBIN while it does.
type optimizerCtl struct {
	cpuOnly        bool
	lrUntilLearned bool
	learnedAt      float64
	eng            *weights.Engine
}

// simEpoch is simulated time zero.
var simEpoch = time.Unix(0, 0).UTC()

func simTime(t float64) time.Time { return simEpoch.Add(time.Duration(t * float64(time.Second))) }

// newOptimizerCtl builds the engine with DefaultParams, told the scenario's
// rate window and scrape interval as the operator's configuration would.
func newOptimizerCtl(sc *Scenario, cpuOnly, lrUntilLearned bool) controller {
	p := weights.DefaultParams()
	p.QueryWindow = sc.Prometheus.RateWindow.Duration
	p.ScrapeInterval = sc.Prometheus.ScrapeInterval.Duration
	if benchParams != nil {
		benchParams(&p)
	}
	return &optimizerCtl{cpuOnly: cpuOnly, lrUntilLearned: lrUntilLearned, learnedAt: -1, eng: weights.New(p)}
}

// benchParams, when set (sensitivity runs), adjusts the engine's parameters.
var benchParams func(*weights.Params)

func (o *optimizerCtl) pods(s *sim) []weights.Pod {
	out := make([]weights.Pod, 0, len(s.hosts))
	for _, h := range s.hosts {
		p := &s.pods[h]
		wp := weights.Pod{Name: p.name, Locality: p.locality, HardwareClass: p.class,
			Cores: float64(p.cores), CPURequest: p.cpuRequest, NodeCores: p.nodeCores, Node: p.name}
		if p.noLimit {
			wp.Cores = 0 // what CPULimit returns for a container without a limit
		}
		if !p.initial {
			wp.ReadySince = simTime(p.addedAt)
		}
		out = append(out, wp)
	}
	return out
}

func (o *optimizerCtl) publish(s *sim, m map[string]uint32) {
	w := make([]float64, s.P)
	copy(w, s.weights)
	for _, h := range s.hosts {
		v, ok := m[s.pods[h].name]
		switch {
		case !ok:
			s.note(fmt.Sprintf("t=%.0fs: no weight for pod %s", s.now, s.pods[h].name))
		case v == 0:
			s.note(fmt.Sprintf("t=%.0fs: weight 0 for pod %s", s.now, s.pods[h].name))
			w[h] = 1
		default:
			w[h] = float64(v)
		}
	}
	s.publish(w)
	o.eng.Applied(simTime(s.now), m)
}

func (o *optimizerCtl) start(s *sim) {
	o.publish(s, o.eng.Weights(simTime(s.now), o.pods(s)))
}

// observe is what the operator's queries return now: one Signal per pod
// with data.
func (o *optimizerCtl) observe(s *sim) weights.Observation {
	obs := weights.Observation{Time: simTime(s.now), Signals: map[string]weights.Signal{}}
	for _, h := range s.hosts {
		cpu, ok := s.promRate(h, seriesCPU)
		if !ok {
			continue
		}
		node := 0.0 // no data
		if s.sc.nodeCPU() {
			node, _ = s.promRate(h, seriesNode)
		}
		// The operator's recent CPU: rate() over two scrape intervals.
		recent, _ := s.promRateOver(h, seriesCPU, 2*s.scrapeEvery)
		req, lat, recentLat := math.NaN(), math.NaN(), math.NaN()
		if !o.cpuOnly {
			req, _ = s.promRate(h, seriesReqs)
			lat = s.promLatency(h, s.rateWindow)
			recentLat = s.promLatency(h, 2*s.scrapeEvery)
		}
		obs.Signals[s.pods[h].name] = weights.Signal{CPU: cpu, Requests: req, Latency: lat, NodeCPU: node, RecentCPU: recent, RecentLatency: recentLat}
	}
	return obs
}

// probes: the operator looks between cycles only under ROUND_ROBIN (its
// default load_balancer), where nothing else steers around a queue.
func (o *optimizerCtl) probes() bool { return o.lrUntilLearned }

// probe is the operator's look between cycles: the latency query over the
// last two scrape intervals, judged by Engine.Alarm. It reports whether to
// run an early cycle now. Under LEAST_REQUEST (not Learned) Alarm stays
// silent, and with CPU alone (optimizer_cpu) the query finds nothing.
func (o *optimizerCtl) probe(s *sim) bool {
	if !o.eng.Alarming() {
		return false // the operator does not query then
	}
	obs := weights.Observation{Time: simTime(s.now), Signals: map[string]weights.Signal{}}
	for _, h := range s.hosts {
		lat := math.NaN()
		if !o.cpuOnly {
			lat = s.promLatency(h, 2*s.scrapeEvery)
		}
		obs.Signals[s.pods[h].name] = weights.Signal{CPU: math.NaN(), Requests: math.NaN(), Latency: math.NaN(), RecentLatency: lat}
	}
	pod, why, ring := o.eng.Alarm(o.pods(s), obs)
	if ring && s.trace != nil {
		fmt.Fprintf(s.trace, "%s t=%5.0fs alarm: %s: %s\n", s.def.name, s.now, pod, why)
	}
	return ring
}

func (o *optimizerCtl) cycle(s *sim) { o.run(s, false) }

// earlyCycle is the cycle an alarm runs between the regular ones.
func (o *optimizerCtl) earlyCycle(s *sim) { o.run(s, true) }

func (o *optimizerCtl) run(s *sim, early bool) {
	obs := o.observe(s)
	obs.Early = early
	res := o.eng.Update(o.pods(s), obs)
	s.modes[string(res.Mode)]++
	if res.Learned && o.learnedAt < 0 {
		o.learnedAt = s.now
	}
	if s.trace != nil {
		fmt.Fprintf(s.trace, "%s t=%5.0fs %-10s changed=%-5v learned=%-5v %s\n", s.def.name, s.now, res.Mode, res.Changed, res.Learned, res.Message)
		for _, h := range s.hosts {
			p := &s.pods[h]
			sig := obs.Signals[p.name]
			fmt.Fprintf(s.trace, "    %-12s speed=%.3f cores=%d cpu=%.3f req/s=%7.2f lat=%7.1fms queue=%d capacity=%.3f weight=%d\n",
				p.name, p.speed, p.cores, sig.CPU, sig.Requests, sig.Latency*1e3, p.qlen(), res.Capacity[p.name], res.Weights[p.name])
		}
	}
	if res.Changed {
		o.publish(s, res.Weights)
	}
	if o.lrUntilLearned {
		if res.Learned {
			s.setLB(lbWRR)
		} else {
			s.setLB(lbWLR)
		}
	}
}

func (o *optimizerCtl) podsChanged(s *sim) {
	o.publish(s, o.eng.Weights(simTime(s.now), o.pods(s)))
}

func (o *optimizerCtl) speedChanged(*sim, int32) {}

// promLatency is the operator's latency query over window (the rate
// window in a cycle, two scrape intervals for the recent latency): rate of
// the histogram's _sum over rate of its _count; NaN without data.
func (s *sim) promLatency(h int32, window float64) float64 {
	req, ok1 := s.promRateOver(h, seriesReqs, window)
	sum, ok2 := s.promRateOver(h, seriesLatSum, window)
	if !ok1 || !ok2 || !(req > 0) {
		return math.NaN()
	}
	return sum / req
}
