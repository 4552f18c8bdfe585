package linux

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/hal/linux/fwbpf"
	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The firewall's throughput benchmark: traffic between two namespaces joined by a veth
// pair, with and without the firewall on one end.
//
//	go test -run '^$' -bench 'FirewallThroughput' -benchtime 1x ./hal/linux/

// The addressing of the benchmark: the peer (10.99.0.1, in the host namespace, on
// fwBenchIface) sends to the endpoint (10.99.0.2, eth0 of the workload namespace).
const (
	fwBenchIface    = "fwep"
	fwBenchPeer     = "10.99.0.1"
	fwBenchEndpoint = "10.99.0.2"
	// fwBenchTCPPort and fwBenchUDPPort are the ports of the stream and of the
	// datagrams, each allowed by one rule; fwBenchDeniedPort is allowed by none.
	fwBenchTCPPort    = 5001
	fwBenchUDPPort    = 5002
	fwBenchDeniedPort = 5003
	// fwBenchLink is the name the firewall's links are pinned under.
	fwBenchLink = "fwbench"
)

// How the benchmark measures: fwBenchPairs pairs of rounds per iteration, each pair one
// round without the program and one with it (in alternating order, so that a drift of the
// machine's load weighs on both alike), every round fwBenchRound long.
const (
	fwBenchPairs = 8
	fwBenchRound = 150 * time.Millisecond
	// fwBenchDatagram is the UDP payload of the packet-rate rounds, and fwBenchBatch
	// the number of datagrams one sendmmsg or recvmmsg call carries.
	fwBenchDatagram = 64
	fwBenchBatch    = 64
)

// BenchmarkFirewallThroughput measures what the firewall costs traffic to an endpoint.
// Two namespaces are joined by a veth pair: the host side, fwep, is the endpoint's
// interface, where the firewall is attached (fwbpf.Open with its maps pinned in a
// directory of /sys/fs/bpf removed afterwards, Objects.Attach on fwep), and the other
// end, eth0 in the workload namespace, is the endpoint. The peer, in the host namespace,
// sends to the endpoint: its packets pass fwep's tcx egress hook (the endpoint's
// ingress), the replies its tcx ingress hook.
//
// The snapshot is built with firewall.Compile from objects: the Endpoint, listing group
// protected, and one policy attached to protected with N ingress rules. With N = 0 the
// policy has no rules and the endpoint is open: the program still runs, tracks the
// connections and counts the packets. With N > 0 one rule allows the TCP stream from the
// peer's /32, one the datagrams, and the rest allow distinct /32s of 172.16.0.0/12 one
// TCP or UDP port each: about 2N entries in the snapshot (an identity and a policy entry
// per rule; the two rules of the peer share its identity).
//
// Two sub-benchmarks per N:
//   - tcp: one TCP connection per round (a new conntrack entry each time) writing 256 KiB
//     at a time; MB/s is 10⁶ bytes a second received by the endpoint. With GSO a packet
//     carries up to 64 KiB, so the program runs seldom for the bytes moved.
//   - udp: 64-byte datagrams from one socket (one conntrack entry, established after its
//     first packet), sent with sendmmsg 64 at a time and received with recvmmsg; pps is
//     datagrams received a second of sending. This is the per-packet cost.
//
// Every iteration runs fwBenchPairs pairs of rounds, one round without any program on
// fwep and one with the firewall, in alternating order. It reports the medians of both
// rates (none-… and fw-…) and x-none, the median over the pairs of the no-program rate
// divided by the firewall's: the time a byte or a packet takes with the firewall over
// the time it takes without (the goal at 10,000 rules is at most 1.3); x-none-min and
// x-none-max, the smallest and largest of these ratios, show the noise. It also reports
// how long firewall.Compile and Objects.Install took for the snapshot, its entries and
// the memory the kernel accounts to its map (memlock, from the map's fdinfo).
//
// It fails unless the program was attached in every firewall round and detached in every
// other (the kernel's tcx query), the endpoint's allowed-packets counter grew by at
// least the datagrams delivered in the firewall rounds, and, with N > 0, a datagram to a
// port no rule allows is counted as denied.
func BenchmarkFirewallThroughput(b *testing.B) {
	fb := newFWBench(b)
	for _, rules := range []int{0, 100, 1000, 10_000} {
		b.Run(fmt.Sprintf("rules=%d", rules), func(b *testing.B) {
			snap := fb.install(b, rules)
			b.Run("tcp", func(b *testing.B) { fb.measure(b, snap, false) })
			b.Run("udp", func(b *testing.B) { fb.measure(b, snap, true) })
		})
	}
}

