// Package scale measures what the operator costs as Services grow: reconcile
// time, memory, ServiceEntry size and query sizes (reconcile_test.go), and
// the manager binary's memory with many optimizers (manager_test.go). The
// figures are in docs/scale.md. `make test` runs the small sizes; `make
// scale` (SCALE=full) runs the sizes the documentation reports.
package scale

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// full reports whether the documented sizes run (make scale).
func full() bool { return os.Getenv("SCALE") == "full" }

// podName is a Deployment pod's name, the length real ones have.
func podName(svc string, i int) string { return fmt.Sprintf("%s-7f9c8d6b5-%05d", svc, i) }

// serviceInput is what the mirror reads for one Service of n ready pods
// with sidecars, CPU limits and zoned nodes, with weights from the engine.
func serviceInput(ns, svc string, n int) desired.Input {
	opt := Optimizer(ns, svc, svc)
	in := desired.Input{
		Optimizer: opt,
		Service:   Service(ns, svc, ServicePort("http", 80, intstr.FromInt32(8080))),
		Pods:      map[string]*corev1.Pod{},
		Nodes:     map[string]*corev1.Node{},
		Weights:   map[string]uint32{},
	}
	for z := range 3 {
		node := fmt.Sprintf("node-%d", z)
		in.Nodes[node] = Node(node, "eu-west", fmt.Sprintf("eu-west-%c", 'a'+z), "", "m5.large")
	}
	for s := 0; s*1000 < n; s++ {
		var eps []Endpoint
		for i := s * 1000; i < min(n, (s+1)*1000); i++ {
			name, node := podName(svc, i), fmt.Sprintf("node-%d", i%3)
			in.Pods[name] = Pod(ns, name, svc, node, WithSidecar(), WithCPULimit("2"))
			in.Weights[name] = uint32(500 + i%1000)
			eps = append(eps, Ready(name, IP(i/250, i%250+1), node))
		}
		in.Slices = append(in.Slices, *EndpointSlice(ns, fmt.Sprintf("%s-%d", svc, s), svc, []SlicePort{{Name: "http", Port: 8080}}, eps...))
	}
	return in
}

// figures of one size.
type figures struct {
	p50, p99     time.Duration
	cpuPerRun    time.Duration // process CPU time (GC included) per run
	allocPerRun  uint64
	seBytes      int
	queryBytes   int
	chunks       int
	longestChunk int
}

// measure runs what one reconcile of an unchanged Service costs the
// operator's own code: desired.Compute plus the up-to-date check against
// the live objects, runs times.
func measure(t *testing.T, inputs []desired.Input, runs int) figures {
	t.Helper()
	live := make([]desired.Result, len(inputs))
	for i, in := range inputs {
		live[i] = desired.Compute(in)
		if n := len(in.Pods); len(live[i].Endpoints) != n {
			t.Fatalf("%d endpoints routed of %d pods", len(live[i].Endpoints), n)
		}
	}
	var times []time.Duration
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cpuBefore := cpuTime()
	for range runs {
		start := time.Now()
		for i, in := range inputs {
			r := desired.Compute(in)
			if !desired.UpToDate("istio-adaptive-optimizer", r.ServiceEntry, live[i].ServiceEntry, &r.ServiceEntry.Spec, &live[i].ServiceEntry.Spec) {
				t.Fatal("an unchanged Service is not up to date")
			}
		}
		times = append(times, time.Since(start))
	}
	cpu := cpuTime() - cpuBefore
	runtime.ReadMemStats(&after)
	slices.Sort(times)
	f := figures{
		p50:         times[len(times)/2],
		p99:         times[min(len(times)-1, len(times)*99/100)],
		allocPerRun: (after.TotalAlloc - before.TotalAlloc) / uint64(runs),
		cpuPerRun:   cpu / time.Duration(runs),
	}
	for i, in := range inputs {
		f.seBytes += proto.Size(&live[i].ServiceEntry.Spec)
		target := promsource.Target{Namespace: in.Service.Namespace, Service: in.Service.Name, Window: time.Minute}
		for _, ep := range live[i].Endpoints {
			target.Pods = append(target.Pods, ep.Pod)
		}
		whole, err := promsource.Render(promsource.DefaultCPUQuery, target)
		if err != nil {
			t.Fatal(err)
		}
		qs, err := promsource.ChunkQueries(promsource.DefaultCPUQuery, target, promsource.DefaultMaxQueryLength)
		if err != nil {
			t.Fatal(err)
		}
		f.queryBytes = max(f.queryBytes, len(whole))
		f.chunks += len(qs)
		for _, q := range qs {
			f.longestChunk = max(f.longestChunk, len(q))
		}
	}
	return f
}

// TestReconcileCostAtScale reports the cost of one reconcile and the object
// and query sizes per Service size. It asserts what must hold at any size
// (every pod routed, every query under the limit); times are reported, not
// asserted (docs/scale.md has them with the command).
func TestReconcileCostAtScale(t *testing.T) {
	type scenario struct {
		name           string
		services, pods int
		runs           int
	}
	cases := []scenario{{"1 x 200 pods", 1, 200, 20}}
	if full() {
		cases = []scenario{
			{"1 x 500 pods", 1, 500, 200},
			{"1 x 2000 pods", 1, 2000, 200},
			{"1 x 4000 pods", 1, 4000, 200},
			{"1 x 4096 pods", 1, desired.MaxEndpoints, 100},
			{"200 x 20 pods", 200, 20, 100},
		}
	}
	t.Logf("%-14s %10s %10s %10s %12s %12s %12s %8s %12s", "services", "p50", "p99", "CPU/rec", "alloc/rec", "SE bytes", "query bytes", "chunks", "max chunk")
	for _, sc := range cases {
		var inputs []desired.Input
		for s := range sc.services {
			inputs = append(inputs, serviceInput(fmt.Sprintf("team-%03d", s), "checkout", sc.pods))
		}
		f := measure(t, inputs, sc.runs)
		if f.longestChunk > promsource.DefaultMaxQueryLength {
			t.Errorf("%s: a query chunk of %d bytes, over the %d limit", sc.name, f.longestChunk, promsource.DefaultMaxQueryLength)
		}
		t.Logf("%-14s %10v %10v %10v %10.1fKiB %10.1fKiB %10.1fKiB %8d %10.1fKiB", sc.name,
			f.p50.Round(10*time.Microsecond), f.p99.Round(10*time.Microsecond), f.cpuPerRun.Round(10*time.Microsecond), float64(f.allocPerRun)/1024,
			float64(f.seBytes)/1024, float64(f.queryBytes)/1024, f.chunks, float64(f.longestChunk)/1024)
	}
}

// Beyond the limit the Service is refused whole, never cut (see
// desired.ReasonTooManyEndpoints).
func TestBeyondTheLimitNothingIsComputed(t *testing.T) {
	if !full() {
		t.Skip("4097-pod input built with SCALE=full only; desired's own test covers the rule")
	}
	r := desired.Compute(serviceInput("team", "checkout", desired.MaxEndpoints+1))
	if r.ServiceEntry != nil || len(r.Problems) == 0 || r.Problems[0].Reason != desired.ReasonTooManyEndpoints {
		t.Fatalf("problems %+v, ServiceEntry %v", r.Problems, r.ServiceEntry != nil)
	}
}

// cpuTime is the CPU time the process used so far (user and system): on a
// shared machine it shows the work where wall-clock times show the queue.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
