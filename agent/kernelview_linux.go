package agent

import (
	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/hal/linux"
)

// KernelView is hal/linux's view of one network namespace's kernel, which the HAL's
// reconcilers share and through which the Inspector reads the kernel.
type KernelView = linux.KernelView

// newKernelView returns the view of namespace ns (nil: the agent's own).
func newKernelView(ns *netns.NsHandle) *KernelView {
	return linux.NewKernelView(linux.KernelViewOptions{Namespace: ns})
}
