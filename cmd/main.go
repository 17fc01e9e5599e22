// Command manager runs the Istio adaptive weight optimizer: it mirrors the
// ready pods of opted-in Services into weighted Istio ServiceEntries and keeps
// the weights proportional to each pod's measured capacity.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/controllers"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	"github.com/liorfranko/istio-adaptive-least-request/internal/promsource"
	"github.com/liorfranko/istio-adaptive-least-request/metrics"
)

// defaultGCPercent is the manager's GOGC unless the environment sets one.
// Its heap is mostly long-lived caches (Pods, EndpointSlices, Istio
// objects, weight state); Go's default of 100 lets garbage grow to the size
// of all of them before collecting. 50 kept 200 optimizers x 50 pods under
// 150 MiB resident at the same CPU (docs/scale.md).
const defaultGCPercent = 50

// memoryLimitShare is the share of the container's memory limit
// (CONTAINER_MEMORY_LIMIT, in bytes, from the Deployment's resourceFieldRef)
// that the manager gives the Go runtime as its soft limit when GOMEMLIMIT is
// not set. The runtime counts only its own memory; the cgroup also counts
// kernel socket buffers and page cache, and Go's GC guide advises 5-10%
// headroom for what the runtime does not see.
const memoryLimitShare = 0.9

// memoryLimit is the Go memory limit to set from the environment: none when
// GOMEMLIMIT is set (the runtime reads it) or the container's limit is not
// known.
func memoryLimit(lookup func(string) (string, bool)) (int64, bool) {
	if _, set := lookup("GOMEMLIMIT"); set {
		return 0, false
	}
	v, _ := lookup("CONTAINER_MEMORY_LIMIT")
	limit, err := strconv.ParseInt(v, 10, 64)
	if err != nil || limit <= 0 {
		return 0, false
	}
	return int64(float64(limit) * memoryLimitShare), true
}

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGCPercent)
	}
	if limit, ok := memoryLimit(os.LookupEnv); ok {
		debug.SetMemoryLimit(limit)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// options are the manager's flags.
type options struct {
	metricsAddr       string
	secureMetrics     bool
	metricsCertPath   string
	metricsCertName   string
	metricsCertKey    string
	probeAddr         string
	pprofAddr         string
	pprofContention   bool
	leaderElect       bool
	leaderElectionNS  string
	watchNamespaces   string
	clusterDomain     string
	prometheus        promsource.Config
	prometheusHeaders headerFlag
	headerFiles       headerFlag
	controllerOptions controllers.Options
}

// headerFlag collects repeated --prometheus-header Name=Value flags.
type headerFlag map[string]string

func (h headerFlag) String() string { return fmt.Sprint(map[string]string(h)) }

func (h headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("want Name=Value, got %q", v)
	}
	h[strings.TrimSpace(name)] = value
	return nil
}

