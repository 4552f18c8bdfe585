package test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
)

// BenchmarkFlowsAgentCPU measures the CPU host-b's agent spends on flow records while its
// firewall starts 10,000 new flows a second (datagrams from web1 on host-a to db2, each to
// a destination port of its own, that the policy allows), for a few seconds, against the
// same agent over as long with no traffic, in the same run: flows-agent-cpu-% is the
// difference, in percent of one core. It checks that every flow was recorded or counted
// lost. db2's budget of records is off, so that the agent takes every one: with the
// default (--fw-flow-endpoint-rate, 5,000 a second on each CPU) some would be suppressed
// in the datapath and the agent would do less.
func BenchmarkFlowsAgentCPU(b *testing.B) {
	const rate, seconds, firstPort = 10000, 5, 10000
	sc := clientServerCluster(b, fmt.Sprintf("%d-%d", firstPort, firstPort+rate*seconds), "--fw-flow-endpoint-rate", "0")
	web1, db2 := sc.workload("web1"), sc.workload("db2")
	agent := sc.host("host-b").agent.cmd.Process.Pid
	tel := sc.host("host-b").telemetry(b)
	const lostSeries = "naples_agent_flow_records_lost_total"

	var sock net.PacketConn
	if err := inNamespace(web1.handle, func() (err error) {
		sock, err = net.ListenPacket("udp4", "0.0.0.0:0")
		return err
	}); err != nil {
		b.Fatal(err)
	}
	defer sock.Close()
	src := uint32(sock.LocalAddr().(*net.UDPAddr).Port)
	dst := db2.addr(4)

	for b.Loop() {
		// The floor: the agent with no traffic, for as long.
		idle0 := procCPU(b, agent)
		time.Sleep(seconds * time.Second)
		idle := procCPU(b, agent) - idle0

		// The flood: rate new flows a second, paced every millisecond.
		lost0 := tel.metrics(b)[lostSeries]
		busy0 := procCPU(b, agent)
		start := time.Now()
		for i := range rate * seconds {
			if i%(rate/1000) == 0 {
				time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
			}
			to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, uint16(firstPort+i)))
			if _, err := sock.WriteTo([]byte("a new flow"), to); err != nil {
				b.Fatalf("datagram %d: %v", i, err)
			}
		}
		sent := time.Since(start)
		// Until the agent took the last records: it looks every 50 ms.
		time.Sleep(200 * time.Millisecond)
		busy := procCPU(b, agent) - busy0
		window := sent + 200*time.Millisecond

		var shown int
		for _, f := range sc.hostFlows(b, "host-b", "--to", dst.String()) {
			if f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_STARTED && f.GetSourcePort() == src && f.GetDestinationPort() >= firstPort {
				shown++
			}
		}
		lost := tel.metrics(b)[lostSeries] - lost0
		if shown+int(lost) != rate*seconds {
			b.Fatalf("%d records shown and %v lost for %d new flows: want every one either", shown, lost, rate*seconds)
		}
		b.ReportMetric(lost, "records-lost")
		b.ReportMetric(float64(rate*seconds)/sent.Seconds(), "flows/s")
		b.ReportMetric(float64(shown), "records-shown")
		b.ReportMetric(100*(busy.Seconds()/window.Seconds()-idle.Seconds()/(seconds)), "flows-agent-cpu-%")
		b.ReportMetric(100*busy.Seconds()/window.Seconds(), "busy-agent-cpu-%")
		b.ReportMetric(100*idle.Seconds()/seconds, "idle-agent-cpu-%")
	}
}

// BenchmarkFlowsDatapathCost measures what flow records cost the traffic between two
// workloads (datapathCost): with both hosts' agents writing flow records and with both
// started again with --fw-flow-ring-bytes 0. conn-rate-x is the rate with records ÷
// without (goal ≥ 0.9), rr-p99-x the p99 with ÷ without (goal ≤ 1.1).
func BenchmarkFlowsDatapathCost(b *testing.B) {
	datapathCost(b, "flow records", []string{"--flows-ring", "65536"}, []string{"--fw-flow-ring-bytes", "0"})
}

// datapathCost measures what a feature of the firewall costs the traffic between two
// workloads: new TCP connections a second (web1 on host-a connects to db2's echo on
// host-b, exchanges a message and resets it, one connection after the other) and the p99
// of a request and its answer over one established connection, with both hosts' agents
// started with the flags on and with the flags off, in turn, twice each, in one run. It
// reports conn-rate-x, the rate on ÷ off, and rr-p99-x, the p99 on ÷ off.
func datapathCost(b *testing.B, feature string, on, off []string) {
	const phase = 3 * time.Second
	sc := clientServerCluster(b, "9")
	web1, db2 := sc.workload("web1"), sc.workload("db2")
	echo := netip.AddrPortFrom(db2.addr(4), 7)
	restart := func(enabled bool) {
		for _, name := range []string{"host-a", "host-b"} {
			h := sc.host(name)
			h.agent.stop(b)
			flags := on
			if !enabled {
				flags = off
			}
			h.startAgentWith(b, slices.Concat(flags, metricsFlags)...)
			h.telemetry(b).waitReady(b)
		}
	}
	// rate returns the connections a second made during phase.
	rate := func() float64 {
		n, start := 0, time.Now()
		for time.Since(start) < phase {
			c := web1.dial(b, "tcp", echo)
			if err := c.exchange(fwFlowWait); err != nil {
				b.Fatalf("connection %d: %v", n, err)
			}
			// Reset, not closed: tens of thousands of connections in TIME_WAIT would
			// slow every next connect down more than anything measured here.
			c.c.(*net.TCPConn).SetLinger(0)
			c.c.Close()
			n++
		}
		return float64(n) / time.Since(start).Seconds()
	}
	// rr returns the p99 of an exchange over one connection, during phase.
	rr := func() time.Duration {
		c := web1.dial(b, "tcp", echo)
		defer c.c.Close()
		var lat []time.Duration
		for start := time.Now(); time.Since(start) < phase; {
			t0 := time.Now()
			if err := c.exchange(fwFlowWait); err != nil {
				b.Fatalf("exchange %d: %v", len(lat), err)
			}
			lat = append(lat, time.Since(t0))
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100]
	}
	for b.Loop() {
		var rateOn, rateOff float64
		var rrOn, rrOff time.Duration
		for _, enabled := range []bool{true, false, true, false} {
			restart(enabled)
			r, p := rate(), rr()
			b.Logf("%s %v: %.0f connections/s, request-response p99 %v", feature, enabled, r, p)
			if enabled {
				rateOn, rrOn = rateOn+r/2, rrOn+p/2
			} else {
				rateOff, rrOff = rateOff+r/2, rrOff+p/2
			}
		}
		b.ReportMetric(rateOn, "conn/s-on")
		b.ReportMetric(rateOff, "conn/s-off")
		b.ReportMetric(rateOn/rateOff, "conn-rate-x")
		b.ReportMetric(float64(rrOn.Microseconds()), "rr-p99-µs-on")
		b.ReportMetric(float64(rrOff.Microseconds()), "rr-p99-µs-off")
		b.ReportMetric(float64(rrOn)/float64(rrOff), "rr-p99-x")
	}
}
