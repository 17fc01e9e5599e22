//go:build !linux

package harness

import "syscall"

// childProcAttr puts a started component (istiod, Prometheus) in its own
// process group, so that Stop, Kill and Pause reach exactly it.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
