package controllers

import (
	"fmt"
	"reflect"
	"strings"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// ReasonCustomQueryNotAllowed: an optimizer set query templates the
// administrator does not allow for its namespace.
const ReasonCustomQueryNotAllowed = "CustomQueryNotAllowed"

// withAllowedQueries returns opt, or, when opt sets query templates
// (spec.optimization.*_query) that gate does not allow for its namespace, a
// copy without them and a message naming them. Custom templates run with the
// operator's metrics credentials and could read any series or load the
// backend; the shipped ones only read the optimizer's Service's namespace.
// A refused template does not stop the optimizer: it keeps running on the
// operator's default queries, and Degraded says so. "-" (request_query: CPU
// only) asks for less, not other data, and is always allowed.
func withAllowedQueries(opt *optv1.IstioAdaptiveRequestOptimizer, gate NamespaceGate) (*optv1.IstioAdaptiveRequestOptimizer, string) {
	if opt.Spec.Optimization == nil || gate.Allows(opt.Namespace) {
		return opt, ""
	}
	out := opt.DeepCopy()
	v := reflect.ValueOf(out.Spec.Optimization).Elem()
	var refused []string
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		f := v.Field(i)
		if !strings.HasSuffix(name, "_query") || f.Kind() != reflect.String || f.String() == "" || f.String() == "-" {
			continue
		}
		refused = append(refused, name)
		f.SetString("")
	}
	if len(refused) == 0 {
		return opt, ""
	}
	return out, fmt.Sprintf("spec.optimization %s: custom query templates are not allowed in namespace %q (%s); the operator's default queries are used. "+
		"Remove the field, or ask the administrator for --allow-custom-queries or --custom-query-namespaces=%s",
		strings.Join(refused, ", "), opt.Namespace, gate.describe("allow-custom-queries", "custom-query-namespaces"), opt.Namespace)
}
