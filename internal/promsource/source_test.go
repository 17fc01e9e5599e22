package promsource

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"math"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var (
	testNow    = time.Unix(1_700_000_000, 500_000_000)
	testTarget = Target{Namespace: "shop", Service: "cart", Pods: []string{"a", "b", "c"}, Window: time.Minute}
)

// vectorBody is a successful instant-vector answer; pairs of pod and value.
func vectorBody(podValues ...string) string {
	var items []string
	for i := 0; i+1 < len(podValues); i += 2 {
		items = append(items, fmt.Sprintf(`{"metric":{"pod":%q},"value":[1700000000.5,%q]}`, podValues[i], podValues[i+1]))
	}
	return `{"status":"success","data":{"resultType":"vector","result":[` + strings.Join(items, ",") + `]}}`
}

// fixed answers every request with one status and body.
func fixed(status int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(body))
	}
}

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// hangingServer never answers: its handler waits until the client goes away or
// the test ends (released before the server closes, since Close waits for it).
func hangingServer(t *testing.T) *httptest.Server {
	release := make(chan struct{})
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body) // lets the server notice the client leaving
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release) })
	return srv
}

func newSource(t *testing.T, cfg Config) *Source {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) error = %v", cfg, err)
	}
	t.Cleanup(s.Close)
	return s
}

func query(t *testing.T, s *Source) (Result, error) {
	t.Helper()
	return s.Query(t.Context(), DefaultCPUQuery, testTarget, testNow)
}

func TestQuerySendsOneInstantQuery(t *testing.T) {
	var calls atomic.Int32
	var gotQuery, gotTime, gotTimeout, gotPath, gotMethod string
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if err := r.ParseForm(); err != nil {
			t.Errorf("ParseForm: %v", err)
		}
		gotPath, gotMethod = r.URL.Path, r.Method
		gotQuery, gotTime, gotTimeout = r.Form.Get("query"), r.Form.Get("time"), r.Form.Get("timeout")
		fixed(200, vectorBody("a", "0.25", "b", "1.5", "c", "0"))(w, r)
	}))
	s := newSource(t, Config{URL: srv.URL, Timeout: 3 * time.Second})

	pods := []string{"a", "b", "c"}
	for i := range 47 {
		pods = append(pods, fmt.Sprintf("other-%d", i))
	}
	target := testTarget
	target.Pods = pods
	res, err := s.Query(t.Context(), DefaultCPUQuery, target, testNow)
	if err != nil {
		t.Fatalf("Query() error = %v", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("backend received %d requests for 50 pods, want 1", n)
	}
	want, _ := Render(DefaultCPUQuery, target)
	if gotQuery != want || res.Query != want {
		t.Errorf("query sent %q, Result.Query %q, want %q", gotQuery, res.Query, want)
	}
	if gotPath != "/api/v1/query" || gotMethod != http.MethodPost {
		t.Errorf("request %s %s, want POST /api/v1/query", gotMethod, gotPath)
	}
	if gotTime != "1700000000.5" {
		t.Errorf("time = %q, want 1700000000.5", gotTime)
	}
	if gotTimeout != "3s" {
		t.Errorf("timeout = %q, want 3s", gotTimeout)
	}
	if !maps.Equal(res.Values, map[string]float64{"a": 0.25, "b": 1.5, "c": 0}) {
		t.Errorf("Values = %v", res.Values)
	}
	if len(res.Missing) != 47 || res.Missing[0] != "other-0" {
		t.Errorf("Missing = %v, want the 47 other pods in order", res.Missing)
	}
	if len(res.Issues) != 0 || res.Err() != nil {
		t.Errorf("Issues = %v, want none", res.Issues)
	}
	if res.Latency <= 0 {
		t.Errorf("Latency = %v, want > 0", res.Latency)
	}
}

func TestQueryZeroNowLetsTheBackendChoose(t *testing.T) {
	var hasTime atomic.Bool
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		hasTime.Store(r.Form.Has("time"))
		fixed(200, vectorBody("a", "1"))(w, r)
	}))
	s := newSource(t, Config{URL: srv.URL})
	if _, err := s.Query(t.Context(), DefaultCPUQuery, testTarget, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if hasTime.Load() {
		t.Error("time parameter sent for a zero now")
	}
	if s.Timeout() != DefaultTimeout {
		t.Errorf("Timeout() = %v, want default %v", s.Timeout(), DefaultTimeout)
	}
}

