package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// The suite's manager (suite_test.go) runs with these administrator settings.
const (
	platformNamespace    = "platform"
	customQueryNamespace = "queries-allowed"
	sharedHostSuffix     = "shared.example"
)

var sharedNamespaces sync.Map

// sharedNamespace creates a namespace of a fixed name once per run.
func sharedNamespace(t *testing.T, name string) string {
	t.Helper()
	if _, done := sharedNamespaces.LoadOrStore(name, true); !done {
		if err := k8s.Create(context.Background(), nsObj(name)); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", name, err)
		}
	}
	return name
}

// untouchedSE returns a check that ServiceEntry ns/web-adaptive keeps the
// resourceVersion and host it has now.
func untouchedSE(t *testing.T, ns string) func() error {
	t.Helper()
	se, err := getSE(ns, "web-adaptive")
	if err != nil {
		t.Fatal(err)
	}
	rv, hosts := se.ResourceVersion, strings.Join(se.Spec.Hosts, ",")
	return func() error {
		now, err := getSE(ns, "web-adaptive")
		if err != nil {
			return err
		}
		if now.ResourceVersion != rv || strings.Join(now.Spec.Hosts, ",") != hosts {
			return fmt.Errorf("ServiceEntry %s/web-adaptive rewritten: hosts %v", ns, now.Spec.Hosts)
		}
		return nil
	}
}

func stalledNaming(t *testing.T, ns, name, reason string, names ...string) {
	t.Helper()
	o := waitCondition(t, ns, name, "Stalled", "True/"+reason)
	msg := conditionMessage(o, "Stalled")
	for _, n := range names {
		if !strings.Contains(msg, n) {
			t.Errorf("Stalled message %q does not name %q", msg, n)
		}
	}
	mustNotExist(t, named(seObj(), ns, "web-adaptive"))
}

// Two teams: team b cannot take team a's host, whichever optimizer comes
// first, and a's routing is untouched.
func TestSecondTeamCannotTakeTheFirstTeamsHost(t *testing.T) {
	for _, order := range []string{"a first", "b first"} {
		t.Run(order, func(t *testing.T) {
			a, b := newNamespace(t), newNamespace(t)
			webService(t, a, Ready("web-0", IP(42, 1), "node-a-"+a))
			webService(t, b, Ready("web-0", IP(42, 2), "node-a-"+b))
			thief := Optimizer(b, "web", "web")
			thief.Spec.Host = "web." + a + ".adaptive"
			if order == "b first" {
				mustCreate(t, thief)
				stalledNaming(t, b, "web", "HostNotAllowed", thief.Spec.Host, `"`+b+`"`)
			}
			mustCreate(t, Optimizer(a, "web", "web"))
			waitCondition(t, a, "web", "Ready", "True/Reconciled")
			mustEventuallySE(t, a, wantAddrs(IP(42, 1)))
			same := untouchedSE(t, a)
			if order == "a first" {
				mustCreate(t, thief)
			}
			stalledNaming(t, b, "web", "HostNotAllowed", thief.Spec.Host)
			consistently(t, 500*time.Millisecond, "team a's ServiceEntry untouched", same)
		})
	}
}

// On a suffix both teams may use, the first claimant keeps the host, the
// second stalls naming it, and takes over when the first goes away.
func TestSharedSuffixHostGoesToTheFirstClaimant(t *testing.T) {
	a, b := newNamespace(t), newNamespace(t)
	host := "web-" + a + "." + sharedHostSuffix
	webService(t, a, Ready("web-0", IP(43, 1), "node-a-"+a))
	webService(t, b, Ready("web-0", IP(43, 2), "node-a-"+b))
	first := Optimizer(a, "web", "web")
	first.Spec.Host = host
	mustCreate(t, first)
	waitCondition(t, a, "web", "Ready", "True/Reconciled")
	mustEventuallySE(t, a, func(se seT) error {
		if strings.Join(se.Spec.Hosts, ",") != host {
			return fmt.Errorf("hosts %v, want the allowed-suffix host %s", se.Spec.Hosts, host)
		}
		return nil
	})
	same := untouchedSE(t, a)

	second := Optimizer(b, "web", "web")
	second.Spec.Host = host
	mustCreate(t, second)
	stalledNaming(t, b, "web", "HostTaken", host, a+"/web")
	consistently(t, 500*time.Millisecond, "the first claimant's ServiceEntry untouched", same)

	if err := k8s.Delete(context.Background(), optKey(a, "web")); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, b, "web", "Ready", "True/Reconciled")
	mustEventuallySE(t, b, wantAddrs(IP(43, 2)))
}

// A ServiceEntry the operator did not write keeps its host; once it is gone
// the optimizer proceeds.
func TestForeignServiceEntryKeepsItsHost(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(44, 1), "node-a-"+ns))
	theirs := &istionet.ServiceEntry{}
	theirs.Namespace, theirs.Name = ns, "legacy-web"
	theirs.Spec.Hosts = []string{"web." + ns + ".adaptive"}
	theirs.Spec.Resolution = networking.ServiceEntry_DNS
	mustCreate(t, theirs)
	mustCreate(t, Optimizer(ns, "web", "web"))
	stalledNaming(t, ns, "web", "HostTaken", "ServiceEntry "+ns+"/legacy-web", "not written by the operator")

	got := &istionet.ServiceEntry{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(theirs), got); err != nil {
		t.Fatal(err)
	}
	if got.ResourceVersion != theirs.ResourceVersion || len(got.Labels) != 0 {
		t.Errorf("the user's ServiceEntry was written: labels %v", got.Labels)
	}
	if err := k8s.Delete(context.Background(), theirs); err != nil {
		t.Fatal(err)
	}
	waitCondition(t, ns, "web", "Ready", "True/Reconciled")
}

