package controllers

import (
	"encoding/json"
	"strings"
	"testing"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// TestDecodeProblemsAreSorted: a spec value that did not decode stalls the
// optimizer (invalidSpec names it), an unknown spec field degrades it, both
// count in optimizer_invalid_objects, and a status that did not decode
// does none of these (the reconcile's status write replaces it).
func TestDecodeProblemsAreSorted(t *testing.T) {
	tests := map[string]struct {
		object  string
		invalid []string // in invalidSpec's message; none: usable
		unknown []string // in unknownSpecFields; none: ""
		counted int      // specProblems: optimizer_invalid_objects
	}{
		"clean":         {object: `{"spec":{"service_name":"web"}}`},
		"wrong type":    {object: `{"spec":{"service_name":"web","optimization":{"dead_band_percent":"90"}}}`, invalid: []string{`spec.optimization.dead_band_percent: "90" is not an integer`}, counted: 1},
		"spec a string": {object: `{"spec":"web"}`, invalid: []string{`spec: "web" is not an object`}, counted: 1},
		"unknown field": {object: `{"spec":{"service_name":"web","deadband":5}}`, unknown: []string{"spec.deadband"}, counted: 1},
		"both": {object: `{"spec":{"service_name":"web","deadband":5,"service_ports":[{"number":"80"}]}}`,
			invalid: []string{"spec.service_ports[0].number"}, unknown: []string{"spec.deadband"}, counted: 2},
		"status only": {object: `{"spec":{"service_name":"web"},"status":{"endpoints":"x","colour":1}}`},
		"spec and status": {object: `{"spec":{"service_name":"web","deadband":5},"status":{"endpoints":"x"}}`,
			unknown: []string{"spec.deadband"}, counted: 1},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			opt := &optv1.IstioAdaptiveRequestOptimizer{}
			if err := json.Unmarshal([]byte(tt.object), opt); err != nil {
				t.Fatal(err)
			}
			msg := invalidSpec(opt)
			if (msg == "") != (len(tt.invalid) == 0) {
				t.Errorf("invalidSpec = %q, want it to name %v", msg, tt.invalid)
			}
			for _, w := range tt.invalid {
				if !strings.Contains(msg, w) {
					t.Errorf("invalidSpec = %q, lacks %q", msg, w)
				}
			}
			u := unknownSpecFields(opt)
			if (u == "") != (len(tt.unknown) == 0) {
				t.Errorf("unknownSpecFields = %q, want it to name %v", u, tt.unknown)
			}
			for _, w := range tt.unknown {
				if !strings.Contains(u, w) {
					t.Errorf("unknownSpecFields = %q, lacks %q", u, w)
				}
			}
			if got := specProblems(opt); got != tt.counted {
				t.Errorf("specProblems = %d (of %v), want %d", got, opt.DecodeProblems(), tt.counted)
			}
		})
	}
}
