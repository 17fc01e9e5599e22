package controllers

import (
	"flag"
	"fmt"
	"strings"
	"time"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// EngineDefaults are the operator-wide defaults of every optimization
// setting; a field of an optimizer's spec.optimization overrides one.
type EngineDefaults struct {
	Cycle        time.Duration
	Params       weights.Params
	CPUQuery     string
	RequestQuery string
	LatencyQuery string
	NodeCPUQuery string
	// Looks: look at the recent latency between cycles where it helps
	// (Settings.ProbeInterval); false turns the looks off for every
	// optimizer, to spare the metrics backend.
	Looks bool
}

// DefaultEngineDefaults are the defaults without flags.
func DefaultEngineDefaults() EngineDefaults {
	return EngineDefaults{
		Cycle:        30 * time.Second,
		Params:       weights.DefaultParams(),
		CPUQuery:     promsource.DefaultCPUQuery,
		RequestQuery: promsource.DefaultRequestQuery,
		LatencyQuery: promsource.DefaultLatencyQuery,
		NodeCPUQuery: promsource.DefaultNodeCPUQuery,
		Looks:        true,
	}
}

// BindFlags registers the defaults as manager flags.
func (d *EngineDefaults) BindFlags(fs *flag.FlagSet) {
	*d = DefaultEngineDefaults()
	fs.DurationVar(&d.Cycle, "default-cycle", d.Cycle, "How often weights are recomputed (spec.optimization.cycle).")
	fs.DurationVar(&d.Params.QueryWindow, "default-query-window", d.Params.QueryWindow, "Range of rate() in the queries (spec.optimization.query_window).")
	fs.DurationVar(&d.Params.ScrapeInterval, "default-scrape-interval", d.Params.ScrapeInterval, "Scrape interval of the pods' metrics (spec.optimization.scrape_interval).")
	fs.Float64Var(&d.Params.DeadBand, "default-dead-band", d.Params.DeadBand, "Cost of a write: weights are written when they save more than its square of the request time, beyond the estimates' noise (spec.optimization.dead_band_percent / 100).")
	fs.Float64Var(&d.Params.MaxStep, "default-max-step", d.Params.MaxStep, "Largest relative move of one weight per write; 1 = it may double or halve (spec.optimization.max_step_percent / 100).")
	fs.Float64Var(&d.Params.MaxRatio, "default-max-weight-ratio", d.Params.MaxRatio, "Weights stay within mean/ratio and mean*ratio (spec.optimization.max_weight_ratio).")
	fs.Float64Var(&d.Params.Smoothing, "default-smoothing", d.Params.Smoothing, "Share of a new reading in a settled capacity estimate; after a change the estimate restarts and follows within a few cycles (spec.optimization.smoothing_percent / 100).")
	fs.Float64Var(&d.Params.MinCPU, "default-min-cpu", d.Params.MinCPU, "Mean CPU cores per pod below which weights are held (spec.optimization.min_cpu_millicores / 1000).")
	fs.DurationVar(&d.Params.SlowStart, "default-slow-start", d.Params.SlowStart, "Ramp-up of a new pod's weight (spec.optimization.slow_start).")
	fs.DurationVar(&d.Params.DrainTime, "default-drain-time", d.Params.DrainTime, "Time within which a pod's backlog should clear; it gets less traffic until then (spec.optimization.drain_time).")
	fs.Float64Var(&d.Params.SpeedTilt, "default-speed-tilt", d.Params.SpeedTilt, "Accepted for compatibility; no effect (spec.optimization.speed_tilt_percent).")
	fs.DurationVar(&d.Params.Expiry, "default-weight-expiry", d.Params.Expiry, "How long the last good weights are held while metrics fail (spec.optimization.weight_expiry).")
	fs.BoolVar(&d.Params.PoolByHardware, "default-share-by-hardware", d.Params.PoolByHardware, "Share capacity estimates between pods on the same node instance type (spec.optimization.share_by_hardware).")
	fs.StringVar(&d.CPUQuery, "default-cpu-query", d.CPUQuery, "PromQL template of per-pod CPU cores (spec.optimization.cpu_query).")
	fs.StringVar(&d.RequestQuery, "default-request-query", d.RequestQuery, `PromQL template of per-pod requests per second, "-" for CPU only (spec.optimization.request_query).`)
	fs.StringVar(&d.LatencyQuery, "default-latency-query", d.LatencyQuery, `PromQL template of per-pod mean request duration in seconds, "-" for none (spec.optimization.latency_query).`)
	fs.BoolVar(&d.Looks, "looks-between-cycles", d.Looks, "Under ROUND_ROBIN, query each optimizer's recent latency once a scrape interval between cycles and run a cycle at once when a pod falls behind; false spares the metrics backend those queries.")
	fs.StringVar(&d.NodeCPUQuery, "default-node-cpu-query", d.NodeCPUQuery, `PromQL template of the CPU cores in use on each pod's node, for pods without a CPU limit, "-" for none (spec.optimization.node_cpu_query).`)
}

// Validate reports invalid defaults at start-up.
func (d EngineDefaults) Validate() error {
	if problems := d.settings(false, true).problems(); len(problems) > 0 {
		return fmt.Errorf("invalid --default-* flags: %s", strings.Join(problems, "; "))
	}
	return nil
}

// settings are the defaults as the settings of one optimizer.
func (d EngineDefaults) settings(dryRun, roundRobin bool) Settings {
	s := Settings{Cycle: d.Cycle, Params: d.Params, CPUQuery: d.CPUQuery, RequestQuery: d.RequestQuery, LatencyQuery: d.LatencyQuery, NodeCPUQuery: d.NodeCPUQuery,
		DryRun: dryRun, RoundRobin: roundRobin, Looks: d.Looks}
	s.complete()
	return s
}

// Settings is the effective optimization configuration of one optimizer.
type Settings struct {
	Cycle        time.Duration
	Params       weights.Params
	CPUQuery     string
	RequestQuery string // "" when CPU only
	LatencyQuery string // "" when none
	NodeCPUQuery string // "" when none
	DryRun       bool
	// RoundRobin: the optimizer's load_balancer is ROUND_ROBIN, under
	// which nothing steers around a queue between cycles (see
	// ProbeInterval).
	RoundRobin bool
	// Looks: the manager allows looks between cycles
	// (--looks-between-cycles).
	Looks bool
	// RecentCPUWindow, RecentLatencyWindow and RecentRequestsWindow are
	// the windows of the recent CPU, latency and request queries (those
	// queries over two scrape intervals), 0 when they are not run; derived
	// from the fields above by complete.
	RecentCPUWindow, RecentLatencyWindow, RecentRequestsWindow time.Duration
	// ProbeInterval is how often, between cycles, the recent latency query
	// runs for weights.Engine.Alarm, 0 = never: policy.LookInterval of the
	// scrape interval (once per scrape interval, at least a second apart:
	// a new scrape is the only new evidence a look can find). Only when the manager allows looks, under ROUND_ROBIN,
	// outside a dry run, and when the recent latency query runs; the
	// policy runs a look only while ROUND_ROBIN is live on learned
	// weights. Derived by complete.
	ProbeInterval time.Duration
}

// complete turns the "-" of an optional query into "" (not queried) and
// derives the recent windows and ProbeInterval, once per change of the
// settings rather than in every cycle.
func (s *Settings) complete() {
	if s.RequestQuery == "-" {
		s.RequestQuery = ""
	}
	if s.LatencyQuery == "-" {
		s.LatencyQuery = ""
	}
	if s.NodeCPUQuery == "-" {
		s.NodeCPUQuery = ""
	}
	s.RecentCPUWindow = recentWindow(*s, s.CPUQuery)
	s.RecentLatencyWindow = recentWindow(*s, s.LatencyQuery)
	s.RecentRequestsWindow = recentWindow(*s, s.RequestQuery)
	s.ProbeInterval = 0
	if s.Looks && s.RoundRobin && !s.DryRun && s.RecentLatencyWindow > 0 {
		s.ProbeInterval = policy.LookInterval(s.Params.ScrapeInterval)
	}
}

// policyConfig is the settings as the optimizer's policy takes them.
func (s Settings) policyConfig() policy.Config {
	lb := weights.BalancerLeastRequest
	if s.RoundRobin && !s.DryRun {
		// In dry run the DestinationRule keeps Istio's LEAST_REQUEST (the
		// weights are not applied): the policy is told so, and tells the
		// engine, whose backlog readings depend on it.
		lb = weights.BalancerRoundRobin
	}
	return policy.Config{Cycle: s.Cycle, LookInterval: s.ProbeInterval, Balancer: lb, Engine: s.Params, DryRun: s.DryRun}
}

// settingsFor merges an optimizer's spec over the defaults. An invalid
// combination (which CRD validation cannot catch) is reported and the
// defaults are used instead, so a bad edit never stops optimization.
func settingsFor(opt *optv1.IstioAdaptiveRequestOptimizer, d EngineDefaults) (Settings, error) {
	roundRobin := opt.Balancer() == optv1.LoadBalancerRoundRobin
	s := d.settings(opt.Spec.DryRun, roundRobin)
	if o := opt.Spec.Optimization; o != nil {
		// A duration that did not parse (see optv1.Duration) is skipped
		// here and reported below; invalidSpec stalls such an optimizer
		// before its settings are used.
		duration(o.Cycle, &s.Cycle)
		duration(o.QueryWindow, &s.Params.QueryWindow)
		duration(o.ScrapeInterval, &s.Params.ScrapeInterval)
		if o.DeadBandPercent != nil {
			s.Params.DeadBand = float64(*o.DeadBandPercent) / 100
		}
		if o.MaxStepPercent != nil {
			s.Params.MaxStep = float64(*o.MaxStepPercent) / 100
		}
		if o.MaxWeightRatio != nil {
			s.Params.MaxRatio = float64(*o.MaxWeightRatio)
		}
		if o.SmoothingPercent != nil {
			s.Params.Smoothing = float64(*o.SmoothingPercent) / 100
		}
		if o.MinCPUMillicores != nil {
			s.Params.MinCPU = float64(*o.MinCPUMillicores) / 1000
		}
		duration(o.SlowStart, &s.Params.SlowStart)
		duration(o.DrainTime, &s.Params.DrainTime)
		// speed_tilt_percent is accepted and has no effect: the engine's
		// one objective leans to faster pods by itself.
		duration(o.WeightExpiry, &s.Params.Expiry)
		if o.ShareByHardware != nil {
			s.Params.PoolByHardware = *o.ShareByHardware
		}
		if o.CPUQuery != "" {
			s.CPUQuery = o.CPUQuery
		}
		if o.RequestQuery != "" {
			s.RequestQuery = o.RequestQuery
		}
		if o.LatencyQuery != "" {
			s.LatencyQuery = o.LatencyQuery
		}
		if o.NodeCPUQuery != "" {
			s.NodeCPUQuery = o.NodeCPUQuery
		}
	}
	s.complete()
	problems := s.problems()
	if o := opt.Spec.Optimization; o != nil {
		for _, f := range durationFields(o) {
			if err := f.value.Err(); err != nil {
				problems = append(problems, f.name+": "+err.Error())
			}
		}
	}
	if len(problems) > 0 {
		return d.settings(opt.Spec.DryRun, roundRobin), fmt.Errorf("spec.optimization is invalid, operator defaults are used instead: %s", strings.Join(problems, "; "))
	}
	return s, nil
}

// SettingsFor is settingsFor for callers outside the package (the
// trace-replay test drives the weight loop with an optimizer's settings).
func SettingsFor(opt *optv1.IstioAdaptiveRequestOptimizer, d EngineDefaults) (Settings, error) {
	return settingsFor(opt, d)
}

// problems lists what makes the settings unusable.
func (s Settings) problems() []string {
	var problems []string
	if s.Cycle < time.Second {
		problems = append(problems, fmt.Sprintf("cycle %v is below 1s", s.Cycle))
	}
	if err := s.Params.Validate(); err != nil {
		problems = append(problems, err.Error())
	}
	if err := promsource.Validate(s.CPUQuery); err != nil {
		problems = append(problems, "cpu_query: "+err.Error())
	}
	if s.RequestQuery != "" {
		if err := promsource.Validate(s.RequestQuery); err != nil {
			problems = append(problems, "request_query: "+err.Error())
		}
	}
	if s.LatencyQuery != "" {
		if err := promsource.Validate(s.LatencyQuery); err != nil {
			problems = append(problems, "latency_query: "+err.Error())
		}
	}
	if s.NodeCPUQuery != "" {
		if err := promsource.Validate(s.NodeCPUQuery); err != nil {
			problems = append(problems, "node_cpu_query: "+err.Error())
		}
	}
	return problems
}

// duration sets *into from a spec field that is set and valid.
func duration(d *optv1.Duration, into *time.Duration) {
	if d != nil && d.Err() == nil {
		*into = d.Duration
	}
}
