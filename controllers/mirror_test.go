package controllers_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

const waitFor = 10 * time.Second

// webService creates Service web with an HTTP, a gRPC and a TCP port, nodes
// in two zones, pods with sidecars, and one EndpointSlice.
func webService(t *testing.T, ns string, eps ...Endpoint) {
	t.Helper()
	zoneA, zoneB := "node-a-"+ns, "node-b-"+ns
	mustCreate(t,
		Node(zoneA, "eu-west", "eu-west-a", "rack1", "m5.large"),
		Node(zoneB, "eu-west", "eu-west-b", "", "m6g.large"),
		Service(ns, "web",
			ServicePort("http", 80, intstr.FromInt32(8080)),
			ServicePort("grpc-api", 9090, intstr.FromInt32(9090)),
			ServicePort("tcp-db", 5432, intstr.FromInt32(5432)),
		),
	)
	for _, e := range eps {
		mustCreate(t, Pod(ns, e.Pod, "web", e.Node, WithSidecar(), WithServiceAccount("web-sa")))
	}
	mustCreate(t, EndpointSlice(ns, "web-1", "web", []SlicePort{{Name: "http", Port: 8080}, {Name: "grpc-api", Port: 9090}, {Name: "tcp-db", Port: 5432}}, eps...))
}

func endpointAddrs(se interface {
	GetEndpoints() []*networking.WorkloadEntry
}) []string {
	var out []string
	for _, e := range se.GetEndpoints() {
		out = append(out, e.Address)
	}
	sort.Strings(out)
	return out
}

func condition(o *optv1.IstioAdaptiveRequestOptimizer, t string) string {
	c := meta.FindStatusCondition(o.Status.Conditions, t)
	if c == nil {
		return "<none>"
	}
	return string(c.Status) + "/" + c.Reason
}

