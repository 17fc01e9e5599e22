package main

import (
	"flag"
	"testing"
)

func TestFlags(t *testing.T) {
	parse := func(args ...string) *options {
		t.Helper()
		o, _, err := parseFlags(flag.NewFlagSet("manager", flag.ContinueOnError), args)
		if err != nil {
			t.Fatalf("parseFlags(%v): %v", args, err)
		}
		return o
	}
	if o := parse(); !o.leaderElect {
		t.Errorf("--leader-elect defaults to false, want true: two replicas must never both write")
	}
	if o := parse("--leader-elect=false"); o.leaderElect {
		t.Errorf("--leader-elect=false is ignored")
	}
	o := parse("--prometheus-basic-auth-username=reader", "--prometheus-basic-auth-password-file=/secrets/pw",
		"--prometheus-header-file=X-Api-Key=/secrets/key", "--prometheus-header=X-Scope-OrgID=t1")
	p := o.prometheus
	if p.BasicAuthUsername != "reader" || p.BasicAuthPasswordFile != "/secrets/pw" ||
		p.HeaderFiles["X-Api-Key"] != "/secrets/key" || p.Headers["X-Scope-OrgID"] != "t1" {
		t.Errorf("credentials flags give %+v", p)
	}
}
