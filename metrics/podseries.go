package metrics

import (
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// The per-pod series (endpoint_weight and the optimizer_pod_* gauges) are
// produced at scrape time from one compact record per pod instead of being
// kept as client_golang vectors: a vector keeps a metric object and its
// label pairs per series, about 700 bytes, and a manager with 10 000 pods
// published four of them for each (29 MiB of its 98 MiB live heap at 200
// optimizers x 50 pods). A record is about 90 bytes and shares its strings
// with the weight book. A pod that is gone has no record, so its series
// cannot be left stale.

// podRecord is what is published for one pod; NaN means no series.
type podRecord struct {
	pod, ip, locality   string
	weight              uint32
	cpu, rate, capacity float64
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
	var old map[podKey]*podRecord
	if prev := s.services[sk]; len(prev) > 0 && !allSignals(pods) {
		old = make(map[podKey]*podRecord, len(prev))
		for i := range prev {
			r := &prev[i]
			old[podKey{r.pod, r.ip, r.locality}] = r
		}
	}
	recs := make([]podRecord, 0, len(pods))
	for _, p := range pods {
		r := podRecord{pod: p.Pod, ip: p.IP, locality: p.Locality, weight: p.Weight, cpu: math.NaN(), rate: math.NaN(), capacity: math.NaN()}
		if p.Signals {
			r.cpu, r.rate, r.capacity = orNaN(p.CPU), orNaN(p.RequestRate), orNaN(p.Capacity)
		} else if o := old[podKey{p.Pod, p.IP, p.Locality}]; o != nil {
			r.cpu, r.rate, r.capacity = o.cpu, o.rate, o.capacity
		}
		recs = append(recs, r)
	}
	s.services[sk] = recs
}

func allSignals(pods []PodSample) bool {
	for _, p := range pods {
		if !p.Signals {
			return false
		}
	}
	return true
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
	f.store.mu.RLock()
	defer f.store.mu.RUnlock()
	for sk, recs := range f.store.services {
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
			if f.endpoint {
				k := [2]string{r.ip, r.locality}
				if seen[k] {
					continue
				}
				seen[k] = true
				ch <- prometheus.MustNewConstMetric(f.desc, prometheus.GaugeValue, v, sk.namespace, sk.name, r.ip, r.locality)
				continue
			}
			ch <- prometheus.MustNewConstMetric(f.desc, prometheus.GaugeValue, v, sk.namespace, sk.name, r.pod, r.ip, r.locality)
		}
	}
}