func parseFlags(fs *flag.FlagSet, args []string) (*options, *zap.Options, error) {
	o := &options{}
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint (:8443 for HTTPS, :8080 for HTTP, 0 to disable).")
	fs.BoolVar(&o.secureMetrics, "metrics-secure", true, "Serve metrics over HTTPS with authentication and authorization (TokenReview/SubjectAccessReview).")
	fs.StringVar(&o.metricsCertPath, "metrics-cert-path", "", "Directory holding the metrics endpoint's certificate and key (e.g. a cert-manager Secret), reloaded when they change. Empty: a self-signed certificate made at start-up.")
	fs.StringVar(&o.metricsCertName, "metrics-cert-name", "tls.crt", "File name of the metrics certificate in --metrics-cert-path.")
	fs.StringVar(&o.metricsCertKey, "metrics-cert-key", "tls.key", "File name of the metrics key in --metrics-cert-path.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", ":8081", "Address of the health and readiness probes.")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "", "Address of Go's pprof endpoints (/debug/pprof/), for profiling memory or CPU; empty or 0 disables them. Unauthenticated: bind it to localhost.")
	fs.BoolVar(&o.pprofContention, "pprof-contention", false, "Also record where goroutines wait on locks and channels (/debug/pprof/block and /debug/pprof/mutex, with --pprof-bind-address); costs a little CPU at each contended wait.")
	fs.BoolVar(&o.leaderElect, "leader-elect", true, "Elect a leader so that only one replica writes (outside a cluster give --leader-election-namespace, or --leader-elect=false for a single local run).")
	fs.StringVar(&o.leaderElectionNS, "leader-election-namespace", "", "Namespace of the leader election lease (default: the manager's own).")
	fs.StringVar(&o.watchNamespaces, "watch-namespaces", "", "Comma-separated namespaces to watch; empty watches the whole cluster.")
	fs.StringVar(&o.clusterDomain, "cluster-domain", "cluster.local", "DNS domain of the cluster, used in Kubernetes Service hosts.")
	fs.StringVar(&o.prometheus.URL, "prometheus-url", "", "URL of a Prometheus-compatible query API (Prometheus, VictoriaMetrics, Thanos, Mimir), path prefix included, e.g. http://vmselect:8481/select/0/prometheus. Empty: weights stay equal.")
	fs.StringVar(&o.prometheus.URL, "vmdb-url", "", "Alias of --prometheus-url, for users of the original operator.")
	fs.DurationVar(&o.prometheus.Timeout, "prometheus-timeout", promsource.DefaultTimeout, "Timeout of one query.")
	fs.StringVar(&o.prometheus.BearerTokenFile, "prometheus-bearer-token-file", "", "File holding a bearer token for the metrics backend (re-read on every query).")
	fs.StringVar(&o.prometheus.CAFile, "prometheus-ca-file", "", "PEM CA bundle to verify the metrics backend (reloaded when the file changes).")
	fs.StringVar(&o.prometheus.CertFile, "prometheus-cert-file", "", "PEM client certificate for mutual TLS with the metrics backend.")
	fs.StringVar(&o.prometheus.KeyFile, "prometheus-key-file", "", "PEM client key for mutual TLS with the metrics backend.")
	fs.BoolVar(&o.prometheus.InsecureSkipVerify, "prometheus-insecure-skip-verify", false, "Do not verify the metrics backend's certificate (testing only).")
	fs.IntVar(&o.prometheus.MaxQueryLength, "prometheus-max-query-length", promsource.DefaultMaxQueryLength, "Longest query sent, in bytes; a query over more pods is sent in chunks of pods and the answers merged (VictoriaMetrics refuses queries over 16 KiB by default).")
	fs.Int64Var(&o.prometheus.MaxResponseBytes, "prometheus-max-response-bytes", promsource.DefaultMaxResponseBytes, "Largest metrics answer read, in bytes; a longer one fails the query (reason too_large) and memory stays bounded.")
	o.prometheusHeaders = headerFlag{}
	fs.Var(o.prometheusHeaders, "prometheus-header", "Extra header Name=Value sent with every query (repeatable), e.g. X-Scope-OrgID=tenant for Mimir.")
	fs.StringVar(&o.prometheus.BasicAuthUsername, "prometheus-basic-auth-username", "", "Basic auth user name for the metrics backend; the password comes from --prometheus-basic-auth-password-file.")
	fs.StringVar(&o.prometheus.BasicAuthPasswordFile, "prometheus-basic-auth-password-file", "", "File holding the basic auth password (re-read on every query, so a rotated Secret is picked up).")
	o.headerFiles = headerFlag{}
	fs.Var(o.headerFiles, "prometheus-header-file", "Extra header Name=/path/to/file whose value is read from the file on every query (repeatable), for secrets such as API keys.")
	o.controllerOptions.BindFlags(fs)
	zo := &zap.Options{Development: false}
	zo.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if len(o.prometheusHeaders) > 0 {
		o.prometheus.Headers = o.prometheusHeaders
	}
	if len(o.headerFiles) > 0 {
		o.prometheus.HeaderFiles = o.headerFiles
	}
	if msg := desired.ClusterDomainProblem(o.clusterDomain); msg != "" {
		return nil, nil, fmt.Errorf("--cluster-domain: %s", msg)
	}
	return o, zo, o.controllerOptions.Validate()
}

