package v1alpha1

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// TestStoredObjectsAlwaysDecode: whatever a stored optimizer holds, it
// decodes; every field that can be kept is kept and each one that cannot
// is named with its path.
func TestStoredObjectsAlwaysDecode(t *testing.T) {
	const head = `{"apiVersion":"optimization.liorfranko.github.io/v1alpha1","kind":"IstioAdaptiveRequestOptimizer","metadata":{"name":"web","namespace":"shop","finalizers":["f"]},`
	tests := map[string]struct {
		body string // after the metadata
		// problems are the paths reported, "?" before an unknown field's.
		problems []string
		check    func(*testing.T, *IstioAdaptiveRequestOptimizer)
	}{
		"valid": {
			body: `"spec":{"service_name":"web","optimization":{"cycle":"30s","dead_band_percent":5}}}`,
			check: func(t *testing.T, o *IstioAdaptiveRequestOptimizer) {
				if *o.Spec.Optimization.DeadBandPercent != 5 || o.Spec.Optimization.Cycle.Duration != 30*time.Second {
					t.Errorf("spec %+v", o.Spec.Optimization)
				}
			},
		},
		"stored without the fields added since (the seed's shape)": {
			body: `"spec":{"service_name":"web","locality_enabled":true,"service_ports":[{"number":80,"protocol":"http"}]}}`,
		},
		"an integer field holding a string": {
			body:     `"spec":{"service_name":"web","optimization":{"dead_band_percent":"90","max_step_percent":20}}}`,
			problems: []string{"spec.optimization.dead_band_percent"},
			check: func(t *testing.T, o *IstioAdaptiveRequestOptimizer) {
				if o.Spec.ServiceName != "web" || o.Spec.Optimization.DeadBandPercent != nil || *o.Spec.Optimization.MaxStepPercent != 20 {
					t.Errorf("the fields that decode are not kept: %+v", o.Spec)
				}
			},
		},
		"a port number beyond int32, a protocol that is a number": {
			body:     `"spec":{"service_name":"web","service_ports":[{"number":99999999999},{"number":81,"protocol":7}]}}`,
			problems: []string{"spec.service_ports[0].number", "spec.service_ports[1].protocol"},
			check: func(t *testing.T, o *IstioAdaptiveRequestOptimizer) {
				if len(o.Spec.ServicePorts) != 2 || o.Spec.ServicePorts[1].Number != 81 {
					t.Errorf("ports %+v", o.Spec.ServicePorts)
				}
			},
		},
		"spec not an object": {body: `"spec":"web"}`, problems: []string{"spec"}},
		"service_name a list, locality a string": {
			body:     `"spec":{"service_name":["web"],"locality_enabled":"yes"}}`,
			problems: []string{"spec.locality_enabled", "spec.service_name"},
		},
		"unknown fields": {
			body:     `"spec":{"service_name":"web","deadband":5,"optimization":{"cycle":"1m","colour":"red"}}}`,
			problems: []string{"?spec.deadband", "?spec.optimization.colour"},
			check: func(t *testing.T, o *IstioAdaptiveRequestOptimizer) {
				if o.Spec.Optimization.Cycle.Duration != time.Minute {
					t.Errorf("known fields beside unknown ones are lost: %+v", o.Spec.Optimization)
				}
			},
		},
		"unknown and wrong-typed fields together": {
			body:     `"spec":{"service_name":"web","deadband":5,"dry_run":1}}`,
			problems: []string{"?spec.deadband", "spec.dry_run"},
		},
		"a status of the wrong shape": {
			body:     `"spec":{"service_name":"web"},"status":{"endpoints":"3","weights":[{"pod":"p","address":"a","weight":-1}],"conditions":"none"}}`,
			problems: []string{"status.conditions", "status.endpoints", "status.weights[0].weight"},
		},
		"a bad duration decodes and says so itself": {
			body: `"spec":{"service_name":"web","optimization":{"cycle":5}}}`,
			check: func(t *testing.T, o *IstioAdaptiveRequestOptimizer) {
				if o.Spec.Optimization.Cycle.Err() == nil {
					t.Error("cycle: 5 has no error")
				}
			},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			o := &IstioAdaptiveRequestOptimizer{}
			if err := json.Unmarshal([]byte(head+tt.body), o); err != nil {
				t.Fatalf("decode failed: %v", err)
			}
			if o.Name != "web" || o.Namespace != "shop" || len(o.Finalizers) != 1 || o.Kind != "IstioAdaptiveRequestOptimizer" {
				t.Errorf("metadata lost: %+v %+v", o.TypeMeta, o.ObjectMeta)
			}
			var got []string
			for _, p := range o.DecodeProblems() {
				if p.Message == "" {
					t.Errorf("%s: no message", p.Path)
				}
				if p.Unknown {
					got = append(got, "?"+p.Path)
				} else {
					got = append(got, p.Path)
				}
			}
			if !reflect.DeepEqual(got, tt.problems) {
				t.Errorf("problems %v, want %v (%v)", got, tt.problems, o.DecodeProblems())
			}
			if tt.check != nil {
				tt.check(t, o)
			}
			if c := o.DeepCopy(); !reflect.DeepEqual(c.DecodeProblems(), o.DecodeProblems()) {
				t.Errorf("DeepCopy loses the problems")
			}
		})
	}
}

