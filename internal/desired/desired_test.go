package desired

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
)

// The fixtures below build the inputs of Compute the way the controller
// reads them: one Service "web" in namespace "shop", its EndpointSlices,
// pods and nodes. Addresses come from 198.18.0.0/15 (identifiers only).

const (
	testNS  = "shop"
	testSvc = "web"
)

func ip(b int) string { return fmt.Sprintf("198.18.0.%d", b) }

func optimizer(mutate ...func(*optv1.IstioAdaptiveRequestOptimizer)) *optv1.IstioAdaptiveRequestOptimizer {
	o := &optv1.IstioAdaptiveRequestOptimizer{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "web-opt", UID: types.UID("opt-uid")},
		Spec:       optv1.IstioAdaptiveRequestOptimizerSpec{ServiceName: testSvc},
	}
	for _, m := range mutate {
		m(o)
	}
	return o
}

func withPorts(ports ...optv1.ServicePort) func(*optv1.IstioAdaptiveRequestOptimizer) {
	return func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.ServicePorts = ports }
}

func svcPort(name string, port int32, target intstr.IntOrString) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: port, TargetPort: target, Protocol: corev1.ProtocolTCP}
}

func service(ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: testSvc},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: ports},
	}
}

// ep is one EndpointSlice entry; ready/terminating nil means "not set".
type ep struct {
	pod, addr, node, zone string
	ready, terminating    *bool
	noTargetRef           bool
}

func readyEP(pod string, b int, node string) ep { return ep{pod: pod, addr: ip(b), node: node} }

func slice(name string, ports map[string]int32, eps ...ep) discoveryv1.EndpointSlice {
	s := discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: testNS, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: testSvc}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	names := make([]string, 0, len(ports))
	for n := range ports {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr.To(n), Port: ptr.To(ports[n]), Protocol: ptr.To(corev1.ProtocolTCP)})
	}
	for _, e := range eps {
		d := discoveryv1.Endpoint{
			Addresses:  []string{e.addr},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Terminating: e.terminating},
		}
		if !e.noTargetRef {
			d.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: testNS, Name: e.pod}
		}
		if e.node != "" {
			d.NodeName = ptr.To(e.node)
		}
		if e.zone != "" {
			d.Zone = ptr.To(e.zone)
		}
		s.Endpoints = append(s.Endpoints, d)
	}
	return s
}

type podOpt func(*corev1.Pod)

func pod(name string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: name},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func sidecarContainer(p *corev1.Pod) {
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "istio-proxy"})
}

func nativeSidecar(p *corev1.Pod) {
	always := corev1.ContainerRestartPolicyAlways
	p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "istio-proxy", RestartPolicy: &always})
}

func sidecarAnnotation(p *corev1.Pod) {
	p.Annotations = map[string]string{"sidecar.istio.io/status": `{"containers":["istio-proxy"]}`}
}

func serviceAccount(sa string) podOpt { return func(p *corev1.Pod) { p.Spec.ServiceAccountName = sa } }

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }

func containerPort(name string, port int32) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: name, ContainerPort: port})
	}
}

func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func podMap(pods ...*corev1.Pod) map[string]*corev1.Pod {
	m := map[string]*corev1.Pod{}
	for _, p := range pods {
		m[p.Name] = p
	}
	return m
}

func nodeMap(nodes ...*corev1.Node) map[string]*corev1.Node {
	m := map[string]*corev1.Node{}
	for _, n := range nodes {
		m[n.Name] = n
	}
	return m
}

// webInput is a Service with one HTTP port (80 -> 8080) and two ready pods.
func webInput() Input {
	return Input{
		Optimizer: optimizer(),
		Service:   service(svcPort("http", 80, intstr.FromInt32(8080))),
		Slices:    []discoveryv1.EndpointSlice{slice("web-1", map[string]int32{"http": 8080}, readyEP("web-0", 1, ""), readyEP("web-1", 2, ""))},
	}
}

// portString renders a port as "name number protocol target".
func portString(p Port) string {
	return fmt.Sprintf("%s %d %s %d", p.Name, p.Number, p.Protocol, p.TargetPort)
}

func portStrings(ps []Port) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, portString(p))
	}
	return out
}

func reasons(ps []Problem) []string {
	out := []string{}
	for _, p := range ps {
		out = append(out, p.Reason)
	}
	return out
}

func hasFatal(ps []Problem) bool {
	return slices.ContainsFunc(ps, func(p Problem) bool { return p.Fatal })
}

