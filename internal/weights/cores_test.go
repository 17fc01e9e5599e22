package weights

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// erlangWait is the M/M/c mean wait over the service time, from the
// textbook sum (not the recursion the engine uses).
func erlangWait(c int, a float64) float64 {
	sum, term := 0.0, 1.0
	for k := 0; k < c; k++ {
		if k > 0 {
			term *= a / float64(k)
		}
		sum += term
	}
	top := term * a / float64(c) * float64(c) / (float64(c) - a) // a^c/c! * c/(c-a)
	return top / (sum + top) / (float64(c) - a)
}

func TestCoresForWaitInvertsErlangC(t *testing.T) {
	tests := map[string]struct {
		cores int
		util  float64
	}{
		"1 core at 80%":   {1, 0.8},
		"2 cores at 80%":  {2, 0.8},
		"4 cores at 50%":  {4, 0.5},
		"8 cores at 90%":  {8, 0.9},
		"8 cores at 30%":  {8, 0.3},
		"32 cores at 95%": {32, 0.95},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := tc.util * float64(tc.cores)
			got := coresForWait(a, erlangWait(tc.cores, a), 64)
			if math.Abs(got-float64(tc.cores)) > 1e-6 {
				t.Errorf("coresForWait = %v, want %d", got, tc.cores)
			}
		})
	}
	if got := coresForWait(1.5, 1e-30, 16); got != 16 {
		t.Errorf("no wait at all: got %v, want the upper bound 16", got)
	}
	if got := coresForWait(1.5, 1e9, 16); got < 1.5 || got > 2 {
		t.Errorf("endless wait at 1.5 busy cores: got %v, want just above 1.5", got)
	}
}

// Pods without limits on unequal nodes: the engine is told only their
// requests and nodes, and the sidecar latency shows their cores.
func TestCoresWithoutLimitsFromLatency(t *testing.T) {
	cores := map[string]int{"one": 1, "two": 2, "four": 4, "eight": 8}
	pods := podsNamed("one", "two", "four", "eight")
	for i := range pods {
		pods[i].CPURequest, pods[i].NodeCores = 0.5, 16
	}
	e := New(DefaultParams())
	now := t0
	e.Applied(now, e.Weights(now, pods))
	var res Result
	for range 12 {
		now = now.Add(quiet)
		// 70% of the total capacity, split by the live weights; each pod's
		// latency is what an M/M/c queue of its cores shows at its load
		// (10 ms of CPU per request), capped below saturation.
		sum := 0.0
		for _, w := range e.live {
			sum += float64(w)
		}
		obs := Observation{Time: now, Signals: map[string]Signal{}}
		for name, c := range cores {
			rate := 0.7 * 15 * 100 * float64(e.live[name]) / sum
			busy := min(rate*0.01, 0.98*float64(c))
			obs.Signals[name] = Signal{CPU: busy, Requests: busy * 100, Latency: 0.01 * (1 + erlangWait(c, busy))}
		}
		res = cycle(e, pods, obs)
	}
	total := 0.0
	for _, c := range res.Capacity {
		total += c
	}
	for name, c := range cores {
		want := float64(c) / 15
		if got := res.Capacity[name] / total; !near(got, want, 0.1) {
			t.Errorf("%s: capacity share %.3f, want %.3f", name, got, want)
		}
	}
	if !res.Learned {
		t.Errorf("not Learned: %s", res.Message)
	}
}

func TestLatencySplit(t *testing.T) {
	tests := map[string]struct {
		cores, speed []float64
		load         float64 // share of the total capacity
		check        func(t *testing.T, split, capacity []float64)
		ok           bool
	}{
		"identical pods get equal traffic at any load": {
			cores: []float64{2, 2, 2}, speed: []float64{1, 1, 1}, load: 0.3, ok: true,
			check: func(t *testing.T, split, _ []float64) {
				if !near(split[0], split[1], 1e-6) || !near(split[1], split[2], 1e-6) {
					t.Errorf("split %v, want equal", split)
				}
			},
		},
		"low load favours the fast pods": {
			cores: []float64{2, 2}, speed: []float64{1, 0.35}, load: 0.2, ok: true,
			check: func(t *testing.T, split, capacity []float64) {
				if split[1]/capacity[1] > 0.5*split[0]/capacity[0] {
					t.Errorf("slow pod at %.2f of its capacity, fast at %.2f: want the slow one far less used",
						split[1]/capacity[1], split[0]/capacity[0])
				}
			},
		},
		"near full load the split tends to capacity shares": {
			cores: []float64{2, 2}, speed: []float64{1, 0.35}, load: 0.95, ok: true,
			check: func(t *testing.T, split, capacity []float64) {
				if u0, u1 := split[0]/capacity[0], split[1]/capacity[1]; !near(u1/u0, 1, 0.1) {
					t.Errorf("utilisations %.3f and %.3f, want within 10%%", u0, u1)
				}
			},
		},
		"more cores take more at the same speed": {
			cores: []float64{1, 8}, speed: []float64{1, 1}, load: 0.6, ok: true,
			check: func(t *testing.T, split, _ []float64) {
				if split[1] < 8*split[0] {
					t.Errorf("split %v: want the 8-core pod to take at least 8 times the 1-core pod", split)
				}
			},
		},
		"over capacity: no split": {
			cores: []float64{2, 2}, speed: []float64{1, 0.5}, load: 1.2, ok: false,
		},
		"unknown cores: no split": {
			cores: []float64{0, 2}, speed: []float64{1, 0.5}, load: 0.5, ok: false,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			capacity, total := capacities(tc.cores, tc.speed)
			split, ok := latencySplit(tc.cores, tc.speed, tc.load*total)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			sum := 0.0
			for _, v := range split {
				sum += v
			}
			if !near(sum, tc.load*total, 1e-6) {
				t.Errorf("split sums to %v, want the load %v", sum, tc.load*total)
			}
			tc.check(t, split, capacity)
		})
	}
}

