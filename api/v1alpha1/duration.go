package v1alpha1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// DurationPattern is the Go duration syntax the API server enforces on every
// duration field (a non-negative time.ParseDuration string such as 30s,
// 1m30s or 1.5h). It is an OpenAPI pattern, so Kubernetes 1.22 enforces it
// too. A value that matches but overflows (9999999999999h) is left to Err:
// a CEL rule calling duration() would catch it, but a CEL evaluation error
// is not ratcheted, so every write of an object stored before the rule
// (status and finalizer included) would fail.
const DurationPattern = `^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+)$`

// Duration is a time span in Go syntax ("30s", "1m30s"). It decodes any
// JSON value without failing: a value that is not a valid duration is kept
// as written and reported by Err. The manager's informer decodes every
// optimizer in one list, so one object stored before the CRD validated
// durations (or written with validation off) must not fail that list and
// stop the operator for everyone; the reconciler reports it on that
// optimizer alone instead.
//
// +kubebuilder:validation:Type=string
// +kubebuilder:validation:MaxLength=64
// +kubebuilder:validation:Pattern=`^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|μs|ms|s|m|h))+)$`
type Duration struct {
	time.Duration `json:"-"`

	// raw is the value as written when it is not a valid duration.
	raw string
	// invalid explains why raw is not a valid duration; "" when valid.
	invalid string
}

// NewDuration is a valid Duration of d.
func NewDuration(d time.Duration) *Duration { return &Duration{Duration: d} }

// Err says why the value as written is not a valid duration, or nil.
func (d *Duration) Err() error {
	if d == nil || d.invalid == "" {
		return nil
	}
	return fmt.Errorf("%q is not a duration: %s (use Go syntax such as 30s, 1m30s or 1.5h)", d.raw, d.invalid)
}

// UnmarshalJSON accepts any JSON value; only a string that time.ParseDuration
// accepts and that is not negative is valid.
func (d *Duration) UnmarshalJSON(b []byte) error {
	*d = Duration{}
	if string(bytes.TrimSpace(b)) == "null" {
		return nil // unset, as encoding/json does for a pointer
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		d.raw = string(bytes.TrimSpace(b))
		d.invalid = "not a string"
		return nil
	}
	v, err := time.ParseDuration(s)
	switch {
	case err != nil:
		d.raw, d.invalid = s, parseProblem(err)
	case v < 0:
		d.raw, d.invalid = s, "negative"
	default:
		d.Duration = v
	}
	return nil
}

// parseProblem is the reason of a time.ParseDuration error without its
// quoted input, which Err already shows.
func parseProblem(err error) string {
	msg := err.Error()
	for _, p := range []string{"time: invalid duration", "time: unknown unit", "time: missing unit in duration"} {
		if len(msg) >= len(p) && msg[:len(p)] == p {
			switch p {
			case "time: unknown unit":
				return "unknown unit"
			case "time: missing unit in duration":
				return "missing unit"
			}
			return "invalid syntax or out of range"
		}
	}
	return msg
}

// MarshalJSON writes an invalid value back as it was written, so that a
// write of the object (status, finalizer) never changes the user's spec.
func (d Duration) MarshalJSON() ([]byte, error) {
	if d.invalid != "" {
		if d.invalid == "not a string" && json.Valid([]byte(d.raw)) {
			return []byte(d.raw), nil
		}
		return json.Marshal(d.raw)
	}
	return json.Marshal(d.Duration.String())
}

// String is the duration, or the invalid value as written.
func (d Duration) String() string {
	if d.invalid != "" {
		return d.raw
	}
	return d.Duration.String()
}
