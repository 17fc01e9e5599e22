package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// picture is what the SVG shows.
type picture struct {
	Title, Subtitle string
	Fleet           []podSpec
	Classes         []string          // class names in fleet order
	ClassColor      map[string]string // fastest green ... slowest red
	T               []float64
	Weights         [][]float64 // [time][pod]
	Util            [][]float64 // [time][pod], NaN where unknown
	Ideal           []float64   // capacity-proportional weights
	LatT            []float64
	P50, P99        []float64 // seconds, over a sliding window
	Timeout         float64
	Marks           map[string]float64
	End             float64
}

const (
	utilSpan = 4.0 // seconds over which utilisation is averaged
	latSpan  = 5.0 // seconds of the sliding latency window
)

// picture assembles the series from the run.
func (d *demo) picture(s *Summary) picture {
	d.mu.Lock()
	tl := slices.Clone(d.timeline)
	marks := map[string]float64{}
	for k, v := range d.marks {
		marks[k] = v
	}
	d.mu.Unlock()
	p := picture{
		Title: fmt.Sprintf("Istio adaptive weight optimizer: local demo (%s)", s.Scenario),
		Subtitle: fmt.Sprintf("p99 %s with Istio's LEAST_REQUEST -> %s after convergence; utilisation max/min %.2f -> %.2f; %d sidecars, weights from %s",
			fmtLat(s.Before.Lat.P99), fmtLat(s.After.Lat.P99), s.Before.UtilMaxMin, s.After.UtilMaxMin, s.Sidecars,
			map[bool]string{true: "istiod (xDS)", false: "the ServiceEntry"}[s.Istiod]),
		Fleet: d.fleet, Ideal: s.IdealWeights, Timeout: d.cfg.Timeout.Duration.Seconds(), Marks: marks,
		End: marks[markAfterEnd],
	}
	speed := map[string]float64{}
	for _, f := range d.fleet {
		if _, ok := speed[f.Class]; !ok {
			speed[f.Class] = f.Speed
			p.Classes = append(p.Classes, f.Class)
		}
	}
	p.ClassColor = classColors(p.Classes, speed)
	for i, pt := range tl {
		if pt.t > p.End+0.5 {
			break
		}
		p.T = append(p.T, pt.t)
		w := make([]float64, len(pt.weights))
		for j, v := range pt.weights {
			w[j] = float64(v)
		}
		p.Weights = append(p.Weights, w)
		u := make([]float64, len(d.fleet))
		k := i
		for k > 0 && pt.t-tl[k].t < utilSpan {
			k--
		}
		for j, f := range d.fleet {
			dt := pt.t - tl[k].t
			if dt <= 0 {
				u[j] = math.NaN()
				continue
			}
			u[j] = (pt.busy[j] - tl[k].busy[j]).Seconds() / (float64(f.Workers) * dt)
		}
		p.Util = append(p.Util, u)
	}
	for t := latSpan; t <= p.End+1e-9; t++ {
		st := latencyOf(d.rec.window(t-latSpan, t), -1)
		p.LatT = append(p.LatT, t)
		p.P50 = append(p.P50, st.P50)
		p.P99 = append(p.P99, st.P99)
	}
	return p
}

// writeSVG writes the picture as a hand-made SVG file.
func writeSVG(path string, p picture) error {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile(path, []byte(renderSVG(p)), 0o644)
}

var palette = []string{"#1a9850", "#f46d43", "#d73027", "#4575b4", "#984ea3", "#8c6d31", "#666666"}

// classColors colours pod classes by speed: green for the fastest, red for
// the slowest, orange between (with more than three classes, a palette).
func classColors(classes []string, speed map[string]float64) map[string]string {
	ranked := slices.Clone(classes)
	slices.SortStableFunc(ranked, func(a, b string) int {
		switch {
		case speed[a] > speed[b]:
			return -1
		case speed[a] < speed[b]:
			return 1
		}
		return 0
	})
	var colors []string
	switch len(ranked) {
	case 1:
		colors = []string{"#1a9850"}
	case 2:
		colors = []string{"#1a9850", "#d73027"}
	case 3:
		colors = []string{"#1a9850", "#f46d43", "#d73027"}
	default:
		colors = palette
	}
	out := map[string]string{}
	for i, c := range ranked {
		out[c] = colors[i%len(colors)]
	}
	return out
}

