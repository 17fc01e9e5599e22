package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// PodGroup is a set of identical pods: same speed, same workers, same
// hardware (node instance type).
type PodGroup struct {
	// Name of the group; pods are named api-<name>-<i>.
	Name string `json:"name"`
	// Count of pods in the group.
	Count int `json:"count"`
	// Speed relative to 1.0: a request costs work/speed seconds of a worker.
	Speed float64 `json:"speed"`
	// Workers serve requests in parallel (the pod's CPU limit in cores).
	// Zero means the scenario's workers.
	Workers int `json:"workers,omitempty"`
	// InstanceType is the node label node.kubernetes.io/instance-type.
	// Empty means one derived from the speed.
	InstanceType string `json:"instance_type,omitempty"`
	// Zone is the topology zone of the pods' nodes. Empty alternates
	// zone-a and zone-b.
	Zone string `json:"zone,omitempty"`
}

// Config is the demo's fleet, load and timing: defaults, then a scenario
// file, then the flags given on the command line.
type Config struct {
	Name        string     `json:"name,omitempty"`
	Description string     `json:"description,omitempty"`
	Pods        []PodGroup `json:"pods,omitempty"`
	// Workers is the default number of workers per pod.
	Workers int `json:"workers,omitempty"`
	// Sidecars is the number of load generators, each balancing alone.
	Sidecars int `json:"sidecars,omitempty"`
	// Load is the offered request rate as a fraction of the fleet's capacity.
	Load float64 `json:"load,omitempty"`
	// Work is the mean service time of a request on a pod of speed 1.
	Work Duration `json:"work,omitempty"`
	// WorkDistribution is exponential or fixed.
	WorkDistribution string `json:"work_distribution,omitempty"`
	// Timeout is the client's request timeout (as an Envoy route timeout).
	Timeout Duration `json:"timeout,omitempty"`
	// Duration bounds the traffic phases; see phases.
	Duration Duration `json:"duration,omitempty"`
	// Warmup is traffic before the baseline window starts.
	Warmup Duration `json:"warmup,omitempty"`
	// Window is the length of each measurement window; zero means Duration/4.
	Window Duration `json:"window,omitempty"`
	// Cycle is the operator's weight cycle (spec.optimization.cycle).
	Cycle Duration `json:"cycle,omitempty"`
	// Istiod: auto (use bin/pilot-discovery if built), on or off.
	Istiod string `json:"istiod,omitempty"`
	// Out is the SVG file written at the end.
	Out string `json:"out,omitempty"`

	// Every is the interval of the live table (flag only).
	Every time.Duration `json:"-"`
	// Verbose sends the operator's log to stderr (flag only).
	Verbose bool `json:"-"`
}

// Duration is a time.Duration spelled "20ms", "2s", "3m" in scenario files.
type Duration struct{ time.Duration }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration must be a string such as \"20ms\" or \"3m\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

func dur(d time.Duration) Duration { return Duration{d} }

// DefaultConfig is the embedded default scenario: three CPU generations, two
// pods each, 2 workers per pod, 8 sidecars at 75% of the fleet's capacity.
func DefaultConfig() Config {
	return Config{
		Name:        "three-generations",
		Description: "2 fast pods (speed 1.0), 2 medium (0.6), 2 slow (0.35), 2 workers each; 8 sidecars at 75% of capacity",
		Pods: []PodGroup{
			{Name: "fast", Count: 2, Speed: 1.0},
			{Name: "medium", Count: 2, Speed: 0.6},
			{Name: "slow", Count: 2, Speed: 0.35},
		},
		Workers:          2,
		Sidecars:         8,
		Load:             0.75,
		Work:             dur(20 * time.Millisecond),
		WorkDistribution: "exponential",
		Timeout:          dur(2 * time.Second),
		Duration:         dur(3 * time.Minute),
		Warmup:           dur(10 * time.Second),
		Cycle:            dur(2 * time.Second),
		Istiod:           "auto",
		Out:              "demo.svg",
		Every:            5 * time.Second,
	}
}

