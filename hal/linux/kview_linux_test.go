package linux

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
	"golang.org/x/sys/unix"
)

// TestKernelViewOneSubscription runs the observers of every reconciler of one namespace
// that share a view, as the agent does, and counts the process's netlink sockets in the
// namespace that are bound to rtnetlink multicast groups: exactly one. The reconcilers
// that write share one batched writer, and those that read links, and the firewall,
// share the view's link table, which one dump loaded.
func TestKernelViewOneSubscription(t *testing.T) {
	ns := testns.Named(t, "naples-view")
	nsh := testns.Handle(t, ns)
	s := newTestStore(t, epIndexes())
	view := NewKernelView(KernelViewOptions{Namespace: &nsh})
	bpfDir := filepath.Join("/sys/fs/bpf", ns)
	t.Cleanup(func() { os.RemoveAll(bpfDir) })

	var observers []hal.Observer
	closed := func(r interface{ Close() error }, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		observers = append(observers, r.(hal.Observer))
	}
	closed(NewRouteReconciler(RouteOptions{Store: s.store, Namespace: &nsh, View: view, Logger: quiet}))
	closed(NewInterfaceReconciler(InterfaceOptions{Store: s.store, Namespace: &nsh, View: view, Logger: quiet,
		StateFile: filepath.Join(t.TempDir(), "interfaces.json")}))
	closed(NewNodeReconciler(NodeOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Logger: quiet}))
	closed(NewNetworkReconciler(NetworkOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Logger: quiet,
		BPFDir: bpfDir, StateFile: filepath.Join(t.TempDir(), "sysctls.json")}))
	closed(NewEndpointReconciler(EndpointOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Logger: quiet,
		StateFile: filepath.Join(t.TempDir(), "endpoints.json")}))

	for _, o := range observers {
		runObserver(t, o)
	}
	if got := testns.RouteSubscriptions(t, ns); got != 1 {
		t.Errorf("%d rtnetlink sockets with multicast groups in the namespace, want 1", got)
	}
	if got := view.subscriptions.Load(); got != 1 {
		t.Errorf("the view opened %d subscriptions, want 1", got)
	}
	if got := view.links.dumps.Load(); got != 1 {
		t.Errorf("the view's link table was dumped %d times, want once, when the subscription started", got)
	}
	if got := view.routes.dumps.Load(); got != 1 {
		t.Errorf("the view's route table was dumped %d times, want once, when the subscription started", got)
	}
	if got := view.addrs.dumps.Load(); got != 1 {
		t.Errorf("the view's address table was dumped %d times, want once, when the subscription started", got)
	}
	if got := view.rules.dumps.Load(); got != 1 {
		t.Errorf("the view's rule table was dumped %d times, want once, when the subscription started", got)
	}
	if f, n := view.neigh.fdb.dumps.Load(), view.neigh.ips.dumps.Load(); f != 1 || n != 1 {
		t.Errorf("the view's FDB entries were dumped %d times and its neighbours %d; want once each, when the subscription started", f, n)
	}
	// The four that write share one batched writer.
	view.mu.Lock()
	if w := view.writers[defaultTimeout]; len(view.writers) != 1 || w == nil || w.holders != 4 {
		t.Errorf("the view holds writers %v, want one held by the four reconcilers that write", view.writers)
	}
	view.mu.Unlock()

	// The observers share what the kernel reports: a link added by hand reaches the
	// view's link table, which the interface reconciler reads, through the one
	// subscription.
	testns.Run(t, "ip", "-n", ns, "link", "add", "view7", "type", "veth", "peer", "name", "view8")
	rec := observers[1].(*InterfaceReconciler)
	waitFor(t, "the interface observer to hear of view7", func() bool {
		_, _, ok := rec.links.byName("view7")
		return ok
	})
	// The reconcilers that read links read the view's table, which holds each link once;
	// none keeps a link mirror of its own.
	nw, ep := observers[3].(*NetworkReconciler), observers[4].(*EndpointReconciler)
	if rec.links != view.links || nw.links != view.links || ep.links != view.links {
		t.Error("a reconciler reads links of its own, not the view's table")
	}
	// The route reconciler reads the view's route table.
	if rr := observers[0].(*RouteReconciler); rr.routes != view.routes {
		t.Error("the route reconciler reads routes of its own, not the view's table")
	}
	// The node, interface and network reconcilers read the view's address table.
	if nr, nw := observers[2].(*NodeReconciler), observers[3].(*NetworkReconciler); nr.addrs != view.addrs || rec.addrs != view.addrs || nw.addrs != view.addrs {
		t.Error("the node, interface or network reconciler reads addresses of its own, not the view's table")
	}
	if nw := observers[3].(*NetworkReconciler); nw.rules != view.rules {
		t.Error("the network reconciler reads rules of its own, not the view's table")
	}
	// The endpoint reconciler reads the view's FDB entries and neighbours.
	if ep := observers[4].(*EndpointReconciler); ep.fdb != view.neigh.fdb || ep.neigh != view.neigh.ips {
		t.Error("the endpoint reconciler reads FDB entries or neighbours of its own, not the view's table")
	}
	if n := view.links.names.Len("view7"); n != 1 {
		t.Errorf("the view's link table holds %d links named view7, want 1", n)
	}

	// The firewall's input reads the interfaces' indexes from the view's table, which the
	// subscription keeps current: it dumps no links.
	fwDir := bpfDir + "-fw"
	t.Cleanup(func() { os.RemoveAll(fwDir) })
	fw, err := NewFirewall(FirewallOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Dir: fwDir, Logger: quiet,
		StatsInterval: time.Hour, GCInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Close() })
	if _, err := fw.input(); err != nil {
		t.Fatal(err)
	}
	if fw.links != view.links {
		t.Error("the firewall reads links of its own, not the view's table")
	}
	if n := fw.conn.dumps.Load(); n != 0 {
		t.Errorf("the firewall's input dumped the links %d times, want none: the view's table is current", n)
	}
}

