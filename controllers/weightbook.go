package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// WeightBook is the in-memory record, per optimizer, shared by the mirror
// (which writes the ServiceEntry and DestinationRule) and the weight loop
// (which runs the cycles and looks). Each optimizer has its own policy here
// (internal/policy, with its weight engine), which decides when the loop
// queries and what the DestinationRule says; the book only locks it and
// turns endpoints into its pods. The policy is seeded (policy.OptIn) the
// first time the mirror sees the optimizer's endpoints: with the live
// weights and the persisted snapshot after a restart, so a restart of the
// manager loses nothing learned that was applied.
type WeightBook struct {
	mu      sync.Mutex
	entries map[types.NamespacedName]*bookEntry
}

type bookEntry struct {
	policy *policy.Policy
	// endpoints is the set the mirror applied last, with its weights.
	endpoints []desired.Endpoint
	// readySince is when the mirror first saw each pod, for slow start.
	// Pods present at the first sight are taken as long-ready.
	readySince map[string]time.Time
	outcome    *Outcome
	// restore is what an earlier manager learned (persisted on the
	// optimizer, see learned_state.go), given to the policy when it is
	// seeded.
	restore weights.Snapshot
	// liveBalancer is the live DestinationRule's load balancer ("" when
	// none) and liveWhy the earlier manager's reason for it ("" when
	// unknown), until the policy is seeded.
	liveBalancer weights.Balancer
	liveWhy      policy.Reason
	// parked: nothing is due until the next Applied (see Park).
	parked bool
}

// Outcome is the result of the last weight cycle, for status and metrics.
type Outcome struct {
	Time     time.Time
	Result   weights.Result
	DryRun   bool
	QueryErr error
	// Signals says which signals the cycle had data for.
	Signals Signals
	// Balancer is the load balancer the policy chose at this cycle, and Why.
	Balancer weights.Balancer
	Why      policy.Reason
	// Early: an alarm at a look ran the cycle before its time.
	Early bool
}

// NewWeightBook returns an empty book.
func NewWeightBook() *WeightBook {
	return &WeightBook{entries: map[types.NamespacedName]*bookEntry{}}
}

// entry returns the optimizer's entry, new with engine parameters p (its
// cycle is set by Configure). The jitter of its cycles is drawn from its
// namespace/name (policy.JitterSeed).
func (b *WeightBook) entry(key types.NamespacedName, p weights.Params) *bookEntry {
	e := b.entries[key]
	if e == nil {
		cfg := policy.Config{Engine: p, Balancer: weights.BalancerRoundRobin, Jitter: policy.NewJitter(policy.JitterSeed(key.String()))}
		e = &bookEntry{policy: policy.New(cfg), readySince: map[string]time.Time{}}
		b.entries[key] = e
	}
	return e
}

// Configure gives the optimizer's policy its settings at now.
func (b *WeightBook) Configure(key types.NamespacedName, now time.Time, s Settings) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.entry(key, s.Params).policy.Configure(now, s.policyConfig())
}

// LiveEndpoints is what the live ServiceEntry tells the book when it first
// meets an optimizer's endpoints (after a restart).
type LiveEndpoints struct {
	// Weights by address.
	Weights map[string]uint32
	// Written is when the operator last wrote the ServiceEntry (zero:
	// unknown), and PodTimes when a pod was created and last became Ready
	// (zero: unknown; nil: none known). Endpoints carry no pod identity, so
	// a live weight is a pod's only if the pod was there when it was
	// written (see newSinceWrite).
	Written  time.Time
	PodTimes func(pod string) (created, ready time.Time)
}

// newSinceWrite reports whether pod's live weight is no verdict on its
// capacity, and when the pod became Ready (zero: unknown). It is new if
// it was created after the live ServiceEntry was last written (while the
// manager was down: at an old pod's address at most), both times by the
// API server's clock; or if its slow start had not ended by then (its
// weight was a ramp's), by the Ready time its node's kubelet gave, within
// that node's clock skew. A pod whose readiness blinked after the write
// keeps its weight without slow start, and ramps again with one.
// The times are at whole seconds: a pod created within the second of the
// write counts as there.
func (l LiveEndpoints) newSinceWrite(pod string, slowStart time.Duration) (time.Time, bool) {
	if l.PodTimes == nil || l.Written.IsZero() {
		return time.Time{}, false
	}
	created, ready := l.PodTimes(pod)
	if created.After(l.Written) {
		return ready, true
	}
	return ready, slowStart > 0 && !ready.IsZero() && ready.Add(slowStart).After(l.Written)
}