var podDashes = []string{"", "7,3", "2,2", "10,3,2,3"}

// axes is one panel: maps data to pixels.
type axes struct {
	x, y, w, h float64
	xmax       float64
	ymin, ymax float64
	log        bool
}

func (a axes) X(t float64) float64 { return a.x + a.w*t/a.xmax }

func (a axes) Y(v float64) float64 {
	if a.log {
		v = math.Max(v, a.ymin)
		return a.y + a.h - a.h*(math.Log10(v)-math.Log10(a.ymin))/(math.Log10(a.ymax)-math.Log10(a.ymin))
	}
	return a.y + a.h - a.h*(v-a.ymin)/(a.ymax-a.ymin)
}

func esc(s string) string { return html.EscapeString(s) }

// tickLat labels a latency axis tick: 5ms, 200ms, 1s.
func tickLat(v float64) string {
	if v >= 1 {
		return fmt.Sprintf("%gs", v)
	}
	return fmt.Sprintf("%gms", math.Round(v*1e6)/1e3)
}

func renderSVG(p picture) string {
	const (
		width   = 1040.0
		left    = 78.0
		right   = 200.0
		panelH  = 190.0
		gap     = 62.0
		top     = 112.0
		bottomM = 46.0
	)
	height := top + 3*panelH + 2*gap + bottomM
	pw := width - left - right
	xmax := math.Max(p.End, 1)
	var b strings.Builder
	f := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	f(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	f(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	f(`<rect x="0" y="0" width="%.0f" height="%.0f" fill="#ffffff"/>`+"\n", width, height)
	f(`<text x="%.0f" y="28" font-size="17" font-weight="bold">%s</text>`+"\n", left, esc(p.Title))
	f(`<text x="%.0f" y="50" font-size="12.5" fill="#333">%s</text>`+"\n", left, esc(p.Subtitle))

	// Panel 1: weights.
	wmax := 1.0
	for _, row := range p.Weights {
		for _, v := range row {
			wmax = math.Max(wmax, v)
		}
	}
	for _, v := range p.Ideal {
		wmax = math.Max(wmax, v)
	}
	a1 := axes{x: left, y: top, w: pw, h: panelH, xmax: xmax, ymin: 0, ymax: niceCeil(wmax * 1.08)}
	// Panel 2: utilisation.
	umax := 1.0
	for _, row := range p.Util {
		for _, v := range row {
			if !math.IsNaN(v) {
				umax = math.Max(umax, v)
			}
		}
	}
	a2 := axes{x: left, y: top + panelH + gap, w: pw, h: panelH, xmax: xmax, ymin: 0, ymax: math.Ceil(umax*10+0.5) / 10}
	// Panel 3: latency, log scale.
	lmax := math.Max(p.Timeout*1.3, 0.1)
	lmin := 0.005
	for _, v := range p.P50 {
		if !math.IsNaN(v) && v > 0 && v < lmin*1.5 {
			lmin = math.Pow(10, math.Floor(math.Log10(v)))
		}
	}
	a3 := axes{x: left, y: top + 2*(panelH+gap), w: pw, h: panelH, xmax: xmax, ymin: lmin, ymax: lmax, log: true}

	for i, a := range []axes{a1, a2, a3} {
		phaseBands(&b, a, p.Marks, i == 0)
	}

	// Weights.
	panelFrame(&b, a1, "Weight of each pod, as sidecar 0 receives it (dashed: proportional to true capacity)")
	for _, v := range linearTicks(a1.ymax) {
		yTick(&b, a1, v, fmt.Sprintf("%.0f", v))
	}
	for j := range p.Fleet {
		if j < len(p.Ideal) {
			y := a1.Y(p.Ideal[j])
			f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="1" stroke-dasharray="3,4" opacity="0.8"/>`+"\n",
				a1.x, y, a1.x+a1.w, y, podColor(p, j))
		}
	}
	for j := range p.Fleet {
		series(&b, a1, p.T, column(p.Weights, j), podColor(p, j), podDash(p, j), 2)
	}

	// Utilisation.
	panelFrame(&b, a2, fmt.Sprintf("CPU utilisation of each pod (busy time / workers, over %.0f s)", utilSpan))
	for _, v := range linearTicks(a2.ymax) {
		yTick(&b, a2, v, fmt.Sprintf("%.0f%%", v*100))
	}
	if a2.ymax >= 1 {
		y := a2.Y(1)
		f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="1" stroke-dasharray="6,3" opacity="0.6"/>`+"\n", a2.x, y, a2.x+a2.w, y)
	}
	for j := range p.Fleet {
		series(&b, a2, p.T, column(p.Util, j), podColor(p, j), podDash(p, j), 1.6)
	}

	// Latency.
	panelFrame(&b, a3, fmt.Sprintf("Latency of all requests (p99 and p50 over the last %.0f s, log scale)", latSpan))
	for _, v := range []float64{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50} {
		if v >= a3.ymin && v <= a3.ymax {
			yTick(&b, a3, v, tickLat(v))
		}
	}
	if p.Timeout > 0 {
		y := a3.Y(p.Timeout)
		f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="1" stroke-dasharray="6,3" opacity="0.6"/>`+"\n", a3.x, y, a3.x+a3.w, y)
		f(`<text x="%.1f" y="%.1f" font-size="10.5" fill="#333" text-anchor="end">client timeout</text>`+"\n", a3.x+a3.w-4, y-4)
	}
	series(&b, a3, p.LatT, p.P50, "#7f7f7f", "", 1.6)
	series(&b, a3, p.LatT, p.P99, "#111111", "", 2.4)

	// X axes.
	for _, a := range []axes{a1, a2, a3} {
		for _, t := range timeTicks(xmax) {
			x := a.X(t)
			f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-width="1"/>`+"\n", x, a.y+a.h, x, a.y+a.h+4)
			f(`<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10.5">%.0fs</text>`+"\n", x, a.y+a.h+16, t)
		}
	}
	f(`<text x="%.1f" y="%.1f" text-anchor="middle" font-size="12">time since traffic started</text>`+"\n", left+pw/2, height-10)

	// Legend.
	lx := left + pw + 22
	ly := top + 8
	f(`<text x="%.1f" y="%.1f" font-weight="bold">pods</text>`+"\n", lx, ly)
	for j, pod := range p.Fleet {
		y := ly + 18 + float64(j)*17
		f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2.4"%s/>`+"\n", lx, y-4, lx+26, y-4, podColor(p, j), dashAttr(podDash(p, j)))
		f(`<text x="%.1f" y="%.1f" font-size="11">%s (%.2f)</text>`+"\n", lx+32, y, esc(pod.Name), pod.Speed)
	}
	y := ly + 18 + float64(len(p.Fleet))*17 + 6
	f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-width="1" stroke-dasharray="3,4"/>`+"\n", lx, y-4, lx+26, y-4)
	f(`<text x="%.1f" y="%.1f" font-size="11">capacity-proportional</text>`+"\n", lx+32, y)
	f(`<text x="%.1f" y="%.1f" font-size="10.5" fill="#333">(speed in parentheses)</text>`+"\n", lx, y+20)
	ly = a3.y + 8
	f(`<text x="%.1f" y="%.1f" font-weight="bold">latency</text>`+"\n", lx, ly)
	f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#111" stroke-width="2.4"/>`+"\n", lx, ly+14, lx+26, ly+14)
	f(`<text x="%.1f" y="%.1f" font-size="11">p99</text>`+"\n", lx+32, ly+18)
	f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#7f7f7f" stroke-width="1.6"/>`+"\n", lx, ly+32, lx+26, ly+32)
	f(`<text x="%.1f" y="%.1f" font-size="11">p50</text>`+"\n", lx+32, ly+36)
	f("</svg>\n")
	return b.String()
}

