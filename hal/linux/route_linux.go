package linux

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// RouteProtocol is the route protocol number that marks routes naples created
// (`ip route show proto 241`).
const RouteProtocol uint8 = 241

// RouteIndex is the delphi index the route reconciler finds the owner of a kernel route
// with: it lists a Route object under its kernel identity, derived from the parsed spec
// and held in a compact binary form (routeID.indexKey), so that spellings of one prefix
// ("2001:DB8::/32", "2001:db8::/32") and the kernel's default IPv6 metric find the same
// owner. Stores handed to NewRouteReconciler must declare it (delphi.Options.Indexes).
var RouteIndex = delphi.Index{Name: "route", Values: func(obj *nimbusv1.Object) []string {
	spec := obj.GetRoute()
	if spec == nil {
		return nil
	}
	id, err := idOf(spec, obj.GetMeta().GetTenant())
	if err != nil {
		return nil
	}
	return []string{id.indexKey()}
}}

// Indexes returns the delphi indexes the backend's reconcilers look objects up by.
func Indexes() []delphi.Index {
	return []delphi.Index{RouteIndex, RouteTenantIndex, EndpointNetworkIndex, EndpointNodeIndex, EndpointInterfaceIndex,
		EndpointMACIndex, EndpointIPIndex, NetworkVNIIndex, PolicyGroupIndex}
}

// RouteStore is what the route reconciler reads of delphi.
type RouteStore interface {
	// LookupFirst returns the first by key of the desired objects a declared index lists
	// under value, with its key; obj is nil when there is none.
	LookupFirst(index, value string) (obj *nimbusv1.Object, key nimbusv1.Key, err error)
	// LookupFirstKey returns the key of the object LookupFirst returns, the zero Key when
	// there is none, without decoding it.
	LookupFirstKey(index, value string) (nimbusv1.Key, error)
	// LookupKeys returns the keys of the desired objects a declared index lists under
	// value, ordered.
	LookupKeys(index, value string) ([]nimbusv1.Key, error)
}

// RouteTenantIndex lists a Route that goes into its tenant's table (spec.tenantTable)
// under its tenant, so that a change of one of the tenant's networks, whose gateways such
// a route often goes through, reconciles it again.
var RouteTenantIndex = delphi.Index{Name: "route_tenant", Values: func(obj *nimbusv1.Object) []string {
	if !obj.GetRoute().GetTenantTable() {
		return nil
	}
	if t := obj.GetMeta().GetTenant(); t != "" {
		return []string{t}
	}
	return []string{nimbusv1.DefaultTenant}
}}

// RouteOptions configures a RouteReconciler.
type RouteOptions struct {
	// Store resolves which object owns a kernel route. Required.
	Store RouteStore
	// Namespace is the network namespace to program. Default: the calling process's.
	Namespace *netns.NsHandle
	// Timeout bounds every netlink request, so a kernel that does not answer fails the
	// reconcile, which is retried, instead of pinning a worker. Default: 10s.
	Timeout time.Duration
	// View is Namespace's kernel view, shared with the other reconcilers of the namespace,
	// through which the observer watches (one subscription between them). Default: a view
	// of the reconciler's own.
	View *KernelView
	// EventBuffer is the size in bytes of the observer's queue of route changes, and the
	// least receive buffer of its view's subscription (SO_RCVBUFFORCE, which needs
	// CAP_NET_ADMIN). A burst of route changes bigger than it overflows it; the observer
	// then fails, and its restart reads the kernel afresh. Default: 32 MiB.
	EventBuffer int
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
}

// routeID is what identifies a naples route in the kernel: its table, its destination and
// its metric, as the kernel reports them (an IPv6 route asked for with metric 0 gets 1024).
// It is held in a compact form without pointers (28 bytes; a netip.Prefix alone takes 32),
// as every mirrored and programmed route keeps one.
type routeID struct {
	// addr is the destination's address: 4 bytes for IPv4, then zeros.
	addr          [16]byte
	table, metric uint32
	// bits is the prefix length; v4 tells an IPv4 destination.
	bits uint8
	v4   bool
	// pad is always zero: it keeps the struct free of padding, so that it hashes and
	// compares as one block of memory.
	pad uint16
}

