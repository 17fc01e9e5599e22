package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The regression guard judges distributions over seeds, not single runs:
// every shipped scenario is run on each seed and a rule holds or misses on
// the median (or the worst seed) of what it measures, so that a change is
// not failed by one seed at the edge of the noise.

// Matrix holds the runs of scenario files on seeds: Runs[file][k] are the
// strategies' results on Seeds[k], by strategy name.
type Matrix struct {
	Dir   string
	Files []string
	Seeds []uint64
	Runs  map[string][]map[string]StrategyResult
	// Restarted holds the same scenarios' runs with a restart of the
	// operator's manager (restartVariant); nil when not run.
	Restarted *Matrix
}

// runMatrix runs strategies(file) of every file in dir on every seed.
func runMatrix(dir string, files []string, strategies func(file string) []string, seeds []uint64, parallel int) (*Matrix, error) {
	return runVariants(dir, files, func(f string, sc *Scenario) bool {
		sc.Strategies = strategies(f)
		return true
	}, seeds, parallel)
}

// runVariants runs every file in dir on every seed as prepare leaves it
// (false: the file is not run; its runs stay empty).
func runVariants(dir string, files []string, prepare func(file string, sc *Scenario) bool, seeds []uint64, parallel int) (*Matrix, error) {
	var scs []*Scenario
	type at struct {
		file string
		k    int
	}
	var where []at
	for k, seed := range seeds {
		for _, f := range files {
			sc, err := LoadScenario(filepath.Join(dir, f))
			if err != nil {
				return nil, err
			}
			if seed != 0 {
				sc.Seed = seed
			}
			if !prepare(f, sc) {
				continue
			}
			scs = append(scs, sc)
			where = append(where, at{f, k})
		}
	}
	results := RunAll(scs, parallel)
	m := &Matrix{Dir: dir, Files: files, Seeds: seeds, Runs: map[string][]map[string]StrategyResult{}}
	for _, f := range files {
		m.Runs[f] = make([]map[string]StrategyResult, len(seeds))
	}
	for i, w := range where {
		byName := map[string]StrategyResult{}
		for _, r := range results[i] {
			byName[r.Name] = r
		}
		m.Runs[w.file][w.k] = byName
	}
	return m, nil
}

// scenarioFiles lists the scenario files of dir, sorted.
func scenarioFiles(dir string) ([]string, error) {
	var out []string
	for _, pat := range []string{"*.yaml", "*.yml", "*.json"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return nil, err
		}
		for _, f := range m {
			out = append(out, filepath.Base(f))
		}
	}
	slices.Sort(out)
	return out, nil
}

// values is what v gives on every seed of file (NaN where a strategy is
// missing).
func (m *Matrix) values(file string, v func(map[string]StrategyResult) float64) []float64 {
	var out []float64
	for _, r := range m.Runs[file] {
		out = append(out, v(r))
	}
	return out
}

func p99Of(name string) func(map[string]StrategyResult) float64 {
	return func(r map[string]StrategyResult) float64 {
		x, ok := r[name]
		if !ok {
			return math.NaN()
		}
		return x.P99Ms
	}
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	return median(v)
}

func worstOf(v []float64) float64 {
	w := math.Inf(-1)
	for _, x := range v {
		if math.IsNaN(x) {
			return math.NaN()
		}
		w = max(w, x)
	}
	return w
}

// isCold: the scenarios measured from opt-in, whose opt-in path is being
// changed to the one that ships; they have their own rules (coldRules).
func isCold(file string) bool { return strings.Contains(file, "-cold") }

// Guard rules and their limits.
const (
	// guardBestRatio: each scenario's median p99 of the optimizer within
	// this of the best static weights' (issue 25, point 7).
	guardBestRatio = 1.1
	// guardMedianSlack and guardWorstSlack: how much worse than the
	// baseline the median and the worst seed may get.
	guardMedianSlack = 1.03
	guardWorstSlack  = 1.10
)

// coldLimit is the opt-in rule of the cold scenarios: the optimizer's p99
// from opt-in at most this times the capacity oracle's, by load.
func coldLimit(load float64) float64 {
	if load >= 0.85 {
		return 1.5
	}
	return 1.3
}

