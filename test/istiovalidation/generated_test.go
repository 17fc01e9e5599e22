package istiovalidation

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"istio.io/istio/pkg/config"
	"istio.io/istio/pkg/config/schema/gvk"
	"istio.io/istio/pkg/config/validation"
	"istio.io/istio/pkg/config/validation/agent"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"github.com/liorfranko/istio-adaptive-least-request/internal/desired"
	. "github.com/liorfranko/istio-adaptive-least-request/test/fixtures"
)

// generatedInputs is how many inputs one run draws: enough that every
// choice below is taken many times (about 200 per host kind), in a few
// seconds.
const generatedInputs = 3000

// TestGeneratedObjectsPassIstioValidation: over generated inputs, every
// object desired.Compute builds for an accepted optimizer passes Istio's
// validation with no error and no warning, and the generator reached both
// outcomes often enough to mean something.
func TestGeneratedObjectsPassIstioValidation(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 4))
	var written, refusedHost, refusedCompute, refusedFlags int
	istioRefusesHost := 0
	for i := range generatedInputs {
		g := generate(r)
		if g.flagsRefused {
			refusedFlags++
			continue
		}
		if agent.ValidateFQDN(g.in.Optimizer.OptimizedHost()) != nil {
			istioRefusesHost++
		}
		claim := desired.HostClaim{
			Namespace: g.in.Optimizer.Namespace, Name: g.in.Optimizer.Name,
			ServiceNamespace: g.in.Optimizer.TargetNamespace(), ServiceName: g.in.Optimizer.Spec.ServiceName,
			Host: g.in.Optimizer.OptimizedHost(),
		}
		if p := desired.CheckHost(claim, g.rules, nil, nil); p != nil {
			refusedHost++
			continue
		}
		res := desired.Compute(g.in)
		if res.ServiceEntry == nil {
			refusedCompute++
			continue
		}
		written++
		objs := []struct {
			kind     string
			k        config.GroupVersionKind
			validate validation.ValidateFunc
			spec     config.Spec
			name, ns string
			labels   map[string]string
		}{
			{"ServiceEntry", gvk.ServiceEntry, validation.ValidateServiceEntry, &res.ServiceEntry.Spec, res.ServiceEntry.Name, res.ServiceEntry.Namespace, res.ServiceEntry.Labels},
			{"DestinationRule", gvk.DestinationRule, validation.ValidateDestinationRule, &res.DestinationRule.Spec, res.DestinationRule.Name, res.DestinationRule.Namespace, res.DestinationRule.Labels},
		}
		if vs := res.VirtualService; vs != nil {
			objs = append(objs, struct {
				kind     string
				k        config.GroupVersionKind
				validate validation.ValidateFunc
				spec     config.Spec
				name, ns string
				labels   map[string]string
			}{"VirtualService", gvk.VirtualService, validation.ValidateVirtualService, &vs.Spec, vs.Name, vs.Namespace, vs.Labels})
		}
		for _, o := range objs {
			cfg := config.Config{Meta: config.Meta{GroupVersionKind: o.k, Name: o.name, Namespace: o.ns, Labels: o.labels, Domain: g.rules.ClusterDomain}, Spec: o.spec}
			warn, err := o.validate(cfg)
			if err != nil {
				t.Errorf("input %d (%s): %s %s/%s rejected by Istio's validation: %v", i, g, o.kind, o.ns, o.name, err)
			}
			if warn != nil {
				t.Errorf("input %d (%s): %s %s/%s: Istio's validation warns: %v", i, g, o.kind, o.ns, o.name, warn)
			}
		}
	}
	t.Logf("%d generated inputs: %d written and validated, %d refused by the host rules, %d by Compute, %d by the start-up checks of the flags; Istio's FQDN check refuses %d of the hosts",
		generatedInputs, written, refusedHost, refusedCompute, refusedFlags, istioRefusesHost)
	// Both sides of the rules are reached, or the test means little.
	if written < generatedInputs/4 || refusedHost < generatedInputs/20 || refusedCompute < generatedInputs/50 || refusedFlags < generatedInputs/50 {
		t.Errorf("the generator is lopsided: %d written, %d refused by the host rules, %d by Compute, %d by the flags", written, refusedHost, refusedCompute, refusedFlags)
	}
}

// generated is one input and the administrator's rules it runs under.
type generated struct {
	in    desired.Input
	rules desired.HostRules
	// flagsRefused: the manager would not start with these flags (a
	// suffix or cluster domain its start-up checks refuse).
	flagsRefused bool
	desc         string
}

func (g generated) String() string { return g.desc }

const (
	lower  = "abcdefghijklmnopqrstuvwxyz"
	digits = "0123456789"
)

