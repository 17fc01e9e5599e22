package driver

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// Trace is a recorded signal trace: one optimizer's configuration, its pods
// and every answer its queries got, by instant. A Replay source serves it
// back, to the bench's driver and to the controllers' weight loop alike.
type Trace struct {
	// Optimizer is the optimizer's namespace/name; its cycles' jitter is
	// drawn from it (policy.JitterSeed), in the operator as in the bench.
	Optimizer string `json:"optimizer"`
	// Cycle, QueryWindow and ScrapeInterval are the optimizer's settings;
	// Balancer its load_balancer.
	Cycle          Duration         `json:"cycle"`
	QueryWindow    Duration         `json:"queryWindow"`
	ScrapeInterval Duration         `json:"scrapeInterval"`
	Balancer       weights.Balancer `json:"balancer"`
	// OptIn and End bound the replay, in nanoseconds since the Unix epoch.
	OptIn int64 `json:"optIn"`
	End   int64 `json:"end"`
	// Pods is the endpoint set (fixed over the trace).
	Pods    []weights.Pod `json:"pods"`
	Answers []Answer      `json:"answers"`
	// Restarts are the instants the operator's manager stopped and a new
	// one took over, in order.
	Restarts []Restart `json:"restarts,omitempty"`
}

// Restart is one stop of the operator's manager: nothing runs from Stop
// until a new manager takes over at Resume (nanoseconds since the Unix
// epoch), seeded from what the cluster holds (Driver.Restart).
type Restart struct {
	Stop   int64 `json:"stop"`
	Resume int64 `json:"resume"`
}

// Duration is a time.Duration written as a Go duration string.
type Duration struct{ time.Duration }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	d.Duration = v
	return err
}

// Answer is what one action's queries returned.
type Answer struct {
	At      int64                  `json:"at"` // nanoseconds since the Unix epoch
	Look    bool                   `json:"look,omitempty"`
	Signals map[string]TraceSignal `json:"signals"`
}

// TraceSignal is weights.Signal with no data as absent (JSON has no NaN).
type TraceSignal struct {
	CPU            *float64 `json:"cpu,omitempty"`
	Requests       *float64 `json:"requests,omitempty"`
	Latency        *float64 `json:"latency,omitempty"`
	NodeCPU        *float64 `json:"nodeCPU,omitempty"`
	RecentCPU      *float64 `json:"recentCPU,omitempty"`
	RecentLatency  *float64 `json:"recentLatency,omitempty"`
	RecentRequests *float64 `json:"recentRequests,omitempty"`
}

func opt(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func val(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

func toTrace(s weights.Signal) TraceSignal {
	return TraceSignal{CPU: opt(s.CPU), Requests: opt(s.Requests), Latency: opt(s.Latency), NodeCPU: opt(s.NodeCPU),
		RecentCPU: opt(s.RecentCPU), RecentLatency: opt(s.RecentLatency), RecentRequests: opt(s.RecentRequests)}
}

// Signal is the weights.Signal of a recorded one (NaN where absent).
func (t TraceSignal) Signal() weights.Signal {
	return weights.Signal{CPU: val(t.CPU), Requests: val(t.Requests), Latency: val(t.Latency), NodeCPU: val(t.NodeCPU),
		RecentCPU: val(t.RecentCPU), RecentLatency: val(t.RecentLatency), RecentRequests: val(t.RecentRequests)}
}

// Recorder is a Source that records every answer of the source it wraps.
type Recorder struct {
	Src   Source
	Trace *Trace
}

func (r Recorder) record(now time.Time, look bool, sig map[string]weights.Signal) {
	a := Answer{At: now.UnixNano(), Look: look, Signals: make(map[string]TraceSignal, len(sig))}
	for pod, s := range sig {
		a.Signals[pod] = toTrace(s)
	}
	r.Trace.Answers = append(r.Trace.Answers, a)
}

func (r Recorder) Cycle(now time.Time, pods []weights.Pod) map[string]weights.Signal {
	sig := r.Src.Cycle(now, pods)
	r.record(now, false, sig)
	return sig
}

func (r Recorder) Look(now time.Time, pods []weights.Pod) map[string]weights.Signal {
	sig := r.Src.Look(now, pods)
	r.record(now, true, sig)
	return sig
}

// Write writes the trace as JSON.
func (t *Trace) Write(path string) error {
	b, err := json.MarshalIndent(t, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// ReadTrace reads a trace written by Write.
func ReadTrace(path string) (*Trace, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t Trace
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	if len(t.Answers) == 0 || len(t.Pods) == 0 {
		return nil, fmt.Errorf("trace %s: no answers or no pods", path)
	}
	sort.SliceStable(t.Answers, func(i, j int) bool { return t.Answers[i].At < t.Answers[j].At })
	return &t, nil
}

// Cycle is the answer of a cycle's queries at now: the last cycle answer
// recorded at or before now (the first one before any), so a replay whose
// instants differ from the recording's still gets answers, the same ones
// whichever path asks.
func (t *Trace) CycleAt(now time.Time) map[string]weights.Signal {
	var found *Answer
	for i := range t.Answers {
		a := &t.Answers[i]
		if a.Look {
			continue
		}
		if found == nil || a.At <= now.UnixNano() {
			found = a
		}
		if a.At > now.UnixNano() {
			break
		}
	}
	out := map[string]weights.Signal{}
	if found != nil {
		for pod, s := range found.Signals {
			out[pod] = s.Signal()
		}
	}
	return out
}

// LookAt is the answer of a look at now: the recent latencies of the last
// answer of either kind recorded at or before now.
func (t *Trace) LookAt(now time.Time) map[string]weights.Signal {
	var found *Answer
	for i := range t.Answers {
		a := &t.Answers[i]
		if a.At > now.UnixNano() {
			break
		}
		found = a
	}
	out := map[string]weights.Signal{}
	if found == nil {
		found = &t.Answers[0]
	}
	for pod, s := range found.Signals {
		out[pod] = weights.Signal{CPU: math.NaN(), Requests: math.NaN(), Latency: math.NaN(), NodeCPU: math.NaN(),
			RecentCPU: math.NaN(), RecentLatency: val(s.RecentLatency), RecentRequests: val(s.RecentRequests)}
	}
	return out
}

// Replay is a Source serving a Trace.
type Replay struct{ T *Trace }

func (r Replay) Cycle(now time.Time, _ []weights.Pod) map[string]weights.Signal {
	return r.T.CycleAt(now)
}
func (r Replay) Look(now time.Time, _ []weights.Pod) map[string]weights.Signal {
	return r.T.LookAt(now)
}
