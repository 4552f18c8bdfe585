package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/naplesnet/naples/internal/testns"
)

// This file sends the firewall tests' traffic: echo servers in the workloads, probes of
// one connection's first packet (TCP, UDP, ICMP echo) from a workload to an address, and
// truth tables run concurrently against them.
//
// A packet the firewall drops is never answered, so a denied probe ends at its deadline;
// anything the peer answers, a TCP reset or an ICMP port unreachable included, was
// delivered.

// fwKind is what a probe sends: a protocol over one IP family, to a destination port.
type fwKind struct {
	// proto is "tcp", "udp" or "icmp".
	proto string
	// family is 4 or 6.
	family int
	// port is the destination port of tcp and udp; 0 for icmp.
	port uint16
}

// String returns the kind as tables write it: "tcp/80", "udp6/53", "icmp", "icmp6".
func (k fwKind) String() string {
	s := k.proto
	if k.family == 6 {
		s += "6"
	}
	if k.proto != "icmp" {
		s += "/" + strconv.Itoa(int(k.port))
	}
	return s
}

// parseFWKind parses what String returns.
func parseFWKind(s string) (fwKind, error) {
	name, port, hasPort := strings.Cut(s, "/")
	k := fwKind{family: 4}
	if base, ok := strings.CutSuffix(name, "6"); ok {
		name, k.family = base, 6
	}
	k.proto = name
	switch name {
	case "tcp", "udp":
		p, err := strconv.ParseUint(port, 10, 16)
		if !hasPort || err != nil || p == 0 {
			return fwKind{}, fmt.Errorf("probe kind %q: want %s/PORT with PORT 1-65535", s, name)
		}
		k.port = uint16(p)
	case "icmp":
		if hasPort {
			return fwKind{}, fmt.Errorf("probe kind %q: icmp has no port", s)
		}
	default:
		return fwKind{}, fmt.Errorf("probe kind %q: want tcp, udp or icmp, with 6 for IPv6", s)
	}
	return k, nil
}

// mustFWKinds parses kinds, panicking on a malformed one: they are the tests' constants.
func mustFWKinds(names ...string) []fwKind {
	var out []fwKind
	for _, n := range names {
		k, err := parseFWKind(n)
		if err != nil {
			panic(err)
		}
		out = append(out, k)
	}
	return out
}

// fwOutcome is what became of a probe.
type fwOutcome int

const (
	// fwPassed: the peer answered, so the first packet was delivered.
	fwPassed fwOutcome = iota
	// fwDropped: no answer before the deadline, as when the firewall drops the packet.
	fwDropped
	// fwFailed: anything else, such as no route or a handshake without an echo; never
	// what a table expects.
	fwFailed
)

// fwResult is the outcome of one probe.
type fwResult struct {
	outcome fwOutcome
	// err says what went wrong for fwFailed, and what ended a fwDropped probe.
	err error
	// refused is set when the peer answered with a TCP reset or an ICMP port unreachable:
	// delivered, but no server listened.
	refused bool
}

// String returns "pass", "drop" or "error (...)", saying when a pass was a refusal.
func (r fwResult) String() string {
	switch r.outcome {
	case fwPassed:
		if r.refused {
			return "pass (refused: no server on the port)"
		}
		return "pass"
	case fwDropped:
		return "drop"
	default:
		return fmt.Sprintf("error (%v)", r.err)
	}
}

// fwWorkload is a workload the firewall tests send from and to: its namespace is kept
// open so that probes enter it without opening it each time.
type fwWorkload struct {
	*workload
	handle netns.NsHandle
}

// newFWWorkload wraps the workload and opens its namespace until the test ends.
func newFWWorkload(t testing.TB, w *workload) *fwWorkload {
	t.Helper()
	return &fwWorkload{workload: w, handle: testns.Handle(t, w.ns)}
}

// addr returns the workload's address of the family.
func (w *fwWorkload) addr(family int) netip.Addr { return netip.MustParseAddr(w.ip(family)) }

// serveFW starts TCP and UDP echo servers in the workload on every port given, IPv4 and
// IPv6, stopped when the test ends. A TCP server echoes what it reads until the client
// closes; a UDP server echoes every datagram to its sender.
func (w *fwWorkload) serveFW(t testing.TB, tcpPorts, udpPorts []uint16) {
	t.Helper()
	var listeners []net.Listener
	var conns []net.PacketConn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		for _, l := range listeners {
			l.Close()
		}
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	})
	if err := inNamespace(w.handle, func() error {
		for _, p := range tcpPorts {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			listeners = append(listeners, l)
		}
		for _, p := range udpPorts {
			c, err := net.ListenPacket("udp", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		return nil
	}); err != nil {
		t.Fatalf("echo servers in %s: %v", w.name, err)
	}
	for _, l := range listeners {
		wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				wg.Go(func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(5 * time.Second))
					io.Copy(c, c)
				})
			}
		})
	}
	for _, c := range conns {
		wg.Go(func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					return
				}
				c.WriteTo(buf[:n], from)
			}
		})
	}
}

