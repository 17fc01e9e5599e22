package promsource

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// CredentialsError means a credential file (bearer token, client certificate)
// could not be read when a request was about to be sent.
type CredentialsError struct {
	File string
	Err  error
}

func (e *CredentialsError) Error() string {
	return fmt.Sprintf("reading credentials from %s: %v", e.File, e.Err)
}

func (e *CredentialsError) Unwrap() error { return e.Err }

// FileCredentials are secrets read from files on every request, so that no
// secret shows in the manager's arguments (visible in the pod spec and the
// process list) and a rotated, mounted Secret is picked up without a restart.
type FileCredentials struct {
	// BasicAuthUsername and the password in BasicAuthPasswordFile are sent
	// as basic auth. Mutually exclusive with a bearer token, an
	// Authorization header and user info in the URL.
	BasicAuthUsername     string
	BasicAuthPasswordFile string
	// HeaderFiles maps a header name to a file holding its value (for
	// example X-Scope-OrgID or an API key header).
	HeaderFiles map[string]string
}

// newTransport builds the HTTP transport: TLS settings, then a wrapper that adds
// the bearer token and the extra headers to every request.
func newTransport(cfg Config) (*authTransport, error) {
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: cfg.InsecureSkipVerify, //nolint:gosec // explicit user opt-in
	}
	var ca *fileReloader[*x509.CertPool]
	if cfg.CAFile != "" {
		ca = newCALoader(cfg.CAFile)
		ca.stale = cfg.OnStaleCredentials
		pool, err := ca.get()
		if err != nil {
			return nil, err
		}
		tlsCfg.RootCAs = pool
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("client certificate needs both a certificate file and a key file")
	}
	if cfg.CertFile != "" {
		l := newCertLoader(cfg.CertFile, cfg.KeyFile)
		l.stale = cfg.OnStaleCredentials
		if _, err := l.get(); err != nil {
			return nil, err
		}
		tlsCfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return l.get() }
	}

	headers := make(http.Header, len(cfg.Headers))
	for k, v := range cfg.Headers {
		if k == "" || strings.ContainsAny(k, " \t\r\n:") {
			return nil, fmt.Errorf("invalid header name %q", k)
		}
		if strings.ContainsAny(v, "\r\n") {
			return nil, fmt.Errorf("header %q: value contains a line break", k)
		}
		headers.Set(k, v)
	}
	if cfg.BearerToken != "" && cfg.BearerTokenFile != "" {
		return nil, errors.New("bearer token and bearer token file are mutually exclusive")
	}
	if (cfg.BearerToken != "" || cfg.BearerTokenFile != "") && headers.Get("Authorization") != "" {
		return nil, errors.New("an Authorization header and a bearer token are mutually exclusive")
	}
	if cfg.BearerTokenFile != "" {
		if _, err := readToken(cfg.BearerTokenFile); err != nil {
			return nil, err
		}
	}
	if err := checkFileCredentials(cfg, headers); err != nil {
		return nil, err
	}

	base := &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   30 * time.Second, // the per-query context deadline is usually shorter
			KeepAlive: 30 * time.Second,
		}).DialContext,
		TLSClientConfig:       tlsCfg,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		MaxIdleConnsPerHost:   16, // several optimizers query one backend concurrently
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("metrics URL: %w", err)
	}
	return &authTransport{
		host:      hostPort(u),
		base:      base,
		ca:        ca,
		headers:   headers,
		token:     cfg.BearerToken,
		tokenFile: cfg.BearerTokenFile,
		files:     cfg.FileCredentials,
	}, nil
}