func run() error {
	ctrlFlags := flag.NewFlagSet("manager", flag.ContinueOnError)
	// --kubeconfig is controller-runtime's flag; KUBECONFIG works too.
	ctrlFlagsWithKubeconfig(ctrlFlags)
	o, zo, err := parseFlags(ctrlFlags, os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if o.pprofContention {
		enableContentionProfiles()
	}
	zl := zap.NewRaw(zap.UseFlagOptions(zo))
	logger := zapr.NewLogger(zl)
	ctrl.SetLogger(logger)

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, istionet.AddToScheme, optv1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig (set --kubeconfig or KUBECONFIG, or run in a cluster): %w", err)
	}

	metricsOpts := metricsserver.Options{BindAddress: o.metricsAddr, SecureServing: o.secureMetrics}
	if o.secureMetrics {
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
		// HTTP/2 is off: it is exposed to the HTTP/2 Rapid Reset and Stream
		// Cancellation CVEs and the metrics endpoint does not need it.
		metricsOpts.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
		if err := metricsCert(&metricsOpts, o); err != nil {
			return err
		}
	}

	if o.leaderElect && o.leaderElectionNS == "" {
		if _, err := os.Stat(inClusterNamespaceFile); err != nil {
			return errors.New("--leader-elect (on by default) needs --leader-election-namespace outside a cluster; " +
				"give one, or pass --leader-elect=false when this is the only manager running")
		}
	}
	m := metrics.New()
	watchHealth := &controllers.WatchHealth{Clock: clock.RealClock{}, Metrics: m}
	cacheOpts := controllers.CacheOptions(strings.Split(o.watchNamespaces, ","))
	cacheOpts.DefaultWatchErrorHandler = watchHealth.Handler
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                        scheme,
		Metrics:                       metricsOpts,
		HealthProbeBindAddress:        o.probeAddr,
		PprofBindAddress:              o.pprofAddr,
		LeaderElection:                o.leaderElect,
		LeaderElectionID:              "istio-adaptive-optimizer.optimization.liorfranko.github.io",
		LeaderElectionNamespace:       o.leaderElectionNS,
		LeaderElectionReleaseOnCancel: true,
		Cache:                         cacheOpts,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}

	if err := m.Register(crmetrics.Registry); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	var source controllers.MetricsSource
	if o.prometheus.URL != "" {
		o.prometheus.OnStaleCredentials = func(err error) {
			logger.Error(err, "Metrics backend credentials: a rotated file is unusable; queries go on with the last good one until it expires")
		}
		s, err := promsource.New(o.prometheus)
		if err != nil {
			return fmt.Errorf("metrics backend: %w", err)
		}
		source = s
	} else {
		logger.Info("No --prometheus-url: endpoints are mirrored with equal weights and no weight is optimized")
	}
	ctx := ctrl.SetupSignalHandler()
	if err := controllers.Setup(ctx, mgr, controllers.Dependencies{
		Clock:         clock.RealClock{},
		Metrics:       m,
		ClusterDomain: o.clusterDomain,
		Source:        source,
		Options:       o.controllerOptions,
		Namespaces:    strings.Split(o.watchNamespaces, ","),
		WatchErrors:   watchHealth.Handler,
	}); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("informers", watchHealth.Check); err != nil {
		return err
	}
	synced := &cachesSynced{ch: make(chan struct{})}
	if err := mgr.Add(synced); err != nil {
		return err
	}
	logger.Info("Starting manager", "prometheusURL", redact(o.prometheus.URL), "watchNamespaces", o.watchNamespaces)
	return startManager(ctx, mgr.Start, synced.ch, stuckStartGrace, logger)
}

// stuckStartGrace is how long a stop signal waits for a manager whose
// caches never synced before the process exits anyway.
const stuckStartGrace = 5 * time.Second

// startManager runs the manager until ctx ends and it returns. A manager
// whose caches never synced (an informer that cannot list: RBAC, an object
// it cannot decode) does not return from Start once ctx ends: its start-up
// wait spins on the closed context (kubernetes-sigs/controller-runtime#3440,
// not fixed in v0.25.2). Nothing has run then, so after grace the process
// exits without it. A manager that did sync shuts down as usual.
func startManager(ctx context.Context, start func(context.Context) error, synced <-chan struct{}, grace time.Duration, logger logr.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- start(ctx) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-errc:
		return err
	case <-time.After(grace):
	}
	select {
	case <-synced:
		return <-errc // a normal shutdown, still running
	default:
		logger.Info("Stopping although the caches never synced; the manager did not stop by itself", "waited", grace)
		return nil
	}
}

// cachesSynced closes ch when the manager starts its runnables that need
// no leader election, which it does once every cache has synced.
type cachesSynced struct{ ch chan struct{} }

func (c *cachesSynced) Start(ctx context.Context) error {
	close(c.ch)
	<-ctx.Done()
	return nil
}

func (c *cachesSynced) NeedLeaderElection() bool { return false }

// inClusterNamespaceFile is where a pod finds its namespace, which
// controller-runtime uses for the lease when none is given.
const inClusterNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

func ctrlFlagsWithKubeconfig(fs *flag.FlagSet) {
	config.RegisterFlags(fs)
}

// metricsCert makes the metrics server serve the certificate in
// --metrics-cert-path (controller-runtime watches and reloads it). A missing
// file is an error here: controller-runtime would silently fall back to a
// self-signed certificate that scrapers verifying the real one reject.
func metricsCert(opts *metricsserver.Options, o *options) error {
	if o.metricsCertPath == "" {
		return nil
	}
	for _, name := range []string{o.metricsCertName, o.metricsCertKey} {
		if _, err := os.Stat(filepath.Join(o.metricsCertPath, name)); err != nil {
			return fmt.Errorf("--metrics-cert-path: %w", err)
		}
	}
	opts.CertDir, opts.CertName, opts.KeyName = o.metricsCertPath, o.metricsCertName, o.metricsCertKey
	return nil
}

// redact hides credentials in a URL before it is logged.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparseable>"
	}
	return u.Redacted()
}