// newRouteID returns the identity of the route to p (masked) in table with metric.
func newRouteID(table uint32, p netip.Prefix, metric uint32) routeID {
	p = p.Masked()
	id := routeID{table: table, metric: metric, bits: uint8(p.Bits())}
	if a := p.Addr(); a.Is4() {
		a4 := a.As4()
		copy(id.addr[:], a4[:])
		id.v4 = true
	} else {
		id.addr = a.As16()
	}
	return id
}

// hash returns a hash of the identity, for the route table's shards.
func (id routeID) hash() uint64 {
	ne := binary.NativeEndian
	h := ne.Uint64(id.addr[0:8]) ^ bits.RotateLeft64(ne.Uint64(id.addr[8:16]), 29)
	h ^= uint64(id.table)<<32 | uint64(id.metric)
	h ^= uint64(id.bits) << 48
	h *= 0x9e3779b97f4a7c15
	return h ^ h>>29
}

// dst returns the destination's address.
func (id routeID) dst() netip.Addr {
	if id.v4 {
		return netip.AddrFrom4([4]byte(id.addr[:4]))
	}
	return netip.AddrFrom16(id.addr)
}

// prefix returns the destination.
func (id routeID) prefix() netip.Prefix { return netip.PrefixFrom(id.dst(), int(id.bits)) }

// indexKey returns the identity in the compact binary form RouteIndex lists owners under:
// the address length (4 or 16), table and metric (4 bytes each, big-endian), prefix
// length, address. It is held once per route in the index and built for every owner
// lookup, so it is about half as long as String's form. Keys of one family have one
// length and the families' keys differ in their first byte, so no key is a prefix of
// another.
func (id routeID) indexKey() string {
	addr := id.dst()
	b := make([]byte, 0, 26)
	b = append(b, byte(addr.BitLen()/8))
	b = binary.BigEndian.AppendUint32(b, id.table)
	b = binary.BigEndian.AppendUint32(b, id.metric)
	b = append(b, id.bits)
	if addr.Is4() {
		a := addr.As4()
		b = append(b, a[:]...)
	} else {
		a := addr.As16()
		b = append(b, a[:]...)
	}
	return string(b)
}

// String returns the identity as "PREFIX table T metric M".
func (id routeID) String() string {
	b := make([]byte, 0, 64)
	b = id.prefix().AppendTo(b)
	b = append(b, " table "...)
	b = strconv.AppendUint(b, uint64(id.table), 10)
	b = append(b, " metric "...)
	b = strconv.AppendUint(b, uint64(id.metric), 10)
	return string(b)
}

// RouteReconciler programs Route objects into policy-routing tables. It reads the kernel
// from its view's route table (every route of the namespace), filled by one dump, kept
// current by the view's subscription and dumped afresh by every sweep, so a reconcile
// costs one netlink write, or none when the kernel already holds the route.
type RouteReconciler struct {
	// rtnlConn dumps the routes and carries the route writes, many to a sendmsg.
	*rtnlConn
	store RouteStore
	// routes is the view's table of routes, which routeReader reads; links the view's
	// table of links, which linkReader reads, whose index by name resolves a next hop's
	// device.
	routes      *routeTable
	routeReader *tableReader[routeID, kernelRoute]
	links       *linkTable
	linkReader  *tableReader[int32, kernelLink]

	// dstLocks serializes work on one kernel route between the workers of different keys
	// and the sweeper: whoever holds it reads delphi and the route table and then writes the
	// kernel.
	dstLocks keyedMutex[routeID]

	// programmed remembers, per object key, the kernel route programmed for it, so a
	// deleted or moved object's old route can be removed and the observer can tell drift
	// from a route that is as programmed. It holds the identity alone (the next hops are
	// the object's), 32 bytes a route.
	programmed programmedRoutes
}

// programmedRoutes maps object keys to the routes programmed for them, in shards by
// key, each with its own lock, so that many workers do not queue on one lock.
type programmedRoutes struct {
	seed   maphash.Seed
	shards [16]programmedShard
}

