package promsource

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// DefaultCoverageQuery measures how much of a Service's traffic went through
// the optimized host (and so through the weights) over the window. It answers
// at most MaxBypassSources+2 series, each labelled path:
//   - path="received": requests per second the Service's pods received, as
//     their own sidecars report them (reporter="destination", selected by
//     pod, like DefaultRequestQuery);
//   - path="weighted": requests per second clients sent to the optimized
//     host, as the clients' sidecars report them (reporter="source"). For a
//     ServiceEntry istiod writes the host into the cluster metadata Istio's
//     telemetry reads destination_service from (the host) and
//     destination_service_namespace from (the ServiceEntry's namespace);
//   - path="bypass": the largest sources whose requests reached the pods by
//     another path, per source_workload and source_workload_namespace
//     (received from that source minus what it sent to the optimized host);
//     "unknown" is what Istio reports for clients without a sidecar.
//
// Every selector stays inside the Service's namespace: the received side by
// destination_workload_namespace, the weighted side by
// destination_service_namespace (the ServiceEntry lives in the Service's
// namespace), as the shipped weight queries do.
const DefaultCoverageQuery = `label_replace(sum(rate(istio_requests_total{reporter="destination", destination_workload_namespace="{{.Namespace}}", pod=~"{{.Pods}}"}[{{.Window}}])), "path", "received", "", "")
or label_replace(sum(rate(istio_requests_total{reporter="source", destination_service="{{.Host}}", destination_service_namespace="{{.Namespace}}"}[{{.Window}}])), "path", "weighted", "", "")
or label_replace(topk(5, clamp_min(
    sum by (source_workload, source_workload_namespace) (rate(istio_requests_total{reporter="destination", destination_workload_namespace="{{.Namespace}}", pod=~"{{.Pods}}"}[{{.Window}}]))
    - (sum by (source_workload, source_workload_namespace) (rate(istio_requests_total{reporter="source", destination_service="{{.Host}}", destination_service_namespace="{{.Namespace}}"}[{{.Window}}]))
       or 0 * sum by (source_workload, source_workload_namespace) (rate(istio_requests_total{reporter="destination", destination_workload_namespace="{{.Namespace}}", pod=~"{{.Pods}}"}[{{.Window}}]))),
    0) > 0), "path", "bypass", "", "")`

// PathLabel tells the parts of a coverage answer apart.
const PathLabel = "path"

// MaxBypassSources bounds the bypassing sources kept from one answer (the
// default query asks for the top 5): status names a few, the metric carries
// the ratio, and a template that forgets topk cannot grow either.
const MaxBypassSources = 5

// MaxCoverageSeries bounds a coverage answer: the received and weighted
// totals and a few sources, with room for a template that splits them
// further. A larger answer is refused rather than read, so a template that
// lists every client cannot load the operator.
const MaxCoverageSeries = 64

// SourceRate is one client workload's request rate.
type SourceRate struct {
	Namespace, Workload string
	// Rate in requests per second.
	Rate float64
}

// Coverage is one measurement of the share of a Service's traffic that went
// through the optimized host.
type Coverage struct {
	// Received is the requests per second the Service's pods received.
	Received float64
	// Weighted is the requests per second clients sent to the optimized host.
	Weighted float64
	// Bypass are the largest sources that reached the pods by another path,
	// largest first, at most MaxBypassSources.
	Bypass []SourceRate
	// Query is the rendered PromQL; Latency the backend's answer time.
	Query   string
	Latency time.Duration
}

// Ratio is the share of the received requests that went through the
// optimized host, in [0, 1]; ok is false without traffic (no figure).
// Client and server sidecars count the same requests apart (retries,
// requests in flight at the window's edges), so a weighted rate slightly
// above the received one is read as full coverage.
func (c Coverage) Ratio() (ratio float64, ok bool) {
	if !(c.Received > 0) {
		return 0, false
	}
	return math.Min(1, math.Max(0, c.Weighted/c.Received)), true
}

// CoverageError reports a coverage answer that cannot be read.
type CoverageError struct {
	Query string
	Msg   string
}

func (e *CoverageError) Error() string {
	return fmt.Sprintf("coverage query %s: %s", e.Query, e.Msg)
}

