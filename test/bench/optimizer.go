package main

import (
	"fmt"
	"math"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/test/bench/driver"
)

// optimizerCtl is the operator in the simulation: a thin adapter between
// the simulated Prometheus and the operator's policy (internal/policy,
// through test/bench/driver, which drives it as controllers/ does). The
// policy decides when cycles and looks run (sim.go asks it through
// scheduler), what is written and which load balancer the clients run; the
// adapter only turns the simulated scrapes into the answers of the
// operator's queries and publishes the weights and the balancer.
// cpuOnly: no Istio metrics (the request and latency queries find nothing).
type optimizerCtl struct {
	cpuOnly   bool
	learnedAt float64
	drv       *driver.Driver
	cfg       policy.Config
	// name is the optimizer's namespace/name, from which its jitter is
	// drawn as in the operator (policy.JitterSeed).
	name string
	// rec records the answers to write to recordTrace (nil: none).
	rec *driver.Trace
	// idle: the policy has nothing due until the pod set changes.
	idle bool
	// wakeAt is the instant of the one evPolicy event this controller
	// expects (NaN once taken); a manager's stop leaves an earlier one
	// pending, which wake then ignores.
	wakeAt float64
	// down: no manager runs until the evPolicy event at wakeAt
	// (EventRestart).
	down bool
	// seenAt is when the manager running now first met the pods: those
	// present then count as long-ready, as the mirror counts them.
	seenAt float64
	// last is the instant of the last action the policy ran, which can be
	// a rounding after the simulated clock's float seconds (see wake):
	// the policy's clock never runs back, or it reads a clock step.
	last time.Time
}

// clock is the policy's now: the simulated clock, never before the last
// action's instant.
func (o *optimizerCtl) clock(s *sim) time.Time {
	now := simTime(s.now)
	if now.Before(o.last) {
		return o.last
	}
	return now
}

// recordTrace, when set (--record-trace), is where the "optimizer"
// strategy writes the signal trace it was answered with (driver.Trace).
var recordTrace string

// simEpoch is simulated time zero.
var simEpoch = time.Unix(0, 0).UTC()

func simTime(t float64) time.Time { return simEpoch.Add(time.Duration(t * float64(time.Second))) }

func simSeconds(t time.Time) float64 { return t.Sub(simEpoch).Seconds() }

// newOptimizerCtl builds the policy with DefaultParams, told the scenario's
// rate window and scrape interval as the operator's configuration would.
// roundRobin is the user's load_balancer ROUND_ROBIN (the default; under it
// the operator looks between cycles), else LEAST_REQUEST.
func newOptimizerCtl(sc *Scenario, cpuOnly, roundRobin bool) controller {
	p := benchEngineParams()
	p.QueryWindow = sc.Prometheus.RateWindow.Duration
	p.ScrapeInterval = sc.Prometheus.ScrapeInterval.Duration
	name := fmt.Sprintf("bench/%s-%d", sc.Name, sc.Seed)
	cfg := policy.Config{Cycle: sc.Cycle.Duration, Engine: p, Balancer: weights.BalancerLeastRequest,
		Jitter: policy.NewJitter(policy.JitterSeed(name))}
	if roundRobin {
		cfg.Balancer = weights.BalancerRoundRobin
		if !cpuOnly {
			// The operator looks only when its recent latency query runs.
			cfg.LookInterval = policy.LookInterval(p.ScrapeInterval)
		}
	}
	o := &optimizerCtl{cpuOnly: cpuOnly, learnedAt: -1, drv: driver.New(cfg), cfg: cfg, name: name}
	if recordTrace != "" && !cpuOnly && roundRobin {
		o.rec = &driver.Trace{Optimizer: name, Cycle: driver.Duration{Duration: cfg.Cycle}, QueryWindow: driver.Duration{Duration: p.QueryWindow},
			ScrapeInterval: driver.Duration{Duration: p.ScrapeInterval}, Balancer: cfg.Balancer}
	}
	return o
}

// source is what the operator's queries are answered from.
func (o *optimizerCtl) source(s *sim) driver.Source {
	src := driver.Source(simSource{s: s, cpuOnly: o.cpuOnly})
	if o.rec != nil {
		src = driver.Recorder{Src: src, Trace: o.rec}
	}
	return src
}

// benchParams, when set (sensitivity runs), adjusts the engine's parameters.
var benchParams func(*weights.Params)

// benchEngineParams are the engine's defaults as benchParams adjusts them.
func benchEngineParams() weights.Params {
	p := weights.DefaultParams()
	if benchParams != nil {
		benchParams(&p)
	}
	return p
}

