// Package fakepod is a loopback exporter that stands in for a set of Kubernetes
// pods in tests and demos: it serves, on one /metrics endpoint, the series that a
// Prometheus scraping a real cluster would hold for those pods:
//
//   - cAdvisor-style container_cpu_usage_seconds_total{namespace, pod, container}
//     for the application container, the istio-proxy sidecar, the pause container
//     (container="POD", as under dockershim) and the pod-level cgroup aggregate
//     (container="", the sum of the others); a correct CPU query counts only the
//     application container;
//   - Istio-style istio_requests_total{reporter="destination", pod, namespace,
//     destination_workload_namespace, destination_workload, ...}, as the pod's own
//     sidecar reports the requests it served.
//
// In a cluster the pod and namespace labels come from the scrape target (kubelet
// cAdvisor, or Istio's kubernetes-pods scrape job); since one exporter here serves
// every pod, it puts them in the exposition itself.
//
// Counter values are driven by the caller, either directly (AddCPU, AddRequests)
// or by integrating a simple model over time (Advance, Run): each pod gets a share
// of the offered request rate, serves it up to its capacity, and spends Work/Speed
// CPU-seconds per request.
package fakepod

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Container names used in the CPU series.
const (
	// DefaultAppContainer is the application container's name when Pod.Container is empty.
	DefaultAppContainer = "app"
	// ProxyContainer is the Istio sidecar.
	ProxyContainer = "istio-proxy"
	// PauseContainer is the sandbox container as dockershim named it.
	PauseContainer = "POD"
)

// Defaults of the model.
const (
	// DefaultWork is the CPU-seconds one request costs on a pod of speed 1.
	DefaultWork = 0.01
	// DefaultProxyCPUPerRequest is the sidecar's CPU-seconds per request.
	DefaultProxyCPUPerRequest = 0.0005
	// DefaultPauseCPU is the pause container's CPU-seconds per second.
	DefaultPauseCPU = 0.001
)

// Pod describes one simulated pod.
type Pod struct {
	// Name and Namespace identify the pod (label pod, namespace). Required.
	Name, Namespace string
	// Speed is the pod's relative CPU speed: a request costs Work/Speed
	// CPU-seconds. Zero means 1.
	Speed float64
	// Cores caps the application container's CPU; the pod serves at most
	// Cores*Speed/Work requests per second. Zero means no cap.
	Cores float64
	// Container is the application container's name. Empty means "app".
	Container string
	// Workload is the destination_workload label (the Deployment). Empty means Name.
	Workload string
	// Service is the destination_service_name label. Empty means "unknown".
	Service string
}

// Load is the traffic model integrated by Advance and Run.
type Load struct {
	// RPS is the total request rate offered to all pods.
	RPS float64
	// Work is the CPU-seconds per request at speed 1. Zero means DefaultWork.
	Work float64
	// Shares are relative traffic shares by pod name (for example the weights
	// Envoy would apply); pods without a share get none. Nil means equal shares.
	Shares map[string]float64
	// ProxyCPUPerRequest is the sidecar's cost; zero means the default, negative none.
	ProxyCPUPerRequest float64
	// PauseCPU is the pause container's steady CPU rate; zero means the default,
	// negative none.
	PauseCPU float64
}

// Totals are a pod's cumulative counters since it was added or last restarted.
type Totals struct {
	AppCPU, ProxyCPU, PauseCPU float64
	Requests                   float64
}

// Rates are what one Advance step did for one pod, per second.
type Rates struct {
	// Offered is the request rate sent to the pod, Served what it could serve.
	Offered, Served float64
	// AppCPU is the application container's CPU-seconds per second.
	AppCPU float64
}

type podState struct {
	Pod
	totals Totals
}

// Exporter serves the metrics of a set of simulated pods. Safe for concurrent use.
type Exporter struct {
	reg      *prometheus.Registry
	cpu      *prometheus.CounterVec
	requests *prometheus.CounterVec

	mu   sync.Mutex
	pods map[string]*podState
	load Load

	srv  *http.Server
	addr string
	done chan struct{}
}

var (
	cpuLabels     = []string{"namespace", "pod", "container"}
	requestLabels = []string{
		"namespace", "pod", "reporter", "destination_workload", "destination_workload_namespace",
		"destination_service_name", "destination_service_namespace", "request_protocol", "response_code",
		"source_workload", "connection_security_policy",
	}
)

// New returns an exporter for pods. It does not listen; call Start, or mount Handler.
func New(pods ...Pod) (*Exporter, error) {
	e := &Exporter{
		reg: prometheus.NewRegistry(),
		cpu: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "container_cpu_usage_seconds_total",
			Help: "Cumulative cpu time consumed in seconds.",
		}, cpuLabels),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_requests_total",
			Help: "Requests served, as reported by the destination sidecar.",
		}, requestLabels),
		pods: map[string]*podState{},
	}
	e.reg.MustRegister(e.cpu, e.requests)
	for _, p := range pods {
		if err := e.AddPod(p); err != nil {
			return nil, err
		}
	}
	return e, nil
}

