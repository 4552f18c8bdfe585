package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// quiet is the logger of the tests' servers and clients.
var quiet = slog.New(slog.DiscardHandler)

// testServer is a nimbus serving on a unix socket until the test ends or stop is called.
type testServer struct {
	srv  *nimbus.Server
	stop func()
}

// serve serves a new nimbus on the socket, durable in dataDir unless it is empty.
func serve(t *testing.T, socket, dataDir string) *testServer {
	t.Helper()
	return serveWith(t, socket, nimbus.Options{DataDir: dataDir})
}

// serveWith serves a new nimbus with the options on the socket.
func serveWith(t *testing.T, socket string, opts nimbus.Options) *testServer {
	t.Helper()
	opts.Logger = quiet
	srv, err := nimbus.New(opts)
	if err != nil {
		t.Fatalf("nimbus.New: %v", err)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}
	t.Cleanup(stop)
	return &testServer{srv: srv, stop: stop}
}

// socketPath returns a path for a socket in the test's temporary directory.
func socketPath(t *testing.T) string {
	return filepath.Join(t.TempDir(), "nimbus.sock")
}

// newClient returns a Client of the nimbus at the socket, closed when the test ends.
func newClient(t *testing.T, socket string, opts Options) *Client {
	t.Helper()
	opts.Address = "unix://" + socket
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if opts.MaxBackoff == 0 {
		opts.MinBackoff, opts.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rawClient returns a plain nimbus client of the socket, as an agent or a test needs it.
func rawClient(t *testing.T, socket string) nimbusv1.NimbusClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return nimbusv1.NewNimbusClient(conn)
}

// testContext returns a context that ends with the test or after 10s.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// route returns a Route called name targeted at nodes; gateway tells versions apart.
func route(name, gateway string, nodes ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: nodes},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{
			Table: 100, Prefix: "10.1.0.0/16", Nexthops: []*nimbusv1.NextHop{{Gateway: gateway}},
		}},
	}
}

func routeKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
}

// report has the node report the phase of the route at the generation, through a real
// ReportStatus stream; when it returns, nimbus has taken the report.
func report(t *testing.T, api nimbusv1.NimbusClient, name, node string, gen int64, phase nimbusv1.Phase, reason, msg string) {
	t.Helper()
	stream, err := api.ReportStatus(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&nimbusv1.StatusReport{
		Key:    routeKey(name),
		Status: &nimbusv1.NodeStatus{Node: node, ObservedGeneration: gen, Phase: phase, Reason: reason, Message: msg},
	})
	if err != nil {
		t.Fatalf("sending a status report: %v", err)
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		t.Fatalf("ReportStatus: %v", err)
	}
}

// recorder is a SyncReactor that records what it is handed as lines on a channel:
// "status NAME gen G programmed P/T", "delete NAME", "synced".
type recorder chan string

func (r recorder) OnStatus(item *nimbusv1.ObjectWithStatus) {
	st := item.GetStatus()
	r <- fmt.Sprintf("status %s gen %d programmed %d/%d", item.GetObject().GetMeta().GetName(),
		item.GetObject().GetMeta().GetGeneration(), st.GetProgrammedNodes(), st.GetTargetNodes())
}

func (r recorder) OnDelete(key *nimbusv1.ObjectKey) { r <- "delete " + key.GetName() }

func (r recorder) OnSynced() { r <- "synced" }

// next returns the next line, or fails the test after 10s.
func (r recorder) next(t *testing.T) string {
	t.Helper()
	select {
	case l := <-r:
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("the reactor was not called within 10s")
		return ""
	}
}

// watch runs c.WatchStatus with a recorder until the test ends, and checks that it
// returns nil then.
func watch(t *testing.T, c *Client, f Filter) recorder {
	t.Helper()
	r := make(recorder, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.WatchStatus(ctx, f, r) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchStatus returned %v after its context ended, want nil", err)
		}
	})
	return r
}
