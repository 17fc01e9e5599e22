package promsource

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// podNames are n names like a Deployment's pods, with a regexp metacharacter
// every so often.
func podNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("checkout-7f9c8d6b5-%05d", i)
		if i%7 == 0 {
			out[i] = fmt.Sprintf("checkout.v2-%05d", i)
		}
	}
	return out
}

// podsOf parses the pods back out of a rendered default query.
var podsMatcher = regexp.MustCompile(`pod=~"([^"]*)"`)

func podsOf(t *testing.T, q string) []string {
	t.Helper()
	m := podsMatcher.FindStringSubmatch(q)
	if m == nil {
		t.Fatalf("no pod matcher in %q", q)
	}
	var out []string
	for _, p := range strings.Split(m[1], "|") {
		out = append(out, strings.ReplaceAll(p, `\\.`, "."))
	}
	return out
}

func TestChunkQueries(t *testing.T) {
	tests := map[string]struct {
		pods   int
		maxLen int
		// wantChunks is the number of queries; 0 = more than one.
		wantChunks int
	}{
		"one pod fits":                   {pods: 1, maxLen: DefaultMaxQueryLength, wantChunks: 1},
		"600 pods need chunks":           {pods: 600, maxLen: DefaultMaxQueryLength},
		"100 pods fit in one":            {pods: 100, maxLen: DefaultMaxQueryLength, wantChunks: 1},
		"4000 pods under 16 KiB":         {pods: 4000, maxLen: 16 << 10},
		"4096 pods in tiny chunks":       {pods: 4096, maxLen: MinMaxQueryLength},
		"a limit that fits exactly once": {pods: 3, maxLen: 0, wantChunks: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			target := Target{Namespace: "shop", Service: "checkout", Pods: podNames(tc.pods), Window: time.Minute}
			maxLen := tc.maxLen
			if maxLen == 0 {
				full, err := Render(DefaultCPUQuery, target)
				if err != nil {
					t.Fatal(err)
				}
				maxLen = len(full)
			}
			qs, err := ChunkQueries(DefaultCPUQuery, target, maxLen)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantChunks > 0 && len(qs) != tc.wantChunks || tc.wantChunks == 0 && len(qs) < 2 {
				t.Errorf("%d chunks, want %d (0: several)", len(qs), tc.wantChunks)
			}
			var got []string
			longest := 0
			for _, q := range qs {
				if len(q) > maxLen {
					t.Errorf("chunk of %d bytes over the %d limit", len(q), maxLen)
				}
				longest = max(longest, len(q))
				got = append(got, podsOf(t, q)...)
			}
			if !slices.Equal(got, target.Pods) {
				t.Errorf("chunks cover %d pods, want each of the %d once, in order", len(got), len(target.Pods))
			}
			// Few and even: no more than twice the minimum number of chunks.
			if full, _ := Render(DefaultCPUQuery, target); len(qs) > 2*((len(full)+maxLen-1)/maxLen)+1 {
				t.Errorf("%d chunks for a %d-byte query under %d: too many", len(qs), len(full), maxLen)
			}
			t.Logf("%d pods: %d chunks, longest %d bytes", tc.pods, len(qs), longest)
		})
	}
}

func TestChunkQueriesSinglePodTooLong(t *testing.T) {
	target := Target{Namespace: "shop", Service: "checkout", Pods: []string{strings.Repeat("p", 600)}, Window: time.Minute}
	_, err := ChunkQueries(DefaultCPUQuery, target, MinMaxQueryLength)
	var tooLong *QueryTooLongError
	if !errors.As(err, &tooLong) || tooLong.Limit != MinMaxQueryLength {
		t.Fatalf("error = %v, want *QueryTooLongError", err)
	}
}

func TestNewRejectsATinyQueryLimit(t *testing.T) {
	if _, err := New(Config{URL: "http://x", MaxQueryLength: 100}); err == nil {
		t.Error("MaxQueryLength 100 accepted")
	}
}

// chunkServer answers each query with a value for every pod the query
// names (pod index as value), and counts requests and their concurrency.
type chunkServer struct {
	requests, inFlight, maxInFlight atomic.Int32
	fail                            func(pods []string) bool
	mu                              sync.Mutex
	longest                         int
}