// LoadScenario reads a scenario file over cfg: fields it sets win.
func LoadScenario(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var sc Config
	if err := yaml.UnmarshalStrict(data, &sc); err != nil {
		return fmt.Errorf("scenario %s: %w", path, err)
	}
	if sc.Name != "" {
		cfg.Name, cfg.Description = sc.Name, sc.Description
	}
	if len(sc.Pods) > 0 {
		cfg.Pods = sc.Pods
	}
	setInt(&cfg.Workers, sc.Workers)
	setInt(&cfg.Sidecars, sc.Sidecars)
	if sc.Load != 0 {
		cfg.Load = sc.Load
	}
	for _, p := range []struct{ dst, src *Duration }{
		{&cfg.Work, &sc.Work}, {&cfg.Timeout, &sc.Timeout}, {&cfg.Duration, &sc.Duration},
		{&cfg.Warmup, &sc.Warmup}, {&cfg.Window, &sc.Window}, {&cfg.Cycle, &sc.Cycle},
	} {
		if p.src.Duration != 0 {
			*p.dst = *p.src
		}
	}
	setStr(&cfg.WorkDistribution, sc.WorkDistribution)
	setStr(&cfg.Istiod, sc.Istiod)
	setStr(&cfg.Out, sc.Out)
	return nil
}

func setInt(dst *int, v int) {
	if v != 0 {
		*dst = v
	}
}

func setStr(dst *string, v string) {
	if v != "" {
		*dst = v
	}
}

