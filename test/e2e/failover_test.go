package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// replica is one manager process of a highly available install.
type replica struct {
	name        string
	cmd         *exec.Cmd
	metricsAddr string
	log         string
	exited      chan struct{}
}

// TestLeaderFailover runs the manager binary three times against one API
// server with leader election on, as the chart's and config/manager's two
// replicas do, and shows that only the leader runs weight cycles and that
// another replica takes over and resumes them when the leader goes:
//
//   - stopped gracefully (SIGTERM, a rolling update or a drain): the leader
//     releases its Lease on the way out (LeaderElectionReleaseOnCancel),
//     which the Lease shows as soon as the process has exited;
//   - killed (SIGKILL, a node failure): the Lease must expire first
//     (controller-runtime's default lease duration, 15 s).
//
// How long each takeover took is logged, not asserted (README, Availability).
func TestLeaderFailover(t *testing.T) {
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	defer api.Stop()
	bin := harness.BuildBinary(t, "./cmd")

	c, err := client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	const ns, leaseNS = "shop", "istio-adaptive-system"
	for _, o := range []client.Object{
		Namespace(ns), Namespace(leaseNS),
		Node("node-1", "us-east", "us-east-1a", "", "c5.xlarge"),
		Service(ns, "cart", ServicePort("http-web", 80, intstr.FromInt32(8080))),
		Pod(ns, "cart-0", "cart", "node-1", WithSidecar()),
		Pod(ns, "cart-1", "cart", "node-1", WithSidecar()),
		EndpointSlice(ns, "cart-abc", "cart", []SlicePort{{Name: "http-web", Port: 8080}},
			Ready("cart-0", IP(9, 1), "node-1"), Ready("cart-1", IP(9, 2), "node-1")),
		Optimizer(ns, "cart", "cart"),
	} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}

	start := func(name string) *replica {
		r := &replica{name: name, metricsAddr: freePort(t), log: filepath.Join(t.TempDir(), name+".log"), exited: make(chan struct{})}
		logFile, err := os.Create(r.log)
		if err != nil {
			t.Fatal(err)
		}
		// Nothing listens on the metrics backend's port: every cycle's query
		// fails fast and the cycle still runs (weights held, then equal),
		// which is all this test needs to see.
		r.cmd = exec.Command(bin,
			"--kubeconfig", api.Kubeconfig,
			"--leader-elect=true", "--leader-election-namespace", leaseNS,
			"--metrics-bind-address", r.metricsAddr, "--metrics-secure=false",
			"--health-probe-bind-address", freePort(t),
			"--prometheus-url", "http://127.0.0.1:1",
			"--default-cycle=1s",
		)
		r.cmd.Stdout, r.cmd.Stderr = logFile, logFile
		if err := r.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = r.cmd.Wait(); _ = logFile.Close(); close(r.exited) }()
		t.Cleanup(func() {
			_ = r.cmd.Process.Signal(os.Interrupt)
			select {
			case <-r.exited:
			case <-time.After(10 * time.Second):
				_ = r.cmd.Process.Kill()
			}
			if t.Failed() {
				data, _ := os.ReadFile(r.log)
				t.Logf("%s log:\n%s", r.name, tail(string(data), 3000))
			}
		})
		return r
	}

	a := start("replica-a")
	waitLeader := func(timeout time.Duration, candidates ...*replica) *replica {
		t.Helper()
		var leader *replica
		harness.Eventually(t, timeout, "a leader among the running replicas", func() error {
			for _, r := range candidates {
				if leaderStatus(r) == 1 {
					leader = r
					return nil
				}
			}
			return fmt.Errorf("none of %d replicas leads", len(candidates))
		})
		return leader
	}
	if got := waitLeader(30*time.Second, a); got != a {
		t.Fatalf("the only replica did not lead")
	}
	waitCycles(t, a, 1, 30*time.Second)
	b := start("replica-b")
	// b is up (it serves metrics) but does not lead and runs no cycle.
	harness.Eventually(t, 30*time.Second, "replica-b serves metrics", func() error {
		if leaderStatus(b) < 0 {
			return fmt.Errorf("no leader_election_master_status yet")
		}
		return nil
	})
	if leaderStatus(b) == 1 {
		t.Fatal("replica-b leads while replica-a holds the Lease")
	}

	takeover := func(how string, leader *replica, sig syscall.Signal, standby *replica) {
		t.Helper()
		before := cyclesTotal(t, standby)
		if before != 0 {
			t.Errorf("standby %s ran %v weight cycles before leading; only the leader may", standby.name, before)
		}
		held := leaseHolder(ctx, t, c, leaseNS)
		stopped := time.Now()
		if err := leader.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		<-leader.exited
		if sig == syscall.SIGTERM {
			// Released on the way out: the Lease names no holder, or
			// already the standby, well before the lease duration (15 s)
			// could have freed it.
			if now := leaseHolder(ctx, t, c, leaseNS); now == held {
				t.Errorf("%s exited on SIGTERM still holding the Lease (%s): it was not released", leader.name, held)
			}
		}
		if got := waitLeader(60*time.Second, standby); got != standby {
			t.Fatalf("%s did not take over", standby.name)
		}
		led := time.Since(stopped)
		waitCycles(t, standby, 1, 30*time.Second)
		cycled := time.Since(stopped)
		holder := leaseHolder(ctx, t, c, leaseNS)
		t.Logf("Takeover after the leader was %s: %s leads after %v, its first weight cycle after %v (Lease holder %s)",
			how, standby.name, led.Round(100*time.Millisecond), cycled.Round(100*time.Millisecond), holder)
	}
	takeover("stopped (SIGTERM, Lease released)", a, syscall.SIGTERM, b)

	c3 := start("replica-c")
	harness.Eventually(t, 30*time.Second, "replica-c serves metrics", func() error {
		if leaderStatus(c3) < 0 {
			return fmt.Errorf("no leader_election_master_status yet")
		}
		return nil
	})
	takeover("killed (SIGKILL, Lease left to expire)", b, syscall.SIGKILL, c3)
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

