//go:build !linux

package agent

import "github.com/vishvananda/netns"

// KernelView stands for hal/linux's view of a network namespace's kernel, which only Linux
// hosts have.
type KernelView struct{}

// newKernelView returns a view that reads nothing.
func newKernelView(*netns.NsHandle) *KernelView { return &KernelView{} }
