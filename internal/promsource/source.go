// Package promsource reads per-pod signals (CPU rate, request rate, or any metric a
// user's template selects) from any Prometheus-compatible query API: Prometheus,
// VictoriaMetrics single or cluster, Thanos, Mimir. The base URL may carry a path
// prefix (http://host/prometheus, http://vmselect:8481/select/0/prometheus).
//
// A Source sends one instant query per call, split into chunks of pods only
// when the query would be longer than a configurable limit (VictoriaMetrics
// refuses queries over 16 KiB by default), and turns the answer into one value
// per pod, with a typed error for every way the answer can be wrong.
package promsource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/internal/textutil"
	"github.com/prometheus/client_golang/api"
	v1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// DefaultTimeout bounds each query when Config.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// PodLabel is the label that identifies a pod in a query's result.
const PodLabel = "pod"

// Config configures a Source.
type Config struct {
	// URL is the base URL of the query API, without /api/v1: for example
	// http://prometheus:9090, http://host/prometheus or
	// http://vmselect:8481/select/0/prometheus. User info in the URL is sent as
	// basic auth.
	URL string
	// Timeout bounds each query, connection included; also sent to the backend as
	// the query's evaluation timeout. Zero means DefaultTimeout.
	Timeout time.Duration
	// BearerToken is sent as "Authorization: Bearer <token>".
	BearerToken string
	// BearerTokenFile holds the token; it is read on every query, so rotation is
	// picked up at once. Mutually exclusive with BearerToken.
	BearerTokenFile string
	// CAFile is a PEM bundle of CAs to trust instead of the system pool.
	CAFile string
	// CertFile and KeyFile are a PEM client certificate and key, for mutual TLS.
	// They are reloaded when they change.
	CertFile, KeyFile string
	// InsecureSkipVerify disables verification of the server's certificate.
	InsecureSkipVerify bool
	// Headers are added to every request, for example X-Scope-OrgID for Mimir,
	// Cortex or Loki-style multi-tenancy.
	Headers map[string]string
	// FileCredentials are basic auth and headers read from files.
	FileCredentials
	// MaxResponseBytes bounds the size of one answer; a longer one fails with
	// a *ResponseTooLargeError. Zero means DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// MaxQueryLength bounds the length of one rendered query in bytes; a
	// longer one is sent in chunks of pods (see Source.Query). Zero means
	// DefaultMaxQueryLength.
	MaxQueryLength int
	// OnStaleCredentials, when set, is told when a reloaded file (the CA
	// bundle, the client certificate or key) changed or vanished and can no
	// longer be read, so the last good value stays in use: once a second
	// read of the files as they stand fails too (a read caught mid-write,
	// a certificate before its key, is read again at the next query and
	// not told), once for each state of them, a vanished file included.
	// The queries go on working until the old certificate expires, so
	// nothing else would show it.
	// It is called with the reloader's lock held, from any goroutine: it
	// must not block or use the Source.
	OnStaleCredentials func(error)
}

// Source queries one backend. It is safe for concurrent use; share one Source
// among all optimizers that use the same backend.
type Source struct {
	api       v1.API
	transport *authTransport
	timeout   time.Duration
	maxQuery  int
	url       string // redacted, for errors

	templates sync.Map // template text -> *template.Template
	// alone holds the templates that broke a combined query (see
	// QueryParts), which are sent on their own from then on.
	alone alone
}

// New validates cfg and returns a Source. It sends no request.
func New(cfg Config) (*Source, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("metrics URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("metrics URL %q: scheme must be http or https", cfg.URL)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("metrics URL %q has no host", cfg.URL)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("metrics URL %q: a fragment is not allowed", cfg.URL)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("timeout must not be negative, got %v", cfg.Timeout)
	}
	if cfg.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("maximum response size must not be negative, got %d", cfg.MaxResponseBytes)
	}
	if cfg.MaxQueryLength < 0 || cfg.MaxQueryLength > 0 && cfg.MaxQueryLength < MinMaxQueryLength {
		return nil, fmt.Errorf("maximum query length must be at least %d bytes, got %d", MinMaxQueryLength, cfg.MaxQueryLength)
	}
	maxQuery := cfg.MaxQueryLength
	if maxQuery == 0 {
		maxQuery = DefaultMaxQueryLength
	}
	maxResponse := cfg.MaxResponseBytes
	if maxResponse == 0 {
		maxResponse = DefaultMaxResponseBytes
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	rt, err := newTransport(cfg)
	if err != nil {
		return nil, err
	}
	client, err := api.NewClient(api.Config{Address: cfg.URL, RoundTripper: &limitTransport{next: rt, max: maxResponse}})
	if err != nil {
		return nil, err
	}
	return &Source{
		api:       v1.NewAPI(capturingClient{client}),
		transport: rt,
		timeout:   timeout,
		maxQuery:  maxQuery,
		url:       u.Redacted(),
	}, nil
}

