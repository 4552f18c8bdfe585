package firewall

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// dirNames and classNames name directions and protocol classes as Key.String writes them.
var (
	dirNames   = map[uint8]string{DirIngress: "ingress", DirEgress: "egress"}
	classNames = map[uint8]string{ClassTCP: "tcp", ClassUDP: "udp", ClassICMP: "icmp", ClassOther: "other"}
)

// DirName returns "ingress" or "egress" for DirIngress and DirEgress, the number otherwise.
func DirName(dir uint8) string {
	if n, ok := dirNames[dir]; ok {
		return n
	}
	return strconv.Itoa(int(dir))
}

// ClassName returns "tcp", "udp", "icmp" or "other" for a protocol class, the number
// otherwise.
func ClassName(class uint8) string {
	if n, ok := classNames[class]; ok {
		return n
	}
	return strconv.Itoa(int(class))
}

// String returns the key in a readable form, which the tests parse back:
//
//	endpoint ifindex=7
//	identity scope=0x9a3c 10.1.0.0/16
//	policy subject=0x1a2b dir=ingress class=tcp identity=0x33 ports=8000-8063
//	source ifindex=7 02:00:00:00:0a:01
//
// with identity=any for AnyIdentity and ports=any for every port. A key that is none of
// these is written as its prefix length and data in hex.
func (k Key) String() string {
	d := k.Data
	switch {
	case d[0] == TableEndpoint && k.PrefixLen == endpointBits:
		return fmt.Sprintf("endpoint ifindex=%d", binary.BigEndian.Uint32(d[1:5]))
	case d[0] == TableIdentity && k.PrefixLen >= identityBits:
		if p, ok := k.identityPrefix(); ok {
			return fmt.Sprintf("identity scope=%#x %s", binary.BigEndian.Uint32(d[1:5]), p)
		}
	case d[0] == TablePolicy && k.PrefixLen >= policyBits && k.PrefixLen <= policyBits+16:
		id := "any"
		if v := binary.BigEndian.Uint32(d[7:11]); v != AnyIdentity {
			id = fmt.Sprintf("%#x", v)
		}
		ports := PortPrefix{Port: binary.BigEndian.Uint16(d[11:13]), Bits: int(k.PrefixLen - policyBits)}
		return fmt.Sprintf("policy subject=%#x dir=%s class=%s identity=%s ports=%s",
			binary.BigEndian.Uint32(d[1:5]), DirName(d[5]), ClassName(d[6]), id, ports)
	case d[0] == TableSource:
		if ifindex, src, ok := k.Source(); ok {
			return fmt.Sprintf("source ifindex=%d %s", ifindex, src)
		}
	}
	return fmt.Sprintf("key prefixlen=%d data=%x", k.PrefixLen, d)
}

// Source returns the interface index and the address of a source key: a MAC as ip(8)
// writes it, an IP address, or a shorter prefix in CIDR form; false for other keys.
func (k Key) Source() (ifindex uint32, addr string, ok bool) {
	d := k.Data
	if d[0] != TableSource || k.PrefixLen < sourceBits {
		return 0, "", false
	}
	ifindex = binary.BigEndian.Uint32(d[1:5])
	var a netip.Addr
	switch d[5] {
	case SourceFamilyMAC:
		if k.PrefixLen != sourceBits+48 {
			return 0, "", false
		}
		return ifindex, net.HardwareAddr(d[6:12]).String(), true
	case SourceFamilyIPv4:
		a = netip.AddrFrom4([4]byte(d[6:10]))
	case SourceFamilyIPv6:
		a = netip.AddrFrom16([16]byte(d[6:22]))
	default:
		return 0, "", false
	}
	p, err := a.Prefix(int(k.PrefixLen - sourceBits))
	if err != nil {
		return 0, "", false
	}
	if p.IsSingleIP() {
		return ifindex, a.String(), true
	}
	return ifindex, p.String(), true
}

// identityPrefix returns the prefix of an identity key.
func (k Key) identityPrefix() (netip.Prefix, bool) {
	bits := int(k.PrefixLen - identityBits)
	var a netip.Addr
	switch k.Data[5] {
	case 4:
		a = netip.AddrFrom4([4]byte(k.Data[6:10]))
	case 6:
		a = netip.AddrFrom16([16]byte(k.Data[6:22]))
	default:
		return netip.Prefix{}, false
	}
	p, err := a.Prefix(bits)
	return p, err == nil
}

// DescribeEntry returns the entry in a readable form, its key (see Key.String), an arrow
// and its value's fields that the table uses:
//
//	endpoint ifindex=7 → id=0x5e1f subject=0x1a2b flags=ingress,egress scope=0x9a3c gen=0x77
//	identity scope=0x9a3c 10.1.0.0/16 → identity=0x33
//	policy subject=0x1a2b dir=ingress class=tcp identity=0x33 ports=8000-8063 → deny rule=0x8c1f…
//	source ifindex=7 10.1.0.10 → id=0x5e1f
func DescribeEntry(e Entry) string {
	v := e.Value
	var val string
	switch e.Key.Data[0] {
	case TableEndpoint:
		val = fmt.Sprintf("id=%#x subject=%#x flags=%s scope=%#x gen=%#x",
			v.ID, v.Subject, flagNames(v.Flags), v.Scope, v.Gen)
	case TableIdentity:
		val = fmt.Sprintf("identity=%#x", v.ID)
	case TableSource:
		val = fmt.Sprintf("id=%#x", v.ID)
	case TablePolicy:
		verdict := strconv.Itoa(int(v.Verdict))
		switch v.Verdict {
		case VerdictAllow:
			verdict = "allow"
		case VerdictDeny:
			verdict = "deny"
		}
		rule := "none"
		if v.Rule != 0 {
			rule = fmt.Sprintf("%#x", v.Rule)
		}
		val = verdict + " rule=" + rule
	default:
		val = fmt.Sprintf("%+v", v)
	}
	return e.Key.String() + " → " + val
}

// flagNames returns an endpoint's flags as "ingress", "egress", "ingress,egress" or
// "none".
func flagNames(f uint32) string {
	var names []string
	if f&FlagIngress != 0 {
		names = append(names, "ingress")
	}
	if f&FlagEgress != 0 {
		names = append(names, "egress")
	}
	if f&FlagGuard != 0 {
		names = append(names, "guard")
	}
	if f&^(FlagIngress|FlagEgress|FlagGuard) != 0 {
		names = append(names, fmt.Sprintf("%#x", f&^(FlagIngress|FlagEgress|FlagGuard)))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}
