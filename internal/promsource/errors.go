package promsource

import (
	"fmt"
	"strconv"
	"strings"
)

// Fatal errors: Query returns one of these (or a *TemplateError) and no values.

// UnreachableError means no answer came back: connection refused, DNS or TLS
// failure, or the per-query timeout or the caller's deadline expired first
// (Timeout), or the caller's context was canceled (errors.Is(err,
// context.Canceled)).
type UnreachableError struct {
	// URL is the query URL with any credentials redacted.
	URL string
	// Timeout is true when the per-query timeout or the caller's deadline expired.
	Timeout bool
	Err     error
}

func (e *UnreachableError) Error() string {
	if e.Timeout {
		return fmt.Sprintf("metrics backend %s: no answer before the deadline: %v", e.URL, e.Err)
	}
	return fmt.Sprintf("metrics backend %s unreachable: %v", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// ServerError means the backend answered with an error: a non-2xx HTTP status, or
// a body with "status":"error". Message is the backend's own explanation (the
// "error" field of a Prometheus API error body, else the start of the body).
type ServerError struct {
	// StatusCode is the HTTP status (0 if unknown).
	StatusCode int
	// Type is the Prometheus error type (bad_data, execution, timeout, canceled,
	// internal, ...) or client_error/server_error when the body was not an API
	// error document.
	Type string
	// Message is the backend's error message.
	Message string
}

func (e *ServerError) Error() string {
	var b strings.Builder
	b.WriteString("metrics backend answered")
	if e.StatusCode != 0 {
		b.WriteString(" HTTP " + strconv.Itoa(e.StatusCode))
	}
	if e.Type != "" {
		b.WriteString(" (" + e.Type + ")")
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	return b.String()
}

// BadResponseError means a 2xx answer that is not a valid Prometheus API document
// (not JSON, or a result that cannot be decoded).
type BadResponseError struct {
	StatusCode int
	Msg        string
}

func (e *BadResponseError) Error() string {
	return fmt.Sprintf("metrics backend sent a malformed answer (HTTP %d): %s", e.StatusCode, e.Msg)
}

// ResultTypeError means the query evaluated to something other than an instant
// vector (a scalar, a string, or a range vector/matrix). Templates must return one
// series per pod.
type ResultTypeError struct {
	Got string
}

func (e *ResultTypeError) Error() string {
	return fmt.Sprintf("query returned a %s, want an instant vector with one series per pod", e.Got)
}

// EmptyResultError means the query matched no usable series: none at all
// (Series == 0: wrong metric or labels, pods too new for the window, or scraping
// broken), or only series that were dropped (see Result.Issues).
type EmptyResultError struct {
	Query string
	// Series is how many series the backend returned before validation.
	Series int
}

func (e *EmptyResultError) Error() string {
	if e.Series == 0 {
		return "query returned no series"
	}
	return fmt.Sprintf("query returned %d series and none was usable", e.Series)
}

// Non-fatal issues: reported in Result.Issues next to the values that were usable.

// InvalidSampleError reports a pod's sample that was dropped because it was NaN,
// ±Inf or negative. The pod is absent from Result.Values.
type InvalidSampleError struct {
	Pod   string
	Value float64
}

func (e *InvalidSampleError) Error() string {
	return fmt.Sprintf("pod %q: dropped invalid sample %v", e.Pod, e.Value)
}

// DuplicateSeriesError reports several series for one pod (a template that does
// not aggregate by pod, or a federated backend returning partial or un-deduplicated
// answers). If all values are equal, one is kept (Kept true); otherwise the pod is
// dropped, since no value can be trusted.
type DuplicateSeriesError struct {
	Pod    string
	Values []float64
	Kept   bool
}

func (e *DuplicateSeriesError) Error() string {
	if e.Kept {
		return fmt.Sprintf("pod %q: %d identical series, kept one", e.Pod, len(e.Values))
	}
	return fmt.Sprintf("pod %q: %d conflicting series %v, dropped (aggregate the query by pod)", e.Pod, len(e.Values), e.Values)
}

// MissingPodLabelError reports a series without a "pod" label; it is dropped.
type MissingPodLabelError struct {
	// Labels is the series' label set as text.
	Labels string
}

func (e *MissingPodLabelError) Error() string {
	return fmt.Sprintf("series %s has no pod label, dropped (aggregate the query by (pod))", e.Labels)
}

// UnexpectedPodError reports a series for a pod that is not in the Target; it is
// dropped.
type UnexpectedPodError struct {
	Pod string
}

func (e *UnexpectedPodError) Error() string {
	return fmt.Sprintf("series for pod %q, which was not asked for, dropped", e.Pod)
}

// WarningsError carries the warnings the backend attached to an answer (for
// example a partial response from Thanos or Mimir).
type WarningsError struct {
	Warnings []string
}

func (e *WarningsError) Error() string {
	return "metrics backend warnings: " + strings.Join(e.Warnings, "; ")
}

// ResponseTooLargeError means the answer was longer than the configured
// limit (Config.MaxResponseBytes); it was not read further, so memory stays
// bounded. The query selects far more series than pods: a template that does
// not aggregate by pod, or labels that match other workloads.
type ResponseTooLargeError struct {
	// Limit is the limit in bytes.
	Limit int64
	// Declared is the length the backend announced (Content-Length), -1 if
	// it did not and the limit was reached while reading.
	Declared int64
}

func (e *ResponseTooLargeError) Error() string {
	if e.Declared >= 0 {
		return fmt.Sprintf("metrics answer of %d bytes exceeds the %d-byte limit (aggregate the query by pod, or raise --prometheus-max-response-bytes)", e.Declared, e.Limit)
	}
	return fmt.Sprintf("metrics answer exceeds the %d-byte limit (aggregate the query by pod, or raise --prometheus-max-response-bytes)", e.Limit)
}

// QueryTooLongError means the template rendered for a single pod is already
// longer than the maximum query length, so no chunking can help.
type QueryTooLongError struct {
	Length, Limit int
}

func (e *QueryTooLongError) Error() string {
	return fmt.Sprintf("the query for a single pod is %d bytes, longer than the %d-byte limit (shorten the template or raise --prometheus-max-query-length)", e.Length, e.Limit)
}