// seed opts the policy in with the weights that are live when the book
// first meets an optimizer's endpoints (none at a first opt-in). A pod
// with a live weight, or any pod at a first opt-in, counts as long-ready;
// at a restart, a pod new since the last write (newSinceWrite) takes no
// live weight, and its slow start counts from when it became Ready.
func (e *bookEntry) seed(now time.Time, eps []desired.Endpoint, w map[string]uint32, live LiveEndpoints, slowStart time.Duration) {
	if e.policy.OptedIn() {
		return
	}
	for _, ep := range eps {
		e.readySince[ep.Pod] = time.Time{}
		if t, isNew := live.newSinceWrite(ep.Pod, slowStart); isNew {
			if t.IsZero() || t.After(now) {
				t = now // unknown, or a node's clock ahead of ours
			}
			e.readySince[ep.Pod] = t
			delete(w, ep.Pod)
		}
	}
	e.policy.OptIn(now, e.pods(now, eps), w, e.liveBalancer, e.liveWhy, e.restore)
}

// WeightsFor returns, by pod, the weights the mirror should write for eps.
// Without the engine (no metrics backend, or dry run) they are the weights
// the mirror applied last, so an out-of-band edit is put back; nil after a
// restart, when the live ServiceEntry's weights count (by address). With the engine they
// are the engine's weights: its latest for pods that stay, initial ones
// (slow start, hardware class, median) for new pods; at the first meeting
// after a restart, the live ones (see seed).
func (b *WeightBook) WeightsFor(key types.NamespacedName, p weights.Params, now time.Time, eps []desired.Endpoint, live LiveEndpoints, useEngine bool) map[string]uint32 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !useEngine {
		e := b.entries[key]
		if e == nil || len(e.endpoints) == 0 {
			return nil
		}
		return byPod(e.endpoints)
	}
	e := b.entry(key, p)
	if !e.policy.OptedIn() {
		seed := make(map[string]uint32, len(eps))
		for _, ep := range eps {
			if w := live.Weights[ep.Address]; w > 0 {
				seed[ep.Pod] = w
			}
		}
		e.seed(now, eps, seed, live, p.SlowStart)
	}
	return e.policy.Weights(now, e.pods(now, eps))
}

func byPod(eps []desired.Endpoint) map[string]uint32 {
	w := make(map[string]uint32, len(eps))
	for _, ep := range eps {
		w[ep.Pod] = ep.Weight
	}
	return w
}

// pods turns endpoints into engine pods, remembering when each first
// appeared; a pod that left and returns starts its slow start again.
func (e *bookEntry) pods(now time.Time, eps []desired.Endpoint) []weights.Pod {
	out := make([]weights.Pod, 0, len(eps))
	// same: the same pods as last time, so far. Names in strictly
	// increasing order (as desired sorts them) are unique, so with every
	// one found and as many as before, none left.
	same := len(eps) == len(e.readySince)
	for i, ep := range eps {
		t, ok := e.readySince[ep.Pod]
		if !ok {
			t, same = now, false
		}
		if i > 0 && ep.Pod <= eps[i-1].Pod {
			same = false
		}
		out = append(out, weights.Pod{Name: ep.Pod, Locality: ep.Locality, HardwareClass: ep.HardwareClass, Cores: ep.Cores,
			CPURequest: ep.CPURequest, NodeCores: ep.NodeCores, Node: ep.Node, ReadySince: t})
	}
	if same {
		// Every pod was there and none left: the record stands. Rebuilding it at every reconcile of a 4000-pod
		// Service was a tenth of the reconcile's garbage.
		return out
	}
	since := make(map[string]time.Time, len(out))
	for _, p := range out {
		since[p.Name] = p.ReadySince
	}
	e.readySince = since
	return out
}

