package linux

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal"
)

// This file is the rtnetlink layer that every reconciler of the package shares:
//
//   - rtnlConn: a reconciler's sockets, the defaults of the options every reconciler
//     has, and the loop every observer runs (observe);
//   - rtnlReader: dumps and single gets, one request at a time;
//   - dumpObjects and dumpMirror: the objects of dumps, or a hal.Mirror loaded with them;
//   - mirrorLoader: the dumps that load a reconciler's mirrors, one at a time;
//   - kernelWrite: a write through the batched writer (nlBatcher), its outcome recorded
//     in a mirror;
//   - dump requests, and helpers that decode and build attributes.
//
// Notifications come through an nlSubscription (nlsock_linux.go).

const (
	// defaultTimeout is the default of every reconciler's Timeout option: how long a
	// netlink request waits for the kernel.
	defaultTimeout = 10 * time.Second
	// dumpAttempts bounds how often a dump starts over when the kernel reports that what
	// it dumps changed meanwhile (NLM_F_DUMP_INTR).
	dumpAttempts = 5
)

// rtnlConn is how a reconciler talks to the kernel: in its namespace, a reader of dumps
// and single objects and a batched writer of its writes, and for its observer a
// subscription with a receive buffer of its own size. Reconcilers embed it.
type rtnlConn struct {
	// ns is the network namespace the reconciler programs; nil is the calling process's.
	ns *netns.NsHandle
	// timeout bounds every netlink request.
	timeout time.Duration
	// eventBuffer is the size in bytes of the receive buffer of the observer's
	// subscription.
	eventBuffer int
	log         *slog.Logger
	// rtnl reads dumps and single objects. nl carries the writes, many to a sendmsg; it
	// is nil for a reconciler that writes nothing.
	rtnl *rtnlReader
	nl   *nlBatcher
	// writes counts the kernel objects the reconciler wrote (KernelWrites); dumps counts
	// the dump requests sent, every attempt of one, for tests.
	writes, dumps atomic.Uint64
}

// rtnlConnOptions configures an rtnlConn. Namespace, Timeout, EventBuffer and Logger are
// the options of these names that every reconciler takes.
type rtnlConnOptions struct {
	// Namespace is the network namespace to talk to. Default: the calling process's.
	Namespace *netns.NsHandle
	// Timeout bounds every netlink request. Default: defaultTimeout (10s).
	Timeout time.Duration
	// EventBuffer is the size in bytes of the receive buffer of the observer's
	// subscription. Default: DefaultEventBuffer, the reconciler's.
	EventBuffer, DefaultEventBuffer int
	// Logger receives the reconciler's logs. Default: slog.Default().
	Logger *slog.Logger
	// Writes tells that the reconciler writes the kernel: it then gets a batched writer.
	Writes bool
}

// openRTNLConn opens the sockets of a reconciler; close closes them.
func openRTNLConn(opts rtnlConnOptions) (*rtnlConn, error) {
	c := &rtnlConn{ns: opts.Namespace, timeout: opts.Timeout, eventBuffer: opts.EventBuffer, log: opts.Logger}
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
	if c.rtnl, err = newRTNLReader(c.ns, c.timeout); err != nil {
		return nil, err
	}
	if opts.Writes {
		c.nl, err = newNLBatcher(nlBatcherOptions{Namespace: c.ns, Protocol: unix.NETLINK_ROUTE, Timeout: c.timeout})
		if err != nil {
			c.rtnl.Close()
			return nil, err
		}
	}
	return c, nil
}

// close closes the sockets. It is safe to call twice.
func (c *rtnlConn) close() {
	if c.nl != nil {
		c.nl.Close()
	}
	c.rtnl.Close()
}

