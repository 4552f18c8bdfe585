//go:build linux

package test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// This file restarts an agent under traffic: the overlay it programmed keeps forwarding
// while the agent is down, and the agent that comes back adopts it without a write.

// streamPort is the UDP port of the stream echo servers.
const streamPort = 9

// streamBuffer is the receive buffer of the stream's sockets (SO_RCVBUFFORCE): enough
// for seconds of the stream, so that a pause of the test process on a busy machine loses
// nothing of it.
const streamBuffer = 8 << 20

// forceRcvBuf gives a socket a receive buffer of streamBuffer bytes.
func forceRcvBuf(c syscall.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, streamBuffer)
	}); err != nil {
		return err
	}
	return serr
}

// serveStream starts a UDP echo server on streamPort in the workload, with a big receive
// buffer, stopped when the test ends.
func (w *workload) serveStream(t *testing.T) {
	t.Helper()
	var pc *net.UDPConn
	if err := inNetns(t, w.ns, func() error {
		var err error
		if pc, err = net.ListenUDP("udp", &net.UDPAddr{Port: streamPort}); err != nil {
			return err
		}
		return forceRcvBuf(pc)
	}); err != nil {
		t.Fatalf("stream echo server in %s: %v", w.name, err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFromUDP(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err == nil {
				pc.WriteToUDP(buf[:n], from)
			}
		}
	})
	t.Cleanup(func() {
		pc.Close()
		wg.Wait()
	})
}

// udpStream sends a numbered UDP datagram every millisecond from a workload to a stream echo
// server and records which of them came back.
type udpStream struct {
	name string
	conn *net.UDPConn
	stop chan struct{}
	wg   sync.WaitGroup

	// mu guards sent, echoed and writeErrs.
	mu sync.Mutex
	// sent holds when each datagram was sent, by sequence number.
	sent []time.Time
	// echoed tells, by sequence number, whether the datagram came back.
	echoed []bool
	// writeErrs counts sends the kernel refused.
	writeErrs int
}

// startStream starts a stream from the workload to addr, stopped by finish or when the
// test ends.
func startStream(t *testing.T, from *workload, addr string) *udpStream {
	t.Helper()
	s := &udpStream{name: from.name + " to " + addr, stop: make(chan struct{})}
	if err := inNetns(t, from.ns, func() error {
		c, err := net.Dial("udp", net.JoinHostPort(addr, fmt.Sprint(streamPort)))
		if err != nil {
			return err
		}
		s.conn = c.(*net.UDPConn)
		return forceRcvBuf(s.conn)
	}); err != nil {
		t.Fatalf("stream from %s: %v", from.name, err)
	}
	s.run(t)
	return s
}

// run starts the stream on its connection: a numbered datagram every millisecond, and a
// reader that records which ones come back, until close, which the test's end calls.
func (s *udpStream) run(t *testing.T) {
	s.wg.Go(func() {
		buf := make([]byte, 1500)
		for {
			n, err := s.conn.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil || n < 8 {
				// An ICMP error reported on the connected socket: the datagram it was
				// about is missing, which finish tells.
				continue
			}
			seq := binary.BigEndian.Uint64(buf)
			s.mu.Lock()
			if seq < uint64(len(s.echoed)) {
				s.echoed[seq] = true
			}
			s.mu.Unlock()
		}
	})
	s.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		msg := make([]byte, 64)
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			s.mu.Lock()
			seq := uint64(len(s.sent))
			s.sent = append(s.sent, time.Now())
			s.echoed = append(s.echoed, false)
			s.mu.Unlock()
			binary.BigEndian.PutUint64(msg, seq)
			if _, err := s.conn.Write(msg); err != nil {
				s.mu.Lock()
				s.writeErrs++
				s.mu.Unlock()
			}
		}
	})
	t.Cleanup(s.close)
}

// close stops the stream's goroutines; it is safe to call twice.
func (s *udpStream) close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	s.conn.Close()
	s.wg.Wait()
}

// next returns the sequence number of the next datagram.
func (s *udpStream) next() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

// echoedSince returns how many datagrams from sequence number from on came back.
func (s *udpStream) echoedSince(from int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ok := range s.echoed[min(from, len(s.echoed)):] {
		if ok {
			n++
		}
	}
	return n
}

