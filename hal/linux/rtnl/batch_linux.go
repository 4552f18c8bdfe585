package rtnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Errors of the Batcher and the Reader; check with errors.Is.
var (
	// ErrNoAnswer is the error of a request the kernel did not answer within the
	// timeout (BatcherOptions.Timeout, Reader's timeout). The request may still take
	// effect.
	ErrNoAnswer = errors.New("no answer from the kernel")
	// ErrBatcherClosed is the error of a request the Batcher was closed before the
	// kernel answered.
	ErrBatcherClosed = errors.New("netlink batcher closed")
	// ErrAcksLost is the error of the requests under way when the socket's receive
	// buffer overflowed and the kernel's answers to them were lost; each of them may or may not have taken effect.
	ErrAcksLost = errors.New("the kernel's answers were lost (receive buffer overflow)")
)

// BatcherOptions configures a Batcher.
type BatcherOptions struct {
	// Namespace is the network namespace the socket talks to. Default: the calling
	// process's.
	Namespace *netns.NsHandle
	// Protocol is the netlink family, such as unix.NETLINK_ROUTE. Required.
	Protocol int
	// Timeout bounds how long Do waits for the kernel's answer: a kernel that does not
	// answer fails the request with ErrNoAnswer instead of blocking its caller. Default:
	// 10s.
	Timeout time.Duration
	// MaxBatch bounds the requests in one sendmsg. Default: 256.
	MaxBatch int
	// MaxBatchBytes bounds the bytes of one sendmsg (a request longer than it is sent
	// alone). Default: 128 KiB.
	MaxBatchBytes int
	// MaxInFlight bounds the requests sent and not yet answered, so that the answers fit
	// the socket's receive buffer. Default: 2048, fewer when the receive buffer is small.
	MaxInFlight int
	// ReceiveBuffer is the size in bytes of the socket's receive buffer, which holds the
	// kernel's answers until they are read (SO_RCVBUFFORCE, SO_RCVBUF without
	// CAP_NET_ADMIN). Default: 4 MiB.
	ReceiveBuffer int
}

// Batcher sends netlink requests to the kernel over one socket, many in one sendmsg,
// and hands each caller the kernel's answer to its own request. A writer goroutine sends
// whatever requests are pending whenever it is free: a lone request goes out at once, and
// the requests that arrive while the kernel works through a batch go out together in the
// next one, so batches form under load without timers or delays. (Before it takes a
// batch the writer lets the goroutines that are ready to run go first, so that those
// about to hand over a request join it.)
//
// Every request carries NLM_F_ACK and its own sequence number. The kernel processes
// every message of a sendmsg before the call returns (rtnetlink does), so the writer
// reads the answers right after it, in bulk (recvmmsg, with NETLINK_CAP_ACK keeping them
// small and NETLINK_EXT_ACK adding the kernel's explanation of an error), and completes
// each request with its own result: a request the kernel refuses fails only its caller.
// A reader goroutine waits for the answers the writer did not find there, should a
// family answer later. The kernel answers the requests of one socket in order, so two
// requests of one caller, or of callers that take turns, reach the kernel in the order Do
// was called.
//
// It carries any netlink request that the kernel answers with one ack (NLMSG_ERROR):
// creating, replacing and deleting routes, links, neighbours, FDB entries; not dumps.
type Batcher struct {
	file        *os.File
	conn        syscall.RawConn
	timeout     time.Duration
	maxBatch    int
	maxBytes    int
	maxInFlight int

	// wake tells the writer that requests are pending or that in-flight requests were
	// answered; orphans tells the reader that requests wait for answers the writer did not
	// find; done is closed by Close.
	wake    chan struct{}
	orphans chan struct{}
	done    chan struct{}
	wg      sync.WaitGroup

	// mu guards pending, inflight, seq, closed and spare.
	mu sync.Mutex
	// spare holds the buffers of requests sent, for buffer to hand out again.
	spare [][]byte
	// pending holds the requests not sent yet, in the order Do took them.
	pending []*nlRequest
	// inflight holds the requests sent and not yet answered, by sequence number.
	inflight map[uint32]*nlRequest
	seq      uint32
	closed   bool
	// closeOnce makes Close safe to call twice.
	closeOnce sync.Once

	// reqs holds requests that were answered, for Do to use again.
	reqs sync.Pool

	// batches and sent count the sendmsg calls and the requests they carried, for tests.
	batches, sent atomic.Uint64
}

