package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Scenario is one benchmark case, read from a YAML or JSON file.
type Scenario struct {
	// Name identifies the scenario in the output. Defaults to the file name.
	Name        string `json:"name,omitempty"`
	Description string `json:"description,omitempty"`
	// Pods is the initial endpoint set, as groups of identical pods.
	Pods []PodGroup `json:"pods"`
	// Clients is the number of client sidecars, each with its own Poisson
	// arrival stream and its own load-balancer state.
	Clients int `json:"clients"`
	// Load is the total arrival rate as a fraction of the initial pods' total
	// capacity (sum of cores*speed/mean work). Events do not change the rate.
	Load float64 `json:"load"`
	// Duration of arrivals; requests still in flight at the end are drained.
	Duration Duration `json:"duration"`
	// Warmup: requests arriving before it are not measured; utilisation is
	// measured from it.
	Warmup Duration `json:"warmup"`
	// Cycle is the weight recomputation period of the central strategies.
	Cycle Duration `json:"cycle"`
	// Work is the CPU work of one request at speed 1.
	Work Work `json:"work"`
	// Seed makes the run deterministic; every strategy sees the same arrivals.
	Seed uint64 `json:"seed"`
	// Strategies limits the run to these strategies (default: all).
	Strategies []string `json:"strategies,omitempty"`
	// Events change the world during the run.
	Events []Event `json:"events,omitempty"`
	// Prometheus models the metrics pipeline feeding the central strategies.
	Prometheus PromConfig `json:"prometheus,omitempty"`
	// OptIn is when the optimizer strategies and the static-weight oracles
	// are applied: before it the Service runs Istio's default
	// LEAST_REQUEST over equal weights, as a live Service does before its
	// owner opts in (Prometheus has that history), so every weighting
	// strategy starts from the same queues. The others (rr, lr, linkerd,
	// prequal, cswrr, the seed rules) run from t=0: they are what the
	// Service could have run instead. 0 = from the start.
	OptIn Duration `json:"opt_in,omitempty"`
	// PerMinute reports p99 per minute of arrival time from the end of
	// the warm-up (cold starts: warmup = opt_in, the moment the optimizer
	// is applied).
	PerMinute bool `json:"per_minute,omitempty"`
	// ReportWindow is the window over which a backend measures the qps and
	// CPU utilisation it reports to cswrr clients (ORCA). Default 1s.
	ReportWindow Duration `json:"report_window,omitempty"`
	// NodeNoise is how far the CPU used by a pod's neighbours on its node
	// strays from its mean (nodeCores - cores), as a fraction, redrawn
	// uniformly at every scrape (default 0.1; 0 = none). It makes the
	// node's idle CPU, which the optimizer reads for pods without a limit,
	// an imperfect measure of what the pod can use.
	NodeNoise *float64 `json:"node_noise,omitempty"`
	// NodeCPU false models a Prometheus without the nodes' root-cgroup CPU
	// series (kube-prometheus-stack's default relabelling drops them): the
	// optimizer gets no node CPU, so a pod without a CPU limit has no
	// ceiling. Default true.
	NodeCPU *bool `json:"node_cpu,omitempty"`
}

// nodeCPU reports whether the optimizer is given the node CPU series.
func (sc *Scenario) nodeCPU() bool { return sc.NodeCPU == nil || *sc.NodeCPU }

// nodeNoise is NodeNoise or its default.
func (sc *Scenario) nodeNoise() float64 {
	if sc.NodeNoise == nil {
		return 0.1
	}
	return *sc.NodeNoise
}

// PodGroup is Count identical pods named Name-0 .. Name-(Count-1).
type PodGroup struct {
	Name          string  `json:"name"`
	Count         int     `json:"count,omitempty"` // default 1
	Cores         int     `json:"cores,omitempty"` // default 1
	Speed         float64 `json:"speed,omitempty"` // default 1
	HardwareClass string  `json:"hardware_class,omitempty"`
	Locality      string  `json:"locality,omitempty"`
	// NoLimit: the pods have no CPU limit. They still use Cores cores (the
	// truth: what their node leaves them), but the optimizer is told only
	// CPURequest and NodeCores, as a real cluster's API would.
	NoLimit bool `json:"no_limit,omitempty"`
	// CPURequest is the pods' CPU request in cores (default: Cores with a
	// limit, 1 without).
	CPURequest float64 `json:"cpu_request,omitempty"`
	// NodeCores is the allocatable CPU of the pods' nodes (default: Cores
	// with a limit, 2x Cores without: other pods share the node).
	NodeCores float64 `json:"node_cores,omitempty"`
}

// Work describes the request work distribution (time at speed 1).
type Work struct {
	Distribution string   `json:"distribution,omitempty"` // exponential (default) | lognormal
	Mean         Duration `json:"mean"`
	Sigma        float64  `json:"sigma,omitempty"` // lognormal shape (sd of the log), default 1
}

