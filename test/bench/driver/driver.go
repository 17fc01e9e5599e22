// Package driver runs the operator's policy (internal/policy) against a
// source of query answers, the way controllers/ does: the benchmark drives it
// on its simulated clock and Prometheus, and the trace-replay test on a
// recorded trace. It holds no orchestration of its own: the policy decides
// when a cycle or a look runs and what the DestinationRule says; the driver
// asks the source, writes the weights as the operator's mirror would (only
// when they differ from the live ones, then Applied) and counts.
package driver

import (
	"maps"
	"math"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// Source answers the operator's queries at an instant, by pod.
type Source interface {
	// Cycle is what a cycle's queries return at now: per pod the CPU,
	// requests, latency, node CPU over the query window and the recent CPU
	// and latency over two scrape intervals; NaN where a query has no
	// value.
	Cycle(now time.Time, pods []weights.Pod) map[string]weights.Signal
	// Look is what a look's query returns at now: per pod the recent
	// latency (RecentLatency; the other fields NaN).
	Look(now time.Time, pods []weights.Pod) map[string]weights.Signal
}

// Step is what one action did.
type Step struct {
	Time   time.Time
	Action policy.Action
	// Decision is the cycle's (Action Cycle).
	Decision policy.Decision
	// Alarm: the look rang (Action Look).
	Alarm *policy.Alarm
	// Written: the weights written after the step (nil: no write).
	Written map[string]uint32
	// Balancer is the load balancer after the step.
	Balancer weights.Balancer
}

// Driver is one optimizer as the operator runs it.
type Driver struct {
	P    *policy.Policy
	pods []weights.Pod
	live map[string]uint32
	// annotation is the learned state the optimizer carries (the
	// learned-state annotation), written when the policy says, as the
	// mirror writes it.
	annotation weights.Snapshot
	// switchesBefore counts the load-balancer changes of the policies
	// that ran before the last Restart.
	switchesBefore int
	// Writes counts ServiceEntry weight writes.
	Writes int
}

// New returns a driver for cfg, before its opt-in.
func New(cfg policy.Config) *Driver {
	return &Driver{P: policy.New(cfg)}
}

// Restart is a new manager taking over at now, as after a crash or a
// leader's failover: a new policy with cfg (a new manager draws its jitter
// afresh), seeded from what the cluster holds (the live weights, the
// learned state persisted on the optimizer, the DestinationRule's load
// balancer and the reason recorded in the optimizer's status for it). It
// returns the weights written, nil when none.
func (d *Driver) Restart(now time.Time, cfg policy.Config, pods []weights.Pod) map[string]uint32 {
	lb, why := d.P.Balancer()
	d.switchesBefore += d.P.Switches()
	d.P = policy.New(cfg)
	d.P.OptIn(now, pods, d.live, lb, why, d.annotation)
	return d.reconcile(now, pods)
}

// OptIn is the mirror's first reconcile at now: the policy is seeded (live:
// the weights a ServiceEntry already carries, nil at a first opt-in;
// liveBalancer: the DestinationRule's, "" when none; liveWhy: the reason
// the manager before gave for it, "" when unknown) and the weights it
// returns are written. It returns them.
func (d *Driver) OptIn(now time.Time, pods []weights.Pod, live map[string]uint32, liveBalancer weights.Balancer, liveWhy policy.Reason, snap weights.Snapshot) map[string]uint32 {
	d.P.OptIn(now, pods, live, liveBalancer, liveWhy, snap)
	d.live = maps.Clone(live)
	if snap.Valid() {
		d.annotation = snap
	}
	return d.reconcile(now, pods)
}

// PodsChanged is the mirror's reconcile after the endpoint set changed; it
// returns the weights written, nil when none.
func (d *Driver) PodsChanged(now time.Time, pods []weights.Pod) map[string]uint32 {
	return d.reconcile(now, pods)
}

// reconcile writes what the policy's weights for pods are when they differ
// from the live ones, and records them as applied, as the mirror does.
func (d *Driver) reconcile(now time.Time, pods []weights.Pod) map[string]uint32 {
	d.pods = append(d.pods[:0], pods...)
	w := d.P.Weights(now, pods)
	var written map[string]uint32
	if !maps.Equal(w, d.live) {
		d.live, written = w, w
		d.Writes++
	}
	d.P.Applied(now, d.live)
	// The mirror persists the learned state after each reconcile when the
	// policy says it is worth a write.
	if snap, ok := d.P.SnapshotToPersist(); ok {
		d.annotation = snap
		d.P.Persisted(snap)
	}
	return written
}

// Next is the policy's next action and its instant.
func (d *Driver) Next(now time.Time) (policy.Action, time.Time) { return d.P.Next(now) }

// Run performs the action due at now (see Next) with answers from src.
func (d *Driver) Run(now time.Time, act policy.Action, src Source) Step {
	st := Step{Time: now, Action: act}
	switch act {
	case policy.Look:
		obs := weights.Observation{Time: now, Signals: usable(src.Look(now, d.pods))}
		if a, ring := d.P.Look(now, obs); ring {
			st.Alarm = &a
		}
	case policy.Cycle:
		obs := weights.Observation{Time: now, Signals: src.Cycle(now, d.pods)}
		st.Decision = d.P.Cycle(now, obs, d.pods)
		// The mirror reconciles after every cycle.
		st.Written = d.reconcile(now, d.pods)
	}
	st.Balancer, _ = d.P.Balancer()
	return st
}

// usable keeps the pods with a recent latency or request rate, as a
// look's answer holds only pods with data (the operator's lookSignals).
func usable(in map[string]weights.Signal) map[string]weights.Signal {
	out := make(map[string]weights.Signal, len(in))
	for pod, s := range in {
		if !math.IsNaN(s.RecentLatency) || !math.IsNaN(s.RecentRequests) {
			out[pod] = s
		}
	}
	return out
}

// Live returns the weights written last.
func (d *Driver) Live() map[string]uint32 { return d.live }

// Switches counts the load-balancer changes (DestinationRule writes).
func (d *Driver) Switches() int { return d.switchesBefore + d.P.Switches() }
