package main

import (
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/test/edf"
)

func mustParse(t *testing.T, y string) *Scenario {
	t.Helper()
	sc, err := ParseScenario([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name == "" {
		sc.Name = t.Name()
	}
	return sc
}

func runSim(t *testing.T, sc *Scenario, name string) (*sim, StrategyResult) {
	t.Helper()
	def, ok := strategyByName(name)
	if !ok {
		t.Fatalf("no strategy %s", name)
	}
	s := newSim(sc, def)
	return s, s.run()
}

// erlangC is the mean sojourn time of an M/M/c queue.
func erlangC(lambda, mu float64, c int) float64 {
	a := lambda / mu
	rho := a / float64(c)
	term, sum := 1.0, 0.0
	for k := 0; k < c; k++ {
		sum += term
		term *= a / float64(k+1)
	}
	// term = a^c/c!
	pc := term / (1 - rho)
	C := pc / (sum + pc)
	return C/(float64(c)*mu-lambda) + 1/mu
}

func TestMMcMatchesErlangC(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cores int
		speed float64
		load  float64
	}{
		{"c2-load0.7", 2, 1, 0.7},
		{"c3-speed0.5-load0.8", 3, 0.5, 0.8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := mustParse(t, `
pods: [{name: p, cores: 1, speed: 1}]
clients: 1
load: 0.5
duration: 3000s
warmup: 100s
work: {mean: 10ms}
seed: 7
strategies: [rr]
`)
			sc.Pods[0].Cores, sc.Pods[0].Speed, sc.Load = tc.cores, tc.speed, tc.load
			_, r := runSim(t, sc, "rr")
			mu := tc.speed / 0.010
			lambda := tc.load * mu * float64(tc.cores)
			want := erlangC(lambda, mu, tc.cores) * 1e3
			if rel := math.Abs(r.MeanMs/want - 1); rel > 0.02 {
				t.Fatalf("mean latency %.3f ms, Erlang-C %.3f ms: off by %.1f%%", r.MeanMs, want, rel*100)
			}
			t.Logf("mean latency %.3f ms, Erlang-C %.3f ms, %d requests", r.MeanMs, want, r.Requests)
		})
	}
}

func TestEDFPickSharesEqualWeightShares(t *testing.T) {
	w := []float64{1, 2, 3, 5, 13, 100, 7}
	var e edf.Scheduler
	for h := range w {
		e.Add(int32(h), w[h])
	}
	total := 0.0
	for _, v := range w {
		total += v
	}
	rounds := 50
	counts := make([]int, len(w))
	for i := 0; i < int(total)*rounds; i++ {
		counts[e.Pick(w)]++
	}
	for h, c := range counts {
		if want := int(w[h]) * rounds; c < want-1 || c > want+1 {
			t.Errorf("host %d (weight %v): %d picks, want %d", h, w[h], c, want)
		}
	}
}

func TestEDFTiesInInsertionOrder(t *testing.T) {
	var e edf.Scheduler
	for h := range 4 {
		e.Add(int32(h), 1)
	}
	w := []float64{1, 1, 1, 1}
	var got []int32
	for range 8 {
		got = append(got, e.Pick(w))
	}
	want := []int32{0, 1, 2, 3, 0, 1, 2, 3}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("picks %v, want %v", got, want)
		}
	}
}

const tinyHetero = `
pods:
  - {name: fast, count: 2, cores: 2, speed: 1.0, hardware_class: gen3}
  - {name: slow, count: 2, cores: 2, speed: 0.4, hardware_class: gen1}
clients: 4
load: 0.7
duration: 150s
warmup: 30s
work: {mean: 10ms}
seed: 3
events:
  - {at: 100s, type: set_speed, pod: fast-1, speed: 0.5}
`

