package controllers

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// TestInvalidSpecNamesEveryBadField decodes specs as the informer does and
// checks each unusable value is named, and a valid spec passes.
func TestInvalidSpecNamesEveryBadField(t *testing.T) {
	tests := map[string]struct {
		spec string
		want []string // parts of the message; none means valid
	}{
		"valid":              {spec: `{"service_name":"web","optimization":{"cycle":"10s","weight_expiry":"5m"},"service_ports":[{"number":80,"targetPort":8080},{"number":81,"targetPort":"http-alt"}]}`},
		"cycle soon":         {spec: `{"service_name":"web","optimization":{"cycle":"soon"}}`, want: []string{"spec.optimization.cycle", `"soon"`}},
		"every duration bad": {spec: `{"service_name":"web","optimization":{"cycle":"x","query_window":"-1s","scrape_interval":"1d","slow_start":"5","drain_time":7,"weight_expiry":"9999999999999h"}}`, want: []string{"cycle", "query_window", "scrape_interval", "slow_start", "drain_time", "weight_expiry"}},
		"target port 0":      {spec: `{"service_name":"web","service_ports":[{"number":80,"targetPort":0}]}`, want: []string{"service_ports[0].targetPort", "0 is not a port number"}},
		"target port 99999":  {spec: `{"service_name":"web","service_ports":[{"number":80,"targetPort":99999}]}`, want: []string{"99999 is not a port number"}},
		"target port name":   {spec: `{"service_name":"web","service_ports":[{"number":80},{"number":81,"targetPort":"Bad_Name"}]}`, want: []string{"service_ports[1].targetPort", "Bad_Name"}},
		"digits as a name":   {spec: `{"service_name":"web","service_ports":[{"number":80,"targetPort":"8080"}]}`, want: []string{`"8080" is not a port name`}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opt := &optv1.IstioAdaptiveRequestOptimizer{}
			if err := json.Unmarshal([]byte(tc.spec), &opt.Spec); err != nil {
				t.Fatalf("decode: %v (one bad value must not fail the decode)", err)
			}
			msg := invalidSpec(opt)
			if len(tc.want) == 0 && msg != "" {
				t.Fatalf("invalidSpec = %q, want valid", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("invalidSpec = %q, lacks %q", msg, w)
				}
			}
		})
	}
}

// TestSettingsForSkipsInvalidDurations: settingsFor never uses a value that
// did not parse, and says so.
func TestSettingsForSkipsInvalidDurations(t *testing.T) {
	opt := &optv1.IstioAdaptiveRequestOptimizer{}
	if err := json.Unmarshal([]byte(`{"service_name":"web","optimization":{"cycle":"soon","weight_expiry":"10m"}}`), &opt.Spec); err != nil {
		t.Fatal(err)
	}
	d := DefaultEngineDefaults()
	s, err := settingsFor(opt, d)
	if err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("settingsFor error = %v, want one naming cycle", err)
	}
	if s.Cycle != d.Cycle {
		t.Errorf("Cycle = %v, want the default %v", s.Cycle, d.Cycle)
	}
	opt.Spec.Optimization.Cycle = optv1.NewDuration(10 * time.Second)
	if s, err = settingsFor(opt, d); err != nil || s.Cycle != 10*time.Second || s.Params.Expiry != 10*time.Minute {
		t.Errorf("valid spec: settings %+v, %v", s, err)
	}
}