func TestComputePorts(t *testing.T) {
	http := optv1.ProtocolHTTP
	grpc := optv1.ProtocolGRPC
	tests := map[string]struct {
		ports    []corev1.ServicePort // of the Service
		selected []optv1.ServicePort  // spec.service_ports
		slices   []discoveryv1.EndpointSlice
		pods     map[string]*corev1.Pod
		want     []string // "name number protocol target", in order
		problems []string // reasons
		fatal    bool
	}{
		"name prefix http- gives HTTP": {
			ports: []corev1.ServicePort{svcPort("http-web", 80, intstr.FromInt32(8080))},
			want:  []string{"http-80 80 HTTP 8080"},
		},
		"bare name http gives HTTP": {
			ports: []corev1.ServicePort{svcPort("http", 80, intstr.FromInt32(8080))},
			want:  []string{"http-80 80 HTTP 8080"},
		},
		"name prefix http2- gives HTTP2": {
			ports: []corev1.ServicePort{svcPort("http2-api", 81, intstr.FromInt32(8081))},
			want:  []string{"http2-81 81 HTTP2 8081"},
		},
		"name prefix grpc- gives GRPC": {
			ports: []corev1.ServicePort{svcPort("grpc-api", 9090, intstr.FromInt32(9090))},
			want:  []string{"grpc-9090 9090 GRPC 9090"},
		},
		"name prefix tcp- gives TCP": {
			ports: []corev1.ServicePort{svcPort("tcp-db", 5432, intstr.FromInt32(5432))},
			want:  []string{"tcp-5432 5432 TCP 5432"},
		},
		"name prefix is case-insensitive": {
			ports: []corev1.ServicePort{svcPort("GRPC-Api", 9090, intstr.FromInt32(9090))},
			want:  []string{"grpc-9090 9090 GRPC 9090"},
		},
		"an undeclared protocol is sniffed, as istiod does": {
			ports: []corev1.ServicePort{svcPort("db", 5432, intstr.FromInt32(5432)), svcPort("", 6379, intstr.FromInt32(6379))},
			want:  []string{"auto-5432 5432  5432", "auto-6379 6379  6379"},
		},
		"well-known ports are TCP when undeclared": {
			ports: []corev1.ServicePort{svcPort("db", 3306, intstr.FromInt32(3306)), svcPort("", 27017, intstr.FromInt32(27017))},
			want:  []string{"tcp-3306 3306 TCP 3306", "tcp-27017 27017 TCP 27017"},
		},
		"https and tls ports are optimized only when listed, with a note": {
			ports:    []corev1.ServicePort{svcPort("https", 443, intstr.FromInt32(8443)), svcPort("tls-x", 444, intstr.FromInt32(8444))},
			selected: []optv1.ServicePort{{Number: 443}, {Number: 444}},
			want:     []string{"https-443 443 HTTPS 8443", "tls-444 444 TLS 8444"},
			problems: []string{"TLSRoutedBySNI", "TLSRoutedBySNI"},
		},
		"https and tls ports are left alone by default": {
			ports:    []corev1.ServicePort{svcPort("http", 80, intstr.FromInt32(8080)), svcPort("https", 443, intstr.FromInt32(8443))},
			want:     []string{"http-80 80 HTTP 8080"},
			problems: []string{"TLSPortNotOptimized"},
		},
		"appProtocol beats the name prefix": {
			ports: []corev1.ServicePort{func() corev1.ServicePort {
				p := svcPort("http-web", 80, intstr.FromInt32(8080))
				p.AppProtocol = ptr.To("grpc")
				return p
			}()},
			want: []string{"grpc-80 80 GRPC 8080"},
		},
		"appProtocol kubernetes.io/h2c gives HTTP2": {
			ports: []corev1.ServicePort{func() corev1.ServicePort {
				p := svcPort("web", 80, intstr.FromInt32(8080))
				p.AppProtocol = ptr.To("kubernetes.io/h2c")
				return p
			}()},
			want: []string{"http2-80 80 HTTP2 8080"},
		},
		"an unknown appProtocol is sniffed; Istio does not read the name then": {
			ports: []corev1.ServicePort{func() corev1.ServicePort {
				p := svcPort("grpc-x", 80, intstr.FromInt32(8080))
				p.AppProtocol = ptr.To("example.com/custom")
				return p
			}()},
			want: []string{"auto-80 80  8080"},
		},
		"spec protocol beats appProtocol and name": {
			ports: []corev1.ServicePort{func() corev1.ServicePort {
				p := svcPort("grpc-x", 80, intstr.FromInt32(8080))
				p.AppProtocol = ptr.To("grpc")
				return p
			}()},
			selected: []optv1.ServicePort{{Number: 80, Protocol: http}},
			want:     []string{"http-80 80 HTTP 8080"},
		},
		"UDP port is refused with a problem, the others kept": {
			ports: []corev1.ServicePort{
				{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolUDP},
				svcPort("http", 80, intstr.FromInt32(8080)),
			},
			want:     []string{"http-80 80 HTTP 8080"},
			problems: []string{"UnsupportedProtocol"},
		},
		"UDP only is fatal": {
			ports:    []corev1.ServicePort{{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(53), Protocol: corev1.ProtocolUDP}},
			want:     []string{},
			problems: []string{"UnsupportedProtocol", "NoPorts"},
			fatal:    true,
		},
		"TCP twin of a UDP port is optimized whatever the order": {
			ports: []corev1.ServicePort{
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolTCP},
				{Name: "dns-udp", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolUDP},
			},
			want: []string{"tcp-53 53 TCP 5353"},
		},
		"TCP twin listed after the UDP port": {
			ports: []corev1.ServicePort{
				{Name: "dns-udp", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolTCP},
			},
			selected: []optv1.ServicePort{{Number: 53}},
			want:     []string{"tcp-53 53 TCP 5353"},
		},
		"unset target port is the port itself": {
			ports: []corev1.ServicePort{svcPort("http", 80, intstr.IntOrString{})},
			want:  []string{"http-80 80 HTTP 80"},
		},
		"named target port resolved through the EndpointSlice port": {
			ports:  []corev1.ServicePort{svcPort("http", 80, intstr.FromString("web"))},
			slices: []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, readyEP("p0", 1, ""))},
			pods:   podMap(pod("p0", containerPort("web", 9999))),
			want:   []string{"http-80 80 HTTP 8080"},
		},
		"named target port resolved through a pod's container port when no slice has it": {
			ports: []corev1.ServicePort{svcPort("http", 80, intstr.FromString("web"))},
			pods:  podMap(pod("p0", containerPort("web", 8088))),
			want:  []string{"http-80 80 HTTP 8088"},
		},
		"named target port nobody declares is a problem": {
			ports:    []corev1.ServicePort{svcPort("http", 80, intstr.FromString("web")), svcPort("grpc", 90, intstr.FromInt32(9090))},
			want:     []string{"grpc-90 90 GRPC 9090"},
			problems: []string{"TargetPortUnresolved"},
		},
		"spec target port overrides the Service's (int)": {
			ports:    []corev1.ServicePort{svcPort("http", 80, intstr.FromInt32(8080))},
			selected: []optv1.ServicePort{{Number: 80, TargetPort: ptr.To(intstr.FromInt32(8181))}},
			slices:   []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, readyEP("p0", 1, ""))},
			want:     []string{"http-80 80 HTTP 8181"},
		},
		"spec target port overrides the Service's (named, from the pods)": {
			ports:    []corev1.ServicePort{svcPort("http", 80, intstr.FromString("web"))},
			selected: []optv1.ServicePort{{Number: 80, TargetPort: ptr.To(intstr.FromString("admin"))}},
			slices:   []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, readyEP("p0", 1, ""))},
			pods:     podMap(pod("p0", containerPort("web", 8080), containerPort("admin", 8181))),
			want:     []string{"http-80 80 HTTP 8181"},
		},
		"service_ports selects a subset in the given order": {
			ports: []corev1.ServicePort{
				svcPort("http", 80, intstr.FromInt32(8080)),
				svcPort("grpc", 9090, intstr.FromInt32(9090)),
				svcPort("db", 5432, intstr.FromInt32(5432)),
			},
			selected: []optv1.ServicePort{{Number: 9090}, {Number: 80, Protocol: grpc}},
			want:     []string{"grpc-9090 9090 GRPC 9090", "grpc-80 80 GRPC 8080"},
		},
		"a port the Service lacks is a non-fatal problem": {
			ports:    []corev1.ServicePort{svcPort("http", 80, intstr.FromInt32(8080))},
			selected: []optv1.ServicePort{{Number: 80}, {Number: 81}},
			want:     []string{"http-80 80 HTTP 8080"},
			problems: []string{"PortNotFound"},
		},
		"all selected ports missing is fatal": {
			ports:    []corev1.ServicePort{svcPort("http", 80, intstr.FromInt32(8080))},
			selected: []optv1.ServicePort{{Number: 81}, {Number: 82}},
			want:     []string{},
			problems: []string{"PortNotFound", "PortNotFound", "NoPorts"},
			fatal:    true,
		},
		"a Service without ports is fatal": {
			want:     []string{},
			problems: []string{"NoPorts"},
			fatal:    true,
		},
		"duplicate selected numbers are optimized once": {
			ports:    []corev1.ServicePort{svcPort("http", 80, intstr.FromInt32(8080))},
			selected: []optv1.ServicePort{{Number: 80}, {Number: 80, Protocol: grpc}},
			want:     []string{"http-80 80 HTTP 8080"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := Compute(Input{
				Optimizer: optimizer(withPorts(tc.selected...)),
				Service:   service(tc.ports...),
				Slices:    tc.slices,
				Pods:      tc.pods,
			})
			if got := portStrings(r.Ports); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ports = %q, want %q", got, tc.want)
			}
			if got := reasons(r.Problems); !reflect.DeepEqual(got, append([]string{}, tc.problems...)) {
				t.Errorf("problems = %v, want %v (%v)", got, tc.problems, r.Problems)
			}
			if hasFatal(r.Problems) != tc.fatal {
				t.Errorf("fatal = %v, want %v", hasFatal(r.Problems), tc.fatal)
			}
			if tc.fatal != (r.ServiceEntry == nil) || tc.fatal != (r.DestinationRule == nil) {
				t.Errorf("objects written despite a fatal problem, or missing without one: SE %v DR %v", r.ServiceEntry != nil, r.DestinationRule != nil)
			}
			if r.ServiceEntry == nil {
				return
			}
			var sePorts []string
			for _, p := range r.ServiceEntry.Spec.Ports {
				sePorts = append(sePorts, fmt.Sprintf("%s %d %s %d", p.Name, p.Number, p.Protocol, p.TargetPort))
			}
			if !reflect.DeepEqual(sePorts, tc.want) {
				t.Errorf("ServiceEntry ports = %q, want %q", sePorts, tc.want)
			}
		})
	}
}

func TestComputeProblemMessagesNameWhatIsWrong(t *testing.T) {
	in := webInput()
	in.Optimizer = optimizer(withPorts(optv1.ServicePort{Number: 80}, optv1.ServicePort{Number: 8443}))
	r := Compute(in)
	if len(r.Problems) != 1 || !strings.Contains(r.Problems[0].Message, "8443") || !strings.Contains(r.Problems[0].Message, "shop/web") {
		t.Fatalf("problems = %+v, want one naming port 8443 and Service shop/web", r.Problems)
	}
	if r.Problems[0].Fatal {
		t.Errorf("a missing port with others left is fatal")
	}
	if len(r.Endpoints) != 2 || r.VirtualService == nil {
		t.Errorf("the remaining port is not routed: %d endpoints, VirtualService %v", len(r.Endpoints), r.VirtualService != nil)
	}
}

func TestComputeFatalWithoutAService(t *testing.T) {
	tests := map[string]struct {
		service *corev1.Service
		reason  string
	}{
		"missing Service": {service: nil, reason: "ServiceNotFound"},
		"ExternalName Service": {service: func() *corev1.Service {
			s := service(svcPort("http", 80, intstr.FromInt32(80)))
			s.Spec.Type = corev1.ServiceTypeExternalName
			s.Spec.ExternalName = "example.com"
			return s
		}(), reason: "UnsupportedService"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := webInput()
			in.Service = tc.service
			r := Compute(in)
			if len(r.Problems) != 1 || r.Problems[0].Reason != tc.reason || !r.Problems[0].Fatal {
				t.Fatalf("problems = %+v, want one fatal %s", r.Problems, tc.reason)
			}
			if !strings.Contains(r.Problems[0].Message, "shop/web") {
				t.Errorf("message %q does not name the Service", r.Problems[0].Message)
			}
			if r.ServiceEntry != nil || r.DestinationRule != nil || r.VirtualService != nil || len(r.Endpoints) != 0 {
				t.Errorf("objects computed despite a fatal problem")
			}
			// What the status reports is still known.
			if r.Host != "web.shop.adaptive" || r.Name != "web-adaptive" || r.Namespace != "shop" {
				t.Errorf("host/name/namespace = %s %s %s", r.Host, r.Name, r.Namespace)
			}
		})
	}
}

// endpointString renders what the ServiceEntry carries for an endpoint.
func endpointString(we *networking.WorkloadEntry) string {
	s := fmt.Sprintf("%s loc=%q sa=%q tls=%q w=%d", we.Address, we.Locality, we.ServiceAccount, we.Labels[LabelTLSMode], we.Weight)
	if len(we.Ports) > 0 {
		keys := make([]string, 0, len(we.Ports))
		for k := range we.Ports {
			keys = append(keys, fmt.Sprintf("%s:%d", k, we.Ports[k]))
		}
		sort.Strings(keys)
		s += " ports=" + strings.Join(keys, ",")
	}
	return s
}