// Event types.
const (
	EventSetSpeed   = "set_speed"
	EventAddPods    = "add_pods"
	EventRemovePods = "remove_pods"
	EventSetLoad    = "set_load"
	// EventRestart: the operator's manager stops (a crash, a rollout, a
	// leader's failover) and a new one takes over after Downtime, seeded
	// from what the cluster holds, as controllers/ seeds it. The other
	// strategies are not touched.
	EventRestart = "restart_operator"
)

// Event is a change during the run.
type Event struct {
	At   Duration `json:"at"`
	Type string   `json:"type"`
	// set_speed: the pod and its new speed.
	Pod   string  `json:"pod,omitempty"`
	Speed float64 `json:"speed,omitempty"`
	// add_pods: new groups (names must be new).
	Pods []PodGroup `json:"pods,omitempty"`
	// remove_pods: pod names; their in-flight and queued requests finish.
	Names []string `json:"names,omitempty"`
	// set_load: the new offered load, as a fraction of the initial
	// capacity (like Scenario.Load).
	Load float64 `json:"load,omitempty"`
	// restart_operator: how long no manager runs (default 0: the new one
	// takes over at once; a failover takes the lease's duration, 15 s).
	Downtime Duration `json:"downtime,omitempty"`
}

// PromConfig is the simulated Prometheus.
type PromConfig struct {
	ScrapeInterval Duration `json:"scrape_interval,omitempty"` // default 15s
	RateWindow     Duration `json:"rate_window,omitempty"`     // default 1m
}

// Duration accepts "1m30s" style strings or a number of seconds.
type Duration struct{ time.Duration }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		d.Duration = v
		return nil
	}
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("duration must be a string like \"30s\" or a number of seconds: %s", b)
	}
	d.Duration = time.Duration(f * float64(time.Second))
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

// Seconds of the duration.
func (d Duration) Seconds() float64 { return d.Duration.Seconds() }

func dur(s float64) Duration { return Duration{time.Duration(s * float64(time.Second))} }

// LoadScenario reads and validates a scenario file (YAML or JSON).
func LoadScenario(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sc, err := ParseScenario(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if sc.Name == "" {
		sc.Name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	}
	return sc, nil
}

// ParseScenario parses YAML or JSON (unknown fields are errors), applies
// defaults and validates.
func ParseScenario(b []byte) (*Scenario, error) {
	var sc Scenario
	if err := yaml.UnmarshalStrict(b, &sc); err != nil {
		return nil, err
	}
	if err := sc.defaultAndValidate(); err != nil {
		return nil, err
	}
	return &sc, nil
}

func (g *PodGroup) defaults() {
	if g.Count == 0 {
		g.Count = 1
	}
	if g.Cores == 0 {
		g.Cores = 1
	}
	if g.Speed == 0 {
		g.Speed = 1
	}
	if g.CPURequest == 0 {
		g.CPURequest = float64(g.Cores)
		if g.NoLimit {
			g.CPURequest = 1
		}
	}
	if g.NodeCores == 0 {
		g.NodeCores = float64(g.Cores)
		if g.NoLimit {
			g.NodeCores = 2 * float64(g.Cores)
		}
	}
}

func (g *PodGroup) validate(where string) error {
	switch {
	case g.Name == "":
		return fmt.Errorf("%s: name is required", where)
	case g.Count < 0 || g.Cores < 0:
		return fmt.Errorf("%s: count and cores must be positive", where)
	case g.Speed < 0 || math.IsNaN(g.Speed) || math.IsInf(g.Speed, 0):
		return fmt.Errorf("%s: speed must be positive", where)
	case !(g.CPURequest >= 0) || !(g.NodeCores >= 0):
		return fmt.Errorf("%s: cpu_request and node_cores must not be negative", where)
	}
	return nil
}

func (g *PodGroup) names() []string {
	out := make([]string, g.Count)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", g.Name, i)
	}
	return out
}

// positive reports a finite number above 0 (false for NaN).
func positive(x float64) bool { return x > 0 && !math.IsInf(x, 1) }

