package rtnl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// OpenSocket opens a netlink socket of the protocol in namespace ns (nil: the calling
// process's), bound to the multicast groups (RTNLGRP_* numbers, 1 to 32), non-blocking
// and ready for the runtime's poller, with a receive buffer of rcvbuf bytes when rcvbuf >
// 0 (SO_RCVBUFFORCE, or SO_RCVBUF without CAP_NET_ADMIN). setup, when not nil, is called
// with the descriptor before it is handed to the poller.
func OpenSocket(ns *netns.NsHandle, protocol int, rcvbuf int, setup func(fd int) error, groups ...uint) (*os.File, error) {
	fd, err := socketAt(ns, protocol)
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK}
	for _, g := range groups {
		sa.Groups |= 1 << (g - 1)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding netlink socket: %w", err)
	}
	if rcvbuf > 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf); err != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
		}
	}
	if setup != nil {
		if err := setup(fd); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	return os.NewFile(uintptr(fd), "netlink"), nil
}

// socketAt returns a non-blocking, close-on-exec netlink socket of the protocol opened
// in namespace ns (nil: the calling process's). A socket stays in the namespace it was
// opened in, so only its opening needs a thread there: a goroutine of its own, whose
// thread is locked into ns and ends with it rather than serve other goroutines from ns.
func socketAt(ns *netns.NsHandle, protocol int) (int, error) {
	open := func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, protocol)
	}
	if ns == nil {
		return open()
	}
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Never unlocked: the runtime ends the thread when the goroutine returns.
		runtime.LockOSThread()
		if err := netns.Set(*ns); err != nil {
			done <- result{-1, fmt.Errorf("entering network namespace %v: %w", *ns, err)}
			return
		}
		fd, err := open()
		done <- result{fd, err}
	}()
	r := <-done
	return r.fd, r.err
}

// mmsgReader reads many datagrams from a socket in one recvmmsg.
type mmsgReader struct {
	slot  int
	slab  []byte
	iovs  []unix.Iovec
	names []unix.RawSockaddrNetlink
	hdrs  []mmsghdr
}

// mmsghdr is the kernel's struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// newMMsgReader returns a reader of up to n datagrams of up to slot bytes at once.
func newMMsgReader(n, slot int) *mmsgReader {
	return &mmsgReader{
		slot:  slot,
		slab:  make([]byte, n*slot),
		iovs:  make([]unix.Iovec, n),
		names: make([]unix.RawSockaddrNetlink, n),
		hdrs:  make([]mmsghdr, n),
	}
}

// read reads as many datagrams as are there on conn, up to the reader's capacity;
// datagram returns them. With wait, it waits until there are some; without, it returns 0
// when there are none.
func (r *mmsgReader) read(conn syscall.RawConn, wait bool) (int, error) {
	for i := range r.hdrs {
		r.iovs[i].Base = &r.slab[i*r.slot]
		r.iovs[i].SetLen(r.slot)
		r.names[i] = unix.RawSockaddrNetlink{}
		r.hdrs[i] = mmsghdr{}
		r.hdrs[i].hdr.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		r.hdrs[i].hdr.Namelen = unix.SizeofSockaddrNetlink
		r.hdrs[i].hdr.Iov = &r.iovs[i]
		r.hdrs[i].hdr.SetIovlen(1)
	}
	var n int
	var rerr error
	err := conn.Read(func(fd uintptr) bool {
		for {
			got, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.hdrs)), 0, 0, 0)
			switch errno {
			case 0:
				n = int(got)
				return true
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return !wait
			default:
				rerr = errno
				return true
			}
		}
	})
	if rerr != nil {
		return 0, rerr
	}
	return n, err
}

