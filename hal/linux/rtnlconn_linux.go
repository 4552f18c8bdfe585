package linux

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/hal/linux/rtnl"
)

// This file is what every reconciler of the package shares to reach the kernel through
// package rtnl:
//
//   - rtnlConn: a reconciler's sockets (an rtnl.Reader for dumps and single gets, an
//     rtnl.Batcher for writes), the defaults of the options every reconciler has, and
//     its namespace's KernelView, through which its observer watches (observe);
//   - dumpObjects and dumpMirror: the objects of dumps, or a hal.Mirror loaded with them;
//   - mirrorLoader: the dumps that load a reconciler's mirrors, one at a time;
//   - kernelWrite: a write through the rtnl.Batcher, its outcome recorded in a mirror.

const (
	// defaultTimeout is the default of every reconciler's Timeout option: how long a
	// netlink request waits for the kernel.
	defaultTimeout = 10 * time.Second
)

// rtnlConn is how a reconciler talks to the kernel: in its namespace, a reader of dumps
// and single objects and a batched writer of its writes, and for its observer the
// namespace's kernel view and the size of its queue. Reconcilers embed it.
type rtnlConn struct {
	// ns is the network namespace the reconciler programs; nil is the calling process's.
	ns *netns.NsHandle
	// view is the namespace's kernel view, through which the observer watches.
	view *KernelView
	// timeout bounds every netlink request.
	timeout time.Duration
	// eventBuffer is the size in bytes of the observer's queue of notifications, and the
	// least receive buffer of its view's subscription.
	eventBuffer int
	log         *slog.Logger
	// rtnl reads dumps and single objects. nl carries the writes, many to a sendmsg: the
	// view's, shared with the reconcilers of the view that have the same timeout; it is
	// nil for a reconciler that writes nothing.
	rtnl *rtnl.Reader
	nl   *rtnl.Batcher
	// releaseNL lets nl, the view's, go.
	releaseNL func()
	// writes counts the kernel objects the reconciler wrote (KernelWrites); dumps counts
	// the dump requests sent, every attempt of one, for tests.
	writes, dumps atomic.Uint64
}

// rtnlConnOptions configures an rtnlConn. Namespace, View, Timeout, EventBuffer and Logger are
// the options of these names that every reconciler takes.
type rtnlConnOptions struct {
	// Namespace is the network namespace to talk to. Default: the calling process's.
	Namespace *netns.NsHandle
	// View is Namespace's kernel view, through which the observer watches. Default: a
	// view of the reconciler's own.
	View *KernelView
	// Timeout bounds every netlink request. Default: defaultTimeout (10s).
	Timeout time.Duration
	// EventBuffer is the size in bytes of the observer's queue of notifications, and the
	// least receive buffer of its view's subscription. Default: DefaultEventBuffer, the
	// reconciler's.
	EventBuffer, DefaultEventBuffer int
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
	// Writes tells that the reconciler writes the kernel: it then gets a batched writer.
	Writes bool
}

