package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/naplesnet/naples/hal/firewall"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The firewall's chain benchmark: a policy of 10,000 rules applied with naplesctl, until
// the node reports it and until traffic shows it enforced.
//
//	go test -run '^$' -bench 'FirewallPolicyApply' -benchtime 1x ./test/

// fwApplyRules is the number of rules of the policy BenchmarkFirewallPolicyApply applies.
const fwApplyRules = 10_000

// BenchmarkFirewallPolicyApply measures the time from a 10,000-rule
// NetworkSecurityPolicy applied at nimbus to its enforcement on the node. One host runs
// its agent (logging at INFO, its firewall's maps at their default capacities) with two
// local endpoints in network fwb: prot (10.1.0.10, in group protected, a UDP echo server
// on port 7) and peer (10.1.0.20, open). A first policy, bench, of one rule (TCP 22 from
// 192.0.2.0/24) protects prot's ingress, so that peer's datagrams to prot's port 7 are
// dropped; the benchmark checks that they were delivered before it and are dropped with
// it.
//
// Then, measured from just before `naplesctl apply -f` of a manifest:
//   - permit: bench becomes 10,000 rules, the first of them allowing UDP 7 from peer's
//     /32, the others distinct /32s of 172.16.0.0/12 one TCP or UDP port each. It reports
//     when naplesctl returned (permit-apply-returned-s), when a WatchStatus stream showed
//     bench PROGRAMMED on the host at its new generation (permit-programmed-s) and when
//     the first of peer's datagrams, sent every millisecond since the start, was echoed
//     (permit-enforced-s).
//   - deny: bench stays 10,000 rules, but its first rule allows UDP 7 from another
//     address only. peer keeps sending on its connection, which the firewall tracks: the
//     new snapshot must cut it at its next datagram. It reports PROGRAMMED as above
//     (deny-programmed-s) and the last echo received (deny-enforced-s: the datagrams sent
//     1 ms later were dropped, and none passed in the 500 ms after PROGRAMMED).
//
// The agent logs nothing that times its snapshot builds, and has no metric of its own for
// them; agent-reconcile-s is the mean duration of the policy reconciles during the
// permit step (naples_hal_reconcile_duration_seconds of kind NetworkSecurityPolicy): a
// reconcile waits for a snapshot built after it started (firewall.Compile of every
// object, a new LPM trie filled and swapped in, counters made) and then reads the
// counter of every rule for the status.
//
// Memory, read from the kernel (the memlock of each map's fdinfo, through the maps the
// agent holds open): snapshot-memlock-B for the snapshot of the 10,000 rules (an LPM trie
// made without preallocation, so its memlock is the kernel's count of its entries times
// the size of a node with its key and value; the trie's intermediate nodes are not in
// it), snapshot-entries and snapshot-memlock-B/entry; ct-memlock-B and ct-entries for
// the conntrack table (an LRU hash, preallocated whole) at its default capacity.
func BenchmarkFirewallPolicyApply(b *testing.B) {
	for range b.N {
		firewallPolicyApply(b)
	}
}

// fwApplyProbePort is the port of prot's UDP echo server that peer sends to.
const fwApplyProbePort = 7

