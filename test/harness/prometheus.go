package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PrometheusOptions configure StartPrometheus.
type PrometheusOptions struct {
	// Targets are host:port addresses serving /metrics (for example fakepod
	// exporters on loopback), scraped by one job named "fakepods" with
	// honor_labels: true, so the namespace and pod labels in the exposition are
	// kept, as Istio's kubernetes-pods job keeps them. Change them with SetTargets.
	Targets []string
	// ScrapeInterval is the scrape (and evaluation) interval. Zero means 1s.
	ScrapeInterval time.Duration
	// RoutePrefix serves every endpoint under a path prefix such as "/prometheus"
	// (--web.route-prefix and --web.external-url), as behind a reverse proxy.
	RoutePrefix string
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
	// ReadyTimeout bounds the wait for /-/ready. Zero means 60s.
	ReadyTimeout time.Duration
}

// Prometheus is a real Prometheus server (bin/prometheus, built by
// `make prometheus`) on a loopback port, with its own configuration and storage in
// a temporary directory.
type Prometheus struct {
	// URL is the base URL of the query API, prefix included (what a metrics
	// source is configured with): http://127.0.0.1:PORT[/prefix].
	URL string
	// Addr is the listen address, 127.0.0.1:PORT.
	Addr string
	// Dir holds the configuration, the targets file, the TSDB and the log.
	Dir string
	// LogPath is the file holding Prometheus's output (all runs, appended).
	LogPath string

	bin  string
	opts PrometheusOptions

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	stopped  bool
	stopOnce sync.Once
	stopErr  error
}

const prometheusTargetsFile = "targets.json"

// StartPrometheus starts Prometheus with opts and waits until it is ready. The
// binary is $PROMETHEUS_BIN or <repo>/bin/prometheus; if it is missing the error
// says to run `make prometheus`. Stop it with Stop.
func StartPrometheus(opts PrometheusOptions) (*Prometheus, error) {
	bin, err := Binary("prometheus", "PROMETHEUS_BIN", "prometheus")
	if err != nil {
		return nil, err
	}
	if opts.ScrapeInterval <= 0 {
		opts.ScrapeInterval = time.Second
	}
	if opts.ScrapeInterval%time.Millisecond != 0 {
		return nil, fmt.Errorf("scrape interval %v is not a whole number of milliseconds", opts.ScrapeInterval)
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = 60 * time.Second
	}
	if opts.RoutePrefix != "" {
		opts.RoutePrefix = "/" + strings.Trim(opts.RoutePrefix, "/")
	}

	// A free port can be taken between the probe and Prometheus's bind; retry
	// when Prometheus exits early.
	var lastErr error
	for range 3 {
		p, err := startPrometheusOnce(bin, opts)
		if err == nil {
			return p, nil
		}
		lastErr = err
		if !errors.Is(err, errPrometheusExited) {
			break
		}
	}
	return nil, lastErr
}

// MustStartPrometheus starts Prometheus for a test: it fails the test (never
// skips) if Prometheus cannot start, for example with "run `make prometheus`"
// when the binary is missing, and stops it when the test ends, logging the end
// of Prometheus's log if the test failed.
func MustStartPrometheus(t testing.TB, opts PrometheusOptions) *Prometheus {
	t.Helper()
	p, err := StartPrometheus(opts)
	if err != nil {
		t.Fatalf("start Prometheus: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- Prometheus log tail (%s) ---\n%s", p.URL, p.LogTail(30))
		}
		if err := p.Stop(); err != nil {
			t.Errorf("stop Prometheus: %v", err)
		}
	})
	return p
}

var errPrometheusExited = errors.New("prometheus exited before it was ready")

func startPrometheusOnce(bin string, opts PrometheusOptions) (*Prometheus, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "prometheus-")
	if err != nil {
		return nil, err
	}
	p := &Prometheus{
		Addr:    fmt.Sprintf("127.0.0.1:%d", ports[0]),
		Dir:     dir,
		LogPath: filepath.Join(dir, "prometheus.log"),
		bin:     bin,
		opts:    opts,
	}
	p.URL = "http://" + p.Addr + opts.RoutePrefix
	if err := p.writeConfig(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := p.SetTargets(opts.Targets); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := p.start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return p, nil
}

