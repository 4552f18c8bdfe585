package agent

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal/firewall"
	"github.com/naplesnet/naples/hal/linux"
	"github.com/naplesnet/naples/hal/linux/fwbpf"
	"github.com/naplesnet/naples/internal/testns"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// fwInspectSeq numbers the pin directories of the tests.
var fwInspectSeq atomic.Uint64

// fwInspectEnv is a host namespace with an endpoint interface, veth-web (10.1.0.1), whose
// peer is eth0 (10.1.0.2) of a workload namespace; a delphi store holding the endpoint,
// its security groups and a policy; the firewall of hal/linux loaded over them with its
// maps pinned in a directory of bpffs and attached to veth-web; and an Inspector reading
// that directory, served on a unix socket.
type fwInspectEnv struct {
	t        *testing.T
	host, wl netns.NsHandle
	dir      string
	ifindex  int
	fw       *linux.Firewall
	api      delphiv1.DelphiClient
	store    *delphi.Store
}

// The objects of the test's tenant, default/default. The policy protects web, on
// veth-web: it allows UDP 5000 to gw's addresses (the host side, 10.1.0.1) and denies
// UDP 6000 to any peer; it allows TCP 8000-8063 from ops's CIDR and denies ICMP from a
// CIDR inside it.
func fwInspectObjects() []*nimbusv1.Object {
	meta := func(name string) *nimbusv1.ObjectMeta { return &nimbusv1.ObjectMeta{Name: name, Generation: 1} }
	group := func(name string, cidrs ...string) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: meta(name), Spec: &nimbusv1.Object_SecurityGroup{SecurityGroup: &nimbusv1.SecurityGroupSpec{Cidrs: cidrs}}}
	}
	endpoint := func(name, node, iface, ip, group string) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: meta(name), Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{
			Network: "blue", Node: node, Interface: iface, Ips: []string{ip}, SecurityGroups: []string{group}}}}
	}
	allow, deny := nimbusv1.PolicyRule_ACTION_ALLOW, nimbusv1.PolicyRule_ACTION_DENY
	return []*nimbusv1.Object{
		endpoint("web", "host-a", "veth-web", "10.1.0.2", "web"),
		endpoint("gw", "host-b", "", "10.1.0.1", "gw"),
		group("web"), group("gw"), group("ops", "10.9.0.0/16"),
		{Meta: meta("web-policy"), Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{
			AttachGroups: []string{"web"},
			Ingress: []*nimbusv1.PolicyRule{
				{Action: allow, Protocol: "tcp", Ports: []string{"8000-8063"}, FromGroups: []string{"ops"}},
				{Action: deny, Protocol: "icmp", FromCidrs: []string{"10.9.1.0/24"}},
			},
			Egress: []*nimbusv1.PolicyRule{
				{Action: allow, Protocol: "udp", Ports: []string{"5000"}, ToGroups: []string{"gw"}},
				{Action: deny, Protocol: "udp", Ports: []string{"6000"}},
			},
		}}},
	}
}

func newFWInspectEnv(t *testing.T) *fwInspectEnv {
	t.Helper()
	return newFWInspectEnvOf(t, fwInspectObjects(), fwbpf.Capacities{})
}

