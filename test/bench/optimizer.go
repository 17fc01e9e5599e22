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
// cpuOnly sends Requests = NaN (no request metrics).
type optimizerCtl struct {
	cpuOnly bool
	eng     *weights.Engine
}

// simEpoch is simulated time zero.
var simEpoch = time.Unix(0, 0).UTC()

func simTime(t float64) time.Time { return simEpoch.Add(time.Duration(t * float64(time.Second))) }

// newOptimizerCtl builds the engine with DefaultParams, told the scenario's
// rate window and scrape interval as the operator's configuration would.
func newOptimizerCtl(sc *Scenario, cpuOnly bool) controller {
	p := weights.DefaultParams()
	p.QueryWindow = sc.Prometheus.RateWindow.Duration
	p.ScrapeInterval = sc.Prometheus.ScrapeInterval.Duration
	return &optimizerCtl{cpuOnly: cpuOnly, eng: weights.New(p)}
}

func (o *optimizerCtl) pods(s *sim) []weights.Pod {
	out := make([]weights.Pod, 0, len(s.hosts))
	for _, h := range s.hosts {
		p := &s.pods[h]
		wp := weights.Pod{Name: p.name, Locality: p.locality, HardwareClass: p.class, Cores: float64(p.cores)}
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

func (o *optimizerCtl) cycle(s *sim) {
	obs := weights.Observation{Time: simTime(s.now), Signals: map[string]weights.Signal{}}
	for _, h := range s.hosts {
		cpu, ok := s.promRate(h, true)
		if !ok {
			continue
		}
		req := math.NaN()
		if !o.cpuOnly {
			req, _ = s.promRate(h, false)
		}
		obs.Signals[s.pods[h].name] = weights.Signal{CPU: cpu, Requests: req}
	}
	res := o.eng.Update(o.pods(s), obs)
	s.modes[string(res.Mode)]++
	if s.trace != nil {
		fmt.Fprintf(s.trace, "%s t=%5.0fs %-10s changed=%-5v %s\n", s.def.name, s.now, res.Mode, res.Changed, res.Message)
		for _, h := range s.hosts {
			p := &s.pods[h]
			sig := obs.Signals[p.name]
			fmt.Fprintf(s.trace, "    %-12s speed=%.3f cpu=%.3f req/s=%7.2f capacity=%.3f weight=%d\n",
				p.name, p.speed, sig.CPU, sig.Requests, res.Capacity[p.name], res.Weights[p.name])
		}
	}
	if res.Changed {
		o.publish(s, res.Weights)
	}
}

func (o *optimizerCtl) podsChanged(s *sim) {
	o.publish(s, o.eng.Weights(simTime(s.now), o.pods(s)))
}

func (o *optimizerCtl) speedChanged(*sim, int32) {}
