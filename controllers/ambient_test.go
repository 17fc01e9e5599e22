package controllers_test

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// TestAmbientServiceBehindAWaypoint: an ambient namespace with a waypoint
// is optimized; the ServiceEntry is bound to the waypoint and the pod's
// endpoint is marked for HBONE. When the namespace drops its waypoint, the
// optimizer stalls saying how to add one, and the live objects stay.
func TestAmbientServiceBehindAWaypoint(t *testing.T) {
	ns := newNamespace(t)
	update(t, nsObj(ns), func(n *corev1.Namespace) {
		n.Labels = map[string]string{desired.LabelDataplaneMode: "ambient", desired.LabelUseWaypoint: "waypoint"}
	})
	mustCreate(t, Service(ns, "web", ServicePort("http", 80, intstr.FromInt32(8080))))
	mustCreate(t, Pod(ns, "web-0", "web", ""))
	mustCreate(t, EndpointSlice(ns, "web-1", "web", []SlicePort{{Name: "http", Port: 8080}}, Ready("web-0", IP(31, 1), "")))
	mustCreate(t, Optimizer(ns, "web", "web"))
	waitMeshCondition(t, ns, optv1.ConditionReady, metav1.ConditionTrue, "Reconciled")
	mustEventuallySE(t, ns, func(se seT) error {
		if se.Labels[desired.LabelUseWaypoint] != "waypoint" {
			return fmt.Errorf("ServiceEntry labels %v, want %s=waypoint", se.Labels, desired.LabelUseWaypoint)
		}
		if eps := se.Spec.Endpoints; len(eps) != 1 || eps[0].Labels[desired.LabelTunnel] != "http" || eps[0].Labels[desired.LabelTLSMode] != "istio" {
			return fmt.Errorf("endpoints %v, want one with tunnel http and tlsMode istio", eps)
		}
		return nil
	})

	update(t, nsObj(ns), func(n *corev1.Namespace) { n.Labels = map[string]string{desired.LabelDataplaneMode: "ambient"} })
	waitMeshCondition(t, ns, optv1.ConditionStalled, metav1.ConditionTrue, desired.ReasonAmbientWaypointRequired)
	if _, err := getSE(ns, "web-adaptive"); err != nil {
		t.Errorf("the live ServiceEntry was removed: %v", err)
	}
}