// nlRequest is one request handed to Do. It is used again once Do has taken its answer;
// a request whose caller gave up is left to the garbage collector, as the writer or an
// answer may still reach it.
type nlRequest struct {
	msg []byte
	// state is reqQueued until the writer takes the request (reqSent) or its caller gives
	// up before that (reqAbandoned).
	state atomic.Int32
	seq   uint32
	// done receives the kernel's answer: nil or the error.
	done  chan error
	timer *time.Timer
}

const (
	reqQueued int32 = iota
	reqSent
	reqAbandoned
)

// newRequest makes a request for the pool.
func newRequest() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &nlRequest{done: make(chan error, 1), timer: t}
}

// NewBatcher opens a netlink socket in the options' namespace and starts the batcher's
// goroutines; Close stops them.
func NewBatcher(opts BatcherOptions) (*Batcher, error) {
	b, err := openNLBatcher(opts)
	if err != nil {
		return nil, err
	}
	b.start()
	return b, nil
}

// openNLBatcher is NewBatcher without starting the goroutines: requests wait until
// start.
func openNLBatcher(opts BatcherOptions) (*Batcher, error) {
	rcv := opts.ReceiveBuffer
	if rcv <= 0 {
		rcv = 4 << 20
	}
	f, err := OpenSocket(opts.Namespace, opts.Protocol, rcv, func(fd int) error {
		// Connected to the kernel: every request goes there, with no address to pass.
		if err := unix.Connect(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return fmt.Errorf("connecting netlink socket to the kernel: %w", err)
		}
		// Acks that do not echo the request, and the kernel's explanation of errors;
		// kernels without either still answer.
		_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
		_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
		// Room for a whole batch in one sendmsg, which the kernel refuses when it
		// exceeds the send buffer.
		if opts.MaxBatchBytes <= 0 {
			opts.MaxBatchBytes = 128 << 10
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 2*opts.MaxBatchBytes); err != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 2*opts.MaxBatchBytes)
		}
		if got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF); err == nil && got/2 < opts.MaxBatchBytes {
			opts.MaxBatchBytes = max(got/2, 4<<10)
		}
		if opts.MaxInFlight <= 0 {
			opts.MaxInFlight = 2048
			// An ack takes up to about 1 KiB of receive buffer (the kernel counts the
			// buffer it allocates, not the bytes of the message).
			if got, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF); err == nil {
				opts.MaxInFlight = max(16, min(opts.MaxInFlight, got/1024))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return newNLBatcherOn(f, opts)
}

// newNLBatcherOn makes a batcher on f, a non-blocking socket that delivers the requests to
// the kernel, or in tests, to a stand-in for it; start starts it.
func newNLBatcherOn(f *os.File, opts BatcherOptions) (*Batcher, error) {
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 256
	}
	if opts.MaxBatchBytes <= 0 {
		opts.MaxBatchBytes = 128 << 10
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 2048
	}
	b := &Batcher{
		file:        f,
		conn:        conn,
		timeout:     opts.Timeout,
		maxBatch:    opts.MaxBatch,
		maxBytes:    opts.MaxBatchBytes,
		maxInFlight: opts.MaxInFlight,
		wake:        make(chan struct{}, 1),
		orphans:     make(chan struct{}, 1),
		done:        make(chan struct{}),
		inflight:    map[uint32]*nlRequest{},
		reqs:        sync.Pool{New: newRequest},
	}
	return b, nil
}

// start starts the writer and the reader.
func (b *Batcher) start() {
	b.wg.Go(b.writeLoop)
	b.wg.Go(b.readLoop)
}

