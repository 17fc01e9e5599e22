// Package weights turns per-pod load signals into integer endpoint weights
// proportional to each pod's capacity, so that Envoy's weighted round robin
// gives every pod the same utilisation. It is pure: no I/O, time is
// injected, and results are deterministic and independent of input order.
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
//     units of the measured noise) shows a persistent change.
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
//  1. Weights are proportional to capacity, with mean MeanWeight, and kept
//     within MaxRatio of the mean (gRPC clients clip at 0.1x to 10x).
//  2. Slow start scales a new pod's weight from 10% up to full over
//     SlowStart after it became ready.
//  3. Compared in shares with the weights Envoy has (the sum of the pods
//     that stay is matched), a weight moves at most MaxStep per cycle.
//  4. If no weight moved by more than its band, nothing changes: pods that
//     stay keep their exact weights and Changed is false, unless pods came
//     or went. The band is the dead band plus three standard deviations of
//     the estimate's own noise (consecutive observations share half their
//     window, which is accounted for), so noise never causes a write. A
//     weight computed from a rough estimate is refined once, against a
//     quarter of the dead band, when the estimate has matured, so that an
//     early error is corrected at a known moment and not by chance later.
//  5. Weights are integers of at least 1, and each is at most
//     (2^32-2)/pods, so that no locality's sum reaches 2^32-1.
//
// # When data is missing
//
//   - Mean CPU below MinCPU (idle pods: CPU is mostly overhead): weights are
//     held (LowLoad).
//   - A failed query (Holding) or no usable data at all (NoData): weights
//     are held until Expiry has passed since the last good observation,
//     then every pod gets the same weight (Fallback). What was learned is
//     kept, and the weights return to it as soon as data does.
//   - NaN, infinite and negative values are no data. A pod without data
//     keeps its estimate, or gets the median.
//
// # Using it
//
// A controller creates one Engine per optimized Service, calls Seed with
// the weights found in an existing ServiceEntry after a restart, calls
// Update every cycle and writes Result.Weights when Result.Changed, then
// calls Applied. The endpoint mirror calls Weights when pods come and go,
// then Applied after writing. An Engine is not safe for concurrent use.
package weights
