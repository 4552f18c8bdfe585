package rtnl

import "golang.org/x/sys/unix"

// attrNetconfIfindex is NETCONFA_IFINDEX (linux/netconf.h).
const attrNetconfIfindex = 1

// ParseNetconfIndex returns the interface index an RTM_NEWNETCONF or RTM_DELNETCONF
// message (struct netconfmsg and its attributes) is about; ok is false for the
// namespace-wide ones ("all", "default").
func ParseNetconfIndex(b []byte) (family uint8, index int32, ok bool) {
	const hdrLen = 4 // struct netconfmsg, padded
	if len(b) < hdrLen {
		return 0, 0, false
	}
	family = b[0]
	EachAttr(b[hdrLen:], func(typ uint16, v []byte) {
		if typ == attrNetconfIfindex {
			index = int32(AttrUint32(v))
		}
	})
	return family, index, index > 0
}

// NetconfReportsAll reports whether the payload of an RTM_NEWNETCONF message carries
// every setting of its interface's family (NETCONFA_ALL), as the kernel's report that it
// created them does (with the interface, or anew after it dropped them), rather than
// the one setting whose change it reports.
func NetconfReportsAll(b []byte) bool {
	const hdrLen = 4 // struct netconfmsg, padded
	if len(b) < hdrLen {
		return false
	}
	settings := 0
	EachAttr(b[hdrLen:], func(typ uint16, _ []byte) {
		if typ != attrNetconfIfindex {
			settings++
		}
	})
	return settings > 1
}

// attrNetconfForwarding is NETCONFA_FORWARDING (linux/netconf.h).
const attrNetconfForwarding = 2

// ipv4DevconfForwarding is IPV4_DEVCONF_FORWARDING (linux/ip.h), the index of
// net.ipv4.conf.DEV.forwarding among the IPv4 settings of an interface.
const ipv4DevconfForwarding = 1

// NetconfRequest returns a request for the settings of the family (AF_INET, AF_INET6) of
// the interface with the index (`ip netconf show dev DEV`); the kernel answers with one
// RTM_NEWNETCONF message.
func NetconfRequest(family uint8, index int32) []byte {
	// struct netconfmsg: family, padded to 4 bytes.
	b := append(Message(nil, unix.RTM_GETNETCONF, 0), family, 0, 0, 0)
	return AppendAttrUint32(b, attrNetconfIfindex, uint32(index))
}

// ParseNetconfForwarding returns NETCONFA_FORWARDING of an RTM_NEWNETCONF message, the
// value of the interface's forwarding sysctl, and whether the message carries it.
func ParseNetconfForwarding(b []byte) (forwarding uint32, ok bool) {
	const hdrLen = 4 // struct netconfmsg, padded
	if len(b) < hdrLen {
		return 0, false
	}
	EachAttr(b[hdrLen:], func(typ uint16, v []byte) {
		if typ == attrNetconfForwarding && len(v) >= 4 {
			forwarding, ok = AttrUint32(v), true
		}
	})
	return forwarding, ok
}

// AppendIPv4ForwardingRequest appends to b an RTM_SETLINK request that sets
// net.ipv4.conf.DEV.forwarding of the interface with the index to value: IFLA_AF_SPEC,
// AF_INET, IFLA_INET_CONF holding IPV4_DEVCONF_FORWARDING. Unlike a write of the
// sysctl, the kernel sends no RTM_NEWNETCONF for it, and it never waits for the rtnl
// lock by restarting the write.
func AppendIPv4ForwardingRequest(b []byte, index int32, value uint32) []byte {
	return appendIPv4Forwarding(AppendIfInfo(Message(b, unix.RTM_SETLINK, 0), unix.AF_UNSPEC, index, 0, 0), value)
}

// appendIPv4Forwarding appends to b the attribute of a link request that sets
// net.ipv4.conf.DEV.forwarding to value: IFLA_AF_SPEC, AF_INET, IFLA_INET_CONF holding
// IPV4_DEVCONF_FORWARDING.
func appendIPv4Forwarding(b []byte, value uint32) []byte {
	b, spec := BeginNest(b, unix.IFLA_AF_SPEC)
	b, inet := BeginNest(b, unix.AF_INET)
	b, conf := BeginNest(b, unix.IFLA_INET_CONF)
	b = AppendAttrUint32(b, ipv4DevconfForwarding, value)
	b = EndNest(b, conf)
	b = EndNest(b, inet)
	return EndNest(b, spec)
}
