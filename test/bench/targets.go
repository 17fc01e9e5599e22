package main

import (
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
)

// Target is one quality goal on one shipped scenario: Value of the run must
// lie in [Min, Max]. Targets known not to hold say why in Miss; they are
// measured and printed, not asserted.
type Target struct {
	Name       string
	Scenario   string   // file in test/bench/scenarios
	Strategies []string // strategies the value needs
	Value      func(r map[string]StrategyResult) float64
	Min, Max   float64
	Unit       string // "x" (a ratio) or "ms"
	Miss       string
}

func p99Ratio(a, b string) func(map[string]StrategyResult) float64 {
	return func(r map[string]StrategyResult) float64 { return r[a].P99Ms / r[b].P99Ms }
}

func afterRatio(a, b string) func(map[string]StrategyResult) float64 {
	return func(r map[string]StrategyResult) float64 {
		if r[a].P99AfterMs == nil || r[b].P99AfterMs == nil {
			return math.NaN()
		}
		return *r[a].P99AfterMs / *r[b].P99AfterMs
	}
}

func p999After(a string) func(map[string]StrategyResult) float64 {
	return func(r map[string]StrategyResult) float64 {
		if r[a].P999AfterMs == nil {
			return math.NaN()
		}
		return *r[a].P999AfterMs
	}
}

// worstMinute is the largest ratio of a's p99 to b's over the minutes.
func worstMinute(a, b string) func(map[string]StrategyResult) float64 {
	return func(r map[string]StrategyResult) float64 {
		x, y := r[a].P99PerMinuteMs, r[b].P99PerMinuteMs
		if len(x) == 0 || len(x) != len(y) {
			return math.NaN()
		}
		worst := 0.0
		for m := range x {
			worst = max(worst, x[m]/y[m])
		}
		return worst
	}
}

// whyWRRSlowdown is why p99.9 after a sudden slowdown under ROUND_ROBIN
// is measured, not asserted (the target is withdrawn for ROUND_ROBIN).
const whyWRRSlowdown = "withdrawn under ROUND_ROBIN: the slowed pod is sent 3x what it serves until a scrape shows its latency, 5-20 s after the change by the scrapes' phase, and the requests queued at it before then set the p99.9 (about 1 s where the first scrape after the change shows it, 7-23 s where it comes 10-20 s later); only a queue-aware balancer (optimizer_lr) avoids that queue"

