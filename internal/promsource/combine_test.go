package promsource

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// combineServer evaluates the queries QueryParts sends the way Prometheus
// would: a plain query is one part; a combined one is parts wrapped in
// label_replace(..., PartLabel, "<k>", "", "") and joined by "or", and its
// answer is every part's series with the part label set. A part's metric
// name (cpu, requests, ...) picks its answer: value(metric, pod), for the
// pods its matcher names. A part whose metric is "broken" is refused
// (400 bad_data) and refuses the whole combined query with it, as a PromQL
// syntax error would; "down" answers 503.
type combineServer struct {
	value func(metric, pod string) (float64, bool)

	mu      sync.Mutex
	queries []string
}

var (
	partMatcher   = regexp.MustCompile(`(?s)^label_replace\(\n(.*)\n, "` + PartLabel + `", "(\d+)", "", ""\)$`)
	metricMatcher = regexp.MustCompile(`^(\w+)\{`)
)

func (c *combineServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	q := r.Form.Get("query")
	c.mu.Lock()
	c.queries = append(c.queries, q)
	c.mu.Unlock()
	type part struct{ q, label string }
	var parts []part
	if strings.HasPrefix(q, "label_replace(") {
		for _, p := range strings.Split(q, orSeparator) {
			m := partMatcher.FindStringSubmatch(p)
			if m == nil {
				fixed(400, `{"status":"error","errorType":"bad_data","error":"parse error"}`)(w, r)
				return
			}
			parts = append(parts, part{m[1], m[2]})
		}
	} else {
		parts = []part{{q, ""}}
	}
	var items []string
	for _, p := range parts {
		metric := metricMatcher.FindStringSubmatch(p.q)[1]
		switch metric {
		case "broken":
			fixed(400, `{"status":"error","errorType":"bad_data","error":"1:1: parse error: unexpected"}`)(w, r)
			return
		case "down":
			fixed(503, `{"status":"error","errorType":"unavailable","error":"overloaded"}`)(w, r)
			return
		}
		m := podsMatcher.FindStringSubmatch(p.q)
		for _, pod := range strings.Split(m[1], "|") {
			pod = strings.ReplaceAll(pod, `\\.`, ".")
			v, ok := c.value(metric, pod)
			if !ok {
				continue
			}
			labels := fmt.Sprintf(`"pod":%q`, pod)
			if p.label != "" {
				labels += fmt.Sprintf(`,%q:%q`, PartLabel, p.label)
			}
			items = append(items, fmt.Sprintf(`{"metric":{%s},"value":[1700000000.5,%q]}`, labels, strconv.FormatFloat(v, 'g', -1, 64)))
		}
	}
	fixed(200, `{"status":"success","data":{"resultType":"vector","result":[`+strings.Join(items, ",")+`]}}`)(w, r)
}

func (c *combineServer) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.queries...)
}

// byMetric gives each metric its own value per pod: the pod's index plus
// the metric's, so a value read under the wrong part shows.
func byMetric(metric, pod string) (float64, bool) {
	base := map[string]float64{"cpu": 100, "requests": 200, "latency": 300}[metric]
	if base == 0 {
		return 0, false // "empty": no series
	}
	i, _ := strconv.Atoi(pod[strings.LastIndex(pod, "-")+1:])
	return base + float64(i), true
}

func part(metric string, pods ...string) Part {
	return Part{Template: metric + `{namespace="{{.Namespace}}", pod=~"{{.Pods}}"}[{{.Window}}]`,
		Target: Target{Namespace: "shop", Service: "cart", Pods: pods, Window: time.Minute}}
}