// writeConfig writes prometheus.yml (as JSON, which is YAML): one job scraping
// the targets listed in the targets file, which Prometheus watches.
func (p *Prometheus) writeConfig() error {
	interval := fmt.Sprintf("%dms", p.opts.ScrapeInterval/time.Millisecond)
	if p.opts.ScrapeInterval%time.Second == 0 {
		interval = fmt.Sprintf("%ds", p.opts.ScrapeInterval/time.Second)
	}
	cfg := map[string]any{
		"global": map[string]any{
			"scrape_interval":     interval,
			"scrape_timeout":      interval,
			"evaluation_interval": interval,
		},
		"scrape_configs": []any{map[string]any{
			"job_name":     "fakepods",
			"honor_labels": true,
			"file_sd_configs": []any{map[string]any{
				"files":            []string{filepath.Join(p.Dir, prometheusTargetsFile)},
				"refresh_interval": "1s",
			}},
		}},
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(p.Dir, "prometheus.yml"), data, 0o600)
}

// SetTargets replaces the scraped targets. Prometheus picks the change up within
// about a second (file service discovery); wait with WaitForTargets.
func (p *Prometheus) SetTargets(targets []string) error {
	groups := []map[string]any{}
	if len(targets) > 0 {
		groups = append(groups, map[string]any{"targets": targets})
	}
	data, err := json.Marshal(groups)
	if err != nil {
		return err
	}
	tmp := filepath.Join(p.Dir, prometheusTargetsFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(p.Dir, prometheusTargetsFile))
}

func (p *Prometheus) args() []string {
	args := []string{
		"--config.file=" + filepath.Join(p.Dir, "prometheus.yml"),
		"--storage.tsdb.path=" + filepath.Join(p.Dir, "data"),
		"--storage.tsdb.retention.time=1d",
		"--web.listen-address=" + p.Addr,
		"--log.level=info",
	}
	if p.opts.RoutePrefix != "" {
		args = append(args,
			"--web.external-url=http://"+p.Addr+p.opts.RoutePrefix,
			"--web.route-prefix="+p.opts.RoutePrefix,
		)
	}
	return append(args, p.opts.ExtraArgs...)
}

// start runs the process and waits for readiness.
func (p *Prometheus) start() error {
	logFile, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child holds its own descriptor

	cmd := exec.Command(p.bin, p.args()...)
	cmd.Dir = p.Dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	exited := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.exited, p.stopped = cmd, exited, false
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(exited)
	}()

	if err := p.waitReady(exited); err != nil {
		tail := p.LogTail(30)
		p.terminate(exited, cmd)
		return fmt.Errorf("%w\n--- prometheus log tail ---\n%s", err, tail)
	}
	return nil
}

func (p *Prometheus) waitReady(exited chan struct{}) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(p.opts.ReadyTimeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			p.mu.Lock()
			err := p.waitErr
			p.mu.Unlock()
			return fmt.Errorf("%w: %v", errPrometheusExited, err)
		default:
		}
		ok, status := probeReady(hc, p.URL+"/-/ready")
		if ok {
			return nil
		}
		last = status
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("prometheus not ready at %s/-/ready after %s (last: %s)", p.URL, p.opts.ReadyTimeout, last)
}

// terminate sends SIGTERM to the process group, then SIGKILL after 5s, and waits.
func (p *Prometheus) terminate(exited chan struct{}, cmd *exec.Cmd) {
	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGCONT) // a paused process cannot handle SIGTERM
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
	}
}

func (p *Prometheus) current() (*exec.Cmd, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd, p.exited
}

