package controllers

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// ReasonUnknownFields is the Degraded reason of a spec with fields the
// operator does not know (a typo, or a field of another release): they are
// ignored, which may not be what the user meant.
const ReasonUnknownFields = "UnknownFields"

// A stored optimizer always decodes (api/v1alpha1/decode.go), so one object
// written past admission cannot fail the informer's list for every other
// optimizer. What did not decode is sorted here:
//
//   - a spec value of the wrong type or beyond its Go type's range: the
//     optimizer stalls with InvalidSpec (undecodedSpec, via invalidSpec);
//     nothing is written for it, as for any other unusable spec;
//   - a spec field the operator does not know: ignored, Degraded;
//   - a status value that did not decode: the operator's own field,
//     rewritten by this reconcile's status write; only logged.
//
// The spec's problems, which only the user can mend, are also counted in
// optimizer_invalid_objects.

// undecodedSpec lists the spec values that did not decode.
func undecodedSpec(opt *optv1.IstioAdaptiveRequestOptimizer) []string {
	var out []string
	for _, p := range opt.DecodeProblems() {
		if !p.Unknown && isSpecPath(p.Path) {
			out = append(out, p.String())
		}
	}
	return out
}

// specProblems counts what did not decode of opt's spec (values and
// unknown fields): what optimizer_invalid_objects shows. A status problem
// is not counted: the reconcile that read it rewrites the status, and a
// series left from it would outlive the problem until the next reconcile.
func specProblems(opt *optv1.IstioAdaptiveRequestOptimizer) int {
	n := 0
	for _, p := range opt.DecodeProblems() {
		if isSpecPath(p.Path) {
			n++
		}
	}
	return n
}

// unknownSpecFields says which spec fields were ignored, or "".
func unknownSpecFields(opt *optv1.IstioAdaptiveRequestOptimizer) string {
	var paths []string
	for _, p := range opt.DecodeProblems() {
		if p.Unknown && isSpecPath(p.Path) {
			paths = append(paths, p.Path)
		}
	}
	if len(paths) == 0 {
		return ""
	}
	return fmt.Sprintf("Unknown fields %s are ignored; check their spelling against the CRD (kubectl explain istioadaptiverequestoptimizer.spec)", strings.Join(paths, ", "))
}

func isSpecPath(path string) bool {
	return path == "spec" || strings.HasPrefix(path, "spec.")
}

// reportDecodeProblems publishes what did not decode of opt: the spec's
// count in optimizer_invalid_objects, unknown spec fields as Degraded with
// a Warning event, all of it in the log. A spec value that did not decode
// stalls the optimizer through invalidSpec.
func (r *MirrorReconciler) reportDecodeProblems(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer, st *status) {
	problems := opt.DecodeProblems()
	r.Metrics.SetInvalidObject(opt.Namespace, opt.Name, specProblems(opt))
	if len(problems) == 0 {
		return
	}
	all := make([]string, 0, len(problems))
	for _, p := range problems {
		all = append(all, p.String())
	}
	log.FromContext(ctx).Info("Parts of the stored optimizer did not decode", "problems", all)
	if msg := unknownSpecFields(opt); msg != "" {
		st.degraded(ReasonUnknownFields, msg)
		r.Recorder.Eventf(opt, nil, corev1.EventTypeWarning, ReasonUnknownFields, "Reconcile", "%s", msg)
	}
}