// probe opens one connection of the kind from the workload to dst and says whether its
// first packet was delivered, waiting at most timeout for an answer.
func (w *fwWorkload) probe(dst netip.Addr, k fwKind, timeout time.Duration) fwResult {
	msg := fmt.Appendf(nil, "naples fw probe %s from %s to %v %d", k, w.name, dst, rand.Uint64())
	switch k.proto {
	case "tcp":
		return w.probeTCP(netip.AddrPortFrom(dst, k.port), msg, timeout)
	case "udp":
		return w.probeUDP(netip.AddrPortFrom(dst, k.port), msg, timeout)
	default:
		return w.probeICMP(dst, msg, timeout)
	}
}

// probeTCP connects to dst and sends msg: passed once the handshake completes and the
// echo comes back, dropped when the handshake does not complete within timeout.
func (w *fwWorkload) probeTCP(dst netip.AddrPort, msg []byte, timeout time.Duration) fwResult {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := dialIn(ctx, w.handle, "tcp", dst.String())
	if err != nil {
		return classify(err)
	}
	defer c.Close()
	// The handshake completed: the SYN was delivered. The echo proves the rest of the
	// connection flows too; it gets a deadline of its own.
	c.SetDeadline(time.Now().Add(timeout + time.Second))
	if _, err := c.Write(msg); err != nil {
		return fwResult{outcome: fwFailed, err: fmt.Errorf("handshake completed, then writing: %w", err)}
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return fwResult{outcome: fwFailed, err: fmt.Errorf("handshake completed, then no echo: %w", err)}
	}
	if !bytes.Equal(got, msg) {
		return fwResult{outcome: fwFailed, err: fmt.Errorf("echo %q, want %q", got, msg)}
	}
	return fwResult{outcome: fwPassed}
}

// probeUDP sends msg to dst from a new socket: passed when the echo comes back within
// timeout, dropped otherwise.
func (w *fwWorkload) probeUDP(dst netip.AddrPort, msg []byte, timeout time.Duration) fwResult {
	c, err := dialIn(context.Background(), w.handle, "udp", dst.String())
	if err != nil {
		return fwResult{outcome: fwFailed, err: err}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(msg); err != nil {
		return classify(err)
	}
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return classify(err)
		}
		if bytes.Equal(buf[:n], msg) {
			return fwResult{outcome: fwPassed}
		}
	}
}

// icmpID numbers the echo requests of ICMP probes, so that each is a connection of its
// own and its reply is told apart from the others'.
var icmpID atomic.Uint32

// init starts icmpID at random, so that probes of concurrent test processes differ.
func init() { icmpID.Store(rand.Uint32()) }

// probeICMP sends an echo request (ICMPv4 or ICMPv6, after dst's family) from the
// workload's address of that family, on a raw socket in its namespace: passed when the
// echo reply comes back within timeout, dropped otherwise.
func (w *fwWorkload) probeICMP(dst netip.Addr, payload []byte, timeout time.Duration) fwResult {
	network, request, reply := "ip4:icmp", byte(8), byte(0)
	src := w.addr(4)
	if dst.Is6() {
		network, request, reply = "ip6:ipv6-icmp", 128, 129
		src = w.addr(6)
	}
	var c net.PacketConn
	if err := inNamespace(w.handle, func() error {
		var err error
		c, err = net.ListenPacket(network, src.String())
		return err
	}); err != nil {
		return fwResult{outcome: fwFailed, err: fmt.Errorf("raw ICMP socket: %w", err)}
	}
	defer c.Close()
	id, seq := uint16(icmpID.Add(1)), uint16(1)
	msg := []byte{request, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq)}
	msg = append(msg, payload...)
	if dst.Is4() {
		// The kernel computes ICMPv6 checksums itself; ICMPv4's is ours.
		binary.BigEndian.PutUint16(msg[2:], internetChecksum(msg))
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return classify(err)
	}
	buf := make([]byte, 1500)
	for {
		// The socket sees every ICMP message the namespace receives: keep the reply to
		// this request.
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return classify(err)
		}
		m := buf[:n]
		fromAddr, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if len(m) >= 8 && m[0] == reply && binary.BigEndian.Uint16(m[4:]) == id &&
			fromAddr.Unmap() == dst && bytes.Equal(m[8:], payload) {
			return fwResult{outcome: fwPassed}
		}
	}
}