// AddPod adds a pod; its counters start at zero (series appear at once).
func (e *Exporter) AddPod(p Pod) error {
	if p.Name == "" || p.Namespace == "" {
		return errors.New("fakepod: a pod needs a name and a namespace")
	}
	if p.Speed < 0 || p.Cores < 0 || math.IsNaN(p.Speed) || math.IsNaN(p.Cores) {
		return fmt.Errorf("fakepod: pod %s: speed and cores must not be negative", p.Name)
	}
	if p.Speed == 0 {
		p.Speed = 1
	}
	if p.Container == "" {
		p.Container = DefaultAppContainer
	}
	if p.Container == ProxyContainer || p.Container == PauseContainer {
		return fmt.Errorf("fakepod: pod %s: container name %q is reserved", p.Name, p.Container)
	}
	if p.Workload == "" {
		p.Workload = p.Name
	}
	if p.Service == "" {
		p.Service = "unknown"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.pods[p.Name]; ok {
		return fmt.Errorf("fakepod: pod %s already exists", p.Name)
	}
	st := &podState{Pod: p}
	e.pods[p.Name] = st
	e.touch(st)
	return nil
}

// RemovePod deletes a pod and all its series, as when a pod goes away.
func (e *Exporter) RemovePod(name string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.pods[name]
	if !ok {
		return fmt.Errorf("fakepod: no pod %s", name)
	}
	e.deleteSeries(st)
	delete(e.pods, name)
	return nil
}

// RestartPod resets a pod's counters to zero, as a container restart does
// (rate() must handle the reset).
func (e *Exporter) RestartPod(name string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.pods[name]
	if !ok {
		return fmt.Errorf("fakepod: no pod %s", name)
	}
	e.deleteSeries(st)
	st.totals = Totals{}
	e.touch(st)
	return nil
}

// Pods returns the pod names, sorted.
func (e *Exporter) Pods() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	names := make([]string, 0, len(e.pods))
	for n := range e.pods {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Totals returns a pod's cumulative counters.
func (e *Exporter) Totals(name string) (Totals, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.pods[name]
	if !ok {
		return Totals{}, false
	}
	return st.totals, true
}

// AddCPU adds CPU-seconds to a pod's application container.
func (e *Exporter) AddCPU(pod string, seconds float64) error {
	return e.add(pod, func(st *podState) {
		e.addCPU(st, st.Container, seconds)
		st.totals.AppCPU += seconds
	}, seconds)
}

// AddProxyCPU adds CPU-seconds to a pod's istio-proxy container.
func (e *Exporter) AddProxyCPU(pod string, seconds float64) error {
	return e.add(pod, func(st *podState) {
		e.addCPU(st, ProxyContainer, seconds)
		st.totals.ProxyCPU += seconds
	}, seconds)
}

// AddPauseCPU adds CPU-seconds to a pod's pause container.
func (e *Exporter) AddPauseCPU(pod string, seconds float64) error {
	return e.add(pod, func(st *podState) {
		e.addCPU(st, PauseContainer, seconds)
		st.totals.PauseCPU += seconds
	}, seconds)
}

// AddRequests counts n requests served by a pod (response code 200).
func (e *Exporter) AddRequests(pod string, n float64) error {
	return e.add(pod, func(st *podState) {
		e.requestCounter(st).Add(n)
		st.totals.Requests += n
	}, n)
}

func (e *Exporter) add(pod string, f func(*podState), v float64) error {
	if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return fmt.Errorf("fakepod: counter increment %v must be finite and non-negative", v)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	st, ok := e.pods[pod]
	if !ok {
		return fmt.Errorf("fakepod: no pod %s", pod)
	}
	f(st)
	return nil
}

// SetLoad sets the load that Run integrates.
func (e *Exporter) SetLoad(l Load) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.load = cloneLoad(l)
}

// Advance integrates the model over dt under load l and returns what each pod did.
// Each pod is offered RPS × its share of the shares of the current pods, serves up
// to Cores×Speed/Work of it, and spends Work/Speed CPU-seconds per request served;
// its sidecar spends ProxyCPUPerRequest per request and its pause container PauseCPU
// per second.
func (e *Exporter) Advance(dt time.Duration, l Load) map[string]Rates {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.advance(dt, l)
}

func (e *Exporter) advance(dt time.Duration, l Load) map[string]Rates {
	secs := dt.Seconds()
	out := make(map[string]Rates, len(e.pods))
	if secs <= 0 || len(e.pods) == 0 {
		return out
	}
	work := positiveOr(l.Work, DefaultWork)
	proxy := positiveOr(l.ProxyCPUPerRequest, DefaultProxyCPUPerRequest)
	pause := positiveOr(l.PauseCPU, DefaultPauseCPU)
	shares := make(map[string]float64, len(e.pods))
	var total float64
	for name := range e.pods {
		s := 1.0
		if l.Shares != nil {
			s = l.Shares[name]
		}
		if s < 0 || math.IsNaN(s) || math.IsInf(s, 0) {
			s = 0
		}
		shares[name] = s
		total += s
	}
	for name, st := range e.pods {
		var r Rates
		if total > 0 && l.RPS > 0 {
			r.Offered = l.RPS * shares[name] / total
		}
		r.Served = r.Offered
		if st.Cores > 0 {
			r.Served = math.Min(r.Served, st.Cores*st.Speed/work)
		}
		r.AppCPU = r.Served * work / st.Speed
		out[name] = r

		reqs := r.Served * secs
		e.addCPU(st, st.Container, r.AppCPU*secs)
		st.totals.AppCPU += r.AppCPU * secs
		e.addCPU(st, ProxyContainer, reqs*proxy)
		st.totals.ProxyCPU += reqs * proxy
		e.addCPU(st, PauseContainer, pause*secs)
		st.totals.PauseCPU += pause * secs
		e.requestCounter(st).Add(reqs)
		st.totals.Requests += reqs
	}
	return out
}

// Run integrates the load set by SetLoad in wall-clock time, every tick, until ctx
// is done. It returns when ctx is done.
func (e *Exporter) Run(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			e.mu.Lock()
			e.advance(now.Sub(last), e.load)
			e.mu.Unlock()
			last = now
		}
	}
}

