package generated

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/yaml"

	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// TestAlertRules loads the PrometheusRule of config/prometheus/alerts.yaml
// into a real Prometheus (bin/prometheus, `make prometheus`) that scrapes the
// operator's own metrics package, exported on loopback and set up as a handful
// of services would look in trouble (and one healthy), and checks that each
// alert becomes active for exactly the situations it is meant for. Alerts
// with a `for` clause are pending, not firing, within the test; what is
// checked is that their expressions match the series the operator exports.
// It also checks that every alert links to an existing section of
// docs/troubleshooting.md, and (subtest dashboard) that every query of the
// Grafana dashboard is valid PromQL that finds the operator's series.
func TestAlertRules(t *testing.T) {
	root := repoRoot(t)
	groups, rules := readAlertRules(t, root)
	checkAlertsInstalled(t, root)
	checkRunbooks(t, root, rules)
	checkManagerDownJob(t, root, rules)

	rulesPath := filepath.Join(t.TempDir(), "rules.json")
	data, err := json.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rulesPath, data, 0o600); err != nil {
		t.Fatal(err)
	}

	addr := serveSituations(t)
	p := harness.MustStartPrometheus(t, harness.PrometheusOptions{
		Targets: []string{addr},
		// Reload to add the rules; pass targets to the scrape manager at
		// once instead of after 5s.
		ExtraArgs: []string{"--web.enable-lifecycle", "--scrape.discovery-reload-interval=100ms"},
	})
	loadRuleFile(t, p, rulesPath)

	// Which alerts each situation must raise: alertname/<service, optimizer or
	// nothing>. Services not listed (healthy, idle) must raise none.
	want := []string{
		"IstioAdaptiveOptimizerFallback/fallback",
		"IstioAdaptiveOptimizerMetricsBackendFailing/failing",
		"IstioAdaptiveOptimizerMetricsMissing/empty",
		"IstioAdaptiveOptimizerMetricsMissing/nodata",
		"IstioAdaptiveOptimizerReconcilerErrors/broken",
		"IstioAdaptiveOptimizerWeightSpreadAtLimit/wide",
		"IstioAdaptiveOptimizerWeightSpreadAtLimit/wide10",
		"IstioAdaptiveOptimizerNoCycles/stuck",
		"IstioAdaptiveOptimizerServiceEntryWriteStorm/storm",
		// The test's scrape job is not the manager's, so the manager is "down".
		"IstioAdaptiveOptimizerManagerDown/",
	}
	sort.Strings(want)
	for _, w := range want {
		name, _, _ := strings.Cut(w, "/")
		if !slices.Contains(rules, name) {
			t.Errorf("config/prometheus/alerts.yaml has no alert %s", name)
		}
	}

	// Rates need two scrapes, so some alerts start late and some (NoCycles
	// for services whose cycles counter has one sample) are active at first:
	// wait until the set is right and stays right over two evaluations.
	deadline := time.Now().Add(30 * time.Second)
	var got []string
	var stable int
	var last string
	for {
		state, err := alertState(p)
		switch {
		case err != nil:
			last, stable = err.Error(), 0
		case len(state.unhealthy) > 0 || state.rules != len(rules):
			last, stable = fmt.Sprintf("%d of %d alert rules loaded; not evaluated or failing: %v", state.rules, len(rules), state.unhealthy), 0
		default:
			got = state.active
			if slices.Equal(got, want) {
				stable++
			} else {
				stable = 0
			}
			var missing, extra []string
			for _, w := range want {
				if !slices.Contains(got, w) {
					missing = append(missing, w)
				}
			}
			for _, g := range got {
				if !slices.Contains(want, g) {
					extra = append(extra, g)
				}
			}
			last = fmt.Sprintf("alerts that should be active but are not: %v; active but should not be: %v", missing, extra)
		}
		if stable >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("alerts did not settle: %s", last)
		}
		time.Sleep(time.Second)
	}

	t.Run("dashboard", func(t *testing.T) { checkDashboard(t, root, p) })
}