func seEndpoints(r Result) []string {
	out := []string{}
	if r.ServiceEntry == nil {
		return out
	}
	for _, we := range r.ServiceEntry.Spec.Endpoints {
		out = append(out, endpointString(we))
	}
	return out
}

func TestComputeEndpoints(t *testing.T) {
	yes, no := ptr.To(true), ptr.To(false)
	http := map[string]int32{"http": 8080}
	zoned := nodeMap(
		node("n-full", map[string]string{labelRegion: "eu-west", labelZone: "eu-west-a", labelSubzone: "rack1", corev1.LabelInstanceTypeStable: "m5.large"}),
		node("n-zone", map[string]string{labelRegion: "eu-west", labelZone: "eu-west-b"}),
		node("n-region", map[string]string{labelRegion: "us-east"}),
		node("n-bare", nil),
	)
	tests := map[string]struct {
		slices []discoveryv1.EndpointSlice
		pods   map[string]*corev1.Pod
		nodes  map[string]*corev1.Node
		target *intstr.IntOrString // of the Service port http 80; default 8080
		want   []string            // endpointString of each ServiceEntry endpoint, in order
	}{
		"ready nil counts as ready, ready false and terminating are left out": {
			slices: []discoveryv1.EndpointSlice{slice("s1", http,
				ep{pod: "a", addr: ip(1)},
				ep{pod: "b", addr: ip(2), ready: yes},
				ep{pod: "c", addr: ip(3), ready: no},
				ep{pod: "d", addr: ip(4), ready: yes, terminating: yes},
				ep{pod: "e", addr: ip(5), terminating: yes},
				ep{pod: "f", addr: ip(6), ready: yes, terminating: no},
			)},
			want: []string{
				ip(1) + ` loc="" sa="" tls="" w=1000`,
				ip(2) + ` loc="" sa="" tls="" w=1000`,
				ip(6) + ` loc="" sa="" tls="" w=1000`,
			},
		},
		"an address in two slices is routed once": {
			slices: []discoveryv1.EndpointSlice{
				slice("s2", http, readyEP("a", 1, ""), readyEP("b", 2, "")),
				slice("s1", http, readyEP("a", 1, "")),
			},
			want: []string{
				ip(1) + ` loc="" sa="" tls="" w=1000`,
				ip(2) + ` loc="" sa="" tls="" w=1000`,
			},
		},
		"FQDN slices and endpoints without addresses are skipped": {
			slices: []discoveryv1.EndpointSlice{
				func() discoveryv1.EndpointSlice {
					s := slice("fqdn", http, ep{pod: "x", addr: "x.example.com"})
					s.AddressType = discoveryv1.AddressTypeFQDN
					return s
				}(),
				func() discoveryv1.EndpointSlice {
					s := slice("s1", http, readyEP("a", 1, ""), ep{pod: "b"})
					s.Endpoints[1].Addresses = nil
					return s
				}(),
			},
			want: []string{ip(1) + ` loc="" sa="" tls="" w=1000`},
		},
		"locality from the node's region, zone and subzone": {
			slices: []discoveryv1.EndpointSlice{slice("s1", http,
				readyEP("a", 1, "n-full"),
				readyEP("b", 2, "n-zone"),
				readyEP("c", 3, "n-region"),
				readyEP("d", 4, "n-bare"),
				readyEP("e", 5, "n-unknown"),
			)},
			nodes: zoned,
			want: []string{
				ip(1) + ` loc="eu-west/eu-west-a/rack1" sa="" tls="" w=1000`,
				ip(2) + ` loc="eu-west/eu-west-b" sa="" tls="" w=1000`,
				ip(3) + ` loc="us-east" sa="" tls="" w=1000`,
				ip(4) + ` loc="" sa="" tls="" w=1000`,
				ip(5) + ` loc="" sa="" tls="" w=1000`,
			},
		},
		"slice zone is the fallback when the node has no zone": {
			slices: []discoveryv1.EndpointSlice{slice("s1", http,
				ep{pod: "a", addr: ip(1), node: "n-region", zone: "us-east-1c"},
				ep{pod: "b", addr: ip(2), node: "n-zone", zone: "ignored"},
				ep{pod: "c", addr: ip(3), zone: "us-east-1d"},
			)},
			nodes: zoned,
			want: []string{
				ip(1) + ` loc="us-east/us-east-1c" sa="" tls="" w=1000`,
				ip(2) + ` loc="eu-west/eu-west-b" sa="" tls="" w=1000`,
				ip(3) + ` loc="/us-east-1d" sa="" tls="" w=1000`,
			},
		},
		"node taken from the pod when the slice has none": {
			slices: []discoveryv1.EndpointSlice{slice("s1", http, readyEP("a", 1, ""))},
			pods:   podMap(pod("a", onNode("n-full"))),
			nodes:  zoned,
			want:   []string{ip(1) + ` loc="eu-west/eu-west-a/rack1" sa="" tls="" w=1000`},
		},
		"sidecar by container, native sidecar or annotation gives tlsMode istio": {
			slices: []discoveryv1.EndpointSlice{slice("s1", http,
				readyEP("container", 1, ""),
				readyEP("native", 2, ""),
				readyEP("annotated", 3, ""),
				readyEP("plain", 4, ""),
				readyEP("unknown", 5, ""),
			)},
			pods: podMap(
				pod("container", sidecarContainer, serviceAccount("sa-1")),
				pod("native", nativeSidecar, serviceAccount("sa-2")),
				pod("annotated", sidecarAnnotation),
				pod("plain", serviceAccount("sa-4")),
			),
			want: []string{
				ip(3) + ` loc="" sa="" tls="istio" w=1000`,
				ip(1) + ` loc="" sa="sa-1" tls="istio" w=1000`,
				ip(2) + ` loc="" sa="sa-2" tls="istio" w=1000`,
				ip(4) + ` loc="" sa="sa-4" tls="" w=1000`,
				ip(5) + ` loc="" sa="" tls="" w=1000`,
			},
		},
		"an endpoint without a pod reference is keyed by its address": {
			slices: []discoveryv1.EndpointSlice{slice("s1", http, ep{addr: ip(9), noTargetRef: true}, readyEP("a", 1, ""))},
			want: []string{
				ip(9) + ` loc="" sa="" tls="" w=1000`,
				ip(1) + ` loc="" sa="" tls="" w=1000`,
			},
		},
		"pods whose slice port differs from the resolved target get a per-endpoint port": {
			slices: []discoveryv1.EndpointSlice{
				slice("s1", http, readyEP("a", 1, "")),
				slice("s2", map[string]int32{"http": 8081}, readyEP("b", 2, "")),
			},
			target: ptr.To(intstr.FromString("web")),
			want: []string{
				ip(1) + ` loc="" sa="" tls="" w=1000`,
				ip(2) + ` loc="" sa="" tls="" w=1000 ports=http-80:8081`,
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			target := intstr.FromInt32(8080)
			if tc.target != nil {
				target = *tc.target
			}
			r := Compute(Input{
				Optimizer: optimizer(),
				Service:   service(svcPort("http", 80, target)),
				Slices:    tc.slices,
				Pods:      tc.pods,
				Nodes:     tc.nodes,
			})
			if len(r.Problems) != 0 {
				t.Fatalf("problems: %+v", r.Problems)
			}
			if got := seEndpoints(r); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("endpoints:\n got %q\nwant %q", got, tc.want)
			}
			if len(r.Endpoints) != len(r.ServiceEntry.Spec.Endpoints) {
				t.Errorf("%d endpoints in the result, %d in the ServiceEntry", len(r.Endpoints), len(r.ServiceEntry.Spec.Endpoints))
			}
		})
	}
}

func TestComputeHardwareClassFromNode(t *testing.T) {
	in := webInput()
	in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, readyEP("a", 1, "n1"), readyEP("b", 2, "n2"))}
	in.Nodes = nodeMap(node("n1", map[string]string{corev1.LabelInstanceTypeStable: "m5.large"}))
	r := Compute(in)
	if got := []string{r.Endpoints[0].HardwareClass, r.Endpoints[1].HardwareClass}; !reflect.DeepEqual(got, []string{"m5.large", ""}) {
		t.Errorf("hardware classes = %q", got)
	}
	if r.Endpoints[0].Node != "n1" || r.Endpoints[0].Pod != "a" {
		t.Errorf("endpoint = %+v", r.Endpoints[0])
	}
}

