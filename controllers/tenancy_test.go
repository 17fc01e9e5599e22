package controllers

import (
	"context"
	"flag"
	"reflect"
	"strings"
	"testing"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
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

// Every *_query field of the API, present and future, is subject to the gate.
func TestCustomQueriesNeedTheAdministrator(t *testing.T) {
	opt := optimizerFor("team-a", "web")
	opt.Spec.Optimization = &optv1.Optimization{}
	v := reflect.ValueOf(opt.Spec.Optimization).Elem()
	var fields []string
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		if strings.HasSuffix(name, "_query") {
			v.Field(i).SetString(`sum by (pod) (up{namespace="other"})`)
			fields = append(fields, name)
		}
	}
	if len(fields) < 2 {
		t.Fatalf("found query fields %v, want at least cpu_query and request_query", fields)
	}

	got, msg := withAllowedQueries(opt, NamespaceGate{})
	for _, f := range fields {
		if !strings.Contains(msg, f) {
			t.Errorf("message %q does not name %s", msg, f)
		}
	}
	s, err := settingsFor(got, DefaultEngineDefaults())
	if err != nil || s.CPUQuery != promsource.DefaultCPUQuery || s.RequestQuery != promsource.DefaultRequestQuery {
		t.Errorf("refused templates are not replaced by the defaults: %q %q %v", s.CPUQuery, s.RequestQuery, err)
	}
	if opt.Spec.Optimization.CPUQuery == "" {
		t.Error("the optimizer read from the cache was modified")
	}

	for _, gate := range []NamespaceGate{{All: true}, {Namespaces: []string{"team-a"}}} {
		if same, msg := withAllowedQueries(opt, gate); same != opt || msg != "" {
			t.Errorf("gate %+v refused: %q", gate, msg)
		}
	}
	cpuOnly := optimizerFor("team-a", "web")
	cpuOnly.Spec.Optimization = &optv1.Optimization{RequestQuery: "-"}
	if _, msg := withAllowedQueries(cpuOnly, NamespaceGate{}); msg != "" {
		t.Errorf(`request_query "-" (CPU only) refused: %q`, msg)
	}
}

// At runtime (an optimizer created under a CRD without the spec.host
// pattern) the host-claim step refuses a host that is not a DNS name before
// it reads or writes anything: its client is nil here.
func TestHostClaimRefusesInvalidHostsAtRuntime(t *testing.T) {
	hosts := &HostClaims{Rules: desired.HostRules{AllowedSuffixes: []string{"shared.example"}}}
	for _, host := range []string{"Bad_Host!.example", "a..b", "web.fast.internal:8080", strings.Repeat("a", 64) + ".team-a.adaptive"} {
		opt := optimizerFor("team-a", "web")
		opt.Spec.Host = host
		p, err := hosts.Check(context.Background(), opt)
		if err != nil || p == nil || p.Reason != desired.ReasonInvalidHost || !p.Fatal || !strings.Contains(p.Message, host) {
			t.Errorf("host %q: problem %+v, error %v; want a fatal InvalidHost naming it", host, p, err)
		}
	}
}
