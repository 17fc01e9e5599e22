package conformance

// Multi-cluster meshes: istiod reads a second API server through a remote
// secret, as `istioctl create-remote-secret` registers it (flat network,
// one mesh). What a client in either cluster gets for the Service before
// opting in, and for the optimized host after, is why the operator refuses
// to route such a Service unless the administrator accepts local-only
// routing (controllers/multicluster.go, internal/desired/multicluster.go).

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// remoteClusterID is the second cluster's ID (the remote secret's data key).
const remoteClusterID = "cluster-2"

// endpointAddrs lists the addresses of cluster c's endpoints, sorted.
func endpointAddrs(x *harness.XDSClient, c string) ([]string, error) {
	eps, err := x.Endpoints(c)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range eps {
		out = append(out, e.Address)
	}
	slices.Sort(out)
	return out, nil
}

// routedTo: the client routes host:port to cluster want, whose endpoints
// are exactly addrs.
func routedTo(host string, port int, want string, addrs []string) func(*harness.XDSClient) error {
	return func(x *harness.XDSClient) error {
		if err := reaches(host, port, want)(x); err != nil {
			return err
		}
		got, err := endpointAddrs(x, want)
		if err != nil {
			return err
		}
		if !slices.Equal(got, addrs) {
			return fmt.Errorf("cluster %s has endpoints %v, want %v", want, got, addrs)
		}
		return nil
	}
}

// TestMultiClusterLocalOnlyHost: with a second cluster registered through
// a remote secret, clients of both clusters get the Service's endpoints of
// both clusters (2 + 2) before opting in; after, both route to the
// optimized host, which holds the 2 local pods only: the remote endpoints
// and cross-cluster failover are gone.
func TestMultiClusterLocalOnlyHost(t *testing.T) {
	ctx := testCtx(t)
	remote, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start the second API server: %v", err)
	}
	t.Cleanup(func() { _ = remote.Stop() })
	rc, err := client.New(remote.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}

	// The Service in both clusters, two ready pods in each.
	s := meshService{ns: "mc", ports: []corev1.ServicePort{httpPort("http", 80)}, ipBlock: 40}
	s.create(t)
	if err := rc.Create(ctx, fixtures.Namespace(s.ns)); err != nil {
		t.Fatal(err)
	}
	if err := rc.Create(ctx, fixtures.Service(s.ns, serviceName, s.ports...)); err != nil {
		t.Fatal(err)
	}
	var remoteEps []fixtures.Endpoint
	for i := 1; i <= 2; i++ {
		name := fmt.Sprintf("web-r%d", i)
		pod := fixtures.Pod(s.ns, name, serviceName, "node-r", fixtures.WithSidecar())
		if err := rc.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = podStatus(podSpec{Name: name, IP: fixtures.IP(41, i), Ready: true})
		if err := rc.Status().Update(ctx, pod); err != nil {
			t.Fatal(err)
		}
		remoteEps = append(remoteEps, fixtures.Ready(name, fixtures.IP(41, i), "node-r"))
	}
	if err := rc.Create(ctx, fixtures.EndpointSlice(s.ns, serviceName+"-r1234", serviceName, []fixtures.SlicePort{{Name: "http", Port: 80}}, remoteEps...)); err != nil {
		t.Fatal(err)
	}

	// Register the second cluster with istiod, as istioctl create-remote-secret does.
	kubeconfig, err := os.ReadFile(remote.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: harness.IstioNamespace, Name: "istio-remote-secret-" + remoteClusterID,
			Labels:      map[string]string{"istio/multiCluster": "true"},
			Annotations: map[string]string{"networking.istio.io/cluster": remoteClusterID}},
		Data: map[string][]byte{remoteClusterID: kubeconfig},
	}
	if err := suite.c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = suite.c.Delete(testCtx(t), secret) })

	local := []string{fixtures.IP(40, 1), fixtures.IP(40, 2)}
	both := append(append([]string{}, local...), fixtures.IP(41, 1), fixtures.IP(41, 2))
	slices.Sort(both)
	var clients []*harness.XDSClient
	for _, o := range []harness.SidecarOptions{
		{IP: "127.0.9.40", Pod: "client-local", Namespace: clientNS},
		{IP: "127.0.9.41", Pod: "client-remote", Namespace: clientNS, ClusterID: remoteClusterID},
	} {
		x, err := harness.DialXDS(ctx, suite.istiod.GRPCAddr, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(x.Close)
		clients = append(clients, x)
	}
	// Reading the remote cluster takes istiod a few seconds.
	for _, x := range clients {
		waitFor(t, x, 60*time.Second, "before: the Service's endpoints of both clusters",
			routedTo(s.host(), 80, clusterName(80, s.host()), both))
	}

	s.optIn(t)
	for _, x := range clients {
		waitFor(t, x, 60*time.Second, "after: the optimized host with the local pods only",
			routedTo(s.host(), 80, clusterName(80, s.optimized()), local))
	}
	t.Logf("before opting in: %s -> %s; after: %s -> %s (remote endpoints %s dropped) for clients in %s",
		s.host(), strings.Join(both, ","), s.optimized(), strings.Join(local, ","), fixtures.IP(41, 1)+","+fixtures.IP(41, 2), "Kubernetes and "+remoteClusterID)
}
