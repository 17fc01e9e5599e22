package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// windowStats is one measurement window.
type windowStats struct {
	From, To float64 // seconds since traffic started
	Lat      latencyStats
	RPS      float64
	Util     []float64 // busy time / (workers x window) per pod
	Share    []float64 // share of the requests per pod
	PodLat   []latencyStats
	// UtilMaxMin and UtilMaxMean are the utilisation spread.
	UtilMaxMin, UtilMaxMean float64
}

// Summary is the demo's result.
type Summary struct {
	Scenario string
	Istiod   bool
	Sidecars int
	Timeout  time.Duration
	Fleet    []podSpec

	// Before: the plain Service, Istio's default LEAST_REQUEST, no
	// optimizer. After: after convergence.
	Before, After windowStats
	Convergence   convergence
	// AfterPolicy is the load balancer the sidecars used at the end.
	AfterPolicy string
	// ServiceEntry writes (optimizer_writes_total{kind="ServiceEntry"}).
	SEWrites struct{ Setup, Baseline, Optimizing, After, Total int }
	// Cycles the operator ran in all.
	Cycles int
	// FinalWeights are what sidecar 0 balanced with at the end; IdealWeights
	// are proportional to each pod's true capacity, with the same sum.
	FinalWeights []uint32
	IdealWeights []float64
}

func (d *demo) window(from, to string) windowStats {
	d.mu.Lock()
	f, t := d.marks[from], d.marks[to]
	b0, b1 := d.busyAt[from], d.busyAt[to]
	d.mu.Unlock()
	samples := d.rec.window(f, t)
	w := windowStats{From: f, To: t, Lat: latencyOf(samples, -1), RPS: float64(len(samples)) / (t - f)}
	counts := make([]int, len(d.fleet))
	for _, s := range samples {
		counts[s.pod]++
	}
	for i, p := range d.fleet {
		w.Util = append(w.Util, (b1[i]-b0[i]).Seconds()/(float64(p.Workers)*(t-f)))
		w.Share = append(w.Share, float64(counts[i])/float64(max(len(samples), 1)))
		w.PodLat = append(w.PodLat, latencyOf(samples, i))
	}
	w.UtilMaxMin, w.UtilMaxMean = spread(w.Util)
	return w
}

func (d *demo) summarize() *Summary {
	s := &Summary{
		Scenario: d.cfg.Name, Istiod: d.istiod != nil, Sidecars: d.cfg.Sidecars, Timeout: d.cfg.Timeout.Duration,
		Fleet:  d.fleet,
		Before: d.window(markBaselineStart, markBaselineEnd),
		After:  d.window(markAfterStart, markAfterEnd),
	}
	d.mu.Lock()
	s.Convergence = d.conv
	op := d.opAt
	s.FinalWeights = d.finalView
	d.mu.Unlock()
	s.AfterPolicy = d.sidecars[0].Policy()
	s.SEWrites.Setup = op[markBaselineStart].SEWrites
	s.SEWrites.Baseline = op[markSwitch].SEWrites - op[markBaselineStart].SEWrites
	s.SEWrites.Optimizing = op[markAfterStart].SEWrites - op[markSwitch].SEWrites
	s.SEWrites.After = op[markAfterEnd].SEWrites - op[markAfterStart].SEWrites
	s.SEWrites.Total = op[markAfterEnd].SEWrites
	s.Cycles = op[markAfterEnd].Cycles
	var sumW, sumC float64
	for i, p := range d.fleet {
		sumW += float64(s.FinalWeights[i])
		sumC += p.Capacity(d.cfg.Work.Duration)
	}
	for _, p := range d.fleet {
		s.IdealWeights = append(s.IdealWeights, sumW*p.Capacity(d.cfg.Work.Duration)/sumC)
	}
	return s
}

// p99Text marks a p99 that is the timeout.
func (s *Summary) latText(v float64) string {
	if !math.IsNaN(v) && v >= s.Timeout.Seconds() {
		return fmtLat(v) + " (timeout)"
	}
	return fmtLat(v)
}

func pct(n, of int) string {
	return fmt.Sprintf("%.1f%%", 100*float64(n)/float64(max(of, 1)))
}

