package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IstioNamespace is the namespace istiod runs "in" (POD_NAMESPACE); it is
// also the mesh's root namespace.
const IstioNamespace = "istio-system"

// IstiodOptions tune StartIstiodWithOptions. The zero value is what
// StartIstiod uses.
type IstiodOptions struct {
	// MeshConfig is the YAML of the mesh config (istio.io/api MeshConfig)
	// written to the file passed as --meshConfig. Empty means DefaultMeshConfig.
	MeshConfig string
	// Env adds or overrides environment variables of pilot-discovery
	// ("NAME=value").
	Env []string
	// ReadyTimeout bounds the wait for /ready (default 90s).
	ReadyTimeout time.Duration
}

// DefaultMeshConfig is the mesh config the harness gives istiod: Istio's
// defaults spelled out, so that nothing depends on a ConfigMap or the
// working directory.
const DefaultMeshConfig = `trustDomain: cluster.local
rootNamespace: istio-system
enableAutoMtls: true
defaultConfig:
  discoveryAddress: istiod.istio-system.svc:15012
`

// Istiod is a running pilot-discovery process serving plaintext xDS on
// GRPCAddr against the envtest API server.
type Istiod struct {
	// GRPCAddr serves plaintext xDS (ADS), the address an XDSClient dials.
	GRPCAddr string
	// HTTPAddr serves /ready and, on loopback, the debug handlers.
	HTTPAddr string
	// MonitoringAddr serves /metrics and /debug/* (endpointShardz, configz...).
	MonitoringAddr string
	// LogPath is the file holding pilot-discovery's stdout and stderr.
	LogPath string

	dir      string
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
	stopOnce sync.Once
	stopErr  error
}

// StartIstiod starts istiod (bin/pilot-discovery, built by `make istiod`)
// against the API server and waits until it is ready. Stop it with Stop.
func StartIstiod(api *APIServer) (*Istiod, error) {
	return StartIstiodWithOptions(api, IstiodOptions{})
}

// StartIstiodWithOptions is StartIstiod with a custom mesh config or
// environment.
//
// How istiod runs outside a cluster here (each flag/env and why):
//   - --kubeconfig: the envtest admin kubeconfig (there is no in-cluster config).
//   - --grpcAddr/--httpAddr/--monitoringAddr on 127.0.0.1 with free ports: the
//     defaults (:15010, :8080, :15014) bind every interface and collide with
//     other test binaries running in parallel.
//   - --secureGRPCAddr "": the TLS xDS port needs istiod's DNS certificate,
//     which needs the CA; tests use plaintext xDS.
//   - --httpsAddr "": the webhook port (default :15017) would bind every
//     interface and has no certificate; with "" the (absent) webhooks are
//     multiplexed on httpAddr.
//   - --meshConfig / --networksConfig: explicit files in a temporary directory,
//     instead of ./etc/istio/config/* relative to the working directory or the
//     `istio` ConfigMap.
//   - --shutdownDuration 1s: istiod waits this long on SIGTERM (default 10s).
//   - --ctrlz_port 0: the ControlZ introspection port (default 127.0.0.1:9876)
//     collides when two istiods run at once ("Unable to start ControlZ").
//   - POD_NAMESPACE=istio-system: istiod's own namespace (the namespace is
//     created first; leader election leases live there).
//   - ENABLE_CA_SERVER=false: no Citadel CA (it would need to write secrets
//     and is not what is being tested); with it istiod skips its DNS certs
//     ("PILOT_CERT_PROVIDER=istiod is not implemented" warning is expected).
//   - PILOT_ENABLE_STATUS=false: no status writer on Istio objects.
//   - (webhooks need nothing: with --httpsAddr "" and no CA, the validation
//     and injection webhook controllers find no configuration and no
//     injection template, and log no errors.)
//   - CLUSTER_ID=Kubernetes: the default, spelled out because XDSClient sends
//     the same CLUSTER_ID in its node metadata.
//
// Everything else is istiod's default (LEAST_REQUEST when no DestinationRule,
// auto-mTLS on, PERMISSIVE peer authentication, IP auto-allocation on, ...),
// so tests see what a sidecar in a default install would see.
func StartIstiodWithOptions(api *APIServer, opts IstiodOptions) (*Istiod, error) {
	bin, err := Binary("pilot-discovery", "PILOT_DISCOVERY_BIN", "istiod")
	if err != nil {
		return nil, err
	}
	if api == nil || api.Kubeconfig == "" {
		return nil, errors.New("StartIstiod needs a started APIServer with a kubeconfig")
	}
	if err := ensureNamespace(api, IstioNamespace); err != nil {
		return nil, err
	}
	if opts.MeshConfig == "" {
		opts.MeshConfig = DefaultMeshConfig
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 90 * time.Second
	}

	// A free port can be taken between our probe and istiod's bind; retry the
	// whole start a few times when istiod exits early.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		i, err := startIstiodOnce(bin, api, opts)
		if err == nil {
			return i, nil
		}
		lastErr = err
		if !errors.Is(err, errIstiodExited) {
			break
		}
	}
	return nil, lastErr
}

