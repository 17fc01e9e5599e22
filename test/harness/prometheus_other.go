//go:build !linux

package harness

import "syscall"

// prometheusSysProcAttr puts Prometheus in its own process group so Stop, Kill
// and Pause reach exactly it.
func prometheusSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
