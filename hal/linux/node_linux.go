package linux

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// NodeOptions configures a NodeReconciler.
type NodeOptions struct {
	// Store holds the desired Node objects. Required.
	Store OverlayStore
	// Node is the name of this host's Node object. Required.
	Node string
	// Namespace is the network namespace whose interfaces must hold this host's VTEP
	// address. Default: the calling process's.
	Namespace *netns.NsHandle
	// Timeout bounds every netlink request. Default: 10s.
	Timeout time.Duration
	// View is Namespace's kernel view, shared with the other reconcilers of the namespace,
	// through which the observer watches (one subscription between them). Default: a view
	// of the reconciler's own.
	View *KernelView
	// EventBuffer is the size in bytes of the observer's queue of address changes, and
	// the least receive buffer of its view's subscription (SO_RCVBUFFORCE). Default: 1 MiB.
	EventBuffer int
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
}

// NodeReconciler reports on Node objects; it programs nothing. This host's Node is
// PROGRAMMED, with operational data {role: local, vtep: ADDR}, once an interface of the
// namespace holds its VTEP address ADDR, and PENDING with ReasonWaitingForAddress until
// then; a local Node without a VTEP address has nothing to wait for and is PROGRAMMED
// with {role: local}. Other nodes are PROGRAMMED with {role: remote, vtep: ADDR}, or
// {role: remote} without a VTEP address.
//
// It reads the addresses of the namespace from a mirror (hal.Mirror) that one dump fills
// and the observer's subscription keeps current; the observer enqueues this host's Node
// whenever its VTEP address comes, goes or changes state.
type NodeReconciler struct {
	// rtnlConn reads the dumps of addresses.
	*rtnlConn
	// mirrorLoader runs the dumps that load addrs.
	mirrorLoader
	store OverlayStore
	node  string

	// addrs holds every address of the namespace; addrsByAddr finds them by address.
	addrs       *hal.Mirror[addrKey, ifAddr]
	addrsByAddr *hal.Index[addrKey, ifAddr, netip.Addr]
}

var (
	_ hal.Reconciler = (*NodeReconciler)(nil)
	_ hal.Observer   = (*NodeReconciler)(nil)
	_ hal.Sweeper    = (*NodeReconciler)(nil)
)

// NewNodeReconciler returns a reconciler bound to the options' namespace.
func NewNodeReconciler(opts NodeOptions) (*NodeReconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("node reconciler: NodeOptions.Store is required")
	}
	if opts.Node == "" {
		return nil, errors.New("node reconciler: NodeOptions.Node is required")
	}
	c, err := openRTNLConn(rtnlConnOptions{Namespace: opts.Namespace, View: opts.View, Timeout: opts.Timeout,
		EventBuffer: opts.EventBuffer, DefaultEventBuffer: 1 << 20, Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	r := &NodeReconciler{
		rtnlConn: c,
		store:    opts.Store,
		node:     opts.Node,
		addrs:    hal.NewMirror[addrKey, ifAddr](func(have, want ifAddr) bool { return have == want }, nil),
	}
	r.addrsByAddr = hal.NewIndex(r.addrs, func(k addrKey, _ ifAddr) (netip.Addr, bool) { return k.prefix.Addr(), true })
	return r, nil
}

// Close releases the netlink socket. It is safe to call twice.
func (r *NodeReconciler) Close() error {
	r.close()
	return nil
}

// Kind returns KIND_NODE.
func (r *NodeReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_NODE }

// Reconcile reports whether the Node obj is ready: for this host's, whether an
// interface holds its VTEP address. It changes nothing in the kernel.
func (r *NodeReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	if obj == nil {
		return nil, nil
	}
	spec := obj.GetNode()
	op := &nimbusv1.NodeOperational{Role: nimbusv1.NodeRole_NODE_ROLE_REMOTE}
	data := &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Node{Node: op}}
	if key.ID() == NodeKey(r.node).ID() {
		op.Role = nimbusv1.NodeRole_NODE_ROLE_LOCAL
	}
	s := spec.GetVtepAddress()
	if s == "" {
		return data, nil
	}
	vtep, err := netip.ParseAddr(s)
	if err != nil {
		return nil, hal.Errorf(hal.ReasonInvalid, "spec.vtepAddress %q: %v", s, err)
	}
	vtep = vtep.Unmap()
	op.Vtep = vtep.String()
	if op.Role == nimbusv1.NodeRole_NODE_ROLE_REMOTE {
		return data, nil
	}
	if err := r.fill(ctx); err != nil {
		return nil, err
	}
	switch r.holds(vtep) {
	case addrAbsent:
		return nil, hal.Pendingf(ReasonWaitingForAddress, "waiting for spec.vtepAddress %s to be assigned to an interface of this host", vtep)
	case addrTentative:
		return nil, hal.Pendingf(ReasonWaitingForAddress, "waiting for spec.vtepAddress %s: it is tentative (duplicate address detection runs, or found a duplicate)", vtep)
	}
	return data, nil
}