// checkFileCredentials refuses contradictory credentials and reads every
// file once, so a wrong path fails at start rather than at the first query.
func checkFileCredentials(cfg Config, headers http.Header) error {
	f := cfg.FileCredentials
	if f.BasicAuthPasswordFile != "" || f.BasicAuthUsername != "" {
		if f.BasicAuthUsername == "" || f.BasicAuthPasswordFile == "" {
			return errors.New("basic auth needs both a username and a password file")
		}
		authFile := false
		for name := range f.HeaderFiles {
			authFile = authFile || http.CanonicalHeaderKey(name) == "Authorization"
		}
		if cfg.BearerToken != "" || cfg.BearerTokenFile != "" || headers.Get("Authorization") != "" || authFile {
			return errors.New("basic auth and a bearer token or Authorization header are mutually exclusive")
		}
		if u, err := url.Parse(cfg.URL); err == nil && u.User != nil {
			return errors.New("basic auth from a password file and user info in the URL are mutually exclusive")
		}
		if _, err := readSecret(f.BasicAuthPasswordFile); err != nil {
			return err
		}
	}
	for name, file := range f.HeaderFiles {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			return fmt.Errorf("invalid header name %q", name)
		}
		if headers.Get(name) != "" {
			return fmt.Errorf("header %q is given both as a value and as a file", name)
		}
		if http.CanonicalHeaderKey(name) == "Authorization" && (cfg.BearerToken != "" || cfg.BearerTokenFile != "") {
			return errors.New("an Authorization header and a bearer token are mutually exclusive")
		}
		if _, err := readSecret(file); err != nil {
			return err
		}
	}
	return nil
}

// authTransport adds credentials and headers to each request.
type authTransport struct {
	// host is the backend's (the metrics URL's host and port, the
	// scheme's default port if none, compared without case): credentials
	// and headers go to it only, not to another host or port a redirect
	// names.
	host      string
	base      *http.Transport
	headers   http.Header
	token     string
	tokenFile string
	files     FileCredentials
	// ca, when set, is the CA bundle file: a new bundle there swaps base
	// for a transport that trusts it (see transport).
	ca     *fileReloader[*x509.CertPool]
	baseMu sync.Mutex
}

// transport is the transport for the next request: base, or a copy that
// trusts the CA bundle as it is now in the CA file, so that a bundle
// rotated in place (a mounted Secret or ConfigMap) is trusted without a
// restart, by the standard verification (names and IP addresses). The
// copy opens new connections; the old transport's idle ones are closed.
func (t *authTransport) transport() *http.Transport {
	t.baseMu.Lock()
	defer t.baseMu.Unlock()
	if t.ca == nil {
		return t.base
	}
	if pool, err := t.ca.get(); err == nil && pool != t.base.TLSClientConfig.RootCAs {
		old := t.base
		t.base = old.Clone()
		t.base.TLSClientConfig.RootCAs = pool
		old.CloseIdleConnections()
	}
	return t.base
}

// fileHeaders reads the credentials kept in files, on every request (one
// per optimizer per cycle), so rotation is picked up at once.
func (t *authTransport) fileHeaders() (http.Header, error) {
	if t.files.BasicAuthPasswordFile == "" && len(t.files.HeaderFiles) == 0 {
		return nil, nil
	}
	h := http.Header{}
	if t.files.BasicAuthPasswordFile != "" {
		pw, err := readSecret(t.files.BasicAuthPasswordFile)
		if err != nil {
			return nil, err
		}
		r := http.Request{Header: h}
		r.SetBasicAuth(t.files.BasicAuthUsername, pw)
	}
	for name, file := range t.files.HeaderFiles {
		v, err := readSecret(file)
		if err != nil {
			return nil, err
		}
		h.Set(name, v)
	}
	return h, nil
}

func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !strings.EqualFold(hostPort(req.URL), t.host) {
		// A redirect to another host (a login page, another virtual
		// host): the backend's credentials and headers are not sent
		// there, as Go's client itself drops Authorization across hosts.
		return t.transport().RoundTrip(req)
	}
	token := t.token
	if t.tokenFile != "" {
		// Read on every request (one per optimizer per cycle): rotated tokens,
		// such as projected service-account tokens, are picked up at once.
		var err error
		if token, err = readToken(t.tokenFile); err != nil {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, err
		}
	}
	fromFiles, err := t.fileHeaders()
	if err != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, err
	}
	if token == "" && len(t.headers) == 0 && len(fromFiles) == 0 {
		return t.transport().RoundTrip(req)
	}
	r := req.Clone(req.Context())
	for _, hs := range []http.Header{t.headers, fromFiles} {
		for k, vs := range hs {
			if k == "Host" {
				r.Host = vs[0]
				continue
			}
			r.Header[k] = vs
		}
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return t.transport().RoundTrip(r)
}

