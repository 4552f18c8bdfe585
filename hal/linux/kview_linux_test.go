package linux

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	"github.com/naplesnet/naples/internal/testns"
	"golang.org/x/sys/unix"
)

// TestKernelViewOneSubscription runs the observers of every reconciler of one namespace
// that share a view, as the agent does, and counts the process's netlink sockets in the
// namespace that are bound to rtnetlink multicast groups: exactly one.
func TestKernelViewOneSubscription(t *testing.T) {
	ns := testns.Named(t, "naples-view")
	nsh := testns.Handle(t, ns)
	s := newTestStore(t, epIndexes())
	view := NewKernelView(KernelViewOptions{Namespace: &nsh})
	bpfDir := filepath.Join("/sys/fs/bpf", ns)
	t.Cleanup(func() { os.RemoveAll(bpfDir) })

	var observers []hal.Observer
	closed := func(r interface{ Close() error }, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		observers = append(observers, r.(hal.Observer))
	}
	closed(NewRouteReconciler(RouteOptions{Store: s.store, Namespace: &nsh, View: view, Logger: quiet}))
	closed(NewInterfaceReconciler(InterfaceOptions{Store: s.store, Namespace: &nsh, View: view, Logger: quiet,
		StateFile: filepath.Join(t.TempDir(), "interfaces.json")}))
	closed(NewNodeReconciler(NodeOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Logger: quiet}))
	closed(NewNetworkReconciler(NetworkOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Logger: quiet,
		BPFDir: bpfDir, StateFile: filepath.Join(t.TempDir(), "sysctls.json")}))
	closed(NewEndpointReconciler(EndpointOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Logger: quiet,
		StateFile: filepath.Join(t.TempDir(), "endpoints.json")}))

	for _, o := range observers {
		runObserver(t, o)
	}
	if got := testns.RouteSubscriptions(t, ns); got != 1 {
		t.Errorf("%d rtnetlink sockets with multicast groups in the namespace, want 1", got)
	}
	if got := view.subscriptions.Load(); got != 1 {
		t.Errorf("the view opened %d subscriptions, want 1", got)
	}

	// The observers share what the kernel reports: a link added by hand reaches the
	// interface observer through the one subscription (its mirror holds it).
	testns.Run(t, "ip", "-n", ns, "link", "add", "view7", "type", "veth", "peer", "name", "view8")
	rec := observers[1].(*InterfaceReconciler)
	waitFor(t, "the interface observer to hear of view7", func() bool {
		_, ok := rec.links.Get("view7")
		return ok
	})
}

// TestKernelViewQueueOverflow checks that an observer whose queue overflows fails with
// rtnl.ErrOverflow, and that notifications are handed only to the observers of their
// group.
func TestKernelViewQueueOverflow(t *testing.T) {
	link := &viewWatcher{groups: 1 << unix.RTNLGRP_LINK, limit: 64, wake: make(chan struct{}, 1)}
	addr := &viewWatcher{groups: 1 << unix.RTNLGRP_IPV4_IFADDR, limit: 1 << 20, wake: make(chan struct{}, 1)}
	payload := make([]byte, 40)
	payload[0] = unix.AF_UNSPEC
	for range 2 {
		for _, w := range []*viewWatcher{link, addr} {
			if w.groups&(1<<notificationGroup(unix.RTM_NEWLINK, payload)) != 0 {
				w.push(unix.RTM_NEWLINK, payload)
			}
		}
	}
	if !errors.Is(link.err, rtnl.ErrOverflow) {
		t.Errorf("the link watcher's error is %v, want rtnl.ErrOverflow", link.err)
	}
	if len(addr.queue) != 0 || addr.err != nil {
		t.Errorf("the address watcher queued %d bytes (error %v), want none", len(addr.queue), addr.err)
	}
	if g := notificationGroup(unix.RTM_NEWADDR, []byte{unix.AF_INET6}); g != unix.RTNLGRP_IPV6_IFADDR {
		t.Errorf("an IPv6 address goes to group %d, want %d", g, unix.RTNLGRP_IPV6_IFADDR)
	}
}
