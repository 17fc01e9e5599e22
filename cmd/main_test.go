package main

import (
	"context"
	"errors"
	"flag"
	"testing"
	"time"

	"github.com/go-logr/logr"
)

func TestFlags(t *testing.T) {
	parse := func(args ...string) *options {
		t.Helper()
		o, _, err := parseFlags(flag.NewFlagSet("manager", flag.ContinueOnError), args)
		if err != nil {
			t.Fatalf("parseFlags(%v): %v", args, err)
		}
		return o
	}
	if o := parse(); !o.leaderElect {
		t.Errorf("--leader-elect defaults to false, want true: two replicas must never both write")
	}
	if o := parse("--leader-elect=false"); o.leaderElect {
		t.Errorf("--leader-elect=false is ignored")
	}
	o := parse("--prometheus-basic-auth-username=reader", "--prometheus-basic-auth-password-file=/secrets/pw",
		"--prometheus-header-file=X-Api-Key=/secrets/key", "--prometheus-header=X-Scope-OrgID=t1")
	p := o.prometheus
	if p.BasicAuthUsername != "reader" || p.BasicAuthPasswordFile != "/secrets/pw" ||
		p.HeaderFiles["X-Api-Key"] != "/secrets/key" || p.Headers["X-Scope-OrgID"] != "t1" {
		t.Errorf("credentials flags give %+v", p)
	}
}

// TestStartManagerStopsWhenCachesNeverSynced: controller-runtime's Start
// does not return after the context ends while its caches have not synced;
// the process must stop anyway, and a manager that did sync must be
// waited for however long its shutdown takes.
func TestStartManagerStopsWhenCachesNeverSynced(t *testing.T) {
	const grace = 50 * time.Millisecond
	tests := map[string]struct {
		synced   bool
		stopTime time.Duration // how long Start takes to return after ctx ends; <0: never
		want     error
	}{
		"stops by itself":                 {synced: true, stopTime: 0},
		"never synced, never stops":       {synced: false, stopTime: -1},
		"synced, slow graceful shutdown":  {synced: true, stopTime: 4 * grace, want: errSlowStop},
		"never synced but stops in grace": {synced: false, stopTime: grace / 5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			synced := make(chan struct{})
			if tc.synced {
				close(synced)
			}
			start := func(ctx context.Context) error {
				<-ctx.Done()
				if tc.stopTime < 0 {
					select {} // controller-runtime#3440
				}
				time.Sleep(tc.stopTime)
				if tc.want != nil {
					return tc.want
				}
				return nil
			}
			done := make(chan error, 1)
			go func() { done <- startManager(ctx, start, synced, grace, logr.Discard()) }()
			cancel()
			select {
			case err := <-done:
				if !errors.Is(err, tc.want) {
					t.Errorf("startManager = %v, want %v", err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("startManager did not return")
			}
		})
	}
	t.Run("start fails", func(t *testing.T) {
		boom := errors.New("boom")
		err := startManager(context.Background(), func(context.Context) error { return boom }, make(chan struct{}), grace, logr.Discard())
		if !errors.Is(err, boom) {
			t.Errorf("startManager = %v, want %v", err, boom)
		}
	})
}

var errSlowStop = errors.New("slow stop")

func TestMemoryLimitLeavesHeadroom(t *testing.T) {
	env := func(vars map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	}
	for name, c := range map[string]struct {
		vars  map[string]string
		limit int64
		set   bool
	}{
		"container limit":      {map[string]string{"CONTAINER_MEMORY_LIMIT": "536870912"}, 483183820, true},
		"GOMEMLIMIT wins":      {map[string]string{"CONTAINER_MEMORY_LIMIT": "536870912", "GOMEMLIMIT": "300MiB"}, 0, false},
		"no limit":             {map[string]string{}, 0, false},
		"not a number":         {map[string]string{"CONTAINER_MEMORY_LIMIT": "512Mi"}, 0, false},
		"zero (no limit seen)": {map[string]string{"CONTAINER_MEMORY_LIMIT": "0"}, 0, false},
	} {
		limit, set := memoryLimit(env(c.vars))
		if limit != c.limit || set != c.set {
			t.Errorf("%s: memoryLimit = %d, %v; want %d, %v", name, limit, set, c.limit, c.set)
		}
	}
}