// Near full load the utilisations fade to the Service's own: the fullest
// pod stays below the saturation threshold while the Service is (which
// would take the adjustment away the next cycle), and nothing jumps at
// maxSplitLoad.
func TestQueueUtilisationsFadeNearFullLoad(t *testing.T) {
	// The 1-2-4-8 mix, and skewed ones where many few-core pods push one
	// large pod past the saturation threshold before queueFadeFrom.
	mixes := map[string]map[float64]int{ // cores: how many pods
		"1, 2, 4 and 8 cores":              {1: 1, 2: 1, 4: 1, 8: 1},
		"twenty 1-core pods and an 8-core": {1: 20, 8: 1},
		"fifty 1-core pods and a 16-core":  {1: 50, 16: 1},
		"a hundred 1-core and a 32-core":   {1: 100, 32: 1},
	}
	for name, mix := range mixes {
		t.Run(name, func(t *testing.T) {
			var cores, speed []float64
			for _, c := range slices.Sorted(maps.Keys(mix)) {
				for range mix[c] {
					cores, speed = append(cores, c), append(speed, 1)
				}
			}
			capacity, total := capacities(cores, speed)
			for k := 0; ; k++ {
				load := 0.70 + 0.0025*float64(k)
				if load >= maxSplitLoad {
					break
				}
				rho, ok := queueUtilisations(cores, speed, load*total)
				if !ok {
					t.Fatalf("load %.4f: no utilisations", load)
				}
				work := 0.0
				for i := range rho {
					work += capacity[i] * rho[i]
				}
				if !near(work, load*total, 1e-6) {
					t.Errorf("load %.4f: work %v, want %v", load, work, load*total)
				}
				fullest := slices.Max(rho)
				if fullest > max(load, queueFullest)+1e-9 {
					t.Errorf("load %.4f: the fullest pod at %.4f, want at most %v", load, fullest, max(load, queueFullest))
				}
				if load > maxSplitLoad-0.003 && fullest-load > 0.002 {
					t.Errorf("load %.4f: the fullest pod at %.4f, want within 0.2%% of the load by maxSplitLoad", load, fullest)
				}
			}
		})
	}
}

// capacities returns each pod's cores times speed, and their sum.
func capacities(cores, speed []float64) (capacity []float64, total float64) {
	capacity = make([]float64, len(cores))
	for i := range cores {
		capacity[i] = cores[i] * speed[i]
		total += capacity[i]
	}
	return capacity, total
}

func TestQueueUtilisations(t *testing.T) {
	tests := map[string]struct {
		cores, speed []float64
		load         float64 // share of the total capacity
		ok           bool
	}{
		"one core count, unlike speeds":    {cores: []float64{2, 2, 2}, speed: []float64{1, 0.6, 0.35}, load: 0.85, ok: true},
		"1, 2 and 8 cores at 85%":          {cores: []float64{1, 2, 8}, speed: []float64{1, 1, 1}, load: 0.85, ok: true},
		"1 and 8 cores, unlike speeds":     {cores: []float64{1, 8}, speed: []float64{1, 0.45}, load: 0.7, ok: true},
		"at maxSplitLoad: capacity shares": {cores: []float64{1, 8}, speed: []float64{1, 1}, load: maxSplitLoad, ok: false},
		"no load":                          {cores: []float64{1, 8}, speed: []float64{1, 1}, load: 0, ok: false},
		"unknown cores":                    {cores: []float64{0, 8}, speed: []float64{1, 1}, load: 0.5, ok: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, total := capacities(tc.cores, tc.speed)
			rho, ok := queueUtilisations(tc.cores, tc.speed, tc.load*total)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			work := 0.0
			for i := range rho {
				work += tc.cores[i] * tc.speed[i] * rho[i]
				// Each pod's marginal queueing cost is the same.
				if a, b := sakasegawaCost(tc.cores[i], rho[i]), sakasegawaCost(tc.cores[0], rho[0]); !near(a, b, 1e-6) {
					t.Errorf("marginal costs %v and %v, want equal (rho %v)", a, b, rho)
				}
				// Equal cores, equal utilisations; more cores, a fuller pod.
				for j := range rho {
					switch {
					case tc.cores[i] == tc.cores[j] && !near(rho[i], rho[j], 1e-9):
						t.Errorf("pods %d and %d have %v cores each but utilisations %v and %v", i, j, tc.cores[i], rho[i], rho[j])
					case tc.cores[i] > tc.cores[j] && !(rho[i] > rho[j]):
						t.Errorf("pod %d (%v cores) at %v, pod %d (%v cores) at %v: want the one with more cores fuller",
							i, tc.cores[i], rho[i], j, tc.cores[j], rho[j])
					}
				}
			}
			if !near(work, tc.load*total, 1e-6) {
				t.Errorf("the utilisations do %v units of work, want the load %v", work, tc.load*total)
			}
		})
	}
}

