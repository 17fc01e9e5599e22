package weights

import "time"

// Params tunes the engine. DefaultParams returns values that work. Sampling
// is not tuning: it says how the metrics were taken.
type Params struct {
	Sampling
	// DeadBand is the cost of a write, as a relative weight error (0.05 =
	// 5%): new weights are written only when the request time they are
	// predicted to save beats what targets each DeadBand off, plus the
	// estimates' own uncertainty, would cost (see publish.go). Every write
	// is an xDS push to every client sidecar.
	DeadBand float64
	// MaxStep bounds the relative move of one weight in one write (1.0 =
	// may double or halve), so one bad reading cannot swing the traffic.
	MaxStep float64
	// MaxRatio keeps every weight within [mean/MaxRatio, mean*MaxRatio].
	// Envoy's scheduler needs no bound (gRPC clips its own weights, at 0.1x
	// in grpc-java and 0.01x in grpc core, to spare its picker CPU); here
	// the floor keeps every pod measured, and its price is the traffic it
	// sends to slow pods at low load, where the best weights send them
	// almost none. The default, 20, is measured (bench --max-ratio, 16 runs
	// each) on four Services at 20-42% load on which the floor binds: from
	// 10 to 20 their median p99 fell 3.5-10% while the weights settled in
	// as many writes (median within half a write) and cycles (at most one
	// more); from 25 on two of them took 1-2 more writes and 2-3 more
	// cycles to settle, their floored pods measured from so few requests
	// that the estimates scatter, for a p99 at most 2.2% lower.
	MaxRatio float64
	// Smoothing is the share of a new reading in a settled estimate (1 =
	// none): the random walk each estimate's filter assumes. After a change
	// the filter's variance is raised and the first readings are averaged
	// plainly (1/2, 1/3, ...) until their share falls to Smoothing. 1/Smoothing
	// is also how many cycles the noise and residual histories remember.
	Smoothing float64
	// MinCPU (cores per pod, mean over pods with data): below it weights are
	// held, since idle pods' CPU is mostly overhead, not work.
	MinCPU float64
	// SlowStart ramps a new pod's weight over this duration (0 = off).
	SlowStart time.Duration
	// Expiry: after the last good observation, failed queries hold the last
	// weights this long, then weights fall back to equal.
	Expiry time.Duration
	// PoolByHardware: a pod without an estimate of its own starts from the
	// speed per core of the pods of its HardwareClass (their mean log
	// speed: a geometric mean).
	PoolByHardware bool
	// Retired holds settings whose engine meaning is gone; they are
	// accepted and have no effect.
	Retired
	// DrainTime: a backlog (requests queued beyond a pod's usual queue) is
	// capacity the pod owes: while it drains, the solver takes its capacity
	// as its own minus the backlog over DrainTime, and sends it no more than
	// it has now. Without it a backlog drains only at the spare capacity
	// left at capacity shares, which at high load takes minutes. Backlogs
	// are measured from request rates and latency. 0 = off.
	DrainTime time.Duration
}

// Sampling is how the signals were measured, as the metrics pipeline
// sets it: facts the engine must be told, not settings that tune it.
type Sampling struct {
	// QueryWindow is the range of the rate() that produced the signals; the
	// engine averages the weights each pod held over it.
	QueryWindow time.Duration
	// ScrapeInterval is how often the metrics backend scrapes the pods (plus
	// any delay of the exporter). A rate() over QueryWindow really averages
	// the samples it found: a span of QueryWindow-ScrapeInterval to
	// QueryWindow that ends up to one ScrapeInterval before the query. The
	// engine only draws conclusions that hold for every such span, so a
	// weight change inside the window cannot be mistaken for a capacity
	// change. 0 means the rate covers exactly the query window.
	ScrapeInterval time.Duration
}

// Retired are Params fields kept so that configurations that set them
// still load; they have no effect. SpeedTilt and MinimizeLatency bent
// capacity shares towards faster pods and blended a latency-minimising
// split in below 60% load: the one solver does both (see decide.go).
type Retired struct {
	SpeedTilt       float64
	MinimizeLatency bool
}

// Pod is one endpoint of the current endpoint set.
type Pod struct {
	Name          string    // stable key (pod name)
	Locality      string    // region/zone/subzone
	HardwareClass string    // node instance type, "" when unknown
	ReadySince    time.Time // when the pod became ready; zero = long ago
	// Cores is the CPU the pod may use (its limit), in cores; 0 = unknown.
	// Optional. Weights are proportional to speed per core times Cores (pods
	// without it count as the median of those with it), and a pod using all
	// of its Cores is known to be saturated, so its CPU understates its load.
	Cores float64
	// CPURequest is the CPU the pod's application containers request, in
	// cores; 0 = unknown. A floor on what the pod can use when Cores is 0.
	CPURequest float64
	// NodeCores is the allocatable CPU of the pod's node, in cores; 0 =
	// unknown. A ceiling on what the pod can use when Cores is 0.
	NodeCores float64
	// Node is the name of the pod's node, "" when unknown. Pods of the set
	// on one node share what that node leaves idle (Signal.NodeCPU).
	Node string
}