// A host that sidecars resolve to a Kubernetes Service is that Service's.
func TestServiceHostIsRefused(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(45, 1), "node-a-"+ns))
	opt := Optimizer(ns, "web", "web")
	opt.Spec.Host = "web." + ns
	mustCreate(t, opt)
	stalledNaming(t, ns, "web", "HostTaken", "Service "+ns+"/web")
}

// A host outside the allowed names is never written.
func TestHostOutsideTheAllowedNamesIsRefused(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(46, 1), "node-a-"+ns))
	opt := Optimizer(ns, "web", "web")
	opt.Spec.Host = "api.example.com"
	mustCreate(t, opt)
	stalledNaming(t, ns, "web", "HostNotAllowed", "api.example.com", "--allowed-host-suffixes", sharedHostSuffix)
}

// Hosts that are not DNS names are refused by the API server. (The same
// hosts are refused at runtime, for a CRD that predates the pattern, by
// desired.invalidHost: TestInvalidHostRefusesWhatIsNotADNSName.)
func TestInvalidHostIsRefusedAtAdmission(t *testing.T) {
	ns := newNamespace(t)
	for _, host := range []string{"Bad_Host!.example", "a..b", "web.fast.internal:8080", strings.Repeat("a", 64) + ".shop.adaptive", "web", strings.Repeat("a.", 127) + "ab"} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "optimization.liorfranko.github.io/v1alpha1",
			"kind":       "IstioAdaptiveRequestOptimizer",
			"metadata":   map[string]any{"name": "bad", "namespace": ns},
			"spec":       map[string]any{"service_name": "web", "host": host},
		}}
		err := k8s.Create(context.Background(), u, client.DryRunAll)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.host") {
			t.Errorf("host %q: error %v, want Invalid on spec.host", host, err)
		}
	}
	ok := Optimizer(ns, "good", "web")
	ok.Spec.Host = "web-v2.team." + sharedHostSuffix
	if err := k8s.Create(context.Background(), ok, client.DryRunAll); err != nil {
		t.Errorf("a valid host is refused: %v", err)
	}
}

// Targeting another namespace is off unless the administrator allows it;
// the refused optimizer writes nothing there.
func TestCrossNamespaceIsOffByDefault(t *testing.T) {
	svcNS, optNS := newNamespace(t), newNamespace(t)
	webService(t, svcNS, Ready("web-0", IP(47, 1), "node-a-"+svcNS))
	opt := Optimizer(optNS, "web", "web")
	opt.Spec.ServiceNamespace = svcNS
	mustCreate(t, opt)
	o := waitCondition(t, optNS, "web", "Stalled", "True/CrossNamespaceDenied")
	if msg := conditionMessage(o, "Stalled"); !strings.Contains(msg, "--allow-cross-namespace") {
		t.Errorf("message %q does not say how to allow it", msg)
	}
	consistently(t, 300*time.Millisecond, "nothing written in the Service's namespace", func() error {
		if _, err := getSE(svcNS, "web-adaptive"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("ServiceEntry in %s: %v", svcNS, err)
		}
		return nil
	})

	// The platform namespace may (suite_test.go lists it).
	allowed := Optimizer(sharedNamespace(t, platformNamespace), "web-"+svcNS, "web")
	allowed.Spec.ServiceNamespace = svcNS
	mustCreate(t, allowed)
	waitCondition(t, platformNamespace, allowed.Name, "Ready", "True/Reconciled")
	mustEventuallySE(t, svcNS, wantAddrs(IP(47, 1)))
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), allowed) })
}

// A holder whose name is too long for a label value (its ServiceEntry's
// optimizer-name label is hashed, the name kept in an annotation) keeps its
// host when an older optimizer asks for that host later.
func TestLongNamedHolderKeepsItsHost(t *testing.T) {
	a, b := newNamespace(t), newNamespace(t)
	host := "web-" + a + "." + sharedHostSuffix
	webService(t, a, Ready("web-0", IP(44, 1), "node-a-"+a))
	webService(t, b, Ready("web-0", IP(44, 2), "node-a-"+b))
	older := Optimizer(b, "web", "web")
	older.Spec.Host = "web-" + b + "." + sharedHostSuffix
	mustCreate(t, older)
	waitCondition(t, b, "web", "Ready", "True/Reconciled")
	// Creation times count in whole seconds: the holder comes a second later.
	time.Sleep(time.Until(older.CreationTimestamp.Add(1100 * time.Millisecond)))

	long := "web-" + strings.Repeat("x", 66) // 70 characters: a label value holds 63
	holder := Optimizer(a, long, "web")
	holder.Spec.Host = host
	mustCreate(t, holder)
	waitCondition(t, a, long, "Ready", "True/Reconciled")
	mustEventuallySE(t, a, func(se seT) error {
		if strings.Join(se.Spec.Hosts, ",") != host {
			return fmt.Errorf("hosts %v, want %s", se.Spec.Hosts, host)
		}
		return nil
	})
	same := untouchedSE(t, a)

	updateOpt(t, b, "web", func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.Host = host })
	o := waitCondition(t, b, "web", "Stalled", "True/HostTaken")
	if msg := conditionMessage(o, "Stalled"); !strings.Contains(msg, a+"/"+long) {
		t.Errorf("Stalled message %q does not name the holder %s/%s", msg, a, long)
	}
	consistently(t, 500*time.Millisecond, "the holder's ServiceEntry untouched", same)
	waitCondition(t, a, long, "Ready", "True/Reconciled")
}
