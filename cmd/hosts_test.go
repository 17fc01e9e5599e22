package main

import (
	"flag"
	"strings"
	"testing"
)

// TestHostFlagsAreValidatedAtStartUp: a suffix or cluster domain that would
// give hosts Istio refuses (an all-numeric last label, as in an IP address)
// stops the manager at start-up with a message naming the flag.
func TestHostFlagsAreValidatedAtStartUp(t *testing.T) {
	tests := []struct {
		args []string
		flag string // "" when the flags are fine
	}{
		{[]string{"--allowed-host-suffixes=mesh.example.com,internal"}, ""},
		{[]string{"--allowed-host-suffixes=3"}, "--allowed-host-suffixes"},
		{[]string{"--allowed-host-suffixes=mesh.example.com,2.3"}, "--allowed-host-suffixes"},
		{[]string{"--allowed-host-suffixes=10.1.2.3"}, "--allowed-host-suffixes"},
		{[]string{"--allowed-host-suffixes=3.example.com"}, ""},
		{[]string{"--allowed-host-suffixes=svc.cluster.local"}, "--allowed-host-suffixes"},
		{[]string{"--cluster-domain=cluster.local"}, ""},
		{[]string{"--cluster-domain=example.3"}, "--cluster-domain"},
		{[]string{"--cluster-domain=Cluster_Local"}, "--cluster-domain"},
	}
	for _, tt := range tests {
		_, _, err := parseFlags(flag.NewFlagSet("manager", flag.ContinueOnError), tt.args)
		switch {
		case tt.flag == "" && err != nil:
			t.Errorf("%v: %v, want accepted", tt.args, err)
		case tt.flag != "" && (err == nil || !strings.Contains(err.Error(), tt.flag)):
			t.Errorf("%v: %v, want an error naming %s", tt.args, err, tt.flag)
		}
	}
}
