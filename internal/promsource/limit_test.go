package promsource

import (
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// hugeAnswer streams a valid vector answer of about size bytes, without a
// Content-Length (chunked), one series per made-up pod: what a template that
// does not aggregate by pod returns from a large cluster.
func hugeAnswer(size int, declare bool) http.HandlerFunc {
	head := []byte(`{"status":"success","data":{"resultType":"vector","result":[`)
	tail := []byte(`]}}`)
	// Written in blocks prepared once, so the server (in this process)
	// allocates next to nothing and the client's allocations show.
	item := `{"metric":{"pod":"a","container":"app","id":"/kubepods/burstable/podxxxxxxxx"},"value":[1700000000.5,"1"]},`
	block := []byte(strings.Repeat(item, 64))
	blocks := max((size-len(head)-len(tail))/len(block), 1)
	last := []byte(strings.TrimSuffix(item, ","))
	length := len(head) + blocks*len(block) + len(last) + len(tail)
	return func(w http.ResponseWriter, _ *http.Request) {
		if declare {
			w.Header().Set("Content-Length", strconv.Itoa(length))
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(head)
		for range blocks {
			if _, err := w.Write(block); err != nil {
				return
			}
		}
		_, _ = w.Write(last)
		_, _ = w.Write(tail)
	}
}

func TestQueryRefusesOversizedAnswers(t *testing.T) {
	const limit = 64 << 10
	for name, declare := range map[string]bool{"Content-Length": true, "chunked": false} {
		t.Run(name, func(t *testing.T) {
			srv := newServer(t, hugeAnswer(4*limit, declare))
			s := newSource(t, Config{URL: srv.URL, MaxResponseBytes: limit})
			_, err := query(t, s)
			var tooLarge *ResponseTooLargeError
			if !errors.As(err, &tooLarge) {
				t.Fatalf("error = %v (%T), want *ResponseTooLargeError", err, err)
			}
			if tooLarge.Limit != limit {
				t.Errorf("Limit = %d, want %d", tooLarge.Limit, limit)
			}
			if declare != (tooLarge.Declared > limit) {
				t.Errorf("Declared = %d with Content-Length sent = %v", tooLarge.Declared, declare)
			}
		})
	}
}

func TestQueryAcceptsAnAnswerOfExactlyTheLimit(t *testing.T) {
	body := vectorBody("a", "1", "b", "2", "c", "3")
	for _, declare := range []bool{true, false} {
		srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if !declare {
				w.(http.Flusher).Flush() // no Content-Length: chunked
			}
			_, _ = w.Write([]byte(body))
		}))
		s := newSource(t, Config{URL: srv.URL, MaxResponseBytes: int64(len(body))})
		if res, err := query(t, s); err != nil || len(res.Values) != 3 {
			t.Errorf("declare=%v: values %v, error %v; want 3 values", declare, res.Values, err)
		}
	}
}

// Backend text in errors (which reach status messages and logs) is bounded
// and printable, whatever bytes the backend sent.
func TestQueryErrorTextIsPrintableAndBounded(t *testing.T) {
	garbage := "\x00\xff\xfe" + strings.Repeat("boom\x00\n\x1b[0m\xff", 20000)
	cases := map[string]http.HandlerFunc{
		"non-JSON 500":              fixed(500, garbage),
		"API error document":        fixed(422, `{"status":"error","errorType":"bad_data","error":"`+strings.Repeat(`x\u0000\u001b`, 20000)+`"}`),
		"2xx that is not JSON":      fixed(200, garbage),
		"status error in a 2xx doc": fixed(200, `{"status":"error","errorType":"execution","error":"`+strings.Repeat(`\u0000y`, 20000)+`"}`),
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			s := newSource(t, Config{URL: newServer(t, h).URL})
			_, err := query(t, s)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if len(msg) > 2*maxMessage {
				t.Errorf("error message is %d bytes, want at most %d", len(msg), 2*maxMessage)
			}
			if !utf8.ValidString(msg) {
				t.Errorf("error message is not valid UTF-8: %q", msg)
			}
			for _, r := range msg {
				if !unicode.IsPrint(r) && r != ' ' {
					t.Fatalf("error message holds non-printing %U: %q", r, msg)
				}
			}
		})
	}
}

// A 24 MB answer (200k series) must not take the memory it would take to
// read and decode: the query fails after reading at most the limit.
func TestQueryHugeAnswerMemoryIsBounded(t *testing.T) {
	const size = 24 << 20
	const limit = 1 << 20
	srv := newServer(t, hugeAnswer(size, false))
	s := newSource(t, Config{URL: srv.URL, MaxResponseBytes: limit})
	// Warm up the connection pool and the template cache.
	_, _ = query(t, s)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := query(t, s)
	runtime.ReadMemStats(&after)
	var tooLarge *ResponseTooLargeError
	if !errors.As(err, &tooLarge) {
		t.Fatalf("error = %v, want *ResponseTooLargeError", err)
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("a %d MiB answer with a %d MiB limit allocated %.1f MiB", size>>20, limit>>20, float64(alloc)/(1<<20))
	// Reading into a doubling buffer allocates up to 4 times what it holds
	// over its growth (peak: twice), twice that under the race detector.
	// Reading the whole 24 MiB answer would allocate at least 48 MiB.
	if alloc > 12*limit {
		t.Errorf("allocated %d bytes for one oversized answer, want at most %d", alloc, 12*limit)
	}
}

func BenchmarkQueryHugeAnswer(b *testing.B) {
	srv := newServer(&testing.T{}, hugeAnswer(24<<20, false))
	defer srv.Close()
	s, err := New(Config{URL: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = s.Query(b.Context(), DefaultCPUQuery, testTarget, testNow)
	}
}