// knownMiss is a rule known not to hold on a scenario: why, and the value
// measured over seeds 1-16 when it was recorded. The rule's own limit is
// not asserted; a ratchet is: the value may not get worse than the larger
// of the two by the guard's median slack, so a known miss cannot hide a
// regression.
type knownMiss struct {
	why      string
	measured float64 // x or ms, as the rule; 0: the rule held when recorded
}

// bound is what the miss's rule, of limit limit, is held to.
func (k knownMiss) bound(limit float64) float64 { return max(k.measured, limit) * guardMedianSlack }

// bestMisses are the scenarios on which the optimizer is known not to come
// within guardBestRatio of the best static weights.
var bestMisses = map[string]knownMiss{}

// baselineMisses are the scenarios on which the optimizer's median p99 is
// known to be worse than the baseline's +3% (the engine before the
// four-stage rewrite, on the same simulator); its worst seed is held to the
// worst-seed rule's limit, with the same ratchet.
var baselineMisses = map[string]knownMiss{
	"nolimits-mix1248.yaml": {whyMix1248, 60.8},
}

// whyMix1248: the miss is measured over seeds 1-16 (make bench-guard), the
// mean times from the same runs' JSON (mean_ms); the best static weights at
// 97% of the load by solving weights.SplitWithin at 0.97 times the true
// load in bestWeightsWithin (a probe, not shipped); the weights' settling
// was traced with --trace optimizer.
const whyMix1248 = "the median misses by 1.2%: the rule is on the p99, the promise on the mean, and on the mean the engine is within 0.4% of the best static weights (14.51 against 14.46 ms); those weights themselves reach 59.6 ms, 0.6% under the limit, for the p99 rewards leaning further than the mean's optimum (solved at 97% of the true load they give 58.6 ms, the mean 0.1% longer; the engine before the rewrite leaned so, 58.2 ms), so the rule needs estimates that cost the p99 under 0.6%: the weights written while they settle cost 2%, kept by the publish bar the noisiest cores estimate sets (4-core pods on 16-core nodes whose neighbours' CPU strays by 10%)"

// GuardCheck is one rule on one scenario.
type GuardCheck struct {
	Rule, Scenario string
	Value, Limit   float64
	Unit           string // "x" or "ms"
	Miss           string // known not to hold: why
	// MissBound is what a known miss is held to instead of Limit
	// (knownMiss.bound).
	MissBound float64
}

func (g GuardCheck) Holds() bool { return g.Value <= g.Limit }

// Fails reports whether the guard fails on g: it does not hold, and it is
// not a known miss within its ratchet.
func (g GuardCheck) Fails() bool {
	return !g.Holds() && (g.Miss == "" || g.Value > g.MissBound)
}

func (g GuardCheck) format(v float64) string {
	if g.Unit == "ms" {
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.3fx", v)
}

// guardStrategies are the strategies the guard needs on file.
func guardStrategies(file string) []string {
	s := []string{"optimizer", "oracle_best"}
	if isCold(file) {
		return append(s, "wrr_oracle", "lr")
	}
	return append(s, "oracle_bounded")
}

// Baseline is the optimizer's p99 per scenario and seed, recorded from an
// engine the guard must not fall behind (make bench-baseline).
type Baseline struct {
	Note string `json:"note"`
	// P99Ms[file][seed] in milliseconds.
	P99Ms map[string]map[string]float64 `json:"p99_ms"`
}

func loadBaseline(path string) (*Baseline, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out Baseline
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &out, nil
}

// baselineOf records the optimizer's p99 of every run of m.
func baselineOf(m *Matrix) *Baseline {
	b := &Baseline{
		Note:  "the optimizer's p99 (ms) per scenario and seed; regenerate with make bench-baseline",
		P99Ms: map[string]map[string]float64{},
	}
	for _, f := range m.Files {
		b.P99Ms[f] = map[string]float64{}
		for k, seed := range m.Seeds {
			if r, ok := m.Runs[f][k]["optimizer"]; ok {
				b.P99Ms[f][fmt.Sprint(seed)] = math.Round(r.P99Ms*1000) / 1000
			}
		}
	}
	return b
}

func (b *Baseline) write(path string) error {
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(out, '\n'), 0o644)
}