// TestMessageQuotesTheValue: a problem says what was stored and what the
// field takes.
func TestMessageQuotesTheValue(t *testing.T) {
	o := &IstioAdaptiveRequestOptimizer{}
	if err := json.Unmarshal([]byte(`{"spec":{"service_name":"web","optimization":{"dead_band_percent":"90"}}}`), o); err != nil {
		t.Fatal(err)
	}
	if got := o.DecodeProblems()[0].String(); got != `spec.optimization.dead_band_percent: "90" is not an integer that fits 64 bits` {
		t.Errorf("message %q", got)
	}
}

// TestOneBadObjectDoesNotFailTheList: the API machinery's decoder (what an
// informer's list uses) decodes a list with a bad item, and the good items
// are as they were stored.
func TestOneBadObjectDoesNotFailTheList(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	item := func(name, optimization string) string {
		return `{"apiVersion":"optimization.liorfranko.github.io/v1alpha1","kind":"IstioAdaptiveRequestOptimizer","metadata":{"name":"` + name +
			`","namespace":"shop","resourceVersion":"7"},"spec":{"service_name":"` + name + `","optimization":` + optimization + `}}`
	}
	list := `{"apiVersion":"optimization.liorfranko.github.io/v1alpha1","kind":"IstioAdaptiveRequestOptimizerList","metadata":{"resourceVersion":"9"},"items":[` +
		item("a", `{"dead_band_percent":5}`) + "," + item("b", `{"dead_band_percent":"90"}`) + "," + item("c", `{"max_weight_ratio":{"x":1}}`) + `]}`
	obj, _, err := serializer.NewCodecFactory(scheme).UniversalDeserializer().Decode([]byte(list), nil, &IstioAdaptiveRequestOptimizerList{})
	if err != nil {
		t.Fatalf("the list fails: %v", err)
	}
	l := obj.(*IstioAdaptiveRequestOptimizerList)
	if len(l.Items) != 3 || *l.Items[0].Spec.Optimization.DeadBandPercent != 5 || len(l.Items[0].DecodeProblems()) != 0 {
		t.Fatalf("items %+v", l.Items)
	}
	for _, i := range []int{1, 2} {
		if p := l.Items[i].DecodeProblems(); len(p) != 1 || !strings.HasPrefix(p[0].Path, "spec.optimization.") || l.Items[i].ResourceVersion != "7" {
			t.Errorf("item %s: problems %v, resourceVersion %q", l.Items[i].Name, p, l.Items[i].ResourceVersion)
		}
	}
	// Written back (as a status update sends it), the object is what decoded.
	b, err := json.Marshal(&l.Items[1])
	if err != nil || strings.Contains(string(b), "90") || strings.Contains(string(b), "decodeProblems") {
		t.Errorf("encoded %s (%v)", b, err)
	}
}