// runUnlikeCores runs cycles of a Service of pods a, b and c (1, 2 and 8
// cores, equal speed) at load of its capacity, each pod's CPU following
// its weight share; the pods named in limited have Cores, the others a
// 1-core request and a node whose idle CPU shows their cores. It returns
// the last weights per core of b and c over a's.
func runUnlikeCores(t *testing.T, p Params, limited string, withRequests func(cycle int) bool, cycles int, load float64) (b, c float64) {
	t.Helper()
	cores := map[string]float64{"a": 1, "b": 2, "c": 8}
	var set []Pod
	for _, name := range []string{"a", "b", "c"} {
		pod := Pod{Name: name, Locality: "r/z/s", Node: "node-" + name}
		if strings.Contains(limited, name) {
			pod.Cores = cores[name]
		} else {
			pod.CPURequest, pod.NodeCores = 1, 4*cores[name]
		}
		set = append(set, pod)
	}
	e := New(p)
	now := t0
	e.Applied(now, e.Weights(now, set))
	for k := range cycles {
		now = now.Add(quiet)
		sum := 0.0
		for _, w := range e.live {
			sum += float64(w)
		}
		obs := Observation{Time: now, Signals: map[string]Signal{}}
		for name, c := range cores {
			cpu := load * 11 * float64(e.live[name]) / sum
			sig := Signal{CPU: cpu, Requests: math.NaN(), Latency: math.NaN(), NodeCPU: 4*c - c + cpu}
			if withRequests(k) {
				sig.Requests = 100 * cpu
			}
			obs.Signals[name] = sig
		}
		cycle(e, set, obs)
	}
	per := func(name string) float64 { return float64(e.live[name]) / cores[name] }
	return per("b") / per("a"), per("c") / per("a")
}

// At 85% load a pod of 8 cores queues far less than one of 1 core at the
// same utilisation, so it is run fuller: its weight per core is above the
// 1-core pod's by what queueUtilisations says. Without MinimizeLatency
// the weights are capacity shares. Cores read from the node's idle CPU
// are used only with request rates: with CPU alone a fuller pod would be
// judged at its noisy limit, so those weights stay capacity shares.
func TestUnlikeCoresRunAtUnlikeUtilisations(t *testing.T) {
	rho, ok := queueUtilisations([]float64{1, 2, 8}, []float64{1, 1, 1}, 0.85*11)
	if !ok || !(rho[2]/rho[0] > 1.1) {
		t.Fatalf("queueUtilisations %v, %v: the test needs the 8-core pod well above the 1-core one", rho, ok)
	}
	wantB, wantC := rho[1]/rho[0], rho[2]/rho[0]
	tests := []struct {
		name     string
		minimize bool
		limited  string // the pods with a CPU limit
		withRq   bool
		b, c     float64
	}{
		{"limits, request rates", true, "abc", true, wantB, wantC},
		{"limits, CPU alone", true, "abc", false, wantB, wantC},
		{"no limits, request rates", true, "", true, wantB, wantC},
		{"no limits, CPU alone: capacity shares", true, "", false, 1, 1},
		{"one pod without a limit, CPU alone: capacity shares", true, "ab", false, 1, 1},
		{"without MinimizeLatency: capacity shares", false, "abc", true, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultParams()
			p.SpeedTilt = 0
			p.MinimizeLatency = tc.minimize
			b, c := runUnlikeCores(t, p, tc.limited, func(int) bool { return tc.withRq }, 12, 0.85)
			if !near(b, tc.b, 0.04) || !near(c, tc.c, 0.04) {
				t.Errorf("weight per core of b and c over a's: %.3f and %.3f, want %.3f and %.3f", b, c, tc.b, tc.c)
			}
		})
	}
}

// Pods without limits run at unlike utilisations on request rates; one
// window without them (a failed scrape, patchy metrics) keeps that, and
// only requestsGrace windows in a row hand the Service to CPU alone's
// capacity shares.
func TestUnlikeCoresOutlastAWindowWithoutRequests(t *testing.T) {
	rho, _ := queueUtilisations([]float64{1, 2, 8}, []float64{1, 1, 1}, 0.85*11)
	wantB, wantC := rho[1]/rho[0], rho[2]/rho[0]
	p := DefaultParams()
	p.SpeedTilt = 0
	for _, tc := range []struct {
		name    string
		without int // cycles without request rates after 12 with
		b, c    float64
	}{
		{"one window without", 1, wantB, wantC},
		{"requestsGrace windows without", requestsGrace - 1, wantB, wantC},
		{"a dozen windows without: CPU alone", 12, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, c := runUnlikeCores(t, p, "", func(k int) bool { return k < 12 }, 12+tc.without, 0.85)
			if !near(b, tc.b, 0.04) || !near(c, tc.c, 0.04) {
				t.Errorf("weight per core of b and c over a's: %.3f and %.3f, want %.3f and %.3f", b, c, tc.b, tc.c)
			}
		})
	}
}