// readAlertRules returns the rule groups of the PrometheusRule and the names
// of its alerts.
func readAlertRules(t *testing.T, root string) ([]any, []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var obj struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			Groups []any `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatalf("config/prometheus/alerts.yaml: %v", err)
	}
	if obj.APIVersion != "monitoring.coreos.com/v1" || obj.Kind != "PrometheusRule" {
		t.Fatalf("config/prometheus/alerts.yaml is %s %s, want monitoring.coreos.com/v1 PrometheusRule", obj.APIVersion, obj.Kind)
	}
	var typed []struct {
		Rules []struct {
			Alert       string            `json:"alert"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	}
	raw, _ := json.Marshal(obj.Spec.Groups)
	if err := json.Unmarshal(raw, &typed); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range typed {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if slices.Contains(names, r.Alert) {
				t.Errorf("alert %s is defined twice", r.Alert)
			}
			names = append(names, r.Alert)
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, a)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" && s != "info" {
				t.Errorf("alert %s has severity %q, want warning, critical or info", r.Alert, s)
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("config/prometheus/alerts.yaml defines no alert")
	}
	return obj.Spec.Groups, names
}

// checkAlertsInstalled makes sure kustomize (and so `kubectl apply -k
// config/prometheus`) installs the rules.
func checkAlertsInstalled(t *testing.T, root string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(k.Resources, "alerts.yaml") {
		t.Errorf("config/prometheus/kustomization.yaml resources %v lack alerts.yaml", k.Resources)
	}
}

// checkRunbooks checks that every alert's runbook_url points at a section of
// docs/troubleshooting.md that exists, named after the alert.
func checkRunbooks(t *testing.T, root string, alerts []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatalf("the alerts' runbook: %v", err)
	}
	anchors := markdownAnchors(string(doc))
	urls := regexp.MustCompile(`runbook_url:\s*(\S+)`).FindAllStringSubmatch(string(data), -1)
	if len(urls) != len(alerts) {
		t.Errorf("%d runbook_url annotations for %d alerts", len(urls), len(alerts))
	}
	for _, m := range urls {
		_, anchor, ok := strings.Cut(m[1], "docs/troubleshooting.md#")
		if !ok {
			t.Errorf("runbook_url %s does not point into docs/troubleshooting.md", m[1])
			continue
		}
		if !anchors[anchor] {
			t.Errorf("runbook_url %s: docs/troubleshooting.md has no heading with anchor #%s", m[1], anchor)
		}
	}
	for _, a := range alerts {
		if !anchors[strings.ToLower(a)] {
			t.Errorf("docs/troubleshooting.md has no section for alert %s", a)
		}
	}
}

// markdownAnchors returns the anchors GitHub gives the headings of a
// Markdown document: lower case, punctuation dropped, spaces to dashes.
func markdownAnchors(doc string) map[string]bool {
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		out[b.String()] = true
	}
	return out
}