// Handler serves the metrics in the Prometheus text format.
func (e *Exporter) Handler() http.Handler {
	return promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{})
}

// Registry is the exporter's registry (for gathering in tests).
func (e *Exporter) Registry() *prometheus.Registry { return e.reg }

// Start serves /metrics on addr ("" means 127.0.0.1:0, a free loopback port)
// and returns the address it listens on.
func (e *Exporter) Start(addr string) (string, error) {
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return "", errors.New("fakepod: already started")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", e.Handler())
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	e.addr = ln.Addr().String()
	e.done = make(chan struct{})
	go func(srv *http.Server, done chan struct{}) {
		defer close(done)
		_ = srv.Serve(ln)
	}(e.srv, e.done)
	return e.addr, nil
}

// Addr is the address Start listens on ("" before Start).
func (e *Exporter) Addr() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.addr
}

// Close stops serving. The exporter can be started again.
func (e *Exporter) Close() error {
	e.mu.Lock()
	srv, done := e.srv, e.done
	e.srv, e.addr = nil, ""
	e.mu.Unlock()
	if srv == nil {
		return nil
	}
	err := srv.Close()
	<-done
	return err
}

// touch creates a pod's series at zero so that they are visible before any work.
func (e *Exporter) touch(st *podState) {
	for _, c := range []string{st.Container, ProxyContainer, PauseContainer, ""} {
		e.cpu.WithLabelValues(st.Namespace, st.Name, c)
	}
	e.requestCounter(st)
}

func (e *Exporter) deleteSeries(st *podState) {
	e.cpu.DeletePartialMatch(prometheus.Labels{"namespace": st.Namespace, "pod": st.Name})
	e.requests.DeletePartialMatch(prometheus.Labels{"namespace": st.Namespace, "pod": st.Name})
}

// addCPU adds to one container and to the pod-level aggregate (container="").
func (e *Exporter) addCPU(st *podState, container string, seconds float64) {
	e.cpu.WithLabelValues(st.Namespace, st.Name, container).Add(seconds)
	e.cpu.WithLabelValues(st.Namespace, st.Name, "").Add(seconds)
}

func (e *Exporter) requestCounter(st *podState) prometheus.Counter {
	return e.requests.With(prometheus.Labels{
		"namespace":                      st.Namespace,
		"pod":                            st.Name,
		"reporter":                       "destination",
		"destination_workload":           st.Workload,
		"destination_workload_namespace": st.Namespace,
		"destination_service_name":       st.Service,
		"destination_service_namespace":  st.Namespace,
		"request_protocol":               "http",
		"response_code":                  "200",
		"source_workload":                "client",
		"connection_security_policy":     "mutual_tls",
	})
}

func positiveOr(v, def float64) float64 {
	switch {
	case v == 0 || math.IsNaN(v):
		return def
	case v < 0:
		return 0
	}
	return v
}

func cloneLoad(l Load) Load {
	if l.Shares != nil {
		s := make(map[string]float64, len(l.Shares))
		for k, v := range l.Shares {
			s[k] = v
		}
		l.Shares = s
	}
	return l
}