// fwBench is the benchmark's setting: the namespaces, the firewall's objects and the
// sockets.
type fwBench struct {
	objs *fwbpf.Objects
	// host is the namespace of fwep and of the peer's sockets; wl that of the endpoint.
	host, wl netns.NsHandle
	ifindex  int
	// tcp accepts the stream in the endpoint; udpRecv receives the datagrams there.
	tcp     net.Listener
	udpRecv *net.UDPConn
	// udpSend is the peer's socket, connected to the endpoint's UDP port; denied the
	// peer's socket connected to a port no rule allows.
	udpSend, denied *net.UDPConn
}

// newFWBench makes the namespaces, the veth pair and the sockets, and loads the firewall
// with its maps pinned in a directory of /sys/fs/bpf; everything goes when the benchmark
// ends.
func newFWBench(b *testing.B) *fwBench {
	b.Helper()
	testns.RequireRoot(b)
	hostName := testns.Named(b, "fwbench-host")
	wlName := testns.Named(b, "fwbench-wl")
	testns.Run(b, "ip", "-n", hostName, "link", "add", fwBenchIface, "type", "veth", "peer", "name", "eth0", "netns", wlName)
	for _, args := range [][]string{
		{"-n", hostName, "addr", "add", fwBenchPeer + "/24", "dev", fwBenchIface},
		{"-n", hostName, "link", "set", fwBenchIface, "up"},
		{"-n", wlName, "addr", "add", fwBenchEndpoint + "/24", "dev", "eth0"},
		{"-n", wlName, "link", "set", "eth0", "up"},
	} {
		testns.Run(b, "ip", args...)
	}
	fb := &fwBench{host: testns.Handle(b, hostName), wl: testns.Handle(b, wlName)}
	if err := runInNamespace(&fb.host, func() error {
		iface, err := net.InterfaceByName(fwBenchIface)
		if err == nil {
			fb.ifindex = iface.Index
		}
		return err
	}); err != nil {
		b.Fatalf("finding %s: %v", fwBenchIface, err)
	}

	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwbench-%d", os.Getpid()))
	b.Cleanup(func() { os.RemoveAll(dir) })
	var err error
	fb.objs, err = fwbpf.Open(dir, fwbpf.Capacities{Conntrack: 4096, Rules: 16384, Endpoints: 64}, quiet)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { fb.objs.Close() })

	if err := runInNamespace(&fb.wl, func() error {
		var err error
		if fb.tcp, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", fwBenchEndpoint, fwBenchTCPPort)); err != nil {
			return err
		}
		fb.udpRecv, err = listenUDP(fmt.Sprintf("%s:%d", fwBenchEndpoint, fwBenchUDPPort))
		return err
	}); err != nil {
		b.Fatalf("listening in the endpoint: %v", err)
	}
	b.Cleanup(func() { fb.tcp.Close(); fb.udpRecv.Close() })
	if err := runInNamespace(&fb.host, func() error {
		var err error
		if fb.udpSend, err = dialUDP(fmt.Sprintf("%s:%d", fwBenchEndpoint, fwBenchUDPPort)); err != nil {
			return err
		}
		fb.denied, err = dialUDP(fmt.Sprintf("%s:%d", fwBenchEndpoint, fwBenchDeniedPort))
		return err
	}); err != nil {
		b.Fatalf("opening the peer's sockets: %v", err)
	}
	b.Cleanup(func() { fb.udpSend.Close(); fb.denied.Close() })

	// A first round of each kind without the program resolves the neighbours and
	// shows that traffic flows.
	if _, err := fb.tcpRound(fwBenchRound / 4); err != nil {
		b.Fatalf("a TCP stream without the firewall: %v", err)
	}
	if n, err := fb.udpRound(fwBenchRound / 4); err != nil || n == 0 {
		b.Fatalf("datagrams without the firewall: %v pps, %v", n, err)
	}
	return fb
}

