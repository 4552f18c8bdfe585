package linux

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// KernelView is how the observers of one network namespace hear of the kernel's changes:
// one rtnetlink subscription (rtnl.Subscription, `ip monitor`) to every group that one of
// them watches, whose notifications it hands each observer, those of the groups that
// observer asked for, in the kernel's order. The reconcilers of a namespace that share a
// KernelView (their View option) hold one subscription between them instead of one
// each. It is safe for concurrent use.
//
// The subscription is open while an observer watches: the first to start opens it, the
// last to stop closes it, and one that starts later joins its groups. Every observer
// reads from a queue of its own, bounded by its EventBuffer option as its own
// subscription's receive buffer was, so a slow observer holds up no other; one whose
// queue overflows fails alone. When the shared subscription overflows, every observer
// fails with rtnl.ErrOverflow, and each reads the kernel afresh when the HAL starts it
// again, as it did when the subscription was its own.
//
// The reconcilers that share a view write through one batched writer (rtnl.Batcher)
// between those of one Timeout, so that their writes share system calls too.
//
// The view holds one table per kernel table that its reconcilers read (viewTable, in
// kview_table_linux.go): a hal.Mirror of the namespace's objects of one kind, held once
// however many reconcilers read it, with indexes by what they look up. The links are
// the first (links, keyed by interface index, with indexes by name and by owner alias),
// the routes next (routes, keyed by table, destination and metric, with an index by
// protocol), the addresses (addrs, keyed by link and address, with indexes by link, by
// address and by protocol), the rules (rules, keyed by their selectors and action,
// with an index by input interface), and the neighbours (neigh: static FDB entries and permanent
// IP neighbours, keyed by device and MAC or IP).
// A table is loaded by one dump once the subscription carries its groups (when it opens,
// again after it overflowed, and when it joins them), through the reader of the
// reconciler whose observer starts first, and kept current by the subscription's reader
// before it hands the notifications on. Every change of a table (an event, a write that
// ended, a dump that found drift) is computed once, old and new value and the fields
// that differ, and queued to every reconciler that reads the table but the one whose
// write made it, between the notifications its observer watches, in the kernel's
// order; one whose observer is not watching hears of the changes when it watches again,
// coalesced by object. A reconciler writes through a table naming itself
// (hal.Mirror.ExpectBy): the echo of its write is marked as such for it alone, so that
// another reconciler still reacts to the change.
type KernelView struct {
	ns *netns.NsHandle

	// links is the table of the namespace's links, routes that of its routes, addrs that
	// of its addresses, rules that of its rules, neigh that of its neighbours and FDB
	// entries; tables lists every table.
	links  *linkTable
	routes *routeTable
	addrs  *addrTable
	rules  *ruleTable
	neigh  *neighTable
	tables []viewTableState

	// mu guards sub, done, groups, rcvbuf, watchers and writers.
	mu sync.Mutex
	// sub is the subscription, nil while no observer watches; done is closed once its
	// reader has returned.
	sub  *rtnl.Subscription
	done chan struct{}
	// groups is the set of groups sub joined, a bit per RTNLGRP_* number; rcvbuf is the
	// size of its receive buffer.
	groups uint64
	rcvbuf int
	// watchers are the observers that watch; list is a copy that the reader reads
	// without the lock.
	watchers map[*viewWatcher]struct{}
	list     atomic.Pointer[[]*viewWatcher]
	// writers are the batched writers of the reconcilers, by the timeout of their
	// requests.
	writers map[time.Duration]*viewWriter

	// subscriptions counts the subscriptions opened, for tests; readers the readers that
	// readings opened (KernelRead), and readDumps the dumps they ran.
	subscriptions atomic.Uint64
	readers       atomic.Uint64
	readDumps     atomic.Uint64
}

// KernelViewOptions configures a KernelView.
type KernelViewOptions struct {
	// Namespace is the network namespace to watch. Default: the calling process's.
	Namespace *netns.NsHandle
}

