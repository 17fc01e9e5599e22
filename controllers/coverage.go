package controllers

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/textutil"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// ReasonTrafficBypassesWeights: less of the Service's traffic than the
// administrator's threshold goes through the optimized host.
const ReasonTrafficBypassesWeights = "TrafficBypassesWeights"

const coverageControllerName = "optimizer.coverage"

// CoverageOptions configure the traffic coverage figure.
type CoverageOptions struct {
	// Threshold: below this share of the traffic through the weights the
	// optimizer is Degraded (TrafficBypassesWeights). 0.9 by default: the
	// weights then steer at least nine requests in ten, and a path that
	// carries more than a tenth of the load (a gateway, sidecar-less
	// clients) is named rather than averaged away.
	Threshold float64
	// Interval between two measurements of one optimizer, and the window
	// each one covers, so consecutive figures cover all the traffic. 5
	// minutes by default: the figure is a status report, not a control
	// signal, and one query per optimizer per 5 minutes (0.003 query/s)
	// leaves the backend's budget of 0.1 query/s per optimizer to the
	// weights.
	Interval time.Duration
	// Query is the default template (spec.optimization.coverage_query
	// overrides it); "-" measures nothing.
	Query string
}

// DefaultCoverageOptions are the flag defaults.
func DefaultCoverageOptions() CoverageOptions {
	return CoverageOptions{Threshold: 0.9, Interval: 5 * time.Minute, Query: promsource.DefaultCoverageQuery}
}

// BindFlags registers the coverage flags.
func (o *CoverageOptions) BindFlags(fs *flag.FlagSet) {
	d := DefaultCoverageOptions()
	fs.Float64Var(&o.Threshold, "coverage-threshold", d.Threshold, "Share of a Service's requests that must go through the optimized host; below it the optimizer is Degraded (TrafficBypassesWeights) and names the bypassing sources. 0 turns the condition off.")
	fs.DurationVar(&o.Interval, "coverage-interval", d.Interval, "How often the traffic coverage of each optimizer is measured, and the window each measurement covers.")
	fs.StringVar(&o.Query, "default-coverage-query", d.Query, `PromQL template of the traffic coverage figure, "-" for none (spec.optimization.coverage_query).`)
}

// Validate reports nonsense settings.
func (o *CoverageOptions) Validate() error {
	if o.Threshold < 0 || o.Threshold > 1 {
		return fmt.Errorf("--coverage-threshold must be between 0 and 1, got %v", o.Threshold)
	}
	// A window under a minute holds too few scrapes (15-30 s apart) for a
	// rate; the query budget needs no lower bound beyond that.
	if o.Interval < time.Minute {
		return fmt.Errorf("--coverage-interval must be at least 1m, got %v", o.Interval)
	}
	if _, err := promsource.FormatDuration(o.Interval); err != nil {
		return fmt.Errorf("--coverage-interval: %w", err)
	}
	if o.Query != "-" {
		if err := promsource.Validate(o.Query); err != nil {
			return fmt.Errorf("--default-coverage-query: %w", err)
		}
	}
	return nil
}

// CoverageSource answers the coverage query.
type CoverageSource interface {
	QueryCoverage(ctx context.Context, tmpl string, t promsource.Target, now time.Time) (promsource.Coverage, error)
}

// CoverageRecord is one optimizer's last measurement.
type CoverageRecord struct {
	Time     time.Time
	Window   time.Duration
	Host     string
	Coverage promsource.Coverage
	// Err is why there is no figure (nil when the query answered).
	Err error
}

// CoverageBook holds the last measurement of each optimizer, for the
// mirror to put in status. Safe for concurrent use.
type CoverageBook struct {
	mu sync.Mutex
	m  map[types.NamespacedName]CoverageRecord
}

// NewCoverageBook returns an empty book.
func NewCoverageBook() *CoverageBook {
	return &CoverageBook{m: map[types.NamespacedName]CoverageRecord{}}
}

// Get returns the record of key, nil without one (or on a nil book).
func (b *CoverageBook) Get(key types.NamespacedName) *CoverageRecord {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	rec, ok := b.m[key]
	if !ok {
		return nil
	}
	return &rec
}

