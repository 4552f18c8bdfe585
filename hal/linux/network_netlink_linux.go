package linux

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// This file holds the kernel objects the network and node reconcilers mirror (links,
// addresses, policy-routing rules, overlay routes and the VXLAN devices' head-end
// replication entries) in the form the mirrors keep: what they keep of the messages
// package rtnl decodes, which serve dumps and notifications alike so that both describe
// an object the same way, and the requests, which rtnl builds, that change them. The
// interface reconciler reads addresses with parseAddr too.

// networkLink is what the network reconciler mirrors of a link (`ip -d link show`). The
// fields after master are set only for the links they apply to.
type networkLink struct {
	// index is the interface index; 0 in a wanted state means any.
	index int32
	// kind is IFLA_INFO_KIND: "bridge", "vxlan", "veth", ...; "" for a link without one.
	kind string
	// alias is IFLA_IFALIAS, naples's mark of ownership.
	alias string
	// group is IFLA_GROUP; a link naples created is in LinkGroup. sameLink ignores it.
	group uint32
	// mac is the link-layer address as raw bytes; "" in a wanted state means any.
	mac string
	// mtu is the MTU; 0 in a wanted state means any.
	mtu uint32
	// up is the administrative state, IFF_UP.
	up bool
	// master is the interface index of the bridge the link is a port of, 0 for none.
	master int32

	// vni, local, port and learning are a VXLAN device's VNI, local address, UDP
	// destination port and whether it learns remote addresses.
	vni      uint32
	local    netip.Addr
	port     uint16
	learning bool

	// bridgePort tells that the link is a port of a bridge; portLearning and
	// neighSuppress are then its port flags (`bridge link`).
	bridgePort    bool
	portLearning  bool
	neighSuppress bool
}

// sameLink reports whether the link have is in the state want describes: equal in every
// field, except that a want without index, MAC or MTU accepts any.
func sameLink(have, want networkLink) bool {
	return (want.index == 0 || have.index == want.index) &&
		(want.mac == "" || have.mac == want.mac) &&
		(want.mtu == 0 || have.mtu == want.mtu) &&
		have.kind == want.kind && have.alias == want.alias && have.up == want.up &&
		have.master == want.master && have.vni == want.vni && have.local == want.local &&
		have.port == want.port && have.learning == want.learning &&
		have.bridgePort == want.bridgePort && have.portLearning == want.portLearning &&
		have.neighSuppress == want.neighSuppress
}

// networkLinkOf returns what the network reconciler reads of the link with the index, as
// the view's link table holds it.
func networkLinkOf(index int32, l kernelLink) networkLink {
	n := networkLink{index: index, kind: l.kind, alias: l.alias, group: l.group, mac: l.mac, mtu: l.mtu, up: l.up,
		master: l.master, bridgePort: l.bridgePort, portLearning: l.learning, neighSuppress: l.neighSuppress}
	if l.kind == "vxlan" {
		n.vni, n.local, n.port, n.learning = l.vxlan.VNI, l.vxlan.Local, l.vxlan.Port, l.vxlan.Learning
	}
	return n
}

// onto returns the link of the name that the link table holds as have, in the state n
// describes: what the network reconciler writes of a link, with the rest (operational
// state, counters) as have shows it.
func (n networkLink) onto(name string, have kernelLink) kernelLink {
	have.name, have.kind, have.alias, have.mac, have.mtu, have.up, have.master = name, n.kind, n.alias, n.mac, n.mtu, n.up, n.master
	have.bridgePort, have.learning, have.neighSuppress = n.bridgePort, n.portLearning, n.neighSuppress
	if n.kind == "vxlan" {
		have.vxlan = rtnl.VXLANInfo{VNI: n.vni, Local: n.local, Port: n.port, Learning: n.learning}
	}
	return have
}

// sameNetworkLink is sameLink for the link table's values: the echo of a write of the
// network reconciler, whatever the fields it leaves to others.
func sameNetworkLink(have, want kernelLink) bool {
	return have.name == want.name && sameLink(networkLinkOf(0, have), networkLinkOf(0, want))
}

// networkLinkFields are the fields of a link that sameLink compares: a change of one of
// them, by someone else, is drift of the network that owns the link.
const networkLinkFields = linkFieldName | linkFieldKind | linkFieldAlias | linkFieldMAC | linkFieldMTU | linkFieldUp |
	linkFieldMaster | linkFieldVXLAN | linkFieldBridgePort | linkFieldLearning | linkFieldNeighSuppress

