package promsource

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"
	"time"
)

// maxRendered bounds what one template may render, in bytes. Backends take
// queries of kilobytes (DefaultMaxQueryLength) and the pods of the largest
// Service a ServiceEntry holds render to a few hundred; a template that
// renders megabytes (printf with a huge width, over and over) is a mistake
// or an attack on the manager's memory, which every team shares.
const maxRendered = 4 << 20

// DefaultCPUQuery is the default CPU signal: CPU-seconds per second used by each
// pod, over the query window, from the kubelet's cAdvisor counters.
//
// It assumes the standard cAdvisor labels namespace, pod and container (Kubernetes
// 1.16+; older clusters had pod_name/container_name). Three kinds of series are
// excluded so that only the application's own containers count:
//   - container="": the pod-level cgroup aggregate (which would double-count) and,
//     under containerd/CRI-O, the pause sandbox;
//   - container="POD": the pause container under dockershim;
//   - container="istio-proxy": the sidecar, whose CPU follows traffic, not capacity.
const DefaultCPUQuery = `sum by (pod) (rate(container_cpu_usage_seconds_total{namespace="{{.Namespace}}", pod=~"{{.Pods}}", container!="", container!="POD", container!="istio-proxy"}[{{.Window}}]))`

// DefaultRequestQuery is the default request-rate signal: requests per second
// served by each pod, as reported by the pod's own sidecar (reporter="destination").
//
// Istio's istio_requests_total carries no pod label of its own: destination_* labels
// describe the workload, not the pod. The pod label comes from the scrape target,
// as in Istio's sample Prometheus (job kubernetes-pods: __meta_kubernetes_pod_name ->
// pod, __meta_kubernetes_namespace -> namespace) and in prometheus-operator
// PodMonitors. Scrape configs that write pod_name instead (Istio's old
// prometheus-operator sample) need an override, for example
// label_replace(sum by (pod_name) (...), "pod", "$1", "pod_name", "(.+)").
// Selection by pod, not by destination_service_name, keeps the query independent of
// the host the client addressed (the Kubernetes Service or the optimized host).
const DefaultRequestQuery = `sum by (pod) (rate(istio_requests_total{reporter="destination", destination_workload_namespace="{{.Namespace}}", pod=~"{{.Pods}}"}[{{.Window}}]))`

// Target is what one query is about: the pods backing one Service.
type Target struct {
	// Namespace of the Service and its pods.
	Namespace string
	// Service name (available to templates as .Service).
	Service string
	// Host is the optimized host (available to templates as .Host); empty
	// for the per-pod queries, which do not depend on it.
	Host string
	// Pods are the pod names to query. Must not be empty.
	Pods []string
	// Window is the range of rate() and similar functions. Must be positive and a
	// whole number of milliseconds.
	Window time.Duration
	// CompactPods renders .Pods with the names that share a prefix up to
	// their last '-' factored out (see podAlternation): the same regexp
	// in about a third of the length, for a query that cannot be split
	// into chunks of pods (QueryCoverage).
	CompactPods bool
}

// ErrNoPods is returned (wrapped in a *TemplateError) when a Target has no pods:
// an empty alternation would match every series without a pod label.
var ErrNoPods = errors.New("target has no pods")

// TemplateError reports a query template that cannot be parsed or executed, or a
// Target that cannot be rendered into it.
type TemplateError struct {
	Template string
	Err      error
}

func (e *TemplateError) Error() string {
	return fmt.Sprintf("query template: %v", e.Err)
}

func (e *TemplateError) Unwrap() error { return e.Err }

// templateData is what templates see. Every field is already escaped for use
// inside a PromQL double-quoted string.
type templateData struct {
	// Namespace, Service and Host are the escaped names.
	Namespace, Service, Host string
	// Pods is an alternation of the pod names, each regexp-quoted, for pod=~"...".
	Pods string
	// Window is a PromQL duration such as 1m, 90s or 1500ms.
	Window string
}

// Render expands a query template for a target. It is pure and deterministic
// (pods are rendered in the order given). Templates use Go text/template syntax and
// see .Namespace, .Service, .Pods and .Window, each already escaped for use inside a
// PromQL double-quoted string (.Pods also regexp-quoted, for a =~ matcher);
// .Host is the optimized host, set for the coverage query.
func Render(tmpl string, t Target) (string, error) {
	parsed, err := parseTemplate(tmpl)
	if err != nil {
		return "", err
	}
	return execute(parsed, tmpl, t)
}

// Validate reports whether a template parses and renders for a sample target, so
// that a bad template can be rejected before any query is sent. It cannot check
// PromQL syntax; the backend does that.
func Validate(tmpl string) error {
	_, err := Render(tmpl, Target{
		Namespace: "ns", Service: "svc", Host: "svc.ns.adaptive", Pods: []string{"pod-0", "pod-1"}, Window: time.Minute,
	})
	return err
}

func parseTemplate(tmpl string) (*template.Template, error) {
	if strings.TrimSpace(tmpl) == "" {
		return nil, &TemplateError{Template: tmpl, Err: errors.New("empty template")}
	}
	parsed, err := template.New("query").Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return nil, &TemplateError{Template: tmpl, Err: err}
	}
	if err := bounded(parsed); err != nil {
		return nil, &TemplateError{Template: tmpl, Err: err}
	}
	return parsed, nil
}