func (o *optimizerCtl) pods(s *sim) []weights.Pod {
	out := make([]weights.Pod, 0, len(s.hosts))
	for _, h := range s.hosts {
		p := &s.pods[h]
		wp := weights.Pod{Name: p.name, Locality: p.locality, HardwareClass: p.class,
			Cores: float64(p.cores), CPURequest: p.cpuRequest, NodeCores: p.nodeCores, Node: p.name}
		if p.noLimit {
			wp.Cores = 0 // what CPULimit returns for a container without a limit
		}
		if !p.initial && p.addedAt > o.seenAt {
			wp.ReadySince = simTime(p.addedAt)
		}
		out = append(out, wp)
	}
	return out
}

// publish sends written weights (nil: none) to every client and the
// policy's load balancer.
func (o *optimizerCtl) publish(s *sim, m map[string]uint32) {
	if m != nil {
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
	}
	if lb, _ := o.drv.P.Balancer(); lb == weights.BalancerRoundRobin {
		s.setLB(lbWRR)
	} else {
		s.setLB(lbWLR)
	}
}

// start is the opt-in: the mirror's first reconcile, with no ServiceEntry
// or DestinationRule of the operator's yet.
func (o *optimizerCtl) start(s *sim) {
	o.seenAt = s.now
	o.publish(s, o.drv.OptIn(simTime(s.now), o.pods(s), nil, "", "", weights.Snapshot{}))
	if o.rec != nil {
		o.rec.OptIn, o.rec.End = simTime(s.now).UnixNano(), simTime(s.end).UnixNano()
		o.rec.Pods = o.pods(s)
	}
}

// next is when the policy's next action is due (seconds; +Inf: none, until
// the pod set changes).
func (o *optimizerCtl) next(s *sim) float64 {
	act, at := o.drv.Next(o.clock(s))
	o.idle = act == policy.Wait
	if o.idle {
		o.wakeAt = math.NaN()
		return math.Inf(1)
	}
	o.wakeAt = max(simSeconds(at), s.now)
	return o.wakeAt
}

// stop is the manager's end (EventRestart): nothing runs and nothing is
// written until a new manager takes over after downtime (wake).
func (o *optimizerCtl) stop(s *sim, downtime float64) {
	s.restarts = append(s.restarts, s.now)
	o.down, o.wakeAt = true, s.now+downtime
	if o.wakeAt <= s.end {
		s.push(event{t: o.wakeAt, kind: evPolicy})
	}
	if o.rec != nil {
		o.rec.Restarts = append(o.rec.Restarts, driver.Restart{Stop: simTime(s.now).UnixNano(), Resume: simTime(o.wakeAt).UnixNano()})
		if o.wakeAt > s.end {
			// No manager runs again: the trace ends here.
			o.writeTrace(s)
		}
	}
}

// writeTrace writes the recorded trace (--record-trace).
func (o *optimizerCtl) writeTrace(s *sim) {
	if err := o.rec.Write(recordTrace); err != nil {
		s.note(fmt.Sprintf("record trace: %v", err))
	}
}

// takeOver is a new manager's start: its policy is seeded from the live
// weights, the persisted learned state and the live DestinationRule
// (driver.Restart), and the pods present count as long-ready.
func (o *optimizerCtl) takeOver(s *sim) {
	o.down, o.seenAt = false, s.now
	cfg := o.cfg
	cfg.Jitter = policy.NewJitter(policy.JitterSeed(o.name))
	o.publish(s, o.drv.Restart(simTime(s.now), cfg, o.pods(s)))
}

// wake runs the policy's action due now and returns when the next is due.
func (o *optimizerCtl) wake(s *sim) float64 {
	if s.now != o.wakeAt {
		// An event of a stopped manager's.
		return math.Inf(1)
	}
	o.wakeAt = math.NaN()
	if o.down {
		o.takeOver(s)
		return o.next(s)
	}
	now := o.clock(s)
	act, at := o.drv.Next(now)
	if act == policy.Wait || at.Sub(now) > time.Microsecond {
		return o.next(s)
	}
	if at.After(now) {
		// The simulated clock is in float seconds: the policy's own
		// instant, a rounding away, is the one it acts at.
		now = at
	}
	o.last = now
	st := o.drv.Run(now, act, o.source(s))
	switch {
	case act == policy.Look:
		if st.Alarm != nil && s.trace != nil {
			fmt.Fprintf(s.trace, "%s t=%5.0fs alarm: %s: %s\n", s.def.name, s.now, st.Alarm.Pod, st.Alarm.Why)
		}
	case st.Decision.Early:
		// Not a regular cycle: cycleIdx (convergence, reported in
		// cycles of the scenario's length) does not count it.
		s.alarms++
	default:
		s.regularCycle()
	}
	if act == policy.Cycle {
		o.traced(s, st)
		res := st.Decision.Result
		s.modes[string(res.Mode)]++
		if res.Learned && o.learnedAt < 0 {
			o.learnedAt = s.now
		}
	}
	o.publish(s, st.Written)
	next := o.next(s)
	if o.rec != nil && next > s.end {
		o.writeTrace(s)
	}
	return next
}