// finish stops sending, waits a while for the last echoes and returns how many datagrams
// were sent and the sequence numbers of those that did not come back.
func (s *udpStream) finish() (sent int, missing []int, writeErrs int) {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	end := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		missing = missing[:0]
		for seq, ok := range s.echoed {
			if !ok {
				missing = append(missing, seq)
			}
		}
		sent, writeErrs = len(s.sent), s.writeErrs
		s.mu.Unlock()
		if len(missing) == 0 || time.Now().After(end) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.close()
	return sent, slices.Clone(missing), writeErrs
}

// gaps describes the missing sequence numbers as ranges with their send times relative
// to t0: "120-131 (+1.20s..+1.31s)".
func (s *udpStream) gaps(missing []int, t0 time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var parts []string
	for i := 0; i < len(missing); {
		j := i
		for j+1 < len(missing) && missing[j+1] == missing[j]+1 {
			j++
		}
		parts = append(parts, fmt.Sprintf("%d-%d (%+.3fs..%+.3fs)", missing[i], missing[j],
			s.sent[missing[i]].Sub(t0).Seconds(), s.sent[missing[j]].Sub(t0).Seconds()))
		i = j + 1
		if len(parts) == 20 {
			parts = append(parts, "...")
			break
		}
	}
	return strings.Join(parts, ", ")
}

// kernelWrites returns the agent's naples_hal_kernel_writes_total by kind, as it serves
// them now.
func kernelWrites(t *testing.T, tel *telemetry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for series, v := range tel.metrics(t) {
		if kind, ok := strings.CutPrefix(series, "naples_hal_kernel_writes_total{"); ok {
			out[strings.TrimSuffix(kind, "}")] = v
		}
	}
	return out
}