func firewallPolicyApply(b *testing.B) {
	c := newCluster(b, quietFlags...)
	h := c.addHost(b, "host-a", "host-a")
	h.startAgentWith(b, append(slices.Clone(quietFlags), metricsFlags...)...)
	tel := h.telemetry(b)
	api := c.publisherAPI(b)
	endpoints := c.watchObjectStatuses(b, nimbusv1.Kind_KIND_ENDPOINT)
	policies := c.watchObjectStatuses(b, nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY)

	prot := newWorkload(b, h, "fwb-prot", "02:00:00:00:30:01", []string{"10.1.0.10/24"})
	peer := newWorkload(b, h, "fwb-peer", "02:00:00:00:30:02", []string{"10.1.0.20/24"})
	prot.serve(b)
	endpoint := func(w *workload, groups ...string) *nimbusv1.Object {
		return &nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Name: w.name},
			Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
				Network: "fwb", Node: h.name, Interface: w.name, Mac: w.mac, Ips: []string{w.ip(4)}, SecurityGroups: groups,
			}},
		}
	}
	ctx := context.Background()
	if _, err := api.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{
		{
			Meta: &nimbusv1.ObjectMeta{Name: h.name},
			Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: h.name, VtepAddress: "10.10.0.1"}},
		},
		{
			Meta: &nimbusv1.ObjectMeta{Name: "fwb"},
			Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 100, Subnets: []*nimbusv1.Subnet{
				{Cidr: "10.1.0.0/24", Gateway: "10.1.0.1"},
			}}},
		},
		{
			Meta: &nimbusv1.ObjectMeta{Name: "protected"},
			Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{}},
		},
		endpoint(prot, "protected"),
		endpoint(peer),
	}}); err != nil {
		b.Fatalf("applying the node, network and endpoints: %v", err)
	}
	endpoints.waitAllProgrammed(b, prot.name)
	endpoints.waitAllProgrammed(b, peer.name)
	p := newProber(b, peer)
	if _, err := p.firstEcho(prot.ip(4), time.Now(), deadline); err != nil {
		b.Fatalf("with no policy, peer's datagrams do not reach prot: %v", err)
	}

	// The first policy: prot's ingress protected, the probe dropped.
	if _, err := api.Apply(ctx, &nimbusv1.ApplyRequest{Object: &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "bench"},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{
			AttachGroups: []string{"protected"},
			Ingress: []*nimbusv1.PolicyRule{{Action: nimbusv1.PolicyRule_ACTION_ALLOW, Protocol: "tcp",
				Ports: []string{"22"}, FromCidrs: []string{"192.0.2.0/24"}}},
		}},
	}}); err != nil {
		b.Fatalf("applying the first policy: %v", err)
	}
	fwWaitPolicy(b, policies, "bench", h.name, 1)
	if _, err := p.firstEcho(prot.ip(4), time.Now(), 300*time.Millisecond); err == nil {
		b.Fatal("with a policy allowing only TCP 22 from 192.0.2.0/24, peer's datagrams still reach prot")
	}

	// Permit: the 10,000 rules, the first allowing the probe.
	manifest := filepath.Join(b.TempDir(), "policy.yaml")
	fwWritePolicyManifest(b, manifest, peer.ip(4))
	before := tel.metrics(b)
	type echo struct {
		d   time.Duration
		err error
	}
	echoed := make(chan echo, 1)
	start := time.Now()
	go func() {
		d, err := p.firstEcho(prot.ip(4), start, 2*deadline)
		echoed <- echo{d, err}
	}()
	c.mustCtl(b, "", "apply", "-f", manifest)
	permitReturned := time.Since(start)
	fwWaitPolicy(b, policies, "bench", h.name, 2)
	permitProgrammed := time.Since(start)
	e := <-echoed
	if e.err != nil {
		b.Fatalf("peer's datagrams never reached prot once the policy allowed them: %v", e.err)
	}
	permitEnforced := e.d
	after := tel.metrics(b)
	const sum = `naples_hal_reconcile_duration_seconds_sum{kind="NetworkSecurityPolicy"}`
	const count = `naples_hal_reconcile_duration_seconds_count{kind="NetworkSecurityPolicy"}`
	reconciles := after[count] - before[count]
	if reconciles < 1 {
		b.Fatalf("the agent ran %v policy reconciles while the policy changed; want at least one", reconciles)
	}
	reconcile := (after[sum] - before[sum]) / reconciles

	// Memory, with the 10,000 rules in place.
	snapshot, snapshotEntries, ct := fwAgentMaps(b, h.agent.cmd.Process.Pid)
	if snapshotEntries < 2*fwApplyRules {
		b.Errorf("the snapshot in place has %d entries; want at least %d (an identity and a policy entry per rule)",
			snapshotEntries, 2*fwApplyRules)
	}
	const defaultCT = 262144
	if ct.MaxEntries != defaultCT {
		b.Errorf("the conntrack table holds %d entries; want the default, %d", ct.MaxEntries, defaultCT)
	}
	snapshotMem, _ := snapshot.Memlock()
	ctMem, _ := ct.Memlock()

	// Deny: the 10,000 rules, the first now allowing another address.
	fwWritePolicyManifest(b, manifest, "10.1.0.99")
	stop := make(chan struct{})
	last := make(chan echo, 1)
	start = time.Now()
	go func() {
		d, err := fwLastEcho(p, prot.ip(4), start, stop, 500*time.Millisecond, 2*deadline)
		last <- echo{d, err}
	}()
	c.mustCtl(b, "", "apply", "-f", manifest)
	fwWaitPolicy(b, policies, "bench", h.name, 3)
	denyProgrammed := time.Since(start)
	close(stop)
	e = <-last
	if e.err != nil {
		b.Fatalf("once the policy denied them: %v", e.err)
	}
	denyEnforced := e.d

	b.Logf("permit: apply returned %v, PROGRAMMED %v, first echo %v; deny: PROGRAMMED %v, last echo %v; "+
		"%v policy reconciles of %.3f s on average; snapshot %d entries, %d B; conntrack %d entries, %d B",
		permitReturned, permitProgrammed, permitEnforced, denyProgrammed, denyEnforced,
		reconciles, reconcile, snapshotEntries, snapshotMem, ct.MaxEntries, ctMem)
	b.ReportMetric(permitReturned.Seconds(), "permit-apply-returned-s")
	b.ReportMetric(permitProgrammed.Seconds(), "permit-programmed-s")
	b.ReportMetric(permitEnforced.Seconds(), "permit-enforced-s")
	b.ReportMetric(denyProgrammed.Seconds(), "deny-programmed-s")
	b.ReportMetric(denyEnforced.Seconds(), "deny-enforced-s")
	b.ReportMetric(reconcile, "agent-reconcile-s")
	b.ReportMetric(float64(snapshotEntries), "snapshot-entries")
	b.ReportMetric(float64(snapshotMem), "snapshot-memlock-B")
	b.ReportMetric(float64(snapshotMem)/float64(snapshotEntries), "snapshot-memlock-B/entry")
	b.ReportMetric(float64(ct.MaxEntries), "ct-entries")
	b.ReportMetric(float64(ctMem), "ct-memlock-B")
	b.ReportMetric(0, "ns/op")
}

