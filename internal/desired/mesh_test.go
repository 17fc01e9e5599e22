package desired

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	networking "istio.io/api/networking/v1alpha3"
	typev1beta1 "istio.io/api/type/v1beta1"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

func TestExportTo(t *testing.T) {
	tests := map[string]struct {
		annotation  string   // the Service's networking.istio.io/exportTo, "" for none
		meshDefault []string // --default-export-to
		want        []string
		fatal       bool
	}{
		"no annotation, Istio's default":            {want: []string{"*"}},
		"no annotation, mesh default private":       {meshDefault: []string{"."}, want: []string{"."}},
		"annotation beats the mesh default":         {annotation: "*", meshDefault: []string{"."}, want: []string{"*"}},
		"private":                                   {annotation: ".", want: []string{"."}},
		"own namespace by name is private":          {annotation: testNS, want: []string{"."}},
		"namespace list, own namespace not implied": {annotation: "b, a", want: []string{"a", "b"}},
		"list with own namespace":                   {annotation: "a,.,shop", want: []string{".", "a"}},
		"star anywhere wins":                        {annotation: "a,*", want: []string{"*"}},
		"none hides the Service":                    {annotation: "~", fatal: true},
		"none next to names is ignored":             {annotation: "~,a", want: []string{"a"}},
		"entries that name no namespace":            {annotation: "Bad_NS,", fatal: true},
		"mesh default none":                         {meshDefault: []string{"~"}, fatal: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			svc := service(svcPort("http", 80, intstr.FromInt32(8080)))
			if tc.annotation != "" {
				svc.Annotations = map[string]string{AnnotationExportTo: tc.annotation}
			}
			got, p := exportTo(svc, tc.meshDefault)
			if (p != nil) != tc.fatal || (p != nil && (!p.Fatal || p.Reason != "ServiceNotExported")) {
				t.Fatalf("problem %+v, want fatal=%v", p, tc.fatal)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("exportTo %q, want %q", got, tc.want)
			}
		})
	}
}

// TestComputeScopesEveryObject: the three owned objects carry the
// Service's scope, and a Service visible nowhere gets nothing written.
func TestComputeScopesEveryObject(t *testing.T) {
	in := webInput()
	in.Service.Annotations = map[string]string{AnnotationExportTo: "client-a,."}
	r := Compute(in)
	want := []string{".", "client-a"}
	if !slices.Equal(r.ServiceEntry.Spec.ExportTo, want) || !slices.Equal(r.DestinationRule.Spec.ExportTo, want) || !slices.Equal(r.VirtualService.Spec.ExportTo, want) {
		t.Errorf("exportTo SE %v DR %v VS %v, want %v", r.ServiceEntry.Spec.ExportTo, r.DestinationRule.Spec.ExportTo, r.VirtualService.Spec.ExportTo, want)
	}
	in.Service.Annotations[AnnotationExportTo] = "~"
	r = Compute(in)
	if r.ServiceEntry != nil || r.VirtualService != nil || r.DestinationRule != nil || len(r.Problems) != 1 || !r.Problems[0].Fatal {
		t.Errorf("a hidden Service got objects or problems %+v", r.Problems)
	}
}

func TestParseExportTo(t *testing.T) {
	if got, err := ParseExportTo(" ., ns-a ,"); err != nil || !slices.Equal(got, []string{".", "ns-a"}) {
		t.Errorf("got %v %v", got, err)
	}
	if _, err := ParseExportTo("Not_A_Namespace"); err == nil {
		t.Error("accepted an entry that is no namespace")
	}
}