// internetChecksum is the checksum of RFC 1071.
func internetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// classify turns a probe's socket error into its result: a deadline is a drop, a
// refusal a delivery, anything else a failure.
func classify(err error) fwResult {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fwResult{outcome: fwPassed, refused: true, err: err}
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fwResult{outcome: fwDropped, err: err}
	default:
		return fwResult{outcome: fwFailed, err: err}
	}
}

// fwCase is one row of a truth table: a probe and whether it must pass.
type fwCase struct {
	src, dst string
	kind     fwKind
	want     bool
	// why is what the reference says of the case, for the line of a mismatch; it may be
	// empty.
	why string
}

// String returns the case as "web1 → db1 tcp/5432".
func (c fwCase) String() string { return fmt.Sprintf("%s → %s %s", c.src, c.dst, c.kind) }

// fwProbeTimeout is how long a probe waits for an answer the first time: what a
// dropped packet costs. Probes that should pass and did not are tried again with
// fwRetryTimeout, up to fwRetries times, so that a slow answer on a loaded machine is not
// taken for a drop.
const (
	fwProbeTimeout = 300 * time.Millisecond
	fwRetryTimeout = time.Second
	fwRetries      = 2
)

// fwParallel is how many probes run at once; a TCP probe holds an OS thread in the
// workload's namespace while it connects.
const fwParallel = 96

// fwTable runs truth tables between a set of workloads.
type fwTable struct {
	workloads map[string]*fwWorkload
}

// newFWTable returns the runner of tables between the workloads.
func newFWTable(ws ...*fwWorkload) *fwTable {
	tb := &fwTable{workloads: map[string]*fwWorkload{}}
	for _, w := range ws {
		tb.workloads[w.name] = w
	}
	return tb
}

// run probes every case of the table named what, all at once (fwParallel at a time),
// and returns the cases whose outcome differs from what they want, as readable lines
// ("web1 → db1 tcp/5432: want pass, got drop"), sorted.
//
// A case that wants pass and got anything else is probed again, up to fwRetries times,
// with a longer timeout. With settle > 0 every mismatch is probed again until it matches
// or settle has passed since run began: for changes whose effect no status reports.
func (tb *fwTable) run(t testing.TB, what string, cases []fwCase, settle time.Duration) []string {
	t.Helper()
	began := time.Now()
	results := tb.probeAll(t, cases, fwProbeTimeout)
	retried := map[int]int{}
	for {
		var again []int
		for i, c := range cases {
			if matches(c, results[i]) {
				continue
			}
			if (c.want && retried[i] < fwRetries) || time.Since(began) < settle {
				again = append(again, i)
			}
		}
		if len(again) == 0 {
			break
		}
		if settle > 0 {
			time.Sleep(50 * time.Millisecond)
		}
		sub := make([]fwCase, len(again))
		for j, i := range again {
			sub[j] = cases[i]
			retried[i]++
		}
		for j, r := range tb.probeAll(t, sub, fwRetryTimeout) {
			results[again[j]] = r
		}
	}
	var mismatches []string
	late := 0
	for i, c := range cases {
		r := results[i]
		if r.refused {
			t.Logf("%v: %v", c, r)
		}
		if !matches(c, r) {
			want := "drop"
			if c.want {
				want = "pass"
			}
			line := fmt.Sprintf("%v: want %s, got %v", c, want, r)
			if c.why != "" {
				line += "; reference: " + c.why
			}
			mismatches = append(mismatches, line)
		} else if retried[i] > 0 {
			late++
		}
	}
	slices.Sort(mismatches)
	t.Logf("%s: %d probes in %v: %d mismatched, %d matched only when probed again", what, len(cases),
		time.Since(began).Round(time.Millisecond), len(mismatches), late)
	return mismatches
}

// matches reports whether the result is what the case wants.
func matches(c fwCase, r fwResult) bool {
	if c.want {
		return r.outcome == fwPassed
	}
	return r.outcome == fwDropped
}

// probeAll runs the probes of the cases concurrently and returns their results in order.
func (tb *fwTable) probeAll(t testing.TB, cases []fwCase, timeout time.Duration) []fwResult {
	t.Helper()
	results := make([]fwResult, len(cases))
	sem := make(chan struct{}, fwParallel)
	var wg sync.WaitGroup
	for i, c := range cases {
		src, dst := tb.workloads[c.src], tb.workloads[c.dst]
		if src == nil || dst == nil {
			t.Fatalf("case %v: no workload named %q or %q", c, c.src, c.dst)
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			results[i] = src.probe(dst.addr(c.kind.family), c.kind, timeout)
		})
	}
	wg.Wait()
	return results
}

// wantTable runs the table and fails the test with every mismatch.
func (tb *fwTable) wantTable(t testing.TB, what string, cases []fwCase, settle time.Duration) {
	t.Helper()
	if bad := tb.run(t, what, cases, settle); len(bad) > 0 {
		t.Errorf("%s: %d of %d probes differ from the table:\n%s", what, len(bad), len(cases), strings.Join(bad, "\n"))
	}
}

