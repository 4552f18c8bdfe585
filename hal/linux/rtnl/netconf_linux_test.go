package rtnl

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// TestIPv4ForwardingRequest decodes the request that sets a link's IPv4 forwarding the way
// the kernel's do_setlink does: RTM_SETLINK for the index, IFLA_AF_SPEC holding AF_INET
// holding IFLA_INET_CONF holding IPV4_DEVCONF_FORWARDING.
func TestIPv4ForwardingRequest(t *testing.T) {
	b := AppendIPv4ForwardingRequest(nil, 42, 1)
	ne := binary.NativeEndian
	if typ := ne.Uint16(b[4:6]); typ != unix.RTM_SETLINK {
		t.Fatalf("message type %d, want RTM_SETLINK (%d)", typ, unix.RTM_SETLINK)
	}
	payload := b[unix.NLMSG_HDRLEN:]
	if family, index := payload[0], int32(ne.Uint32(payload[4:8])); family != unix.AF_UNSPEC || index != 42 {
		t.Fatalf("ifinfomsg family %d index %d, want AF_UNSPEC, 42", family, index)
	}
	var found []uint32
	EachAttr(payload[unix.SizeofIfInfomsg:], func(typ uint16, spec []byte) {
		if typ != unix.IFLA_AF_SPEC {
			t.Errorf("attribute %d, want only IFLA_AF_SPEC", typ)
			return
		}
		EachAttr(spec, func(family uint16, inet []byte) {
			if family != unix.AF_INET {
				t.Errorf("IFLA_AF_SPEC holds family %d, want AF_INET", family)
				return
			}
			EachAttr(inet, func(typ uint16, conf []byte) {
				if typ != unix.IFLA_INET_CONF {
					t.Errorf("AF_INET holds %d, want IFLA_INET_CONF", typ)
					return
				}
				EachAttr(conf, func(index uint16, v []byte) {
					found = append(found, uint32(index), AttrUint32(v))
				})
			})
		})
	})
	if len(found) != 2 || found[0] != ipv4DevconfForwarding || found[1] != 1 {
		t.Fatalf("IFLA_INET_CONF holds %v, want [IPV4_DEVCONF_FORWARDING 1]", found)
	}
}

// TestParseNetconfForwarding reads NETCONFA_FORWARDING from an RTM_NEWNETCONF message
// and reports a message without it.
func TestParseNetconfForwarding(t *testing.T) {
	msg := AppendAttrUint32([]byte{unix.AF_INET, 0, 0, 0}, attrNetconfIfindex, 7)
	if _, ok := ParseNetconfForwarding(msg); ok {
		t.Fatal("a message without NETCONFA_FORWARDING: ok")
	}
	msg = AppendAttrUint32(msg, attrNetconfForwarding, 1)
	if v, ok := ParseNetconfForwarding(msg); !ok || v != 1 {
		t.Fatalf("forwarding %d, %v; want 1, true", v, ok)
	}
	if family, index, ok := ParseNetconfIndex(msg); family != unix.AF_INET || index != 7 || !ok {
		t.Fatalf("ParseNetconfIndex: %d, %d, %v; want AF_INET, 7, true", family, index, ok)
	}
}

// TestNetconfReportsAll tells the kernel's report of an interface's settings created,
// which carries them all, from that of one setting changed, and from one of none.
func TestNetconfReportsAll(t *testing.T) {
	const rpFilter, proxyNeigh = 3, 5 // NETCONFA_RP_FILTER, NETCONFA_PROXY_NEIGH
	index := AppendAttrUint32([]byte{unix.AF_INET, 0, 0, 0}, attrNetconfIfindex, 7)
	one := AppendAttrUint32(append([]byte(nil), index...), attrNetconfForwarding, 1)
	all := AppendAttrUint32(AppendAttrUint32(append([]byte(nil), one...), rpFilter, 0), proxyNeigh, 0)
	for _, c := range []struct {
		name string
		msg  []byte
		want bool
	}{
		{"IndexOnly", index, false},
		{"OneSetting", one, false},
		{"AllSettings", all, true},
		{"Short", []byte{unix.AF_INET}, false},
	} {
		if got := NetconfReportsAll(c.msg); got != c.want {
			t.Errorf("%s: NetconfReportsAll = %v, want %v", c.name, got, c.want)
		}
	}
}
