//go:build tools

// Package tools pins istiod (pilot-discovery), run outside a cluster by the
// conformance tests and the demo. Built from the Go module proxy.
package tools

import _ "istio.io/istio/pilot/cmd/pilot-discovery"
