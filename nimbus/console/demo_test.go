package console

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/manifest"
	"github.com/naplesnet/naples/nimbus"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// demoNodes are the hosts of the demo state, each with an agent that the test plays, by
// name, with the version of its agent.
var demoNodes = map[string]string{"host-a": "v1.4.2", "host-b": "v1.4.2", "host-c": "v1.4.1"}

// demoManifest is a realistic small fleet: three hosts, two networks of two tenants,
// endpoints, security groups, a policy and routes.
const demoManifest = `
kind: Node
meta: {name: host-a}
spec: {hostname: host-a, vtepAddress: 192.168.100.1}
---
kind: Node
meta: {name: host-b}
spec: {hostname: host-b, vtepAddress: 192.168.100.2}
---
kind: Node
meta: {name: host-c}
spec: {hostname: host-c, vtepAddress: 192.168.100.3}
---
kind: Network
meta: {name: blue}
spec: {vni: 100, subnet: 10.1.0.0/24, gateway: 10.1.0.1}
---
kind: Network
meta: {name: green, tenant: acme}
spec: {vni: 200, subnet: 10.2.0.0/24, gateway: 10.2.0.1}
---
kind: Endpoint
meta: {name: web-a, nodes: [host-a]}
spec: {network: blue, node: host-a, interface: web-a, mac: "02:00:00:00:01:0a", ips: [10.1.0.10], securityGroups: [client]}
---
kind: Endpoint
meta: {name: web-b, nodes: [host-b]}
spec: {network: blue, node: host-b, interface: web-b, mac: "02:00:00:00:01:0b", ips: [10.1.0.11], securityGroups: [web]}
---
kind: Endpoint
meta: {name: db-c, nodes: [host-c]}
spec: {network: blue, node: host-c, interface: db-c, mac: "02:00:00:00:01:0c", ips: [10.1.0.12], securityGroups: [db]}
---
kind: Endpoint
meta: {name: app-c, tenant: acme, nodes: [host-c]}
spec: {network: green, node: host-c, interface: app-c, mac: "02:00:00:00:02:0c", ips: [10.2.0.12]}
---
kind: SecurityGroup
meta: {name: client}
spec: {}
---
kind: SecurityGroup
meta: {name: web}
spec: {}
---
kind: SecurityGroup
meta: {name: db}
spec: {}
---
kind: NetworkSecurityPolicy
meta: {name: web-ingress}
spec:
  attachGroups: [web]
  ingress:
    - {action: ACTION_ALLOW, fromGroups: [client], protocol: tcp, ports: ["8080"]}
---
kind: NetworkSecurityPolicy
meta: {name: db-ingress}
spec:
  attachGroups: [db]
  ingress:
    - {action: ACTION_ALLOW, fromGroups: [web], protocol: tcp, ports: ["5432"]}
---
kind: Route
meta: {name: to-dc2}
spec: {table: 100, prefix: 198.51.100.0/24, nexthops: [{gateway: 10.10.0.2}]}
---
kind: Route
meta: {name: to-backup, nodes: [host-b, host-c]}
spec: {table: 100, prefix: 203.0.113.0/24, nexthops: [{gateway: 10.10.0.3}, {gateway: 10.10.0.4}]}
`

// demo is a nimbus Server serving gRPC on a unix socket with the demo state, the agents
// of its nodes played by the test over gRPC, and the console serving on a loopback port.
type demo struct {
	srv     *nimbus.Server
	client  nimbusv1.NimbusClient
	flows   flowsv1.FlowsClient
	console *Console
	reg     *prometheus.Registry
	// url is the console's root, ending in /ui/.
	url string
	// target is nimbus's gRPC address, for more agents.
	target string
}

