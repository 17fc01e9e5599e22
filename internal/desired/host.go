package desired

import (
	"fmt"
	"hash/fnv"
	"strings"
)

// VirtualAddress is the ServiceEntry's address: a stable hash of the host in
// 240.241.0.0/16, reserved address space (class E) that no pod or Service
// uses and that Istio's own auto-allocation (240.240.0.0/16) does not touch.
func VirtualAddress(host string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(host))
	v := h.Sum32() % 65534
	v++ // never 240.241.0.0
	return fmt.Sprintf("240.241.%d.%d", v>>8, v&0xff)
}

// invalidHost refuses an optimized host that would shadow a Kubernetes
// Service: Istio prefers the Service over a ServiceEntry of the same host and
// the mix sends pods twice, and a host of another Service would let an
// optimizer capture that Service's traffic.
func invalidHost(host, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if strings.Contains(h, "*") {
		return fmt.Sprintf("host %q: wildcards are not allowed for the optimized host", host)
	}
	if strings.HasSuffix(h, ".svc") || strings.HasSuffix(h, ".svc."+clusterDomain) || !strings.Contains(h, ".") {
		return fmt.Sprintf("host %q looks like a Kubernetes Service host; the optimized host must be a name of its own, such as <service>.<namespace>.adaptive", host)
	}
	return ""
}