func TestMirrorCreatesServiceEntryRoutingAndStatus(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns,
		Ready("web-0", IP(1, 1), "node-a-"+ns),
		Ready("web-1", IP(1, 2), "node-b-"+ns),
		NotReady("web-2", IP(1, 3), "node-b-"+ns),
	)
	mustCreate(t, Optimizer(ns, "web", "web"))

	var se = mustEventuallySE(t, ns, func(se seT) error {
		if got := endpointAddrs(&se.Spec); strings.Join(got, ",") != IP(1, 1)+","+IP(1, 2) {
			return fmt.Errorf("endpoints %v", got)
		}
		return nil
	})
	spec := &se.Spec
	if got := spec.Hosts; len(got) != 1 || got[0] != "web."+ns+".adaptive" {
		t.Errorf("hosts = %v", got)
	}
	if spec.Location != networking.ServiceEntry_MESH_INTERNAL || spec.Resolution != networking.ServiceEntry_STATIC {
		t.Errorf("location/resolution = %v/%v", spec.Location, spec.Resolution)
	}
	wantPorts := map[uint32]string{80: "HTTP/8080", 9090: "GRPC/9090", 5432: "TCP/5432"}
	if len(spec.Ports) != 3 {
		t.Fatalf("ports = %v", spec.Ports)
	}
	for _, p := range spec.Ports {
		if got := fmt.Sprintf("%s/%d", p.Protocol, p.TargetPort); got != wantPorts[p.Number] {
			t.Errorf("port %d = %s, want %s", p.Number, got, wantPorts[p.Number])
		}
	}
	wantLocality := map[string]string{IP(1, 1): "eu-west/eu-west-a/rack1", IP(1, 2): "eu-west/eu-west-b"}
	for _, e := range spec.Endpoints {
		if e.Locality != wantLocality[e.Address] {
			t.Errorf("%s locality = %q, want %q", e.Address, e.Locality, wantLocality[e.Address])
		}
		if e.ServiceAccount != "web-sa" || e.Labels["security.istio.io/tlsMode"] != "istio" {
			t.Errorf("%s: serviceAccount %q labels %v: want web-sa and tlsMode istio", e.Address, e.ServiceAccount, e.Labels)
		}
		if e.Weight != 1000 {
			t.Errorf("%s weight = %d, want the equal starting weight 1000", e.Address, e.Weight)
		}
	}

	vs := getVS(t, ns, "web-adaptive")
	if got := vs.Spec.Hosts; len(got) != 1 || got[0] != "web."+ns+".svc.cluster.local" {
		t.Errorf("VirtualService hosts = %v", got)
	}
	if len(vs.Spec.Http) != 2 || len(vs.Spec.Tcp) != 1 {
		t.Fatalf("VirtualService routes: %d http, %d tcp; want 2 and 1", len(vs.Spec.Http), len(vs.Spec.Tcp))
	}
	for _, r := range vs.Spec.Http {
		d := r.Route[0].Destination
		if d.Host != "web."+ns+".adaptive" || d.Port.Number != r.Match[0].Port {
			t.Errorf("http route %s goes to %s:%d", r.Name, d.Host, d.Port.Number)
		}
	}
	if d := vs.Spec.Tcp[0].Route[0].Destination; d.Host != "web."+ns+".adaptive" || d.Port.Number != 5432 || vs.Spec.Tcp[0].Match[0].Port != 5432 {
		t.Errorf("tcp route = %v", vs.Spec.Tcp[0])
	}
	dr := getDR(t, ns, "web-adaptive")
	// No metrics backend in this suite: the weights are never learned, so
	// the DestinationRule keeps Istio's default LEAST_REQUEST.
	if dr.Spec.Host != "web."+ns+".adaptive" || dr.Spec.TrafficPolicy.GetLoadBalancer().GetSimple() != networking.LoadBalancerSettings_LEAST_REQUEST {
		t.Errorf("DestinationRule = %v", &dr.Spec)
	}
	if dr.Spec.TrafficPolicy.GetLoadBalancer().GetLocalityLbSetting() != nil || dr.Spec.TrafficPolicy.GetOutlierDetection() != nil {
		t.Errorf("locality settings present with locality_enabled false: %v", &dr.Spec)
	}

	eventually(t, waitFor, "status Ready", func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if condition(o, "Ready") != "True/Reconciled" || condition(o, "Stalled") != "False/Reconciled" || condition(o, "Reconciling") != "False/Reconciled" {
			return fmt.Errorf("conditions %v", o.Status.Conditions)
		}
		if o.Status.Host != "web."+ns+".adaptive" || o.Status.Endpoints != 2 || o.Status.ObservedGeneration != o.Generation {
			return fmt.Errorf("status %+v", o.Status)
		}
		if o.Status.OwnedObjects.ServiceEntry != "web-adaptive" || o.Status.OwnedObjects.VirtualService != "web-adaptive" || o.Status.OwnedObjects.DestinationRule != "web-adaptive" {
			return fmt.Errorf("owned objects %+v", o.Status.OwnedObjects)
		}
		return nil
	})
}

func TestMirrorFollowsReadinessAndScale(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(2, 1), "node-a-"+ns), Ready("web-1", IP(2, 2), "node-a-"+ns))
	mustCreate(t, Optimizer(ns, "web", "web"))
	mustEventuallySE(t, ns, wantAddrs(IP(2, 1), IP(2, 2)))

	// Scale up: a new ready pod appears in the slice.
	mustCreate(t, Pod(ns, "web-2", "web", "node-b-"+ns, WithSidecar()))
	updateSlice(t, ns, "web-1", func(s *sliceT) {
		s.Endpoints = append(s.Endpoints, EndpointSlice(ns, "x", "web", nil, Ready("web-2", IP(2, 3), "node-b-"+ns)).Endpoints...)
	})
	start := time.Now()
	mustEventuallySE(t, ns, wantAddrs(IP(2, 1), IP(2, 2), IP(2, 3)))
	t.Logf("scale up reached the ServiceEntry in %s", time.Since(start))

	// A pod turns unready: it leaves the ServiceEntry, the others stay.
	updateSlice(t, ns, "web-1", func(s *sliceT) {
		f := false
		s.Endpoints[0].Conditions.Ready = &f
	})
	start = time.Now()
	mustEventuallySE(t, ns, wantAddrs(IP(2, 2), IP(2, 3)))
	t.Logf("readiness change reached the ServiceEntry in %s", time.Since(start))

	// A terminating pod is never routed, even while still serving.
	updateSlice(t, ns, "web-1", func(s *sliceT) {
		tr := true
		s.Endpoints[1].Conditions.Terminating = &tr
	})
	mustEventuallySE(t, ns, wantAddrs(IP(2, 3)))
}

