package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/liorfranko/istio-adaptive-least-request/test/edf"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// endpointWeight is one endpoint a sidecar balances over.
type endpointWeight struct {
	Address string
	Weight  uint32
}

// weightSource is where a sidecar learns its endpoints, their weights and
// the cluster's load-balancing policy ("ROUND_ROBIN" or "LEAST_REQUEST").
type weightSource interface {
	Endpoints(ctx context.Context) ([]endpointWeight, string, error)
	Close()
}

// xdsSource reads what istiod sends a sidecar: the cluster the route for the
// Kubernetes Service's host:port leads to (the optimized host's, through the
// operator's VirtualService), and that cluster's endpoints with their weights.
// Like Envoy, only the highest-priority group of endpoints is used.
type xdsSource struct {
	x    *harness.XDSClient
	host string
	port int
}

func (s *xdsSource) Endpoints(context.Context) ([]endpointWeight, string, error) {
	if err := s.x.Err(); err != nil {
		return nil, "", fmt.Errorf("xDS stream: %w", err)
	}
	cluster, err := s.x.RouteCluster(s.host, s.port)
	if err != nil {
		return nil, "", err
	}
	info, err := s.x.Cluster(cluster)
	if err != nil {
		return nil, "", err
	}
	eps, err := s.x.Endpoints(cluster)
	if err != nil {
		return nil, "", err
	}
	best := uint32(1 << 31)
	for _, e := range eps {
		if usable(e.Health) && e.Priority < best {
			best = e.Priority
		}
	}
	var out []endpointWeight
	for _, e := range eps {
		if usable(e.Health) && e.Priority == best {
			out = append(out, endpointWeight{Address: e.Address, Weight: e.Weight})
		}
	}
	return out, info.LbPolicy, nil
}

func usable(health string) bool { return health == "HEALTHY" || health == "UNKNOWN" || health == "" }

func (s *xdsSource) Close() { s.x.Close() }

// seSource reads the weights straight from the operator's ServiceEntry and
// the policy from its DestinationRule, for machines without istiod. Before
// the optimizer exists it reads the Service's EndpointSlice: equal weights
// and Istio's default LEAST_REQUEST, what a sidecar has for a plain Service.
type seSource struct {
	c     client.Client
	key   client.ObjectKey
	slice client.ObjectKey
}

func (s *seSource) Endpoints(ctx context.Context) ([]endpointWeight, string, error) {
	se := &istionet.ServiceEntry{}
	var out []endpointWeight
	switch err := s.c.Get(ctx, s.key, se); {
	case apierrors.IsNotFound(err):
		es := &discoveryv1.EndpointSlice{}
		if err := s.c.Get(ctx, s.slice, es); err != nil {
			return nil, "", err
		}
		for _, e := range es.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				out = append(out, endpointWeight{Address: e.Addresses[0], Weight: 1})
			}
		}
		return out, "LEAST_REQUEST", nil
	case err != nil:
		return nil, "", err
	}
	for _, e := range se.Spec.Endpoints {
		out = append(out, endpointWeight{Address: e.Address, Weight: e.Weight})
	}
	policy := "LEAST_REQUEST" // Istio's default without a DestinationRule
	dr := &istionet.DestinationRule{}
	if err := s.c.Get(ctx, s.key, dr); err == nil {
		if p := dr.Spec.GetTrafficPolicy().GetLoadBalancer().GetSimple().String(); p == "ROUND_ROBIN" {
			policy = p
		}
	}
	return out, policy, nil
}

func (s *seSource) Close() {}

// sidecar is one load generator acting as a client's sidecar: Poisson
// arrivals at its own rate, each request sent to the pod Envoy's load
// balancer picks for the cluster's policy, over a connection pool of its
// own, with a timeout. ROUND_ROBIN: an EDF schedule over the weights this
// sidecar currently has. LEAST_REQUEST: with equal weights, the less busy of
// two random hosts (power of two choices on this sidecar's own requests in
// flight); with unequal weights, the EDF schedule re-adding the picked host
// at weight/(active+1), as Envoy does. It polls its
// weight source every 500 ms and, like Envoy, rebuilds its schedule at a
// random offset when the host set or a weight changes.
type sidecar struct {
	id     int
	rate   float64 // requests per second
	src    weightSource
	byAddr map[string]int // EndpointSlice address -> pod index
	pods   []*simPod
	http   *http.Client
	rec    *recorder
	rng    *rand.Rand // arrivals (generate's goroutine only)

	mu      sync.Mutex
	offsets *rand.Rand // least request's random picks, under mu
	// lbSeed is the load balancer's seed, drawn once as Envoy draws it:
	// where each rebuilt schedule starts (edf.Rebuild).
	lbSeed  uint64
	hosts   []int     // pod index per scheduler host
	weights []float64 // weight per scheduler host
	byPod   []uint32  // weight per pod index (0: not an endpoint)
	key     string
	policy  string // "ROUND_ROBIN" or "LEAST_REQUEST"
	equal   bool   // every weight the same
	active  []int  // requests in flight per pod index, under mu
	sched   edf.Scheduler
	synced  bool
	lastErr error

	unmapped atomic.Int64
	inflight sync.WaitGroup
}

