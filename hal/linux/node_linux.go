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
// It reads the addresses of the namespace from its KernelView's address table, which it
// shares with the other reconcilers of the namespace, and finds an address there by its
// index of addresses; the observer hears of the table's changes through the view, and
// enqueues this host's Node whenever its VTEP address comes, goes or changes state.
type NodeReconciler struct {
	// rtnlConn reads the dumps of addresses.
	*rtnlConn
	store OverlayStore
	node  string

	// addrs is the view's table of addresses, which addrReader reads.
	addrs      *addrTable
	addrReader *tableReader[addrKey, kernelAddr]
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
	reader := c.view.addrs.reader(c)
	if reader == nil {
		c.close()
		return nil, errors.New("node reconciler: the kernel view's address table has as many readers as it can hold")
	}
	return &NodeReconciler{rtnlConn: c, store: opts.Store, node: opts.Node, addrs: c.view.addrs, addrReader: reader}, nil
}

// Close releases the netlink socket and stops reading the view's address table. It is
// safe to call twice.
func (r *NodeReconciler) Close() error {
	r.addrReader.close()
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
	for _, v := range r.addrs.byAddr.Get(a) {
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

// fill loads the address table with a dump, unless one has loaded it already.
func (r *NodeReconciler) fill(ctx context.Context) error {
	return r.addrs.fill(ctx, r.rtnlConn)
}

// addrChanged enqueues this host's Node when the address of a change is its VTEP
// address.
func (r *NodeReconciler) addrChanged(c tableChange[addrKey, kernelAddr], enqueue func(nimbusv1.Key)) {
	if vtep, ok := r.localVTEP(); ok && c.key.prefix.Addr() == vtep {
		local := NodeKey(r.node).Key()
		r.log.Debug("VTEP address changed", "key", local, "address", c.key.prefix.String())
		enqueue(local)
	}
}

// Sweep reads the addresses afresh into the address table and enqueues this host's Node
// when its VTEP address changed without the observer reporting it (through the
// observer, when it watches). There is nothing to remove.
func (r *NodeReconciler) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	if err := r.addrs.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.addrReader.drainMissed(func(c tableChange[addrKey, kernelAddr]) { r.addrChanged(c, enqueue) })
	return nil
}

// Observe watches the view's address table (which the view dumps when its subscription
// starts), enqueueing this host's Node whenever its VTEP address is added, removed or
// changes state.
func (r *NodeReconciler) Observe(ctx context.Context, enqueue func(nimbusv1.Key), subscribed func()) error {
	addrs := r.addrReader.watching(func(c tableChange[addrKey, kernelAddr]) { r.addrChanged(c, enqueue) })
	return r.observeTables(ctx, "address changes", nil, []viewSource{addrs}, func(context.Context) error { return nil }, subscribed,
		func(uint16, []byte) {})
}
