package controllers

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// ReasonInvalidSpec is the Stalled reason of a spec the API server should
// have refused but stored anyway: written before the CRD validated the
// field, with validation off, or on a Kubernetes version that does not run
// the CEL rule for it.
const ReasonInvalidSpec = "InvalidSpec"

// invalidSpec lists the fields of a spec that cannot be used, or returns "".
// Nothing is written for such an optimizer and its live routing is left as
// it is: guessing what the user meant (a default cycle, port 80) would route
// traffic in a way nobody asked for.
func invalidSpec(opt *optv1.IstioAdaptiveRequestOptimizer) string {
	problems := undecodedSpec(opt)
	if o := opt.Spec.Optimization; o != nil {
		for _, f := range durationFields(o) {
			if err := f.value.Err(); err != nil {
				problems = append(problems, fmt.Sprintf("spec.optimization.%s: %v", f.name, err))
			}
		}
	}
	for i, p := range opt.Spec.ServicePorts {
		if p.TargetPort == nil {
			continue
		}
		if msg := targetPortProblem(*p.TargetPort); msg != "" {
			problems = append(problems, fmt.Sprintf("spec.service_ports[%d].targetPort: %s", i, msg))
		}
	}
	if len(problems) == 0 {
		return ""
	}
	return "The spec cannot be used, nothing is written and live routing is left as it is; fix " + strings.Join(problems, "; ")
}

// targetPortProblem checks a target port as Kubernetes checks a container
// port: a number 1-65535 or an IANA service name.
func targetPortProblem(p intstr.IntOrString) string {
	if p.Type == intstr.Int {
		if p.IntVal < 1 || p.IntVal > 65535 {
			return fmt.Sprintf("%d is not a port number (1-65535)", p.IntVal)
		}
		return ""
	}
	if errs := validation.IsValidPortName(p.StrVal); len(errs) > 0 {
		return fmt.Sprintf("%q is not a port name: %s", p.StrVal, strings.Join(errs, ", "))
	}
	return ""
}

type durationField struct {
	name  string
	value *optv1.Duration
}

// durationFields are the duration fields of spec.optimization that are set.
func durationFields(o *optv1.Optimization) []durationField {
	all := []durationField{
		{"cycle", o.Cycle}, {"query_window", o.QueryWindow}, {"scrape_interval", o.ScrapeInterval},
		{"slow_start", o.SlowStart}, {"drain_time", o.DrainTime}, {"weight_expiry", o.WeightExpiry},
	}
	set := all[:0]
	for _, f := range all {
		if f.value != nil {
			set = append(set, f)
		}
	}
	return set
}
