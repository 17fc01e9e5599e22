package main

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"
)

type outcome uint8

const (
	outcomeOK      outcome = iota
	outcomeTimeout         // the client gave up after its timeout
	outcomeError           // connection error or non-200
)

// sample is one request as its sidecar measured it.
type sample struct {
	at  float64 // seconds since traffic started, when the request was sent
	end float64 // when it completed (or timed out)
	lat float64 // seconds (the timeout for a timed-out request)
	pod int
	out outcome
}

// recorder keeps every request of the run (a few hundred per second).
type recorder struct {
	t0 time.Time
	mu sync.Mutex
	s  []sample
}

func (r *recorder) add(start time.Time, pod int, lat time.Duration, o outcome) {
	s := sample{at: start.Sub(r.t0).Seconds(), end: time.Since(r.t0).Seconds(), lat: lat.Seconds(), pod: pod, out: o}
	r.mu.Lock()
	r.s = append(r.s, s)
	r.mu.Unlock()
}

// window returns the requests sent in [from, to) seconds.
func (r *recorder) window(from, to float64) []sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []sample
	for _, s := range r.s {
		if s.at >= from && s.at < to {
			out = append(out, s)
		}
	}
	return out
}

// completed returns the requests that completed in [from, to) seconds.
func (r *recorder) completed(from, to float64) []sample {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []sample
	for _, s := range r.s {
		if s.end >= from && s.end < to {
			out = append(out, s)
		}
	}
	return out
}

// latencyStats summarizes requests. Timed-out requests count with the
// timeout as their latency (what the caller experienced); errors are
// counted apart and left out of the percentiles.
type latencyStats struct {
	N, Timeouts, Errors int
	P50, P99, P999      float64 // seconds
}

// latencyOf summarizes the samples of one pod, or of all with pod < 0.
func latencyOf(samples []sample, pod int) latencyStats {
	var st latencyStats
	lats := make([]float64, 0, len(samples))
	for _, s := range samples {
		if pod >= 0 && s.pod != pod {
			continue
		}
		st.N++
		switch s.out {
		case outcomeError:
			st.Errors++
			continue
		case outcomeTimeout:
			st.Timeouts++
		}
		lats = append(lats, s.lat)
	}
	slices.Sort(lats)
	st.P50, st.P99, st.P999 = quantile(lats, 0.5), quantile(lats, 0.99), quantile(lats, 0.999)
	return st
}

// quantile of sorted values (nearest rank); NaN when empty.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// fmtLat prints seconds as "41ms" or "1.23s"; "-" for no data.
func fmtLat(s float64) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case s < 0.010:
		return fmt.Sprintf("%.1fms", s*1000)
	case s < 1:
		return fmt.Sprintf("%.0fms", s*1000)
	default:
		return fmt.Sprintf("%.2fs", s)
	}
}

// spread returns max/min and max/mean of positive values.
func spread(v []float64) (maxMin, maxMean float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN()
	}
	lo, hi, sum := math.Inf(1), math.Inf(-1), 0.0
	for _, x := range v {
		lo, hi, sum = math.Min(lo, x), math.Max(hi, x), sum+x
	}
	if lo <= 0 {
		return math.Inf(1), hi / (sum / float64(len(v)))
	}
	return hi / lo, hi / (sum / float64(len(v)))
}