// label draws a DNS label of 1-max characters: letters, digits and inner
// hyphens, starting with a letter when letterFirst.
func label(r *rand.Rand, max int, letterFirst bool) string {
	n := 1 + r.IntN(max)
	if r.IntN(4) == 0 {
		n = 1 + r.IntN(3) // short ones often: "a", "3", "x1"
	}
	b := make([]byte, n)
	for i := range b {
		set := lower + digits
		switch {
		case i == 0 && letterFirst:
			set = lower
		case i > 0 && i < n-1 && r.IntN(6) == 0:
			set = "-"
		}
		b[i] = set[r.IntN(len(set))]
	}
	return string(b)
}

// dnsName draws a name of 1-4 labels; the last one is sometimes all digits.
func dnsName(r *rand.Rand) string {
	parts := make([]string, 1+r.IntN(4))
	for i := range parts {
		parts[i] = label(r, 20, false)
	}
	if r.IntN(4) == 0 {
		parts[len(parts)-1] = fmt.Sprint(r.IntN(300))
	}
	return strings.Join(parts, ".")
}

// junk draws a string that is often not a DNS name at all.
func junk(r *rand.Rand) string {
	const chars = lower + digits + ".-_*:AZ "
	n := r.IntN(12)
	if r.IntN(10) == 0 {
		n = 240 + r.IntN(40) // around the 253-character limit
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = chars[r.IntN(len(chars))]
	}
	return string(b)
}

func ipv4(r *rand.Rand) string {
	return fmt.Sprintf("%d.%d.%d.%d", 1+r.IntN(254), r.IntN(256), r.IntN(256), 1+r.IntN(254))
}