func TestQueryPathPrefix(t *testing.T) {
	for _, prefix := range []string{"/prometheus", "/prometheus/", "/select/0/prometheus", "/a/b/c/d"} {
		t.Run(prefix, func(t *testing.T) {
			want := strings.TrimSuffix(prefix, "/") + "/api/v1/query"
			srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != want {
					http.Error(w, "404 page not found: "+r.URL.Path, http.StatusNotFound)
					return
				}
				fixed(200, vectorBody("a", "1"))(w, r)
			}))
			s := newSource(t, Config{URL: srv.URL + prefix})
			res, err := query(t, s)
			if err != nil {
				t.Fatalf("Query() error = %v", err)
			}
			if res.Values["a"] != 1 {
				t.Errorf("Values = %v", res.Values)
			}
		})
	}
	t.Run("wrong prefix gives a 404 ServerError", func(t *testing.T) {
		srv := newServer(t, http.NotFoundHandler())
		s := newSource(t, Config{URL: srv.URL + "/nope"})
		_, err := query(t, s)
		var se *ServerError
		if !errors.As(err, &se) || se.StatusCode != 404 || !strings.Contains(se.Message, "404 page not found") {
			t.Fatalf("error = %#v, want ServerError 404 with the body", err)
		}
	})
}

func TestQueryFallsBackToGET(t *testing.T) {
	// Some proxies allow only GET; client_golang retries with GET on 405.
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		if !strings.Contains(r.URL.Query().Get("query"), "container_cpu_usage_seconds_total") {
			t.Errorf("GET without the query: %s", r.URL.RawQuery)
		}
		fixed(200, vectorBody("a", "2"))(w, r)
	}))
	res, err := query(t, newSource(t, Config{URL: srv.URL}))
	if err != nil || res.Values["a"] != 2 {
		t.Fatalf("Query() = %v, %v", res.Values, err)
	}
}

// A backend that redirects to another host (a login page, another virtual
// host) does not get the credentials and headers sent on: they are the
// backend's own.
func TestCredentialsStayWithTheBackend(t *testing.T) {
	type seen struct{ auth, org, key string }
	var mu sync.Mutex
	got := map[string]seen{}
	record := func(name string, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		got[name] = seen{r.Header.Get("Authorization"), r.Header.Get("X-Scope-OrgID"), r.Header.Get("X-Api-Key")}
	}
	other := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record("other", r)
		fixed(200, vectorBody("a", "1"))(w, r)
	}))
	front := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record("front", r)
		http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	keyFile := filepath.Join(t.TempDir(), "key")
	writeFile(t, keyFile, "k3y")
	s := newSource(t, Config{URL: front.URL, BearerToken: "s3cret", Headers: map[string]string{"X-Scope-OrgID": "tenant-1"},
		FileCredentials: FileCredentials{HeaderFiles: map[string]string{"X-Api-Key": keyFile}}})
	if _, err := query(t, s); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if g := got["front"]; g != (seen{"Bearer s3cret", "tenant-1", "k3y"}) {
		t.Errorf("the backend saw %+v, want its credentials", g)
	}
	if g, ok := got["other"]; !ok || g != (seen{}) {
		t.Errorf("the host redirected to saw %+v (reached %v), want no credentials", g, ok)
	}
	for raw, want := range map[string]string{"http://Prom:9090/x": "Prom:9090", "http://prom/x": "prom:80", "https://prom/x": "prom:443", "http://[::1]/x": "[::1]:80"} {
		u, _ := url.Parse(raw)
		if got := hostPort(u); got != want {
			t.Errorf("hostPort(%s) = %s, want %s", raw, got, want)
		}
	}
}