// Applied records the endpoints (with weights) that are now live.
func (b *WeightBook) Applied(key types.NamespacedName, p weights.Params, now time.Time, eps []desired.Endpoint) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entry(key, p)
	w := byPod(eps)
	if e.policy.OptedIn() {
		e.policy.SetPods(e.pods(now, eps))
		e.policy.Applied(now, w)
	} else {
		// The weights the mirror just wrote for these very pods.
		e.seed(now, eps, w, LiveEndpoints{}, p.SlowStart)
	}
	// A new slice each time, so callers may keep the one they got.
	e.endpoints = append([]desired.Endpoint(nil), eps...)
	e.parked = false
}

// Next is what the optimizer's policy has due next and when (policy.Wait
// before its endpoints are known).
func (b *WeightBook) Next(key types.NamespacedName, now time.Time) (policy.Action, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || len(e.endpoints) == 0 || e.parked {
		return policy.Wait, time.Time{}
	}
	return e.policy.Next(now)
}

// Cycle runs one cycle of the policy over the last applied endpoint set
// and records the outcome. It returns false when no endpoint set is known
// yet.
func (b *WeightBook) Cycle(key types.NamespacedName, obs weights.Observation, dryRun bool) (Outcome, []desired.Endpoint, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || len(e.endpoints) == 0 {
		return Outcome{}, nil, false
	}
	d := e.policy.Cycle(obs.Time, obs, e.pods(obs.Time, e.endpoints))
	out := Outcome{Time: obs.Time, Result: d.Result, DryRun: dryRun, QueryErr: obs.Err, Balancer: d.Balancer, Why: d.Why, Early: d.Early}
	e.outcome = &out
	return out, e.endpoints, true
}

// Look hands the policy a look's answer (the recent latencies): whether
// its alarm rang, for which pod and why.
func (b *WeightBook) Look(key types.NamespacedName, obs weights.Observation) (policy.Alarm, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || len(e.endpoints) == 0 {
		return policy.Alarm{}, false
	}
	return e.policy.Look(obs.Time, obs)
}

// LookWanted reports whether the optimizer's policy wants a look between
// cycles now (ROUND_ROBIN live on learned weights, looks on).
func (b *WeightBook) LookWanted(key types.NamespacedName) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	return e != nil && len(e.endpoints) > 0 && e.policy.LookWanted()
}

// Balancer is the load balancer the optimizer's policy says the
// DestinationRule should have; ok false before the policy is seeded.
func (b *WeightBook) Balancer(key types.NamespacedName) (lb weights.Balancer, why policy.Reason, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil || !e.policy.OptedIn() {
		return "", "", false
	}
	lb, why = e.policy.Balancer()
	return lb, why, true
}

// Outcome returns the last weight cycle's outcome, if any.
func (b *WeightBook) Outcome(key types.NamespacedName) *Outcome {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil && e.outcome != nil {
		o := *e.outcome
		return &o
	}
	return nil
}

// Endpoints returns the last applied endpoint set; callers must not change it.
func (b *WeightBook) Endpoints(key types.NamespacedName) []desired.Endpoint {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		return e.endpoints
	}
	return nil
}

// Forget drops everything about a deleted optimizer.
func (b *WeightBook) Forget(key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.entries, key)
}

// Restore hands the book what an earlier manager left of an optimizer,
// for its policy's seed: the learned snapshot, the live DestinationRule's
// load balancer ("" when none) and the reason the earlier manager recorded
// for it ("" when unknown). It has no effect once the policy is seeded.
func (b *WeightBook) Restore(key types.NamespacedName, p weights.Params, s weights.Snapshot, liveBalancer weights.Balancer, liveWhy policy.Reason) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entry(key, p); !e.policy.OptedIn() {
		e.restore, e.liveBalancer, e.liveWhy = s, liveBalancer, liveWhy
	}
}

// SnapshotToPersist returns the policy's snapshot when it is worth a write
// to the optimizer (policy.Policy.SnapshotToPersist).
func (b *WeightBook) SnapshotToPersist(key types.NamespacedName) (weights.Snapshot, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		return e.policy.SnapshotToPersist()
	}
	return weights.Snapshot{}, false
}

// Persisted records that s was written to the optimizer.
func (b *WeightBook) Persisted(key types.NamespacedName, s weights.Snapshot) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		e.policy.Persisted(s)
	}
}