// listenUDP opens a UDP socket bound to addr with a receive buffer of 8 MiB, so that a
// burst the receiver is late for is not dropped.
func listenUDP(addr string) (*net.UDPConn, error) {
	a, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, err
	}
	c, err := net.ListenUDP("udp4", a)
	if err != nil {
		return nil, err
	}
	if err := setSockopt(c, unix.SO_RCVBUFFORCE, 8<<20); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// dialUDP opens a UDP socket connected to addr.
func dialUDP(addr string) (*net.UDPConn, error) {
	a, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, err
	}
	return net.DialUDP("udp4", nil, a)
}

// setSockopt sets an integer option of level SOL_SOCKET on the socket.
func setSockopt(c *net.UDPConn, opt, value int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, value) }); err != nil {
		return err
	}
	return serr
}

// fwBenchSnapshot is a snapshot installed for a sub-benchmark and what its making cost.
type fwBenchSnapshot struct {
	rules int
	snap  *firewall.Snapshot
	// compile and install are how long firewall.Compile and Objects.Install took;
	// memlock is the memory the kernel accounts to the snapshot's map.
	compile, install time.Duration
	memlock          uint64
	// epID is the endpoint's id, tcpRule and udpRule the ids of the rules allowing the
	// stream and the datagrams (0 with no rules).
	epID             uint32
	tcpRule, udpRule uint64
}

// fwBenchObjects returns the Endpoint on fwep, listing group protected, and a policy
// attached to protected with the rules: the first allows the peer's TCP stream, the
// second its datagrams, the others distinct /32s of 172.16.0.0/12 one TCP or UDP port
// each.
func fwBenchObjects(rules int) (ep, policy *nimbusv1.Object) {
	ep = &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "bench"},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: "net", Node: "node", Interface: fwBenchIface, Ips: []string{fwBenchEndpoint},
			SecurityGroups: []string{"protected"},
		}},
	}
	spec := &nimbusv1.NetworkSecurityPolicySpec{AttachGroups: []string{"protected"}}
	allow := func(proto string, port int, cidr string) *nimbusv1.PolicyRule {
		return &nimbusv1.PolicyRule{Action: nimbusv1.PolicyRule_ACTION_ALLOW, Protocol: proto,
			Ports: []string{fmt.Sprint(port)}, FromCidrs: []string{cidr}}
	}
	for i := range rules {
		switch i {
		case 0:
			spec.Ingress = append(spec.Ingress, allow("tcp", fwBenchTCPPort, fwBenchPeer+"/32"))
		case 1:
			spec.Ingress = append(spec.Ingress, allow("udp", fwBenchUDPPort, fwBenchPeer+"/32"))
		default:
			proto := "tcp"
			if i%2 == 1 {
				proto = "udp"
			}
			spec.Ingress = append(spec.Ingress, allow(proto, 1024+i%60000,
				fmt.Sprintf("172.%d.%d.%d/32", 16+i>>16, (i>>8)&0xff, i&0xff)))
		}
	}
	policy = &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "bench"},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: spec},
	}
	return ep, policy
}