// checkManagerDownJob makes sure the ManagerDown alert watches the job a
// ServiceMonitor gives the manager's metrics Service as config/default
// installs it (the job label is the Service's name).
func checkManagerDownJob(t *testing.T, root string, alerts []string) {
	t.Helper()
	if !slices.Contains(alerts, "IstioAdaptiveOptimizerManagerDown") {
		return
	}
	runMake(t, root, "kustomize")
	var svc string
	for _, o := range kustomizeBuild(t, root, "config/default") {
		if o.GetKind() == "Service" && strings.HasSuffix(o.GetName(), "metrics-service") {
			svc = o.GetName()
		}
	}
	if svc == "" {
		t.Fatal("config/default renders no metrics Service")
	}
	data, err := os.ReadFile(filepath.Join(root, "config", "prometheus", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `up{job="`+svc+`"}`) {
		t.Errorf("IstioAdaptiveOptimizerManagerDown does not watch up{job=%q}, the manager's metrics Service", svc)
	}
}

// serveSituations exports the operator's metrics (package metrics, as the
// manager registers them) on a loopback port, set up as these services:
//
//	healthy   optimizing, everything normal
//	fallback  weights fell back to equal
//	failing   the metrics backend is unreachable (holding)
//	empty     the CPU query returns no series (holding)
//	nodata    the engine found no CPU data (NoData)
//	wide      a pod estimated at a twentieth of the mean capacity or less
//	wide10    max_weight_ratio 10, a pod at 0.08 of the mean capacity, under
//	          a tenth: an alert (the live weights still at ratio 20's scale)
//	near      a pod at 0.06 of the mean capacity, over a twentieth: none
//	lowload   the weights spread 58x (low load leans to the fast pods), the
//	          capacities within 3x: no alert
//	stuck     endpoints but no optimization cycles
//	storm     the ServiceEntry is rewritten 10 times a second
//	idle      no endpoints and no cycles
//
// plus reconciler errors of optimizer team-a/broken (rising), team-a/flaky
// (one, long ago) and query errors of the weight loop (not a reconcile error
// to alert on: the backend alerts cover them).
func serveSituations(t *testing.T) string {
	t.Helper()
	const ns = "shop"
	m := metrics.New()
	reg := prometheus.NewRegistry()
	if err := m.Register(reg); err != nil {
		t.Fatal(err)
	}
	services := []string{"healthy", "fallback", "failing", "empty", "nodata", "wide", "wide10", "near", "lowload", "stuck", "storm", "idle"}
	mode := map[string]string{
		"healthy": "Optimizing", "fallback": "Fallback", "failing": "Holding", "empty": "Holding",
		"nodata": "NoData", "wide": "Optimizing", "wide10": "Steady", "near": "Steady", "lowload": "Steady", "storm": "Optimizing",
	}
	// Weights (mean 2000: max_weight_ratio 20) and relative capacity
	// estimates (mean 1) where they are not the default's, and the ratio
	// where it is not 20.
	weights := map[string][]uint32{"wide": {100, 2950, 2950}, "wide10": {120, 2940, 2940}, "near": {120, 2940, 2940}, "lowload": {100, 100, 5800}}
	ratio := map[string]float64{"wide10": 10}
	capacities := map[string][]float64{"wide": {0.045, 1.4, 1.555}, "wide10": {0.08, 1.46, 1.46}, "near": {0.06, 1.47, 1.47}, "lowload": {0.6, 0.9, 1.5}}
	f := func(v float64) *float64 { return &v }
	for i, svc := range services {
		if svc == "idle" {
			m.ServiceEndpoints.WithLabelValues(ns, svc).Set(0)
			continue
		}
		var pods []metrics.PodSample
		for j := range 3 {
			w, c := uint32(1600+400*j), 0.8+0.2*float64(j)
			if ws := weights[svc]; ws != nil {
				w, c = ws[j], capacities[svc][j]
			}
			pods = append(pods, metrics.PodSample{
				Pod: fmt.Sprintf("%s-%d", svc, j), IP: fmt.Sprintf("127.0.%d.%d", i+1, j+1),
				Locality: "eu/eu-1a/", Weight: w, Signals: true,
				CPU: f(0.4 + 0.1*float64(j)), RequestRate: f(100), Capacity: f(c),
			})
		}
		m.SetPods(ns, svc, pods)
		m.ServiceEndpoints.WithLabelValues(ns, svc).Set(3)
		m.QueryLatency.WithLabelValues(svc, ns).Set(0.05)
		m.WeightSpread.WithLabelValues(ns, svc).Set(1.5)
		m.MaxWeightRatio.WithLabelValues(ns, svc).Set(cmp.Or(ratio[svc], 20))
		if md := mode[svc]; md != "" {
			m.SetMode(ns, svc, md)
		}
	}
	m.WeightSpread.WithLabelValues(ns, "wide").Set(29.5)
	m.WeightSpread.WithLabelValues(ns, "lowload").Set(58)
	// Series that exist at zero must not alert.
	m.QueryErrors.WithLabelValues(ns, "healthy", "cpu", "unreachable").Add(0)
	m.Fallbacks.WithLabelValues(ns, "healthy").Add(0)
	m.Fallbacks.WithLabelValues(ns, "fallback").Inc()
	m.Writes.WithLabelValues(ns, "healthy", "ServiceEntry").Add(4)
	m.Writes.WithLabelValues(ns, "healthy", "DestinationRule").Add(1)
	m.Writes.WithLabelValues(ns, "healthy", "VirtualService").Add(1)
	m.ReconcileError("optimizer.mirror", "conflict", "flaky", "team-a")

	tick := func() {
		for _, svc := range services {
			if svc != "stuck" && svc != "idle" {
				md := mode[svc]
				if md == "" {
					md = "Steady"
				}
				m.Cycles.WithLabelValues(ns, svc, md).Inc()
			}
		}
		m.QueryErrors.WithLabelValues(ns, "failing", "cpu", "unreachable").Inc()
		m.QueryErrors.WithLabelValues(ns, "empty", "cpu", "empty").Inc()
		// rate(...[5m]) divides by the whole window, so a storm must be
		// violent to show within seconds.
		m.Writes.WithLabelValues(ns, "storm", "ServiceEntry").Add(100)
		m.ReconcileError("optimizer.mirror", "forbidden", "broken", "team-a")
		m.ReconcileError("optimizer.weights", "query", "failing", ns)
	}
	tick()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				tick()
			}
		}
	}()

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		close(done)
		wg.Wait()
		_ = srv.Close()
	})
	return lis.Addr().String()
}

