package weights

import (
	"math"
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
