package promsource

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestRender(t *testing.T) {
	base := Target{Namespace: "shop", Service: "cart", Pods: []string{"cart-7d9f-abcde", "cart-7d9f-fghij"}, Window: time.Minute}
	with := func(f func(*Target)) Target {
		t := base
		t.Pods = append([]string(nil), base.Pods...)
		f(&t)
		return t
	}
	tests := []struct {
		name    string
		tmpl    string
		target  Target
		want    string
		wantErr error // matched with errors.Is; any *TemplateError if errIs is nil and wantAnyErr
		anyErr  bool
	}{
		{
			name:   "default CPU",
			tmpl:   DefaultCPUQuery,
			target: base,
			want:   `sum by (pod) (rate(container_cpu_usage_seconds_total{namespace="shop", pod=~"cart-7d9f-abcde|cart-7d9f-fghij", container!="", container!="POD", container!="istio-proxy"}[1m]))`,
		},
		{
			name:   "default request rate",
			tmpl:   DefaultRequestQuery,
			target: with(func(t *Target) { t.Window = 90 * time.Second }),
			want:   `sum by (pod) (rate(istio_requests_total{reporter="destination", destination_workload_namespace="shop", pod=~"cart-7d9f-abcde|cart-7d9f-fghij"}[90s]))`,
		},
		{
			name: "regex metacharacters are quoted and the backslashes escaped for PromQL",
			tmpl: `x{pod=~"{{.Pods}}"}`,
			target: with(func(t *Target) {
				t.Pods = []string{"a.b", "c+d", "e|f", `g\h`, "(i)", "j*", "k?l", "m[n]", "o{1}", "^p$"}
			}),
			want: `x{pod=~"a\\.b|c\\+d|e\\|f|g\\\\h|\\(i\\)|j\\*|k\\?l|m\\[n\\]|o\\{1\\}|\\^p\\$"}`,
		},
		{
			name:   "quotes and newlines in names are escaped",
			tmpl:   `x{namespace="{{.Namespace}}", service="{{.Service}}", pod=~"{{.Pods}}"}`,
			target: with(func(t *Target) { t.Namespace = `n"s`; t.Service = "s\nv"; t.Pods = []string{`p"q`} }),
			want:   `x{namespace="n\"s", service="s\nv", pod=~"p\"q"}`,
		},
		{
			name:   "pod order is kept",
			tmpl:   `{{.Pods}}`,
			target: with(func(t *Target) { t.Pods = []string{"z", "a", "m"} }),
			want:   `z|a|m`,
		},
		{name: "window 1500ms", tmpl: `{{.Window}}`, target: with(func(t *Target) { t.Window = 1500 * time.Millisecond }), want: "1500ms"},
		{name: "window 2h", tmpl: `{{.Window}}`, target: with(func(t *Target) { t.Window = 2 * time.Hour }), want: "2h"},
		{name: "window 1d", tmpl: `{{.Window}}`, target: with(func(t *Target) { t.Window = 24 * time.Hour }), want: "1d"},
		{name: "window 61m", tmpl: `{{.Window}}`, target: with(func(t *Target) { t.Window = 61 * time.Minute }), want: "61m"},
		{name: "surrounding space trimmed", tmpl: "\n  up  \n", target: base, want: "up"},
		{name: "no pods", tmpl: DefaultCPUQuery, target: with(func(t *Target) { t.Pods = nil }), wantErr: ErrNoPods},
		{name: "empty pod name", tmpl: DefaultCPUQuery, target: with(func(t *Target) { t.Pods = []string{"a", ""} }), anyErr: true},
		{name: "zero window", tmpl: DefaultCPUQuery, target: with(func(t *Target) { t.Window = 0 }), anyErr: true},
		{name: "negative window", tmpl: DefaultCPUQuery, target: with(func(t *Target) { t.Window = -time.Second }), anyErr: true},
		{name: "sub-millisecond window", tmpl: DefaultCPUQuery, target: with(func(t *Target) { t.Window = 1500 * time.Microsecond }), anyErr: true},
		{name: "unparsable template", tmpl: `{{.Pods`, target: base, anyErr: true},
		{name: "unknown field", tmpl: `{{.Pod}}`, target: base, anyErr: true},
		{name: "empty template", tmpl: "  ", target: base, anyErr: true},
		{name: "renders empty", tmpl: `{{if false}}x{{end}}`, target: base, anyErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Render(tc.tmpl, tc.target)
			if tc.wantErr != nil || tc.anyErr {
				var te *TemplateError
				if !errors.As(err, &te) {
					t.Fatalf("Render() error = %v, want a *TemplateError", err)
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("Render() error = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Render() error = %v", err)
			}
			if got != tc.want {
				t.Fatalf("Render()\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestRenderedRegexSelectsExactlyThePods decodes the rendered PromQL string the
// way PromQL does (Go string rules, then a fully anchored RE2 regexp) and checks
// that it matches each pod and nothing that merely looks like one.
func TestRenderedRegexSelectsExactlyThePods(t *testing.T) {
	pods := []string{"web-1.2", "web+x", "a|b", `back\slash`, "q\"uote", "dot.", "wild.*card", "ünï"}
	got, err := Render(`{{.Pods}}`, Target{Namespace: "n", Pods: pods, Window: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	unquoted, err := strconv.Unquote(`"` + got + `"`)
	if err != nil {
		t.Fatalf("rendered pods %s is not a valid double-quoted string: %v", got, err)
	}
	re := regexp.MustCompile("^(?:" + unquoted + ")$")
	for _, p := range pods {
		if !re.MatchString(p) {
			t.Errorf("regex %q does not match pod %q", unquoted, p)
		}
	}
	for _, p := range []string{"web-132", "webbx", "a", "b", "dotx", "wild-anything", "web-1.2x", "xweb+x"} {
		if re.MatchString(p) {
			t.Errorf("regex %q matches %q, which is not a pod", unquoted, p)
		}
	}
}

func TestValidate(t *testing.T) {
	if err := Validate(DefaultCPUQuery); err != nil {
		t.Errorf("Validate(DefaultCPUQuery) = %v", err)
	}
	if err := Validate(DefaultRequestQuery); err != nil {
		t.Errorf("Validate(DefaultRequestQuery) = %v", err)
	}
	if err := Validate(`{{.Nope}}`); err == nil || !strings.Contains(err.Error(), "Nope") {
		t.Errorf("Validate(bad field) = %v, want an error naming the field", err)
	}
}

// A template is validated in every reconcile of its optimizer, in the
// manager every team shares: one whose work or output has no bound is
// refused, and the refusal comes at once.
func TestUnboundedTemplatesAreRefused(t *testing.T) {
	for name, tmpl := range map[string]string{
		"range over an integer": `up{pod=~"{{.Pods}}"}{{range 100000000000}}x{{end}}`,
		"range without output":  `up{pod=~"{{.Pods}}"}{{range 100000000000}}{{end}}`,
		"range inside if":       `{{if .Pods}}{{range 100000000000}}{{end}}{{end}}up`,
		"range inside else":     `{{with .Nope}}a{{else}}{{range 100000000000}}{{end}}{{end}}up`,
		"recursion":             `{{define "a"}}{{template "a" .}}{{template "a" .}}{{end}}{{template "a" .}}`,
		"block":                 `{{block "b" .}}up{{end}}`,
		"megabytes of output":   strings.Repeat(`{{printf "%0999999d" 0}}`, 8),
	} {
		if err := Validate(tmpl); err == nil {
			t.Errorf("%s: Validate(%q) = nil, want it refused", name, tmpl)
		} else if _, ok := err.(*TemplateError); !ok {
			t.Errorf("%s: Validate = %T %v, want a *TemplateError", name, err, err)
		}
	}
	// What queries need stays allowed.
	for _, tmpl := range []string{
		`{{if .Host}}a{{else}}b{{end}}{pod=~"{{.Pods}}"}`,
		`{{with .Service}}{{.}}{{end}}`,
		`{{printf "%s" .Namespace}}`,
	} {
		if err := Validate(tmpl); err != nil {
			t.Errorf("Validate(%q) = %v, want it allowed", tmpl, err)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Millisecond: "1ms", time.Second: "1s", 30 * time.Second: "30s", 5 * time.Minute: "5m",
		90 * time.Minute: "90m", 48 * time.Hour: "2d", 25 * time.Hour: "25h", 1001 * time.Millisecond: "1001ms",
	} {
		got, err := FormatDuration(d)
		if err != nil || got != want {
			t.Errorf("FormatDuration(%v) = %q, %v; want %q", d, got, err, want)
		}
	}
}

// matchesExactly reports whether the anchored alternation alt matches every
// name in names and none of others.
func matchesExactly(t *testing.T, alt string, names, others []string) {
	t.Helper()
	re, err := regexp.Compile("^(?:" + alt + ")$")
	if err != nil {
		t.Fatalf("alternation %q: %v", alt, err)
	}
	for _, n := range names {
		if !re.MatchString(n) {
			t.Errorf("%q does not match %q", alt, n)
		}
	}
	for _, n := range others {
		if re.MatchString(n) {
			t.Errorf("%q matches %q, not one of the pods", alt, n)
		}
	}
}

// The compact alternation matches exactly the pods the plain one does, in
// about a third of the length for Deployment pods.
func TestPodAlternationCompact(t *testing.T) {
	pods := []string{"web-5d8f-x2k4p", "db-0", "web-5d8f-q9z7m", "web.1", "solo", "db-1", "web-77aa-zz9k1", "a-b-", "a-b-c"}
	others := []string{"web-5d8f-", "web-5d8f-x2k4", "web-5d8f-q9z7mx", "db-", "db-2", "webx1", "web-77aa-x2k4p", "a-b-d", "sol", "web-5d8f-x2k4p|db-0"}
	compact := podAlternation(pods, true)
	if want := `web-5d8f-(?:x2k4p|q9z7m)|db-(?:0|1)|web\.1|solo|web-77aa-zz9k1|a-b-(?:|c)`; compact != want {
		t.Errorf("compact alternation %q, want %q", compact, want)
	}
	matchesExactly(t, compact, pods, others)
	matchesExactly(t, podAlternation(pods, false), pods, others)

	var deployment []string
	for i := range 300 {
		deployment = append(deployment, fmt.Sprintf("checkout-6f7d9c8b5d-%05x", i*104729%(1<<20)))
	}
	plain, short := podAlternation(deployment, false), podAlternation(deployment, true)
	if 3*len(short) > len(plain) {
		t.Errorf("300 Deployment pods: compact %d bytes, plain %d; want at most a third", len(short), len(plain))
	}
	matchesExactly(t, short, deployment, []string{"checkout-6f7d9c8b5d-", "checkout-6f7d9c8b5d-zzzzz"})
}

// FuzzPodAlternation: for any pod names, the compact alternation matches a
// string exactly when the plain one does.
func FuzzPodAlternation(f *testing.F) {
	f.Add("web-5d8f-x2k4p,db-0,web-5d8f-q9z7m", "web-5d8f-")
	f.Add("a-,a--,-,a-b", "a-b-")
	f.Fuzz(func(t *testing.T, list, probe string) {
		pods := strings.Split(list, ",")
		for _, p := range pods {
			if p == "" || !utf8.ValidString(p) {
				return
			}
		}
		plain := regexp.MustCompile("^(?:" + podAlternation(pods, false) + ")$")
		compact, err := regexp.Compile("^(?:" + podAlternation(pods, true) + ")$")
		if err != nil {
			t.Fatalf("compact alternation of %q: %v", pods, err)
		}
		for _, s := range append(pods, probe) {
			if plain.MatchString(s) != compact.MatchString(s) {
				t.Fatalf("pods %q: %q matched %v by the plain alternation, %v by the compact one %q", pods, s, plain.MatchString(s), compact.MatchString(s), podAlternation(pods, true))
			}
		}
	})
}