// Targets are issue 4's and issue 10's goals, judged on their medians
// over seeds by TestIssueTargets.
var Targets = []Target{
	{Name: "hetero3-80: optimizer p99 ≤ 1.0x wrr_oracle", Scenario: "hetero3-80.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.0, Unit: "x"},
	{Name: "hetero3-80: optimizer p99 below lr and cswrr", Scenario: "hetero3-80.yaml",
		Strategies: []string{"optimizer", "lr", "cswrr"}, Unit: "x", Max: 0.999,
		Value: func(r map[string]StrategyResult) float64 {
			return r["optimizer"].P99Ms / min(r["lr"].P99Ms, r["cswrr"].P99Ms)
		}},
	{Name: "hetero3-90: optimizer p99 ≤ 1.2x wrr_oracle", Scenario: "hetero3-90.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.2, Unit: "x"},
	// Below full load the best static weights are not capacity shares
	// (they lean to faster pods), so these are judged against oracle_best;
	// weights that react to the run may beat any static weights, so there
	// is no lower bound.
	{Name: "hetero3-60: optimizer p99 ≤ 1.05x oracle_best", Scenario: "hetero3-60.yaml",
		Strategies: []string{"optimizer", "oracle_best"}, Value: p99Ratio("optimizer", "oracle_best"), Max: 1.05, Unit: "x"},
	{Name: "homogeneous: optimizer p99 ≤ 1.05x oracle_best", Scenario: "homogeneous.yaml",
		Strategies: []string{"optimizer", "oracle_best"}, Value: p99Ratio("optimizer", "oracle_best"), Max: 1.05, Unit: "x"},
	{Name: "slowdown: optimizer p99 after the change ≤ 1.3x the oracle's", Scenario: "slowdown.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: afterRatio("optimizer", "wrr_oracle"), Max: 1.3, Unit: "x"},
	{Name: "slowdown: optimizer p99 after the change ≤ 1.1x the oracle's", Scenario: "slowdown.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: afterRatio("optimizer", "wrr_oracle"), Max: 1.1, Unit: "x"},
	{Name: "slowdown: optimizer p99.9 after the change ≤ 2 s", Scenario: "slowdown.yaml",
		Strategies: []string{"optimizer"}, Value: p999After("optimizer"), Max: 2000, Unit: "ms", Miss: whyWRRSlowdown},
	{Name: "slowdown: optimizer_lr p99 after the change ≤ 1.1x the oracle's", Scenario: "slowdown.yaml",
		Strategies: []string{"optimizer_lr", "wrr_oracle"}, Value: afterRatio("optimizer_lr", "wrr_oracle"), Max: 1.1, Unit: "x"},
	{Name: "slowdown: optimizer_lr p99.9 after the change ≤ 2 s", Scenario: "slowdown.yaml",
		Strategies: []string{"optimizer_lr"}, Value: p999After("optimizer_lr"), Max: 2000, Unit: "ms"},
	{Name: "slowdown: optimizer_cpu p99 after the change ≤ 3x the oracle's", Scenario: "slowdown.yaml",
		Strategies: []string{"optimizer_cpu", "wrr_oracle"}, Value: afterRatio("optimizer_cpu", "wrr_oracle"), Max: 3, Unit: "x"},
	{Name: "hetero3-80-cold: optimizer p99 from opt-in ≤ 1.3x wrr_oracle", Scenario: "hetero3-80-cold.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.3, Unit: "x"},
	{Name: "hetero3-80-cold: optimizer p99 no worse than lr in any minute", Scenario: "hetero3-80-cold.yaml",
		Strategies: []string{"optimizer", "lr"}, Value: worstMinute("optimizer", "lr"), Max: 1.0, Unit: "x"},
	{Name: "hetero3-90-cold: optimizer p99 from opt-in ≤ 1.5x wrr_oracle", Scenario: "hetero3-90-cold.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.5, Unit: "x"},
	{Name: "hetero3-90-cold: optimizer p99 no worse than lr in any minute", Scenario: "hetero3-90-cold.yaml",
		Strategies: []string{"optimizer", "lr"}, Value: worstMinute("optimizer", "lr"), Max: 1.0, Unit: "x"},
	{Name: "hetero3-20-lowload: optimizer p99 ≤ 0.85x wrr_oracle", Scenario: "hetero3-20-lowload.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 0.85, Unit: "x"},
	{Name: "nolimits-4class: optimizer p99 ≤ 1.1x wrr_oracle", Scenario: "nolimits-4class.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.1, Unit: "x"},
	{Name: "nolimits-4class: optimizer_cpu p99 ≤ 1.1x wrr_oracle", Scenario: "nolimits-4class.yaml",
		Strategies: []string{"optimizer_cpu", "wrr_oracle"}, Value: p99Ratio("optimizer_cpu", "wrr_oracle"), Max: 1.1, Unit: "x"},
	{Name: "nolimits-mix1248: optimizer p99 ≤ 1.1x wrr_oracle", Scenario: "nolimits-mix1248.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.1, Unit: "x"},
	{Name: "nolimits-mix1248: optimizer_cpu p99 ≤ 1.1x wrr_oracle", Scenario: "nolimits-mix1248.yaml",
		Strategies: []string{"optimizer_cpu", "wrr_oracle"}, Value: p99Ratio("optimizer_cpu", "wrr_oracle"), Max: 1.1, Unit: "x"},
	{Name: "hetero3-80-nolimits: optimizer p99 ≤ 1.0x wrr_oracle", Scenario: "hetero3-80-nolimits.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.0, Unit: "x"},
	{Name: "hetero3-90-nolimits: optimizer p99 ≤ 1.0x wrr_oracle", Scenario: "hetero3-90-nolimits.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.0, Unit: "x"},
	{Name: "hetero3-80-nolimits: optimizer_cpu p99 ≤ 1.0x wrr_oracle", Scenario: "hetero3-80-nolimits.yaml",
		Strategies: []string{"optimizer_cpu", "wrr_oracle"}, Value: p99Ratio("optimizer_cpu", "wrr_oracle"), Max: 1.0, Unit: "x"},
	{Name: "hetero3-90-nolimits: optimizer_cpu p99 ≤ 1.0x wrr_oracle", Scenario: "hetero3-90-nolimits.yaml",
		Strategies: []string{"optimizer_cpu", "wrr_oracle"}, Value: p99Ratio("optimizer_cpu", "wrr_oracle"), Max: 1.0, Unit: "x"},
	// Without node CPU data: request rates and latency still show the
	// cores; CPU alone shows nothing, and must then be no worse than
	// what the Service had before (LEAST_REQUEST).
	{Name: "nolimits-mix1248-nonodecpu: optimizer p99 ≤ 1.1x wrr_oracle", Scenario: "nolimits-mix1248-nonodecpu.yaml",
		Strategies: []string{"optimizer", "wrr_oracle"}, Value: p99Ratio("optimizer", "wrr_oracle"), Max: 1.1, Unit: "x"},
	{Name: "nolimits-mix1248-nonodecpu: optimizer_cpu p99 no worse than lr", Scenario: "nolimits-mix1248-nonodecpu.yaml",
		Strategies: []string{"optimizer_cpu", "lr"}, Value: p99Ratio("optimizer_cpu", "lr"), Max: 1.0, Unit: "x"},
}

// holds reports whether v meets the target.
func (tg Target) holds(v float64) bool { return v <= tg.Max && v >= tg.Min }

func (tg Target) format(v float64) string {
	if tg.Unit == "ms" {
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.3fx", v)
}

// targetRuns loads every scenario the targets need once per seed, with
// the union of the strategies they need, and the file of each. seed 0
// keeps the file's seed.
func targetRuns(dir string, targets []Target, seeds []uint64) ([]*Scenario, []string, error) {
	var files []string
	strategies := map[string][]string{}
	for _, tg := range targets {
		if !slices.Contains(files, tg.Scenario) {
			files = append(files, tg.Scenario)
		}
		for _, s := range tg.Strategies {
			if !slices.Contains(strategies[tg.Scenario], s) {
				strategies[tg.Scenario] = append(strategies[tg.Scenario], s)
			}
		}
	}
	var scs []*Scenario
	var from []string
	for _, seed := range seeds {
		for _, f := range files {
			sc, err := LoadScenario(filepath.Join(dir, f))
			if err != nil {
				return nil, nil, err
			}
			if seed != 0 {
				sc.Seed = seed
				sc.Name = fmt.Sprintf("%s-s%d", sc.Name, seed)
			}
			sc.Strategies = strategies[f]
			scs = append(scs, sc)
			from = append(from, f)
		}
	}
	return scs, from, nil
}

// TargetResult is one target measured on one seed.
type TargetResult struct {
	Target Target
	Seed   uint64
	Value  float64
}

// evaluateTargets runs the targets on the seeds and returns one result per
// target and seed, in target order then seed order.
func evaluateTargets(dir string, targets []Target, seeds []uint64, parallel int) ([]TargetResult, error) {
	scs, from, err := targetRuns(dir, targets, seeds)
	if err != nil {
		return nil, err
	}
	results := RunAll(scs, parallel)
	perSeed := len(scs) / len(seeds)
	bySeed := make([][]TargetResult, len(seeds))
	for k, seed := range seeds {
		block := k * perSeed
		bySeed[k] = targetsOf(targets, from[block:block+perSeed], results[block:block+perSeed])
		for j := range bySeed[k] {
			bySeed[k][j].Seed = seed
		}
	}
	// Target order, then seed order (every seed ran the same files).
	var out []TargetResult
	for j := range bySeed[0] {
		for k := range seeds {
			out = append(out, bySeed[k][j])
		}
	}
	return out, nil
}

// targetsOf measures the targets whose scenario file was run (matched by
// file name) with every strategy they need, from results[i], the run of
// files[i].
func targetsOf(targets []Target, files []string, results [][]StrategyResult) []TargetResult {
	var out []TargetResult
	for _, tg := range targets {
		for i, f := range files {
			if filepath.Base(f) != tg.Scenario {
				continue
			}
			byName := map[string]StrategyResult{}
			for _, r := range results[i] {
				byName[r.Name] = r
			}
			complete := true
			for _, s := range tg.Strategies {
				_, ok := byName[s]
				complete = complete && ok
			}
			if complete {
				out = append(out, TargetResult{Target: tg, Value: tg.Value(byName)})
			}
		}
	}
	return out
}

// writeTargets prints one row per target, one column per seed. Over more
// than one seed a last column holds the median, and the verdict is the
// median's, as TestIssueTargets judges; over one, that seed's.
func writeTargets(w io.Writer, rs []TargetResult, seeds []uint64) {
	multi := len(seeds) > 1
	hdr, sep := "| target |", "|---|"
	for _, s := range seeds {
		sep += "---|"
		if s == 0 {
			hdr += " file's seed |"
			continue
		}
		hdr += fmt.Sprintf(" seed %d |", s)
	}
	if multi {
		hdr, sep = hdr+" median |", sep+"---|"
	}
	fmt.Fprintln(w, hdr+" holds |")
	fmt.Fprintln(w, sep+"---|")
	for i := 0; i < len(rs); i += len(seeds) {
		tg := rs[i].Target
		line := "| " + tg.Name + " |"
		var values []float64
		for _, r := range rs[i : i+len(seeds)] {
			line += " " + tg.format(r.Value) + " |"
			values = append(values, r.Value)
		}
		judged := values[0]
		if multi {
			judged = medianOf(values)
			line += " " + tg.format(judged) + " |"
		}
		held := tg.holds(judged)
		verdict := "yes"
		switch {
		case held && tg.Miss != "":
			verdict = "yes (a known miss, held here)"
		case !held && tg.Miss != "":
			verdict = "no (known: " + tg.Miss + ")"
		case !held:
			verdict = "**NO**"
		}
		fmt.Fprintln(w, line+" "+verdict+" |")
	}
}