// newFWInspectEnvOf is newFWInspectEnv with the objects objs and the firewall's maps of
// the capacities caps.
func newFWInspectEnvOf(t *testing.T, objs []*nimbusv1.Object, caps fwbpf.Capacities) *fwInspectEnv {
	t.Helper()
	host := testns.Named(t, "naples-fwi")
	wl := testns.Named(t, "naples-fwi-wl")
	e := &fwInspectEnv{t: t, host: testns.Handle(t, host), wl: testns.Handle(t, wl)}
	ip := func(ns string, args ...string) { testns.Run(t, "ip", append([]string{"-n", ns}, args...)...) }
	ip(host, "link", "add", "veth-web", "type", "veth", "peer", "name", "eth0", "netns", wl)
	ip(host, "addr", "add", "10.1.0.1/24", "dev", "veth-web")
	ip(host, "link", "set", "veth-web", "up")
	ip(wl, "addr", "add", "10.1.0.2/24", "dev", "eth0")
	ip(wl, "link", "set", "eth0", "up")
	h, err := netlink.NewHandleAt(e.host)
	if err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("veth-web")
	h.Close()
	if err != nil {
		t.Fatal(err)
	}
	e.ifindex = l.Attrs().Index

	store, err := delphi.Open(delphi.Options{Logger: quiet, Indexes: indexes()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	txn := &delphi.DesiredTxn{}
	for _, o := range objs {
		txn.Put(o)
	}
	if err := desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
	desired.MarkSynced()
	e.store = store

	e.dir = filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwi-%d-%d", os.Getpid(), fwInspectSeq.Add(1)))
	t.Cleanup(func() {
		if err := os.RemoveAll(e.dir); err != nil {
			t.Errorf("removing the pin directory: %v", err)
		}
	})
	fw, err := linux.NewFirewall(linux.FirewallOptions{
		Store: store, Node: "host-a", Namespace: &e.host, Dir: e.dir, Logger: quiet, GCInterval: time.Hour, Capacities: caps,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Close() })
	e.fw = fw
	webKey := fwKey(nimbusv1.Kind_KIND_ENDPOINT, "web")
	web, _ := store.Get(mustParseKey(t, webKey))
	if _, err := fw.AttachEndpoint(t.Context(), mustParseKey(t, webKey).Key(), web, e.ifindex); err != nil {
		t.Fatalf("attaching the firewall to veth-web: %v", err)
	}
	e.api = serveInspector(t, InspectorOptions{Store: store, Logger: quiet, Node: "host-a", Namespace: &e.host, BPFDir: e.dir, Firewall: fw})
	return e
}

// fwKey returns the key ID of the named object of the default tenant and namespace.
func fwKey(kind nimbusv1.Kind, name string) string { return nimbusv1.NewKey(kind, "", "", name).ID() }

// inNamespace runs fn on a thread in namespace ns: sockets it opens stay there. The
// thread is never handed back to the runtime.
func inNamespace(t *testing.T, ns netns.NsHandle, fn func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// firewall calls the Firewall RPC with the view.
func (e *fwInspectEnv) firewall(view delphiv1.FirewallView) *delphiv1.FirewallResponse {
	e.t.Helper()
	resp, err := e.api.Firewall(e.t.Context(), &delphiv1.FirewallRequest{View: view})
	if err != nil {
		e.t.Fatalf("Firewall: %v", err)
	}
	return resp
}

// waitFirewall calls the Firewall RPC until ok accepts its answer, for up to 20s.
func (e *fwInspectEnv) waitFirewall(what string, ok func(*delphiv1.FirewallResponse) bool) *delphiv1.FirewallResponse {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp := e.firewall(delphiv1.FirewallView_FIREWALL_VIEW_UNSPECIFIED)
		if ok(resp) {
			return resp
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("waiting for %s: the firewall answers %v", what, resp)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// exchange sends datagrams from the workload to 10.1.0.1:5000 until the host side
// answers one and the answer arrives; it returns the workload's port.
func (e *fwInspectEnv) exchange() int {
	e.t.Helper()
	var server net.PacketConn
	inNamespace(e.t, e.host, func() (err error) {
		server, err = net.ListenPacket("udp4", "10.1.0.1:5000")
		return err
	})
	defer server.Close()
	var client net.Conn
	inNamespace(e.t, e.wl, func() (err error) {
		client, err = net.Dial("udp4", "10.1.0.1:5000")
		return err
	})
	defer client.Close()
	buf := make([]byte, 64)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := client.Write([]byte("ping")); err != nil {
			e.t.Fatalf("sending: %v", err)
		}
		server.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, from, err := server.ReadFrom(buf)
		if isTimeout(err) {
			continue
		}
		if err != nil {
			e.t.Fatalf("receiving at 10.1.0.1:5000: %v", err)
		}
		if _, err := server.WriteTo([]byte("pong"), from); err != nil {
			e.t.Fatalf("answering: %v", err)
		}
		client.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := client.Read(buf)
		if isTimeout(err) {
			continue
		}
		if err != nil || string(buf[:n]) != "pong" {
			e.t.Fatalf("the workload received %q, %v; want \"pong\"", buf[:n], err)
		}
		return client.LocalAddr().(*net.UDPAddr).Port
	}
	e.t.Fatal("no datagram of the allowed connection to 10.1.0.1:5000 got through and back")
	return 0
}

// isTimeout tells whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// policyLines describes a subject's entries, one line each.
func policyLines(s *delphiv1.FirewallSubject) []string {
	var lines []string
	for _, e := range s.GetEntries() {
		peer := "any"
		if !e.GetAnyPeer() {
			peer = fmt.Sprintf("%#x%v", e.GetIdentity(), e.GetLabels())
		}
		lines = append(lines, fmt.Sprintf("%s %s %s %s(%d-%d) %s %s", e.GetDirection(), e.GetClass(), peer, e.GetPorts(),
			e.GetFirstPort(), e.GetLastPort(), e.GetVerdict(), e.GetRuleName()))
	}
	return lines
}

// TestFirewallInspect loads the firewall over a policy protecting a veth endpoint, sends
// an allowed UDP exchange and denied datagrams from the workload, and checks that the
// Firewall RPC shows the endpoint with its counters, the subject's policy entries named
// with the policy's rules and the identities' labels, the rules' counters, the
// identities per tenant, the connection the exchange made and the program's counters,
// all with the ids of the snapshot the firewall installed.
func TestFirewallInspect(t *testing.T) {
	e := newFWInspectEnv(t)
	snap := e.fw.Snapshot()
	if snap == nil || len(snap.Endpoints) != 1 {
		t.Fatalf("the firewall's snapshot = %+v, want one endpoint", snap)
	}
	ep := snap.Endpoints[0]
	ruleID := map[string]uint64{}
	for _, r := range snap.Rules {
		ruleID[fmt.Sprintf("%s[%d]", firewall.DirName(r.Dir), r.Index)] = r.ID
	}
	idOf := map[string]uint32{}
	for _, id := range snap.Identities {
		idOf[strings.Join(id.Labels, ",")] = id.ID
	}
	const (
		gw    = "group:SecurityGroup/default/default/gw"
		ops   = "group:SecurityGroup/default/default/ops"
		cidr  = "cidr:10.9.1.0/24"
		rules = "NetworkSecurityPolicy/default/default/web-policy "
	)
	if len(idOf) != 3 || idOf[gw] == 0 || idOf[ops] == 0 || idOf[cidr+","+ops] == 0 {
		t.Fatalf("the firewall's identities = %+v, want those of gw, ops and ops with the rule's CIDR", snap.Identities)
	}

	port := e.exchange()
	// Datagrams to UDP 6000 are denied by egress[1]; send until its counter moves.
	var denied net.Conn
	inNamespace(t, e.wl, func() (err error) {
		denied, err = net.Dial("udp4", "10.1.0.1:6000")
		return err
	})
	defer denied.Close()
	resp := e.waitFirewall("the deny rule's counter", func(r *delphiv1.FirewallResponse) bool {
		if _, err := denied.Write([]byte("blocked")); err != nil {
			t.Fatalf("sending to 10.1.0.1:6000: %v", err)
		}
		i := slices.IndexFunc(r.GetRules(), func(fr *delphiv1.FirewallRule) bool { return fr.GetId() == ruleID["egress[1]"] })
		return i >= 0 && r.GetRules()[i].GetPackets() > 0
	})

	if resp.GetNode() != "host-a" || resp.GetBpfDir() != e.dir || len(resp.GetProblems()) != 0 {
		t.Errorf("node %q, bpf dir %q, problems %q; want host-a, %s, none", resp.GetNode(), resp.GetBpfDir(), resp.GetProblems(), e.dir)
	}
	if s := resp.GetSnapshot(); !s.GetPresent() || !s.GetCurrent() || s.GetGeneration() != snap.Gen || s.GetCompiledGeneration() != snap.Gen ||
		s.GetEntries() != uint32(len(snap.Entries)) || s.GetEntries() != 9 || s.GetCapacity() != 65536 || s.GetStaleEntries() != 0 || s.GetMissingEntries() != 0 {
		t.Errorf("snapshot = %v, want generation %#x, 9 entries of 65536, current", s, snap.Gen)
	}

	// The endpoint, with its counters: the exchange was allowed, the datagrams to 6000
	// denied.
	if len(resp.GetEndpoints()) != 1 {
		t.Fatalf("endpoints = %v, want web's", resp.GetEndpoints())
	}
	fe := resp.GetEndpoints()[0]
	if fe.GetKey().ID() != fwKey(nimbusv1.Kind_KIND_ENDPOINT, "web") || fe.GetInterface() != "veth-web" || fe.GetIfindex() != uint32(e.ifindex) ||
		fe.GetId() != ep.ID || fe.GetSubject() != ep.Subject || fe.GetSubject() == 0 || fe.GetScope() != ep.Scope || fe.GetTenant() != "default" ||
		!fe.GetIngressProtected() || !fe.GetEgressProtected() || fe.GetGeneration() != snap.Gen {
		t.Errorf("endpoint = %v, want web on veth-web (%d), id %#x, subject %#x, both directions protected", fe, e.ifindex, ep.ID, ep.Subject)
	}
	if c := fe.GetCounters(); c.GetAllowedPackets() < 2 || c.GetAllowedBytes() < 2*32 || c.GetDeniedPackets() < 1 || c.GetDeniedBytes() < 35 {
		t.Errorf("endpoint counters = %v, want at least the ping and pong allowed and a datagram denied", c)
	}

	// The subject's policy and entries, named.
	if len(resp.GetSubjects()) != 1 {
		t.Fatalf("subjects = %v, want one", resp.GetSubjects())
	}
	sub := resp.GetSubjects()[0]
	if sub.GetId() != ep.Subject || sub.GetTenant() != "default" || sub.GetScope() != ep.Scope || len(sub.GetPolicies()) != 1 ||
		sub.GetPolicies()[0].ID() != fwKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "web-policy") {
		t.Errorf("subject = %v, want %#x of tenant default with web-policy", sub, ep.Subject)
	}
	checkLines(t, "policy entries", policyLines(sub), []string{
		fmt.Sprintf("ingress tcp %#x[%s] 8000-8063(8000-8063) allow %singress[0]", idOf[ops], ops, rules),
		fmt.Sprintf("ingress tcp %#x[%s %s] 8000-8063(8000-8063) allow %singress[0]", idOf[cidr+","+ops], cidr, ops, rules),
		fmt.Sprintf("ingress icmp %#x[%s %s] any(0-65535) deny %singress[1]", idOf[cidr+","+ops], cidr, ops, rules),
		fmt.Sprintf("egress udp %#x[%s] 5000(5000-5000) allow %segress[0]", idOf[gw], gw, rules),
		fmt.Sprintf("egress udp any 6000(6000-6000) deny %segress[1]", rules),
	})

	// The rules with their counters: the exchange's first datagram on egress[0], the
	// denied ones on egress[1].
	var ruleLines []string
	for _, r := range resp.GetRules() {
		moved := "0"
		if r.GetPackets() > 0 && r.GetBytes() >= 28*r.GetPackets() {
			moved = ">0"
		}
		ruleLines = append(ruleLines, fmt.Sprintf("%#x %s %s %s %s %v %v counted=%t packets=%s", r.GetId(), r.GetName(),
			r.GetAction(), r.GetProtocol(), r.GetPolicy().GetName(), r.GetPorts(), r.GetPeers(), r.GetCounted(), moved))
	}
	checkLines(t, "rules", ruleLines, []string{
		fmt.Sprintf("%#x %singress[0] allow tcp web-policy [8000-8063] [%s] counted=true packets=0", ruleID["ingress[0]"], rules, ops),
		fmt.Sprintf("%#x %singress[1] deny icmp web-policy [] [%s] counted=true packets=0", ruleID["ingress[1]"], rules, cidr),
		fmt.Sprintf("%#x %segress[0] allow udp web-policy [5000] [%s] counted=true packets=>0", ruleID["egress[0]"], rules, gw),
		fmt.Sprintf("%#x %segress[1] deny udp web-policy [6000] [] counted=true packets=>0", ruleID["egress[1]"], rules),
	})

	// The identities of the tenant, with the prefixes that map to them.
	if len(resp.GetScopes()) != 1 || resp.GetScopes()[0].GetTenant() != "default" || resp.GetScopes()[0].GetScope() != ep.Scope {
		t.Fatalf("scopes = %v, want the default tenant's, %#x", resp.GetScopes(), ep.Scope)
	}
	var idLines []string
	for _, id := range resp.GetScopes()[0].GetIdentities() {
		idLines = append(idLines, fmt.Sprintf("%#x %v %v", id.GetId(), id.GetLabels(), id.GetPrefixes()))
	}
	type wantID struct {
		id   uint32
		line string
	}
	wantIDs := []wantID{
		{idOf[gw], fmt.Sprintf("%#x [%s] [10.1.0.1/32]", idOf[gw], gw)},
		{idOf[ops], fmt.Sprintf("%#x [%s] [10.9.0.0/16]", idOf[ops], ops)},
		{idOf[cidr+","+ops], fmt.Sprintf("%#x [%s %s] [10.9.1.0/24]", idOf[cidr+","+ops], cidr, ops)},
	}
	slices.SortFunc(wantIDs, func(a, b wantID) int { return cmp.Compare(a.id, b.id) }) // the answer's order
	var want []string
	for _, w := range wantIDs {
		want = append(want, w.line)
	}
	checkLines(t, "identities", idLines, want)

	// The exchange's connection, replied, and none for the denied datagrams.
	if len(resp.GetConnections()) != 1 {
		t.Fatalf("connections = %v, want the exchange's", resp.GetConnections())
	}
	c := resp.GetConnections()[0]
	if c.GetIfindex() != uint32(e.ifindex) || c.GetInterface() != "veth-web" || c.GetEndpoint().ID() != fwKey(nimbusv1.Kind_KIND_ENDPOINT, "web") ||
		c.GetFamily() != 4 || c.GetProtocol() != 17 || c.GetProtocolName() != "udp" ||
		c.GetSource() != "10.1.0.2" || c.GetSourcePort() != uint32(port) || c.GetDestination() != "10.1.0.1" || c.GetDestinationPort() != 5000 ||
		c.GetDirection() != "egress" || !c.GetReplied() || c.GetClosing() || c.GetGeneration() != snap.Gen ||
		c.GetRule() != ruleID["egress[0]"] || c.GetRuleName() != rules+"egress[0]" {
		t.Errorf("connection = %v, want udp 10.1.0.2:%d → 10.1.0.1:5000 egress on veth-web, replied, by egress[0]", c, port)
	}
	if idle, left := c.GetIdle().AsDuration(), c.GetExpiresIn().AsDuration(); idle < 0 || idle > 30*time.Second || left <= 0 || idle+left != time.Minute {
		t.Errorf("connection idle %v, expires in %v; want them to add up to UDP's 60s", idle, left)
	}
	if st := resp.GetStats(); st.GetConntrackCreated() < 1 || st.GetConntrackEntries() != 1 || st.GetConntrackCapacity() != 262144 ||
		st.GetRuleCountersCapacity() != 65536 || st.GetEndpointCountersCapacity() != 16384 {
		t.Errorf("stats = %v, want a connection created and live, default capacities", st)
	}

	// Each view holds its part only.
	if r := e.firewall(delphiv1.FirewallView_FIREWALL_VIEW_CONNTRACK); len(r.GetConnections()) != 1 || len(r.GetEndpoints()) != 0 ||
		len(r.GetScopes()) != 0 || len(r.GetRules()) != 0 || r.GetSnapshot().GetGeneration() != snap.Gen {
		t.Errorf("the conntrack view = %v, want the connection and the summary only", r)
	}
	if r := e.firewall(delphiv1.FirewallView_FIREWALL_VIEW_IDENTITIES); len(r.GetScopes()) != 1 || len(r.GetConnections()) != 0 ||
		len(r.GetSubjects()) != 0 || r.GetStats().GetConntrackEntries() != 0 {
		t.Errorf("the identities view = %v, want the scopes and the summary only", r)
	}
	if r := e.firewall(delphiv1.FirewallView_FIREWALL_VIEW_POLICY); len(r.GetEndpoints()) != 1 || len(r.GetSubjects()) != 1 ||
		len(r.GetRules()) != 4 || len(r.GetScopes()) != 0 || len(r.GetConnections()) != 0 {
		t.Errorf("the policy view = %v, want endpoints, subjects and rules only", r)
	}
}

// TestFirewallInspectUnknownIDs installs, behind the firewall's back, a snapshot with
// entries no object compiles to, and a counter of a rule no policy has, and checks that
// the Firewall RPC shows them with their raw ids and reports the snapshot not current.
func TestFirewallInspectUnknownIDs(t *testing.T) {
	e := newFWInspectEnv(t)
	snap := e.fw.Snapshot()
	const (
		epID, subject, scope, identity = 0xdead0001, 0xbeef0001, 0x5c0fe, 0x77
		rule                           = uint64(0x1234)
	)
	entries := append(slices.Clone(snap.Entries),
		firewall.Entry{Key: firewall.EndpointKey(4242), Value: firewall.Value{ID: epID, Subject: subject, Flags: firewall.FlagIngress, Scope: scope, Gen: snap.Gen}},
		firewall.Entry{Key: firewall.IdentityKey(scope, mustPrefix("192.0.2.0/24")), Value: firewall.Value{ID: identity}},
		firewall.Entry{Key: firewall.PolicyKey(subject, firewall.DirIngress, firewall.ClassTCP, identity, 22, 16),
			Value: firewall.Value{Verdict: firewall.VerdictDeny, Rule: rule}},
	)
	objs := e.fw.Objects()
	if err := objs.Install(entries); err != nil {
		t.Fatal(err)
	}
	ids := []uint64{rule}
	for _, r := range snap.Rules {
		ids = append(ids, r.ID)
	}
	if err := objs.KeepRuleCounters(ids); err != nil {
		t.Fatal(err)
	}

	resp := e.firewall(delphiv1.FirewallView_FIREWALL_VIEW_UNSPECIFIED)
	if s := resp.GetSnapshot(); s.GetCurrent() || s.GetStaleEntries() != 3 || s.GetMissingEntries() != 0 || s.GetEntries() != uint32(len(entries)) {
		t.Errorf("snapshot = %v, want 3 stale entries, not current", s)
	}
	if n := len(resp.GetEndpoints()); n != 2 {
		t.Fatalf("endpoints = %v, want web's and the unknown one", resp.GetEndpoints())
	}
	if u := resp.GetEndpoints()[1]; u.GetKey() != nil || u.GetIfindex() != 4242 || u.GetInterface() != "" || u.GetId() != epID ||
		u.GetSubject() != subject || u.GetScope() != scope || u.GetTenant() != "" || !u.GetIngressProtected() || u.GetEgressProtected() ||
		u.GetCounters() != nil {
		t.Errorf("the unknown endpoint = %v, want raw ids, no key, no interface, no counters", u)
	}
	i := slices.IndexFunc(resp.GetSubjects(), func(s *delphiv1.FirewallSubject) bool { return s.GetId() == subject })
	if i < 0 {
		t.Fatalf("subjects = %v, want %#x among them", resp.GetSubjects(), subject)
	}
	checkLines(t, "the unknown subject's entries", policyLines(resp.GetSubjects()[i]), []string{"ingress tcp 0x77[] 22(22-22) deny "})
	if s := resp.GetSubjects()[i]; len(s.GetPolicies()) != 0 || s.GetScope() != scope || s.GetTenant() != "" || s.GetEntries()[0].GetRule() != rule {
		t.Errorf("the unknown subject = %v, want no policies, scope %#x, rule %#x", s, scope, rule)
	}
	if last := resp.GetRules()[len(resp.GetRules())-1]; last.GetId() != rule || last.GetPolicy() != nil || last.GetName() != "" || !last.GetCounted() {
		t.Errorf("the last rule = %v, want the unknown counter %#x", last, rule)
	}
	if n := len(resp.GetScopes()); n != 2 {
		t.Fatalf("scopes = %v, want the default tenant's and the unknown one", resp.GetScopes())
	}
	if u := resp.GetScopes()[1]; u.GetScope() != scope || u.GetTenant() != "" || len(u.GetIdentities()) != 1 ||
		u.GetIdentities()[0].GetId() != identity || len(u.GetIdentities()[0].GetLabels()) != 0 ||
		!slices.Equal(u.GetIdentities()[0].GetPrefixes(), []string{"192.0.2.0/24"}) {
		t.Errorf("the unknown scope = %v, want identity 0x77 of 192.0.2.0/24 without labels", u)
	}
}

// mustPrefix parses a prefix of the tests.
func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// TestFirewallInspectRefuses checks that Firewall refuses with FailedPrecondition when
// the agent runs without a firewall or without a node name.
func TestFirewallInspectRefuses(t *testing.T) {
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, tc := range []struct {
		name string
		opts InspectorOptions
		want string
	}{
		{"no firewall", InspectorOptions{Node: "host-a"}, "--bpf-dir"},
		{"no node", InspectorOptions{BPFDir: "/sys/fs/bpf/naples"}, "node name"},
	} {
		tc.opts.Store, tc.opts.Logger = store, quiet
		api := serveInspector(t, tc.opts)
		_, err := api.Firewall(t.Context(), &delphiv1.FirewallRequest{})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Firewall = %v, want FailedPrecondition naming %s", tc.name, err, tc.want)
		}
	}
}

// TestFirewallInspectNotPinned checks that Firewall refuses with FailedPrecondition
// before the firewall pinned its maps, and refuses an unknown view.
func TestFirewallInspectNotPinned(t *testing.T) {
	ns := testns.Named(t, "naples-fwi")
	nsh := testns.Handle(t, ns)
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	dir := t.TempDir()
	api := serveInspector(t, InspectorOptions{Store: store, Logger: quiet, Node: "host-a", Namespace: &nsh, BPFDir: dir})
	_, err = api.Firewall(t.Context(), &delphiv1.FirewallRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "has not pinned its maps in "+dir) {
		t.Errorf("Firewall before the maps are pinned = %v, want FailedPrecondition saying so", err)
	}
	_, err = api.Firewall(t.Context(), &delphiv1.FirewallRequest{View: 42})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("Firewall of view 42 = %v, want InvalidArgument", err)
	}
}

// mustParseKey parses a key ID.
func mustParseKey(t *testing.T, id string) *nimbusv1.ObjectKey {
	t.Helper()
	k, err := nimbusv1.ParseKeyID(id)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestFirewallInspectAfterCapacityFallback gives the firewall room for five rule
// counters and two policies of web of six rules together: the firewall installs a
// snapshot without x-policy, whose ids differ from those of compiling every policy, and
// the Firewall RPC names the maps' ids by the snapshot installed.
func TestFirewallInspectAfterCapacityFallback(t *testing.T) {
	objs := fwInspectObjects()
	allow := nimbusv1.PolicyRule_ACTION_ALLOW
	objs = append(objs, &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "x-policy", Generation: 1},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{
			AttachGroups: []string{"web"},
			Ingress: []*nimbusv1.PolicyRule{
				{Action: allow, Protocol: "tcp", Ports: []string{"22"}, FromGroups: []string{"ops"}},
				{Action: allow, Protocol: "tcp", Ports: []string{"443"}, FromGroups: []string{"gw"}},
			},
		}},
	})
	e := newFWInspectEnvOf(t, objs, fwbpf.Capacities{Rules: 5})
	snap := e.fw.Snapshot()
	if snap == nil || len(snap.Endpoints) != 1 || len(snap.Rules) != 4 {
		t.Fatalf("the firewall's snapshot = %+v, want one endpoint and web-policy's 4 rules", snap)
	}
	for _, r := range snap.Rules {
		if r.Policy.String() != fwKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "web-policy") {
			t.Fatalf("the firewall enforces rule %+v, want web-policy's only", r)
		}
	}
	// Compiling every policy, as the inspector once did, gives other ids.
	all := firewall.Compile(firewall.InputOf(e.store, "host-a", map[string]int{"veth-web": e.ifindex}))
	if len(all.Endpoints) != 1 || all.Endpoints[0].Subject == snap.Endpoints[0].Subject || all.Gen == snap.Gen {
		t.Fatalf("compiling every policy gives subject %#x and generation %#x, want others than those installed, %#x and %#x",
			all.Endpoints[0].Subject, all.Gen, snap.Endpoints[0].Subject, snap.Gen)
	}

	resp := e.firewall(delphiv1.FirewallView_FIREWALL_VIEW_POLICY)
	if s := resp.GetSnapshot(); !s.GetCurrent() || s.GetGeneration() != snap.Gen || s.GetCompiledGeneration() != snap.Gen || s.GetEntries() != uint32(len(snap.Entries)) {
		t.Errorf("snapshot = %v, want the installed one, generation %#x, %d entries, current", s, snap.Gen, len(snap.Entries))
	}
	if len(resp.GetProblems()) != 0 {
		t.Errorf("problems %q, want none", resp.GetProblems())
	}
	ep := snap.Endpoints[0]
	if len(resp.GetEndpoints()) != 1 || resp.GetEndpoints()[0].GetId() != ep.ID || resp.GetEndpoints()[0].GetSubject() != ep.Subject ||
		resp.GetEndpoints()[0].GetKey().ID() != fwKey(nimbusv1.Kind_KIND_ENDPOINT, "web") {
		t.Errorf("endpoints = %v, want web with id %#x and subject %#x", resp.GetEndpoints(), ep.ID, ep.Subject)
	}
	if len(resp.GetSubjects()) != 1 || resp.GetSubjects()[0].GetId() != ep.Subject || len(resp.GetSubjects()[0].GetPolicies()) != 1 ||
		resp.GetSubjects()[0].GetPolicies()[0].ID() != fwKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "web-policy") {
		t.Errorf("subjects = %v, want %#x of web-policy", resp.GetSubjects(), ep.Subject)
	}
	var want, got []uint64
	for _, r := range snap.Rules {
		want = append(want, r.ID)
	}
	for _, r := range resp.GetRules() {
		if r.GetPolicy().ID() != fwKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "web-policy") {
			t.Errorf("rule %v, want web-policy's", r)
		}
		got = append(got, r.GetId())
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("rule ids %#x, want those installed, %#x", got, want)
	}
}
