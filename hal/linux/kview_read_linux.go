package linux

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// This file holds what readers outside the reconcilers (the agent's `dataplane` view) read
// of a KernelView's namespace: its links, bridge ports, addresses, FDB and neighbour
// entries, as package rtnl's typed values. A read returns the entries of the view's table
// of the kind while an observer watches through the view, which keeps the table current
// (viewTable.current); it dumps the kernel otherwise, as the firewall's input does. The
// FDB entries and the neighbours are always dumped: their tables hold the kinds the
// reconcilers write alone (the static unicast entries without a VLAN, one destination
// per VXLAN device and MAC, the VXLAN devices' head-end replication entries, and the
// permanent neighbours), and a reader wants every one (a learned or permanent entry, a
// MAC's further destinations, a learned neighbour's state), which a dump of its own
// family brings whatever the table holds. The reads of one KernelRead dump through one
// reader.

// KernelRead is one reading of a KernelView's namespace (KernelView.Read): the reads
// that dump share one reader, opened by the first of them and closed by Close. It is not
// safe for concurrent use.
type KernelRead struct {
	v *KernelView
	r *rtnl.Reader
}

// Read returns a reading of the view's namespace. The caller closes it.
func (v *KernelView) Read() *KernelRead { return &KernelRead{v: v} }

// Close closes the reader the reading's dumps went through, if one did.
func (r *KernelRead) Close() {
	if r.r != nil {
		r.r.Close()
		r.r = nil
	}
}

// Links returns every link of the view's namespace in a reading of its own
// (KernelRead.Links); the other kinds are read through a reading (Read).
func (v *KernelView) Links(ctx context.Context) ([]rtnl.Link, error) {
	r := v.Read()
	defer r.Close()
	return r.Links(ctx)
}

// Links returns every link of the view's namespace (`ip -d link show`): the messages of
// family AF_UNSPEC, about the links themselves. From the link table, a link's Flags hold
// IFF_UP alone, and its Port the flags the table holds, learning and neighbour
// suppression.
func (r *KernelRead) Links(ctx context.Context) ([]rtnl.Link, error) {
	if out, ok := readTable(ctx, r.v.links.viewTable, func(index int32, l kernelLink) (rtnl.Link, bool) {
		return l.rtnl(index), true
	}); ok {
		return out, ctx.Err()
	}
	return viewDump(ctx, r, "links", rtnl.LinkDumpRequest(), unix.RTM_NEWLINK, func(b []byte) (rtnl.Link, bool) {
		l, ok := rtnl.ParseLink(b)
		return l, ok && l.Family == unix.AF_UNSPEC
	})
}

// BridgePorts returns the bridges' view of every bridge port of the view's namespace
// (`bridge -d link show`): links of family AF_BRIDGE whose Port holds the port's flags,
// learning among them (IFLA_PROTINFO). From the link table, a port holds its index, name,
// master, MTU and those flags.
func (r *KernelRead) BridgePorts(ctx context.Context) ([]rtnl.Link, error) {
	if out, ok := readTable(ctx, r.v.links.viewTable, func(index int32, l kernelLink) (rtnl.Link, bool) {
		if !l.bridgePort {
			return rtnl.Link{}, false
		}
		return rtnl.Link{Family: unix.AF_BRIDGE, Index: index, Name: l.name, Master: l.master, MTU: l.mtu,
			Protinfo: true, Port: rtnl.BridgePortInfo{Learning: l.learning, NeighSuppress: l.neighSuppress}}, true
	}); ok {
		return out, ctx.Err()
	}
	return viewDump(ctx, r, "bridge ports", rtnl.BridgeLinkDumpRequest(), unix.RTM_NEWLINK, func(b []byte) (rtnl.Link, bool) {
		l, ok := rtnl.ParseLink(b)
		return l, ok && l.Family == unix.AF_BRIDGE
	})
}

// Addrs returns every address of both families of the view's namespace (`ip addr
// show`). From the address table, an address without a peer holds its address in Local
// (IPv4) or Address (IPv6), and one with a peer its own address in Local and no peer.
func (r *KernelRead) Addrs(ctx context.Context) ([]rtnl.Addr, error) {
	if out, ok := readTable(ctx, r.v.addrs.viewTable, func(k addrKey, a kernelAddr) (rtnl.Addr, bool) {
		return a.rtnl(k), true
	}); ok {
		return out, ctx.Err()
	}
	return viewDump(ctx, r, "addresses", rtnl.AddrDumpRequest(), unix.RTM_NEWADDR, rtnl.ParseAddr)
}

