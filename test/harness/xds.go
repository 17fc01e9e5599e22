package harness

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxyv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// xDS type URLs requested by XDSClient.
const (
	TypeCluster  = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	TypeEndpoint = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
	TypeListener = "type.googleapis.com/envoy.config.listener.v3.Listener"
	TypeRoute    = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"

	typeResourceWrapper = "type.googleapis.com/envoy.service.discovery.v3.Resource"
)

// DefaultClusterID is the Kubernetes cluster id istiod and the client use.
const DefaultClusterID = "Kubernetes"

// DefaultProxyIstioVersion is the ISTIO_VERSION the client claims; istiod
// gates some generated config on the proxy's version.
const DefaultProxyIstioVersion = "1.31.0"

// Locality is an Envoy/Istio locality.
type Locality struct {
	Region, Zone, SubZone string
}

// String is Istio's "region/zone/subzone" spelling.
func (l Locality) String() string {
	return l.Region + "/" + l.Zone + "/" + l.SubZone
}

// SidecarOptions describe the sidecar proxy an XDSClient poses as.
type SidecarOptions struct {
	// IP of the pod; should not belong to any Service's endpoints unless the
	// test wants istiod to see the client as that workload. Default 127.0.200.1.
	IP string
	// Pod and Namespace name the workload. Defaults "client-0" and "default".
	Pod, Namespace string
	// ServiceAccount of the workload (default "default").
	ServiceAccount string
	// Labels are the workload's labels (metadata LABELS); default app=<pod>.
	Labels map[string]string
	// Locality of the proxy, sent on the xDS node. Istiod uses it when the
	// proxy's own pod is not in the registry (which is the case for a client
	// IP with no Pod object), so locality-aware priorities can be tested.
	Locality Locality
	// ClusterID (default DefaultClusterID) and IstioVersion (default
	// DefaultProxyIstioVersion) of the proxy.
	ClusterID, IstioVersion string
	// Metadata adds or overrides node metadata fields.
	Metadata map[string]any
	// NodeType is Istio's proxy type: "sidecar" (default) or "router" (a
	// gateway: istiod sends it the listeners and routes of the Gateways
	// whose selector matches Labels).
	NodeType string
}

// XDSClient is an ADS (state of the world) client posing as a sidecar. It
// subscribes to all clusters and listeners, then to the endpoints of every
// EDS cluster and every route configuration the listeners reference, ACKing
// each response, and keeps the latest state. All query methods read that
// state; use WaitFor to poll until a condition holds.
type XDSClient struct {
	nodeID string
	conn   *grpc.ClientConn
	stream discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	cancel context.CancelFunc
	node   *corev3.Node
	done   chan struct{}

	mu        sync.RWMutex
	err       error
	updates   uint64
	changed   chan struct{} // closed and replaced on every update
	clusters  map[string]*clusterv3.Cluster
	endpoints map[string]*endpointv3.ClusterLoadAssignment
	listeners map[string]*listenerv3.Listener
	routes    map[string]*routev3.RouteConfiguration
	received  map[string]bool     // type URL -> a response arrived
	sub       map[string][]string // type URL -> subscribed names (EDS, RDS)
	version   map[string]string   // type URL -> last version_info
	nonce     map[string]string   // type URL -> last nonce
}

// NodeID returns Istio's node id: <type>~<ip>~<pod>.<ns>~<ns>.svc.cluster.local.
func (o SidecarOptions) NodeID() string {
	typ := o.NodeType
	if typ == "" {
		typ = "sidecar"
	}
	return fmt.Sprintf("%s~%s~%s.%s~%s.svc.cluster.local", typ, o.IP, o.Pod, o.Namespace, o.Namespace)
}

func (o SidecarOptions) withDefaults() SidecarOptions {
	if o.IP == "" {
		o.IP = "127.0.200.1"
	}
	if o.Pod == "" {
		o.Pod = "client-0"
	}
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.ServiceAccount == "" {
		o.ServiceAccount = "default"
	}
	if o.ClusterID == "" {
		o.ClusterID = DefaultClusterID
	}
	if o.IstioVersion == "" {
		o.IstioVersion = DefaultProxyIstioVersion
	}
	if o.Labels == nil {
		o.Labels = map[string]string{"app": o.Pod}
	}
	return o
}