// Several signals in one request: each part gets its own values, split by
// the part label, with the pods it does not answer missing; a part without
// series is empty while the others are not; the same pod in two parts is
// no duplicate.
func TestQueryPartsSplitsOneRequestPerPart(t *testing.T) {
	srv := &combineServer{value: byMetric}
	s := newSource(t, Config{URL: newServer(t, srv).URL})
	parts := []Part{part("cpu", "web-0", "web-1"), part("requests", "web-0", "web-1", "web-2"), part("empty", "web-0"), part("latency", "web-1")}
	got := s.QueryParts(t.Context(), parts, testNow)
	if n := len(srv.sent()); n != 1 {
		t.Fatalf("%d requests, want 1: %q", n, srv.sent())
	}
	want := []map[string]float64{{"web-0": 100, "web-1": 101}, {"web-0": 200, "web-1": 201, "web-2": 202}, nil, {"web-1": 301}}
	for i, w := range want {
		r := got[i]
		if w == nil {
			var empty *EmptyResultError
			if !errors.As(r.Err, &empty) {
				t.Errorf("part %d: err %v, want an empty result", i, r.Err)
			}
			continue
		}
		if r.Err != nil || !maps.Equal(r.Result.Values, w) || len(r.Result.Issues) != 0 {
			t.Errorf("part %d: values %v, issues %v, err %v; want %v", i, r.Result.Values, r.Result.Issues, r.Err, w)
		}
		if own, _ := Render(parts[i].Template, parts[i].Target); r.Result.Query != own {
			t.Errorf("part %d: Query %q, want its own %q", i, r.Result.Query, own)
		}
	}
}

// One part alone is sent exactly as Query sends it, and answers the same.
func TestQueryPartsOfOneIsQuery(t *testing.T) {
	srv := &combineServer{value: byMetric}
	s := newSource(t, Config{URL: newServer(t, srv).URL})
	p := part("cpu", "web-0", "web-1")
	alone, err := s.Query(t.Context(), p.Template, p.Target, testNow)
	got := s.QueryParts(t.Context(), []Part{p}, testNow)[0]
	sent := srv.sent()
	if err != nil || got.Err != nil || !maps.Equal(alone.Values, got.Result.Values) || sent[0] != sent[1] {
		t.Errorf("Query %v (%v) via %q; QueryParts %v (%v) via %q", alone.Values, err, sent[0], got.Result.Values, got.Err, sent[1])
	}
}

// Parts that do not fit in one request under the limit are spread over
// several, each within the limit, and every part is answered; a part too
// long for a request of its own is sent in chunks of pods, as Query does.
func TestQueryPartsSpreadOverRequestsUnderTheLimit(t *testing.T) {
	srv := &combineServer{value: byMetric}
	const limit = 1024
	s := newSource(t, Config{URL: newServer(t, srv).URL, MaxQueryLength: limit})
	var parts []Part
	for i := range 40 {
		parts = append(parts, part([]string{"cpu", "requests", "latency"}[i%3], fmt.Sprintf("web-%d", i), fmt.Sprintf("web-%d", i+100)))
	}
	var many []string
	for i := range 300 {
		many = append(many, fmt.Sprintf("big-%d", i))
	}
	parts = append(parts, part("cpu", many...))
	got := s.QueryParts(t.Context(), parts, testNow)
	for i, r := range got {
		if r.Err != nil || len(r.Result.Values) != len(parts[i].Target.Pods) {
			t.Fatalf("part %d: %d values of %d pods, err %v", i, len(r.Result.Values), len(parts[i].Target.Pods), r.Err)
		}
	}
	if c := got[len(got)-1].Result.Chunks; c < 2 {
		t.Errorf("the 300-pod part went in %d request(s), want chunks", c)
	}
	sent := srv.sent()
	for _, q := range sent {
		if len(q) > limit {
			t.Errorf("a request of %d bytes, over the limit %d", len(q), limit)
		}
	}
	planned, err := CombinedQueries(parts, limit)
	if err != nil || len(planned) != len(sent) {
		t.Errorf("CombinedQueries: %d queries (%v), sent %d", len(planned), err, len(sent))
	}
	if len(sent) >= len(parts) {
		t.Errorf("%d requests for %d parts: nothing combined", len(sent), len(parts))
	}
	t.Logf("%d parts in %d requests", len(parts), len(sent))
}