func TestQueryHeadersAndBearerToken(t *testing.T) {
	type seen struct{ auth, org, custom string }
	var mu sync.Mutex
	var got seen
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = seen{r.Header.Get("Authorization"), r.Header.Get("X-Scope-OrgID"), r.Header.Get("X-Custom")}
		mu.Unlock()
		fixed(200, vectorBody("a", "1"))(w, r)
	}))
	last := func() seen { mu.Lock(); defer mu.Unlock(); return got }

	t.Run("literal token and headers", func(t *testing.T) {
		s := newSource(t, Config{URL: srv.URL, BearerToken: "s3cret", Headers: map[string]string{"X-Scope-OrgID": "tenant-1", "x-custom": "v"}})
		if _, err := query(t, s); err != nil {
			t.Fatal(err)
		}
		if g := last(); g != (seen{"Bearer s3cret", "tenant-1", "v"}) {
			t.Errorf("headers seen %+v", g)
		}
	})
	t.Run("token file is re-read", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "token")
		writeFile(t, file, "first\n")
		s := newSource(t, Config{URL: srv.URL, BearerTokenFile: file})
		if _, err := query(t, s); err != nil {
			t.Fatal(err)
		}
		if g := last(); g.auth != "Bearer first" {
			t.Errorf("Authorization = %q, want Bearer first", g.auth)
		}
		writeFile(t, file, "second")
		if _, err := query(t, s); err != nil {
			t.Fatal(err)
		}
		if g := last(); g.auth != "Bearer second" {
			t.Errorf("Authorization after rotation = %q, want Bearer second", g.auth)
		}
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		_, err := query(t, s)
		var ce *CredentialsError
		if !errors.As(err, &ce) || ce.File != file || !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("error with the token file gone = %v, want *CredentialsError wrapping ErrNotExist", err)
		}
	})
	t.Run("basic auth from the URL", func(t *testing.T) {
		u := strings.Replace(srv.URL, "http://", "http://user:pa%20ss@", 1)
		s := newSource(t, Config{URL: u})
		if _, err := query(t, s); err != nil {
			t.Fatal(err)
		}
		if g := last(); !strings.HasPrefix(g.auth, "Basic ") {
			t.Errorf("Authorization = %q, want basic auth", g.auth)
		}
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	writeFile(t, notPEM, "not a certificate")
	for name, cfg := range map[string]Config{
		"empty URL":            {},
		"no scheme":            {URL: "prometheus:9090"},
		"ftp":                  {URL: "ftp://host"},
		"no host":              {URL: "http:///prometheus"},
		"negative timeout":     {URL: "http://h", Timeout: -time.Second},
		"token and token file": {URL: "http://h", BearerToken: "a", BearerTokenFile: "/etc/hostname"},
		"token file missing":   {URL: "http://h", BearerTokenFile: filepath.Join(dir, "none")},
		"token and auth hdr":   {URL: "http://h", BearerToken: "a", Headers: map[string]string{"authorization": "x"}},
		"bad header name":      {URL: "http://h", Headers: map[string]string{"X Bad": "v"}},
		"header CRLF":          {URL: "http://h", Headers: map[string]string{"X-A": "v\r\nX-B: w"}},
		"CA missing":           {URL: "https://h", CAFile: filepath.Join(dir, "none")},
		"CA not PEM":           {URL: "https://h", CAFile: notPEM},
		"cert without key":     {URL: "https://h", CertFile: notPEM},
		"bad key pair":         {URL: "https://h", CertFile: notPEM, KeyFile: notPEM},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New(%+v) succeeded, want an error", name, cfg)
		}
	}
}

func TestQueryTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(fixed(200, vectorBody("a", "1")))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // expected handshake failures
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	writeFile(t, caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))

	t.Run("trusted CA", func(t *testing.T) {
		if _, err := query(t, newSource(t, Config{URL: srv.URL, CAFile: caFile})); err != nil {
			t.Fatalf("Query() error = %v", err)
		}
	})
	t.Run("unknown CA is unreachable", func(t *testing.T) {
		_, err := query(t, newSource(t, Config{URL: srv.URL}))
		var ue *UnreachableError
		var uae x509.UnknownAuthorityError
		if !errors.As(err, &ue) || ue.Timeout || !errors.As(err, &uae) {
			t.Fatalf("error = %v, want *UnreachableError wrapping x509.UnknownAuthorityError", err)
		}
	})
	t.Run("insecure skip verify", func(t *testing.T) {
		if _, err := query(t, newSource(t, Config{URL: srv.URL, InsecureSkipVerify: true})); err != nil {
			t.Fatalf("Query() error = %v", err)
		}
	})
}

