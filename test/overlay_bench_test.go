package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/naplesnet/naples/internal/testns"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The overlay benchmarks run the chain with networks and endpoints: nimbus, agents in
// host namespaces joined by an underlay, workloads in namespaces of their own.
//
//	go test -run '^$' -bench 'Overlay' -benchtime 1x ./test/

// BenchmarkOverlayEndpointLatency measures how soon a new endpoint carries traffic. Two
// hosts, each with its agent, share network lat (VNI 100, 10.1.0.0/24); a client workload
// on host-a is programmed, and so is a first workload on host-b, which the samples leave
// out (it brings host-a's replication to host-b). Then 100 times: a new workload (its own
// namespace, MAC and IP, an echo server on UDP port 7) is made on host-b, and its Endpoint
// applied at nimbus with one Apply; from just before the Apply, the client sends a UDP
// datagram to it every millisecond until one is echoed. That time is first-packet; the
// time until a WatchStatus stream shows the endpoint PROGRAMMED on both hosts is
// programmed.
//
// Two things are done beforehand, so that the figure is the overlay's and not a kernel
// timer's. The workload's host-side interface is set up, as a container runtime does, and
// the benchmark waits until the kernel reports it operationally up: the kernel passes
// carrier changes on at most once a second (linkwatch), and a bridge enables a port only
// once its interface is operationally up, so the first packet to an interface that the
// agent sets up may wait up to a second. And the client's neighbour entry for the new
// workload (`ip neigh replace IP lladdr MAC nud permanent` in the client) is made, as for
// a VM that resolved it earlier: an ARP request lost before the overlay is ready is
// retried after 1 s by default, never under 10 ms.
//
// The floor, measured after each sample, is what any path from Apply to a packet must
// take at least: one gRPC round trip to nimbus (a Get) plus one UDP echo between the two
// workloads over the programmed overlay.
//
// It reports p50 and p99 of first-packet, programmed and the floor, and first-packet's
// over the floor's.
func BenchmarkOverlayEndpointLatency(b *testing.B) {
	const samples = 100
	for range b.N {
		overlayEndpointLatency(b, samples)
	}
}

func overlayEndpointLatency(b *testing.B, samples int) {
	c := newCluster(b, quietFlags...)
	u := newUnderlay(b)
	ha := c.addHost(b, "host-a", "host-a")
	hb := c.addHost(b, "host-b", "host-b")
	vtepA, vtepB := u.attach(b, ha), u.attach(b, hb)
	ha.startAgentWith(b, quietFlags...)
	hb.startAgentWith(b, quietFlags...)
	api := c.publisherAPI(b)
	status := c.watchObjectStatuses(b, nimbusv1.Kind_KIND_ENDPOINT)

	client := newWorkload(b, ha, "wlat-client", "02:00:00:00:10:01", []string{"10.1.0.10/24"})
	warm := newWorkload(b, hb, "wlat-warm", "02:00:00:00:10:02", []string{"10.1.0.11/24"})
	warm.serve(b)
	c.apply(b, nodeYAML(ha, vtepA)+nodeYAML(hb, vtepB)+
		"kind: Network\nmeta: {name: lat}\nspec: {vni: 100, subnet: 10.1.0.0/24, gateway: 10.1.0.1}\n---\n"+
		client.endpointYAML("default", "lat", ha)+warm.endpointYAML("default", "lat", hb))
	status.waitAllProgrammed(b, client.name)
	status.waitAllProgrammed(b, warm.name)
	p := newProber(b, client)
	if _, err := p.firstEcho(warm.ip(4), time.Now(), deadline); err != nil {
		b.Fatalf("the client never reached the first workload on host-b: %v", err)
	}

	ctx := context.Background()
	var first, programmed, floor []time.Duration
	for i := range samples {
		w := newWorkload(b, hb, fmt.Sprintf("wlat%03d", i), fmt.Sprintf("02:00:00:00:11:%02x", i),
			[]string{fmt.Sprintf("10.1.0.%d/24", 100+i)})
		w.serve(b)
		testns.Run(b, "ip", "-n", client.ns, "neigh", "replace", w.ip(4), "lladdr", w.mac, "dev", "eth0", "nud", "permanent")
		testns.Run(b, "ip", "-n", hb.ns, "link", "set", w.name, "up")
		waitFor(b, w.name+" to be operationally up", func() bool {
			return strings.Contains(testns.Run(b, "ip", "-n", hb.ns, "-o", "link", "show", "dev", w.name), " state UP ")
		})
		obj := &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: w.name},
			Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
				Network: "lat", Node: hb.name, Interface: w.name, Mac: w.mac, Ips: []string{w.ip(4)},
			}},
		}

		type echo struct {
			d   time.Duration
			err error
		}
		echoed := make(chan echo, 1)
		start := time.Now()
		go func() {
			d, err := p.firstEcho(w.ip(4), start, deadline)
			echoed <- echo{d, err}
		}()
		if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj}); err != nil {
			b.Fatal(err)
		}
		status.waitAllProgrammed(b, w.name)
		programmed = append(programmed, time.Since(start))
		e := <-echoed
		if e.err != nil {
			b.Fatalf("no echo from %s: %v", w.name, e.err)
		}
		first = append(first, e.d)

		start = time.Now()
		if _, err := api.Get(ctx, &nimbusv1.GetRequest{Key: obj.Key()}); err != nil {
			b.Fatal(err)
		}
		if _, err := p.firstEcho(w.ip(4), start, deadline); err != nil {
			b.Fatalf("no echo from %s once programmed: %v", w.name, err)
		}
		floor = append(floor, time.Since(start))
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(percentile(first, 0.5)), "first-packet-p50-ms")
	b.ReportMetric(ms(percentile(first, 0.99)), "first-packet-p99-ms")
	b.ReportMetric(ms(percentile(programmed, 0.5)), "programmed-p50-ms")
	b.ReportMetric(ms(percentile(programmed, 0.99)), "programmed-p99-ms")
	b.ReportMetric(ms(percentile(floor, 0.5)), "floor-p50-ms")
	b.ReportMetric(ms(percentile(floor, 0.99)), "floor-p99-ms")
	b.ReportMetric(float64(percentile(first, 0.5))/float64(percentile(floor, 0.5)), "p50-x-floor")
	b.ReportMetric(float64(percentile(first, 0.99))/float64(percentile(floor, 0.99)), "p99-x-floor")
}

