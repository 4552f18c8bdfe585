package rtnl

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/internal/testns"
)

// TestSubscriptionJoin: a subscription hears nothing of a group it has not joined, and
// hears the group's notifications once it joins it.
func TestSubscriptionJoin(t *testing.T) {
	ns := testns.Named(t, "naples-sub")
	nsh := testns.Handle(t, ns)
	sub, err := Subscribe(&nsh, 1<<20, unix.RTNLGRP_IPV4_IFADDR)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	// A notification that never comes fails the test instead of blocking it.
	stop := time.AfterFunc(20*time.Second, func() { sub.Close() })
	defer stop.Stop()
	if err := sub.SetReceiveBuffer(2 << 20); err != nil {
		t.Fatal(err)
	}
	// A link, of which the subscription hears nothing, then an address, which it hears.
	testns.Run(t, "ip", "-n", ns, "link", "add", "sub0", "type", "veth", "peer", "name", "sub1")
	testns.Run(t, "ip", "-n", ns, "addr", "add", "192.0.2.1/24", "dev", "sub0")
	var got []uint16
	if err := sub.Receive(func(typ uint16, _ []byte) { got = append(got, typ) }); err != nil {
		t.Fatal(err)
	}
	for _, typ := range got {
		if typ == unix.RTM_NEWLINK {
			t.Errorf("a subscription to addresses heard of a link")
		}
	}

	if err := sub.Join(unix.RTNLGRP_LINK); err != nil {
		t.Fatal(err)
	}
	testns.Run(t, "ip", "-n", ns, "link", "set", "sub0", "mtu", "1400")
	heard := false
	for !heard {
		if err := sub.Receive(func(typ uint16, _ []byte) { heard = heard || typ == unix.RTM_NEWLINK }); err != nil {
			t.Fatal(err)
		}
	}
}
