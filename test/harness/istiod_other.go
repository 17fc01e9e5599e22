//go:build !linux

package harness

import "syscall"

// istiodSysProcAttr puts istiod in its own process group so Stop can kill
// the group.
func istiodSysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