// Signal is what the metrics backend said about one pod over the query window.
// A NaN, infinite or negative field means "no data".
type Signal struct {
	CPU      float64 // cores (rate of CPU seconds)
	Requests float64 // requests per second served
	// Latency is the mean time the pod's own sidecar measured per request
	// over the window, in seconds (Istio's
	// istio_request_duration_milliseconds, reporter="destination": rate of
	// _sum over rate of _count); queueing at a saturated pod shows here
	// whatever its cores. Optional.
	Latency float64
	// NodeCPU is the CPU in use on the pod's node over the window, in
	// cores, every container and the system included (cAdvisor's root
	// cgroup, container_cpu_usage_seconds_total{id="/"}). With
	// Pod.NodeCores it shows what a pod without a CPU limit could use now:
	// its own CPU plus what its node leaves idle. Optional; 0 (a node with
	// a pod on it is never at 0) or no data = unknown.
	NodeCPU float64
	// RecentCPU is the pod's CPU over the last two scrape intervals, in
	// cores. A pod that has just reached its CPU limit shows it here a
	// cycle before the window's rate does (see readRecentCPU). Optional; 0
	// or no data = unknown.
	RecentCPU float64
	// RecentLatency is Latency over the last two scrape intervals, for
	// Engine.Alarm between cycles and, in Update, a backlog by Little's law
	// (see readBacklogs). Optional; 0 or no data = unknown.
	RecentLatency float64
	// RecentRequests is Requests over the same two scrape intervals. With
	// the live weights it shows whether a pod whose recent latency rings
	// the alarm serves less than it is sent (see Alarm). Optional; NaN,
	// Inf or negative = unknown, and a Service whose pods all read 0 says
	// nothing either.
	RecentRequests float64
}

// Observation is one cycle's query result.
type Observation struct {
	Time    time.Time
	Err     error             // non-nil: the whole query failed
	Signals map[string]Signal // by Pod.Name; missing pods have no data
	// Early: the cycle runs between the regular ones because Alarm rang.
	// It says nothing of how often cycles run, which the engine measures
	// (its noise bands and Snapshot depend on it).
	Early bool
	// Balancer is the load balancer the clients ran over the query window,
	// as the policy that writes the DestinationRule knows it; "" = unknown
	// (the engine then assumes the operator's default: LEAST_REQUEST until
	// a result is Learned, ROUND_ROBIN after). Under
	// LEAST_REQUEST traffic does not follow the weights, so sent minus
	// served measures no backlog; the latency still does.
	Balancer Balancer
	// RoundRobinSince is when ROUND_ROBIN last took over from
	// LEAST_REQUEST, while it is live; zero = not live, or live since
	// before any sample the engine reads (as Balancer says). Right after
	// a switch the recent rates and latencies (Signal.RecentLatency,
	// RecentRequests) show ROUND_ROBIN while Balancer, the window's, is
	// still LEAST_REQUEST.
	RoundRobinSince time.Time
}

// Balancer is a client-side load-balancing policy the DestinationRule can set.
type Balancer string

const (
	// BalancerRoundRobin: Envoy's weighted ROUND_ROBIN; traffic follows
	// the weights.
	BalancerRoundRobin Balancer = "ROUND_ROBIN"
	// BalancerLeastRequest: Envoy's weighted LEAST_REQUEST; traffic follows
	// the weights only where no queue steers it away.
	BalancerLeastRequest Balancer = "LEAST_REQUEST"
)

// Mode says what the engine did this cycle.
type Mode string

const (
	ModeOptimizing Mode = "Optimizing" // new weights written: their gain beat the bar
	ModeSteady     Mode = "Steady"     // the gain did not beat the bar; nothing moved
	ModeLowLoad    Mode = "LowLoad"    // too little CPU to learn from; weights held
	ModeHolding    Mode = "Holding"    // query failed; last good weights held
	ModeFallback   Mode = "Fallback"   // failures past Expiry; equal weights
	ModeNoData     Mode = "NoData"     // query succeeded but no pod had data
)

// Result is one cycle's outcome.
type Result struct {
	Weights  map[string]uint32 // by Pod.Name, every pod of the set, each >= 1
	Changed  bool              // new weights were worth a write (see publish.go), or the set changed
	Mode     Mode
	Capacity map[string]float64 // current capacity estimate per pod (relative units)
	Message  string             // human-readable explanation for status, rendered from Reasons
	// Reasons says why, as typed codes with parameters (see ReasonCode).
	Reasons []Reason
	// Learned: the weights rest on capacity estimates from data for the
	// pods that carry most of the traffic, not on equal or default weights.
	// Until then the operator may keep a queue-aware load balancer
	// (LEAST_REQUEST) in place of weighted ROUND_ROBIN, so opting in is
	// never worse than Istio's default.
	Learned bool
	// Doubtful: the result is not Learned only because some estimates from
	// data are less sure than the dead band; no pod is behind, blind or
	// without data. It is not evidence against the weights: the operator
	// keeps ROUND_ROBIN through it, and a pod they overload shows a queue.
	Doubtful bool
	// Unlearned counts the pods weighted by their guessed cores and not
	// learned from: with CPU alone, pods without a limit whose CPU request
	// or node is known but whose node CPU is not, so that nothing would
	// show them overloaded. While it is above 0, Learned is false.
	Unlearned int
}
