// Package metrics defines the series the manager exports on its metrics
// endpoint, next to controller-runtime's own. Names and labels of
// endpoint_weight, reconciler_errors and query_latency are part of the
// user's contract (dashboards and alerts depend on them).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the operator's series. Create one with New and register it.
type Metrics struct {
	EndpointWeight   prometheus.Collector
	ReconcilerErrors *prometheus.CounterVec
	QueryLatency     *prometheus.GaugeVec
	QueryErrors      *prometheus.CounterVec
	PodCPU           prometheus.Collector
	PodRequestRate   prometheus.Collector
	PodCapacity      prometheus.Collector
	Cycles           *prometheus.CounterVec
	Alarms           *prometheus.CounterVec
	Writes           *prometheus.CounterVec
	Fallbacks        *prometheus.CounterVec
	Mode             *prometheus.GaugeVec
	WeightSpread     *prometheus.GaugeVec
	MaxWeightRatio   *prometheus.GaugeVec
	ServiceEndpoints *prometheus.GaugeVec
	Condition        *prometheus.GaugeVec
	WatchErrors      *prometheus.CounterVec
	SignalAvailable  *prometheus.GaugeVec
	TrafficCoverage  *prometheus.GaugeVec
	InvalidObjects   *prometheus.GaugeVec
	// CycleLateness is how late each weight cycle started after its
	// policy made it due: the weight loop's backlog (a metrics backend
	// too slow for the queries, or a manager short of CPU).
	CycleLateness prometheus.Histogram

	// pods holds the per-pod series (see podseries.go).
	pods *podStore
}

type serviceKey struct{ namespace, name string }

type podKey struct{ pod, ip, locality string }

var (
	serviceLabels = []string{"service_namespace", "service_name"}
	podLabels     = []string{"service_namespace", "service_name", "pod", "pod_ip", "locality"}
	// endpointLabels are endpoint_weight's, part of the user's contract.
	endpointLabels = []string{"service_namespace", "service_name", "pod_ip", "locality"}
)

// New creates the series (unregistered).
func New() *Metrics {
	pods := &podStore{services: map[serviceKey][]podRecord{}}
	return &Metrics{
		pods: pods,
		EndpointWeight: newPodFamily(pods, "endpoint_weight",
			"Weight of a ServiceEntry endpoint as computed by the optimizer (applied unless dry run).",
			true, func(r *podRecord) float64 { return float64(r.weight) }),
		CycleLateness: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "optimizer_cycle_lateness_seconds",
			Help: "Seconds each weight cycle started after it was due.",
			// From a scheduler's wake-up (milliseconds) to a whole
			// default cycle (30 s): the cycles have fallen a cycle behind.
			Buckets: []float64{0.005, 0.025, 0.1, 0.5, 1, 2.5, 5, 10, 30},
		}),
		ReconcilerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "reconciler_errors",
			Help: "Errors in the reconcilers, by controller and error type.",
		}, []string{"controller", "type", "name", "namespace"}),
		QueryLatency: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "query_latency",
			Help: "Seconds the metrics backend took to answer the last query for a service.",
		}, []string{"service_name", "service_namespace"}),
		QueryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "optimizer_query_errors_total",
			Help: "Failed metrics queries, by kind of failure.",
		}, append(append([]string{}, serviceLabels...), "signal", "reason")),
		PodCPU: newPodFamily(pods, "optimizer_pod_cpu_cores",
			"CPU cores each pod used over the query window, as the metrics backend reported.",
			false, func(r *podRecord) float64 { return r.cpu }),
		PodRequestRate: newPodFamily(pods, "optimizer_pod_request_rate",
			"Requests per second each pod served over the query window.",
			false, func(r *podRecord) float64 { return r.rate }),
		PodCapacity: newPodFamily(pods, "optimizer_pod_capacity_estimate",
			"Relative capacity estimate of each pod (mean 1).",
			false, func(r *podRecord) float64 { return r.capacity }),
		Cycles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "optimizer_cycles_total",
			Help: "Weight optimization cycles run, by outcome mode.",
		}, append(append([]string{}, serviceLabels...), "mode")),
		Alarms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "optimizer_alarms_total",
			Help: "Cycles run between the regular ones because a pod's latency over the last scrapes showed it falling behind (ROUND_ROBIN only).",
		}, serviceLabels),
		Writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "optimizer_writes_total",
			Help: "Writes of owned Istio objects (each one is an xDS push), by kind.",
		}, append(append([]string{}, serviceLabels...), "kind")),
		Fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "optimizer_fallbacks_total",
			Help: "Times weights fell back to equal after the metrics backend failed past the expiry.",
		}, serviceLabels),
		Mode: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_mode",
			Help: "1 for the weight engine's current mode (Optimizing, Steady, LowLoad, Holding, Fallback, NoData).",
		}, append(append([]string{}, serviceLabels...), "mode")),
		WeightSpread: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_weight_spread",
			Help: "Largest weight divided by smallest weight of a service.",
		}, serviceLabels),
		MaxWeightRatio: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_max_weight_ratio",
			Help: "The max_weight_ratio the weight engine bounds a service's weights with (mean/ratio to mean*ratio).",
		}, serviceLabels),
		ServiceEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_endpoints",
			Help: "Ready endpoints mirrored into the ServiceEntry.",
		}, serviceLabels),
		Condition: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_status_condition",
			Help: "1 for each status condition of an optimizer with its status and reason, so Stalled and Degraded optimizers can alert.",
		}, []string{"namespace", "name", "type", "status", "reason"}),
		WatchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "optimizer_watch_errors_total",
			Help: "List and watch errors of the manager's informers, by resource; a rising count means the cache is stale (for example an object that cannot be decoded).",
		}, []string{"resource"}),
		SignalAvailable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_signal_available",
			Help: "1 when the last weight cycle had data for a signal (cpu, requests, latency, node_cpu, recent_cpu, recent_latency), 0 when it was disabled or had none; requests 0 means the weights rest on CPU alone.",
		}, append(append([]string{}, serviceLabels...), "signal")),
		TrafficCoverage: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_traffic_coverage_ratio",
			Help: "Share of the requests a Service's pods received over the coverage window that clients sent to the optimized host (through the weights); absent without traffic or when the query fails.",
		}, serviceLabels),
		InvalidObjects: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "optimizer_invalid_objects",
			Help: "For each stored optimizer with spec parts that did not decode (a value of the wrong type or range, an unknown field: written past the CRD's validation), how many; sum() is the number of such objects' problems, count() the objects. A status that did not decode is rewritten by the operator and only logged.",
		}, []string{"namespace", "name"}),
	}
}