// ParseFlags builds the configuration: defaults, then --scenario, then the
// other flags that were given.
func ParseFlags(args []string) (Config, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: go run ./test/demo [flags]   (or: make demo DEMO_ARGS="...")

Runs, on loopback, a local API server, a real Prometheus, istiod (if built)
and the operator, a fleet of simulated pods of unequal speed, and sidecar-like
load generators; measures latency with Istio's default LEAST_REQUEST (no optimizer), then with the
operator's weights, and prints a before/after summary and writes a picture.

Flags:
`)
		fs.PrintDefaults()
	}
	scenario := fs.String("scenario", "", "YAML scenario file (see test/demo/scenarios); flags given as well override it")
	pods := fs.Int("pods", 6, "number of pods, split evenly over --speeds")
	speeds := fs.String("speeds", "1.0,0.6,0.35", "comma-separated pod speeds; one per pod, or groups the pods are split into")
	workers := fs.Int("workers", cfg.Workers, "workers (CPU limit in cores) per pod")
	load := fs.Float64("load", cfg.Load, "offered load as a fraction of the fleet's total capacity")
	duration := fs.Duration("duration", cfg.Duration.Duration, "upper bound of the traffic phases: warm-up, baseline (duration/4), optimization until converged, measurement (duration/4)")
	cycle := fs.Duration("cycle", cfg.Cycle.Duration, "the operator's weight cycle (spec.optimization.cycle)")
	out := fs.String("out", cfg.Out, "SVG file to write: weights, utilisation and latency over time")
	sidecars := fs.Int("sidecars", cfg.Sidecars, "load generators, each balancing alone like a client sidecar")
	work := fs.Duration("work", cfg.Work.Duration, "mean service time of a request on a pod of speed 1.0")
	dist := fs.String("work-distribution", cfg.WorkDistribution, "service time distribution: exponential or fixed")
	timeout := fs.Duration("timeout", cfg.Timeout.Duration, "client request timeout (like an Envoy route timeout)")
	warmup := fs.Duration("warmup", cfg.Warmup.Duration, "traffic before the baseline window")
	window := fs.Duration("window", 0, "length of each measurement window (default duration/4)")
	istiod := fs.String("istiod", cfg.Istiod, "auto: sidecars get weights from istiod over xDS when bin/pilot-discovery exists, else from the ServiceEntry; on; off")
	every := fs.Duration("every", cfg.Every, "interval of the live table")
	verbose := fs.Bool("verbose", false, "print the operator's log on stderr")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments %q (flags start with --)", fs.Args())
	}
	if *scenario != "" {
		if err := LoadScenario(*scenario, &cfg); err != nil {
			return cfg, err
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["workers"] {
		cfg.Workers = *workers
		for i := range cfg.Pods {
			cfg.Pods[i].Workers = 0
		}
	}
	if set["pods"] || set["speeds"] {
		groups, err := groupsFromFlags(*pods, *speeds)
		if err != nil {
			return cfg, err
		}
		cfg.Pods = groups
		cfg.Name, cfg.Description = "flags", ""
	}
	if set["load"] {
		cfg.Load = *load
	}
	if set["duration"] {
		cfg.Duration = dur(*duration)
	}
	if set["cycle"] {
		cfg.Cycle = dur(*cycle)
	}
	if set["out"] {
		cfg.Out = *out
	}
	if set["sidecars"] {
		cfg.Sidecars = *sidecars
	}
	if set["work"] {
		cfg.Work = dur(*work)
	}
	if set["work-distribution"] {
		cfg.WorkDistribution = *dist
	}
	if set["timeout"] {
		cfg.Timeout = dur(*timeout)
	}
	if set["warmup"] {
		cfg.Warmup = dur(*warmup)
	}
	if set["window"] {
		cfg.Window = dur(*window)
	}
	if set["istiod"] {
		cfg.Istiod = *istiod
	}
	cfg.Every = *every
	cfg.Verbose = *verbose
	return cfg, cfg.Validate()
}

// groupsFromFlags splits n pods over the speeds: one pod per speed when
// there are n speeds, else as evenly as possible, in order.
func groupsFromFlags(n int, speedList string) ([]PodGroup, error) {
	if n < 1 {
		return nil, fmt.Errorf("--pods must be at least 1, got %d", n)
	}
	var speeds []float64
	for _, f := range strings.Split(speedList, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) {
			return nil, fmt.Errorf("--speeds: %q is not a positive number", f)
		}
		speeds = append(speeds, v)
	}
	if len(speeds) == 0 {
		return nil, errors.New("--speeds is empty")
	}
	if len(speeds) > n {
		return nil, fmt.Errorf("--speeds lists %d speeds for %d pods", len(speeds), n)
	}
	counts := make([]int, len(speeds))
	if len(speeds) == n {
		for i := range counts {
			counts[i] = 1
		}
	} else {
		for i := range counts {
			counts[i] = n / len(speeds)
			if i < n%len(speeds) {
				counts[i]++
			}
		}
	}
	// Consecutive equal speeds form one group.
	var groups []PodGroup
	for i, s := range speeds {
		if k := len(groups); k > 0 && groups[k-1].Speed == s {
			groups[k-1].Count += counts[i]
			continue
		}
		groups = append(groups, PodGroup{Speed: s, Count: counts[i]})
	}
	names := classNames(groups)
	for i := range groups {
		groups[i].Name = names[i]
	}
	return groups, nil
}

// classNames names groups by speed rank: fast/slow, fast/medium/slow, or
// after the speed when there are more classes or equal speeds.
func classNames(groups []PodGroup) []string {
	distinct := map[float64]bool{}
	for _, g := range groups {
		distinct[g.Speed] = true
	}
	var ranked []float64
	for s := range distinct {
		ranked = append(ranked, s)
	}
	slices.Sort(ranked)
	slices.Reverse(ranked)
	labels := map[int][]string{1: {"std"}, 2: {"fast", "slow"}, 3: {"fast", "medium", "slow"}}[len(ranked)]
	out := make([]string, len(groups))
	used := map[string]int{}
	for i, g := range groups {
		name := fmt.Sprintf("s%03d", int(math.Round(g.Speed*100)))
		if labels != nil && len(ranked) == len(groups) {
			name = labels[slices.Index(ranked, g.Speed)]
		}
		if used[name] > 0 {
			name = fmt.Sprintf("%s%d", name, used[name]+1)
		}
		used[name]++
		out[i] = name
	}
	return out
}

// Validate reports settings that cannot work.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Pods) == 0 {
		bad("no pods")
	}
	names := map[string]bool{}
	total := 0
	for _, g := range c.Pods {
		if g.Name == "" || !validName(g.Name) {
			bad("pod group name %q must be lower-case letters, digits and '-'", g.Name)
		}
		if names[g.Name] {
			bad("pod group %q appears twice", g.Name)
		}
		names[g.Name] = true
		if g.Count < 1 {
			bad("pod group %q: count must be at least 1", g.Name)
		}
		if !(g.Speed > 0) || math.IsInf(g.Speed, 0) {
			bad("pod group %q: speed must be positive", g.Name)
		}
		if g.Workers < 0 || (g.Workers == 0 && c.Workers < 1) {
			bad("pod group %q: workers must be at least 1", g.Name)
		}
		total += g.Count
	}
	if total > 200 {
		bad("%d pods: at most 200 (addresses 127.77.0.1-127.77.0.200)", total)
	}
	if c.Sidecars < 1 || c.Sidecars > 200 {
		bad("sidecars must be between 1 and 200, got %d", c.Sidecars)
	}
	if !(c.Load > 0 && c.Load <= 2) {
		bad("load must be above 0 and at most 2, got %v", c.Load)
	}
	if c.Work.Duration < time.Millisecond {
		bad("work must be at least 1ms, got %v", c.Work.Duration)
	}
	if c.WorkDistribution != "exponential" && c.WorkDistribution != "fixed" {
		bad("work distribution must be exponential or fixed, got %q", c.WorkDistribution)
	}
	if c.Timeout.Duration < 10*c.Work.Duration {
		bad("timeout %v must be at least 10 times the work %v", c.Timeout.Duration, c.Work.Duration)
	}
	if c.Cycle.Duration < time.Second || c.Cycle.Duration%time.Millisecond != 0 {
		bad("cycle must be at least 1s (whole milliseconds), got %v", c.Cycle.Duration)
	}
	if c.Warmup.Duration < 0 {
		bad("warmup must not be negative")
	}
	if c.Window.Duration != 0 && c.Window.Duration < 5*time.Second {
		bad("window must be at least 5s, got %v", c.Window.Duration)
	}
	if c.Istiod != "auto" && c.Istiod != "on" && c.Istiod != "off" {
		bad("istiod must be auto, on or off, got %q", c.Istiod)
	}
	if c.Out == "" {
		bad("out must name a file")
	}
	if c.Every < time.Second {
		bad("every must be at least 1s")
	}
	if len(errs) == 0 {
		if p := c.Phases(); p.OptimizeMax < 5*c.Cycle.Duration {
			bad("duration %v is too short: after warm-up %v, two windows of %v and settling %v, fewer than 5 cycles of %v are left to optimize",
				c.Duration.Duration, p.Warmup, p.Window, p.Settle, c.Cycle.Duration)
		}
		if rps := c.TotalRate(); rps > 3000 {
			bad("%.0f requests/s is more than this demo should put on a laptop (3000); lower --load or raise --work", rps)
		}
	}
	return errors.Join(errs...)
}

func validName(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return len(s) <= 40 && s[0] != '-' && s[len(s)-1] != '-'
}

// Phases are the demo's timeline, measured from the start of traffic.
type Phases struct {
	// Warmup: equal weights, not measured (queues and Prometheus fill).
	Warmup time.Duration
	// Window: length of the baseline and of the after-convergence windows.
	Window time.Duration
	// OptimizeMax: the longest the optimization phase may take.
	OptimizeMax time.Duration
	// Settle: after convergence, before the second window (every sidecar
	// has the final weights and queues drained).
	Settle time.Duration
}

// Phases splits Duration: warm-up, a baseline window (Window, default
// Duration/4), the optimization until converged (at most what is left),
// settling (two cycles) and a second window.
func (c Config) Phases() Phases {
	p := Phases{Warmup: c.Warmup.Duration, Window: c.Window.Duration, Settle: 2 * c.Cycle.Duration}
	if p.Window == 0 {
		p.Window = c.Duration.Duration / 4
	}
	p.OptimizeMax = c.Duration.Duration - p.Warmup - 2*p.Window - p.Settle
	return p
}

// podSpec is one simulated pod.
type podSpec struct {
	Index        int
	Name         string
	Class        string
	Speed        float64
	Workers      int
	InstanceType string
	Zone         string
	Node         string
	// ID is the pod IP registered in the EndpointSlice (198.18.0.0/15, an
	// identifier only); the server listens on a loopback address.
	ID string
}

// Capacity is requests per second the pod can serve.
func (p podSpec) Capacity(work time.Duration) float64 {
	return float64(p.Workers) * p.Speed / work.Seconds()
}

// Fleet expands the pod groups into pods.
func (c Config) Fleet() []podSpec {
	var out []podSpec
	for _, g := range c.Pods {
		workers := g.Workers
		if workers == 0 {
			workers = c.Workers
		}
		it := g.InstanceType
		if it == "" {
			it = fmt.Sprintf("speed-%.2f", g.Speed)
		}
		for i := range g.Count {
			idx := len(out)
			zone := g.Zone
			if zone == "" {
				zone = []string{"zone-a", "zone-b"}[idx%2]
			}
			out = append(out, podSpec{
				Index: idx, Name: fmt.Sprintf("api-%s-%d", g.Name, i), Class: g.Name,
				Speed: g.Speed, Workers: workers, InstanceType: it, Zone: zone,
				Node: fmt.Sprintf("node-%d", idx+1), ID: fixtures.IP(0, idx+1),
			})
		}
	}
	return out
}

// TotalCapacity is the fleet's requests per second at 100% utilisation.
func (c Config) TotalCapacity() float64 {
	sum := 0.0
	for _, p := range c.Fleet() {
		sum += p.Capacity(c.Work.Duration)
	}
	return sum
}

// TotalRate is the offered request rate.
func (c Config) TotalRate() float64 { return c.Load * c.TotalCapacity() }
