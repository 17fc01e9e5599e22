package weights

import (
	"maps"
	"math"
	"slices"
	"time"
)

// epoch is a set of weights that was live from `from` until the next epoch
// began. The first epoch of a timeline also stands for all time before it.
type epoch struct {
	from    time.Time
	weights map[string]uint32
	total   float64 // sum of weights; exact in float64 (< 2^53)
}

func newEpoch(from time.Time, w map[string]uint32) epoch {
	total := 0.0
	for _, v := range w {
		total += float64(v)
	}
	return epoch{from: from, weights: w, total: total}
}

// timeline remembers which weights Envoy had over the recent past, because a
// pod's CPU over a query window follows the traffic share it held over that
// window, not the share it holds now.
type timeline struct {
	epochs []epoch // oldest first
}

// reset forgets the past and records that w has been live since long before at.
func (t *timeline) reset(at time.Time, w map[string]uint32) {
	t.epochs = []epoch{newEpoch(at, w)}
}

// record notes that w became live at `at`. Writes closer together than
// bucket are merged into one epoch, so a burst of pod events cannot grow the
// timeline without bound; the error is at most bucket of misplaced traffic.
func (t *timeline) record(at time.Time, w map[string]uint32, bucket time.Duration) {
	if len(t.epochs) == 0 {
		// Before the first write Envoy balanced the pods evenly: that is what
		// it does for endpoints without weights.
		t.epochs = append(t.epochs, newEpoch(at, equalWeights(w)))
	}
	last := &t.epochs[len(t.epochs)-1]
	if at.Before(last.from) {
		at = last.from // a clock that went backwards: keep the timeline ordered
	}
	if len(t.epochs) > 1 && at.Sub(last.from) < bucket {
		*last = newEpoch(last.from, w)
		return
	}
	t.epochs = append(t.epochs, newEpoch(at, w))
}

// prune drops epochs that ended before `before`. The oldest kept epoch then
// stands for all earlier time, which no observation reaches any more.
func (t *timeline) prune(before time.Time) {
	keep := 0
	for k := range t.epochs {
		if !t.epochs[k].from.After(before) {
			keep = k
		}
	}
	if keep > 0 {
		t.epochs = append([]epoch(nil), t.epochs[keep:]...)
	}
}

// segment is one epoch seen from an observation: it starts `start` seconds
// relative to the observation time (negative: before it; -Inf for the
// oldest) and lasts until the next segment starts, or the observation.
type segment struct {
	start float64
	ep    *epoch
}

// segmentsSince returns the epochs live at some time in [earliest, 0],
// where times are seconds relative to obsTime.
func (t *timeline) segmentsSince(obsTime time.Time, earliest float64) []segment {
	var segs []segment
	for k := range t.epochs {
		start := math.Inf(-1)
		if k > 0 {
			start = secondsBetween(obsTime, t.epochs[k].from)
		}
		if start >= 0 {
			break // became live at or after the observation: not in its data
		}
		if start <= earliest {
			segs = segs[:0] // everything before ended by earliest
		}
		segs = append(segs, segment{start: start, ep: &t.epochs[k]})
	}
	return segs
}

// steady returns the weights that were live over all of the span d before
// obsTime, nil if they changed within it (or none were recorded).
func (t *timeline) steady(obsTime time.Time, d time.Duration) map[string]uint32 {
	segs := t.segmentsSince(obsTime, -d.Seconds())
	if len(segs) == 0 {
		return nil
	}
	w := segs[len(segs)-1].ep.weights
	for _, s := range segs {
		if !maps.Equal(s.ep.weights, w) {
			return nil
		}
	}
	return w
}

// secondsBetween is at minus ref in seconds, without the overflow of
// time.Duration for far-apart times.
func secondsBetween(ref, at time.Time) float64 {
	return float64(at.Unix()-ref.Unix()) + float64(at.Nanosecond()-ref.Nanosecond())/1e9
}

// window is a span [from, to] in seconds relative to the observation time.
type window struct{ from, to float64 }

