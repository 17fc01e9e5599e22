package desired

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// UpToDate says whether a live object already has everything the desired one
// asks for: the desired labels, owners and spec. Only what the operator's
// field manager (manager) owns counts: every spec field the operator sets
// equals the live one, and every spec field its managedFields entry owns is
// still desired (else an apply must remove it). Fields other writers added
// (labels, annotations, a spec field such as exportTo set by another field
// manager or a mutating webhook) cause no write. Without a managedFields
// entry of the operator the whole spec is compared.
func UpToDate(manager string, desired, live metav1.Object, desiredSpec, liveSpec proto.Message) bool {
	if live == nil {
		return false
	}
	for k, v := range desired.GetLabels() {
		if live.GetLabels()[k] != v {
			return false
		}
	}
	if len(desired.GetOwnerReferences()) > 0 && !hasOwners(live.GetOwnerReferences(), desired.GetOwnerReferences()) {
		return false
	}
	if specEqual(desiredSpec, liveSpec) {
		// The usual case, and the cheap one: a spec that is already exactly
		// what is desired needs no apply whoever owns its fields. Reading
		// the owned fields costs two JSON encodings of the spec, a third of
		// a 4000-pod reconcile.
		return true
	}
	owned := ownedFields(live.GetManagedFields(), manager)
	if owned == nil {
		return false
	}
	want, err1 := specMap(desiredSpec)
	have, err2 := specMap(liveSpec)
	if err1 != nil || err2 != nil {
		return proto.Equal(desiredSpec, liveSpec)
	}
	return SpecUpToDate(want, have, owned)
}

// SpecUpToDate is UpToDate on JSON specs: want is the desired spec, have
// the live one, owned the live spec paths the operator's field manager owns
// (each a list of field names from the spec down). Maps are compared field
// by field (fields only in have are someone else's); lists and scalars the
// operator sets are compared whole, as server-side apply owns them (Istio's
// lists are atomic).
func SpecUpToDate(want, have map[string]any, owned [][]string) bool {
	if !subset(want, have) {
		return false
	}
	for _, path := range owned {
		if !hasPath(want, path) {
			return false
		}
	}
	return true
}

func subset(want, have any) bool {
	wm, ok := want.(map[string]any)
	if !ok {
		return reflect.DeepEqual(want, have)
	}
	hm, ok := have.(map[string]any)
	if !ok {
		return false
	}
	for k, w := range wm {
		h, found := hm[k]
		if !found || !subset(w, h) {
			return false
		}
	}
	return true
}

func hasPath(m map[string]any, path []string) bool {
	var cur any = m
	for _, name := range path {
		cm, ok := cur.(map[string]any)
		if !ok {
			return true // inside a list or value the operator sets whole
		}
		if cur, ok = cm[name]; !ok {
			return false
		}
	}
	return true
}

// ownedFields lists the spec paths manager's apply entry owns, down to the
// first element that is not a field name (a list item); nil when there is
// no such entry or it cannot be read.
func ownedFields(entries []metav1.ManagedFieldsEntry, manager string) [][]string {
	for _, e := range entries {
		if e.Manager != manager || e.Operation != metav1.ManagedFieldsOperationApply || e.FieldsV1 == nil || e.Subresource != "" {
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(bytes.NewReader(e.FieldsV1.Raw)); err != nil {
			return nil
		}
		out := [][]string{}
		set.Leaves().Iterate(func(p fieldpath.Path) {
			if len(p) == 0 || p[0].FieldName == nil || *p[0].FieldName != "spec" {
				return
			}
			var names []string
			for _, el := range p[1:] {
				if el.FieldName == nil {
					break
				}
				names = append(names, *el.FieldName)
			}
			if len(names) > 0 {
				out = append(out, names)
			}
		})
		return out
	}
	return nil
}

// specMap is a spec as the API server stores it (Istio's JSON form).
func specMap(spec proto.Message) (map[string]any, error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, err
	}
	return out, nil
}

func hasOwners(live, want []metav1.OwnerReference) bool {
	for _, w := range want {
		found := false
		for _, l := range live {
			if l.UID == w.UID {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// VirtualServiceReach is which clients' sidecars a VirtualService applies
// to, by its exportTo: everywhere (empty, taken as Istio's default of all
// namespaces, or "*"), or only those in the namespaces listed ("." is its
// own; "~", alone or not, none: istiod drops the whole VirtualService).
// An empty exportTo is taken as everywhere, not as the mesh's
// defaultVirtualServiceExportTo, which the manager does not read: a
// narrower default only makes more VirtualServices look like conflicts.
// For a sidecar Istio selects the VirtualServices
// exported privately to its namespace first, then those exported to it by
// name, then the public ones, and the first for a host wins: a
// VirtualService of a narrower reach takes the host from the public ones
// in those namespaces only.
func VirtualServiceReach(vs *istionet.VirtualService) (namespaces []string, everywhere bool) {
	if len(vs.Spec.ExportTo) == 0 {
		return nil, true
	}
	if slices.Contains(vs.Spec.ExportTo, "~") {
		return nil, false
	}
	for _, e := range vs.Spec.ExportTo {
		switch e {
		case "*":
			return nil, true
		case ".":
			namespaces = append(namespaces, vs.Namespace)
		default:
			namespaces = append(namespaces, e)
		}
	}
	slices.Sort(namespaces)
	return slices.Compact(namespaces), false
}

// ServesHost says whether a VirtualService that applies to sidecars (gateway
// "mesh", or no gateways) routes exactly the Kubernetes host of the Service.
// Short names are resolved in the VirtualService's namespace as Istio does.
// Wildcard hosts are less specific than the exact host, so Istio prefers an
// exact VirtualService over them and they do not conflict.
func ServesHost(vs *istionet.VirtualService, service, namespace, clusterDomain string) bool {
	if len(vs.Spec.Gateways) > 0 {
		mesh := false
		for _, g := range vs.Spec.Gateways {
			if g == "mesh" {
				mesh = true
			}
		}
		if !mesh {
			return false
		}
	}
	fqdn := KubernetesHost(service, namespace, clusterDomain)
	for _, h := range vs.Spec.Hosts {
		h = strings.ToLower(h)
		switch {
		case h == fqdn:
			return true
		case h == service && vs.Namespace == namespace:
			return true
		case h == service+"."+namespace, h == service+"."+namespace+".svc":
			return true
		}
	}
	return false
}

// LiveWeights reads the weights of a live ServiceEntry by endpoint address.
func LiveWeights(se *istionet.ServiceEntry) map[string]uint32 {
	if se == nil {
		return nil
	}
	out := make(map[string]uint32, len(se.Spec.Endpoints))
	for _, ep := range se.Spec.Endpoints {
		if ep != nil && ep.Weight > 0 {
			out[ep.Address] = ep.Weight
		}
	}
	return out
}