// programmedShard holds the programmed routes of the keys that hash to it.
type programmedShard struct {
	// mu guards m.
	mu sync.Mutex
	m  map[nimbusv1.Key]programmedRoute
}

// init makes the shards' maps.
func (p *programmedRoutes) init() {
	p.seed = maphash.MakeSeed()
	for i := range p.shards {
		p.shards[i].m = map[nimbusv1.Key]programmedRoute{}
	}
}

// shard returns the shard of key id.
func (p *programmedRoutes) shard(id nimbusv1.Key) *programmedShard {
	return &p.shards[maphash.Comparable(p.seed, id)%uint64(len(p.shards))]
}

// get returns the route programmed for key id.
func (p *programmedRoutes) get(id nimbusv1.Key) (programmedRoute, bool) {
	sh := p.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.m[id]
	return r, ok
}

// set records the route programmed for key id.
func (p *programmedRoutes) set(id nimbusv1.Key, r programmedRoute) {
	sh := p.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.m[id] = r
}

// adopt records r for key id unless a route is recorded for it.
func (p *programmedRoutes) adopt(id nimbusv1.Key, r programmedRoute) {
	sh := p.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, known := sh.m[id]; !known {
		sh.m[id] = r
	}
}

// remove forgets the route of key id.
func (p *programmedRoutes) remove(id nimbusv1.Key) {
	sh := p.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.m, id)
}

// programmedRoute is a route the reconciler programmed, or adopted, for an object.
type programmedRoute struct {
	id routeID
	// reconciled is false for an adopted route not yet reconciled.
	reconciled bool
}

var (
	_ hal.Reconciler         = (*RouteReconciler)(nil)
	_ hal.Sweeper            = (*RouteReconciler)(nil)
	_ hal.Observer           = (*RouteReconciler)(nil)
	_ hal.Dependent          = (*RouteReconciler)(nil)
	_ hal.KernelWriteCounter = (*RouteReconciler)(nil)
)

// NewRouteReconciler returns a reconciler bound to the options' namespace.
func NewRouteReconciler(opts RouteOptions) (*RouteReconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("route reconciler: RouteOptions.Store is required")
	}
	c, err := openRTNLConn(rtnlConnOptions{Namespace: opts.Namespace, View: opts.View, Timeout: opts.Timeout,
		EventBuffer: opts.EventBuffer, DefaultEventBuffer: 32 << 20, Logger: opts.Logger, Writes: true})
	if err != nil {
		return nil, err
	}
	reader := c.view.routes.reader(c)
	if reader == nil {
		c.close()
		return nil, errors.New("route reconciler: the kernel view's route table has as many readers as it can hold")
	}
	linkReader := c.view.links.reader(c)
	if linkReader == nil {
		reader.close()
		c.close()
		return nil, errors.New("route reconciler: the kernel view's link table has as many readers as it can hold")
	}
	r := &RouteReconciler{
		rtnlConn:    c,
		store:       opts.Store,
		routes:      c.view.routes,
		routeReader: reader,
		links:       c.view.links,
		linkReader:  linkReader,
	}
	r.programmed.init()
	return r, nil
}

// Close releases the netlink sockets and stops reading the view's route table. It is
// safe to call twice.
func (r *RouteReconciler) Close() error {
	r.routeReader.close()
	r.linkReader.close()
	r.close()
	return nil
}

// Kind returns KIND_ROUTE.
func (r *RouteReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_ROUTE }

// KernelWrites returns how many routes the reconciler has created, replaced or deleted.
func (r *RouteReconciler) KernelWrites() uint64 { return r.writes.Load() }