// TestKernelViewQueueOverflow checks that an observer whose queue overflows fails with
// rtnl.ErrOverflow, and that notifications are handed only to the observers of their
// group.
func TestKernelViewQueueOverflow(t *testing.T) {
	link := &viewWatcher{groups: 1 << unix.RTNLGRP_LINK, limit: 64, wake: make(chan struct{}, 1)}
	addr := &viewWatcher{groups: 1 << unix.RTNLGRP_IPV4_IFADDR, limit: 1 << 20, wake: make(chan struct{}, 1)}
	payload := make([]byte, 40)
	payload[0] = unix.AF_UNSPEC
	for range 2 {
		for _, w := range []*viewWatcher{link, addr} {
			if w.groups&(1<<notificationGroup(unix.RTM_NEWLINK, payload)) != 0 {
				w.push(unix.RTM_NEWLINK, payload)
			}
		}
	}
	if !errors.Is(link.err, rtnl.ErrOverflow) {
		t.Errorf("the link watcher's error is %v, want rtnl.ErrOverflow", link.err)
	}
	if len(addr.queue) != 0 || addr.err != nil {
		t.Errorf("the address watcher queued %d bytes (error %v), want none", len(addr.queue), addr.err)
	}
	if g := notificationGroup(unix.RTM_NEWADDR, []byte{unix.AF_INET6}); g != unix.RTNLGRP_IPV6_IFADDR {
		t.Errorf("an IPv6 address goes to group %d, want %d", g, unix.RTNLGRP_IPV6_IFADDR)
	}
}

