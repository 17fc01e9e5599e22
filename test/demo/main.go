// Command demo is the one-command local demo of the Istio adaptive weight
// optimizer (`make demo`, or `go run ./test/demo` after `make envtest
// prometheus istiod`).
//
// On loopback it starts a Kubernetes API server (envtest's kube-apiserver and
// etcd from bin/), a real Prometheus, istiod when bin/pilot-discovery exists,
// and the operator in-process (controllers.Setup, short cycle). It starts a
// fleet of simulated pods of unequal speed, each a real HTTP server on its own
// loopback address with a fixed number of workers and a first-come
// first-served queue, exporting its busy time as cAdvisor's
// container_cpu_usage_seconds_total and its served requests as Istio's
// istio_requests_total; registers them as Pods, Nodes, an EndpointSlice and a
// Service. Load generators act like client sidecars: each has its own
// Poisson arrivals and picks pods as Envoy does for the policy and weights it
// gets from istiod over xDS (or, without istiod, from the EndpointSlice and
// then the ServiceEntry): LEAST_REQUEST (power of two choices, or EDF over
// weight/(active+1)) or weighted ROUND_ROBIN (EDF), measuring real latency.
//
// The EndpointSlice addresses are identifiers from 198.18.0.0/15 (the API
// server rejects loopback addresses); a load generator maps the endpoint
// address it receives to the pod's loopback server and never sends anything
// to 198.18.0.0/15.
//
// Phases: warm-up and a "before" window on the plain Service with Istio's
// default LEAST_REQUEST (what a user has before opting in), then the
// optimizer is applied and runs until the weights and the load balancer
// converge, then a second window. It
// prints a live table, a before/after summary, and writes an SVG picture.
// Ctrl-C stops it and everything it started.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	cfg, err := ParseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		n := 0
		for range sigs {
			n++
			if n == 1 {
				fmt.Fprintln(os.Stderr, "\ndemo: interrupted; stopping everything it started (press Ctrl-C twice more to exit at once)")
				cancel()
				continue
			}
			if n >= 3 {
				fmt.Fprintln(os.Stderr, "demo: exiting without waiting; Prometheus and istiod die with this process, kube-apiserver and etcd may not")
				os.Exit(130)
			}
		}
	}()
	_, err = run(ctx, cfg, os.Stdout)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "demo: interrupted before the end; nothing it started is left running")
		os.Exit(130)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}
