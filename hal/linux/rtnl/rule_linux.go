package rtnl

import (
	"encoding/binary"

	"golang.org/x/sys/unix"
)

// Rule is a decoded RTM_NEWRULE or RTM_DELRULE message (`ip rule show`): struct
// fib_rule_hdr and the attributes of it that the HAL reads.
type Rule struct {
	// Family is the rule's family, AF_INET or AF_INET6.
	Family uint8
	// DstLen, SrcLen and TOS select packets by destination, source and TOS; 0 when the
	// rule does not.
	DstLen, SrcLen, TOS uint8
	// Table is FRA_TABLE, or the header's table without it.
	Table uint32
	// Action is the rule's action (FR_ACT_TO_TBL, FR_ACT_PROHIBIT, ...).
	Action uint8
	// Flags are the header's flags (FIB_RULE_*).
	Flags uint32
	// Priority is FRA_PRIORITY (`pref`).
	Priority uint32
	// IIF is FRA_IIFNAME, the input interface the rule selects.
	IIF string
	// FwMark is FRA_FWMARK; FwMask is FRA_FWMASK, all ones when the message carried none.
	FwMark, FwMask uint32
	// SuppressPrefixLen and SuppressIfGroup are FRA_SUPPRESS_PREFIXLEN and
	// FRA_SUPPRESS_IFGROUP; the kernel reports them for every rule, all ones when unset,
	// as they are when the message carried none.
	SuppressPrefixLen, SuppressIfGroup uint32
	// Protocol is FRA_PROTOCOL, who added the rule.
	Protocol uint8
	// Other tells that the message carried an attribute ParseRule does not decode
	// (FRA_OIFNAME, FRA_GOTO, FRA_SPORT_RANGE, ...): a selector or action beyond these.
	Other bool
}

// ParseRule decodes the payload of an RTM_NEWRULE or RTM_DELRULE message (struct
// fib_rule_hdr and its attributes). ok is false when the payload is too short to hold
// struct fib_rule_hdr.
func ParseRule(b []byte) (r Rule, ok bool) {
	const hdrLen = 12
	if len(b) < hdrLen {
		return Rule{}, false
	}
	r.Family, r.DstLen, r.SrcLen, r.TOS = b[0], b[1], b[2], b[3]
	r.Table = uint32(b[4])
	r.Action = b[7]
	r.Flags = binary.NativeEndian.Uint32(b[8:12])
	r.FwMask, r.SuppressPrefixLen, r.SuppressIfGroup = ^uint32(0), ^uint32(0), ^uint32(0)
	EachAttr(b[hdrLen:], func(typ uint16, v []byte) {
		switch typ {
		case unix.FRA_PRIORITY:
			r.Priority = AttrUint32(v)
		case unix.FRA_TABLE:
			r.Table = AttrUint32(v)
		case unix.FRA_IIFNAME:
			r.IIF = CString(v)
		case unix.FRA_FWMARK:
			r.FwMark = AttrUint32(v)
		case unix.FRA_FWMASK:
			r.FwMask = AttrUint32(v)
		case unix.FRA_PROTOCOL:
			if len(v) > 0 {
				r.Protocol = v[0]
			}
		case unix.FRA_SUPPRESS_PREFIXLEN:
			r.SuppressPrefixLen = AttrUint32(v)
		case unix.FRA_SUPPRESS_IFGROUP:
			r.SuppressIfGroup = AttrUint32(v)
		default:
			r.Other = true
		}
	})
	return r, true
}

// AppendRuleRequest appends to b a request of the type, RTM_NEWRULE (`ip rule add`) or
// RTM_DELRULE (`ip rule del`), for the rule r: struct fib_rule_hdr with its family,
// action and table (0 in the header for a table above 255), then FRA_PRIORITY, and each
// of FRA_IIFNAME, FRA_FWMARK with FRA_FWMASK (FwMask, all ones when 0), FRA_TABLE and
// FRA_PROTOCOL when r sets it. The other fields of r are not sent.
func AppendRuleRequest(b []byte, typ, flags uint16, r Rule) []byte {
	b = Message(b, typ, flags)
	table := byte(0)
	if r.Table < 256 {
		table = byte(r.Table)
	}
	// struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags.
	b = append(b, r.Family, 0, 0, 0, table, 0, 0, r.Action, 0, 0, 0, 0)
	b = AppendAttrUint32(b, unix.FRA_PRIORITY, r.Priority)
	if r.IIF != "" {
		b = AppendAttrString(b, unix.FRA_IIFNAME, r.IIF)
	}
	if r.FwMark != 0 {
		mask := r.FwMask
		if mask == 0 {
			mask = ^uint32(0)
		}
		b = AppendAttrUint32(b, unix.FRA_FWMARK, r.FwMark)
		b = AppendAttrUint32(b, unix.FRA_FWMASK, mask)
	}
	if r.Table > 0 {
		b = AppendAttrUint32(b, unix.FRA_TABLE, r.Table)
	}
	if r.Protocol > 0 {
		b = AppendAttr(b, unix.FRA_PROTOCOL, []byte{r.Protocol})
	}
	return b
}