// bounded refuses the actions that make a template's work unbounded: range
// (which counts to any integer) and templates that call templates
// (define, block, template: recursion). A query template only substitutes
// the fields above, which needs neither.
func bounded(t *template.Template) error {
	if len(t.Templates()) > 1 {
		return errors.New("define and block are not allowed in a query template")
	}
	if t.Tree == nil {
		return nil
	}
	var walk func(n parse.Node) error
	walk = func(n parse.Node) error {
		switch n := n.(type) {
		case *parse.RangeNode:
			return errors.New("range is not allowed in a query template: it substitutes .Namespace, .Service, .Pods, .Window and .Host")
		case *parse.TemplateNode:
			return errors.New("template is not allowed in a query template")
		case *parse.ListNode:
			if n == nil {
				return nil
			}
			for _, c := range n.Nodes {
				if err := walk(c); err != nil {
					return err
				}
			}
		case *parse.IfNode:
			return walkBranch(walk, &n.BranchNode)
		case *parse.WithNode:
			return walkBranch(walk, &n.BranchNode)
		}
		return nil
	}
	return walk(t.Tree.Root)
}

func walkBranch(walk func(parse.Node) error, b *parse.BranchNode) error {
	if err := walk(b.List); err != nil {
		return err
	}
	if b.ElseList != nil {
		return walk(b.ElseList)
	}
	return nil
}

// cappedBuffer stops a template's execution once it has rendered
// maxRendered bytes.
type cappedBuffer struct{ bytes.Buffer }

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if b.Len()+len(p) > maxRendered {
		return 0, fmt.Errorf("the template renders more than %d bytes", maxRendered)
	}
	return b.Buffer.Write(p)
}

func execute(parsed *template.Template, tmpl string, t Target) (string, error) {
	data, err := newTemplateData(t)
	if err != nil {
		return "", &TemplateError{Template: tmpl, Err: err}
	}
	var buf cappedBuffer
	if err := parsed.Execute(&buf, data); err != nil {
		return "", &TemplateError{Template: tmpl, Err: err}
	}
	out := strings.TrimSpace(buf.String())
	if out == "" {
		return "", &TemplateError{Template: tmpl, Err: errors.New("template rendered an empty query")}
	}
	return out, nil
}

func newTemplateData(t Target) (templateData, error) {
	if len(t.Pods) == 0 {
		return templateData{}, ErrNoPods
	}
	for _, p := range t.Pods {
		if p == "" {
			return templateData{}, errors.New("target has an empty pod name")
		}
	}
	window, err := FormatDuration(t.Window)
	if err != nil {
		return templateData{}, err
	}
	return templateData{
		Namespace: EscapeString(t.Namespace),
		Service:   EscapeString(t.Service),
		Host:      EscapeString(t.Host),
		Pods:      EscapeString(podAlternation(t.Pods, t.CompactPods)),
		Window:    window,
	}, nil
}

// podAlternation is a regexp alternation matching exactly the pod names,
// each regexp-quoted, in their order. Compact factors out the prefix up to
// the last '-' that names share (the pods of one ReplicaSet share their
// Deployment's and template hash's, a StatefulSet's its name), keeping
// each group where its first name stands: web-5d8f-(?:x2k4p|q9z7m)|db-0.
// A Deployment's pod then costs its 5-character suffix and a '|' instead
// of its whole name.
func podAlternation(pods []string, compact bool) string {
	var b strings.Builder
	if !compact {
		for i, p := range pods {
			if i > 0 {
				b.WriteByte('|')
			}
			b.WriteString(regexp.QuoteMeta(p))
		}
		return b.String()
	}
	var prefixes []string
	suffixes := map[string][]string{}
	for _, p := range pods {
		prefix := p[:strings.LastIndexByte(p, '-')+1]
		if _, seen := suffixes[prefix]; !seen {
			prefixes = append(prefixes, prefix)
		}
		suffixes[prefix] = append(suffixes[prefix], p[len(prefix):])
	}
	for i, prefix := range prefixes {
		if i > 0 {
			b.WriteByte('|')
		}
		group := suffixes[prefix]
		if prefix == "" || len(group) == 1 {
			for j, s := range group {
				if j > 0 {
					b.WriteByte('|')
				}
				b.WriteString(regexp.QuoteMeta(prefix + s))
			}
			continue
		}
		b.WriteString(regexp.QuoteMeta(prefix))
		b.WriteString("(?:")
		for j, s := range group {
			if j > 0 {
				b.WriteByte('|')
			}
			b.WriteString(regexp.QuoteMeta(s))
		}
		b.WriteByte(')')
	}
	return b.String()
}

// EscapeString escapes s for use inside a PromQL double-quoted string literal
// (without adding the quotes). PromQL strings follow Go's escaping rules, so a
// backslash that a regexp needs (\.) must be written twice (\\.).
func EscapeString(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// FormatDuration renders d as a PromQL duration in the largest single unit that
// represents it exactly: 1m, 90s, 1500ms, 2h. It rejects non-positive durations and
// sub-millisecond precision, which PromQL cannot express.
func FormatDuration(d time.Duration) (string, error) {
	if d <= 0 {
		return "", fmt.Errorf("window must be positive, got %v", d)
	}
	if d%time.Millisecond != 0 {
		return "", fmt.Errorf("window %v is not a whole number of milliseconds", d)
	}
	units := []struct {
		d    time.Duration
		name string
	}{
		{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"},
	}
	for _, u := range units {
		if d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name, nil
		}
	}
	panic("unreachable") // every duration that passed the checks divides by 1ms
}
