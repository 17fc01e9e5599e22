package controllers_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/intstr"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// The suite's manager allows custom queries only in customQueryNamespace: an
// optimizer elsewhere keeps routing, on the default queries, Degraded with
// CustomQueryNotAllowed; one in the allowed namespace is not.
func TestCustomQueriesOnlyWhereTheAdministratorAllows(t *testing.T) {
	custom := &optv1.Optimization{CPUQuery: `sum by (pod) (rate(container_cpu_usage_seconds_total{pod=~"{{.Pods}}"}[{{.Window}}]))`}

	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(49, 1), "node-a-"+ns))
	refused := Optimizer(ns, "web", "web")
	refused.Spec.Optimization = custom
	mustCreate(t, refused)
	o := waitCondition(t, ns, "web", "Degraded", "True/CustomQueryNotAllowed")
	if msg := conditionMessage(o, "Degraded"); !strings.Contains(msg, "cpu_query") || !strings.Contains(msg, "--custom-query-namespaces") {
		t.Errorf("Degraded message %q names neither the field nor the flag", msg)
	}
	if condition(o, "Ready") != "True/Reconciled" {
		t.Errorf("a refused template stopped the optimizer: Ready %s", condition(o, "Ready"))
	}
	mustEventuallySE(t, ns, wantAddrs(IP(49, 1)))

	allowedNS := sharedNamespace(t, customQueryNamespace)
	svc := "web-" + ns
	mustCreate(t, Service(allowedNS, svc, ServicePort("http", 80, intstr.FromInt32(8080))))
	allowed := Optimizer(allowedNS, svc, svc)
	allowed.Spec.Optimization = custom
	mustCreate(t, allowed)
	a := waitCondition(t, allowedNS, svc, "Ready", "True/Reconciled")
	if strings.Contains(condition(a, "Degraded"), "CustomQueryNotAllowed") || strings.Contains(conditionMessage(a, "Degraded"), "cpu_query") {
		t.Errorf("custom query refused in the allowed namespace: %v", a.Status.Conditions)
	}
}
