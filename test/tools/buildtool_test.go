// Package tools tests how the Makefile builds the tools in bin/: every build
// goes through hack/build-tool.sh, which names the tool, says about how long
// it takes, and prints an elapsed-time line while it runs, so a first
// 25-minute run is never silent. Nothing here builds a real tool.
package tools

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

func script(t *testing.T) (root, path string) {
	t.Helper()
	root, err := harness.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return root, filepath.Join(root, "hack", "build-tool.sh")
}

// TestBuildToolReportsProgress wraps a 3-second command standing in for a
// compile, with the ticker at 1 s, and checks what the user sees: the tool
// and its expected duration first, elapsed-time lines while it runs, the
// total at the end, and the command's exit status passed through.
func TestBuildToolReportsProgress(t *testing.T) {
	_, sh := script(t)
	cmd := exec.CommandContext(t.Context(), sh, "kube-apiserver-v1.36.3", "--", "sleep", "3")
	cmd.Env = append(cmd.Environ(), "BUILD_TOOL_TICK=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build-tool.sh: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if !strings.HasPrefix(lines[0], "[kube-apiserver-v1.36.3] Building") || !strings.Contains(lines[0], "about 8 min") {
		t.Errorf("first line %q does not name the tool and its expected time", lines[0])
	}
	ticks := regexp.MustCompile(`(?m)^\[kube-apiserver-v1\.36\.3\] still building, \dm\d\ds elapsed`).FindAllString(string(out), -1)
	if len(ticks) < 2 {
		t.Errorf("%d elapsed-time lines in a 3 s build with a 1 s tick, want at least 2:\n%s", len(ticks), out)
	}
	if last := lines[len(lines)-1]; !regexp.MustCompile(`^\[kube-apiserver-v1\.36\.3\] built in 0m0[3-9]s$`).MatchString(last) {
		t.Errorf("last line %q does not report the total time", last)
	}

	fail := exec.CommandContext(t.Context(), sh, "helm-v3.22.0", "--", "sh", "-c", "exit 3")
	out, err = fail.CombinedOutput()
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 3 {
		t.Errorf("failing build: error %v, want exit status 3", err)
	}
	if !strings.Contains(string(out), "[helm-v3.22.0] build FAILED") {
		t.Errorf("failing build output lacks the failure line:\n%s", out)
	}
}

// TestEveryToolBuildReportsProgress asks make what it would run to build
// every tool into an empty directory (make -n runs nothing) and checks that
// each build goes through hack/build-tool.sh with a name it has an estimate
// for, and that the default tick is at most 30 s.
func TestEveryToolBuildReportsProgress(t *testing.T) {
	root, sh := script(t)
	cmd := exec.CommandContext(t.Context(), "make", "-n", "tools", "LOCALBIN="+t.TempDir())
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n tools: %v\n%s", err, out)
	}
	builds := 0
	for _, line := range strings.Split(string(out), "\n") {
		if !regexp.MustCompile(`\bgo (build|install)\b`).MatchString(line) {
			continue
		}
		builds++
		m := regexp.MustCompile(`build-tool\.sh (\S+) -- go`).FindStringSubmatch(line)
		if m == nil {
			t.Errorf("a tool is built without hack/build-tool.sh (silent for minutes):\n%s", line)
			continue
		}
		name := regexp.MustCompile(`-v[0-9].*$`).ReplaceAllString(m[1], "")
		probe := exec.CommandContext(t.Context(), sh, m[1], "--", "true")
		first, _ := probe.CombinedOutput()
		if !strings.Contains(string(first), "about ") {
			t.Errorf("hack/build-tool.sh has no time estimate for %s: %q", name, first)
		}
	}
	if builds < 7 {
		t.Errorf("make -n tools shows %d tool builds, want 7 (controller-gen, kustomize, kube-apiserver, etcd, istiod, prometheus, helm):\n%s", builds, out)
	}
	data, err := exec.CommandContext(t.Context(), "grep", "-E", `^tick=\$\{BUILD_TOOL_TICK:-([0-9]+)\}`, sh).Output()
	if err != nil {
		t.Fatalf("hack/build-tool.sh has no default tick: %v", err)
	}
	m := regexp.MustCompile(`:-(\d+)\}`).FindStringSubmatch(string(data))
	if m == nil {
		t.Fatalf("cannot read the default tick from %q", data)
	}
	if tick, _ := strconv.Atoi(m[1]); tick < 1 || tick > 30 {
		t.Errorf("default tick %d s: the user must see a line at least every 30 s", tick)
	}
}
