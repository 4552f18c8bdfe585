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
type Reader struct {
	ns      *netns.NsHandle
	timeout time.Duration
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
// requests wait at most timeout for the kernel.
func NewReader(ns *netns.NsHandle, timeout time.Duration) (*Reader, error) {
	d := &Reader{ns: ns, timeout: timeout}
	if err := d.openLocked(); err != nil {
		return nil, err
	}
	return d, nil
}

// openLocked opens the reader's socket.
func (d *Reader) openLocked() error {
	f, err := OpenSocket(d.ns, unix.NETLINK_ROUTE, 4<<20, func(fd int) error {
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
	reader := takeAnswerReader(dump)
	defer putAnswerReader(dump, reader)
	var result error
	done, interrupted := false, false
	for !done {
		n, err := reader.read(d.conn, true)
		if err != nil {
			return d.failed(ctx, "reading the kernel's answer", err)
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
