package promsource

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
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

// newTransport builds the HTTP transport: TLS settings, then a wrapper that adds
// the bearer token and the extra headers to every request.
func newTransport(cfg Config) (*authTransport, error) {
	tlsCfg := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: cfg.InsecureSkipVerify, //nolint:gosec // explicit user opt-in
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("reading CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA file %s holds no PEM certificate", cfg.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("client certificate needs both a certificate file and a key file")
	}
	if cfg.CertFile != "" {
		l := &certLoader{certFile: cfg.CertFile, keyFile: cfg.KeyFile}
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
	return &authTransport{
		base:      base,
		headers:   headers,
		token:     cfg.BearerToken,
		tokenFile: cfg.BearerTokenFile,
	}, nil
}

// authTransport adds credentials and headers to each request.
type authTransport struct {
	base      *http.Transport
	headers   http.Header
	token     string
	tokenFile string
}

func (t *authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
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
	if token == "" && len(t.headers) == 0 {
		return t.base.RoundTrip(req)
	}
	r := req.Clone(req.Context())
	for k, vs := range t.headers {
		if k == "Host" {
			r.Host = vs[0]
			continue
		}
		r.Header[k] = vs
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return t.base.RoundTrip(r)
}

func (t *authTransport) CloseIdleConnections() { t.base.CloseIdleConnections() }

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

// certLoader serves a client certificate and reloads it when either file changes
// (cert-manager and similar rotate them in place). If a reload fails, the last good
// certificate stays in use.
type certLoader struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	certMod time.Time
	keyMod  time.Time
}

func (l *certLoader) get() (*tls.Certificate, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cs, cerr := os.Stat(l.certFile)
	ks, kerr := os.Stat(l.keyFile)
	if cerr == nil && kerr == nil && l.cert != nil && cs.ModTime().Equal(l.certMod) && ks.ModTime().Equal(l.keyMod) {
		return l.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(l.certFile, l.keyFile)
	if err != nil {
		if l.cert != nil {
			return l.cert, nil
		}
		return nil, &CredentialsError{File: l.certFile, Err: err}
	}
	l.cert = &cert
	if cerr == nil && kerr == nil {
		l.certMod, l.keyMod = cs.ModTime(), ks.ModTime()
	}
	return l.cert, nil
}