// percentile returns the q-quantile of the durations, the nearest rank below.
func percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// prober sends UDP datagrams from a workload to the echo servers of others.
type prober struct {
	conn net.PacketConn
	// seq numbers the probes, so an echo of an earlier one is told apart.
	seq uint64
}

// newProber opens the prober's socket in the workload's namespace; it is closed when the
// benchmark ends.
func newProber(t testing.TB, w *workload) *prober {
	t.Helper()
	p := &prober{}
	if err := inNetns(t, w.ns, func() error {
		var err error
		p.conn, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		t.Fatalf("probe socket in %s: %v", w.name, err)
	}
	t.Cleanup(func() { p.conn.Close() })
	return p
}

// firstEcho sends a datagram to port 7 of addr every millisecond until one comes back,
// and returns how long after start that was; it gives up at start+limit. A prober is used
// by one goroutine at a time.
func (p *prober) firstEcho(addr string, start time.Time, limit time.Duration) (time.Duration, error) {
	p.seq++
	msg := binary.BigEndian.AppendUint64([]byte("naples-probe-"), p.seq)
	dst := &net.UDPAddr{IP: net.ParseIP(addr), Port: 7}
	buf := make([]byte, 64)
	end := start.Add(limit)
	for time.Now().Before(end) {
		// A send the kernel refuses (no route yet, say) is tried again like a lost one.
		p.conn.WriteTo(msg, dst)
		if err := p.conn.SetReadDeadline(time.Now().Add(time.Millisecond)); err != nil {
			return 0, err
		}
		for {
			n, _, err := p.conn.ReadFrom(buf)
			if err != nil {
				break
			}
			if bytes.Equal(buf[:n], msg) {
				return time.Since(start), nil
			}
		}
	}
	return 0, fmt.Errorf("no echo from %s within %v", addr, limit)
}

// BenchmarkOverlayRestart measures an agent restarting on a host full of remote
// endpoints. host-a's agent programs network blue (VNI 100, 10.64.0.0/16) and 10,000
// endpoints on 16 other nodes (a Node object each, VTEPs 10.10.0.10 to 10.10.0.25): per
// endpoint two FDB entries on the VXLAN device and a permanent neighbour on the bridge.
// Then it is SIGKILLed and started again on its state directory, nimbus up. It reports
// the time until /readyz answers 200 and, once the HAL's queue is empty, the kernel
// writes of every kind since the restart (naples_hal_kernel_writes_total), and fails if
// there are any or if the kernel no longer holds every entry. The floor, timed in the
// same run before the kill, is a dump of what the restarted agent adopts: `bridge fdb
// show` and `ip neigh show` in the host. It also reports the restarted agent's heap and
// RSS per endpoint once its queue is empty, and again settled, settleTime later, when
// the agent has returned the garbage of the restart to the OS, and the CPU each agent
// spent: the first applying the endpoints, the restarted one until its queue was empty.
//
// Each run first does the same with no endpoints (the Nodes and the network only,
// endpoints=0) and reports the agent's settled heap and RSS, the cost of an agent on
// that cluster before any endpoint; the run with endpoints then also reports its settled
// figures less those, per endpoint (the slope), beside the totals per endpoint. It runs
// twice, the agent with its default garbage collector target (--gc-percent) and with
// Go's, 100, so that what the default saves and costs shows in one run. A run with
// 100,000 endpoints, default target, takes some minutes and runs only when named, with
// its floor:
//
//	go test -run '^$' -bench 'OverlayRestart' -benchtime 1x ./test/
//	go test -run '^$' -bench 'OverlayRestart/gc-percent=default/endpoints=(0|100000)$' -benchtime 1x ./test/
func BenchmarkOverlayRestart(b *testing.B) {
	for _, gc := range []struct{ name, flag string }{{"default", ""}, {"100", "--gc-percent=100"}} {
		b.Run("gc-percent="+gc.name, func(b *testing.B) {
			// floor is the endpoints=0 run's, when it ran.
			var floor *overlayMemory
			for _, n := range []int{0, 10_000, 100_000} {
				b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
					if n >= 100_000 && (gc.flag != "" || !benchNamed("endpoints=(0|100000)")) {
						b.Skip("run with -bench 'OverlayRestart/gc-percent=default/endpoints=(0|100000)$'")
					}
					for range b.N {
						m := overlayRestart(b, n, gc.flag, floor)
						if n == 0 {
							floor = &m
						}
					}
				})
			}
		})
	}
}