func (sc *Scenario) defaultAndValidate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if sc.Work.Distribution == "" {
		sc.Work.Distribution = "exponential"
	}
	if sc.Work.Distribution == "lognormal" && sc.Work.Sigma == 0 {
		sc.Work.Sigma = 1
	}
	if sc.Cycle.Duration == 0 {
		sc.Cycle = dur(30)
	}
	if sc.Prometheus.ScrapeInterval.Duration == 0 {
		sc.Prometheus.ScrapeInterval = dur(15)
	}
	if sc.Prometheus.RateWindow.Duration == 0 {
		sc.Prometheus.RateWindow = dur(60)
	}
	if sc.ReportWindow.Duration == 0 {
		sc.ReportWindow = dur(1)
	}
	if n := sc.nodeNoise(); !(n >= 0 && n <= 1) {
		bad("node_noise %v: want 0 to 1", n)
	}
	if sc.Clients == 0 {
		sc.Clients = 1
	}
	switch sc.Work.Distribution {
	case "exponential", "lognormal":
	default:
		bad("work.distribution %q: want exponential or lognormal", sc.Work.Distribution)
	}
	if sc.Work.Mean.Duration <= 0 {
		bad("work.mean must be positive")
	}
	if sc.Work.Sigma < 0 {
		bad("work.sigma must not be negative")
	}
	if len(sc.Pods) == 0 {
		bad("pods: at least one group is required")
	}
	if sc.Clients < 0 {
		bad("clients must be positive")
	}
	if !positive(sc.Load) {
		bad("load must be a positive fraction of capacity (e.g. 0.8)")
	}
	if sc.Duration.Duration <= 0 {
		bad("duration must be positive")
	}
	if sc.Warmup.Duration < 0 || sc.Warmup.Duration >= sc.Duration.Duration {
		bad("warmup must be in [0, duration)")
	}
	if sc.OptIn.Duration < 0 || sc.OptIn.Duration >= sc.Duration.Duration {
		bad("opt_in must be in [0, duration)")
	}
	if sc.Cycle.Duration < 0 || sc.Prometheus.ScrapeInterval.Duration < 0 || sc.Prometheus.RateWindow.Duration < 0 || sc.ReportWindow.Duration < 0 {
		bad("cycle, scrape_interval, rate_window and report_window must be positive")
	}
	names := map[string]bool{}
	addGroup := func(g *PodGroup, where string) {
		g.defaults()
		if err := g.validate(where); err != nil {
			errs = append(errs, err)
			return
		}
		for _, n := range g.names() {
			if names[n] {
				bad("%s: pod name %s is used twice", where, n)
			}
			names[n] = true
		}
	}
	for i := range sc.Pods {
		addGroup(&sc.Pods[i], fmt.Sprintf("pods[%d]", i))
	}
	// Events are checked in time order against the live pod set.
	live := map[string]bool{}
	for n := range names {
		live[n] = true
	}
	order := sortedEventIndex(sc.Events)
	for _, i := range order {
		ev := &sc.Events[i]
		where := fmt.Sprintf("events[%d]", i)
		if ev.At.Duration < 0 || ev.At.Duration >= sc.Duration.Duration {
			bad("%s: at must be in [0, duration)", where)
		}
		switch ev.Type {
		case EventSetSpeed:
			if !live[ev.Pod] {
				bad("%s: pod %q does not exist at that time", where, ev.Pod)
			}
			if !positive(ev.Speed) {
				bad("%s: speed must be positive", where)
			}
		case EventAddPods:
			if len(ev.Pods) == 0 {
				bad("%s: add_pods needs pods", where)
			}
			for j := range ev.Pods {
				addGroup(&ev.Pods[j], fmt.Sprintf("%s.pods[%d]", where, j))
				for _, n := range ev.Pods[j].names() {
					live[n] = true
				}
			}
		case EventRemovePods:
			if len(ev.Names) == 0 {
				bad("%s: remove_pods needs names", where)
			}
			for _, n := range ev.Names {
				if !live[n] {
					bad("%s: pod %q does not exist at that time", where, n)
				}
				delete(live, n)
			}
			if len(live) == 0 {
				bad("%s: removes every pod", where)
			}
		case EventSetLoad:
			if !positive(ev.Load) {
				bad("%s: load must be positive", where)
			}
		case EventRestart:
			if ev.Downtime.Duration < 0 {
				bad("%s: downtime must not be negative", where)
			}
		default:
			bad("%s: type %q: want %s, %s, %s, %s or %s", where, ev.Type, EventSetSpeed, EventAddPods, EventRemovePods, EventSetLoad, EventRestart)
		}
	}
	for _, s := range sc.Strategies {
		if _, ok := strategyByName(s); !ok {
			bad("strategies: unknown %q (known: %s)", s, strings.Join(StrategyNames(), ", "))
		}
	}
	return errors.Join(errs...)
}

// sortedEventIndex returns event indexes ordered by time, then file order.
func sortedEventIndex(evs []Event) []int {
	idx := make([]int, len(evs))
	for i := range idx {
		idx[i] = i
	}
	for i := 1; i < len(idx); i++ { // insertion sort: stable, tiny inputs
		for j := i; j > 0 && evs[idx[j]].At.Duration < evs[idx[j-1]].At.Duration; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	return idx
}

// capacity of the initial pods in requests per second.
func (sc *Scenario) initialCapacity() float64 {
	c := 0.0
	for _, g := range sc.Pods {
		c += float64(g.Count*g.Cores) * g.Speed
	}
	return c / sc.Work.Mean.Seconds()
}
