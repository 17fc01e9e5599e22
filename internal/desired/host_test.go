package desired

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

func TestComputeRefusesHostsThatShadowKubernetesServices(t *testing.T) {
	tests := map[string]struct {
		host string
		ok   bool
	}{
		"default host":              {host: "", ok: true},
		"a name of its own":         {host: "web.fast.internal", ok: true},
		"another Service's FQDN":    {host: "payments.prod.svc.cluster.local"},
		"svc suffix":                {host: "payments.prod.svc"},
		"short name":                {host: "payments"},
		"wildcard":                  {host: "*.adaptive"},
		"trailing dot of a Service": {host: "payments.prod.svc.cluster.local."},
		"upper case Service FQDN":   {host: "Payments.Prod.SVC.cluster.local"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opt := &optv1.IstioAdaptiveRequestOptimizer{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o"},
				Spec: optv1.IstioAdaptiveRequestOptimizerSpec{ServiceName: "web", Host: tc.host}}
			res := Compute(Input{Optimizer: opt})
			var fatal *Problem
			for i := range res.Problems {
				if res.Problems[i].Fatal {
					fatal = &res.Problems[i]
				}
			}
			switch {
			case tc.ok && fatal != nil && fatal.Reason == "InvalidHost":
				t.Errorf("host %q refused: %s", tc.host, fatal.Message)
			case !tc.ok && (fatal == nil || fatal.Reason != "InvalidHost"):
				t.Errorf("host %q accepted; problems %+v", tc.host, res.Problems)
			case !tc.ok && !strings.Contains(fatal.Message, "host"):
				t.Errorf("message does not explain: %q", fatal.Message)
			}
			if !tc.ok && res.ServiceEntry != nil {
				t.Errorf("a ServiceEntry was computed for a refused host")
			}
		})
	}
}

func TestInvalidHostRefusesWhatIsNotADNSName(t *testing.T) {
	long := strings.Repeat("a", 64)
	tests := map[string]struct {
		host string
		ok   bool
	}{
		"default form":           {host: "web.shop.adaptive", ok: true},
		"63-character label":     {host: strings.Repeat("a", 63) + ".shop.adaptive", ok: true},
		"253 characters":         {host: strings.Repeat(strings.Repeat("a", 62)+".", 3) + strings.Repeat("b", 55) + ".adaptive", ok: true},
		"hyphens inside":         {host: "web-v2.shop-eu.adaptive", ok: true},
		"bad characters":         {host: "Bad_Host!.example"},
		"empty label":            {host: "a..b"},
		"port":                   {host: "web.fast.internal:8080"},
		"64-character label":     {host: long + ".shop.adaptive"},
		"254 characters":         {host: strings.Repeat(strings.Repeat("a", 62)+".", 3) + strings.Repeat("b", 56) + ".adaptive"},
		"leading dot":            {host: ".web.shop.adaptive"},
		"label starts with dash": {host: "-web.shop.adaptive"},
		"label ends with dash":   {host: "web-.shop.adaptive"},
		"upper case":             {host: "Web.shop.adaptive"},
		"underscore":             {host: "web_v2.shop.adaptive"},
		"space":                  {host: "web .shop.adaptive"},
		"non-ASCII":              {host: "wéb.shop.adaptive"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			msg := invalidHost(tc.host, "")
			if tc.ok && msg != "" {
				t.Errorf("valid host %q refused: %s", tc.host, msg)
			}
			if !tc.ok && (msg == "" || !strings.Contains(msg, tc.host)) {
				t.Errorf("invalid host %q: message %q does not refuse it by name", tc.host, msg)
			}
		})
	}
}

