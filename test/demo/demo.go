package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
	fx "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

const (
	namespace        = "demo"
	clientsNamespace = "clients"
	serviceName      = "api"
	servicePort      = 80
	targetPort       = 8080
	scrapeInterval   = time.Second
)

var kubernetesHost = serviceName + "." + namespace + ".svc.cluster.local"

// demo is one run.
type demo struct {
	cfg    Config
	out    io.Writer
	fleet  []podSpec
	phases Phases

	pods      []*simPod
	api       *harness.APIServer
	prom      *harness.Prometheus
	istiod    *harness.Istiod
	c         client.Client
	opReg     *prometheus.Registry // the operator's own metrics
	sidecars  []*sidecar
	rec       *recorder
	useIstiod bool
	logPath   string

	t0    time.Time
	phase atomic.Value // string

	mu        sync.Mutex
	timeline  []point
	marks     map[string]float64         // phase boundaries, seconds since traffic started
	busyAt    map[string][]time.Duration // every pod's busy time at each mark
	opAt      map[string]opStats         // the operator's counters at each mark
	conv      convergence
	finalView []uint32

	cleanups []cleanup
}

type cleanup struct {
	what string // shown when stopping; "" for internal parts
	f    func()
}

// Phase boundaries.
const (
	markBaselineStart = "baseline-start"
	markBaselineEnd   = "baseline-end"
	markSwitch        = "switch"
	markConverged     = "converged"
	markAfterStart    = "after-start"
	markAfterEnd      = "after-end"
)

// point is the state sampled once a second, for the picture.
type point struct {
	t       float64
	weights []uint32        // what sidecar 0 balances with
	busy    []time.Duration // cumulative busy time per pod
}

// opStats are read from the operator's metrics registry.
type opStats struct {
	Cycles   int
	SEWrites int
	// RoutingWrites counts ServiceEntry and DestinationRule writes (the
	// latter when the load balancer switches).
	RoutingWrites int
	Mode          string
	// Capacity is the engine's relative capacity estimate per pod (mean 1).
	Capacity map[string]float64
}

// run executes the demo and returns its summary. It stops everything it
// started before it returns, also when ctx is cancelled (Ctrl-C).
func run(ctx context.Context, cfg Config, out io.Writer) (sum *Summary, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &demo{cfg: cfg, out: out, fleet: cfg.Fleet(), phases: cfg.Phases(),
		marks: map[string]float64{}, busyAt: map[string][]time.Duration{}, opAt: map[string]opStats{}}
	d.phase.Store("starting")
	defer func() {
		d.cleanup()
		if err != nil && d.logPath != "" && ctx.Err() == nil {
			err = fmt.Errorf("%w\n(operator log: %s)", err, d.logPath)
		} else if d.logPath != "" {
			_ = os.Remove(d.logPath)
		}
	}()
	if err := d.checkBinaries(); err != nil {
		return nil, err
	}
	d.printIntro()
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	if err := d.traffic(ctx); err != nil {
		return nil, err
	}
	sum = d.summarize()
	sum.Print(d.out)
	if err := writeSVG(cfg.Out, d.picture(sum)); err != nil {
		return sum, fmt.Errorf("write %s: %w", cfg.Out, err)
	}
	abs, _ := filepath.Abs(cfg.Out)
	fmt.Fprintf(d.out, "\nPicture (weights, utilisation and latency over time): %s\n", abs)
	return sum, nil
}

func (d *demo) logf(format string, args ...any) {
	fmt.Fprintf(d.out, format+"\n", args...)
}

// onCleanup registers what to stop at the end, in reverse order.
func (d *demo) onCleanup(what string, f func()) { d.cleanups = append(d.cleanups, cleanup{what, f}) }

func (d *demo) cleanup() {
	if len(d.cleanups) == 0 {
		return
	}
	start := time.Now()
	var names []string
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		if w := d.cleanups[i].what; w != "" && !slices.Contains(names, w) {
			names = append(names, w)
		}
	}
	fmt.Fprintf(d.out, "\nStopping %s...\n", strings.Join(names, ", "))
	for i := len(d.cleanups) - 1; i >= 0; i-- {
		d.cleanups[i].f()
	}
	d.cleanups = nil
	fmt.Fprintf(d.out, "Stopped everything in %s.\n", time.Since(start).Round(100*time.Millisecond))
}