func TestComputeWeights(t *testing.T) {
	tests := map[string]struct {
		pods   []string          // ready pods web-<x> at ip(<index+1>)
		byPod  map[string]uint32 // from the weight engine
		byAddr map[string]uint32 // from the live ServiceEntry
		want   []uint32          // in pod order
	}{
		"nothing known: everyone starts at the default": {
			pods: []string{"a", "b", "c"},
			want: []uint32{DefaultWeight, DefaultWeight, DefaultWeight},
		},
		"engine weights by pod": {
			pods:  []string{"a", "b"},
			byPod: map[string]uint32{"a": 300, "b": 1700},
			want:  []uint32{300, 1700},
		},
		"engine weight beats the live weight": {
			pods:   []string{"a", "b"},
			byPod:  map[string]uint32{"a": 300},
			byAddr: map[string]uint32{ip(1): 999, ip(2): 400},
			want:   []uint32{300, 400},
		},
		"live weights by address keep the weights of staying pods": {
			pods:   []string{"a", "b", "c"},
			byAddr: map[string]uint32{ip(1): 500, ip(2): 1500, ip(3): 900},
			want:   []uint32{500, 1500, 900},
		},
		"a new pod gets the median of the known weights": {
			pods:   []string{"a", "b", "c", "new"},
			byAddr: map[string]uint32{ip(1): 500, ip(2): 1500, ip(3): 900},
			want:   []uint32{500, 1500, 900, 900},
		},
		"median of an even count is the upper middle": {
			pods:  []string{"a", "b", "c", "d", "new"},
			byPod: map[string]uint32{"a": 100, "b": 200, "c": 300, "d": 400},
			want:  []uint32{100, 200, 300, 400, 300},
		},
		"weights of pods that left do not count for the median": {
			pods:   []string{"a", "new"},
			byAddr: map[string]uint32{ip(1): 700, ip(9): 5000, ip(10): 6000},
			byPod:  map[string]uint32{"gone": 9000},
			want:   []uint32{700, 700},
		},
		"weight 0 is unknown, never written": {
			pods:   []string{"a", "b"},
			byPod:  map[string]uint32{"a": 0},
			byAddr: map[string]uint32{ip(1): 0, ip(2): 0},
			want:   []uint32{DefaultWeight, DefaultWeight},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var eps []ep
			for i, p := range tc.pods {
				eps = append(eps, readyEP(p, i+1, ""))
			}
			in := webInput()
			in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, eps...)}
			in.Weights, in.LiveWeights = tc.byPod, tc.byAddr
			r := Compute(in)
			got := map[string]uint32{}
			for _, e := range r.Endpoints {
				got[e.Pod] = e.Weight
			}
			for i, p := range tc.pods {
				if got[p] != tc.want[i] {
					t.Errorf("weight of %s = %d, want %d", p, got[p], tc.want[i])
				}
			}
			for _, we := range r.ServiceEntry.Spec.Endpoints {
				if we.Weight == 0 {
					t.Errorf("%s has weight 0 in the ServiceEntry", we.Address)
				}
			}
		})
	}
}

// A change of the endpoint set, fed the live ServiceEntry of the previous
// round as the controller does, keeps the weights of the pods that stay.
func TestComputeEndpointSetChangeKeepsWeights(t *testing.T) {
	in := webInput()
	in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, readyEP("a", 1, ""), readyEP("b", 2, ""), readyEP("c", 3, ""))}
	in.Weights = map[string]uint32{"a": 200, "b": 2000, "c": 800}
	first := Compute(in)

	in.Weights = nil // e.g. the manager restarted
	in.LiveWeights = LiveWeights(first.ServiceEntry)
	in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, readyEP("b", 2, ""), readyEP("c", 3, ""), readyEP("d", 4, ""))}
	second := Compute(in)
	got := map[string]uint32{}
	for _, e := range second.Endpoints {
		got[e.Pod] = e.Weight
	}
	// d gets the upper median of {2000, 800}.
	want := map[string]uint32{"b": 2000, "c": 800, "d": 2000}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("weights after scale = %v, want %v", got, want)
	}
}

func TestComputeWeightSumPerLocalityFitsUint32(t *testing.T) {
	in := webInput()
	var eps []ep
	weights := map[string]uint32{}
	for i := range 6 {
		name := fmt.Sprintf("p%d", i)
		eps = append(eps, ep{pod: name, addr: ip(i + 1), zone: []string{"a", "b"}[i%2]})
		weights[name] = math.MaxUint32 - uint32(i)
	}
	eps = append(eps, ep{pod: "small", addr: ip(50), zone: "a"})
	weights["small"] = 1
	in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, eps...)}
	in.Weights = weights
	r := Compute(in)
	sums := map[string]uint64{}
	for _, e := range r.Endpoints {
		if e.Weight == 0 {
			t.Errorf("%s has weight 0", e.Pod)
		}
		sums[e.Locality] += uint64(e.Weight)
	}
	for loc, s := range sums {
		if s > math.MaxUint32 {
			t.Errorf("weights of locality %q sum to %d, over Envoy's limit %d", loc, s, uint64(math.MaxUint32))
		}
	}
	// Scaling keeps the order of the weights.
	byPod := map[string]uint32{}
	for _, e := range r.Endpoints {
		byPod[e.Pod] = e.Weight
	}
	if !(byPod["p0"] >= byPod["p5"] && byPod["p5"] > byPod["small"]) {
		t.Errorf("scaled weights lost their order: %v", byPod)
	}
}

func TestComputeTooManyEndpoints(t *testing.T) {
	in := webInput()
	in.Slices = nil
	// 5 slices of at most 1000 endpoints, as the EndpointSlice controller makes them.
	n := 0
	for s := range 5 {
		var eps []ep
		for range 1000 {
			if n == MaxEndpoints+100 {
				break
			}
			eps = append(eps, ep{pod: fmt.Sprintf("web-%05d", n), addr: fmt.Sprintf("198.18.%d.%d", 10+n/250, n%250+1)})
			n++
		}
		in.Slices = append(in.Slices, slice(fmt.Sprintf("web-%d", s), map[string]int32{"http": 8080}, eps...))
	}
	r := Compute(in)
	// Routing only the first 4096 would leave 100 ready pods without mesh
	// traffic: nothing is written, traffic stays on the Kubernetes Service.
	if got := reasons(r.Problems); !reflect.DeepEqual(got, []string{ReasonTooManyEndpoints}) || !r.Problems[0].Fatal {
		t.Fatalf("problems = %+v, want one fatal TooManyEndpoints", r.Problems)
	}
	if msg := r.Problems[0].Message; !strings.Contains(msg, "4196") || !strings.Contains(msg, "4096") || !strings.Contains(msg, r.KubernetesHost) {
		t.Errorf("message %q does not give the count, the limit and the Service host", msg)
	}
	if r.ServiceEntry != nil || r.VirtualService != nil || r.DestinationRule != nil || r.Endpoints != nil {
		t.Errorf("objects computed for a partial endpoint set")
	}

	// Exactly at the limit everything is routed.
	in.Slices = in.Slices[:4]
	in.Slices = append(in.Slices, slice("web-4", map[string]int32{"http": 8080}))
	for i := 4000; i < MaxEndpoints; i++ {
		in.Slices[4].Endpoints = append(in.Slices[4].Endpoints, slice("x", nil, ep{pod: fmt.Sprintf("web-%05d", i), addr: fmt.Sprintf("198.18.%d.%d", 10+i/250, i%250+1)}).Endpoints...)
	}
	r = Compute(in)
	if len(r.Problems) != 0 || len(r.ServiceEntry.Spec.Endpoints) != MaxEndpoints {
		t.Errorf("at the limit: problems %+v, %d endpoints", r.Problems, len(r.Endpoints))
	}
}

// A dual-stack Service has one EndpointSlice per family for the same pods;
// each pod is routed once, by its address in the Service's primary family.
func TestComputeDualStackRoutesEachPodOnce(t *testing.T) {
	v6 := func(s discoveryv1.EndpointSlice, addrs ...string) discoveryv1.EndpointSlice {
		s.AddressType = discoveryv1.AddressTypeIPv6
		for i := range s.Endpoints {
			s.Endpoints[i].Addresses = []string{addrs[i]}
		}
		return s
	}
	ports := map[string]int32{"http": 8080}
	v4Slice := slice("web-v4", ports, readyEP("web-0", 1, ""), readyEP("web-1", 2, ""))
	v6Slice := v6(slice("web-v6", ports, readyEP("web-0", 1, ""), readyEP("web-1", 2, "")), "fd00::1", "fd00::2")
	fqdn := slice("web-fqdn", ports, ep{pod: "ext", addr: "ext.example.com"})
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	tests := map[string]struct {
		families []corev1.IPFamily
		slices   []discoveryv1.EndpointSlice
		want     []string // addresses routed
	}{
		"IPv4 primary":                       {families: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, slices: []discoveryv1.EndpointSlice{v4Slice, v6Slice}, want: []string{ip(1), ip(2)}},
		"IPv6 primary":                       {families: []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol}, slices: []discoveryv1.EndpointSlice{v4Slice, v6Slice}, want: []string{"fd00::1", "fd00::2"}},
		"unset families mean IPv4":           {slices: []discoveryv1.EndpointSlice{v6Slice, v4Slice}, want: []string{ip(1), ip(2)}},
		"IPv6 single stack":                  {families: []corev1.IPFamily{corev1.IPv6Protocol}, slices: []discoveryv1.EndpointSlice{v6Slice}, want: []string{"fd00::1", "fd00::2"}},
		"FQDN slices are never routed":       {families: []corev1.IPFamily{corev1.IPv4Protocol}, slices: []discoveryv1.EndpointSlice{fqdn, v4Slice}, want: []string{ip(1), ip(2)}},
		"only the secondary family's slices": {families: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}, slices: []discoveryv1.EndpointSlice{v6Slice}, want: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := webInput()
			in.Service.Spec.IPFamilies = tc.families
			in.Slices = tc.slices
			r := Compute(in)
			var got []string
			for _, e := range r.Endpoints {
				got = append(got, e.Address)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("routed %v, want %v", got, tc.want)
			}
		})
	}
}

