// Package policy decides when the weight engine runs and what the
// DestinationRule says, for one optimized Service. It is pure and driven by
// the clock value its caller passes in: no goroutines, no I/O, no clock of
// its own. The operator (controllers/, on a real clock and a Prometheus
// source) and the benchmark (test/bench, on a simulated clock and
// Prometheus) both drive the same Policy, so the benchmark measures what
// ships.
//
// It owns:
//
//   - Timing. The first cycle runs as soon as the endpoints are known at
//     opt-in (OptIn), on the query window from before it; then one cycle
//     every Config.Cycle, give or take half a scrape interval of jitter,
//     counted from the last cycle of either kind. Between cycles, while a
//     look is wanted (ROUND_ROBIN is live on learned weights, so nothing
//     steers around a queue), a look at the recent latency every
//     Config.LookInterval, on the interval's multiples on the clock (shared
//     by all optimizers), up to the regular cycle; an alarm at a look
//     (weights.Engine.Alarm) makes the next cycle due at once.
//   - Seeding. At a first opt-in the pods carried equal traffic under
//     Istio's default LEAST_REQUEST, and the engine is told so over the
//     whole query window (no empty history). After a restart the live
//     weights, with the persisted weights.Snapshot, are settled estimates
//     if the manager before had learned them, estimates as sure as its were
//     if it was still learning them (else a start, with the noise it
//     measured restored), and the live load balancer is kept with the
//     reason the manager before gave for it. The snapshot is worth a write
//     to the optimizer when it is no longer Similar to the one there
//     (SnapshotToPersist).
//   - The load balancer. LEAST_REQUEST until the engine's results have been
//     Learned for a whole query window, then the user's choice. A later
//     result that is not Learned (an alarm, a drained pod, a pod without
//     data) starts a spell of LEAST_REQUEST, as do weights fallen back to
//     equal; one kept from Learned only by the estimates' confidence
//     (weights.Result.Doubtful) starts none: doubt is not evidence, and a
//     pod that the doubted weights overload shows a queue. A spell ends
//     when the results have been Learned for a whole query window, so one
//     result at the edge of the engine's confidence does not switch the
//     mesh back and forth. With CPU alone, a pod at its limit after
//     learning keeps LEAST_REQUEST until request rates measure the speeds
//     (ReasonCPUAtLimit). While the load is past the utilisation cap
//     (weights.ReasonPastCap) LEAST_REQUEST runs with the weights
//     (ReasonAtCapacity): a live one is kept, a live ROUND_ROBIN gives way
//     after a whole query window past the cap, and comes back after one
//     below it. The engine is told which balancer was live over each query
//     window, and since when ROUND_ROBIN has been
//     (weights.Observation.Balancer, RoundRobinSince).
package policy

