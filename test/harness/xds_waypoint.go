package harness

import (
	"fmt"
	"strconv"
	"strings"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
)

// WaypointRoute is where a waypoint sends a service's traffic: istiod
// gives a waypoint, in its main_internal listener, one filter chain per
// service it serves, named inbound-vip|<port>|<protocol>|<host>, whose
// HTTP connection manager carries its routes inline (not over RDS); the
// first route of its virtual host is returned.
func (c *XDSClient) WaypointRoute(host string, port int) (RouteTarget, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	l := c.listeners["main_internal"]
	if l == nil {
		return RouteTarget{}, fmt.Errorf("no main_internal listener (have %v): not a waypoint", sortedKeys(c.listeners))
	}
	prefix, suffix := "inbound-vip|"+strconv.Itoa(port)+"|", "|"+host
	for _, fc := range allChains(l) {
		if !strings.HasPrefix(fc.GetName(), prefix) || !strings.HasSuffix(fc.GetName(), suffix) {
			continue
		}
		for _, f := range fc.GetFilters() {
			h := asHCM(f)
			if h == nil {
				continue
			}
			for _, vh := range h.GetRouteConfig().GetVirtualHosts() {
				out := RouteTarget{RouteConfig: "main_internal/" + fc.GetName(), VirtualHost: vh.GetName(), Domains: vh.GetDomains()}
				if len(vh.GetRoutes()) == 0 {
					return out, fmt.Errorf("virtual host %s of %s has no routes", vh.GetName(), out.RouteConfig)
				}
				r := vh.GetRoutes()[0]
				out.RouteName = r.GetName()
				switch {
				case r.GetRoute().GetCluster() != "":
					out.Clusters = []WeightedCluster{{Name: r.GetRoute().GetCluster()}}
				case r.GetRoute().GetWeightedClusters() != nil:
					for _, wc := range r.GetRoute().GetWeightedClusters().GetClusters() {
						out.Clusters = append(out.Clusters, WeightedCluster{Name: wc.GetName(), Weight: wc.GetWeight().GetValue()})
					}
				default:
					return out, fmt.Errorf("route %q of %s leads to no cluster", r.GetName(), out.RouteConfig)
				}
				return out, nil
			}
		}
	}
	return RouteTarget{}, fmt.Errorf("the waypoint has no filter chain %s...%s", prefix, suffix)
}

// TunnelTarget is the address an endpoint really leads to: itself, or,
// for an endpoint reached through Istio's HBONE tunnel (an Envoy internal
// address), the destination in its tunnel metadata.
func TunnelTarget(lb *endpointv3.LbEndpoint) string {
	if sa := lb.GetEndpoint().GetAddress().GetSocketAddress(); sa != nil {
		return sa.GetAddress()
	}
	md := lb.GetMetadata().GetFilterMetadata()
	for _, key := range []string{"envoy.filters.listener.original_dst", "tunnel"} {
		if v := md[key].GetFields(); v != nil {
			for _, field := range []string{"local", "destination", "address"} {
				if s := v[field].GetStringValue(); s != "" {
					return s
				}
			}
		}
	}
	return ""
}

// RawListener returns a copy of a listener (nil when absent).
func (c *XDSClient) RawListener(name string) *listenerv3.Listener {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return cloneOrNil(c.listeners[name])
}

// DescribeListener lists a listener's filter chains with their filters'
// types and, for HTTP connection managers, their inline virtual hosts'
// domains or RDS name, for failure messages.
func (c *XDSClient) DescribeListener(name string) string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	l := c.listeners[name]
	if l == nil {
		return "no listener " + name
	}
	var b strings.Builder
	for _, fc := range allChains(l) {
		fmt.Fprintf(&b, "chain %q:", fc.GetName())
		for _, f := range fc.GetFilters() {
			fmt.Fprintf(&b, " %s", f.GetTypedConfig().GetTypeUrl())
			if h := asHCM(f); h != nil {
				if rc := h.GetRouteConfig(); rc != nil {
					for _, vh := range rc.GetVirtualHosts() {
						fmt.Fprintf(&b, " vh %s %v", vh.GetName(), vh.GetDomains())
					}
				} else {
					fmt.Fprintf(&b, " rds %s", h.GetRds().GetRouteConfigName())
				}
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}