func (o *optimizerCtl) traced(s *sim, st driver.Step) {
	if s.trace == nil {
		return
	}
	res := st.Decision.Result
	fmt.Fprintf(s.trace, "%s t=%5.0fs %-10s changed=%-5v learned=%-5v lb=%s (%s) %s\n", s.def.name, s.now, res.Mode, res.Changed, res.Learned,
		st.Balancer, st.Decision.Why, res.Message)
	for _, h := range s.hosts {
		p := &s.pods[h]
		fmt.Fprintf(s.trace, "    %-12s speed=%.3f cores=%d queue=%d capacity=%.3f weight=%d\n",
			p.name, p.speed, p.cores, p.qlen(), res.Capacity[p.name], res.Weights[p.name])
	}
}

// cycle is not called for a policy-driven controller (sim.go schedules it
// through scheduler); it runs a cycle now, for completeness.
func (o *optimizerCtl) cycle(s *sim) {
	st := o.drv.Run(simTime(s.now), policy.Cycle, simSource{s: s, cpuOnly: o.cpuOnly})
	o.publish(s, st.Written)
}

func (o *optimizerCtl) podsChanged(s *sim) {
	if o.down {
		return // no mirror runs; the next manager meets the pods
	}
	o.publish(s, o.drv.PodsChanged(simTime(s.now), o.pods(s)))
	if o.idle {
		// The policy waited for pods: ask it again.
		if next := o.next(s); next <= s.end {
			s.push(event{t: next, kind: evPolicy})
		}
	}
}

func (o *optimizerCtl) truthChanged(*sim) {}

// simSource answers the operator's queries from the simulated Prometheus.
type simSource struct {
	s       *sim
	cpuOnly bool
}

var _ driver.Source = simSource{}

// Cycle: rate of the per-pod CPU-seconds and served-requests counters over
// the rate window, the latency histogram's mean, the node's CPU, and the
// CPU, latency and served requests over two scrape intervals; pods
// without a CPU sample are left out (no data).
func (q simSource) Cycle(_ time.Time, _ []weights.Pod) map[string]weights.Signal {
	s := q.s
	out := map[string]weights.Signal{}
	for _, h := range s.hosts {
		cpu, ok := s.promRate(h, seriesCPU)
		if !ok {
			continue
		}
		node := 0.0 // no data
		if s.sc.nodeCPU() {
			node, _ = s.promRate(h, seriesNode)
		}
		recent, _ := s.promRateOver(h, seriesCPU, 2*s.scrapeEvery)
		req, lat, recentLat, recentReq := math.NaN(), math.NaN(), math.NaN(), math.NaN()
		if !q.cpuOnly {
			req, _ = s.promRate(h, seriesReqs)
			lat = s.promLatency(h, s.rateWindow)
			recentLat = s.promLatency(h, 2*s.scrapeEvery)
			recentReq, _ = s.promRateOver(h, seriesReqs, 2*s.scrapeEvery)
		}
		out[s.pods[h].name] = weights.Signal{CPU: cpu, Requests: req, Latency: lat, NodeCPU: node, RecentCPU: recent, RecentLatency: recentLat, RecentRequests: recentReq}
	}
	return out
}

// Look: the latency and request queries over the last two scrape intervals.
func (q simSource) Look(_ time.Time, _ []weights.Pod) map[string]weights.Signal {
	s := q.s
	out := map[string]weights.Signal{}
	for _, h := range s.hosts {
		lat, req := math.NaN(), math.NaN()
		if !q.cpuOnly {
			lat = s.promLatency(h, 2*s.scrapeEvery)
			req, _ = s.promRateOver(h, seriesReqs, 2*s.scrapeEvery)
		}
		out[s.pods[h].name] = weights.Signal{CPU: math.NaN(), Requests: math.NaN(), Latency: math.NaN(), RecentLatency: lat, RecentRequests: req}
	}
	return out
}

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

// observe is what a cycle's queries return now.
func (o *optimizerCtl) observe(s *sim) weights.Observation {
	return weights.Observation{Time: simTime(s.now), Signals: simSource{s: s, cpuOnly: o.cpuOnly}.Cycle(simTime(s.now), o.pods(s))}
}