// Speeds a fraction of a band apart come out all but equal, speeds many
// bands apart untouched; the result is smooth in the speeds, does not
// depend on their order, and a young pod's wide band pulls nobody.
func TestPoolSpeeds(t *testing.T) {
	band := []float64{0.05, 0.05, 0.05, 0.05}
	rel := func(a, b float64) float64 { return math.Abs(a/b - 1) }

	t.Run("within noise: all but equal; far apart: untouched", func(t *testing.T) {
		v := []float64{0.6, 1, 0.612, 0.35} // 0.6 and 0.612: 2% apart, 0.4 bands
		got := poolSpeeds(v, band)
		if d := rel(got[0], got[2]); d > 0.002 {
			t.Errorf("the two close speeds %v are %.3f%% apart, want under 0.2%% (10x closer)", got, 100*d)
		}
		if got[0] < 0.6 || got[2] > 0.612 {
			t.Errorf("pooled %v: want them between their inputs", got)
		}
		if rel(got[1], 1) > 1e-9 || rel(got[3], 0.35) > 1e-9 {
			t.Errorf("pooled %v: want 1 and 0.35, many bands from the rest, unchanged", got)
		}
	})
	t.Run("does not depend on order", func(t *testing.T) {
		v := []float64{1, 1.03, 0.97, 0.5}
		tol := []float64{0.05, 0.1, 0.05, 0.2}
		got := poolSpeeds(v, tol)
		perm := []int{3, 1, 0, 2}
		pv, pt := make([]float64, 4), make([]float64, 4)
		for k, i := range perm {
			pv[k], pt[k] = v[i], tol[i]
		}
		pgot := poolSpeeds(pv, pt)
		for k, i := range perm {
			if rel(pgot[k], got[i]) > 1e-12 {
				t.Fatalf("permuted: %v for %v, want %v's values permuted", pgot, pv, got)
			}
		}
	})
	t.Run("smooth: a speed crossing a band moves the rest a little", func(t *testing.T) {
		a := poolSpeeds([]float64{1, 1.05, 0.5, 0.5}, band)
		b := poolSpeeds([]float64{1, 1.06, 0.5, 0.5}, band)
		if d := rel(a[0], b[0]); d > 0.01 {
			t.Errorf("1.05 to 1.06 moved the pooled 1 from %v to %v (%.2f%%), want under 1%%", a[0], b[0], 100*d)
		}
	})
	t.Run("a young pod's wide band pulls nobody", func(t *testing.T) {
		got := poolSpeeds([]float64{0.8, 1, 1, 1}, []float64{0.4, 0.01, 0.01, 0.01})
		for i := 1; i < 4; i++ {
			if rel(got[i], 1) > 1e-9 {
				t.Errorf("pooled %v: the well-measured pods moved towards the young one", got)
			}
		}
	})
	t.Run("unusable speeds stay and pool with none", func(t *testing.T) {
		v := []float64{math.NaN(), 0, math.Inf(1), 1, 1.01}
		in := slices.Clone(v)
		got := poolSpeeds(v, []float64{0.05, 0.05, 0.05, 0.05, 0.05})
		same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
		if !slices.EqualFunc(v, in, same) {
			t.Errorf("input changed to %v", v)
		}
		if !same(got[0], v[0]) || got[1] != 0 || !math.IsInf(got[2], 1) {
			t.Errorf("pooled %v: want NaN, 0 and +Inf left as they were", got)
		}
		if rel(got[3], got[4]) > 0.002 || math.IsNaN(got[3]) {
			t.Errorf("pooled %v: want 1 and 1.01 drawn together, untouched by the rest", got)
		}
	})
	t.Run("empty", func(t *testing.T) {
		if got := poolSpeeds(nil, nil); len(got) != 0 {
			t.Errorf("got %v", got)
		}
	})
}

// At low load the split sends the traffic the fast pods should not take to
// the next class; with speeds pooled, two pods of that class whose
// estimates differ by noise share it evenly instead of one taking it all.
func TestPooledSplitSharesWithinAClass(t *testing.T) {
	cores := []float64{2, 2, 2, 2}
	speed := []float64{1, 1, 0.6, 0.612} // the mids 2% apart: noise
	load := 0.3 * (2*2*1 + 2*2*0.6)
	raw, ok := latencySplit(cores, speed, load)
	if !ok {
		t.Fatal("no split")
	}
	if raw[2] > 0.8*raw[3] {
		t.Fatalf("unpooled split %v: the test needs the mids treated unevenly", raw)
	}
	pooled, ok := latencySplit(cores, poolSpeeds(speed, []float64{0.05, 0.05, 0.05, 0.05}), load)
	if !ok {
		t.Fatal("no pooled split")
	}
	if !(pooled[2] > 0) || !near(pooled[2], pooled[3], 0.1) {
		t.Errorf("pooled split %v: want the two mids within 10%% of each other and in use", pooled)
	}
}