func TestMeshProtocol(t *testing.T) {
	tests := map[string]struct {
		port corev1.ServicePort
		want string
		kind routeKind
	}{
		"http name":                      {corev1.ServicePort{Name: "http-web", Port: 80}, "HTTP", routeHTTP},
		"grpc-web before prefix":         {corev1.ServicePort{Name: "grpc-web-x", Port: 80}, "GRPC-Web", routeHTTP},
		"h2c appProtocol":                {corev1.ServicePort{Name: "tcp", Port: 80, AppProtocol: ptr.To("kubernetes.io/h2c")}, "HTTP2", routeHTTP},
		"wss is HTTPS":                   {corev1.ServicePort{Port: 443, AppProtocol: ptr.To("kubernetes.io/wss")}, "HTTPS", routeTLS},
		"https name":                     {corev1.ServicePort{Name: "https", Port: 443}, "HTTPS", routeTLS},
		"tls name":                       {corev1.ServicePort{Name: "tls-db", Port: 5433}, "TLS", routeTLS},
		"unnamed":                        {corev1.ServicePort{Port: 8080}, "", routeSniffed},
		"unknown name":                   {corev1.ServicePort{Name: "web", Port: 8080}, "", routeSniffed},
		"unknown appProtocol, http name": {corev1.ServicePort{Name: "http", Port: 8080, AppProtocol: ptr.To("example.com/x")}, "", routeSniffed},
		"well-known port":                {corev1.ServicePort{Name: "db", Port: 3306}, "TCP", routeTCP},
		"redis":                          {corev1.ServicePort{Name: "redis", Port: 6379}, "Redis", routeTCP},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := meshProtocol(tc.port)
			if got != tc.want || routeKindOf(got) != tc.kind {
				t.Errorf("meshProtocol = %q kind %v, want %q kind %v", got, routeKindOf(got), tc.want, tc.kind)
			}
		})
	}
}

// TestComputeRoutesEveryListenerChain: the VirtualService has, for each
// Service port, the routes the client's listener for that port reads.
func TestComputeRoutesEveryListenerChain(t *testing.T) {
	in := webInput()
	in.Service = service(svcPort("web", 8080, intstr.FromInt32(8080)), svcPort("https", 443, intstr.FromInt32(8443)), svcPort("tls-other", 444, intstr.FromInt32(444)))
	in.Optimizer = optimizer(withPorts(optv1.ServicePort{Number: 8080}, optv1.ServicePort{Number: 443}))
	r := Compute(in)
	if len(r.Problems) != 1 || r.Problems[0].Reason != "TLSRoutedBySNI" || r.Problems[0].Fatal {
		t.Fatalf("problems %+v, want the TLSRoutedBySNI note", r.Problems)
	}
	vs := &r.VirtualService.Spec
	kube := "web.shop.svc.cluster.local"
	var got []string
	for _, h := range vs.Http {
		got = append(got, "http "+h.Route[0].Destination.Host+":"+itoa(h.Match[0].Port))
	}
	for _, tr := range vs.Tcp {
		got = append(got, "tcp "+tr.Route[0].Destination.Host+":"+itoa(tr.Match[0].Port))
	}
	for _, tl := range vs.Tls {
		got = append(got, "tls "+strings.Join(tl.Match[0].SniHosts, ",")+" "+tl.Route[0].Destination.Host+":"+itoa(tl.Match[0].Port))
	}
	want := []string{
		"http web.shop.adaptive:8080", // sniffed: both chains
		"tcp web.shop.adaptive:8080",
		"tls " + kube + " web.shop.adaptive:443", // by SNI; a tcp route would be ignored
		// port 444 is TLS and not optimized: no route, istiod's default
		// chain already goes to the Kubernetes Service for any SNI.
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes\n%q\nwant\n%q", got, want)
	}
	var se []string
	for _, p := range r.ServiceEntry.Spec.Ports {
		se = append(se, p.Name+"/"+p.Protocol)
	}
	if !slices.Equal(se, []string{"auto-8080/", "https-443/HTTPS"}) {
		t.Errorf("ServiceEntry ports %q", se)
	}
}

func itoa(n uint32) string { return strconv.Itoa(int(n)) }

func userDR(name string, created time.Time, mutate func(*istionet.DestinationRule)) *istionet.DestinationRule {
	dr := &istionet.DestinationRule{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name, CreationTimestamp: metav1.NewTime(created)}}
	dr.Spec.Host = "web"
	if mutate != nil {
		mutate(dr)
	}
	return dr
}