func TestCheckHostDecidesWhoOwnsAHost(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	claim := func(ns, name, svcNS, host string, created time.Duration, mut ...func(*HostClaim)) HostClaim {
		c := HostClaim{Namespace: ns, Name: name, ServiceNamespace: svcNS, ServiceName: "web", Host: host, Created: t0.Add(created)}
		for _, m := range mut {
			m(&c)
		}
		return c
	}
	holds := func(c *HostClaim) { c.Holds = true }
	deleting := func(c *HostClaim) { c.Deleting = true }
	barred := func(c *HostClaim) { c.Barred = true }
	rules := HostRules{AllowedSuffixes: []string{"mesh.example.com", ".shared.internal."}}

	tests := map[string]struct {
		me      HostClaim
		others  []HostClaim
		holders []HostHolder
		reason  string // "" when the host may be used
		names   string // in the message
	}{
		"default host, alone":          {me: claim("a", "o", "a", "web.a.adaptive", 0)},
		"own namespace's names":        {me: claim("a", "o", "a", "canary.web.a.adaptive", 0)},
		"allowed suffix":               {me: claim("a", "o", "a", "web.mesh.example.com", 0)},
		"allowed suffix, dots trimmed": {me: claim("a", "o", "a", "web.shared.internal", 0)},
		"the suffix itself":            {me: claim("a", "o", "a", "mesh.example.com", 0), reason: ReasonHostNotAllowed},
		"namespace suffix itself":      {me: claim("a", "o", "a", "a.adaptive", 0), reason: ReasonHostNotAllowed},
		"another namespace's names":    {me: claim("b", "o", "b", "checkout.a.adaptive", 0), reason: ReasonHostNotAllowed, names: `"b"`},
		"a public name":                {me: claim("b", "o", "b", "api.example.com", 0), reason: ReasonHostNotAllowed, names: "--allowed-host-suffixes"},
		"suffix look-alike":            {me: claim("a", "o", "a", "evilmesh.example.com", 0), reason: ReasonHostNotAllowed},
		"invalid DNS name":             {me: claim("a", "o", "a", "a..b", 0), reason: ReasonInvalidHost},
		"Service host":                 {me: claim("a", "o", "a", "web.a.svc.cluster.local", 0), reason: ReasonInvalidHost},
		"older optimizer holds it": {
			me:     claim("b", "o", "b", "web.mesh.example.com", time.Hour),
			others: []HostClaim{claim("a", "first", "a", "web.mesh.example.com", 0)},
			reason: ReasonHostTaken, names: "a/first",
		},
		"we are older": {
			me:     claim("a", "first", "a", "web.mesh.example.com", 0),
			others: []HostClaim{claim("b", "o", "b", "web.mesh.example.com", time.Hour)},
		},
		"same age: by namespace/name": {
			me:     claim("b", "o", "b", "web.mesh.example.com", 0),
			others: []HostClaim{claim("a", "o", "a", "web.mesh.example.com", 0)},
			reason: ReasonHostTaken, names: "a/o",
		},
		"the current holder beats an older claim": {
			me:     claim("a", "old", "a", "web.mesh.example.com", 0),
			others: []HostClaim{claim("b", "young", "b", "web.mesh.example.com", time.Hour, holds)},
			reason: ReasonHostTaken, names: "b/young",
		},
		"a deleting optimizer gives the host up": {
			me:     claim("b", "o", "b", "web.mesh.example.com", time.Hour),
			others: []HostClaim{claim("a", "o", "a", "web.mesh.example.com", 0, holds, deleting)},
		},
		"a barred claim does not count": {
			me:     claim("b", "o", "b", "web.mesh.example.com", time.Hour),
			others: []HostClaim{claim("a", "o", "a", "web.mesh.example.com", 0, barred)},
		},
		"a claim its team may not make does not block the owner": {
			me:     claim("a", "o", "a", "web.a.adaptive", time.Hour),
			others: []HostClaim{claim("b", "thief", "b", "web.a.adaptive", 0, holds)},
		},
		"another optimizer of the same Service is left to the object conflict rule": {
			me:     claim("a", "again", "a", "web.a.adaptive", time.Hour),
			others: []HostClaim{claim("a", "o", "a", "web.a.adaptive", 0, holds)},
		},
		"other hosts do not matter": {
			me:     claim("a", "o", "a", "web.a.adaptive", time.Hour),
			others: []HostClaim{claim("a", "x", "a", "api.a.adaptive", 0)},
		},
		"a ServiceEntry the operator did not write": {
			me:      claim("a", "o", "a", "web.mesh.example.com", 0),
			holders: []HostHolder{{Kind: "ServiceEntry", Namespace: "legacy", Name: "web-ext"}},
			reason:  ReasonHostTaken, names: "ServiceEntry legacy/web-ext",
		},
		"a Kubernetes Service": {
			me:      claim("a", "o", "a", "web.a", 0),
			holders: []HostHolder{{Kind: "Service", Namespace: "a", Name: "web"}},
			reason:  ReasonHostTaken, names: "Service a/web",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := CheckHost(tc.me, rules, tc.others, tc.holders)
			switch {
			case tc.reason == "" && p != nil:
				t.Fatalf("refused: %s: %s", p.Reason, p.Message)
			case tc.reason == "":
				return
			case p == nil:
				t.Fatalf("allowed, want %s", tc.reason)
			case p.Reason != tc.reason || !p.Fatal:
				t.Fatalf("%s (fatal %v): %s, want %s", p.Reason, p.Fatal, p.Message, tc.reason)
			case !strings.Contains(p.Message, tc.me.Host) || !strings.Contains(p.Message, tc.names):
				t.Errorf("message %q names neither the host nor %q", p.Message, tc.names)
			}
		})
	}
}