func TestAllStrategiesSeeIdenticalArrivals(t *testing.T) {
	sc := mustParse(t, tinyHetero)
	res := RunAll([]*Scenario{sc}, 2)[0]
	if len(res) != len(strategyDefs) {
		t.Fatalf("%d results", len(res))
	}
	for _, r := range res[1:] {
		if r.Arrivals != res[0].Arrivals || r.ArrivalHash != res[0].ArrivalHash {
			t.Errorf("%s: %d arrivals hash %x; %s: %d arrivals hash %x",
				r.Name, r.Arrivals, r.ArrivalHash, res[0].Name, res[0].Arrivals, res[0].ArrivalHash)
		}
	}
	if res[0].Arrivals == 0 {
		t.Fatal("no arrivals")
	}
	// Deterministic: a second run gives the same numbers.
	again := RunAll([]*Scenario{sc}, 1)[0]
	for i := range res {
		if res[i].P99Ms != again[i].P99Ms || res[i].Publications != again[i].Publications {
			t.Errorf("%s: not deterministic: p99 %v vs %v", res[i].Name, res[i].P99Ms, again[i].P99Ms)
		}
	}
}

func TestRoundRobinSendsEqualCounts(t *testing.T) {
	sc := mustParse(t, `
pods: [{name: a, cores: 1, speed: 1}, {name: b, cores: 1, speed: 0.5}, {name: c, cores: 4, speed: 2}]
clients: 1
load: 0.3
duration: 100s
warmup: 0s
work: {mean: 10ms}
`)
	s, _ := runSim(t, sc, "rr")
	n := s.pods[0].reqs
	for _, p := range s.pods {
		if math.Abs(p.reqs-n) > 1 {
			t.Fatalf("rr counts differ: %v %v %v", s.pods[0].reqs, s.pods[1].reqs, s.pods[2].reqs)
		}
	}
}

func twoPodSim(t *testing.T, strategy string) *sim {
	sc := mustParse(t, `
pods: [{name: a, cores: 1, speed: 1}, {name: b, cores: 1, speed: 0.5}]
clients: 1
load: 0.5
duration: 10s
warmup: 0s
work: {mean: 10ms}
`)
	def, _ := strategyByName(strategy)
	s := newSim(sc, def)
	if s.ctl != nil {
		s.ctl.start(s)
	}
	s.rebuild(0)
	return s
}

func pickShares(s *sim, n int) []float64 {
	counts := make([]float64, s.P)
	for range n {
		counts[s.pick(&s.clients[0], 0)]++
	}
	for i := range counts {
		counts[i] /= float64(n)
	}
	return counts
}

func TestLeastRequestIsPowerOfTwoChoices(t *testing.T) {
	s := twoPodSim(t, "lr")
	s.active[0], s.active[1] = 3, 0 // client 0's own view
	// Pod a is picked only when both samples are a: 1/4.
	if got := pickShares(s, 200000); math.Abs(got[0]-0.25) > 0.01 {
		t.Fatalf("share of the busier pod %.3f, want 0.25", got[0])
	}
	s.active[0], s.active[1] = 1, 1 // ties: first sample wins, 1/2 each
	if got := pickShares(s, 200000); math.Abs(got[0]-0.5) > 0.01 {
		t.Fatalf("share with equal actives %.3f, want 0.5", got[0])
	}
}

func TestOracleWeightsAreCapacity(t *testing.T) {
	s := twoPodSim(t, "wrr_oracle")
	if math.Abs(s.weights[0]/s.weights[1]-2) > 0.005 {
		t.Fatalf("oracle weights %v, want 2:1", s.weights[:2])
	}
	if got := pickShares(s, 30000); math.Abs(got[0]-2.0/3) > 0.001 {
		t.Fatalf("wrr share of the fast pod %.4f, want 0.6667", got[0])
	}
}

func TestWeightedLeastRequestUsesWeightOverActivePlusOne(t *testing.T) {
	s := twoPodSim(t, "wlr_oracle") // weights 2:1
	s.active[0], s.active[1] = 1, 0 // 2/(1+1) = 1/(0+1): equal effective weights
	s.rebuild(0)
	if got := pickShares(s, 30000); math.Abs(got[0]-0.5) > 0.001 {
		t.Fatalf("share %.4f, want 0.5", got[0])
	}
	s.active[0], s.active[1] = 0, 0
	s.rebuild(0)
	if got := pickShares(s, 30000); math.Abs(got[0]-2.0/3) > 0.001 {
		t.Fatalf("share %.4f, want 0.6667", got[0])
	}
}