// rateWindows lists the spans a rate() over the query window W may really
// have averaged, when the backend scrapes every S: Prometheus uses the
// samples inside the window, which span at least W-S and end at most S
// before the query; a plain increase over the whole window spans W. So a
// span starts at or after -W, ends between -S and 0, and is at least W-S
// long. A pod's average share over a span is a ratio of functions linear
// in its two ends between the times where an end meets a weight change, so
// its extremes lie at the corners of those pieces, which this returns.
func rateWindows(p Params, segs []segment) []window {
	w := p.QueryWindow.Seconds()
	s := p.ScrapeInterval.Seconds()
	if s <= 0 {
		return []window{{-w, 0}}
	}
	minLen := w - s
	var breaks []float64
	for _, seg := range segs {
		if seg.start > -w && seg.start < 0 {
			breaks = append(breaks, seg.start)
		}
	}
	// A rate's resolution is one scrape: more weight changes than the
	// window holds scrapes cannot be told apart, and thinning them to that
	// many keeps a burst of writes from making one cycle expensive.
	maxBreaks := int(math.Ceil(w/s)) + 1
	if len(breaks) > maxBreaks {
		thinned := make([]float64, 0, maxBreaks)
		for i := range maxBreaks {
			thinned = append(thinned, breaks[i*len(breaks)/maxBreaks])
		}
		breaks = thinned
	}
	starts := []float64{-w}
	ends := []float64{-s, 0}
	for _, b := range breaks {
		if b < -w+s {
			starts = append(starts, b)
		}
		if b > -s {
			ends = append(ends, b)
		}
	}
	var out []window
	for _, end := range ends {
		for _, start := range starts {
			if end-start >= minLen {
				out = append(out, window{start, end})
			}
		}
		out = append(out, window{end - minLen, end}) // the shortest span
	}
	for _, start := range starts {
		if end := start + minLen; end > -s && end < 0 {
			out = append(out, window{start, end})
		}
	}
	return out
}

// shareRange returns the least and the greatest average traffic share the
// pod can have had over any of the windows. ok is false when the pod was
// not live during all of them (it joined or left meanwhile), since its rate
// then covers only part of the window.
func shareRange(name string, segs []segment, windows []window) (lo, hi float64, ok bool) {
	if len(segs) == 0 {
		return 0, 0, false
	}
	var buf [8]float64
	shares := buf[:0]
	for _, seg := range segs {
		w, present := seg.ep.weights[name]
		if !present || seg.ep.total <= 0 {
			return 0, 0, false
		}
		shares = append(shares, float64(w)/seg.ep.total)
	}
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, win := range windows {
		avg := averageShare(segs, shares, win)
		lo, hi = min(lo, avg), max(hi, avg)
	}
	return lo, hi, lo > 0 && !math.IsInf(hi, 0)
}

// averageShare integrates a piecewise-constant share over win.
func averageShare(segs []segment, shares []float64, win window) float64 {
	if win.to <= win.from {
		return 0
	}
	sum := 0.0
	for k, seg := range segs {
		end := 0.0
		if k+1 < len(segs) {
			end = segs[k+1].start
		}
		from, to := max(seg.start, win.from), min(end, win.to)
		if to > from {
			sum += shares[k] * (to - from)
		}
	}
	return sum / (win.to - win.from)
}

// equalWeights gives every pod of w the same weight.
func equalWeights(w map[string]uint32) map[string]uint32 {
	out := make(map[string]uint32, len(w))
	for name := range w {
		out[name] = 1
	}
	return out
}

// equalOver gives every pod of the set the same weight.
func equalOver(set []Pod) map[string]uint32 {
	out := make(map[string]uint32, len(set))
	for _, pod := range set {
		out[pod.Name] = 1
	}
	return out
}

// sortedNames returns the keys of w in order, so that every loop over a map
// that feeds a result runs in one order.
func sortedNames(w map[string]uint32) []string { return slices.Sorted(maps.Keys(w)) }
