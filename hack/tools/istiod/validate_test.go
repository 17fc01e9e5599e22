package tools

// Istio's own validation (the checks istiod's validating webhook runs) on
// every object the operator writes: the golden objects of internal/desired,
// which TestGoldenObjects keeps equal to what desired.Compute produces.

import (
	"bytes"
	"os"
	"strings"
	"testing"

	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/schema/gvk"
	"istio.io/istio/pkg/config/validation"
	"sigs.k8s.io/yaml"
)

const goldenObjects = "../../../internal/desired/testdata/istio-objects.yaml"

func TestOperatorObjectsPassIstioValidation(t *testing.T) {
	data, err := os.ReadFile(goldenObjects)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, doc := range bytes.Split(data, []byte("\n---\n")) {
		doc = bytes.TrimPrefix(doc, []byte("---\n"))
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		var cfg config.Config
		var validate validation.ValidateFunc
		switch head.Kind {
		case "ServiceEntry":
			o := &istionet.ServiceEntry{}
			must(t, yaml.Unmarshal(doc, o))
			cfg = config.Config{Meta: meta(gvk.ServiceEntry, o.Name, o.Namespace, o.Labels), Spec: &o.Spec}
			validate = validation.ValidateServiceEntry
		case "VirtualService":
			o := &istionet.VirtualService{}
			must(t, yaml.Unmarshal(doc, o))
			cfg = config.Config{Meta: meta(gvk.VirtualService, o.Name, o.Namespace, o.Labels), Spec: &o.Spec}
			validate = validation.ValidateVirtualService
		case "DestinationRule":
			o := &istionet.DestinationRule{}
			must(t, yaml.Unmarshal(doc, o))
			cfg = config.Config{Meta: meta(gvk.DestinationRule, o.Name, o.Namespace, o.Labels), Spec: &o.Spec}
			validate = validation.ValidateDestinationRule
		default:
			t.Fatalf("unexpected kind %q", head.Kind)
		}
		kinds[head.Kind]++
		warn, err := validate(cfg)
		name := head.Kind + " " + cfg.Namespace + "/" + cfg.Name
		if err != nil {
			t.Errorf("%s rejected by Istio's validation: %v", name, err)
		}
		if warn != nil {
			t.Errorf("%s: Istio's validation warns: %v", name, warn)
		}
	}
	if kinds["ServiceEntry"] == 0 || kinds["VirtualService"] == 0 || kinds["DestinationRule"] == 0 {
		t.Fatalf("validated %v: every kind must be present", kinds)
	}
	t.Logf("Istio's validation accepted %v", kinds)
}

func meta(k config.GroupVersionKind, name, namespace string, labels map[string]string) config.Meta {
	return config.Meta{GroupVersionKind: k, Name: name, Namespace: namespace, Labels: labels, Domain: strings.TrimSpace("cluster.local")}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