// phaseBands shades the two measurement windows and marks the switch and
// convergence.
func phaseBands(b *strings.Builder, a axes, m map[string]float64, labels bool) {
	band := func(from, to float64, fill, label string) {
		if to <= from {
			return
		}
		fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n", a.X(from), a.y, a.X(to)-a.X(from), a.h, fill)
		if labels {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11" fill="#333">%s</text>`+"\n", (a.X(from)+a.X(to))/2, a.y-6, esc(label))
		}
	}
	band(m[markBaselineStart], m[markBaselineEnd], "#eeeeee", "before: Istio's LEAST_REQUEST, no optimizer")
	band(m[markAfterStart], m[markAfterEnd], "#e5f5e0", "after convergence")
	vline := func(t float64, label string) {
		if t <= 0 {
			return
		}
		x := a.X(t)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#555" stroke-width="1" stroke-dasharray="4,3"/>`+"\n", x, a.y, x, a.y+a.h)
		if labels {
			fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="10.5" fill="#333" transform="rotate(-90 %.1f %.1f)" text-anchor="end">%s</text>`+"\n",
				x+11, a.y+4, x+11, a.y+4, esc(label))
		}
	}
	vline(m[markSwitch], "optimizer applied")
	vline(m[markConverged], "converged")
}

func panelFrame(b *strings.Builder, a axes, title string) {
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#000" stroke-width="1"/>`+"\n", a.x, a.y, a.w, a.h)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-size="13" font-weight="bold">%s</text>`+"\n", a.x, a.y-22, esc(title))
}

func yTick(b *strings.Builder, a axes, v float64, label string) {
	y := a.Y(v)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000" stroke-opacity="0.08"/>`+"\n", a.x, y, a.x+a.w, y)
	fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#000"/>`+"\n", a.x-4, y, a.x, y)
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="10.5">%s</text>`+"\n", a.x-7, y+3.5, esc(label))
}

// series draws a polyline, broken where values are NaN.
func series(b *strings.Builder, a axes, t, v []float64, color, dash string, width float64) {
	var pts []string
	flush := func() {
		if len(pts) > 1 {
			fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="%.1f" stroke-linejoin="round"%s points="%s"/>`+"\n",
				color, width, dashAttr(dash), strings.Join(pts, " "))
		}
		pts = pts[:0]
	}
	for i := range t {
		if i >= len(v) || math.IsNaN(v[i]) || math.IsInf(v[i], 0) {
			flush()
			continue
		}
		y := math.Max(a.y, math.Min(a.y+a.h, a.Y(v[i])))
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", a.X(t[i]), y))
	}
	flush()
}

