package controllers

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

func TestLookInstant(t *testing.T) {
	base := time.Unix(1_700_000_000, 0) // a multiple of 5 s
	iv := 5 * time.Second
	cases := map[string]struct {
		due, now, want time.Time
	}{
		"due on the grid":             {base.Add(10 * time.Second), base.Add(7 * time.Second), base.Add(10 * time.Second)},
		"due between: the one before": {base.Add(8 * time.Second), base.Add(4 * time.Second), base.Add(5 * time.Second)},
		"a timer that fired late":     {base.Add(8 * time.Second), base.Add(5*time.Second + 300*time.Millisecond), base.Add(5 * time.Second)},
		"long overdue: now, alone":    {base.Add(8 * time.Second), base.Add(20 * time.Second), base.Add(20 * time.Second)},
	}
	for name, tc := range cases {
		if got := lookInstant(tc.due, tc.now, iv); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", name, got.Sub(base), tc.want.Sub(base))
		}
	}
}

// The looks of one namespace are one part for all their pods (a pod two
// optimizers share asked for once); other namespaces and windows are parts
// of their own, and a template that names the Service splits by Service.
// Each look gets the values of its own pods only.
func TestPlanLooksMergesByNamespace(t *testing.T) {
	lat := promsource.DefaultLatencyQuery
	byService := `sum by (pod) (x{service="{{.Service}}", pod=~"{{.Pods}}"})`
	req := func(ns, svc, tmpl string, pods ...string) lookRequest {
		return lookRequest{tmpl: tmpl, target: promsource.Target{Namespace: ns, Service: svc, Pods: pods, Window: 30 * time.Second}}
	}
	k := func(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }
	reqs := map[types.NamespacedName]lookRequest{
		k("shop", "web"):  req("shop", "web", lat, "web-0", "web-1"),
		k("shop", "api"):  req("shop", "api", lat, "api-0", "web-1"),
		k("blog", "web"):  req("blog", "web", lat, "web-0"),
		k("shop", "cart"): req("shop", "cart", byService, "cart-0"),
		k("shop", "pay"):  req("shop", "pay", byService, "pay-0"),
	}
	parts, of := planLooks(reqs, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	if len(parts) != 4 {
		t.Fatalf("%d parts, want 4 (shop, blog, and the two Services of the template that names its Service): %+v", len(parts), parts)
	}
	shop := parts[of[k("shop", "web")]]
	if of[k("shop", "api")] != of[k("shop", "web")] || !slices.Equal(shop.Target.Pods, []string{"api-0", "web-1", "web-0"}) {
		t.Errorf("shop's looks: part %+v, want one part for api-0, web-1 and web-0", shop)
	}
	if of[k("blog", "web")] == of[k("shop", "web")] || of[k("shop", "cart")] == of[k("shop", "pay")] {
		t.Errorf("parts %v: another namespace or Service shares a part", of)
	}
	got := promsource.PartResult{Result: promsource.Result{Values: map[string]float64{"api-0": 1, "web-1": 2, "web-0": 3}}}
	if a := lookAnswer(got, []string{"web-0", "web-1", "web-9"}); a.Err != nil || len(a.Result.Values) != 2 || a.Result.Values["web-0"] != 3 ||
		!slices.Equal(a.Result.Missing, []string{"web-9"}) {
		t.Errorf("web's share: %+v", a)
	}
	if a := lookAnswer(got, []string{"gone-0"}); a.Err == nil {
		t.Errorf("a look none of whose pods were answered: %+v, want empty", a)
	}
}

// learnedFleet is learnedLoop for several optimizers (four pods each) in
// one book, behind one source that combines queries.
func learnedFleet(t *testing.T, clk *clocktesting.FakeClock, keys []types.NamespacedName) (*WeightLoop, *partsFleet, Settings) {
	t.Helper()
	s, err := settingsFor(optimizerFor("ns", "web"), DefaultEngineDefaults())
	if err != nil {
		t.Fatal(err)
	}
	book := NewWeightBook()
	for _, key := range keys {
		var eps []desired.Endpoint
		for i := range 4 {
			eps = append(eps, desired.Endpoint{Pod: fmt.Sprintf("%s-%d", key.Name, i), Cores: 2, Weight: 1000})
		}
		book.Configure(key, clk.Now(), s)
		book.Applied(key, s.Params, clk.Now(), eps)
	}
	src := &partsFleet{fleetSource: &fleetSource{s: s, recent: map[string]float64{}}}
	loop := &WeightLoop{Source: src, Book: book, Clock: clk, Metrics: metrics.New(), Wake: make(chan event.GenericEvent, 1000)}
	for range 6 {
		clk.Step(2 * time.Minute)
		for _, key := range keys {
			loop.cycle(context.Background(), logr.Discard(), key, target{key.Namespace, key.Name}, s)
			if out := book.Outcome(key); out != nil && out.Result.Changed {
				book.Applied(key, s.Params, clk.Now(), withWeights(book.Endpoints(key), out.Result.Weights))
			}
		}
	}
	for _, key := range keys {
		if !book.LookWanted(key) {
			t.Fatalf("%s: no look wanted after learning", key)
		}
	}
	src.calls = nil
	return loop, src, s
}

// isLook: a call of looks only (the recent latency and requests), not a
// cycle's.
func isLook(parts []promsource.Part, s Settings) bool {
	for _, p := range parts {
		if (p.Template != s.LatencyQuery && p.Template != s.RequestQuery) || p.Target.Window != s.RecentLatencyWindow {
			return false
		}
	}
	return true
}

// The looks of optimizers whose cycles are spread by their jitter fall on
// shared instants, and all the looks of one instant are one call to the
// source, one part per namespace and query (latency, requests): six
// optimizers in two namespaces make one call per instant, not six.
func TestLooksOfManyOptimizersAreOneCall(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	var keys []types.NamespacedName
	for i := range 6 {
		keys = append(keys, types.NamespacedName{Namespace: []string{"shop", "blog"}[i%2], Name: fmt.Sprintf("svc%d", i)})
	}
	loop, src, s := learnedFleet(t, clk, keys)
	// A minute's cycle: every optimizer looks at least twice between two
	// cycles, whatever its jitter (half a scrape interval either way).
	s.Cycle = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = loop.Start(ctx) }()
	for _, key := range keys {
		opt := optimizerFor(key.Namespace, key.Name)
		loop.Ensure(opt, s)
	}
	// Each runs its first cycle at once (due since the last learning
	// round), then looks until its next.
	for stepped := time.Duration(0); stepped < s.Cycle/2; stepped += time.Second {
		// Every worker at its timer: none is late for an instant.
		waitFor(t, func() bool { return clk.Waiters() == len(keys) })
		clk.Step(time.Second)
	}
	time.Sleep(100 * time.Millisecond)
	src.mu.Lock()
	defer src.mu.Unlock()
	var looks [][]promsource.Part
	for _, c := range src.calls {
		if isLook(c, s) {
			looks = append(looks, c)
		}
	}
	if len(looks) < 2 {
		t.Fatalf("%d look calls in %v (%d calls in all)", len(looks), s.Cycle/2, len(src.calls))
	}
	for i, c := range looks {
		pods := map[string]int{}
		for _, p := range c {
			pods[p.Template] += len(p.Target.Pods)
		}
		if len(c) != 4 || pods[s.LatencyQuery] != 4*len(keys) || pods[s.RequestQuery] != 4*len(keys) {
			t.Errorf("look call %d: %d parts for %v pods, want the 2 namespaces' parts of each query for all %d pods", i, len(c), pods, 4*len(keys))
		}
	}
	if src.single != 0 {
		t.Errorf("%d single queries, want every query combined", src.single)
	}
	t.Logf("%d look calls for %d optimizers in %v", len(looks), len(keys), s.Cycle/2)
}

