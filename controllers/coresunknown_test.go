package controllers

import (
	"strings"
	"testing"
)

// Pods without a CPU limit whose cores no signal shows make the optimizer
// Degraded/CoresUnknown: with CPU alone unless the node CPU has data, and
// with request rates unless the node CPU or the sidecars' latency does.
func TestCoresUnknownReason(t *testing.T) {
	for name, tc := range map[string]struct {
		s         Signals
		unlearned int
		want      string // "" for no reason, else a part of the message
	}{
		"every pod has a limit":             {Signals{CPU: true}, 0, ""},
		"no CPU data":                       {Signals{NoLimitPods: 3}, 0, ""},
		"node CPU shows them":               {Signals{CPU: true, NodeCPU: true, NoLimitPods: 3}, 0, ""},
		"latency shows them":                {Signals{CPU: true, Requests: true, Latency: true, NoLimitPods: 3}, 0, ""},
		"CPU alone, no node CPU":            {Signals{CPU: true, NoLimitPods: 3}, 0, "3 pod(s) have no CPU limit and the node CPU query has no data for them, nor the sidecars' request rates:"},
		"CPU alone keeps LEAST_REQUEST":     {Signals{CPU: true, NoLimitPods: 3}, 3, "3 pod(s) have no CPU limit and no node CPU data: their cores are guessed between their CPU request and their node's allocatable CPU, and, with CPU alone, nothing shows when they get more than they serve: they are weighted by that guess, not learned from, and LEAST_REQUEST is kept instead of ROUND_ROBIN."},
		"one node pool without node CPU":    {Signals{CPU: true, NodeCPU: true, NoLimitPods: 5}, 2, "2 pod(s) have no CPU limit and no node CPU data"},
		"CPU alone, learned (no bounds)":    {Signals{CPU: true, NoLimitPods: 3}, 0, "which can send them more than they serve."},
		"CPU alone, node CPU disabled":      {Signals{CPU: true, NodeCPUDisabled: true, NoLimitPods: 1}, 0, `node_cpu_query is "-", nor the sidecars' request rates:`},
		"request rates without latency":     {Signals{CPU: true, Requests: true, NoLimitPods: 2}, 0, "has no data for them, nor the sidecars' latency"},
		"advice names both sidecar metrics": {Signals{CPU: true, NoLimitPods: 2}, 0, "or the sidecars' request rates and latency together (istio_requests_total and istio_request_duration_milliseconds)"},
	} {
		got := coresUnknownReason(tc.s, tc.unlearned)
		switch {
		case tc.want == "" && got != "":
			t.Errorf("%s: %q, want none", name, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%s: %q, want it to say %q", name, got, tc.want)
		}
	}
}
