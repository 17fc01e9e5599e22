// Command bench is a deterministic discrete-event simulation comparing load
// balancing strategies (Envoy's built-in algorithms, the seed operator's
// rules, an oracle and this project's weight package) on scenarios of unlike
// pods. See docs/benchmarks.md.
//
//	go run ./test/bench --scenario FILE [--json]
//	go run ./test/bench --all DIR [--json]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

func main() {
	var (
		scenarioFile = flag.String("scenario", "", "scenario file (YAML or JSON) to run")
		allDir       = flag.String("all", "", "run every *.yaml, *.yml and *.json scenario in this directory")
		asJSON       = flag.Bool("json", false, "print one JSON object per scenario instead of a table")
		only         = flag.String("strategies", "", "comma-separated strategies to run (default: the scenario's list, else all: "+strings.Join(StrategyNames(), ",")+")")
		parallel     = flag.Int("parallel", runtime.GOMAXPROCS(0), "simulations run at once")
		cpuProfile   = flag.String("cpuprofile", "", "write a CPU profile to this file")
		trace        = flag.String("trace", "", "print every cycle of this optimizer strategy (weights, signals, engine message) to stderr")
		record       = flag.String("record-trace", "", "[policy] write the signal trace the optimizer strategy was answered with to this file (test/replay)")
		targets      = flag.String("targets", "", "measure the quality targets on the scenarios in this directory (see --seeds) and print them")
		guardedOnly  = flag.Bool("guarded-only", false, "with --targets: skip the targets known to miss (as TestIssueTargets does)")
		seeds        = flag.String("seeds", "0", "with --targets, --guard or --markdown: comma-separated seeds or ranges (1-8); 0 = each file's own seed")
		guard        = flag.String("guard", "", "run the regression guard (TestIssueTargets) on the scenarios in this directory over --seeds and print it")
		baseline     = flag.String("baseline", "test/bench/baseline.json", "with --guard or --markdown: the recorded baseline to compare with")
		writeBase    = flag.String("write-baseline", "", "with --guard: record the optimizer's p99 per scenario and seed to this file instead of comparing")
		markdown     = flag.String("markdown", "", "run every scenario of --all over --seeds and write the benchmark documentation (docs/benchmarks.md) to this file")
		readme       = flag.String("readme", "", "with --markdown: also regenerate the figures between the bench-docs markers of this README")
		sensitivity  = flag.String("sensitivity", "test/bench/sensitivity.md", "with --markdown: the sensitivity table to include (make bench-sensitivity writes it)")
		matrixCache  = flag.String("matrix-cache", "", "with --markdown: keep the runs in this file, and read them from it when it exists (to rework the template without rerunning)")
		drainTime    = flag.Duration("drain-time", -1, "engine DrainTime for the optimizer strategies (sensitivity runs; default: DefaultParams)")
		deadBand     = flag.Float64("dead-band", -1, "engine DeadBand for the optimizer strategies (sensitivity runs; default: DefaultParams)")
		smoothing    = flag.Float64("smoothing", -1, "engine Smoothing for the optimizer strategies (sensitivity runs; default: DefaultParams)")
		maxStep      = flag.Float64("max-step", -1, "engine MaxStep for the optimizer strategies (sensitivity runs; default: DefaultParams)")
		random       = flag.Int("random", 0, "run the guard on this many random scenarios (drawn from --random-seed; none shipped) over --seeds, and print it")
		randomSeed   = flag.Uint64("random-seed", 1, "with --random: the seed the scenarios are drawn from (another seed, other Services)")
		randomDoc    = flag.String("random-doc", "", "with --random: also write the result as Markdown to this file (docs/random-scenarios.md)")
		maxRatio     = flag.Float64("max-ratio", -1, "engine MaxRatio for the optimizer strategies (the resource's max_weight_ratio; default: DefaultParams)")
	)
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: bench --scenario FILE | --all DIR | FILE... [--json] [--strategies a,b]\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	recordTrace = *record
	if *drainTime >= 0 || *deadBand >= 0 || *smoothing >= 0 || *maxStep >= 0 || *maxRatio >= 0 {
		benchParams = func(p *weights.Params) {
			if *drainTime >= 0 {
				p.DrainTime = *drainTime
			}
			if *deadBand >= 0 {
				p.DeadBand = *deadBand
			}
			if *smoothing >= 0 {
				p.Smoothing = *smoothing
			}
			if *maxStep >= 0 {
				p.MaxStep = *maxStep
			}
			if *maxRatio >= 0 {
				p.MaxRatio = *maxRatio
			}
		}
		// The engine would put a value out of range back to its default
		// and run on that; the oracle bounded by it would not.
		if err := benchEngineParams().Validate(); err != nil {
			fatal(err)
		}
	}
	if *markdown != "" {
		ss, err := parseSeeds(*seeds)
		if err != nil {
			fatal(err)
		}
		if *allDir == "" {
			fatal(fmt.Errorf("--markdown needs --all DIR"))
		}
		start := time.Now()
		if err := writeDocs(*allDir, ss, *parallel, *markdown, *readme, *baseline, *sensitivity, *matrixCache); err != nil {
			fatal(err)
		}
		fmt.Fprintf(os.Stderr, "bench: %s written from %d seed(s) in %.1fs\n", *markdown, len(ss), time.Since(start).Seconds())
		return
	}
	if *random > 0 {
		ss, err := parseSeeds(*seeds)
		if err != nil {
			fatal(err)
		}
		start := time.Now()
		if err := runRandom(os.Stdout, *random, *randomSeed, ss, *parallel, *randomDoc); err != nil {
			fatal(err)
		}
		fmt.Fprintf(os.Stderr, "bench: guard on %d random scenarios, %d seed(s) each, in %.1fs\n", *random, len(ss), time.Since(start).Seconds())
		return
	}
	if *guard != "" {
		ss, err := parseSeeds(*seeds)
		if err != nil {
			fatal(err)
		}
		start := time.Now()
		m, err := runGuardMatrix(*guard, ss, *parallel)
		if err != nil {
			fatal(err)
		}
		if *writeBase != "" {
			if err := baselineOf(m).write(*writeBase); err != nil {
				fatal(err)
			}
			checks, err := guardChecks(m, nil)
			if err != nil {
				fatal(err)
			}
			writeGuard(os.Stdout, checks, medianTargets(m, Targets))
			fmt.Fprintf(os.Stderr, "bench: baseline of %d scenarios on %d seed(s) written to %s in %.1fs\n", len(m.Files), len(ss), *writeBase, time.Since(start).Seconds())
			return
		}
		base, err := loadBaseline(*baseline)
		if err != nil {
			fatal(err)
		}
		checks, err := guardChecks(m, base)
		if err != nil {
			fatal(err)
		}
		writeGuard(os.Stdout, checks, medianTargets(m, Targets))
		fmt.Fprintf(os.Stderr, "bench: guard on %d seed(s) in %.1fs\n", len(ss), time.Since(start).Seconds())
		return
	}
	if *targets != "" {
		ss, err := parseSeeds(*seeds)
		if err != nil {
			fatal(err)
		}
		start := time.Now()
		list := Targets
		if *guardedOnly {
			list = nil
			for _, tg := range Targets {
				if tg.Miss == "" {
					list = append(list, tg)
				}
			}
		}
		rs, err := evaluateTargets(*targets, list, ss, *parallel)
		if err != nil {
			fatal(err)
		}
		writeTargets(os.Stdout, rs, ss)
		fmt.Fprintf(os.Stderr, "bench: %d targets on %d seed(s) in %.1fs\n", len(list), len(ss), time.Since(start).Seconds())
		return
	}
	files := flag.Args()
	if *scenarioFile != "" {
		files = append(files, *scenarioFile)
	}
	if *allDir != "" {
		for _, pat := range []string{"*.yaml", "*.yml", "*.json"} {
			m, err := filepath.Glob(filepath.Join(*allDir, pat))
			if err != nil {
				fatal(err)
			}
			files = append(files, m...)
		}
		slices.Sort(files)
	}
	if len(files) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	var scs []*Scenario
	for _, f := range files {
		sc, err := LoadScenario(f)
		if err != nil {
			fatal(err)
		}
		if *only != "" {
			sc.Strategies = strings.Split(*only, ",")
			for _, n := range sc.Strategies {
				if _, ok := strategyByName(n); !ok {
					fatal(fmt.Errorf("unknown strategy %q (known: %s)", n, strings.Join(StrategyNames(), ", ")))
				}
			}
		}
		scs = append(scs, sc)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	traceStrategy = *trace
	results := RunAll(scs, *parallel)
	for i, sc := range scs {
		if *asJSON {
			if err := writeJSON(os.Stdout, sc, results[i]); err != nil {
				fatal(err)
			}
		} else {
			writeTable(os.Stdout, sc, results[i])
		}
	}
	if !*asJSON {
		if rs := targetsOf(Targets, files, results); len(rs) > 0 {
			fmt.Println("## Targets (each file's seed; known misses say why)")
			fmt.Println()
			writeTargets(os.Stdout, rs, []uint64{0})
		}
	}
	fmt.Fprintf(os.Stderr, "bench: %d scenario(s) simulated in %.1fs with %d parallel simulations\n",
		len(scs), time.Since(start).Seconds(), *parallel)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// strategiesOf returns the scenario's strategies in output order.
func strategiesOf(sc *Scenario) []strategyDef {
	var out []strategyDef
	for _, d := range strategyDefs {
		if len(sc.Strategies) == 0 || slices.Contains(sc.Strategies, d.name) {
			out = append(out, d)
		}
	}
	return out
}

// traceStrategy names the strategy whose cycles are traced (--trace).
var traceStrategy string

// RunAll simulates every strategy of every scenario, up to parallel at once.
// Each simulation is independent and deterministic, so the result does not
// depend on parallel.
func RunAll(scs []*Scenario, parallel int) [][]StrategyResult {
	type job struct{ i, j int }
	results := make([][]StrategyResult, len(scs))
	var jobs []job
	for i, sc := range scs {
		defs := strategiesOf(sc)
		results[i] = make([]StrategyResult, len(defs))
		for j := range defs {
			jobs = append(jobs, job{i, j})
		}
	}
	// Longest first: optimizer-driven and cswrr runs cost a little more.
	ch := make(chan job)
	var wg sync.WaitGroup
	for range max(1, parallel) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for jb := range ch {
				def := strategiesOf(scs[jb.i])[jb.j]
				s := newSim(scs[jb.i], def)
				if def.name == traceStrategy {
					s.trace = os.Stderr
				}
				results[jb.i][jb.j] = s.run()
			}
		}()
	}
	for _, jb := range jobs {
		ch <- jb
	}
	close(ch)
	wg.Wait()
	return results
}