// checkBinaries fails early, naming the make targets, when a server binary
// is missing.
func (d *demo) checkBinaries() error {
	root, err := harness.RepoRoot()
	if err != nil {
		return err
	}
	bin := filepath.Join(root, "bin")
	rel := func(p string) string {
		if r, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
		return p
	}
	exists := func(p string) bool { st, err := os.Stat(p); return err == nil && !st.IsDir() }
	pathOf := func(name, env string) string {
		if p := os.Getenv(env); p != "" {
			return p
		}
		return filepath.Join(bin, name)
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		assets = bin
	}
	var missing, targets []string
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if p := filepath.Join(assets, b); !exists(p) {
			missing = append(missing, rel(p))
		}
	}
	if len(missing) > 0 {
		targets = append(targets, "envtest")
	}
	if p := pathOf("prometheus", "PROMETHEUS_BIN"); !exists(p) {
		missing = append(missing, rel(p))
		targets = append(targets, "prometheus")
	}
	istiod := pathOf("pilot-discovery", "PILOT_DISCOVERY_BIN")
	switch d.cfg.Istiod {
	case "on":
		if !exists(istiod) {
			missing = append(missing, rel(istiod))
			targets = append(targets, "istiod")
		}
		d.useIstiod = true
	case "auto":
		d.useIstiod = exists(istiod)
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: run `make %s` (builds them from the Go module proxy into bin/), or just `make demo`, which builds what it needs",
			strings.Join(missing, ", "), strings.Join(targets, " "))
	}
	return nil
}

func (d *demo) printIntro() {
	cfg := d.cfg
	d.logf("Istio adaptive weight optimizer: local demo (scenario %q)", cfg.Name)
	if cfg.Description != "" {
		d.logf("  %s", cfg.Description)
	}
	d.logf("")
	d.logf("Fleet (Service %s/%s, port %d -> %d). The EndpointSlice carries each pod's identifier address from",
		namespace, serviceName, servicePort, targetPort)
	d.logf("198.18.0.0/15 (the API server rejects loopback addresses); it is never dialled: load generators")
	d.logf("map it to the pod's real HTTP server on its own loopback address.")
}

func (d *demo) printFleet() {
	work := d.cfg.Work.Duration
	d.logf("  %-14s %5s %7s %8s  %-11s %-6s  %-18s    %s", "pod", "speed", "workers", "capacity", "instance", "zone", "EndpointSlice addr", "serves on")
	for i, p := range d.fleet {
		d.logf("  %-14s %5.2f %7d %6.0f/s  %-11s %-6s  %-18s -> %s",
			p.Name, p.Speed, p.Workers, p.Capacity(work), p.InstanceType, p.Zone, fmt.Sprintf("%s:%d", p.ID, targetPort), d.pods[i].addr)
	}
	ph := d.phases
	d.logf("")
	d.logf("Load: %d sidecars, Poisson arrivals, %.0f req/s in total = %.0f%% of the fleet's capacity (%.0f req/s);",
		d.cfg.Sidecars, d.cfg.TotalRate(), d.cfg.Load*100, d.cfg.TotalCapacity())
	d.logf("      %s service time %v at speed 1.0, client timeout %v.", d.cfg.WorkDistribution, work, d.cfg.Timeout.Duration)
	d.logf("Plan: %v warm-up, %v before: the plain Service with Istio's default LEAST_REQUEST (no optimizer); then the optimizer is applied and the",
		ph.Warmup, ph.Window)
	d.logf("      operator (cycle %v) optimizes until converged (at most %v), %v settling, %v measurement.",
		d.cfg.Cycle.Duration, ph.OptimizeMax, ph.Settle, ph.Window)
	d.logf("")
}