// install compiles the snapshot of a policy of the rules, installs it, makes the
// counters of its rules and endpoint, and reads its map's memory.
func (fb *fwBench) install(b *testing.B, rules int) *fwBenchSnapshot {
	b.Helper()
	ep, policy := fwBenchObjects(rules)
	in := firewall.Input{
		Endpoints: []*nimbusv1.Object{ep},
		Policies:  []*nimbusv1.Object{policy},
		Local:     []firewall.Local{{Endpoint: ep.Key().ID(), Ifindex: uint32(fb.ifindex)}},
	}
	s := &fwBenchSnapshot{rules: rules}
	start := time.Now()
	s.snap = firewall.Compile(in)
	s.compile = time.Since(start)
	if len(s.snap.Problems) > 0 || len(s.snap.Endpoints) != 1 || len(s.snap.Rules) != rules {
		b.Fatalf("the snapshot of %d rules has %d endpoints, %d rules and problems %v; want 1, %d, none",
			rules, len(s.snap.Endpoints), len(s.snap.Rules), s.snap.Problems, rules)
	}
	if want := firewall.FlagIngress; rules > 0 && s.snap.Endpoints[0].Flags != uint32(want) {
		b.Fatalf("the endpoint's flags are %#x; want ingress protected (%#x)", s.snap.Endpoints[0].Flags, want)
	}
	start = time.Now()
	if err := fb.objs.Install(s.snap.Entries); err != nil {
		b.Fatal(err)
	}
	s.install = time.Since(start)
	s.epID = s.snap.Endpoints[0].ID
	var ids []uint64
	for _, r := range s.snap.Rules {
		ids = append(ids, r.ID)
		switch r.Index {
		case 0:
			s.tcpRule = r.ID
		case 1:
			s.udpRule = r.ID
		}
	}
	if err := fb.objs.KeepRuleCounters(ids); err != nil {
		b.Fatal(err)
	}
	if err := fb.objs.KeepEndpointCounters([]uint32{s.epID}); err != nil {
		b.Fatal(err)
	}
	info, err := snapshotMapInfo(fb.objs.Snapshots)
	if err != nil {
		b.Fatal(err)
	}
	s.memlock, _ = info.Memlock()
	return s
}

// snapshotMapInfo returns the information the kernel gives about the map in slot 0 of
// the array of snapshots.
func snapshotMapInfo(snapshots *ebpf.Map) (*ebpf.MapInfo, error) {
	var id ebpf.MapID
	if err := snapshots.Lookup(uint32(0), &id); err != nil {
		return nil, fmt.Errorf("reading the snapshot slot: %w", err)
	}
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return nil, fmt.Errorf("opening snapshot map %d: %w", id, err)
	}
	defer m.Close()
	return m.Info()
}

// measure runs fwBenchPairs pairs of rounds per iteration, of the TCP stream or of the
// datagrams (udp), without and with the firewall, and reports the medians of their
// rates, their ratio and what the snapshot cost.
func (fb *fwBench) measure(b *testing.B, s *fwBenchSnapshot, udp bool) {
	round, unit, rule := fb.tcpRound, "MB/s", s.tcpRule
	if udp {
		round, unit, rule = fb.udpRound, "pps", s.udpRule
	}
	before := fb.endpointCount(b, s.epID)
	var none, fw, ratios []float64
	var fwDelivered float64
	for b.Loop() {
		for pair := range fwBenchPairs {
			var rate [2]float64
			// Alternate the order: none first in even pairs, the firewall first in odd
			// ones.
			for _, attached := range []bool{pair%2 == 1, pair%2 == 0} {
				fb.setAttached(b, attached)
				r, err := round(fwBenchRound)
				if err != nil {
					b.Fatalf("a round with the firewall attached=%v: %v", attached, err)
				}
				if attached {
					rate[1] = r
					// A round sends for at least fwBenchRound: this is at most what
					// it delivered.
					fwDelivered += r * fwBenchRound.Seconds()
				} else {
					rate[0] = r
				}
			}
			none, fw = append(none, rate[0]), append(fw, rate[1])
			ratios = append(ratios, rate[0]/rate[1])
		}
	}
	fb.setAttached(b, false)

	// The firewall saw the traffic of its rounds: every datagram delivered passed it.
	after := fb.endpointCount(b, s.epID)
	allowed := after.AllowedPackets - before.AllowedPackets
	if allowed == 0 || udp && float64(allowed) < fwDelivered {
		b.Errorf("the endpoint's counter allowed %d packets; want at least the %.0f datagrams delivered with the firewall",
			allowed, fwDelivered)
	}
	if s.rules > 0 {
		c, err := fb.objs.RuleCounters(rule)
		if err != nil || c.Packets == 0 {
			b.Errorf("the rule allowing the traffic counted %+v, %v; want packets", c, err)
		}
		fb.wantDenied(b, s.epID)
	}

	b.ReportMetric(median(none), "none-"+unit)
	b.ReportMetric(median(fw), "fw-"+unit)
	b.ReportMetric(median(ratios), "x-none")
	b.ReportMetric(slices.Min(ratios), "x-none-min")
	b.ReportMetric(slices.Max(ratios), "x-none-max")
	b.ReportMetric(float64(s.compile.Microseconds())/1e3, "compile-ms")
	b.ReportMetric(float64(s.install.Microseconds())/1e3, "install-ms")
	b.ReportMetric(float64(len(s.snap.Entries)), "entries")
	b.ReportMetric(float64(s.memlock), "snapshot-memlock-B")
	b.ReportMetric(0, "ns/op")
}

