package linux

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// AddressProtocol marks the addresses naples adds to host interfaces. The kernel keeps it
// with each address as the address's protocol (IFA_PROTO, Linux 6.1 and later; `ip address
// show proto 242` with iproute2 6.2 and later), so a restarted agent recognises the
// addresses it added, and never removes one it did not. It is the number of
// OverlayRouteProtocol: the kernel numbers address and route protocols apart, and 242
// stands for naples in both.
const AddressProtocol = OverlayRouteProtocol

// InterfaceStore is what the interface reconciler reads of delphi.
type InterfaceStore interface {
	// Get returns the desired object with the key.
	Get(key *nimbusv1.ObjectKey) (*nimbusv1.Object, bool)
	// Keys returns the keys of the desired objects of one kind, ordered.
	Keys(kind nimbusv1.Kind) []nimbusv1.Key
}

// InterfaceOptions configures an InterfaceReconciler.
type InterfaceOptions struct {
	// Store holds the desired Interface objects; the reconciler reads it to find which
	// object names a link, and, when sweeping, which addresses are still wanted. Required.
	Store InterfaceStore
	// Namespace is the network namespace whose interfaces are programmed. Default: the
	// calling process's.
	Namespace *netns.NsHandle
	// Timeout bounds every netlink request and dump, so a kernel that does not answer
	// fails the reconcile, which is retried, instead of pinning a worker. Default: 10s.
	Timeout time.Duration
	// View is Namespace's kernel view, shared with the other reconcilers of the namespace,
	// through which the observer watches (one subscription between them). Default: a view
	// of the reconciler's own.
	View *KernelView
	// EventBuffer is the size in bytes of the observer's queue of link and address
	// changes, and the least receive buffer of its view's subscription (SO_RCVBUFFORCE,
	// which needs CAP_NET_ADMIN). A burst of changes bigger than it overflows it; the
	// observer then fails, and its restart reads the kernel afresh. Default: 32 MiB.
	EventBuffer int
	// StatsInterval is how often the observer reads every link afresh (one dump) and
	// enqueues every Interface object, so that the counters in their statuses refresh.
	// Default: 10s; negative disables the refresh.
	StatsInterval time.Duration
	// StateFile is the file where the reconciler keeps, per link, the administrative
	// state and MTU it found before it first changed them, so that it puts them back
	// when the object is deleted or stops setting them, also after a restart (the
	// agent's is interfaces.json in its state directory). Default: "", which keeps them
	// in memory only.
	StateFile string
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
}

// sameIfaceLink reports whether the link have is in the state want describes: the
// administrative state and MTU the reconciler writes. Operational state and counters
// change on their own and are left out, so that the echo of a write is recognised
// whatever they show.
func sameIfaceLink(have, want kernelLink) bool {
	return have.up == want.up && have.mtu == want.mtu
}

// ifaceLinkFields are the fields of a link whose change concerns the objects that name
// it: what their statuses show of it (the counters aside) and its owner.
const ifaceLinkFields = linkFieldName | linkFieldUp | linkFieldMTU | linkFieldOperState | linkFieldCarrier | linkFieldAlias

// ifaceAddrID identifies an address in the kernel: its link and its address with prefix
// length, as `ip address` shows it (10.0.0.1/24, not masked).
type ifaceAddrID = addrKey

// sameIfaceAddr reports whether the address have is in the state want describes: added
// by the same protocol. Its flags are the kernel's.
func sameIfaceAddr(have, want kernelAddr) bool { return have.proto == want.proto }