// A stopped optimizer (Stalled: the mirror stops its worker at every
// reconcile, after ensuring it) sends no query, however often it is
// reconciled and however long it stays so; endpoints applied again resume
// its cycles.
func TestStalledOptimizerDoesNotQuery(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
	key := types.NamespacedName{Namespace: "shop", Name: "web"}
	loop, src, s := learnedFleet(t, clk, []types.NamespacedName{key})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = loop.Start(ctx) }()
	opt := optimizerFor(key.Namespace, key.Name)
	calls := func() int {
		src.mu.Lock()
		defer src.mu.Unlock()
		return len(src.calls) + src.single
	}
	loop.Stop(key) // Stalled
	for range 10 {
		// A reconcile of the Stalled optimizer: ensure, then stop.
		loop.Ensure(opt, s)
		time.Sleep(10 * time.Millisecond)
		loop.Stop(key)
		clk.Step(s.Cycle)
	}
	time.Sleep(50 * time.Millisecond)
	if n := calls(); n != 0 {
		t.Fatalf("%d queries while Stalled, want none", n)
	}
	// The problem is fixed: the mirror applies endpoints and pokes.
	loop.Ensure(opt, s)
	loop.Book.Applied(key, s.Params, clk.Now(), loop.Book.Endpoints(key))
	loop.Poke(key)
	waitFor(t, func() bool { return calls() > 0 })
}