// fwWritePolicyManifest writes policy bench of fwApplyRules ingress rules to path: the
// first allows UDP fwApplyProbePort from probeFrom's /32, the others distinct /32s of
// 172.16.0.0/12 one TCP or UDP port each.
func fwWritePolicyManifest(b *testing.B, path, probeFrom string) {
	b.Helper()
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintf(w, "kind: NetworkSecurityPolicy\nmeta: {name: bench}\nspec:\n  attachGroups: [protected]\n  ingress:\n")
	rule := func(proto string, port int, cidr string) {
		fmt.Fprintf(w, "    - action: ACTION_ALLOW\n      protocol: %s\n      ports: [\"%d\"]\n      fromCidrs: [%s]\n", proto, port, cidr)
	}
	rule("udp", fwApplyProbePort, probeFrom+"/32")
	for i := 1; i < fwApplyRules; i++ {
		proto := "tcp"
		if i%2 == 1 {
			proto = "udp"
		}
		rule(proto, 1024+i%60000, fmt.Sprintf("172.%d.%d.%d/32", 16+i>>16, (i>>8)&0xff, i&0xff))
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
}

// fwWaitPolicy waits until the status stream shows the named policy at generation gen
// PROGRAMMED on the node; it fails the benchmark when the node reports it FAILED at that
// generation, when a later generation shows up, or after deadline.
func fwWaitPolicy(b *testing.B, o *objectStatuses, name, node string, gen int64) {
	b.Helper()
	timeout := time.After(deadline)
	for {
		item := o.latest[name]
		got := item.GetObject().GetMeta().GetGeneration()
		st := nodeStatus(item.GetStatus(), node)
		switch {
		case got > gen:
			b.Fatalf("policy %s is at generation %d; want %d", name, got, gen)
		case got == gen && st.GetObservedGeneration() == gen && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED:
			return
		case got == gen && st.GetObservedGeneration() == gen && st.GetPhase() == nimbusv1.Phase_PHASE_FAILED:
			b.Fatalf("policy %s generation %d FAILED on %s: %s: %s", name, gen, node, st.GetReason(), st.GetMessage())
		}
		select {
		case f := <-o.stream.updates:
			for _, ev := range f.GetEvents() {
				if ev.GetType() == nimbusv1.StatusEvent_TYPE_PUT {
					o.latest[ev.GetItem().GetObject().GetMeta().GetName()] = ev.GetItem()
				}
			}
		case err := <-o.stream.errs:
			b.Fatalf("status stream ended waiting for policy %s generation %d: %v", name, gen, err)
		case <-timeout:
			b.Fatalf("timed out after %v waiting for policy %s generation %d to be PROGRAMMED on %s; last status: %v",
				deadline, name, gen, node, item.GetStatus())
		}
	}
}

// fwLastEcho sends a datagram to port 7 of addr every millisecond, on the prober's one
// socket (one connection for the firewall), and returns how long after start the last
// echo came: it stops once stop is closed and no echo has come for quiet. It fails when
// no echo came after start, or when echoes still come at start+limit.
func fwLastEcho(p *prober, addr string, start time.Time, stop <-chan struct{}, quiet, limit time.Duration) (time.Duration, error) {
	p.seq++
	msg := binary.BigEndian.AppendUint64([]byte("naples-last-"), p.seq)
	dst := &net.UDPAddr{IP: net.ParseIP(addr), Port: 7}
	buf := make([]byte, 64)
	var last, stopped time.Time
	for {
		now := time.Now()
		select {
		case <-stop:
			if stopped.IsZero() {
				stopped = now
			}
		default:
		}
		if !stopped.IsZero() && now.Sub(stopped) >= quiet && now.Sub(last) >= quiet {
			break
		}
		if now.Sub(start) > limit {
			return 0, fmt.Errorf("%s still echoes %v after the start", addr, limit)
		}
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
				last = time.Now()
			}
		}
	}
	if last.Before(start) {
		return 0, fmt.Errorf("no echo from %s after the start", addr)
	}
	return last.Sub(start), nil
}