func generate(r *rand.Rand) generated {
	var g generated
	ns := label(r, 63, false)     // a namespace is a DNS-1123 label
	svcName := label(r, 63, true) // a Service name is a DNS-1035 label

	// The administrator's flags, refused at start-up as the manager does.
	var suffixes []string
	for range r.IntN(3) {
		var s string
		switch r.IntN(10) {
		case 0, 1, 2, 3:
			s = "mesh.example.com"
		case 4, 5, 6:
			s = dnsName(r)
		case 7:
			s = ipv4(r)
		default:
			s = junk(r)
		}
		suffixes = append(suffixes, s)
		if desired.SuffixProblem(s) != "" {
			g.flagsRefused = true
		}
	}
	domain := "cluster.local"
	if r.IntN(8) == 0 {
		domain = dnsName(r)
		if desired.ClusterDomainProblem(domain) != "" {
			g.flagsRefused = true
		}
	}
	g.rules = desired.HostRules{AllowedSuffixes: suffixes, ClusterDomain: domain}

	// The optimizer's host.
	var host string
	switch r.IntN(8) {
	case 0, 1:
		// The default, <service>.<namespace>.adaptive.
	case 2:
		host = label(r, 30, false) + "." + ns + ".adaptive"
	case 3:
		if len(suffixes) > 0 {
			host = label(r, 30, false) + "." + strings.Trim(strings.ToLower(suffixes[r.IntN(len(suffixes))]), ".")
		} else {
			host = dnsName(r)
		}
	case 4:
		host = ipv4(r)
	case 5:
		host = label(r, 10, false) + "." + ns + "." + fmt.Sprint(r.IntN(100))
	case 6:
		host = dnsName(r)
	default:
		host = junk(r)
	}

	// The Service: 1-4 ports of unlike names, protocols and targets.
	svc := Service(ns, svcName)
	svc.Spec.ClusterIP = ipv4(r)
	portNames := []string{"", "http", "http-web", "http2", "grpc", "grpc-web", "tcp", "tcp-db", "https", "tls", "mongo", "redis", "mysql", "udp", "web", label(r, 15, true)}
	appProtocols := []*string{nil, nil, ptr.To("http"), ptr.To("grpc"), ptr.To("kubernetes.io/h2c"), ptr.To("https"), ptr.To("tcp"), ptr.To("kubernetes.io/ws"), ptr.To("custom")}
	var slicePorts []SlicePort
	usedNumbers, usedNames := map[int32]bool{}, map[string]bool{}
	nPorts := 1 + r.IntN(4)
	for i := range nPorts {
		num := int32(1 + r.IntN(65535))
		if r.IntN(3) == 0 {
			num = []int32{80, 443, 8080, 9090, 15001, 15006}[r.IntN(6)]
		}
		name := portNames[r.IntN(len(portNames))]
		if nPorts > 1 && name == "" {
			name = fmt.Sprintf("p%d", i) // Kubernetes names every port of a multi-port Service
		}
		if usedNumbers[num] || usedNames[name] {
			continue
		}
		usedNumbers[num], usedNames[name] = true, true
		target := intstr.FromInt32(int32(1 + r.IntN(65535)))
		slicePort := target.IntVal
		if r.IntN(3) == 0 {
			target = intstr.FromString("t" + label(r, 10, true))
			slicePort = int32(1 + r.IntN(65535))
		}
		p := ServicePort(name, num, target)
		p.AppProtocol = appProtocols[r.IntN(len(appProtocols))]
		if r.IntN(10) == 0 {
			p.Protocol = corev1.ProtocolUDP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, p)
		slicePorts = append(slicePorts, SlicePort{Name: name, Port: slicePort})
	}
	switch r.IntN(6) {
	case 0:
		svc.Annotations = map[string]string{desired.AnnotationExportTo: "."}
	case 1:
		svc.Annotations = map[string]string{desired.AnnotationExportTo: "*"}
	case 2:
		svc.Annotations = map[string]string{desired.AnnotationExportTo: ".," + label(r, 20, false)}
	case 3:
		svc.Annotations = map[string]string{desired.AnnotationExportTo: junk(r)}
	}

	// The optimizer.
	opt := Optimizer(ns, label(r, 40, true), svcName)
	opt.Spec.Host = host
	opt.Spec.LocalityEnabled = r.IntN(2) == 0
	opt.Spec.RoutingMode = []optv1.RoutingMode{"", optv1.RoutingVirtualService, optv1.RoutingNone}[r.IntN(3)]
	opt.Spec.LoadBalancer = []optv1.LoadBalancer{"", optv1.LoadBalancerRoundRobin, optv1.LoadBalancerLeastRequest}[r.IntN(3)]
	for _, p := range svc.Spec.Ports {
		if r.IntN(3) != 0 {
			continue
		}
		sp := optv1.ServicePort{Number: p.Port, Protocol: []optv1.Protocol{"", optv1.ProtocolHTTP, optv1.ProtocolGRPC, optv1.ProtocolTCP}[r.IntN(4)]}
		if r.IntN(4) == 0 {
			sp.TargetPort = ptr.To(intstr.FromInt32(int32(1 + r.IntN(65535))))
		}
		opt.Spec.ServicePorts = append(opt.Spec.ServicePorts, sp)
	}
	if r.IntN(10) == 0 {
		opt.Spec.ServicePorts = append(opt.Spec.ServicePorts, optv1.ServicePort{Number: int32(1 + r.IntN(65535))}) // not a port of the Service
	}

	// Pods on zoned nodes, some without sidecars or not ready.
	in := desired.Input{Optimizer: opt, Service: svc, ClusterDomain: domain, Pods: map[string]*corev1.Pod{}, Nodes: map[string]*corev1.Node{}, WeightsLearned: r.IntN(2) == 0}
	for z := range 3 {
		node := fmt.Sprintf("node-%d", z)
		in.Nodes[node] = Node(node, "region-"+label(r, 10, false), "zone-"+label(r, 10, false), []string{"", "rack-" + label(r, 5, false)}[r.IntN(2)], "m5.large")
	}
	var eps []Endpoint
	for i := range 1 + r.IntN(6) {
		name := fmt.Sprintf("%s-%d", svcName, i)
		node := fmt.Sprintf("node-%d", r.IntN(3))
		var opts []PodOption
		if r.IntN(4) != 0 {
			opts = append(opts, WithSidecar())
		}
		if r.IntN(2) == 0 {
			opts = append(opts, WithServiceAccount(label(r, 30, true)))
		}
		in.Pods[name] = Pod(ns, name, svcName, node, opts...)
		e := Ready(name, ipv4(r), node)
		if r.IntN(8) == 0 {
			e = NotReady(name, ipv4(r), node)
		}
		eps = append(eps, e)
	}
	in.Slices = []discoveryv1.EndpointSlice{*EndpointSlice(ns, svcName+"-1", svcName, slicePorts, eps...)}
	if r.IntN(4) == 0 {
		in.Mesh.DefaultExportTo = []string{"."}
	}
	g.in = in
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s:%d->%s/%s appProtocol %s", p.Name, p.Port, p.TargetPort.String(), p.Protocol, ptr.Deref(p.AppProtocol, "-")))
	}
	var optimized []string
	for _, p := range opt.Spec.ServicePorts {
		optimized = append(optimized, fmt.Sprintf("%d/%s", p.Number, p.Protocol))
	}
	g.desc = fmt.Sprintf("host %q of Service %s/%s, suffixes %q, cluster domain %q, ports %v, optimized %v, exportTo %q",
		host, ns, svcName, suffixes, domain, ports, optimized, svc.Annotations[desired.AnnotationExportTo])
	return g
}