// addrKey identifies an address of an interface: the interface and the address with its
// prefix length.
type addrKey struct {
	index  int32
	prefix netip.Prefix
}

// addrMsg is a decoded RTM_NEWADDR or RTM_DELADDR message.
type addrMsg struct {
	key addrKey
	// flags are the address's flags (IFA_F_*); proto is its protocol (IFA_PROTO), 0 from
	// kernels without address protocols.
	flags uint32
	proto uint8
}

// parseAddr decodes the payload of an RTM_NEWADDR or RTM_DELADDR message
// (rtnl.ParseAddr); the address is rtnl.Addr.Prefix. ok is false for a message that is
// not about an address of its family, IPv4 or IPv6, on an interface.
func parseAddr(b []byte) (m addrMsg, ok bool) {
	a, ok := rtnl.ParseAddr(b)
	if !ok {
		return addrMsg{}, false
	}
	p, ok := a.Prefix()
	if !ok {
		return addrMsg{}, false
	}
	m = addrMsg{key: addrKey{index: a.Index, prefix: p}, flags: a.Flags, proto: a.Protocol}
	return m, m.key.index > 0
}

// ruleKey identifies a policy-routing rule the overlay uses: `ip rule` with a priority,
// an input interface or a firewall mark (matched whole), and an action (to a table, or
// prohibit), and nothing else.
type ruleKey struct {
	family   uint8
	priority uint32
	iif      string
	fwmark   uint32
	table    uint32
	action   uint8
}

// ruleMsg is a decoded RTM_NEWRULE or RTM_DELRULE message.
type ruleMsg struct {
	key      ruleKey
	protocol uint8
	// plain tells that the rule selects packets by its input interface or its whole
	// firewall mark alone, as the overlay's rules do; rules with other selectors are never
	// the overlay's.
	plain bool
}

// The bits of struct fib_rule_hdr's flags that describe the rule's state rather than
// select packets: the input or output interface does not exist (FIB_RULE_IIF_DETACHED,
// FIB_RULE_OIF_DETACHED).
const ruleStateFlags = 0x8 | 0x10

// parseRuleMsg decodes the payload of an RTM_NEWRULE or RTM_DELRULE message
// (rtnl.ParseRule) of family AF_INET or AF_INET6.
func parseRuleMsg(b []byte) (m ruleMsg, ok bool) {
	r, ok := rtnl.ParseRule(b)
	if !ok || r.Family != unix.AF_INET && r.Family != unix.AF_INET6 {
		return ruleMsg{}, false
	}
	m.key = ruleKey{family: r.Family, priority: r.Priority, iif: r.IIF, fwmark: r.FwMark, table: r.Table, action: r.Action}
	m.protocol = r.Protocol
	m.plain = r.DstLen == 0 && r.SrcLen == 0 && r.TOS == 0 && r.Flags&^ruleStateFlags == 0 &&
		r.FwMask == ^uint32(0) && r.SuppressPrefixLen == ^uint32(0) && r.SuppressIfGroup == ^uint32(0) && !r.Other
	return m, true
}

// appendRuleRequest appends to b an RTM_NEWRULE (`ip rule add`) or RTM_DELRULE (`ip rule
// del`) request for the rule k, of the protocol (0: any, for a delete).
func appendRuleRequest(b []byte, typ, flags uint16, k ruleKey, protocol uint8) []byte {
	return rtnl.AppendRuleRequest(b, typ, flags, rtnl.Rule{Family: k.family, Priority: k.priority, IIF: k.iif,
		FwMark: k.fwmark, Table: k.table, Action: k.action, Protocol: protocol})
}

// appendOverlayRouteRequest appends to b an RTM_NEWROUTE request (`ip route add` with
// NLM_F_CREATE|NLM_F_EXCL, `ip route replace` with NLM_F_CREATE|NLM_F_REPLACE) for the
// overlay route id through rt.oif, or with typ RTM_DELROUTE an `ip route del` of it that
// names OverlayRouteProtocol, so that it never removes a route of another protocol.
func appendOverlayRouteRequest(b []byte, typ, flags uint16, id routeID, rt kernelRoute) []byte {
	r := rtnl.Route{Family: unix.AF_INET6, DstLen: id.bits, Table: id.table, Protocol: uint8(OverlayRouteProtocol),
		Scope: rt.scope, Type: unix.RTN_UNICAST, Dst: id.dst(), Priority: id.metric}
	if id.v4 {
		r.Family = unix.AF_INET
	}
	if typ == unix.RTM_DELROUTE {
		r.Scope, r.Type = unix.RT_SCOPE_NOWHERE, unix.RTN_UNSPEC
	} else {
		r.OIF, r.PrefSrc = rt.oif, rt.src
	}
	return rtnl.AppendRouteRequest(b, typ, flags, r, nil)
}