func TestMissingServiceStallsAndRecovers(t *testing.T) {
	ns := newNamespace(t)
	mustCreate(t, Optimizer(ns, "web", "web"))
	eventually(t, waitFor, "Stalled ServiceNotFound", func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if condition(o, "Stalled") != "True/ServiceNotFound" || condition(o, "Ready") != "False/ServiceNotFound" {
			return fmt.Errorf("conditions %v", o.Status.Conditions)
		}
		if c := meta.FindStatusCondition(o.Status.Conditions, "Stalled"); !strings.Contains(c.Message, "web") {
			return fmt.Errorf("message does not name the Service: %q", c.Message)
		}
		return nil
	})
	if _, err := getSE(ns, "web-adaptive"); err == nil {
		t.Fatalf("a ServiceEntry was written for a missing Service")
	}

	webService(t, ns, Ready("web-0", IP(3, 1), "node-a-"+ns))
	mustEventuallySE(t, ns, wantAddrs(IP(3, 1)))
	eventually(t, waitFor, "Ready after the Service appears", func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if condition(o, "Ready") != "True/Reconciled" || condition(o, "Stalled") != "False/Reconciled" {
			return fmt.Errorf("conditions %v", o.Status.Conditions)
		}
		return nil
	})

	// The Service goes away: the optimizer stalls but live routing stays.
	svc := &corev1.Service{}
	svc.Namespace, svc.Name = ns, "web"
	if err := k8s.Delete(context.Background(), svc); err != nil {
		t.Fatal(err)
	}
	eventually(t, waitFor, "Stalled after the Service is deleted", func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if condition(o, "Stalled") != "True/ServiceNotFound" {
			return fmt.Errorf("conditions %v", o.Status.Conditions)
		}
		return nil
	})
	for _, obj := range []client.Object{seObj(), vsObj(), drObj()} {
		if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, obj); err != nil {
			t.Errorf("live %T was removed when the Service vanished: %v", obj, err)
		}
	}
}

// Changing service_name moves the optimizer to another Service: the routing
// objects of the old one are removed (nobody would keep them in line with its
// pods any more) and the new Service gets its own.
func TestRetargetRemovesTheOldServicesObjects(t *testing.T) {
	ns := newNamespace(t)
	webService(t, ns, Ready("web-0", IP(41, 1), "node-a-"+ns))
	mustCreate(t,
		Service(ns, "api", ServicePort("http", 80, intstr.FromInt32(8080))),
		EndpointSlice(ns, "api-1", "api", []SlicePort{{Name: "http", Port: 8080}}, Ready("api-0", IP(41, 2), "")),
		Optimizer(ns, "web", "web"),
	)
	mustEventuallySE(t, ns, wantAddrs(IP(41, 1)))
	getVS(t, ns, "web-adaptive")

	o, err := getOpt(ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(o.DeepCopy())
	o.Spec.ServiceName = "api"
	if err := k8s.Patch(context.Background(), o, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, waitFor, "objects of the new Service", func() error {
		se, err := getSE(ns, "api-adaptive")
		if err != nil {
			return err
		}
		return wantAddrs(IP(41, 2))(se)
	})
	eventually(t, waitFor, "objects of the old Service removed", func() error {
		for _, obj := range []client.Object{seObj(), vsObj(), drObj()} {
			if err := k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-adaptive"}, obj); err == nil {
				return fmt.Errorf("%T web-adaptive still exists", obj)
			}
		}
		return nil
	})
	eventually(t, waitFor, "status names the new objects", func() error {
		o, err := getOpt(ns, "web")
		if err != nil {
			return err
		}
		if o.Status.OwnedObjects.ServiceEntry != "api-adaptive" || condition(o, "Ready") != "True/Reconciled" {
			return fmt.Errorf("status %+v", o.Status)
		}
		return nil
	})
}