// A CA bundle rotated in place is trusted at the next connection, without
// a restart, and the backend's name is still verified against it.
func TestQueryTLSCARotation(t *testing.T) {
	serverCert := func(ca *x509.Certificate, key *ecdsa.PrivateKey, ips ...net.IP) tls.Certificate {
		return issueCert(t, ca, key, &x509.Certificate{Subject: pkix.Name{CommonName: "prometheus"}, IPAddresses: ips,
			DNSNames: []string{"prometheus.test"}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	}
	oldCA, oldKey := newCA(t)
	newCA_, newKey := newCA(t)
	loopback := net.ParseIP("127.0.0.1")
	var serving atomic.Pointer[tls.Certificate]
	cert := serverCert(oldCA, oldKey, loopback)
	serving.Store(&cert)
	srv := httptest.NewUnstartedServer(fixed(200, vectorBody("a", "1")))
	// GetConfigForClient, not GetCertificate: httptest installs its own
	// certificate, which crypto/tls prefers when the client sends no SNI
	// (an IP address).
	srv.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{*serving.Load()}}, nil
	}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // expected handshake failures
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeCA := func(ca *x509.Certificate, at time.Time) {
		writeFile(t, caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})))
		if err := os.Chtimes(caFile, at, at); err != nil {
			t.Fatal(err)
		}
	}
	writeCA(oldCA, time.Now())
	var stale []error
	s := newSource(t, Config{URL: srv.URL, CAFile: caFile, OnStaleCredentials: func(err error) { stale = append(stale, err) }})
	if _, err := query(t, s); err != nil {
		t.Fatalf("Query() with the CA that signed the backend's certificate: %v", err)
	}

	// The backend moves to a certificate from a new CA.
	cert = serverCert(newCA_, newKey, loopback)
	serving.Store(&cert)
	s.Close()
	var uae x509.UnknownAuthorityError
	if _, err := query(t, s); !errors.As(err, &uae) {
		t.Fatalf("Query() with the old CA bundle: error = %v, want x509.UnknownAuthorityError", err)
	}
	writeCA(newCA_, time.Now().Add(time.Minute))
	if _, err := query(t, s); err != nil {
		t.Fatalf("Query() after the CA bundle was rotated in place: %v", err)
	}
	// The same bundle written again keeps the transport and its
	// connections.
	before := s.transport.transport()
	writeCA(newCA_, time.Now().Add(90*time.Second))
	if _, err := query(t, s); err != nil || s.transport.transport() != before {
		t.Errorf("the same bundle written again: error %v, transport replaced %v", err, s.transport.transport() != before)
	}

	// A rotation that leaves a broken file keeps the last good bundle.
	writeFile(t, caFile, "not a certificate")
	future := time.Now().Add(2 * time.Minute)
	_ = os.Chtimes(caFile, future, future)
	s.Close()
	if _, err := query(t, s); err != nil {
		t.Fatalf("Query() after the CA file was broken: %v, want the last good bundle used", err)
	}
	// It says so, once for the change, and once when the file vanishes.
	_, _ = query(t, s)
	if len(stale) != 1 || !strings.Contains(stale[0].Error(), caFile) {
		t.Fatalf("a broken CA file, read twice: told %q, want once, naming the file", stale)
	}
	if err := os.Remove(caFile); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for range 2 {
		if _, err := query(t, s); err != nil {
			t.Fatalf("Query() after the CA file vanished: %v, want the last good bundle used", err)
		}
	}
	if len(stale) != 2 {
		t.Fatalf("a vanished CA file, read twice: told %d times in all, want 2", len(stale))
	}

	// The name is still verified: a certificate from the trusted CA that
	// does not name the address asked for is refused.
	writeCA(newCA_, time.Now().Add(3*time.Minute))
	cert = serverCert(newCA_, newKey)
	serving.Store(&cert)
	s.Close()
	var he x509.HostnameError
	if _, err := query(t, s); !errors.As(err, &he) {
		t.Fatalf("Query() of a backend whose certificate does not name it: error = %v, want x509.HostnameError", err)
	}
}

