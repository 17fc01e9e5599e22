// Package istiovalidation runs Istio's own validation (the checks of
// istiod's validating webhook, istio.io/istio/pkg/config/validation) over
// the objects desired.Compute builds from generated inputs: Service and
// namespace names, hosts, allowed suffixes, cluster domains, ports,
// protocols and export scopes, drawn from both sides of every rule. Every
// object the operator would write must pass; everything Istio would
// refuse must have been refused before (CheckHost, Compute, the manager's
// start-up checks).
//
// It is its own module so that istio.io/istio, which the operator does not
// link, stays out of the operator's dependencies; `make test` runs it.
package istiovalidation