func (t *authTransport) CloseIdleConnections() { t.transport().CloseIdleConnections() }

// readSecret reads a password or header value: surrounding white space
// (a trailing newline from `echo` or an editor) is dropped.
func readSecret(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", &CredentialsError{File: file, Err: err}
	}
	v := strings.TrimSpace(string(b))
	if v == "" {
		return "", &CredentialsError{File: file, Err: errors.New("file is empty")}
	}
	if strings.ContainsAny(v, "\r\n") {
		return "", &CredentialsError{File: file, Err: errors.New("value contains a line break")}
	}
	return v, nil
}

func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", &CredentialsError{File: file, Err: err}
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", &CredentialsError{File: file, Err: errors.New("file is empty")}
	}
	if strings.ContainsAny(tok, "\r\n") {
		return "", &CredentialsError{File: file, Err: errors.New("token contains a line break")}
	}
	return tok, nil
}

// fileReloader serves a value read from files, and reads it again when
// any of them changes: cert-manager and the kubelet rotate mounted Secrets
// and ConfigMaps in place. If a read fails, the last good value stays in
// use and the files are read again at the next use, since a file can be
// caught mid-write (a certificate written before its key, a torn read
// within one modification time); stale, when set, is told when a second
// read of the files as they were fails too (once for each state of them,
// a vanished file included). same, when set, keeps the last value (and
// what was built on it) when a new read holds the same thing.
type fileReloader[T any] struct {
	files []string
	read  func() (T, error)
	same  func(a, b T) bool
	stale func(error)

	mu    sync.Mutex
	value T
	ok    bool
	mods  []time.Time
	// failed: the last read failed, with the files at failedMods (nil: a
	// file was missing); told: stale was told of that state.
	failed, told bool
	failedMods   []time.Time
}

func (r *fileReloader[T]) get() (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mods := make([]time.Time, len(r.files))
	for i, f := range r.files {
		st, err := os.Stat(f)
		if err != nil {
			mods = nil
			break
		}
		mods[i] = st.ModTime()
	}
	if r.ok && mods != nil && slices.EqualFunc(mods, r.mods, time.Time.Equal) {
		r.failed, r.told = false, false
		return r.value, nil
	}
	v, err := r.read()
	switch {
	case err != nil && r.ok:
		again := r.failed && (mods == nil) == (r.failedMods == nil) && slices.EqualFunc(mods, r.failedMods, time.Time.Equal)
		if !again {
			r.failed, r.told, r.failedMods = true, false, mods
		} else if !r.told && r.stale != nil {
			r.told = true
			r.stale(fmt.Errorf("%s changed and cannot be read, so the last good one stays in use: %w", strings.Join(r.files, " or "), err))
		}
		return r.value, nil
	case err != nil:
		var zero T
		return zero, err
	}
	r.failed, r.told = false, false
	if mods != nil {
		r.mods = mods
	}
	if r.ok && r.same != nil && r.same(v, r.value) {
		return r.value, nil
	}
	r.value, r.ok = v, true
	return r.value, nil
}

// newCertLoader serves the client certificate of certFile and keyFile.
func newCertLoader(certFile, keyFile string) *fileReloader[*tls.Certificate] {
	return &fileReloader[*tls.Certificate]{files: []string{certFile, keyFile}, read: func() (*tls.Certificate, error) {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, &CredentialsError{File: certFile, Err: err}
		}
		return &cert, nil
	}}
}

// newCALoader serves the CA bundle of file, which the backend's
// certificate is verified against; the same bundle written again keeps the
// pool, and so the connections (see authTransport.transport).
func newCALoader(file string) *fileReloader[*x509.CertPool] {
	return &fileReloader[*x509.CertPool]{files: []string{file}, read: func() (*x509.CertPool, error) { return readCAs(file) },
		same: (*x509.CertPool).Equal}
}

func readCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("reading CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s holds no PEM certificate", file)
	}
	return pool, nil
}

// hostPort is u's host and port, with the scheme's default port when u
// names none.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}