func TestServiceHostName(t *testing.T) {
	for host, want := range map[string]string{
		"web.shop":                   "shop/web",
		"web.shop.svc":               "shop/web",
		"web.shop.svc.cluster.local": "shop/web",
		"web.shop.adaptive":          "",
		"web":                        "",
		"web.shop.example.com":       "",
	} {
		ns, svc, ok := ServiceHostName(host, "")
		got := ""
		if ok {
			got = ns + "/" + svc
		}
		if got != want {
			t.Errorf("ServiceHostName(%q) = %q, want %q", host, got, want)
		}
	}
}

// FuzzCheckHost: whatever the host, an accepted one is a DNS name under an
// allowed suffix, and of two optimizers claiming one host exactly one wins.
func FuzzCheckHost(f *testing.F) {
	for _, s := range []string{"web.a.adaptive", "a..b", "Bad_Host!.example", "web.fast.internal:8080", "x.mesh.example.com", strings.Repeat("a", 64) + ".a.adaptive", "*.a.adaptive", ""} {
		f.Add(s, "a", "b", int64(0), false)
	}
	rules := HostRules{AllowedSuffixes: []string{"mesh.example.com"}}
	f.Fuzz(func(t *testing.T, host, nsA, nsB string, ageGap int64, holdsB bool) {
		t0 := time.Unix(0, 0)
		a := HostClaim{Namespace: nsA, Name: "a", ServiceNamespace: nsA, ServiceName: "web-a", Host: host, Created: t0}
		b := HostClaim{Namespace: nsB, Name: "b", ServiceNamespace: nsB, ServiceName: "web-b", Host: host, Created: t0.Add(time.Duration(ageGap)), Holds: holdsB}
		pa := CheckHost(a, rules, []HostClaim{b}, nil)
		pb := CheckHost(b, rules, []HostClaim{a}, nil)
		for _, c := range []struct {
			claim HostClaim
			p     *Problem
		}{{a, pa}, {b, pb}} {
			if c.p == nil {
				if why := dnsSyntax(host); why != "" {
					t.Fatalf("host %q accepted for %s but it %s", host, c.claim.Namespace, why)
				}
				if !strings.HasSuffix(host, "."+c.claim.ServiceNamespace+".adaptive") && !strings.HasSuffix(host, ".mesh.example.com") {
					t.Fatalf("host %q accepted for namespace %q outside its names", host, c.claim.ServiceNamespace)
				}
			} else if !c.p.Fatal || c.p.Message == "" {
				t.Fatalf("refusal without a message: %+v", c.p)
			}
		}
		if pa == nil && pb == nil {
			t.Fatalf("host %q given to both %s/a and %s/b", host, nsA, nsB)
		}
		validA := pa == nil || pa.Reason == ReasonHostTaken
		validB := pb == nil || pb.Reason == ReasonHostTaken
		if validA && validB && pa != nil && pb != nil {
			t.Fatalf("host %q refused to both claimants: %s / %s", host, pa.Message, pb.Message)
		}
	})
}
