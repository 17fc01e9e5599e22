package controllers

import (
	"flag"
	"strings"
	"testing"
)

func TestCrossNamespaceDenied(t *testing.T) {
	same := optimizerFor("team-a", "web")
	other := optimizerFor("team-a", "web")
	other.Spec.ServiceNamespace = "team-b"
	if msg := crossNamespaceDenied(other, NamespaceGate{}); msg == "" || !strings.Contains(msg, "--allow-cross-namespace") {
		t.Errorf("allowed by default, or the message names no flag: %q", msg)
	}
	if msg := crossNamespaceDenied(same, NamespaceGate{}); msg != "" {
		t.Errorf("same namespace denied: %q", msg)
	}
	if msg := crossNamespaceDenied(other, NamespaceGate{All: true}); msg != "" {
		t.Errorf("denied with --allow-cross-namespace: %q", msg)
	}
	if msg := crossNamespaceDenied(other, NamespaceGate{Namespaces: []string{"team-a"}}); msg != "" {
		t.Errorf("denied although team-a is listed: %q", msg)
	}
	if msg := crossNamespaceDenied(other, NamespaceGate{Namespaces: []string{"team-c"}}); msg == "" {
		t.Error("allowed although only team-c is listed")
	}
}

// The flags default to the safe side, and the deprecated flag still works.
func TestTenancyFlags(t *testing.T) {
	parse := func(args ...string) Options {
		t.Helper()
		var o Options
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o.BindFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return o
	}
	d := parse()
	if d.CrossNamespace.All || len(d.CrossNamespace.Namespaces) > 0 || d.CustomQueries.All || len(d.CustomQueries.Namespaces) > 0 || len(d.AllowedHostSuffixes) > 0 {
		t.Errorf("defaults allow something: %+v %+v %v", d.CrossNamespace, d.CustomQueries, d.AllowedHostSuffixes)
	}
	o := parse("--cross-namespace-namespaces=platform, ops", "--custom-query-namespaces=team-a", "--allow-custom-queries", "--allowed-host-suffixes=mesh.example.com,.internal")
	if strings.Join(o.CrossNamespace.Namespaces, ",") != "platform,ops" || !o.CustomQueries.All || strings.Join(o.CustomQueries.Namespaces, ",") != "team-a" ||
		strings.Join(o.AllowedHostSuffixes, ",") != "mesh.example.com,.internal" {
		t.Errorf("parsed %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Errorf("valid flags refused: %v", err)
	}
	if !parse("--deny-cross-namespace=false").CrossNamespace.All || parse("--deny-cross-namespace").CrossNamespace.All {
		t.Error("the deprecated --deny-cross-namespace does not map onto --allow-cross-namespace")
	}
	for _, bad := range []string{"svc.cluster.local", "adaptive", "a..b", "Bad_Suffix"} {
		if o := parse("--allowed-host-suffixes=" + bad); o.Validate() == nil {
			t.Errorf("--allowed-host-suffixes=%s accepted", bad)
		}
	}
}