// fwAddrOf returns the address of the family (4 or 6) of the workload with the name.
type fwAddrOf func(name string, family int) netip.Addr

// addrOf is the fwAddrOf of the table's workloads.
func (tb *fwTable) addrOf(name string, family int) netip.Addr {
	return tb.workloads[name].addr(family)
}

// names returns the names of the table's workloads, sorted.
func (tb *fwTable) names() []string {
	names := make([]string, 0, len(tb.workloads))
	for n := range tb.workloads {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// referenceCases returns the cases of every ordered pair of distinct names and every
// kind, wanting what the reference says of each.
func referenceCases(ref *fwReference, names []string, addrOf fwAddrOf, kinds []fwKind) []fwCase {
	var cases []fwCase
	for _, k := range kinds {
		for _, s := range names {
			for _, d := range names {
				if s == d {
					continue
				}
				want, why := ref.delivered(fwPacket{src: addrOf(s, k.family), dst: addrOf(d, k.family), proto: k.proto, port: k.port})
				cases = append(cases, fwCase{src: s, dst: d, kind: k, want: want, why: why})
			}
		}
	}
	return cases
}

// parseHandTable parses a truth table written by hand: per probe kind, a matrix whose
// header line names the destinations and whose every other line names a source and
// gives, per destination, ✓ (delivered), ✗ (dropped) or - (the source itself, not
// probed). Every name must be one of names, on every line and in every column.
func parseHandTable(names []string, table []fwHandKind) ([]fwCase, error) {
	var cases []fwCase
	for _, hk := range table {
		k, err := parseFWKind(hk.kind)
		if err != nil {
			return nil, err
		}
		var lines [][]string
		for l := range strings.Lines(hk.matrix) {
			if f := strings.Fields(l); len(f) > 0 {
				lines = append(lines, f)
			}
		}
		if len(lines) == 0 {
			return nil, fmt.Errorf("%s: empty matrix", hk.kind)
		}
		header := lines[0]
		if !sameNames(header, names) {
			return nil, fmt.Errorf("%s: header %v, want each of %v once", hk.kind, header, names)
		}
		var rows []string
		for _, row := range lines[1:] {
			if len(row) != len(header)+1 {
				return nil, fmt.Errorf("%s: row %v has %d cells, want %d", hk.kind, row, len(row)-1, len(header))
			}
			src := row[0]
			rows = append(rows, src)
			for j, cell := range row[1:] {
				dst := header[j]
				switch {
				case src == dst && cell == "-":
				case src == dst:
					return nil, fmt.Errorf("%s: %s → %s is %q, want -", hk.kind, src, dst, cell)
				case cell == "✓" || cell == "✗":
					cases = append(cases, fwCase{src: src, dst: dst, kind: k, want: cell == "✓"})
				default:
					return nil, fmt.Errorf("%s: %s → %s is %q, want ✓ or ✗", hk.kind, src, dst, cell)
				}
			}
		}
		if !sameNames(rows, names) {
			return nil, fmt.Errorf("%s: rows %v, want each of %v once", hk.kind, rows, names)
		}
	}
	return cases, nil
}

// fwHandKind is one probe kind's matrix of a hand-written truth table.
type fwHandKind struct {
	kind   string
	matrix string
}

// sameNames reports whether got holds each of want exactly once.
func sameNames(got, want []string) bool {
	a, b := slices.Clone(got), slices.Clone(want)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// compareWithReference returns, as readable lines, the cases whose want differs from
// what the reference says.
func compareWithReference(ref *fwReference, addrOf fwAddrOf, cases []fwCase) []string {
	var out []string
	for _, c := range cases {
		k := c.kind
		got, why := ref.delivered(fwPacket{src: addrOf(c.src, k.family), dst: addrOf(c.dst, k.family), proto: k.proto, port: k.port})
		if got != c.want {
			out = append(out, fmt.Sprintf("%v: the hand table says %s, the reference %s (%s)", c, passDrop(c.want), passDrop(got), why))
		}
	}
	return out
}

// withReasons returns the cases with what the reference says of each as their why; their
// want is kept.
func withReasons(ref *fwReference, addrOf fwAddrOf, cases []fwCase) []fwCase {
	out := slices.Clone(cases)
	for i, c := range out {
		k := c.kind
		_, out[i].why = ref.delivered(fwPacket{src: addrOf(c.src, k.family), dst: addrOf(c.dst, k.family), proto: k.proto, port: k.port})
	}
	return out
}

// passDrop returns "pass" or "drop".
func passDrop(delivered bool) string {
	if delivered {
		return "pass"
	}
	return "drop"
}
