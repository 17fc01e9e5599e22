package controllers

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

func TestCoverageStatus(t *testing.T) {
	at := time.Unix(1_700_000_000, 0)
	rec := func(c promsource.Coverage, err error) *CoverageRecord {
		return &CoverageRecord{Time: at, Window: 5 * time.Minute, Host: "web.shop.adaptive", Coverage: c, Err: err}
	}
	gw := promsource.SourceRate{Namespace: "istio-system", Workload: "istio-ingressgateway", Rate: 40}
	tests := map[string]struct {
		rec        *CoverageRecord
		wantRatio  string // "" for no status figure
		wantStatus bool   // a status field at all
		wantMsg    []string
		wantState  string
	}{
		"nothing measured":  {wantState: "none"},
		"no traffic":        {rec: rec(promsource.Coverage{}, nil), wantState: "no traffic"},
		"covered":           {rec: rec(promsource.Coverage{Received: 100, Weighted: 95}, nil), wantRatio: "0.95", wantStatus: true, wantState: "covered"},
		"at the threshold":  {rec: rec(promsource.Coverage{Received: 100, Weighted: 90}, nil), wantRatio: "0.90", wantStatus: true, wantState: "covered"},
		"below, a gateway":  {rec: rec(promsource.Coverage{Received: 100, Weighted: 60, Bypass: []promsource.SourceRate{gw}}, nil), wantRatio: "0.60", wantStatus: true, wantMsg: []string{"0.60 of the 100.0 requests/s", "last 5m", "istio-system/istio-ingressgateway (40.0 rps)", "web.shop.adaptive"}, wantState: "below: istio-system/istio-ingressgateway"},
		"below, no sources": {rec: rec(promsource.Coverage{Received: 100, Weighted: 10}, nil), wantRatio: "0.10", wantStatus: true, wantMsg: []string{"no single source stands out"}, wantState: "below: "},
		"query failed":      {rec: rec(promsource.Coverage{}, errors.New("boom")), wantStatus: true, wantState: "failed"},
		"query too long":    {rec: rec(promsource.Coverage{}, &promsource.QueryTooLongError{Length: 20000, Limit: 12288}), wantStatus: true, wantState: "failed"},
		"a partial answer":  {rec: rec(promsource.Coverage{Received: 100, Weighted: 20}, &promsource.WarningsError{Warnings: []string{"store down"}}), wantStatus: true, wantState: "failed"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cov, msg := coverageStatus(tc.rec, 0.9)
			if (cov != nil) != tc.wantStatus {
				t.Fatalf("status %+v, want one: %v", cov, tc.wantStatus)
			}
			if cov != nil && cov.Ratio != tc.wantRatio {
				t.Errorf("ratio %q, want %q", cov.Ratio, tc.wantRatio)
			}
			if (msg != "") != (len(tc.wantMsg) > 0) {
				t.Errorf("Degraded message %q", msg)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q: %s", w, msg)
				}
			}
			if cov != nil && tc.rec.Err != nil && cov.Message == "" {
				t.Error("a failed query left no message")
			}
			if got := coverageState(tc.rec, 0.9); got != tc.wantState {
				t.Errorf("state %q, want %q", got, tc.wantState)
			}
		})
	}
	if cov, msg := coverageStatus(rec(promsource.Coverage{Received: 100, Weighted: 20}, &promsource.WarningsError{Warnings: []string{"store down"}}), 0.9); msg != "" || cov.Ratio != "" || !strings.Contains(cov.Message, "carried warnings") || !strings.Contains(cov.Message, "store down") {
		t.Errorf("a partial answer: ratio %q, message %q, Degraded %q; want no figure, the warnings, no Degraded", cov.Ratio, cov.Message, msg)
	}
	if _, msg := coverageStatus(rec(promsource.Coverage{Received: 100, Weighted: 1}, nil), 0); msg != "" {
		t.Errorf("threshold 0 still degrades: %s", msg)
	}
}

func TestCoverageOptionsValidate(t *testing.T) {
	ok := DefaultCoverageOptions()
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*CoverageOptions){
		"threshold above 1":   func(o *CoverageOptions) { o.Threshold = 1.5 },
		"negative threshold":  func(o *CoverageOptions) { o.Threshold = -0.1 },
		"interval too short":  func(o *CoverageOptions) { o.Interval = 30 * time.Second },
		"template with error": func(o *CoverageOptions) { o.Query = "{{.Nope}}" },
	} {
		o := DefaultCoverageOptions()
		mutate(&o)
		if err := o.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	o := DefaultCoverageOptions()
	o.Query = "-"
	if err := o.Validate(); err != nil {
		t.Errorf("\"-\" refused: %v", err)
	}
}