func TestCSWRRBlackoutExpiryAndQPSOverUtilisation(t *testing.T) {
	sc := mustParse(t, `
pods: [{name: a, cores: 8, speed: 1}, {name: b, cores: 8, speed: 0.5}, {name: c, cores: 8, speed: 0.5}]
clients: 1
load: 0.5
duration: 60s
warmup: 0s
work: {mean: 10ms}
`)
	def, _ := strategyByName("cswrr")
	s := newSim(sc, def)
	s.run()
	c := &s.clients[0]
	// After the blackout: weight = qps/utilisation = capacity (800 and 400 req/s).
	for i, want := range []float64{800, 400, 400} {
		if math.Abs(c.w[i]/want-1) > 0.15 {
			t.Errorf("pod %d weight %v, want about %v", i, c.w[i], want)
		}
	}
	// Blackout: a host whose first report is younger than 10 s, and expiry: a
	// host without a report for 180 s, both get the median of the valid ones.
	s.now = 1000
	c.cs[0] = csHost{weight: 90, nonEmptySince: 500, lastUpdate: 999}
	c.cs[1] = csHost{weight: 40, nonEmptySince: 995, lastUpdate: 999} // blackout
	c.cs[2] = csHost{weight: 30, nonEmptySince: 100, lastUpdate: 700} // expired
	s.cswrrUpdate(0)
	if c.w[0] != 90 || c.w[1] != 90 || c.w[2] != 90 {
		t.Errorf("weights %v, want [90 90 90]", c.w)
	}
	if c.cs[2].nonEmptySince != -1 {
		t.Errorf("expired host keeps non_empty_since %v", c.cs[2].nonEmptySince)
	}
	c.cs[1].nonEmptySince = 980 // out of blackout: own weight
	s.cswrrUpdate(0)
	if c.w[1] != 40 || c.w[2] != 90 {
		t.Errorf("weights %v, want [90 40 90] (median of 40, 90 is the upper one)", c.w)
	}
}

func TestSeedDevRule(t *testing.T) {
	w := []float64{1000, 1000, 1000}
	mult := []float64{1, 1, 1}
	cpu := []float64{1.0, 1.02, 2.0} // avg 1.34
	if !seedDevStep(w, mult, cpu) {
		t.Fatal("step failed")
	}
	// Clamped to 600, scaled by 350/600 to 350; multipliers for the next cycle.
	for i, v := range w {
		if v != 350 {
			t.Errorf("w[%d] = %v, want 350", i, v)
		}
	}
	avg := (1.0 + 1.02 + 2.0) / 3
	for i, v := range cpu {
		want := 1 - (v-avg)*0.01/avg
		if math.Abs(mult[i]-want) > 1e-12 {
			t.Errorf("mult[%d] = %v, want %v", i, mult[i], want)
		}
	}
	// Next cycle applies the previous multipliers, truncated, then 350/median.
	prev := append([]float64(nil), mult...)
	seedDevStep(w, mult, cpu)
	raw := []float64{math.Trunc(350 * prev[0]), math.Trunc(350 * prev[1]), math.Trunc(350 * prev[2])}
	med := raw[1]
	for i := range w {
		if want := math.Trunc(raw[i] * 350 / med); w[i] != want {
			t.Errorf("cycle 2 w[%d] = %v, want %v", i, w[i], want)
		}
	}
	// Within 5% of the average: no change.
	w, mult = []float64{500, 500}, []float64{1, 1}
	seedDevStep(w, mult, []float64{1.0, 1.04})
	if mult[0] != 1 || mult[1] != 1 {
		t.Errorf("dead band: mult %v", mult)
	}
	if seedDevStep(w, mult, []float64{0, math.NaN()}) {
		t.Error("all-zero CPU must fail like the seed's NaN")
	}
}

func TestSeedMainRule(t *testing.T) {
	w := []float64{1000, 1000}
	if !seedMainStep(w, []float64{0.1, 0.2}) || w[0] != 600 || w[1] != 600 {
		t.Fatalf("low CPU: %v, want all 600", w)
	}
	w = []float64{1000, 1000}
	seedMainStep(w, []float64{1, 3}) // avg 2: shares 2/(2+2/3) x 2000 = 1500 and 500
	// pod 0: +0.15 x 500 = 75 (cap 2000/2/4 = 250); pod 1: -75.
	if w[0] != 1075 || w[1] != 925 {
		t.Fatalf("w = %v, want [1075 925]", w)
	}
	w = []float64{1000, 1000, 1000, 1000, 1000, 1000, 1000, 1000}
	seedMainStep(w, []float64{0.3, 10, 10, 10, 10, 10, 10, 10}) // increase capped at 8000/8/4
	if w[0] != 1250 {
		t.Fatalf("capped increase: w[0] = %v, want 1250", w[0])
	}
}

