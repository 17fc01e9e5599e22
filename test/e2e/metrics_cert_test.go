package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// TestMetricsServedWithProvidedCertificate runs the manager binary with
// --metrics-cert-path, as the chart and config/overlays/verified-metrics do
// with a cert-manager Secret, and scrapes it the way the ServiceMonitor does:
// verifying the certificate against its CA under the Service's DNS name, with
// the bearer token of a service account bound to config/'s metrics-reader
// ClusterRole. A scrape that does not trust the CA, or sends no token, is
// refused. A renewed certificate is served without a restart. A
// --metrics-cert-path without the files stops the manager at start-up
// instead of serving a self-signed certificate no scraper trusts.
func TestMetricsServedWithProvidedCertificate(t *testing.T) {
	api, err := harness.StartAPIServer()
	if err != nil {
		t.Fatalf("start API server: %v", err)
	}
	defer api.Stop()
	bin := harness.BuildBinary(t, "./cmd")

	const serverName = "istio-adaptive-controller-manager-metrics-service.istio-adaptive-system.svc"
	certDir := t.TempDir()
	caPool := writeServingCert(t, certDir, serverName)

	t.Run("missing files stop the manager", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, bin, "--kubeconfig", api.Kubeconfig, "--leader-elect=false",
			"--metrics-bind-address", freePort(t), "--health-probe-bind-address", freePort(t),
			"--metrics-cert-path", t.TempDir()).CombinedOutput()
		if err == nil || ctx.Err() != nil || !strings.Contains(string(out), "--metrics-cert-path") {
			t.Errorf("manager with an empty --metrics-cert-path: err %v, output:\n%s", err, tail(string(out), 2000))
		}
	})

	metricsAddr := freePort(t)
	cmd := exec.Command(bin, "--kubeconfig", api.Kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", freePort(t),
		"--metrics-cert-path", certDir)
	logFile := filepath.Join(t.TempDir(), "manager.log")
	lf, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			data, _ := os.ReadFile(logFile)
			t.Logf("manager log:\n%s", tail(string(data), 3000))
		}
	}()

	c, err := client.New(api.Config, client.Options{Scheme: harness.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	token := scraperToken(t, c, root)

	url := "https://" + metricsAddr + "/metrics"
	verifying := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: caPool, ServerName: serverName},
	}}
	harness.Eventually(t, 60*time.Second, "a verified, authorized scrape", func() error {
		code, body, err := scrapeWith(verifying, url, token)
		if err != nil {
			return err
		}
		if code != http.StatusOK || !strings.Contains(body, "controller_runtime_") {
			return fmt.Errorf("status %d: %s", code, tail(body, 300))
		}
		return nil
	})
	if code, _, err := scrapeWith(verifying, url, ""); err != nil || code != http.StatusUnauthorized {
		t.Errorf("scrape without a token: status %d, error %v; want 401", code, err)
	}
	systemRoots := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{ServerName: serverName},
	}}
	if _, _, err := scrapeWith(systemRoots, url, token); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("scrape that does not trust the CA: error %v, want a certificate error", err)
	}

	// Renewal: cert-manager rewrites the Secret; the manager must serve the
	// new certificate without a restart. A new CA makes old and new tell apart.
	renewedPool := writeServingCert(t, certDir, serverName)
	renewed := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: renewedPool, ServerName: serverName},
	}}
	renewedAt := time.Now()
	harness.Eventually(t, 60*time.Second, "the renewed certificate served", func() error {
		code, _, err := scrapeWith(renewed, url, token)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	t.Logf("Renewed certificate served %v after the files changed", time.Since(renewedAt).Round(100*time.Millisecond))
}

// writeServingCert writes a CA-signed tls.crt/tls.key for dnsName into dir,
// as cert-manager does, and returns a pool holding the CA (its ca.crt).
func writeServingCert(t *testing.T, dir, dnsName string) *x509.CertPool {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test metrics CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"tls.crt": {Type: "CERTIFICATE", Bytes: leafDER},
		"tls.key": {Type: "EC PRIVATE KEY", Bytes: keyDER},
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool
}

// scraperToken creates config/rbac's metrics-reader ClusterRole, a service
// account bound to it (as config/prometheus does) and returns its token.
func scraperToken(t *testing.T, c client.Client, root string) string {
	t.Helper()
	ctx := t.Context()
	data, err := os.ReadFile(filepath.Join(root, "config", "rbac", "metrics_reader_role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var reader rbacv1.ClusterRole
	if err := yaml.Unmarshal(data, &reader); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "metrics-scraper"}}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-scraper"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: reader.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: sa.Namespace, Name: sa.Name}},
	}
	for _, o := range []client.Object{&reader, sa, binding} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if err := c.SubResource("token").Create(ctx, sa, tr); err != nil {
		t.Fatalf("request a token: %v", err)
	}
	return tr.Status.Token
}

func scrapeWith(hc *http.Client, url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}
