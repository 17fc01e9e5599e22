package metrics

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// The per-pod series (endpoint_weight and the optimizer_pod_* gauges) are
// produced at scrape time from one small record per pod instead of being
// kept as client_golang vectors. A vector keeps a metric and its label
// pairs for each series, about 700 bytes, and a manager with 10 000 pods
// published four series for each: 29 MiB of its 98 MiB live heap at 200
// optimizers x 50 pods. Building the label pairs at every scrape instead
// allocated 39 MB a scrape. A record keeps its label pairs, built once
// per pod and shared by its series and by the next record of the same pod
// (BenchmarkScrape10000Pods). A pod that is gone has no record, so its
// series cannot be left stale.

// podRecord is what is published for one pod; NaN means no series. A
// record is never modified once stored: a scrape may still read the
// records a later set replaced.
type podRecord struct {
	pod, ip, locality   string
	weight              uint32
	cpu, rate, capacity float64
	// Label pairs, sorted by name as the registry expects.
	endpointLabels, podLabels []*dto.LabelPair
}

// podStore holds the records of every service.
type podStore struct {
	mu       sync.RWMutex
	services map[serviceKey][]podRecord
}

// set replaces a service's records. Without Signals a pod keeps the CPU,
// request rate and capacity it had.
func (s *podStore) set(sk serviceKey, pods []PodSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.services[sk]
	old := make(map[podKey]*podRecord, len(prev))
	for i := range prev {
		r := &prev[i]
		old[podKey{r.pod, r.ip, r.locality}] = r
	}
	var nsPair, svcPair *dto.LabelPair
	if len(prev) > 0 {
		// The service's pairs are the last two of every record's.
		l := prev[0].podLabels
		nsPair, svcPair = l[len(l)-1], l[len(l)-2]
	} else {
		nsPair, svcPair = pair("service_namespace", sk.namespace), pair("service_name", sk.name)
	}
	recs := make([]podRecord, 0, len(pods))
	for _, p := range pods {
		r := podRecord{pod: p.Pod, ip: p.IP, locality: p.Locality, weight: p.Weight, cpu: math.NaN(), rate: math.NaN(), capacity: math.NaN()}
		o := old[podKey{p.Pod, p.IP, p.Locality}]
		if p.Signals {
			r.cpu, r.rate, r.capacity = orNaN(p.CPU), orNaN(p.RequestRate), orNaN(p.Capacity)
		} else if o != nil {
			r.cpu, r.rate, r.capacity = o.cpu, o.rate, o.capacity
		}
		if o != nil {
			r.endpointLabels, r.podLabels = o.endpointLabels, o.podLabels
		} else {
			loc, ip := pair("locality", p.Locality), pair("pod_ip", p.IP)
			r.endpointLabels = []*dto.LabelPair{loc, ip, svcPair, nsPair}
			r.podLabels = []*dto.LabelPair{loc, pair("pod", p.Pod), ip, svcPair, nsPair}
		}
		recs = append(recs, r)
	}
	s.services[sk] = recs
}

func pair(name, value string) *dto.LabelPair {
	return &dto.LabelPair{Name: proto.String(name), Value: proto.String(value)}
}

func orNaN(v *float64) float64 {
	if v == nil || math.IsNaN(*v) {
		return math.NaN()
	}
	return *v
}

func (s *podStore) forget(sk serviceKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.services, sk)
}

// podFamily is one metric family over the store.
type podFamily struct {
	store *podStore
	desc  *prometheus.Desc
	// endpoint: labelled by address (endpoint_weight), not by pod.
	endpoint bool
	value    func(*podRecord) float64
}

func newPodFamily(store *podStore, name, help string, endpoint bool, value func(*podRecord) float64) *podFamily {
	labels := podLabels
	if endpoint {
		labels = endpointLabels
	}
	return &podFamily{store: store, desc: prometheus.NewDesc(name, help, labels, nil), endpoint: endpoint, value: value}
}

func (f *podFamily) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }

func (f *podFamily) Collect(ch chan<- prometheus.Metric) {
	// The lock is held only to take the services' record slices, which are
	// never modified once stored: sending a scrape's 40 000 series held it
	// for about 0.2 s at 10 000 pods, and every reconcile's set waited.
	f.store.mu.RLock()
	all := make([][]podRecord, 0, len(f.store.services))
	for _, recs := range f.store.services {
		all = append(all, recs)
	}
	f.store.mu.RUnlock()
	for _, recs := range all {
		// Two records with one address (a pod gone and its IP reused
		// within a cycle) would be a duplicate series, which fails the
		// whole scrape: the later one wins.
		var seen map[[2]string]bool
		if f.endpoint {
			seen = make(map[[2]string]bool, len(recs))
		}
		for i := len(recs) - 1; i >= 0; i-- {
			r := &recs[i]
			v := f.value(r)
			if math.IsNaN(v) {
				continue
			}
			labels := r.podLabels
			if f.endpoint {
				k := [2]string{r.ip, r.locality}
				if seen[k] {
					continue
				}
				seen[k] = true
				labels = r.endpointLabels
			}
			ch <- &podMetric{desc: f.desc, labels: labels, value: v}
		}
	}
}

// podMetric is one series of a scrape. Its label pairs are shared with
// the record and must not be modified (the registry only reads them).
type podMetric struct {
	desc   *prometheus.Desc
	labels []*dto.LabelPair
	value  float64
}

func (m *podMetric) Desc() *prometheus.Desc { return m.desc }

func (m *podMetric) Write(out *dto.Metric) error {
	out.Label = m.labels
	out.Gauge = &dto.Gauge{Value: proto.Float64(m.value)}
	return nil
}

// EndpointWeightValue is the endpoint_weight a scrape would show for an
// endpoint of a service; ok is false when there is no such series.
func (m *Metrics) EndpointWeightValue(namespace, service, ip, locality string) (v float64, ok bool) {
	m.pods.mu.RLock()
	defer m.pods.mu.RUnlock()
	recs := m.pods.services[serviceKey{namespace, service}]
	for i := len(recs) - 1; i >= 0; i-- { // the later record wins, as in Collect
		if r := &recs[i]; r.ip == ip && r.locality == locality {
			return float64(r.weight), true
		}
	}
	return 0, false
}