func TestQueryMutualTLS(t *testing.T) {
	dir := t.TempDir()
	clientCA, clientCAKey := newCA(t)
	certFile, keyFile := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	issueClientCert(t, clientCA, clientCAKey, "optimizer", certFile, keyFile)

	var seenCN atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seenCN.Store(r.TLS.PeerCertificates[0].Subject.CommonName)
		fixed(200, vectorBody("a", "1"))(w, r)
	}))
	pool := x509.NewCertPool()
	pool.AddCert(clientCA)
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // expected handshake failures
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(dir, "server-ca.pem")
	writeFile(t, caFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})))

	s := newSource(t, Config{URL: srv.URL, CAFile: caFile, CertFile: certFile, KeyFile: keyFile})
	if _, err := query(t, s); err != nil {
		t.Fatalf("Query() with client cert error = %v", err)
	}
	if cn := seenCN.Load(); cn != "optimizer" {
		t.Errorf("server saw client CN %v", cn)
	}

	// Rotation: a new certificate in place is used for new connections.
	issueClientCert(t, clientCA, clientCAKey, "optimizer-rotated", certFile, keyFile)
	future := time.Now().Add(time.Minute)
	_ = os.Chtimes(certFile, future, future)
	_ = os.Chtimes(keyFile, future, future)
	s.Close()
	if _, err := query(t, s); err != nil {
		t.Fatalf("Query() after rotation error = %v", err)
	}
	if cn := seenCN.Load(); cn != "optimizer-rotated" {
		t.Errorf("after rotation server saw client CN %v", cn)
	}

	if _, err := query(t, newSource(t, Config{URL: srv.URL, CAFile: caFile})); err == nil {
		t.Error("Query() without a client certificate succeeded")
	}
}

func TestQueryTimeout(t *testing.T) {
	srv := hangingServer(t)
	s := newSource(t, Config{URL: srv.URL, Timeout: 150 * time.Millisecond})
	start := time.Now()
	res, err := query(t, s)
	elapsed := time.Since(start)
	var ue *UnreachableError
	if !errors.As(err, &ue) || !ue.Timeout || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error = %#v, want *UnreachableError{Timeout: true} wrapping DeadlineExceeded", err)
	}
	if elapsed > 2*time.Second {
		t.Errorf("Query() took %v with a 150ms timeout", elapsed)
	}
	if res.Latency < 150*time.Millisecond || res.Query == "" {
		t.Errorf("Result on timeout = %+v, want Latency >= timeout and the query", res)
	}
}

