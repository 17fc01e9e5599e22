package controllers

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
)

// Looks between cycles are batched: every optimizer's looks fall on shared
// instants (multiples of its look interval on the clock: lookInstant), and
// the looks due at one instant are answered by one call to the metrics
// source (lookBatches), which combines them into as few requests as fit
// (promsource.Source.QueryParts). A thousand optimizers that each look
// once a scrape interval (15 s by default) then cost the backend a few
// requests every 15 s, not nearly seventy a second.

// lookInstant is the shared instant of a look the policy has due at due:
// the multiple of the look interval iv at or before due, so the look runs
// no later than the policy asked (its rule that a look leaves a whole
// interval before the next cycle holds) and no earlier than the last look
// (which was at due-iv). A look long overdue (its worker was busy past
// the instant) runs at now, alone.
func lookInstant(due, now time.Time, iv time.Duration) time.Time {
	if iv <= 0 {
		return due
	}
	t := due.Truncate(iv)
	if now.Sub(t) > iv {
		return now
	}
	return t
}

// lookRequest is one optimizer's look: the latency template (tmpl) and
// the request template (reqTmpl, "" = not run) over the recent window for
// its pods.
type lookRequest struct {
	tmpl, reqTmpl string
	target        promsource.Target
	timeout       time.Duration
}

// lookQuery is one of a look's queries: which (0 the latency's, 1 the
// requests') of key's look.
type lookQuery struct {
	key   types.NamespacedName
	which int
}

// lookAnswers are one look's answers; requests is empty when its query
// was not run.
type lookAnswers struct {
	latency, requests promsource.PartResult
}

// lookBatches gathers the looks of one instant. A worker that will look at
// instant t says so (expect) before it waits for t, and joins when t comes
// or withdraws (unexpect) when it is woken for something else or stopped;
// the batch runs when every worker expected at t has joined, in one call,
// and each joined worker gets its own answer. Batching waits for no clock:
// only for workers already due at the same instant.
type lookBatches struct {
	mu sync.Mutex
	at map[time.Time]*lookBatch
}

type lookBatch struct {
	at       time.Time
	expected map[types.NamespacedName]bool
	joined   map[types.NamespacedName]lookRequest

	mu sync.Mutex
	// ready[key] is closed once answers[key] holds every answer the look
	// waits for (pending[key] of them are still out): each look gets its
	// answers as soon as its own templates' queries return, whatever the
	// other templates of the batch take.
	ready   map[types.NamespacedName]chan struct{}
	pending map[types.NamespacedName]int
	answers map[types.NamespacedName]*lookAnswers
}

func (b *lookBatches) batch(t time.Time) *lookBatch {
	if b.at == nil {
		b.at = map[time.Time]*lookBatch{}
	}
	lb := b.at[t]
	if lb == nil {
		lb = &lookBatch{at: t, expected: map[types.NamespacedName]bool{}, joined: map[types.NamespacedName]lookRequest{},
			ready: map[types.NamespacedName]chan struct{}{}, pending: map[types.NamespacedName]int{},
			answers: map[types.NamespacedName]*lookAnswers{}}
		b.at[t] = lb
	}
	return lb
}

// expect records that key's worker will look at t.
func (b *lookBatches) expect(t time.Time, key types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batch(t).expected[key] = true
}

// unexpect withdraws key from the looks at t; the batch runs if the others
// expected there have all joined. run starts a batch that is complete.
func (b *lookBatches) unexpect(t time.Time, key types.NamespacedName, run func(*lookBatch)) {
	b.mu.Lock()
	lb := b.at[t]
	if lb == nil {
		b.mu.Unlock()
		return
	}
	delete(lb.expected, key)
	if len(lb.expected) == 0 && len(lb.joined) == 0 {
		// Every worker withdrew: nothing to run, nothing to keep.
		delete(b.at, t)
		b.mu.Unlock()
		return
	}
	ready := b.readyLocked(lb)
	b.mu.Unlock()
	if ready {
		go run(lb)
	}
}

// join adds key's look to the batch at t and returns the batch to wait on.
func (b *lookBatches) join(t time.Time, key types.NamespacedName, req lookRequest, run func(*lookBatch)) *lookBatch {
	b.mu.Lock()
	lb := b.batch(t)
	lb.expected[key] = true
	lb.joined[key] = req
	lb.mu.Lock()
	if lb.ready[key] == nil {
		lb.ready[key] = make(chan struct{})
		lb.answers[key] = &lookAnswers{}
		lb.pending[key] = 1
		if req.reqTmpl != "" {
			lb.pending[key] = 2
		}
	}
	lb.mu.Unlock()
	ready := b.readyLocked(lb)
	b.mu.Unlock()
	if ready {
		go run(lb)
	}
	return lb
}

// readyLocked: every expected worker has joined (and one has): the batch
// leaves the map, so a late look at the same instant starts another.
func (b *lookBatches) readyLocked(lb *lookBatch) bool {
	if len(lb.joined) == 0 || len(lb.joined) < len(lb.expected) {
		return false
	}
	for k := range lb.expected {
		if _, ok := lb.joined[k]; !ok {
			return false
		}
	}
	if b.at[lb.at] == lb {
		delete(b.at, lb.at)
	}
	return true
}

