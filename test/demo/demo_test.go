package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDemoEndToEnd runs the demo in a short configuration (4 pods, about a
// minute): real API server, Prometheus, istiod, the operator, the
// pods and the sidecars. The p99 latency after convergence must be below the
// p99 of the plain Service with Istio's LEAST_REQUEST, the busiest pod's
// utilisation must fall, the picture must be well-formed SVG, and no process
// may be left behind.
func TestDemoEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the API server, Prometheus and istiod and runs traffic for about a minute")
	}
	cfg := DefaultConfig()
	cfg.Name = "test"
	// istiod is part of what the test proves (the weights reach the
	// sidecars over xDS): without bin/pilot-discovery it fails saying
	// which make target builds it, rather than passing on the fallback.
	cfg.Istiod = "on"
	cfg.Pods = []PodGroup{{Name: "fast", Count: 2, Speed: 1.0}, {Name: "slow", Count: 2, Speed: 0.35}}
	cfg.Sidecars = 4
	cfg.Duration = dur(50 * time.Second)
	cfg.Warmup = dur(5 * time.Second)
	cfg.Window = dur(10 * time.Second)
	cfg.Every = 10 * time.Second
	cfg.Out = filepath.Join(t.TempDir(), "demo.svg")

	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	sum, err := run(ctx, cfg, &out)
	t.Logf("demo output (%s):\n%s", time.Since(start).Round(time.Second), out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}

	if !(sum.After.Lat.P99 < sum.Before.Lat.P99) {
		t.Errorf("p99 after convergence %s is not below the baseline's %s", fmtLat(sum.After.Lat.P99), fmtLat(sum.Before.Lat.P99))
	}
	// The promise: the expected request time falls (the p99 above) and no
	// pod is left saturated. Below full load the slow pods run emptier
	// than the fast ones, so the utilisations need not even out; the
	// busiest pod's must fall.
	if before, after := slices.Max(sum.Before.Util), slices.Max(sum.After.Util); !(after < before) {
		t.Errorf("the busiest pod's utilisation did not fall: %.0f%% -> %.0f%%", 100*before, 100*after)
	}
	if sum.Before.Lat.N == 0 || sum.After.Lat.N == 0 {
		t.Errorf("empty window: %d requests before, %d after", sum.Before.Lat.N, sum.After.Lat.N)
	}
	if sum.SEWrites.Baseline != 0 {
		t.Errorf("%d ServiceEntry writes before the optimizer was applied, want 0", sum.SEWrites.Baseline)
	}
	if !sum.Convergence.Converged {
		t.Logf("note: the weights had not converged when the second window started")
	}
	if !strings.Contains(out.String(), "Summary: same fleet") {
		t.Errorf("no summary in the output")
	}
	checkSVG(t, cfg.Out)
	checkNoChildren(t)
}

// checkSVG parses the file as XML: an <svg> root with polylines.
func checkSVG(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("picture: %v", err)
	}
	dec := xml.NewDecoder(bytes.NewReader(data))
	var root string
	polylines := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if root == "" {
				root = se.Name.Local
				if se.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root namespace %q", se.Name.Space)
				}
			}
			if se.Name.Local == "polyline" {
				polylines++
			}
		}
	}
	if root != "svg" {
		t.Errorf("root element %q, want svg", root)
	}
	if polylines < 4 {
		t.Errorf("%d polylines in the picture, want a series per pod and the latency", polylines)
	}
}

// checkNoChildren fails if a process this test binary started (kube-apiserver,
// etcd, Prometheus, istiod) is still alive.
func checkNoChildren(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		kids := children(os.Getpid())
		if len(kids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes left behind: %v", kids)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// children lists "pid comm" of the live (not zombie) child processes of pid.
func children(pid int) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) < 2 || fields[0] == "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == pid {
			out = append(out, e.Name()+" "+s[strings.IndexByte(s, '(')+1:i])
		}
	}
	return out
}

func TestParseFlags(t *testing.T) {
	cfg, err := ParseFlags(nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cfg.Fleet()); n != 6 {
		t.Errorf("default fleet has %d pods, want 6", n)
	}
	if r := cfg.TotalRate(); r < 250 || r > 350 {
		t.Errorf("default load %.0f req/s, want a few hundred", r)
	}
	if p := cfg.Phases(); p.Warmup+2*p.Window+p.Settle+p.OptimizeMax > 4*time.Minute {
		t.Errorf("default phases %+v exceed 4 minutes", p)
	}

	cfg, err = ParseFlags([]string{"--pods", "5", "--speeds", "1,0.5", "--workers", "3", "--load", "0.6", "--cycle", "1s", "--duration", "90s"})
	if err != nil {
		t.Fatal(err)
	}
	fleet := cfg.Fleet()
	var names []string
	for _, p := range fleet {
		names = append(names, p.Name)
		if p.Workers != 3 {
			t.Errorf("%s has %d workers, want 3", p.Name, p.Workers)
		}
	}
	if got := strings.Join(names, ","); got != "api-fast-0,api-fast-1,api-fast-2,api-slow-0,api-slow-1" {
		t.Errorf("pods %s", got)
	}
	if cfg.Load != 0.6 || cfg.Cycle.Duration != time.Second || cfg.Duration.Duration != 90*time.Second {
		t.Errorf("flags not applied: %+v", cfg)
	}

	for _, f := range []string{"three-generations.yaml", "arm-and-x86.yaml", "quick.yaml"} {
		cfg, err := ParseFlags([]string{"--scenario", filepath.Join("scenarios", f)})
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if r := cfg.TotalRate(); r > 500 {
			t.Errorf("%s: %.0f req/s is too much for a small machine", f, r)
		}
	}
	if cfg, err := ParseFlags([]string{"--scenario", "scenarios/quick.yaml", "--load", "0.5"}); err != nil || cfg.Load != 0.5 || cfg.Sidecars != 4 {
		t.Errorf("a flag must override the scenario: %v %+v", err, cfg)
	}

	for _, bad := range [][]string{
		{"--speeds", "1,-1"},
		{"--pods", "2", "--speeds", "1,0.5,0.2"},
		{"--duration", "20s"},
		{"--istiod", "maybe"},
		{"--load", "0"},
		{"extra"},
	} {
		if _, err := ParseFlags(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

func TestRenderSVGIsWellFormed(t *testing.T) {
	p := picture{
		Title: "a <title> & more", Subtitle: "x", Timeout: 2,
		Fleet:   []podSpec{{Name: "a", Class: "fast", Speed: 1}, {Name: "b", Class: "slow", Speed: 0.5}},
		Classes: []string{"fast", "slow"},
		T:       []float64{0, 1, 2}, Weights: [][]float64{{1000, 1000}, {1300, 700}, {1333, 667}},
		Util: [][]float64{{math.NaN(), math.NaN()}, {0.5, 1}, {0.7, 0.7}}, Ideal: []float64{1333, 667},
		LatT: []float64{1, 2}, P50: []float64{0.03, 0.02}, P99: []float64{2, 0.2},
		Marks: map[string]float64{markBaselineStart: 0.2, markBaselineEnd: 1, markSwitch: 1, markConverged: 1.5, markAfterStart: 1.6, markAfterEnd: 2},
		End:   2,
	}
	path := filepath.Join(t.TempDir(), "p.svg")
	if err := writeSVG(path, p); err != nil {
		t.Fatal(err)
	}
	checkSVG(t, path)
}