func TestQueryTimeoutWhileReadingBody(t *testing.T) {
	release := make(chan struct{})
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"vector","result":[`))
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release) }) // runs before the server's Close
	_, err := query(t, newSource(t, Config{URL: srv.URL, Timeout: 150 * time.Millisecond}))
	var ue *UnreachableError
	if !errors.As(err, &ue) || !ue.Timeout {
		t.Fatalf("error = %#v, want *UnreachableError{Timeout: true}", err)
	}
}

func TestQueryCallerCancel(t *testing.T) {
	srv := hangingServer(t)
	s := newSource(t, Config{URL: srv.URL})
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err := s.Query(ctx, DefaultCPUQuery, testTarget, testNow)
	var ue *UnreachableError
	if !errors.As(err, &ue) || ue.Timeout || !errors.Is(err, context.Canceled) {
		t.Fatalf("error = %#v, want *UnreachableError wrapping context.Canceled", err)
	}
}

func TestQueryUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	s := newSource(t, Config{URL: "http://u:secret@" + addr + "/prometheus"})
	_, err = query(t, s)
	var ue *UnreachableError
	if !errors.As(err, &ue) || ue.Timeout {
		t.Fatalf("error = %#v, want *UnreachableError (not a timeout)", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Errorf("error leaks the password: %v", err)
	}
	if !strings.Contains(err.Error(), "refused") {
		t.Errorf("error does not say why: %v", err)
	}
}

func TestQueryErrorAnswers(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		check   func(t *testing.T, err error)
		wantMsg string
	}{
		{
			name: "400 bad_data", status: 400,
			body:  `{"status":"error","errorType":"bad_data","error":"1:5: parse error: unexpected identifier"}`,
			check: wantServerError(400, "bad_data", "parse error: unexpected identifier"),
		},
		{
			name: "422 execution", status: 422,
			body:  `{"status":"error","errorType":"execution","error":"query processing would load too many samples"}`,
			check: wantServerError(422, "execution", "too many samples"),
		},
		{
			name: "503 timeout with an API body", status: 503,
			body:  `{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}`,
			check: wantServerError(503, "timeout", "query timed out"),
		},
		{
			name: "500 plain text", status: 500, body: "internal meltdown\n",
			check: wantServerError(500, "server_error", "internal meltdown"),
		},
		{
			name: "502 HTML from a proxy", status: 502, body: "<html><body>Bad Gateway</body></html>",
			check: wantServerError(502, "server_error", "Bad Gateway"),
		},
		{
			name: "401 unauthorized", status: 401, body: "Unauthorized",
			check: wantServerError(401, "client_error", "Unauthorized"),
		},
		{
			name: "VictoriaMetrics style 422", status: 422,
			body:  `{"status":"error","errorType":"422","error":"error when executing query=\"x\": cannot parse"}`,
			check: wantServerError(422, "422", "cannot parse"),
		},
		{
			name: "400 with a non-JSON body", status: 400, body: "bad request, really",
			check: wantServerError(400, "", "bad request, really"),
		},
		{
			name: "200 with status error", status: 200,
			body:  `{"status":"error","errorType":"internal","error":"storage is shutting down"}`,
			check: wantServerError(200, "internal", "shutting down"),
		},
		{
			name: "200 not JSON", status: 200, body: "<html>login page</html>",
			check: wantBadResponse(200),
		},
		{
			name: "200 truncated JSON", status: 200, body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":`,
			check: wantBadResponse(200),
		},
		{
			name: "200 unknown result type", status: 200, body: `{"status":"success","data":{"resultType":"histogram","result":[]}}`,
			check: wantResultType("histogram"),
		},
		{
			name: "200 bad sample value", status: 200, body: `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"a"},"value":[1,"abc"]}]}}`,
			check: wantBadResponse(200),
		},
		{
			name: "scalar", status: 200, body: `{"status":"success","data":{"resultType":"scalar","result":[1700000000,"3"]}}`,
			check: wantResultType("scalar"),
		},
		{
			name: "string", status: 200, body: `{"status":"success","data":{"resultType":"string","result":[1700000000,"x"]}}`,
			check: wantResultType("string"),
		},
		{
			name: "matrix", status: 200, body: `{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"pod":"a"},"values":[[1700000000,"1"]]}]}}`,
			check: wantResultType("matrix"),
		},
		{
			name: "empty vector", status: 200, body: vectorBody(),
			check: func(t *testing.T, err error) {
				var ee *EmptyResultError
				if !errors.As(err, &ee) || ee.Series != 0 || ee.Query == "" {
					t.Fatalf("error = %#v, want *EmptyResultError with 0 series", err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, fixed(tc.status, tc.body))
			res, err := query(t, newSource(t, Config{URL: srv.URL}))
			if err == nil {
				t.Fatalf("Query() = %v, want an error", res.Values)
			}
			if res.Values != nil {
				t.Errorf("Values = %v on error, want nil", res.Values)
			}
			tc.check(t, err)
		})
	}
}

func wantServerError(status int, typ, msgPart string) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var se *ServerError
		if !errors.As(err, &se) {
			t.Fatalf("error = %#v (%v), want *ServerError", err, err)
		}
		if se.StatusCode != status || (typ != "" && se.Type != typ) || !strings.Contains(se.Message, msgPart) {
			t.Fatalf("ServerError = %+v, want status %d type %q message containing %q", se, status, typ, msgPart)
		}
	}
}

func wantBadResponse(status int) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var be *BadResponseError
		if !errors.As(err, &be) || be.StatusCode != status {
			t.Fatalf("error = %#v (%v), want *BadResponseError with status %d", err, err, status)
		}
	}
}

func wantResultType(got string) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var re *ResultTypeError
		if !errors.As(err, &re) || re.Got != got {
			t.Fatalf("error = %#v, want *ResultTypeError{Got: %q}", err, got)
		}
	}
}

