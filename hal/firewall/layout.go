package firewall

import (
	"encoding/binary"
	"net/netip"
)

// The tables of a snapshot: the first byte of every Key's Data.
const (
	// TableEndpoint holds one entry per local endpoint, by the ifindex of its interface.
	TableEndpoint = 1
	// TableIdentity maps peer addresses, by longest prefix within a tenant's scope, to
	// their identity.
	TableIdentity = 2
	// TablePolicy holds the verdicts of a subject's rules by direction, protocol class,
	// peer identity and destination port prefix.
	TablePolicy = 3
	// TableSource holds the addresses a guarded local endpoint sends from, by the ifindex
	// of its interface: its MAC and its IP addresses (SourceFamily*).
	TableSource = 4
)

// The families of a source entry (the byte after the ifindex).
const (
	SourceFamilyMAC  = 0
	SourceFamilyIPv4 = 4
	SourceFamilyIPv6 = 6
)

// Directions, seen from the endpoint.
const (
	// DirIngress is traffic to the endpoint: its interface's tcx egress hook.
	DirIngress = 0
	// DirEgress is traffic from the endpoint: its interface's tcx ingress hook.
	DirEgress = 1
)

// Protocol classes of a policy lookup.
const (
	ClassTCP   = 1
	ClassUDP   = 2
	ClassICMP  = 3 // ICMP and ICMPv6
	ClassOther = 4
)

// Verdicts of a policy entry.
const (
	VerdictAllow = 1
	VerdictDeny  = 2
)

// Flags of an endpoint entry: the directions policies protect, and whether the frames
// the endpoint sends must come from its own addresses (its source entries).
const (
	FlagIngress = 1
	FlagEgress  = 2
	FlagGuard   = 4
)

// AnyIdentity stands for every peer in a policy entry; the world identity, of addresses no
// prefix covers, is 0.
const AnyIdentity = 0xffffffff

// The prefix lengths of a Key's fixed parts, in bits.
const (
	endpointBits = 8 + 32
	identityBits = 8 + 32 + 8
	policyBits   = 8 + 32 + 8 + 8 + 32
	sourceBits   = 8 + 32 + 8
)

// Key is a key of a snapshot, an LPM trie: a prefix length in bits and the data it
// applies to. Its memory layout is the C struct fw_key.
type Key struct {
	// PrefixLen is how many leading bits of Data the entry matches.
	PrefixLen uint32
	// Data is the table (Data[0]) and the table's fields, multi-byte ones big-endian.
	Data [24]byte
}

// Value is a value of a snapshot. Its memory layout is the C struct fw_value. Which fields
// mean something depends on the table.
type Value struct {
	// ID is the endpoint id (TableEndpoint) or the identity (TableIdentity).
	ID uint32
	// Subject is the endpoint's subject, the set of policies protecting it; 0 for none.
	Subject uint32
	// Flags are the directions policies protect (FlagIngress, FlagEgress).
	Flags uint32
	// Gen is the snapshot's generation (TableEndpoint).
	Gen uint32
	// Scope is the endpoint's tenant scope (TableEndpoint).
	Scope uint32
	// Verdict is VerdictAllow or VerdictDeny (TablePolicy).
	Verdict uint32
	// Rule is the id of the rule that decides (TablePolicy); 0 for none.
	Rule uint64
}

// EndpointKey returns the key of the endpoint entry of the interface.
func EndpointKey(ifindex uint32) Key {
	k := Key{PrefixLen: endpointBits}
	k.Data[0] = TableEndpoint
	binary.BigEndian.PutUint32(k.Data[1:5], ifindex)
	return k
}

// IdentityKey returns the key of the identity entry of the prefix in the scope.
func IdentityKey(scope uint32, p netip.Prefix) Key {
	p = p.Masked()
	k := Key{PrefixLen: identityBits + uint32(p.Bits())}
	k.Data[0] = TableIdentity
	binary.BigEndian.PutUint32(k.Data[1:5], scope)
	// An IPv4-mapped IPv6 prefix stays IPv6: packets carrying such addresses are IPv6.
	a := p.Addr()
	if a.Is4() {
		k.Data[5] = 4
		b := a.As4()
		copy(k.Data[6:10], b[:])
	} else {
		k.Data[5] = 6
		b := a.As16()
		copy(k.Data[6:22], b[:])
	}
	return k
}

// PolicyKey returns the key of the policy entry of the subject for the direction, class
// and identity, covering the destination ports whose leading portBits bits equal port's.
func PolicyKey(subject uint32, dir, class uint8, identity uint32, port uint16, portBits int) Key {
	k := Key{PrefixLen: policyBits + uint32(portBits)}
	k.Data[0] = TablePolicy
	binary.BigEndian.PutUint32(k.Data[1:5], subject)
	k.Data[5] = dir
	k.Data[6] = class
	binary.BigEndian.PutUint32(k.Data[7:11], identity)
	if portBits > 0 {
		port &^= uint16(0xffff >> portBits)
		binary.BigEndian.PutUint16(k.Data[11:13], port)
	}
	return k
}

// SourceKey returns the key of the source entry of an IP address of the local endpoint on
// the interface: the endpoint may send from it.
func SourceKey(ifindex uint32, a netip.Addr) Key {
	return SourcePrefixKey(ifindex, netip.PrefixFrom(a, a.BitLen()))
}

// SourcePrefixKey returns the key of the source entry of a prefix the local endpoint on
// the interface may send from (its spec.allowedSourcePrefixes; an address is a full-length
// prefix). An IPv4-mapped IPv6 prefix stays IPv6.
func SourcePrefixKey(ifindex uint32, p netip.Prefix) Key {
	p = p.Masked()
	k := Key{PrefixLen: sourceBits + uint32(p.Bits())}
	k.Data[0] = TableSource
	binary.BigEndian.PutUint32(k.Data[1:5], ifindex)
	if a := p.Addr(); a.Is4() {
		k.Data[5] = SourceFamilyIPv4
		b := a.As4()
		copy(k.Data[6:10], b[:])
	} else {
		k.Data[5] = SourceFamilyIPv6
		b := a.As16()
		copy(k.Data[6:22], b[:])
	}
	return k
}

// SourceMACKey returns the key of the source entry of the MAC of the local endpoint on
// the interface.
func SourceMACKey(ifindex uint32, mac [6]byte) Key {
	k := Key{PrefixLen: sourceBits + 48}
	k.Data[0] = TableSource
	binary.BigEndian.PutUint32(k.Data[1:5], ifindex)
	k.Data[5] = SourceFamilyMAC
	copy(k.Data[6:12], mac[:])
	return k
}