// addrState is how the namespace holds an address.
type addrState int

const (
	addrAbsent addrState = iota
	addrTentative
	addrUsable
)

// holds tells how the interfaces of the namespace hold the address a.
func (r *NodeReconciler) holds(a netip.Addr) addrState {
	st := addrAbsent
	for _, v := range r.addrsByAddr.Get(a) {
		if v.flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
			return addrUsable
		}
		st = addrTentative
	}
	return st
}

// localVTEP returns this host's VTEP address as its Node object has it, if it has one.
func (r *NodeReconciler) localVTEP() (netip.Addr, bool) {
	obj, ok := r.store.Get(NodeKey(r.node))
	if !ok {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(obj.GetNode().GetVtepAddress())
	return a.Unmap(), err == nil
}

// fill loads the mirror with a dump, unless one has loaded it already.
func (r *NodeReconciler) fill(ctx context.Context) error {
	return r.loadOnce(ctx, func(ctx context.Context) error {
		_, err := r.dumpAddrs(ctx)
		return err
	})
}

// dumpAddrs loads the mirror with a fresh dump of the namespace's addresses (`ip addr
// show`) and returns the addresses whose state changed.
func (r *NodeReconciler) dumpAddrs(ctx context.Context) ([]addrKey, error) {
	return dumpMirror(ctx, r.rtnlConn, r.addrs, "addresses", unix.RTM_NEWADDR, parseAddrMsg, rtnl.AddrDumpRequest())
}

// resync dumps afresh and enqueues this host's Node when its VTEP address changed.
func (r *NodeReconciler) resync(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	var drift []addrKey
	if _, err := r.loadAgain(ctx, func(ctx context.Context) (err error) {
		drift, err = r.dumpAddrs(ctx)
		return err
	}); err != nil {
		return err
	}
	vtep, ok := r.localVTEP()
	for _, k := range drift {
		if ok && k.prefix.Addr() == vtep {
			enqueue(NodeKey(r.node).Key())
			return nil
		}
	}
	return nil
}

// Sweep reads the addresses afresh and enqueues this host's Node when its VTEP address
// changed without the observer reporting it. There is nothing to remove.
func (r *NodeReconciler) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	return r.resync(ctx, enqueue)
}

// Observe subscribes to address changes, reads the addresses afresh, and then keeps the
// mirror current, enqueueing this host's Node whenever its VTEP address is added,
// removed or changes state.
func (r *NodeReconciler) Observe(ctx context.Context, enqueue func(nimbusv1.Key), subscribed func()) error {
	local := NodeKey(r.node).Key()
	return r.observe(ctx, "address changes", []uint{unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR},
		func(ctx context.Context) error { return r.resync(ctx, enqueue) }, subscribed,
		func(typ uint16, payload []byte) {
			if typ != unix.RTM_NEWADDR && typ != unix.RTM_DELADDR {
				return
			}
			k, a, ok := parseAddrMsg(payload)
			if !ok {
				return
			}
			if typ == unix.RTM_NEWADDR {
				r.addrs.Update(k, a)
			} else {
				r.addrs.Remove(k)
			}
			if vtep, ok := r.localVTEP(); ok && k.prefix.Addr() == vtep {
				r.log.Debug("VTEP address changed", "key", local, "address", k.prefix.String())
				enqueue(local)
			}
		})
}