// Close releases idle connections. The Source stays usable.
func (s *Source) Close() { s.transport.CloseIdleConnections() }

// Timeout is the per-query timeout in effect.
func (s *Source) Timeout() time.Duration { return s.timeout }

// Result is the answer to one query.
type Result struct {
	// Values holds one finite, non-negative value per pod of the Target that had
	// a usable series. Never nil when Query returns no error.
	Values map[string]float64
	// Missing lists, in Target order, the Target's pods absent from Values.
	Missing []string
	// Issues are non-fatal problems, each a typed error (*InvalidSampleError,
	// *DuplicateSeriesError, *MissingPodLabelError, *UnexpectedPodError,
	// *WarningsError). Also filled when Query fails, if known.
	Issues []error
	// Warnings are the backend's warnings, verbatim.
	Warnings []string
	// Query is the rendered PromQL; of a query sent in chunks, the first
	// chunk's, or the failing chunk's if one failed.
	Query string
	// Chunks is how many requests the query was sent as (see Source.Query).
	Chunks int
	// Latency is the time the backend took to answer (or to fail). Set whenever a
	// request was sent, also when Query returns an error.
	Latency time.Duration
}

// Err joins the non-fatal issues (nil if none); errors.As finds each one.
func (r Result) Err() error { return errors.Join(r.Issues...) }

// Query renders the template for t, runs it as an instant query evaluated at
// now (the backend's current time if now is zero), and returns a value per
// pod, taken from each series' "pod" label.
//
// The query is ONE request unless the rendered query is longer than the
// source's MaxQueryLength (templates select pods by a regexp of their names,
// about 12 bytes a pod): then the pods are split into chunks whose queries
// each fit, the chunks run concurrently (at most MaxConcurrentChunks at a
// time), and their answers are merged as if they were one (a pod answered
// twice is a duplicate series, as in one answer).
//
// A fatal error (no values at all) is one of *TemplateError, *QueryTooLongError,
// *CredentialsError, *UnreachableError, *ServerError, *BadResponseError,
// *ResponseTooLargeError, *ResultTypeError or *EmptyResultError; the Result
// still carries Query, Latency and any Issues. If any chunk fails, the query
// fails: values for part of the pods would be read as a change of load.
// Problems with single series are not fatal: they are dropped and reported
// in Result.Issues.
func (s *Source) Query(ctx context.Context, tmpl string, t Target, now time.Time) (Result, error) {
	queries, err := s.renderChunks(tmpl, t)
	if err != nil {
		return Result{}, err
	}
	res := Result{Query: queries[0], Chunks: len(queries)}

	start := time.Now()
	answers := make([]answer, len(queries))
	// cause is the chunk that failed first; the others may only have
	// been canceled because of it.
	cause := -1
	if len(queries) == 1 {
		answers[0] = s.send(ctx, queries[0], now)
	} else {
		ctx, cancel := context.WithCancel(ctx)
		s.fanOut(ctx, len(queries), func(i int) answer { return s.send(ctx, queries[i], now) },
			func(i int, a answer) {
				answers[i] = a
				if a.err != nil && cause < 0 {
					cause = i
					cancel() // the query fails anyway; spare the backend
				}
			})
		cancel()
	}
	res.Latency = time.Since(start)

	var vec model.Vector
	var firstErr error
	if cause < 0 && answers[0].err != nil {
		cause = 0
	}
	if cause >= 0 {
		firstErr, res.Query = answers[cause].err, queries[cause]
	}
	for _, a := range answers {
		res.Warnings = append(res.Warnings, a.warnings...)
		vec = append(vec, a.vec...)
	}
	return finish(res, vec, t.Pods, firstErr)
}