// start brings up every component and waits until each sidecar balances
// over the optimized host's endpoints.
func (d *demo) start(ctx context.Context) error {
	began := time.Now()
	if err := d.setupLogging(); err != nil {
		return err
	}
	for _, spec := range d.fleet {
		p, err := startPod(spec, namespace, d.cfg.Work.Duration, d.cfg.WorkDistribution == "exponential")
		if err != nil {
			return err
		}
		d.pods = append(d.pods, p)
		d.onCleanup("the pods", func() {
			sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			p.stop(sctx)
		})
	}
	d.printFleet()

	d.logf("Starting the API server (kube-apiserver and etcd from bin/)...")
	api, err := harness.StartAPIServer()
	if err != nil {
		return err
	}
	d.api = api
	d.onCleanup("the API server (kube-apiserver, etcd)", func() { _ = api.Stop() })
	if err := ctx.Err(); err != nil {
		return err
	}

	// Prometheus and istiod start in parallel.
	var wg sync.WaitGroup
	var promErr, istiodErr error
	targets := make([]string, len(d.pods))
	for i, p := range d.pods {
		targets[i] = p.addr
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		d.prom, promErr = harness.StartPrometheus(harness.PrometheusOptions{Targets: targets, ScrapeInterval: scrapeInterval})
	}()
	if d.useIstiod {
		d.logf("Starting Prometheus (scraping every pod's /metrics every %v) and istiod...", scrapeInterval)
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.istiod, istiodErr = harness.StartIstiod(api)
		}()
	} else {
		why := "istiod is not built (`make istiod`)"
		if d.cfg.Istiod == "off" {
			why = "--istiod off"
		}
		d.logf("Starting Prometheus (scraping every pod's /metrics every %v); %s,", scrapeInterval, why)
		d.logf("so sidecars read the weights from the ServiceEntry instead of from istiod over xDS.")
	}
	wg.Wait()
	if d.prom != nil {
		d.onCleanup("Prometheus", func() { _ = d.prom.Stop() })
	}
	if d.istiod != nil {
		d.onCleanup("istiod", func() { _ = d.istiod.Stop() })
	}
	if promErr != nil {
		return fmt.Errorf("start Prometheus: %w", promErr)
	}
	if istiodErr != nil {
		return fmt.Errorf("start istiod: %w", istiodErr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}

	if d.c, err = client.New(api.Config, client.Options{Scheme: harness.Scheme()}); err != nil {
		return err
	}
	if err := d.createObjects(ctx); err != nil {
		return err
	}
	if err := d.startOperator(ctx); err != nil {
		return err
	}
	if err := d.startSidecars(ctx); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := d.prom.WaitForTargets(wctx, targets); err != nil {
		return fmt.Errorf("Prometheus does not scrape the pods: %w", err)
	}
	xds := ""
	if d.istiod != nil {
		xds = ", istiod xDS " + d.istiod.GRPCAddr
	}
	d.logf("Everything is up after %s (Prometheus %s%s).", time.Since(began).Round(100*time.Millisecond), d.prom.URL, xds)
	d.logf("")
	return nil
}

func (d *demo) setupLogging() error {
	var w io.Writer
	if d.cfg.Verbose {
		w = os.Stderr
	} else {
		f, err := os.CreateTemp("", "istio-adaptive-demo-*.log")
		if err != nil {
			return err
		}
		d.logPath = f.Name()
		w = f
		d.onCleanup("", func() { _ = f.Close() })
	}
	logger := zap.New(zap.WriteTo(w), zap.UseDevMode(false))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	return nil
}