// NewKernelView returns the view of a namespace's kernel. It opens nothing until an
// observer watches through it, and holds nothing to close once none does.
func NewKernelView(opts KernelViewOptions) *KernelView {
	v := &KernelView{ns: opts.Namespace, watchers: map[*viewWatcher]struct{}{}, writers: map[time.Duration]*viewWriter{}}
	v.links = newLinkTable()
	v.routes = newRouteTable()
	v.addrs = newAddrTable()
	v.rules = newRuleTable()
	v.neigh = newNeighTable()
	v.tables = []viewTableState{v.links, v.routes, v.addrs, v.rules, v.neigh.fdb, v.neigh.ips}
	return v
}

// viewWriter is a batched writer of a KernelView and the number of reconcilers that hold
// it.
type viewWriter struct {
	b       *rtnl.Batcher
	holders int
}

// writer returns the view's batched writer whose requests wait at most timeout for the
// kernel, opening it for the first reconciler that asks, and the function with which a
// reconciler lets it go; the last to let it go closes it. The function is safe to call
// twice.
func (v *KernelView) writer(timeout time.Duration) (*rtnl.Batcher, func(), error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	w := v.writers[timeout]
	if w == nil {
		b, err := rtnl.NewBatcher(rtnl.BatcherOptions{Namespace: v.ns, Protocol: unix.NETLINK_ROUTE, Timeout: timeout})
		if err != nil {
			return nil, nil, err
		}
		w = &viewWriter{b: b}
		v.writers[timeout] = w
	}
	w.holders++
	var once sync.Once
	release := func() {
		once.Do(func() {
			v.mu.Lock()
			w.holders--
			last := w.holders == 0
			if last {
				delete(v.writers, timeout)
			}
			v.mu.Unlock()
			if last {
				w.b.Close()
			}
		})
	}
	return w.b, release, nil
}

// viewWatcher is one observer watching through a KernelView.
type viewWatcher struct {
	// groups is the set of groups whose notifications the observer watches, a bit per
	// RTNLGRP_* number.
	groups uint64
	// sources are the tables whose changes it watches; their groups are in joins, with
	// groups.
	sources []viewSource
	joins   uint64
	// limit bounds queue, in bytes.
	limit int
	// wake has a value once queue holds notifications or err is set.
	wake chan struct{}

	// mu guards queue and err.
	mu sync.Mutex
	// queue holds the notifications the observer has yet to apply, each as its type (2
	// bytes), the length of its payload (4 bytes) and the payload.
	queue []byte
	// err is why the observer stops watching: its queue or the subscription overflowed.
	err error
}

// viewEntryHeader is the size of a notification's header in a watcher's queue.
const viewEntryHeader = 6

// viewTableMark is the type of a watcher's queue entry that stands for the next change
// of one of its tables (viewSource), queued with the table's reader; its payload is the
// table's place in the watcher's sources. Netlink uses no message type below 16.
const viewTableMark = 0

// viewTableCost is what a table's change counts against a watcher's limit, beyond its
// mark: about the size of the notification that made it.
const viewTableCost = 256

// viewSpareMax is the capacity beyond which an observer drops a drained queue's memory
// instead of keeping it for the next notifications: a burst does not pin its peak.
const viewSpareMax = 256 << 10

// push queues a notification, unless the watcher has failed; a notification that does
// not fit fails it.
func (w *viewWatcher) push(typ uint16, payload []byte) {
	w.mu.Lock()
	switch {
	case w.err != nil:
	case len(w.queue) > 0 && len(w.queue)+viewEntryHeader+len(payload) > w.limit:
		w.err = fmt.Errorf("queueing notifications: %w", rtnl.ErrOverflow)
		w.queue = nil
	default:
		w.queue = binary.NativeEndian.AppendUint16(w.queue, typ)
		w.queue = binary.NativeEndian.AppendUint32(w.queue, uint32(len(payload)))
		w.queue = append(w.queue, payload...)
	}
	w.mu.Unlock()
	w.signal()
}

