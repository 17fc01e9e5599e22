package promsource

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestCredentialsFromFiles: basic auth and header values come from files,
// re-read on every query so a rotated Secret is used at once, and a missing
// file fails the query with a *CredentialsError naming it.
func TestCredentialsFromFiles(t *testing.T) {
	type seen struct {
		user, pass, key string
		basic           bool
	}
	var mu sync.Mutex
	var got seen
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		mu.Lock()
		got = seen{u, p, r.Header.Get("X-Api-Key"), ok}
		mu.Unlock()
		fixed(200, vectorBody("a", "1"))(w, r)
	}))
	last := func() seen { mu.Lock(); defer mu.Unlock(); return got }
	dir := t.TempDir()
	pwFile, keyFile := filepath.Join(dir, "password"), filepath.Join(dir, "api-key")
	writeFile(t, pwFile, "first-pass\n")
	writeFile(t, keyFile, "key-1")
	s := newSource(t, Config{URL: srv.URL, FileCredentials: FileCredentials{
		BasicAuthUsername: "reader", BasicAuthPasswordFile: pwFile,
		HeaderFiles: map[string]string{"X-Api-Key": keyFile},
	}})
	if _, err := query(t, s); err != nil {
		t.Fatal(err)
	}
	if g := last(); g != (seen{"reader", "first-pass", "key-1", true}) {
		t.Errorf("seen %+v, want basic auth reader/first-pass and X-Api-Key key-1", g)
	}
	writeFile(t, pwFile, "second-pass")
	writeFile(t, keyFile, "key-2")
	if _, err := query(t, s); err != nil {
		t.Fatal(err)
	}
	if g := last(); g != (seen{"reader", "second-pass", "key-2", true}) {
		t.Errorf("after rotation seen %+v, want second-pass and key-2", g)
	}
	if err := os.Remove(keyFile); err != nil {
		t.Fatal(err)
	}
	_, err := query(t, s)
	var ce *CredentialsError
	if !errors.As(err, &ce) || ce.File != keyFile {
		t.Fatalf("error with the header file gone = %v, want *CredentialsError for %s", err, keyFile)
	}
}

func TestFileCredentialsRejectBadConfig(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	writeFile(t, pw, "p")
	empty := filepath.Join(dir, "empty")
	writeFile(t, empty, "\n")
	missing := filepath.Join(dir, "none")
	for name, cfg := range map[string]Config{
		"user without password":    {URL: "http://h", FileCredentials: FileCredentials{BasicAuthUsername: "u"}},
		"password without user":    {URL: "http://h", FileCredentials: FileCredentials{BasicAuthPasswordFile: pw}},
		"password file missing":    {URL: "http://h", FileCredentials: FileCredentials{BasicAuthUsername: "u", BasicAuthPasswordFile: missing}},
		"password file empty":      {URL: "http://h", FileCredentials: FileCredentials{BasicAuthUsername: "u", BasicAuthPasswordFile: empty}},
		"basic auth and token":     {URL: "http://h", BearerToken: "t", FileCredentials: FileCredentials{BasicAuthUsername: "u", BasicAuthPasswordFile: pw}},
		"basic auth and URL user":  {URL: "http://a:b@h", FileCredentials: FileCredentials{BasicAuthUsername: "u", BasicAuthPasswordFile: pw}},
		"header file missing":      {URL: "http://h", FileCredentials: FileCredentials{HeaderFiles: map[string]string{"X-Key": missing}}},
		"header as value and file": {URL: "http://h", Headers: map[string]string{"X-Key": "v"}, FileCredentials: FileCredentials{HeaderFiles: map[string]string{"x-key": pw}}},
		"bad header name":          {URL: "http://h", FileCredentials: FileCredentials{HeaderFiles: map[string]string{"X Key": pw}}},
		"token and auth file":      {URL: "http://h", BearerToken: "t", FileCredentials: FileCredentials{HeaderFiles: map[string]string{"authorization": pw}}},
		"basic auth and auth file": {URL: "http://h", FileCredentials: FileCredentials{BasicAuthUsername: "u", BasicAuthPasswordFile: pw, HeaderFiles: map[string]string{"authorization": pw}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New succeeded, want an error", name)
		}
	}
}
