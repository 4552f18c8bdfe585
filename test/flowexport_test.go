package test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/ipfix"
	"github.com/naplesnet/naples/internal/ipfix/ipfixtest"
	"github.com/naplesnet/naples/internal/testns"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// listenCollector starts an IPFIX collector, goflow2's decoder on a UDP socket, on the
// loopback of the host's namespace, where its agent exports to.
func listenCollector(t *testing.T, h *host, addr string) *ipfixtest.Collector {
	t.Helper()
	var c *ipfixtest.Collector
	if err := inNamespace(testns.Handle(t, h.ns), func() (err error) {
		c, err = ipfixtest.Listen(addr)
		return err
	}); err != nil {
		t.Fatalf("starting a collector in %s: %v", h.name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// flowExportManifest is the YAML of a FlowExportPolicy of host-b exporting db2's flows
// to the targets.
func flowExportManifest(name string, targets ...string) string {
	return fmt.Sprintf(`kind: FlowExportPolicy
meta:
  name: %s
  nodes: [host-b]
spec:
  endpoints: [db2]
  targets: ["%s"]
  interval: 60s
  templateInterval: 5s
`, name, strings.Join(targets, `", "`))
}

// exportStatus returns host-b's status of the FlowExportPolicy.
func exportStatus(t *testing.T, c *cluster, name string) *nimbusv1.NodeStatus {
	t.Helper()
	_, st, err := c.get(t, "FlowExportPolicy", name)
	if err != nil {
		t.Fatalf("get FlowExportPolicy %s: %v", name, err)
	}
	return nodeStatus(st, "host-b")
}

// TestFlowExportIPFIX makes real TCP connections, IPv4 and IPv6, from web1 on host-a
// to db2 on host-b and checks that a collector in host-b's namespace, decoding with
// goflow2, receives one IPFIX record a direction of every connection that ended, with
// the 5-tuple, times, end reason, rule, names and counts of host-b's own flow records,
// the counts exactly the packets and IP bytes a capture in web1's namespace saw each way;
// that a target that refuses fails its own policy's status, naming the refusal, and
// nothing else; and that the status clears once a collector returns, which gets the
// templates again and the records of what came after.
func TestFlowExportIPFIX(t *testing.T) {
	sc := clientServerCluster(t, "9")
	c := sc.c
	hb := sc.host("host-b")
	coll := listenCollector(t, hb, "127.0.0.1:0")
	c.apply(t, flowExportManifest("to-collector", coll.Addr().String()))
	c.waitProgrammed(t, "FlowExportPolicy", "to-collector", "host-b", 1)
	waitFor(t, "the templates at the collector", func() bool {
		msgs, _ := coll.Messages()
		return len(msgs) > 0 && msgs[0].Templates == 2
	})

	web1, db2 := sc.workload("web1"), sc.workload("db2")
	// What the workload sent and received, counted from the wire.
	capture := newCapture(t, web1.ns)
	// connect makes n connections, every third over IPv6, and returns their source ports.
	connect := func(n int) map[uint16]bool {
		ports := map[uint16]bool{}
		for i := range n {
			family := 4
			if i%3 == 2 {
				family = 6
			}
			conn := web1.dial(t, "tcp", netip.AddrPortFrom(db2.addr(family), 7))
			if err := conn.exchange(fwFlowWait); err != nil {
				t.Fatalf("%s: %v", conn.name, err)
			}
			ports[netip.MustParseAddrPort(conn.c.LocalAddr().String()).Port()] = true
			conn.c.Close()
		}
		return ports
	}
	const conns = 5
	ports := connect(conns)
	recordsOf := func(coll *ipfixtest.Collector, ports map[uint16]bool) map[uint16][]ipfix.Record {
		byPort := map[uint16][]ipfix.Record{}
		for _, r := range coll.Records() {
			if p := r.SourcePort; ports[p] {
				byPort[p] = append(byPort[p], r)
			} else if p := r.DestinationPort; ports[p] {
				byPort[p] = append(byPort[p], r)
			}
		}
		return byPort
	}
	// complete tells whether the collector has both directions of every connection.
	complete := func(coll *ipfixtest.Collector, ports map[uint16]bool) bool {
		got := recordsOf(coll, ports)
		for p := range ports {
			if len(got[p]) < 2 {
				return false
			}
		}
		return true
	}
	waitFor(t, fmt.Sprintf("both directions of %d connections at the collector", conns), func() bool { return complete(coll, ports) })

	// host-b's own records of the connections' ends say what the collector must have.
	ended := map[uint16]*delphiv1.Flow{}
	for _, f := range sc.hostFlows(t, "host-b", "--to", "db2") {
		if f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_ENDED && ports[uint16(f.GetSourcePort())] {
			ended[uint16(f.GetSourcePort())] = f
		}
	}
	for p, recs := range recordsOf(coll, ports) {
		f := ended[p]
		if f == nil {
			t.Errorf("port %d: exported, but host-b shows no end of the connection", p)
			continue
		}
		if len(recs) != 2 {
			t.Errorf("port %d: %d records, want one a direction: %+v", p, len(recs), recs)
			continue
		}
		init, resp := recs[0], recs[1]
		if init.SourcePort != p {
			init, resp = resp, init
		}
		t.Logf("port %d: initiator %d packets %d bytes, responder %d packets %d bytes", p, init.Packets, init.Octets, resp.Packets, resp.Octets)
		w, d := netip.MustParseAddr(f.GetSource()), netip.MustParseAddr(f.GetDestination())
		family := 4
		if w.Is6() {
			family = 6
		}
		if w != web1.addr(family) || d != db2.addr(family) {
			t.Errorf("port %d: host-b's record is of %v > %v, not web1 > db2", p, w, d)
		}
		for _, c := range []struct {
			what string
			got  ipfix.Record
			src  netip.AddrPort
			dst  netip.AddrPort
			pkts uint64
			oct  uint64
		}{
			{"initiator", init, netip.AddrPortFrom(w, p), netip.AddrPortFrom(d, 7), f.GetInitiatorPackets(), f.GetInitiatorBytes()},
			{"responder", resp, netip.AddrPortFrom(d, 7), netip.AddrPortFrom(w, p), f.GetResponderPackets(), f.GetResponderBytes()},
		} {
			r := c.got
			if got := netip.AddrPortFrom(r.Source, r.SourcePort); got != c.src || netip.AddrPortFrom(r.Destination, r.DestinationPort) != c.dst || r.Protocol != 6 {
				t.Errorf("port %d %s: %v > %v protocol %d, want %v > %v tcp", p, c.what, got, netip.AddrPortFrom(r.Destination, r.DestinationPort), r.Protocol, c.src, c.dst)
			}
			if r.EndReason != ipfix.EndOfFlow || r.Verdict != ipfix.VerdictAllowed {
				t.Errorf("port %d %s: end reason %d, verdict %d; want %d (end of flow: %s), %d (allowed)", p, c.what, r.EndReason, r.Verdict, ipfix.EndOfFlow, f.GetReason(), ipfix.VerdictAllowed)
			}
			if r.Rule != f.GetRule() || r.RuleName != f.GetRuleName() || r.Rule == 0 ||
				r.Policy != "default/default/servers" || r.Endpoint != "default/default/db2" {
				t.Errorf("port %d %s: rule %d %q of %q at %q; want %d %q of default/default/servers at default/default/db2",
					p, c.what, r.Rule, r.RuleName, r.Policy, r.Endpoint, f.GetRule(), f.GetRuleName())
			}
			if r.Start.UnixMilli() != f.GetStartTime().AsTime().UnixMilli() || r.End.UnixMilli() != f.GetTime().AsTime().UnixMilli() {
				t.Errorf("port %d %s: from %v to %v, want %v to %v", p, c.what, r.Start, r.End, f.GetStartTime().AsTime(), f.GetTime().AsTime())
			}
			// The connection's counts are exported as the datapath has them, exactly, and
			// those are what crossed the wire.
			if r.Packets != c.pkts || r.Octets != c.oct {
				t.Errorf("port %d %s: %d packets %d bytes, want host-b's %d and %d", p, c.what, r.Packets, r.Octets, c.pkts, c.oct)
			}
			wire := countTuple(capture.packets(t, 0), c.src, c.dst)
			if wire.largest > 1514 {
				t.Errorf("port %d: the capture saw a frame of %d bytes: a GSO packet, which the test cannot count", p, wire.largest)
			}
			if r.Packets != wire.packets[0] || r.Octets != wire.bytes[0] {
				t.Errorf("port %d %s: %d packets %d bytes exported, the capture in web1's namespace saw %d and %d",
					p, c.what, r.Packets, r.Octets, wire.packets[0], wire.bytes[0])
			}
		}
	}
	if _, errs := coll.Messages(); len(errs) > 0 {
		t.Errorf("goflow2 could not decode: %v", errs)
	}
	// The status shows the counts at its next refresh (every 10s).
	var op *nimbusv1.FlowExportOperational
	waitFor(t, fmt.Sprintf("the status to count %d records sent", 2*conns), func() bool {
		op = exportStatus(t, c, "to-collector").GetOperationalData().GetFlowExport()
		return op.GetTargets()[0].GetRecordsSent() >= 2*conns
	})
	if ts := op.GetTargets(); len(ts) != 1 || ts[0].GetErrors() != 0 || ts[0].GetLastError() != "" {
		t.Errorf("status operational data %v; want no error", op)
	}
	tel := hb.telemetry(t)
	series := fmt.Sprintf(`naples_agent_flow_export_records_total{policy="default/default/to-collector",target=%q}`, coll.Addr().String())
	if n := tel.metrics(t)[series]; n < 2*conns {
		t.Errorf("%s = %v, want %d at least", series, n, 2*conns)
	}

	// A policy whose target refuses is FAILED, naming the target and the refusal; the
	// first one exports on.
	refused := "127.0.0.1:1"
	c.apply(t, flowExportManifest("refused", refused))
	var st *nimbusv1.NodeStatus
	waitFor(t, "the refusing target's policy FAILED", func() bool {
		st = exportStatus(t, c, "refused")
		return st.GetPhase() == nimbusv1.Phase_PHASE_FAILED
	})
	if st.GetReason() != "ExportFailed" || !strings.Contains(st.GetMessage(), fmt.Sprintf("target %q", refused)) || !strings.Contains(st.GetMessage(), "connection refused") {
		t.Errorf("status %s: %s; want ExportFailed naming the target and the refusal", st.GetReason(), st.GetMessage())
	}
	if st := exportStatus(t, c, "to-collector"); st.GetPhase() != nimbusv1.Phase_PHASE_PROGRAMMED {
		t.Errorf("the first policy is %v (%s) beside a failing one", st.GetPhase(), st.GetMessage())
	}

	// The collector goes: its policy fails. It comes back: the status clears, and the
	// connections after get there with the templates sent again.
	addr := coll.Addr().String()
	coll.Close()
	connect(1)
	waitFor(t, "the policy FAILED while its collector is gone", func() bool {
		return exportStatus(t, c, "to-collector").GetPhase() == nimbusv1.Phase_PHASE_FAILED
	})
	back := listenCollector(t, hb, addr)
	waitFor(t, "the policy PROGRAMMED once the collector is back", func() bool {
		return exportStatus(t, c, "to-collector").GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED
	})
	after := connect(2)
	waitFor(t, "the connections after the return at the collector", func() bool { return complete(back, after) })
	if msgs, errs := back.Messages(); len(errs) > 0 || msgs[0].Templates != 2 {
		t.Errorf("the returned collector's first message has %d templates (%v); want the templates", msgs[0].Templates, errs)
	}

	// Absurd input is refused at apply, naming the field and the value.
	out, err := c.ctl(t, strings.Replace(flowExportManifest("absurd", "collector:4739"), "interval: 60s", "interval: 31536000s", 1), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error()+out, `spec.interval "8760h0m0s": must be between 1s and 1h0m0s`) {
		t.Errorf("applying an interval of a year: %v %s; want a refusal naming spec.interval", err, out)
	}
	out, err = c.ctl(t, flowExportManifest("invalid", "collector"), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error()+out, `spec.targets[0] "collector": not "host:port"`) {
		t.Errorf("applying a target without a port: %v %s; want a refusal naming spec.targets[0]", err, out)
	}
	// describe shows the policy with its node's status.
	if out := c.mustCtl(t, "", "describe", "FlowExportPolicy", "refused"); !strings.Contains(out, "connection refused") {
		t.Errorf("describe FlowExportPolicy refused does not show the refusal:\n%s", out)
	}
}

// TestFlowExportActiveDeltas keeps a TCP connection from web1 to db2 busy for a few
// export intervals, with host-b's firewall writing ACTIVE records every 200 ms, and checks
// that the collector receives the connection while it lasts (records of end reason
// active timeout, at most one a direction per interval) and at its end, and that each
// direction's records add up, packet for packet and byte for byte, to what a capture in
// web1's namespace saw of the connection.
func TestFlowExportActiveDeltas(t *testing.T) {
	sc := clientServerCluster(t, "9", "--fw-flow-active-timeout", "200ms")
	coll := listenCollector(t, sc.host("host-b"), "127.0.0.1:0")
	sc.c.apply(t, strings.Replace(flowExportManifest("busy", coll.Addr().String()), "interval: 60s", "interval: 1s", 1))
	sc.c.waitProgrammed(t, "FlowExportPolicy", "busy", "host-b", 1)
	web1, db2 := sc.workload("web1"), sc.workload("db2")
	capture := newCapture(t, web1.ns)

	dst := netip.AddrPortFrom(db2.addr(4), 7)
	conn := web1.dial(t, "tcp", dst)
	src := netip.MustParseAddrPort(conn.c.LocalAddr().String())
	ofConn := func() (active, ended []ipfix.Record) {
		for _, r := range coll.Records() {
			if (r.SourcePort != src.Port() || r.Source != src.Addr()) && (r.DestinationPort != src.Port() || r.Destination != src.Addr()) {
				continue
			}
			if r.EndReason == ipfix.EndActiveTimeout {
				active = append(active, r)
			} else {
				ended = append(ended, r)
			}
		}
		return active, ended
	}
	// Exchanges until the collector has records of the connection while it lasts, from
	// two intervals at least.
	waitFor(t, "active-timeout records of the busy connection at the collector", func() bool {
		if err := conn.exchange(fwFlowWait); err != nil {
			t.Fatalf("%s: %v", conn.name, err)
		}
		active, _ := ofConn()
		return len(active) >= 4
	})
	conn.c.Close()
	var active, ended []ipfix.Record
	waitFor(t, "the busy connection's end at the collector", func() bool {
		active, ended = ofConn()
		return len(ended) == 2
	})

	wire := countTuple(capture.packets(t, 0), src, dst)
	var sums [2]struct{ packets, octets uint64 }
	for _, r := range append(active, ended...) {
		side := 0
		if r.Source != src.Addr() || r.SourcePort != src.Port() {
			side = 1
		}
		sums[side].packets += r.Packets
		sums[side].octets += r.Octets
	}
	t.Logf("%d active-timeout records and %d at the end; exported %+v, the capture saw %v packets and %v bytes",
		len(active), len(ended), sums, wire.packets, wire.bytes)
	for side, what := range []string{"from web1", "from db2"} {
		if sums[side].packets != wire.packets[side] || sums[side].octets != wire.bytes[side] {
			t.Errorf("%s: the records add up to %d packets and %d bytes, the capture saw %d and %d",
				what, sums[side].packets, sums[side].octets, wire.packets[side], wire.bytes[side])
		}
	}
	// At most one record a direction per interval (1 s) of the connection's life.
	life := ended[0].End.Sub(ended[0].Start)
	if n := len(active) / 2; n > int(life/time.Second)+1 {
		t.Errorf("%d active-timeout records a direction in the %v the connection lasted, want one a second at most", n, life)
	}
}
