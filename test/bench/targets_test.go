package main

import (
	"testing"
)

// guardSeeds are the seeds TestIssueTargets runs every target on; make
// bench --targets (docs/benchmarks.md) reports eight.
var guardSeeds = []uint64{1, 2, 3}

// TestIssueTargets guards the quality targets of the benchmark (issues 4
// and 10, the Targets table) on the shipped scenarios, so that a change of
// the weight package that loses one fails make test. Targets known not to
// hold (Target.Miss) are measured and logged, not asserted. The
// simulation is seeded and deterministic: these are measurements of
// balancing quality, not of wall-clock speed.
func TestIssueTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("runs about a hundred 20-minute simulations (about a minute of CPU per seed)")
	}
	var guarded []Target
	for _, tg := range Targets {
		if tg.Miss == "" {
			guarded = append(guarded, tg)
		}
	}
	results, err := evaluateTargets("scenarios", guarded, guardSeeds, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Target.holds(r.Value) {
			t.Logf("holds, margin %+5.1f%%: seed %d: %s: %s", 100*r.Target.margin(r.Value), r.Seed, r.Target.Name, r.Target.format(r.Value))
			continue
		}
		t.Errorf("MISSED by %.1f%%: seed %d: %s: %s", -100*r.Target.margin(r.Value), r.Seed, r.Target.Name, r.Target.format(r.Value))
	}
	for _, tg := range Targets {
		if tg.Miss != "" {
			t.Logf("not guarded (known miss): %s: %s", tg.Name, tg.Miss)
		}
	}
}
