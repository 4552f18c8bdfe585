package linux

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/testns"
)

// TestTraceRouted asks the kernel for the routes of packets that come up from a bridge,
// as a trace's at the gateway: through the policy rules, a destination the bridge's
// table covers is routed, one no table covers is not, nor one a rule prohibits.
func TestTraceRouted(t *testing.T) {
	ns := testns.Named(t, "naples-troute")
	nsh := testns.Handle(t, ns)
	for _, args := range [][]string{
		{"link", "add", "br-t", "type", "bridge"},
		{"link", "set", "br-t", "up"},
		{"addr", "add", "10.1.0.1/24", "dev", "br-t"},
		{"route", "add", "10.20.0.0/16", "via", "10.1.0.2", "table", "100"},
		{"rule", "add", "iif", "br-t", "lookup", "100", "pref", "1000"},
		// What the table does not cover goes no further, for 10.30.0.0/16.
		{"rule", "add", "iif", "br-t", "to", "10.30.0.0/16", "prohibit", "pref", "1001"},
	} {
		testns.Run(t, "ip", append([]string{"-n", ns}, args...)...)
	}
	testns.Run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	out := testns.Run(t, "ip", "-n", ns, "-o", "link", "show", "br-t")
	first, _, _ := strings.Cut(out, ":")
	index, err := strconv.Atoi(first)
	if err != nil {
		t.Fatalf("the index of br-t in %q: %v", out, err)
	}
	view := NewKernelView(KernelViewOptions{Namespace: &nsh})
	src := netip.MustParseAddr("10.1.0.11")
	for _, tc := range []struct {
		dst  string
		want bool
	}{{"10.20.3.4", true}, {"10.1.0.98", true}, {"10.9.9.9", false}, {"10.30.0.1", false}} {
		got, err := TraceRouted(t.Context(), view, int32(index), src, netip.MustParseAddr(tc.dst))
		if err != nil || got != tc.want {
			t.Errorf("TraceRouted(%s → %s) = %v, %v; want %v", src, tc.dst, got, err, tc.want)
		}
	}
	if _, err := TraceRouted(t.Context(), view, int32(index), src, netip.MustParseAddr("2001:db8::1")); err == nil {
		t.Error("TraceRouted with addresses of two families: no error")
	}
}
