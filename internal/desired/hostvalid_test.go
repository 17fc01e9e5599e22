package desired

import (
	"strings"
	"testing"
)

// TestHostsIstioRefusesAreRefused: a host whose last label is all digits
// (an IP address among them) is refused by Compute, by CheckHost and as an
// allowed suffix, as Istio's validation refuses it; a digit elsewhere is
// fine. Istio's own validation runs over generated inputs in
// test/istiovalidation.
func TestHostsIstioRefusesAreRefused(t *testing.T) {
	rules := HostRules{AllowedSuffixes: []string{"mesh.example.com"}}
	for host, refused := range map[string]bool{
		"10.1.2.3":                 true,
		"web.2.3":                  true,
		"web.shop.3":               true,
		"web.3":                    true,
		"1.2.3.4.mesh.example.com": false, // digits, but not the last label
		"web.shop.adaptive":        false,
		"3web.shop.adaptive":       false,
		"web.shop.adaptive2":       false,
	} {
		in := webInput()
		in.Optimizer.Spec.Host = host
		r := Compute(in)
		got := len(r.Problems) > 0 && r.Problems[0].Reason == ReasonInvalidHost
		if got != refused {
			t.Errorf("Compute with host %q: refused %v, want %v (%+v)", host, got, refused, r.Problems)
		}
		if refused && (r.ServiceEntry != nil || !strings.Contains(r.Problems[0].Message, "all-numeric")) {
			t.Errorf("host %q: objects written or the message does not say why: %+v", host, r.Problems)
		}
		p := CheckHost(HostClaim{Namespace: testNS, Name: "web", ServiceNamespace: testNS, ServiceName: "web", Host: host}, rules, nil, nil)
		if refused && (p == nil || p.Reason != ReasonInvalidHost) {
			t.Errorf("CheckHost(%q) = %+v, want InvalidHost", host, p)
		}
	}
	for suffix, refused := range map[string]bool{"3": true, "2.3": true, "10.1.2.3": true, "example.3": true, "3.example.com": false, "mesh": false} {
		if got := SuffixProblem(suffix) != ""; got != refused {
			t.Errorf("SuffixProblem(%q) refuses %v, want %v", suffix, got, refused)
		}
	}
	if ClusterDomainProblem("cluster.local") != "" || ClusterDomainProblem("cluster.7") == "" {
		t.Errorf("ClusterDomainProblem: cluster.local %q, cluster.7 %q", ClusterDomainProblem("cluster.local"), ClusterDomainProblem("cluster.7"))
	}
}
