package promsource

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
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

// A rotation caught mid-write is no rotation gone wrong: a pair of files
// read after the first was written and before the second (a certificate
// before its key), or a file read half written within one modification
// time, fails once, is read again at the next use, and is taken once
// whole, with nothing reported. A state of the files that fails twice is
// reported once.
func TestReloaderRetriesAReadCaughtMidWrite(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "cert"), filepath.Join(dir, "key")
	at := time.Now()
	write := func(path, content string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	// The pair is good when both files hold the same generation.
	r := &fileReloader[string]{files: []string{a, b}, read: func() (string, error) {
		x, err1 := os.ReadFile(a)
		y, err2 := os.ReadFile(b)
		if err := errors.Join(err1, err2); err != nil {
			return "", err
		}
		if string(x) != string(y) {
			return "", fmt.Errorf("%q does not go with %q", x, y)
		}
		return string(x), nil
	}}
	var told []error
	r.stale = func(err error) { told = append(told, err) }
	get := func(want string) {
		t.Helper()
		if v, err := r.get(); err != nil || v != want {
			t.Fatalf("get() = %q, %v; want %q", v, err, want)
		}
	}
	write(a, "1", at)
	write(b, "1", at)
	get("1")

	// A certificate written before its key.
	write(a, "2", at.Add(time.Minute))
	get("1")
	write(b, "2", at.Add(time.Minute))
	get("2")
	// A torn read: half written, then whole, within one modification time.
	write(a, "3", at.Add(2*time.Minute))
	write(b, "x", at.Add(2*time.Minute))
	get("2")
	write(b, "3", at.Add(2*time.Minute))
	get("3")
	if len(told) != 0 {
		t.Fatalf("rotations caught mid-write reported: %v", told)
	}

	// A rotation that stays broken: reported at the second read, once.
	write(a, "4", at.Add(3*time.Minute))
	for range 3 {
		get("3")
	}
	if len(told) != 1 {
		t.Fatalf("a pair that stays broken: told %d times, want once", len(told))
	}
}
