package cli

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// firewallAgent is an agent's local API whose Firewall answers what the test sets and
// records the view asked for.
type firewallAgent struct {
	delphiv1.UnimplementedDelphiServer
	resp *delphiv1.FirewallResponse
	err  error
	// views are the views asked for, in order.
	views []delphiv1.FirewallView
}

// Firewall records the view and returns the answer the test set.
func (a *firewallAgent) Firewall(_ context.Context, req *delphiv1.FirewallRequest) (*delphiv1.FirewallResponse, error) {
	a.views = append(a.views, req.GetView())
	return a.resp, a.err
}

// serveFirewallAgent serves a on a unix socket in e's directory until the test ends and
// points NAPLES_AGENT at it.
func serveFirewallAgent(t *testing.T, e *env, a *firewallAgent) {
	t.Helper()
	sock := filepath.Join(e.dir, "agent.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	delphiv1.RegisterDelphiServer(gs, a)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	e.vars[AgentEnv] = sock
}

// The names of the canned firewall's objects.
const (
	cannedPolicy = "NetworkSecurityPolicy/default/default/web-policy"
	cannedGW     = "group:SecurityGroup/default/default/gw"
	cannedOps    = "group:SecurityGroup/default/default/ops"
)

// cannedFirewall is an agent's view of its firewall: one known endpoint protected by one
// policy, an endpoint, subject, scope and rule counter the firewall's snapshot does not know, and
// three connections, one of them checked against an older snapshot.
func cannedFirewall() *delphiv1.FirewallResponse {
	key := func(kind nimbusv1.Kind, name string) *nimbusv1.ObjectKey { return nimbusv1.NewKey(kind, "", "", name) }
	policy := key(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "web-policy")
	web := key(nimbusv1.Kind_KIND_ENDPOINT, "web")
	return &delphiv1.FirewallResponse{
		Node:   "host-a",
		BpfDir: "/sys/fs/bpf/naples",
		Snapshot: &delphiv1.FirewallSnapshot{Present: true, Generation: 0xe0dfa3e5, Entries: 12, Capacity: 65536,
			CompiledGeneration: 0xe0dfa3e5, StaleEntries: 3},
		Stats: &delphiv1.FirewallStats{ConntrackCreated: 7, ConntrackDenied: 1, NoSnapshotDrops: 0, ConntrackEntries: 3,
			ConntrackCapacity: 262144, RuleCountersCapacity: 65536, EndpointCountersCapacity: 16384,
			FragmentUntrackedDrops: 2, FragmentCapacity: 8192, BadHeaderDrops: 1},
		Problems: []string{"Endpoint/default/default/db: spec.ips[0] \"10.1.0.x\": not an IP address"},
		Endpoints: []*delphiv1.FirewallEndpoint{
			{Key: web, Ifindex: 7, Interface: "veth-web", Id: 0x5e1f2a3b, Scope: 0x9a3c1234, Tenant: "default", Subject: 0x1a2b3c4d,
				IngressProtected: true, EgressProtected: true, Generation: 0xe0dfa3e5,
				Guarded: true, Sources: []string{"02:00:00:00:00:05", "10.1.0.2", "fd00:1::2"},
				Counters: &nimbusv1.EndpointFirewallCounters{AllowedPackets: 12, AllowedBytes: 1180, DeniedPackets: 1, DeniedBytes: 49,
					SpoofedPackets: 2, SpoofedBytes: 84}},
			{Ifindex: 4242, Id: 0xdead0001, Scope: 0x5c0fe, Subject: 0xbeef0001, IngressProtected: true, Generation: 0xe0dfa3e5},
		},
		Subjects: []*delphiv1.FirewallSubject{
			{Id: 0x1a2b3c4d, Policies: []*nimbusv1.ObjectKey{policy}, Scope: 0x9a3c1234, Tenant: "default", Entries: []*delphiv1.FirewallPolicyEntry{
				{Direction: "ingress", Class: "tcp", Identity: 0x33, Labels: []string{cannedOps}, FirstPort: 8000, LastPort: 8063,
					Ports: "8000-8063", Verdict: "allow", Rule: 0x8c1f, RuleName: cannedPolicy + " ingress[0]"},
				{Direction: "egress", Class: "udp", Identity: 0x44, Labels: []string{cannedGW}, FirstPort: 5000, LastPort: 5000,
					Ports: "5000", Verdict: "allow", Rule: 0x9d20, RuleName: cannedPolicy + " egress[0]"},
				{Direction: "egress", Class: "udp", Identity: 0xffffffff, AnyPeer: true, FirstPort: 6000, LastPort: 6000,
					Ports: "6000", Verdict: "deny", Rule: 0xae31, RuleName: cannedPolicy + " egress[1]"},
			}},
			{Id: 0xbeef0001, Scope: 0x5c0fe, Entries: []*delphiv1.FirewallPolicyEntry{
				{Direction: "ingress", Class: "tcp", Identity: 0x77, FirstPort: 22, LastPort: 22, Ports: "22", Verdict: "deny", Rule: 0x1234},
			}},
		},
		Rules: []*delphiv1.FirewallRule{
			{Id: 0x8c1f, Policy: policy, Direction: "ingress", Index: 0, Name: cannedPolicy + " ingress[0]", Action: "allow",
				Protocol: "tcp", Ports: []string{"8000-8063"}, Peers: []string{cannedOps}, Counted: true},
			{Id: 0x9d20, Policy: policy, Direction: "egress", Index: 0, Name: cannedPolicy + " egress[0]", Action: "allow",
				Protocol: "udp", Ports: []string{"5000"}, Peers: []string{cannedGW}, Counted: true, Packets: 3, Bytes: 96},
			{Id: 0xae31, Policy: policy, Direction: "egress", Index: 1, Name: cannedPolicy + " egress[1]", Action: "deny",
				Protocol: "udp", Ports: []string{"6000"}, Counted: true, Packets: 1, Bytes: 49},
			{Id: 0x1234, Counted: true, Packets: 5, Bytes: 300},
		},
		Scopes: []*delphiv1.FirewallScope{
			{Scope: 0x9a3c1234, Tenant: "default", Identities: []*delphiv1.FirewallIdentity{
				{Id: 0x33, Labels: []string{cannedOps}, Prefixes: []string{"10.9.0.0/16"}},
				{Id: 0x44, Labels: []string{cannedGW}, Prefixes: []string{"10.1.0.1/32", "fd00:1::1/128"}},
				{Id: 0x55, Labels: []string{"cidr:10.9.1.0/24", cannedOps}, Prefixes: []string{"10.9.1.0/24"}},
			}},
			{Scope: 0x5c0fe, Identities: []*delphiv1.FirewallIdentity{{Id: 0x77, Prefixes: []string{"192.0.2.0/24"}}}},
		},
		Connections: []*delphiv1.FirewallConnection{
			{Ifindex: 7, Interface: "veth-web", Endpoint: web, Family: 4, Protocol: 17, ProtocolName: "udp",
				Source: "10.1.0.2", SourcePort: 40000, Destination: "10.1.0.1", DestinationPort: 5000, Direction: "egress",
				Idle: durationpb.New(2300 * time.Millisecond), ExpiresIn: durationpb.New(57700 * time.Millisecond),
				Replied: true, Generation: 0xe0dfa3e5, Rule: 0x9d20, RuleName: cannedPolicy + " egress[0]"},
			{Ifindex: 7, Interface: "veth-web", Endpoint: web, Family: 6, Protocol: 6, ProtocolName: "tcp",
				Source: "fd00:9::5", SourcePort: 51000, Destination: "fd00:1::2", DestinationPort: 8000, Direction: "ingress",
				Idle: durationpb.New(250 * time.Millisecond), ExpiresIn: durationpb.New(9750 * time.Millisecond),
				Replied: true, Closing: true, Generation: 0x1111, Rule: 0x8c1f, RuleName: cannedPolicy + " ingress[0]"},
			{Ifindex: 9, Family: 4, Protocol: 1, ProtocolName: "icmp", Source: "10.2.0.2", SourcePort: 7, Destination: "10.2.0.1",
				Direction: "egress", Idle: durationpb.New(time.Second), ExpiresIn: durationpb.New(29 * time.Second),
				Generation: 0xe0dfa3e5},
		},
	}
}

// TestBPFCommands checks the readable, JSON and YAML forms of the three views of an
// agent's firewall, and how an agent's refusal reads.
func TestBPFCommands(t *testing.T) {
	e := newEnv(t)
	a := &firewallAgent{resp: cannedFirewall()}
	serveFirewallAgent(t, e, a)
	header := `node host-a, bpf dir /sys/fs/bpf/naples
snapshot: generation 0xe0dfa3e5, 12 entries of 65536; NOT CURRENT: 3 entries the firewall did not install (the firewall installed generation 0xe0dfa3e5)
problem: Endpoint/default/default/db: spec.ips[0] "10.1.0.x": not an IP address
`

	equal(t, "bpf policy", e.ok("bpf", "policy"), header+`
ENDPOINT              INTERFACE      ID           SUBJECT      INGRESS     EGRESS      ALLOWED          DENIED       SPOOFED       SOURCES
default/default/web   veth-web (7)   0x5e1f2a3b   0x1a2b3c4d   protected   protected   12 pkts 1180 B   1 pkt 49 B   2 pkts 84 B   02:00:00:00:00:05 10.1.0.2 fd00:1::2
unknown               ifindex 4242   0xdead0001   0xbeef0001   protected   open        -                -            -             unchecked

subject 0x1a2b3c4d, tenant default
  policy default/default/web-policy
    ingress[0]: allow tcp 8000-8063 from group:SecurityGroup/default/default/ops: 0 packets, 0 bytes
    egress[0]: allow udp 5000 to group:SecurityGroup/default/default/gw: 3 packets, 96 bytes
    egress[1]: deny udp 6000 to any peer: 1 packet, 49 bytes
  DIRECTION   CLASS   PEER                                           PORTS       VERDICT   RULE
  ingress     tcp     0x33 group:SecurityGroup/default/default/ops   8000-8063   allow     NetworkSecurityPolicy/default/default/web-policy ingress[0]
  egress      udp     0x44 group:SecurityGroup/default/default/gw    5000        allow     NetworkSecurityPolicy/default/default/web-policy egress[0]
  egress      udp     any                                            6000        deny      NetworkSecurityPolicy/default/default/web-policy egress[1]

subject 0xbeef0001: not known to the firewall's snapshot
  DIRECTION   CLASS   PEER   PORTS   VERDICT   RULE
  ingress     tcp     0x77   22      deny      0x1234

rule counters the firewall's snapshot does not know:
  rule 0x1234: 5 packets, 300 bytes
`)

	equal(t, "bpf identities", e.ok("bpf", "identities"), header+`
tenant default, scope 0x9a3c1234
  IDENTITY   LABELS                                                      PREFIXES
  0x33       group:SecurityGroup/default/default/ops                     10.9.0.0/16
  0x44       group:SecurityGroup/default/default/gw                      10.1.0.1/32 fd00:1::1/128
  0x55       cidr:10.9.1.0/24, group:SecurityGroup/default/default/ops   10.9.1.0/24

tenant unknown, scope 0x5c0fe
  IDENTITY   LABELS    PREFIXES
  0x77       unknown   192.0.2.0/24
`)

	equal(t, "bpf ct", e.ok("bpf", "ct"), header+`conntrack: 3 live connections of 262144
program: 7 connections tracked, 1 cut off by a new snapshot, 0 packets dropped for want of a snapshot, 0 spoofed frames dropped
fragments: 2 later fragments dropped for want of their first (tracked 8192 at once), 1 packet dropped for hostile headers

INTERFACE      ENDPOINT              PROTO   SOURCE              DESTINATION        DIRECTION   IDLE    EXPIRES   FLAGS             GENERATION     RULE
veth-web (7)   default/default/web   udp     10.1.0.2:40000      10.1.0.1:5000      egress      2s      58s       replied           0xe0dfa3e5     NetworkSecurityPolicy/default/default/web-policy egress[0]
veth-web (7)   default/default/web   tcp     [fd00:9::5]:51000   [fd00:1::2]:8000   ingress     250ms   10s       replied,closing   0x1111 (old)   NetworkSecurityPolicy/default/default/web-policy ingress[0]
ifindex 9      unknown               icmp    10.2.0.2 id 7       10.2.0.1           egress      1s      29s       -                 0xe0dfa3e5     none
`)
	want := []delphiv1.FirewallView{delphiv1.FirewallView_FIREWALL_VIEW_POLICY, delphiv1.FirewallView_FIREWALL_VIEW_IDENTITIES,
		delphiv1.FirewallView_FIREWALL_VIEW_CONNTRACK}
	if len(a.views) != 3 || a.views[0] != want[0] || a.views[1] != want[1] || a.views[2] != want[2] {
		t.Errorf("views asked for = %v, want %v", a.views, want)
	}

	var doc struct {
		Node     string
		Snapshot struct {
			Generation   uint32
			Current      bool
			StaleEntries uint32
		}
		Endpoints []struct {
			Key      *struct{ Name string }
			Id       uint32
			Counters *struct{ AllowedPackets uint64 }
		}
		Subjects []struct {
			Id      uint32
			Entries []struct {
				AnyPeer  bool
				Rule     uint64
				RuleName string
			}
		}
		Connections []struct {
			SourcePort uint32
			Idle       string
			Replied    bool
		}
	}
	out := e.ok("bpf", "ct", "-o", "json")
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("bpf ct -o json: %v\n%s", err, out)
	}
	if doc.Node != "host-a" || doc.Snapshot.Generation != 0xe0dfa3e5 || doc.Snapshot.Current || doc.Snapshot.StaleEntries != 3 {
		t.Errorf("bpf ct -o json: %+v", doc)
	}
	if len(doc.Connections) != 3 || doc.Connections[0].SourcePort != 40000 || doc.Connections[0].Idle != "2.300s" || !doc.Connections[0].Replied {
		t.Errorf("bpf ct -o json: connections %+v", doc.Connections)
	}
	if len(doc.Endpoints) != 2 || doc.Endpoints[0].Key == nil || doc.Endpoints[0].Key.Name != "web" || doc.Endpoints[0].Counters.AllowedPackets != 12 ||
		doc.Endpoints[1].Key != nil || doc.Endpoints[1].Id != 0xdead0001 || doc.Endpoints[1].Counters != nil {
		t.Errorf("bpf ct -o json: endpoints %+v", doc.Endpoints)
	}
	// Every field is there, false ones too.
	if len(doc.Subjects) != 2 || doc.Subjects[0].Entries[2].RuleName != cannedPolicy+" egress[1]" || !doc.Subjects[0].Entries[2].AnyPeer ||
		doc.Subjects[1].Entries[0].Rule != 4660 || !strings.Contains(out, `"anyPeer": false`) {
		t.Errorf("bpf ct -o json: subjects %+v", doc.Subjects)
	}
	out = e.ok("bpf", "identities", "-o", "yaml")
	for _, w := range []string{"scopes:\n- identities:\n", "  - id: 51\n", "    - 10.9.0.0/16\n", "node: host-a\n", "    tenant: default\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("bpf identities -o yaml does not contain %q:\n%s", w, out)
		}
	}

	contains(t, "bpf policy -o table", e.fails("bpf", "policy", "-o", "table"), `--output "table": want tree, json or yaml`)
	contains(t, "bpf ct -o tree", e.fails("bpf", "ct", "-o", "tree"), `--output "tree": want table, json or yaml`)
	a.resp, a.err = nil, status.Error(codes.FailedPrecondition, "the agent runs without a firewall (--bpf-dir is empty)")
	contains(t, "an agent's refusal", e.fails("bpf", "identities"),
		"reading the firewall: the agent runs without a firewall (--bpf-dir is empty) (FailedPrecondition)")
}