var errIstiodExited = errors.New("pilot-discovery exited before it was ready")

func startIstiodOnce(bin string, api *APIServer, opts IstiodOptions) (*Istiod, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "istiod-")
	if err != nil {
		return nil, err
	}
	i := &Istiod{
		GRPCAddr:       fmt.Sprintf("127.0.0.1:%d", ports[0]),
		HTTPAddr:       fmt.Sprintf("127.0.0.1:%d", ports[1]),
		MonitoringAddr: fmt.Sprintf("127.0.0.1:%d", ports[2]),
		LogPath:        filepath.Join(dir, "istiod.log"),
		dir:            dir,
		exited:         make(chan struct{}),
	}
	meshFile := filepath.Join(dir, "mesh.yaml")
	networksFile := filepath.Join(dir, "meshNetworks.yaml")
	if err := os.WriteFile(meshFile, []byte(opts.MeshConfig), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(networksFile, []byte("networks: {}\n"), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(i.LogPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the child holds its own descriptor

	cmd := exec.Command(bin, "discovery",
		"--kubeconfig", api.Kubeconfig,
		"--grpcAddr", i.GRPCAddr,
		"--httpAddr", i.HTTPAddr,
		"--monitoringAddr", i.MonitoringAddr,
		"--secureGRPCAddr", "",
		"--httpsAddr", "",
		"--meshConfig", meshFile,
		"--networksConfig", networksFile,
		"--shutdownDuration", "1s",
		"--ctrlz_port", "0",
		"--log_output_level", "default:info",
	)
	cmd.Dir = dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = childProcAttr()
	cmd.Env = append(os.Environ(),
		"POD_NAMESPACE="+IstioNamespace,
		"POD_NAME=istiod-harness",
		"ENABLE_CA_SERVER=false",
		"PILOT_ENABLE_STATUS=false",
		"CLUSTER_ID="+DefaultClusterID,
	)
	cmd.Env = append(cmd.Env, opts.Env...)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start pilot-discovery: %w", err)
	}
	i.cmd = cmd
	go func() {
		i.waitErr = cmd.Wait()
		close(i.exited)
	}()

	if err := i.waitReady(opts.ReadyTimeout); err != nil {
		tail := i.LogTail(40)
		_ = i.Stop()
		return nil, fmt.Errorf("%w\n--- istiod log tail ---\n%s", err, tail)
	}
	return i, nil
}

// waitReady polls /ready on the HTTP address until istiod answers 200.
func (i *Istiod) waitReady(timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		select {
		case <-i.exited:
			return fmt.Errorf("%w: %v", errIstiodExited, i.waitErr)
		default:
		}
		ok, status := probeReady(hc, "http://"+i.HTTPAddr+"/ready")
		if ok {
			return nil
		}
		last = status
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("istiod not ready on http://%s/ready after %s (last: %s)", i.HTTPAddr, timeout, last)
}

// Running reports whether the process is still alive.
func (i *Istiod) Running() bool {
	select {
	case <-i.exited:
		return false
	default:
		return true
	}
}

// Stop terminates istiod's process group (SIGTERM, then SIGKILL after 5s),
// waits for it and removes its temporary directory (and with it the log;
// read LogTail before Stop). Safe to call more than once.
func (i *Istiod) Stop() error {
	i.stopOnce.Do(func() {
		if i.cmd != nil && i.cmd.Process != nil {
			pgid := i.cmd.Process.Pid
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-i.exited:
			case <-time.After(5 * time.Second):
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
				<-i.exited
			}
			// Anything left in the group (there should be nothing) goes too.
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
		}
		if os.Getenv("HARNESS_KEEP_LOGS") == "" {
			i.stopErr = os.RemoveAll(i.dir)
		}
	})
	return i.stopErr
}