func (b *CoverageBook) set(key types.NamespacedName, rec CoverageRecord) *CoverageRecord {
	b.mu.Lock()
	defer b.mu.Unlock()
	prev, ok := b.m[key]
	b.m[key] = rec
	if !ok {
		return nil
	}
	return &prev
}

func (b *CoverageBook) forget(key types.NamespacedName) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, ok := b.m[key]
	delete(b.m, key)
	return ok
}

func (b *CoverageBook) keys() []types.NamespacedName {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(b.m))
	for k := range b.m {
		out = append(out, k)
	}
	return out
}

// CoverageLoop measures the traffic coverage of every optimizer on its own
// slow timer, leader only (one backend query per optimizer per interval
// whatever the replicas). Like the weight loop it never writes: it records
// into the book and wakes the mirror when what status says would change
// (a figure crosses the threshold, appears, or goes).
type CoverageLoop struct {
	Client  client.Reader
	Source  CoverageSource
	Book    *CoverageBook
	Clock   clock.Clock
	Metrics *metrics.Metrics
	Options CoverageOptions
	// CustomQueries says which optimizers may bring their own template.
	CustomQueries NamespaceGate
	Wake          chan<- event.GenericEvent
}

// NeedLeaderElection: only the leader queries the backend.
func (l *CoverageLoop) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable: every optimizer is measured once an
// interval, the first time after one whole interval (the window must have
// passed since the optimizer could route anything). A round's
// measurements are spread evenly over the interval: each one changes its
// optimizer's status (status.coverage's time), and optimizers measured in
// one go would all write their status in the same cycle.
func (l *CoverageLoop) Start(ctx context.Context) error {
	next := l.Clock.Now().Add(l.Options.Interval)
	for l.sleepUntil(ctx, next) {
		next = next.Add(l.Options.Interval)
		l.MeasureAll(ctx, next)
	}
	return nil
}

// sleepUntil waits until t on the loop's clock; false when ctx ended.
func (l *CoverageLoop) sleepUntil(ctx context.Context, t time.Time) bool {
	d := t.Sub(l.Clock.Now())
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := l.Clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C():
		return true
	}
}

// MeasureAll measures every optimizer once, one after the other, spread
// evenly from now until end (all at once when end has passed): the
// queries are few and small, and a backend that hangs costs at most its
// timeout per optimizer, once per interval.
func (l *CoverageLoop) MeasureAll(ctx context.Context, end time.Time) {
	list := &optv1.IstioAdaptiveRequestOptimizerList{}
	if err := l.Client.List(ctx, list); err != nil {
		log.FromContext(ctx).Info("Could not list optimizers to measure traffic coverage", "error", err.Error())
		return
	}
	start, n := l.Clock.Now(), time.Duration(len(list.Items))
	span := max(end.Sub(start), 0)
	seen := make(map[types.NamespacedName]bool, len(list.Items))
	for i := range list.Items {
		opt := &list.Items[i]
		key := client.ObjectKeyFromObject(opt)
		seen[key] = true
		if !l.sleepUntil(ctx, start.Add(span*time.Duration(i)/n)) {
			return
		}
		l.Measure(ctx, opt)
	}
	for _, key := range l.Book.keys() {
		if !seen[key] {
			l.Book.forget(key)
		}
	}
}

