package weights

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// fuzzInput reads a scenario from arbitrary bytes; past the end it reads
// zeros, so every input is a valid scenario.
type fuzzInput struct{ data []byte }

func (in *fuzzInput) byte() byte {
	if len(in.data) == 0 {
		return 0
	}
	b := in.data[0]
	in.data = in.data[1:]
	return b
}

// float returns the values exporters and queries really produce, broken
// ones included.
func (in *fuzzInput) float() float64 {
	switch b := in.byte(); b {
	case 0:
		return math.NaN()
	case 1:
		return math.Inf(1)
	case 2:
		return math.Inf(-1)
	case 3:
		return -1
	case 4:
		return 0
	case 5:
		return math.SmallestNonzeroFloat64
	case 6:
		return math.MaxFloat64
	case 7:
		return 1e300
	default:
		return float64(b) * math.Pow(10, float64(int(in.byte()%24)-12))
	}
}

func (in *fuzzInput) weight() uint32 {
	switch b := in.byte(); b {
	case 0:
		return 0
	case 1:
		return math.MaxUint32
	default:
		return uint32(b) * uint32(in.byte()+1)
	}
}

type fuzzStep struct {
	obs      Observation
	apply    bool
	mirror   []Pod // a changed set asked of Weights
	seedMap  map[string]uint32
	settled  bool     // a restarted manager: new engines seeded by SeedSettled with snap
	learning bool     // by SeedLearning instead (the manager before was still learning)
	snap     Snapshot // what the manager before persisted, however odd
}