// A pod without a limit could use its own CPU plus its share of what its
// node leaves idle; pods of the set on one node share that idle CPU in
// proportion to their use; a limit wins; without the node's figures
// nothing is known.
func TestCeilingsFromNodeIdleCPU(t *testing.T) {
	set := []Pod{
		{Name: "alone", NodeCores: 8, Node: "n1"},
		{Name: "pair-a", NodeCores: 16, Node: "n2"},
		{Name: "pair-b", NodeCores: 16, Node: "n2"},
		{Name: "limited", Cores: 2, NodeCores: 16, Node: "n3"},
		{Name: "no-node-data", NodeCores: 8, Node: "n4"},
		{Name: "no-node-name", NodeCores: 4},
		{Name: "overbooked", NodeCores: 4, Node: "n5"},
		{Name: "big", NodeCores: 16, Node: "n6"},
		{Name: "no-allocatable", Node: "n6"}, // beside big, but nothing to share by
	}
	obs := map[string]Signal{
		"alone":          {CPU: 1, NodeCPU: 5},     // 3 idle
		"pair-a":         {CPU: 3, NodeCPU: 12},    // 4 idle, a uses 3 of the pair's 4
		"pair-b":         {CPU: 1, NodeCPU: 12},    // and b 1 of 4
		"limited":        {CPU: 1, NodeCPU: 2},     // its limit
		"no-node-data":   {CPU: 1, NodeCPU: 0},     // unknown
		"no-node-name":   {CPU: 1.5, NodeCPU: 4.5}, // node busier than allocatable: none idle
		"overbooked":     {CPU: 1, NodeCPU: 6},     // far busier
		"big":            {CPU: 0.1, NodeCPU: 8},
		"no-allocatable": {CPU: 4, NodeCPU: 8},
	}
	sig := readSignals(canonicalPods(set), obs)
	want := map[string]float64{"alone": 4, "pair-a": 6, "pair-b": 2, "limited": 2, "no-node-data": 0, "no-node-name": 1.5,
		"overbooked": 1, "big": 8.1, "no-allocatable": 0}
	// What the average takes: the idle CPU signed (0.5 under allocatable
	// for no-node-name), down to half the pod's own CPU (overbooked).
	wantSeen := map[string]float64{"alone": 4, "pair-a": 6, "pair-b": 2, "no-node-name": 1, "overbooked": 0.5, "big": 8.1}
	for i, pod := range canonicalPods(set) {
		if got := sig.pods[i].limit; math.Abs(got-want[pod.Name]) > 1e-9 {
			t.Errorf("%s: limit %v, want %v", pod.Name, got, want[pod.Name])
		}
		if got := sig.pods[i].nodeCeiling; math.Abs(got-wantSeen[pod.Name]) > 1e-9 {
			t.Errorf("%s: node ceiling %v, want %v", pod.Name, got, wantSeen[pod.Name])
		}
	}
	if !sig.pods[slices.IndexFunc(canonicalPods(set), func(p Pod) bool { return p.Name == "no-node-name" })].saturated() {
		t.Error("a pod whose node has nothing idle is not taken as saturated")
	}
}

// With CPU alone, the cores of pods without a limit come from their
// ceilings, so the first weights after opt-in already follow them (1, 2, 4 and 8 cores
// of equal speed), where the bounds alone (a 1-core request, 4- and
// 16-core nodes) would give 2, 2, 4 and 4.
func TestCPUOnlyWeightsFollowCeilings(t *testing.T) {
	cores := map[string]float64{"c1": 1, "c2": 2, "c4": 4, "c8": 8}
	node := map[string]float64{"c1": 4, "c2": 4, "c4": 16, "c8": 16}
	var set []Pod
	obs := Observation{Time: time.Unix(1000, 0), Signals: map[string]Signal{}}
	for name, c := range cores {
		set = append(set, Pod{Name: name, CPURequest: 1, NodeCores: node[name], Node: "node-" + name})
		use := 0.5 * c
		obs.Signals[name] = Signal{CPU: use, Requests: math.NaN(), NodeCPU: node[name] - c + use}
	}
	// The weights were applied 30 s ago: the window still shows the
	// Service's history before them, from which CPU alone learns nothing.
	e := New(DefaultParams())
	e.Applied(obs.Time.Add(-30*time.Second), e.Weights(obs.Time.Add(-30*time.Second), set))
	res := e.Update(set, obs)
	for name, c := range cores {
		if got := e.coresOf(Pod{Name: name, CPURequest: 1, NodeCores: node[name]}); math.Abs(got-c) > 1e-9 {
			t.Errorf("%s: cores %v, want %v", name, got, c)
		}
	}
	if !(res.Capacity["c8"] > 1.9*res.Capacity["c4"] && res.Capacity["c4"] > 1.9*res.Capacity["c2"] && res.Capacity["c2"] > 1.9*res.Capacity["c1"]) {
		t.Errorf("capacities %v do not follow the ceilings 1:2:4:8 (%s: %s)", res.Capacity, res.Mode, res.Message)
	}
}

// A pod that reached its limit only at the end of the window is
// saturated by its recent CPU, a cycle before the window's rate shows it;
// an unknown recent CPU changes nothing.
func TestRecentCPUShowsSaturationSooner(t *testing.T) {
	set := []Pod{{Name: "a", Cores: 2}, {Name: "b", Cores: 2}}
	for _, tc := range []struct {
		recent float64
		want   bool
	}{{2.0, true}, {1.7, false}, {0, false}, {math.NaN(), false}} {
		sig := readSignals(set, map[string]Signal{
			"a": {CPU: 1.8, RecentCPU: tc.recent},
			"b": {CPU: 1.0},
		})
		if got := sig.pods[0].saturated(); got != tc.want {
			t.Errorf("CPU 1.8 over the window, %v lately, limit 2: saturated %v, want %v", tc.recent, got, tc.want)
		}
	}
}

// With CPU alone a pod without a limit is judged saturated against the
// lower of this window's ceiling and the average, since its node's idle
// CPU is noise around zero once it is saturated; with request rates the
// average alone is used.
func TestSaturationAgainstNoisyCeilings(t *testing.T) {
	set := []Pod{{Name: "p", NodeCores: 4, Node: "n"}}
	e := New(DefaultParams())
	// Earlier windows: the node showed 0.3 idle beside 2 busy cores.
	for range 4 {
		sig := readSignals(set, map[string]Signal{"p": {CPU: 2, NodeCPU: 3.7, Requests: math.NaN()}})
		e.smoothCeilings(time.Unix(0, 0), set, sig)
	}
	cpuOnly := readSignals(set, map[string]Signal{"p": {CPU: 2, NodeCPU: 4, Requests: math.NaN()}})
	e.smoothCeilings(time.Unix(0, 0), set, cpuOnly)
	if !cpuOnly.pods[0].saturated() {
		t.Errorf("CPU alone: limit %v, CPU 2 with nothing idle now: not saturated", cpuOnly.pods[0].limit)
	}
	withRequests := readSignals(set, map[string]Signal{"p": {CPU: 2, NodeCPU: 4, Requests: 100}})
	e.smoothCeilings(time.Unix(0, 0), set, withRequests)
	if withRequests.pods[0].saturated() {
		t.Errorf("request rates: limit %v (the average), CPU 2: saturated on one window's noise", withRequests.pods[0].limit)
	}
}

