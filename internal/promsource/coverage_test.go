package promsource

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
)

func sample(v float64, labels ...string) *model.Sample {
	m := model.Metric{}
	for i := 0; i+1 < len(labels); i += 2 {
		m[model.LabelName(labels[i])] = model.LabelValue(labels[i+1])
	}
	return &model.Sample{Metric: m, Value: model.SampleValue(v)}
}

func TestParseCoverage(t *testing.T) {
	bypass := func(ns, wl string, v float64) *model.Sample {
		return sample(v, "path", "bypass", "source_workload_namespace", ns, "source_workload", wl)
	}
	tests := map[string]struct {
		vec model.Vector
		// want* are the expected totals, ratio (-1: none) and bypass names.
		wantReceived, wantWeighted, wantRatio float64
		wantBypass                            []string
		wantErr                               string
	}{
		"every part": {
			vec:          model.Vector{sample(100, "path", "received"), sample(80, "path", "weighted"), bypass("istio-system", "gw", 15), bypass("unknown", "unknown", 5)},
			wantReceived: 100, wantWeighted: 80, wantRatio: 0.8,
			wantBypass: []string{"istio-system/gw", "unknown (clients without a sidecar)"},
		},
		"no traffic: no figure": {vec: model.Vector{}, wantRatio: -1},
		"nothing through the weights": {
			vec:          model.Vector{sample(10, "path", "received"), bypass("a", "b", 10)},
			wantReceived: 10, wantRatio: 0, wantBypass: []string{"a/b"},
		},
		"client counts above server counts read as full": {
			vec:          model.Vector{sample(10, "path", "received"), sample(10.4, "path", "weighted")},
			wantReceived: 10, wantWeighted: 10.4, wantRatio: 1,
		},
		"bypass bounded and sorted": {
			vec: model.Vector{sample(100, "path", "received"),
				bypass("n", "a", 1), bypass("n", "b", 7), bypass("n", "c", 3), bypass("n", "d", 2), bypass("n", "e", 6), bypass("n", "f", 5), bypass("n", "g", 0)},
			wantReceived: 100, wantRatio: 0,
			wantBypass: []string{"n/b", "n/e", "n/f", "n/c", "n/d"},
		},
		"no path label":    {vec: model.Vector{sample(1)}, wantErr: "no path label"},
		"NaN":              {vec: model.Vector{sample(math.NaN(), "path", "received")}, wantErr: "finite"},
		"negative":         {vec: model.Vector{sample(-1, "path", "weighted")}, wantErr: "finite"},
		"received twice":   {vec: model.Vector{sample(1, "path", "received"), sample(2, "path", "received")}, wantErr: "two series"},
		"too many series":  {vec: make(model.Vector, MaxCoverageSeries+1), wantErr: "more than"},
		"unknown path tag": {vec: model.Vector{sample(1, "path", "other")}, wantErr: "no path label"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, err := ParseCoverage(tc.vec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Received != tc.wantReceived || c.Weighted != tc.wantWeighted {
				t.Errorf("received %v weighted %v, want %v %v", c.Received, c.Weighted, tc.wantReceived, tc.wantWeighted)
			}
			r, ok := c.Ratio()
			if tc.wantRatio < 0 {
				if ok {
					t.Errorf("ratio %v, want none", r)
				}
			} else if !ok || math.Abs(r-tc.wantRatio) > 1e-9 {
				t.Errorf("ratio %v (%v), want %v", r, ok, tc.wantRatio)
			}
			var names []string
			for _, b := range c.Bypass {
				names = append(names, b.String())
			}
			if strings.Join(names, ",") != strings.Join(tc.wantBypass, ",") {
				t.Errorf("bypass %v, want %v", names, tc.wantBypass)
			}
		})
	}
}

func TestDefaultCoverageQueryRendersInsideTheNamespace(t *testing.T) {
	q, err := Render(DefaultCoverageQuery, Target{Namespace: "shop", Service: "web", Host: "web.shop.adaptive", Pods: []string{"web-0", "web.1"}, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`destination_service="web.shop.adaptive"`, `destination_service_namespace="shop"`, `destination_workload_namespace="shop"`, `pod=~"web-0|web\\.1"`, "[1m]", "topk(5,"} {
		if !strings.Contains(q, want) {
			t.Errorf("rendered coverage query lacks %s:\n%s", want, q)
		}
	}
	if strings.Count(q, "topk(") != 1 || strings.Contains(q, "{{") {
		t.Errorf("rendered query %s", q)
	}
}

// A coverage answer that carries warnings (a partial response) gives no
// figure: its sums may miss some of the traffic, and the figure feeds a
// condition.
func TestQueryCoverageRefusesAPartialAnswer(t *testing.T) {
	body := `{"status":"success","warnings":["partial response: store gateway down"],"data":{"resultType":"vector","result":[` +
		`{"metric":{"path":"received"},"value":[1,"100"]},{"metric":{"path":"weighted"},"value":[1,"20"]}]}}`
	src := newSource(t, Config{URL: newServer(t, fixed(200, body)).URL})
	_, err := src.QueryCoverage(t.Context(), DefaultCoverageQuery, Target{Namespace: "shop", Host: "web.shop.adaptive", Pods: []string{"web-0"}, Window: time.Minute}, time.Time{})
	var w *WarningsError
	if !errors.As(err, &w) || len(w.Warnings) != 1 {
		t.Fatalf("err %v, want the warnings as a *WarningsError", err)
	}
	ok := `{"status":"success","data":{"resultType":"vector","result":[` +
		`{"metric":{"path":"received"},"value":[1,"100"]},{"metric":{"path":"weighted"},"value":[1,"20"]}]}}`
	src = newSource(t, Config{URL: newServer(t, fixed(200, ok)).URL})
	c, err := src.QueryCoverage(t.Context(), DefaultCoverageQuery, Target{Namespace: "shop", Host: "web.shop.adaptive", Pods: []string{"web-0"}, Window: time.Minute}, time.Time{})
	if r, has := c.Ratio(); err != nil || !has || r != 0.2 {
		t.Fatalf("the same answer without warnings: ratio %v %v, err %v; want 0.2", r, has, err)
	}
}

func TestQueryCoverageRefusesALongQuery(t *testing.T) {
	src, err := New(Config{URL: "http://127.0.0.1:1", MaxQueryLength: MinMaxQueryLength})
	if err != nil {
		t.Fatal(err)
	}
	pods := make([]string, 200)
	for i := range pods {
		pods[i] = "web-pod-with-a-long-name-" + strings.Repeat("x", i%7)
	}
	_, err = src.QueryCoverage(t.Context(), DefaultCoverageQuery, Target{Namespace: "shop", Host: "web.shop.adaptive", Pods: pods, Window: time.Minute}, time.Time{})
	var tooLong *QueryTooLongError
	if !errors.As(err, &tooLong) {
		t.Fatalf("err %v, want a *QueryTooLongError (the coverage query is never split)", err)
	}
}
