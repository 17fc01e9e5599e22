package desired

import (
	"fmt"
	"strings"
)

// numericTopLabel explains why a name whose last label is all digits is not
// a host, or returns "". Istio's validation refuses such names in every
// host field ("top level domain cannot be all-numeric", after RFC 3696
// section 2), so an IP address written as a host (10.1.2.3), or a suffix
// such as 3 or 2.3 that would give hosts like web.2.3, must be refused here
// before any object carries it.
func numericTopLabel(name string) string {
	top := name[strings.LastIndex(name, ".")+1:]
	if top == "" {
		return ""
	}
	for _, c := range top {
		if c < '0' || c > '9' {
			return ""
		}
	}
	return fmt.Sprintf("ends in the all-numeric label %q, which Istio refuses (an IP address is not a host name)", top)
}

// ClusterDomainProblem explains why a cluster domain cannot end the
// Kubernetes Service hosts the owned VirtualService names, or returns "".
func ClusterDomainProblem(domain string) string {
	d := strings.Trim(strings.ToLower(strings.TrimSpace(domain)), ".")
	if why := dnsSyntax(d); why != "" {
		return fmt.Sprintf("cluster domain %q is not a DNS name: it %s", domain, why)
	}
	return ""
}