func newSidecar(id int, rate float64, src weightSource, byAddr map[string]int, pods []*simPod, timeout time.Duration, rec *recorder, seed uint64) *sidecar {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &sidecar{
		id: id, rate: rate, src: src, byAddr: byAddr, pods: pods, rec: rec,
		http:    &http.Client{Transport: tr, Timeout: timeout},
		rng:     rand.New(rand.NewPCG(seed, uint64(id))),
		offsets: rand.New(rand.NewPCG(seed+1, uint64(id))),
		lbSeed:  rand.New(rand.NewPCG(seed+2, uint64(id))).Uint64(),
		byPod:   make([]uint32, len(pods)),
		active:  make([]int, len(pods)),
	}
}

// refresh reads the weight source and rebuilds the schedule on a change.
func (s *sidecar) refresh(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	eps, policy, err := s.src.Endpoints(rctx)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.lastErr = err // keep balancing over what we have, as Envoy does
		return
	}
	s.lastErr = nil
	var hosts []int
	var weights []float64
	byPod := make([]uint32, len(s.pods))
	var key strings.Builder
	for _, e := range eps {
		// The endpoint address is the pod's identifier (198.18.x.y); the
		// request goes to the pod's loopback server. Nothing is ever sent
		// to 198.18.0.0/15.
		i, ok := s.byAddr[e.Address]
		if !ok {
			s.unmapped.Add(1)
			continue
		}
		w := e.Weight
		if w == 0 {
			w = 1 // istiod sends weight 0 as 1
		}
		hosts = append(hosts, i)
		weights = append(weights, float64(w))
		byPod[i] = w
		key.WriteString(e.Address + "=" + strconv.FormatUint(uint64(w), 10) + ",")
	}
	key.WriteString(policy)
	if len(hosts) == 0 || key.String() == s.key {
		return
	}
	s.key, s.hosts, s.weights, s.byPod, s.policy = key.String(), hosts, weights, byPod, policy
	s.equal = !slices.ContainsFunc(weights, func(w float64) bool { return w != weights[0] })
	// Envoy rebuilds the EDF schedule at the sidecar's own point of the
	// weighted rotation, so that sidecars do not move in lock step. (With
	// equal weights Envoy's unweighted round robin starts at a random
	// index: the same sequence.)
	order := make([]int32, len(weights))
	for h := range order {
		order[h] = int32(h)
	}
	s.sched.Rebuild(order, s.effectiveWeight, s.lbSeed)
	s.synced = true
}

// Synced reports whether the sidecar has endpoints to send to.
func (s *sidecar) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.synced
}

// View returns the weight per pod index this sidecar currently uses (0 for
// a pod that is not an endpoint).
func (s *sidecar) View() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.byPod)
}

func (s *sidecar) LastErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// effectiveWeight is what the EDF schedule uses for scheduler host h:
// the weight, divided by (requests in flight + 1) under LEAST_REQUEST.
// Called under mu.
func (s *sidecar) effectiveWeight(h int32) float64 {
	if s.policy == "LEAST_REQUEST" {
		return s.weights[h] / float64(s.active[s.hosts[h]]+1)
	}
	return s.weights[h]
}

// Policy is the load-balancing policy the sidecar uses now.
func (s *sidecar) Policy() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy
}

// pick chooses the pod of the next request and counts it in flight; done
// must be called when it completes.
func (s *sidecar) pick() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pod int
	switch {
	case s.policy == "LEAST_REQUEST" && s.equal:
		a, b := s.hosts[s.offsets.IntN(len(s.hosts))], s.hosts[s.offsets.IntN(len(s.hosts))]
		pod = a
		if s.active[b] < s.active[a] {
			pod = b
		}
	case s.policy == "LEAST_REQUEST":
		// Re-added with the count seen at pick time, before this request.
		h := s.sched.Top()
		s.sched.Readd(s.effectiveWeight(h))
		pod = s.hosts[h]
	default:
		pod = s.hosts[s.sched.Pick(s.weights)]
	}
	s.active[pod]++
	return pod
}

func (s *sidecar) done(pod int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active[pod]--
}

// pollWeights refreshes every 500 ms until ctx is done.
func (s *sidecar) pollWeights(ctx context.Context) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.refresh(ctx)
		}
	}
}

// generate sends requests with Poisson arrivals until stop is closed, then
// waits for the requests in flight. abort cancels requests in flight.
func (s *sidecar) generate(stop <-chan struct{}, abort context.Context) {
	defer s.inflight.Wait()
	next := time.Now()
	timer := time.NewTimer(0)
	<-timer.C
	for {
		next = next.Add(time.Duration(s.rng.ExpFloat64() / s.rate * float64(time.Second)))
		if d := time.Until(next); d > 0 {
			timer.Reset(d)
			select {
			case <-stop:
				timer.Stop()
				return
			case <-timer.C:
			}
		} else {
			select {
			case <-stop:
				return
			default: // behind schedule: send at once
			}
		}
		pod := s.pick()
		s.inflight.Add(1)
		go s.send(abort, pod)
	}
}

func (s *sidecar) send(ctx context.Context, pod int) {
	defer s.inflight.Done()
	defer s.done(pod)
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.pods[pod].addr+"/work", nil)
	if err != nil {
		return
	}
	resp, err := s.http.Do(req)
	if err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
	}
	if ctx.Err() != nil {
		return // interrupted: not a measurement
	}
	lat := time.Since(start)
	outcome := outcomeOK
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			outcome = outcomeTimeout
			lat = s.http.Timeout
		} else {
			outcome = outcomeError
		}
	}
	s.rec.add(start, pod, lat, outcome)
}

func (s *sidecar) close() {
	s.src.Close()
	s.http.CloseIdleConnections()
}
