package rtnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DumpAttempts bounds how often a dump starts over when the kernel reports that what it
// dumps changed meanwhile (NLM_F_DUMP_INTR).
const DumpAttempts = 5

// ErrDumpInterrupted is the error of a dump that the kernel's tables changed under
// (NLM_F_DUMP_INTR) on every one of its DumpAttempts: what it read may be inconsistent.
var ErrDumpInterrupted = errors.New("dump interrupted by a concurrent change")

// Reader reads the kernel's rtnetlink tables over one socket, one request at a time:
// dumps (`ip link show`, `ip rule show`, ...) and single gets. Its socket asks the kernel
// to check requests strictly (NETLINK_GET_STRICT_CHK), which also makes the kernel
// filter route dumps by the protocol a request names. A request it gives up on (a
// timeout, an ended context) may leave a dump half read, which would refuse the next
// one (EBUSY): the next request opens a fresh socket.
//
// The timeout bounds each wait for the kernel: for a get or a dump's first answer, the
// time since the request; for the rest of a dump, the time since its last datagram, so
// that a long dump (the FDB of 100,000 endpoints, read while other dumps run) fails only
// when the kernel stops sending, not when it is slow to finish.
type Reader struct {
	timeout time.Duration
	// open opens the reader's socket: a netlink socket in the reader's namespace, or in
	// tests, a stand-in for the kernel.
	open func() (*os.File, error)
	// mu guards the fields below, and serializes requests.
	mu   sync.Mutex
	file *os.File
	conn syscall.RawConn
	seq  uint32
	// stale tells that the socket may hold the rest of an answer nobody reads.
	stale bool
	// closed is set by Close.
	closed bool
}

// answerReaders keeps spare receive buffers for the readers' answers: one of 512 KiB for
// dumps and one of 64 KiB for gets, whose answer is one message. A reader takes one for a
// request and gives it back after, so the buffers live only while requests are read
// (readers are idle between the dumps and gets of a reconcile), not one for each reader
// for its whole life. It keeps a single spare of each, so that requests read one after
// another share it and those read at the same time (at start-up, every reconciler's
// dumps) leave theirs to the next garbage collection; a get that overlaps another
// request costs 64 KiB of garbage, not 512. Dump answers come in datagrams of up to 32
// KiB, more for a link with many virtual functions.
var answerReaders struct {
	mu    sync.Mutex
	spare [2]*mmsgReader // for a get, for a dump
}

// answerSlots is the number of datagrams one read takes, for a get and for a dump.
var answerSlots = [2]int{1, 8}

// takeAnswerReader returns the spare receive buffer for a dump or a get, or a new one
// when another request has it.
func takeAnswerReader(dump bool) *mmsgReader {
	i := answerKind(dump)
	answerReaders.mu.Lock()
	r := answerReaders.spare[i]
	answerReaders.spare[i] = nil
	answerReaders.mu.Unlock()
	if r == nil {
		r = newMMsgReader(answerSlots[i], 64<<10)
	}
	return r
}

// putAnswerReader gives r, taken for a dump or a get, back once its request is read: it
// becomes the spare, unless there is one.
func putAnswerReader(dump bool, r *mmsgReader) {
	i := answerKind(dump)
	answerReaders.mu.Lock()
	if answerReaders.spare[i] == nil {
		answerReaders.spare[i] = r
	}
	answerReaders.mu.Unlock()
}

// answerKind returns the index of answerReaders.spare for a dump or a get.
func answerKind(dump bool) int {
	if dump {
		return 1
	}
	return 0
}

// NewReader opens a reader in namespace ns (nil: the calling process's) whose
// requests wait at most timeout for the kernel: for a get's answer, or for each part of
// a dump's.
func NewReader(ns *netns.NsHandle, timeout time.Duration) (*Reader, error) {
	return newReaderOn(func() (*os.File, error) { return openReaderSocket(ns) }, timeout)
}