// Measure measures one optimizer and records the result.
func (l *CoverageLoop) Measure(ctx context.Context, opt *optv1.IstioAdaptiveRequestOptimizer) {
	key := client.ObjectKeyFromObject(opt)
	ns, svc := opt.TargetNamespace(), opt.Spec.ServiceName
	tmpl := l.template(opt)
	routed := opt.Status.Host != "" && opt.Status.OwnedObjects.ServiceEntry != "" && opt.DeletionTimestamp.IsZero() &&
		!meta.IsStatusConditionTrue(opt.Status.Conditions, optv1.ConditionStalled)
	if !routed || tmpl == "" {
		l.drop(opt)
		return
	}
	pods, err := l.pods(ctx, ns, svc)
	if err != nil {
		log.FromContext(ctx).Info("Could not read the pods to measure traffic coverage", "optimizer", key, "error", err.Error())
		return
	}
	if len(pods) == 0 {
		l.drop(opt)
		return
	}
	now := l.Clock.Now()
	target := promsource.Target{Namespace: ns, Service: svc, Host: opt.Status.Host, Pods: pods, Window: l.Options.Interval}
	c, err := l.Source.QueryCoverage(ctx, tmpl, target, now)
	rec := CoverageRecord{Time: now, Window: l.Options.Interval, Host: opt.Status.Host, Coverage: c, Err: err}
	if err != nil {
		l.Metrics.QueryErrors.WithLabelValues(ns, svc, "coverage", coverageErrorReason(err)).Inc()
		log.FromContext(ctx).Info("Traffic coverage query failed", "optimizer", key, "error", err.Error())
	}
	if ratio, ok := c.Ratio(); ok && err == nil {
		l.Metrics.TrafficCoverage.WithLabelValues(ns, svc).Set(ratio)
	} else {
		l.Metrics.TrafficCoverage.DeleteLabelValues(ns, svc)
	}
	prev := l.Book.set(key, rec)
	if coverageState(prev, l.Options.Threshold) != coverageState(&rec, l.Options.Threshold) {
		l.wake(opt)
	}
}

// drop forgets the figure of an optimizer that routes nothing now.
func (l *CoverageLoop) drop(opt *optv1.IstioAdaptiveRequestOptimizer) {
	l.Metrics.TrafficCoverage.DeleteLabelValues(opt.TargetNamespace(), opt.Spec.ServiceName)
	if l.Book.forget(client.ObjectKeyFromObject(opt)) {
		l.wake(opt)
	}
}

func (l *CoverageLoop) wake(opt *optv1.IstioAdaptiveRequestOptimizer) {
	if l.Wake == nil {
		return
	}
	select {
	case l.Wake <- event.GenericEvent{Object: opt}:
	default:
		// The mirror is busy; the next weight cycle or event brings the
		// figure into status anyway.
	}
}

// template is the optimizer's coverage template, "" for none. A custom
// template the administrator does not allow falls back to the default, as
// the weight queries do.
func (l *CoverageLoop) template(opt *optv1.IstioAdaptiveRequestOptimizer) string {
	tmpl := l.Options.Query
	if o := opt.Spec.Optimization; o != nil && o.CoverageQuery != "" {
		if o.CoverageQuery == "-" || l.CustomQueries.Allows(opt.Namespace) {
			tmpl = o.CoverageQuery
		}
	}
	if tmpl == "-" {
		return ""
	}
	return tmpl
}

