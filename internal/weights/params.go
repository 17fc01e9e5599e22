package weights

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// maxWeightSum is the largest sum of weights the engine ever produces:
// Envoy limits the weights of one locality to 2^32-1 (see settle).
const maxWeightSum = math.MaxUint32 - 1

// smallestWeight is the weight of a pod at mean/MaxRatio: rounding to an
// integer moves it by at most half a percent. The mean weight is
// smallestWeight*MaxRatio (2000 at the default ratio of 20), and with
// MaxRatio at most 100 a Service of 4096 endpoints, Istio's limit, sums
// below 2^32-1.
const smallestWeight = 100

// DefaultParams returns parameters that suit a Service scraped every 15 s
// and queried every 30 s with rate(...[1m]).
func DefaultParams() Params {
	return Params{
		Sampling:       Sampling{QueryWindow: time.Minute, ScrapeInterval: 15 * time.Second},
		DeadBand:       0.05,
		MaxStep:        1.0,
		MaxRatio:       20,
		Smoothing:      0.05,
		MinCPU:         0.05,
		SlowStart:      0,
		Expiry:         5 * time.Minute,
		PoolByHardware: false,
		DrainTime:      15 * time.Second,
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
	if !inRange(p.MaxRatio, 1, 100) {
		bad("max ratio %v must be between 1 and 100", p.MaxRatio)
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
	if !inRange(p.MaxRatio, 1, 100) {
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
	return p
}

// inRange reports lo <= v <= hi, false for NaN.
func inRange(v, lo, hi float64) bool { return v >= lo && v <= hi }

// rampFactor is how far through slow start pod is at now: 0 when it just
// became ready, 1 once SlowStart has passed. The ramp starts at the
// smallest weight MaxRatio allows (see proposalFrom).
func (p Params) rampFactor(pod Pod, now time.Time) float64 {
	if p.SlowStart <= 0 || pod.ReadySince.IsZero() {
		return 1
	}
	elapsed := now.Sub(pod.ReadySince)
	if elapsed >= p.SlowStart {
		return 1
	}
	return max(float64(elapsed), 0) / float64(p.SlowStart)
}

// MeanWeight is the mean weight the engine scales its weights to (see
// smallestWeight): 100 times MaxRatio.
func (p Params) MeanWeight() float64 { return smallestWeight * p.MaxRatio }

// horizon is how far back an observation can reach, with a margin for
// backends that also use the sample just before the window.
func (p Params) horizon() time.Duration { return p.QueryWindow + p.ScrapeInterval }

// misalignment is how far a rate()'s span may sit off another's, relative
// to the span: ScrapeInterval over the shortest span, QueryWindow minus
// it (see rateWindows); 0 when rates cover exactly the window.
func (p Params) misalignment() float64 {
	if p.ScrapeInterval <= 0 || p.QueryWindow <= p.ScrapeInterval {
		return 0
	}
	return float64(p.ScrapeInterval) / float64(p.QueryWindow-p.ScrapeInterval)
}