// Close stops the batcher's goroutines and closes its socket; requests not answered yet
// fail with ErrBatcherClosed. It is safe to call twice.
func (b *Batcher) Close() error {
	b.closeOnce.Do(func() {
		b.mu.Lock()
		b.closed = true
		b.mu.Unlock()
		close(b.done)
		// Closing the file ends a read that blocks; the writer sees done.
		b.file.Close()
		b.wg.Wait()
		b.mu.Lock()
		pending, inflight := b.pending, b.inflight
		b.pending, b.inflight = nil, map[uint32]*nlRequest{}
		b.mu.Unlock()
		for _, req := range pending {
			if req.state.CompareAndSwap(reqQueued, reqSent) {
				req.done <- ErrBatcherClosed
			}
		}
		for _, req := range inflight {
			req.done <- ErrBatcherClosed
		}
	})
	return nil
}

// Bounds of the buffers a batcher keeps for reuse: how many, and how large each.
const (
	maxSpareBuffers = 1024
	maxSpareBuffer  = 1024
)

// Buffer returns an empty buffer to build a request for Do in: one that a request sent
// before used, when there is one.
func (b *Batcher) Buffer() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.spare); n > 0 {
		buf := b.spare[n-1]
		b.spare[n-1] = nil
		b.spare = b.spare[:n-1]
		return buf
	}
	return make([]byte, 0, 256)
}

// Do sends msg, one netlink message (header and payload; its length, sequence number and
// port ID are filled in, and NLM_F_REQUEST and NLM_F_ACK set), to the kernel with the
// other pending requests, and returns the kernel's answer: nil when it acknowledged the
// request, or its error (an error that unwraps to the unix.Errno, with the kernel's
// explanation in its text when the kernel gives one). Do takes msg over: the caller must
// not use it afterwards (the batcher reuses it; build it in a buffer from Buffer).
//
// A context that has ended writes nothing; one that ends while msg waits to be sent
// takes it back, and Do returns its error. A request the kernel does not answer within
// the timeout fails with ErrNoAnswer, and one whose context ends after it was sent
// returns at once with the context's error: the kernel may then still carry it out.
func (b *Batcher) Do(ctx context.Context, msg []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msg) < unix.NLMSG_HDRLEN {
		return fmt.Errorf("netlink request of %d bytes: shorter than its header", len(msg))
	}
	req := b.reqs.Get().(*nlRequest)
	req.msg = msg
	req.state.Store(reqQueued)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		req.msg = nil
		b.reqs.Put(req)
		return ErrBatcherClosed
	}
	b.pending = append(b.pending, req)
	b.mu.Unlock()
	b.signal()

	req.timer.Reset(b.timeout)
	select {
	case err := <-req.done:
		req.timer.Stop()
		req.msg = nil
		b.reqs.Put(req)
		return err
	case <-ctx.Done():
		req.timer.Stop()
		if !req.state.CompareAndSwap(reqQueued, reqAbandoned) {
			b.forget(req)
			return fmt.Errorf("waiting for the kernel's answer: %w", ctx.Err())
		}
		return ctx.Err()
	case <-req.timer.C:
		if !req.state.CompareAndSwap(reqQueued, reqAbandoned) {
			b.forget(req)
		}
		return fmt.Errorf("%w within %v", ErrNoAnswer, b.timeout)
	}
}

// forget stops waiting for the answer to a request that was sent: an answer that comes
// is dropped. The request is not reused.
func (b *Batcher) forget(req *nlRequest) {
	b.mu.Lock()
	if b.inflight[req.seq] == req {
		delete(b.inflight, req.seq)
	}
	b.mu.Unlock()
	b.signal() // room in flight
}