// InterfaceReconciler programs Interface objects: host NICs that exist, whose
// administrative state, MTU and addresses it sets. naples never creates or deletes such
// a link. An object names its link by spec.device, or by its own name when that is
// empty; an object whose link does not exist is PENDING (ReasonWaitingForInterface) until
// the observer sees a link of that name appear. A link is programmed for one object only:
// when several name it, the one programmed on it owns it while it still names it, else
// the one created first (meta.createTime, then key ID), and the others are FAILED
// (hal.ReasonConflict) naming it, as is an object naming a link naples created for another
// object. An object that comes later never takes a link from the one running on it.
//
// The addresses it adds carry AddressProtocol. Those of the owning object's addresses that
// the link holds already, added by someone else, are left alone and make the object FAILED
// with hal.ReasonConflict; addresses of naples that the object no longer lists are
// removed, and other addresses are never touched.
//
// A spec sets only what it says: without admin_up the administrative state, and with mtu
// 0 the MTU, are left as found. Before it first changes either, the reconciler records
// what it found (InterfaceOptions.StateFile keeps the record across restarts); deleting
// the object, or removing the field from the spec, puts back what was found, as deleting
// removes the addresses naples added. Sweep puts back the links that no object names any
// more, such as those of objects deleted while the agent was down.
//
// The link is set (`ip link set DEV up|down mtu M`) by index and only when the table shows
// that it differs. IPv6 addresses go when a link goes down (unless
// net.ipv6.conf.DEV.keep_addr_on_down is set): the observer then sees them go, and the
// reconcile it triggers adds them again, so a link that is down keeps the addresses of
// its object as well.
//
// It reads the links and the addresses from its KernelView's link and address tables,
// which it shares with the other reconcilers of the namespace, and finds a link there
// by name (its index of names) and a link's addresses by its index; it hears of the
// tables' changes through the view, and dumps them afresh at every sweep. Every
// StatsInterval the observer dumps the links again, which refreshes their counters in
// the table, and enqueues every Interface object, so their statuses carry fresh
// counters (the HAL sends a status upstream only when it changed). A reconcile compares
// with the tables and writes only what differs, so a restarted agent that finds
// everything as programmed writes nothing. Writes go through the batched netlink writer.
//
// The status's operational data (nimbusv1.InterfaceOperational) are the link's: its
// operational state, carrier, administrative state, MTU and counters.
type InterfaceReconciler struct {
	// rtnlConn carries the writes and reads the dumps of links and addresses.
	*rtnlConn
	store         InterfaceStore
	statsInterval time.Duration

	// links is the view's table of links, which linkReader reads; addrs the view's table
	// of addresses, which addrReader reads.
	links      *linkTable
	linkReader *tableReader[int32, kernelLink]
	addrs      *addrTable
	addrReader *tableReader[addrKey, kernelAddr]

	// devLocks serializes work on one link between the workers of different objects and
	// the sweeper.
	devLocks keyedMutex[string]

	// found records what the links were before naples changed them.
	found *foundLinks

	// programmedMu guards programmed.
	programmedMu sync.Mutex
	// programmed maps the key of every object that owned its link at its last
	// reconcile to the link's name, so that deleting the object, or moving it to another
	// link, removes the addresses added for it.
	programmed map[nimbusv1.Key]string
}

var (
	_ hal.Reconciler         = (*InterfaceReconciler)(nil)
	_ hal.Sweeper            = (*InterfaceReconciler)(nil)
	_ hal.Observer           = (*InterfaceReconciler)(nil)
	_ hal.KernelWriteCounter = (*InterfaceReconciler)(nil)
)

// NewInterfaceReconciler returns a reconciler bound to the options' namespace.
func NewInterfaceReconciler(opts InterfaceOptions) (*InterfaceReconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("interface reconciler: InterfaceOptions.Store is required")
	}
	if opts.StatsInterval == 0 {
		opts.StatsInterval = 10 * time.Second
	}
	found, err := openFoundLinks(opts.StateFile)
	if err != nil {
		return nil, fmt.Errorf("interface reconciler: %w", err)
	}
	c, err := openRTNLConn(rtnlConnOptions{Namespace: opts.Namespace, View: opts.View, Timeout: opts.Timeout,
		EventBuffer: opts.EventBuffer, DefaultEventBuffer: 32 << 20, Logger: opts.Logger, Writes: true})
	if err != nil {
		return nil, err
	}
	reader := c.view.links.reader(c)
	if reader == nil {
		c.close()
		return nil, errors.New("interface reconciler: the kernel view's link table has as many readers as it can hold")
	}
	addrReader := c.view.addrs.reader(c)
	if addrReader == nil {
		reader.close()
		c.close()
		return nil, errors.New("interface reconciler: the kernel view's address table has as many readers as it can hold")
	}
	return &InterfaceReconciler{
		rtnlConn:      c,
		store:         opts.Store,
		statsInterval: opts.StatsInterval,
		links:         c.view.links,
		linkReader:    reader,
		addrs:         c.view.addrs,
		addrReader:    addrReader,
		found:         found,
		programmed:    map[nimbusv1.Key]string{},
	}, nil
}

