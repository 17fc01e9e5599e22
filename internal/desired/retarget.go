package desired

import (
	"encoding/json"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The edit of a listed gateway route: a JSON patch of only the destination
// fields, with a record of what they held, and its exact undoing.

// RetargetRecord is one recorded edit of a gateway route, kept in
// AnnotationRetargeted.
type RetargetRecord struct {
	// Optimizer is namespace/name of the optimizer that made the edit.
	Optimizer string `json:"optimizer"`
	FieldEdit
}

// RetargetRecords reads AnnotationRetargeted; a value that does not parse
// reads as no records (it was not written by the operator).
func RetargetRecords(annotations map[string]string) []RetargetRecord {
	var out []RetargetRecord
	if v := annotations[AnnotationRetargeted]; v != "" {
		if json.Unmarshal([]byte(v), &out) != nil {
			return nil
		}
	}
	return out
}

// recordedPaths maps each recorded path to its original value.
func recordedPaths(annotations map[string]string) map[string]*string {
	out := map[string]*string{}
	for _, r := range RetargetRecords(annotations) {
		from := r.From
		if from == nil {
			from = ptrTo("")
		}
		out[r.Path] = from
	}
	return out
}

// PatchOp is one JSON patch (RFC 6902) operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// annotationPath is the JSON pointer of AnnotationRetargeted ("/" is ~1).
var annotationPath = "/metadata/annotations/" + strings.ReplaceAll(AnnotationRetargeted, "/", "~1")

// RetargetPatch is the JSON patch that applies the edits of route g for
// optimizer (namespace/name) to the live object obj and records them: each
// field change preceded by a test that the field still holds what was read
// (a destination changed meanwhile fails the patch and is read again rather
// than overwritten; changes elsewhere in the route, such as the status
// istiod writes on Gateway API routes, do not), then the record. Nil when
// there is nothing to change.
func RetargetPatch(obj runtime.Object, meta metav1.Object, g GatewayRoute, optimizer string) ([]PatchOp, error) {
	var edits []FieldEdit
	for _, d := range g.Destinations {
		edits = append(edits, d.Edits...)
	}
	if len(edits) == 0 {
		return nil, nil
	}
	doc, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	var ops []PatchOp
	records := RetargetRecords(meta.GetAnnotations())
	for _, e := range edits {
		ops = append(ops, testOp(doc, e.Path)...)
		ops = append(ops, setOp(doc, e.Path, e.To)...)
		records = append(records, RetargetRecord{Optimizer: optimizer, FieldEdit: e})
	}
	return append(ops, recordOps(meta.GetAnnotations(), records)...), nil
}

// RestorePatch is the JSON patch that undoes the recorded edits of
// optimizer on the live object: each field still holding what the operator
// wrote gets its original value back (a field the user changed since is
// left as the user set it), and the records go. Nil when it has none.
func RestorePatch(obj runtime.Object, meta metav1.Object, optimizer string) ([]PatchOp, error) {
	records := RetargetRecords(meta.GetAnnotations())
	var keep, mine []RetargetRecord
	for _, r := range records {
		if r.Optimizer == optimizer {
			mine = append(mine, r)
		} else {
			keep = append(keep, r)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	doc, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	var ops []PatchOp
	for _, r := range mine {
		cur, present := pointerGet(doc, r.Path)
		if !sameValue(cur, present, r.To) {
			continue
		}
		ops = append(ops, testOp(doc, r.Path)...)
		ops = append(ops, setOp(doc, r.Path, r.From)...)
	}
	return append(ops, recordOps(meta.GetAnnotations(), keep)...), nil
}

func sameValue(cur any, present bool, want *string) bool {
	if want == nil {
		return !present
	}
	s, ok := cur.(string)
	return present && ok && s == *want
}

// testOp checks that the field at path still holds what doc says (a field
// that is absent cannot be tested in JSON patch, and gets no test).
func testOp(doc map[string]any, path string) []PatchOp {
	if cur, present := pointerGet(doc, path); present {
		return []PatchOp{{Op: "test", Path: path, Value: cur}}
	}
	return nil
}

// setOp sets (value non-nil) or removes (nil) the field at path.
func setOp(doc map[string]any, path string, value *string) []PatchOp {
	_, present := pointerGet(doc, path)
	switch {
	case value == nil && present:
		return []PatchOp{{Op: "remove", Path: path}}
	case value == nil:
		return nil // already absent
	case present:
		return []PatchOp{{Op: "replace", Path: path, Value: *value}}
	}
	return []PatchOp{{Op: "add", Path: path, Value: *value}}
}

// recordOps writes records into AnnotationRetargeted (removes it when empty).
func recordOps(annotations map[string]string, records []RetargetRecord) []PatchOp {
	_, had := annotations[AnnotationRetargeted]
	if len(records) == 0 {
		if had {
			return []PatchOp{{Op: "remove", Path: annotationPath}}
		}
		return nil
	}
	data, _ := json.Marshal(records)
	if annotations == nil {
		return []PatchOp{{Op: "add", Path: "/metadata/annotations", Value: map[string]string{AnnotationRetargeted: string(data)}}}
	}
	return []PatchOp{{Op: "add", Path: annotationPath, Value: string(data)}}
}

// pointerGet reads a JSON pointer (RFC 6901) from a decoded document.
func pointerGet(doc any, path string) (any, bool) {
	cur := doc
	for _, tok := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[tok]
			if !ok {
				return nil, false
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			cur = c[i]
		default:
			return nil, false
		}
	}
	return cur, true
}
