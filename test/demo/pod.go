package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/test/fakepod"
)

// simPod is a simulated pod: a real HTTP server on its own loopback address
// with a fixed number of workers. A request waits in a first-come
// first-served queue for a worker, then holds it for work/speed (a sleep
// emulating CPU time, so the demo needs almost no real CPU). The time
// workers are busy is the pod's CPU usage: it is exported, with the served
// request count, on the pod's own /metrics as cAdvisor's
// container_cpu_usage_seconds_total and Istio's istio_requests_total
// (test/fakepod), and Prometheus scrapes it every second.
//
// Each worker keeps its own clock of when it is nominally free: a request
// starts at the later of its arrival and that time, and ends exactly
// work/speed later. On a loaded machine a sleep can wake late; the lateness
// then shows in that request's latency but is not added to the worker's
// busy time, so it does not eat the pod's capacity or pile up in its queue.
type simPod struct {
	podSpec
	work        time.Duration // mean service time at speed 1
	exponential bool

	addr string       // loopback host:port the server listens on
	free chan *worker // idle workers; waiting receivers are served in order
	exp  *fakepod.Exporter
	srv  *http.Server
	done chan struct{}

	waiting   atomic.Int64
	abandoned atomic.Int64

	mu       sync.Mutex
	busyDone time.Duration
	inflight map[uint64]span
	nextID   uint64
	served   int64
	// what has been added to the exporter's counters
	reportedBusy   time.Duration
	reportedServed int64
}

// worker is one of a pod's workers (a CPU core).
type worker struct {
	freeAt time.Time // when its last request nominally ended
}

// span is a request's nominal service interval.
type span struct{ start, end time.Time }

// loopbackAddr is the address pod i listens on: 127.77.0.<i+1>. Any address
// in 127.0.0.0/8 reaches the loopback interface on Linux.
func loopbackAddr(i int) string { return fmt.Sprintf("127.77.%d.%d", (i+1)/256, (i+1)%256) }

func startPod(spec podSpec, namespace string, work time.Duration, exponential bool) (*simPod, error) {
	exp, err := fakepod.New(fakepod.Pod{Name: spec.Name, Namespace: namespace, Speed: spec.Speed,
		Cores: float64(spec.Workers), Workload: "api", Service: "api"})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", loopbackAddr(spec.Index)+":0")
	if err != nil {
		return nil, fmt.Errorf("pod %s: listen on %s: %w", spec.Name, loopbackAddr(spec.Index), err)
	}
	p := &simPod{
		podSpec: spec, work: work, exponential: exponential,
		addr: ln.Addr().String(), free: make(chan *worker, spec.Workers), exp: exp,
		inflight: map[uint64]span{}, done: make(chan struct{}),
	}
	for range spec.Workers {
		p.free <- &worker{}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", p.exporterHandler())
	mux.HandleFunc("/", p.serve)
	p.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(p.done)
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("pod %s: serve: %v\n", spec.Name, err)
		}
	}()
	return p, nil
}

// exporterHandler brings the counters up to date, then serves them, so each
// scrape sees the busy time up to that instant (requests in progress
// included), as cAdvisor would.
func (p *simPod) exporterHandler() http.Handler {
	h := p.exp.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.report()
		h.ServeHTTP(w, r)
	})
}

func (p *simPod) serve(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	p.waiting.Add(1)
	var wk *worker
	select {
	case wk = <-p.free:
		p.waiting.Add(-1)
	case <-r.Context().Done(): // the client gave up while queued
		p.waiting.Add(-1)
		p.abandoned.Add(1)
		return
	}
	d := p.work
	if p.exponential {
		d = time.Duration(rand.ExpFloat64() * float64(d))
	}
	d = time.Duration(float64(d) / p.Speed)
	sp := span{start: arrived, end: arrived.Add(d)}
	if wk.freeAt.After(arrived) {
		sp = span{start: wk.freeAt, end: wk.freeAt.Add(d)}
	}
	wk.freeAt = sp.end
	id := p.begin(sp)
	time.Sleep(time.Until(sp.end)) // the work goes on even if the client left, as CPU would
	p.end(id, sp)
	p.free <- wk
	_, _ = w.Write([]byte("ok\n"))
}

func (p *simPod) begin(sp span) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextID++
	p.inflight[p.nextID] = sp
	return p.nextID
}

func (p *simPod) end(id uint64, sp span) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.inflight, id)
	p.busyDone += sp.end.Sub(sp.start)
	p.served++
}

// busyLocked is the busy time up to now: finished requests plus the part of
// each request in progress that has elapsed. It never decreases.
func (p *simPod) busyLocked(now time.Time) time.Duration {
	b := p.busyDone
	for _, sp := range p.inflight {
		switch {
		case now.After(sp.end):
			b += sp.end.Sub(sp.start)
		case now.After(sp.start):
			b += now.Sub(sp.start)
		}
	}
	return b
}

// busy is the pod's cumulative busy time (CPU-seconds) up to now, requests
// in progress included.
func (p *simPod) busy() time.Duration {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.busyLocked(now)
}

// report adds the busy time and requests since the last report to the
// exporter's counters.
func (p *simPod) report() {
	now := time.Now()
	p.mu.Lock()
	b := p.busyLocked(now)
	dBusy := b - p.reportedBusy
	dServed := p.served - p.reportedServed
	if dBusy > 0 {
		p.reportedBusy = b
	}
	p.reportedServed = p.served
	p.mu.Unlock()
	if dBusy > 0 {
		_ = p.exp.AddCPU(p.Name, dBusy.Seconds())
	}
	if dServed > 0 {
		_ = p.exp.AddRequests(p.Name, float64(dServed))
	}
}

func (p *simPod) stop(ctx context.Context) {
	_ = p.srv.Shutdown(ctx)
	_ = p.srv.Close()
	<-p.done
}