// Close releases the netlink sockets and stops reading the view's link table. It is safe
// to call twice.
func (r *InterfaceReconciler) Close() error {
	r.linkReader.close()
	r.addrReader.close()
	r.close()
	return nil
}

// Kind returns KIND_INTERFACE.
func (r *InterfaceReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_INTERFACE }

// KernelWrites returns how many link changes and addresses the reconciler has written:
// one per request the kernel took (a link's state and MTU are set together).
func (r *InterfaceReconciler) KernelWrites() uint64 { return r.writes.Load() }

// ifaceSpec is an Interface object's spec, parsed.
type ifaceSpec struct {
	device string
	// adminUp is the administrative state to set; nil leaves it as found.
	adminUp *bool
	// mtu is the MTU to set; 0 leaves it as found.
	mtu uint32
	// addrs are the addresses, without duplicates, in the order the spec lists them.
	addrs []netip.Prefix
}

// deviceOf returns the name of the link an Interface object names: spec.device, or the
// object's name.
func deviceOf(obj *nimbusv1.Object) string {
	if d := obj.GetInterface().GetDevice(); d != "" {
		return d
	}
	return obj.GetMeta().GetName()
}

// parseIfaceSpec parses an Interface object's spec.
func parseIfaceSpec(obj *nimbusv1.Object) (ifaceSpec, error) {
	spec := obj.GetInterface()
	s := ifaceSpec{device: deviceOf(obj), adminUp: spec.AdminUp, mtu: spec.GetMtu()}
	if s.device == "" {
		return ifaceSpec{}, hal.Errorf(hal.ReasonInvalid, "spec.device is empty and so is the object's name")
	}
	if len(s.device) >= unix.IFNAMSIZ || strings.ContainsAny(s.device, "/: \t\n") {
		return ifaceSpec{}, hal.Errorf(hal.ReasonInvalid, "spec.device %q: not a valid interface name", s.device)
	}
	for i, a := range spec.GetAddresses() {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return ifaceSpec{}, hal.Errorf(hal.ReasonInvalid, "spec.addresses[%d] %q: %v", i, a, err)
		}
		if p.Addr().Is4In6() {
			return ifaceSpec{}, hal.Errorf(hal.ReasonInvalid, "spec.addresses[%d] %q: an IPv4-mapped IPv6 address; write the IPv4 address", i, a)
		}
		if !slices.Contains(s.addrs, p) {
			s.addrs = append(s.addrs, p)
		}
	}
	return s, nil
}

