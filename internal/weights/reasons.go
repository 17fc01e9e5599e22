package weights

import (
	"fmt"
	"strings"
	"time"
)

// ReasonCode says why a cycle came out as it did. Status and tests read the
// codes; Result.Message renders them for people.
type ReasonCode string

const (
	// ReasonQueryFailed: the metrics query failed (Detail: the error).
	ReasonQueryFailed ReasonCode = "QueryFailed"
	// ReasonNoData: the query succeeded but no pod had CPU data (Pods).
	ReasonNoData ReasonCode = "NoData"
	// ReasonExpired: no usable data for Until, past the expiry: equal weights.
	ReasonExpired ReasonCode = "Expired"
	// ReasonRecovered: data is back after a cycle without it.
	ReasonRecovered ReasonCode = "Recovered"
	// ReasonLowLoad: mean CPU (Value) below MinCPU (Limit): weights held.
	ReasonLowLoad ReasonCode = "LowLoad"
	// ReasonPartialData: these Pods had no CPU data; their weights are kept.
	ReasonPartialData ReasonCode = "PartialData"
	// ReasonNewData: these Pods had no CPU data at a cycle within the last
	// query window and scrape interval (the horizon): their rates cover part
	// of the window, and their weights are kept until a whole one holds
	// their data.
	ReasonNewData ReasonCode = "NewData"
	// ReasonMoved: the predicted gain (Gain) beat the bar (Bar); the live
	// weights were up to Value off the new ones (the largest gap between
	// a pod's live share and its new one, relative to the new; as for
	// Steady, on the weights a write would send); learned from Count of
	// Of pods (Detail: SpeedsFromRequests or SpeedsFromCPU).
	ReasonMoved ReasonCode = "Moved"
	// ReasonSteady: the gain did not beat the bar, or no live weight is
	// the dead band (Limit, set then) off its target; the live weights
	// are up to Value off the targets; nothing moved.
	ReasonSteady ReasonCode = "Steady"
	// ReasonBacklog: these Pods hold a backlog and are sent less until it clears.
	ReasonBacklog ReasonCode = "Backlog"
	// ReasonSaturated: these Pods used all the CPU they could.
	ReasonSaturated ReasonCode = "Saturated"
	// ReasonFloorOverload: the MaxRatio floor (Limit) alone sends these
	// Pods more than they can serve: their weight is the least the ratio
	// allows, and their queue grows whatever the other weights.
	ReasonFloorOverload ReasonCode = "FloorOverload"
	// ReasonCPUOnly: these Pods have no CPU limit and nothing in CPU alone
	// shows their overload; they are weighted by guessed cores and not
	// learned from (Result.Unlearned).
	ReasonCPUOnly ReasonCode = "CPUOnly"
	// ReasonPastCap: the load (Value, a share of the estimated capacity)
	// is past the utilisation cap (Limit): the weights are capacity shares
	// and every pod runs above the cap, where chance queues grow (see
	// maxUtilisation).
	ReasonPastCap ReasonCode = "PastCap"
)

// Where an optimizing cycle's speeds came from: the Detail of its
// ReasonMoved or ReasonSteady.
const (
	// SpeedsFromRequests: requests served per CPU-second.
	SpeedsFromRequests = "requests"
	// SpeedsFromCPU: CPU alone, against the live weights' shares.
	SpeedsFromCPU = "cpu"
)

// SpeedsFrom returns where the speeds of the cycle with these reasons came
// from (SpeedsFromRequests or SpeedsFromCPU), "" for a cycle that did not
// optimize (no data, low load, a failed query).
func SpeedsFrom(reasons []Reason) string {
	for _, r := range reasons {
		if r.Code == ReasonMoved || r.Code == ReasonSteady {
			return r.Detail
		}
	}
	return ""
}

// Reason is one typed reason with its parameters.
type Reason struct {
	Code      ReasonCode
	Pods      []string      `json:",omitempty"`
	Value     float64       `json:",omitempty"`
	Limit     float64       `json:",omitempty"`
	Gain, Bar float64       `json:",omitempty"`
	Count, Of int           `json:",omitempty"`
	Until     time.Duration `json:",omitempty"`
	Detail    string        `json:",omitempty"`
}

