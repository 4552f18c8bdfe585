package rtnl

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