// median returns the median of the values.
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// endpointCount returns the endpoint's firewall counter.
func (fb *fwBench) endpointCount(b *testing.B, id uint32) fwbpf.EndpointStats {
	b.Helper()
	c, err := fb.objs.EndpointCounters(id)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// wantDenied attaches the firewall and sends datagrams to a port no rule allows until
// the endpoint's counter of denied packets grows; it fails the benchmark if it does not
// within a generous deadline.
func (fb *fwBench) wantDenied(b *testing.B, epID uint32) {
	b.Helper()
	fb.setAttached(b, true)
	defer fb.setAttached(b, false)
	before := fb.endpointCount(b, epID).DeniedPackets
	end := time.Now().Add(10 * time.Second)
	for fb.endpointCount(b, epID).DeniedPackets == before {
		if time.Now().After(end) {
			b.Fatalf("datagrams to port %d, which no rule allows, were not counted as denied", fwBenchDeniedPort)
		}
		fb.denied.Write([]byte("denied"))
		time.Sleep(time.Millisecond)
	}
}

// setAttached attaches the firewall to fwep or detaches it, and waits until the
// kernel's tcx hooks of fwep hold the firewall's programs, or nothing.
func (fb *fwBench) setAttached(b *testing.B, attached bool) {
	b.Helper()
	var err error
	if attached {
		err = runInNamespace(&fb.host, func() error {
			_, err := fb.objs.Attach(fwBenchLink, fb.ifindex)
			return err
		})
	} else {
		err = fb.objs.Detach(fwBenchLink)
	}
	if err != nil {
		b.Fatalf("attached=%v: %v", attached, err)
	}
	// An unpinned link is released by the kernel's deferred work: wait for it.
	end := time.Now().Add(10 * time.Second)
	for {
		n, err := fb.attachedPrograms()
		if err != nil {
			b.Fatal(err)
		}
		if attached && n == 2 || !attached && n == 0 {
			return
		}
		if time.Now().After(end) {
			b.Fatalf("%s's tcx hooks hold %d programs; want %d", fwBenchIface, n, map[bool]int{true: 2, false: 0}[attached])
		}
		time.Sleep(time.Millisecond)
	}
}

// attachedPrograms returns how many programs fwep's tcx ingress and egress hooks hold.
func (fb *fwBench) attachedPrograms() (int, error) {
	n := 0
	err := runInNamespace(&fb.host, func() error {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			r, err := link.QueryPrograms(link.QueryOptions{Target: fb.ifindex, Attach: at})
			if err != nil {
				return fmt.Errorf("querying the tcx programs of %s: %w", fwBenchIface, err)
			}
			n += len(r.Programs)
		}
		return nil
	})
	return n, err
}