import (
	"hash/fnv"
	"math/rand/v2"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// Action is what is due next.
type Action int

const (
	// Wait: nothing is due until the caller changes something (OptIn, a
	// pod set).
	Wait Action = iota
	// Cycle: run the queries and Policy.Cycle.
	Cycle
	// Look: query the recent latency and Policy.Look.
	Look
)

func (a Action) String() string {
	switch a {
	case Cycle:
		return "Cycle"
	case Look:
		return "Look"
	}
	return "Wait"
}

// Config is one optimizer's configuration as the user and the operator set
// it; none of it is tuned here.
type Config struct {
	// Cycle is the period of the regular cycles.
	Cycle time.Duration
	// LookInterval is the period of the looks between cycles (see
	// LookInterval); 0 = no looks.
	LookInterval time.Duration
	// Balancer is the user's load balancer (spec.load_balancer).
	Balancer weights.Balancer
	// Engine is the engine's parameters.
	Engine weights.Params
	// DryRun: the policy's weights are computed and reported, not
	// written (the DestinationRule keeps Balancer, LEAST_REQUEST in the
	// operator). Results Learned then rest on weights no client followed,
	// so leaving dry run learns anew, as at an opt-in: the learned weights
	// go live under LEAST_REQUEST, and ROUND_ROBIN follows once the
	// results have been Learned on them for a whole query window.
	DryRun bool
	// Jitter draws the jitter of each regular cycle, uniform in [0, 1); it
	// spreads many optimizers' queries over the cycle. Deterministic for a
	// given source (see NewJitter); nil = no jitter.
	Jitter func() float64
}

// minLookInterval bounds the looks' rate whatever scrape interval is set (a
// typo of 15ms for 15s would otherwise send a query every 15ms).
const minLookInterval = time.Second

// LookInterval is the look period for a scrape interval: one look per
// scrape, at least a second apart; 0 for an unknown scrape interval. A
// scrape is the only new evidence a look can find, so looking more often
// only finds it sooner within the interval, for one more query each time.
func LookInterval(scrape time.Duration) time.Duration {
	if scrape <= 0 {
		return 0
	}
	return max(scrape, minLookInterval)
}

// JitterSeed is the seed of an optimizer's jitter, from its namespace/name:
// optimizers spread their cycles over the cycle, and one optimizer's
// instants do not depend on when its manager started.
func JitterSeed(name string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// NewJitter returns a deterministic jitter source for seed (PCG).
func NewJitter(seed uint64) func() float64 {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return r.Float64
}

// Reason says why the DestinationRule has its load balancer.
type Reason string

const (
	// ReasonUserChoice: the user asked for LEAST_REQUEST.
	ReasonUserChoice Reason = "UserChoice"
	// ReasonLearning: LEAST_REQUEST (Istio's default) until the weights
	// have rested on measured capacity for a query window.
	ReasonLearning Reason = "Learning"
	// ReasonLearned: the weights were learned; the user's choice.
	ReasonLearned Reason = "Learned"
	// ReasonRestored: kept as the live DestinationRule had it, until this
	// manager's first cycle (after a restart).
	ReasonRestored Reason = "Restored"
	// ReasonAlarm: LEAST_REQUEST for a spell after an alarm, until the
	// engine's results have been Learned again for a query window.
	ReasonAlarm Reason = "Alarm"
	// ReasonUnsettled: LEAST_REQUEST for a spell while the engine's result
	// is not Learned (a pod drained or without data), until the results
	// have been Learned again for a query window.
	ReasonUnsettled Reason = "Unsettled"
	// ReasonFallback: LEAST_REQUEST while the weights have fallen back to
	// equal (failed queries past the expiry).
	ReasonFallback Reason = "Fallback"
	// ReasonCPUAtLimit: LEAST_REQUEST from the first time, after learning
	// or under the live weights after a restart, that a pod reached its CPU
	// limit while the speeds came from CPU alone, until request rates
	// measure them (see Policy.Cycle).
	ReasonCPUAtLimit Reason = "CPUAtLimit"
	// ReasonAtCapacity: LEAST_REQUEST with the weights while the load is
	// past the utilisation cap (weights.ReasonPastCap): kept at once when
	// live, turned on after a whole query window past the cap when
	// ROUND_ROBIN is; the user's choice after a query window below it.
	ReasonAtCapacity Reason = "AtCapacity"
)

// Alarm is a pod whose recent latency rang weights.Engine.Alarm.
type Alarm struct {
	Pod, Why string
}

// Decision is one cycle's outcome.
type Decision struct {
	// Result is the engine's result; Result.Changed says whether the
	// weights moved (Policy.Weights then gives what to write).
	Result weights.Result
	// Balancer is what the DestinationRule should say from now on, and
	// Why.
	Balancer weights.Balancer
	Why      Reason
	// Switched: Balancer differs from the one before this cycle.
	Switched bool
	// Early: the cycle ran before its time because an alarm rang at a look.
	Early bool
	// Alarm: the cycle's own recent latencies rang the alarm (a look's
	// alarm is in Early and Policy.Look's answer).
	Alarm *Alarm
}

// Policy is one optimizer's policy. Not safe for concurrent use.
type Policy struct {
	cfg Config
	eng *weights.Engine

	optedIn bool
	pods    []weights.Pod

	// lastCycle is when the last cycle ran, nextCycle when the next
	// regular one is due; lastLook when the last look ran (or the last
	// cycle, whichever is later).
	lastCycle, nextCycle, lastLook time.Time
	// early: an alarm rang at a look; the next cycle is due at once.
	early bool

	balancer weights.Balancer
	why      Reason
	// learned: the engine's result was Learned once since opt-in (or, at
	// a restart, the live balancer said the manager before had learned).
	learned bool
	// leastRequestUntil is the last instant LEAST_REQUEST was live
	// (zero: never within memory).
	leastRequestUntil time.Time
	// learnedSince is since when the results have been Learned without a
	// break (zero: the last was not).
	learnedSince time.Time
	// pastCapSince, belowCapSince: since when the results have said the
	// load is past the utilisation cap (weights.ReasonPastCap), or not,
	// without a break (zero: the last said the other).
	pastCapSince, belowCapSince time.Time
	switches                    int
	// cpuAtLimit: since learning, a pod reached its CPU limit while the
	// speeds came from CPU alone (see ReasonCPUAtLimit).
	cpuAtLimit bool
	// restarted: the engine was seeded with the live weights as settled (a
	// restart whose live weights an earlier manager learned, with its
	// learned state).
	restarted bool
	// persisted is the snapshot the optimizer carries (the one OptIn was
	// given, then each one Persisted); invalid: none.
	persisted weights.Snapshot
}

// New returns the policy of one optimizer, before its opt-in.
func New(cfg Config) *Policy {
	return &Policy{cfg: cfg, eng: weights.New(cfg.Engine), balancer: weights.BalancerLeastRequest, why: ReasonLearning}
}

// Configure changes the configuration; what was learned is kept. A new
// cycle length reschedules the next regular cycle from the last one.
func (p *Policy) Configure(now time.Time, cfg Config) {
	jitter := p.cfg.Jitter
	if cfg.Jitter == nil {
		cfg.Jitter = jitter
	}
	reschedule := cfg.Cycle != p.cfg.Cycle
	if p.cfg.DryRun && !cfg.DryRun {
		p.learned, p.learnedSince, p.cpuAtLimit = false, time.Time{}, false
	}
	p.cfg = cfg
	p.eng.SetParams(cfg.Engine)
	if reschedule && !p.lastCycle.IsZero() {
		p.schedule(p.lastCycle)
	}
	if p.optedIn {
		p.setBalancer(now, p.balancer, p.why)
	}
}

// OptIn seeds the engine when the policy first meets the optimizer's
// endpoints, at now: live is the weights the ServiceEntry carries (nil at a
// first opt-in, when there is none), liveBalancer the DestinationRule's
// load balancer ("" when there is none), snap what an earlier manager
// persisted (weights.Snapshot; invalid = none), and liveWhy the reason the
// earlier manager gave for the live load balancer ("" when unknown). With
// live weights for the pods (a restart) they are settled estimates, unless
// the manager before was still Learning (then they are estimates as
// uncertain as its were) or had fallen back to equal weights (then they
// are only a start, as without a snapshot), and the live load balancer is
// kept until the first cycle; one the earlier manager chose after it had
// learned (ReasonAlarm, ReasonUnsettled, ReasonCPUAtLimit,
// ReasonAtCapacity) is kept as it would have kept it: a
// spell ends once the results have been Learned for a query window,
// CPUAtLimit once request rates measure the speeds, AtCapacity once the
// load has been below the cap for a query window. Without them the pods
// carried equal traffic under Istio's default LEAST_REQUEST, and that is
// the history the engine gets. The first cycle is due at once. OptIn with no pods does nothing and
// returns false (the caller tries again when there are pods); after a
// successful OptIn it does nothing.
func (p *Policy) OptIn(now time.Time, pods []weights.Pod, live map[string]uint32, liveBalancer weights.Balancer, liveWhy Reason, snap weights.Snapshot) bool {
	if p.optedIn || len(pods) == 0 {
		return false
	}
	p.optedIn = true
	p.pods = append([]weights.Pod(nil), pods...)
	seed := map[string]uint32{}
	for _, pod := range pods {
		if w := live[pod.Name]; w > 0 {
			seed[pod.Name] = w
		}
	}
	restart := len(seed) > 0
	if snap.Valid() {
		p.persisted = snap
	}
	// The live weights are an engine's verdict only if the manager before
	// had learned: LEAST_REQUEST while Learning holds weights written
	// while the estimates were still moving, and Fallback equal ones.
	// Taken as settled, a restart declares them learned at its first
	// cycle: on CPU alone at 90% load without CPU limits, restarts
	// halfway through 16 bench runs made 13 balancer switches in their
	// first five cycles, against 9 in the same span of the runs without
	// a restart. Weights written while Learning are the estimates as far
	// as they had come, and are seeded as such, with the uncertainty the
	// manager before persisted (SeedLearning): the learning goes on from
	// them. Replaced by the first cycle's readings (Seed), they moved by
	// up to 103% in such runs at 80-90% load. Fallback's equal weights say
	// nothing of the pods and are only a start.
	verdict := liveBalancer != weights.BalancerLeastRequest || (liveWhy != ReasonLearning && liveWhy != ReasonFallback)
	switch {
	case restart && snap.Valid() && verdict:
		p.eng.SeedSettled(now, seed, snap)
		p.restarted = true
	case restart && liveWhy == ReasonLearning:
		p.eng.SeedLearning(now, seed, snap) // Seed's without a valid snapshot
	case restart:
		p.eng.Restore(snap)
		p.eng.Seed(now, seed)
	default:
		// The window before the opt-in is history the engine can learn
		// from: equal weights over all of it. Not capacities: nothing is
		// known of those yet (a seed would take equal weights for them).
		equal := make(map[string]uint32, len(pods))
		for _, pod := range pods {
			equal[pod.Name] = 1
		}
		p.eng.Applied(now.Add(-p.horizon()), equal)
	}
	switch {
	case restart && liveBalancer == weights.BalancerRoundRobin:
		// The manager before this one had learned; its weights are live
		// under ROUND_ROBIN. Keep it (a restart must not flip the mesh's
		// balancer back and forth).
		p.learned = true
		p.balancer, p.why = weights.BalancerRoundRobin, ReasonRestored
	case restart && liveBalancer == weights.BalancerLeastRequest && (liveWhy == ReasonAlarm || liveWhy == ReasonUnsettled || liveWhy == ReasonCPUAtLimit || liveWhy == ReasonAtCapacity):
		// The manager before this one had learned and chose
		// LEAST_REQUEST for a reason that outlives it. Learning again
		// would switch to ROUND_ROBIN after a query window and, on CPU
		// alone, back at the next pod at its limit.
		p.learned = true
		p.cpuAtLimit = liveWhy == ReasonCPUAtLimit
		p.leastRequestUntil = now
		p.balancer, p.why = weights.BalancerLeastRequest, liveWhy
	default:
		p.leastRequestUntil = now
		p.balancer, p.why = weights.BalancerLeastRequest, ReasonLearning
	}
	if p.cfg.Balancer == weights.BalancerLeastRequest {
		p.balancer, p.why = weights.BalancerLeastRequest, ReasonUserChoice
	}
	p.lastLook = now
	p.nextCycle = now // the first cycle at once
	return true
}

// OptedIn reports whether OptIn has seeded the engine.
func (p *Policy) OptedIn() bool { return p.optedIn }

// Weights records the current pod set and returns the weights to write for
// it: what the engine holds for pods that stay (its latest while not yet
// applied), initial weights for new ones (weights.Engine.Weights).
func (p *Policy) Weights(now time.Time, pods []weights.Pod) map[string]uint32 {
	p.pods = append(p.pods[:0], pods...)
	return p.eng.Weights(now, pods)
}

// SetPods records the current pod set (the endpoints the weights were
// applied to) without asking for weights.
func (p *Policy) SetPods(pods []weights.Pod) { p.pods = append(p.pods[:0], pods...) }

// Applied records that weights w are live from now (the caller wrote them,
// or confirmed them unchanged).
func (p *Policy) Applied(now time.Time, w map[string]uint32) {
	p.eng.Applied(now, w)
}

// Next returns what is due next and when (at or before now: at once). It
// changes nothing, so the caller may ask again at any time.
func (p *Policy) Next(now time.Time) (Action, time.Time) {
	if !p.optedIn || len(p.pods) == 0 || p.cfg.Cycle <= 0 {
		// Not opted in, no pods, or not configured yet.
		return Wait, time.Time{}
	}
	if p.early {
		return Cycle, now
	}
	// A wall clock stepped back (a clock without a monotonic reading, or
	// times made from wall clock values) finds the last cycle in the
	// future: the next is due at once rather than the step later. Each
	// instant below is measured from now on its own clock: a look instant
	// is a wall time (Truncate drops the monotonic reading), the cycle's
	// carries one when now does.
	cycle := p.nextCycle
	if now.Before(p.lastCycle) {
		cycle = now
	}
	if p.lookWanted() {
		// Looks fall on the multiples of the look interval on the clock,
		// so that the looks of many optimizers share instants (the
		// operator answers one instant's looks with one request): the
		// multiple at or before one interval after the last look.
		look := p.lastLook.Add(p.cfg.LookInterval).Truncate(p.cfg.LookInterval)
		if !look.After(p.lastLook) {
			look = look.Add(p.cfg.LookInterval)
		}
		// The last interval before the cycle is looked at too: a scrape
		// in it can show a slowed pod, and waiting for the cycle lets its
		// queue grow for up to that interval more. An alarm there runs an
		// early cycle, which learns no speeds and pushes the regular one a
		// period on. Against no look in the last interval (the shipped
		// scenarios, 16 seeds each): after a pod slows to a third at 80%
		// load, the p99 from the change 242 -> 237 ms (median; the worst
		// run 286 -> 274 ms, p99.9 20.9 -> 15.5 s); steady runs with a
		// chance spell of LEAST_REQUEST 8 -> 11 of 192, their p99 as
		// before.
		if now.Before(p.lastLook) {
			look = now
		}
		if look.Sub(now) < cycle.Sub(now) {
			return Look, look
		}
	}
	return Cycle, cycle
}

// LookWanted reports whether a look between cycles is worth its query now
// (see Next).
func (p *Policy) LookWanted() bool { return p.optedIn && p.lookWanted() }

// lookWanted: looks are on, ROUND_ROBIN is live (under LEAST_REQUEST the
// clients steer around a queue within a request) and the engine's alarm
// can ring (its last result was Learned or Doubtful on fresh data, see
// weights.Engine.Alarming).
func (p *Policy) lookWanted() bool {
	return p.cfg.LookInterval > 0 && p.balancer == weights.BalancerRoundRobin && p.eng.Alarming()
}

// Look is the look between cycles at now: obs holds the recent latencies
// (weights.Signal.RecentLatency), or Err when the query failed. When they
// ring the engine's alarm the next cycle is due at once, and Look returns
// which pod and why.
func (p *Policy) Look(now time.Time, obs weights.Observation) (Alarm, bool) {
	p.lastLook = now
	if !p.lookWanted() || obs.Err != nil || len(obs.Signals) == 0 {
		return Alarm{}, false
	}
	obs.Time = now
	obs.Balancer, obs.RoundRobinSince = p.liveOver(now), p.roundRobinSince()
	pod, why, ring := p.eng.Alarm(p.pods, obs)
	if ring {
		p.early = true
	}
	return Alarm{Pod: pod, Why: why}, ring
}

// Cycle runs the engine on obs at now for pods (the endpoint set the
// weights were applied to) and decides the load balancer.
func (p *Policy) Cycle(now time.Time, obs weights.Observation, pods []weights.Pod) Decision {
	p.pods = append(p.pods[:0], pods...)
	d := Decision{Early: p.early}
	obs.Time = now
	obs.Early = p.early
	obs.Balancer, obs.RoundRobinSince = p.liveOver(now), p.roundRobinSince()
	alarmed := d.Early
	if !d.Early && p.balancer == weights.BalancerRoundRobin {
		if pod, why, ring := p.eng.Alarm(pods, obs); ring {
			d.Alarm, alarmed = &Alarm{Pod: pod, Why: why}, true
		}
	}
	d.Result = p.eng.Update(pods, obs)
	p.early = false
	p.lastCycle, p.lastLook = now, now
	p.schedule(now)

	before := p.balancer
	lb, why := p.balancer, p.why
	if !d.Result.Learned || d.Result.Mode == weights.ModeFallback {
		p.learnedSince = time.Time{}
	} else if p.learnedSince.IsZero() {
		p.learnedSince = now
	}
	switch weights.SpeedsFrom(d.Result.Reasons) {
	case weights.SpeedsFromCPU:
		// Before learning, a pod at its limit is the opt-in's own
		// overload (equal weights on unlike pods), which the weights
		// are there to mend; after a restart that took the live weights
		// as learned, a pod at its limit under them counts at once (a
		// restart does not switch the mesh back and forth either).
		// Live weights taken only as a start (the manager before was
		// still learning; equal weights written without the engine, as
		// in a dry run) count as not learned.
		if _, hot := weights.Has(d.Result.Reasons, weights.ReasonSaturated); hot && (p.learned || p.restarted) {
			p.cpuAtLimit = true
		}
	case weights.SpeedsFromRequests:
		if p.cpuAtLimit {
			// Request rates measure the speeds again: the spell ends as
			// any other, once their results have been Learned for a whole
			// query window.
			p.cpuAtLimit = false
			if d.Result.Learned {
				p.learnedSince = now
			}
			if why == ReasonCPUAtLimit {
				why = ReasonUnsettled
			}
		}
	}
	switch {
	case d.Result.Mode == weights.ModeFallback:
		lb, why = weights.BalancerLeastRequest, ReasonFallback
	case p.cpuAtLimit:
		// With CPU alone, a pod at its limit is all that shows it
		// behind, and nothing tells a slowed pod from one that reached
		// its limit by chance (near full load the solver runs the
		// fastest pods at 93%, 4% below the limit's mark). Each such
		// reading started a spell, and the mesh switched back and forth:
		// on CPU alone, 40 of the bench's 192 steady runs (12 scenarios,
		// 16 seeds) made more than two switches, up to 12. LEAST_REQUEST
		// honours the weights and steers around a queue within a
		// request; kept on it from the first such reading, 5 of 192 runs
		// make more than two, no scenario's median p99 rises by more than
		// 0.3%, and two fall by 1% and 3%. It holds until request rates
		// measure the speeds, and with them a backlog.
		lb, why = weights.BalancerLeastRequest, ReasonCPUAtLimit
	case !p.learned && d.Result.Learned && now.Sub(p.learnedSince) >= p.cfg.Engine.QueryWindow:
		// The weights have rested on measured capacity for a whole
		// query window: the first estimates, from a window that may hold
		// little traffic, are not a verdict on their own.
		p.learned = true
		lb, why = weights.BalancerRoundRobin, ReasonLearned
	case !p.learned:
		lb, why = weights.BalancerLeastRequest, ReasonLearning
	case d.Result.Doubtful && !alarmed && p.balancer == weights.BalancerRoundRobin:
		// Only the estimates' confidence keeps the result from Learned:
		// no pod is behind, blind or without data, and ROUND_ROBIN is
		// live on weights that were Learned. Doubt starts no spell: weights
		// that overload a pod under ROUND_ROBIN show as its queue (a
		// backlog, an alarm at a look; the looks go on), which starts one
		// at once, so a spell on doubt alone only adds two switches. A
		// pod's uncertainty crosses the dead band and back on its
		// readings' scatter alone: on a 1-2-4-8-core mix without limits,
		// spells started at once made 6 of 16 runs switch more than
		// twice; started after a query window of doubt, 3 of 32 (request
		// rates and CPU alone), each run's p99 0.4-1.4% higher than
		// without the spell.
	case !d.Result.Learned:
		// A spell: the engine no longer trusts the weights (a pod fell
		// behind, is drained, or lacks data) and LEAST_REQUEST steers
		// around queues within a request. At once: a slowed pod's first
		// backlog is no larger than a chance queue's, and waiting a cycle
		// for a second reading raised the p99 after a slowdown by two
		// fifths (median of 16 runs; the worst run from under 0.3 s to
		// 20 s), while with ROUND_ROBIN alone the cut, halved each write
		// by MaxStep, left it at 16.5 s.
		lb, why = weights.BalancerLeastRequest, ReasonUnsettled
		if alarmed || p.why == ReasonAlarm {
			why = ReasonAlarm
		}
	case p.balancer == weights.BalancerLeastRequest && now.Sub(p.learnedSince) < p.cfg.Engine.QueryWindow:
		// Learned again, but not yet for a whole query window: a
		// result at the edge of the engine's confidence flickers, and
		// each switch rebuilds the cluster in every client sidecar.
	default:
		lb, why = weights.BalancerRoundRobin, ReasonLearned
	}
	_, past := weights.Has(d.Result.Reasons, weights.ReasonPastCap)
	switch {
	case d.Result.Mode != weights.ModeOptimizing && d.Result.Mode != weights.ModeSteady:
		// No fresh data (a failed query, none, too little load): it says
		// nothing of the load, and what was decided stands.
		past = p.why == ReasonAtCapacity
	case past:
		p.belowCapSince = time.Time{}
		if p.pastCapSince.IsZero() {
			p.pastCapSince = now
		}
	default:
		p.pastCapSince = time.Time{}
		if p.belowCapSince.IsZero() {
			p.belowCapSince = now
		}
	}
	switch {
	case lb != weights.BalancerRoundRobin:
	case past && (p.balancer == weights.BalancerLeastRequest || now.Sub(p.pastCapSince) >= p.cfg.Engine.QueryWindow),
		!past && p.balancer == weights.BalancerLeastRequest && p.why == ReasonAtCapacity && now.Sub(p.belowCapSince) < p.cfg.Engine.QueryWindow:
		// Past the cap every pod runs above it on any weights, and its
		// chance queues grow into backlogs that start spells. On 60
		// Services drawn at random, 8 seeds each, 34 of 480 runs switched
		// more than twice, nearly all at 93-95% load, up to 7 times in 15
		// minutes. LEAST_REQUEST honours the same weights and steers
		// around those queues within a request: there, the p99 of the
		// Services past the cap fell by up to two fifths, and ten pods of
		// two speeds at 95% load without CPU limits went from 11 switches
		// and 393 ms to none and 275 ms (the best static weights: 391).
		// A LEAST_REQUEST that is live (the opt-in's learning, a spell) is
		// kept at once; ROUND_ROBIN that is live gives way once the
		// results have said so for a whole query window, and comes back
		// once they have said the load is below the cap for one: the load
		// is estimated over a query window, and at the cap's edge one
		// result says little, while each switch rebuilds the cluster in
		// every client sidecar. On a Service that reached the cap after
		// ROUND_ROBIN had been turned on, it ran there at 1.3-2.1x the
		// best static weights' p99 (thirteen pods at 94% load, 8
		// clients), against 0.5x on LEAST_REQUEST. Over pods of unlike
		// cores least request does not quite honour the weights (it
		// divides each by the requests in flight, which grow with a
		// pod's busy cores), yet ROUND_ROBIN past the cap is worse there
		// too: with the rule keeping ROUND_ROBIN whenever the pods'
		// cores estimates differed, 6 of 13 Services drawn at random at
		// 90-95% load (8 of make bench-random's 60, 5 drawn outside the
		// repository) got a median p99 over eight runs each 1.04-10x
		// higher, and none lower.
		lb, why = weights.BalancerLeastRequest, ReasonAtCapacity
	}
	p.setBalancer(now, lb, why)
	d.Balancer, d.Why = p.balancer, p.why
	d.Switched = p.balancer != before
	return d
}

// decide applies the user's choice over the policy's.
func (p *Policy) decide(lb weights.Balancer, why Reason) (weights.Balancer, Reason) {
	if p.cfg.Balancer == weights.BalancerLeastRequest {
		return weights.BalancerLeastRequest, ReasonUserChoice
	}
	if why == ReasonUserChoice {
		// The user moved back to ROUND_ROBIN.
		switch {
		case p.cpuAtLimit:
			return weights.BalancerLeastRequest, ReasonCPUAtLimit
		case p.learned:
			return weights.BalancerRoundRobin, ReasonLearned
		}
		return weights.BalancerLeastRequest, ReasonLearning
	}
	return lb, why
}

// setBalancer sets the balancer the policy chose (lb, why), under the
// user's choice.
func (p *Policy) setBalancer(now time.Time, lb weights.Balancer, why Reason) {
	lb, why = p.decide(lb, why)
	if !p.optedIn {
		p.balancer, p.why = lb, why
		return
	}
	if lb != p.balancer {
		p.switches++
	}
	if p.balancer == weights.BalancerLeastRequest || lb == weights.BalancerLeastRequest {
		p.leastRequestUntil = now
	}
	p.balancer, p.why = lb, why
}

// schedule sets the next regular cycle one period after from, give or
// take half a scrape interval of jitter: queries within one scrape
// interval read the same samples, so spreading many optimizers' cycles
// over one costs no freshness, and the mean period stays the cycle.
func (p *Policy) schedule(from time.Time) {
	c := p.cfg.Cycle
	if p.cfg.Jitter != nil && p.cfg.Engine.ScrapeInterval > 0 {
		c += time.Duration((p.cfg.Jitter() - 0.5) * float64(min(p.cfg.Engine.ScrapeInterval, p.cfg.Cycle)))
	}
	p.nextCycle = from.Add(c)
}

// liveOver is the balancer the clients ran over the query window ending at
// now: LEAST_REQUEST if it was live at any moment of it (the window's
// traffic did not all follow the weights), else ROUND_ROBIN.
func (p *Policy) liveOver(now time.Time) weights.Balancer {
	if p.balancer == weights.BalancerLeastRequest {
		return weights.BalancerLeastRequest
	}
	if !p.leastRequestUntil.IsZero() && now.Sub(p.leastRequestUntil) < p.horizon() {
		return weights.BalancerLeastRequest
	}
	return weights.BalancerRoundRobin
}

// horizon is how far back a query window's samples can reach: the window
// plus one scrape interval.
func (p *Policy) horizon() time.Duration {
	return p.cfg.Engine.QueryWindow + p.cfg.Engine.ScrapeInterval
}

// roundRobinSince is when ROUND_ROBIN took over from LEAST_REQUEST, while
// it is live (weights.Observation.RoundRobinSince); zero otherwise, or
// when it was live from the start (a restart restored it).
func (p *Policy) roundRobinSince() time.Time {
	if p.balancer != weights.BalancerRoundRobin {
		return time.Time{}
	}
	return p.leastRequestUntil
}

// Balancer is what the DestinationRule should say now, and why.
func (p *Policy) Balancer() (weights.Balancer, Reason) { return p.balancer, p.why }

// Switches counts the load-balancer changes since New (each one a
// DestinationRule write).
func (p *Policy) Switches() int { return p.switches }

// Snapshot is the engine's weights.Snapshot.
func (p *Policy) Snapshot() weights.Snapshot { return p.eng.Snapshot() }

// SnapshotToPersist returns the engine's snapshot when it is worth a write
// to the optimizer: valid, and not Similar to the one the optimizer
// carries (the noise settles within a few cycles, so the writes are rare).
// The caller writes it and then calls Persisted.
func (p *Policy) SnapshotToPersist() (weights.Snapshot, bool) {
	if !p.optedIn {
		return weights.Snapshot{}, false
	}
	s := p.eng.Snapshot()
	if !s.Valid() || s.Similar(p.persisted) {
		return weights.Snapshot{}, false
	}
	return s, true
}

// Persisted records that the optimizer now carries s.
func (p *Policy) Persisted(s weights.Snapshot) { p.persisted = s }
