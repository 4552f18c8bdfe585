//go:build linux

package test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// This file restarts an agent whose firewall protects an endpoint under traffic: the
// pinned programs and maps enforce the policy while the agent is down, and the agent
// that comes back takes them over without a packet lost or let through.

// startStreamTo starts a stream like startStream's, from the workload to dst: a numbered
// datagram every millisecond, recording which ones come back. It stops with finish or
// when the test ends.
func startStreamTo(t *testing.T, from *fwWorkload, dst netip.AddrPort) *udpStream {
	t.Helper()
	s := &udpStream{name: fmt.Sprintf("%s to %v", from.name, dst), stop: make(chan struct{})}
	if err := inNamespace(from.handle, func() error {
		c, err := net.Dial("udp", dst.String())
		if err != nil {
			return err
		}
		s.conn = c.(*net.UDPConn)
		return forceRcvBuf(s.conn)
	}); err != nil {
		t.Fatalf("stream from %s to %v: %v", from.name, dst, err)
	}
	s.run(t)
	return s
}

// Series of the firewall's metrics that must not move across a restart.
const (
	fwUnknownInterfaceDrops = "naples_firewall_unknown_interface_drops_total"
	fwConntrackDenied       = "naples_firewall_conntrack_denied_total"
)

// TestFirewallRestart kills host-b's agent with SIGKILL while db2 (host-b) is protected by
// a policy whose ingress allows udp/9 and tcp/7 from web1's group and denies udp/10, and
// while two UDP streams, a datagram a millisecond each, run from web1 (host-a) to db2,
// one to udp/9 and one to udp/10, and messages are echoed over a TCP connection to tcp/7
// opened before the kill. The streams and the connection run on while the agent is down,
// and after it is started again and ready. Every datagram to udp/9 must come back, none
// to udp/10 may reach db2, every message over the connection must be echoed, and the
// firewall must neither drop a packet for want of a snapshot nor cut a connection. Then a
// policy change made through the restarted agent is enforced: udp/10 allowed, udp/9
// denied, the TCP connection still allowed.
func TestFirewallRestart(t *testing.T) {
	defs := fwDefs("web1", "db2")
	groups := map[string][]string{"web1": {"client"}, "db2": {"server"}}
	sc := newFWSmallCluster(t, fwSmallSpec{
		workloads:  defs,
		endpoints:  fwEndpointsOf(defs, groups),
		objs:       []*nimbusv1.Object{fwGroupObject("client"), fwGroupObject("server")},
		tcp:        []uint16{7},
		udp:        []uint16{9, 10},
		agentFlags: [][]string{nil, metricsFlags},
	})
	// The multicast reports allowed, the firewall cuts no connection but the test's.
	servers := func(allowUDP, denyUDP string) *nimbusv1.Object {
		return fwPolicyObject("servers", []string{"server"}, fwRules(
			allowIn("udp", fwPorts(allowUDP), "group:client"),
			denyIn("udp", fwPorts(denyUDP), "group:client"),
			allowIn("tcp", fwPorts("7"), "group:client"),
			allowMulticastReports()), nil)
	}
	sc.apply(t, servers("9", "10"))
	sc.waitProgrammed(t)
	sc.wantCases(t, "the policy",
		fwCaseOf("web1", "db2", "udp/9", true), fwCaseOf("web1", "db2", "udp/10", false), fwCaseOf("web1", "db2", "tcp/7", true))

	web1, db2, b := sc.workload("web1"), sc.workload("db2"), sc.host("host-b")
	tel := b.telemetry(t)
	// The probe above sent udp/10 datagrams; the streams' are counted from here.
	deniedBefore := sc.echo["db2"].received(10)
	conn := startFlow(t, web1.dial(t, "tcp", netip.AddrPortFrom(db2.addr(4), 7)), fwFlowWait)
	allowed := startStreamTo(t, web1, netip.AddrPortFrom(db2.addr(4), 9))
	denied := startStreamTo(t, web1, netip.AddrPortFrom(db2.addr(4), 10))
	began := time.Now()
	waitFor(t, "the allowed stream and the TCP connection to flow", func() bool {
		return allowed.echoedSince(0) >= 100 && conn.answeredSince(began) >= 50
	})
	before := tel.metrics(t)
	progsBefore := linkPrograms(t, b)

	b.agent.kill(t)
	killed := time.Now()
	down, deniedDown := allowed.next(), denied.next()
	waitFor(t, "the allowed stream and the TCP connection to flow while the agent is down", func() bool {
		return allowed.echoedSince(down) >= 200 && conn.answeredSince(killed) >= 50
	})
	b.startAgentWith(t, metricsFlags...)
	tel = b.telemetry(t)
	tel.waitReady(t)
	ready := time.Now()
	t.Logf("the agent was killed %v after the traffic began and ready %v after the kill",
		killed.Sub(began).Round(time.Millisecond), ready.Sub(killed).Round(time.Millisecond))
	// The restarted agent loaded its programs anew and put them on the pinned links in
	// place of the killed agent's, atomically: an upgrade goes the same way.
	progsAfter := linkPrograms(t, b)
	for link, id := range progsBefore {
		if after, ok := progsAfter[link]; !ok || after == id {
			t.Errorf("link %s runs program %d after the restart (before: %d); want the restarted agent's", link, after, id)
		}
	}
	mark, deniedReady := allowed.next(), denied.next()
	waitFor(t, "the allowed stream and the TCP connection to flow after the restart", func() bool {
		return allowed.echoedSince(mark) >= 500 && conn.answeredSince(ready) >= 50
	})

	conn.finish()
	if at, err := conn.failure(); !at.IsZero() {
		t.Errorf("%s: an exchange that began %v after the kill got no answer: %v", conn.conn.name, at.Sub(killed).Round(time.Millisecond), err)
	}
	t.Logf("%s: %d exchanges answered, %d of them while the agent was down", conn.conn.name,
		conn.answeredSince(began), conn.answeredSince(killed)-conn.answeredSince(ready))
	sent, missing, writeErrs := allowed.finish()
	t.Logf("stream %s: %d datagrams sent, %d missing, %d sends refused", allowed.name, sent, len(missing), writeErrs)
	if len(missing) > 0 {
		t.Errorf("stream %s lost %d of %d datagrams (%d sends refused); sent relative to the kill: %s",
			allowed.name, len(missing), sent, writeErrs, allowed.gaps(missing, killed))
	}
	denied.close()
	deniedSent, deniedEchoed := denied.next(), denied.echoedSince(0)
	delivered := sc.echo["db2"].received(10) - deniedBefore
	t.Logf("stream %s: %d datagrams sent, %d delivered, %d echoed", denied.name, deniedSent, delivered, deniedEchoed)
	if deniedDown == 0 || deniedReady <= deniedDown || deniedSent <= deniedReady {
		t.Errorf("stream %s sent %d datagrams before the kill, %d while the agent was down, %d after; want some each time",
			denied.name, deniedDown, deniedReady-deniedDown, deniedSent-deniedReady)
	}
	if delivered != 0 || deniedEchoed != 0 {
		t.Errorf("stream %s: %d datagrams reached db2 and %d came back; want none", denied.name, delivered, deniedEchoed)
	}
	after := tel.metrics(t)
	for _, series := range []string{fwUnknownInterfaceDrops, fwConntrackDenied} {
		if _, ok := after[series]; !ok {
			t.Errorf("the restarted agent serves no %s", series)
		} else if after[series] != before[series] {
			t.Errorf("%s went from %v before the kill to %v after the restart; want no change", series, before[series], after[series])
		}
	}

	// The restarted agent enforces a change.
	sc.apply(t, servers("10", "9"))
	sc.waitProgrammed(t)
	sc.wantCases(t, "the policy changed after the restart",
		fwCaseOf("web1", "db2", "udp/9", false), fwCaseOf("web1", "db2", "udp/10", true), fwCaseOf("web1", "db2", "tcp/7", true))
	if err := conn.conn.exchange(fwFlowWait); err != nil {
		t.Errorf("%s: still allowed after the change, but: %v", conn.conn.name, err)
	}

	// db2's egress link, which enforces its ingress policy, detached by hand (its pin
	// removed): the agent attaches the firewall again, and udp/9 is denied again.
	pins := unpinLinks(t, filepath.Join(b.bpf, "links", "*-egress"))
	waitFor(t, fmt.Sprintf("host-b's agent to attach the firewall again at %v", pins), func() bool {
		for _, pin := range pins {
			l, err := link.LoadPinnedLink(pin, nil)
			if err != nil {
				return false
			}
			info, err := l.Info()
			l.Close()
			if err != nil || info.TCX() == nil || info.TCX().Ifindex == 0 {
				return false
			}
		}
		return true
	})
	sc.wantCases(t, "the policy after db2's egress link was detached by hand",
		fwCaseOf("web1", "db2", "udp/9", false), fwCaseOf("web1", "db2", "udp/10", true))
}

