package v1alpha1

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	kjson "sigs.k8s.io/json"
)

// DecodeProblem is a part of a stored optimizer that did not decode into
// its Go field: a value of the wrong type or out of the field's range (a
// string where an integer belongs, 2^40 in an int32), or a field the type
// does not have. The API server refuses such objects at admission, but one
// stored anyway (under a relaxed CRD schema, or written to etcd directly)
// must not stop the operator: the manager's informer decodes every
// optimizer of a list in one go, and one object that fails fails the list
// (the cache never syncs, and a restart does not help).
type DecodeProblem struct {
	// Path is the field's JSON path, such as spec.optimization.cycle or
	// spec.service_ports[0].number.
	Path string
	// Message says what is wrong with the value as stored.
	Message string
	// Unknown: the type has no such field; its value was ignored.
	Unknown bool
}

func (p DecodeProblem) String() string { return p.Path + ": " + p.Message }

// DecodeProblems lists what did not decode when the object was read, by
// path; nil for an object that decoded as a whole.
func (o *IstioAdaptiveRequestOptimizer) DecodeProblems() []DecodeProblem {
	return o.decodeProblems
}

// UnmarshalJSON decodes an optimizer as the API server stores it, whatever
// it holds: strictly first (the usual case costs one decode), then, should
// that fail, field by field, keeping every field that decodes and recording
// a DecodeProblem for each one that does not. It fails only on input that
// is not JSON at all, which no API server returns.
func (o *IstioAdaptiveRequestOptimizer) UnmarshalJSON(data []byte) error {
	type plain IstioAdaptiveRequestOptimizer // without this method
	*o = IstioAdaptiveRequestOptimizer{}
	problems, err := decodeLeniently(data, reflect.ValueOf((*plain)(o)).Elem(), "")
	o.decodeProblems = problems
	return err
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// decodeLeniently decodes data into v, field by field where the whole
// does not decode. Only a JSON syntax error is returned as an error.
func decodeLeniently(data []byte, v reflect.Value, path string) ([]DecodeProblem, error) {
	strictErrs, err := kjson.UnmarshalStrict(data, v.Addr().Interface())
	if err == nil {
		var problems []DecodeProblem
		for _, se := range strictErrs {
			p := DecodeProblem{Path: path, Message: se.Error()}
			if fe, ok := se.(kjson.FieldError); ok {
				p.Path = joinPath(path, fe.FieldPath())
				p.Unknown = strings.HasPrefix(se.Error(), "unknown field")
				p.Message = "set more than once; the last value is used"
				if p.Unknown {
					p.Message = "not a field of the optimizer; ignored"
				}
			}
			problems = append(problems, p)
		}
		return problems, nil
	}
	if ok, _ := kjson.SyntaxErrorOffset(err); ok {
		return nil, err
	}
	// Start again from nothing: the failed decode may have set part of v.
	v.Set(reflect.Zero(v.Type()))
	t := v.Type()
	leaf := func() []DecodeProblem {
		return []DecodeProblem{{Path: path, Message: fmt.Sprintf("%s is not %s", shorten(data), describe(t))}}
	}
	if path != "" && reflect.PointerTo(t).Implements(unmarshalerType) {
		return leaf(), nil // its own decoding refused it
	}
	switch t.Kind() {
	case reflect.Pointer:
		elem := reflect.New(t.Elem())
		problems, err := decodeLeniently(data, elem.Elem(), path)
		// A struct keeps what decoded of it; a value that did not decode
		// stays unset rather than zero.
		if err == nil && (len(problems) == 0 || !elem.Elem().IsZero()) {
			v.Set(elem)
		}
		return problems, err
	case reflect.Struct:
		var fields map[string]json.RawMessage
		if kjson.UnmarshalCaseSensitivePreserveInts(data, &fields) != nil {
			return leaf(), nil
		}
		var problems []DecodeProblem
		// Sorted, so messages (and the status quoting them) are stable.
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			p := joinPath(path, name)
			index, ok := fieldIndex(t, name)
			if !ok {
				problems = append(problems, DecodeProblem{Path: p, Message: "not a field of the optimizer; ignored", Unknown: true})
				continue
			}
			more, err := decodeLeniently(fields[name], v.FieldByIndex(index), p)
			if err != nil {
				return nil, err
			}
			problems = append(problems, more...)
		}
		return problems, nil
	case reflect.Slice:
		var items []json.RawMessage
		if kjson.UnmarshalCaseSensitivePreserveInts(data, &items) != nil {
			return leaf(), nil
		}
		if items == nil {
			return nil, nil
		}
		s := reflect.MakeSlice(t, len(items), len(items))
		var problems []DecodeProblem
		for i, item := range items {
			more, err := decodeLeniently(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
			if err != nil {
				return nil, err
			}
			problems = append(problems, more...)
		}
		v.Set(s)
		return problems, nil
	}
	return leaf(), nil
}

// fieldIndex finds the field of t that the JSON key name decodes into, as
// encoding/json does: by tag name, through embedded structs without one.
func fieldIndex(t reflect.Type, name string) ([]int, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if tag == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct {
			if sub, ok := fieldIndex(f.Type, name); ok {
				return append([]int{i}, sub...), true
			}
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		if tag == name {
			return []int{i}, true
		}
	}
	return nil, false
}

func joinPath(path, field string) string {
	switch {
	case path == "":
		return field
	case field == "":
		return path
	case strings.HasPrefix(field, "["):
		return path + field
	}
	return path + "." + field
}

// maxShownValue bounds how much of a bad value a message quotes, so a
// status condition stays readable whatever was stored.
const maxShownValue = 40

func shorten(data []byte) string {
	s := strings.TrimSpace(string(data))
	if len(s) > maxShownValue {
		s = s[:maxShownValue] + "…"
	}
	return s
}

// describe names what a Go type accepts, in the words of the CRD's schema.
func describe(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.String() {
	case "intstr.IntOrString":
		return "an integer or a string"
	case "v1.Time":
		return "a time (RFC 3339)"
	}
	switch t.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64, reflect.Int:
		return fmt.Sprintf("an integer that fits %d bits", t.Bits())
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uint:
		return fmt.Sprintf("an integer from 0 that fits %d bits", t.Bits())
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "a list"
	}
	return "a " + t.String()
}