// node builds the Envoy node the way istio-agent does for a sidecar.
func (o SidecarOptions) node() (*corev3.Node, error) {
	labels := map[string]any{}
	for k, v := range o.Labels {
		labels[k] = v
	}
	md := map[string]any{
		"NAMESPACE":         o.Namespace,
		"CLUSTER_ID":        o.ClusterID,
		"ISTIO_VERSION":     o.IstioVersion,
		"LABELS":            labels,
		"INSTANCE_IPS":      o.IP,
		"SERVICE_ACCOUNT":   o.ServiceAccount,
		"NAME":              o.Pod,
		"WORKLOAD_NAME":     o.Pod,
		"OWNER":             fmt.Sprintf("kubernetes://apis/v1/namespaces/%s/pods/%s", o.Namespace, o.Pod),
		"MESH_ID":           "cluster.local",
		"INTERCEPTION_MODE": "REDIRECT",
		"PROXY_CONFIG": map[string]any{
			"discoveryAddress": "istiod.istio-system.svc:15012",
		},
	}
	for k, v := range o.Metadata {
		md[k] = v
	}
	st, err := structpb.NewStruct(md)
	if err != nil {
		return nil, fmt.Errorf("node metadata: %w", err)
	}
	return &corev3.Node{
		Id:                   o.NodeID(),
		Cluster:              o.Pod + "." + o.Namespace,
		Metadata:             st,
		Locality:             &corev3.Locality{Region: o.Locality.Region, Zone: o.Locality.Zone, SubZone: o.Locality.SubZone},
		UserAgentName:        "envoy",
		UserAgentVersionType: &corev3.Node_UserAgentVersion{UserAgentVersion: "1.36.0"},
	}, nil
}

// DialXDS connects to istiod's plaintext xDS address (Istiod.GRPCAddr) as the
// sidecar opts describes and starts subscribing. Close it when done.
func DialXDS(ctx context.Context, addr string, opts SidecarOptions) (*XDSClient, error) {
	opts = opts.withDefaults()
	node, err := opts.node()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("dial xDS %s: %w", addr, err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	c := &XDSClient{
		nodeID:    opts.NodeID(),
		conn:      conn,
		cancel:    cancel,
		node:      node,
		done:      make(chan struct{}),
		changed:   make(chan struct{}),
		clusters:  map[string]*clusterv3.Cluster{},
		endpoints: map[string]*endpointv3.ClusterLoadAssignment{},
		listeners: map[string]*listenerv3.Listener{},
		routes:    map[string]*routev3.RouteConfiguration{},
		received:  map[string]bool{},
		sub:       map[string][]string{},
		version:   map[string]string{},
		nonce:     map[string]string{},
	}
	// Bound the stream setup by ctx, not the stream's lifetime.
	type result struct {
		s   discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesClient
		err error
	}
	ch := make(chan result, 1)
	go func() {
		s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx, grpc.WaitForReady(true))
		ch <- result{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			cancel()
			_ = conn.Close()
			return nil, fmt.Errorf("open ADS stream to %s: %w", addr, r.err)
		}
		c.stream = r.s
	case <-ctx.Done():
		cancel()
		_ = conn.Close()
		return nil, fmt.Errorf("open ADS stream to %s: %w", addr, ctx.Err())
	}
	// Envoy's order: CDS, then LDS (EDS and RDS follow the responses).
	for _, t := range []string{TypeCluster, TypeListener} {
		if err := c.send(t, nil, "", ""); err != nil {
			c.Close()
			return nil, err
		}
	}
	go c.recvLoop()
	return c, nil
}

// NodeID is the xDS node id the client sent.
func (c *XDSClient) NodeID() string { return c.nodeID }

// Close ends the stream and the connection.
func (c *XDSClient) Close() {
	c.cancel()
	_ = c.conn.Close()
	<-c.done
}

// Err is the error that ended the stream, if it ended.
func (c *XDSClient) Err() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.err
}

func (c *XDSClient) send(typeURL string, names []string, version, nonce string) error {
	req := &discoveryv3.DiscoveryRequest{
		Node:          c.node,
		TypeUrl:       typeURL,
		ResourceNames: names,
		VersionInfo:   version,
		ResponseNonce: nonce,
	}
	if err := c.stream.Send(req); err != nil {
		return fmt.Errorf("send %s request: %w", shortType(typeURL), err)
	}
	return nil
}

func (c *XDSClient) recvLoop() {
	defer close(c.done)
	for {
		resp, err := c.stream.Recv()
		if err != nil {
			c.mu.Lock()
			c.err = err
			c.notifyLocked()
			c.mu.Unlock()
			return
		}
		if err := c.handle(resp); err != nil {
			c.mu.Lock()
			c.err = err
			c.notifyLocked()
			c.mu.Unlock()
			c.cancel()
			return
		}
	}
}

