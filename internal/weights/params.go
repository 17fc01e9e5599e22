package weights

import (
	"errors"
	"fmt"
	"math"
	"time"
)

const (
	// MaxEndpoints is the most endpoints Istio accepts in one ServiceEntry.
	// Weight bounds are chosen so that this many weights still sum below
	// 2^32-1, the limit Envoy puts on the weights of one locality.
	MaxEndpoints = 4096
	// maxWeightSum is the largest sum of weights the engine ever produces.
	maxWeightSum = math.MaxUint32 - 1
	// maxMeanTimesRatio keeps MeanWeight*MaxRatio*MaxEndpoints below 2^32-1.
	maxMeanTimesRatio = maxWeightSum / MaxEndpoints
)

// DefaultParams returns parameters that suit a Service scraped every 15 s
// and queried every 30 s with rate(...[1m]).
func DefaultParams() Params {
	return Params{
		QueryWindow:    time.Minute,
		ScrapeInterval: 15 * time.Second,
		DeadBand:       0.05,
		MaxStep:        1.0,
		MaxRatio:       10,
		Smoothing:      0.05,
		MinCPU:         0.05,
		SlowStart:      0,
		Expiry:         5 * time.Minute,
		PoolByHardware: false,
		DrainTime:      15 * time.Second,
		MeanWeight:     1000,
	}
}

// Validate reports every parameter that makes no sense, joined in one error.
func (p Params) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if p.QueryWindow <= 0 {
		bad("query window %v must be positive", p.QueryWindow)
	}
	if p.ScrapeInterval < 0 {
		bad("scrape interval %v must not be negative", p.ScrapeInterval)
	}
	if p.QueryWindow > 0 && p.ScrapeInterval > 0 && p.QueryWindow < 2*p.ScrapeInterval {
		// rate() needs two samples inside its window.
		bad("query window %v must be at least twice the scrape interval %v", p.QueryWindow, p.ScrapeInterval)
	}
	if !inRange(p.DeadBand, 0, 0.5) {
		bad("dead band %v must be between 0 and 0.5", p.DeadBand)
	}
	if !inRange(p.MaxStep, 0, 10) || p.MaxStep == 0 {
		bad("max step %v must be above 0 and at most 10", p.MaxStep)
	}
	if !inRange(p.MaxRatio, 1, 1000) {
		bad("max ratio %v must be between 1 and 1000", p.MaxRatio)
	}
	if !inRange(p.Smoothing, 0, 1) || p.Smoothing == 0 {
		bad("smoothing %v must be above 0 and at most 1", p.Smoothing)
	}
	if !inRange(p.MinCPU, 0, math.MaxFloat64) {
		bad("min CPU %v must be a non-negative number of cores", p.MinCPU)
	}
	if p.SlowStart < 0 {
		bad("slow start %v must not be negative", p.SlowStart)
	}
	if p.Expiry <= 0 {
		bad("expiry %v must be positive", p.Expiry)
	}
	if p.DrainTime < 0 {
		bad("drain time %v must not be negative", p.DrainTime)
	}
	if p.MeanWeight == 0 {
		bad("mean weight must be positive")
	} else if inRange(p.MaxRatio, 1, 1000) {
		mean := float64(p.MeanWeight)
		if mean/p.MaxRatio < 1/maxRounding {
			bad("mean weight %d divided by max ratio %v must be at least %v, or rounding distorts small weights",
				p.MeanWeight, p.MaxRatio, 1/maxRounding)
		}
		if mean*p.MaxRatio > maxMeanTimesRatio {
			bad("mean weight %d times max ratio %v must be at most %d, so that %d endpoints sum below 2^32-1",
				p.MeanWeight, p.MaxRatio, maxMeanTimesRatio, MaxEndpoints)
		}
	}
	return errors.Join(errs...)
}

// sanitized returns p with every invalid field replaced by its default, so
// an engine given nonsense still behaves; callers should Validate first to
// tell the user.
func (p Params) sanitized() Params {
	d := DefaultParams()
	if p.QueryWindow <= 0 {
		p.QueryWindow = d.QueryWindow
	}
	if p.ScrapeInterval < 0 || 2*p.ScrapeInterval > p.QueryWindow {
		p.ScrapeInterval = min(d.ScrapeInterval, p.QueryWindow/2)
	}
	if !inRange(p.DeadBand, 0, 0.5) {
		p.DeadBand = d.DeadBand
	}
	if !inRange(p.MaxStep, 0, 10) || p.MaxStep == 0 {
		p.MaxStep = d.MaxStep
	}
	if !inRange(p.MaxRatio, 1, 1000) {
		p.MaxRatio = d.MaxRatio
	}
	if !inRange(p.Smoothing, 0, 1) || p.Smoothing == 0 {
		p.Smoothing = d.Smoothing
	}
	if !inRange(p.MinCPU, 0, math.MaxFloat64) {
		p.MinCPU = d.MinCPU
	}
	if p.SlowStart < 0 {
		p.SlowStart = 0
	}
	if p.Expiry <= 0 {
		p.Expiry = d.Expiry
	}
	if p.DrainTime < 0 {
		p.DrainTime = d.DrainTime
	}
	mean := float64(p.MeanWeight)
	if p.MeanWeight == 0 || mean/p.MaxRatio < 1/maxRounding || mean*p.MaxRatio > maxMeanTimesRatio {
		p.MeanWeight, p.MaxRatio = d.MeanWeight, d.MaxRatio
	}
	return p
}

// inRange reports lo <= v <= hi, false for NaN.
func inRange(v, lo, hi float64) bool { return v >= lo && v <= hi }

// slowStartFloor is the share of its full weight a pod gets the moment it
// becomes ready when SlowStart is on: Envoy's slow start starts at 10%.
const slowStartFloor = 0.1

// maxRounding is the most a weight's rounding to an integer may move it:
// a tenth, at the smallest weight (MeanWeight/MaxRatio at least 10).
const maxRounding = 0.1

// rampFactor is how far through slow start pod is at now: slowStartFloor
// when it just became ready, 1 once SlowStart has passed.
func (p Params) rampFactor(pod Pod, now time.Time) float64 {
	if p.SlowStart <= 0 || pod.ReadySince.IsZero() {
		return 1
	}
	elapsed := now.Sub(pod.ReadySince)
	if elapsed >= p.SlowStart {
		return 1
	}
	if elapsed < 0 {
		elapsed = 0
	}
	return slowStartFloor + (1-slowStartFloor)*float64(elapsed)/float64(p.SlowStart)
}

// horizon is how far back an observation can reach, with a margin for
// backends that also use the sample just before the window.
func (p Params) horizon() time.Duration { return p.QueryWindow + p.ScrapeInterval }
