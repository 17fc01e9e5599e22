package controllers

import (
	"fmt"
	"slices"
	"strings"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// NamespaceGate is an administrator's yes/no for a capability: for every
// namespace (All) or for the listed ones. The zero value allows nothing.
type NamespaceGate struct {
	All        bool
	Namespaces []string
}

// Allows says whether optimizers in namespace ns have the capability.
func (g NamespaceGate) Allows(ns string) bool {
	return g.All || slices.Contains(g.Namespaces, ns)
}

// describe names the flags that would allow the capability, for messages.
func (g NamespaceGate) describe(boolFlag, listFlag string) string {
	if len(g.Namespaces) == 0 {
		return fmt.Sprintf("the manager runs without --%s (the default)", boolFlag)
	}
	return fmt.Sprintf("the manager allows it only for the namespaces in --%s (%s)", listFlag, strings.Join(g.Namespaces, ","))
}

// listFlag parses a comma-separated flag value, dropping empty items.
func listFlag(dst *[]string) func(string) error {
	return func(s string) error {
		for _, v := range strings.Split(s, ",") {
			if v = strings.TrimSpace(v); v != "" {
				*dst = append(*dst, v)
			}
		}
		return nil
	}
}

// crossNamespaceDenied explains why an optimizer may not reach into another
// namespace, or returns "". Targeting another namespace makes the operator
// write routing objects there for whoever may create an optimizer, so it is
// off unless the administrator allows it.
func crossNamespaceDenied(opt *optv1.IstioAdaptiveRequestOptimizer, gate NamespaceGate) string {
	if opt.TargetNamespace() == opt.Namespace || gate.Allows(opt.Namespace) {
		return ""
	}
	return fmt.Sprintf("service_namespace %q differs from the optimizer's namespace %q and %s; create the optimizer in %q instead, "+
		"or ask the administrator for --allow-cross-namespace or --cross-namespace-namespaces=%s",
		opt.TargetNamespace(), opt.Namespace, gate.describe("allow-cross-namespace", "cross-namespace-namespaces"), opt.TargetNamespace(), opt.Namespace)
}