// answer waits for key's answers in the batch (key has joined it), or ctx.
func (lb *lookBatch) answer(ctx context.Context, key types.NamespacedName) (lookAnswers, bool) {
	lb.mu.Lock()
	ready := lb.ready[key]
	lb.mu.Unlock()
	select {
	case <-ready:
		lb.mu.Lock()
		defer lb.mu.Unlock()
		return *lb.answers[key], true
	case <-ctx.Done():
		return lookAnswers{}, false
	}
}

// deliver gives q's look that query's answer.
func (lb *lookBatch) deliver(q lookQuery, r promsource.PartResult) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	a := lb.answers[q.key]
	if a == nil || lb.pending[q.key] <= 0 {
		return
	}
	if q.which == 0 {
		a.latency = r
	} else {
		a.requests = r
	}
	if lb.pending[q.key]--; lb.pending[q.key] == 0 {
		close(lb.ready[q.key])
	}
}

// runLookBatch answers every look of a batch, evaluated at its instant.
func (l *WeightLoop) runLookBatch(lb *lookBatch) {
	ctx := l.loopContext()
	timeout := time.Duration(0)
	for _, r := range lb.joined {
		if timeout == 0 || r.timeout < timeout {
			timeout = r.timeout
		}
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	l.answerLooks(ctx, lb.joined, lb.at, lb.deliver)
}

// loopContext is the loop's context (Start's), or Background before Start.
func (l *WeightLoop) loopContext() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx != nil {
		return l.ctx
	}
	return context.Background()
}

// answerLooks queries the looks at now and delivers each query its answer
// as soon as it returns. The looks with the same templates run in one call
// (planLooks: one part per template and namespace); different templates,
// which are different teams' queries, never share a request and run at
// once, so one team's slow or broken query delays or fails only its own
// looks.
func (l *WeightLoop) answerLooks(ctx context.Context, reqs map[types.NamespacedName]lookRequest, now time.Time, deliver func(lookQuery, promsource.PartResult)) {
	type templates struct{ latency, requests string }
	byTmpl := map[templates]map[lookQuery]lookRequest{}
	for k, r := range reqs {
		ts := templates{r.tmpl, r.reqTmpl}
		if byTmpl[ts] == nil {
			byTmpl[ts] = map[lookQuery]lookRequest{}
		}
		one := r
		one.reqTmpl = ""
		byTmpl[ts][lookQuery{k, 0}] = one
		if r.reqTmpl != "" {
			one.tmpl = r.reqTmpl
			byTmpl[ts][lookQuery{k, 1}] = one
		}
	}
	var wg sync.WaitGroup
	for _, group := range byTmpl {
		wg.Go(func() {
			parts, of := planLooks(group, func(a, b lookQuery) int {
				if c := strings.Compare(a.key.String(), b.key.String()); c != 0 {
					return c
				}
				return a.which - b.which
			})
			got := l.queryParts(ctx, parts, now, false)
			for q, r := range group {
				deliver(q, lookAnswer(got[of[q]], r.target.Pods))
			}
		})
	}
	// The batch's context (its timeout) lives until the last query is done.
	wg.Wait()
}

// planLooks merges looks into as few parts as they allow: the looks of one
// namespace over one window are one part for all their pods (pod names are
// unique in a namespace; a pod two optimizers share is asked for once),
// unless the template names the Service or the host, which then splits
// them by Service. of maps each look to its part; order fixes the order
// of the looks, so that the same looks make the same query.
func planLooks[K comparable](reqs map[K]lookRequest, order func(a, b K) int) ([]promsource.Part, map[K]int) {
	type mergeKey struct {
		tmpl, namespace, service string
		window                   time.Duration
	}
	keys := make([]K, 0, len(reqs))
	for k := range reqs {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, order)
	var parts []promsource.Part
	of := make(map[K]int, len(reqs))
	index := map[mergeKey]int{}
	seen := map[int]map[string]bool{}
	for _, k := range keys {
		r := reqs[k]
		mk := mergeKey{tmpl: r.tmpl, namespace: r.target.Namespace, window: r.target.Window}
		if strings.Contains(r.tmpl, ".Service") || strings.Contains(r.tmpl, ".Host") {
			mk.service = r.target.Service
		}
		i, ok := index[mk]
		if !ok {
			i = len(parts)
			index[mk] = i
			t := r.target
			t.Pods = nil
			parts = append(parts, promsource.Part{Template: r.tmpl, Target: t})
			seen[i] = map[string]bool{}
		}
		for _, p := range r.target.Pods {
			if !seen[i][p] {
				seen[i][p] = true
				parts[i].Target.Pods = append(parts[i].Target.Pods, p)
			}
		}
		of[k] = i
	}
	return parts, of
}

// lookAnswer is one look's share of its part's answer: the values of its
// own pods. A part that answered none of them is empty for this look.
func lookAnswer(got promsource.PartResult, pods []string) promsource.PartResult {
	if got.Err != nil {
		return got
	}
	res := got.Result
	res.Values = make(map[string]float64, len(pods))
	res.Missing, res.Issues = nil, nil
	for _, p := range pods {
		if v, ok := got.Result.Values[p]; ok {
			res.Values[p] = v
		} else {
			res.Missing = append(res.Missing, p)
		}
	}
	if len(res.Values) == 0 {
		return promsource.PartResult{Result: res, Err: &promsource.EmptyResultError{Query: res.Query}}
	}
	return promsource.PartResult{Result: res}
}
