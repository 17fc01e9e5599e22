package v1alpha1

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestDurationDecodesAnythingAndKeepsIt(t *testing.T) {
	tests := map[string]struct {
		json    string
		want    time.Duration
		invalid string // part of Err; "" means valid
	}{
		"seconds":      {json: `"30s"`, want: 30 * time.Second},
		"compound":     {json: `"1m30s"`, want: 90 * time.Second},
		"fraction":     {json: `"1.5h"`, want: 90 * time.Minute},
		"zero":         {json: `"0"`},
		"word":         {json: `"soon"`, invalid: `"soon" is not a duration`},
		"no unit":      {json: `"30"`, invalid: "missing unit"},
		"unknown unit": {json: `"5 minutes"`, invalid: "unknown unit"},
		"negative":     {json: `"-5s"`, invalid: "negative"},
		"overflow":     {json: `"9999999999999h"`, invalid: "out of range"},
		"a number":     {json: `30`, invalid: "not a string"},
		"an object":    {json: `{"a":1}`, invalid: "not a string"},
		"empty":        {json: `""`, invalid: "is not a duration"},
		"null":         {json: `null`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var d Duration
			if err := json.Unmarshal([]byte(tc.json), &d); err != nil {
				t.Fatalf("Unmarshal(%s) failed: %v", tc.json, err)
			}
			err := d.Err()
			switch {
			case tc.invalid == "" && err != nil:
				t.Fatalf("Err = %v, want valid", err)
			case tc.invalid != "" && (err == nil || !strings.Contains(err.Error(), tc.invalid)):
				t.Fatalf("Err = %v, want one containing %q", err, tc.invalid)
			case tc.invalid == "" && d.Duration != tc.want:
				t.Fatalf("Duration = %v, want %v", d.Duration, tc.want)
			}
			if tc.invalid != "" {
				// Written back as written, so a write never changes the spec.
				out, err := json.Marshal(d)
				if err != nil || string(out) != tc.json {
					t.Fatalf("Marshal = %s, %v; want %s", out, err, tc.json)
				}
			}
		})
	}
}

// TestDurationPatternAgreesWithGo: whatever the CRD pattern admits, Go parses
// (overflow aside), and what it refuses Go refuses or is negative.
func TestDurationPatternAgreesWithGo(t *testing.T) {
	re := regexp.MustCompile(DurationPattern)
	for _, s := range []string{"0", "1s", "1.5h", "300ms", "1h2m3s", "10us", "10µs", "10μs", "2ns", "soon", "30", "-5s", "+5s", "1.s", ".5s", "5 m", "", "1d"} {
		_, err := time.ParseDuration(s)
		if re.MatchString(s) && err != nil {
			t.Errorf("pattern admits %q, which Go refuses: %v", s, err)
		}
		if !re.MatchString(s) && err == nil && !strings.HasPrefix(s, "-") && s != "+5s" && s != "1.s" && s != ".5s" {
			t.Errorf("pattern refuses %q, which Go accepts", s)
		}
	}
}