// loadRuleFile adds a rule file to the harness's Prometheus configuration
// and reloads it; Prometheus refuses a configuration whose rules do not parse.
func loadRuleFile(t *testing.T, p *harness.Prometheus, path string) {
	t.Helper()
	cfgPath := filepath.Join(p.Dir, "prometheus.yml")
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatalf("the harness's Prometheus configuration: %v", err)
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", cfgPath, err)
	}
	cfg["rule_files"] = []string{path}
	if data, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(p.URL+"/-/reload", "", nil)
	if err != nil {
		t.Fatalf("reload Prometheus: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("Prometheus refused the rules of config/prometheus/alerts.yaml (HTTP %d): %s", resp.StatusCode, body)
	}
}

type alertStates struct {
	rules     int      // alerting rules loaded
	unhealthy []string // rules not (yet) evaluated without error
	active    []string // alertname/<service_name|name>, pending or firing, sorted
}

func alertState(p *harness.Prometheus) (alertStates, error) {
	var st alertStates
	resp, err := http.Get(p.URL + "/api/v1/rules?type=alert")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	var doc struct {
		Status string `json:"status"`
		Data   struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
					Alerts    []struct {
						Labels map[string]string `json:"labels"`
						State  string            `json:"state"`
					} `json:"alerts"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return st, fmt.Errorf("decode /api/v1/rules: %w", err)
	}
	if doc.Status != "success" {
		return st, fmt.Errorf("/api/v1/rules: status %q", doc.Status)
	}
	for _, g := range doc.Data.Groups {
		for _, r := range g.Rules {
			st.rules++
			if r.Health != "ok" {
				st.unhealthy = append(st.unhealthy, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.LastError))
			}
			for _, a := range r.Alerts {
				if a.State != "pending" && a.State != "firing" {
					continue
				}
				subject := a.Labels["service_name"]
				if subject == "" {
					subject = a.Labels["name"]
				}
				st.active = append(st.active, r.Name+"/"+subject)
			}
		}
	}
	sort.Strings(st.active)
	return st, nil
}

// checkDashboard checks the Grafana dashboard: its variables, and that every
// panel query, with the variables set to the healthy service, is valid PromQL
// and (for the operator's own series, which the exporter above publishes)
// returns data.
func checkDashboard(t *testing.T, root string, p *harness.Prometheus) {
	data, err := os.ReadFile(filepath.Join(root, "config", "grafana", "istio-adaptive-optimizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		Expr       string         `json:"expr"`
		RefID      string         `json:"refId"`
		Datasource map[string]any `json:"datasource"`
	}
	type panel struct {
		ID      int      `json:"id"`
		Title   string   `json:"title"`
		Type    string   `json:"type"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		UID        string  `json:"uid"`
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("config/grafana/istio-adaptive-optimizer.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Error("the dashboard needs a uid and a title")
	}

	vars := map[string]string{}
	for _, v := range dash.Templating.List {
		switch v.Type {
		case "datasource":
			vars[v.Name] = fmt.Sprint(v.Query)
		case "query":
			q, _ := v.Query.(string)
			vars[v.Name] = q
		}
	}
	if vars["datasource"] != "prometheus" {
		t.Errorf("the dashboard has no Prometheus datasource variable named datasource")
	}
	subst := strings.NewReplacer(
		"$namespace", "shop", "$service", "healthy",
		"$__rate_interval", "1m", "$__range", "5m", "$__interval", "15s",
	)
	for name, want := range map[string]string{"namespace": "shop", "service": "healthy"} {
		q := vars[name]
		m := regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`).FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", name, q)
			continue
		}
		values, err := labelValues(p, m[2], subst.Replace(m[1]))
		if err != nil {
			t.Errorf("variable %s: %v", name, err)
		} else if !slices.Contains(values, want) {
			t.Errorf("variable %s: %q finds %v, want %q among them", name, q, values, want)
		}
	}

	var all []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			all = append(all, p)
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	ids := map[int]bool{}
	queries := 0
	for _, pn := range all {
		if ids[pn.ID] {
			t.Errorf("panel id %d is used twice", pn.ID)
		}
		ids[pn.ID] = true
		if pn.Type != "row" && len(pn.Targets) == 0 {
			t.Errorf("panel %q has no query", pn.Title)
		}
		for _, tg := range pn.Targets {
			queries++
			if uid, _ := tg.Datasource["uid"].(string); uid != "${datasource}" {
				t.Errorf("panel %q query %s: datasource %v, want the ${datasource} variable", pn.Title, tg.RefID, tg.Datasource)
			}
			expr := subst.Replace(tg.Expr)
			if strings.Contains(strings.ReplaceAll(expr, `"$1"`, ""), "$") {
				t.Errorf("panel %q query %s uses an unknown variable: %s", pn.Title, tg.RefID, tg.Expr)
			}
			n, err := instantQuery(p, expr)
			if err != nil {
				t.Errorf("panel %q query %s: %v\n%s", pn.Title, tg.RefID, err, expr)
				continue
			}
			// controller-runtime's series come from a running manager, not
			// from the metrics package; the rest must find the healthy service.
			external := strings.Contains(expr, "controller_runtime_") || strings.Contains(expr, "workqueue_")
			if n == 0 && !external {
				t.Errorf("panel %q query %s finds no series for the healthy service:\n%s", pn.Title, tg.RefID, expr)
			}
		}
	}
	if queries == 0 {
		t.Error("the dashboard has no queries")
	}
}

func instantQuery(p *harness.Prometheus, expr string) (int, error) {
	resp, err := http.Get(p.URL + "/api/v1/query?" + url.Values{"query": {expr}}.Encode())
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var doc struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return 0, fmt.Errorf("decode answer (HTTP %d): %w", resp.StatusCode, err)
	}
	if doc.Status != "success" {
		return 0, fmt.Errorf("Prometheus: %s", doc.Error)
	}
	return len(doc.Data.Result), nil
}

func labelValues(p *harness.Prometheus, label, match string) ([]string, error) {
	resp, err := http.Get(p.URL + "/api/v1/label/" + label + "/values?" + url.Values{"match[]": {match}}.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc struct {
		Status string   `json:"status"`
		Error  string   `json:"error"`
		Data   []string `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, err
	}
	if doc.Status != "success" {
		return nil, fmt.Errorf("Prometheus: %s", doc.Error)
	}
	return doc.Data, nil
}