// QueryCoverage renders tmpl for t (t.Host is the optimized host) and runs it
// as one instant query. The query is never split: its parts are sums over
// every pod, which chunks could not add up (topk of differences would come
// out wrong). A query longer than the source's limit is rendered again
// with the pods' names factored by prefix (Target.CompactPods); one still
// too long fails with a *QueryTooLongError. Fatal errors are those of Query. An answer with
// warnings (a partial response: a store or an ingester missing) gives no
// figure, since the sums behind the ratio may be short of some of the
// traffic and the figure feeds a condition: it fails with a
// *WarningsError.
func (s *Source) QueryCoverage(ctx context.Context, tmpl string, t Target, now time.Time) (Coverage, error) {
	q, err := s.render(tmpl, t)
	if err != nil {
		return Coverage{}, err
	}
	if len(q) > s.maxQuery && !t.CompactPods {
		// The same pods in a shorter regexp (a Service of a few hundred
		// pods lists them three times over the limit).
		t.CompactPods = true
		if q, err = s.render(tmpl, t); err != nil {
			return Coverage{}, err
		}
	}
	if len(q) > s.maxQuery {
		return Coverage{Query: q}, &QueryTooLongError{Length: len(q), Limit: s.maxQuery}
	}
	start := time.Now()
	a := s.send(ctx, q, now)
	c := Coverage{Query: q, Latency: time.Since(start)}
	if a.err != nil {
		return c, a.err
	}
	if len(a.warnings) > 0 {
		return c, &WarningsError{Warnings: a.warnings}
	}
	parsed, err := ParseCoverage(a.vec)
	if err != nil {
		return c, &CoverageError{Query: q, Msg: err.Error()}
	}
	parsed.Query, parsed.Latency = c.Query, c.Latency
	return parsed, nil
}

// ParseCoverage reads a coverage answer. It is pure. Series without a known
// path label, or with a value that is not finite and non-negative, are
// errors: the figure feeds a condition, so a wrong template must say so
// rather than report a made-up share. An answer without a received series
// means no traffic (Received 0).
func ParseCoverage(vec model.Vector) (Coverage, error) {
	if len(vec) > MaxCoverageSeries {
		return Coverage{}, fmt.Errorf("%d series, more than %d; keep the bypassing sources to a few (topk)", len(vec), MaxCoverageSeries)
	}
	var c Coverage
	var seenReceived, seenWeighted bool
	for _, smp := range vec {
		v := float64(smp.Value)
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return Coverage{}, fmt.Errorf("series %s has value %v, want a finite rate >= 0", smp.Metric, v)
		}
		switch path := string(smp.Metric[PathLabel]); path {
		case "received":
			if seenReceived {
				return Coverage{}, fmt.Errorf("two series with path=%q", path)
			}
			seenReceived, c.Received = true, v
		case "weighted":
			if seenWeighted {
				return Coverage{}, fmt.Errorf("two series with path=%q", path)
			}
			seenWeighted, c.Weighted = true, v
		case "bypass":
			if v > 0 {
				c.Bypass = append(c.Bypass, SourceRate{
					Namespace: string(smp.Metric["source_workload_namespace"]),
					Workload:  string(smp.Metric["source_workload"]),
					Rate:      v,
				})
			}
		default:
			return Coverage{}, fmt.Errorf("series %s has no %s label of received, weighted or bypass", smp.Metric, PathLabel)
		}
	}
	sort.Slice(c.Bypass, func(i, j int) bool {
		a, b := c.Bypass[i], c.Bypass[j]
		if a.Rate != b.Rate {
			return a.Rate > b.Rate
		}
		return a.Namespace+"/"+a.Workload < b.Namespace+"/"+b.Workload
	})
	if len(c.Bypass) > MaxBypassSources {
		c.Bypass = c.Bypass[:MaxBypassSources]
	}
	return c, nil
}

// String names a source as namespace/workload, "unknown" for clients Istio
// cannot name (without a sidecar).
func (r SourceRate) String() string {
	ns, wl := r.Namespace, r.Workload
	if wl == "" || wl == "unknown" {
		if ns == "" || ns == "unknown" {
			return "unknown (clients without a sidecar)"
		}
		return ns + "/unknown"
	}
	return strings.TrimPrefix(ns+"/"+wl, "/")
}