// mark queues the mark of a change of the watcher's table at slot, and reports whether
// the watcher takes it: not when it has failed, or when the change does not fit (which
// fails it).
func (w *viewWatcher) mark(slot int) bool {
	w.mu.Lock()
	ok := false
	switch {
	case w.err != nil:
	case len(w.queue) > 0 && len(w.queue)+viewEntryHeader+1+viewTableCost > w.limit:
		w.err = fmt.Errorf("queueing notifications: %w", rtnl.ErrOverflow)
		w.queue = nil
	default:
		w.queue = binary.NativeEndian.AppendUint16(w.queue, viewTableMark)
		w.queue = binary.NativeEndian.AppendUint32(w.queue, 1)
		w.queue = append(w.queue, byte(slot))
		ok = true
	}
	w.mu.Unlock()
	w.signal()
	return ok
}

// fail stops the watcher with err.
func (w *viewWatcher) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
		w.queue = nil
	}
	w.mu.Unlock()
	w.signal()
}

// signal wakes the observer.
func (w *viewWatcher) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// watch is the loop of an observer that watches through the view (hal.Observer). It
// subscribes to the groups (RTNLGRP_* numbers) and to those of the tables (sources) with
// a queue of eventBuffer bytes, dumps the tables that the subscription joined since their
// last dump, hands the observer the changes of the tables it missed while it did not
// watch, reads the kernel afresh with resync, and calls subscribed. Then it hands every
// notification of the groups to apply, and every change of the tables to their sources'
// functions, in the kernel's order, until ctx ends, and returns nil. Subscribed first,
// then dumped: a change that the dump misses is reported after it, and the mirrors apply
// it in order. It fails when notifications were lost (rtnl.ErrOverflow); the HAL then
// starts it again, and its resync starts from the kernel's state. what names the changes
// in its errors ("route changes").
func (v *KernelView) watch(ctx context.Context, what string, groups []uint, sources []viewSource, eventBuffer int, resync func(context.Context) error, subscribed func(), apply func(typ uint16, payload []byte)) error {
	w, err := v.register(groups, sources, eventBuffer)
	if err != nil {
		return fmt.Errorf("subscribing to %s: %w", what, err)
	}
	defer v.unregister(w)
	// The dumps' changes go to the backlogs, which the observer handles before it is
	// subscribed, as it would the drift its own dumps found.
	for _, s := range sources {
		if err := s.ensure(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
	var missed []func()
	for i, s := range sources {
		missed = append(missed, s.attach(w, i))
		defer s.detach()
	}
	for _, m := range missed {
		m()
	}
	if err := resync(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	subscribed()
	var spare []byte
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		}
		w.mu.Lock()
		batch, err := w.queue, w.err
		w.queue = spare[:0]
		w.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watching %s: %w", what, err)
		}
		for b := batch; len(b) >= viewEntryHeader; {
			typ := binary.NativeEndian.Uint16(b)
			n := int(binary.NativeEndian.Uint32(b[2:]))
			if typ == viewTableMark {
				sources[b[viewEntryHeader]].next()
			} else {
				apply(typ, b[viewEntryHeader:viewEntryHeader+n])
			}
			b = b[viewEntryHeader+n:]
		}
		spare = batch
		if cap(spare) > viewSpareMax {
			spare = nil
		}
	}
}