// openRTNLConn opens the sockets of a reconciler; close closes them.
func openRTNLConn(opts rtnlConnOptions) (*rtnlConn, error) {
	c := &rtnlConn{ns: opts.Namespace, view: opts.View, timeout: opts.Timeout, eventBuffer: opts.EventBuffer, log: opts.Logger}
	if c.view == nil {
		c.view = NewKernelView(KernelViewOptions{Namespace: c.ns})
	}
	if c.timeout <= 0 {
		c.timeout = defaultTimeout
	}
	if c.eventBuffer <= 0 {
		c.eventBuffer = opts.DefaultEventBuffer
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	var err error
	if c.rtnl, err = rtnl.NewReader(c.ns, c.timeout); err != nil {
		return nil, err
	}
	if opts.Writes {
		c.nl, c.releaseNL, err = c.view.writer(c.timeout)
		if err != nil {
			c.rtnl.Close()
			return nil, err
		}
	}
	return c, nil
}

// close closes the sockets. It is safe to call twice.
func (c *rtnlConn) close() {
	if c.releaseNL != nil {
		c.releaseNL()
	}
	c.rtnl.Close()
}

// observe is the loop of every reconciler's observer (hal.Observer): it watches the
// groups (RTNLGRP_* numbers) through the reconciler's kernel view (KernelView.watch) with
// a queue of eventBuffer bytes.
func (c *rtnlConn) observe(ctx context.Context, what string, groups []uint, resync func(context.Context) error, subscribed func(), apply func(typ uint16, payload []byte)) error {
	return c.view.watch(ctx, what, groups, nil, c.eventBuffer, resync, subscribed, apply)
}

// observeTables is observe for an observer that watches tables of the view too: it hears
// of their changes through the sources, in the kernel's order with the notifications of
// the groups.
func (c *rtnlConn) observeTables(ctx context.Context, what string, groups []uint, sources []viewSource, resync func(context.Context) error, subscribed func(), apply func(typ uint16, payload []byte)) error {
	return c.view.watch(ctx, what, groups, sources, c.eventBuffer, resync, subscribed, apply)
}

// dumpObjects sends the dump requests reqs in turn and returns what parse makes of the
// messages of the answers, in order; parse returns ok false for a message it passes
// over. A dump that the kernel reports interrupted by a change starts over
// (rtnl.Reader.Dump).
func dumpObjects[T any](ctx context.Context, c *rtnlConn, parse func(typ uint16, payload []byte) (T, bool), reqs ...[]byte) ([]T, error) {
	var out []T
	for _, req := range reqs {
		mark := len(out)
		err := c.rtnl.Dump(ctx, req, func() {
			c.dumps.Add(1)
			out = out[:mark]
		}, func(typ uint16, payload []byte) {
			if v, ok := parse(typ, payload); ok {
				out = append(out, v)
			}
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dumpMirror loads m with a dump (hal.Mirror.Replace), unless ctx has ended, and returns
// the keys whose state the dump found changed. It sends the dump requests reqs in turn,
// and parse turns the payload of every message of type answer (RTM_NEWLINK for a dump of
// links, say) into the key and value of an object that m keeps, or returns ok false.
// what names the objects in its error ("links").
func dumpMirror[K comparable, V any](ctx context.Context, c *rtnlConn, m *hal.Mirror[K, V], what string, answer uint16, parse func(payload []byte) (K, V, bool), reqs ...[]byte) ([]K, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	type entry struct {
		k K
		v V
	}
	return m.Replace(func(add func(K, V)) error {
		var got dumpBuffer[entry]
		for _, req := range reqs {
			mark := got.len()
			err := c.rtnl.Dump(ctx, req, func() {
				c.dumps.Add(1)
				got.truncate(mark)
			}, func(typ uint16, payload []byte) {
				if typ != answer {
					return
				}
				if k, v, ok := parse(payload); ok {
					got.push(entry{k, v})
				}
			})
			if err != nil {
				return fmt.Errorf("listing %s: %w", what, err)
			}
		}
		for e := range got.all() {
			add(e.k, e.v)
		}
		return nil
	})
}

// dumpChunk is the number of objects a dumpBuffer holds in one block.
const dumpChunk = 256

// dumpBuffer holds the objects of a dump in order, in blocks of dumpChunk, so that a
// dump of many objects is not copied over and over as one slice would be while it
// grows. The first block grows as a slice does, so a dump of a few objects takes
// little.
type dumpBuffer[T any] struct {
	// chunks are full (dumpChunk objects) but the last.
	chunks [][]T
	n      int
}

// len returns the number of objects the buffer holds.
func (b *dumpBuffer[T]) len() int { return b.n }

// push appends v.
func (b *dumpBuffer[T]) push(v T) {
	switch last := len(b.chunks) - 1; {
	case last < 0:
		b.chunks = append(b.chunks, []T{v})
	case len(b.chunks[last]) == dumpChunk:
		b.chunks = append(b.chunks, append(make([]T, 0, dumpChunk), v))
	default:
		b.chunks[last] = append(b.chunks[last], v)
	}
	b.n++
}

// truncate drops the objects from the nth on, as a dump that starts over must.
func (b *dumpBuffer[T]) truncate(n int) {
	if n >= b.n {
		return
	}
	for b.n > n {
		last := len(b.chunks) - 1
		c := b.chunks[last]
		keep := max(0, len(c)-(b.n-n))
		clear(c[keep:])
		b.n -= len(c) - keep
		if keep == 0 && last > 0 {
			b.chunks = b.chunks[:last]
		} else {
			b.chunks[last] = c[:keep]
		}
	}
}

// all returns the objects in the order they were pushed.
func (b *dumpBuffer[T]) all() iter.Seq[T] {
	return func(yield func(T) bool) {
		for _, c := range b.chunks {
			for _, v := range c {
				if !yield(v) {
					return
				}
			}
		}
	}
}

// kernelWrite sends msg, the write of a mirrored object that w expects, through the
// batched writer and ends w by the kernel's answer: Done, and counts it in writes, when
// the kernel took it; Gone when the kernel refused it with an errno in gone, as it
// refuses to delete what is not there; Fail otherwise. It returns whether the kernel
// took it, and its refusal, nil for an errno in gone.
func kernelWrite[K comparable, V any](ctx context.Context, c *rtnlConn, w *hal.Write[K, V], msg []byte, gone ...unix.Errno) (took bool, err error) {
	err = c.nl.Do(ctx, msg)
	if err == nil {
		w.Done()
		c.writes.Add(1)
		return true, nil
	}
	for _, errno := range gone {
		if errors.Is(err, errno) {
			w.Gone()
			return false, nil
		}
	}
	w.Fail()
	return false, err
}

// mirrorLoader runs the dumps that load a reconciler's mirrors, one at a time, and
// remembers whether one has loaded them. Reconcilers embed it.
type mirrorLoader struct {
	// dumpMu serializes the dumps.
	dumpMu sync.Mutex
	// filled is set once a dump has loaded the mirrors.
	filled atomic.Bool
}

// loadOnce runs load, which loads the mirrors with a dump, unless one has loaded them
// already.
func (l *mirrorLoader) loadOnce(ctx context.Context, load func(context.Context) error) error {
	if l.filled.Load() {
		return nil
	}
	l.dumpMu.Lock()
	defer l.dumpMu.Unlock()
	if l.filled.Load() {
		return nil
	}
	if err := load(ctx); err != nil {
		return err
	}
	l.filled.Store(true)
	return nil
}

// loadAgain runs load, which loads the mirrors with a fresh dump, and reports whether it
// was the first to load them: the drift a first load finds is no news, as the HAL
// reconciles every object once at start anyway.
func (l *mirrorLoader) loadAgain(ctx context.Context, load func(context.Context) error) (first bool, err error) {
	l.dumpMu.Lock()
	defer l.dumpMu.Unlock()
	first = !l.filled.Load()
	if err := load(ctx); err != nil {
		return false, err
	}
	l.filled.Store(true)
	return first, nil
}
