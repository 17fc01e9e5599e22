package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The random draws are valid scenarios, the same for one seed, other for
// another, and cover what random.go says they do.
func TestRandomScenarios(t *testing.T) {
	const n = 60
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	for dir, seed := range map[string]uint64{a: 1, b: 1, c: 2} {
		if err := writeRandomScenarios(dir, seed, n); err != nil {
			t.Fatal(err)
		}
	}
	files, err := scenarioFiles(a)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != n {
		t.Fatalf("%d files, want %d", len(files), n)
	}
	var cold, noLimit, high, low int
	differs := false
	for _, f := range files {
		one, err := os.ReadFile(filepath.Join(a, f))
		if err != nil {
			t.Fatal(err)
		}
		if two, err := os.ReadFile(filepath.Join(b, f)); err != nil || !bytes.Equal(one, two) {
			t.Errorf("%s: seed 1 drew it differently the second time (%v)", f, err)
		}
		if other, err := os.ReadFile(filepath.Join(c, f)); err != nil || !bytes.Equal(one, other) {
			differs = true
		}
		sc, err := LoadScenario(filepath.Join(a, f))
		if err != nil {
			t.Fatalf("a draw is no valid scenario: %v", err)
		}
		if isCold(f) != (sc.OptIn.Duration > 0) || isCold(f) != sc.PerMinute {
			t.Errorf("%s: the file name and the opt-in disagree", f)
		}
		if isCold(f) {
			cold++
		}
		if sc.Pods[0].NoLimit {
			noLimit++
		}
		if sc.Load < 0.2 || sc.Load > 0.95 || len(sc.Pods) < 2 || len(sc.Pods) > 5 || sc.Clients < 4 || sc.Clients > 256 {
			t.Errorf("%s: outside the stated ranges: load %v, %d classes, %d clients", f, sc.Load, len(sc.Pods), sc.Clients)
		}
		if sc.Load >= 0.7 {
			high++
		} else {
			low++
		}
		if !strings.HasPrefix(sc.Name, "r") {
			t.Errorf("%s: named %q", f, sc.Name)
		}
	}
	if !differs {
		t.Error("seed 2 drew the same scenarios as seed 1")
	}
	// Two in five of each kind, and both load ranges: far from none or all
	// in 60 draws.
	for what, k := range map[string]int{"opted in on a live Service": cold, "without CPU limits": noLimit, "at 70% load or more": high, "below 70% load": low} {
		if k < n/10 || k > n-n/10 {
			t.Errorf("%d of %d draws %s", k, n, what)
		}
	}
}