// datagram returns the i-th datagram the last read returned, and whether the kernel sent
// it (a datagram from another netlink socket is not the kernel's word).
func (r *mmsgReader) datagram(i int) (data []byte, fromKernel bool) {
	h := &r.hdrs[i]
	if h.hdr.Namelen >= unix.SizeofSockaddrNetlink && r.names[i].Family == unix.AF_NETLINK && r.names[i].Pid != 0 {
		return nil, false
	}
	return r.slab[i*r.slot : i*r.slot+min(int(h.n), r.slot)], true
}

// nlaTypeMask masks the flags out of a netlink attribute's type (NLA_TYPE_MASK).
const nlaTypeMask = ^uint16(unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)

// eachMessage calls f with the type, flags, sequence number and payload of every netlink
// message in a datagram.
func eachMessage(data []byte, f func(typ, flags uint16, seq uint32, payload []byte)) {
	ne := binary.NativeEndian
	for len(data) >= unix.NLMSG_HDRLEN {
		l := int(ne.Uint32(data[0:4]))
		if l < unix.NLMSG_HDRLEN || l > len(data) {
			return
		}
		f(ne.Uint16(data[4:6]), ne.Uint16(data[6:8]), ne.Uint32(data[8:12]), data[unix.NLMSG_HDRLEN:l])
		data = data[min(len(data), nlmAlign(l)):]
	}
}

// ErrOverflow is the error of a Receive when the kernel dropped notifications that
// did not fit the subscription's receive buffer.
var ErrOverflow = errors.New("notifications lost: the receive buffer overflowed")

// Subscription receives the kernel's notifications of one or more netlink multicast
// groups (`ip monitor`), many datagrams to a system call.
type Subscription struct {
	file   *os.File
	conn   syscall.RawConn
	reader *mmsgReader
}

// Subscribe subscribes to the groups (RTNLGRP_* numbers) of NETLINK_ROUTE in
// namespace ns (nil: the calling process's) with a receive buffer of rcvbuf bytes.
func Subscribe(ns *netns.NsHandle, rcvbuf int, groups ...uint) (*Subscription, error) {
	f, err := OpenSocket(ns, unix.NETLINK_ROUTE, rcvbuf, nil, groups...)
	if err != nil {
		return nil, err
	}
	conn, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Subscription{file: f, conn: conn, reader: newMMsgReader(64, 16<<10)}, nil
}

// Receive waits for notifications and calls f with the type and payload of each that the
// kernel sent. It returns ErrOverflow when the kernel dropped some, and an
// error once Close is called.
func (s *Subscription) Receive(f func(typ uint16, payload []byte)) error {
	n, err := s.reader.read(s.conn, true)
	if errors.Is(err, unix.ENOBUFS) {
		return ErrOverflow
	}
	if err != nil {
		return err
	}
	for i := range n {
		data, ok := s.reader.datagram(i)
		if !ok {
			continue
		}
		eachMessage(data, func(typ, _ uint16, _ uint32, payload []byte) { f(typ, payload) })
	}
	return nil
}

// Join subscribes to more groups (RTNLGRP_* numbers), as `ip monitor` naming them would
// have: notifications of the groups follow from the call on.
func (s *Subscription) Join(groups ...uint) error {
	var serr error
	err := s.conn.Control(func(fd uintptr) {
		for _, g := range groups {
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, int(g)); serr != nil {
				serr = fmt.Errorf("joining netlink group %d: %w", g, serr)
				return
			}
		}
	})
	if err != nil {
		return fmt.Errorf("joining netlink groups: %w", err)
	}
	return serr
}

// SetReceiveBuffer sets the size in bytes of the subscription's receive buffer, as
// Subscribe's rcvbuf does.
func (s *Subscription) SetReceiveBuffer(rcvbuf int) error {
	var serr error
	err := s.conn.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf); serr != nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("setting the receive buffer of a subscription: %w", err)
	}
	return nil
}

// Close ends the subscription; a Receive under way returns. It is safe to call twice.
func (s *Subscription) Close() error {
	s.file.Close()
	return nil
}
