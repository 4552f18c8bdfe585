// Package testns gives tests fresh network namespaces, the root check that privileged
// tests share, and a count of the rtnetlink subscriptions a test holds in a namespace.
package testns

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
)

// RequireRoot skips the test when not running as root outside CI, and fails it when CI is set:
// privileged tests must run in CI.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("this test needs root, and CI must run it as root")
	}
	t.Skip("needs root; runs in CI")
}

var seq atomic.Uint64

// Named creates a fresh named network namespace (visible to `ip netns exec`) with its
// loopback up, and deletes it when the test ends. The name starts with prefix and is
// unique within the machine.
func Named(t testing.TB, prefix string) string {
	t.Helper()
	RequireRoot(t)
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.Add(1))
	if len(name) > 64 {
		t.Fatalf("namespace name %q too long", name)
	}
	Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("deleting namespace %s: %v: %s", name, err, out)
		}
	})
	Run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// Run runs a command and fails the test when it fails, returning its output.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Handle opens the named namespace for netlink.NewHandleAt and friends and closes it when
// the test ends.
func Handle(t testing.TB, name string) netns.NsHandle {
	t.Helper()
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatalf("opening namespace %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// RouteSubscriptions returns the number of the calling process's NETLINK_ROUTE sockets in
// the named namespace that are bound to multicast groups (`ip monitor`'s kind): the rows
// of the namespace's /proc/net/netlink with protocol 0 and groups whose inode is one of
// the process's descriptors.
func RouteSubscriptions(t testing.TB, name string) int {
	t.Helper()
	mine := map[string]bool{}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			mine[strings.TrimSuffix(inode, "]")] = true
		}
	}
	n := 0
	rows := strings.Split(Run(t, "ip", "netns", "exec", name, "cat", "/proc/net/netlink"), "\n")
	for _, row := range rows[1:] {
		// sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
		f := strings.Fields(row)
		if len(f) < 10 || f[1] != "0" || !mine[f[9]] {
			continue
		}
		if groups, err := strconv.ParseUint(f[3], 16, 64); err == nil && groups != 0 {
			n++
		}
	}
	return n
}
