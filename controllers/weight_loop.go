package controllers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/policy"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/internal/textutil"
	"github.com/liorfranko/istio-adaptive-least-request/internal/weights"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

const weightControllerName = "optimizer.weights"

// MetricsSource answers one PromQL query for a set of pods.
type MetricsSource interface {
	Query(ctx context.Context, tmpl string, t promsource.Target, now time.Time) (promsource.Result, error)
}

// WeightLoop recomputes the weights of every optimizer when its policy
// (internal/policy, kept in the book) says a cycle or a look is due, on the
// injected clock. Each optimizer has its own goroutine and its cycles their
// own requests, so a slow metrics backend for one never delays another's
// cycles; the looks due at one instant share requests (look_batch.go),
// each bounded by the look interval. A cycle never writes: it records the
// outcome in the book and wakes the mirror, the only writer of Istio
// objects and status.
type WeightLoop struct {
	Source  MetricsSource
	Book    *WeightBook
	Clock   clock.Clock
	Metrics *metrics.Metrics
	// Wake asks the mirror to reconcile an optimizer.
	Wake chan<- event.GenericEvent

	mu      sync.Mutex
	ctx     context.Context
	workers map[types.NamespacedName]*worker
	// looks batches the looks due at one instant (look_batch.go).
	looks lookBatches
}

type worker struct {
	cancel   context.CancelFunc
	mu       sync.Mutex
	settings Settings
	target   target
	update   chan struct{}
}

type target struct{ namespace, service string }

// Start implements manager.Runnable: workers run until ctx ends. Workers
// asked for before the loop started (the mirror runs before leader-only
// runnables) start now.
func (l *WeightLoop) Start(ctx context.Context) error {
	l.mu.Lock()
	l.ctx = ctx
	for key, w := range l.workers {
		wctx, cancel := context.WithCancel(ctx)
		w.cancel = cancel
		go l.run(wctx, key, w)
	}
	l.mu.Unlock()
	<-ctx.Done()
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, w := range l.workers {
		w.cancel()
		delete(l.workers, key)
	}
	return nil
}

// NeedLeaderElection: only the leader computes weights.
func (l *WeightLoop) NeedLeaderElection() bool { return true }

func (l *WeightLoop) enabled() bool { return l != nil && l.Source != nil }

// Ensure starts or updates the worker of an optimizer.
func (l *WeightLoop) Ensure(opt *optv1.IstioAdaptiveRequestOptimizer, s Settings) {
	if !l.enabled() {
		return
	}
	key := types.NamespacedName{Namespace: opt.Namespace, Name: opt.Name}
	tgt := target{opt.TargetNamespace(), opt.Spec.ServiceName}
	l.Book.Configure(key, l.Clock.Now(), s)
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.workers[key]; w != nil {
		w.mu.Lock()
		w.settings, w.target = s, tgt
		w.mu.Unlock()
		// The policy may have a new cycle or look interval: ask it again.
		w.poke()
		return
	}
	w := &worker{cancel: func() {}, settings: s, target: tgt, update: make(chan struct{}, 1)}
	if l.workers == nil {
		l.workers = map[types.NamespacedName]*worker{}
	}
	l.workers[key] = w
	if l.ctx != nil {
		ctx, cancel := context.WithCancel(l.ctx)
		w.cancel = cancel
		go l.run(ctx, key, w)
	}
}

// Stop ends the worker of a deleted optimizer.
func (l *WeightLoop) Stop(key types.NamespacedName) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.workers[key]; w != nil {
		w.cancel()
		delete(l.workers, key)
	}
	if l.Book != nil {
		// Until the mirror applies endpoints again, a worker started for
		// the optimizer has nothing to query (a Stalled optimizer is
		// reconciled, and its worker ensured, at every change).
		l.Book.Park(key)
	}
}