// guardChecks evaluates the guard on m; base may be nil (no baseline rule).
// An error names what is missing (a seed or scenario the baseline lacks).
func guardChecks(m *Matrix, base *Baseline) ([]GuardCheck, error) {
	var out []GuardCheck
	for _, f := range m.Files {
		sc, err := LoadScenario(filepath.Join(m.Dir, f))
		if err != nil {
			return nil, err
		}
		for k, r := range m.Runs[f] {
			for _, s := range guardStrategies(f) {
				if _, ok := r[s]; !ok {
					return nil, fmt.Errorf("%s on seed %d has no %s run (a matrix recorded before the guard needed it?): run it again", f, m.Seeds[k], s)
				}
			}
		}
		opt := m.values(f, p99Of("optimizer"))
		if isCold(f) {
			ratio := m.values(f, p99Ratio("optimizer", "wrr_oracle"))
			out = append(out, GuardCheck{Rule: "optimizer p99 from opt-in / wrr_oracle, median", Scenario: f,
				Value: medianOf(ratio), Limit: coldLimit(sc.Load), Unit: "x"})
			if sc.PerMinute {
				worst := m.values(f, worstMinute("optimizer", "lr"))
				out = append(out, GuardCheck{Rule: "optimizer's worst minute / lr's, median", Scenario: f,
					Value: medianOf(worst), Limit: 1, Unit: "x"})
			}
		} else {
			best := m.values(f, p99Of("oracle_best"))
			bounded := m.values(f, p99Of("oracle_bounded"))
			out = append(out,
				GuardCheck{Rule: "optimizer median p99 / oracle_best median p99", Scenario: f,
					Value: medianOf(opt) / medianOf(best), Limit: guardBestRatio, Unit: "x", Miss: bestMisses[f].why, MissBound: bestMisses[f].bound(guardBestRatio)},
				GuardCheck{Rule: "optimizer median p99 / oracle_bounded median p99", Scenario: f,
					Value: medianOf(opt) / medianOf(bounded), Limit: guardBestRatio, Unit: "x"})
		}
		if base == nil || isCold(f) {
			continue
		}
		var was []float64
		for _, seed := range m.Seeds {
			v, ok := base.P99Ms[f][fmt.Sprint(seed)]
			if !ok {
				return nil, fmt.Errorf("the baseline has no p99 for %s on seed %d: run make bench-baseline", f, seed)
			}
			was = append(was, v)
		}
		miss := baselineMisses[f]
		medianLimit, worstLimit := guardMedianSlack*medianOf(was), guardWorstSlack*worstOf(was)
		out = append(out,
			GuardCheck{Rule: "optimizer median p99 against the baseline's +3%", Scenario: f,
				Value: medianOf(opt), Limit: medianLimit, Unit: "ms", Miss: miss.why, MissBound: miss.bound(medianLimit)},
			GuardCheck{Rule: "optimizer worst-seed p99 against the baseline's +10%", Scenario: f,
				Value: worstOf(opt), Limit: worstLimit, Unit: "ms", Miss: miss.why, MissBound: worstLimit * guardMedianSlack})
	}
	return out, nil
}

// medianTargets evaluates the targets on the medians over the seeds of m
// (a target needs its scenario and all its strategies in m).
func medianTargets(m *Matrix, targets []Target) []TargetResult {
	var out []TargetResult
	for _, tg := range targets {
		runs, ok := m.Runs[tg.Scenario]
		if !ok || !slices.ContainsFunc(runs, func(r map[string]StrategyResult) bool { return hasAll(r, tg.Strategies) }) {
			continue
		}
		var vs []float64
		for _, r := range runs {
			if hasAll(r, tg.Strategies) {
				vs = append(vs, tg.Value(r))
			}
		}
		out = append(out, TargetResult{Target: tg, Value: medianOf(vs)})
	}
	return out
}

func hasAll(r map[string]StrategyResult, names []string) bool {
	for _, n := range names {
		if _, ok := r[n]; !ok {
			return false
		}
	}
	return true
}

