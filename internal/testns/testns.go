// Package testns gives tests fresh network namespaces and the root check that privileged
// tests share.
package testns

import (
	"fmt"
	"os"
	"os/exec"
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