func TestQueryInvalidSamplesAreDropped(t *testing.T) {
	srv := newServer(t, fixed(200, vectorBody("a", "NaN", "b", "+Inf", "c", "-0.5", "d", "-Inf")))
	s := newSource(t, Config{URL: srv.URL})
	target := testTarget
	target.Pods = []string{"a", "b", "c", "d", "e"}

	// All invalid: nothing usable is fatal, and the reasons are still reported.
	res, err := s.Query(t.Context(), DefaultCPUQuery, target, testNow)
	var ee *EmptyResultError
	if !errors.As(err, &ee) || ee.Series != 4 {
		t.Fatalf("error = %#v, want *EmptyResultError with 4 series", err)
	}
	if got := invalidPods(res.Issues); !slices.Equal(got, []string{"a", "b", "c", "d"}) {
		t.Errorf("invalid samples reported for %v, want a b c d", got)
	}

	// Some valid: the rest come back, the dropped ones are reported and missing.
	srv2 := newServer(t, fixed(200, vectorBody("a", "NaN", "b", "2", "c", "-1", "d", "+Inf", "e", "0.5")))
	res, err = newSource(t, Config{URL: srv2.URL}).Query(t.Context(), DefaultCPUQuery, target, testNow)
	if err != nil {
		t.Fatalf("Query() error = %v", err)
	}
	if !maps.Equal(res.Values, map[string]float64{"b": 2, "e": 0.5}) {
		t.Errorf("Values = %v", res.Values)
	}
	if !slices.Equal(res.Missing, []string{"a", "c", "d"}) {
		t.Errorf("Missing = %v", res.Missing)
	}
	var ie *InvalidSampleError
	if !errors.As(res.Err(), &ie) {
		t.Errorf("Err() = %v, want an *InvalidSampleError inside", res.Err())
	}
	for _, issue := range res.Issues {
		if e, ok := issue.(*InvalidSampleError); ok && e.Pod == "a" && !math.IsNaN(e.Value) {
			t.Errorf("pod a reported value %v, want NaN", e.Value)
		}
	}
}

func invalidPods(issues []error) []string {
	var pods []string
	for _, i := range issues {
		if e, ok := i.(*InvalidSampleError); ok {
			pods = append(pods, e.Pod)
		}
	}
	return pods
}

func TestQueryDuplicateSeries(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
		{"metric":{"pod":"a","replica":"0"},"value":[1,"1"]},
		{"metric":{"pod":"a","replica":"1"},"value":[1,"3"]},
		{"metric":{"pod":"b","replica":"0"},"value":[1,"2"]},
		{"metric":{"pod":"b","replica":"1"},"value":[1,"2"]},
		{"metric":{"pod":"c"},"value":[1,"4"]}]}}`
	res, err := query(t, newSource(t, Config{URL: newServer(t, fixed(200, body)).URL}))
	if err != nil {
		t.Fatalf("Query() error = %v", err)
	}
	if !maps.Equal(res.Values, map[string]float64{"b": 2, "c": 4}) {
		t.Errorf("Values = %v, want conflicting a dropped, identical b kept", res.Values)
	}
	var dups []DuplicateSeriesError
	for _, i := range res.Issues {
		var d *DuplicateSeriesError
		if errors.As(i, &d) {
			dups = append(dups, *d)
		}
	}
	if len(dups) != 2 || dups[0].Pod != "a" || dups[0].Kept || dups[1].Pod != "b" || !dups[1].Kept {
		t.Errorf("duplicate issues = %+v", dups)
	}
}

func TestQueryMissingPodLabelAndUnexpectedPods(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[
		{"metric":{"namespace":"shop"},"value":[1,"9"]},
		{"metric":{"pod":""},"value":[1,"9"]},
		{"metric":{"pod":"intruder"},"value":[1,"9"]},
		{"metric":{"pod":"a"},"value":[1,"1"]}]}}`
	res, err := query(t, newSource(t, Config{URL: newServer(t, fixed(200, body)).URL}))
	if err != nil {
		t.Fatalf("Query() error = %v", err)
	}
	if !maps.Equal(res.Values, map[string]float64{"a": 1}) {
		t.Errorf("Values = %v", res.Values)
	}
	var missing *MissingPodLabelError
	var unexpected *UnexpectedPodError
	if !errors.As(res.Err(), &missing) || !strings.Contains(missing.Labels, "shop") {
		t.Errorf("Err() = %v, want *MissingPodLabelError with the labels", res.Err())
	}
	if !errors.As(res.Err(), &unexpected) || unexpected.Pod != "intruder" {
		t.Errorf("Err() = %v, want *UnexpectedPodError for intruder", res.Err())
	}

	// Only series without a pod label (a template that forgot "by (pod)"): fatal.
	body = `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"9"]}]}}`
	res, err = query(t, newSource(t, Config{URL: newServer(t, fixed(200, body)).URL}))
	var ee *EmptyResultError
	if !errors.As(err, &ee) || !errors.As(res.Err(), &missing) {
		t.Fatalf("error = %v, issues %v; want *EmptyResultError and *MissingPodLabelError", err, res.Issues)
	}
}