// newReaderOn makes a reader whose sockets open opens: non-blocking sockets that deliver
// the requests to the kernel, or in tests, to a stand-in for it.
func newReaderOn(open func() (*os.File, error), timeout time.Duration) (*Reader, error) {
	d := &Reader{timeout: timeout, open: open}
	if err := d.openLocked(); err != nil {
		return nil, err
	}
	return d, nil
}

// openReaderSocket opens a reader's socket in namespace ns.
func openReaderSocket(ns *netns.NsHandle) (*os.File, error) {
	return OpenSocket(ns, unix.NETLINK_ROUTE, 4<<20, func(fd int) error {
		if err := unix.Connect(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("connecting netlink socket to the kernel: %w", err)
		}
		// Kernels before 4.20 lack strict checking; they dump unfiltered, and the
		// decoders filter.
		_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
		_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
		return nil
	})
}

// openLocked opens the reader's socket.
func (d *Reader) openLocked() error {
	f, err := d.open()
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
func (d *Reader) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	d.file.Close()
	return nil
}

// Dump sends msg, a dump request (built with Message; its flags, length and sequence
// number are filled in), and calls f with the type and payload of every message of the
// answer. It starts over, up to DumpAttempts times, when the kernel reports that the
// table changed during the dump; f must then forget what it was given before (start is
// called before every attempt).
func (d *Reader) Dump(ctx context.Context, msg []byte, start func(), f func(typ uint16, payload []byte)) error {
	for attempt := 1; ; attempt++ {
		start()
		err := d.request(ctx, msg, true, f)
		if errors.Is(err, ErrDumpInterrupted) && attempt < DumpAttempts && ctx.Err() == nil {
			continue
		}
		return err
	}
}

// Get sends msg, a request for one object, and calls f with the type and payload of the
// answer; the kernel's refusal (ENODEV for a link that does not exist, say) is returned
// as an error that unwraps to its unix.Errno.
func (d *Reader) Get(ctx context.Context, msg []byte, f func(typ uint16, payload []byte)) error {
	return d.request(ctx, msg, false, f)
}

// request sends msg and reads its answer until the kernel is done with it.
func (d *Reader) request(ctx context.Context, msg []byte, dump bool, f func(typ uint16, payload []byte)) error {
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

	if err := d.extendDeadlineLocked(ctx); err != nil {
		return err
	}
	// An ended context cuts a wait short.
	file := d.file
	stop := context.AfterFunc(ctx, func() { _ = file.SetDeadline(time.Now()) })
	defer stop()

	if _, err := d.file.Write(msg); err != nil {
		return d.failed(ctx, "sending to the kernel", err)
	}
	reader := takeAnswerReader(dump)
	defer putAnswerReader(dump, reader)
	var result error
	done, interrupted := false, false
	for !done {
		n, err := reader.read(d.conn, true)
		if err != nil {
			return d.failed(ctx, "reading the kernel's answer", err)
		}
		if dump && n > 0 {
			// The kernel is still answering: the dump has another timeout from now.
			if err := d.extendDeadlineLocked(ctx); err != nil {
				return err
			}
		}
		for i := range n {
			data, ok := reader.datagram(i)
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
		result = ErrDumpInterrupted
	}
	return result
}

// extendDeadlineLocked sets the socket's deadline to the timeout from now, or to the
// context's deadline when that comes first; once the context has ended, to now, so that
// the next read returns at once (the context's AfterFunc may have run before).
func (d *Reader) extendDeadlineLocked(ctx context.Context) error {
	deadline := time.Now().Add(d.timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := d.file.SetDeadline(deadline); err != nil {
		return fmt.Errorf("setting netlink deadline: %w", err)
	}
	if ctx.Err() != nil {
		_ = d.file.SetDeadline(time.Now())
	}
	return nil
}

// failed describes an error of a request, the context's when it ended, and has the
// next request open a fresh socket.
func (d *Reader) failed(ctx context.Context, what string, err error) error {
	d.stale = true
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%s: %w within %v", what, ErrNoAnswer, d.timeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}
