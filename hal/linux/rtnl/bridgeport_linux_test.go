package rtnl

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/internal/testns"
)

// TestBridgePortLearningRoundTrip sets bridge ports' learning, one with `bridge link set`
// and one with a request AppendLinkRequest builds, and reads it back from the kernel with
// BridgeLinkDumpRequest and ParseLink (IFLA_PROTINFO): the ports, and only they, with
// the flag each was given.
func TestBridgePortLearningRoundTrip(t *testing.T) {
	ns := testns.Named(t, "naples-brport")
	nsh := testns.Handle(t, ns)
	ip := func(args ...string) { testns.Run(t, "ip", append([]string{"-n", ns}, args...)...) }
	ip("link", "add", "br0", "type", "bridge")
	ip("link", "add", "p0", "type", "veth", "peer", "name", "q0")
	ip("link", "add", "p1", "type", "veth", "peer", "name", "q1")
	ip("link", "set", "p0", "master", "br0")
	ip("link", "set", "p1", "master", "br0")
	testns.Run(t, "bridge", "-n", ns, "link", "set", "dev", "p0", "learning", "off")

	r, err := NewReader(&nsh, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// p1 learns, as a new port does; the request turns it off and on again.
	for _, learning := range []bool{false, true} {
		msg := AppendLinkRequest(nil, unix.RTM_NEWLINK, 0, Link{Name: "p1", Port: BridgePortInfo{Learning: learning}}, 0,
			LinkName|LinkPortLearning)
		if err := r.Get(t.Context(), msg, func(uint16, []byte) {}); err != nil {
			t.Fatalf("setting p1's learning to %v: %v", learning, err)
		}
		got := map[string]bool{}
		err := r.Dump(t.Context(), BridgeLinkDumpRequest(), func() { clear(got) }, func(typ uint16, payload []byte) {
			l, ok := ParseLink(payload)
			if typ != unix.RTM_NEWLINK || !ok {
				t.Errorf("message %d of the dump: ok %v", typ, ok)
				return
			}
			if l.Family != unix.AF_BRIDGE || !l.Protinfo || !l.BridgePort {
				t.Errorf("%s: family %d, protinfo %v, bridge port %v; want AF_BRIDGE, true, true", l.Name, l.Family, l.Protinfo, l.BridgePort)
			}
			got[l.Name] = l.Port.Learning
		})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{"p0": false, "p1": learning}
		if len(got) != len(want) || got["p0"] != want["p0"] || got["p1"] != want["p1"] {
			t.Errorf("learning of the bridge ports after setting p1's to %v = %v, want %v", learning, got, want)
		}
	}
}

// TestBridgeLinkDumpRequest decodes the request: RTM_GETLINK, struct ifinfomsg of family
// AF_BRIDGE and nothing else, as strict checking wants it.
func TestBridgeLinkDumpRequest(t *testing.T) {
	b := BridgeLinkDumpRequest()
	if typ := binary.NativeEndian.Uint16(b[4:6]); typ != unix.RTM_GETLINK || len(b) != unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg {
		t.Fatalf("request of %d bytes, type %d; want %d bytes, RTM_GETLINK", len(b), typ, unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg)
	}
	l, ok := ParseLink(b[unix.NLMSG_HDRLEN:])
	if !ok || l != (Link{Family: unix.AF_BRIDGE}) {
		t.Errorf("ParseLink of the request = %+v, %v; want family AF_BRIDGE alone", l, ok)
	}
}
