//go:build tools

// Package tools pins the Prometheus server used by integration tests and the
// demo. Built from the Go module proxy (the web UI assets are absent; the HTTP
// API works).
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
