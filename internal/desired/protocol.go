package desired

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Istio protocols as istiod spells them on a Kubernetes Service port.
// ProtocolSniffed is a port without a declared protocol: istiod sniffs each
// connection and gives the client's listener an HTTP chain and a TCP chain.
const (
	ProtocolSniffed = ""
	protoHTTP       = "HTTP"
	protoHTTP2      = "HTTP2"
	protoGRPC       = "GRPC"
	protoGRPCWeb    = "GRPC-Web"
	protoHTTPS      = "HTTPS"
	protoTLS        = "TLS"
	protoTCP        = "TCP"
)

// wellKnownTCPPorts are the ports istiod treats as TCP when undeclared
// (SMTP, DNS, MySQL, MongoDB).
var wellKnownTCPPorts = map[int32]bool{25: true, 53: true, 3306: true, 27017: true}

// meshProtocol is the protocol istiod gives a Kubernetes Service port, by
// Istio's own rules (pkg/config/kube ConvertProtocol): the appProtocol when
// set (then the name is not read), else the name's prefix before "-"; an
// unknown value is sniffed, except on a few well-known TCP ports. It decides
// which routes of the operator's VirtualService the client's listener uses.
func meshProtocol(sp corev1.ServicePort) string {
	name := sp.Name
	if sp.AppProtocol != nil {
		name = *sp.AppProtocol
		switch name {
		case "kubernetes.io/h2c":
			return protoHTTP2
		case "kubernetes.io/ws":
			return protoHTTP
		case "kubernetes.io/wss":
			return protoHTTPS
		}
	}
	if len(name) >= len("grpc-web") && strings.EqualFold(name[:len("grpc-web")], "grpc-web") {
		return protoGRPCWeb
	}
	prefix, _, _ := strings.Cut(name, "-")
	switch strings.ToLower(prefix) {
	case "http", "http_proxy":
		return protoHTTP
	case "http2":
		return protoHTTP2
	case "grpc":
		return protoGRPC
	case "https":
		return protoHTTPS
	case "tls":
		return protoTLS
	case "tcp":
		return protoTCP
	case "mongo":
		return "Mongo"
	case "redis":
		return "Redis"
	case "mysql":
		return "MySQL"
	}
	if wellKnownTCPPorts[sp.Port] {
		return protoTCP
	}
	return ProtocolSniffed
}

// routeKind is how the client's listener for a Kubernetes Service port
// chooses a destination, and so which VirtualService routes it reads.
type routeKind int

const (
	// routeHTTP: an HTTP connection manager; only http routes apply.
	routeHTTP routeKind = iota
	// routeTCP: a tcp_proxy; only tcp routes apply.
	routeTCP
	// routeTLS: filter chains by SNI; only tls routes apply, tcp routes
	// are ignored (istiod builds no TCP chain for HTTPS/TLS ports).
	routeTLS
	// routeSniffed: an HTTP chain for what the sniffer recognises as HTTP
	// and a TCP chain for the rest; both an http and a tcp route are needed.
	routeSniffed
)

func routeKindOf(meshProto string) routeKind {
	switch meshProto {
	case ProtocolSniffed:
		return routeSniffed
	case protoHTTP, protoHTTP2, protoGRPC, protoGRPCWeb:
		return routeHTTP
	case protoHTTPS, protoTLS:
		return routeTLS
	}
	return routeTCP
}

// portName names a ServiceEntry port after its protocol ("auto" when sniffed).
func portName(protocol string, number int32, suffix string) string {
	p := strings.ToLower(protocol)
	if p == "" {
		p = "auto"
	}
	return p + "-" + strconv.Itoa(int(number)) + suffix
}

// tlsPortProblem says what optimizing an HTTPS/TLS port costs. istiod
// routes such a port only by SNI: with a tls route for the Service's FQDN,
// a client sending that SNI reaches the optimized host, but one sending
// another SNI ("web", "web.ns") or none matches no route and goes to
// PassthroughCluster, without Istio mTLS or weights (observed with istiod
// 1.31, TestTLSRoutedBySNI). So such a port is optimized only when the
// optimizer lists it (skip false, with a Degraded note), and is otherwise
// left to the Service's own route (skip true).
func tlsPortProblem(svc *corev1.Service, sp corev1.ServicePort, mesh string, listed bool, clusterDomain string) (p *Problem, skip bool) {
	if routeKindOf(mesh) != routeTLS {
		return nil, false
	}
	fqdn := KubernetesHost(svc.Name, svc.Namespace, clusterDomain)
	if !listed {
		return &Problem{Reason: "TLSPortNotOptimized", Message: fmt.Sprintf(
			"port %d of Service %s/%s is %s, which Istio routes by SNI only: clients that send an SNI other than %s, or none, would lose their route. It is left on the Service's own route; list it in service_ports to optimize the clients that send %s",
			sp.Port, svc.Namespace, svc.Name, mesh, fqdn, fqdn)}, true
	}
	return &Problem{Reason: "TLSRoutedBySNI", Message: fmt.Sprintf(
		"port %d of Service %s/%s is %s: only TLS with SNI %s reaches the optimized host; other SNI, or none, goes to PassthroughCluster without Istio mTLS or weights",
		sp.Port, svc.Namespace, svc.Name, mesh, fqdn)}, false
}