func (c *chunkServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.requests.Add(1)
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	for {
		m := c.maxInFlight.Load()
		if n <= m || c.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(5 * time.Millisecond) // let chunks overlap
	_ = r.ParseForm()
	q := r.Form.Get("query")
	c.mu.Lock()
	c.longest = max(c.longest, len(q))
	c.mu.Unlock()
	m := podsMatcher.FindStringSubmatch(q)
	var pods []string
	for _, p := range strings.Split(m[1], "|") {
		pods = append(pods, strings.ReplaceAll(p, `\\.`, "."))
	}
	if c.fail != nil && c.fail(pods) {
		fixed(422, `{"status":"error","errorType":"bad_data","error":"chunk refused"}`)(w, r)
		return
	}
	var pv []string
	for _, p := range pods {
		pv = append(pv, p, "1.5")
	}
	fixed(200, vectorBody(pv...))(w, r)
}

func TestQueryInChunksMergesEveryPod(t *testing.T) {
	srv := &chunkServer{}
	s := newSource(t, Config{URL: newServer(t, srv).URL, MaxQueryLength: 1024})
	target := Target{Namespace: "shop", Service: "checkout", Pods: podNames(300), Window: time.Minute}
	res, err := s.Query(t.Context(), DefaultCPUQuery, target, testNow)
	if err != nil {
		t.Fatal(err)
	}
	if res.Chunks < 2 || int(srv.requests.Load()) != res.Chunks {
		t.Errorf("Chunks = %d, requests = %d; want several, equal", res.Chunks, srv.requests.Load())
	}
	if srv.longest > 1024 {
		t.Errorf("a query of %d bytes reached the backend, over the 1024 limit", srv.longest)
	}
	if m := srv.maxInFlight.Load(); m > MaxConcurrentChunks || m < 2 {
		t.Errorf("%d chunks in flight at once, want 2..%d", m, MaxConcurrentChunks)
	}
	if len(res.Values) != 300 || len(res.Missing) != 0 || res.Err() != nil {
		t.Errorf("%d values, missing %v, issues %v; want all 300 pods", len(res.Values), res.Missing, res.Err())
	}
}

func TestQueryInChunksFailsWhenOneChunkFails(t *testing.T) {
	pods := podNames(300)
	srv := &chunkServer{fail: func(p []string) bool { return slices.Contains(p, pods[150]) }}
	s := newSource(t, Config{URL: newServer(t, srv).URL, MaxQueryLength: 1024})
	res, err := s.Query(t.Context(), DefaultCPUQuery, Target{Namespace: "shop", Pods: pods, Window: time.Minute}, testNow)
	var se *ServerError
	if !errors.As(err, &se) || se.Message != "chunk refused" {
		t.Fatalf("error = %v, want the failing chunk's *ServerError", err)
	}
	if res.Values != nil {
		t.Errorf("values for part of the pods returned: %d", len(res.Values))
	}
	if !slices.Contains(podsOf(t, res.Query), pods[150]) {
		t.Errorf("Result.Query is not the failing chunk: %.80s...", res.Query)
	}
}

// A pod named twice lands in two chunks; both answer for it: a duplicate
// series, handled as in one answer (identical values: one kept).
func TestQueryInChunksPodInTwoChunks(t *testing.T) {
	pods := podNames(200)
	pods = append(pods, pods[0]) // last chunk too
	s := newSource(t, Config{URL: newServer(t, &chunkServer{}).URL, MaxQueryLength: 1024})
	res, err := s.Query(t.Context(), DefaultCPUQuery, Target{Namespace: "shop", Pods: pods, Window: time.Minute}, testNow)
	if err != nil {
		t.Fatal(err)
	}
	var dup *DuplicateSeriesError
	if !errors.As(res.Err(), &dup) || dup.Pod != pods[0] || !dup.Kept {
		t.Errorf("issues = %v, want a kept duplicate for %s", res.Err(), pods[0])
	}
	if len(res.Values) != 200 {
		t.Errorf("%d values, want 200", len(res.Values))
	}
}
