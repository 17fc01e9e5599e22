package desired

import (
	"sort"

	optv1 "github.com/liorfranko/istio-adaptive-least-request/api/v1alpha1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	networking "istio.io/api/networking/v1alpha3"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func serviceEntry(r Result, labels map[string]string) *istionet.ServiceEntry {
	se := &istionet.ServiceEntry{
		TypeMeta:   metav1.TypeMeta{APIVersion: istionet.SchemeGroupVersion.String(), Kind: "ServiceEntry"},
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, Labels: labels},
	}
	se.Spec.Hosts = []string{r.Host}
	// Without an address, istiod gives every sidecar a wildcard listener
	// 0.0.0.0_<port> for each TCP port of a STATIC ServiceEntry, which would
	// capture all TCP traffic on that port to any destination. A fixed
	// virtual address scopes the listener; clients still reach the pods
	// through the Kubernetes Service, whose VirtualService routes to this host.
	se.Spec.Addresses = []string{VirtualAddress(r.Host)}
	se.Spec.Location = networking.ServiceEntry_MESH_INTERNAL
	se.Spec.Resolution = networking.ServiceEntry_STATIC
	for _, p := range r.Ports {
		se.Spec.Ports = append(se.Spec.Ports, &networking.ServicePort{
			Number: uint32(p.Number), Protocol: p.Protocol, Name: p.Name, TargetPort: p.TargetPort,
		})
	}
	for _, ep := range r.Endpoints {
		we := &networking.WorkloadEntry{
			Address:        ep.Address,
			Locality:       ep.Locality,
			Weight:         ep.Weight,
			ServiceAccount: ep.ServiceAccount,
		}
		if ep.Sidecar {
			we.Labels = map[string]string{LabelTLSMode: "istio"}
		}
		if len(ep.Ports) > 0 {
			we.Ports = ep.Ports
		}
		se.Spec.Endpoints = append(se.Spec.Endpoints, we)
	}
	return se
}

func destinationRule(r Result, opt *optv1.IstioAdaptiveRequestOptimizer, labels map[string]string) *istionet.DestinationRule {
	dr := &istionet.DestinationRule{
		TypeMeta:   metav1.TypeMeta{APIVersion: istionet.SchemeGroupVersion.String(), Kind: "DestinationRule"},
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, Labels: labels},
	}
	dr.Spec.Host = r.Host
	lb := &networking.LoadBalancerSettings{
		LbPolicy: &networking.LoadBalancerSettings_Simple{Simple: r.LoadBalancer},
	}
	policy := &networking.TrafficPolicy{LoadBalancer: lb}
	if opt.Spec.LocalityEnabled {
		// Istio applies locality failover only when outlier detection can
		// eject unhealthy endpoints; without it every locality stays at
		// priority 0.
		lb.LocalityLbSetting = &networking.LocalityLoadBalancerSetting{Enabled: wrapperspb.Bool(true)}
		policy.OutlierDetection = &networking.OutlierDetection{
			Consecutive_5XxErrors: wrapperspb.UInt32(5),
			Interval:              durationpb.New(10e9),
			BaseEjectionTime:      durationpb.New(30e9),
			MaxEjectionPercent:    50,
		}
	}
	dr.Spec.TrafficPolicy = policy
	return dr
}

// passThroughPorts are the Service's TCP ports that are not optimized. A
// VirtualService takes over its host on every port, so these get routes to
// the Kubernetes Service itself, exactly where they went before.
func passThroughPorts(svc *corev1.Service, optimized []Port) []Port {
	done := map[int32]bool{}
	for _, p := range optimized {
		done[p.Number] = true
	}
	var out []Port
	for _, sp := range svc.Spec.Ports {
		if done[sp.Port] || sp.Protocol == corev1.ProtocolUDP || sp.Protocol == corev1.ProtocolSCTP {
			continue
		}
		done[sp.Port] = true
		proto := meshProtocol(sp)
		out = append(out, Port{Name: portName(proto, sp.Port, "-passthrough"), Number: sp.Port, Protocol: proto, meshProtocol: proto})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Number < out[j].Number })
	return out
}

func virtualService(r Result, passThrough []Port, labels map[string]string) *istionet.VirtualService {
	vs := &istionet.VirtualService{
		TypeMeta:   metav1.TypeMeta{APIVersion: istionet.SchemeGroupVersion.String(), Kind: "VirtualService"},
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace, Labels: labels},
	}
	vs.Spec.Hosts = []string{r.KubernetesHost}
	type route struct {
		Port
		host string
	}
	var routes []route
	for _, p := range r.Ports {
		routes = append(routes, route{p, r.Host})
	}
	for _, p := range passThrough {
		routes = append(routes, route{p, r.KubernetesHost})
	}
	for _, rt := range routes {
		p := rt.Port
		dest := &networking.Destination{Host: rt.host, Port: &networking.PortSelector{Number: uint32(p.Number)}}
		httpRoute := func() {
			vs.Spec.Http = append(vs.Spec.Http, &networking.HTTPRoute{
				Name:  p.Name,
				Match: []*networking.HTTPMatchRequest{{Port: uint32(p.Number)}},
				Route: []*networking.HTTPRouteDestination{{Destination: dest}},
			})
		}
		tcpRoute := func() {
			vs.Spec.Tcp = append(vs.Spec.Tcp, &networking.TCPRoute{
				Match: []*networking.L4MatchAttributes{{Port: uint32(p.Number)}},
				Route: []*networking.RouteDestination{{Destination: dest}},
			})
		}
		switch routeKindOf(p.meshProtocol) {
		case routeHTTP:
			httpRoute()
		case routeTCP:
			tcpRoute()
		case routeSniffed:
			// The client's listener sniffs: HTTP requests take the http
			// route, everything else the tcp route. Both must lead here,
			// or HTTP (the common case) would bypass the weights.
			httpRoute()
			tcpRoute()
		case routeTLS:
			if rt.host == r.KubernetesHost {
				// Without a tls route istiod's default chain for the port
				// already leads to the Kubernetes Service, whatever the SNI;
				// a tls route would narrow it to one SNI.
				continue
			}
			// istiod builds no TCP chain for HTTPS/TLS ports: only a tls
			// route, matched by SNI, moves this traffic.
			vs.Spec.Tls = append(vs.Spec.Tls, &networking.TLSRoute{
				Match: []*networking.TLSMatchAttributes{{Port: uint32(p.Number), SniHosts: []string{r.KubernetesHost}}},
				Route: []*networking.RouteDestination{{Destination: dest}},
			})
		}
	}
	return vs
}
