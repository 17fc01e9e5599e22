package desired

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"
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

const (
	// MaxHostLength is the longest DNS name (RFC 1123).
	MaxHostLength = 253
	// maxLabelLength is the longest DNS label.
	maxLabelLength = 63
	// adaptiveSuffix ends every host the operator gives out by default.
	adaptiveSuffix = "adaptive"
)

// Reasons of a refused host.
const (
	ReasonInvalidHost    = "InvalidHost"
	ReasonHostNotAllowed = "HostNotAllowed"
	ReasonHostTaken      = "HostTaken"
)

// dnsSyntax explains why host is not a DNS-1123 subdomain (lower case
// letters, digits and '-', labels of 1–63 characters that start and end with
// a letter or digit, at most 253 in all, no port), or returns "". Istio's own
// validation refuses every object built from such a host, so it must never
// be written.
func dnsSyntax(host string) string {
	switch {
	case host == "":
		return "is empty"
	case len(host) > MaxHostLength:
		return fmt.Sprintf("is %d characters long, more than %d", len(host), MaxHostLength)
	case strings.Contains(host, ":"):
		return "contains ':'; a host has no port (ports come from the Service)"
	}
	for i, label := range strings.Split(host, ".") {
		switch {
		case label == "":
			return fmt.Sprintf("has an empty label (at position %d); a host has no leading, trailing or doubled dots", i+1)
		case len(label) > maxLabelLength:
			return fmt.Sprintf("has a label of %d characters (%.20s...), more than %d", len(label), label, maxLabelLength)
		case label[0] == '-' || label[len(label)-1] == '-':
			return fmt.Sprintf("has a label %q that starts or ends with '-'", label)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Sprintf("contains %q; a host holds only lower-case letters, digits, '-' and '.'", c)
			}
		}
	}
	return numericTopLabel(host)
}