// FDB returns every FDB entry of the view's namespace (`bridge fdb show`): the devices'
// own, flagged NTF_SELF (a VXLAN device's remotes), and the bridges', which name their
// bridge (Master).
func (r *KernelRead) FDB(ctx context.Context) ([]rtnl.Neigh, error) {
	return viewDump(ctx, r, "fdb entries", rtnl.NeighDumpRequest(unix.AF_BRIDGE), unix.RTM_NEWNEIGH, func(b []byte) (rtnl.Neigh, bool) {
		n, ok := rtnl.ParseNeigh(b)
		return n, ok && n.Family == unix.AF_BRIDGE
	})
}

// Neighbours returns every IPv4 and IPv6 neighbour entry of the view's namespace (`ip
// neigh show`).
func (r *KernelRead) Neighbours(ctx context.Context) ([]rtnl.Neigh, error) {
	return viewDump(ctx, r, "neighbour entries", rtnl.NeighDumpRequest(unix.AF_UNSPEC), unix.RTM_NEWNEIGH, func(b []byte) (rtnl.Neigh, bool) {
		n, ok := rtnl.ParseNeigh(b)
		return n, ok && (n.Family == unix.AF_INET || n.Family == unix.AF_INET6)
	})
}

// rtnl returns the link with the index as package rtnl decodes it, with what the table
// holds of it.
func (l kernelLink) rtnl(index int32) rtnl.Link {
	var flags uint32
	if l.up {
		flags = unix.IFF_UP
	}
	return rtnl.Link{Family: unix.AF_UNSPEC, Index: index, Flags: flags, Name: l.name, Alias: l.alias, Kind: l.kind,
		Master: l.master, MTU: l.mtu, OperState: l.operState, Carrier: l.carrier, Group: l.group, MAC: l.mac,
		BridgePort: l.bridgePort, Port: rtnl.BridgePortInfo{Learning: l.learning, NeighSuppress: l.neighSuppress},
		VXLAN: l.vxlan, Stats: l.stats}
}

// rtnl returns the address with the key as package rtnl decodes it, with what the table
// holds of it.
func (a kernelAddr) rtnl(k addrKey) rtnl.Addr {
	addr := k.prefix.Addr()
	out := rtnl.Addr{Family: unix.AF_INET6, PrefixLen: uint8(k.prefix.Bits()), Flags: a.flags, Index: k.index, Protocol: a.proto}
	if addr.Is4() {
		out.Family = unix.AF_INET
	}
	switch {
	case a.peer:
		out.Local = addr
	case addr.Is4():
		out.Local, out.Address = addr, addr
	default:
		out.Address = addr
	}
	return out
}

// readTable returns what value makes of each object of the table t, and true, when the
// table is current (viewTable.current); false when the caller must dump instead.
func readTable[K comparable, V, T any](ctx context.Context, t *viewTable[K, V], value func(K, V) (T, bool)) ([]T, bool) {
	if ctx.Err() != nil || !t.current() {
		return nil, false
	}
	out := make([]T, 0, t.m.Len())
	for k, v := range t.m.All() {
		if x, ok := value(k, v); ok {
			out = append(out, x)
		}
	}
	return out, true
}

// viewDump dumps a table of the view's namespace with the request req through the
// reading's reader, opened by the first dump, whose requests wait at most defaultTimeout
// (10s) for the kernel and end with ctx, and returns what parse accepts of the answer's
// messages of type answer. A dump that the kernel reports interrupted by a change starts
// over (rtnl.Reader.Dump). what names the table in its error ("links").
func viewDump[T any](ctx context.Context, r *KernelRead, what string, req []byte, answer uint16, parse func(payload []byte) (T, bool)) ([]T, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	if r.r == nil {
		rd, err := rtnl.NewReader(r.v.ns, defaultTimeout)
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", what, err)
		}
		r.r = rd
		r.v.readers.Add(1)
	}
	r.v.readDumps.Add(1)
	var out []T
	err := r.r.Dump(ctx, req, func() { out = out[:0] }, func(typ uint16, payload []byte) {
		if typ != answer {
			return
		}
		if x, ok := parse(payload); ok {
			out = append(out, x)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	return out, nil
}
