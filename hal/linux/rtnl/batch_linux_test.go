package rtnl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/internal/testns"
)

// batchNamespace makes a fresh namespace with eth0 on 10.10.0.1/24 and returns its name
// and handle.
func batchNamespace(t *testing.T) (string, netns.NsHandle) {
	t.Helper()
	ns := testns.Named(t, "naples-nlb")
	for _, args := range [][]string{
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"addr", "add", "10.10.0.1/24", "dev", "eth0"},
		{"link", "set", "eth0", "up"},
		{"link", "set", "eth1", "up"},
	} {
		testns.Run(t, "ip", append([]string{"-n", ns}, args...)...)
	}
	return ns, testns.Handle(t, ns)
}

// hostRoute returns 198.18.x.y/32, the i-th test route.
func hostRoute(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
}

// viaGW is the gateway of the test routes.
var viaGW = netip.MustParseAddr("10.10.0.2")

// routeMsg returns a request of the type for the route to dst/32 in table 100 with
// protocol 241 through the gateway gw, when valid (`ip route add DST via GW table 100
// proto 241`; with RTM_DELROUTE, `ip route del DST table 100 proto 241`).
func routeMsg(typ, flags uint16, dst, gw netip.Addr) []byte {
	b := Message(nil, typ, flags)
	scope, rtype := byte(unix.RT_SCOPE_UNIVERSE), byte(unix.RTN_UNICAST)
	if typ == unix.RTM_DELROUTE {
		scope, rtype = unix.RT_SCOPE_NOWHERE, unix.RTN_UNSPEC
	}
	// struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
	b = append(b, unix.AF_INET, 32, 0, 0, 100, 241, scope, rtype, 0, 0, 0, 0)
	b = AppendAttrAddr(b, unix.RTA_DST, dst)
	if gw.IsValid() {
		b = AppendAttrAddr(b, unix.RTA_GATEWAY, gw)
	}
	return b
}

// addRouteMsg returns the request that adds the test route to dst through gw.
func addRouteMsg(dst, gw netip.Addr) []byte {
	return routeMsg(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, dst, gw)
}

// table100 returns `ip route show table 100` in the namespace.
func table100(t *testing.T, ns string) string {
	t.Helper()
	return testns.Run(t, "ip", "-n", ns, "route", "show", "table", "100")
}

// waitPending waits until n requests wait in the batcher, whose goroutines have not
// started.
func waitPending(t *testing.T, b *Batcher, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b.mu.Lock()
		got := len(b.pending)
		b.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests pending, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// TestNLBatcherOneBatchEachItsAnswer: requests that wait together go to the kernel in
// one sendmsg, and each caller gets the kernel's answer to its own request: the one the
// kernel refuses fails alone, with the kernel's errno and explanation.
func TestNLBatcherOneBatchEachItsAnswer(t *testing.T) {
	ns, nsh := batchNamespace(t)
	// A route that is there already: adding it again fails with EEXIST.
	testns.Run(t, "ip", "-n", ns, "route", "add", "198.18.0.7/32", "via", "10.10.0.2", "table", "100")
	b, err := openNLBatcher(BatcherOptions{Namespace: &nsh, Protocol: unix.NETLINK_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })

	const n = 20
	unreachable := netip.MustParseAddr("10.99.0.2")
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		gw := viaGW
		if i == 13 {
			gw = unreachable
		}
		msg := addRouteMsg(hostRoute(i), gw)
		wg.Go(func() { errs[i] = b.Do(context.Background(), msg) })
	}
	waitPending(t, b, n)
	b.start()
	wg.Wait()

	if got := b.batches.Load(); got != 1 {
		t.Errorf("%d requests that waited together went out in %d sendmsg calls, want 1", n, got)
	}
	for i, err := range errs {
		switch i {
		case 7:
			if !errors.Is(err, unix.EEXIST) {
				t.Errorf("adding a route that exists: err = %v, want EEXIST", err)
			}
		case 13:
			if !errors.Is(err, unix.ENETUNREACH) {
				t.Errorf("adding a route via an unreachable gateway: err = %v, want ENETUNREACH", err)
			}
			t.Logf("the kernel's refusal: %v", err)
		default:
			if err != nil {
				t.Errorf("request %d: %v", i, err)
			}
		}
	}
	got := table100(t, ns)
	for i := range n {
		want := hostRoute(i).String() + " via 10.10.0.2 dev eth0 proto 241"
		switch i {
		case 7:
			// The route that was there, untouched.
			if !strings.Contains(got, "198.18.0.7 via 10.10.0.2") || strings.Contains(got, "198.18.0.7 via 10.10.0.2 dev eth0 proto 241") {
				t.Errorf("table 100 should hold 198.18.0.7 as ip added it:\n%s", got)
			}
			continue
		case 13:
			if strings.Contains(got, "198.18.0.13 ") {
				t.Errorf("the refused route is in the kernel:\n%s", got)
			}
			continue
		}
		if !strings.Contains(got, want) {
			t.Errorf("table 100 lacks %q:\n%s", want, got)
		}
	}
}