// Reconcile makes the link obj names match it: `ip link set DEV up|down mtu M` when the
// state or MTU the spec sets (or, for one it no longer sets, the one naples found) differ,
// `ip address add ADDR dev DEV proto 242` for each listed address the link lacks, `ip
// address del` for each address of naples on it that is not listed. With obj nil it
// removes the addresses it added for key and puts back the state and MTU it found.
func (r *InterfaceReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	if err := r.fill(ctx); err != nil {
		return nil, err
	}
	id := key.Key()
	old, hadOld := r.programmedDevice(id)
	if obj == nil {
		if !hadOld {
			return nil, nil // never programmed by this reconciler; Sweep removes leftovers
		}
		return nil, r.release(ctx, id, old)
	}
	want, err := parseIfaceSpec(obj)
	if err != nil {
		return nil, err
	}
	if hadOld && old != want.device {
		if err := r.release(ctx, id, old); err != nil {
			return nil, err
		}
	}

	lock := r.devLocks.lock(want.device)
	defer r.devLocks.unlock(want.device, lock)
	if owner := r.ownerOf(want.device); !owner.IsZero() && owner != id {
		r.forget(id, want.device)
		return nil, hal.Errorf(hal.ReasonConflict, "interface %q is already claimed by %s", want.device, owner)
	}
	index, link, ok := r.links.byName(want.device)
	if !ok {
		// The link's addresses went with it: there is nothing to remove for key.
		r.forget(id, want.device)
		return nil, hal.Pendingf(ReasonWaitingForInterface, "waiting for interface %q: no such link", want.device)
	}
	if owner, ours := link.owner(); ours {
		r.forget(id, want.device)
		return nil, hal.Errorf(hal.ReasonConflict, "interface %q was created by naples for %s; an Interface object describes a host NIC", want.device, owner)
	}
	r.remember(id, want.device)
	if err := r.syncLink(ctx, want.device, index, link, want); err != nil {
		return nil, err
	}
	if err := r.syncAddresses(ctx, want.device, index, want.addrs); err != nil {
		return nil, err
	}
	if r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("interface programmed", "key", id, "device", want.device)
	}
	link, _ = r.links.get(index)
	return linkStatus(link), nil
}

// linkStatus returns the operational data of a link for its object's status.
func linkStatus(l kernelLink) *nimbusv1.OperationalData {
	return &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Interface{Interface: &nimbusv1.InterfaceOperational{
		OperState: linkOperState(l.operState),
		Carrier:   l.carrier,
		AdminUp:   l.up,
		Mtu:       l.mtu,
		RxBytes:   l.stats.RxBytes,
		TxBytes:   l.stats.TxBytes,
		RxPackets: l.stats.RxPackets,
		TxPackets: l.stats.TxPackets,
		RxErrors:  l.stats.RxErrors,
		TxErrors:  l.stats.TxErrors,
		RxDropped: l.stats.RxDropped,
		TxDropped: l.stats.TxDropped,
	}}}
}

// linkOperState returns the kernel's operational state of a link (IF_OPER_*) as the
// status has it: a kernel state the API does not name is unknown.
func linkOperState(state uint8) nimbusv1.LinkOperState {
	if state > rtnl.OperUp {
		return nimbusv1.LinkOperState_LINK_OPER_STATE_UNKNOWN
	}
	// The API's states are the kernel's, one up: its zero is unspecified.
	return nimbusv1.LinkOperState(state) + 1
}

// ownersOf returns the keys of the desired Interface objects that name the link,
// ordered.
func (r *InterfaceReconciler) ownersOf(device string) []nimbusv1.Key {
	var out []nimbusv1.Key
	for _, id := range r.store.Keys(nimbusv1.Kind_KIND_INTERFACE) {
		if obj, ok := r.store.Get(id.Proto()); ok && deviceOf(obj) == device {
			out = append(out, id)
		}
	}
	return out
}

// ownerOf returns the key of the desired Interface object that owns the link, of those
// that name it: the one programmed on it, else the one created first (meta.createTime,
// then key); the zero Key when none names it.
func (r *InterfaceReconciler) ownerOf(device string) nimbusv1.Key {
	owners := r.ownersOf(device)
	switch len(owners) {
	case 0:
		return nimbusv1.Key{}
	case 1:
		return owners[0]
	}
	for _, id := range owners {
		if d, ok := r.programmedDevice(id); ok && d == device {
			return id
		}
	}
	return firstCreated(r.store.Get, owners)
}

// programmedDevice returns the link programmed for key id.
func (r *InterfaceReconciler) programmedDevice(id nimbusv1.Key) (string, bool) {
	r.programmedMu.Lock()
	defer r.programmedMu.Unlock()
	d, ok := r.programmed[id]
	return d, ok
}

// remember records that key id owns the link.
func (r *InterfaceReconciler) remember(id nimbusv1.Key, device string) {
	r.programmedMu.Lock()
	defer r.programmedMu.Unlock()
	r.programmed[id] = device
}

