package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
)

// Random scenarios: Services this repository does not ship, drawn from a
// seed, so that the engine is judged on mixes nobody tuned it on (make
// bench-random; docs/random-scenarios.md). Each draw is a Service as the
// field has them, in the ranges the shipped scenarios and probes leave
// apart:
//
//   - 2 to 5 hardware classes, each of 1, 2, 3, 4 or 6 pods of 1, 2, 4 or
//     8 cores (2 and 4 twice as likely: the common request sizes) at a
//     speed per core of 0.3 to 1.0 (three CPU generations and noisy
//     neighbours span about that), each class in its own zone;
//   - in two draws of five, no CPU limits, each class on nodes of one or
//     two times its cores (a node to itself, or shared with as much other
//     work);
//   - a load of 20-70% or of 70-95% of the capacity, either half the time;
//   - 4 to 256 client sidecars (powers of two: a gateway's few replicas to
//     a large mesh);
//   - request work exponential of 10 ms or 50 ms mean, or lognormal of
//     5 ms (sigma 0.5) or 20 ms (sigma 1, heavy-tailed);
//   - in two draws of five, opted in at 5 minutes on a live Service (a
//     `-cold` file, judged from the opt-in as the shipped cold scenarios
//     are, per minute against `lr`); else opted in from the start;
//   - 15 minutes of arrivals, measured after 5, a 30 s cycle.
//
// The files name the draw (r00, r01, ...) and carry their own seed; the
// guard runs them over its own seeds. A draw may be one no weights can
// serve (a pod smaller than the weight floor): the guard shows it as any
// other miss.

// randomScenario draws scenario k from r as a YAML document, and whether
// it opts in on a live Service (a cold file).
func randomScenario(r *rand.Rand, k int) (doc string, cold bool) {
	classes := []int{2, 3, 3, 4, 5}[r.IntN(5)]
	noLimit := r.Float64() < 0.4
	var b strings.Builder
	fmt.Fprintf(&b, "name: r%02d\n", k)
	fmt.Fprintf(&b, "description: a random draw (make bench-random), not a shipped scenario\n")
	fmt.Fprintf(&b, "pods:\n")
	for c := range classes {
		cores := []int{1, 2, 2, 4, 4, 8}[r.IntN(6)]
		speed := 0.3 + 0.7*r.Float64()
		count := []int{1, 2, 3, 4, 6}[r.IntN(5)]
		fmt.Fprintf(&b, "  - {name: c%d, count: %d, cores: %d, speed: %.2f, hardware_class: h%d, locality: region/zone-%c/",
			c, count, cores, speed, c, 'a'+rune(c%3))
		if noLimit {
			fmt.Fprintf(&b, ", no_limit: true, node_cores: %d", cores*(1+r.IntN(2)))
		}
		b.WriteString("}\n")
	}
	load := 0.2 + 0.5*r.Float64()
	if r.IntN(2) == 1 {
		load = 0.7 + 0.25*r.Float64()
	}
	clients := 4 << r.IntN(7)
	work := []string{
		"{distribution: exponential, mean: 10ms}",
		"{distribution: lognormal, mean: 20ms, sigma: 1}",
		"{distribution: exponential, mean: 50ms}",
		"{distribution: lognormal, mean: 5ms, sigma: 0.5}",
	}[r.IntN(4)]
	cold = r.Float64() < 0.4
	fmt.Fprintf(&b, "clients: %d\nload: %.2f\nduration: 15m\nwarmup: 5m\ncycle: 30s\nwork: %s\nseed: %d\n",
		clients, load, work, 1+r.IntN(1000))
	if cold {
		b.WriteString("opt_in: 5m\nper_minute: true\n")
	}
	return b.String(), cold
}