// fanOut runs do(i) for each i below n, at most MaxConcurrentChunks at a
// time, and hands each answer to got, one call at a time. A request that
// cannot start before ctx ends is answered with an *UnreachableError.
func (s *Source) fanOut(ctx context.Context, n int, do func(i int) answer, got func(i int, a answer)) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	sem := make(chan struct{}, MaxConcurrentChunks)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var a answer
			select {
			case sem <- struct{}{}:
				a = do(i)
				<-sem
			case <-ctx.Done():
				a = answer{err: &UnreachableError{URL: s.url, Err: ctx.Err()}}
			}
			mu.Lock()
			defer mu.Unlock()
			got(i, a)
		}()
	}
	wg.Wait()
}

// finish turns the series answered for pods (all the requests of one query,
// merged) into the query's Result, as Query documents it: firstErr is the
// first request's failure, if any.
func finish(res Result, vec model.Vector, pods []string, firstErr error) (Result, error) {
	if len(res.Warnings) > 0 {
		res.Issues = append(res.Issues, &WarningsError{Warnings: res.Warnings})
	}
	if firstErr != nil {
		return res, firstErr
	}
	if len(vec) == 0 {
		return res, &EmptyResultError{Query: res.Query}
	}

	values, issues := perPod(vec, pods)
	res.Issues = append(res.Issues, issues...)
	if len(values) == 0 {
		return res, &EmptyResultError{Query: res.Query, Series: len(vec)}
	}
	res.Values = values
	seen := make(map[string]bool, len(pods))
	for _, p := range pods {
		if _, ok := values[p]; !ok && !seen[p] {
			res.Missing = append(res.Missing, p)
		}
		seen[p] = true
	}
	return res, nil
}

// answer is the outcome of one request.
type answer struct {
	vec      model.Vector
	warnings []string
	err      error
	// byPiece: a combined request that failed, sent again piece by piece
	// (see QueryParts); each piece's own answer.
	byPiece []answer
}

// send runs one instant query. A vector without series is not an error here:
// in a chunked query other chunks may have data.
func (s *Source) send(ctx context.Context, q string, now time.Time) answer {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	exch := &exchange{}
	ctx = context.WithValue(ctx, exchangeKey{}, exch)

	val, warnings, err := s.api.Query(ctx, q, now, v1.WithTimeout(s.timeout))
	a := answer{warnings: slices.Clone([]string(warnings))}
	if err != nil {
		a.err = s.classify(ctx, err, exch)
		return a
	}
	vec, ok := val.(model.Vector)
	if !ok {
		got := "null result"
		if val != nil {
			got = val.Type().String()
		}
		a.err = &ResultTypeError{Got: got}
		return a
	}
	a.vec = vec
	return a
}

// perPod validates a vector: one finite, non-negative sample per wanted pod.
// Issues come out sorted by pod, so results are deterministic.
func perPod(vec model.Vector, pods []string) (map[string]float64, []error) {
	want := make(map[string]bool, len(pods))
	for _, p := range pods {
		want[p] = true
	}
	var issues []error
	byPod := make(map[string][]float64, len(pods))
	for _, smp := range vec {
		pod := string(smp.Metric[PodLabel])
		switch {
		case pod == "":
			issues = append(issues, &MissingPodLabelError{Labels: smp.Metric.String()})
		case !want[pod]:
			issues = append(issues, &UnexpectedPodError{Pod: pod})
		default:
			byPod[pod] = append(byPod[pod], float64(smp.Value))
		}
	}
	values := make(map[string]float64, len(byPod))
	for _, pod := range slices.Sorted(maps.Keys(byPod)) {
		vs := byPod[pod]
		if len(vs) > 1 {
			same := true
			for _, v := range vs[1:] {
				if v != vs[0] {
					same = false
				}
			}
			issues = append(issues, &DuplicateSeriesError{Pod: pod, Values: vs, Kept: same})
			if !same {
				continue
			}
		}
		v := vs[0]
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			issues = append(issues, &InvalidSampleError{Pod: pod, Value: v})
			continue
		}
		values[pod] = v
	}
	return values, issues
}