// tcpRound connects from the peer to the endpoint, writes for the duration and closes;
// it returns the MB (10⁶ bytes) a second the endpoint received, from the accept to the
// end of the stream.
func (fb *fwBench) tcpRound(d time.Duration) (float64, error) {
	type result struct {
		n   int64
		d   time.Duration
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := fb.tcp.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		start := time.Now()
		n, err := io.Copy(io.Discard, c)
		done <- result{n, time.Since(start), err}
	}()
	var c net.Conn
	if err := runInNamespace(&fb.host, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", fwBenchEndpoint, fwBenchTCPPort), 10*time.Second)
		return err
	}); err != nil {
		// Unblock the accept, and clear the deadline for the next round.
		l := fb.tcp.(*net.TCPListener)
		l.SetDeadline(time.Now())
		<-done
		l.SetDeadline(time.Time{})
		return 0, fmt.Errorf("connecting: %w", err)
	}
	buf := make([]byte, 256<<10)
	end := time.Now().Add(d)
	var werr error
	for time.Now().Before(end) {
		if _, werr = c.Write(buf); werr != nil {
			break
		}
	}
	c.Close()
	r := <-done
	if err := errors.Join(werr, r.err); err != nil {
		return 0, err
	}
	return float64(r.n) / r.d.Seconds() / 1e6, nil
}

// mmsghdr is the kernel's struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
}

// mmsgs returns n message headers (mmsghdr), each of one buffer of size bytes.
func mmsgs(n, size int) []mmsghdr {
	msgs := make([]mmsghdr, n)
	iovs := make([]unix.Iovec, n)
	for i := range msgs {
		buf := make([]byte, size)
		copy(buf, "naples firewall benchmark")
		iovs[i].Base = &buf[0]
		iovs[i].SetLen(size)
		msgs[i].hdr.Iov = &iovs[i]
		msgs[i].hdr.SetIovlen(1)
	}
	return msgs
}

// mmsg calls sendmmsg or recvmmsg (trap) on the socket with the messages, waiting for
// the socket to be ready as the runtime's poller does; it returns how many messages went.
func mmsg(rc syscall.RawConn, trap uintptr, msgs []mmsghdr, read bool) (int, error) {
	var n uintptr
	var errno syscall.Errno
	f := func(fd uintptr) bool {
		for {
			n, _, errno = unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), 0, 0, 0)
			if errno != unix.EINTR {
				return errno != unix.EAGAIN
			}
		}
	}
	var err error
	if read {
		err = rc.Read(f)
	} else {
		err = rc.Write(f)
	}
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// udpRound sends 64-byte datagrams from the peer to the endpoint for the duration and
// returns how many the endpoint received a second of sending. The receiver reads until
// it has every datagram sent, or, when some were dropped, until it has seen nothing for
// 100 ms after the sender stopped.
func (fb *fwBench) udpRound(d time.Duration) (float64, error) {
	recv, err := fb.udpRecv.SyscallConn()
	if err != nil {
		return 0, err
	}
	send, err := fb.udpSend.SyscallConn()
	if err != nil {
		return 0, err
	}
	// sent is -1 while the sender sends, then the number of datagrams it sent.
	var sent atomic.Int64
	sent.Store(-1)
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		msgs := mmsgs(fwBenchBatch, 2048)
		total := 0
		for {
			// Read the count before the call: a timeout after the sender stopped means
			// the socket is drained, and what is missing was dropped.
			n := sent.Load()
			if n >= 0 && int64(total) >= n {
				done <- result{total, nil}
				return
			}
			fb.udpRecv.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			got, err := mmsg(recv, unix.SYS_RECVMMSG, msgs, true)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				if n >= 0 {
					done <- result{total, nil}
					return
				}
				continue
			}
			if err != nil {
				done <- result{total, err}
				return
			}
			for _, m := range msgs[:got] {
				if m.n == fwBenchDatagram {
					total++
				}
			}
		}
	}()
	msgs := mmsgs(fwBenchBatch, fwBenchDatagram)
	start := time.Now()
	end := start.Add(d)
	var serr error
	var total int64
	for time.Now().Before(end) {
		n, err := mmsg(send, unix.SYS_SENDMMSG, msgs, false)
		if err != nil {
			serr = err
			break
		}
		total += int64(n)
	}
	elapsed := time.Since(start)
	sent.Store(total)
	r := <-done
	if err := errors.Join(serr, r.err); err != nil {
		return 0, err
	}
	return float64(r.n) / elapsed.Seconds(), nil
}