// forget forgets that key id owned the link, if it did.
func (r *InterfaceReconciler) forget(id nimbusv1.Key, device string) {
	r.programmedMu.Lock()
	defer r.programmedMu.Unlock()
	if r.programmed[id] == device {
		delete(r.programmed, id)
	}
}

// release removes the addresses of naples from the link key id owned and puts back its
// state and MTU as found, unless another object owns it now, and forgets that id owned
// it.
func (r *InterfaceReconciler) release(ctx context.Context, id nimbusv1.Key, device string) error {
	lock := r.devLocks.lock(device)
	defer r.devLocks.unlock(device, lock)
	if owner := r.ownerOf(device); owner.IsZero() || owner == id {
		if err := r.removeOurs(ctx, device); err != nil {
			return err
		}
		if err := r.restoreLink(ctx, device); err != nil {
			return err
		}
	}
	r.forget(id, device)
	return nil
}

// syncLink sets the link's administrative state and MTU to what want sets, and those want
// leaves out to what naples found before it changed them, if it did. Before it changes
// a field the spec sets, it records what it found, unless a record of it is there
// already; once it has put a field back, it forgets it.
func (r *InterfaceReconciler) syncLink(ctx context.Context, device string, index int32, link kernelLink, want ifaceSpec) error {
	found := r.found.get(device)
	next, record := link, found
	switch {
	case want.adminUp != nil:
		next.up = *want.adminUp
		if record.Up == nil && next.up != link.up {
			record.Up = &link.up
		}
	case found.Up != nil:
		next.up = *found.Up
		record.Up = nil
	}
	switch {
	case want.mtu != 0:
		next.mtu = want.mtu
		if record.MTU == 0 && next.mtu != link.mtu {
			record.MTU = link.mtu
		}
	case found.MTU != 0:
		next.mtu = found.MTU
		record.MTU = 0
	}
	return r.setLinkRecorded(ctx, device, index, link, next, found, record)
}

// restoreLink puts back the link's administrative state and MTU as naples found them, and
// forgets them. A link that is gone has nothing to put back: its record is dropped.
func (r *InterfaceReconciler) restoreLink(ctx context.Context, device string) error {
	found := r.found.get(device)
	if found.empty() {
		return nil
	}
	index, link, ok := r.links.byName(device)
	if _, ours := link.owner(); !ok || ours {
		return r.found.set(device, linkFound{})
	}
	next := link
	if found.Up != nil {
		next.up = *found.Up
	}
	if found.MTU != 0 {
		next.mtu = found.MTU
	}
	if err := r.setLinkRecorded(ctx, device, index, link, next, found, linkFound{}); err != nil {
		return err
	}
	r.log.Info("interface put back as found", "device", device, "up", next.up, "mtu", next.mtu)
	return nil
}

// setLinkRecorded sets the link from have to next, when they differ, keeping record of
// what was found: a record that grows is written before the kernel is, one that shrinks
// after, so that what naples changed is always on record.
func (r *InterfaceReconciler) setLinkRecorded(ctx context.Context, device string, index int32, have, next kernelLink, found, record linkFound) error {
	grows := (found.Up == nil && record.Up != nil) || (found.MTU == 0 && record.MTU != 0)
	if grows {
		if err := r.found.set(device, record); err != nil {
			return err
		}
	}
	if next.up != have.up || next.mtu != have.mtu {
		if err := r.setLink(ctx, device, index, have, next); err != nil {
			return err
		}
	}
	if !grows {
		return r.found.set(device, record)
	}
	return nil
}

// removeOurs removes every address of naples from the link, if it exists.
func (r *InterfaceReconciler) removeOurs(ctx context.Context, device string) error {
	index, _, ok := r.links.byName(device)
	if !ok {
		return nil
	}
	for _, p := range r.oursOn(index) {
		if err := r.deleteAddr(ctx, device, ifaceAddrID{index: index, prefix: p}); err != nil {
			return err
		}
	}
	return nil
}

