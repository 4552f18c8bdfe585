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

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// RouteProtocol is the route protocol number that marks routes naples created
// (`ip route show proto 241`).
const RouteProtocol netlink.RouteProtocol = 241

// Reasons a Route object can fail with, as its status reports them.
const (
	// ReasonConflict: another owner already holds the route's table, prefix and metric.
	ReasonConflict = "Conflict"
	// ReasonKernelError: the kernel refused the change.
	ReasonKernelError = "KernelError"
)

// reasonError is an error with a status reason.
type reasonError struct {
	reason string
	err    error
}

func (e *reasonError) Error() string  { return e.err.Error() }
func (e *reasonError) Unwrap() error  { return e.err }
func (e *reasonError) Reason() string { return e.reason }

// RouteStore is what the route reconciler reads of delphi.
type RouteStore interface {
	// RoutesTo returns the desired Route objects for prefix in table, ordered by key.
	RoutesTo(table uint32, prefix string) []*nimbusv1.Object
}

// RouteOptions configures a RouteReconciler.
type RouteOptions struct {
	// Store resolves which object owns a kernel route. Required.
	Store RouteStore
	// Namespace is the network namespace to program. Default: the calling process's.
	Namespace *netns.NsHandle
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
}

// routeID is what identifies a naples route in the kernel.
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
	// deleted or moved object's old route can be removed.
	programmed map[string]routeID
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
	return &RouteReconciler{
		store:      opts.Store,
		handle:     h,
		ns:         opts.Namespace,
		log:        opts.Logger,
		programmed: map[string]routeID{},
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
	if hadOld && (obj == nil || old != want) {
		if err := r.release(id, old); err != nil {
			return nil, err
		}
	}
	if obj == nil {
		return nil, nil
	}

	unlock := r.dstLocks.lock(want)
	defer unlock()
	if owner := ownerOf(r.store, want); owner != nil && owner.Key().ID() != id {
		return nil, &reasonError{ReasonConflict, fmt.Errorf("route %s is already claimed by %s", want, owner.Key().ID())}
	}
	route, err := r.build(want, obj.GetRoute())
	if err != nil {
		return nil, err
	}
	existing, err := r.list(want)
	if err != nil {
		return nil, err
	}
	if len(existing) > 0 && existing[0].Protocol != RouteProtocol {
		return nil, &reasonError{ReasonConflict, fmt.Errorf("route %s exists and was not created by naples (protocol %s); leaving it alone", want, existing[0].Protocol)}
	}
	if len(existing) == 0 || !sameNexthops(existing[0], route) {
		if err := r.handle.RouteReplace(route); err != nil {
			return nil, &reasonError{ReasonKernelError, fmt.Errorf("replacing route %s: %w", want, err)}
		}
		r.writes.Add(1)
		r.log.Info("route programmed", "key", id, "route", want.String())
	}
	r.mu.Lock()
	r.programmed[id] = want
	r.mu.Unlock()
	return map[string]string{
		"table":    strconv.FormatUint(uint64(want.table), 10),
		"prefix":   want.prefix.String(),
		"nexthops": describeNexthops(route),
	}, nil
}

// release removes the route key had programmed, unless another object now owns it.
func (r *RouteReconciler) release(id string, old routeID) error {
	unlock := r.dstLocks.lock(old)
	defer unlock()
	if owner := ownerOf(r.store, old); owner == nil || owner.Key().ID() == id {
		if err := r.delete(old); err != nil {
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
		if err := r.sweepOne(id); err != nil {
			return err
		}
	}
	return nil
}

func (r *RouteReconciler) sweepOne(id routeID) error {
	unlock := r.dstLocks.lock(id)
	defer unlock()
	if owner := ownerOf(r.store, id); owner != nil {
		r.mu.Lock()
		if _, known := r.programmed[owner.Key().ID()]; !known {
			r.programmed[owner.Key().ID()] = id
		}
		r.mu.Unlock()
		return nil
	}
	r.log.Info("removing stale route", "route", id.String())
	return r.delete(id)
}

// Observe enqueues the owner of every naples route that someone else changes or deletes,
// so drift is repaired by a normal reconcile.
func (r *RouteReconciler) Observe(ctx context.Context, enqueue func(keyID string)) error {
	updates := make(chan netlink.RouteUpdate, 256)
	done := make(chan struct{})
	defer close(done)
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
			if u.Type == unix.RTM_NEWROUTE && u.Protocol == RouteProtocol {
				continue // our own write
			}
			id, ok := kernelID(u.Route)
			if !ok {
				continue
			}
			if owner := ownerOf(r.store, id); owner != nil {
				enqueue(owner.Key().ID())
			}
		}
	}
}

// idOf derives the kernel identity of a route spec.
func idOf(spec *nimbusv1.RouteSpec) (routeID, error) {
	p, err := netip.ParsePrefix(spec.GetPrefix())
	if err != nil {
		return routeID{}, fmt.Errorf("spec.prefix %q: %w", spec.GetPrefix(), err)
	}
	return routeID{table: spec.GetTable(), prefix: p.Masked(), metric: spec.GetMetric()}, nil
}

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
// Route objects for its table and prefix with the same metric.
func ownerOf(store RouteStore, id routeID) *nimbusv1.Object {
	for _, obj := range store.RoutesTo(id.table, id.prefix.String()) {
		if obj.GetRoute().GetMetric() == id.metric {
			return obj
		}
	}
	return nil
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
				return nil, &reasonError{ReasonKernelError, fmt.Errorf("spec.nexthops[%d].device %q: %w", i, nh.GetDevice(), err)}
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
func (r *RouteReconciler) list(id routeID) ([]netlink.Route, error) {
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
func (r *RouteReconciler) delete(id routeID) error {
	existing, err := r.list(id)
	if err != nil {
		return err
	}
	for _, rt := range existing {
		if rt.Protocol != RouteProtocol {
			continue
		}
		if err := r.handle.RouteDel(&rt); err != nil && !errors.Is(err, unix.ESRCH) {
			return &reasonError{ReasonKernelError, fmt.Errorf("deleting route %s: %w", id, err)}
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