func TestCarryUserDestinationRule(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tlsPolicy := &networking.ClientTLSSettings{Mode: networking.ClientTLSSettings_SIMPLE, Sni: "web.shop.svc.cluster.local"}
	pool := &networking.ConnectionPoolSettings{Tcp: &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: 7}}
	withPolicy := func(dr *istionet.DestinationRule) {
		dr.Spec.TrafficPolicy = &networking.TrafficPolicy{
			Tls:            tlsPolicy,
			ConnectionPool: pool,
			LoadBalancer:   &networking.LoadBalancerSettings{LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: networking.LoadBalancerSettings_LEAST_REQUEST}},
			PortLevelSettings: []*networking.TrafficPolicy_PortTrafficPolicy{
				{Port: &networking.PortSelector{Number: 80}, ConnectionPool: pool},
				{Port: &networking.PortSelector{Number: 9999}, ConnectionPool: pool},
			},
		}
	}
	tests := map[string]struct {
		drs      []*istionet.DestinationRule
		locality bool
		exportTo string
		fatal    string // substring of the Fatal message, "" for none
		carried  string
	}{
		"none":                  {},
		"other host":            {drs: []*istionet.DestinationRule{userDR("other", t0, func(d *istionet.DestinationRule) { d.Spec.Host = "api"; withPolicy(d) })}}, //nolint:lll
		"short name is carried": {drs: []*istionet.DestinationRule{userDR("web-dr", t0, withPolicy)}, carried: "shop/web-dr"},
		"FQDN with locality":    {drs: []*istionet.DestinationRule{userDR("web-dr", t0, func(d *istionet.DestinationRule) { withPolicy(d); d.Spec.Host = "web.shop.svc.cluster.local" })}, locality: true, carried: "shop/web-dr"},
		"oldest wins": {drs: []*istionet.DestinationRule{userDR("young", t0.Add(time.Hour), func(d *istionet.DestinationRule) {
			d.Spec.TrafficPolicy = &networking.TrafficPolicy{ConnectionPool: &networking.ConnectionPoolSettings{Tcp: &networking.ConnectionPoolSettings_TCPSettings{MaxConnections: 99}}}
		}), userDR("old", t0, withPolicy)}, carried: "shop/old"},
		"operator's own skipped": {drs: []*istionet.DestinationRule{userDR("web-adaptive", t0, func(d *istionet.DestinationRule) {
			d.Labels = map[string]string{LabelManagedBy: ManagedByValue}
			d.Spec.Subsets = []*networking.Subset{{Name: "x"}}
		})}},
		"subsets on a younger rule stall too": {drs: []*istionet.DestinationRule{userDR("old", t0, withPolicy), userDR("young", t0.Add(time.Hour), func(d *istionet.DestinationRule) { d.Spec.Subsets = []*networking.Subset{{Name: "v1"}} })}, fatal: "young for"},
		"subsets stall":                       {drs: []*istionet.DestinationRule{userDR("web-dr", t0, func(d *istionet.DestinationRule) { withPolicy(d); d.Spec.Subsets = []*networking.Subset{{Name: "v1"}} })}, fatal: "subsets"},
		"workload selector stalls": {drs: []*istionet.DestinationRule{userDR("web-dr", t0, func(d *istionet.DestinationRule) {
			d.Spec.WorkloadSelector = &typev1beta1.WorkloadSelector{MatchLabels: map[string]string{"app": "x"}}
		})}, fatal: "workloadSelector"},
		"narrower scope stalls":                {drs: []*istionet.DestinationRule{userDR("web-dr", t0, func(d *istionet.DestinationRule) { withPolicy(d); d.Spec.ExportTo = []string{"."} })}, fatal: "narrower"},
		"own namespace by name covers private": {drs: []*istionet.DestinationRule{userDR("web-dr", t0, func(d *istionet.DestinationRule) { withPolicy(d); d.Spec.ExportTo = []string{testNS} })}, exportTo: ".", carried: "shop/web-dr"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := webInput()
			in.WeightsLearned = true // the operator's ROUND_ROBIN is in force
			in.Optimizer.Spec.LocalityEnabled = tc.locality
			in.Mesh.DestinationRules = tc.drs
			if tc.exportTo != "" {
				in.Service.Annotations = map[string]string{AnnotationExportTo: tc.exportTo}
			}
			r := Compute(in)
			if tc.fatal != "" {
				if len(r.Problems) != 1 || r.Problems[0].Reason != "UserDestinationRuleNotCarried" || !r.Problems[0].Fatal || !strings.Contains(r.Problems[0].Message, tc.fatal) {
					t.Fatalf("problems %+v, want a fatal one about %s", r.Problems, tc.fatal)
				}
				if r.DestinationRule != nil || r.ServiceEntry != nil || r.VirtualService != nil {
					t.Error("objects computed despite a fatal problem")
				}
				return
			}
			if len(r.Problems) != 0 {
				t.Fatalf("problems %+v", r.Problems)
			}
			if r.CarriedDestinationRule != tc.carried {
				t.Errorf("carried %q, want %q", r.CarriedDestinationRule, tc.carried)
			}
			tp := r.DestinationRule.Spec.TrafficPolicy
			if lb := tp.GetLoadBalancer(); lb.GetSimple() != networking.LoadBalancerSettings_ROUND_ROBIN || lb.GetLocalityLbSetting().GetEnabled().GetValue() != tc.locality {
				t.Errorf("load balancer %v: the operator's must stay", lb)
			}
			if tc.carried == "" {
				if tp.Tls != nil || tp.ConnectionPool != nil || len(tp.PortLevelSettings) != 0 {
					t.Errorf("policy carried from nowhere: %v", tp)
				}
				return
			}
			if tp.GetTls().GetMode() != networking.ClientTLSSettings_SIMPLE || tp.GetTls().GetSni() != "web.shop.svc.cluster.local" || tp.GetConnectionPool().GetTcp().GetMaxConnections() != 7 {
				t.Errorf("TLS %v pool %v not carried", tp.GetTls(), tp.GetConnectionPool())
			}
			if tc.locality != (tp.GetOutlierDetection() != nil) {
				t.Errorf("outlier detection %v with locality %v", tp.GetOutlierDetection(), tc.locality)
			}
			if len(tp.PortLevelSettings) != 1 {
				t.Fatalf("port level %v: only the optimized port 80 must stay", tp.PortLevelSettings)
			}
			pl := tp.PortLevelSettings[0]
			if pl.GetPort().GetNumber() != 80 || pl.GetLoadBalancer().GetSimple() != networking.LoadBalancerSettings_ROUND_ROBIN || pl.GetConnectionPool().GetTcp().GetMaxConnections() != 7 {
				t.Errorf("port level %v: the port keeps its pool and gets the operator's load balancer", pl)
			}
			if tc.locality && pl.GetOutlierDetection() == nil {
				t.Error("port level setting lost the outlier detection locality failover needs")
			}
			// The user's object is untouched.
			if in.Mesh.DestinationRules[len(in.Mesh.DestinationRules)-1].Spec.TrafficPolicy.LoadBalancer.GetSimple() != networking.LoadBalancerSettings_LEAST_REQUEST {
				t.Error("the user's DestinationRule was changed")
			}
		})
	}
}

