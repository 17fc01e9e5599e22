package promsource

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Every shipped query template (each Default*Query constant of this package,
// including ones added later) selects only series of the optimizer's own
// Service's namespace: every series selector of the rendered query carries
// an exact namespace matcher. Custom templates, which could read anything
// with the operator's credentials, need the administrator's flag.
//
// One documented exception, in DefaultNodeCPUQuery alone: the cAdvisor root
// cgroup, container_cpu_usage_seconds_total{id="/"}, a node-level total (every
// container and the system), not another team's per-pod series; the query
// reduces it to one number per pod of the Service's namespace.
func TestDefaultQueriesStayInTheServicesNamespace(t *testing.T) {
	templates := defaultQueryTemplates(t)
	for _, known := range []string{"DefaultCPUQuery", "DefaultRequestQuery", "DefaultLatencyQuery", "DefaultNodeCPUQuery"} {
		if _, ok := templates[known]; !ok {
			t.Fatalf("%s not found among the package's constants (found %v)", known, templates)
		}
	}
	if templates["DefaultCPUQuery"] != DefaultCPUQuery || templates["DefaultRequestQuery"] != DefaultRequestQuery || templates["DefaultNodeCPUQuery"] != DefaultNodeCPUQuery {
		t.Fatal("the constants read from the source differ from the compiled ones")
	}
	const ns = "ns-probe"
	selector := regexp.MustCompile(`\{[^{}]*\}`)
	nsMatcher := regexp.MustCompile(`(^|[{,\s])[a-z_]*namespace\s*=\s*"` + ns + `"`)
	for name, tmpl := range templates {
		q, err := Render(tmpl, Target{Namespace: ns, Service: "web", Pods: []string{"web-0", "web-1"}, Window: time.Minute})
		if err != nil {
			t.Errorf("%s does not render: %v", name, err)
			continue
		}
		sels := selector.FindAllString(q, -1)
		if len(sels) == 0 {
			t.Errorf("%s has no series selector with label matchers: %s", name, q)
		}
		for _, s := range sels {
			if name == "DefaultNodeCPUQuery" && s == nodeRootCgroupSelector {
				continue
			}
			if !nsMatcher.MatchString(s) {
				t.Errorf("%s: selector %s does not filter on namespace %q: %s", name, s, ns, q)
			}
		}
	}
}

// nodeRootCgroupSelector is the one selector of a shipped query allowed
// without a namespace matcher (see above): exactly this, nothing wider.
const nodeRootCgroupSelector = `{id="/"}`

// defaultQueryTemplates reads every Default*Query string constant from the
// package's source, so a template added later is checked too.
func defaultQueryTemplates(t *testing.T) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					if !strings.HasPrefix(id.Name, "Default") || !strings.HasSuffix(id.Name, "Query") {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("%s is not a plain string literal; extend this test to evaluate it", id.Name)
					}
					v, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					out[id.Name] = v
				}
			}
		}
	}
	return out
}