// TestBPFCommandsEmpty checks the views of an agent whose firewall has no snapshot yet.
func TestBPFCommandsEmpty(t *testing.T) {
	e := newEnv(t)
	serveFirewallAgent(t, e, &firewallAgent{resp: &delphiv1.FirewallResponse{
		Node: "host-a", BpfDir: "/sys/fs/bpf/naples", Snapshot: &delphiv1.FirewallSnapshot{CompiledGeneration: 0x1},
		Stats: &delphiv1.FirewallStats{ConntrackCapacity: 1024, NoSnapshotDrops: 1},
	}})
	header := "node host-a, bpf dir /sys/fs/bpf/naples\n" +
		"snapshot: NONE: every packet of a filtered interface is dropped (the firewall installed generation 0x1)\n"
	for _, tc := range []struct {
		args           []string
		stdout, stderr string
	}{
		{[]string{"bpf", "policy"}, header, "No endpoints found.\n"},
		{[]string{"bpf", "identities"}, header, "No identities found.\n"},
		{[]string{"bpf", "ct"}, header + "conntrack: 0 live connections of 1024\n" +
			"program: 0 connections tracked, 0 cut off by a new snapshot, 1 packet dropped for want of a snapshot, 0 spoofed frames dropped\n" +
			"fragments: 0 later fragments dropped for want of their first (tracked 0 at once), 0 packets dropped for hostile headers\n", "No connections found.\n"},
	} {
		out, errOut, err := e.run("", tc.args...)
		if err != nil || out != tc.stdout || errOut != tc.stderr {
			t.Errorf("%s: err %v\nstdout %q\nwant   %q\nstderr %q, want %q", strings.Join(tc.args, " "), err, out, tc.stdout, errOut, tc.stderr)
		}
	}
}