// run is one optimizer's worker: it does what the optimizer's policy has
// due (policy.Policy.Next: a cycle, or a look between cycles) on the
// injected clock, and waits for the next instant, a settings change or the
// mirror's poke (the endpoints became known).
func (l *WeightLoop) run(ctx context.Context, key types.NamespacedName, w *worker) {
	logger := log.FromContext(ctx).WithValues("controller", weightControllerName, "optimizer", key)
	// expected is the shared instant this worker said it will look at
	// (lookBatches.expect), zero when none.
	var expected time.Time
	withdraw := func() {
		if !expected.IsZero() {
			l.looks.unexpect(expected, key, l.runLookBatch)
			expected = time.Time{}
		}
	}
	defer withdraw()
	for ctx.Err() == nil {
		s, tgt := w.current()
		now := l.Clock.Now()
		act, at := l.Book.Next(key, now)
		if act == policy.Look {
			// On the instant the looks of every optimizer share.
			at = lookInstant(at, now, s.ProbeInterval)
		}
		if !expected.IsZero() && (act != policy.Look || !at.Equal(expected)) {
			withdraw()
		}
		if act != policy.Wait && !at.After(now) {
			switch act {
			case policy.Look:
				// Joining the batch at expected takes the place of the
				// expectation.
				expected = time.Time{}
				l.look(ctx, logger, key, tgt, s, at)
			case policy.Cycle:
				l.Metrics.CycleLateness.Observe(now.Sub(at).Seconds())
				l.cycle(ctx, logger, key, tgt, s)
			}
			continue
		}
		var fire <-chan time.Time
		var timer clock.Timer
		if act != policy.Wait {
			if act == policy.Look && expected.IsZero() {
				l.looks.expect(at, key)
				expected = at
			}
			timer = l.Clock.NewTimer(at.Sub(now))
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-w.update:
		case <-fire:
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// current returns the worker's settings and target now.
func (w *worker) current() (Settings, target) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.settings, w.target
}

// Poke makes the worker of an optimizer ask its policy again what is due:
// the mirror calls it after applying endpoints, so the first cycle runs as
// soon as they are known.
func (l *WeightLoop) Poke(key types.NamespacedName) {
	if !l.enabled() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.workers[key]; w != nil {
		w.poke()
	}
}

func (w *worker) poke() {
	select {
	case w.update <- struct{}{}:
	default:
	}
}

// probe is the look between cycles, when the policy has one due (ROUND_ROBIN
// is live on learned weights): the latency query over the last two scrape
// intervals, bounded by one look interval, judged by the engine's Alarm.
// It reports whether the alarm rang (the policy then has the cycle due at
// once). A failed look counts in
// optimizer_query_errors_total{signal="recent_latency"}; the next cycle
// runs every query and says more.
func (l *WeightLoop) probe(ctx context.Context, logger logr.Logger, key types.NamespacedName, tgt target, s Settings) bool {
	return l.look(ctx, logger, key, tgt, s, time.Time{})
}

// look is probe at the shared instant at, answered in the batch of every
// look due then (look_batch.go); at zero: now, alone.
func (l *WeightLoop) look(ctx context.Context, logger logr.Logger, key types.NamespacedName, tgt target, s Settings, at time.Time) bool {
	now := at
	if now.IsZero() {
		now = l.Clock.Now()
	}
	obs := weights.Observation{Time: now, Signals: map[string]weights.Signal{}}
	pods := podNames(l.Book.Endpoints(key))
	wanted := len(pods) > 0 && s.ProbeInterval > 0 && s.RecentLatencyWindow > 0 && l.Book.LookWanted(key)
	if !wanted && !at.IsZero() {
		// Expected at the instant, but nothing to ask after all.
		l.looks.unexpect(at, key, l.runLookBatch)
	}
	if wanted {
		qctx, cancel := context.WithTimeout(ctx, s.ProbeInterval)
		defer cancel()
		qt := promsource.Target{Namespace: tgt.namespace, Service: tgt.service, Pods: pods}
		// The request query over the same window shows whether a pod
		// whose latency rings the alarm serves less than it is sent
		// (weights.Signal.RecentRequests).
		reqTmpl := s.RequestQuery
		if s.RecentRequestsWindow != s.RecentLatencyWindow {
			reqTmpl = ""
		}
		var res, reqs promsource.Result
		if at.IsZero() {
			res = l.recentSignal(qctx, logger, tgt, "recent_latency", s.LatencyQuery, qt, s.RecentLatencyWindow, now)
			reqs = l.recentSignal(qctx, logger, tgt, "recent_requests", reqTmpl, qt, s.RecentRequestsWindow, now)
		} else {
			qt.Window = s.RecentLatencyWindow
			lb := l.looks.join(at, key, lookRequest{tmpl: s.LatencyQuery, reqTmpl: reqTmpl, target: qt, timeout: s.ProbeInterval}, l.runLookBatch)
			got, ok := lb.answer(qctx, key)
			if !ok && ctx.Err() == nil {
				timeout := &promsource.UnreachableError{URL: "(the looks' batch)", Timeout: true, Err: qctx.Err()}
				got.latency.Err, got.requests.Err = timeout, timeout
			}
			res = l.optionalAnswer(ctx, logger, tgt, "recent_latency", got.latency.Result, got.latency.Err)
			if reqTmpl != "" {
				reqs = l.optionalAnswer(ctx, logger, tgt, "recent_requests", got.requests.Result, got.requests.Err)
			}
		}
		if ctx.Err() != nil {
			// Stopped: the optimizer may be gone, no series written now.
			return false
		}
		obs.Signals = lookSignals(pods, res.Values, reqs.Values)
	}
	alarm, ring := l.Book.Look(key, obs)
	if ring {
		l.Metrics.Alarms.WithLabelValues(tgt.namespace, tgt.service).Inc()
		logger.Info("A pod fell behind between cycles; running the cycle now", "pod", alarm.Pod, "why", alarm.Why)
	}
	return ring
}

// lookSignals are a look's signals: the recent latency and request rate
// of every pod with either answer (podSignals, NaN for the rest). A pod
// with a request rate but no latency (it completed none over the window)
// still counts in what the Service sent per share of weight, as at a
// cycle.
func lookSignals(pods []string, latency, requests map[string]float64) map[string]weights.Signal {
	out := make(map[string]weights.Signal, len(pods))
	podSignals(out, pods, answers{recentLatency: promsource.Result{Values: latency}, recentRequests: promsource.Result{Values: requests}}, false)
	for pod, s := range out {
		if math.IsNaN(s.RecentLatency) && math.IsNaN(s.RecentRequests) {
			delete(out, pod)
		}
	}
	return out
}

// podNames lists the pods of endpoints, in their order.
func podNames(eps []desired.Endpoint) []string {
	pods := make([]string, 0, len(eps))
	for _, ep := range eps {
		pods = append(pods, ep.Pod)
	}
	return pods
}

// cycle runs one optimization: query, compute (the policy's cycle), record,
// wake the mirror.
func (l *WeightLoop) cycle(ctx context.Context, logger logr.Logger, key types.NamespacedName, tgt target, s Settings) {
	pods := podNames(l.Book.Endpoints(key))
	if len(pods) == 0 {
		return
	}
	obs, avail, ok := l.observe(ctx, logger, key, tgt, s, pods, l.Clock.Now())
	if !ok {
		return
	}
	out, eps, ok := l.Book.Cycle(key, obs, s.DryRun)
	if !ok {
		return
	}
	for _, ep := range eps {
		if !(ep.Cores > 0) {
			avail.NoLimitPods++
		}
	}
	out.Signals = l.Book.noteSignals(key, avail)
	l.publish(tgt, eps, obs, out, s.Params.MaxRatio)
	if out.Result.Changed {
		logger.Info("Weights changed", "mode", out.Result.Mode, "dryRun", s.DryRun, "early", out.Early, "message", out.Result.Message)
	}
	select {
	case l.Wake <- event.GenericEvent{Object: wakeObject(key)}:
	case <-ctx.Done():
	}
}

// observe runs the cycle's queries for pods: the engine's observation and
// which signals had data. false: the cycle was stopped (the optimizer was
// deleted or the manager is stopping), and nothing may be recorded.
func (l *WeightLoop) observe(ctx context.Context, logger logr.Logger, key types.NamespacedName, tgt target, s Settings, pods []string, now time.Time) (weights.Observation, Signals, bool) {
	qt := promsource.Target{Namespace: tgt.namespace, Service: tgt.service, Pods: pods, Window: s.Params.QueryWindow}
	obs := weights.Observation{Time: now, Signals: make(map[string]weights.Signal, len(pods))}

	// One request for every signal where the source can combine them:
	// the cycle's load on the backend does not grow with its signals.
	qs := cycleQueries(s, qt)
	parts := make([]promsource.Part, len(qs))
	for i, q := range qs {
		parts[i] = q.part
	}
	got := l.queryParts(ctx, parts, now, true)
	cpu, err := got[0].Result, got[0].Err
	if ctx.Err() != nil {
		// Stopped (the optimizer was deleted or the manager is stopping):
		// nothing to count, and a series written now would outlive the
		// deletion's ForgetOptimizer.
		return obs, Signals{}, false
	}
	l.Metrics.QueryLatency.WithLabelValues(tgt.service, tgt.namespace).Set(cpu.Latency.Seconds())
	var emptyCPU *promsource.EmptyResultError
	if errors.As(err, &emptyCPU) {
		// The backend answered, with nothing for these pods: a query or
		// scrape problem for the user to fix, not an outage (NoData).
		l.Metrics.QueryErrors.WithLabelValues(tgt.namespace, tgt.service, "cpu", "empty").Inc()
		logger.Info("CPU query returned no data for the pods", "query", textutil.Printable(cpu.Query, textutil.LogLimit))
		err = nil
	}
	if err != nil {
		// The backend's words reach the status message: bounded, printable.
		obs.Err = textutil.Error(fmt.Errorf("CPU query: %w", err), textutil.StatusLimit)
		l.Metrics.QueryErrors.WithLabelValues(tgt.namespace, tgt.service, "cpu", queryErrorReason(err)).Inc()
		l.Metrics.ReconcileError(weightControllerName, "query", key.Name, key.Namespace)
		logger.Info("CPU query failed", "error", textutil.Printable(err.Error(), textutil.LogLimit))
	}
	a := answers{cpu: cpu}
	if obs.Err == nil {
		// Without CPU the cycle uses none of the others: they count
		// nothing either.
		for i := 1; i < len(qs); i++ {
			a.set(qs[i].signal, l.optionalAnswer(ctx, logger, tgt, qs[i].signal, got[i].Result, got[i].Err))
		}
	}
	// Series that were dropped (duplicates, NaN, no pod label, warnings)
	// do not fail the cycle, but the user must hear why a pod has no data.
	for _, r := range a.bySignal() {
		if issues := r.res.Err(); issues != nil {
			logger.Info("Query answer had problems; the affected series were ignored", "signal", r.signal,
				"query", textutil.Printable(r.res.Query, textutil.LogLimit), "problems", textutil.Printable(issues.Error(), textutil.LogLimit))
		}
	}
	if ctx.Err() != nil {
		return obs, Signals{}, false
	}
	podSignals(obs.Signals, pods, a, obs.Err == nil)
	return obs, signalsOf(s, obs.Err == nil && len(cpu.Values) > 0, a), true
}

// answers are one cycle's query results, one per signal; a signal that was
// not queried has an empty Result.
type answers struct {
	cpu, requests, latency, nodeCPU, recentCPU, recentLatency, recentRequests promsource.Result
}

// bySignal lists the answers under their signal names, as in
// optimizer_query_errors_total and optimizer_signal_available.
func (a answers) bySignal() []struct {
	signal string
	res    promsource.Result
} {
	return []struct {
		signal string
		res    promsource.Result
	}{{"cpu", a.cpu}, {"requests", a.requests}, {"latency", a.latency}, {"node_cpu", a.nodeCPU}, {"recent_cpu", a.recentCPU},
		{"recent_latency", a.recentLatency}, {"recent_requests", a.recentRequests}}
}

// recentWindow is the window of a recent query, which runs the query tmpl
// (the CPU, latency or request query) again over the last two scrape intervals
// (the shortest window in which rate() is sure to find two samples): a pod
// that has just reached its CPU limit, or fallen behind, shows it there a
// cycle before it does over the query window. 0 = not run: the query is
// off (""), the scrape interval is unknown (0), two of them are no shorter
// than the query window (the same query), or the query does not depend on
// its window (a recording rule: the same answer again).
func recentWindow(s Settings, tmpl string) time.Duration {
	si := s.Params.ScrapeInterval
	w := 2 * si
	if tmpl == "" || si <= 0 || w <= 0 || w >= s.Params.QueryWindow {
		return 0
	}
	probe := promsource.Target{Namespace: "ns", Service: "svc", Pods: []string{"pod-0"}, Window: s.Params.QueryWindow}
	full, err := promsource.Render(tmpl, probe)
	if err != nil {
		return 0 // the query itself reports it
	}
	probe.Window = w
	recent, err := promsource.Render(tmpl, probe)
	if err != nil || recent == full {
		return 0 // a window PromQL cannot express (below 1ms), or no window at all
	}
	return w
}

// podSignals fills into with each pod's signals from the answers; a pod
// without a value for a signal gets NaN (no data). CPU counts only when its
// query succeeded (cpuOK).
func podSignals(into map[string]weights.Signal, pods []string, a answers, cpuOK bool) {
	value := func(r promsource.Result, pod string) float64 {
		if v, ok := r.Values[pod]; ok {
			return v
		}
		return math.NaN()
	}
	for _, p := range pods {
		sig := weights.Signal{CPU: math.NaN(), Requests: value(a.requests, p), Latency: value(a.latency, p),
			NodeCPU: value(a.nodeCPU, p), RecentCPU: value(a.recentCPU, p), RecentLatency: value(a.recentLatency, p),
			RecentRequests: value(a.recentRequests, p)}
		if cpuOK {
			sig.CPU = value(a.cpu, p)
		}
		into[p] = sig
	}
}

func (l *WeightLoop) publish(tgt target, eps []desired.Endpoint, obs weights.Observation, out Outcome, maxRatio float64) {
	m := l.Metrics
	samples := make([]metrics.PodSample, 0, len(eps))
	for _, ep := range eps {
		s := metrics.PodSample{Pod: ep.Pod, IP: ep.Address, Locality: ep.Locality, Weight: out.Result.Weights[ep.Pod], Signals: true}
		if sig, ok := obs.Signals[ep.Pod]; ok {
			if !math.IsNaN(sig.CPU) {
				v := sig.CPU
				s.CPU = &v
			}
			if !math.IsNaN(sig.Requests) {
				v := sig.Requests
				s.RequestRate = &v
			}
		}
		if c, ok := out.Result.Capacity[ep.Pod]; ok {
			v := c
			s.Capacity = &v
		}
		samples = append(samples, s)
	}
	m.SetPods(tgt.namespace, tgt.service, samples)
	for signal, ok := range map[string]bool{"cpu": out.Signals.CPU, "requests": out.Signals.Requests, "latency": out.Signals.Latency, "node_cpu": out.Signals.NodeCPU,
		"recent_cpu": out.Signals.RecentCPU, "recent_latency": out.Signals.RecentLatency, "recent_requests": out.Signals.RecentRequests} {
		m.SignalAvailable.WithLabelValues(tgt.namespace, tgt.service, signal).Set(b2f(ok))
	}
	m.Cycles.WithLabelValues(tgt.namespace, tgt.service, string(out.Result.Mode)).Inc()
	m.SetMode(tgt.namespace, tgt.service, string(out.Result.Mode))
	m.WeightSpread.WithLabelValues(tgt.namespace, tgt.service).Set(spread(out.Result.Weights))
	m.MaxWeightRatio.WithLabelValues(tgt.namespace, tgt.service).Set(maxRatio)
	if out.Result.Mode == weights.ModeFallback && out.Result.Changed {
		m.Fallbacks.WithLabelValues(tgt.namespace, tgt.service).Inc()
	}
}

func spread(w map[string]uint32) float64 {
	lo, hi := uint32(math.MaxUint32), uint32(0)
	for _, v := range w {
		lo, hi = min(lo, v), max(hi, v)
	}
	if hi == 0 || lo == 0 {
		return 1
	}
	return float64(hi) / float64(lo)
}

func queryErrorReason(err error) string {
	var (
		unreachable *promsource.UnreachableError
		server      *promsource.ServerError
		empty       *promsource.EmptyResultError
		shape       *promsource.ResultTypeError
		bad         *promsource.BadResponseError
		tmpl        *promsource.TemplateError
		tooLarge    *promsource.ResponseTooLargeError
		tooLong     *promsource.QueryTooLongError
		cred        *promsource.CredentialsError
	)
	switch {
	case errors.As(err, &cred):
		return "credentials"
	case errors.As(err, &tooLarge):
		return "too_large"
	case errors.As(err, &tooLong):
		return "query_too_long"
	case errors.As(err, &unreachable):
		return "unreachable"
	case errors.As(err, &server):
		return "server_error"
	case errors.As(err, &empty):
		return "empty"
	case errors.As(err, &shape):
		return "result_type"
	case errors.As(err, &bad):
		return "bad_response"
	case errors.As(err, &tmpl):
		return "template"
	}
	return "other"
}

func wakeObject(key types.NamespacedName) *optv1.IstioAdaptiveRequestOptimizer {
	o := &optv1.IstioAdaptiveRequestOptimizer{}
	o.Namespace, o.Name = key.Namespace, key.Name
	return o
}
