package main

import "runtime"

// Contention profiles (--pprof-contention): what pprof's /debug/pprof/block
// and /debug/pprof/mutex report is where goroutines wait on channels, locks
// and each other, which a CPU profile does not show. Both are sampled, so
// the cost stays a small share of the contended operations themselves.
const (
	// blockProfileRate samples, on average, one blocking event per 100 µs
	// spent blocked: a reconcile's waits of a millisecond or more are all
	// seen, the microsecond hand-offs of a channel mostly not.
	blockProfileRate = 100_000 // nanoseconds
	// mutexProfileFraction records one contended unlock in ten.
	mutexProfileFraction = 10
)

// enableContentionProfiles turns the block and mutex profiles on.
func enableContentionProfiles() {
	runtime.SetBlockProfileRate(blockProfileRate)
	runtime.SetMutexProfileFraction(mutexProfileFraction)
}
