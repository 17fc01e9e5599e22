// Package weights turns per-pod load signals into integer endpoint weights
// proportional to each pod's capacity, so that Envoy's weighted round robin
// gives every pod about the same utilisation; slightly tilted towards the
// faster pods, which lowers tail latency; and, while a pod has a backlog,
// below its capacity until the backlog is gone. It is pure: no I/O, time
// is injected, and results are deterministic and independent of input
// order.
//
// # What a pod's capacity is
//
// A pod's capacity is its speed per core times its cores. Speed shows in
// the metrics in one of two ways:
//
//   - With request rates (Istio's istio_requests_total), speed is requests
//     served per CPU-second: requests/s divided by CPU cores over the same
//     window. It does not depend on how traffic was split, so it is right
//     from the first cycle, even while a pod is overloaded. It is used when
//     at least half of the pods with CPU data have request data.
//   - With CPU alone, speed is the pod's share of the traffic per CPU-second,
//     because traffic follows weights. The share is not the current weight
//     but the one the pod held, averaged over the window the backend's rate
//     covered. The engine keeps a timeline of the weights it applied
//     (Applied) for this.
//
// The window is not known exactly. Prometheus' rate() over a window W
// averages the samples it finds: a span between W minus the scrape
// interval S and W long, ending up to S before the query. The engine
// considers every such span and keeps the range of shares they give. Right
// after a weight change that range is wide; an estimate then moves only as
// far as the range forces it, so a weight change half-way through the
// window is never mistaken for a change of speed. With steady weights the
// range is a point and the observation measures the pod. (Before anything
// is applied, as in a dry run, Envoy is taken to balance evenly.)
//
// A pod that uses all of its CPU limit (Pod.Cores) shows what it could do,
// not what it was sent: with CPU alone its speed is then only bounded from
// above, and its estimate is cut below that bound, deeper each cycle it
// stays saturated, until a cycle without saturation measures it exactly.
// A pod first seen saturated starts no higher than the median of the pods
// already known: its bound is set by its own share, too large by an
// unknown amount.
//
// # Pods without CPU limits
//
// A pod without a limit (Cores 0) can use what its node leaves it, and its
// capacity is its speed per core times those cores. The node's CPU in use
// (Signal.NodeCPU, cAdvisor's root cgroup) shows that ceiling: the pod's
// own CPU plus what its node (Pod.NodeCores) left idle, shared by the
// set's pods on that node (Pod.Node) in proportion to their use. One
// window's idle CPU is noisy (the neighbours' use varies), so the ceiling
// is averaged over cycles: plainly at first, then over about the last ten
// (ceilingGain), restarting when a window jumps beyond surpriseSigmas of
// the pod's usual noise (a neighbour came or went); a steady drift is
// followed at ceilingGain a cycle. A saturated pod's node shows idle CPU
// that is noise around zero, negative half included, so its negative
// values are averaged too: clamped at zero they would hold the average
// above the pod's cores, and hide the saturation. With CPU alone
// the ceiling stands in for a limit: it is the pod's cores, and a pod at
// it is saturated. With request rates it is the cores only until the
// latency measures them (below), and saturation is not judged by it: the
// node's idle CPU is noisy, and there a backlog is measured. The sidecar's
// latency (Signal.Latency, Istio's request duration at the
// destination) shows them: with u busy cores, s = u/requests CPU-seconds
// per request and mean latency L, the mean wait over the service time,
// (L-s)/s, is what an M/M/c queue of c cores shows at u busy cores,
// ErlangC(c, u)/(c-u), which falls steeply as c grows past u; the engine
// solves it for c. The estimate is bounded below by the pod's CPU request
// and the CPU it uses, above by its node's allocatable CPU (Pod.CPURequest,
// Pod.NodeCores), and averaged in log scale over windows in which the pod's
// traffic share held. Until a pod has one, or without latency data, its
// cores are the geometric mean of its bounds (the median of the pods with
// cores when it has none). A wait below 2% of the service time is taken
// as 2% (a lower bound on the cores), since the latency and CPU series,
// scraped apart, cannot tell less from noise.
//
// With CPU alone and no node CPU, a pod without a limit whose bounds are
// known has no sign of being overloaded: past its cores its CPU stops
// growing while its share grows, which reads as a faster pod, and its
// weight would run away. Such a pod keeps the weight of its guessed cores,
// is not learned from, and Result.Learned stays false while it is in the
// set, so the operator keeps LEAST_REQUEST (see markBlind). A pod with
// neither a limit nor bounds is taken to have the median cores and is
// learned from, as when nothing about cores is known.
//
// # From observations to estimates
//
// Observations of one cycle are in units that change with the total load,
// so they are first scaled to fit the current estimates: by the factor that
// puts the most estimates inside their ranges (a median, so one pod that
// really changed does not move the others). Then each estimate:
//
//   - is taken whole the first time a pod is observed;
//   - is averaged with later sharp observations, plainly (1/2, 1/3, ...)
//     until the share of a new one falls to Smoothing, then exponentially;
//   - restarts from the new observation when it jumps by more than twice
//     the larger of the dead band and four times the measured noise, or
//     when a cumulative sum of deviations in one direction (a CUSUM, in
//     units of the measured noise) shows a persistent change. For one
//     query window after a restart, observations replace the estimate
//     rather than being averaged into it: their windows may still mix the
//     pod's old and new speed.
//
// The noise of an observation is measured from the pods at steady weights
// (a robust median, so it is not inflated by a pod that changed). A pod
// without data gets the median capacity of the pods with estimates or,
// with PoolByHardware, the estimate of its hardware class (node instance
// type), which the engine remembers even when no pod of the class is left,
// so the pods of a rollout start near their right weight. Pods that joined
// within the query window or are still in slow start are not learned from,
// because their rate covers only part of the window.
//
// # From estimates to weights
//
// Each cycle:
//
//  0. With MinimizeLatency (the default), the pods' CPU known and no pod
//     at its limit (a Service with a saturated pod has no room to spare), the
//     traffic is split to minimise the mean time of a request: every pod
//     in use gets the traffic at which its marginal cost, (1/v)(1 +
//     d(rho w)/d rho) for speed per core v, utilisation rho and w the
//     M/M/c mean wait over the service time (Sakasegawa's approximation),
//     is the same. The offered load is the pods' busy cores times their
//     speeds per core, averaged over cycles. At low load this sends less
//     to slow pods (those whose time per request at zero load is above the
//     common marginal cost get only the MaxRatio floor). For the split,
//     speeds within a few bands (the dead band plus the estimates' noise)
//     of each other are drawn together, smoothly (see poolSpeeds), so pods
//     of one class share what it gives them instead of the one a hair
//     faster by noise taking it all, a different one each cycle. It is
//     used in
//     full below 40% of the capacity and blended linearly into step 1's
//     weights by 60%: for pods of one core count a busy Service needs even
//     utilisation, and ROUND_ROBIN's contract is capacity-proportional
//     traffic (pods of unlike cores, see step 1). Without CPU
//     data for every pod, step 1 applies alone. The load is the larger of
//     the average and the last window's, so a rising load is not averaged
//     away.
//  1. Weights are proportional to capacity times (speed per core)^SpeedTilt,
//     with mean MeanWeight, and kept within MaxRatio of the mean (gRPC
//     clients clip at 0.1x to 10x). Capacity shares equalise utilisation,
//     but at equal utilisation a request on a slow pod waits and runs
//     longer, so the slowest pods set the tail latency; the small default
//     tilt (0.03: pods of speeds 1 and 0.35 get about 1% more and 2% less
//     than their capacity shares) lowers p99 at every load. Identical pods
//     are not affected. With MinimizeLatency and a known load below 98% of
//     the capacity, pods of unlike cores are moved off equal utilisation:
//     each gets the utilisation at which its marginal queueing cost,
//     d(rho w)/d rho, is the same as every other pod's
//     (queueUtilisations), since at one utilisation a pod's queue is the
//     shorter the more cores it has (at 85%, 5.7 service times on one
//     core and 0.5 on eight). From 90% of the capacity (queueFadeFrom)
//     the utilisations fade back to the Service's own by 98%, and no pod
//     is given more than 95% (queueFullest), so that the fullest pod stays
//     below the saturation threshold whatever the mix. Pods of one core
//     count keep capacity shares, whatever their speeds. Estimated cores
//     within coresPool (a fifth) of each other are pooled first (close
//     estimates come out close, not always equal), and with CPU alone only
//     a Service whose pods all have CPU limits is moved: a pod run fuller
//     against a ceiling read from its node's noisy idle CPU is judged at
//     it and drained.
//  2. Slow start scales a new pod's weight from 10% up to full over
//     SlowStart after it became ready.
//  3. Pods with a backlog are drained (below).
//  4. Compared in shares with the weights Envoy has (the sum of the pods
//     that stay and are not drained is matched), a weight moves at most
//     MaxStep per cycle; drains are not bounded.
//  5. If no weight moved by more than its band, nothing changes: pods that
//     stay keep their exact weights and Changed is false, unless pods came
//     or went. The band is the dead band plus three standard deviations of
//     the estimate's own noise (consecutive observations share half their
//     window, which is accounted for), so noise never causes a write. A
//     weight computed from a rough estimate is refined once, against a
//     quarter of the dead band, when the estimate has matured, so that an
//     early error is corrected at a known moment and not by chance later.
//     A pod whose CPU is at its limit is evidence that its weight is too
//     high: a move down needs only a quarter of the dead band, never the
//     noise term. A drain that starts, ends or changes by more than the
//     dead band is always written.
//  6. Weights are integers of at least 1, and each is at most
//     (2^32-2)/pods, so that no locality's sum reaches 2^32-1.
//
// # Draining a backlog
//
// A pod sent more than it can serve (on equal weights before the first
// cycle, or in the minute it takes to notice that it slowed down) builds a
// queue. At capacity-proportional weights that queue drains only at the
// capacity the load leaves spare, a tenth of the pod's at 90% load, so it
// would last many minutes, and every request sent to the pod meanwhile
// waits behind it. So, when the live weights are the engine's own (not in a
// dry run):
//
//   - With request rates the backlog is measured. Over a rate's window a
//     pod was sent its average weight share (from the timeline) of the
//     total, and the total is what the pods that keep up serve per unit of
//     share (a median). Sent minus served, times the window, is how much
//     its queue grew over the window; the backlog is the one a window ago
//     plus that growth. A shortfall under 5% of what it was sent, or
//     within four standard deviations of a Poisson count, is not believed;
//     a pod whose CPU stayed below its limit and whose queue did not grow
//     had idle moments, so has no backlog. The pod is sent its capacity
//     (requests per CPU-second times Cores) minus its backlog over
//     DrainTime, at least a little (MaxRatio bounds it), until the backlog
//     is gone; then it gets its capacity weight back.
//   - While the engine has not Learned, the operator runs LEAST_REQUEST,
//     under which traffic does not follow the weights, so the backlog is
//     bounded by what the sidecar's latency shows: by Little's law the mean
//     queue over the window is requests times the mean wait (latency minus
//     CPU per request), and a queue that grew steadily ends at twice that.
//   - A pod whose CPU is at its Cores limit without a measured backlog
//     (no request rates, or a backlog built before the engine looked) is
//     overloaded by an unknown amount: it gets 0.8 of its capacity weight
//     until its CPU drops. "At its limit" is judged over the window and
//     over its last two scrape intervals (Signal.RecentCPU), so a pod
//     that just slowed down is drained, and LEAST_REQUEST kept, a cycle
//     sooner. The recent CPU counts only when it stands more than 2.5
//     standard deviations (robust, from the pod's last cycles) above the
//     window's: over two scrape intervals a pod serving few, long
//     requests reaches its limit by chance. With CPU alone, a pod without a limit is at its limit at
//     the lower of this window's ceiling (above) and the average, as the
//     idle CPU a saturated pod's node shows is noise around zero.
//   - The traffic taken off goes to the other pods, at most as much as
//     keeps their CPU below 95% of their limits: when the whole Service is
//     overloaded, nothing is drained.
//
// All of this waits for a cycle, and under weighted ROUND_ROBIN a pod that
// slows down just after one is sent its old share until the next. Between
// cycles the operator looks at the pods' sidecar latency over the last two
// scrape intervals (Signal.RecentLatency) every third of a scrape
// interval, and Engine.Alarm says whether it shows a pod overloaded that
// the last cycle did not know of: latency at twice or more the last
// cycle's, and beyond 2.5 robust deviations of how the two usually differ
// for that pod. When it rings the operator runs the cycle at once. It is
// silent while the engine has not Learned (LEAST_REQUEST steers around a
// queue) and for pods already drained or at their limit.
//
// The capacity estimates are not touched by a drain: requests per
// CPU-second do not depend on the share a pod is sent.
//
// # When data is missing
//
//   - Mean CPU below MinCPU (idle pods: CPU is mostly overhead): weights are
//     held (LowLoad).
//   - A failed query (Holding) or no usable data at all (NoData): weights
//     are held until Expiry has passed since the last good observation,
//     then every pod gets the same weight (Fallback). What was learned is
//     kept, and the weights return to it as soon as data does. Drained pods
//     get their capacity weight back at once: without data a drain cannot
//     be steered.
//   - NaN, infinite and negative values are no data. A pod without data
//     keeps its estimate, or gets the median.
//
// # Learned, and which load balancer to use
//
// Result.Learned is true when the pods whose weights rest on a settled
// estimate carry at least 90% of the traffic (the larger of a pod's share
// of the live and of the new weights). A pod is settled when its estimate
// came from data (with request rates: a sharp observation since the last
// restart of the estimate), its cores are a limit or, with latency data,
// measured, no drain holds it off its capacity, and no pod is one CPU
// alone cannot judge (above). Until then (the first
// cycle after opt-in, a surprise, a large drain, many new pods) the
// operator keeps Envoy's LEAST_REQUEST, which reacts to queues within a
// request and is never worse than the Service's default, and uses weighted
// ROUND_ROBIN once Learned. With CPU alone the speed is learned through
// traffic shares, which follow the engine's weights only once they are
// live: nothing is learned from windows that reach back before the first
// Applied (or Seed), when the Service ran on Istio's LEAST_REQUEST over
// equal weights and the pods that keep up got more than their share.
// Estimates from data then count as settled from their first cycle.
//
// # Using it
//
// A controller creates one Engine per optimized Service, calls Seed with
// the weights found in an existing ServiceEntry after a restart, calls
// Update every cycle and writes Result.Weights when Result.Changed, then
// calls Applied. The endpoint mirror calls Weights when pods come and go,
// then Applied after writing. An Engine is not safe for concurrent use.
package weights