// TestNLBatcherManyCallers: many callers at once each add and then delete their routes;
// every request succeeds, the kernel holds exactly what they wrote, and the requests
// share sendmsg calls.
func TestNLBatcherManyCallers(t *testing.T) {
	ns, nsh := batchNamespace(t)
	b, err := NewBatcher(BatcherOptions{Namespace: &nsh, Protocol: unix.NETLINK_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })

	const callers, each = 64, 40
	run := func(what string, msg func(dst netip.Addr) []byte) {
		t.Helper()
		errs := make(chan error, callers*each)
		var wg sync.WaitGroup
		for c := range callers {
			wg.Go(func() {
				for i := range each {
					id := hostRoute(c*each + i)
					if err := b.Do(context.Background(), msg(id)); err != nil {
						errs <- fmt.Errorf("%s %s: %w", what, id, err)
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}

	run("adding", func(dst netip.Addr) []byte { return addRouteMsg(dst, viaGW) })
	if got := strings.Count(table100(t, ns), " proto 241"); got != callers*each {
		t.Fatalf("table 100 holds %d naples routes, want %d", got, callers*each)
	}
	run("deleting", func(dst netip.Addr) []byte {
		return routeMsg(unix.RTM_DELROUTE, 0, dst, netip.Addr{})
	})
	if got := table100(t, ns); got != "" {
		t.Fatalf("table 100 after deleting every route:\n%s", got)
	}
	batches, sent := b.batches.Load(), b.sent.Load()
	t.Logf("%d requests in %d sendmsg calls", sent, batches)
	if sent != 2*callers*each || batches > sent {
		t.Errorf("%d requests sent in %d sendmsg calls, want %d requests", sent, batches, 2*callers*each)
	}
}

// TestNLBatcherContextWritesNothing: a request whose context has ended is not sent, nor
// is one whose context ends while it waits its turn.
func TestNLBatcherContextWritesNothing(t *testing.T) {
	ns, nsh := batchNamespace(t)
	b, err := openNLBatcher(BatcherOptions{Namespace: &nsh, Protocol: unix.NETLINK_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.Do(ended, addRouteMsg(hostRoute(1), viaGW)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Do with an ended context: err = %v, want context.Canceled", err)
	}

	// The writer has not started: the request waits, and its context ends meanwhile.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Do(ctx, addRouteMsg(hostRoute(2), viaGW)) }()
	waitPending(t, b, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Do whose context ended while it waited: err = %v, want context.Canceled", err)
	}

	b.start()
	if err := b.Do(context.Background(), addRouteMsg(hostRoute(3), viaGW)); err != nil {
		t.Fatal(err)
	}
	got := table100(t, ns)
	if strings.Contains(got, "198.18.0.1 ") || strings.Contains(got, "198.18.0.2 ") || !strings.Contains(got, "198.18.0.3 ") {
		t.Fatalf("table 100 should hold 198.18.0.3 alone:\n%s", got)
	}
	if sent := b.sent.Load(); sent != 1 {
		t.Errorf("%d requests sent, want 1", sent)
	}
}

// fakeKernel is the other end of a batcher's socket: it reads the requests the batcher
// sends and answers them when a test says so.
type fakeKernel struct {
	t  *testing.T
	fd int
}

// newFakeKernelBatcher returns a started batcher whose socket leads to a fakeKernel.
func newFakeKernelBatcher(t *testing.T, opts BatcherOptions) (*Batcher, *fakeKernel) {
	t.Helper()
	f, fd := fakeKernelSocket(t)
	k := &fakeKernel{t: t, fd: fd}
	b, err := newNLBatcherOn(f, opts)
	if err != nil {
		t.Fatal(err)
	}
	b.start()
	t.Cleanup(func() {
		b.Close()
		unix.Close(k.fd)
	})
	return b, k
}

// fakeKernelSocket returns the two ends of a datagram socket pair that stands in for a
// netlink socket: a non-blocking file for the batcher or reader under test, and the end
// the test answers on as the kernel would.
func fakeKernelSocket(t *testing.T) (ours *os.File, kernel int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fds[0]), "fake-netlink"), fds[1]
}

// next reads the next request the batcher sent and returns its sequence number.
func (k *fakeKernel) next() (seq uint32) {
	k.t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Read(k.fd, buf)
	if err != nil || n < unix.NLMSG_HDRLEN {
		k.t.Fatalf("reading a request: %d bytes, %v", n, err)
	}
	if flags := binary.NativeEndian.Uint16(buf[6:8]); flags&unix.NLM_F_ACK == 0 {
		k.t.Fatalf("request without NLM_F_ACK: flags %#x", flags)
	}
	return binary.NativeEndian.Uint32(buf[8:12])
}

// ack answers request seq with errno (0: success).
func (k *fakeKernel) ack(seq uint32, errno unix.Errno) {
	k.t.Helper()
	msg := make([]byte, unix.NLMSG_HDRLEN+4+unix.NLMSG_HDRLEN)
	ne := binary.NativeEndian
	ne.PutUint32(msg[0:4], uint32(len(msg)))
	ne.PutUint16(msg[4:6], unix.NLMSG_ERROR)
	ne.PutUint16(msg[6:8], unix.NLM_F_CAPPED)
	ne.PutUint32(msg[8:12], seq)
	ne.PutUint32(msg[16:20], uint32(-int32(errno)))
	if _, err := unix.Write(k.fd, msg); err != nil {
		k.t.Fatalf("answering request %d: %v", seq, err)
	}
}

// TestNLBatcherTimeout: a request the kernel does not answer fails after the timeout
// instead of blocking its caller; a late answer to it is dropped, and later requests get
// their own answers.
func TestNLBatcherTimeout(t *testing.T) {
	b, k := newFakeKernelBatcher(t, BatcherOptions{Timeout: 100 * time.Millisecond})

	start := time.Now()
	err := b.Do(context.Background(), addRouteMsg(hostRoute(1), viaGW))
	if !errors.Is(err, ErrNoAnswer) {
		t.Fatalf("Do of a request the kernel does not answer: err = %v, want ErrNoAnswer", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Do returned after %v, want about the timeout", d)
	}
	late := k.next()
	k.ack(late, 0) // too late: dropped

	done := make(chan error, 1)
	go func() { done <- b.Do(context.Background(), addRouteMsg(hostRoute(2), viaGW)) }()
	seq := k.next()
	if seq == late {
		t.Fatalf("a new request reused sequence number %d", seq)
	}
	k.ack(seq, unix.EEXIST)
	if err := <-done; !errors.Is(err, unix.EEXIST) {
		t.Fatalf("Do answered EEXIST: err = %v", err)
	}
	b.mu.Lock()
	inflight := len(b.inflight)
	b.mu.Unlock()
	if inflight != 0 {
		t.Errorf("%d requests still wait for an answer", inflight)
	}
}

// TestNLBatcherClose: requests under way when the batcher closes fail, as do requests made
// after; Close can be called twice.
func TestNLBatcherClose(t *testing.T) {
	b, k := newFakeKernelBatcher(t, BatcherOptions{})
	done := make(chan error, 1)
	go func() { done <- b.Do(context.Background(), addRouteMsg(hostRoute(1), viaGW)) }()
	k.next()
	b.Close()
	if err := <-done; !errors.Is(err, ErrBatcherClosed) {
		t.Fatalf("Do under way at Close: err = %v, want ErrBatcherClosed", err)
	}
	if err := b.Do(context.Background(), addRouteMsg(hostRoute(2), viaGW)); !errors.Is(err, ErrBatcherClosed) {
		t.Fatalf("Do after Close: err = %v, want ErrBatcherClosed", err)
	}
	b.Close()
}

// TestAckError decodes the kernel's acks: success, a bare errno, and an errno with the
// kernel's explanation after a capped or a whole echoed request.
func TestAckError(t *testing.T) {
	ne := binary.NativeEndian
	ack := func(errno unix.Errno, echoed int, text string) ([]byte, uint16) {
		b := ne.AppendUint32(nil, uint32(-int32(errno)))
		echo := make([]byte, echoed)
		ne.PutUint32(echo[0:4], 40) // the request's length, whether echoed whole or not
		b = append(b, echo...)
		flags := uint16(0)
		if echoed == unix.NLMSG_HDRLEN {
			flags |= unix.NLM_F_CAPPED
		}
		if text != "" {
			flags |= unix.NLM_F_ACK_TLVS
			b = AppendAttr(b, 1 /* NLMSGERR_ATTR_MSG */, append([]byte(text), 0))
		}
		return b, flags
	}
	for _, tc := range []struct {
		name   string
		errno  unix.Errno
		echoed int
		text   string
		want   string
	}{
		{"success", 0, unix.NLMSG_HDRLEN, "", ""},
		{"errno", unix.EEXIST, unix.NLMSG_HDRLEN, "", unix.EEXIST.Error()},
		{"capped with text", unix.ENETUNREACH, unix.NLMSG_HDRLEN, "Nexthop has invalid gateway", "network is unreachable: Nexthop has invalid gateway"},
		{"whole request with text", unix.EINVAL, 40, "Invalid prefix", "invalid argument: Invalid prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg, flags := ack(tc.errno, tc.echoed, tc.text)
			err := ackError(msg, flags)
			if tc.errno == 0 {
				if err != nil {
					t.Fatalf("ackError = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.errno) || err.Error() != tc.want {
				t.Fatalf("ackError = %q, want %q wrapping %v", err, tc.want, tc.errno)
			}
		})
	}
}