// FuzzExportTo: whatever the annotation, the scope never names a namespace
// the annotation did not, is "*" only when the annotation says so, and is
// something Istio accepts on every kind (no "~", no duplicates, "*" alone).
func FuzzExportTo(f *testing.F) {
	for _, s := range []string{".", "*", "~", "a,b", "shop,.", "~,a", " a , ,b", "A_b", "a,*,b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, annotation string) {
		svc := service(svcPort("http", 80, intstr.FromInt32(8080)))
		svc.Annotations = map[string]string{AnnotationExportTo: annotation}
		got, p := exportTo(svc, []string{"."})
		if p != nil {
			if len(got) != 0 || !p.Fatal {
				t.Fatalf("problem %+v with scope %v", p, got)
			}
			return
		}
		entries := map[string]bool{}
		for _, e := range strings.Split(annotation, ",") {
			entries[strings.TrimSpace(e)] = true
		}
		if strings.TrimSpace(annotation) == "" {
			entries = map[string]bool{".": true}
		}
		seen := map[string]bool{}
		for _, e := range got {
			if seen[e] || e == "~" || (e == "*" && len(got) > 1) {
				t.Fatalf("scope %v for %q", got, annotation)
			}
			seen[e] = true
			if e == "." && !entries["."] && !entries[testNS] {
				t.Fatalf("scope %v widens %q to the own namespace", got, annotation)
			}
			if e != "." && !entries[e] {
				t.Fatalf("scope %v names %q, which %q does not", got, e, annotation)
			}
		}
		if _, err := ParseExportTo(strings.Join(got, ",")); err != nil {
			t.Fatal(err)
		}
	})
}