// setLink sets the administrative state of the link with the index and, when it
// differs, its MTU to next's, in one request: `ip link set DEV up|down mtu M`. The
// request names the link by its index, under which the link table holds it: a link of
// that name created anew has another index, and the request fails rather than reach it.
func (r *InterfaceReconciler) setLink(ctx context.Context, device string, index int32, have, next kernelLink) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var flags uint32
	if next.up {
		flags = unix.IFF_UP
	}
	var attrs rtnl.LinkAttrs
	if next.mtu != have.mtu {
		attrs |= rtnl.LinkMTU
	}
	msg := rtnl.AppendLinkRequest(r.nl.Buffer(), unix.RTM_NEWLINK, 0, rtnl.Link{Index: index, Flags: flags, MTU: next.mtu},
		unix.IFF_UP, attrs)
	state := "down"
	if next.up {
		state = "up"
	}
	what := fmt.Sprintf("setting interface %q %s mtu %d", device, state, next.mtu)
	_, err := kernelWrite(ctx, r.rtnlConn, r.links.m.ExpectBy(r.linkReader.writer(), index, next, sameIfaceLink), msg)
	switch {
	case errors.Is(err, unix.ENODEV):
		return hal.Pendingf(ReasonWaitingForInterface, "waiting for interface %q: it went away while %s", device, what)
	case err != nil:
		return hal.Errorf(hal.ReasonKernelError, "%s: %w", what, err)
	}
	r.log.Info("interface set", "device", device, "up", next.up, "mtu", next.mtu)
	return nil
}

// syncAddresses removes the addresses of naples on the link that want does not list and
// adds those it lists that the link lacks. A listed address that the link holds without
// AddressProtocol is someone else's: it is left alone, the others are programmed, and
// the error is a conflict that names it.
func (r *InterfaceReconciler) syncAddresses(ctx context.Context, device string, index int32, want []netip.Prefix) error {
	for _, p := range r.oursOn(index) {
		if slices.Contains(want, p) {
			continue
		}
		if err := r.deleteAddr(ctx, device, ifaceAddrID{index: index, prefix: p}); err != nil {
			return err
		}
	}
	var foreign []string
	for _, p := range want {
		id := ifaceAddrID{index: index, prefix: p}
		have, ok := r.addrs.get(id)
		switch {
		case ok && have.proto == AddressProtocol:
		case ok:
			foreign = append(foreign, p.String())
		default:
			if err := r.addAddr(ctx, device, id); err != nil {
				return err
			}
		}
	}
	if len(foreign) > 0 {
		return hal.Errorf(hal.ReasonConflict, "interface %q holds %s already, not added by naples (protocol other than %d); leaving it alone",
			device, strings.Join(foreign, ", "), AddressProtocol)
	}
	return nil
}

// addAddr adds an address of naples to the link: `ip address add PREFIX dev DEV proto
// 242`, which fails rather than take over an address the table has not heard of yet.
func (r *InterfaceReconciler) addAddr(ctx context.Context, device string, id ifaceAddrID) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	msg := appendIfaceAddrRequest(r.nl.Buffer(), unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL, id)
	_, err := kernelWrite(ctx, r.rtnlConn, r.addrs.m.ExpectBy(r.addrReader.writer(), id, kernelAddr{proto: AddressProtocol}, sameIfaceAddr), msg)
	switch {
	case errors.Is(err, unix.ENODEV):
		return hal.Pendingf(ReasonWaitingForInterface, "waiting for interface %q: it went away while adding %s", device, id.prefix)
	case errors.Is(err, unix.EEXIST):
		return hal.Errorf(hal.ReasonConflict, "adding %s to interface %q: the interface holds the address already (with another prefix length, or added by someone else just now): %w", id.prefix, device, err)
	case err != nil:
		return hal.Errorf(hal.ReasonKernelError, "adding %s to interface %q: %w", id.prefix, device, err)
	}
	r.log.Info("address added", "device", device, "address", id.prefix.String())
	return nil
}

