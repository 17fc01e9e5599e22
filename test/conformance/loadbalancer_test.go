package conformance

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/test/harness"
)

// TestLoadBalancerPolicies: for each value of spec.load_balancer, the
// optimized cluster a sidecar receives from istiod has that lb_policy, and
// its endpoints carry exactly the ServiceEntry's (learned, unequal)
// weights, since Envoy's LEAST_REQUEST honours weights (weight/(active+1))
// as ROUND_ROBIN does. The default, ROUND_ROBIN, is in force here because
// the suite starts from learned weights (before that, Istio's default
// LEAST_REQUEST is kept: TestLoadBalancerFollowsLearned in controllers).
func TestLoadBalancerPolicies(t *testing.T) {
	ctx := testCtx(t)
	t.Cleanup(func() {
		patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.LoadBalancer = "" })
	})
	for _, tc := range []struct {
		requested optv1.LoadBalancer
		want      string
	}{
		{"", "ROUND_ROBIN"},
		{optv1.LoadBalancerLeastRequest, "LEAST_REQUEST"},
		{optv1.LoadBalancerRoundRobin, "ROUND_ROBIN"},
	} {
		t.Run(fmt.Sprintf("load_balancer=%q", tc.requested), func(t *testing.T) {
			patchOptimizer(t, func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.LoadBalancer = tc.requested })
			for _, p := range suite.fleet.Ports {
				cluster := clusterName(p.Port, optimizedHost)
				var w map[string]uint32
				took := waitFor(t, suite.zoneA, propagation, cluster+" with "+tc.want, func(x *harness.XDSClient) error {
					info, err := x.Cluster(cluster)
					if err != nil {
						return err
					}
					if info.LbPolicy != tc.want {
						return fmt.Errorf("lb_policy %s, want %s", info.LbPolicy, tc.want)
					}
					if w, err = seWeights(ctx, suite.c, suite.fleet); err != nil {
						return err
					}
					if !orderedLike(w, suite.fleet) {
						return fmt.Errorf("ServiceEntry weights %s are not the learned ones", byPod(suite.fleet, w))
					}
					return checkEndpoints(x, cluster, suite.fleet.expectedEndpoints(p, w))
				})
				t.Logf("%s: lb_policy %s after %s, endpoint weights %s", cluster, tc.want, took.Round(1e6), byPod(suite.fleet, w))
			}
			// The DestinationRule and the status are two writes: the
			// status may land a moment after istiod has pushed the rule.
			got := ""
			err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, propagation, true, func(ctx context.Context) (bool, error) {
				o := &optv1.IstioAdaptiveRequestOptimizer{}
				if err := suite.c.Get(ctx, client.ObjectKey{Namespace: demoNS, Name: optimizerName}, o); err != nil {
					return false, err
				}
				got = o.Status.LoadBalancer
				return got == tc.want, nil
			})
			if err != nil {
				t.Errorf("status.loadBalancer %q %v after the sidecar had lb_policy %s, want %q (%v)", got, propagation, tc.want, tc.want, err)
			}
		})
	}
}