// A batch runs once every worker expected at its instant has joined or
// withdrawn, and is forgotten then, as is one every worker withdrew from.
func TestLookBatchRunsWhenAllExpectedAreIn(t *testing.T) {
	var b lookBatches
	at := time.Unix(1_700_000_000, 0)
	a, c := types.NamespacedName{Namespace: "ns", Name: "a"}, types.NamespacedName{Namespace: "ns", Name: "c"}
	ran := make(chan *lookBatch, 2)
	run := func(lb *lookBatch) { ran <- lb }
	b.expect(at, a)
	b.expect(at, c)
	lb := b.join(at, a, lookRequest{}, run)
	select {
	case <-ran:
		t.Fatal("the batch ran before c joined or withdrew")
	case <-time.After(50 * time.Millisecond):
	}
	b.unexpect(at, c, run)
	select {
	case got := <-ran:
		if got != lb || len(got.joined) != 1 {
			t.Errorf("ran %+v, want a's batch with a alone", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the batch did not run once c withdrew")
	}
	b.expect(at.Add(time.Second), c)
	b.unexpect(at.Add(time.Second), c, run)
	if len(b.at) != 0 {
		t.Errorf("%d batches kept, want none", len(b.at))
	}
}

// hangingSource answers the template "fast" at once and blocks on any
// other until the query's context ends.
type hangingSource struct{}

func (hangingSource) Query(ctx context.Context, tmpl string, t promsource.Target, _ time.Time) (promsource.Result, error) {
	if tmpl != "fast" {
		<-ctx.Done()
		return promsource.Result{}, ctx.Err()
	}
	v := map[string]float64{}
	for _, p := range t.Pods {
		v[p] = 0.01
	}
	return promsource.Result{Query: tmpl, Values: v}, nil
}

// Two teams' looks at one instant, one of whose backends hangs: the other
// gets its answer as soon as its own query returns, not when the batch's
// slowest query gives up.
func TestALookIsNotHeldByAnotherTeamsSlowQuery(t *testing.T) {
	l := &WeightLoop{Source: hangingSource{}, Metrics: metrics.New()}
	at := time.Unix(1_700_000_000, 0)
	fast, slow := types.NamespacedName{Namespace: "a", Name: "fast"}, types.NamespacedName{Namespace: "b", Name: "slow"}
	l.looks.expect(at, fast)
	l.looks.expect(at, slow)
	target := func(ns string) promsource.Target {
		return promsource.Target{Namespace: ns, Service: "web", Pods: []string{"web-0"}, Window: 30 * time.Second}
	}
	lb := l.looks.join(at, fast, lookRequest{tmpl: "fast", target: target("a"), timeout: 10 * time.Second}, l.runLookBatch)
	l.looks.join(at, slow, lookRequest{tmpl: "slow", target: target("b"), timeout: 10 * time.Second}, l.runLookBatch)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	got, ok := lb.answer(ctx, fast)
	if !ok || got.latency.Err != nil || got.latency.Result.Values["web-0"] != 0.01 {
		t.Fatalf("the fast look: answered %v, %+v: want its answer before the slow query's timeout", ok, got)
	}
}

// A look's signals hold every pod with either answer: a pod that completed
// no request over the window (no latency) but has a request rate still
// counts in what the Service sent per share, as at a cycle; a pod with
// neither is left out, and the fields a look does not ask are NaN.
func TestLookSignalsKeepPodsWithRequestsAlone(t *testing.T) {
	got := lookSignals([]string{"a", "b", "c", "d"},
		map[string]float64{"a": 0.5, "b": 0.1},
		map[string]float64{"a": 2, "c": 3})
	if len(got) != 3 {
		t.Fatalf("signals for %d pods, want a, b and c: %v", len(got), got)
	}
	for pod, want := range map[string][2]float64{"a": {0.5, 2}, "b": {0.1, math.NaN()}, "c": {math.NaN(), 3}} {
		s := got[pod]
		same := func(x, y float64) bool { return x == y || (math.IsNaN(x) && math.IsNaN(y)) }
		if !same(s.RecentLatency, want[0]) || !same(s.RecentRequests, want[1]) {
			t.Errorf("%s: recent latency %v, requests %v; want %v, %v", pod, s.RecentLatency, s.RecentRequests, want[0], want[1])
		}
		if !math.IsNaN(s.CPU) || !math.IsNaN(s.Requests) || !math.IsNaN(s.Latency) {
			t.Errorf("%s: %+v, want NaN for what a look does not ask", pod, s)
		}
	}
}
