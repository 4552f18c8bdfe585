package nimbus

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testServer is a Server serving on a unix socket in the test's temporary directory, and
// a client connected to it.
type testServer struct {
	srv    *Server
	client nimbusv1.NimbusClient
	path   string
	clock  *fakeClock
}

// start serves a new Server for the test; the test's cleanup stops it and checks that
// Serve returned nil. Unset Logger and Now are set to the test's log and a fake clock.
func start(t *testing.T, opts Options) *testServer {
	t.Helper()
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.Now == nil {
		opts.Now = clock.Now
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	path := filepath.Join(t.TempDir(), "n.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve returned %v, want nil", err)
		}
	})
	return &testServer{srv: srv, client: dial(t, path), path: path, clock: clock}
}

// dial connects a new client to the socket; the test's cleanup closes it.
func dial(t *testing.T, path string, opts ...grpc.DialOption) nimbusv1.NimbusClient {
	t.Helper()
	return nimbusv1.NewNimbusClient(dialConn(t, path, opts...))
}

// dialConn connects to the socket, in plaintext unless opts say otherwise; the test's
// cleanup closes the connection.
func dialConn(t *testing.T, path string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient("unix://"+path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// testContext returns a context that ends with the test or after a minute: a bound on a
// test that hangs, generous enough for a race-detector build on a loaded machine, where
// moving tens of MiB of reports takes more than ten seconds.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) Timestamp() *timestamppb.Timestamp { return timestamppb.New(c.Now()) }

// route returns a Route in table 100 to 10.1.0.0/16 via the gateways, targeted at nodes.
func route(name string, nodes []string, gateways ...string) *nimbusv1.Object {
	var hops []*nimbusv1.NextHop
	for _, gw := range gateways {
		hops = append(hops, &nimbusv1.NextHop{Gateway: gw})
	}
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Nodes: nodes},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Table: 100, Prefix: "10.1.0.0/16", Nexthops: hops}},
	}
}

// nodeObject returns a Node object for the named host, with a VTEP address of its own.
func nodeObject(name string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: name, VtepAddress: vtepOf(name)}},
	}
}

// vtepOf returns a VTEP address for the named node, the same for a name every time and a
// different one for each name: an IPv6 unique local address made of a hash of the name.
func vtepOf(name string) string {
	h := fnv.New64a()
	h.Write([]byte(name))
	var b [16]byte
	b[0] = 0xfd
	binary.BigEndian.PutUint64(b[8:], h.Sum64())
	return netip.AddrFrom16(b).String()
}

func routeKey(name string) *nimbusv1.ObjectKey {
	return nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
}

// apply applies the object and fails the test on error.
func (ts *testServer) apply(t *testing.T, obj *nimbusv1.Object) *nimbusv1.ApplyResponse {
	t.Helper()
	resp, err := ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: obj})
	if err != nil {
		t.Fatalf("Apply %s: %v", obj.Key().ID(), err)
	}
	return resp
}

// get gets the object and fails the test on error.
func (ts *testServer) get(t *testing.T, key *nimbusv1.ObjectKey) *nimbusv1.ObjectWithStatus {
	t.Helper()
	resp, err := ts.client.Get(testContext(t), &nimbusv1.GetRequest{Key: key})
	if err != nil {
		t.Fatalf("Get %s: %v", key.ID(), err)
	}
	return resp.GetItem()
}

// wantCode fails the test unless err is a status with the code.
func wantCode(t *testing.T, err error, code codes.Code) *status.Status {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("error = %v, want code %v", err, code)
	}
	return st
}

func TestNewRefusesNegativeWatchBuffer(t *testing.T) {
	if _, err := New(Options{WatchBuffer: -1}); !errors.Is(err, ErrInvalidOptions) {
		t.Fatalf("New(WatchBuffer: -1) error = %v, want ErrInvalidOptions", err)
	}
}

func TestServeWithoutListeners(t *testing.T) {
	srv, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(t.Context()); !errors.Is(err, ErrNoListeners) {
		t.Fatalf("Serve() error = %v, want ErrNoListeners", err)
	}
}

func TestCloseEndsWatchesAndWrites(t *testing.T) {
	ts := start(t, Options{})
	ctx := testContext(t)
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)
	reports, err := ts.client.ReportStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if err := ts.srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := ts.srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err = w.Recv()
	wantCode(t, err, codes.Unavailable)
	_, err = reports.CloseAndRecv()
	wantCode(t, err, codes.Unavailable)

	_, err = ts.client.Apply(ctx, &nimbusv1.ApplyRequest{Object: route("r1", nil, "192.0.2.1")})
	wantCode(t, err, codes.Unavailable)
	w2, err := ts.client.Watch(ctx, &nimbusv1.WatchRequest{Node: "a"})
	if err == nil {
		_, err = w2.Recv()
	}
	wantCode(t, err, codes.Unavailable)
	// Reads still answer.
	if _, err := ts.client.List(ctx, &nimbusv1.ListRequest{}); err != nil {
		t.Fatalf("List after Close: %v", err)
	}
}

func TestServeReturnsListenerError(t *testing.T) {
	srv, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "n.sock"))
	if err != nil {
		t.Fatal(err)
	}
	lis.Close()
	if err := srv.Serve(t.Context(), lis); err == nil || !strings.Contains(err.Error(), "serving nimbus on") {
		t.Fatalf("Serve on a closed listener = %v, want an error saying where it was serving", err)
	}
}