// Report is the --json output for one scenario.
type Report struct {
	Scenario   string           `json:"scenario"`
	Strategies []StrategyResult `json:"strategies"`
}

func clean(v float64) float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return -1
	}
	return math.Round(v*1000) / 1000
}

func writeJSON(w io.Writer, sc *Scenario, rs []StrategyResult) error {
	out := Report{Scenario: sc.Name}
	for _, r := range rs {
		r.P50Ms, r.P99Ms, r.P999Ms, r.MeanMs = clean(r.P50Ms), clean(r.P99Ms), clean(r.P999Ms), clean(r.MeanMs)
		r.MaxMeanUtil, r.MinMeanUtil = clean(r.MaxMeanUtil), clean(r.MinMeanUtil)
		if r.P99AfterMs != nil {
			v, v9 := clean(*r.P99AfterMs), clean(*r.P999AfterMs)
			r.P99AfterMs, r.P999AfterMs = &v, &v9
		}
		r.P99PerMinuteMs = slices.Clone(r.P99PerMinuteMs)
		for m, v := range r.P99PerMinuteMs {
			r.P99PerMinuteMs[m] = clean(v)
		}
		out.Strategies = append(out.Strategies, r)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func writeTable(w io.Writer, sc *Scenario, rs []StrategyResult) {
	pods := 0
	for _, g := range sc.Pods {
		pods += g.Count
	}
	fmt.Fprintf(w, "## %s\n\n", sc.Name)
	if sc.Description != "" {
		fmt.Fprintf(w, "%s\n\n", strings.TrimSpace(sc.Description))
	}
	var n uint64
	if len(rs) > 0 {
		n = rs[0].Requests
	}
	fmt.Fprintf(w, "%d pods, %d clients, load %s, %s %s work, %s (first %s excluded, %d requests measured), cycle %s, seed %d\n\n",
		pods, sc.Clients, loadText(sc), sc.Work.Mean.Duration, sc.Work.Distribution, sc.Duration.Duration,
		sc.Warmup.Duration, n, sc.Cycle.Duration, sc.Seed)
	after := len(sc.Events) > 0
	hdr := "| strategy | p50 ms | p99 ms | p99.9 ms |"
	sep := "|---|---:|---:|---:|"
	if after {
		hdr += " p99 after event ms | p99.9 after event ms |"
		sep += "---:|---:|"
	}
	hdr += " max/mean util | min/mean util | max queue | writes | policy switches | settled (cycle) | writes, switches after settled |"
	sep += "---:|---:|---:|---:|---:|---:|---:|"
	fmt.Fprintln(w, hdr)
	fmt.Fprintln(w, sep)
	for _, r := range rs {
		line := fmt.Sprintf("| %s | %s | %s | %s |", r.Name, ms(r.P50Ms), ms(r.P99Ms), ms(r.P999Ms))
		if after {
			v, v9 := math.NaN(), math.NaN()
			if r.P99AfterMs != nil {
				v, v9 = *r.P99AfterMs, *r.P999AfterMs
			}
			line += fmt.Sprintf(" %s | %s |", ms(v), ms(v9))
		}
		settled, after := "-", "-"
		switch {
		case r.SettledCycle >= 0:
			settled = fmt.Sprintf("%d (%s)", r.SettledCycle, time.Duration(r.SettledCycle)*sc.Cycle.Duration)
			after = fmt.Sprintf("%d, %d", r.WritesAfterSettled, r.SwitchesAfterSettled)
		case r.Writes > 0:
			settled = "never"
		}
		line += fmt.Sprintf(" %.3f | %.3f | %d | %d | %d | %s | %s |", r.MaxMeanUtil, r.MinMeanUtil, r.MaxQueue, r.Writes, r.PolicySwitches, settled, after)
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
	if len(rs) > 0 && len(rs[0].P99PerMinuteMs) > 0 {
		fmt.Fprintln(w, "p99 per minute of arrival (ms), from the end of the warm-up (the opt-in):")
		fmt.Fprintln(w)
		hdr, sep := "| strategy |", "|---|"
		for m := range rs[0].P99PerMinuteMs {
			hdr += fmt.Sprintf(" %d |", m+1)
			sep += "---:|"
		}
		fmt.Fprintln(w, hdr)
		fmt.Fprintln(w, sep)
		for _, r := range rs {
			line := "| " + r.Name + " |"
			for _, v := range r.P99PerMinuteMs {
				line += " " + ms(v) + " |"
			}
			fmt.Fprintln(w, line)
		}
		fmt.Fprintln(w)
	}
	for _, r := range rs {
		if r.LearnedAt != 0 {
			if r.LearnedAt < 0 {
				fmt.Fprintf(w, "- %s: never reported Learned\n", r.Name)
			} else {
				fmt.Fprintf(w, "- %s: Learned from %s\n", r.Name, time.Duration(r.LearnedAt*float64(time.Second)))
			}
		}
		if len(r.Modes) > 0 {
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(r.Modes)) {
				parts = append(parts, fmt.Sprintf("%s %d", k, r.Modes[k]))
			}
			fmt.Fprintf(w, "- %s engine modes per cycle: %s\n", r.Name, strings.Join(parts, ", "))
		}
		for _, note := range r.Notes {
			fmt.Fprintf(w, "- %s: %s\n", r.Name, note)
		}
	}
	fmt.Fprintln(w)
}

func ms(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// parseSeeds reads "1-5,7" into seeds.
func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		var lo, hi uint64
		if n, _ := fmt.Sscanf(part, "%d-%d", &lo, &hi); n == 2 && hi >= lo && hi-lo < 1000 {
			for v := lo; v <= hi; v++ {
				out = append(out, v)
			}
			continue
		}
		if _, err := fmt.Sscanf(part, "%d", &lo); err != nil {
			return nil, fmt.Errorf("seeds %q: want numbers or ranges like 1-8", s)
		}
		out = append(out, lo)
	}
	return out, nil
}

// loadText is the scenario's offered load as the header states it: the
// initial load, then each set_load event's, so a run whose load moves does
// not read as a steady one.
func loadText(sc *Scenario) string {
	out := fmt.Sprintf("%.2f", sc.Load)
	for _, ev := range sc.Events {
		if ev.Type == EventSetLoad {
			out += fmt.Sprintf(", %.2f from %s", ev.Load, ev.At.Duration)
		}
	}
	return out
}