// startDemo serves a Server and its console for the test, applies the demo state and
// connects an agent of every node, each of which reports everything PROGRAMMED.
func startDemo(t *testing.T, opts Options) *demo {
	t.Helper()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	reg := prometheus.NewRegistry()
	srv, err := nimbus.New(nimbus.Options{Logger: log, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "nimbus.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	opts.Logger = log
	opts.Registerer = reg
	c, err := New(srv, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	hs, err := Serve(ctx, "127.0.0.1:0", nil, c, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hs.Close() })

	d := &demo{srv: srv, client: nimbusv1.NewNimbusClient(conn), flows: flowsv1.NewFlowsClient(conn), console: c, reg: reg,
		url: "http://" + hs.Addr() + "/ui/", target: "unix://" + sock}
	objs, err := manifest.Decode(strings.NewReader(demoManifest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.client.ApplyBatch(t.Context(), &nimbusv1.ApplyBatchRequest{Objects: objs, OmitObjects: true}); err != nil {
		t.Fatalf("applying the demo state: %v", err)
	}
	for n, version := range demoNodes {
		d.watch(t, d.target, n, version)
	}
	waitFor(t, "every node connected", func() bool {
		connected := 0
		for _, n := range srv.Nodes() {
			if n.Connected() {
				connected++
			}
		}
		return connected == len(demoNodes)
	})
	var marks []*nimbusv1.StatusReport
	for n := range demoNodes {
		marks = append(marks, &nimbusv1.StatusReport{Watermark: &nimbusv1.StatusWatermark{Node: n, Epoch: srv.Epoch(), Revision: srv.Revision()}})
	}
	d.report(t, marks...)
	return d
}

// watch opens the watch stream of an agent of the node, of the version, on a connection
// of its own to target, and reads it until the test ends or stop is called.
func (d *demo) watch(t *testing.T, target, node, version string) (stop func()) {
	t.Helper()
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent(nimbusv1.AgentUserAgent(version)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := nimbusv1.NewNimbusClient(conn).Watch(ctx, &nimbusv1.WatchRequest{Node: node})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := stream.Recv(); err != nil {
				return
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return stop
}

// connected reports whether nimbus has a watch stream of the node open.
func (d *demo) connected(node string) bool {
	for _, n := range d.srv.Nodes() {
		if n.Name == node {
			return n.Connected()
		}
	}
	return false
}

// report sends the reports in one ReportStatus call; when it returns, nimbus has taken
// them.
func (d *demo) report(t *testing.T, reports ...*nimbusv1.StatusReport) {
	t.Helper()
	stream, err := d.client.ReportStatus(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reports {
		if err := stream.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("ReportStatus: %v", err)
	}
}

// fail reports the object FAILED on the node with the message, at its current generation.
func (d *demo) fail(t *testing.T, key *nimbusv1.ObjectKey, node, reason, msg string) {
	t.Helper()
	got, err := d.client.Get(t.Context(), &nimbusv1.GetRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	d.report(t, &nimbusv1.StatusReport{Key: key, Status: &nimbusv1.NodeStatus{Node: node, Phase: nimbusv1.Phase_PHASE_FAILED,
		ObservedGeneration: got.GetItem().GetObject().GetMeta().GetGeneration(), Reason: reason, Message: msg,
		UpdateTime: timestamppb.Now()}})
}

// demoFlows are the records the flow tap of host-b sends: web-a talks to web-b, and
// db-c refuses web-b on a port no rule opens.
func demoFlows(now time.Time) []*delphiv1.Flow {
	ep := func(name string) *nimbusv1.ObjectKey {
		return nimbusv1.NewKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", name)
	}
	policy := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "", "", "web-ingress")
	return []*delphiv1.Flow{
		{Time: timestamppb.New(now.Add(-3 * time.Second)), Event: delphiv1.FlowEvent_FLOW_EVENT_STARTED, Verdict: "allowed", Node: "host-b",
			Endpoint: ep("web-b"), PeerEndpoint: ep("web-a"), Direction: "ingress", Protocol: "tcp", Source: "10.1.0.10", SourcePort: 40112,
			Destination: "10.1.0.11", DestinationPort: 8080, Rule: 1, Policy: policy, RuleName: "ingress[0]", Bytes: 60,
			InitiatorPackets: 1, InitiatorBytes: 60},
		{Time: timestamppb.New(now.Add(-2 * time.Second)), Event: delphiv1.FlowEvent_FLOW_EVENT_ENDED, Verdict: "allowed", Reason: "fin", Node: "host-b",
			Endpoint: ep("web-b"), PeerEndpoint: ep("web-a"), Direction: "ingress", Protocol: "tcp", Source: "10.1.0.10", SourcePort: 40112,
			Destination: "10.1.0.11", DestinationPort: 8080, Rule: 1, Policy: policy, RuleName: "ingress[0]", Bytes: 52,
			InitiatorPackets: 6, InitiatorBytes: 383, ResponderPackets: 4, ResponderBytes: 279},
		{Time: timestamppb.New(now.Add(-time.Second)), Event: delphiv1.FlowEvent_FLOW_EVENT_DENIED, Verdict: "denied", Reason: "policy", Node: "host-b",
			Endpoint: ep("web-b"), PeerEndpoint: ep("db-c"), Direction: "egress", Protocol: "tcp", Source: "10.1.0.11", SourcePort: 51000,
			Destination: "10.1.0.12", DestinationPort: 22, Bytes: 60},
		{Time: timestamppb.New(now), Event: delphiv1.FlowEvent_FLOW_EVENT_STARTED, Verdict: "allowed", Node: "host-b",
			Endpoint: ep("web-b"), PeerEndpoint: ep("db-c"), Direction: "egress", Protocol: "tcp", Source: "10.1.0.11", SourcePort: 51002,
			Destination: "10.1.0.12", DestinationPort: 5432, Bytes: 60, InitiatorPackets: 1, InitiatorBytes: 60},
	}
}

// fakeTap plays the flow tap of an agent of the node over gRPC: whenever nimbus
// subscribes it, it sends the records. It runs until the test ends.
func (d *demo) fakeTap(t *testing.T, node string, flows []*delphiv1.Flow) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := d.flows.FlowTap(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := stream.Send(&flowsv1.FlowTapUp{Node: node}); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			down, err := stream.Recv()
			if err != nil {
				return
			}
			if down.GetCancel() {
				continue
			}
			if err := stream.Send(&flowsv1.FlowTapUp{Subscription: down.GetSubscription(), Flows: flows}); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// waitFor polls cond until it holds, failing the test after ten seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