// A pod's ceiling is averaged over the cycles, since one window of its
// node's idle CPU is noisy: with the neighbours' use 5% either way of
// their mean, the average settles within 1% of the pod's 2 cores (an
// average over the last two windows would swing by almost 2%). When a
// neighbour leaves and the pod's share of the node jumps to 3 cores, the
// average restarts at once instead of taking ten cycles to follow.
func TestCeilingAverageFiltersNoiseAndFollowsANeighbour(t *testing.T) {
	set := []Pod{{Name: "p", NodeCores: 8, Node: "n"}}
	e := New(DefaultParams())
	now := time.Unix(0, 0)
	window := func(k int, ceiling float64) {
		noise := 0.05 * ceiling * float64(1-2*(k%2))
		sig := readSignals(set, map[string]Signal{"p": {CPU: 1.2, NodeCPU: 8 - ceiling + 1.2 - noise, Requests: math.NaN()}})
		e.smoothCeilings(now, set, sig)
	}
	for k := range 20 {
		window(k, 2)
		if got := e.pods["p"].ceiling; k >= 10 && math.Abs(got/2-1) > 0.01 {
			t.Errorf("cycle %d: ceiling %.4f, want within 1%% of 2 cores", k, got)
		}
	}
	window(20, 3)
	if got := e.pods["p"].ceiling; math.Abs(got/3.15-1) > 1e-9 {
		t.Errorf("the first window after a neighbour left: ceiling %.4f, want that window's 3.15", got)
	}
	for k := 21; k < 40; k++ {
		window(k, 3)
	}
	window(40, 2)
	if got := e.pods["p"].ceiling; math.Abs(got/2.1-1) > 1e-9 {
		t.Errorf("the first window after a neighbour came back: ceiling %.4f, want that window's 2.1", got)
	}
}

// A saturated pod's node shows idle CPU that is noise around zero. Its
// negative half is averaged too: clamped at the pod's own CPU, the
// windows (2 and 2.2 here) would hold the average 5% above the pod's 2
// cores, and with CPU alone a window whose node showed 0.2 idle would not
// find the pod saturated. Averaged whole, they put the ceiling at its
// cores, and it is.
func TestSaturatedPodsCeilingIsItsCores(t *testing.T) {
	set := []Pod{{Name: "p", NodeCores: 4, Node: "n"}}
	e := New(DefaultParams())
	var sig signals
	for k := range 12 {
		nodeCPU := 4 - 0.2*float64(1-2*(k%2)) // 0.2 idle, then 0.2 over allocatable
		sig = readSignals(set, map[string]Signal{"p": {CPU: 2, NodeCPU: nodeCPU, Requests: math.NaN()}})
		e.smoothCeilings(time.Unix(0, 0), set, sig)
	}
	if got := e.pods["p"].ceiling; math.Abs(got/2-1) > 0.015 {
		t.Errorf("ceiling %.4f, want within 1.5%% of the pod's 2 cores", got)
	}
	sig = readSignals(set, map[string]Signal{"p": {CPU: 2, NodeCPU: 3.8, Requests: math.NaN()}})
	e.smoothCeilings(time.Unix(0, 0), set, sig)
	if !sig.pods[0].saturated() {
		t.Errorf("CPU alone, CPU 2 at its 2 cores, 0.2 idle on its node this window: limit %.4f, not saturated", sig.pods[0].limit)
	}
}

// The recent CPU is a sign of saturation only when it stands out from the
// pod's usual difference between the two rates: a pod whose recent CPU
// always wanders by 15% (few, long requests) is not alarmed when it
// wanders up to its limit, one whose two rates agree within 2% is.
func TestRecentCPUCountsOnlyAboveItsNoise(t *testing.T) {
	set := []Pod{{Name: "p", Cores: 2}}
	for _, tc := range []struct {
		name   string
		wander float64
		want   bool
	}{{"quiet", 0.02, true}, {"noisy", 0.15, false}} {
		e := New(DefaultParams())
		for k := range 10 {
			recent := 1.6 * math.Exp(tc.wander*float64(1-2*(k%2)))
			sig := readSignals(set, map[string]Signal{"p": {CPU: 1.6, RecentCPU: recent}})
			e.judgeRecent(set, sig)
		}
		// The window's CPU is 1.8 of 2; lately the pod used all of it.
		sig := readSignals(set, map[string]Signal{"p": {CPU: 1.8, RecentCPU: 2}})
		e.judgeRecent(set, sig)
		if got := sig.pods[0].saturated(); got != tc.want {
			t.Errorf("%s (recent CPU within %.0f%% of the window's): saturated %v, want %v", tc.name, 100*tc.wander, got, tc.want)
		}
	}
}