// deleteAddr removes an address of naples from the link, if the table holds it: `ip
// address del PREFIX dev DEV`. One that is gone already is no error.
func (r *InterfaceReconciler) deleteAddr(ctx context.Context, device string, id ifaceAddrID) error {
	have, ok := r.addrs.get(id)
	if !ok || have.proto != AddressProtocol {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	msg := appendIfaceAddrRequest(r.nl.Buffer(), unix.RTM_DELADDR, 0, id)
	took, err := kernelWrite(ctx, r.rtnlConn, r.addrs.m.ExpectGoneBy(r.addrReader.writer(), id), msg, unix.EADDRNOTAVAIL, unix.ENODEV)
	if err != nil {
		return hal.Errorf(hal.ReasonKernelError, "deleting %s from interface %q: %w", id.prefix, device, err)
	}
	if took {
		r.log.Info("address deleted", "device", device, "address", id.prefix.String())
	}
	return nil
}

// appendIfaceAddrRequest appends to b a request of type RTM_NEWADDR (with protocol
// AddressProtocol) or RTM_DELADDR for the address: struct ifaddrmsg, then IFA_LOCAL and
// IFA_ADDRESS, both the address, as `ip address` sends them. (An IPv4 delete matches the
// prefix length only when IFA_ADDRESS is there.)
func appendIfaceAddrRequest(b []byte, typ, flags uint16, id ifaceAddrID) []byte {
	return rtnl.AppendAddrRequest(b, typ, flags, id.index, id.prefix, 0, AddressProtocol)
}

// oursOn returns the addresses of naples the address table holds on the link with the
// index, sorted.
func (r *InterfaceReconciler) oursOn(index int32) []netip.Prefix {
	var out []netip.Prefix
	for id, a := range r.addrs.byLink.Get(index) {
		if a.proto == AddressProtocol {
			out = append(out, id.prefix)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return out
}

// nameOf returns the name of the link with the index, as the link table shows it.
func (r *InterfaceReconciler) nameOf(index int32) (string, bool) {
	l, ok := r.links.get(index)
	return l.name, ok
}

// Sweep reads every link and address afresh into the link and address tables,
// enqueues the objects whose links or addresses changed without the observer reporting
// it (through the observer, when it watches), removes every address of
// naples on a link that no Interface object lists it for, and puts back the state and MTU
// naples found on the links that no Interface object names. Links that naples created
// for other objects (an overlay bridge, say) are left to their own reconcilers.
func (r *InterfaceReconciler) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	if err := r.links.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.linkReader.drainMissed(func(c tableChange[int32, kernelLink]) { r.linkChanged(c, enqueue) })
	if err := r.addrs.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.addrReader.drainMissed(func(c tableChange[addrKey, kernelAddr]) { r.addrChanged(c, enqueue) })
	for _, device := range r.found.devices() {
		if err := r.sweepLink(ctx, device); err != nil {
			return err
		}
	}
	for id := range r.addrs.protocols.Get(AddressProtocol) {
		if err := ctx.Err(); err != nil {
			return err
		}
		link, ok := r.links.get(id.index)
		if _, ours := link.owner(); !ok || ours {
			continue
		}
		if err := r.sweepAddr(ctx, link.name, id); err != nil {
			return err
		}
	}
	return nil
}

// sweepLink puts back the state and MTU naples found on the link unless an object names
// it.
func (r *InterfaceReconciler) sweepLink(ctx context.Context, device string) error {
	lock := r.devLocks.lock(device)
	defer r.devLocks.unlock(device, lock)
	if !r.ownerOf(device).IsZero() {
		return nil
	}
	return r.restoreLink(ctx, device)
}

// sweepAddr removes the address of naples from the link unless the object that owns the
// link lists it.
func (r *InterfaceReconciler) sweepAddr(ctx context.Context, device string, id ifaceAddrID) error {
	lock := r.devLocks.lock(device)
	defer r.devLocks.unlock(device, lock)
	if owner := r.ownerOf(device); !owner.IsZero() {
		if obj, ok := r.store.Get(owner.Proto()); ok {
			if want, err := parseIfaceSpec(obj); err == nil && slices.Contains(want.addrs, id.prefix) {
				return nil
			}
		}
	}
	r.log.Info("removing stale address", "device", device, "address", id.prefix.String())
	return r.deleteAddr(ctx, device, id)
}

// Observe watches the view's link and address tables (which the view dumps when its
// subscription starts, so a restart after an overflow starts from the kernel's state).
// It enqueues the objects that name a
// link that appears, goes, or changes its administrative or operational state, carrier
// or MTU, and those whose link's addresses change other than by the reconciler's own
// writes; and every StatsInterval it dumps the links, which refreshes their counters,
// and enqueues every Interface object.
func (r *InterfaceReconciler) Observe(ctx context.Context, enqueue func(nimbusv1.Key), subscribed func()) error {
	// The counters' refresh starts once the observer is subscribed and ends before
	// Observe returns.
	refreshCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	links := r.linkReader.watching(func(c tableChange[int32, kernelLink]) { r.linkChanged(c, enqueue) })
	addrs := r.addrReader.watching(func(c tableChange[addrKey, kernelAddr]) { r.addrChanged(c, enqueue) })
	return r.observeTables(ctx, "link and address changes", nil, []viewSource{links, addrs},
		func(context.Context) error { return nil },
		func() {
			subscribed()
			wg.Go(func() { r.refreshStats(refreshCtx, enqueue) })
		},
		func(uint16, []byte) {})
}

// refreshStats dumps the links every StatsInterval, which refreshes their counters in
// the link table, and enqueues every Interface object, so that their statuses report the
// counters; until ctx ends.
func (r *InterfaceReconciler) refreshStats(ctx context.Context, enqueue func(nimbusv1.Key)) {
	if r.statsInterval < 0 {
		return
	}
	t := time.NewTicker(r.statsInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.links.reload(ctx, r.rtnlConn); err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Warn("reading link counters", "err", err)
			continue
		}
		for _, key := range r.store.Keys(nimbusv1.Kind_KIND_INTERFACE) {
			enqueue(key)
		}
	}
}

// addrChanged enqueues the objects that name the link of an address that changed other
// than by the reconciler's own write.
func (r *InterfaceReconciler) addrChanged(c tableChange[addrKey, kernelAddr], enqueue func(nimbusv1.Key)) {
	if c.echo {
		return // our own write
	}
	if name, ok := r.nameOf(c.key.index); ok {
		for _, owner := range r.ownersOf(name) {
			enqueue(owner)
		}
	}
}

// linkChanged enqueues the objects that name a link of the change, when the link
// appeared, went, was renamed, or changed what their statuses show of it (the counters
// aside) or its owner. The echo of the reconciler's own write is handled as any change:
// what the kernel filled in (the operational state, say) shows in the status.
func (r *InterfaceReconciler) linkChanged(c tableChange[int32, kernelLink], enqueue func(nimbusv1.Key)) {
	renamed := c.had && c.has && c.old.name != c.new.name
	if c.had && (!c.has || renamed) {
		for _, id := range r.ownersOf(c.old.name) {
			enqueue(id)
		}
	}
	if c.has && (!c.had || c.fields&ifaceLinkFields != 0) {
		for _, id := range r.ownersOf(c.new.name) {
			enqueue(id)
		}
	}
}

// fill loads the link table and the address table with a dump each, unless one has
// loaded them already.
func (r *InterfaceReconciler) fill(ctx context.Context) error {
	if err := r.links.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	return r.addrs.fill(ctx, r.rtnlConn)
}

// ifaceDump dumps the addresses of both families of the reconciler's namespace and
// returns what parse accepts of the answer (dumpObjects).
func ifaceDump[T any](ctx context.Context, r *InterfaceReconciler, parse func(typ uint16, payload []byte) (T, bool)) ([]T, error) {
	return dumpObjects(ctx, r.rtnlConn, parse, rtnl.AddrDumpRequest())
}