// TestOverlayRestart kills host-a's agent with SIGKILL while two UDP streams, a datagram
// a millisecond each, run from workloads on host-a to one on host-b, one within network
// blue and one from network green through the gateways, lets the streams flow a while
// without it, and starts it again. Once the new agent is ready (/readyz), it has made no
// kernel write (naples_hal_kernel_writes_total is 0 for every kind, then and after more
// traffic), host-a's kernel state of naples's is what it was before the kill, every
// datagram of both streams came back, before, during and after the restart, and traffic
// goes on over UDP and TCP. A route changed then is programmed with one write.
func TestOverlayRestart(t *testing.T) {
	quickExit(t)
	c := newCluster(t)
	u := newUnderlay(t)
	a := c.addHost(t, "host-a", "host-a")
	b := c.addHost(t, "host-b", "host-b")
	vtepA, vtepB := u.attach(t, a), u.attach(t, b)
	a.startAgentWith(t, metricsFlags...)
	b.startAgent(t)

	blueA := newWorkload(t, a, "wblue-a", "02:00:00:00:01:0a", []string{"10.1.0.10/24", "fd00:1::a/64"}, "10.1.0.1", "fd00:1::1")
	greenA := newWorkload(t, a, "wgreen-a", "02:00:00:00:02:0a", []string{"10.2.0.10/24"}, "10.2.0.1")
	blueB := newWorkload(t, b, "wblue-b", "02:00:00:00:01:0b", []string{"10.1.0.11/24", "fd00:1::b/64"}, "10.1.0.1", "fd00:1::1")
	for _, w := range []*workload{blueA, greenA, blueB} {
		w.serve(t)
	}
	blueB.serveStream(t)

	c.apply(t, nodeYAML(a, vtepA)+nodeYAML(b, vtepB)+`kind: Network
meta: {name: blue}
spec:
  vni: 100
  mtu: 1450
  subnets:
  - {cidr: 10.1.0.0/24, gateway: 10.1.0.1}
  - {cidr: "fd00:1::/64", gateway: "fd00:1::1"}
---
kind: Network
meta: {name: green}
spec: {vni: 200, subnet: 10.2.0.0/24, gateway: 10.2.0.1}
---
kind: Route
meta: {name: r-dc2}
spec: {table: 100, prefix: 198.51.100.0/24, nexthops: [{gateway: 10.10.0.2}]}
---
kind: Route
meta: {name: r-out}
spec: {tenantTable: true, prefix: 192.0.2.0/24, nexthops: [{gateway: 10.10.0.2}]}
---
`+blueA.endpointYAML("default", "blue", a)+greenA.endpointYAML("default", "green", a)+blueB.endpointYAML("default", "blue", b))
	waitOverlayProgrammed(t, c)
	blueA.wantReach(t, blueB.ip(4))
	blueA.wantReach(t, blueB.ip(6))
	greenA.wantReach(t, blueB.ip(4))

	// The first agent's writes count: a count of zero after the restart means something.
	first := kernelWrites(t, a.telemetry(t))
	for _, kind := range []string{"Route", "Network", "Endpoint"} {
		if first[fmt.Sprintf("kind=%q", kind)] == 0 {
			t.Fatalf("the first agent counted no kernel writes for %s: %v", kind, first)
		}
	}

	reader := newStateReader(t, a)
	before := reader.mustState(t)
	if !slices.ContainsFunc(before, func(l string) bool { return strings.HasPrefix(l, "port wgreen-a ") }) {
		t.Fatalf("host-a's kernel state lacks wgreen-a's port before the restart:\n%s", strings.Join(before, "\n"))
	}

	streams := []*udpStream{startStream(t, blueA, blueB.ip(4)), startStream(t, greenA, blueB.ip(4))}
	began := time.Now()
	waitFor(t, "both streams to flow", func() bool {
		return streams[0].echoedSince(0) >= 100 && streams[1].echoedSince(0) >= 100
	})

	a.agent.kill(t)
	killed := time.Now()
	// The kernel forwards without the agent.
	down := []int{streams[0].next(), streams[1].next()}
	waitFor(t, "both streams to flow while the agent is down", func() bool {
		return streams[0].echoedSince(down[0]) >= 200 && streams[1].echoedSince(down[1]) >= 200
	})
	a.startAgentWith(t, metricsFlags...)
	tel := a.telemetry(t)
	tel.waitReady(t)
	ready := time.Now()
	t.Logf("the agent was killed %v after the streams began and ready %v after the kill",
		killed.Sub(began).Round(time.Millisecond), ready.Sub(killed).Round(time.Millisecond))
	wantNoWrites := func(when string) {
		t.Helper()
		writes := kernelWrites(t, tel)
		for _, kind := range []string{"Route", "Network", "Endpoint"} {
			if _, ok := writes[fmt.Sprintf("kind=%q", kind)]; !ok {
				t.Errorf("%s: the restarted agent serves no naples_hal_kernel_writes_total for %s: %v", when, kind, writes)
			}
		}
		for kind, v := range writes {
			if v != 0 {
				t.Errorf("%s: the restarted agent made %v kernel writes for %s; want none", when, v, kind)
			}
		}
	}
	wantNoWrites("once ready")

	// Traffic goes on after the restart.
	marks := []int{streams[0].next(), streams[1].next()}
	waitFor(t, "both streams to flow after the restart", func() bool {
		return streams[0].echoedSince(marks[0]) >= 500 && streams[1].echoedSince(marks[1]) >= 500
	})
	for _, s := range streams {
		sent, missing, writeErrs := s.finish()
		t.Logf("stream %s: %d datagrams sent, %d missing, %d sends refused", s.name, sent, len(missing), writeErrs)
		if len(missing) > 0 {
			t.Errorf("stream %s lost %d of %d datagrams (%d sends refused); sent relative to the kill: %s",
				s.name, len(missing), sent, writeErrs, s.gaps(missing, killed))
		}
	}
	blueA.wantReach(t, blueB.ip(4))
	greenA.wantReach(t, blueB.ip(4))
	blueB.wantReach(t, blueA.ip(6))

	wantNoWrites("after the traffic")
	if after := reader.mustState(t); !slices.Equal(after, before) {
		t.Errorf("host-a's kernel state changed across the restart (- before, + after):\n%s", stateDiff(before, after))
	}

	// The restarted agent is at work: a change is programmed with one write.
	routeWrites := kernelWrites(t, tel)[`kind="Route"`]
	c.apply(t, "kind: Route\nmeta: {name: r-dc2}\nspec: {table: 100, prefix: 198.51.100.0/24, nexthops: [{gateway: 10.20.0.2}]}\n")
	c.waitProgrammed(t, "route", "r-dc2", "host-a", 2)
	if got := a.routes(t, 100); !strings.Contains(got, "198.51.100.0/24 via 10.20.0.2") {
		t.Errorf("host-a's table 100 after changing r-dc2:\n%s", got)
	}
	if w := kernelWrites(t, tel)[`kind="Route"`] - routeWrites; w != 1 {
		t.Errorf("the restarted agent counted %v route writes for one changed route; want 1", w)
	}
}