func (s *Source) render(tmpl string, t Target) (string, error) {
	v, ok := s.templates.Load(tmpl)
	if !ok {
		p, err := parseTemplate(tmpl)
		if err != nil {
			return "", err
		}
		v, _ = s.templates.LoadOrStore(tmpl, p)
	}
	return execute(v.(*template.Template), tmpl, t)
}

// classify turns a client_golang error into one of the package's typed errors.
func (s *Source) classify(ctx context.Context, err error, exch *exchange) error {
	var cred *CredentialsError
	if errors.As(err, &cred) {
		return cred
	}
	var tooLarge *ResponseTooLargeError
	if errors.As(err, &tooLarge) {
		return tooLarge
	}
	status, body := exch.result()
	var apiErr *v1.Error
	if errors.As(err, &apiErr) {
		switch {
		case status/100 == 2 && apiErr.Type == v1.ErrBadResponse:
			return badResponse(status, apiErr.Msg, body)
		case status/100 == 2:
			// "status":"error" in a 2xx answer.
			return &ServerError{StatusCode: status, Type: string(apiErr.Type), Message: textutil.Printable(apiErr.Msg, maxMessage)}
		default:
			typ, msg := errorFromBody(body)
			if typ == "" {
				typ = string(apiErr.Type)
			}
			if msg == "" {
				msg = apiErr.Msg
			}
			return &ServerError{StatusCode: status, Type: textutil.Printable(typ, 64), Message: textutil.Printable(msg, maxMessage)}
		}
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) ||
		(errors.As(err, &netErr) && netErr.Timeout()) {
		return &UnreachableError{URL: s.url, Timeout: true, Err: err}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		// The connection broke while the answer was being read: the
		// backend or the network, not a malformed answer.
		return &UnreachableError{URL: s.url, Err: err}
	}
	if status != 0 && ctx.Err() == nil {
		// An answer came back but could not be decoded.
		return badResponse(status, err.Error(), body)
	}
	return &UnreachableError{URL: s.url, Err: err}
}

// badResponse reports an answer that could not be decoded. If it declares a
// result type other than a vector (which client_golang may fail to decode, as it
// does for strings), that is the clearer error.
func badResponse(status int, msg string, body []byte) error {
	var doc struct {
		Data struct {
			ResultType string `json:"resultType"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &doc) == nil && doc.Data.ResultType != "" && doc.Data.ResultType != "vector" {
		return &ResultTypeError{Got: doc.Data.ResultType}
	}
	return &BadResponseError{StatusCode: status, Msg: textutil.Printable(msg, maxMessage)}
}

// maxMessage bounds the backend's own words kept in an error, so that a
// status message or a log line built from it stays small and printable.
const maxMessage = 512

// errorFromBody extracts the error type and message from an error answer: a
// Prometheus API document if it is one, else the start of the body as text.
func errorFromBody(body []byte) (typ, msg string) {
	var doc struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
	}
	if json.Unmarshal(body, &doc) == nil && doc.Error != "" {
		return doc.ErrorType, doc.Error
	}
	return "", strings.TrimSpace(textutil.Printable(string(body[:min(len(body), 4*maxMessage)]), maxMessage))
}

// exchange records the last HTTP status and body of one query, so that errors can
// carry them (client_golang's Query does not return the response).
type exchange struct {
	mu     sync.Mutex
	status int
	body   []byte
}

func (e *exchange) result() (int, []byte) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.status, e.body
}

type exchangeKey struct{}

// capturingClient wraps api.Client to record the response in the query's exchange.
type capturingClient struct {
	api.Client
}

func (c capturingClient) Do(ctx context.Context, req *http.Request) (*http.Response, []byte, error) {
	resp, body, err := c.Client.Do(ctx, req)
	if e, ok := ctx.Value(exchangeKey{}).(*exchange); ok && resp != nil {
		e.mu.Lock()
		e.status, e.body = resp.StatusCode, body
		e.mu.Unlock()
	}
	return resp, body, err
}