func TestComputeRoutingObjects(t *testing.T) {
	threePorts := service(
		svcPort("http", 80, intstr.FromInt32(8080)),
		svcPort("grpc-api", 9090, intstr.FromInt32(9090)),
		svcPort("db", 5432, intstr.FromInt32(5432)),
	)
	tests := map[string]struct {
		opt        *optv1.IstioAdaptiveRequestOptimizer
		host       string // optimized host
		kubeHost   string // host of the VirtualService
		namespace  string // of the owned objects
		locality   bool
		noVS       bool
		httpRoutes []string // "name port -> host:port"
		tcpRoutes  []string
	}{
		"defaults": {
			opt:        optimizer(),
			host:       "web.shop.adaptive",
			kubeHost:   "web.shop.svc.cluster.local",
			namespace:  "shop",
			httpRoutes: []string{"http-80 80 -> web.shop.adaptive:80", "grpc-9090 9090 -> web.shop.adaptive:9090", "auto-5432 5432 -> web.shop.adaptive:5432"},
			tcpRoutes:  []string{"5432 -> web.shop.adaptive:5432"},
		},
		"routing_mode none writes no VirtualService": {
			opt:       optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = optv1.RoutingNone }),
			host:      "web.shop.adaptive",
			namespace: "shop",
			noVS:      true,
		},
		"explicit routing_mode virtual_service": {
			opt:        optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.RoutingMode = optv1.RoutingVirtualService }, withPorts(optv1.ServicePort{Number: 5432})),
			host:       "web.shop.adaptive",
			kubeHost:   "web.shop.svc.cluster.local",
			namespace:  "shop",
			httpRoutes: []string{"auto-5432 5432 -> web.shop.adaptive:5432"},
			tcpRoutes:  []string{"5432 -> web.shop.adaptive:5432"},
		},
		"locality_enabled adds locality load balancing and outlier detection": {
			opt:        optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.LocalityEnabled = true }, withPorts(optv1.ServicePort{Number: 80})),
			host:       "web.shop.adaptive",
			kubeHost:   "web.shop.svc.cluster.local",
			namespace:  "shop",
			locality:   true,
			httpRoutes: []string{"http-80 80 -> web.shop.adaptive:80"},
		},
		"host override": {
			opt:        optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Spec.Host = "web.fast.internal" }, withPorts(optv1.ServicePort{Number: 9090})),
			host:       "web.fast.internal",
			kubeHost:   "web.shop.svc.cluster.local",
			namespace:  "shop",
			httpRoutes: []string{"grpc-9090 9090 -> web.fast.internal:9090"},
		},
		"service_namespace puts the objects next to the Service": {
			opt: optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) {
				o.Namespace = "platform"
				o.Spec.ServiceNamespace = "shop"
			}, withPorts(optv1.ServicePort{Number: 80, Protocol: optv1.ProtocolTCP})),
			host:      "web.shop.adaptive",
			kubeHost:  "web.shop.svc.cluster.local",
			namespace: "shop",
			// The Service port is named http, so the client's listener is
			// HTTP whatever the optimizer says: only an http route moves it.
			httpRoutes: []string{"tcp-80 80 -> web.shop.adaptive:80"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// Learned weights: the default policy is then ROUND_ROBIN (before,
			// LEAST_REQUEST; see TestLoadBalancer).
			r := Compute(Input{Optimizer: tc.opt, Service: threePorts, WeightsLearned: true,
				Slices: []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080, "grpc-api": 9090, "db": 5432}, readyEP("a", 1, ""))}})
			if len(r.Problems) != 0 {
				t.Fatalf("problems: %+v", r.Problems)
			}
			if r.Host != tc.host || r.Namespace != tc.namespace || r.Name != "web-adaptive" {
				t.Errorf("host %s namespace %s name %s", r.Host, r.Namespace, r.Name)
			}
			wantLabels := map[string]string{LabelManagedBy: ManagedByValue, LabelOptimizerName: tc.opt.Name, LabelOptimizerNamespace: tc.opt.Namespace}
			se, dr := r.ServiceEntry, r.DestinationRule
			for _, obj := range []metav1.Object{se, dr} {
				if obj.GetNamespace() != tc.namespace || obj.GetName() != "web-adaptive" || !reflect.DeepEqual(obj.GetLabels(), wantLabels) {
					t.Errorf("%T %s/%s labels %v", obj, obj.GetNamespace(), obj.GetName(), obj.GetLabels())
				}
			}
			if !slices.Equal(se.Spec.Hosts, []string{tc.host}) || se.Spec.Location != networking.ServiceEntry_MESH_INTERNAL || se.Spec.Resolution != networking.ServiceEntry_STATIC {
				t.Errorf("ServiceEntry hosts %v location %v resolution %v", se.Spec.Hosts, se.Spec.Location, se.Spec.Resolution)
			}
			if se.Kind != "ServiceEntry" || se.APIVersion != "networking.istio.io/v1alpha3" || dr.Kind != "DestinationRule" {
				t.Errorf("type meta %v %v", se.TypeMeta, dr.TypeMeta)
			}

			if dr.Spec.Host != tc.host {
				t.Errorf("DestinationRule host %s", dr.Spec.Host)
			}
			lb := dr.Spec.GetTrafficPolicy().GetLoadBalancer()
			if lb.GetSimple() != networking.LoadBalancerSettings_ROUND_ROBIN {
				t.Errorf("load balancer %v, want ROUND_ROBIN", lb)
			}
			od := dr.Spec.GetTrafficPolicy().GetOutlierDetection()
			if tc.locality {
				if !lb.GetLocalityLbSetting().GetEnabled().GetValue() {
					t.Errorf("localityLbSetting not enabled: %v", lb.GetLocalityLbSetting())
				}
				if od == nil || od.GetConsecutive_5XxErrors().GetValue() == 0 || od.GetInterval().AsDuration() <= 0 || od.GetBaseEjectionTime().AsDuration() <= 0 {
					t.Errorf("outlier detection %v: locality failover needs it", od)
				}
			} else if lb.GetLocalityLbSetting() != nil || od != nil {
				t.Errorf("locality settings without locality_enabled: %v %v", lb.GetLocalityLbSetting(), od)
			}

			vs := r.VirtualService
			if tc.noVS {
				if vs != nil {
					t.Fatalf("VirtualService with routing_mode none: %v", vs)
				}
				return
			}
			if vs == nil {
				t.Fatal("no VirtualService")
			}
			if vs.Namespace != tc.namespace || vs.Name != "web-adaptive" || !reflect.DeepEqual(vs.Labels, wantLabels) || len(vs.Spec.Gateways) != 0 {
				t.Errorf("VirtualService %s/%s labels %v gateways %v", vs.Namespace, vs.Name, vs.Labels, vs.Spec.Gateways)
			}
			if !slices.Equal(vs.Spec.Hosts, []string{tc.kubeHost}) || r.KubernetesHost != tc.kubeHost {
				t.Errorf("VirtualService hosts %v (KubernetesHost %s), want %s", vs.Spec.Hosts, r.KubernetesHost, tc.kubeHost)
			}
			// Routes to the optimized host are compared with the case; every
			// other Service port must keep a route to the Kubernetes host
			// itself, because the VirtualService takes over the whole host.
			var httpRoutes, tcpRoutes []string
			routed := map[uint32]bool{}
			passed := map[string]bool{}
			passThrough := func(kind string, port uint32, d *networking.Destination) {
				key := fmt.Sprint(kind, port)
				if d.Port.GetNumber() != port || passed[key] {
					t.Errorf("pass-through %s route for port %d goes to port %d (or twice)", kind, port, d.Port.GetNumber())
				}
				passed[key], routed[port] = true, true
			}
			for _, h := range vs.Spec.Http {
				if len(h.Match) != 1 || len(h.Route) != 1 {
					t.Fatalf("http route %v", h)
				}
				d := h.Route[0].Destination
				if d.Host == tc.kubeHost {
					passThrough("http", h.Match[0].Port, d)
					continue
				}
				routed[h.Match[0].Port] = true
				httpRoutes = append(httpRoutes, fmt.Sprintf("%s %d -> %s:%d", h.Name, h.Match[0].Port, d.Host, d.Port.GetNumber()))
			}
			for _, tr := range vs.Spec.Tcp {
				if len(tr.Match) != 1 || len(tr.Route) != 1 {
					t.Fatalf("tcp route %v", tr)
				}
				d := tr.Route[0].Destination
				if d.Host == tc.kubeHost {
					passThrough("tcp", tr.Match[0].Port, d)
					continue
				}
				routed[tr.Match[0].Port] = true
				tcpRoutes = append(tcpRoutes, fmt.Sprintf("%d -> %s:%d", tr.Match[0].Port, d.Host, d.Port.GetNumber()))
			}
			for _, sp := range threePorts.Spec.Ports {
				if sp.Protocol != corev1.ProtocolUDP && sp.Protocol != corev1.ProtocolSCTP && !routed[uint32(sp.Port)] {
					t.Errorf("Service port %d has no route in the VirtualService", sp.Port)
				}
			}
			if !slices.Equal(httpRoutes, tc.httpRoutes) || !slices.Equal(tcpRoutes, tc.tcpRoutes) {
				t.Errorf("routes http %q tcp %q, want http %q tcp %q", httpRoutes, tcpRoutes, tc.httpRoutes, tc.tcpRoutes)
			}
		})
	}
}