// SetInvalidObject publishes how many parts of an optimizer did not
// decode; 0 deletes its series.
func (m *Metrics) SetInvalidObject(namespace, name string, problems int) {
	if problems == 0 {
		m.InvalidObjects.DeleteLabelValues(namespace, name)
		return
	}
	m.InvalidObjects.WithLabelValues(namespace, name).Set(float64(problems))
}

// SetCondition publishes one condition of an optimizer, replacing the
// previous status and reason of that type.
func (m *Metrics) SetCondition(namespace, name, typ, status, reason string) {
	m.Condition.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "name": name, "type": typ})
	m.Condition.WithLabelValues(namespace, name, typ, status, reason).Set(1)
}

// ForgetOptimizer deletes the condition and reconciler_errors series of a
// deleted optimizer, so a cluster with churning optimizers does not grow
// series without bound.
func (m *Metrics) ForgetOptimizer(namespace, name string) {
	opt := prometheus.Labels{"namespace": namespace, "name": name}
	m.Condition.DeletePartialMatch(opt)
	m.ReconcilerErrors.DeletePartialMatch(opt)
	m.InvalidObjects.DeletePartialMatch(opt)
}

// Collectors lists every series for registration.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.EndpointWeight, m.ReconcilerErrors, m.QueryLatency, m.QueryErrors, m.PodCPU,
		m.PodRequestRate, m.PodCapacity, m.Cycles, m.Alarms, m.Writes, m.Fallbacks, m.Mode,
		m.WeightSpread, m.MaxWeightRatio, m.ServiceEndpoints, m.Condition, m.WatchErrors, m.SignalAvailable, m.TrafficCoverage,
		m.InvalidObjects, m.CycleLateness,
	}
}

// Register registers every series with r.
func (m *Metrics) Register(r prometheus.Registerer) error {
	for _, c := range m.Collectors() {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// PodSample is what is published for one pod.
type PodSample struct {
	Pod, IP, Locality string
	Weight            uint32
	// Signals says CPU, RequestRate and Capacity are this cycle's values:
	// a nil one deletes its series. Without it they are left as they are.
	Signals     bool
	CPU         *float64
	RequestRate *float64
	Capacity    *float64
}

// SetPods publishes the per-pod series of a service and deletes the series
// of pods that are no longer in the set.
func (m *Metrics) SetPods(namespace, service string, pods []PodSample) {
	m.pods.set(serviceKey{namespace, service}, pods)
}

// SetMode publishes the engine's mode as a one-hot gauge.
func (m *Metrics) SetMode(namespace, service, mode string) {
	m.Mode.DeletePartialMatch(prometheus.Labels{"service_namespace": namespace, "service_name": service})
	m.Mode.WithLabelValues(namespace, service, mode).Set(1)
}

// ForgetService deletes every series of a service whose optimizer is gone.
func (m *Metrics) ForgetService(namespace, service string) {
	m.pods.forget(serviceKey{namespace, service})
	svc := prometheus.Labels{"service_namespace": namespace, "service_name": service}
	for _, v := range []interface {
		DeletePartialMatch(prometheus.Labels) int
	}{m.QueryLatency, m.QueryErrors,
		m.Cycles, m.Alarms, m.Writes, m.Fallbacks, m.Mode, m.WeightSpread, m.MaxWeightRatio, m.ServiceEndpoints, m.SignalAvailable, m.TrafficCoverage} {
		v.DeletePartialMatch(svc)
	}
}

// ReconcileError counts an error of a reconciler.
func (m *Metrics) ReconcileError(controller, errType, name, namespace string) {
	m.ReconcilerErrors.WithLabelValues(controller, errType, name, namespace).Inc()
}
