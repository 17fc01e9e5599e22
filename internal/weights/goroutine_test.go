package weights

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"testing"
)

// TestPackageStartsNoGoroutine: make test runs this package without the
// race detector (the Makefile's TEST_NORACE_PACKAGES), on the ground that
// neither the engine nor its tests start a goroutine, so the detector has
// nothing to watch. A go statement here, in code or tests, ends that
// ground: take the package out of TEST_NORACE_PACKAGES.
func TestPackageStartsNoGoroutine(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files to read (%v)", err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			if g, ok := n.(*ast.GoStmt); ok {
				t.Errorf("%s: a go statement; the package now needs the race detector (remove ./internal/weights/... from the Makefile's TEST_NORACE_PACKAGES)", fset.Position(g.Pos()))
			}
			return true
		})
	}
}
