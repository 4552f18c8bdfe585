package rtnl

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestParseRule decodes `ip rule add iif br0 lookup 1000 pref 1000 proto 242`, whose
// unset mask and suppressors read as all ones, and tells an attribute it does not decode.
func TestParseRule(t *testing.T) {
	b := []byte{unix.AF_INET, 0, 0, 0, unix.RT_TABLE_UNSPEC, 0, 0, unix.FR_ACT_TO_TBL, 0, 0, 0, 0}
	b = AppendAttrUint32(b, unix.FRA_PRIORITY, 1000)
	b = AppendAttrUint32(b, unix.FRA_TABLE, 1000)
	b = AppendAttrString(b, unix.FRA_IIFNAME, "br0")
	b = AppendAttrUint8(b, unix.FRA_PROTOCOL, 242)
	want := Rule{Family: unix.AF_INET, Table: 1000, Action: unix.FR_ACT_TO_TBL, Priority: 1000, IIF: "br0",
		FwMask: ^uint32(0), SuppressPrefixLen: ^uint32(0), SuppressIfGroup: ^uint32(0), Protocol: 242}
	if got, ok := ParseRule(b); !ok || got != want {
		t.Errorf("ParseRule = %+v, %v\nwant %+v, true", got, ok, want)
	}
	b = AppendAttrString(b, unix.FRA_OIFNAME, "eth0")
	want.Other = true
	if got, ok := ParseRule(b); !ok || got != want {
		t.Errorf("ParseRule with an oif = %+v, %v\nwant %+v, true", got, ok, want)
	}
}

// TestRuleRequestRoundTrip: a rule built by AppendRuleRequest parses back as the rule,
// in a table above 255 and with a firewall mark matched whole.
func TestRuleRequestRoundTrip(t *testing.T) {
	r := Rule{Family: unix.AF_INET6, Table: 1000, Action: unix.FR_ACT_TO_TBL, Priority: 900, FwMark: 0x4200,
		FwMask: ^uint32(0), SuppressPrefixLen: ^uint32(0), SuppressIfGroup: ^uint32(0), Protocol: 242}
	msg := AppendRuleRequest(nil, unix.RTM_NEWRULE, 0, r)
	if got, ok := ParseRule(msg[unix.NLMSG_HDRLEN:]); !ok || got != r {
		t.Errorf("ParseRule(AppendRuleRequest(r)) = %+v, %v\nwant %+v, true", got, ok, r)
	}
}