// Reconcile makes the kernel hold exactly the route obj describes for key: `ip route
// replace PREFIX table T metric M proto 241 nexthop via GW ...` (`ip route add` when the
// route table holds no route there), written only when the table shows that what is there
// differs. With obj nil it deletes the route it programmed for key.
func (r *RouteReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (*nimbusv1.OperationalData, error) {
	if err := r.fill(ctx); err != nil {
		return nil, err
	}
	id := key.Key()
	old, hadOld := r.programmed.get(id)

	var want routeID
	if obj != nil {
		var err error
		if want, err = idOf(obj.GetRoute(), obj.GetMeta().GetTenant()); err != nil {
			return nil, err
		}
	}
	if hadOld && (obj == nil || old.id != want) {
		if err := r.release(ctx, id, old.id); err != nil {
			return nil, err
		}
	}
	if obj == nil {
		return nil, nil
	}

	lock := r.dstLocks.lock(want)
	defer r.dstLocks.unlock(want, lock)
	owner, err := r.ownerOf(want)
	if err != nil {
		return nil, err
	}
	if !owner.IsZero() && owner != id {
		return nil, hal.Errorf(hal.ReasonConflict, "route %s is already claimed by %s", want, owner)
	}
	wantRoute, err := r.build(want, obj.GetRoute())
	if err != nil {
		return nil, err
	}
	have, exists := r.routes.get(want)
	if exists && have.protocol != RouteProtocol {
		return nil, hal.Errorf(hal.ReasonConflict, "route %s exists and was not created by naples (protocol %s); leaving it alone", want, rtnl.RouteProtocolName(have.protocol))
	}
	if !exists || !sameRoute(have, wantRoute) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := r.write(ctx, want, wantRoute, exists); err != nil {
			return nil, err
		}
		if r.log.Enabled(ctx, slog.LevelDebug) {
			r.log.Debug("route programmed", "key", id, "route", want.String())
		}
	}
	if !hadOld || old != (programmedRoute{id: want, reconciled: true}) {
		r.remember(id, want)
	}
	// No operational data: PROGRAMMED at the object's generation says that the kernel
	// holds its spec, and an echo of the spec in every status cost each route a map.
	return nil, nil
}

// write puts route into the kernel and the route table: `ip route replace` over a naples
// route the table holds, `ip route add` where it holds none, so that a route someone else
// added that the table has not heard of yet fails the write instead of being overwritten.
func (r *RouteReconciler) write(ctx context.Context, id routeID, want kernelRoute, replace bool) error {
	flags := uint16(unix.NLM_F_CREATE | unix.NLM_F_EXCL)
	if replace {
		flags = unix.NLM_F_CREATE | unix.NLM_F_REPLACE
	}
	msg := appendRouteRequest(r.nl.Buffer(), unix.RTM_NEWROUTE, flags, id, want.hops)
	_, err := kernelWrite(ctx, r.rtnlConn, r.routes.m.ExpectBy(r.routeReader.writer(), id, want, sameRoute), msg)
	switch {
	case err != nil && !replace && errors.Is(err, unix.EEXIST):
		return hal.Errorf(hal.ReasonKernelError, "adding route %s: a route the mirror has not heard of yet is there: %w", id, err)
	case err != nil && !replace:
		return hal.Errorf(hal.ReasonKernelError, "adding route %s: %w", id, err)
	case err != nil:
		return hal.Errorf(hal.ReasonKernelError, "replacing route %s: %w", id, err)
	}
	return nil
}

// remember records that the route with identity rid is the one programmed for key id.
func (r *RouteReconciler) remember(id nimbusv1.Key, rid routeID) {
	r.programmed.set(id, programmedRoute{id: rid, reconciled: true})
}

// release removes the route key had programmed, unless another object now owns it.
func (r *RouteReconciler) release(ctx context.Context, id nimbusv1.Key, old routeID) error {
	lock := r.dstLocks.lock(old)
	defer r.dstLocks.unlock(old, lock)
	owner, err := r.ownerOf(old)
	if err != nil {
		return err
	}
	if owner.IsZero() || owner == id {
		if err := r.delete(ctx, old); err != nil {
			return err
		}
	}
	r.programmed.remove(id)
	return nil
}

