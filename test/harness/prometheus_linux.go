package harness

import "syscall"

// prometheusSysProcAttr puts Prometheus in its own process group (so Stop, Kill
// and Pause reach exactly it) and has the kernel kill it if the test binary dies.
func prometheusSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
