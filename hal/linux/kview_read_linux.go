package linux

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// This file holds what readers outside the reconcilers (the agent's `dataplane` view) read
// of a KernelView's namespace: its links, bridge ports, addresses, FDB and neighbour
// entries, as package rtnl's typed values. Each read is one dump of the kernel today, on
// a reader of its own (viewDump); once the view keeps a table of the kind, the read
// returns the table's entries instead, and its callers do not change.

// Links returns every link of the view's namespace (`ip -d link show`): the messages of
// family AF_UNSPEC, about the links themselves.
func (v *KernelView) Links(ctx context.Context) ([]rtnl.Link, error) {
	return viewDump(ctx, v, "links", rtnl.LinkDumpRequest(), unix.RTM_NEWLINK, func(b []byte) (rtnl.Link, bool) {
		l, ok := rtnl.ParseLink(b)
		return l, ok && l.Family == unix.AF_UNSPEC
	})
}

// BridgePorts returns the bridges' view of every bridge port of the view's namespace
// (`bridge -d link show`): links of family AF_BRIDGE whose Port holds the port's flags,
// learning among them (IFLA_PROTINFO).
func (v *KernelView) BridgePorts(ctx context.Context) ([]rtnl.Link, error) {
	return viewDump(ctx, v, "bridge ports", rtnl.BridgeLinkDumpRequest(), unix.RTM_NEWLINK, func(b []byte) (rtnl.Link, bool) {
		l, ok := rtnl.ParseLink(b)
		return l, ok && l.Family == unix.AF_BRIDGE
	})
}

// Addrs returns every address of both families of the view's namespace (`ip addr show`).
func (v *KernelView) Addrs(ctx context.Context) ([]rtnl.Addr, error) {
	return viewDump(ctx, v, "addresses", rtnl.AddrDumpRequest(), unix.RTM_NEWADDR, rtnl.ParseAddr)
}

// FDB returns every FDB entry of the view's namespace (`bridge fdb show`): the devices'
// own, flagged NTF_SELF (a VXLAN device's remotes), and the bridges', which name their
// bridge (Master).
func (v *KernelView) FDB(ctx context.Context) ([]rtnl.Neigh, error) {
	return viewDump(ctx, v, "fdb entries", rtnl.NeighDumpRequest(unix.AF_BRIDGE), unix.RTM_NEWNEIGH, func(b []byte) (rtnl.Neigh, bool) {
		n, ok := rtnl.ParseNeigh(b)
		return n, ok && n.Family == unix.AF_BRIDGE
	})
}

// Neighbours returns every IPv4 and IPv6 neighbour entry of the view's namespace (`ip
// neigh show`).
func (v *KernelView) Neighbours(ctx context.Context) ([]rtnl.Neigh, error) {
	return viewDump(ctx, v, "neighbour entries", rtnl.NeighDumpRequest(unix.AF_UNSPEC), unix.RTM_NEWNEIGH, func(b []byte) (rtnl.Neigh, bool) {
		n, ok := rtnl.ParseNeigh(b)
		return n, ok && (n.Family == unix.AF_INET || n.Family == unix.AF_INET6)
	})
}

// viewDump dumps a table of the view's namespace with the request req on a reader of its
// own, whose requests wait at most defaultTimeout (10s) for the kernel and end with ctx,
// and returns what parse accepts of the answer's messages of type answer. A dump that
// the kernel reports interrupted by a change starts over (rtnl.Reader.Dump). what names
// the table in its error ("links").
func viewDump[T any](ctx context.Context, v *KernelView, what string, req []byte, answer uint16, parse func(payload []byte) (T, bool)) ([]T, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	r, err := rtnl.NewReader(v.ns, defaultTimeout)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", what, err)
	}
	defer r.Close()
	var out []T
	err = r.Dump(ctx, req, func() { out = out[:0] }, func(typ uint16, payload []byte) {
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