// register adds a watcher of the groups and of the tables (sources) with a queue of
// eventBuffer bytes, opening the subscription or joining the groups it lacks; the tables
// of the groups it opens or joins are stale.
func (v *KernelView) register(groups []uint, sources []viewSource, eventBuffer int) (*viewWatcher, error) {
	w := &viewWatcher{limit: eventBuffer, wake: make(chan struct{}, 1), sources: sources}
	for _, g := range groups {
		w.groups |= 1 << g
	}
	w.joins = w.groups
	for _, s := range sources {
		w.joins |= s.groupSet()
	}
	var all []uint
	for g := uint(0); g < 64; g++ {
		if w.joins&(1<<g) != 0 {
			all = append(all, g)
		}
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sub == nil {
		sub, err := rtnl.Subscribe(v.ns, eventBuffer, all...)
		if err != nil {
			return nil, err
		}
		v.subscriptions.Add(1)
		v.sub, v.done, v.groups, v.rcvbuf = sub, make(chan struct{}), w.joins, eventBuffer
		v.staleLocked(w.joins)
		go v.read(sub, v.done)
	} else {
		if missing := w.joins &^ v.groups; missing != 0 {
			var join []uint
			for _, g := range all {
				if missing&(1<<g) != 0 {
					join = append(join, g)
				}
			}
			if err := v.sub.Join(join...); err != nil {
				return nil, err
			}
			v.groups |= missing
			v.staleLocked(missing)
		}
		if eventBuffer > v.rcvbuf {
			if err := v.sub.SetReceiveBuffer(eventBuffer); err != nil {
				return nil, err
			}
			v.rcvbuf = eventBuffer
		}
	}
	v.watchers[w] = struct{}{}
	v.publishLocked()
	return w, nil
}

// staleLocked marks stale the tables of the groups the subscription just joined, or
// stops reporting.
func (v *KernelView) staleLocked(joined uint64) {
	for _, t := range v.tables {
		if t.groupSet()&joined != 0 {
			t.markStale()
		}
	}
}

// unregister removes a watcher, and closes the subscription when it was the last.
func (v *KernelView) unregister(w *viewWatcher) {
	v.mu.Lock()
	delete(v.watchers, w)
	v.publishLocked()
	var done chan struct{}
	if len(v.watchers) == 0 && v.sub != nil {
		v.staleLocked(v.groups)
		v.sub.Close()
		v.sub, done = nil, v.done
	}
	v.mu.Unlock()
	if done != nil {
		<-done
	}
}

// publishLocked hands the reader the watchers as they are now.
func (v *KernelView) publishLocked() {
	list := make([]*viewWatcher, 0, len(v.watchers))
	for w := range v.watchers {
		list = append(list, w)
	}
	v.list.Store(&list)
}

// read hands sub's notifications to the watchers until sub ends. When it ends while it is
// the view's subscription (it overflowed), every watcher fails, and the next to start
// opens a subscription anew.
func (v *KernelView) read(sub *rtnl.Subscription, done chan struct{}) {
	defer close(done)
	deliver := func(typ uint16, payload []byte) {
		g := notificationGroup(typ, payload)
		if g == 0 {
			return
		}
		// The tables first: a watcher hears of their changes before the notification.
		for _, t := range v.tables {
			if t.groupSet()&(1<<g) != 0 {
				t.notify(typ, payload)
			}
		}
		list := v.list.Load()
		if list == nil {
			return
		}
		for _, w := range *list {
			if w.groups&(1<<g) != 0 {
				w.push(typ, payload)
			}
		}
	}
	for {
		err := sub.Receive(deliver)
		if err == nil {
			continue
		}
		v.mu.Lock()
		if v.sub == sub {
			for w := range v.watchers {
				w.fail(err)
			}
			clear(v.watchers)
			v.publishLocked()
			v.staleLocked(v.groups)
			v.sub = nil
			sub.Close()
		}
		v.mu.Unlock()
		return
	}
}

// notificationGroup returns the group (RTNLGRP_* number) the kernel sends a
// notification of type typ to, by its type and the address family that starts its
// payload, or 0 for one that no observer watches.
func notificationGroup(typ uint16, payload []byte) uint {
	if len(payload) == 0 {
		return 0
	}
	family := payload[0]
	byFamily := func(v4, v6 uint) uint {
		switch family {
		case unix.AF_INET:
			return v4
		case unix.AF_INET6:
			return v6
		}
		return 0
	}
	switch typ {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		return unix.RTNLGRP_LINK
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		return unix.RTNLGRP_NEIGH
	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		return byFamily(unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR)
	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		return byFamily(unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE)
	case unix.RTM_NEWRULE, unix.RTM_DELRULE:
		return byFamily(unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE)
	case unix.RTM_NEWNETCONF, unix.RTM_DELNETCONF:
		return byFamily(unix.RTNLGRP_IPV4_NETCONF, unix.RTNLGRP_IPV6_NETCONF)
	}
	return 0
}