// overlayMemory is what an agent holds settled, in bytes.
type overlayMemory struct {
	rss, heap float64
}

// overlayRestart runs BenchmarkOverlayRestart with n endpoints, the agent started with
// gcFlag, a --gc-percent flag, unless it is empty, and returns the restarted agent's
// settled memory. With n > 0 and a floor, the memory of the same run with no endpoints,
// it also reports the settled figures less the floor's, per endpoint.
func overlayRestart(b *testing.B, n int, gcFlag string, floor *overlayMemory) overlayMemory {
	flags := append(slices.Clone(quietFlags), metricsFlags...)
	if gcFlag != "" {
		flags = append(flags, gcFlag)
	}
	c := newCluster(b, quietFlags...)
	h := c.addHost(b, "host-a", "host-a")
	h.startAgentWith(b, flags...)
	manifest := filepath.Join(b.TempDir(), "overlay.yaml")
	writeOverlayManifest(b, manifest, h, n)
	networks := c.watchKindStatus(b, nimbusv1.Kind_KIND_NETWORK)
	status := c.watchKindStatus(b, nimbusv1.Kind_KIND_ENDPOINT)
	c.mustCtl(b, "", "apply", "-f", manifest)
	networks.waitProgrammedOn(b, h.name, 1)
	status.waitProgrammedOn(b, h.name, n)
	fdb, neigh := overlayEntries(b, h)
	if fdb != 2*n || neigh != n {
		b.Fatalf("the agent programmed %d static FDB entries and %d permanent neighbours; want %d and %d", fdb, neigh, 2*n, n)
	}
	start := time.Now()
	overlayEntries(b, h)
	dump := time.Since(start)
	applyCPU := h.telemetry(b).metrics(b)["process_cpu_seconds_total"]

	h.agent.kill(b)
	start = time.Now()
	h.startAgentWith(b, flags...)
	tel := h.telemetry(b)
	for {
		if code, _ := tel.get(b, "/readyz"); code == http.StatusOK {
			break
		}
		if time.Since(start) > 5*time.Minute {
			b.Fatal("the restarted agent was not ready within 5 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ready := time.Since(start)
	var m map[string]float64
	waitFor(b, "the restarted agent's HAL queue to empty", func() bool {
		m = tel.metrics(b)
		return m["naples_hal_queue_depth"] == 0
	})
	idle := time.Now()
	var writes float64
	var byKind []string
	for k, v := range m {
		if strings.HasPrefix(k, "naples_hal_kernel_writes_total{") {
			writes += v
			byKind = append(byKind, fmt.Sprintf("%s %v", k, v))
		}
	}
	slices.Sort(byKind)
	b.Logf("after the restart: ready in %v, %d-entry dump in %v; %s", ready, 3*n, dump, strings.Join(byKind, ", "))
	if writes != 0 {
		b.Errorf("the restarted agent wrote the kernel %v times; want 0: %s", writes, strings.Join(byKind, ", "))
	}
	if f, nb := overlayEntries(b, h); f != 2*n || nb != n {
		b.Errorf("after the restart the kernel holds %d static FDB entries and %d permanent neighbours; want %d and %d", f, nb, 2*n, n)
	}
	rss := float64(agentRSS(b, h))
	settled := overlayMemory{rss: float64(settledRSS(b, h, idle))}
	settled.heap = tel.metrics(b)["go_memstats_heap_inuse_bytes"]
	b.ReportMetric(ready.Seconds(), "ready-s")
	b.ReportMetric(writes, "kernel-writes")
	b.ReportMetric(applyCPU, "apply-cpu-s")
	b.ReportMetric(m["process_cpu_seconds_total"], "restart-cpu-s")
	if n == 0 {
		b.ReportMetric(settled.heap/1e6, "settled-heap-MB")
		b.ReportMetric(settled.rss/1e6, "settled-rss-MB")
		return settled
	}
	b.ReportMetric(dump.Seconds(), "dump-s")
	b.ReportMetric(ready.Seconds()/dump.Seconds(), "ready-x-dump")
	b.ReportMetric(m["go_memstats_heap_inuse_bytes"]/float64(n), "heap-B/endpoint")
	b.ReportMetric(rss/float64(n), "rss-B/endpoint")
	b.ReportMetric(settled.rss/float64(n), "settled-rss-B/endpoint")
	b.ReportMetric(settled.heap/float64(n), "settled-heap-B/endpoint")
	if floor != nil {
		b.ReportMetric((settled.rss-floor.rss)/float64(n), "slope-rss-B/endpoint")
		b.ReportMetric((settled.heap-floor.heap)/float64(n), "slope-heap-B/endpoint")
	}
	return settled
}

// overlayRestartNodes is the number of other nodes BenchmarkOverlayRestart's endpoints
// are on.
const overlayRestartNodes = 16

// writeOverlayManifest writes the objects of BenchmarkOverlayRestart to path: host h's
// Node (VTEP 10.10.0.1, its eth0), 16 other Nodes, network blue and n endpoints on the
// other nodes.
func writeOverlayManifest(t testing.TB, path string, h *host, n int) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "kind: Node\nmeta: {name: %s}\nspec: {hostname: %s, vtepAddress: 10.10.0.1}\n---\n", h.name, h.name)
	for i := range overlayRestartNodes {
		fmt.Fprintf(w, "kind: Node\nmeta: {name: node-%d}\nspec: {hostname: node-%d, vtepAddress: 10.10.0.%d}\n---\n", i, i, 10+i)
	}
	// 250 addresses in each /24 from 10.64.1.0 on: beyond 63,750 endpoints they run past
	// 10.64.0.0/16, and the network is 10.64.0.0/14.
	prefix := 16
	if n > 255*250 {
		prefix = 14
	}
	fmt.Fprintf(w, "kind: Network\nmeta: {name: blue}\nspec: {vni: 100, subnet: 10.64.0.0/%d, gateway: 10.64.0.1}\n---\n", prefix)
	for i := range n {
		q := 1 + i/250
		fmt.Fprintf(w, "kind: Endpoint\nmeta: {name: ep%05d}\nspec: {network: blue, node: node-%d, mac: \"02:00:00:%02x:%02x:%02x\", ips: [10.%d.%d.%d]}\n---\n",
			i, i%overlayRestartNodes, i>>16, (i>>8)&0xff, i&0xff, 64+(q>>8), q&0xff, 1+i%250)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// overlayEntries counts the static FDB entries and the permanent neighbours in the host,
// what the endpoint reconciler writes for remote endpoints.
func overlayEntries(t testing.TB, h *host) (fdb, neigh int) {
	t.Helper()
	fdb = strings.Count(testns.Run(t, "bridge", "-n", h.ns, "fdb", "show"), " static")
	neigh = strings.Count(testns.Run(t, "ip", "-n", h.ns, "neigh", "show", "nud", "permanent"), "PERMANENT")
	return fdb, neigh
}

// watchKindStatus opens a WatchStatus stream of one kind as the publisher.
func (c *cluster) watchKindStatus(t testing.TB, kind nimbusv1.Kind) *routeStatus {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := c.publisherAPI(t).WatchStatus(ctx, &nimbusv1.WatchStatusRequest{Kind: kind},
		grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	s := &routeStatus{updates: make(chan *nimbusv1.StatusFrame, 1024), errs: make(chan error, 1)}
	go func() {
		for {
			f, err := stream.Recv()
			if err != nil {
				if !errors.Is(ctx.Err(), context.Canceled) {
					s.errs <- err
				}
				return
			}
			s.updates <- f
		}
	}()
	return s
}

// waitProgrammedOn waits until n objects are PROGRAMMED at their generation on the node.
func (s *routeStatus) waitProgrammedOn(t testing.TB, node string, n int) {
	t.Helper()
	s.wait(t, fmt.Sprintf("%d objects PROGRAMMED on %s", n, node), n, func(ev *nimbusv1.StatusEvent) (string, bool, bool) {
		if ev.GetType() != nimbusv1.StatusEvent_TYPE_PUT {
			return "", false, false
		}
		obj := ev.GetItem().GetObject()
		st := nodeStatus(ev.GetItem().GetStatus(), node)
		return obj.GetMeta().GetName(), st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED &&
			st.GetObservedGeneration() == obj.GetMeta().GetGeneration(), true
	})
}

// objectStatuses follows a WatchStatus stream and keeps the latest status of every
// object it reports, so that waiting for one object loses nothing of the others.
type objectStatuses struct {
	stream *routeStatus
	// latest holds the last PUT of every object, by name.
	latest map[string]*nimbusv1.ObjectWithStatus
}

// watchObjectStatuses opens a WatchStatus stream of one kind as the publisher.
func (c *cluster) watchObjectStatuses(t testing.TB, kind nimbusv1.Kind) *objectStatuses {
	t.Helper()
	return &objectStatuses{stream: c.watchKindStatus(t, kind), latest: map[string]*nimbusv1.ObjectWithStatus{}}
}

// waitAllProgrammed waits until the named object is PROGRAMMED at its generation on
// every node it targets; it fails the benchmark after deadline, with the last status it
// saw.
func (o *objectStatuses) waitAllProgrammed(t testing.TB, name string) {
	t.Helper()
	programmed := func() bool {
		item := o.latest[name]
		st := item.GetStatus()
		return item != nil && st.GetTargetNodes() > 0 && st.GetProgrammedNodes() == st.GetTargetNodes() &&
			st.GetGeneration() == item.GetObject().GetMeta().GetGeneration()
	}
	timeout := time.After(deadline)
	for !programmed() {
		select {
		case f := <-o.stream.updates:
			for _, ev := range f.GetEvents() {
				if ev.GetType() == nimbusv1.StatusEvent_TYPE_PUT {
					o.latest[ev.GetItem().GetObject().GetMeta().GetName()] = ev.GetItem()
				}
			}
		case err := <-o.stream.errs:
			t.Fatalf("status stream ended waiting for %s to be PROGRAMMED: %v", name, err)
		case <-timeout:
			t.Fatalf("timed out after %v waiting for %s to be PROGRAMMED on every node; last status: %v",
				deadline, name, o.latest[name].GetStatus())
		}
	}
}

// benchNamed reports whether the -bench pattern contains s, for benchmarks too long to
// run unless asked for by name.
func benchNamed(s string) bool {
	f := flag.Lookup("test.bench")
	return f != nil && strings.Contains(f.Value.String(), s)
}