func dashAttr(d string) string {
	if d == "" {
		return ""
	}
	return fmt.Sprintf(` stroke-dasharray="%s"`, d)
}

func column(rows [][]float64, j int) []float64 {
	out := make([]float64, len(rows))
	for i, r := range rows {
		if j < len(r) {
			out[i] = r[j]
		} else {
			out[i] = math.NaN()
		}
	}
	return out
}

func podColor(p picture, j int) string {
	if c, ok := p.ClassColor[p.Fleet[j].Class]; ok {
		return c
	}
	return palette[j%len(palette)]
}

func podDash(p picture, j int) string {
	n := 0
	for k := 0; k < j; k++ {
		if p.Fleet[k].Class == p.Fleet[j].Class {
			n++
		}
	}
	return podDashes[n%len(podDashes)]
}

// niceCeil rounds up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*e >= v {
			return m * e
		}
	}
	return 10 * e
}

func linearTicks(max float64) []float64 {
	step := niceCeil(max / 5)
	var out []float64
	for v := 0.0; v <= max+1e-9; v += step {
		out = append(out, v)
	}
	return out
}

func timeTicks(max float64) []float64 {
	step := 10.0
	for _, s := range []float64{10, 15, 20, 30, 60, 120, 300} {
		step = s
		if max/s <= 12 {
			break
		}
	}
	var out []float64
	for t := 0.0; t <= max+1e-9; t += step {
		out = append(out, t)
	}
	return out
}