func TestComputeClusterDomain(t *testing.T) {
	in := webInput()
	in.ClusterDomain = "corp.example"
	r := Compute(in)
	if r.KubernetesHost != "web.shop.svc.corp.example" || r.VirtualService.Spec.Hosts[0] != "web.shop.svc.corp.example" {
		t.Errorf("Kubernetes host %s, VirtualService hosts %v", r.KubernetesHost, r.VirtualService.Spec.Hosts)
	}
}

func TestComputeDoesNotModifyItsInput(t *testing.T) {
	in := webInput()
	in.Slices = append(in.Slices, slice("a-first", map[string]int32{"http": 8080}, readyEP("web-9", 9, "")))
	in.Weights = map[string]uint32{"web-0": 5}
	in.LiveWeights = map[string]uint32{ip(2): 7}
	before := []discoveryv1.EndpointSlice{*in.Slices[0].DeepCopy(), *in.Slices[1].DeepCopy()}
	svc := in.Service.DeepCopy()
	opt := in.Optimizer.DeepCopy()
	Compute(in)
	if !reflect.DeepEqual(before, in.Slices) || !reflect.DeepEqual(svc, in.Service) || !reflect.DeepEqual(opt, in.Optimizer) {
		t.Error("Compute modified its input")
	}
	if !reflect.DeepEqual(in.Weights, map[string]uint32{"web-0": 5}) || !reflect.DeepEqual(in.LiveWeights, map[string]uint32{ip(2): 7}) {
		t.Error("Compute modified the weight maps")
	}
}

func TestOwnership(t *testing.T) {
	opt := optimizer()
	r := Compute(Input{Optimizer: opt, Service: service(svcPort("http", 80, intstr.FromInt32(80)))})
	if !IsOwnedBy(r.ServiceEntry, opt) {
		t.Error("own ServiceEntry not recognised")
	}
	other := optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Name = "other" })
	if IsOwnedBy(r.ServiceEntry, other) {
		t.Error("ServiceEntry of another optimizer recognised as own")
	}
	otherNS := optimizer(func(o *optv1.IstioAdaptiveRequestOptimizer) { o.Namespace = "elsewhere" })
	if IsOwnedBy(r.ServiceEntry, otherNS) {
		t.Error("ServiceEntry of a same-named optimizer in another namespace recognised as own")
	}
	user := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelOptimizerName: opt.Name, LabelOptimizerNamespace: opt.Namespace}}}
	if IsOwnedBy(user, opt) {
		t.Error("object without the managed-by label recognised as own")
	}
}

func vsWith(namespace string, hosts []string, gateways ...string) *istionet.VirtualService {
	vs := &istionet.VirtualService{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "user"}}
	vs.Spec.Hosts = hosts
	vs.Spec.Gateways = gateways
	return vs
}

func TestServesHost(t *testing.T) {
	tests := map[string]struct {
		vs   *istionet.VirtualService
		want bool
	}{
		"FQDN":                             {vs: vsWith("other", []string{"web.shop.svc.cluster.local"}), want: true},
		"FQDN in upper case":               {vs: vsWith("other", []string{"WEB.shop.svc.cluster.local"}), want: true},
		"short name in the same namespace": {vs: vsWith("shop", []string{"web"}), want: true},
		"short name in another namespace":  {vs: vsWith("other", []string{"web"}), want: false},
		"name.namespace":                   {vs: vsWith("other", []string{"web.shop"}), want: true},
		"name.namespace.svc":               {vs: vsWith("other", []string{"web.shop.svc"}), want: true},
		"another Service":                  {vs: vsWith("shop", []string{"api", "api.shop.svc.cluster.local"}), want: false},
		"same name in another namespace":   {vs: vsWith("shop", []string{"web.other.svc.cluster.local"}), want: false},
		"one of several hosts":             {vs: vsWith("shop", []string{"api", "web.shop"}), want: true},
		"other cluster domain":             {vs: vsWith("shop", []string{"web.shop.svc.corp.example"}), want: false},
		"optimized host":                   {vs: vsWith("shop", []string{"web.shop.adaptive"}), want: false},
		"wildcard":                         {vs: vsWith("shop", []string{"*.shop.svc.cluster.local"}), want: false},
		"catch-all wildcard":               {vs: vsWith("shop", []string{"*"}), want: false},
		"gateway only":                     {vs: vsWith("shop", []string{"web"}, "istio-system/ingress"), want: false},
		"gateway and mesh":                 {vs: vsWith("shop", []string{"web"}, "istio-system/ingress", "mesh"), want: true},
		"mesh only":                        {vs: vsWith("shop", []string{"web.shop.svc.cluster.local"}, "mesh"), want: true},
		"no hosts":                         {vs: vsWith("shop", nil), want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := ServesHost(tc.vs, "web", "shop", ""); got != tc.want {
				t.Errorf("ServesHost(%v, gateways %v) = %v, want %v", tc.vs.Spec.Hosts, tc.vs.Spec.Gateways, got, tc.want)
			}
		})
	}
	if !ServesHost(vsWith("x", []string{"web.shop.svc.corp.example"}), "web", "shop", "corp.example") {
		t.Error("custom cluster domain not honoured")
	}
}

func TestUpToDate(t *testing.T) {
	want := Compute(webInput())
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "X", Name: "web-opt", UID: "opt-uid"}
	desiredSE := want.ServiceEntry.DeepCopy()
	desiredSE.OwnerReferences = []metav1.OwnerReference{owner}
	liveOf := func(mutate func(*istionet.ServiceEntry)) *istionet.ServiceEntry {
		l := desiredSE.DeepCopy()
		l.ResourceVersion = "42"
		l.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "istio-adaptive-optimizer"}}
		mutate(l)
		return l
	}
	tests := map[string]struct {
		live *istionet.ServiceEntry
		want bool
	}{
		"identical": {live: liveOf(func(*istionet.ServiceEntry) {}), want: true},
		"labels and annotations added by others": {live: liveOf(func(l *istionet.ServiceEntry) {
			l.Labels = map[string]string{"team": "x", LabelManagedBy: ManagedByValue, LabelOptimizerName: "web-opt", LabelOptimizerNamespace: "shop"}
			l.Annotations = map[string]string{"note": "y"}
		}), want: true},
		"extra owner": {live: liveOf(func(l *istionet.ServiceEntry) {
			l.OwnerReferences = append(l.OwnerReferences, metav1.OwnerReference{UID: "someone"})
		}), want: true},
		"missing owner":  {live: liveOf(func(l *istionet.ServiceEntry) { l.OwnerReferences = nil }), want: false},
		"label changed":  {live: liveOf(func(l *istionet.ServiceEntry) { l.Labels = map[string]string{LabelManagedBy: ManagedByValue} }), want: false},
		"weight changed": {live: liveOf(func(l *istionet.ServiceEntry) { l.Spec.Endpoints[0].Weight = 7 }), want: false},
		"hosts changed":  {live: liveOf(func(l *istionet.ServiceEntry) { l.Spec.Hosts = []string{"evil.example"} }), want: false},
		"endpoint gone":  {live: liveOf(func(l *istionet.ServiceEntry) { l.Spec.Endpoints = l.Spec.Endpoints[:1] }), want: false},
		"field added to the spec by someone else": {live: liveOf(func(l *istionet.ServiceEntry) { l.Spec.ExportTo = []string{"."} }), want: false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := UpToDate("istio-adaptive-optimizer", desiredSE, tc.live, &desiredSE.Spec, &tc.live.Spec); got != tc.want {
				t.Errorf("UpToDate = %v, want %v", got, tc.want)
			}
		})
	}
	if UpToDate("istio-adaptive-optimizer", desiredSE, nil, &desiredSE.Spec, nil) {
		t.Error("UpToDate with no live object")
	}
	// Objects without owners (another namespace) ignore live owners.
	noOwner := want.DestinationRule.DeepCopy()
	live := noOwner.DeepCopy()
	live.OwnerReferences = []metav1.OwnerReference{owner}
	if !UpToDate("istio-adaptive-optimizer", noOwner, live, &noOwner.Spec, &live.Spec) {
		t.Error("desired object without owners is not up to date with an owned live copy")
	}
}