// signal wakes the writer.
func (b *Batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// writeLoop sends what is pending whenever it can, until Close.
func (b *Batcher) writeLoop() {
	var buf []byte
	var batch []*nlRequest
	r := newMMsgReader(64, 8<<10)
	for {
		select {
		case <-b.done:
			return
		case <-b.wake:
		}
		for {
			// Let the goroutines that are ready to run go first: those about to hand
			// over a request join this batch instead of waiting for the next. With none
			// ready this returns at once.
			runtime.Gosched()
			buf, batch = b.takeBatch(buf[:0], batch[:0])
			if len(batch) == 0 {
				break
			}
			// Counted before the answers release the callers, so that a caller sees its
			// request counted.
			b.batches.Add(1)
			b.sent.Add(uint64(len(batch)))
			if err := b.send(buf); err != nil {
				b.fail(batch, fmt.Errorf("sending to the kernel: %w", err))
			} else {
				b.drain(r)
			}
			clear(batch)
		}
	}
}

// drain reads the answers that are there after a send. The kernel processes the
// messages of a sendmsg before the call returns (rtnetlink does), so their answers are
// all there, and the writer completes the batch without waking the reader, which reads
// what drain leaves behind.
func (b *Batcher) drain(r *mmsgReader) {
	for {
		n, err := r.read(b.conn, false)
		if err != nil {
			if !b.readFailed(err) {
				continue
			}
			return
		}
		if n == 0 {
			break
		}
		b.complete(r, n)
	}
	b.mu.Lock()
	left := len(b.inflight) > 0
	b.mu.Unlock()
	if left {
		select {
		case b.orphans <- struct{}{}:
		default:
		}
	}
}

// takeBatch moves the next batch of pending requests to inflight, appending them to batch
// and their messages, numbered, to buf.
func (b *Batcher) takeBatch(buf []byte, batch []*nlRequest) ([]byte, []*nlRequest) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return buf, batch
	}
	room := min(b.maxBatch, b.maxInFlight-len(b.inflight))
	taken := 0
	for _, req := range b.pending {
		if len(batch) >= room || (len(batch) > 0 && len(buf)+len(req.msg) > b.maxBytes) {
			break
		}
		taken++
		if !req.state.CompareAndSwap(reqQueued, reqSent) {
			continue // its caller gave up
		}
		b.seq++
		if b.seq == 0 {
			b.seq++
		}
		req.seq = b.seq
		start := len(buf)
		buf = append(buf, req.msg...)
		h := buf[start:]
		ne := binary.NativeEndian
		ne.PutUint32(h[0:4], uint32(len(req.msg)))
		ne.PutUint16(h[6:8], ne.Uint16(h[6:8])|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
		ne.PutUint32(h[8:12], req.seq)
		ne.PutUint32(h[12:16], 0)
		for len(buf)%unix.NLMSG_ALIGNTO != 0 {
			buf = append(buf, 0)
		}
		b.inflight[req.seq] = req
		batch = append(batch, req)
		if cap(req.msg) <= maxSpareBuffer && len(b.spare) < maxSpareBuffers {
			b.spare = append(b.spare, req.msg[:0])
		}
		req.msg = nil
	}
	n := copy(b.pending, b.pending[taken:])
	clear(b.pending[n:])
	b.pending = b.pending[:n]
	return buf, batch
}

