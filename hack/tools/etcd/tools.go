//go:build tools

// Package tools pins the etcd used by envtest, built from the Go module proxy.
package tools

import _ "go.etcd.io/etcd/server/v3"