func TestLiveWeights(t *testing.T) {
	if LiveWeights(nil) != nil {
		t.Error("LiveWeights(nil) != nil")
	}
	se := &istionet.ServiceEntry{}
	se.Spec.Endpoints = []*networking.WorkloadEntry{{Address: ip(1), Weight: 5}, {Address: ip(2)}, nil, {Address: ip(3), Weight: 9}}
	if got, want := LiveWeights(se), map[string]uint32{ip(1): 5, ip(3): 9}; !reflect.DeepEqual(got, want) {
		t.Errorf("LiveWeights = %v, want %v", got, want)
	}
}

func TestNamesAndHosts(t *testing.T) {
	if got := ObjectName("web"); got != "web-adaptive" {
		t.Errorf("ObjectName = %s", got)
	}
	if got := KubernetesHost("web", "shop", ""); got != "web.shop.svc.cluster.local" {
		t.Errorf("KubernetesHost = %s", got)
	}
	// The ServiceEntry is on a host of its own, never the Kubernetes host
	// (the Service would shadow it and every pod would be sent twice).
	r := Compute(webInput())
	if r.ServiceEntry.Spec.Hosts[0] == r.KubernetesHost {
		t.Errorf("ServiceEntry on the Kubernetes host %s", r.KubernetesHost)
	}
}

// fuzzReader turns fuzz bytes into choices; it returns zeros when exhausted.
type fuzzReader struct{ b []byte }

func (r *fuzzReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzReader) intn(n int) int { return int(r.byte()) % n }

func (r *fuzzReader) u32() uint32 {
	return uint32(r.byte()) | uint32(r.byte())<<8 | uint32(r.byte())<<16 | uint32(r.byte())<<24
}

func (r *fuzzReader) pick(options ...string) string { return options[r.intn(len(options))] }

func (r *fuzzReader) boolPtr() *bool {
	switch r.intn(3) {
	case 0:
		return nil
	case 1:
		return ptr.To(true)
	}
	return ptr.To(false)
}

// fuzzInput builds an arbitrary but API-shaped Input: slice names are
// unique (they are in one namespace), everything else may repeat.
func fuzzInput(data []byte) Input {
	r := &fuzzReader{b: data}
	portNumbers := []int32{53, 80, 443, 8080, 9090, 1, 65535}
	names := []string{"", "http", "http-web", "http2-x", "grpc", "grpc-web", "tcp-db", "https", "mongo", "HTTP-Upper"}
	in := Input{Optimizer: optimizer(), Pods: map[string]*corev1.Pod{}, Nodes: map[string]*corev1.Node{}}
	if r.intn(8) == 0 {
		in.Optimizer.Spec.LocalityEnabled = true
	}
	if r.intn(8) == 0 {
		in.Optimizer.Spec.RoutingMode = optv1.RoutingNone
	}
	if r.intn(16) != 0 {
		in.Service = service()
		if r.intn(16) == 0 {
			in.Service.Spec.Type = corev1.ServiceTypeExternalName
		}
		for range r.intn(6) {
			sp := corev1.ServicePort{Name: r.pick(names...), Port: portNumbers[r.intn(len(portNumbers))],
				Protocol: []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP, ""}[r.intn(5)]}
			switch r.intn(3) {
			case 0:
				sp.TargetPort = intstr.FromInt32(int32(r.intn(4) * 1000))
			case 1:
				sp.TargetPort = intstr.FromString(r.pick("web", "admin", "metrics"))
			}
			if r.intn(4) == 0 {
				sp.AppProtocol = ptr.To(r.pick("http", "grpc", "kubernetes.io/h2c", "tcp", "weird"))
			}
			in.Service.Spec.Ports = append(in.Service.Spec.Ports, sp)
		}
	}
	for range r.intn(4) {
		p := optv1.ServicePort{Number: portNumbers[r.intn(len(portNumbers))], Protocol: []optv1.Protocol{"", optv1.ProtocolHTTP, optv1.ProtocolGRPC, optv1.ProtocolTCP}[r.intn(4)]}
		switch r.intn(4) {
		case 0:
			p.TargetPort = ptr.To(intstr.FromInt32(int32(r.intn(3)*1000 + 1)))
		case 1:
			p.TargetPort = ptr.To(intstr.FromString(r.pick("web", "admin")))
		}
		in.Optimizer.Spec.ServicePorts = append(in.Optimizer.Spec.ServicePorts, p)
	}
	nodes := []string{"n0", "n1", "n2", ""}
	for _, n := range nodes[:3] {
		if r.intn(2) == 0 {
			in.Nodes[n] = node(n, map[string]string{labelRegion: r.pick("", "eu"), labelZone: r.pick("", "a", "b"), labelSubzone: r.pick("", "r1")})
		}
	}
	podNames := []string{"p0", "p1", "p2", "p3", "p4", "p5"}
	for _, p := range podNames {
		if r.intn(2) == 0 {
			opts := []podOpt{serviceAccount(r.pick("", "sa")), onNode(nodes[r.intn(len(nodes))])}
			switch r.intn(4) {
			case 0:
				opts = append(opts, sidecarContainer)
			case 1:
				opts = append(opts, nativeSidecar)
			case 2:
				opts = append(opts, sidecarAnnotation)
			}
			if r.intn(2) == 0 {
				opts = append(opts, containerPort(r.pick("web", "admin"), int32(r.intn(3)+8080)))
			}
			in.Pods[p] = pod(p, opts...)
		}
	}
	for s := range r.intn(5) {
		sl := slice(fmt.Sprintf("s%d", s), nil)
		if r.intn(10) == 0 {
			sl.AddressType = discoveryv1.AddressTypeFQDN
		}
		for range r.intn(3) {
			sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: ptr.To(r.pick(names...)), Port: ptr.To(int32(r.intn(3) + 8080))})
		}
		count := r.intn(8)
		if r.intn(32) == 0 {
			count = 1000 + r.intn(8)*100 // exercise the ServiceEntry limit
		}
		for i := range count {
			e := discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: r.boolPtr(), Terminating: r.boolPtr()}}
			if count > 100 {
				e.Addresses = []string{fmt.Sprintf("198.19.%d.%d", s*10+i/250, i%250)}
				e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Name: fmt.Sprintf("bulk-%d-%d", s, i)}
			} else {
				if r.intn(10) != 0 {
					e.Addresses = []string{ip(r.intn(10))}
				}
				if r.intn(6) != 0 {
					e.TargetRef = &corev1.ObjectReference{Kind: r.pick("Pod", "Pod", "Pod", "Node"), Name: podNames[r.intn(len(podNames))]}
				}
				if n := nodes[r.intn(len(nodes))]; n != "" {
					e.NodeName = ptr.To(n)
				}
				if r.intn(3) == 0 {
					e.Zone = ptr.To(r.pick("a", "b", "c"))
				}
			}
			sl.Endpoints = append(sl.Endpoints, e)
		}
		in.Slices = append(in.Slices, sl)
	}
	if r.intn(2) == 0 {
		in.Weights = map[string]uint32{}
		for _, p := range podNames {
			if r.intn(2) == 0 {
				in.Weights[p] = r.u32() >> (r.intn(4) * 8)
			}
		}
	}
	if r.intn(2) == 0 {
		in.LiveWeights = map[string]uint32{}
		for i := range 10 {
			if r.intn(2) == 0 {
				in.LiveWeights[ip(i)] = r.u32() >> (r.intn(4) * 8)
			}
		}
	}
	// Stalls that leave the pods readable, and one that does not.
	switch r.intn(8) {
	case 1:
		in.Mesh.DestinationRules = []*istionet.DestinationRule{userDR("web-dr", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), func(d *istionet.DestinationRule) {
			d.Spec.Subsets = []*networking.Subset{{Name: "v1"}}
		})}
	case 2:
		if in.Service != nil {
			in.Service.Annotations = map[string]string{AnnotationExportTo: "~"}
		}
	case 3:
		in.Mesh.MultiCluster.RemoteClusters = []string{"east"}
	}
	return in
}

// permuted returns the same input with the slices and the endpoints of
// each slice in another order; seed picks the order.
func permuted(in Input, seed byte) Input {
	out := in
	out.Slices = make([]discoveryv1.EndpointSlice, len(in.Slices))
	for i := range in.Slices {
		s := in.Slices[i].DeepCopy()
		rotate(s.Endpoints, int(seed))
		slices.Reverse(s.Endpoints)
		out.Slices[i] = *s
	}
	rotate(out.Slices, int(seed)/3)
	slices.Reverse(out.Slices)
	return out
}

func rotate[T any](s []T, k int) {
	if len(s) == 0 {
		return
	}
	k %= len(s)
	slices.Reverse(s[:k])
	slices.Reverse(s[k:])
	slices.Reverse(s)
}