// send writes one batch to the socket.
func (b *Batcher) send(buf []byte) error {
	var serr error
	err := b.conn.Write(func(fd uintptr) bool {
		for {
			_, serr = unix.Write(int(fd), buf)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if serr != nil {
		return serr
	}
	return err
}

// fail completes the requests of a batch that was not sent with err.
func (b *Batcher) fail(batch []*nlRequest, err error) {
	b.mu.Lock()
	var failed []*nlRequest
	for _, req := range batch {
		if b.inflight[req.seq] == req {
			delete(b.inflight, req.seq)
			failed = append(failed, req)
		}
	}
	b.mu.Unlock()
	for _, req := range failed {
		req.done <- err
	}
	b.signal()
}

// readLoop reads the answers that drain left behind, whenever there are some, until
// Close.
func (b *Batcher) readLoop() {
	r := newMMsgReader(64, 8<<10)
	for {
		select {
		case <-b.done:
			return
		case <-b.orphans:
		}
		for {
			b.mu.Lock()
			waiting := len(b.inflight) > 0
			b.mu.Unlock()
			if !waiting {
				break
			}
			n, err := r.read(b.conn, true)
			select {
			case <-b.done:
				return
			default:
			}
			if err != nil {
				if b.readFailed(err) {
					return
				}
				continue
			}
			b.complete(r, n)
		}
	}
}

// readFailed handles an error reading answers and reports whether it is fatal: the
// batcher is then closed for new requests.
func (b *Batcher) readFailed(err error) (fatal bool) {
	if errors.Is(err, unix.ENOBUFS) {
		// Answers were dropped: which requests they answered cannot be told, so every
		// request under way fails, and its caller tries again.
		b.failInFlight(ErrAcksLost)
		return false
	}
	select {
	case <-b.done:
		return true
	default:
	}
	// Not a condition the socket recovers from: fail what is under way and what comes,
	// until Close.
	b.failInFlight(fmt.Errorf("reading the kernel's answers: %w", err))
	b.mu.Lock()
	b.closed = true
	pending := b.pending
	b.pending = nil
	b.mu.Unlock()
	for _, req := range pending {
		if req.state.CompareAndSwap(reqQueued, reqSent) {
			req.done <- ErrBatcherClosed
		}
	}
	return true
}

// complete completes the requests that the n datagrams r read answer.
func (b *Batcher) complete(r *mmsgReader, n int) {
	completed := false
	for i := range n {
		data, ok := r.datagram(i)
		if !ok {
			continue
		}
		eachMessage(data, func(typ, flags uint16, seq uint32, payload []byte) {
			if typ != unix.NLMSG_ERROR || len(payload) < 4 {
				return
			}
			b.mu.Lock()
			req := b.inflight[seq]
			delete(b.inflight, seq)
			b.mu.Unlock()
			if req != nil {
				req.done <- ackError(payload, flags)
				completed = true
			}
		})
	}
	if completed {
		b.signal() // room in flight
	}
}

// nlmsgerrAttrMsg is NLMSGERR_ATTR_MSG, the attribute of an NLMSG_ERROR message that
// holds the kernel's explanation, which golang.org/x/sys/unix does not name.
const nlmsgerrAttrMsg = 1

// ackError decodes the payload of an NLMSG_ERROR message (struct nlmsgerr and, with
// NLM_F_ACK_TLVS, the kernel's explanation).
func ackError(msg []byte, flags uint16) error {
	errno := int32(binary.NativeEndian.Uint32(msg[0:4]))
	if errno == 0 {
		return nil
	}
	e := unix.Errno(-errno)
	if flags&unix.NLM_F_ACK_TLVS == 0 || len(msg) < 4+unix.NLMSG_HDRLEN {
		return e
	}
	// The request's header, or with NLM_F_CAPPED unset, the whole request, then
	// attributes.
	rest := msg[4:]
	skip := unix.NLMSG_HDRLEN
	if flags&unix.NLM_F_CAPPED == 0 {
		skip = nlmAlign(int(binary.NativeEndian.Uint32(rest[0:4])))
	}
	if skip > len(rest) {
		return e
	}
	rest = rest[skip:]
	for len(rest) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(rest[0:2]))
		typ := binary.NativeEndian.Uint16(rest[2:4])
		if l < unix.SizeofRtAttr || l > len(rest) {
			break
		}
		if typ == nlmsgerrAttrMsg {
			if text := unix.ByteSliceToString(rest[unix.SizeofRtAttr:l]); text != "" {
				return &nlError{errno: e, msg: text}
			}
		}
		rest = rest[min(len(rest), AttrAlign(l)):]
	}
	return e
}

// failInFlight fails every request sent and not answered with err.
func (b *Batcher) failInFlight(err error) {
	b.mu.Lock()
	inflight := b.inflight
	b.inflight = map[uint32]*nlRequest{}
	b.mu.Unlock()
	for _, req := range inflight {
		req.done <- err
	}
	b.signal()
}

// nlError is the kernel's refusal of a request, with its explanation.
type nlError struct {
	errno unix.Errno
	msg   string
}

func (e *nlError) Error() string { return e.errno.Error() + ": " + e.msg }

// Unwrap returns the errno.
func (e *nlError) Unwrap() error { return e.errno }