// handle stores a response, sends the follow-up subscriptions (EDS after CDS,
// RDS after LDS) and ACKs it, as Envoy does.
func (c *XDSClient) handle(resp *discoveryv3.DiscoveryResponse) error {
	t := resp.GetTypeUrl()
	c.mu.Lock()
	var follow string
	var followNames []string
	var decodeErr error
	switch t {
	case TypeCluster:
		m := map[string]*clusterv3.Cluster{}
		for _, a := range resp.GetResources() {
			cl := &clusterv3.Cluster{}
			if err := unmarshalResource(a, cl); err != nil {
				decodeErr = err
				continue
			}
			m[cl.GetName()] = cl
		}
		c.clusters = m // wildcard: the response is the whole set
		var eds []string
		for name, cl := range m {
			if cl.GetType() == clusterv3.Cluster_EDS {
				eds = append(eds, name)
			}
		}
		sort.Strings(eds)
		if !equalStrings(eds, c.sub[TypeEndpoint]) {
			c.sub[TypeEndpoint] = eds
			follow, followNames = TypeEndpoint, eds
			keep := map[string]bool{}
			for _, n := range eds {
				keep[n] = true
			}
			for n := range c.endpoints {
				if !keep[n] {
					delete(c.endpoints, n)
				}
			}
		}
	case TypeListener:
		m := map[string]*listenerv3.Listener{}
		for _, a := range resp.GetResources() {
			l := &listenerv3.Listener{}
			if err := unmarshalResource(a, l); err != nil {
				decodeErr = err
				continue
			}
			m[l.GetName()] = l
		}
		c.listeners = m
		rds := routeNames(m)
		if !equalStrings(rds, c.sub[TypeRoute]) {
			c.sub[TypeRoute] = rds
			follow, followNames = TypeRoute, rds
			keep := map[string]bool{}
			for _, n := range rds {
				keep[n] = true
			}
			for n := range c.routes {
				if !keep[n] {
					delete(c.routes, n)
				}
			}
		}
	case TypeEndpoint:
		// Not wildcard: a response may carry only the changed clusters.
		for _, a := range resp.GetResources() {
			cla := &endpointv3.ClusterLoadAssignment{}
			if err := unmarshalResource(a, cla); err != nil {
				decodeErr = err
				continue
			}
			c.endpoints[cla.GetClusterName()] = cla
		}
	case TypeRoute:
		for _, a := range resp.GetResources() {
			rc := &routev3.RouteConfiguration{}
			if err := unmarshalResource(a, rc); err != nil {
				decodeErr = err
				continue
			}
			c.routes[rc.GetName()] = rc
		}
	}
	c.received[t] = true
	c.version[t] = resp.GetVersionInfo()
	c.nonce[t] = resp.GetNonce()
	var followVersion, followNonce string
	if follow != "" {
		followVersion, followNonce = c.version[follow], c.nonce[follow]
	}
	ackNames := c.sub[t]
	c.updates++
	c.notifyLocked()
	c.mu.Unlock()

	if decodeErr != nil {
		return fmt.Errorf("decode %s response: %w", shortType(t), decodeErr)
	}
	if follow != "" {
		if err := c.send(follow, followNames, followVersion, followNonce); err != nil {
			return err
		}
	}
	return c.send(t, ackNames, resp.GetVersionInfo(), resp.GetNonce())
}

func (c *XDSClient) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func unmarshalResource(a *anypb.Any, m proto.Message) error {
	if a.GetTypeUrl() == typeResourceWrapper {
		r := &discoveryv3.Resource{}
		if err := a.UnmarshalTo(r); err != nil {
			return err
		}
		a = r.GetResource()
	}
	return a.UnmarshalTo(m)
}

