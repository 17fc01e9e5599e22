package harness

import "syscall"

// childProcAttr puts a started component (istiod, Prometheus) in its own
// process group, so that Stop, Kill and Pause reach exactly it, and has the
// kernel kill it if the test binary dies first.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