var (
	leaderRE = regexp.MustCompile(`(?m)^leader_election_master_status\{[^}]*\} (\S+)$`)
	cyclesRE = regexp.MustCompile(`(?m)^optimizer_cycles_total\{[^}]*\} (\S+)$`)
)

// leaderStatus is controller-runtime's leader_election_master_status of a
// replica: 1 leading, 0 not, -1 not answering yet.
func leaderStatus(r *replica) float64 {
	body, err := scrapeMetrics(r)
	if err != nil {
		return -1
	}
	m := leaderRE.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// cyclesTotal sums the replica's optimizer_cycles_total over all modes.
func cyclesTotal(t *testing.T, r *replica) float64 {
	t.Helper()
	body, err := scrapeMetrics(r)
	if err != nil {
		t.Fatalf("scrape %s: %v", r.name, err)
	}
	var sum float64
	for _, m := range cyclesRE.FindAllStringSubmatch(body, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

func waitCycles(t *testing.T, r *replica, n float64, timeout time.Duration) {
	t.Helper()
	harness.Eventually(t, timeout, r.name+" runs weight cycles", func() error {
		if got := cyclesTotal(t, r); got < n {
			return fmt.Errorf("optimizer_cycles_total = %v", got)
		}
		return nil
	})
}

func scrapeMetrics(r *replica) (string, error) {
	select {
	case <-r.exited:
		return "", fmt.Errorf("%s exited", r.name)
	default:
	}
	resp, err := httpClient.Get("http://" + r.metricsAddr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, err = io.Copy(&b, resp.Body)
	return b.String(), err
}

func leaseHolder(ctx context.Context, t *testing.T, c client.Client, ns string) string {
	t.Helper()
	var leases coordinationv1.LeaseList
	if err := c.List(ctx, &leases, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Items {
		if l.Spec.HolderIdentity != nil {
			return l.Name + "=" + *l.Spec.HolderIdentity
		}
	}
	return "(none)"
}