// unpinLinks removes the pins of the tcx links that match the pattern, as someone
// detaching naples's programs by hand would, and waits until the kernel has freed the
// links (no process holds them). It returns the pins; there must be some.
func unpinLinks(t *testing.T, pattern string) []string {
	t.Helper()
	pins, err := filepath.Glob(pattern)
	if err != nil || len(pins) == 0 {
		t.Fatalf("pinned links %s: %v %v", pattern, pins, err)
	}
	var removed []link.ID
	for _, pin := range pins {
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			t.Fatal(err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		removed = append(removed, info.ID)
		if err := os.Remove(pin); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, fmt.Sprintf("the kernel to free the links %v whose pins were removed", removed), func() bool {
		for _, id := range removed {
			if l, err := link.NewFromID(id); err == nil {
				l.Close()
				return false
			}
		}
		return true
	})
	return pins
}

// linkPrograms returns the program each tcx link the host's agent pinned runs, by pin
// name; there must be some.
func linkPrograms(t *testing.T, h *host) map[string]ebpf.ProgramID {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(h.bpf, "links"))
	if err != nil {
		t.Fatalf("listing the pinned links: %v", err)
	}
	progs := map[string]ebpf.ProgramID{}
	for _, e := range ents {
		l, err := link.LoadPinnedLink(filepath.Join(h.bpf, "links", e.Name()), nil)
		if err != nil {
			t.Fatalf("opening pinned link %s: %v", e.Name(), err)
		}
		info, err := l.Info()
		l.Close()
		if err != nil {
			t.Fatalf("reading pinned link %s: %v", e.Name(), err)
		}
		progs[e.Name()] = info.Program
	}
	if len(progs) == 0 {
		t.Fatalf("the agent of %s pinned no links in %s", h.name, h.bpf)
	}
	return progs
}