// With CPU alone, a pod without a limit whose node's CPU is unknown shows
// no sign of being overloaded: pinned at its cores, it only looks faster
// the more it is sent. The engine must not chase that (the bench's
// nolimits scenarios without node CPU went to thousands of times the
// oracle's p99): such pods keep the weight of their guessed cores and
// Learned stays false, so the operator keeps LEAST_REQUEST. With the
// node's CPU the same fleet is learned.
func TestCPUOnlyWithoutCeilingHoldsGuessedCoresUnderLeastRequest(t *testing.T) {
	cores := map[string]float64{"c1": 1, "c8": 8}
	node := map[string]float64{"c1": 4, "c8": 16} // guesses: 2 and 4 cores
	var set []Pod
	for name := range cores {
		set = append(set, Pod{Name: name, CPURequest: 1, NodeCores: node[name], Node: "node-" + name})
	}
	run := func(t *testing.T, withNodeCPU bool) (Result, bool) {
		t.Helper()
		p := DefaultParams()
		e := New(p)
		now := time.Unix(1000, 0)
		e.Applied(now, e.Weights(now, set))
		everLearned := false
		var res Result
		for range 30 {
			now = now.Add(30 * time.Second)
			// Traffic follows the live weights (ROUND_ROBIN); 5 cores of
			// work in all: c1 is sent more than its 1 core while the
			// weights follow the guesses.
			total := float64(e.live["c1"] + e.live["c8"])
			obs := Observation{Time: now, Signals: map[string]Signal{}}
			for name, c := range cores {
				use := min(c, 5*float64(e.live[name])/total)
				sig := Signal{CPU: use, Requests: math.NaN(), Latency: math.NaN()}
				if withNodeCPU {
					sig.NodeCPU = node[name] - c + use
				}
				obs.Signals[name] = sig
			}
			res = cycle(e, set, obs)
			everLearned = everLearned || res.Learned
		}
		return res, everLearned
	}
	t.Run("no node CPU", func(t *testing.T) {
		res, everLearned := run(t, false)
		if everLearned {
			t.Errorf("Learned was reported, so ROUND_ROBIN would feed the pinned pod; last: %s", res.Message)
		}
		if r := float64(res.Weights["c8"]) / float64(res.Weights["c1"]); r < 1.8 || r > 2.2 {
			t.Errorf("weights %v: c8/c1 = %.2f, want the guessed cores' 4/2 (the pinned c1 ran away if below)", res.Weights, r)
		}
		if !strings.Contains(res.Message, "LEAST_REQUEST is kept") || res.Unlearned != 2 {
			t.Errorf("Unlearned %d, want 2, or the message does not say why: %q", res.Unlearned, res.Message)
		}
	})
	t.Run("with node CPU", func(t *testing.T) {
		res, everLearned := run(t, true)
		if !everLearned || res.Unlearned != 0 {
			t.Errorf("never Learned with ceilings, or Unlearned %d; last: %s", res.Unlearned, res.Message)
		}
		if r := float64(res.Weights["c8"]) / float64(res.Weights["c1"]); r < 4 {
			t.Errorf("weights %v: c8/c1 = %.2f, want towards the cores' 8/1", res.Weights, r)
		}
	})
}

// A cycle in which a pod's node CPU is missing (a failed scrape) keeps the
// pod's average ceiling, so with CPU alone it neither turns blind nor
// flips the load balancer; past Expiry without node CPU it does.
func TestMissingNodeCPUKeepsTheCeilingUntilExpiry(t *testing.T) {
	set := []Pod{{Name: "a", CPURequest: 1, NodeCores: 4, Node: "n1"}, {Name: "b", CPURequest: 1, NodeCores: 4, Node: "n2"}}
	p := DefaultParams()
	e := New(p)
	now := time.Unix(1000, 0)
	e.Applied(now, e.Weights(now, set))
	obs := func(withNode bool) Observation {
		o := Observation{Time: now, Signals: map[string]Signal{}}
		for _, pod := range set {
			sig := Signal{CPU: 1, Requests: math.NaN()} // 2 cores each, half busy
			if withNode {
				sig.NodeCPU = 3
			}
			o.Signals[pod.Name] = sig
		}
		return o
	}
	var res Result
	for range 6 {
		now = now.Add(30 * time.Second)
		res = cycle(e, set, obs(true))
	}
	if !res.Learned {
		t.Fatalf("not Learned with node CPU: %s", res.Message)
	}
	now = now.Add(30 * time.Second)
	if res = e.Update(set, obs(false)); !res.Learned || strings.Contains(res.Message, "guessed cores") {
		t.Errorf("one cycle without node CPU: Learned %v, %q; want the average ceiling kept", res.Learned, res.Message)
	}
	for now.Sub(time.Unix(1000, 0)) < 3*time.Minute+p.Expiry+time.Minute {
		now = now.Add(30 * time.Second)
		res = e.Update(set, obs(false))
	}
	if res.Learned || !strings.Contains(res.Message, "2 pod(s) without a CPU limit or node CPU data") {
		t.Errorf("past Expiry without node CPU: Learned %v, %q; want the pods blind", res.Learned, res.Message)
	}
}