// targetStrategies are the strategies the targets need on file.
func targetStrategies(targets []Target, file string) []string {
	var out []string
	for _, tg := range targets {
		if tg.Scenario != file {
			continue
		}
		for _, s := range tg.Strategies {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// guardColumns are writeGuard's columns, by rule.
var guardColumns = []struct{ rule, title string }{
	{"optimizer median p99 / oracle_best median p99", "median p99 / `oracle_best`'s (≤ 1.1x)"},
	{"optimizer median p99 / oracle_bounded median p99", "median p99 / `oracle_bounded`'s (≤ 1.1x)"},
	{"optimizer median p99 against the baseline's +3%", "median p99 (≤ baseline +3%)"},
	{"optimizer worst-seed p99 against the baseline's +10%", "worst seed's p99 (≤ baseline +10%)"},
	{"optimizer p99 from opt-in / wrr_oracle, median", "cold: p99 from opt-in / `wrr_oracle`'s, median (≤ 1.3x at 0.8 load, 1.5x at 0.9)"},
	{"optimizer's worst minute / lr's, median", "cold: worst minute / `lr`'s, median (≤ 1x)"},
}

// writeGuard prints the guard's checks, one row per scenario, the reasons
// of the known misses below, and the targets on medians.
func writeGuard(w io.Writer, checks []GuardCheck, targets []TargetResult) {
	var scenarios []string
	cell := map[[2]string]GuardCheck{}
	for _, g := range checks {
		if !slices.Contains(scenarios, g.Scenario) {
			scenarios = append(scenarios, g.Scenario)
		}
		cell[[2]string{g.Scenario, g.Rule}] = g
	}
	// The columns of the rules checked (without a baseline, its two are
	// not).
	var columns []struct{ rule, title string }
	for _, c := range guardColumns {
		if slices.ContainsFunc(checks, func(g GuardCheck) bool { return g.Rule == c.rule }) {
			columns = append(columns, c)
		}
	}
	hdr, sep := "| scenario (the optimizer's) |", "|---|"
	for _, c := range columns {
		hdr += " " + c.title + " |"
		sep += "---|"
	}
	fmt.Fprintln(w, hdr)
	fmt.Fprintln(w, sep)
	var reasons []string
	for _, f := range scenarios {
		line := "| " + strings.TrimSuffix(f, ".yaml") + " |"
		for _, c := range columns {
			g, ok := cell[[2]string{f, c.rule}]
			if !ok {
				line += " - |"
				continue
			}
			v := verdict(g.Holds(), g.Miss)
			if g.Miss != "" {
				k := slices.Index(reasons, g.Miss)
				if k < 0 {
					reasons = append(reasons, g.Miss)
					k = len(reasons) - 1
				}
				v = fmt.Sprintf("known miss (%d), held to %s", k+1, g.format(g.MissBound))
				switch {
				case g.Holds():
					v = fmt.Sprintf("yes, a known miss (%d)", k+1)
				case g.Fails():
					v = fmt.Sprintf("no: known miss (%d) past its bound %s", k+1, g.format(g.MissBound))
				}
			}
			limit := ""
			if g.Unit == "ms" {
				limit = " of " + g.format(g.Limit)
			}
			line += fmt.Sprintf(" %s%s: %s |", g.format(g.Value), limit, v)
		}
		fmt.Fprintln(w, line)
	}
	for k, r := range reasons {
		fmt.Fprintf(w, "\n(%d) %s\n", k+1, r)
	}
	if len(targets) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| target (median over the seeds) | value | holds |")
	fmt.Fprintln(w, "|---|---:|---|")
	for _, r := range targets {
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.Target.Name, r.Target.format(r.Value), verdict(r.Target.holds(r.Value), r.Target.Miss))
	}
}

func verdict(holds bool, miss string) string {
	switch {
	case holds && miss != "":
		return "yes (a known miss, held here)"
	case !holds && miss != "":
		return "no (known: " + miss + ")"
	case !holds:
		return "**NO**"
	}
	return "yes"
}

// runGuardMatrix runs what the guard and the targets need on every
// scenario of dir over seeds.
func runGuardMatrix(dir string, seeds []uint64, parallel int) (*Matrix, error) {
	files, err := scenarioFiles(dir)
	if err != nil {
		return nil, err
	}
	return runMatrix(dir, files, func(f string) []string {
		s := guardStrategies(f)
		for _, t := range targetStrategies(Targets, f) {
			if !slices.Contains(s, t) {
				s = append(s, t)
			}
		}
		return s
	}, seeds, parallel)
}
