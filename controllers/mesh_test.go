package controllers_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

func waitMeshCondition(t *testing.T, ns, typ string, status metav1.ConditionStatus, reason string) string {
	t.Helper()
	var msg string
	eventually(t, 10*time.Second, typ+"="+string(status)+"/"+reason, func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(o.Status.Conditions, typ)
		if c == nil || c.Status != status || c.Reason != reason {
			return fmt.Errorf("condition %s = %+v", typ, c)
		}
		msg = c.Message
		return nil
	})
	return msg
}

// TestNamespaceEnrolledInAmbientLater: labelling the Service's namespace
// for ambient after opting in reaches the optimizer through the Namespace
// watch; it stalls naming the namespace and leaves the live objects alone.
func TestNamespaceEnrolledInAmbientLater(t *testing.T) {
	ns := newNamespace(t)
	mustCreate(t, Service(ns, "web", ServicePort("http", 80, intstr.FromInt32(8080))))
	mustCreate(t, Pod(ns, "web-0", "web", ""))
	mustCreate(t, EndpointSlice(ns, "web-1", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-0", IP(30, 1), "")))
	mustCreate(t, Optimizer(ns, "web", "web"))
	waitMeshCondition(t, ns, optv1.ConditionReady, metav1.ConditionTrue, "Reconciled")

	update(t, nsObj(ns), func(n *corev1.Namespace) { n.Labels = map[string]string{desired.LabelDataplaneMode: "ambient"} })
	msg := waitMeshCondition(t, ns, optv1.ConditionStalled, metav1.ConditionTrue, desired.ReasonAmbientWaypointRequired)
	if !strings.Contains(msg, "namespace "+ns) || !strings.Contains(msg, "web-0") {
		t.Errorf("message %q names neither the namespace nor the pod", msg)
	}
	if _, err := getSE(ns, "web-adaptive"); err != nil {
		t.Errorf("the live ServiceEntry was removed: %v", err)
	}
}

// TestUserDestinationRuleWatched: a DestinationRule the user creates for the
// Service after opting in (short host name) reaches the optimizer through
// the DestinationRule watch: its policy appears on the owned rule, and a
// later subset stalls the optimizer. The stall leaves the route in place,
// and the ServiceEntry behind it keeps following the pods through a
// rollout.
func TestUserDestinationRuleWatched(t *testing.T) {
	ns := newNamespace(t)
	mustCreate(t, Service(ns, "web", ServicePort("http", 80, intstr.FromInt32(8080))))
	mustCreate(t, Pod(ns, "web-0", "web", "", WithSidecar()))
	mustCreate(t, EndpointSlice(ns, "web-1", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-0", IP(30, 2), "")))
	mustCreate(t, Optimizer(ns, "web", "web"))
	waitMeshCondition(t, ns, optv1.ConditionReady, metav1.ConditionTrue, "Reconciled")

	dr := &istionet.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-policy"}}
	dr.Spec.Host = "web"
	dr.Spec.TrafficPolicy = &networking.TrafficPolicy{ConnectionPool: &networking.ConnectionPoolSettings{Tcp: &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: 5}}}
	// No metrics backend here, so the weights are never learned and the
	// operator keeps LEAST_REQUEST: the user's load balancer is not carried.
	mustCreate(t, dr)
	eventually(t, 10*time.Second, "the user's pool on the owned DestinationRule", func() error {
		owned := &istionet.DestinationRule{}
		if err := k8s.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, owned); err != nil {
			return err
		}
		tp := owned.Spec.GetTrafficPolicy()
		if tp.GetConnectionPool().GetTcp().GetMaxConnections() != 5 || tp.GetLoadBalancer().GetSimple() != networking.LoadBalancerSettings_LEAST_REQUEST {
			return fmt.Errorf("owned traffic policy %v", tp)
		}
		return nil
	})
	update(t, dr, func(d *istionet.DestinationRule) {
		d.Spec.Subsets = []*networking.Subset{{Name: "v1", Labels: map[string]string{"v": "1"}}}
	})
	waitMeshCondition(t, ns, optv1.ConditionStalled, metav1.ConditionTrue, "UserDestinationRuleNotCarried")

	// A rollout during the stall: web-0 replaced by web-2.
	mustCreate(t, Pod(ns, "web-2", "web", "", WithSidecar()))
	if err := k8s.Delete(t.Context(), named(&discoveryv1.EndpointSlice{}, ns, "web-1")); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, EndpointSlice(ns, "web-2", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-2", IP(30, 3), "")))
	mustEventuallySE(t, ns, wantAddrs(IP(30, 3)))
	getVS(t, ns, "web-adaptive")
	waitMeshCondition(t, ns, optv1.ConditionStalled, metav1.ConditionTrue, "UserDestinationRuleNotCarried")
}