// Sweep reads every route afresh into the route table, enqueues the owners of routes
// that changed without the observer reporting it (through the observer, when it
// watches), deletes every naples route that no desired Route object owns, and adopts the
// others, so a restarted agent knows what it programmed before.
func (r *RouteReconciler) Sweep(ctx context.Context, enqueue func(nimbusv1.Key)) error {
	if err := r.routes.reload(ctx, r.rtnlConn); err != nil {
		return err
	}
	r.routeReader.drainMissed(func(c tableChange[routeID, kernelRoute]) { r.routeChanged(c, enqueue) })
	for id := range r.routes.protocols.Get(RouteProtocol) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := r.sweepOne(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

func (r *RouteReconciler) sweepOne(ctx context.Context, id routeID) error {
	lock := r.dstLocks.lock(id)
	defer r.dstLocks.unlock(id, lock)
	owner, err := r.ownerOf(id)
	if err != nil {
		return err
	}
	if !owner.IsZero() {
		r.programmed.adopt(owner, programmedRoute{id: id})
		return nil
	}
	r.log.Info("removing stale route", "route", id.String())
	return r.delete(ctx, id)
}

// Observe watches the view's route table (which the view dumps when its subscription
// starts, so a restart after an overflow starts from the kernel's state). It enqueues
// the owner of every naples route that someone else changes or deletes, and of every
// route a fresh read finds changed, so drift is repaired by a normal reconcile. A route
// of protocol 241 that differs from what the reconciler wrote counts as drift too:
// another writer may use the protocol.
//
// The kernel removes IPv4 routes without a word when the interface they go through goes
// down or away, or loses its last IPv4 address: no RTM_DELROUTE follows. So the observer
// also hears of links and IPv4 addresses, and when a link that the table shows carrying
// an IPv4 route goes down or away, or loses an address, it reads the routes afresh (one
// re-read at a time, and one more for every burst of such events that came meanwhile),
// which enqueues the objects whose routes went.
func (r *RouteReconciler) Observe(ctx context.Context, enqueue func(nimbusv1.Key), subscribed func()) error {
	var reread coalescing
	defer reread.wait()
	routes := r.routeReader.watching(func(c tableChange[routeID, kernelRoute]) { r.routeChanged(c, enqueue) })
	// The link table's changes are no news: the link notifications tell of flushes, and
	// the table only names next hops' devices. Watching it keeps it loaded and current.
	links := r.linkReader.watching(func(tableChange[int32, kernelLink]) {})
	groups := []uint{unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_IFADDR}
	return r.observeTables(ctx, "route changes", groups, []viewSource{routes, links}, func(context.Context) error { return nil }, subscribed,
		func(typ uint16, payload []byte) {
			index, down := routeFlushHint(typ, payload)
			if !down || !r.routes.carriesV4(index) {
				return
			}
			reread.run(func() {
				if err := r.routes.reload(ctx, r.rtnlConn); err != nil && ctx.Err() == nil {
					r.log.Warn("reading routes afresh after a link went down", "err", err)
				}
			})
		})
}

// DependsOn returns Network: a route in its tenant's table often goes through the
// gateway of one of the tenant's networks, and cannot be written before that network is.
func (r *RouteReconciler) DependsOn() []nimbusv1.Kind {
	return []nimbusv1.Kind{nimbusv1.Kind_KIND_NETWORK}
}

// DependentsOf returns, for a Network, the routes that go into its tenant's table.
func (r *RouteReconciler) DependentsOf(key nimbusv1.Key) []nimbusv1.Key {
	if key.Kind != nimbusv1.Kind_KIND_NETWORK {
		return nil
	}
	keys, err := r.store.LookupKeys(RouteTenantIndex.Name, key.Tenant)
	if err != nil {
		return nil
	}
	return keys
}

// routeFlushHint tells, for a link or address notification, the index of the link it is
// about and whether it may have made the kernel flush IPv4 routes through that link
// without a notification: the link went away or is down, or it lost an IPv4 address.
func routeFlushHint(typ uint16, payload []byte) (index int32, down bool) {
	ne := binary.NativeEndian
	switch typ {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		if len(payload) < unix.SizeofIfInfomsg {
			return 0, false
		}
		index = int32(ne.Uint32(payload[4:8]))
		return index, typ == unix.RTM_DELLINK || ne.Uint32(payload[8:12])&unix.IFF_UP == 0
	case unix.RTM_DELADDR:
		if len(payload) < unix.SizeofIfAddrmsg || payload[0] != unix.AF_INET {
			return 0, false
		}
		return int32(ne.Uint32(payload[4:8])), true
	}
	return 0, false
}

// coalescing runs a function in a goroutine of its own, one run at a time: a call while
// one runs makes one more run after it, however many calls come meanwhile.
type coalescing struct {
	mu      sync.Mutex
	running bool
	again   bool
	wg      sync.WaitGroup
}

// run runs f now, or once more after the run under way.
func (c *coalescing) run(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		c.again = true
		return
	}
	c.running = true
	c.wg.Go(func() {
		for {
			f()
			c.mu.Lock()
			if !c.again {
				c.running = false
				c.mu.Unlock()
				return
			}
			c.again = false
			c.mu.Unlock()
		}
	})
}

// wait waits for the runs under way.
func (c *coalescing) wait() { c.wg.Wait() }

// routeChanged enqueues the owner of a route that changed, when the change is drift: not
// the echo of the reconciler's own write, and leaving the route other than programmed.
func (r *RouteReconciler) routeChanged(c tableChange[routeID, kernelRoute], enqueue func(nimbusv1.Key)) {
	if c.echo {
		return // our own write
	}
	if c.had && c.has && c.fields&(routeFieldProtocol|routeFieldHops) == 0 {
		return // a preferred source, output interface or scope, which its routes leave the kernel's
	}
	typ := uint16(unix.RTM_NEWROUTE)
	if !c.has {
		typ = unix.RTM_DELROUTE
	}
	if key, drift := r.drift(c.key, typ, c.new); drift {
		enqueue(key)
	}
}

// drift tells whether a route change that is not the echo of the reconciler's own write
// leaves a route some object owns other than programmed, and which object that is.
func (r *RouteReconciler) drift(id routeID, typ uint16, rt kernelRoute) (key nimbusv1.Key, ok bool) {
	obj, key, err := r.store.LookupFirst(RouteIndex.Name, id.indexKey())
	if err != nil || key.IsZero() {
		return nimbusv1.Key{}, false
	}
	if typ == unix.RTM_NEWROUTE && rt.protocol == RouteProtocol {
		p, known := r.programmed.get(key)
		if known && p.id == id && p.reconciled {
			if want, err := r.build(id, obj.GetRoute()); err == nil && sameRoute(rt, want) {
				return nimbusv1.Key{}, false // as programmed: another writer put back the same route
			}
		}
	}
	return key, true
}

// fill loads the route and link tables with a dump each, unless one has loaded them
// already.
func (r *RouteReconciler) fill(ctx context.Context) error {
	if err := r.links.fill(ctx, r.rtnlConn); err != nil {
		return err
	}
	return r.routes.fill(ctx, r.rtnlConn)
}

// idOf derives the kernel identity of a route spec of an object of the tenant.
func idOf(spec *nimbusv1.RouteSpec, tenant string) (routeID, error) {
	p, err := netip.ParsePrefix(spec.GetPrefix())
	if err != nil {
		return routeID{}, fmt.Errorf("spec.prefix %q: %w", spec.GetPrefix(), err)
	}
	table := spec.GetTable()
	if spec.GetTenantTable() {
		table = TenantTable(tenant)
	}
	id := newRouteID(table, p, spec.GetMetric())
	if id.metric == 0 && !id.v4 {
		// The kernel stores an IPv6 route asked for with metric 0 at metric 1024.
		id.metric = ip6DefaultMetric
	}
	return id, nil
}

// ip6DefaultMetric is the metric the kernel gives an IPv6 route added with metric 0
// (IP6_RT_PRIO_USER).
const ip6DefaultMetric = 1024

// ownerOf returns the key of the desired object that owns a kernel route, the first by
// key of the Route objects with its identity; the zero Key when none does.
func (r *RouteReconciler) ownerOf(id routeID) (nimbusv1.Key, error) {
	key, err := r.store.LookupFirstKey(RouteIndex.Name, id.indexKey())
	if err != nil {
		return nimbusv1.Key{}, fmt.Errorf("finding the owner of route %s: %w", id, err)
	}
	return key, nil
}

// errNoLink is the error of a next hop whose device the link table does not hold.
var errNoLink = errors.New("link not found")

// build returns the route with identity id that spec describes, in the form the route table holds: its next hops
// sorted, with interface names resolved to indexes through the link table's index by name.
func (r *RouteReconciler) build(id routeID, spec *nimbusv1.RouteSpec) (kernelRoute, error) {
	nhs := spec.GetNexthops()
	k := kernelRoute{protocol: RouteProtocol, hops: make([]hop, 0, max(1, len(nhs)))}
	for i, nh := range nhs {
		h := hop{weight: 1}
		if nh.GetGateway() != "" {
			gw, err := netip.ParseAddr(nh.GetGateway())
			if err != nil {
				return kernelRoute{}, fmt.Errorf("spec.nexthops[%d].gateway %q: %w", i, nh.GetGateway(), err)
			}
			if h.gw = gw.Unmap(); h.gw.Is4() != id.v4 {
				return kernelRoute{}, fmt.Errorf("spec.nexthops[%d].gateway %q: not of the prefix's address family", i, nh.GetGateway())
			}
		}
		if nh.GetDevice() != "" {
			index, _, ok := r.links.byName(nh.GetDevice())
			if !ok {
				return kernelRoute{}, hal.Errorf(hal.ReasonKernelError, "spec.nexthops[%d].device %q: %w", i, nh.GetDevice(), errNoLink)
			}
			h.link = index
		}
		if w := nh.GetWeight(); w > 1 {
			h.weight = int32(w)
		}
		k.hops = append(k.hops, h)
	}
	if len(k.hops) == 0 {
		k.hops = append(k.hops, hop{weight: 1})
	}
	if len(k.hops) > 1 {
		slices.SortFunc(k.hops, compareHops)
	}
	return k, nil
}

// delete removes the naples route with the identity, if the route table holds one: `ip route
// del PREFIX table T metric M proto 241`, which the kernel refuses for a route of another
// protocol. A route that is gone already, or was not created by naples, is left alone.
func (r *RouteReconciler) delete(ctx context.Context, id routeID) error {
	have, ok := r.routes.get(id)
	if !ok || have.protocol != RouteProtocol {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	msg := appendRouteRequest(r.nl.Buffer(), unix.RTM_DELROUTE, 0, id, nil)
	took, err := kernelWrite(ctx, r.rtnlConn, r.routes.m.ExpectGoneBy(r.routeReader.writer(), id), msg, unix.ESRCH)
	if err != nil {
		return hal.Errorf(hal.ReasonKernelError, "deleting route %s: %w", id, err)
	}
	if took && r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("route deleted", "route", id.String())
	}
	return nil
}

// appendRouteRequest appends to b a request of type RTM_NEWROUTE (`ip route add` with
// flags NLM_F_CREATE|NLM_F_EXCL, `ip route replace` with NLM_F_CREATE|NLM_F_REPLACE) or
// RTM_DELROUTE (`ip route del`, hops nil) for the naples route with the identity: protocol
// 241, scope universe (nowhere for a delete: any scope), unicast.
func appendRouteRequest(b []byte, typ, flags uint16, id routeID, hops []hop) []byte {
	r := rtnl.Route{Family: unix.AF_INET6, DstLen: id.bits, Table: id.table, Protocol: RouteProtocol,
		Scope: unix.RT_SCOPE_UNIVERSE, Type: unix.RTN_UNICAST, Dst: id.dst(), Priority: id.metric}
	if id.v4 {
		r.Family = unix.AF_INET
	}
	if r.Table == 0 {
		r.Table = unix.RT_TABLE_MAIN
	}
	if typ == unix.RTM_DELROUTE {
		r.Scope, r.Type = unix.RT_SCOPE_NOWHERE, unix.RTN_UNSPEC
	}
	if len(hops) == 1 && hops[0].weight <= 1 {
		r.Gateway, r.OIF = hops[0].gw, hops[0].link
		return rtnl.AppendRouteRequest(b, typ, flags, r, nil)
	}
	var buf [8]rtnl.Nexthop
	nhs := buf[:0]
	for _, h := range hops {
		nhs = append(nhs, rtnl.Nexthop{Index: h.link, Weight: h.weight, Gateway: h.gw})
	}
	return rtnl.AppendRouteRequest(b, typ, flags, r, nhs)
}
