package harness

import "syscall"

// istiodSysProcAttr puts istiod in its own process group (so Stop can kill
// the group) and has the kernel kill it if the test binary dies first.
func istiodSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
