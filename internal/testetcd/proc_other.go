//go:build !linux

package testetcd

import "syscall"

// procAttr asks for nothing outside Linux, which has no parent-death signal: members of a
// test binary that dies before its cleanup keep running.
func procAttr() *syscall.SysProcAttr {
	return nil
}
