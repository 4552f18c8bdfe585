package linux

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// RouteProtocol is the route protocol number that marks routes naples created
// (`ip route show proto 241`).
const RouteProtocol netlink.RouteProtocol = 241

// RouteIndex is the delphi index the route reconciler finds the owner of a kernel route
// with: it lists a Route object under its kernel identity, derived from the parsed spec,
// so that spellings of one prefix ("2001:DB8::/32", "2001:db8::/32") and the kernel's
// default IPv6 metric find the same owner. Stores handed to NewRouteReconciler must
// declare it (delphi.Options.Indexes).
var RouteIndex = delphi.Index{Name: "route", Values: func(obj *nimbusv1.Object) []string {
	spec := obj.GetRoute()
	if spec == nil {
		return nil
	}
	id, err := idOf(spec)
	if err != nil {
		return nil
	}
	return []string{id.String()}
}}

// Indexes returns the delphi indexes the backend's reconcilers look objects up by.
func Indexes() []delphi.Index { return []delphi.Index{RouteIndex} }

// RouteStore is what the route reconciler reads of delphi.
type RouteStore interface {
	// Lookup returns the desired objects a declared index lists under value, ordered by
	// key.
	Lookup(index, value string) ([]*nimbusv1.Object, error)
}

// RouteOptions configures a RouteReconciler.
type RouteOptions struct {
	// Store resolves which object owns a kernel route. Required.
	Store RouteStore
	// Namespace is the network namespace to program. Default: the calling process's.
	Namespace *netns.NsHandle
	// Timeout bounds every netlink request, so a kernel that does not answer fails the
	// reconcile, which is retried, instead of pinning a worker. Default: 10s.
	Timeout time.Duration
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
}

// routeID is what identifies a naples route in the kernel: its table, its destination and
// its metric, as the kernel reports them (an IPv6 route asked for with metric 0 gets 1024).
type routeID struct {
	table  uint32
	prefix netip.Prefix
	metric uint32
}

func (id routeID) String() string {
	return fmt.Sprintf("%s table %d metric %d", id.prefix, id.table, id.metric)
}

// RouteReconciler programs Route objects into policy-routing tables.
type RouteReconciler struct {
	store  RouteStore
	handle *netlink.Handle
	ns     *netns.NsHandle
	log    *slog.Logger
	writes atomic.Uint64

	// dstLocks serializes work on one kernel route between the workers of different keys
	// and the sweeper: whoever holds it reads delphi and then writes the kernel.
	dstLocks keyedMutex[routeID]

	// mu guards programmed.
	mu sync.Mutex
	// programmed remembers, per object key ID, the kernel route programmed for it, so a
	// deleted or moved object's old route can be removed and the observer can tell our
	// own writes from someone else's.
	programmed map[string]programmedRoute
}

// programmedRoute is a route the reconciler programmed, or adopted, for an object.
type programmedRoute struct {
	id routeID
	// route is what was written, or found correct; nil for an adopted route not yet
	// reconciled.
	route *netlink.Route
}

var (
	_ hal.Reconciler = (*RouteReconciler)(nil)
	_ hal.Sweeper    = (*RouteReconciler)(nil)
	_ hal.Observer   = (*RouteReconciler)(nil)
)