// A part that breaks the combined query fails alone: the others are sent
// again apart and answered, and its template is sent alone from then on
// (one failed request, not one per cycle). An unrenderable part fails
// before anything is sent. A backend that is down fails every part the
// same, without sending them again apart.
func TestQueryPartsABrokenPartFailsAlone(t *testing.T) {
	srv := &combineServer{value: byMetric}
	s := newSource(t, Config{URL: newServer(t, srv).URL})
	parts := []Part{part("cpu", "web-0"), part("broken", "web-0"), part("latency", "web-0"), {Template: "{{.Nope}}", Target: testTarget}}
	check := func(round int) {
		got := s.QueryParts(t.Context(), parts, testNow)
		var server *ServerError
		var tmpl *TemplateError
		if got[0].Err != nil || got[2].Err != nil || got[0].Result.Values["web-0"] != 100 || got[2].Result.Values["web-0"] != 300 {
			t.Errorf("round %d: the good parts: %+v, %+v", round, got[0], got[2])
		}
		if !errors.As(got[1].Err, &server) || server.StatusCode != 400 {
			t.Errorf("round %d: the broken part: %v, want its 400", round, got[1].Err)
		}
		if !errors.As(got[3].Err, &tmpl) {
			t.Errorf("round %d: the unrenderable part: %v, want a template error", round, got[3].Err)
		}
	}
	check(1)
	if n := len(srv.sent()); n != 4 {
		t.Errorf("first round: %d requests, want 4 (the combined one, then its 3 parts apart)", n)
	}
	check(2)
	if n := len(srv.sent()) - 4; n != 2 {
		t.Errorf("second round: %d requests, want 2 (the good parts together, the broken one alone): %q", n, srv.sent()[4:])
	}

	down := &combineServer{value: byMetric}
	s = newSource(t, Config{URL: newServer(t, down).URL})
	got := s.QueryParts(t.Context(), []Part{part("down", "web-0"), part("cpu", "web-0")}, testNow)
	for i, r := range got {
		var server *ServerError
		if !errors.As(r.Err, &server) || server.StatusCode != 503 {
			t.Errorf("part %d with the backend down: %v, want its 503", i, r.Err)
		}
	}
	if n := len(down.sent()); n != 1 {
		t.Errorf("backend down: %d requests, want 1", n)
	}
}

// A backend that refuses the credentials, is behind a wrong path prefix or
// throttles fails every part alike: one request, no part sent again apart,
// and no template marked to go alone from then on.
func TestBackendTroubleIsNoPartsFault(t *testing.T) {
	for _, code := range []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusProxyAuthRequired, http.StatusTooManyRequests} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			var mu sync.Mutex
			requests := 0
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				requests++
				mu.Unlock()
				fixed(code, `{"status":"error","errorType":"unauthorized","error":"no"}`)(w, r)
			}))
			s := newSource(t, Config{URL: srv.URL})
			custom := Part{Template: `sum by (pod) (custom_metric{pod=~"{{.Pods}}"})`, Target: testTarget}
			parts := []Part{part("cpu", "web-0"), part("latency", "web-0"), custom}
			for i, r := range s.QueryParts(t.Context(), parts, testNow) {
				if r.Err == nil {
					t.Errorf("part %d answered with the backend refusing", i)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			// client_golang tries GET after a POST refused with 403.
			if want := map[bool]int{true: 2, false: 1}[code == http.StatusForbidden]; requests != want {
				t.Errorf("%d requests, want %d (the combined one)", requests, want)
			}
			if s.alone.has(custom.Template) {
				t.Error("the custom template is sent alone from now on")
			}
		})
	}
}

// Which failures may come from a part: a query the backend could not
// take (too long for a proxy's limit), parse or evaluate, not the
// backend's trouble.
func TestPartsAtFault(t *testing.T) {
	for code, want := range map[int]bool{400: true, 413: true, 414: true, 422: true, 401: false, 403: false, 404: false, 429: false, 500: false, 503: false} {
		if got := partsAtFault(&ServerError{StatusCode: code}); got != want {
			t.Errorf("HTTP %d: a part's fault %v, want %v", code, got, want)
		}
	}
	if !partsAtFault(&ServerError{StatusCode: 503, Type: "execution"}) {
		t.Error("an execution error is a part's fault whatever the status")
	}
	if partsAtFault(&UnreachableError{}) || partsAtFault(&CredentialsError{}) {
		t.Error("an unreachable backend or unreadable credentials are no part's fault")
	}
}

// The default templates are never sent alone, whatever broke a request
// they were in: they are known to combine.
func TestDefaultTemplatesAlwaysCombine(t *testing.T) {
	var a alone
	for _, d := range []string{DefaultCPUQuery, DefaultRequestQuery, DefaultLatencyQuery, DefaultNodeCPUQuery} {
		a.add(d)
		if a.has(d) {
			t.Errorf("a default template was set apart: %.40s...", d)
		}
	}
	a.add("custom")
	if !a.has("custom") {
		t.Error("a custom template that broke a request was not set apart")
	}
}
