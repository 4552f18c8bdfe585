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
type KernelView struct {
	ns *netns.NsHandle

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

	// subscriptions counts the subscriptions opened, for tests.
	subscriptions atomic.Uint64
}

// KernelViewOptions configures a KernelView.
type KernelViewOptions struct {
	// Namespace is the network namespace to watch. Default: the calling process's.
	Namespace *netns.NsHandle
}

// NewKernelView returns the view of a namespace's kernel. It opens nothing until an
// observer watches through it, and holds nothing to close once none does.
func NewKernelView(opts KernelViewOptions) *KernelView {
	return &KernelView{ns: opts.Namespace, watchers: map[*viewWatcher]struct{}{}, writers: map[time.Duration]*viewWriter{}}
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
	// groups is the set of groups the observer watches, a bit per RTNLGRP_* number.
	groups uint64
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
// subscribes to the groups (RTNLGRP_* numbers) with a queue of eventBuffer bytes, reads
// the kernel afresh with resync, and calls subscribed. Then it hands every notification
// of the groups to apply until ctx ends, and returns nil. Subscribed first, then dumped:
// a change that the dump misses is reported after it, and the mirrors apply it in order.
// It fails when notifications were lost (rtnl.ErrOverflow); the HAL then starts it
// again, and its resync starts from the kernel's state. what names the changes in its
// errors ("route changes").
func (v *KernelView) watch(ctx context.Context, what string, groups []uint, eventBuffer int, resync func(context.Context) error, subscribed func(), apply func(typ uint16, payload []byte)) error {
	w, err := v.register(groups, eventBuffer)
	if err != nil {
		return fmt.Errorf("subscribing to %s: %w", what, err)
	}
	defer v.unregister(w)
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
			apply(typ, b[viewEntryHeader:viewEntryHeader+n])
			b = b[viewEntryHeader+n:]
		}
		spare = batch
		if cap(spare) > viewSpareMax {
			spare = nil
		}
	}
}

// register adds a watcher of the groups with a queue of eventBuffer bytes, opening the
// subscription or joining the groups it lacks.
func (v *KernelView) register(groups []uint, eventBuffer int) (*viewWatcher, error) {
	w := &viewWatcher{limit: eventBuffer, wake: make(chan struct{}, 1)}
	for _, g := range groups {
		w.groups |= 1 << g
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.sub == nil {
		sub, err := rtnl.Subscribe(v.ns, eventBuffer, groups...)
		if err != nil {
			return nil, err
		}
		v.subscriptions.Add(1)
		v.sub, v.done, v.groups, v.rcvbuf = sub, make(chan struct{}), w.groups, eventBuffer
		go v.read(sub, v.done)
	} else {
		if missing := w.groups &^ v.groups; missing != 0 {
			var join []uint
			for _, g := range groups {
				if missing&(1<<g) != 0 {
					join = append(join, g)
				}
			}
			if err := v.sub.Join(join...); err != nil {
				return nil, err
			}
			v.groups |= missing
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

// unregister removes a watcher, and closes the subscription when it was the last.
func (v *KernelView) unregister(w *viewWatcher) {
	v.mu.Lock()
	delete(v.watchers, w)
	v.publishLocked()
	var done chan struct{}
	if len(v.watchers) == 0 && v.sub != nil {
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
