package harness

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
)

// RawCluster returns a copy of a cluster (nil when absent), for assertions
// the summaries do not cover (circuit breakers, TLS details).
func (c *XDSClient) RawCluster(name string) *clusterv3.Cluster {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return cloneOrNil(c.clusters[name])
}

// ClusterNames lists the clusters the sidecar has, sorted.
func (c *XDSClient) ClusterNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return sortedKeys(c.clusters)
}

// VirtualHostsFor lists "<route config>/<virtual host>" of every virtual
// host, in any route configuration, whose domains contain host (alone or as
// host:port): whether the sidecar can address the host by HTTP at all.
func (c *XDSClient) VirtualHostsFor(host string) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for name, rc := range c.routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, d := range vh.GetDomains() {
				if d == host || (len(d) > len(host) && d[:len(host)+1] == host+":") {
					out = append(out, name+"/"+vh.GetName())
					break
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// DanglingRoutes lists every route (HTTP route or TCP chain) that leads to a
// cluster the sidecar does not have: traffic there would fail with "no
// cluster" (503 NC). Istio's own PassthroughCluster/BlackHoleCluster and
// InboundPassthrough clusters count as present only if sent.
func (c *XDSClient) DanglingRoutes() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	check := func(where, cluster string) {
		if cluster == "" {
			return
		}
		if _, ok := c.clusters[cluster]; !ok {
			out = append(out, where+" -> "+cluster)
		}
	}
	for name, rc := range c.routes {
		for _, vh := range rc.GetVirtualHosts() {
			for _, r := range vh.GetRoutes() {
				ra := r.GetRoute()
				if ra == nil {
					continue
				}
				where := fmt.Sprintf("route %s/%s/%s", name, vh.GetName(), r.GetName())
				check(where, ra.GetCluster())
				for _, wc := range ra.GetWeightedClusters().GetClusters() {
					check(where, wc.GetName())
				}
			}
		}
	}
	for _, l := range c.listeners {
		if l.GetTrafficDirection().String() == "INBOUND" {
			continue
		}
		for _, fc := range allChains(l) {
			for _, f := range fc.GetFilters() {
				if p := asTCPProxy(f); p != nil {
					where := fmt.Sprintf("listener %s chain %q", l.GetName(), fc.GetName())
					check(where, p.GetCluster())
					for _, wc := range p.GetWeightedClusters().GetClusters() {
						check(where, wc.GetName())
					}
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// TLSCluster emulates Envoy's filter chain match for a TLS connection to
// dst:port with SNI sni (empty: a client that sends none): the listener
// bound to dst:port (else the wildcard one), then the chain whose
// server_names contain sni (exact, or a "*.suffix" wildcard), else a chain
// without server_names. It returns the chain's tcp_proxy cluster, or an
// error naming what matched nothing (Envoy closes such a connection).
func (c *XDSClient) TLSCluster(port int, dst, sni string) (string, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ip, err := netip.ParseAddr(dst)
	if err != nil {
		return "", fmt.Errorf("TLSCluster: %q is not an IP address", dst)
	}
	var exact, wild *listenerv3.Listener
	for _, l := range c.listeners {
		sa := l.GetAddress().GetSocketAddress()
		if sa == nil || int(sa.GetPortValue()) != port || l.GetTrafficDirection().String() == "INBOUND" {
			continue
		}
		a, err := netip.ParseAddr(sa.GetAddress())
		if err != nil {
			continue
		}
		if a == ip {
			exact = l
		} else if a.IsUnspecified() {
			wild = l
		}
	}
	l := exact
	if l == nil {
		l = wild
	}
	if l == nil {
		return "", fmt.Errorf("no outbound listener for %s:%d", dst, port)
	}
	var byName, noName *listenerv3.FilterChain
	for _, fc := range l.GetFilterChains() {
		m := fc.GetFilterChainMatch()
		if tp := m.GetTransportProtocol(); tp != "" && tp != "tls" {
			continue
		}
		if len(m.GetApplicationProtocols()) > 0 {
			continue
		}
		if len(m.GetServerNames()) == 0 {
			if noName == nil {
				noName = fc
			}
			continue
		}
		for _, n := range m.GetServerNames() {
			if sni != "" && (n == sni || (len(n) > 1 && n[0] == '*' && len(sni) > len(n)-1 && strings.HasSuffix(sni, n[1:]))) {
				byName = fc
			}
		}
	}
	fc := byName
	if fc == nil {
		fc = noName
	}
	if fc == nil {
		fc = l.GetDefaultFilterChain()
	}
	if fc == nil {
		return "", fmt.Errorf("listener %s has no filter chain for SNI %q", l.GetName(), sni)
	}
	for _, f := range fc.GetFilters() {
		if p := asTCPProxy(f); p != nil && p.GetCluster() != "" {
			return p.GetCluster(), nil
		}
	}
	return "", fmt.Errorf("listener %s chain %q for SNI %q has no single tcp_proxy cluster", l.GetName(), fc.GetName(), sni)
}

// SniffedHTTPCluster follows the HTTP chain of the listener bound to
// dst:port (the chain a sniffed connection takes once the HTTP inspector
// recognised HTTP/1.x or h2c): its route configuration (RDS, often named
// "<host>:<port>" for a sniffed port), the virtual host for host, and the
// first forwarding route's single cluster.
func (c *XDSClient) SniffedHTTPCluster(dst string, port int, host string) (string, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	name := fmt.Sprintf("%s_%d", dst, port)
	l, ok := c.listeners[name]
	if !ok {
		return "", fmt.Errorf("no listener %s", name)
	}
	rds := ""
	for _, fc := range l.GetFilterChains() {
		if !slicesContains(fc.GetFilterChainMatch().GetApplicationProtocols(), "http/1.1") {
			continue
		}
		for _, f := range fc.GetFilters() {
			if hcm := asHCM(f); hcm != nil {
				rds = hcm.GetRds().GetRouteConfigName()
			}
		}
	}
	if rds == "" {
		return "", fmt.Errorf("listener %s has no sniffed HTTP chain with RDS", name)
	}
	rc, ok := c.routes[rds]
	if !ok {
		return "", fmt.Errorf("no route configuration %q yet", rds)
	}
	hostPort := fmt.Sprintf("%s:%d", host, port)
	for _, vh := range rc.GetVirtualHosts() {
		// A sniffed port's own route configuration has one virtual host
		// for "*": the listener already chose the Service by address.
		if !slicesContains(vh.GetDomains(), host) && !slicesContains(vh.GetDomains(), hostPort) && !slicesContains(vh.GetDomains(), "*") {
			continue
		}
		for _, r := range vh.GetRoutes() {
			if cl := r.GetRoute().GetCluster(); cl != "" {
				return cl, nil
			}
		}
		return "", fmt.Errorf("virtual host %s in %q has no single-cluster route", vh.GetName(), rds)
	}
	var vhs []string
	for _, vh := range rc.GetVirtualHosts() {
		vhs = append(vhs, fmt.Sprintf("%s%v", vh.GetName(), vh.GetDomains()))
	}
	return "", fmt.Errorf("route configuration %q has no virtual host for %s (has %v)", rds, hostPort, vhs)
}

func slicesContains(s []string, v string) bool {
	for _, e := range s {
		if e == v {
			return true
		}
	}
	return false
}
