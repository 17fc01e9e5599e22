package desired

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

func TestComputeRefusesHostsThatShadowKubernetesServices(t *testing.T) {
	tests := map[string]struct {
		host string
		ok   bool
	}{
		"default host":              {host: "", ok: true},
		"a name of its own":         {host: "web.fast.internal", ok: true},
		"another Service's FQDN":    {host: "payments.prod.svc.cluster.local"},
		"svc suffix":                {host: "payments.prod.svc"},
		"short name":                {host: "payments"},
		"wildcard":                  {host: "*.adaptive"},
		"trailing dot of a Service": {host: "payments.prod.svc.cluster.local."},
		"upper case Service FQDN":   {host: "Payments.Prod.SVC.cluster.local"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			opt := &optv1.IstioAdaptiveRequestOptimizer{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o"},
				Spec: optv1.IstioAdaptiveRequestOptimizerSpec{ServiceName: "web", Host: tc.host}}
			res := Compute(Input{Optimizer: opt})
			var fatal *Problem
			for i := range res.Problems {
				if res.Problems[i].Fatal {
					fatal = &res.Problems[i]
				}
			}
			switch {
			case tc.ok && fatal != nil && fatal.Reason == "InvalidHost":
				t.Errorf("host %q refused: %s", tc.host, fatal.Message)
			case !tc.ok && (fatal == nil || fatal.Reason != "InvalidHost"):
				t.Errorf("host %q accepted; problems %+v", tc.host, res.Problems)
			case !tc.ok && !strings.Contains(fatal.Message, "host"):
				t.Errorf("message does not explain: %q", fatal.Message)
			}
			if !tc.ok && res.ServiceEntry != nil {
				t.Errorf("a ServiceEntry was computed for a refused host")
			}
		})
	}
}
