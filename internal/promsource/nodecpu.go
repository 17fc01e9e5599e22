package promsource

// DefaultNodeCPUQuery is the default node CPU signal: for each pod, the CPU
// in use on the pod's node over the query window, in cores, every container
// and the system included: the rate of cAdvisor's root cgroup
// (container_cpu_usage_seconds_total{id="/"}). With the node's allocatable
// CPU it tells the engine what a pod without a CPU limit could use now: its
// own CPU plus what its node leaves idle. Pods with a CPU limit do not need it.
//
// Pods are mapped to nodes through the pods' own cAdvisor series (any
// application container; the value is multiplied by 0), which must carry a
// node label, as the kubelet ServiceMonitor of the Prometheus Operator
// (kube-prometheus-stack) sets. Where the kubelet is scraped by a
// role: node job instead (the prometheus community chart's
// kubernetes-nodes-cadvisor), the node name is in the instance label:
// override the template with "instance" in place of "node". One root-cgroup
// series per node is expected; max rather than sum keeps a node scraped
// twice (two jobs, or replicas behind a query layer that does not
// deduplicate) from counting twice.
//
// kube-prometheus-stack drops the root cgroup by default (the kubelet
// cAdvisorMetricRelabelings rule "Drop cgroup metrics with no pod",
// sourceLabels [id, pod], regex '.+;'); its regex '/.+;' keeps the root
// cgroup ("/") and still drops the other pod-less cgroups. Without the root
// series this query answers nothing, and pods without a CPU limit are
// bounded by their node's allocatable CPU alone.
//
// The root-cgroup selector carries no namespace matcher: it is a node-level
// total, not another team's per-pod series, and the answer is reduced to
// one number per pod of the optimizer's Service.
const DefaultNodeCPUQuery = `max by (pod) (max by (pod, node) (container_cpu_usage_seconds_total{namespace="{{.Namespace}}", pod=~"{{.Pods}}", container!="", container!="POD"}) * 0 + on (node) group_left () max by (node) (rate(container_cpu_usage_seconds_total{id="/"}[{{.Window}}])))`