// NewRouteReconciler returns a reconciler bound to the options' namespace.
func NewRouteReconciler(opts RouteOptions) (*RouteReconciler, error) {
	if opts.Store == nil {
		return nil, errors.New("route reconciler: RouteOptions.Store is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	var h *netlink.Handle
	var err error
	if opts.Namespace != nil {
		h, err = netlink.NewHandleAt(*opts.Namespace)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("opening netlink handle: %w", err)
	}
	if err := h.SetSocketTimeout(opts.Timeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("setting netlink timeout %v: %w", opts.Timeout, err)
	}
	return &RouteReconciler{
		store:      opts.Store,
		handle:     h,
		ns:         opts.Namespace,
		log:        opts.Logger,
		programmed: map[string]programmedRoute{},
	}, nil
}

// Close releases the netlink handle. It is safe to call twice.
func (r *RouteReconciler) Close() error {
	r.handle.Close()
	return nil
}

// Kind returns KIND_ROUTE.
func (r *RouteReconciler) Kind() nimbusv1.Kind { return nimbusv1.Kind_KIND_ROUTE }

// KernelWrites returns how many routes the reconciler has replaced or deleted.
func (r *RouteReconciler) KernelWrites() uint64 { return r.writes.Load() }

// Reconcile makes the kernel hold exactly the route obj describes for key: `ip route
// replace PREFIX table T metric M proto 241 nexthop via GW ...`, written only when what is
// there differs. With obj nil it deletes the route it programmed for key.
func (r *RouteReconciler) Reconcile(ctx context.Context, key *nimbusv1.ObjectKey, obj *nimbusv1.Object) (map[string]string, error) {
	id := key.ID()
	r.mu.Lock()
	old, hadOld := r.programmed[id]
	r.mu.Unlock()

	var want routeID
	if obj != nil {
		var err error
		if want, err = idOf(obj.GetRoute()); err != nil {
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

	unlock := r.dstLocks.lock(want)
	defer unlock()
	owner, err := r.ownerOf(want)
	if err != nil {
		return nil, err
	}
	if owner != nil && owner.Key().ID() != id {
		return nil, hal.Errorf(hal.ReasonConflict, "route %s is already claimed by %s", want, owner.Key().ID())
	}
	route, err := r.build(want, obj.GetRoute())
	if err != nil {
		return nil, err
	}
	existing, err := r.list(ctx, want)
	if err != nil {
		return nil, err
	}
	if len(existing) > 0 && existing[0].Protocol != RouteProtocol {
		return nil, hal.Errorf(hal.ReasonConflict, "route %s exists and was not created by naples (protocol %s); leaving it alone", want, existing[0].Protocol)
	}
	if len(existing) == 0 || !sameNexthops(existing[0], route) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Recorded before the write, so the observer knows the change it is about to see.
		r.remember(id, want, route)
		if err := r.handle.RouteReplace(route); err != nil {
			return nil, hal.Errorf(hal.ReasonKernelError, "replacing route %s: %w", want, err)
		}
		r.writes.Add(1)
		r.log.Info("route programmed", "key", id, "route", want.String())
	}
	r.remember(id, want, route)
	return map[string]string{
		"table":    strconv.FormatUint(uint64(want.table), 10),
		"prefix":   want.prefix.String(),
		"nexthops": describeNexthops(route),
	}, nil
}

// remember records that route, with identity rid, is the one programmed for key ID id.
func (r *RouteReconciler) remember(id string, rid routeID, route *netlink.Route) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.programmed[id] = programmedRoute{id: rid, route: route}
}

// release removes the route key had programmed, unless another object now owns it.
func (r *RouteReconciler) release(ctx context.Context, id string, old routeID) error {
	unlock := r.dstLocks.lock(old)
	defer unlock()
	owner, err := r.ownerOf(old)
	if err != nil {
		return err
	}
	if owner == nil || owner.Key().ID() == id {
		if err := r.delete(ctx, old); err != nil {
			return err
		}
	}
	r.mu.Lock()
	delete(r.programmed, id)
	r.mu.Unlock()
	return nil
}

// Sweep deletes every naples route that no desired Route object owns and adopts the
// others, so a restarted agent knows what it programmed before.
func (r *RouteReconciler) Sweep(ctx context.Context) error {
	routes, err := r.handle.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Table: unix.RT_TABLE_UNSPEC, Protocol: RouteProtocol},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("listing naples routes: %w", err)
	}
	for _, rt := range routes {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		id, ok := kernelID(rt)
		if !ok {
			continue
		}
		if err := r.sweepOne(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

func (r *RouteReconciler) sweepOne(ctx context.Context, id routeID) error {
	unlock := r.dstLocks.lock(id)
	defer unlock()
	owner, err := r.ownerOf(id)
	if err != nil {
		return err
	}
	if owner != nil {
		r.mu.Lock()
		if _, known := r.programmed[owner.Key().ID()]; !known {
			r.programmed[owner.Key().ID()] = programmedRoute{id: id}
		}
		r.mu.Unlock()
		return nil
	}
	r.log.Info("removing stale route", "route", id.String())
	return r.delete(ctx, id)
}

// Observe enqueues the owner of every naples route that someone else changes or deletes,
// so drift is repaired by a normal reconcile. A route of protocol 241 that differs from
// what the reconciler wrote counts as drift too: another writer may use the protocol.
func (r *RouteReconciler) Observe(ctx context.Context, enqueue func(keyID string), subscribed func()) error {
	updates := make(chan netlink.RouteUpdate, 256)
	done := make(chan struct{})
	defer func() {
		// Closing done closes the socket, which ends the subscription's goroutine; it
		// may be blocked sending an update, so take what it still sends until it closes
		// the channel.
		close(done)
		for range updates {
		}
	}()
	errs := make(chan error, 1)
	err := netlink.RouteSubscribeWithOptions(updates, done, netlink.RouteSubscribeOptions{
		Namespace: r.ns,
		ErrorCallback: func(err error) {
			select {
			case errs <- err:
			default:
			}
		},
	})
	if err != nil {
		return fmt.Errorf("subscribing to route changes: %w", err)
	}
	subscribed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return fmt.Errorf("watching route changes: %w", err)
		case u, ok := <-updates:
			if !ok {
				return errors.New("route change subscription closed")
			}
			if keyID, drift := r.drift(u); drift {
				enqueue(keyID)
			}
		}
	}
}

// drift tells whether a route change is one the reconciler did not make to a route some
// object owns, and which object that is.
func (r *RouteReconciler) drift(u netlink.RouteUpdate) (keyID string, ok bool) {
	id, ok := kernelID(u.Route)
	if !ok {
		return "", false
	}
	owner, err := r.ownerOf(id)
	if err != nil || owner == nil {
		return "", false
	}
	keyID = owner.Key().ID()
	if u.Type == unix.RTM_NEWROUTE && u.Protocol == RouteProtocol {
		r.mu.Lock()
		p, known := r.programmed[keyID]
		r.mu.Unlock()
		if known && p.id == id && p.route != nil && sameNexthops(u.Route, p.route) {
			return "", false // our own write
		}
	}
	return keyID, true
}

// idOf derives the kernel identity of a route spec.
func idOf(spec *nimbusv1.RouteSpec) (routeID, error) {
	p, err := netip.ParsePrefix(spec.GetPrefix())
	if err != nil {
		return routeID{}, fmt.Errorf("spec.prefix %q: %w", spec.GetPrefix(), err)
	}
	id := routeID{table: spec.GetTable(), prefix: p.Masked(), metric: spec.GetMetric()}
	if id.metric == 0 && id.prefix.Addr().Is6() {
		// The kernel stores an IPv6 route asked for with metric 0 at metric 1024.
		id.metric = ip6DefaultMetric
	}
	return id, nil
}

// ip6DefaultMetric is the metric the kernel gives an IPv6 route added with metric 0
// (IP6_RT_PRIO_USER).
const ip6DefaultMetric = 1024

// kernelID is the identity of a kernel route, if it is one naples could have created.
func kernelID(rt netlink.Route) (routeID, bool) {
	if rt.Dst == nil {
		return routeID{}, false
	}
	addr, ok := netip.AddrFromSlice(rt.Dst.IP)
	if !ok {
		return routeID{}, false
	}
	ones, _ := rt.Dst.Mask.Size()
	return routeID{table: uint32(rt.Table), prefix: netip.PrefixFrom(addr.Unmap(), ones).Masked(), metric: uint32(rt.Priority)}, true
}

// ownerOf returns the desired object that owns a kernel route: the first by key of the
// Route objects with its identity.
func (r *RouteReconciler) ownerOf(id routeID) (*nimbusv1.Object, error) {
	objs, err := r.store.Lookup(RouteIndex.Name, id.String())
	if err != nil {
		return nil, fmt.Errorf("finding the owner of route %s: %w", id, err)
	}
	if len(objs) == 0 {
		return nil, nil
	}
	return objs[0], nil
}

func (r *RouteReconciler) build(id routeID, spec *nimbusv1.RouteSpec) (*netlink.Route, error) {
	route := &netlink.Route{
		Table:    int(id.table),
		Dst:      prefixNet(id.prefix),
		Priority: int(id.metric),
		Protocol: RouteProtocol,
		Family:   family(id.prefix.Addr()),
	}
	var hops []*netlink.NexthopInfo
	for i, nh := range spec.GetNexthops() {
		info := &netlink.NexthopInfo{}
		if nh.GetGateway() != "" {
			gw, err := netip.ParseAddr(nh.GetGateway())
			if err != nil {
				return nil, fmt.Errorf("spec.nexthops[%d].gateway %q: %w", i, nh.GetGateway(), err)
			}
			info.Gw = net.IP(gw.AsSlice())
		}
		if nh.GetDevice() != "" {
			link, err := r.handle.LinkByName(nh.GetDevice())
			if err != nil {
				return nil, hal.Errorf(hal.ReasonKernelError, "spec.nexthops[%d].device %q: %w", i, nh.GetDevice(), err)
			}
			info.LinkIndex = link.Attrs().Index
		}
		if w := nh.GetWeight(); w > 1 {
			info.Hops = int(w) - 1
		}
		hops = append(hops, info)
	}
	if len(hops) == 1 && hops[0].Hops == 0 {
		route.Gw, route.LinkIndex = hops[0].Gw, hops[0].LinkIndex
	} else {
		route.MultiPath = hops
	}
	return route, nil
}

// list returns the kernel routes with the identity's table, prefix and metric.
func (r *RouteReconciler) list(ctx context.Context, id routeID) ([]netlink.Route, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	routes, err := r.handle.RouteListFiltered(family(id.prefix.Addr()),
		&netlink.Route{Table: int(id.table), Dst: prefixNet(id.prefix), Priority: int(id.metric)},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
	if err != nil {
		return nil, fmt.Errorf("listing routes to %s: %w", id, err)
	}
	var out []netlink.Route
	for _, rt := range routes {
		if rt.Priority == int(id.metric) {
			out = append(out, rt)
		}
	}
	return out, nil
}

// delete removes the naples route with the identity, if any; one that is gone already, or
// was not created by naples, is left alone.
func (r *RouteReconciler) delete(ctx context.Context, id routeID) error {
	existing, err := r.list(ctx, id)
	if err != nil {
		return err
	}
	for _, rt := range existing {
		if rt.Protocol != RouteProtocol {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := r.handle.RouteDel(&rt); err != nil && !errors.Is(err, unix.ESRCH) {
			return hal.Errorf(hal.ReasonKernelError, "deleting route %s: %w", id, err)
		}
		r.writes.Add(1)
		r.log.Info("route deleted", "route", id.String())
	}
	return nil
}

// hop is a next hop in a form that compares equal however the kernel reports it.
type hop struct {
	gw     string
	link   int
	weight int
}

func hopsOf(rt *netlink.Route) []hop {
	var hops []hop
	if len(rt.MultiPath) == 0 {
		hops = append(hops, hop{gw: ipString(rt.Gw), link: rt.LinkIndex, weight: 1})
	}
	for _, nh := range rt.MultiPath {
		hops = append(hops, hop{gw: ipString(nh.Gw), link: nh.LinkIndex, weight: nh.Hops + 1})
	}
	sort.Slice(hops, func(i, j int) bool {
		if hops[i].gw != hops[j].gw {
			return hops[i].gw < hops[j].gw
		}
		return hops[i].link < hops[j].link
	})
	return hops
}

// sameNexthops reports whether the kernel route has exactly the wanted next hops; a
// wanted hop without a device matches whatever interface the kernel chose.
func sameNexthops(have netlink.Route, want *netlink.Route) bool {
	h, w := hopsOf(&have), hopsOf(want)
	return slices.EqualFunc(h, w, func(a, b hop) bool {
		return a.gw == b.gw && a.weight == b.weight && (b.link == 0 || a.link == b.link)
	})
}

func describeNexthops(rt *netlink.Route) string {
	var parts []string
	for _, h := range hopsOf(rt) {
		parts = append(parts, fmt.Sprintf("%s weight %d", h.gw, h.weight))
	}
	return strings.Join(parts, ", ")
}

func ipString(ip net.IP) string {
	if ip == nil {
		return ""
	}
	return ip.String()
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func family(a netip.Addr) int {
	if a.Is4() {
		return netlink.FAMILY_V4
	}
	return netlink.FAMILY_V6
}