// readyAddresses counts, independently of Compute, the distinct addresses
// of ready endpoints.
func readyAddresses(in Input) int {
	seen := map[string]bool{}
	for _, s := range in.Slices {
		if s.AddressType != PrimaryAddressType(in.Service) {
			continue
		}
		for _, e := range s.Endpoints {
			ready := e.Conditions.Ready == nil || *e.Conditions.Ready
			if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
				ready = false
			}
			if ready && len(e.Addresses) > 0 {
				seen[e.Addresses[0]] = true
			}
		}
	}
	return len(seen)
}

func FuzzCompute(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x01\x00\x01\x03\x01\x02\x00\x00\x01\x05\x02\x01\x00\x07\x03"))
	f.Add([]byte{3, 1, 1, 5, 1, 1, 0, 0, 2, 1, 3, 2, 0, 0, 0, 4, 1, 2, 7, 0, 0, 1, 0, 3, 6, 1, 1, 1, 2, 2, 0, 9, 9, 9, 9, 0, 0})
	f.Add([]byte(strings.Repeat("\x02\x01\x04\x00\x03\x01\x00\x05", 40)))
	f.Add([]byte(strings.Repeat("\xff\x10\x20\x00\x7f", 60)))
	// Long pseudo-random inputs reach many slices, endpoints and pods at once.
	x := uint32(1)
	for range 8 {
		data := make([]byte, 512)
		for i := range data {
			x = x*1664525 + 1013904223
			data[i] = byte(x >> 24)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzInput(data)
		r := Compute(in)

		fatal := hasFatal(r.Problems)
		if fatal != (r.ServiceEntry == nil) || fatal != (r.DestinationRule == nil) {
			t.Fatalf("fatal %v but ServiceEntry %v DestinationRule %v", fatal, r.ServiceEntry != nil, r.DestinationRule != nil)
		}
		// A stall keeps the pods' endpoints only where they are all there
		// and the ServiceEntry could hold them: every one is a ready pod's,
		// with a weight, over ports that exist.
		if len(r.StalledEndpoints) > 0 {
			rs := reasons(r.Problems)
			if !fatal || slices.Contains(rs, ReasonTooManyEndpoints) || slices.Contains(rs, ReasonMultiCluster) || len(r.Ports) == 0 {
				t.Fatalf("stalled endpoints with problems %v and %d ports", rs, len(r.Ports))
			}
			if len(r.StalledEndpoints) != len(r.Endpoints) {
				t.Fatalf("%d stalled endpoints for %d ready pods", len(r.StalledEndpoints), len(r.Endpoints))
			}
			names := map[string]bool{}
			for _, p := range r.Ports {
				names[p.Name] = true
			}
			for i, we := range r.StalledEndpoints {
				if we.Address != r.Endpoints[i].Address || we.Weight < 1 {
					t.Fatalf("stalled endpoint %d: %s weight %d, pod %s", i, we.Address, we.Weight, r.Endpoints[i].Address)
				}
				for name := range we.Ports {
					if !names[name] {
						t.Fatalf("stalled endpoint %s overrides unknown port %s", we.Address, name)
					}
				}
			}
		}
		if fatal {
			return
		}
		if (r.VirtualService == nil) != (in.Optimizer.Routing() == optv1.RoutingNone) {
			t.Fatalf("VirtualService %v with routing mode %s", r.VirtualService != nil, in.Optimizer.Routing())
		}
		if want := readyAddresses(in); len(r.Endpoints) != min(want, MaxEndpoints) {
			t.Fatalf("%d endpoints for %d ready addresses", len(r.Endpoints), want)
		} else if tooMany := slices.Contains(reasons(r.Problems), "TooManyEndpoints"); tooMany != (want > MaxEndpoints) {
			t.Fatalf("TooManyEndpoints problem %v with %d ready addresses", tooMany, want)
		}
		addrs := map[string]bool{}
		sums := map[string]uint64{}
		for i, e := range r.Endpoints {
			if addrs[e.Address] {
				t.Fatalf("address %s routed twice", e.Address)
			}
			addrs[e.Address] = true
			if i > 0 {
				p := r.Endpoints[i-1]
				if p.Pod > e.Pod || (p.Pod == e.Pod && p.Address >= e.Address) {
					t.Fatalf("endpoints not sorted: %s/%s before %s/%s", p.Pod, p.Address, e.Pod, e.Address)
				}
			}
			if e.Weight < 1 {
				t.Fatalf("%s has weight %d", e.Pod, e.Weight)
			}
			sums[e.Locality] += uint64(e.Weight)
		}
		for loc, s := range sums {
			if s > math.MaxUint32 {
				t.Fatalf("weights of locality %q sum to %d", loc, s)
			}
		}
		se := &r.ServiceEntry.Spec
		if len(se.Endpoints) != len(r.Endpoints) {
			t.Fatalf("%d ServiceEntry endpoints, %d computed", len(se.Endpoints), len(r.Endpoints))
		}
		numbers, names := map[uint32]bool{}, map[string]bool{}
		for _, p := range se.Ports {
			if numbers[p.Number] || names[p.Name] {
				t.Fatalf("duplicate ServiceEntry port %d %s in %v", p.Number, p.Name, se.Ports)
			}
			numbers[p.Number], names[p.Name] = true, true
			if p.Number < 1 || p.Number > 65535 || p.TargetPort > 65535 {
				t.Fatalf("port out of range: %v", p)
			}
			if !slices.Contains([]string{"HTTP", "HTTP2", "GRPC", "GRPC-Web", "HTTPS", "TLS", "TCP", "Mongo", "Redis", "MySQL", ""}, p.Protocol) {
				t.Fatalf("protocol %q", p.Protocol)
			}
		}
		for _, we := range se.Endpoints {
			for name := range we.Ports {
				if !names[name] {
					t.Fatalf("endpoint %s overrides unknown port %s", we.Address, name)
				}
			}
		}

		// The order the API server lists slices and endpoints in does not matter.
		seed := byte(len(data))
		if len(data) > 0 {
			seed ^= data[len(data)-1]
		}
		again := Compute(permuted(in, seed))
		if !reflect.DeepEqual(r.Endpoints, again.Endpoints) {
			t.Fatalf("endpoints depend on input order:\n%+v\n%+v", r.Endpoints, again.Endpoints)
		}
		if !reflect.DeepEqual(r.Ports, again.Ports) || !reflect.DeepEqual(r.Problems, again.Problems) {
			t.Fatalf("ports or problems depend on input order:\n%+v %+v\n%+v %+v", r.Ports, r.Problems, again.Ports, again.Problems)
		}
		if !proto.Equal(&r.ServiceEntry.Spec, &again.ServiceEntry.Spec) || !proto.Equal(&r.DestinationRule.Spec, &again.DestinationRule.Spec) {
			t.Fatal("ServiceEntry or DestinationRule depends on input order")
		}
		if r.VirtualService != nil && !proto.Equal(&r.VirtualService.Spec, &again.VirtualService.Spec) {
			t.Fatal("VirtualService depends on input order")
		}
	})
}

// The same address listed twice (an endpoint moving between slices, or a
// repeated entry) is routed once, and which copy wins does not depend on
// the order the API server lists them in.
func TestComputeDuplicateAddressIndependentOfOrder(t *testing.T) {
	first := ep{pod: "a", addr: ip(1), zone: "eu-west-a"}
	second := ep{pod: "a", addr: ip(1), zone: "eu-west-b"}
	in := webInput()
	in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, first, second)}
	one := Compute(in)
	in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, second, first)}
	other := Compute(in)
	if len(one.Endpoints) != 1 || !reflect.DeepEqual(one.Endpoints, other.Endpoints) {
		t.Errorf("endpoints depend on order: %+v vs %+v", one.Endpoints, other.Endpoints)
	}

	// Among other endpoints, found only after some were taken (a slice is
	// read as listed until it repeats an address), and across slices.
	x, y := readyEP("x", 2, "n1"), readyEP("y", 3, "n2")
	in.Slices = []discoveryv1.EndpointSlice{slice("s1", map[string]int32{"http": 8080}, x, first, y, second), slice("s2", map[string]int32{"http": 8080}, readyEP("z", 3, "n3"))}
	one = Compute(in)
	in.Slices = []discoveryv1.EndpointSlice{slice("s2", map[string]int32{"http": 8080}, readyEP("z", 3, "n3")), slice("s1", map[string]int32{"http": 8080}, second, y, x, first)}
	other = Compute(in)
	if len(one.Endpoints) != 3 || !reflect.DeepEqual(one.Endpoints, other.Endpoints) {
		t.Errorf("endpoints depend on order: %+v vs %+v", one.Endpoints, other.Endpoints)
	}
	for _, e := range one.Endpoints {
		if e.Address == ip(3) && e.Pod != "y" {
			t.Errorf("address %s from %s; the first slice by name (s1, pod y) holds it", e.Address, e.Pod)
		}
	}
}
