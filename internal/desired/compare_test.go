package desired

import (
	"encoding/json"
	"slices"
	"testing"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const testManager = "istio-adaptive-optimizer"

// managed builds a managedFields entry of the given owner and operation.
func managed(manager string, op metav1.ManagedFieldsOperationType, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
}

func TestUpToDateComparesOnlyWhatTheOperatorOwns(t *testing.T) {
	ours := `{"f:metadata":{"f:labels":{"f:app.kubernetes.io/managed-by":{}}},"f:spec":{"f:hosts":{},"f:ports":{},"f:resolution":{},"f:endpoints":{},"f:location":{}}}`
	oursWithSANs := `{"f:spec":{"f:hosts":{},"f:ports":{},"f:resolution":{},"f:endpoints":{},"f:location":{},"f:subjectAltNames":{}}}`
	theirs := `{"f:spec":{"f:exportTo":{}}}`
	desiredSpec := func() *networking.ServiceEntry {
		return &networking.ServiceEntry{
			Hosts:      []string{"web.shop.adaptive"},
			Ports:      []*networking.ServicePort{{Number: 80, Name: "http-80", Protocol: "HTTP", TargetPort: 8080}},
			Resolution: networking.ServiceEntry_STATIC,
			Location:   networking.ServiceEntry_MESH_INTERNAL,
			Endpoints:  []*networking.WorkloadEntry{{Address: "198.18.0.1", Weight: 10, Locality: "eu/a"}},
		}
	}
	tests := map[string]struct {
		mutate  func(live *networking.ServiceEntry)
		managed []metav1.ManagedFieldsEntry
		want    bool
	}{
		"identical": {
			managed: []metav1.ManagedFieldsEntry{managed(testManager, metav1.ManagedFieldsOperationApply, ours)},
			want:    true,
		},
		"another manager added exportTo": {
			mutate:  func(l *networking.ServiceEntry) { l.ExportTo = []string{"."} },
			managed: []metav1.ManagedFieldsEntry{managed(testManager, metav1.ManagedFieldsOperationApply, ours), managed("webhook", metav1.ManagedFieldsOperationUpdate, theirs)},
			want:    true,
		},
		"another manager's field, no managedFields of ours: whole spec": {
			mutate: func(l *networking.ServiceEntry) { l.ExportTo = []string{"."} },
			want:   false,
		},
		"a weight we set changed": {
			mutate:  func(l *networking.ServiceEntry) { l.Endpoints[0].Weight = 11 },
			managed: []metav1.ManagedFieldsEntry{managed(testManager, metav1.ManagedFieldsOperationApply, ours)},
		},
		"a field inside our list was dropped": {
			mutate:  func(l *networking.ServiceEntry) { l.Endpoints[0].Locality = "" },
			managed: []metav1.ManagedFieldsEntry{managed(testManager, metav1.ManagedFieldsOperationApply, ours)},
		},
		"an endpoint more, inside our list": {
			mutate: func(l *networking.ServiceEntry) {
				l.Endpoints = append(l.Endpoints, &networking.WorkloadEntry{Address: "198.18.0.2"})
			},
			managed: []metav1.ManagedFieldsEntry{managed(testManager, metav1.ManagedFieldsOperationApply, ours)},
		},
		"a field we owned is no longer desired": {
			mutate:  func(l *networking.ServiceEntry) { l.SubjectAltNames = []string{"spiffe://x"} },
			managed: []metav1.ManagedFieldsEntry{managed(testManager, metav1.ManagedFieldsOperationApply, oursWithSANs)},
		},
		"our Update entry does not count as owning": {
			mutate:  func(l *networking.ServiceEntry) { l.ExportTo = []string{"."} },
			managed: []metav1.ManagedFieldsEntry{managed(testManager, metav1.ManagedFieldsOperationUpdate, `{"f:spec":{"f:exportTo":{}}}`)},
			want:    false,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			want := &istionet.ServiceEntry{Spec: *desiredSpec()}
			live := &istionet.ServiceEntry{Spec: *desiredSpec()}
			live.ManagedFields = tc.managed
			if tc.mutate != nil {
				tc.mutate(&live.Spec)
			}
			if got := UpToDate(testManager, want, live, &want.Spec, &live.Spec); got != tc.want {
				t.Errorf("UpToDate = %v, want %v", got, tc.want)
			}
		})
	}
}

// FuzzSpecUpToDate: a spec is always up to date with itself and with itself
// plus fields nobody of ours owns; and never when a value we set differs.
func FuzzSpecUpToDate(f *testing.F) {
	f.Add(`{"hosts":["a"],"ports":[{"number":80}]}`, "exportTo", `["."]`)
	f.Add(`{"a":{"b":1}}`, "c", `{"d":2}`)
	f.Fuzz(func(t *testing.T, specJSON, extraKey, extraJSON string) {
		want := map[string]any{}
		var extra any
		if json.Unmarshal([]byte(specJSON), &want) != nil || json.Unmarshal([]byte(extraJSON), &extra) != nil {
			return
		}
		if _, taken := want[extraKey]; taken {
			return
		}
		var owned [][]string
		for k := range want {
			owned = append(owned, []string{k})
		}
		if !SpecUpToDate(want, want, owned) {
			t.Fatalf("%s not up to date with itself", specJSON)
		}
		have := map[string]any{extraKey: extra}
		for k, v := range want {
			have[k] = v
		}
		if !SpecUpToDate(want, have, owned) {
			t.Fatalf("a field %q of someone else makes %s out of date", extraKey, specJSON)
		}
		if len(want) > 0 {
			for k := range want {
				changed := map[string]any{}
				for k2, v := range have {
					changed[k2] = v
				}
				changed[k] = []any{"changed", want[k]}
				if SpecUpToDate(want, changed, owned) {
					t.Fatalf("field %q changed but counted up to date", k)
				}
				break
			}
		}
	})
}

func TestVirtualServiceReach(t *testing.T) {
	cases := []struct {
		exportTo   []string
		namespaces []string
		everywhere bool
	}{
		{nil, nil, true},
		{[]string{"*"}, nil, true},
		{[]string{".", "*"}, nil, true},
		{[]string{"."}, []string{"team"}, false},
		{[]string{"b", ".", "a", "b"}, []string{"a", "b", "team"}, false},
		{[]string{"~"}, nil, false},
		{[]string{"~", "team"}, nil, false},
	}
	for _, c := range cases {
		vs := &istionet.VirtualService{}
		vs.Namespace = "team"
		vs.Spec.ExportTo = c.exportTo
		ns, all := VirtualServiceReach(vs)
		if all != c.everywhere || !slices.Equal(ns, c.namespaces) {
			t.Errorf("exportTo %q: reach %q, everywhere %v; want %q, %v", c.exportTo, ns, all, c.namespaces, c.everywhere)
		}
	}
}