// Print writes the before/after summary.
func (s *Summary) Print(w io.Writer) {
	b, a := s.Before, s.After
	src := "the ServiceEntry, without istiod"
	if s.Istiod {
		src = "istiod over xDS"
	}
	line := strings.Repeat("=", 96)
	fmt.Fprintf(w, "\n%s\nSummary: same fleet, same offered load, same %d sidecars (weights from %s)\n%s\n", line, s.Sidecars, src, line)
	row := func(name, before, after, note string) {
		fmt.Fprintf(w, "  %-26s %-24s %-24s %s\n", name, before, after, note)
	}
	row("", "before: LEAST_REQUEST", "after convergence", "")
	row("load balancer", "Istio default, no optimizer", s.AfterPolicy+", optimized weights", "")
	row("window", fmt.Sprintf("t=%.0f-%.0fs (%.0fs)", b.From, b.To, b.To-b.From), fmt.Sprintf("t=%.0f-%.0fs (%.0fs)", a.From, a.To, a.To-a.From), "")
	row("requests", fmt.Sprintf("%d (%.0f/s)", b.Lat.N, b.RPS), fmt.Sprintf("%d (%.0f/s)", a.Lat.N, a.RPS), "")
	row("p50 latency", s.latText(b.Lat.P50), s.latText(a.Lat.P50), ratio(b.Lat.P50, a.Lat.P50))
	row("p99 latency", s.latText(b.Lat.P99), s.latText(a.Lat.P99), ratio(b.Lat.P99, a.Lat.P99))
	row("p99.9 latency", s.latText(b.Lat.P999), s.latText(a.Lat.P999), ratio(b.Lat.P999, a.Lat.P999))
	row(fmt.Sprintf("timeouts (> %v)", s.Timeout), pct(b.Lat.Timeouts, b.Lat.N), pct(a.Lat.Timeouts, a.Lat.N), "")
	if b.Lat.Errors+a.Lat.Errors > 0 {
		row("errors", pct(b.Lat.Errors, b.Lat.N), pct(a.Lat.Errors, a.Lat.N), "")
	}
	row("utilisation max/min", fmt.Sprintf("%.2f", b.UtilMaxMin), fmt.Sprintf("%.2f", a.UtilMaxMin), "")
	row("utilisation max/mean", fmt.Sprintf("%.2f", b.UtilMaxMean), fmt.Sprintf("%.2f", a.UtilMaxMean), "")

	fmt.Fprintf(w, "\n  %-14s %5s  %-15s %-15s %-17s %s\n", "pod", "speed", "utilisation", "traffic share", "p99", "final weight (capacity-proportional)")
	for i, p := range s.Fleet {
		fmt.Fprintf(w, "  %-14s %5.2f  %-15s %-15s %-17s %d (%.0f)\n", p.Name, p.Speed,
			fmt.Sprintf("%3.0f%% -> %3.0f%%", 100*b.Util[i], 100*a.Util[i]),
			fmt.Sprintf("%4.1f%% -> %4.1f%%", 100*b.Share[i], 100*a.Share[i]),
			fmt.Sprintf("%s -> %s", fmtLat(b.PodLat[i].P99), fmtLat(a.PodLat[i].P99)),
			s.FinalWeights[i], s.IdealWeights[i])
	}

	c := s.Convergence
	fmt.Fprintln(w)
	if c.Converged {
		fmt.Fprintf(w, "  Convergence: %s.\n", c.describe())
	} else {
		fmt.Fprintf(w, "  Convergence: NOT converged within the time allowed (weights still changing %d cycle(s) in).\n", c.Cycles)
	}
	fmt.Fprintf(w, "  Largest deviation of a final weight from capacity-proportional: %.1f%%.\n", 100*maxDeviation(s.FinalWeights, s.IdealWeights))
	sw := s.SEWrites
	fmt.Fprintf(w, "  ServiceEntry writes (optimizer_writes_total): %d before the optimizer was applied, %d from its creation to convergence,\n", sw.Setup+sw.Baseline, sw.Optimizing)
	fmt.Fprintf(w, "    %d during the measurement after convergence; %d in %d cycles in all.\n", sw.After, sw.Total, s.Cycles)
}

// describe says when the weights settled.
func (c convergence) describe() string {
	var when string
	switch {
	case c.Writes == 0:
		when = "the weights did not need to change"
	default:
		when = fmt.Sprintf("the weights and the load balancer were final %d cycles (%.1fs) after the optimizer was applied", c.Cycles, c.Time.Seconds())
	}
	return fmt.Sprintf("%s, and unchanged for the %d cycles after", when, convergedAfter)
}

func ratio(before, after float64) string {
	if math.IsNaN(before) || math.IsNaN(after) || after <= 0 {
		return ""
	}
	r := before / after
	switch {
	case r >= 1.05:
		return fmt.Sprintf("%.1fx lower", r)
	case r <= 1/1.05:
		return fmt.Sprintf("%.1fx higher", 1/r)
	}
	return "about the same"
}

func maxDeviation(w []uint32, ideal []float64) float64 {
	m := 0.0
	for i := range w {
		if ideal[i] > 0 {
			m = math.Max(m, math.Abs(float64(w[i])-ideal[i])/ideal[i])
		}
	}
	return m
}