// fwAgentMaps finds the firewall's maps among the file descriptors of the agent (process
// pid) and returns the kernel's information on the snapshot in place (the map in slot 0
// of fw_snapshots), its number of entries, and that on the conntrack table, fw_ct.
func fwAgentMaps(b *testing.B, pid int) (snapshot *ebpf.MapInfo, entries int, ct *ebpf.MapInfo) {
	b.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		b.Fatal(err)
	}
	var snapshots *ebpf.Map
	for _, fd := range fds {
		target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err != nil || target != "anon_inode:bpf-map" {
			continue
		}
		// The agent opens and closes maps as it works (a snapshot while it fills it): a
		// descriptor or a map gone since the listing is skipped.
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		var id uint64
		for line := range strings.Lines(string(info)) {
			if v, ok := strings.CutPrefix(line, "map_id:"); ok {
				id, err = strconv.ParseUint(strings.TrimSpace(v), 10, 32)
				if err != nil {
					b.Fatalf("parsing the map id of fd %s of the agent: %v", fd.Name(), err)
				}
			}
		}
		m, err := ebpf.NewMapFromID(ebpf.MapID(id))
		if err != nil {
			continue
		}
		mi, err := m.Info()
		if err != nil {
			m.Close()
			continue
		}
		switch mi.Name {
		case "fw_snapshots":
			if snapshots == nil {
				snapshots = m
				continue
			}
		case "fw_ct":
			ct = mi
		}
		m.Close()
	}
	if snapshots == nil || ct == nil {
		b.Fatalf("the agent (pid %d) holds no fw_snapshots or no fw_ct map", pid)
	}
	defer snapshots.Close()
	var id ebpf.MapID
	if err := snapshots.Lookup(uint32(0), &id); err != nil {
		b.Fatalf("reading the agent's snapshot slot: %v", err)
	}
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		b.Fatalf("opening the agent's snapshot, map %d: %v", id, err)
	}
	defer m.Close()
	if snapshot, err = m.Info(); err != nil {
		b.Fatal(err)
	}
	var k firewall.Key
	var v firewall.Value
	it := m.Iterate()
	for it.Next(&k, &v) {
		entries++
	}
	if err := it.Err(); err != nil {
		b.Fatalf("reading the agent's snapshot: %v", err)
	}
	return snapshot, entries, ct
}
