package linux

import (
	"context"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// neighTable is a KernelView's table of neighbours, as RTM_NEWNEIGH and RTM_DELNEIGH
// report them: the static FDB entries without a VLAN (AF_BRIDGE, `bridge fdb show`) and
// the permanent IP neighbours (AF_INET and AF_INET6, `ip neigh show nud permanent`). The
// two kinds have keys of their own, so each is a viewTable of its own, with its own
// dump, fed by the same notifications; an entry of another kind is no entry of either.
// Both are keyed by the device (a bridge, for a bridge's FDB entries) first. The FDB
// entries hold the VXLAN devices' head-end replication entries too, which the network
// reconciler reads, one device's at a time, through headEnds; the endpoint reconciler
// finds the rest by key, unindexed, since an index costs memory per entry, of which
// there are a few per endpoint.
type neighTable struct {
	fdb *viewTable[fdbKey, fdbEntry]
	ips *viewTable[neighKey, neighEntry]
	// headEnds finds the head-end replication entries of a VXLAN device, by its index.
	headEnds *hal.Index[fdbKey, fdbEntry, int32]
}

// The fields of an fdbEntry and of a neighEntry, a bit each, as a tableChange reports
// those that changed.
const (
	fdbFieldDst uint64 = 1 << iota
	fdbFieldPort
	fdbFieldPermanent
)

const neighFieldMAC uint64 = 1

// newNeighTable returns an empty neighbour table.
func newNeighTable() *neighTable {
	t := &neighTable{
		fdb: newViewTable(viewTableOptions[fdbKey, fdbEntry]{
			groups: []uint{unix.RTNLGRP_NEIGH},
			equal:  func(have, want fdbEntry) bool { return have == want },
			hash:   fdbKey.hash,
			fields: func(a, b fdbEntry) uint64 {
				var f uint64
				if a.dst != b.dst {
					f |= fdbFieldDst
				}
				if a.port != b.port {
					f |= fdbFieldPort
				}
				if a.permanent != b.permanent {
					f |= fdbFieldPermanent
				}
				return f
			},
			notify: notifyFDB,
			dump: func(ctx context.Context, c *rtnlConn, m *hal.Mirror[fdbKey, fdbEntry]) error {
				_, err := dumpMirror(ctx, c, m, "FDB entries", unix.RTM_NEWNEIGH, parseFDB, rtnl.NeighDumpRequest(unix.AF_BRIDGE))
				return err
			},
		}),
		ips: newViewTable(viewTableOptions[neighKey, neighEntry]{
			groups: []uint{unix.RTNLGRP_NEIGH},
			equal:  func(have, want neighEntry) bool { return have == want },
			hash:   neighKey.hash,
			fields: func(a, b neighEntry) uint64 {
				if a != b {
					return neighFieldMAC
				}
				return 0
			},
			notify: notifyNeigh,
			dump: func(ctx context.Context, c *rtnlConn, m *hal.Mirror[neighKey, neighEntry]) error {
				_, err := dumpMirror(ctx, c, m, "neighbours", unix.RTM_NEWNEIGH, parseIPNeigh,
					rtnl.NeighDumpRequest(unix.AF_INET), rtnl.NeighDumpRequest(unix.AF_INET6))
				return err
			},
		}),
	}
	t.headEnds = hal.NewIndex(t.fdb.m, func(k fdbKey, _ fdbEntry) (int32, bool) { return k.ifindex, k.headEnd() })
	return t
}

// parseFDB decodes the payload of an RTM_NEWNEIGH message of a dump of FDB entries into
// the entry the table holds, if it is of the kind it holds (neighMsg.fdb).
func parseFDB(b []byte) (fdbKey, fdbEntry, bool) {
	m, ok := parseNeighMsg(b)
	if !ok || m.family != unix.AF_BRIDGE {
		return fdbKey{}, fdbEntry{}, false
	}
	return m.fdb()
}

// parseIPNeigh decodes the payload of an RTM_NEWNEIGH message of a dump of neighbours
// into the neighbour the table holds, if it is of the kind it holds (neighMsg.neigh).
func parseIPNeigh(b []byte) (neighKey, neighEntry, bool) {
	m, ok := parseNeighMsg(b)
	if !ok || (m.family != unix.AF_INET && m.family != unix.AF_INET6) {
		return neighKey{}, neighEntry{}, false
	}
	return m.neigh()
}

// notifyFDB applies a notification of an FDB entry (AF_BRIDGE) to the FDB entries: a
// static entry or a head-end replication entry added or replaced shows, any other goes.
// A bridge's entry that a port it left reports gone is passed over: the bridge's entry
// is on another port now.
func notifyFDB(m *hal.Mirror[fdbKey, fdbEntry], typ uint16, payload []byte) {
	if typ != unix.RTM_NEWNEIGH && typ != unix.RTM_DELNEIGH {
		return
	}
	msg, ok := parseNeighMsg(payload)
	if !ok || msg.family != unix.AF_BRIDGE {
		return
	}
	k, e, static := msg.fdb()
	if typ == unix.RTM_DELNEIGH && k.master {
		if cur, had := m.Get(k); had && cur.port != e.port {
			return
		}
	}
	if typ == unix.RTM_NEWNEIGH && static {
		m.Update(k, e)
	} else {
		m.Remove(k)
	}
}

// notifyNeigh applies a notification of an IP neighbour (AF_INET, AF_INET6) to the
// neighbours: a permanent neighbour added or replaced shows, any other goes.
func notifyNeigh(m *hal.Mirror[neighKey, neighEntry], typ uint16, payload []byte) {
	if typ != unix.RTM_NEWNEIGH && typ != unix.RTM_DELNEIGH {
		return
	}
	msg, ok := parseNeighMsg(payload)
	if !ok || (msg.family != unix.AF_INET && msg.family != unix.AF_INET6) {
		return
	}
	k, e, permanent := msg.neigh()
	if !k.ip.valid() {
		return
	}
	if typ == unix.RTM_NEWNEIGH && permanent {
		m.Update(k, e)
	} else {
		m.Remove(k)
	}
}
