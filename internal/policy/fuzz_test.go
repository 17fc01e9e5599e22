package policy

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
)

// policyInput reads a run of the policy from arbitrary bytes; past the end
// it reads zeros, so every input is a valid run.
type policyInput struct{ data []byte }

func (in *policyInput) byte() byte {
	if len(in.data) == 0 {
		return 0
	}
	b := in.data[0]
	in.data = in.data[1:]
	return b
}

// float returns what exporters and queries really produce, broken values
// included.
func (in *policyInput) float() float64 {
	switch b := in.byte(); b % 8 {
	case 0:
		return math.NaN()
	case 1:
		return math.Inf(1)
	case 2:
		return -1
	case 3:
		return 0
	default:
		return float64(b) * math.Pow(10, float64(int(in.byte()%8)-4))
	}
}

// duration is zero, negative, tiny or a few seconds to minutes.
func (in *policyInput) duration() time.Duration {
	switch b := in.byte(); b % 6 {
	case 0:
		return 0
	case 1:
		return -time.Second
	case 2:
		return time.Duration(b)
	default:
		return time.Duration(b) * time.Second
	}
}

func (in *policyInput) config() Config {
	cfg := Config{Cycle: in.duration(), Engine: weights.DefaultParams(), Balancer: weights.BalancerRoundRobin}
	if in.byte()%2 == 0 {
		cfg.Balancer = weights.BalancerLeastRequest
	}
	switch in.byte() % 3 {
	case 0:
		cfg.LookInterval = LookInterval(cfg.Engine.ScrapeInterval)
	case 1:
		cfg.LookInterval = in.duration()
	}
	if b := in.byte(); b%2 == 0 {
		cfg.Jitter = NewJitter(uint64(b))
	}
	if in.byte()%4 == 0 {
		cfg.Engine.ScrapeInterval, cfg.Engine.QueryWindow = in.duration(), in.duration()
	}
	return cfg
}

func (in *policyInput) pods() []weights.Pod {
	pods := make([]weights.Pod, int(in.byte()%6)+1)
	for i := range pods {
		pods[i] = weights.Pod{Name: fmt.Sprintf("web-%d", in.byte()%8), Cores: in.float(), NodeCores: in.float()}
	}
	return pods
}

func (in *policyInput) observation(pods []weights.Pod) weights.Observation {
	obs := weights.Observation{Signals: map[string]weights.Signal{}}
	if in.byte()%9 == 0 {
		obs.Err = errors.New("down")
	}
	for _, pod := range pods {
		if in.byte()%5 != 0 {
			obs.Signals[pod.Name] = weights.Signal{CPU: in.float(), Requests: in.float(), Latency: in.float(),
				NodeCPU: in.float(), RecentCPU: in.float(), RecentLatency: in.float()}
		}
	}
	return obs
}

// checkPolicyWeights: a weight for every pod asked of, none zero, summing
// below 2^32-1 (Envoy's bound).
func checkPolicyWeights(t *testing.T, what string, pods []weights.Pod, w map[string]uint32) {
	t.Helper()
	names := map[string]bool{}
	for _, pod := range pods {
		names[pod.Name] = true
	}
	sum := uint64(0)
	for name, v := range w {
		if !names[name] || v == 0 {
			t.Fatalf("%s: weight %d for %q (pods %v)", what, v, name, pods)
		}
		sum += uint64(v)
	}
	if len(w) != len(names) || sum >= math.MaxUint32 {
		t.Fatalf("%s: %d weights for %d pods, summing to %d", what, len(w), len(names), sum)
	}
}

// Whatever the configuration, the seed, the clock (it may go backwards) and
// the answers, the policy does not panic, its weights keep the invariants,
// Next changes nothing and the actions it asks for move on: acting on one
// does not make the same action due at the same instant again.
func FuzzPolicy(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x1e\x01\x00\x02\x04\x03web\x10\x20\x30\x40\x50\x60\x70"))
	f.Add([]byte("\x03\x00\x01\x00\x07\x05\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := &policyInput{data: data}
		p := New(in.config())
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		pods := in.pods()
		var live map[string]uint32
		if in.byte()%2 == 0 {
			live = map[string]uint32{}
			for _, pod := range pods {
				live[pod.Name] = uint32(in.byte()) * 1000
			}
		}
		lbs := []weights.Balancer{"", weights.BalancerRoundRobin, weights.BalancerLeastRequest, "RANDOM"}
		whys := []Reason{"", ReasonLearning, ReasonLearned, ReasonAlarm, ReasonUnsettled, ReasonFallback, ReasonCPUAtLimit, ReasonAtCapacity, "Gibberish"}
		snap := weights.Snapshot{Noise: in.float(), NoiseCycles: int(in.byte()), CycleSeconds: in.float(), CoresNoise: in.float(), CoresNoiseMax: in.float(), Spread: in.float()}
		p.OptIn(now, pods, live, lbs[in.byte()%4], whys[int(in.byte())%len(whys)], snap)
		for step := range int(in.byte()%12) + 1 {
			now = now.Add(time.Duration(int(in.byte())-32) * 5 * time.Second)
			switch in.byte() % 6 {
			case 0:
				p.Configure(now, in.config())
			case 1:
				pods = in.pods()
			}
			for range 64 {
				act, at := p.Next(now)
				if again, at2 := p.Next(now); again != act || !at2.Equal(at) {
					t.Fatalf("step %d: Next changed its answer: %s at %v, then %s at %v", step, act, at, again, at2)
				}
				if act == Wait || at.After(now) {
					break
				}
				switch act {
				case Look:
					p.Look(at, in.observation(pods))
				case Cycle:
					d := p.Cycle(at, in.observation(pods), pods)
					if d.Balancer != weights.BalancerRoundRobin && d.Balancer != weights.BalancerLeastRequest {
						t.Fatalf("step %d: balancer %q", step, d.Balancer)
					}
				}
				if act2, at2 := p.Next(now); act2 == act && at2.Equal(at) {
					t.Fatalf("step %d: %s at %v is due again after it ran", step, act, at)
				}
				w := p.Weights(at, pods)
				checkPolicyWeights(t, fmt.Sprintf("step %d after %s", step, act), pods, w)
				if in.byte()%4 != 0 {
					p.Applied(at, w)
				}
			}
			if lb, why := p.Balancer(); (lb != weights.BalancerRoundRobin && lb != weights.BalancerLeastRequest) || why == "" {
				t.Fatalf("step %d: balancer %q (%q)", step, lb, why)
			}
			_, _ = p.SnapshotToPersist()
		}
	})
}
