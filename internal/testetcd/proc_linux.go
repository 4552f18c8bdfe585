package testetcd

import "syscall"

// procAttr makes the kernel kill a member when the thread that started it exits, so that
// a test binary that dies (a panic, a -timeout) takes its etcd processes with it. The
// member's waiter goroutine keeps that thread locked while the member runs.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
