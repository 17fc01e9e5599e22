package harness

import (
	"fmt"
	"testing"
	"time"
)

// Poll calls cond every interval until it returns nil or the timeout has
// passed; cond is always called at least once, and once more at or after
// the timeout. It returns nil, or cond's last error wrapped with the
// timeout.
func Poll(timeout, interval time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("not true after %s: %w", timeout, err)
		}
		time.Sleep(interval)
	}
}

// Eventually polls cond every 50ms until it returns nil, and fails the test
// with cond's last error if that has not happened within the timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Poll(timeout, 50*time.Millisecond, cond); err != nil {
		t.Fatalf("%s: %v", what, err) // "<what>: not true after <timeout>: <err>"
	}
}
