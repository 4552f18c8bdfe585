package nimbusclient

import (
	"context"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/internal/version"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// bus is a real nimbus server on a unix socket that can be stopped and replaced by a
// fresh one on the same socket, and a publisher client to it.
type bus struct {
	path string
	stop func()
	api  nimbusv1.NimbusClient
	// srv is the server serving now.
	srv *nimbus.Server
}

func newBus(t *testing.T) *bus {
	b := &bus{path: filepath.Join(t.TempDir(), "nimbus.sock")}
	b.restart(t)
	t.Cleanup(func() { b.stop() })
	conn, err := grpc.NewClient("unix://"+b.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	b.api = nimbusv1.NewNimbusClient(conn)
	return b
}

// restart stops the running server, if any, and serves a new, empty one.
func (b *bus) restart(t *testing.T) {
	t.Helper()
	if b.stop != nil {
		b.stop()
	}
	srv, err := nimbus.New(nimbus.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	b.srv = srv
	lis, err := net.Listen("unix", b.path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	b.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		b.stop = func() {}
	}
}

func (b *bus) apply(t *testing.T, name string, nodes ...string) *nimbusv1.Object {
	t.Helper()
	obj := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: nodes},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "198.51.100.0/24", Nexthops: []*nimbusv1.NextHop{{Gateway: "10.0.0.1"}}}},
	}
	resp, err := b.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: obj})
	if err != nil {
		t.Fatalf("Apply %s: %v", name, err)
	}
	return resp.GetObject()
}

func (b *bus) delete(t *testing.T, name string) {
	t.Helper()
	if _, err := b.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: routeKey(name)}); err != nil {
		t.Fatal(err)
	}
}

func routeKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
}

// agent is a delphi store with a running client for node "a".
type agent struct {
	store  *delphi.Store
	status *delphi.StatusWriter
}

// newAgent opens a delphi store and claims its status writer, for a client not started
// yet.
func newAgent(t *testing.T) *agent {
	t.Helper()
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	status, err := store.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	return &agent{store: store, status: status}
}

func startClient(t *testing.T, b *bus) *agent {
	t.Helper()
	store, c := newClient(t, "a", "unix://"+b.path)
	status, err := store.ClaimStatus()
	if err != nil {
		t.Fatal(err)
	}
	runClient(t, c)
	return &agent{store: store, status: status}
}

// startNodeClient runs a client for node with its own delphi store.
func startNodeClient(t *testing.T, node, addr string) *delphi.Store {
	t.Helper()
	store, c := newClient(t, node, addr)
	runClient(t, c)
	return store
}

func newClient(t *testing.T, node, addr string) (*delphi.Store, *Client) {
	t.Helper()
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	c, err := New(Options{Node: node, Address: addr, Store: store, Logger: quiet, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return store, c
}

func runClient(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

func (a *agent) names() []string {
	var out []string
	for _, o := range a.store.List(nimbusv1.Kind_KIND_ROUTE) {
		out = append(out, o.GetMeta().GetName())
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWatchSaysTheAgentVersion(t *testing.T) {
	b := newBus(t)
	startClient(t, b)
	want := version.Get()
	waitFor(t, "nimbus to know the agent's version", func() bool {
		nodes := b.srv.Nodes()
		return len(nodes) == 1 && nodes[0].Name == "a" && nodes[0].AgentVersion == want
	})
}

func TestWatchFillsDelphi(t *testing.T) {
	b := newBus(t)
	b.apply(t, "mine", "a")
	b.apply(t, "everyone")
	b.apply(t, "theirs", "b")
	a := startClient(t, b)

	select {
	case <-a.store.Synced():
	case <-time.After(20 * time.Second):
		t.Fatal("delphi never marked synced")
	}
	if got := a.names(); !slices.Equal(got, []string{"everyone", "mine"}) {
		t.Fatalf("after snapshot delphi holds %v, want [everyone mine]", got)
	}

	changed := b.apply(t, "theirs", "a", "b")
	b.delete(t, "mine")
	waitFor(t, "delphi to follow a retarget and a delete", func() bool {
		return slices.Equal(a.names(), []string{"everyone", "theirs"})
	})
	waitFor(t, "the resume point to reach the last revision", func() bool {
		_, rev := a.store.Resume()
		return rev > changed.GetMeta().GetRevision()
	})
	got, _ := a.store.Get(routeKey("theirs"))
	if got.GetMeta().GetGeneration() != 2 {
		t.Errorf("retargeted object has generation %d, want 2", got.GetMeta().GetGeneration())
	}
}

// TestReconnectResyncsAndResendsStatus replaces nimbus with a fresh server holding a
// different set of objects: the client reconnects, drops exactly the objects the new
// snapshot lacks, and reports its status again without any new status write.
func TestReconnectResyncsAndResendsStatus(t *testing.T) {
	b := newBus(t)
	b.apply(t, "kept", "a")
	b.apply(t, "dropped", "a")
	a := startClient(t, b)
	waitFor(t, "the first snapshot", func() bool { return slices.Equal(a.names(), []string{"dropped", "kept"}) })

	programmed := &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}
	if err := a.status.Set(routeKey("kept"), programmed); err != nil {
		t.Fatal(err)
	}
	waitNodeStatus(t, b, "kept")

	b.restart(t)
	b.apply(t, "kept", "a")
	b.apply(t, "added", "a")
	waitFor(t, "the resync after reconnect", func() bool { return slices.Equal(a.names(), []string{"added", "kept"}) })
	waitNodeStatus(t, b, "kept")
}

// TestNodeRecreatedResendsStatus deletes node a's Node object, which makes nimbus forget
// every status node a reported, and applies it again: the client sends them all again,
// although none of them changed.
func TestNodeRecreatedResendsStatus(t *testing.T) {
	b := newBus(t)
	node := &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "a"}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{VtepAddress: "192.0.2.1"}}}
	applyNode := func() {
		if _, err := b.api.Apply(context.Background(), &nimbusv1.ApplyRequest{Object: node}); err != nil {
			t.Fatal(err)
		}
	}
	applyNode()
	b.apply(t, "kept", "a")
	a := startClient(t, b)
	waitFor(t, "the first snapshot", func() bool { return slices.Equal(a.names(), []string{"kept"}) })
	if err := a.status.Set(routeKey("kept"), &nimbusv1.NodeStatus{ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
		t.Fatal(err)
	}
	waitNodeStatus(t, b, "kept")

	if _, err := b.api.Delete(context.Background(), &nimbusv1.DeleteRequest{Key: node.Key()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "nimbus to forget node a's status", func() bool {
		resp, err := b.api.Get(context.Background(), &nimbusv1.GetRequest{Key: routeKey("kept")})
		if err != nil {
			return false
		}
		for _, st := range resp.GetItem().GetStatus().GetNodes() {
			if st.GetNode() == "a" && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED {
				return false
			}
		}
		return true
	})
	applyNode()
	waitNodeStatus(t, b, "kept")
}

func waitNodeStatus(t *testing.T, b *bus, name string) {
	t.Helper()
	waitFor(t, "node a's status of "+name+" at nimbus", func() bool {
		resp, err := b.api.Get(context.Background(), &nimbusv1.GetRequest{Key: routeKey(name)})
		if err != nil {
			return false
		}
		for _, st := range resp.GetItem().GetStatus().GetNodes() {
			if st.GetNode() == "a" && st.GetPhase() == nimbusv1.Phase_PHASE_PROGRAMMED {
				return true
			}
		}
		return false
	})
}