// routeNames lists the RDS route configuration names the listeners use.
func routeNames(ls map[string]*listenerv3.Listener) []string {
	set := map[string]bool{}
	for _, l := range ls {
		for _, fc := range allChains(l) {
			for _, f := range fc.GetFilters() {
				if hcm := asHCM(f); hcm != nil && hcm.GetRds() != nil {
					set[hcm.GetRds().GetRouteConfigName()] = true
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func allChains(l *listenerv3.Listener) []*listenerv3.FilterChain {
	out := append([]*listenerv3.FilterChain{}, l.GetFilterChains()...)
	if d := l.GetDefaultFilterChain(); d != nil {
		out = append(out, d)
	}
	return out
}

func asHCM(f *listenerv3.Filter) *hcmv3.HttpConnectionManager {
	tc := f.GetTypedConfig()
	if tc == nil || !strings.HasSuffix(tc.GetTypeUrl(), "http_connection_manager.v3.HttpConnectionManager") {
		return nil
	}
	h := &hcmv3.HttpConnectionManager{}
	if tc.UnmarshalTo(h) != nil {
		return nil
	}
	return h
}

func asTCPProxy(f *listenerv3.Filter) *tcpproxyv3.TcpProxy {
	tc := f.GetTypedConfig()
	if tc == nil || !strings.HasSuffix(tc.GetTypeUrl(), "tcp_proxy.v3.TcpProxy") {
		return nil
	}
	p := &tcpproxyv3.TcpProxy{}
	if tc.UnmarshalTo(p) != nil {
		return nil
	}
	return p
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func shortType(t string) string {
	switch t {
	case TypeCluster:
		return "CDS"
	case TypeEndpoint:
		return "EDS"
	case TypeListener:
		return "LDS"
	case TypeRoute:
		return "RDS"
	}
	return t
}

// Synced reports nil once the client holds clusters, listeners, the
// endpoints of every EDS cluster and every referenced route configuration.
func (c *XDSClient) Synced() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.err != nil {
		return fmt.Errorf("xDS stream ended: %w", c.err)
	}
	for _, t := range []string{TypeCluster, TypeListener} {
		if !c.received[t] {
			return fmt.Errorf("no %s response yet", shortType(t))
		}
	}
	for _, n := range c.sub[TypeEndpoint] {
		if _, ok := c.endpoints[n]; !ok {
			return fmt.Errorf("no endpoints yet for EDS cluster %s", n)
		}
	}
	for _, n := range c.sub[TypeRoute] {
		if _, ok := c.routes[n]; !ok {
			return fmt.Errorf("no route configuration %q yet", n)
		}
	}
	return nil
}

// WaitFor polls cond on the latest xDS state, re-checking on every update
// (and at least every 200ms), until it returns nil, the stream fails, or
// timeout passes; then it returns cond's last error.
func (c *XDSClient) WaitFor(timeout time.Duration, cond func(c *XDSClient) error) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.RLock()
		changed := c.changed
		streamErr := c.err
		c.mu.RUnlock()
		err := cond(c)
		if err == nil {
			return nil
		}
		if streamErr != nil {
			return fmt.Errorf("%w (xDS stream ended: %v)", err, streamErr)
		}
		select {
		case <-deadline.C:
			return fmt.Errorf("after %s: %w", timeout, err)
		case <-changed:
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ListenerNames lists the listeners the sidecar has, sorted.
func (c *XDSClient) ListenerNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return sortedKeys(c.listeners)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// RawEndpoints returns a copy of a cluster's ClusterLoadAssignment (nil when
// absent), for assertions the helpers do not cover.
func (c *XDSClient) RawEndpoints(cluster string) *endpointv3.ClusterLoadAssignment {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return cloneOrNil(c.endpoints[cluster])
}

func cloneOrNil[T proto.Message](m T) T {
	var zero T
	if proto.Message(m) == nil || !m.ProtoReflect().IsValid() {
		return zero
	}
	return proto.Clone(m).(T)
}

// WeightedCluster is one destination of a route.
type WeightedCluster struct {
	Name   string
	Weight uint32 // 0 when the route has a single cluster
}

// RouteTarget is where the sidecar's HTTP route for host:port leads.
type RouteTarget struct {
	RouteConfig string   // RDS name (the port for sidecar outbound routes)
	VirtualHost string   // e.g. "web.demo.svc.cluster.local:80"
	Domains     []string // the virtual host's domains
	RouteName   string   // the matched route's name (Istio: VirtualService route name or "default")
	Clusters    []WeightedCluster
}

// Route finds the sidecar's HTTP route for host:port: the route
// configuration named after the port, the virtual host whose domains contain
// host or host:port, and its first route that forwards (Istio orders a
// virtual host's routes; for a VirtualService with only port matches the
// first is the one for this port).
func (c *XDSClient) Route(host string, port int) (RouteTarget, error) {
	return c.RouteIn(strconv.Itoa(port), host, port)
}

// RouteIn is Route in the route configuration name (a gateway's are
// "http.<port>"); a virtual host matches host, host:port or host:*.
func (c *XDSClient) RouteIn(name, host string, port int) (RouteTarget, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	rc, ok := c.routes[name]
	if !ok {
		return RouteTarget{}, fmt.Errorf("no route configuration %q (have %v)", name, sortedKeys(c.routes))
	}
	hostPort := host + ":" + strconv.Itoa(port)
	var vh *routev3.VirtualHost
	for _, v := range rc.GetVirtualHosts() {
		for _, d := range v.GetDomains() {
			if d == host || d == hostPort || d == host+":*" {
				vh = v
				break
			}
		}
		if vh != nil {
			break
		}
	}
	if vh == nil {
		var names []string
		for _, v := range rc.GetVirtualHosts() {
			names = append(names, v.GetName())
		}
		return RouteTarget{}, fmt.Errorf("route configuration %q has no virtual host for %s (virtual hosts: %v)", name, hostPort, names)
	}
	out := RouteTarget{RouteConfig: name, VirtualHost: vh.GetName(), Domains: append([]string{}, vh.GetDomains()...)}
	for _, r := range vh.GetRoutes() {
		ra := r.GetRoute()
		if ra == nil {
			continue
		}
		out.RouteName = r.GetName()
		switch {
		case ra.GetCluster() != "":
			out.Clusters = []WeightedCluster{{Name: ra.GetCluster()}}
		case ra.GetWeightedClusters() != nil:
			for _, wc := range ra.GetWeightedClusters().GetClusters() {
				out.Clusters = append(out.Clusters, WeightedCluster{Name: wc.GetName(), Weight: wc.GetWeight().GetValue()})
			}
		default:
			return out, fmt.Errorf("route %q of virtual host %s has neither a cluster nor weighted clusters", r.GetName(), vh.GetName())
		}
		return out, nil
	}
	return out, fmt.Errorf("virtual host %s in route configuration %q has no forwarding route", vh.GetName(), name)
}

// RouteCluster returns the one cluster the sidecar's HTTP route for
// host:port points to (an error if the route splits traffic).
func (c *XDSClient) RouteCluster(host string, port int) (string, error) {
	rt, err := c.Route(host, port)
	if err != nil {
		return "", err
	}
	if len(rt.Clusters) != 1 {
		return "", fmt.Errorf("route for %s:%d splits over %v", host, port, rt.Clusters)
	}
	return rt.Clusters[0].Name, nil
}

// TCPTarget is the outbound listener and filter chain that TCP traffic to
// dst:port reaches, and its tcp_proxy destination.
type TCPTarget struct {
	Listener    string // e.g. "10.0.0.12_5432" or "0.0.0.0_5432"
	FilterChain string
	Clusters    []WeightedCluster
}

// TCPRoute emulates Envoy's original-destination listener lookup for an
// outbound TCP connection to one of dst (IP addresses; Envoy never sees a
// hostname for TCP) on port:
//
//   - a listener bound to exactly dst:port wins (Istio names it
//     "<vip>_<port>" for a Service with a ClusterIP or a ServiceEntry with
//     addresses or an auto-allocated address);
//   - else the wildcard listener "0.0.0.0_<port>", choosing the filter chain
//     whose destination prefix ranges contain dst, else the chain without a
//     destination match. Istio builds this wildcard listener for TCP ports of
//     services without a VIP, e.g. a ServiceEntry with resolution STATIC and
//     no addresses, so every connection on that port from the sidecar to an
//     IP without its own listener goes there (observed with istiod 1.31:
//     only a sidecar with DNS_CAPTURE=true in its metadata gets a listener
//     on the auto-allocated 240.240.x.y address instead of the wildcard);
//   - else the listener with use_original_dst (Istio's "virtualOutbound" on
//     15001, where iptables sends all outbound traffic), whose default chain
//     leads to PassthroughCluster (or BlackHoleCluster with
//     outboundTrafficPolicy REGISTRY_ONLY).
//
// With no dst, only the wildcard listener's default chain is considered.
// Filter chains that match on SNI, transport or application protocol (TLS /
// HTTP sniffing chains) are skipped, as plain TCP would not hit them.
func (c *XDSClient) TCPRoute(port int, dst ...string) (TCPTarget, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var ips []netip.Addr
	for _, d := range dst {
		a, err := netip.ParseAddr(d)
		if err != nil {
			return TCPTarget{}, fmt.Errorf("TCPRoute: %q is not an IP address (pass the Service's ClusterIP or the ServiceEntry's address)", d)
		}
		ips = append(ips, a)
	}
	var results []TCPTarget
	var errs []string
	lookup := func(ip *netip.Addr) {
		var exact, wild, virtual *listenerv3.Listener
		for _, l := range c.listeners {
			if l.GetUseOriginalDst().GetValue() {
				virtual = l
				continue
			}
			sa := l.GetAddress().GetSocketAddress()
			if sa == nil || int(sa.GetPortValue()) != port || l.GetTrafficDirection() == corev3.TrafficDirection_INBOUND {
				continue
			}
			a, err := netip.ParseAddr(sa.GetAddress())
			if err != nil {
				continue
			}
			if a.IsUnspecified() {
				wild = l
			} else if ip != nil && a == *ip {
				exact = l
			}
		}
		l := exact
		if l == nil {
			l = wild
		}
		if l == nil {
			l = virtual
		}
		if l == nil {
			errs = append(errs, fmt.Sprintf("no outbound listener for %s port %d", ipString(ip), port))
			return
		}
		fc := chooseChain(l, ip, port)
		if fc == nil {
			errs = append(errs, fmt.Sprintf("listener %s has no plain TCP filter chain for %s", l.GetName(), ipString(ip)))
			return
		}
		t := TCPTarget{Listener: l.GetName(), FilterChain: fc.GetName()}
		for _, f := range fc.GetFilters() {
			if p := asTCPProxy(f); p != nil {
				if p.GetCluster() != "" {
					t.Clusters = []WeightedCluster{{Name: p.GetCluster()}}
				}
				for _, wc := range p.GetWeightedClusters().GetClusters() {
					t.Clusters = append(t.Clusters, WeightedCluster{Name: wc.GetName(), Weight: wc.GetWeight()})
				}
			}
		}
		if len(t.Clusters) == 0 {
			errs = append(errs, fmt.Sprintf("listener %s chain %q for %s has no tcp_proxy", l.GetName(), fc.GetName(), ipString(ip)))
			return
		}
		results = append(results, t)
	}
	if len(ips) == 0 {
		lookup(nil)
	}
	for i := range ips {
		lookup(&ips[i])
	}
	if len(errs) > 0 {
		return TCPTarget{}, errors.New(strings.Join(errs, "; "))
	}
	for _, r := range results[1:] {
		if fmt.Sprint(r.Clusters) != fmt.Sprint(results[0].Clusters) {
			return TCPTarget{}, fmt.Errorf("addresses %v lead to different destinations: %+v", dst, results)
		}
	}
	return results[0], nil
}

// TCPCluster returns the one cluster TCP traffic to dst:port goes to (see
// TCPRoute for how the listener and filter chain are chosen).
func (c *XDSClient) TCPCluster(port int, dst ...string) (string, error) {
	t, err := c.TCPRoute(port, dst...)
	if err != nil {
		return "", err
	}
	if len(t.Clusters) != 1 {
		return "", fmt.Errorf("TCP %v:%d splits over %v", dst, port, t.Clusters)
	}
	return t.Clusters[0].Name, nil
}

func ipString(ip *netip.Addr) string {
	if ip == nil {
		return "any address"
	}
	return ip.String()
}

// chooseChain picks the filter chain Envoy would use for a plain TCP
// connection to ip:port, following Envoy's match order: chains for exactly
// this destination port before chains without a port; among them the most
// specific destination prefix containing ip, else a chain without
// destination prefixes; else the default filter chain.
func chooseChain(l *listenerv3.Listener, ip *netip.Addr, port int) *listenerv3.FilterChain {
	var portChains, anyPortChains []*listenerv3.FilterChain
	for _, fc := range l.GetFilterChains() {
		m := fc.GetFilterChainMatch()
		if len(m.GetServerNames()) > 0 || len(m.GetApplicationProtocols()) > 0 ||
			(m.GetTransportProtocol() != "" && m.GetTransportProtocol() != "raw_buffer") {
			continue
		}
		switch dp := m.GetDestinationPort(); {
		case dp == nil:
			anyPortChains = append(anyPortChains, fc)
		case int(dp.GetValue()) == port:
			portChains = append(portChains, fc)
		}
	}
	if fc := chooseByPrefix(portChains, ip); fc != nil {
		return fc
	}
	if fc := chooseByPrefix(anyPortChains, ip); fc != nil {
		return fc
	}
	return l.GetDefaultFilterChain()
}

func chooseByPrefix(chains []*listenerv3.FilterChain, ip *netip.Addr) *listenerv3.FilterChain {
	var best, catchAll *listenerv3.FilterChain
	bestLen := -1
	for _, fc := range chains {
		m := fc.GetFilterChainMatch()
		if len(m.GetPrefixRanges()) == 0 {
			if catchAll == nil {
				catchAll = fc
			}
			continue
		}
		if ip == nil {
			continue
		}
		for _, pr := range m.GetPrefixRanges() {
			a, err := netip.ParseAddr(pr.GetAddressPrefix())
			if err != nil {
				continue
			}
			bits := int(pr.GetPrefixLen().GetValue())
			if pr.GetPrefixLen() == nil {
				bits = a.BitLen()
			}
			p, err := a.Prefix(bits)
			if err != nil || !p.Contains(*ip) {
				continue
			}
			if bits > bestLen {
				best, bestLen = fc, bits
			}
		}
	}
	if best != nil {
		return best
	}
	return catchAll
}

// ClusterInfo is what a test asks about a cluster.
type ClusterInfo struct {
	Name string
	Type string // "EDS", "STATIC", "ORIGINAL_DST", ...
	// LbPolicy is the lb_policy enum name ("ROUND_ROBIN", "LEAST_REQUEST", ...)
	// or, when load_balancing_policy is used, its first policy's extension
	// name.
	LbPolicy string
	// TLS is set when the cluster's own transport_socket is TLS (e.g. a
	// DestinationRule with tls mode ISTIO_MUTUAL).
	TLS *TLSInfo
	// AutoMTLS is set when a transport_socket_matches entry for endpoints
	// labelled tlsMode=istio uses TLS: Istio's auto-mTLS.
	AutoMTLS *TLSInfo
	// TransportSocketMatches lists the names of the matches
	// (e.g. "tlsMode-istio", "tlsMode-disabled").
	TransportSocketMatches []string
	// OutlierDetection tells whether outlier detection is configured.
	OutlierDetection bool
	// ServiceHosts are the hosts Istio records in the cluster's metadata.
	ServiceHosts []string
}

// TLSInfo describes an upstream TLS context.
type TLSInfo struct {
	SNI  string
	SANs []string // subject alt names verified (exact/prefix/... values)
	ALPN []string
}

// Cluster summarizes a cluster: lb policy and mTLS settings.
func (c *XDSClient) Cluster(name string) (ClusterInfo, error) {
	c.mu.RLock()
	cl, ok := c.clusters[name]
	c.mu.RUnlock()
	if !ok {
		return ClusterInfo{}, fmt.Errorf("no cluster %q", name)
	}
	info := ClusterInfo{
		Name:             name,
		Type:             cl.GetType().String(),
		LbPolicy:         cl.GetLbPolicy().String(),
		OutlierDetection: cl.GetOutlierDetection() != nil,
	}
	if cl.GetClusterDiscoveryType() == nil {
		info.Type = ""
	}
	if ps := cl.GetLoadBalancingPolicy().GetPolicies(); len(ps) > 0 {
		info.LbPolicy = ps[0].GetTypedExtensionConfig().GetName()
	}
	if ts := cl.GetTransportSocket(); ts != nil {
		t, err := tlsInfo(ts)
		if err != nil {
			return info, fmt.Errorf("cluster %s transport socket: %w", name, err)
		}
		info.TLS = t
	}
	for _, m := range cl.GetTransportSocketMatches() {
		info.TransportSocketMatches = append(info.TransportSocketMatches, m.GetName())
		if m.GetMatch().GetFields()["tlsMode"].GetStringValue() != "istio" {
			continue
		}
		t, err := tlsInfo(m.GetTransportSocket())
		if err != nil {
			return info, fmt.Errorf("cluster %s transport socket match %s: %w", name, m.GetName(), err)
		}
		if t != nil {
			info.AutoMTLS = t
		}
	}
	for _, s := range cl.GetMetadata().GetFilterMetadata()["istio"].GetFields()["services"].GetListValue().GetValues() {
		if h := s.GetStructValue().GetFields()["host"].GetStringValue(); h != "" {
			info.ServiceHosts = append(info.ServiceHosts, h)
		}
	}
	return info, nil
}

// tlsInfo decodes a TLS transport socket; nil for a non-TLS socket.
func tlsInfo(ts *corev3.TransportSocket) (*TLSInfo, error) {
	tc := ts.GetTypedConfig()
	if tc == nil || !strings.HasSuffix(tc.GetTypeUrl(), "UpstreamTlsContext") {
		return nil, nil
	}
	u := &tlsv3.UpstreamTlsContext{}
	if err := tc.UnmarshalTo(u); err != nil {
		return nil, err
	}
	out := &TLSInfo{SNI: u.GetSni(), ALPN: u.GetCommonTlsContext().GetAlpnProtocols()}
	ctx := u.GetCommonTlsContext()
	vcs := []*tlsv3.CertificateValidationContext{
		ctx.GetValidationContext(),
		ctx.GetCombinedValidationContext().GetDefaultValidationContext(),
	}
	for _, vc := range vcs {
		for _, m := range vc.GetMatchSubjectAltNames() {
			out.SANs = append(out.SANs, matcherValue(m))
		}
		for _, m := range vc.GetMatchTypedSubjectAltNames() {
			out.SANs = append(out.SANs, matcherValue(m.GetMatcher()))
		}
	}
	return out, nil
}

func matcherValue(m *matcherv3.StringMatcher) string {
	switch {
	case m.GetExact() != "":
		return m.GetExact()
	case m.GetPrefix() != "":
		return m.GetPrefix() + "*"
	case m.GetSuffix() != "":
		return "*" + m.GetSuffix()
	case m.GetContains() != "":
		return "*" + m.GetContains() + "*"
	case m.GetSafeRegex() != nil:
		return "regex:" + m.GetSafeRegex().GetRegex()
	}
	return ""
}

// Endpoint is one endpoint of a cluster as the sidecar sees it.
type Endpoint struct {
	Address string
	Port    uint32
	// Weight is the endpoint's load_balancing_weight (0 when unset).
	Weight   uint32
	Locality Locality
	// Priority of the endpoint's locality group (0 = used first).
	Priority uint32
	// LocalityWeight is the group's load_balancing_weight.
	LocalityWeight uint32
	// Health is the health_status name ("HEALTHY", "UNHEALTHY", "DRAINING", ...).
	Health string
	// TLSMode is the endpoint's "tlsMode" transport socket match label
	// ("istio" for auto-mTLS).
	TLSMode string
}

// Key is "address:port".
func (e Endpoint) Key() string { return fmt.Sprintf("%s:%d", e.Address, e.Port) }

// Endpoints lists a cluster's endpoints in the order of its
// ClusterLoadAssignment (grouped by locality).
func (c *XDSClient) Endpoints(cluster string) ([]Endpoint, error) {
	c.mu.RLock()
	cla, ok := c.endpoints[cluster]
	c.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("no endpoints (ClusterLoadAssignment) for cluster %q", cluster)
	}
	var out []Endpoint
	for _, g := range cla.GetEndpoints() {
		loc := Locality{Region: g.GetLocality().GetRegion(), Zone: g.GetLocality().GetZone(), SubZone: g.GetLocality().GetSubZone()}
		for _, lb := range g.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			e := Endpoint{
				Address:        sa.GetAddress(),
				Port:           sa.GetPortValue(),
				Weight:         lb.GetLoadBalancingWeight().GetValue(),
				Locality:       loc,
				Priority:       g.GetPriority(),
				LocalityWeight: g.GetLoadBalancingWeight().GetValue(),
				Health:         lb.GetHealthStatus().String(),
				TLSMode:        lb.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue(),
			}
			if sa == nil {
				if p := lb.GetEndpoint().GetAddress().GetPipe(); p != nil {
					e.Address = p.GetPath()
				} else if ia := lb.GetEndpoint().GetAddress().GetEnvoyInternalAddress(); ia != nil {
					e.Address = "internal:" + ia.GetServerListenerName()
				}
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// Dump summarizes the state (names of clusters, listeners, routes and
// endpoint counts) for failure messages.
func (c *XDSClient) Dump() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var b strings.Builder
	fmt.Fprintf(&b, "node %s, %d updates, err=%v\n", c.nodeID, c.updates, c.err)
	fmt.Fprintf(&b, "clusters: %v\n", sortedKeys(c.clusters))
	fmt.Fprintf(&b, "listeners: %v\n", sortedKeys(c.listeners))
	fmt.Fprintf(&b, "routes: %v\n", sortedKeys(c.routes))
	for _, n := range sortedKeys(c.endpoints) {
		cnt := 0
		for _, g := range c.endpoints[n].GetEndpoints() {
			cnt += len(g.GetLbEndpoints())
		}
		fmt.Fprintf(&b, "eds %s: %d endpoints\n", n, cnt)
	}
	return b.String()
}
