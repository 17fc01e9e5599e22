package desired

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

func TestNameLabelValue(t *testing.T) {
	long := strings.Repeat("a", 249) + ".b-c"
	tests := map[string]struct {
		name string
		want string // "" checks only validity and the hash suffix
	}{
		"short name is kept":       {name: "cart", want: "cart"},
		"63 characters are kept":   {name: strings.Repeat("x", 63), want: strings.Repeat("x", 63)},
		"64 characters are hashed": {name: strings.Repeat("x", 64)},
		"253 characters":           {name: long[:253]},
		"cut before a dot":         {name: strings.Repeat("a", 51) + "." + strings.Repeat("b", 40)},
	}
	seen := map[string]string{}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := NameLabelValue(tc.name)
			if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
				t.Fatalf("NameLabelValue(%d chars) = %q, not a label value: %v", len(tc.name), got, errs)
			}
			if tc.want != "" && got != tc.want {
				t.Errorf("NameLabelValue(%q) = %q, want %q", tc.name, got, tc.want)
			}
			if tc.want == "" && (got == tc.name || len(got) > 63) {
				t.Errorf("NameLabelValue(%d chars) = %q, want a shortened value", len(tc.name), got)
			}
			if other, dup := seen[got]; dup && other != tc.name {
				t.Errorf("%q and %q share the label value %q", other, tc.name, got)
			}
			seen[got] = tc.name
		})
	}
	// Two long names that differ only at the end get different values.
	a, b := strings.Repeat("n", 100)+"a", strings.Repeat("n", 100)+"b"
	if NameLabelValue(a) == NameLabelValue(b) {
		t.Errorf("long names differing at the end share %q", NameLabelValue(a))
	}
}

func TestLongOptimizerNameStaysOwned(t *testing.T) {
	opt := &optv1.IstioAdaptiveRequestOptimizer{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: strings.Repeat("o", 253)}}
	obj := &metav1.ObjectMeta{Labels: OwnedLabels(opt), Annotations: ownedAnnotations(opt.Name)}
	for k, v := range obj.Labels {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %s=%q invalid: %v", k, v, errs)
		}
	}
	if !IsOwnedBy(obj, opt) {
		t.Errorf("an object labelled for the optimizer is not owned by it")
	}
	if got := OwnerName(obj); got != opt.Name {
		t.Errorf("OwnerName = %q, want the full name", got)
	}
	other := opt.DeepCopy()
	other.Name = strings.Repeat("o", 252) + "p"
	if IsOwnedBy(obj, other) {
		t.Errorf("an optimizer whose long name differs owns the object")
	}
	short := &metav1.ObjectMeta{Labels: map[string]string{LabelOptimizerName: "cart"}}
	if got := OwnerName(short); got != "cart" {
		t.Errorf("OwnerName of a short name = %q", got)
	}
}
