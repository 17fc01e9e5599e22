package desired

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// AnnotationOptimizerName holds the full name of the owning optimizer on an
// owned object whose LabelOptimizerName had to be shortened (see
// NameLabelValue), so events on the object still map back to it.
const AnnotationOptimizerName = "optimization.liorfranko.github.io/optimizer-name"

// nameHashLen is the number of hex digits of the name's SHA-256 kept in a
// shortened label value: 40 bits, so two long names that share their first
// 52 characters collide with odds of one in a trillion.
const nameHashLen = 10

// NameLabelValue is an object name as a label value. A name is a DNS
// subdomain of up to 253 characters, a label value holds at most 63: a
// longer name keeps its first characters and ends in a hash of the whole
// name, so the value stays unique, valid and stable.
func NameLabelValue(name string) string {
	if len(validation.IsValidLabelValue(name)) == 0 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	prefix := name
	if max := validation.LabelValueMaxLength - nameHashLen - 1; len(prefix) > max {
		prefix = prefix[:max]
	}
	// A label value starts and ends with an alphanumeric character.
	prefix = strings.TrimRight(prefix, "-._")
	return prefix + "-" + hex.EncodeToString(sum[:])[:nameHashLen]
}

// ownedAnnotations are put on every owned object next to OwnedLabels; only a
// shortened name needs one.
func ownedAnnotations(name string) map[string]string {
	if NameLabelValue(name) == name {
		return nil
	}
	return map[string]string{AnnotationOptimizerName: name}
}

// OwnerName is the name of the optimizer an owned object belongs to, as
// written in its labels or, when the label was shortened, its annotation.
func OwnerName(obj metav1.Object) string {
	if n := obj.GetAnnotations()[AnnotationOptimizerName]; n != "" && NameLabelValue(n) == obj.GetLabels()[LabelOptimizerName] {
		return n
	}
	return obj.GetLabels()[LabelOptimizerName]
}