func TestPrometheusRate(t *testing.T) {
	// 1/s counter scraped every 15 s, window (0, 60]: samples 5..50 → the
	// gaps (5 s and 10 s) are below 1.1 x 15 s: extrapolated to 60 s.
	ts := []float64{5, 20, 35, 50}
	vs := []float64{100, 115, 130, 145}
	if got := extrapolatedRate(ts, vs, 0, 60); math.Abs(got-1) > 1e-12 {
		t.Fatalf("rate %v, want 1", got)
	}
	// A counter starting at 0 is not extrapolated below zero.
	vs = []float64{0, 15, 30, 45}
	if got, want := extrapolatedRate(ts, vs, 0, 60), 55.0/60; math.Abs(got-want) > 1e-12 {
		t.Fatalf("rate %v, want %v", got, want)
	}
	// A gap larger than 1.1 intervals extrapolates by half an interval.
	ts, vs = []float64{30, 45}, []float64{100, 115}
	if got, want := extrapolatedRate(ts, vs, 0, 60), 15*(15+7.5+15)/15/60; math.Abs(got-want) > 1e-12 {
		t.Fatalf("rate %v, want %v", got, want)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	h := newHistogram()
	for i := 1; i <= 100000; i++ {
		h.add(float64(i) * 1e-4)
	}
	for _, q := range []float64{0.5, 0.99, 0.999} {
		want := q * 10
		if got := h.quantile(q); math.Abs(got/want-1) > 0.001 {
			t.Errorf("q%v = %v, want %v", q, got, want)
		}
	}
}

func TestScenarioParsing(t *testing.T) {
	js := `{"pods":[{"name":"a","count":2}],"clients":2,"load":0.5,"duration":"60s","warmup":10,"work":{"mean":"5ms"}}`
	sc, err := ParseScenario([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	if sc.Warmup.Seconds() != 10 || sc.Cycle.Seconds() != 30 || sc.Pods[0].Cores != 1 || sc.Work.Distribution != "exponential" {
		t.Fatalf("defaults: %+v", sc)
	}
	for _, bad := range []string{
		`{"pods":[{"name":"a"}],"load":0.5,"duration":"60s","work":{"mean":"5ms"},"typo":1}`,
		`{"pods":[{"name":"a"}],"load":0,"duration":"60s","work":{"mean":"5ms"}}`,
		`{"pods":[{"name":"a"}],"load":0.5,"duration":"60s","work":{"mean":"5ms"},"events":[{"at":"10s","type":"set_speed","pod":"nope","speed":1}]}`,
		`{"pods":[{"name":"a"}],"load":0.5,"duration":"60s","work":{"mean":"5ms"},"strategies":["nope"]}`,
		`{"pods":[{"name":"a"}],"load":0.5,"duration":"60s","work":{"mean":"5ms"},"events":[{"at":"10s","type":"set_load","load":0}]}`,
	} {
		if _, err := ParseScenario([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// A set_load event changes the arrival rate from then on, the same for
// every strategy, and the best static weights are solved again at the new
// load (more to the slow pod, as the load nears capacity).
func TestSetLoadChangesTheArrivalRate(t *testing.T) {
	const base = `
pods: [{name: a, cores: 2, speed: 1}, {name: b, cores: 2, speed: 0.4}]
clients: 4
load: 0.5
duration: 100s
warmup: 0s
work: {mean: 10ms}
seed: 1
`
	flat := mustParse(t, base)
	surge := mustParse(t, base+"events:\n  - {at: 50s, type: set_load, load: 0.9}\n")
	sf, rf := runSim(t, flat, "oracle_best")
	ss, rs := runSim(t, surge, "oracle_best")
	// Half the run at 0.5, half at 0.9: 1.4 times the arrivals (about
	// 14 000 without the event, so chance moves the ratio by about 1%).
	if ratio := float64(rs.Arrivals) / float64(rf.Arrivals); math.Abs(ratio-1.4) > 0.04 {
		t.Fatalf("arrivals %d with the surge, %d without: ratio %.3f, want 1.4", rs.Arrivals, rf.Arrivals, ratio)
	}
	if _, rr := runSim(t, surge, "rr"); rr.Arrivals != rs.Arrivals || rr.ArrivalHash != rs.ArrivalHash {
		t.Fatalf("rr saw %d arrivals (hash %x), oracle_best %d (hash %x): not the same stream", rr.Arrivals, rr.ArrivalHash, rs.Arrivals, rs.ArrivalHash)
	}
	share := func(s *sim) float64 { return s.weights[1] / (s.weights[0] + s.weights[1]) }
	if share(ss) <= share(sf) {
		t.Fatalf("the slow pod's share of the best static weights is %.3f after the surge, %.3f at the initial load: not solved again", share(ss), share(sf))
	}
}

func TestShippedScenariosParse(t *testing.T) {
	files, _ := filepath.Glob("scenarios/*.yaml")
	if len(files) < 6 {
		t.Fatalf("only %d shipped scenarios", len(files))
	}
	probes, _ := filepath.Glob("probes/*.yaml")
	if len(probes) == 0 {
		t.Fatal("no probes (make bench-probes runs them)")
	}
	for _, f := range append(files, probes...) {
		if _, err := LoadScenario(f); err != nil {
			t.Error(err)
		}
	}
}

func TestOptimizerRunsOnPodChurn(t *testing.T) {
	sc := mustParse(t, tinyHetero+`
  - {at: 110s, type: add_pods, pods: [{name: new, count: 1, cores: 2, speed: 1}]}
  - {at: 120s, type: remove_pods, names: [slow-0]}
`)
	for _, name := range []string{"optimizer", "optimizer_cpu"} {
		s, r := runSim(t, sc, name)
		if r.Publications < 1 || len(r.Notes) > 0 {
			t.Errorf("%s: %d publications, notes %v", name, r.Publications, r.Notes)
		}
		for _, h := range s.hosts {
			if s.weights[h] < 1 {
				t.Errorf("%s: weight of %s = %v", name, s.pods[h].name, s.weights[h])
			}
		}
	}
}

func TestTableAndJSONOutput(t *testing.T) {
	sc := mustParse(t, tinyHetero)
	sc.Strategies = []string{"rr", "wrr_oracle"}
	res := RunAll([]*Scenario{sc}, 2)[0]
	var b strings.Builder
	if err := writeJSON(&b, sc, res); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"scenario":`, `"p50_ms":`, `"p99_ms":`, `"p999_ms":`, `"max_mean_util":`, `"publications":`, `"settled_cycle":`, `"writes":2`, `"policy_switches":0`} {
		if !strings.Contains(b.String(), k) {
			t.Errorf("json lacks %s: %s", k, b.String())
		}
	}
	b.Reset()
	writeTable(&b, sc, res)
	if !strings.Contains(b.String(), "| wrr_oracle |") {
		t.Errorf("table: %s", b.String())
	}
	_ = os.Stdout
}

// twoSpeeds is two fast and two slow pods at 70% load, reported per
// minute; a test adds its duration, warm-up and opt-in.
const twoSpeeds = `
pods:
  - {name: fast, count: 2, cores: 2, speed: 1.0}
  - {name: slow, count: 2, cores: 2, speed: 0.4}
clients: 4
load: 0.7
per_minute: true
work: {mean: 10ms}
seed: 3
`

// The optimizer's default mode is the operator's: nothing before opt-in
// (Istio's LEAST_REQUEST over equal weights), weighted LEAST_REQUEST until
// the engine reports Learned, then weighted ROUND_ROBIN; optimizer_lr
// stays on LEAST_REQUEST.
func TestOptInAndLoadBalancerFollowLearned(t *testing.T) {
	sc := mustParse(t, twoSpeeds+`
duration: 240s
warmup: 60s
opt_in: 60s
`)
	s, r := runSim(t, sc, "optimizer")
	if r.LearnedAt < 60 {
		t.Errorf("Learned at %vs, want at or after the opt-in at 60s", r.LearnedAt)
	}
	// [policy] The policy switches to ROUND_ROBIN once the results have
	// been Learned for a query window, and the clients run what it says.
	if r.PolicySwitches < 1 {
		t.Errorf("optimizer never left LEAST_REQUEST though Learned from %vs", r.LearnedAt)
	}
	if lb, _ := s.ctl.(*optimizerCtl).drv.P.Balancer(); (lb == weights.BalancerRoundRobin) != (s.lb == lbWRR) {
		t.Errorf("the clients run load balancer %d, the policy says %s", s.lb, lb)
	}
	if len(r.P99PerMinuteMs) != 3 {
		t.Errorf("%d per-minute p99s, want 3 (180 s after the warm-up)", len(r.P99PerMinuteMs))
	}
	s, _ = runSim(t, sc, "optimizer_lr")
	if s.lb != lbWLR {
		t.Errorf("optimizer_lr ends on load balancer %d, want weighted LEAST_REQUEST", s.lb)
	}
}

// An opt-in applies the static oracles as it applies the optimizer: until
// it every weighting strategy runs Istio's default, so each starts from the
// same queues. The first minute, served before the opt-in, is lr's to the
// request; after it the oracle's weights and DestinationRule are in force.
func TestOraclesAppliedAtOptIn(t *testing.T) {
	sc := mustParse(t, twoSpeeds+`
duration: 180s
warmup: 0s
opt_in: 90s
`)
	_, lr := runSim(t, sc, "lr")
	for _, name := range []string{"wrr_oracle", "oracle_best", "optimizer"} {
		s, r := runSim(t, sc, name)
		if r.P99PerMinuteMs[0] != lr.P99PerMinuteMs[0] {
			t.Errorf("%s: first minute's p99 %.3f ms, lr's %.3f ms: before the opt-in every strategy runs Istio's default",
				name, r.P99PerMinuteMs[0], lr.P99PerMinuteMs[0])
		}
		if name == "optimizer" {
			continue
		}
		if r.PolicySwitches != 1 || s.lb != lbWRR {
			t.Errorf("%s: %d switches, ends on load balancer %d; want one switch, to ROUND_ROBIN at the opt-in",
				name, r.PolicySwitches, s.lb)
		}
		if s.weights[0] <= s.weights[len(s.weights)-1] {
			t.Errorf("%s: weights %v after the opt-in, want the fast pods above the slow", name, s.weights)
		}
		if r.P99PerMinuteMs[2] == lr.P99PerMinuteMs[2] {
			t.Errorf("%s: last minute's p99 is lr's (%.3f ms): the oracle was not applied", name, r.P99PerMinuteMs[2])
		}
	}
}

// Pods without limits: the engine sees Cores 0 with the request and node
// CPU; the sidecar latency it gets is the scraped histogram's mean.
func TestNoLimitPodsAndLatencySignal(t *testing.T) {
	sc := mustParse(t, `
pods:
  - {name: big, count: 1, cores: 4, no_limit: true, node_cores: 16}
  - {name: small, count: 1, cores: 1, no_limit: true, cpu_request: 0.5}
clients: 2
load: 0.5
duration: 120s
warmup: 10s
work: {mean: 10ms}
seed: 1
`)
	def, _ := strategyByName("optimizer")
	s := newSim(sc, def)
	o := s.ctl.(*optimizerCtl)
	pods := o.pods(s)
	want := map[string][3]float64{"big-0": {0, 1, 16}, "small-0": {0, 0.5, 2}}
	for _, p := range pods {
		if w := want[p.Name]; p.Cores != w[0] || p.CPURequest != w[1] || p.NodeCores != w[2] {
			t.Errorf("%s: cores %v, request %v, node %v; want %v", p.Name, p.Cores, p.CPURequest, p.NodeCores, w)
		}
	}
	s.run()
	for _, h := range s.hosts {
		sum, ok1 := s.promRate(h, seriesLatSum)
		n, ok2 := s.promRate(h, seriesReqs)
		if !ok1 || !ok2 || !(sum/n >= 0.01*0.5) || sum/n > 1 {
			t.Errorf("%s: mean latency %v s from the scraped histogram, want about the 10 ms of work or more", s.pods[h].name, sum/n)
		}
		// The node's root cgroup: the pod's CPU plus its neighbours',
		// who use what the pod's cores leave of the node, give or take
		// the default 10%.
		p := &s.pods[h]
		node, ok1 := s.promRate(h, seriesNode)
		cpu, ok2 := s.promRate(h, seriesCPU)
		neighbours := p.nodeCores - float64(p.cores)
		if !ok1 || !ok2 || node-cpu < 0.9*neighbours-1e-9 || node-cpu > 1.1*neighbours+1e-9 {
			t.Errorf("%s: node CPU %v minus pod CPU %v, want the neighbours' %v ± 10%%", p.name, node, cpu, neighbours)
		}
		if got := o.observe(s).Signals[p.name].NodeCPU; got != node {
			t.Errorf("%s: the optimizer is given node CPU %v, want the scraped %v", p.name, got, node)
		}
	}
	// node_cpu: false is a Prometheus without those series: the optimizer
	// gets none, and still gets the pods' own CPU.
	f := false
	s.sc.NodeCPU = &f
	for name, sig := range o.observe(s).Signals {
		if sig.NodeCPU != 0 || !(sig.CPU > 0) {
			t.Errorf("node_cpu false: %s given node CPU %v and CPU %v, want none and the pod's", name, sig.NodeCPU, sig.CPU)
		}
	}
}

// After a pod slows down under ROUND_ROBIN, the first cycle that can see
// it (run at once by a look's alarm, or the regular one, which checks the
// alarm too) hands the Service to LEAST_REQUEST, not Learned, though its
// one-minute windows hold only seconds of the slowdown; and it comes within
// two scrape intervals of the change: one for a scrape to show it, one for
// the look or cycle after that scrape.
func TestFirstAlarmHandsTheServiceToLeastRequest(t *testing.T) {
	sc, err := LoadScenario("scenarios/slowdown.yaml")
	if err != nil {
		t.Fatal(err)
	}
	def, _ := strategyByName("optimizer")
	s := newSim(sc, def)
	var trace strings.Builder
	s.trace = &trace
	s.run()
	change := sc.Events[0].At.Seconds()
	scrape := s.scrapeEvery

	for _, line := range strings.Split(trace.String(), "\n") {
		at, rest, ok := strings.Cut(strings.TrimPrefix(line, "optimizer t="), "s ")
		if !ok || !strings.HasPrefix(line, "optimizer t=") {
			continue
		}
		sec, err := strconv.Atoi(strings.TrimSpace(at))
		if err != nil || float64(sec) <= change {
			continue
		}
		if strings.HasPrefix(rest, "alarm:") || !strings.Contains(rest, "(Alarm)") {
			continue
		}
		if !strings.Contains(rest, "learned=false") || !strings.Contains(rest, "lb=LEAST_REQUEST") {
			t.Errorf("the first cycle that saw the slowdown: %q; want it not Learned, on LEAST_REQUEST", line)
		}
		if float64(sec) > change+2*scrape+1 {
			t.Errorf("the slowdown at %.0fs first seen by the cycle at %ds; want within two scrape intervals (%.0fs)", change, sec, 2*scrape)
		}
		return
	}
	t.Fatalf("no cycle after the slowdown at %.0fs put the Service on LEAST_REQUEST for an alarm", change)
}

// A scenario whose load moves says so in its header: the initial load,
// then each set_load event's, not the initial load alone.
func TestHeaderStatesEveryLoad(t *testing.T) {
	sc := &Scenario{Load: 0.85, Events: []Event{
		{At: Duration{10 * 60e9}, Type: EventSetLoad, Load: 0.9},
		{At: Duration{12 * 60e9}, Type: EventSetSpeed, Pod: "a-0", Speed: 0.5},
	}}
	if got, want := loadText(sc), "0.85, 0.90 from 10m0s"; got != want {
		t.Errorf("header load %q, want %q", got, want)
	}
}

// runRestart runs base's optimizer strategy name on seed with a restart of
// the manager halfway (restartVariant, as the documentation's restart
// table runs it), and requires that the new manager wrote neither the
// weights nor the DestinationRule in its first restartWindow cycles.
func runRestart(t *testing.T, base *Scenario, seed uint64, name string) (*sim, StrategyResult) {
	t.Helper()
	sc := *base
	sc.Seed = seed
	if !restartVariant("", &sc) {
		t.Fatalf("%s is not a steady scenario", base.Name)
	}
	s, r := runSim(t, &sc, name)
	if r.Restarts != 1 {
		t.Fatalf("seed %d, %s: %d restarts, want 1", seed, name, r.Restarts)
	}
	if r.WritesAfterRestart != 0 || r.SwitchesAfterRestart != 0 {
		t.Errorf("seed %d, %s: the new manager made %d weight writes and %d balancer switches in its first %d cycles, want none",
			seed, name, r.WritesAfterRestart, r.SwitchesAfterRestart, restartWindow)
	}
	return s, r
}

// A manager restart (a crash, a rollout, a leader's failover) on a steady
// Service: the new manager is seeded from what the cluster holds, as
// controllers/ seeds it (driver.Restart), and writes neither the weights
// nor the DestinationRule in its first restartWindow cycles, with request
// rates and on CPU alone, over several seeds; and it goes on cycling.
func TestRestartOnASteadyServiceWritesNothing(t *testing.T) {
	base, err := LoadScenario("scenarios/hetero3-80.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for seed := uint64(1); seed <= 6; seed++ {
		for _, name := range []string{"optimizer", "optimizer_cpu"} {
			s, r := runRestart(t, base, seed, name)
			after := 0
			for _, c := range r.CycleTimes {
				if c > s.restarts[0] {
					after++
				}
			}
			if after < 2*restartWindow {
				t.Errorf("seed %d, %s: %d regular cycles after the restart at %.0fs; the new manager stopped cycling", seed, name, after, s.restarts[0])
			}
		}
	}
}

// A restart at low load, where the slow pods sit at the max_weight_ratio
// floor: their weight does not show their speed, so the new manager takes
// each one's first reading as its speed. Two things made the next readings
// read as a change, written within the first cycles (1 of 16 seeds each).
// With request rates: that reading rests on a MaxRatio-th of the mean
// pod's requests, and judged as a reading of the mean pod's noise its
// scatter is news; the engine weighs it by its count (countNoise). On CPU
// alone: the reading stayed in the readings' units while the calibration
// moved the others into the live weights', and at low load those moves are
// long; it is moved with them (calibrateTo). CPU alone still does not know
// how few requests a floored pod's reading rests on: over restarts at 8,
// 10, 12, 13, 14, 16 and 18 minutes, 1 of 112 writes (before the move, 4:
// one seed at four of the times).
func TestRestartWithPodsAtTheFloorWritesNothing(t *testing.T) {
	base, err := LoadScenario("scenarios/hetero3-20-lowload.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for seed := uint64(1); seed <= 16; seed++ {
		for _, name := range []string{"optimizer", "optimizer_cpu"} {
			runRestart(t, base, seed, name)
		}
	}
}

// Weight writes and balancer switches rebuild every client's scheduler; as
// Envoy rebuilds it (edf.Rebuild), each client starts at its own point of
// the weighted rotation, so a rebuild sends no burst to the light pods.
// One-core pods on one-core nodes at a small share of the weight, 256
// clients, heavy-tailed work: with the rebuild of Envoy before 1.30 (every
// client's first pick of a light pod within one rotation of the others')
// each switch to ROUND_ROBIN queued the one-core pods, the alarm rang and
// the policy switched back and forth.
func TestRebuildsSendNoBurstToLightPods(t *testing.T) {
	base, err := ParseScenario([]byte(`name: light-one-core-pods
description: one-core pods on one-core nodes beside 2- and 4-core pods, no CPU limits, 256 clients
pods:
  - {name: c0, count: 4, cores: 2, speed: 0.93, no_limit: true, node_cores: 4, hardware_class: h0, locality: region/zone-a/}
  - {name: c1, count: 4, cores: 4, speed: 0.78, no_limit: true, node_cores: 8, hardware_class: h1, locality: region/zone-b/}
  - {name: c2, count: 4, cores: 1, speed: 0.36, no_limit: true, node_cores: 1, hardware_class: h2, locality: region/zone-c/}
clients: 256
load: 0.7
duration: 20m
warmup: 5m
cycle: 30s
work: {distribution: lognormal, mean: 10ms, sigma: 1}
seed: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	var switches []float64
	for seed := uint64(1); seed <= 8; seed++ {
		sc := *base
		sc.Seed = seed
		_, r := runSim(t, &sc, "optimizer")
		switches = append(switches, float64(r.PolicySwitches))
	}
	// The rebuild as Envoy does it: a median of 1 (the switch that ends
	// the opt-in's learning), 11 in all; the rebuild before 1.30: a
	// median of 6, 49 in all.
	if m := median(switches); m > 2 {
		t.Errorf("balancer switches over seeds 1-8 %v, median %v; want a median of at most 2", switches, m)
	}
}
