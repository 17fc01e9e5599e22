//go:build tools

// Package tools pins the kube-apiserver used by envtest. setup-envtest downloads
// release tarballs, which this project cannot rely on, so the binary is built
// from the Go module proxy instead.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
