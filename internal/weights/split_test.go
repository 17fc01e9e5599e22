package weights

import (
	"math"
	"slices"
	"testing"
)

// SplitWithin is Split bounded as the engine bounds its weights: a pod
// Split sends nothing gets mean/ratio, one it sends more than mean*ratio
// gets that, the pods between keep Split's proportions, and where no pod
// reaches a bound it is Split.
func TestSplitWithinBoundsSplitAsTheEngineDoes(t *testing.T) {
	cores := []float64{2, 2, 2, 2, 2, 2}
	speeds := []float64{1, 1, 0.6, 0.6, 0.35, 0.35}
	capacity := 0.0
	for i := range cores {
		capacity += cores[i] * speeds[i]
	}
	for _, tc := range []struct {
		load, ratio float64
		wantFloor   bool // some pod's share is below mean/ratio in Split
		wantCeiling bool // and some pod's above mean*ratio
	}{{0.2, 10, true, false}, {0.9, 10, false, false}, {0.2, 2, true, true}} {
		ratio := tc.ratio
		free := Split(cores, speeds, tc.load*capacity)
		got := SplitWithin(cores, speeds, tc.load*capacity, ratio)
		mean := 1 / float64(len(cores))
		sum, floored, capped := 0.0, 0, 0
		for i := range got {
			sum += got[i]
			if free[i] < mean/ratio {
				floored++
			}
			if free[i] > mean*ratio {
				capped++
			}
			if got[i] < mean/ratio*(1-1e-9) || got[i] > mean*ratio*(1+1e-9) {
				t.Errorf("load %.1f: pod %d has share %.4f, outside [%.4f, %.4f]", tc.load, i, got[i], mean/ratio, mean*ratio)
			}
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Errorf("load %.1f: shares sum to %v, not 1", tc.load, sum)
		}
		if (floored > 0) != tc.wantFloor || (capped > 0) != tc.wantCeiling {
			t.Fatalf("load %.1f, ratio %v: Split puts %d pods below the floor and %d above the ceiling (%v); the test expects some below: %v, above: %v",
				tc.load, ratio, floored, capped, free, tc.wantFloor, tc.wantCeiling)
		}
		for i := range got {
			for j := range got {
				if free[i] < mean/ratio || free[j] < mean/ratio || free[i] > mean*ratio || free[j] > mean*ratio {
					continue
				}
				if r, w := got[i]/got[j], free[i]/free[j]; math.Abs(r/w-1) > 1e-9 {
					t.Errorf("load %.1f: pods %d and %d above the floor in the ratio %.4f, Split's is %.4f", tc.load, i, j, r, w)
				}
			}
		}
		if !tc.wantFloor {
			for i := range got {
				if math.Abs(got[i]-free[i]) > 1e-12 {
					t.Errorf("load %.1f: no pod at the floor, yet pod %d's share %.6f is not Split's %.6f", tc.load, i, got[i], free[i])
				}
			}
		}
	}
}

// A ratio of 1 or less, or NaN, leaves no room around the mean: equal shares.
func TestSplitWithinNoRatioIsEqualShares(t *testing.T) {
	for _, ratio := range []float64{1, 0.5, 0, -3, math.NaN()} {
		for i, v := range SplitWithin([]float64{1, 2, 8}, []float64{1, 0.5, 0.3}, 3, ratio) {
			if math.Abs(v-1.0/3) > 1e-12 {
				t.Errorf("ratio %v: pod %d's share %v, want 1/3", ratio, i, v)
			}
		}
	}
}

// FuzzSplitWithin: whatever the cores, speeds, load and ratio, the shares
// are finite, sum to 1 (or are all 0 when no pod is valid), and with a
// ratio the engine accepts (1-100) stay within it of the mean, to well
// below rounding.
func FuzzSplitWithin(f *testing.F) {
	f.Add([]byte{2, 10, 2, 6, 2, 3, 20, 10})
	f.Add([]byte{8, 10, 8, 10, 1, 5, 1, 5, 95, 2})
	f.Add([]byte{0, 0, 255, 255, 1, 1, 0, 0})
	// Found by fuzzing: a pod taking all at ratio 2 and at ratio 3 (the
	// repeated clamp left it past the ceiling), and two fast pods among
	// many starved ones at ratio 49 (a rounding residue read as a scale).
	f.Add([]byte("000100\x01"))
	f.Add([]byte("0000000001" + "0\x02"))
	f.Add(append(slices.Repeat([]byte{48, 48}, 40), 48, 248, 48, 248, 65, 48))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 4 {
			return
		}
		ratio := 1 + float64(data[len(data)-1]%100)
		load := float64(data[len(data)-2]) / 10
		data = data[:len(data)-2]
		var cores, speeds []float64
		for i := 0; i+1 < len(data); i += 2 {
			cores = append(cores, float64(data[i])/2)
			speeds = append(speeds, float64(data[i+1])/10)
		}
		x := SplitWithin(cores, speeds, load, ratio)
		if len(x) != len(cores) {
			t.Fatalf("%d shares for %d pods", len(x), len(cores))
		}
		sum := 0.0
		for i, v := range x {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("pod %d: share %v (cores %v, speeds %v, load %v, ratio %v)", i, v, cores, speeds, load, ratio)
			}
			sum += v
		}
		if sum == 0 {
			return
		}
		if math.Abs(sum-1) > 1e-9 {
			t.Fatalf("shares sum to %v: %v", sum, x)
		}
		// clampRatio repeats a bounded number of times: what it leaves is
		// held to a fifth of what rounding a floor weight (smallestWeight)
		// to an integer moves it by.
		tol := 0.2 * 0.5 / smallestWeight
		mean := 1 / float64(len(x))
		for i, v := range x {
			if v < mean/ratio*(1-tol) || v > mean*ratio*(1+tol) {
				t.Errorf("pod %d: share %v outside [%v, %v] (ratio %v; cores %v, speeds %v, load %v)", i, v, mean/ratio, mean*ratio, ratio, cores, speeds, load)
			}
		}
	})
}