// Blind pods hold the weight of their guessed cores whatever the engine
// started from: after a restart seeded with runaway weights (what the
// ServiceEntry held before blind pods existed), after a cycle without
// their CPU data (no flip to Learned), and in a low-load cycle.
func TestBlindPodsHoldTheirGuessedCores(t *testing.T) {
	set := []Pod{
		{Name: "c1", CPURequest: 1, NodeCores: 4, Node: "n1"},  // guess: 2 cores
		{Name: "c8", CPURequest: 1, NodeCores: 16, Node: "n2"}, // guess: 4 cores
	}
	for k := range 20 {
		set = append(set, Pod{Name: fmt.Sprintf("l%d", k), Cores: 2})
	}
	obs := func(now time.Time, cpu float64, skip string) Observation {
		o := Observation{Time: now, Signals: map[string]Signal{}}
		for _, pod := range set {
			if pod.Name != skip {
				o.Signals[pod.Name] = Signal{CPU: cpu, Requests: math.NaN()}
			}
		}
		return o
	}
	ratio := func(res Result) float64 { return float64(res.Weights["c8"]) / float64(res.Weights["c1"]) }
	e := New(DefaultParams())
	now := time.Unix(1000, 0)
	runaway := map[string]uint32{"c1": 2000, "c8": 111}
	for _, pod := range set[2:] {
		runaway[pod.Name] = 1000
	}
	e.SeedSettled(now, runaway, Snapshot{})
	var res Result
	for range 10 {
		now = now.Add(30 * time.Second)
		// 90% of the cores guessed: weights follow cores, not the split.
		res = cycle(e, set, obs(now, 1.8, ""))
	}
	if r := ratio(res); r < 1.8 || r > 2.2 || res.Learned || res.Unlearned != 2 {
		t.Fatalf("after a seeded restart: weights %v (c8/c1 %.2f, want the guesses' 2), Learned %v, Unlearned %d", res.Weights, r, res.Learned, res.Unlearned)
	}
	// c1 has no CPU data for a cycle: it is still blind; 20 limited pods
	// carry more than 90% of the weight, so only that keeps Learned false.
	now = now.Add(30 * time.Second)
	if res = e.Update(set, obs(now, 1.8, "c1")); res.Learned || res.Unlearned != 2 {
		t.Errorf("a cycle without c1's CPU: Learned %v, Unlearned %d; want false and 2", res.Learned, res.Unlearned)
	}
	now = now.Add(30 * time.Second)
	if res = e.Update(set, obs(now, 0.001, "")); res.Mode != ModeLowLoad || res.Learned || res.Unlearned != 2 {
		t.Errorf("low load: mode %s, Learned %v, Unlearned %d; want LowLoad, false and 2", res.Mode, res.Learned, res.Unlearned)
	}
}

// A held ceiling belongs to the node it was seen on: a pod that comes back
// on another node (a StatefulSet's pod keeps its name) starts over.
func TestHeldCeilingIsDroppedOnAnotherNode(t *testing.T) {
	e := New(DefaultParams())
	on := func(node string) []Pod { return []Pod{{Name: "p", CPURequest: 1, NodeCores: 4, Node: node}} }
	now := time.Unix(1000, 0)
	sig := readSignals(on("n1"), map[string]Signal{"p": {CPU: 1, NodeCPU: 3, Requests: math.NaN()}})
	e.smoothCeilings(now, on("n1"), sig)
	if l := sig.pods[0].limit; l != 2 {
		t.Fatalf("on n1: limit %v, want 2", l)
	}
	gap := func(node string) float64 {
		now = now.Add(30 * time.Second)
		sig := readSignals(on(node), map[string]Signal{"p": {CPU: 1, Requests: math.NaN()}})
		e.smoothCeilings(now, on(node), sig)
		return sig.pods[0].limit
	}
	if l := gap("n1"); l != 2 {
		t.Errorf("n1 without node CPU: limit %v, want the held 2", l)
	}
	if l := gap("n2"); l != 0 {
		t.Errorf("n2 without node CPU: limit %v, want none (n1's ceiling is not n2's)", l)
	}
}

// Estimated cores 10% apart are pooled before they set
// utilisations (noise, for pods of one core count), cores twice apart are
// not, and cores from a limit are exact; a pod of which nothing is known
// counts as the median of the others.
func TestSplitCoresPoolsEstimates(t *testing.T) {
	set := []Pod{
		{Name: "e2", CPURequest: 1, NodeCores: 16},
		{Name: "e2b", CPURequest: 1, NodeCores: 16},
		{Name: "e4", CPURequest: 1, NodeCores: 16},
		{Name: "l2", Cores: 2},
		{Name: "l2b", Cores: 2.2},
		{Name: "unknown"},
	}
	e := New(DefaultParams())
	e.state("e2").cores, e.state("e2b").cores, e.state("e4").cores = 2, 2.2, 4
	cores := e.splitCores(set)
	pooled := poolCores(set, cores)
	want := []float64{2, 2.2, 4, 2, 2.2, 2.2}
	for i := range want {
		if !near(cores[i], want[i], 1e-9) {
			t.Errorf("%s: cores %v, want %v", set[i].Name, cores[i], want[i])
		}
	}
	if !near(pooled[0], pooled[1], 0.02) || !(pooled[1] < cores[1]) || !(pooled[0] > cores[0]) {
		t.Errorf("estimates 2 and 2.2 pooled to %v and %v: want them within 2%% of each other", pooled[0], pooled[1])
	}
	if !near(pooled[2], 4, 0.01) {
		t.Errorf("an estimate of 4 cores pooled to %v: want it left near 4", pooled[2])
	}
	if pooled[3] != 2 || pooled[4] != 2.2 {
		t.Errorf("limits 2 and 2.2 pooled to %v and %v: want them exact", pooled[3], pooled[4])
	}
}