// observe is the loop of every reconciler's observer (hal.Observer). It subscribes to
// the multicast groups (RTNLGRP_* numbers) with a receive buffer of eventBuffer bytes,
// reads the kernel afresh with resync, and calls subscribed. Then it hands every
// notification to apply until ctx ends, and returns nil. Subscribed first, then dumped: a
// change that the dump misses is reported after it, and the mirrors apply it in order.
// It fails when the kernel drops notifications (errSubscriptionOverflow); the HAL then
// starts it again, and its resync starts from the kernel's state. what names the changes
// in its errors ("route changes").
func (c *rtnlConn) observe(ctx context.Context, what string, groups []uint, resync func(context.Context) error, subscribed func(), apply func(typ uint16, payload []byte)) error {
	sub, err := subscribeNetlink(c.ns, c.eventBuffer, groups...)
	if err != nil {
		return fmt.Errorf("subscribing to %s: %w", what, err)
	}
	// Closing the socket ends a Receive under way.
	stop := context.AfterFunc(ctx, func() { sub.Close() })
	defer func() {
		stop()
		sub.Close()
	}()
	if err := resync(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	subscribed()
	for {
		err := sub.Receive(apply)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("watching %s: %w", what, err)
		}
	}
}

// dumpObjects sends the dump requests reqs in turn and returns what parse makes of the
// messages of the answers, in order; parse returns ok false for a message it passes
// over. A dump that the kernel reports interrupted by a change starts over
// (rtnlReader.dump).
func dumpObjects[T any](ctx context.Context, c *rtnlConn, parse func(typ uint16, payload []byte) (T, bool), reqs ...[]byte) ([]T, error) {
	var out []T
	for _, req := range reqs {
		mark := len(out)
		err := c.rtnl.dump(ctx, req, func() {
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
		got, err := dumpObjects(ctx, c, func(typ uint16, payload []byte) (entry, bool) {
			if typ != answer {
				return entry{}, false
			}
			k, v, ok := parse(payload)
			return entry{k, v}, ok
		}, reqs...)
		if err != nil {
			return fmt.Errorf("listing %s: %w", what, err)
		}
		for _, e := range got {
			add(e.k, e.v)
		}
		return nil
	})
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

// linkDumpRequest returns a request for every link (`ip link show`).
func linkDumpRequest() []byte {
	return appendIfInfo(nlMessage(nil, unix.RTM_GETLINK, 0), unix.AF_UNSPEC, 0, 0, 0)
}

// addrDumpRequest returns a request for every address of both families (`ip addr
// show`).
func addrDumpRequest() []byte {
	return append(nlMessage(nil, unix.RTM_GETADDR, 0), make([]byte, unix.SizeofIfAddrmsg)...)
}

// routeDumpRequest returns a request for the routes of every table of the family
// (AF_UNSPEC: every family) and, unless protocol is 0, of the protocol (`ip route show
// table all proto P`): with strict checking the kernel sends only those.
func routeDumpRequest(family uint8, protocol netlink.RouteProtocol) []byte {
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
	return append(nlMessage(nil, unix.RTM_GETROUTE, 0), family, 0, 0, 0, 0, byte(protocol), 0, 0, 0, 0, 0, 0)
}

// neighDumpRequest returns a request for every neighbour of the family (`ip neigh show`),
// or with AF_BRIDGE for every FDB entry (`bridge fdb show`).
func neighDumpRequest(family uint8) []byte {
	// struct ndmsg: family, then zeros.
	return append(nlMessage(nil, unix.RTM_GETNEIGH, 0), family, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
}

// errDumpInterrupted: the kernel's tables changed while it dumped them (NLM_F_DUMP_INTR),
// so the dump may be inconsistent.
var errDumpInterrupted = errors.New("dump interrupted by a concurrent change")

// rtnlReader reads the kernel's rtnetlink tables over one socket, one request at a time:
// dumps (`ip link show`, `ip rule show`, ...) and single gets. Its socket asks the kernel
// to check requests strictly (NETLINK_GET_STRICT_CHK), which also makes the kernel
// filter route dumps by the protocol a request names. A request it gives up on (a
// timeout, an ended context) may leave a dump half read, which would refuse the next
// one (EBUSY): the next request opens a fresh socket.
type rtnlReader struct {
	ns      *netns.NsHandle
	timeout time.Duration
	// mu guards the fields below, and serializes requests.
	mu     sync.Mutex
	file   *os.File
	conn   syscall.RawConn
	reader *mmsgReader
	seq    uint32
	// stale tells that the socket may hold the rest of an answer nobody reads.
	stale bool
	// closed is set by Close.
	closed bool
}

// newRTNLReader opens a reader in namespace ns (nil: the calling process's) whose
// requests wait at most timeout for the kernel.
func newRTNLReader(ns *netns.NsHandle, timeout time.Duration) (*rtnlReader, error) {
	// Dump answers come in datagrams of up to 32 KiB, more for a link with many virtual
	// functions.
	d := &rtnlReader{ns: ns, timeout: timeout, reader: newMMsgReader(8, 64<<10)}
	if err := d.openLocked(); err != nil {
		return nil, err
	}
	return d, nil
}

// openLocked opens the reader's socket.
func (d *rtnlReader) openLocked() error {
	f, err := openNetlink(d.ns, unix.NETLINK_ROUTE, 4<<20, func(fd int) error {
		if err := unix.Connect(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("connecting netlink socket to the kernel: %w", err)
		}
		// Kernels before 4.20 lack strict checking; they dump unfiltered, and the
		// decoders filter.
		_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
		_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
		return nil
	})
	if err != nil {
		return err
	}
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	d.file, d.conn, d.stale = f, conn, false
	return nil
}

// Close closes the socket. It is safe to call twice.
func (d *rtnlReader) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	d.file.Close()
	return nil
}

// dump sends msg, a dump request (built with nlMessage; its flags, length and sequence
// number are filled in), and calls f with the type and payload of every message of the
// answer. It starts over, up to dumpAttempts times, when the kernel reports that the
// table changed during the dump; f must then forget what it was given before (start is
// called before every attempt).
func (d *rtnlReader) dump(ctx context.Context, msg []byte, start func(), f func(typ uint16, payload []byte)) error {
	for attempt := 1; ; attempt++ {
		start()
		err := d.request(ctx, msg, true, f)
		if errors.Is(err, errDumpInterrupted) && attempt < dumpAttempts && ctx.Err() == nil {
			continue
		}
		return err
	}
}

// get sends msg, a request for one object, and calls f with the type and payload of the
// answer; the kernel's refusal (ENODEV for a link that does not exist, say) is returned
// as an error that unwraps to its unix.Errno.
func (d *rtnlReader) get(ctx context.Context, msg []byte, f func(typ uint16, payload []byte)) error {
	return d.request(ctx, msg, false, f)
}

// request sends msg and reads its answer until the kernel is done with it.
func (d *rtnlReader) request(ctx context.Context, msg []byte, dump bool, f func(typ uint16, payload []byte)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("netlink reader closed")
	}
	if d.stale {
		d.file.Close()
		if err := d.openLocked(); err != nil {
			return err
		}
	}
	d.seq++
	seq := d.seq
	ne := binary.NativeEndian
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
	} else {
		flags |= unix.NLM_F_ACK
	}
	ne.PutUint32(msg[0:4], uint32(len(msg)))
	ne.PutUint16(msg[6:8], ne.Uint16(msg[6:8])|flags)
	ne.PutUint32(msg[8:12], seq)

	deadline := time.Now().Add(d.timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := d.file.SetDeadline(deadline); err != nil {
		return fmt.Errorf("setting netlink deadline: %w", err)
	}
	// An ended context cuts a wait short.
	file := d.file
	stop := context.AfterFunc(ctx, func() { _ = file.SetDeadline(time.Now()) })
	defer stop()

	if _, err := d.file.Write(msg); err != nil {
		return d.failed(ctx, "sending to the kernel", err)
	}
	var result error
	done, interrupted := false, false
	for !done {
		n, err := d.reader.read(d.conn, true)
		if err != nil {
			return d.failed(ctx, "reading the kernel's answer", err)
		}
		for i := range n {
			data, ok := d.reader.datagram(i)
			if !ok {
				continue
			}
			eachMessage(data, func(typ, mflags uint16, mseq uint32, payload []byte) {
				if mseq != seq || done {
					return // the answer to an earlier request that gave up
				}
				if mflags&unix.NLM_F_DUMP_INTR != 0 {
					interrupted = true
				}
				switch typ {
				case unix.NLMSG_DONE:
					done = true
					if len(payload) >= 4 {
						if errno := int32(ne.Uint32(payload)); errno != 0 {
							result = unix.Errno(-errno)
						}
					}
				case unix.NLMSG_ERROR:
					done = true
					if len(payload) >= 4 {
						result = ackError(payload, mflags)
					}
				default:
					f(typ, payload)
				}
			})
		}
	}
	if result == nil && interrupted {
		result = errDumpInterrupted
	}
	return result
}

// failed describes an error of a request, the context's when it ended, and has the
// next request open a fresh socket.
func (d *rtnlReader) failed(ctx context.Context, what string, err error) error {
	d.stale = true
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%s: %w within %v", what, errNoAnswer, d.timeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// eachAttr calls f with the type (flags masked out) and value of every netlink attribute
// in b.
func eachAttr(b []byte, f func(typ uint16, v []byte)) {
	ne := binary.NativeEndian
	for len(b) >= unix.SizeofRtAttr {
		l := int(ne.Uint16(b[0:2]))
		if l < unix.SizeofRtAttr || l > len(b) {
			return
		}
		f(ne.Uint16(b[2:4])&nlaTypeMask, b[unix.SizeofRtAttr:l])
		b = b[min(len(b), rtaAlign(l)):]
	}
}

// attrUint32 returns an attribute's value as a uint32 in host byte order, 0 when it is
// too short.
func attrUint32(v []byte) uint32 {
	if len(v) < 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(v)
}

// cString returns the string of a NUL-terminated attribute.
func cString(v []byte) string { return unix.ByteSliceToString(v) }

// appendIfInfo appends struct ifinfomsg: family, type, index, flags and the flags to
// change.
func appendIfInfo(b []byte, family uint8, index int32, flags, change uint32) []byte {
	b = append(b, family, 0, 0, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(index))
	b = binary.NativeEndian.AppendUint32(b, flags)
	return binary.NativeEndian.AppendUint32(b, change)
}

// appendAttrAddr appends an attribute holding an address, 4 or 16 bytes.
func appendAttrAddr(b []byte, typ uint16, a netip.Addr) []byte {
	if a.Is4() {
		v := a.As4()
		return appendAttr(b, typ, v[:])
	}
	v := a.As16()
	return appendAttr(b, typ, v[:])
}

// appendAttrString appends an attribute holding a NUL-terminated string.
func appendAttrString(b []byte, typ uint16, s string) []byte {
	b = appendAttrHeader(b, typ, unix.SizeofRtAttr+len(s)+1)
	b = append(b, s...)
	return padAttr(append(b, 0))
}

// appendAttrUint8 appends an attribute holding one byte.
func appendAttrUint8(b []byte, typ uint16, v uint8) []byte {
	return appendAttr(b, typ, []byte{v})
}

// beginNest starts a nested attribute in b; endNest, with the offset it returns, ends it.
func beginNest(b []byte, typ uint16) ([]byte, int) {
	start := len(b)
	return appendAttrHeader(b, typ, 0), start
}

// endNest ends the nested attribute started at offset start.
func endNest(b []byte, start int) []byte {
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	return b
}
