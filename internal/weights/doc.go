// Package weights gives each pod the traffic that minimises the Service's
// expected request time, given what can be measured of its capacity,
// without loading any pod past a utilisation cap.
//
// Capacity-proportional traffic (every pod equally busy, the contract of
// ROUND_ROBIN) is the limit this approaches as the Service nears full
// load; below it the rule leans to faster pods, and with unlike cores it
// fills many-core pods fuller, since their queues are shorter at one
// utilisation. One rule, not modes. The package is pure: no I/O, time is
// passed in, results are deterministic and independent of input order.
//
// # Four stages
//
// Each cycle (Engine.Update) runs four stages, a file each:
//
//  1. observe (observe.go): the signals and the weight timeline become
//     per-pod readings with their uncertainty. A pod's speed per core is
//     requests per CPU-second with request rates, else its traffic share
//     per CPU-second, the share averaged over the span the backend's rate()
//     may have covered (an interval, see timeline.go: a weight change inside
//     the window widens it, so it is never mistaken for a change of speed;
//     with request rates, which are scraped apart from the CPU, so does a
//     move of the Service's load between this window and the last).
//     A pod at its CPU limit on CPU alone gives a censored reading: its speed
//     is at most its share over the limit (a CPU reading above the limit is
//     noise). The cores of a pod without a limit come from its
//     latency (Erlang C) or its node's idle CPU. A backlog is the queue
//     beyond a pod's usual: sent minus served while the clients follow the
//     weights, and by Little's law its request rate times the latency beyond
//     its usual. A pod first seen at its CPU limit borrows as its usual
//     latency the most a pod that kept up waits, scaled to its speed (its
//     own reading then may be the queue), while it stays at its limit and
//     no longer than that queue takes to serve. A pod without data gives
//     no reading, never a zero.
//  2. estimate (estimate.go): one Kalman filter per pod over log speed
//     (and one over log cores for a pod without a limit): a mean and a
//     variance. The readings' noise is measured from the residuals (for
//     cores, their spread, so an estimate that is off is not taken for
//     noise, and a reading of the node's idle CPU, or one clamped at it,
//     by that reading's own spread too, which carries the neighbours'
//     noise); a speed read from
//     request rates on fewer requests than the median pod's adds the
//     count noise of the difference (1/n for exponential work); a change that
//     persists (a CUSUM of innovations) or a jump restarts the filter
//     with a wide variance, so the estimate moves fast, then settles to
//     Smoothing per reading. A noise no steady
//     window has shown over the estimates' memory is taken from the
//     readings' own scatter (each pod's reading against its last, and
//     its recent CPU against its window's). A censored reading is a
//     truncated update (Tobit), backing off below the bound by the gap it
//     found. Each cycle's readings are put in the estimates' units by the
//     offset that puts the most estimates inside their ranges (a median of
//     the ends), a bound at a CPU limit counting as a range open below.
//  3. decide (decide.go): one solver. Minimise sum x_i T_i(x_i) subject to
//     sum x_i = load and x_i <= maxUtilisation mu_i, T_i the mean time of
//     an M/M/c queue of the pod's cores and speed (Sakasegawa's
//     approximation, convex), by water-filling on the marginal cost. A
//     backlog is capacity the pod owes over DrainTime, and it is sent no
//     more than it has until it clears. A pod without data keeps its
//     traffic. Where no pod's cores are known the load cannot be related
//     to the capacity, and the solver gives capacity shares.
//  4. publish (publish.go): new weights are written only when their
//     predicted gain over the live weights, in the same objective
//     (the objective with the solver's bounds priced in: its Lagrangian,
//     so that weights past the cap, cheaper in T alone, are no gain) beats
//     what the estimates' noise carried through the solver could show by
//     chance (zSigmas; a settled estimate's noise, or a speed estimate's
//     own while it has only begun) plus a write's cost (DeadBand² of the
//     request time), and moves some pod's traffic by at least DeadBand
//     (closer weights are converged; judged on the weights the write would
//     send, each live share against the new one) unless a pod is sent its
//     capacity or its estimate is following a change; a pod that the MaxRatio floor
//     holds on both sides is compared at its live traffic; then MaxStep,
//     MaxRatio (0.05x-20x by default, see Params.MaxRatio), integers of at
//     least 1,
//     and sums per locality below 2^32-1.
//
// Result.Learned says the estimates are confident (their standard
// deviation within the dead band, or the readings' noise where that is
// larger) for the pods carrying all the traffic
// but what the cap's headroom could absorb (1-maxUtilisation, 7%), and no
// pod is behind (a no-limit pod's cores resting on one reading are not yet
// confident): until then the operator keeps
// LEAST_REQUEST. Result.Reasons says why, as typed codes (reasons.go);
// Result.Message renders them.
//
// # Between cycles
//
// Engine.Alarm judges a look at the pods' latency over the last two
// scrape intervals: a pod whose latency is at least alarmLatency (4)
// times its usual and zSigmas beyond its usual recent-to-window ratio
// rings it, and the operator runs an early cycle (Observation.Early) that
// reads the extra wait as a backlog and cuts the pod at once. An early
// cycle's windows are mostly the last cycle's: it reads backlogs, not
// speeds.
//
// # When data is missing
//
//   - Mean CPU below MinCPU (idle pods: CPU is mostly overhead): weights
//     are held (LowLoad).
//   - A failed query (Holding) or no CPU data at all (NoData): weights are
//     held until Expiry has passed since the last good observation, then
//     every pod gets the same weight (Fallback). What was learned is kept.
//   - Some pods without data (PartialData): their weights are kept
//     exactly; the others move as far as their own data shows.
//   - NaN, infinite and negative values are no data.
//   - With CPU alone, a pod without a limit whose node CPU is unknown is
//     one nothing shows overloaded: it is weighted by its guessed cores
//     and the measured pods' speed, and Learned stays false (CPUOnly).
//
// # Using it
//
// A controller creates one Engine per optimized Service, calls Seed (or,
// with a persisted Snapshot of an engine that had learned them,
// SeedSettled; of one still learning them, SeedLearning; of one that had
// fallen back to equal weights, Restore then Seed) with the weights
// found in an existing ServiceEntry after a restart, calls Update every
// cycle, writes Result.Weights when Result.Changed, then calls Applied. After
// SeedSettled each pod's first cycle with data takes the capacity that
// makes its live weight the solver's answer (its speed from that cycle's
// reading, adjusted until the solver gives back its live share; a pod
// without a limit takes its cores from its first reading, as a settled
// estimate, and has the adjustment shared with them by the two readings'
// noises, a speed being read far more precisely), so a restart moves
// nothing the data does not show and a learned engine stays Learned. The
// endpoint mirror calls Weights when pods come and go.
// An Engine is not safe for concurrent use.
package weights