// writeRandomScenarios writes n draws from seed into dir, one file each:
// rNN.yaml, or rNN-cold.yaml for a draw that opts in on a live Service.
func writeRandomScenarios(dir string, seed uint64, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(seed, 0x72616e646f6d)) // "random": any fixed stream
	for k := range n {
		doc, cold := randomScenario(r, k)
		name := fmt.Sprintf("r%02d.yaml", k)
		if cold {
			name = fmt.Sprintf("r%02d-cold.yaml", k)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// runRandom draws n scenarios from seed, runs the guard's strategies on
// them over seeds, and prints the guard's table (no baseline: no engine
// ran them before) with a count of the rules that hold; with doc not
// empty it also writes them as Markdown there.
func runRandom(w io.Writer, n int, seed uint64, seeds []uint64, parallel int, doc string) error {
	dir, err := os.MkdirTemp("", "bench-random-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := writeRandomScenarios(dir, seed, n); err != nil {
		return err
	}
	m, err := runGuardMatrix(dir, seeds, parallel)
	if err != nil {
		return err
	}
	checks, err := guardChecks(m, nil)
	if err != nil {
		return err
	}
	var table strings.Builder
	writeGuard(&table, checks, nil)
	summary := randomSummary(checks) + "\n" + calmSummary(m)
	fmt.Fprintf(w, "%s\n%s", summary, table.String())
	if doc == "" {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, randomDocHead, n, seed, seedList(seeds), n, seed, seedList(seeds))
	fmt.Fprintf(&b, "%s\n%s", summary, table.String())
	return os.WriteFile(doc, []byte(b.String()), 0o644)
}

// randomSummary counts, per rule, the draws on which it holds.
func randomSummary(checks []GuardCheck) string {
	held, all := map[string]int{}, map[string]int{}
	for _, g := range checks {
		all[g.Rule]++
		if g.Holds() {
			held[g.Rule]++
		}
	}
	var b strings.Builder
	fmt.Fprintln(&b, "| rule | draws on which it holds |")
	fmt.Fprintln(&b, "|---|---:|")
	for _, c := range guardColumns {
		if all[c.rule] > 0 {
			fmt.Fprintf(&b, "| %s | %d of %d |\n", c.title, held[c.rule], all[c.rule])
		}
	}
	return b.String()
}

// calmSummary counts the runs (draws times seeds) whose control plane was
// not calm: a weight write after the weights settled (the first cycle
// from which every share stays within 5% of its last), and more than two
// policy switches, and names the draws.
func calmSummary(m *Matrix) string {
	var runs, late, switches int
	var lateIn, switchIn []string
	for _, f := range m.Files {
		name := strings.TrimSuffix(f, ".yaml")
		l, s := 0, 0
		for _, r := range m.Runs[f] {
			o, ok := r["optimizer"]
			if !ok {
				continue
			}
			runs++
			if o.WritesAfterSettled > 0 {
				l++
			}
			if o.PolicySwitches > 2 {
				s++
			}
		}
		late, switches = late+l, switches+s
		if l > 0 {
			lateIn = append(lateIn, fmt.Sprintf("%s (%d)", name, l))
		}
		if s > 0 {
			switchIn = append(switchIn, fmt.Sprintf("%s (%d)", name, s))
		}
	}
	none := func(xs []string) string {
		if len(xs) == 0 {
			return "none"
		}
		return strings.Join(xs, ", ")
	}
	var b strings.Builder
	fmt.Fprintln(&b, "| the optimizer's runs (draws times seeds) | runs | in the draws (runs) |")
	fmt.Fprintln(&b, "|---|---:|---|")
	fmt.Fprintf(&b, "| a weight write after the weights settled | %d of %d | %s |\n", late, runs, none(lateIn))
	fmt.Fprintf(&b, "| more than two policy switches | %d of %d | %s |\n", switches, runs, none(switchIn))
	return b.String()
}

const randomDocHead = `# Random scenarios

Generated by ` + "`make bench-random`" + ` (%d draws from seed %d, each run on seeds %s):
do not edit. The engine is tuned on none of these Services: they are drawn
at random, in the ranges ` + "`test/bench/random.go`" + ` states (2-5 hardware
classes of 1-8 cores at 0.3-1.0 of a reference core's speed, two in five
without CPU limits, 20-95%% load, 4-256 client sidecars, light and
heavy-tailed request times, two in five opted in on a live Service), and
judged by the rules of the shipped scenarios' guard
([benchmarks.md](benchmarks.md), "Regression guard") without a baseline:
the median p99 within 1.1x of the best static weights' (` + "`oracle_best`" + `),
and of the same weights clamped to ` + "`max_weight_ratio`" + ` of the mean as the
engine clamps its own (` + "`oracle_bounded`" + `, so that this rule measures what
the estimates cost); for a draw opted
in on a live Service (` + "`-cold`" + `), its p99 from the opt-in against the
capacity oracle's and its worst minute against ` + "`lr`" + `'s. The second
table counts the runs whose control plane was not calm. Another seed
(` + "`make bench-random RANDOM=%d RANDOM_SEED=...`" + `) draws other
Services; the figures below are for seed %d over seeds %s.

A miss here is what the engine does on a Service nobody tuned it for, not
a failed test. The kinds seen so far:

- at low load, slow pods held at the least weight ` + "`max_weight_ratio`" + `
  allows (the mean over the ratio: a twentieth of it by default)
  where the best static weights send them nothing (the rule against
  ` + "`oracle_bounded`" + ` shows how much of a miss is that floor's);
- a pod smaller than that least weight: no weight the ratio allows serves
  it, and it is reported as ` + "`Degraded/WeightFloorOverload`" + `;
- a Service where Envoy's least request beats any static weights, the
  capacity oracle's and the best ones included: few client sidecars, or
  heavy-tailed requests near full load, where chance queues under
  ` + "`ROUND_ROBIN`" + ` also start spells of ` + "`LEAST_REQUEST`" + ` (two switches each);
  past the utilisation cap the policy runs ` + "`LEAST_REQUEST`" + ` itself
  (` + "`AtCapacity`" + `), and below it ` + "`load_balancer: LEAST_REQUEST`" + ` keeps the
  weights and is often the better choice there, less so where the pods'
  cores differ widely (README, "Load balancer");
- weights written from the first estimates that the publish bar then holds
  for minutes, because the bar is set by the noise of the one pod whose
  estimate costs most ([troubleshooting.md](troubleshooting.md), "Weights
  are not moving", ` + "`Steady`" + `).
- a load a few percent under the utilisation cap, opted in from equal
  weights that had queued the small pods: the load's estimate keeps the
  work of those queues for minutes and reads the load past the cap, so the
  Service runs capacity shares under ` + "`LEAST_REQUEST`" + ` (` + "`AtCapacity`" + `) where
  the best static weights fill many-core pods fuller
  ([troubleshooting.md](troubleshooting.md), "` + "`AtCapacity`" + ` for minutes
  after opting in"); further under the cap, the same estimate makes the
  weights lean too little for those minutes.

`