// invalidHost refuses an optimized host that is not a valid DNS name, or that
// would shadow a Kubernetes Service: Istio prefers the Service over a
// ServiceEntry of the same host and the mix sends pods twice, and a host of
// another Service would let an optimizer capture that Service's traffic.
func invalidHost(host, clusterDomain string) string {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	if strings.Contains(host, "*") {
		return fmt.Sprintf("host %q: wildcards are not allowed for the optimized host", host)
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if strings.HasSuffix(h, ".svc") || strings.HasSuffix(h, ".svc."+clusterDomain) || !strings.Contains(h, ".") {
		return fmt.Sprintf("host %q looks like a Kubernetes Service host; the optimized host must be a name of its own, such as <service>.<namespace>.adaptive", host)
	}
	if why := dnsSyntax(host); why != "" {
		return fmt.Sprintf("host %q is not a valid DNS name: it %s", host, why)
	}
	return ""
}

// DefaultHost is the optimized host when spec.host is empty.
func DefaultHost(service, serviceNamespace string) string {
	return service + "." + serviceNamespace + "." + adaptiveSuffix
}

// HostRules are the administrator's rules for optimized hosts.
type HostRules struct {
	// AllowedSuffixes are DNS suffixes (e.g. "mesh.example.com") under which
	// any team may name its optimized host, besides its own
	// <service_namespace>.adaptive. A host equal to a suffix is not allowed.
	AllowedSuffixes []string
	ClusterDomain   string
}

// hostNotAllowed explains why a team whose Service lives in serviceNamespace
// may not use host, or returns "". Every namespace owns the names under
// <namespace>.adaptive; other names need a suffix the administrator allowed,
// so no team can name (and capture) a host another team or the world uses.
func (r HostRules) hostNotAllowed(host, serviceNamespace string) string {
	own := "." + serviceNamespace + "." + adaptiveSuffix
	if strings.HasSuffix(host, own) && len(host) > len(own) {
		return ""
	}
	for _, s := range r.AllowedSuffixes {
		s = strings.Trim(strings.ToLower(strings.TrimSpace(s)), ".")
		if s != "" && strings.HasSuffix(host, "."+s) {
			return ""
		}
	}
	allowed := "*" + own
	for _, s := range r.AllowedSuffixes {
		if s = strings.Trim(strings.ToLower(strings.TrimSpace(s)), "."); s != "" {
			allowed += ", *." + s
		}
	}
	return fmt.Sprintf("host %q is outside the names Service namespace %q may use (%s); leave spec.host empty for %s, "+
		"or ask the administrator to allow the suffix (--allowed-host-suffixes)", host, serviceNamespace, allowed, "<service>"+own)
}

// HostClaim is one optimizer that asks for a host.
type HostClaim struct {
	Namespace, Name  string // the optimizer
	ServiceNamespace string
	ServiceName      string
	Host             string
	Created          time.Time
	// Holds says a live ServiceEntry the operator wrote for this optimizer
	// already carries the host: whoever routes the host now keeps it.
	Holds bool
	// Deleting optimizers give their host up.
	Deleting bool
	// Barred claims (e.g. cross-namespace targeting the manager forbids)
	// never hold a host.
	Barred bool
}

// HostHolder is something other than an optimizer that uses a host: a
// ServiceEntry the operator did not write, or a Kubernetes Service.
type HostHolder struct {
	Kind, Namespace, Name string
	// Note adds what the user should know about the holder.
	Note string
}

// CheckHost decides whether the optimizer of claim may use its host: the
// host must be a valid DNS name that shadows no Kubernetes Service, nobody
// else (holders) may use it, it must be under the Service namespace's own
// names or an allowed suffix, and among the optimizers that claim it the
// first wins. "First" is the same on every side, so the loser never writes:
// an optimizer whose ServiceEntry already carries the host, then the oldest
// (creationTimestamp), then by namespace/name. It returns nil when the host
// may be used, else a Fatal problem naming what holds the host.
func CheckHost(claim HostClaim, rules HostRules, others []HostClaim, holders []HostHolder) *Problem {
	host := claim.Host
	if msg := invalidHost(host, rules.ClusterDomain); msg != "" {
		return &Problem{Reason: ReasonInvalidHost, Fatal: true, Message: msg}
	}
	if len(holders) > 0 {
		hs := slices.Clone(holders)
		slices.SortFunc(hs, func(a, b HostHolder) int {
			return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
		})
		h := hs[0]
		msg := fmt.Sprintf("host %q is already used by %s %s/%s", host, h.Kind, h.Namespace, h.Name)
		if h.Note != "" {
			msg += " (" + h.Note + ")"
		}
		return &Problem{Reason: ReasonHostTaken, Fatal: true, Message: msg + "; the operator does not take a host from its holder. " + otherHost(claim)}
	}
	if msg := rules.hostNotAllowed(host, claim.ServiceNamespace); msg != "" {
		return &Problem{Reason: ReasonHostNotAllowed, Fatal: true, Message: msg}
	}
	if w := firstClaim(claim, rules, others); w != nil {
		return &Problem{Reason: ReasonHostTaken, Fatal: true, Message: fmt.Sprintf(
			"host %q is already claimed by optimizer %s/%s (Service %s/%s), which came first; it keeps the host. %s",
			host, w.Namespace, w.Name, w.ServiceNamespace, w.ServiceName, otherHost(claim))}
	}
	return nil
}

// otherHost tells the loser of a host what to do.
func otherHost(claim HostClaim) string {
	if def := DefaultHost(claim.ServiceName, claim.ServiceNamespace); claim.Host != def {
		return "Choose another spec.host, or leave it empty for " + def
	}
	return "Set spec.host to another name under ." + claim.ServiceNamespace + "." + adaptiveSuffix + " or an allowed suffix, or remove the holder"
}

// firstClaim returns the claim among others that comes before claim for
// the same host, or nil when claim comes first. Claims the rules would
// refuse do not count, so a team cannot block a host it may not use.
func firstClaim(claim HostClaim, rules HostRules, others []HostClaim) *HostClaim {
	var first *HostClaim
	for i := range others {
		o := &others[i]
		if o.Host != claim.Host || o.Deleting || o.Barred || (o.Namespace == claim.Namespace && o.Name == claim.Name) {
			continue
		}
		if o.ServiceNamespace == claim.ServiceNamespace && o.ServiceName == claim.ServiceName {
			// Two optimizers of one Service write objects of one name; the
			// object conflict rule (who owns them) decides between them.
			continue
		}
		if invalidHost(o.Host, rules.ClusterDomain) != "" || rules.hostNotAllowed(o.Host, o.ServiceNamespace) != "" {
			continue
		}
		if claimBefore(*o, claim) && (first == nil || claimBefore(*o, *first)) {
			first = o
		}
	}
	return first
}

// claimBefore orders claims of one host: the current holder, then the
// oldest, then by namespace/name.
func claimBefore(a, b HostClaim) bool {
	if a.Holds != b.Holds {
		return a.Holds
	}
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name)) < 0
}

// ServiceHostName splits a host that names a Kubernetes Service the way
// sidecars resolve it (<svc>.<ns>, <svc>.<ns>.svc, <svc>.<ns>.svc.<domain>)
// into namespace and service, so the caller can look that Service up.
func ServiceHostName(host, clusterDomain string) (namespace, service string, ok bool) {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	h = strings.TrimSuffix(strings.TrimSuffix(h, "."+clusterDomain), ".svc")
	service, namespace, ok = strings.Cut(h, ".")
	if !ok || service == "" || namespace == "" || strings.Contains(namespace, ".") {
		return "", "", false
	}
	return namespace, service, true
}

// SuffixProblem explains why an administrator's allowed host suffix is
// unusable, or returns "". A suffix that would let teams name Kubernetes
// Service hosts is refused.
func SuffixProblem(suffix string) string {
	s := strings.Trim(strings.ToLower(strings.TrimSpace(suffix)), ".")
	if why := dnsSyntax(s); why != "" {
		return fmt.Sprintf("suffix %q is not a DNS name: it %s", suffix, why)
	}
	if s == "svc" || strings.HasPrefix(s, "svc.") || strings.Contains(s, ".svc.") || s == adaptiveSuffix {
		return fmt.Sprintf("suffix %q would let teams name Kubernetes Service hosts or other namespaces' .adaptive names", suffix)
	}
	return ""
}