// TestKernelViewSubscriptionEnds: when the shared subscription fails (as when it
// overflows), every observer of the view fails, and the observers started again share a
// fresh subscription; once the last stops, the view holds none.
func TestKernelViewSubscriptionEnds(t *testing.T) {
	ns := testns.Named(t, "naples-view")
	nsh := testns.Handle(t, ns)
	s := newTestStore(t, Indexes())
	view := NewKernelView(KernelViewOptions{Namespace: &nsh})
	var observers []hal.Observer
	for range 2 {
		rec, err := NewNodeReconciler(NodeOptions{Store: s.store, Node: localNode, Namespace: &nsh, View: view, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close() })
		observers = append(observers, rec)
	}
	route, err := NewRouteReconciler(RouteOptions{Store: s.store, Namespace: &nsh, View: view, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { route.Close() })
	observers = append(observers, route)

	// start runs every observer until it ends, and waits until each is subscribed.
	start := func() (ended []chan error) {
		for _, o := range observers {
			subscribed, done := make(chan struct{}), make(chan error, 1)
			go func() {
				done <- o.Observe(context.Background(), func(nimbusv1.Key) {}, func() { close(subscribed) })
			}()
			select {
			case <-subscribed:
			case err := <-done:
				t.Fatalf("Observe ended before it subscribed: %v", err)
			case <-time.After(20 * time.Second):
				t.Fatal("the observer did not subscribe")
			}
			ended = append(ended, done)
		}
		return ended
	}
	// fail ends the view's subscription as an overflow does, and waits for every observer
	// to fail.
	fail := func(ended []chan error) {
		t.Helper()
		view.mu.Lock()
		view.sub.Close()
		view.mu.Unlock()
		for _, done := range ended {
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "watching") {
					t.Errorf("Observe = %v, want the error of a subscription that ended", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("an observer went on after the subscription ended")
			}
		}
	}

	fail(start())
	if n := testns.RouteSubscriptions(t, ns); n != 0 {
		t.Errorf("%d subscriptions once every observer failed, want 0", n)
	}
	fail(start())
	if got := view.subscriptions.Load(); got != 2 {
		t.Errorf("the view opened %d subscriptions, want 2: one, and one after it ended", got)
	}
	if n := testns.RouteSubscriptions(t, ns); n != 0 {
		t.Errorf("%d subscriptions once every observer failed, want 0", n)
	}
}

// TestKernelViewLinkTableShared runs two reconcilers that read the links through one
// view: one dump loads the view's link table when its subscription starts, however many
// observers start; the table holds each link of the namespace once; and a write of one
// reconciler reaches the other's observer, which enqueues the object that names the link
// (the echo of a write is passed over by its writer alone).
func TestKernelViewLinkTableShared(t *testing.T) {
	h := newIfaceHost(t, -1)
	view := NewKernelView(KernelViewOptions{Namespace: &h.nsh})
	reconciler := func() *InterfaceReconciler {
		rec, err := NewInterfaceReconciler(InterfaceOptions{Store: h.store, Namespace: &h.nsh, View: view, StatsInterval: -1,
			StateFile: filepath.Join(t.TempDir(), "interfaces.json"), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close() })
		return rec
	}
	a, b := reconciler(), reconciler()
	obj := ifaceObject("uplink", "nic0", true, 1400)
	h.put(t, obj)
	runObserver(t, a)
	heard := runObserver(t, b)
	checkSharedTable(t, "link", view.links.dumps.Load(), a.links == view.links && b.links == view.links)

	h.mustReconcile(t, a, obj.Key())
	epAwaitEnqueued(t, heard, obj.Key().Key().String(), "the other reconciler set nic0 up, mtu 1400")
	index, l, ok := view.links.byName("nic0")
	if !ok || !l.up || l.mtu != 1400 {
		t.Errorf("the table holds nic0 as %+v (found %v); want up, mtu 1400", l, ok)
	}
	if n := view.links.names.Len("nic0"); n != 1 {
		t.Errorf("the table holds %d links named nic0; want 1", n)
	}
	if n, want := view.links.m.Len(), 2; n != want {
		t.Errorf("the table holds %d links; want %d, lo and nic0", n, want)
	}
	if _, ok := view.links.get(index); !ok {
		t.Errorf("nic0 is not under its index %d", index)
	}
}

// TestViewTableReaders checks what the readers of a table hear while no observer
// watches: every change, coalesced by object, but the ends of their own writes; the echo
// of a write marked as such for its writer alone; and nothing of the first dump.
func TestViewTableReaders(t *testing.T) {
	links := newLinkTable()
	a, b := links.reader(nil), links.reader(nil)
	defer a.close()
	defer b.close()
	if a.writer() == b.writer() {
		t.Fatal("two readers name the same writer")
	}
	heard := func(r *tableReader[int32, kernelLink]) map[int32]tableChange[int32, kernelLink] {
		got := map[int32]tableChange[int32, kernelLink]{}
		r.drainMissed(func(c tableChange[int32, kernelLink]) { got[c.key] = c })
		return got
	}

	// The first load is no news.
	links.loading.Store(true)
	if _, err := links.m.Replace(func(add func(int32, kernelLink)) error {
		add(1, kernelLink{name: "lo", up: true, mtu: 65536})
		add(2, kernelLink{name: "eth0", mtu: 1500})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	links.loading.Store(false)
	links.loaded.Store(true)
	if got := heard(a); len(got) != 0 {
		t.Errorf("a heard %v of the first load; want nothing", got)
	}

	// a sets eth0 up, mtu 9000: b hears of it at once, a of nothing; the echo, which the
	// kernel reports with the operational state it filled in, is a's alone.
	want := kernelLink{name: "eth0", mtu: 9000, up: true}
	links.m.ExpectBy(a.writer(), 2, want, sameIfaceLink).Done()
	if got := heard(a); len(got) != 0 {
		t.Errorf("a heard %v of its own write; want nothing", got)
	}
	if c := heard(b)[2]; !c.had || !c.has || c.fields != linkFieldMTU|linkFieldUp || c.echo {
		t.Errorf("b heard %+v of a's write; want eth0's MTU and state changed, no echo", c)
	}
	links.m.Update(2, kernelLink{name: "eth0", mtu: 9000, up: true, operState: 6})
	if c := heard(a)[2]; !c.echo || c.fields != linkFieldOperState {
		t.Errorf("a heard %+v of its write's echo; want an echo that changed the operational state", c)
	}
	if c := heard(b)[2]; c.echo || c.fields != linkFieldOperState {
		t.Errorf("b heard %+v of a's echo; want a change of the operational state, no echo", c)
	}

	// Someone renames eth0 and then deletes it: a hears of one change, eth0 gone.
	links.m.Update(2, kernelLink{name: "uplink", mtu: 9000, up: true, operState: 6})
	links.m.Remove(2)
	got := heard(a)
	if c := got[2]; len(got) != 1 || !c.had || c.has || c.old.name != "eth0" {
		t.Errorf("a heard %v; want one change, eth0 gone", got)
	}
	if _, _, ok := links.byName("uplink"); ok {
		t.Error("the table finds a link by the name of one that is gone")
	}
}

// TestViewTableReaderConcerns checks that a reader made with what concerns it hears of
// those changes alone, its backlog holding no others, while the other readers hear of
// every change: the network reconciler's route reader hears of a route of
// OverlayRouteProtocol before or after a change, not of the routes of Route objects.
func TestViewTableReaderConcerns(t *testing.T) {
	routes := newRouteTable()
	all, overlay := routes.reader(nil), routes.readerOf(nil, overlayRouteChange)
	defer all.close()
	defer overlay.close()
	writer := routes.reader(nil)
	defer writer.close()
	heard := func(r *tableReader[routeID, kernelRoute]) map[routeID]tableChange[routeID, kernelRoute] {
		got := map[routeID]tableChange[routeID, kernelRoute]{}
		r.drainMissed(func(c tableChange[routeID, kernelRoute]) { got[c.key] = c })
		return got
	}
	ids := make([]routeID, 3)
	for i := range ids {
		ids[i] = mustID(t, 100, fmt.Sprintf("192.0.2.%d/32", i+1))
	}
	// A thousand routes of Route objects, written and echoed, then one overlay route, a
	// route that moves from the overlay's protocol to RouteProtocol, and one never in
	// the overlay.
	for i := range 1000 {
		id := mustID(t, 100, fmt.Sprintf("198.51.%d.%d/32", i/256, i%256))
		r := kernelRoute{protocol: RouteProtocol, oif: 2}
		routes.m.ExpectBy(writer.writer(), id, r, sameRoute).Done()
		routes.m.Update(id, r)
	}
	routes.m.Update(ids[0], kernelRoute{protocol: OverlayRouteProtocol, oif: 3})
	routes.m.Update(ids[1], kernelRoute{protocol: OverlayRouteProtocol, oif: 3})
	routes.m.Update(ids[1], kernelRoute{protocol: RouteProtocol, oif: 3})
	routes.m.Update(ids[2], kernelRoute{protocol: RouteProtocol, oif: 3})

	if got := heard(all); len(got) != 1003 {
		t.Errorf("the reader of every change heard of %d routes; want 1003", len(got))
	}
	got := heard(overlay)
	if len(got) != 2 {
		t.Errorf("the overlay's reader heard of %d routes; want 2", len(got))
	}
	if c, ok := got[ids[0]]; !ok || !c.has || c.new.protocol != OverlayRouteProtocol {
		t.Errorf("the overlay's reader heard %+v of the overlay route; want it added", c)
	}
	if c, ok := got[ids[1]]; !ok || !c.has || c.new.protocol != RouteProtocol {
		t.Errorf("the overlay's reader heard %+v of the route that left the overlay; want it of RouteProtocol now", c)
	}
}

// TestKernelViewRouteTableShared runs two route reconcilers through one view: one dump
// loads the view's route table when its subscription starts, however many observers
// start; the table holds each route once; and a route one reconciler writes reaches the
// other's observer, which enqueues the route's owner, while the writer's own observer
// passes its echo over.
func TestKernelViewRouteTableShared(t *testing.T) {
	f := families[0]
	h := newHost(t)
	view := NewKernelView(KernelViewOptions{Namespace: &h.nsh})
	reconciler := func() *RouteReconciler {
		rec, err := NewRouteReconciler(RouteOptions{Store: h.store, Namespace: &h.nsh, View: view, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rec.Close() })
		return rec
	}
	a, b := reconciler(), reconciler()
	obj := route("shared", 100, f.prefix, f.gw1)
	h.put(t, obj)
	heardA := runObserver(t, a)
	heardB := runObserver(t, b)
	checkSharedTable(t, "route", view.routes.dumps.Load(), a.routes == view.routes && b.routes == view.routes)

	if _, err := h.reconcileStored(a, obj.Key()); err != nil {
		t.Fatal(err)
	}
	epAwaitEnqueued(t, heardB, obj.Key().Key().String(), "the other reconciler added the route")
	id := mustID(t, 100, f.prefix)
	if _, ok := view.routes.get(id); !ok {
		t.Errorf("the table does not hold %s", id)
	}
	if n := view.routes.protocols.Len(RouteProtocol); n != 1 {
		t.Errorf("the table holds %d routes of protocol %d; want 1", n, RouteProtocol)
	}
	// A marker change after the write: once the writer's observer has heard of it, it has
	// heard the echo of its own write too, and enqueued nothing for it.
	h.ip(t, f, "route", "add", f.prefix3, "via", f.gw1, "table", "100")
	waitFor(t, "the table to hold the marker route", func() bool {
		_, ok := view.routes.get(mustID(t, 100, f.prefix3))
		return ok
	})
	select {
	case got := <-heardA:
		t.Errorf("the writer's observer enqueued %s for its own write", got)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestKernelViewOverlayTablesShared checks that the network and route reconcilers of one
// namespace share the view's route table, one dump for both, each finding its own
// routes there: a network's overlay routes (OverlayRouteProtocol) and a Route object's
// (RouteProtocol). The head-end replication entry the network reconciler programs is in
// the view's FDB table, found by its VXLAN device, and goes from it with the device.
func TestKernelViewOverlayTablesShared(t *testing.T) {
	f := families[0]
	h := newHost(t)
	view := NewKernelView(KernelViewOptions{Namespace: &h.nsh})
	bpfDir := filepath.Join("/sys/fs/bpf", h.ns)
	t.Cleanup(func() { os.RemoveAll(bpfDir) })
	rr, err := NewRouteReconciler(RouteOptions{Store: h.store, Namespace: &h.nsh, View: view, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rr.Close() })
	nw, err := NewNetworkReconciler(NetworkOptions{Store: h.store, Node: localNode, Namespace: &h.nsh, View: view, Logger: quiet,
		BPFDir: bpfDir, StateFile: filepath.Join(t.TempDir(), "sysctls.json")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nw.Close() })
	// This host's VTEP is eth0's address; n2's is its peer's.
	blue := networkObj("acme", "blue", 100, 0, subnet("10.1.0.0/24", "10.1.0.1"))
	obj := route("shared", 100, f.prefix, f.gw1)
	h.put(t, nodeObj(localNode, "10.10.0.1"), nodeObj("n2", f.gw1), blue, endpointObj("acme", "e2", "blue", "n2"), obj)
	runObserver(t, rr)
	heardNW := runObserver(t, nw)
	checkSharedTable(t, "route", view.routes.dumps.Load(), rr.routes == view.routes && nw.routes == view.routes)
	if nw.neigh != view.neigh {
		t.Error("the network reconciler reads FDB entries of its own, not the view's table")
	}

	if _, err := h.reconcileStored(nw, blue.Key()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.reconcileStored(rr, obj.Key()); err != nil {
		t.Fatal(err)
	}
	if _, ok := view.routes.get(mustID(t, 100, f.prefix)); !ok {
		t.Errorf("the table does not hold the Route object's route %s", f.prefix)
	}
	if n := view.routes.protocols.Len(RouteProtocol); n != 1 {
		t.Errorf("the table holds %d routes of protocol %d; want the Route object's", n, RouteProtocol)
	}
	overlay := nw.overlayRouteIDs()
	if len(overlay) == 0 {
		t.Fatalf("the table holds no routes of protocol %d; want the network's", OverlayRouteProtocol)
	}
	for _, id := range overlay {
		if id.table != TenantTable("acme") {
			t.Errorf("an overlay route %s is in table %d; want the tenant's, %d", id, id.table, TenantTable("acme"))
		}
	}
	// Each reads its own: a reconcile of either again writes nothing.
	writes := nw.KernelWrites() + rr.KernelWrites()
	if _, err := h.reconcileStored(nw, blue.Key()); err != nil {
		t.Fatal(err)
	}
	if _, err := h.reconcileStored(rr, obj.Key()); err != nil {
		t.Fatal(err)
	}
	if n := nw.KernelWrites() + rr.KernelWrites() - writes; n != 0 {
		t.Errorf("reconciling both again wrote %d times; want none", n)
	}

	vx, _, ok := view.links.byName(VXLANName(blue.Key().ID()))
	if !ok {
		t.Fatal("the link table holds no VXLAN device of the network")
	}
	k := fdbKey{ifindex: vx, dst: epAddrOf(netip.MustParseAddr(f.gw1))}
	if e, ok := view.neigh.fdb.m.Get(k); !ok || !e.permanent {
		t.Errorf("the FDB table holds %v (%v) for the head-end replication entry %s; want a permanent entry", e, ok, k)
	}
	if n := view.neigh.headEnds.Len(vx); n != 1 {
		t.Errorf("the FDB table finds %d head-end replication entries on %s; want 1", n, VXLANName(blue.Key().ID()))
	}
	// Deleted by hand, it reaches the network's observer, which enqueues the network,
	// once what the observer heard of the reconciles has passed.
	for quiet := false; !quiet; {
		select {
		case <-heardNW:
		case <-time.After(300 * time.Millisecond):
			quiet = true
		}
	}
	testns.Run(t, "bridge", "-n", h.ns, "fdb", "del", "00:00:00:00:00:00", "dev", VXLANName(blue.Key().ID()), "dst", f.gw1, "self")
	epAwaitEnqueued(t, heardNW, blue.Key().Key().String(), "someone deleted the head-end replication entry")
	if _, ok := view.neigh.fdb.m.Get(k); ok {
		t.Errorf("the FDB table holds %s after its delete", k)
	}
	// Put back, it goes from the table with its device.
	if _, err := h.reconcileStored(nw, blue.Key()); err != nil {
		t.Fatal(err)
	}
	if n := view.neigh.headEnds.Len(vx); n != 1 {
		t.Fatalf("the FDB table finds %d head-end replication entries after the reconcile; want 1", n)
	}
	testns.Run(t, "ip", "-n", h.ns, "link", "del", VXLANName(blue.Key().ID()))
	waitFor(t, "the head-end replication entry to go from the FDB table with its device", func() bool {
		return view.neigh.headEnds.Len(vx) == 0
	})
}

// checkSharedTable fails the test unless the view's table of what ("route") was dumped
// once for two observers, dumps telling how often, and both reconcilers read it, as
// shared tells.
func checkSharedTable(t *testing.T, what string, dumps uint64, shared bool) {
	t.Helper()
	if dumps != 1 {
		t.Errorf("the %s table was dumped %d times for two observers; want once", what, dumps)
	}
	if !shared {
		t.Errorf("a reconciler reads %ss of its own, not the view's table", what)
	}
}
