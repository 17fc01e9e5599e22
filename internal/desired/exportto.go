package desired

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationExportTo is Istio's annotation that limits which namespaces see
// a Kubernetes Service ("." own namespace, "*" all, "~" none, or names).
const AnnotationExportTo = "networking.istio.io/exportTo"

// exportTo is the export scope of the owned objects: exactly the namespaces
// that see the Service, so opting in never makes the Service reachable from a
// namespace that could not reach it before. Istio reads the Service's
// annotation, else the mesh's defaultServiceExportTo (meshDefault; nil means
// Istio's own default, "*"). Istio's rules, mirrored here: "." is the
// Service's namespace; a list of names does not imply the own namespace;
// "~" alone hides the Service from every namespace, and next to other
// entries means nothing. An entry that is not a namespace name can match no
// namespace and is dropped. The result is sorted, with the own namespace
// written "." (Istio rejects both spellings together).
//
// A Service exported to no namespace gets a Fatal problem: the owned
// VirtualService and DestinationRule cannot say "~" (Istio allows it only on
// ServiceEntries), and nothing could reach the optimized host anyway.
func exportTo(svc *corev1.Service, meshDefault []string) ([]string, *Problem) {
	raw := meshDefault
	source := "the mesh default (--default-export-to)"
	if v := strings.TrimSpace(svc.Annotations[AnnotationExportTo]); v != "" {
		raw = strings.Split(v, ",")
		source = fmt.Sprintf("its %s annotation %q", AnnotationExportTo, v)
	}
	if len(raw) == 0 {
		return []string{"*"}, nil
	}
	set := map[string]bool{}
	for _, e := range raw {
		e = strings.TrimSpace(e)
		switch {
		case e == "*":
			return []string{"*"}, nil
		case e == "." || e == svc.Namespace:
			set["."] = true
		case e == "~" || e == "":
		case len(validation.IsDNS1123Label(e)) == 0:
			set[e] = true
		}
	}
	if len(set) == 0 {
		return nil, &Problem{Reason: "ServiceNotExported", Fatal: true,
			Message: fmt.Sprintf("Service %s/%s is visible to no namespace (%s); there is no traffic to optimize", svc.Namespace, svc.Name, source)}
	}
	out := make([]string, 0, len(set))
	for e := range set {
		out = append(out, e)
	}
	sort.Strings(out) // "." sorts before every namespace name
	return out, nil
}

// ParseExportTo reads a comma-separated export scope (the
// --default-export-to flag, Istio's defaultServiceExportTo).
func ParseExportTo(s string) ([]string, error) {
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if e != "*" && e != "." && e != "~" && len(validation.IsDNS1123Label(e)) > 0 {
			return nil, fmt.Errorf("export scope entry %q is not \".\", \"*\", \"~\" or a namespace name", e)
		}
		out = append(out, e)
	}
	return out, nil
}
