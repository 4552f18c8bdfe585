package firewall

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// ErrBadKey is wrapped by ParseKey's errors.
var ErrBadKey = errors.New("not a firewall key")

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

// String returns the key in a readable form, which ParseKey parses back:
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

// ParseKey parses a key in the form Key.String writes (except the hex form of unknown
// keys). Numbers may be decimal or 0x-prefixed hex; a policy key's ports are "any", a port
// or a range that is one aligned block ("8000-8063", not "8000-8080").
func ParseKey(s string) (Key, error) {
	words := strings.Fields(s)
	if len(words) == 0 {
		return Key{}, fmt.Errorf("key %q: %w", s, ErrBadKey)
	}
	fail := func(reason string, args ...any) (Key, error) {
		return Key{}, fmt.Errorf("key %q: %s: %w", s, fmt.Sprintf(reason, args...), ErrBadKey)
	}
	fields := map[string]string{}
	var bare []string
	for _, w := range words[1:] {
		name, value, ok := strings.Cut(w, "=")
		if !ok {
			bare = append(bare, w)
			continue
		}
		if _, dup := fields[name]; dup {
			return fail("%s given twice", name)
		}
		fields[name] = value
	}
	// want checks that exactly the named fields and bare words were given.
	want := func(nbare int, names ...string) error {
		if len(bare) != nbare {
			return fmt.Errorf("key %q: want %d bare word(s), have %d: %w", s, nbare, len(bare), ErrBadKey)
		}
		for _, n := range names {
			if _, ok := fields[n]; !ok {
				return fmt.Errorf("key %q: %s missing: %w", s, n, ErrBadKey)
			}
		}
		if len(fields) != len(names) {
			return fmt.Errorf("key %q: want only %s: %w", s, strings.Join(names, ", "), ErrBadKey)
		}
		return nil
	}
	num := func(name string) (uint32, error) {
		v, err := strconv.ParseUint(fields[name], 0, 32)
		if err != nil {
			return 0, fmt.Errorf("key %q: %s %q: not a 32-bit number: %w", s, name, fields[name], ErrBadKey)
		}
		return uint32(v), nil
	}
	switch words[0] {
	case "endpoint":
		if err := want(0, "ifindex"); err != nil {
			return Key{}, err
		}
		ifindex, err := num("ifindex")
		if err != nil {
			return Key{}, err
		}
		return EndpointKey(ifindex), nil
	case "identity":
		if err := want(1, "scope"); err != nil {
			return Key{}, err
		}
		scope, err := num("scope")
		if err != nil {
			return Key{}, err
		}
		p, err := netip.ParsePrefix(bare[0])
		if err != nil {
			// A bare address is its own full-length prefix.
			a, aerr := netip.ParseAddr(bare[0])
			if aerr != nil {
				return fail("%q: not a prefix or address", bare[0])
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		return IdentityKey(scope, p), nil
	case "policy":
		if err := want(0, "subject", "dir", "class", "identity", "ports"); err != nil {
			return Key{}, err
		}
		subject, err := num("subject")
		if err != nil {
			return Key{}, err
		}
		dir, ok := lookupName(dirNames, fields["dir"])
		if !ok {
			return fail("dir %q: want ingress or egress", fields["dir"])
		}
		class, ok := lookupName(classNames, fields["class"])
		if !ok {
			return fail("class %q: want tcp, udp, icmp or other", fields["class"])
		}
		identity := uint32(AnyIdentity)
		if fields["identity"] != "any" {
			if identity, err = num("identity"); err != nil {
				return Key{}, err
			}
		}
		ports := PortPrefix{}
		if fields["ports"] != "any" {
			r, err := parsePortBlock(fields["ports"])
			if err != nil {
				return fail("ports %q: %v", fields["ports"], err)
			}
			ports = r
		}
		return PolicyKey(subject, dir, class, identity, ports.Port, ports.Bits), nil
	}
	return fail("%q: want endpoint, identity or policy", words[0])
}

// parsePortBlock parses a port or range that is exactly one aligned block.
func parsePortBlock(s string) (PortPrefix, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	l, lerr := strconv.ParseUint(lo, 10, 16)
	h, herr := strconv.ParseUint(hi, 10, 16)
	if lerr != nil || herr != nil || l > h {
		return PortPrefix{}, errors.New(`want a port 0-65535 or a range "low-high"`)
	}
	blocks := PortRange{Lo: uint16(l), Hi: uint16(h)}.Prefixes()
	if len(blocks) != 1 {
		return PortPrefix{}, fmt.Errorf("not one aligned block of ports but %d", len(blocks))
	}
	return blocks[0], nil
}

// lookupName returns the number a name stands for in names.
func lookupName(names map[uint8]string, name string) (uint8, bool) {
	for n, s := range names {
		if s == name {
			return n, true
		}
	}
	return 0, false
}
