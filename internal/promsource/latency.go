package promsource

// DefaultLatencyQuery is the default latency signal: the mean time, in
// seconds, each pod's own sidecar measured per request it served
// (reporter="destination") over the query window, from Istio's
// istio_request_duration_milliseconds histogram (rate of _sum over rate of
// _count, divided by 1000). It covers the pod's queueing and service time,
// not the network to it, so a pod close to saturation shows here whatever
// its cores.
//
// The pod label comes from the scrape target, as for DefaultRequestQuery. A
// pod that served no request in the window is left out (the "> 0" on the
// request rate), rather than answered with 0/0 = NaN: it has no latency
// this cycle.
const DefaultLatencyQuery = `sum by (pod) (rate(istio_request_duration_milliseconds_sum{reporter="destination", destination_workload_namespace="{{.Namespace}}", pod=~"{{.Pods}}"}[{{.Window}}])) / (sum by (pod) (rate(istio_request_duration_milliseconds_count{reporter="destination", destination_workload_namespace="{{.Namespace}}", pod=~"{{.Pods}}"}[{{.Window}}])) > 0) / 1000`