// pods are the names of the Service's ready pods, sorted.
func (l *CoverageLoop) pods(ctx context.Context, namespace, service string) ([]string, error) {
	slices := &discoveryv1.EndpointSliceList{}
	if err := l.Client.List(ctx, slices, client.InNamespace(namespace), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s/%s: %w", namespace, service, err)
	}
	seen := map[string]bool{}
	var out []string
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || seen[e.TargetRef.Name] {
				continue
			}
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			seen[e.TargetRef.Name] = true
			out = append(out, e.TargetRef.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// coverageState is what of a record status shows at a glance: no figure,
// at or above the threshold, or below it with these sources named.
func coverageState(rec *CoverageRecord, threshold float64) string {
	if rec == nil {
		return "none"
	}
	ratio, ok := rec.Coverage.Ratio()
	switch {
	case rec.Err != nil:
		return "failed"
	case !ok:
		return "no traffic"
	case ratio >= threshold:
		return "covered"
	}
	names := make([]string, 0, len(rec.Coverage.Bypass))
	for _, b := range rec.Coverage.Bypass {
		names = append(names, b.String())
	}
	return "below: " + strings.Join(names, ",")
}

// coverageStatus turns a record into the status field and, below the
// threshold, the Degraded message. It is pure.
func coverageStatus(rec *CoverageRecord, threshold float64) (*optv1.TrafficCoverage, string) {
	if rec == nil {
		return nil, ""
	}
	window, _ := promsource.FormatDuration(rec.Window)
	out := &optv1.TrafficCoverage{MeasuredTime: statusTime(rec.Time), Window: window}
	if rec.Err != nil {
		var long *promsource.QueryTooLongError
		msg := "the coverage query failed: " + rec.Err.Error()
		var warned *promsource.WarningsError
		switch {
		case errors.As(rec.Err, &long):
			msg = "the coverage query is too long for the backend (it names every pod and is never split); set spec.optimization.coverage_query to one that selects the pods by workload"
		case errors.As(rec.Err, &warned):
			msg = "no figure: the backend's answer carried warnings (a partial answer may miss some of the traffic): " + strings.Join(warned.Warnings, "; ")
		}
		out.Message = textutil.Printable(msg, 1000)
		return out, ""
	}
	ratio, ok := rec.Coverage.Ratio()
	if !ok {
		return nil, ""
	}
	out.Ratio = strconv.FormatFloat(ratio, 'f', 2, 64)
	out.ReceivedRate = strconv.FormatFloat(rec.Coverage.Received, 'f', 1, 64)
	named := make([]string, 0, len(rec.Coverage.Bypass))
	for _, b := range rec.Coverage.Bypass {
		rate := strconv.FormatFloat(b.Rate, 'f', 1, 64)
		out.Bypassing = append(out.Bypassing, optv1.BypassingSource{Namespace: b.Namespace, Workload: b.Workload, Rate: rate})
		named = append(named, fmt.Sprintf("%s (%s rps)", b, rate))
	}
	if ratio >= threshold {
		return out, ""
	}
	sources := "no single source stands out"
	if len(named) > 0 {
		sources = "the largest sources that bypass them: " + strings.Join(named, ", ")
	}
	return out, fmt.Sprintf("%s of the %s requests/s the Service's pods received over the last %s went through the optimized host %s and its weights (threshold %s); %s. "+
		"Route gateways to %s, give clients a sidecar, or lower --coverage-threshold",
		out.Ratio, out.ReceivedRate, window, rec.Host, strconv.FormatFloat(threshold, 'f', 2, 64), sources, rec.Host)
}

// coverage puts the last coverage figure into status, and Degraded below
// the threshold.
func (r *MirrorReconciler) coverage(opt *optv1.IstioAdaptiveRequestOptimizer, st *status) {
	if r.Coverage == nil {
		return
	}
	cov, msg := coverageStatus(r.Coverage.Get(client.ObjectKeyFromObject(opt)), r.CoverageThreshold)
	opt.Status.Coverage = cov
	if msg != "" {
		st.degraded(ReasonTrafficBypassesWeights, msg)
	}
}

// coverageErrorReason names the kind of a failed coverage query, for
// optimizer_query_errors_total{signal="coverage"}.
func coverageErrorReason(err error) string {
	var (
		unreachable *promsource.UnreachableError
		server      *promsource.ServerError
		tooLong     *promsource.QueryTooLongError
		tmpl        *promsource.TemplateError
		warned      *promsource.WarningsError
		cred        *promsource.CredentialsError
	)
	switch {
	case errors.As(err, &cred):
		return "credentials"
	case errors.As(err, &warned):
		return "warnings"
	case errors.As(err, &unreachable):
		return "unreachable"
	case errors.As(err, &server):
		return "server"
	case errors.As(err, &tooLong):
		return "too_long"
	case errors.As(err, &tmpl):
		return "template"
	}
	return "bad_response"
}

// setupCoverage adds the coverage loop when there is a backend to ask.
func setupCoverage(mgr manager.Manager, d Dependencies, mirror *MirrorReconciler, wake chan<- event.GenericEvent) error {
	src := d.CoverageSource
	if src == nil {
		src, _ = d.Source.(CoverageSource)
	}
	opts := d.Options.Coverage
	if opts.Interval == 0 {
		opts = DefaultCoverageOptions()
	}
	if src == nil {
		return nil
	}
	mirror.Coverage = NewCoverageBook()
	mirror.CoverageThreshold = opts.Threshold
	loop := &CoverageLoop{Client: mgr.GetClient(), Source: src, Book: mirror.Coverage, Clock: d.Clock, Metrics: d.Metrics,
		Options: opts, CustomQueries: d.Options.CustomQueries, Wake: wake}
	if err := mgr.Add(loop); err != nil {
		return fmt.Errorf("add coverage loop: %w", err)
	}
	return nil
}
