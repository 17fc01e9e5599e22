package main

import (
	"path/filepath"
	"testing"
)

// TestIssueTargets guards the quality targets of the benchmark (issue 4) on
// the shipped scenarios, so a change of the weight package that loses them
// fails make test. The simulation is seeded and deterministic: these are
// measurements of balancing quality, not of wall-clock speed.
func TestIssueTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("runs five 20-minute simulations (a few seconds)")
	}
	type target struct {
		scenario   string
		strategies []string
		check      func(t *testing.T, r map[string]StrategyResult)
	}
	ratio := func(r map[string]StrategyResult, a, b string) float64 { return r[a].P99Ms / r[b].P99Ms }
	targets := []target{
		{"hetero3-80.yaml", []string{"optimizer", "wrr_oracle", "lr", "cswrr"}, func(t *testing.T, r map[string]StrategyResult) {
			if x := ratio(r, "optimizer", "wrr_oracle"); x > 1.0 {
				t.Errorf("80%% load: optimizer p99 = %.3fx wrr_oracle, want <= 1.0x", x)
			}
			if r["optimizer"].P99Ms >= r["lr"].P99Ms || r["optimizer"].P99Ms >= r["cswrr"].P99Ms {
				t.Errorf("80%% load: optimizer p99 %.1f ms not below lr %.1f and cswrr %.1f", r["optimizer"].P99Ms, r["lr"].P99Ms, r["cswrr"].P99Ms)
			}
		}},
		{"hetero3-90.yaml", []string{"optimizer", "wrr_oracle"}, func(t *testing.T, r map[string]StrategyResult) {
			if x := ratio(r, "optimizer", "wrr_oracle"); x > 1.2 {
				t.Errorf("90%% load: optimizer p99 = %.3fx wrr_oracle, want <= 1.2x", x)
			}
		}},
		{"hetero3-60.yaml", []string{"optimizer", "wrr_oracle"}, func(t *testing.T, r map[string]StrategyResult) {
			if x := ratio(r, "optimizer", "wrr_oracle"); x > 1.05 || x < 0.95 {
				t.Errorf("60%% load: optimizer p99 = %.3fx wrr_oracle, want within 5%%", x)
			}
		}},
		{"homogeneous.yaml", []string{"optimizer", "wrr_oracle"}, func(t *testing.T, r map[string]StrategyResult) {
			if x := ratio(r, "optimizer", "wrr_oracle"); x > 1.05 || x < 0.95 {
				t.Errorf("homogeneous: optimizer p99 = %.3fx wrr_oracle, want within 5%%", x)
			}
		}},
		{"slowdown.yaml", []string{"optimizer", "wrr_oracle"}, func(t *testing.T, r map[string]StrategyResult) {
			o, w := r["optimizer"].P99AfterMs, r["wrr_oracle"].P99AfterMs
			if o == nil || w == nil {
				t.Fatalf("no p99 after the event: %+v", r)
			}
			if x := *o / *w; x > 1.3 {
				t.Errorf("slowdown: optimizer p99 after the change = %.3fx the oracle's, want <= 1.3x", x)
			}
		}},
	}
	var scs []*Scenario
	for _, tg := range targets {
		sc, err := LoadScenario(filepath.Join("scenarios", tg.scenario))
		if err != nil {
			t.Fatalf("%s: %v", tg.scenario, err)
		}
		sc.Strategies = tg.strategies
		scs = append(scs, sc)
	}
	results := RunAll(scs, 2)
	for i, tg := range targets {
		t.Run(tg.scenario, func(t *testing.T) {
			byName := map[string]StrategyResult{}
			for _, r := range results[i] {
				byName[r.Name] = r
			}
			for _, s := range tg.strategies {
				if _, ok := byName[s]; !ok {
					t.Fatalf("strategy %s did not run", s)
				}
			}
			tg.check(t, byName)
			t.Logf("optimizer p99 %.1f ms, wrr_oracle p99 %.1f ms", byName["optimizer"].P99Ms, byName["wrr_oracle"].P99Ms)
		})
	}
}