// Running reports whether the process is alive (paused counts as alive).
func (p *Prometheus) Running() bool {
	_, exited := p.current()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// Kill stops Prometheus abruptly (SIGKILL), as a crash would, keeping its port,
// configuration and storage, so Restart brings the same server back. Queries get
// "connection refused" meanwhile.
func (p *Prometheus) Kill() error {
	cmd, exited := p.current()
	if cmd == nil || !p.Running() {
		return errors.New("prometheus is not running")
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
	return nil
}

// Restart starts Prometheus again after Kill (or a crash) on the same address
// with the same storage (the TSDB replays its write-ahead log, so earlier samples
// stay queryable), and waits until it is ready.
func (p *Prometheus) Restart() error {
	if p.Running() {
		return errors.New("prometheus is still running: Kill it first")
	}
	p.mu.Lock()
	stopped := p.stopped
	p.mu.Unlock()
	if stopped {
		return errors.New("prometheus was stopped and its directory removed")
	}
	var err error
	for range 20 { // the port may take a moment to be free again
		if err = p.start(); err == nil || !errors.Is(err, errPrometheusExited) {
			return err
		}
		time.Sleep(250 * time.Millisecond)
	}
	return err
}

// Pause freezes Prometheus (SIGSTOP): connections are accepted by the kernel but
// never answered, so queries run into their timeouts. Resume undoes it. It
// returns once the process is stopped: kill(2) only queues the signal, and
// on a busy machine a query sent right after it was still answered.
func (p *Prometheus) Pause() error {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	cmd, _ := p.current()
	stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(stat)
		if err != nil {
			return nil // no procfs: the signal is all there is
		}
		// pid (comm) state ...: comm may hold spaces, the state follows its ")".
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return nil
		}
	}
	return errors.New("prometheus did not stop within 5s of SIGSTOP")
}

// Resume continues a paused Prometheus (SIGCONT).
func (p *Prometheus) Resume() error { return p.signal(syscall.SIGCONT) }

func (p *Prometheus) signal(sig syscall.Signal) error {
	cmd, _ := p.current()
	if cmd == nil || !p.Running() {
		return errors.New("prometheus is not running")
	}
	return syscall.Kill(-cmd.Process.Pid, sig)
}

// Stop terminates Prometheus and removes its directory (set HARNESS_KEEP_LOGS to
// keep it). Safe to call more than once.
func (p *Prometheus) Stop() error {
	p.stopOnce.Do(func() {
		cmd, exited := p.current()
		if cmd != nil && p.Running() {
			p.terminate(exited, cmd)
		}
		p.mu.Lock()
		p.stopped = true
		p.mu.Unlock()
		if os.Getenv("HARNESS_KEEP_LOGS") == "" {
			p.stopErr = os.RemoveAll(p.Dir)
		}
	})
	return p.stopErr
}

// LogTail returns the last n lines of Prometheus's log.
func (p *Prometheus) LogTail(n int) string {
	return tailFile(p.LogPath, n)
}

// PrometheusTarget is one active scrape target as /api/v1/targets reports it.
type PrometheusTarget struct {
	ScrapeURL string `json:"scrapeUrl"`
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// Targets returns the active scrape targets.
func (p *Prometheus) Targets(ctx context.Context) ([]PrometheusTarget, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/targets?state=active", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var doc struct {
		Status string `json:"status"`
		Data   struct {
			ActiveTargets []PrometheusTarget `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, fmt.Errorf("decode /api/v1/targets (HTTP %d): %w", resp.StatusCode, err)
	}
	if doc.Status != "success" {
		return nil, fmt.Errorf("/api/v1/targets: status %q (HTTP %d)", doc.Status, resp.StatusCode)
	}
	return doc.Data.ActiveTargets, nil
}

// WaitForTargets waits until exactly the given host:port targets are active and
// have each been scraped successfully (health "up").
func (p *Prometheus) WaitForTargets(ctx context.Context, targets []string) error {
	want := make([]string, 0, len(targets))
	for _, t := range targets {
		want = append(want, "http://"+t+"/metrics")
	}
	slices.Sort(want)
	var last string
	for {
		ts, err := p.Targets(ctx)
		if err == nil {
			var got []string
			up := true
			for _, t := range ts {
				got = append(got, t.ScrapeURL)
				if t.Health != "up" {
					up = false
				}
			}
			slices.Sort(got)
			if up && slices.Equal(got, want) {
				return nil
			}
			last = fmt.Sprintf("%+v", ts)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("targets %v not all up: %w (last: %s)", targets, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
