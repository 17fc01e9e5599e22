package desired

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAmbient: ambient pods are optimized only behind a waypoint. With one
// (on the Service or its namespace) the ServiceEntry is bound to the same
// waypoint and the ambient pods' endpoints are marked for HBONE and mTLS;
// without one the optimizer refuses, saying how to add one. Sidecars and
// pods that opt out are not ambient.
func TestAmbient(t *testing.T) {
	ambient := func(p *corev1.Pod) { p.Labels = map[string]string{LabelDataplaneMode: "ambient"} }
	optOut := func(p *corev1.Pod) { p.Labels = map[string]string{LabelDataplaneMode: "none"} }
	ns := func(labels ...string) *corev1.Namespace {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS, Labels: map[string]string{}}}
		for i := 0; i+1 < len(labels); i += 2 {
			n.Labels[labels[i]] = labels[i+1]
		}
		return n
	}
	tests := map[string]struct {
		pods       []*corev1.Pod
		ns         *corev1.Namespace
		svcLabels  map[string]string
		wantRefuse string            // substring of the fatal message, "" for none
		wantSE     map[string]string // waypoint labels expected on the ServiceEntry (nil: none)
		wantHBONE  []string          // pods whose endpoints carry the tunnel label
	}{
		"sidecars":                    {pods: []*corev1.Pod{pod("web-0", sidecarContainer), pod("web-1", sidecarContainer)}},
		"sidecar wins over namespace": {pods: []*corev1.Pod{pod("web-0", sidecarContainer), pod("web-1", nativeSidecar)}, ns: ns(LabelDataplaneMode, "ambient")},
		"pod opts out":                {pods: []*corev1.Pod{pod("web-0", optOut), pod("web-1", optOut)}, ns: ns(LabelDataplaneMode, "ambient")},
		"no mesh at all":              {pods: []*corev1.Pod{pod("web-0"), pod("web-1")}},
		"pod label, no waypoint": {pods: []*corev1.Pod{pod("web-0", sidecarContainer), pod("web-1", ambient)},
			wantRefuse: "pods web-1 "},
		"namespace label, no waypoint": {pods: []*corev1.Pod{pod("web-0"), pod("web-1")}, ns: ns(LabelDataplaneMode, "ambient"),
			wantRefuse: "namespace shop is labelled"},
		"Service opts out of the namespace's waypoint": {pods: []*corev1.Pod{pod("web-0"), pod("web-1")},
			ns: ns(LabelDataplaneMode, "ambient", LabelUseWaypoint, "waypoint"), svcLabels: map[string]string{LabelUseWaypoint: "none"},
			wantRefuse: "istioctl waypoint apply -n shop --enroll-namespace"},
		"namespace waypoint": {pods: []*corev1.Pod{pod("web-0"), pod("web-1")}, ns: ns(LabelDataplaneMode, "ambient", LabelUseWaypoint, "waypoint"),
			wantSE: map[string]string{LabelUseWaypoint: "waypoint"}, wantHBONE: []string{"web-0", "web-1"}},
		"Service waypoint in another namespace": {pods: []*corev1.Pod{pod("web-0", sidecarContainer), pod("web-1", ambient)},
			svcLabels: map[string]string{LabelUseWaypoint: "shared", LabelUseWaypointNamespace: "istio-waypoints"},
			wantSE:    map[string]string{LabelUseWaypoint: "shared", LabelUseWaypointNamespace: "istio-waypoints"}, wantHBONE: []string{"web-1"}},
		"Service waypoint beats the namespace's": {pods: []*corev1.Pod{pod("web-0", ambient), pod("web-1", ambient)},
			ns: ns(LabelUseWaypoint, "ns-wp"), svcLabels: map[string]string{LabelUseWaypoint: "svc-wp"},
			wantSE: map[string]string{LabelUseWaypoint: "svc-wp"}, wantHBONE: []string{"web-0", "web-1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := webInput()
			in.Pods = podMap(tc.pods...)
			in.Mesh.Namespace = tc.ns
			in.Service.Labels = tc.svcLabels
			r := Compute(in)
			if tc.wantRefuse != "" {
				if len(r.Problems) != 1 || r.Problems[0].Reason != ReasonAmbientWaypointRequired || !r.Problems[0].Fatal ||
					!strings.Contains(r.Problems[0].Message, tc.wantRefuse) || !strings.Contains(r.Problems[0].Message, "istioctl waypoint apply") || r.ServiceEntry != nil {
					t.Fatalf("problems %+v, want %s naming %q", r.Problems, ReasonAmbientWaypointRequired, tc.wantRefuse)
				}
				return
			}
			if len(r.Problems) != 0 || r.ServiceEntry == nil {
				t.Fatalf("problems %+v", r.Problems)
			}
			for _, k := range []string{LabelUseWaypoint, LabelUseWaypointNamespace} {
				if got, want := r.ServiceEntry.Labels[k], tc.wantSE[k]; got != want {
					t.Errorf("ServiceEntry label %s = %q, want %q", k, got, want)
				}
			}
			if !IsOwnedBy(r.ServiceEntry, in.Optimizer) {
				t.Error("the waypoint labels replaced the ownership labels")
			}
			hbone := map[string]bool{}
			for _, p := range tc.wantHBONE {
				for _, ep := range r.Endpoints {
					if ep.Pod == p {
						hbone[ep.Address] = true
					}
				}
			}
			for _, we := range r.ServiceEntry.Spec.Endpoints {
				tunneled := we.Labels[LabelTunnel] == "http"
				if tunneled != hbone[we.Address] {
					t.Errorf("endpoint %s labels %v, want tunnel=%v", we.Address, we.Labels, hbone[we.Address])
				}
				if tunneled && we.Labels[LabelTLSMode] != "istio" {
					t.Errorf("ambient endpoint %s without tlsMode istio: %v", we.Address, we.Labels)
				}
			}
		})
	}
}