// Has reports whether reasons hold code, and the first such reason.
func Has(reasons []Reason, code ReasonCode) (Reason, bool) {
	for _, r := range reasons {
		if r.Code == code {
			return r, true
		}
	}
	return Reason{}, false
}

// render turns reasons into the human-readable Message.
func render(reasons []Reason) string {
	parts := make([]string, 0, len(reasons))
	for _, r := range reasons {
		parts = append(parts, r.String())
	}
	return strings.Join(parts, "; ")
}

func (r Reason) String() string {
	pods := func() string {
		if len(r.Pods) <= 3 {
			return strings.Join(r.Pods, ", ")
		}
		return fmt.Sprintf("%s and %d more", strings.Join(r.Pods[:3], ", "), len(r.Pods)-3)
	}
	source := "CPU and the weights held"
	if r.Detail == SpeedsFromRequests {
		source = "requests per CPU-second"
	}
	switch r.Code {
	case ReasonQueryFailed:
		return fmt.Sprintf("Metrics query failed: %s; holding the last weights, equal weights in %v unless data returns", r.Detail, r.Until.Round(time.Second))
	case ReasonNoData:
		return fmt.Sprintf("The query returned no CPU data for any of the %d pods; holding the last weights, equal weights in %v unless data returns", len(r.Pods), r.Until.Round(time.Second))
	case ReasonExpired:
		return fmt.Sprintf("no usable data for %v, longer than the expiry: equal weights", r.Until.Round(time.Second))
	case ReasonRecovered:
		return "Metrics are back"
	case ReasonLowLoad:
		return fmt.Sprintf("Low load: the pods use %.3f cores on average, below the %.3f needed to learn from; weights held", r.Value, r.Limit)
	case ReasonPartialData:
		return fmt.Sprintf("no CPU data for %d pod(s) (%s): their weights are kept", len(r.Pods), pods())
	case ReasonNewData:
		return fmt.Sprintf("%d pod(s) (%s) lacked CPU data within the last query window and scrape interval: their weights are kept until a whole window holds their data", len(r.Pods), pods())
	case ReasonMoved:
		return fmt.Sprintf("Optimizing: the live weights were up to %.1f%% off the new ones, for a predicted gain of %.2g%% of the request time (bar %.2g%%); learned from %d of %d pods using %s",
			100*r.Value, 100*r.Gain, 100*r.Bar, r.Count, r.Of, source)
	case ReasonSteady:
		if r.Limit > 0 {
			return fmt.Sprintf("Steady: the live weights are up to %.1f%% off the targets, which would gain %.2g%% of the request time (bar %.2g%%), but none is %.0f%% (the dead band) off: the estimates are settling; learned from %d of %d pods using %s",
				100*r.Value, 100*r.Gain, 100*r.Bar, 100*r.Limit, r.Count, r.Of, source)
		}
		return fmt.Sprintf("Steady: the live weights are up to %.1f%% off the targets, which would gain %.2g%% of the request time, within the %.2g%% the estimates' noise and a write's cost allow; learned from %d of %d pods using %s",
			100*r.Value, 100*max(r.Gain, 0), 100*r.Bar, r.Count, r.Of, source)
	case ReasonBacklog:
		return fmt.Sprintf("%d pod(s) with a backlog (%s) get less traffic until it clears", len(r.Pods), pods())
	case ReasonSaturated:
		return fmt.Sprintf("%d pod(s) at their CPU limit (%s)", len(r.Pods), pods())
	case ReasonFloorOverload:
		return fmt.Sprintf("%d pod(s) (%s) are sent more than they can serve by the weight floor alone (the mean weight over a max weight ratio of %g): their queue grows; raise the ratio, or give them more CPU", len(r.Pods), pods(), r.Limit)
	case ReasonPastCap:
		return fmt.Sprintf("the load is %.0f%% of the pods' estimated capacity, past the %.0f%% any pod is loaded to: every pod is sent its capacity share and runs above that", 100*r.Value, 100*r.Limit)
	case ReasonCPUOnly:
		return fmt.Sprintf("%d pod(s) without a CPU limit or node CPU data (%s) are weighted by their guessed cores, not learned from CPU alone, and LEAST_REQUEST is kept", len(r.Pods), pods())
	}
	return string(r.Code)
}
