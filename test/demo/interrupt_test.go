package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// serverProcesses lists "pid name" of the live processes of the servers the
// demo starts.
func serverProcesses() map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		switch name {
		case "kube-apiserver", "etcd", "prometheus", "pilot-discovery":
			stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
			if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(strings.TrimSpace(string(stat)[i+1:]), "Z") {
				continue
			}
			out[e.Name()+" "+name] = true
		}
	}
	return out
}

// TestCtrlCLeavesNothingBehind runs the demo as a user would, presses Ctrl-C
// (SIGINT to the whole process group, as a terminal sends it) once traffic
// flows, and checks that it exits with 130 and that none of the servers it
// started is left running.
func TestCtrlCLeavesNothingBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the demo's API server, Prometheus and istiod")
	}
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "demo")
	build := exec.Command("go", "build", "-o", bin, "./test/demo")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build demo: %v\n%s", err, out)
	}
	before := serverProcesses()

	cmd := exec.Command(bin, "--scenario", filepath.Join(root, "test/demo/scenarios/quick.yaml"), "--out", filepath.Join(t.TempDir(), "demo.svg"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBEBUILDER_ASSETS="+filepath.Join(root, "bin"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		lines []string
	)
	output := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(lines, "\n")
	}
	traffic := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		signalled := false
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if !signalled && strings.HasPrefix(sc.Text(), "[t=") {
				signalled = true
				close(traffic)
			}
		}
	}()
	select {
	case <-traffic:
	case <-time.After(2 * time.Minute):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("no traffic after 2 minutes:\n%s", output())
	}
	// Ctrl-C in a terminal signals the whole foreground process group.
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatal("the demo did not stop within 30s of Ctrl-C")
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("exit code %d after Ctrl-C, want 130 (err %v)", code, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for p := range serverProcesses() {
			if !before[p] {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left running after Ctrl-C: %v\noutput:\n%s", left, output())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