// LogTail returns the last n lines of istiod's log.
func (i *Istiod) LogTail(n int) string {
	return tailFile(i.LogPath, n)
}

// ShardzEndpoint is one endpoint as istiod holds it in its endpoint index
// (model.IstioEndpoint, JSON as served by /debug/endpointShardz).
type ShardzEndpoint struct {
	Labels          map[string]string `json:"Labels"`
	Addresses       []string          `json:"Addresses"`
	ServicePortName string            `json:"ServicePortName"`
	ServiceAccount  string            `json:"ServiceAccount"`
	Network         string            `json:"Network"`
	Locality        struct {
		Label     string `json:"Label"`
		ClusterID string `json:"ClusterID"`
	} `json:"Locality"`
	EndpointPort uint32 `json:"EndpointPort"`
	LbWeight     uint32 `json:"LbWeight"`
	TLSMode      string `json:"TLSMode"`
	Namespace    string `json:"Namespace"`
	WorkloadName string `json:"WorkloadName"`
	HealthStatus int32  `json:"HealthStatus"` // 1 healthy, 2 unhealthy, 3 draining, 4 terminating
	NodeName     string `json:"NodeName"`
}

// ShardzService is the endpoint shards of one service in one namespace.
type ShardzService struct {
	// Shards by "<provider>/<cluster>", e.g. "Kubernetes/Kubernetes" for the
	// Kubernetes registry and "External/Kubernetes" for ServiceEntries.
	Shards          map[string][]ShardzEndpoint `json:"Shards"`
	ServiceAccounts map[string]struct{}         `json:"ServiceAccounts"`
}

// EndpointShardz is /debug/endpointShardz: hostname -> namespace -> shards.
type EndpointShardz map[string]map[string]ShardzService

// Endpoints flattens the shards of host in namespace ns, sorted by address
// and port.
func (z EndpointShardz) Endpoints(host, ns string) []ShardzEndpoint {
	var out []ShardzEndpoint
	for _, eps := range z[host][ns].Shards {
		out = append(out, eps...)
	}
	sort.Slice(out, func(a, b int) bool {
		ka := strings.Join(out[a].Addresses, ",")
		kb := strings.Join(out[b].Addresses, ",")
		if ka != kb {
			return ka < kb
		}
		if out[a].EndpointPort != out[b].EndpointPort {
			return out[a].EndpointPort < out[b].EndpointPort
		}
		return out[a].ServicePortName < out[b].ServicePortName
	})
	return out
}

// EndpointShardz reads /debug/endpointShardz from the monitoring address:
// every endpoint istiod knows, with its weight and locality.
func (i *Istiod) EndpointShardz(ctx context.Context) (EndpointShardz, error) {
	var out EndpointShardz
	if err := i.debugJSON(ctx, "/debug/endpointShardz", &out); err != nil {
		return nil, err
	}
	return out, nil
}

func (i *Istiod) debugJSON(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+i.MonitoringAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return fmt.Errorf("istiod %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("istiod %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("istiod %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("istiod %s: decode: %w", path, err)
	}
	return nil
}

func ensureNamespace(api *APIServer, name string) error {
	c, err := client.New(api.Config, client.Options{Scheme: Scheme()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	return nil
}