// createObjects registers the fleet: a Node per pod (instance type by
// speed, zones), the Pods (CPU limit = workers), the Service and its
// EndpointSlice.
func (d *demo) createObjects(ctx context.Context) error {
	objs := []client.Object{
		fx.Namespace(namespace), fx.Namespace(clientsNamespace),
		fx.Service(namespace, serviceName, fx.ServicePort("http", servicePort, intstr.FromInt32(targetPort))),
	}
	var eps []fx.Endpoint
	for _, p := range d.fleet {
		objs = append(objs,
			fx.Node(p.Node, "demo-region", p.Zone, "", p.InstanceType),
			fx.Pod(namespace, p.Name, serviceName, p.Node, fx.WithSidecar(), fx.WithServiceAccount(serviceName),
				fx.WithContainerPort("http", targetPort), fx.WithCPULimit(fmt.Sprint(p.Workers))))
		eps = append(eps, fx.Ready(p.Name, p.ID, p.Node))
	}
	objs = append(objs, fx.EndpointSlice(namespace, serviceName+"-demo", serviceName, []fx.SlicePort{{Name: "http", Port: targetPort}}, eps...))
	for _, o := range objs {
		if err := d.c.Create(ctx, o); err != nil {
			return fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// startOperator runs the operator in this process (controllers.Setup), with
// a metrics source on the real Prometheus.
func (d *demo) startOperator(ctx context.Context) error {
	source, err := promsource.New(promsource.Config{URL: d.prom.URL, Timeout: 2 * time.Second})
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(d.api.Config, ctrl.Options{
		Scheme:  harness.Scheme(),
		Metrics: metricsserver.Options{BindAddress: "0"},
		Cache:   controllers.CacheOptions(nil),
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	m := metrics.New()
	d.opReg = prometheus.NewRegistry()
	if err := m.Register(d.opReg); err != nil {
		return err
	}
	defaults := controllers.DefaultEngineDefaults()
	defaults.Cycle = d.cfg.Cycle.Duration
	defaults.Params.QueryWindow = d.queryWindow()
	defaults.Params.ScrapeInterval = scrapeInterval
	if err := controllers.Setup(ctx, mgr, controllers.Dependencies{
		Clock: clock.RealClock{}, Metrics: m, ClusterDomain: "cluster.local", Source: source,
		Options: controllers.Options{MaxConcurrentReconciles: 2, Engine: defaults},
	}); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	d.onCleanup("the operator", func() {
		cancel()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			fmt.Fprintln(d.out, "warning: the operator did not stop within 15s")
		}
	})
	return nil
}

func (d *demo) queryWindow() time.Duration {
	return max(3*d.cfg.Cycle.Duration, 3*scrapeInterval)
}

// createOptimizer applies the optimizer, as a user opting in on a live
// Service does: the operator writes the ServiceEntry, DestinationRule and
// VirtualService and starts learning (the DestinationRule keeps Istio's
// LEAST_REQUEST until the weights rest on measured capacity).
func (d *demo) createOptimizer(ctx context.Context) error {
	opt := fx.Optimizer(namespace, serviceName, serviceName, optv1.ServicePort{Number: servicePort, Protocol: optv1.ProtocolHTTP})
	opt.Spec.Optimization = &optv1.Optimization{
		Cycle:          &optv1.Duration{Duration: d.cfg.Cycle.Duration},
		QueryWindow:    &optv1.Duration{Duration: d.queryWindow()},
		ScrapeInterval: &optv1.Duration{Duration: scrapeInterval},
	}
	if err := d.c.Create(ctx, opt); err != nil {
		return fmt.Errorf("create optimizer: %w", err)
	}
	d.logf("Applied IstioAdaptiveRequestOptimizer %s/%s (service_name: %s, cycle %v, query_window %v).",
		namespace, serviceName, serviceName, d.cfg.Cycle.Duration, d.queryWindow())
	// The ServiceEntry with every pod.
	deadline := time.Now().Add(30 * time.Second)
	for {
		se := &istionet.ServiceEntry{}
		err := d.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: desired.ObjectName(serviceName)}, se)
		if err == nil && len(se.Spec.Endpoints) == len(d.fleet) {
			d.logf("The operator wrote ServiceEntry %s/%s (host %s) with %d endpoints.", namespace, se.Name, strings.Join(se.Spec.Hosts, ","), len(se.Spec.Endpoints))
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no ServiceEntry with %d endpoints after 30s (last error: %v)", len(d.fleet), err)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// startSidecars connects the load generators to their weight source and
// waits until each has every pod.
func (d *demo) startSidecars(ctx context.Context) error {
	byAddr := map[string]int{}
	for i, p := range d.fleet {
		byAddr[p.ID] = i
	}
	d.t0 = time.Now() // replaced when traffic starts
	d.rec = &recorder{}
	rate := d.cfg.TotalRate() / float64(d.cfg.Sidecars)
	for i := range d.cfg.Sidecars {
		var src weightSource
		if d.istiod != nil {
			x, err := harness.DialXDS(ctx, d.istiod.GRPCAddr, harness.SidecarOptions{
				IP: fmt.Sprintf("127.77.200.%d", i+1), Pod: fmt.Sprintf("client-%d", i), Namespace: clientsNamespace,
				Locality: harness.Locality{Region: "demo-region", Zone: []string{"zone-a", "zone-b"}[i%2]},
			})
			if err != nil {
				return fmt.Errorf("sidecar %d: %w", i, err)
			}
			src = &xdsSource{x: x, host: kubernetesHost, port: servicePort}
		} else {
			src = &seSource{c: d.c, key: client.ObjectKey{Namespace: namespace, Name: desired.ObjectName(serviceName)},
				slice: client.ObjectKey{Namespace: namespace, Name: serviceName + "-demo"}}
		}
		s := newSidecar(i, rate, src, byAddr, d.pods, d.cfg.Timeout.Duration, d.rec, uint64(time.Now().UnixNano()))
		d.sidecars = append(d.sidecars, s)
		d.onCleanup("the load generators", s.close)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ready := 0
		var lastErr error
		for _, s := range d.sidecars {
			if !s.Synced() || countNonZero(s.View()) < len(d.fleet) {
				s.refresh(ctx)
			}
			if s.Synced() && countNonZero(s.View()) == len(d.fleet) {
				ready++
			} else if err := s.LastErr(); err != nil {
				lastErr = err
			}
		}
		if ready == len(d.sidecars) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d sidecars have all %d endpoints after 60s (last error: %v)", ready, len(d.sidecars), len(d.fleet), lastErr)
		}
		if err := sleepCtx(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
	if d.istiod != nil {
		x := d.sidecars[0].src.(*xdsSource).x
		cluster, _ := x.RouteCluster(kubernetesHost, servicePort)
		info, _ := x.Cluster(cluster)
		d.logf("%d sidecars connected to istiod over xDS: the route for %s:%d leads to cluster %s (lb_policy %s), no optimizer yet.",
			len(d.sidecars), kubernetesHost, servicePort, cluster, info.LbPolicy)
	} else {
		d.logf("%d sidecars read the EndpointSlice (LEAST_REQUEST, no optimizer yet), then the ServiceEntry's endpoints and weights.", len(d.sidecars))
	}
	return nil
}

func countNonZero(v []uint32) int {
	n := 0
	for _, x := range v {
		if x > 0 {
			n++
		}
	}
	return n
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// operator reads the operator's cycle and write counters.
func (d *demo) operator() opStats {
	var st opStats
	mfs, err := d.opReg.Gather()
	if err != nil {
		return st
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "optimizer_cycles_total":
				st.Cycles += int(m.GetCounter().GetValue())
			case "optimizer_writes_total":
				if label(m, "kind") == "ServiceEntry" {
					st.SEWrites += int(m.GetCounter().GetValue())
				}
				if k := label(m, "kind"); k == "ServiceEntry" || k == "DestinationRule" {
					st.RoutingWrites += int(m.GetCounter().GetValue())
				}
			case "optimizer_pod_capacity_estimate":
				if st.Capacity == nil {
					st.Capacity = map[string]float64{}
				}
				st.Capacity[label(m, "pod")] = m.GetGauge().GetValue()
			case "optimizer_mode":
				if m.GetGauge().GetValue() == 1 {
					st.Mode = label(m, "mode")
				}
			}
		}
	}
	return st
}

func (d *demo) busy() []time.Duration {
	out := make([]time.Duration, len(d.pods))
	for i, p := range d.pods {
		out[i] = p.busy()
	}
	return out
}

func (d *demo) now() float64 { return time.Since(d.t0).Seconds() }

// traffic runs the phases.
func (d *demo) traffic(ctx context.Context) error {
	d.t0 = time.Now()
	d.rec.t0 = d.t0
	d.phase.Store("warm-up, no optimizer")
	stop := make(chan struct{})
	abortCtx, abort := context.WithCancel(context.Background())
	pollCtx, stopPolling := context.WithCancel(context.Background())
	var gens, bg sync.WaitGroup
	for _, s := range d.sidecars {
		gens.Add(1)
		go func() { defer gens.Done(); s.generate(stop, abortCtx) }()
		bg.Add(1)
		go func() { defer bg.Done(); s.pollWeights(pollCtx) }()
	}
	bg.Add(2)
	go func() { defer bg.Done(); d.sample(pollCtx) }()
	go func() { defer bg.Done(); d.liveTable(pollCtx) }()
	stopped := false
	stopTraffic := func(interrupted bool) {
		if stopped {
			return
		}
		stopped = true
		close(stop)
		if interrupted {
			abort()
		}
		gens.Wait() // requests in flight finish (at most the timeout)
		stopPolling()
		bg.Wait()
		abort()
	}
	d.onCleanup("the load generators", func() { stopTraffic(true) })

	ph := d.phases
	d.logf("Traffic started. Live table every %v, over the last interval: the weight sidecar 0 balances with,", d.cfg.Every)
	d.logf("each pod's share of the requests, utilisation (busy time of its workers), queue length now, p99")
	d.logf("latency, and the operator's capacity estimate relative to the mean (the true value in parentheses).")
	if err := sleepCtx(ctx, ph.Warmup); err != nil {
		return err
	}
	d.setMark(markBaselineStart)
	d.phase.Store("before: Istio's LEAST_REQUEST")
	if err := sleepCtx(ctx, ph.Window); err != nil {
		return err
	}
	d.setMark(markBaselineEnd)

	// Opt in.
	before := d.operator()
	d.setMark(markSwitch)
	d.phase.Store("optimizing")
	fmt.Fprintf(d.out, "\n>>> t=%.0fs: the optimizer is applied: the operator routes the Service through its host and learns the weights.\n\n", d.now())
	if err := d.createOptimizer(ctx); err != nil {
		return err
	}

	conv := d.waitConverged(ctx, before)
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	d.conv = conv
	d.mu.Unlock()
	d.setMark(markConverged)
	if conv.Converged {
		fmt.Fprintf(d.out, "\n>>> t=%.0fs: converged: %s; the sidecars balance with %s.\n\n", d.now(), conv.describe(), d.sidecars[0].Policy())
	} else {
		fmt.Fprintf(d.out, "\n>>> t=%.0fs: not converged within %v; measuring anyway.\n\n", d.now(), ph.OptimizeMax)
	}
	d.phase.Store("settling")
	if err := sleepCtx(ctx, ph.Settle); err != nil {
		return err
	}
	d.setMark(markAfterStart)
	d.phase.Store("after convergence")
	if err := sleepCtx(ctx, ph.Window); err != nil {
		return err
	}
	d.setMark(markAfterEnd)
	d.mu.Lock()
	d.finalView = d.sidecars[0].View()
	d.mu.Unlock()
	d.phase.Store("stopping")
	stopTraffic(false)
	return nil
}

func (d *demo) setMark(name string) {
	t, busy, op := d.now(), d.busy(), d.operator()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.marks[name] = t
	d.busyAt[name] = busy
	d.opAt[name] = op
}

// convergedAfter is how many cycles without a weight change count as
// converged.
const convergedAfter = 3

// convergence is what waitConverged found.
type convergence struct {
	Converged bool
	// Cycles: operator cycles after the optimizer was applied until the
	// last change of the weights or the load balancer.
	Cycles int
	// Time from the switch to the last weight change.
	Time time.Duration
	// Writes of the ServiceEntry during the optimization.
	Writes int
	// Before: the operator's counters at the switch.
	Before opStats
}

// waitConverged waits until the ServiceEntry's weights have not changed for
// convergedAfter cycles, or the optimization time is up.
func (d *demo) waitConverged(ctx context.Context, before opStats) convergence {
	c := convergence{Before: before, Cycles: -1}
	start := time.Now()
	deadline := start.Add(d.phases.OptimizeMax)
	lastWrites := before.RoutingWrites
	for time.Now().Before(deadline) {
		st := d.operator()
		cycles := st.Cycles - before.Cycles
		if d.sidecars[0].Policy() != string(optv1.LoadBalancerRoundRobin) {
			// Not learned yet: the DestinationRule keeps LEAST_REQUEST
			// until the weights rest on measured capacity.
			lastWrites, c.Cycles = -1, -1
			if sleepCtx(ctx, 100*time.Millisecond) != nil {
				return c
			}
			continue
		}
		if st.RoutingWrites != lastWrites {
			lastWrites = st.RoutingWrites
			c.Cycles, c.Time = cycles, time.Since(start)
		}
		c.Writes = st.SEWrites - before.SEWrites
		switch {
		case c.Cycles >= 0 && cycles-c.Cycles >= convergedAfter:
			c.Converged = true
			return c
		}
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return c
		}
	}
	if c.Cycles < 0 {
		c.Cycles = 0
	}
	return c
}

// sample records, once a second, what sidecar 0 balances with and every
// pod's busy time.
func (d *demo) sample(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		p := point{t: d.now(), weights: d.sidecars[0].View(), busy: d.busy()}
		d.mu.Lock()
		d.timeline = append(d.timeline, p)
		d.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// liveTable prints, every cfg.Every, what happened in the last interval.
func (d *demo) liveTable(ctx context.Context) {
	t := time.NewTicker(d.cfg.Every)
	defer t.Stop()
	prevT := 0.0
	prevBusy := d.busy()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := d.now()
		busy := d.busy()
		samples := d.rec.completed(prevT, now)
		d.printTable(d.phase.Load().(string), prevT, now, samples, prevBusy, busy)
		prevT, prevBusy = now, busy
	}
}

// printTable prints the requests completed in the interval (timed-out ones
// when they timed out).
func (d *demo) printTable(phase string, from, to float64, samples []sample, b0, b1 []time.Duration) {
	all := latencyOf(samples, -1)
	op := d.operator()
	view := d.sidecars[0].View()
	var b strings.Builder
	fmt.Fprintf(&b, "[t=%3.0fs] %-34s %5.0f req/s  p50 %-6s p99 %-6s timeouts %4.1f%%  operator: %d cycles, %s, SE writes %d\n",
		to, phase, float64(all.N)/(to-from), fmtLat(all.P50), fmtLat(all.P99),
		100*float64(all.Timeouts)/float64(max(all.N, 1)), op.Cycles, orDash(op.Mode), op.SEWrites)
	fmt.Fprintf(&b, "  %-14s %5s %6s %6s %5s %5s %7s  %s\n", "pod", "speed", "weight", "share", "util", "queue", "p99", "capacity estimate (true)")
	meanCap := d.cfg.TotalCapacity() / float64(len(d.fleet))
	for i, p := range d.fleet {
		n := 0
		for _, s := range samples {
			if s.pod == i {
				n++
			}
		}
		util := (b1[i] - b0[i]).Seconds() / (float64(p.Workers) * (to - from))
		pl := latencyOf(samples, i)
		est := "-"
		if v, ok := op.Capacity[p.Name]; ok {
			est = fmt.Sprintf("%.2f", v)
		}
		fmt.Fprintf(&b, "  %-14s %5.2f %6d %5.1f%% %4.0f%% %5d %7s  %s (%.2f)\n", p.Name, p.Speed, view[i],
			100*float64(n)/float64(max(all.N, 1)), 100*util, d.pods[i].waiting.Load(), fmtLat(pl.P99),
			est, p.Capacity(d.cfg.Work.Duration)/meanCap)
	}
	fmt.Fprint(d.out, b.String())
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