func decodeScenario(data []byte) (Params, []Pod, []fuzzStep) {
	in := &fuzzInput{data: data}
	p := DefaultParams()
	switch in.byte() % 5 {
	case 1:
		p.SlowStart = time.Minute
		p.PoolByHardware = true
	case 2:
		p.DeadBand, p.Smoothing, p.MaxStep = 0, 1, 10
	case 3:
		p.MaxRatio = 100 // the largest: 4096 weights of up to 100x the mean
	case 4:
		p.QueryWindow, p.MaxRatio, p.DeadBand = -1, math.NaN(), 7 // nonsense: defaults apply
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	n := int(in.byte()%24) + 1
	pods := make([]Pod, n)
	for i := range pods {
		pods[i] = Pod{
			Name:          fmt.Sprintf("pod-%d", in.byte()%32), // duplicates happen
			Locality:      fmt.Sprintf("r/z%d/", in.byte()%3),
			HardwareClass: []string{"", "a", "b"}[in.byte()%3],
			Cores:         in.float(),
			CPURequest:    in.float(),
			NodeCores:     in.float(),
		}
		if b := in.byte(); b%2 == 0 {
			pods[i].ReadySince = start.Add(time.Duration(b) * time.Second)
		}
	}
	var steps []fuzzStep
	now := start
	for range int(in.byte()%8) + 1 {
		now = now.Add(time.Duration(int(in.byte())-16) * time.Second) // sometimes backwards
		step := fuzzStep{obs: Observation{Time: now, Signals: map[string]Signal{}}, apply: in.byte()%4 != 0}
		if in.byte()%7 == 0 {
			step.obs.Err = errors.New("down")
		}
		step.obs.Early = in.byte()%5 == 0
		step.obs.Balancer = []Balancer{"", BalancerRoundRobin, BalancerLeastRequest}[in.byte()%3]
		for _, pod := range pods {
			if in.byte()%5 != 0 {
				sig := Signal{CPU: in.float(), Requests: in.float(), Latency: in.float()}
				if in.byte()%3 == 0 {
					sig.CPU = pod.Cores // at its CPU limit: the censored readings
				}
				if b := in.byte(); b%2 == 0 {
					sig.NodeCPU, sig.RecentCPU, sig.RecentLatency = in.float(), in.float(), in.float()
				} else if b%3 == 0 {
					sig.RecentLatency = sig.Latency * float64(b%16) // a recent queue, as alarms see it
				}
				if b := in.byte(); b%2 == 0 {
					sig.RecentRequests = in.float()
				} else if b%3 == 0 {
					sig.RecentRequests = sig.Requests * float64(b%8) / 4 // served short or long, as the alarm's gate sees it
				}
				step.obs.Signals[pod.Name] = sig
			}
		}
		if in.byte()%5 == 0 {
			step.mirror = pods[:len(pods)/2+1]
		}
		if in.byte()%9 == 0 {
			step.seedMap = map[string]uint32{}
			for _, pod := range pods {
				step.seedMap[pod.Name] = in.weight()
			}
			b := in.byte()
			step.settled, step.learning = b%2 == 0, b%4 == 2
			if step.settled {
				step.snap = Snapshot{Noise: in.float(), NoiseCycles: int(in.byte()) - 8, CycleSeconds: in.float(), CoresNoise: in.float(), CoresNoiseMax: in.float(), Spread: in.float()}
			}
		}
		steps = append(steps, step)
	}
	return p, pods, steps
}

// checkWeights asserts the invariants every published weight set keeps.
func checkWeights(t *testing.T, what string, pods []Pod, w map[string]uint32) {
	t.Helper()
	names := map[string]bool{}
	for _, pod := range pods {
		names[pod.Name] = true
	}
	if len(w) != len(names) {
		t.Fatalf("%s: %d weights for %d pods: %v", what, len(w), len(names), w)
	}
	sum := uint64(0)
	for name, v := range w {
		if !names[name] {
			t.Fatalf("%s: weight for unknown pod %q", what, name)
		}
		if v == 0 {
			t.Fatalf("%s: %s has weight 0", what, name)
		}
		sum += uint64(v)
	}
	if sum >= math.MaxUint32 {
		t.Fatalf("%s: weights sum to %d, not below 2^32-1", what, sum)
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 5, 1, 0, 1, 0, 2, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte("\x01\x0b\x02\x01\x00\x10\x07\x02\x09\x20\x30\x00\x40\xff\x41\x05\x06\x07\x08\x09\x0a\x0b"))
	f.Add([]byte("\x03\x17 some longer scenario with many pods and a few cycles of odd signals ..........."))
	f.Add([]byte("\x02\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, pods, steps := decodeScenario(data)
		reversed := slices.Clone(pods)
		slices.Reverse(reversed)
		e, mirrorImage := New(p), New(p)
		for k, step := range steps {
			switch {
			case step.learning:
				e, mirrorImage = New(p), New(p)
				e.SeedLearning(step.obs.Time, step.seedMap, step.snap)
				mirrorImage.SeedLearning(step.obs.Time, step.seedMap, step.snap)
			case step.settled:
				e, mirrorImage = New(p), New(p)
				e.SeedSettled(step.obs.Time, step.seedMap, step.snap)
				mirrorImage.SeedSettled(step.obs.Time, step.seedMap, step.snap)
			case step.seedMap != nil:
				e.Seed(step.obs.Time, step.seedMap)
				mirrorImage.Seed(step.obs.Time, step.seedMap)
			}
			pod, why, ring := e.Alarm(pods, step.obs)
			otherPod, _, otherRing := mirrorImage.Alarm(reversed, step.obs)
			if ring != otherRing || pod != otherPod || ring != (why != "") {
				t.Fatalf("cycle %d: alarm depends on pod order or has no reason: %q %q %v, %q %v", k+1, pod, why, ring, otherPod, otherRing)
			}
			res := e.Update(pods, step.obs)
			other := mirrorImage.Update(reversed, step.obs)
			what := fmt.Sprintf("cycle %d (%s)", k+1, res.Mode)
			checkWeights(t, what, pods, res.Weights)
			if res.Mode == "" || res.Message == "" {
				t.Fatalf("%s: empty mode or message", what)
			}
			if res.Learned && (res.Mode == ModeFallback || res.Mode == ModeNoData) {
				t.Fatalf("%s: Learned without usable data", what)
			}
			// A relative capacity is finite and not negative; it rounds
			// to 0 only when the pod's declared cores are a vanishing
			// fraction of the others' (a limit of 5e-324 cores).
			for name, c := range res.Capacity {
				if !(c >= 0) || math.IsInf(c, 0) {
					t.Fatalf("%s: capacity of %s is %v", what, name, c)
				}
			}
			if fmt.Sprint(res) != fmt.Sprint(other) {
				t.Fatalf("%s: result depends on pod order:\n%v\n%v", what, res, other)
			}
			if step.apply && res.Changed {
				e.Applied(step.obs.Time, res.Weights)
				mirrorImage.Applied(step.obs.Time, other.Weights)
			}
			if step.mirror != nil {
				w := e.Weights(step.obs.Time, step.mirror)
				checkWeights(t, what+" mirror", step.mirror, w)
				if fmt.Sprint(w) != fmt.Sprint(mirrorImage.Weights(step.obs.Time, step.mirror)) {
					t.Fatalf("%s: mirror weights differ between engines", what)
				}
			}
		}
	})
}
