package harness

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildBinary builds the package pkg of this repository (e.g. "./cmd") into
// the test's temporary directory and returns the binary's path; a build
// failure fails the test with the compiler's output.
func BuildBinary(t testing.TB, pkg string) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(pkg))
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}