func TestQueryWarnings(t *testing.T) {
	body := `{"status":"success","warnings":["partial response: store gateway down"],"data":{"resultType":"vector","result":[{"metric":{"pod":"a"},"value":[1,"1"]}]}}`
	res, err := query(t, newSource(t, Config{URL: newServer(t, fixed(200, body)).URL}))
	if err != nil {
		t.Fatalf("Query() error = %v", err)
	}
	if res.Values["a"] != 1 {
		t.Errorf("Values = %v", res.Values)
	}
	var we *WarningsError
	if !errors.As(res.Err(), &we) || len(we.Warnings) != 1 || !strings.Contains(we.Error(), "store gateway down") {
		t.Errorf("Err() = %v, want *WarningsError", res.Err())
	}
	if len(res.Warnings) != 1 {
		t.Errorf("Warnings = %v", res.Warnings)
	}

	// Warnings also come back with an error answer.
	body = `{"status":"error","errorType":"execution","error":"boom","warnings":["w1"]}`
	res, err = query(t, newSource(t, Config{URL: newServer(t, fixed(422, body)).URL}))
	if err == nil || len(res.Warnings) != 1 {
		t.Errorf("error answer: err %v, warnings %v; want both", err, res.Warnings)
	}
}

func TestQueryTemplateErrorSendsNothing(t *testing.T) {
	var calls atomic.Int32
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	s := newSource(t, Config{URL: srv.URL})
	for _, tc := range []struct {
		tmpl string
		t    Target
	}{
		{DefaultCPUQuery, Target{Namespace: "n", Window: time.Minute}},
		{`{{.Bad}}`, testTarget},
		{`{{`, testTarget},
	} {
		_, err := s.Query(t.Context(), tc.tmpl, tc.t, testNow)
		var te *TemplateError
		if !errors.As(err, &te) {
			t.Errorf("Query(%q) error = %v, want *TemplateError", tc.tmpl, err)
		}
	}
	if calls.Load() != 0 {
		t.Errorf("%d requests sent for bad templates", calls.Load())
	}
}

func TestQueryConcurrent(t *testing.T) {
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		// Echo a distinct answer per query so mix-ups would show.
		q := r.Form.Get("query")
		pod := q[strings.Index(q, `pod=~"`)+6:]
		pod = pod[:strings.Index(pod, `"`)]
		if strings.HasPrefix(pod, "slow") {
			time.Sleep(300 * time.Millisecond)
			fixed(500, "slow and broken")(w, r)
			return
		}
		fixed(200, vectorBody(pod, "1"))(w, r)
	}))
	s := newSource(t, Config{URL: srv.URL, Timeout: 2 * time.Second})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			pod := fmt.Sprintf("p%d", i)
			if i%5 == 0 {
				pod = fmt.Sprintf("slow%d", i)
			}
			res, err := s.Query(t.Context(), DefaultCPUQuery, Target{Namespace: "n", Pods: []string{pod}, Window: time.Minute}, testNow)
			if strings.HasPrefix(pod, "slow") {
				var se *ServerError
				if !errors.As(err, &se) || se.StatusCode != 500 {
					t.Errorf("%s: error = %v, want ServerError 500", pod, err)
				}
				return
			}
			if err != nil || res.Values[pod] != 1 || len(res.Values) != 1 {
				t.Errorf("%s: Values = %v, err = %v", pod, res.Values, err)
			}
		})
	}
	wg.Wait()
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "test client CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func issueClientCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn, certFile, keyFile string) {
	t.Helper()
	cert := issueCert(t, ca, caKey, &x509.Certificate{Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	writeFile(t, certFile, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})))
	keyDER, err := x509.MarshalECPrivateKey(cert.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
}

// issueCert signs a leaf certificate from tmpl (subject, usages, names)
// with ca, valid for the hour around now.
func issueCert(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, tmpl *x509.Certificate) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber, _ = rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// A backend whose connection breaks while the answer is being read is
// unreachable, not the sender of a malformed answer: the error kind says
// which to look at, and only a malformed answer may be a query's fault.
func TestConnectionBrokenMidAnswerIsUnreachable(t *testing.T) {
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "4096")
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{"status":"success","data":{"resultType":"vector","result":[`))
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	_, err := query(t, newSource(t, Config{URL: srv.URL}))
	var unreachable *UnreachableError
	if !errors.As(err, &unreachable) {
		t.Fatalf("err %T %v, want *UnreachableError", err, err)
	}
}