// appendHERRequest appends to b an RTM_NEWNEIGH (`bridge fdb append 00:00:00:00:00:00 dev
// VXLAN dst ADDR self permanent`, flags NLM_F_CREATE|NLM_F_APPEND) or RTM_DELNEIGH
// (`bridge fdb del ...`) request for the head-end replication entry k (fdbKey.headEnd).
func appendHERRequest(b []byte, typ, flags uint16, k fdbKey) []byte {
	return rtnl.AppendNeighRequest(b, typ, flags, rtnl.Neigh{Family: unix.AF_BRIDGE, Index: k.ifindex, State: unix.NUD_PERMANENT,
		Flags: unix.NTF_SELF, Dst: k.dst.addr(), HasMAC: true})
}

// appendAddrRequest appends to b an RTM_NEWADDR (`ip addr add`) or RTM_DELADDR (`ip addr
// del`) request for the address k with the flags (IFA_F_*; none for a delete).
func appendAddrRequest(b []byte, typ, flags uint16, k addrKey, ifaFlags uint32) []byte {
	return rtnl.AppendAddrRequest(b, typ, flags, k.index, k.prefix, ifaFlags, 0)
}

// runInNamespace runs fn on an OS thread in network namespace ns (nil: the calling
// process's). Files under /proc/sys/net belong to the namespace of the thread that opens
// them. The thread is locked for fn and never handed back to the runtime, which discards
// it, so that no goroutine runs in ns by accident afterwards.
func runInNamespace(ns *netns.NsHandle, fn func() error) error {
	if ns == nil {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread ends with this goroutine.
		if err := netns.Set(*ns); err != nil {
			errc <- fmt.Errorf("entering network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// nsThreads runs functions on OS threads that stay in a network namespace: what must be
// done from inside the namespace (a sysctl file, attaching programs to an interface by
// index) then starts no thread each time, as runInNamespace does. A thread is started
// when every thread is busy and kept for the next call, so there are as many as calls
// ever ran at once; a function must neither unlock its thread nor leave the namespace.
type nsThreads struct {
	ns *netns.NsHandle

	// mu guards idle and closed.
	mu     sync.Mutex
	idle   []*nsThread
	closed bool
}

// nsThread is one thread of nsThreads: it runs what comes on calls until calls is
// closed, and then closes done.
type nsThread struct {
	calls chan nsCall
	done  chan struct{}
}

// nsCall is one function for an nsThread to run, and where its error goes.
type nsCall struct {
	fn    func() error
	reply chan error
}

// run runs fn on a thread in the namespace (nil: on the calling goroutine, in the
// process's namespace) and returns its error, or the error of entering the namespace.
func (t *nsThreads) run(fn func() error) error {
	if t.ns == nil {
		return fn()
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errors.New("running in the network namespace: closed")
	}
	var th *nsThread
	if n := len(t.idle); n > 0 {
		th, t.idle = t.idle[n-1], t.idle[:n-1]
	} else {
		th = &nsThread{calls: make(chan nsCall), done: make(chan struct{})}
		go th.serve(*t.ns)
	}
	t.mu.Unlock()
	reply := make(chan error, 1)
	th.calls <- nsCall{fn: fn, reply: reply}
	err := <-reply
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		th.stop()
		return err
	}
	t.idle = append(t.idle, th)
	t.mu.Unlock()
	return err
}

// serve enters ns on a locked thread and runs the calls until calls is closed. The
// thread is never handed back to the runtime, which discards it when serve returns.
func (th *nsThread) serve(ns netns.NsHandle) {
	defer close(th.done)
	runtime.LockOSThread()
	err := netns.Set(ns)
	if err != nil {
		err = fmt.Errorf("entering network namespace: %w", err)
	}
	for c := range th.calls {
		if err != nil {
			c.reply <- err
			continue
		}
		c.reply <- c.fn()
	}
}

// stop ends the thread and waits for it.
func (th *nsThread) stop() {
	close(th.calls)
	<-th.done
}

// close ends the idle threads, and a busy one when its call returns. It is safe to call
// twice.
func (t *nsThreads) close() {
	t.mu.Lock()
	idle := t.idle
	t.idle, t.closed = nil, true
	t.mu.Unlock()
	for _, th := range idle {
		th.stop()
	}
}
