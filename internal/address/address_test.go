package address

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Address
		wantErr bool
	}{
		{in: "tcp://127.0.0.1:9000", want: Address{"tcp", "127.0.0.1:9000"}},
		{in: "127.0.0.1:9000", want: Address{"tcp", "127.0.0.1:9000"}},
		{in: "tcp://[::1]:9000", want: Address{"tcp", "[::1]:9000"}},
		{in: "unix:///run/nimbus.sock", want: Address{"unix", "/run/nimbus.sock"}},
		{in: "unix://relative.sock", wantErr: true},
		{in: "http://x:1", wantErr: true},
		{in: "tcp://noport", wantErr: true},
	} {
		got, err := Parse(tc.in)
		if tc.wantErr {
			if !errors.Is(err, ErrBadAddress) {
				t.Errorf("Parse(%q) error = %v, want ErrBadAddress", tc.in, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestListenReplacesStaleSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "s.sock")
	a := Address{Network: "unix", Addr: path}
	l, err := a.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// A second listener on a live socket is refused.
	if _, err := a.Listen(context.Background()); err == nil {
		t.Fatal("second Listen on a served socket succeeded")
	}
	// Leave the socket file behind as a crashed process would.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
	l2, err := a.Listen(context.Background())
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	l2.Close()
}

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want List
		// wantErr is what the error must quote; empty when the list is good.
		wantErr string
	}{
		{in: "unix:///run/nimbus.sock", want: List{{"unix", "/run/nimbus.sock"}}},
		{in: " tcp://nimbus.example:7000 ", want: List{{"tcp", "nimbus.example:7000"}}},
		{
			in:   "unix:///run/a.sock, tcp://10.0.0.2:7000,[::1]:7000",
			want: List{{"unix", "/run/a.sock"}, {"tcp", "10.0.0.2:7000"}, {"tcp", "[::1]:7000"}},
		},
		{in: "", wantErr: `""`},
		{in: " ", wantErr: `" "`},
		{in: "ftp://x", wantErr: `"ftp://x"`},
		{in: "unix:///a.sock,", wantErr: "address 2 is empty"},
		{in: ",unix:///a.sock", wantErr: "address 1 is empty"},
		{in: "unix:///a.sock,ftp://x:1", wantErr: `"ftp://x:1"`},
		{in: "tcp://h:1,unix://relative.sock", wantErr: `"unix://relative.sock"`},
		{in: "tcp://h:1,tcp://noport", wantErr: `"noport"`},
		{in: "tcp://h:1,h:1", wantErr: "tcp://h:1 is listed twice"},
	} {
		got, err := ParseList(tc.in)
		if tc.wantErr != "" {
			if !errors.Is(err, ErrBadAddress) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseList(%q) error = %v, want ErrBadAddress saying %s", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			continue
		}
		if again, err := ParseList(got.String()); err != nil || !slices.Equal(again, got) {
			t.Errorf("ParseList(%q), the String of %q, = %v, %v", got.String(), tc.in, again, err)
		}
	}
}

// healthServer is a gRPC server of the health service on one address.
type healthServer struct {
	addr   Address
	srv    *grpc.Server
	health *health.Server
}

func newHealthServer(t *testing.T, a Address, opts ...grpc.ServerOption) *healthServer {
	t.Helper()
	lis, err := a.Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return &healthServer{addr: Address{Network: a.Network, Addr: lis.Addr().String()}, srv: srv, health: hs}
}

// dialList returns a plaintext connection to l made as clients of it make theirs.
func dialList(t *testing.T, l List) *grpc.ClientConn {
	t.Helper()
	return dialListWith(t, l, insecure.NewCredentials())
}

// dialListWith returns a connection to l with creds.
func dialListWith(t *testing.T, l List, creds credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	target, opts := l.GRPCTarget()
	conn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%q): %v", target, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// check calls the health service over conn, waiting for a connection, and returns the
// address it reached. A call on a connection that breaks under it fails; check tries
// again until the deadline.
func check(t *testing.T, conn *grpc.ClientConn) Address {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		var p peer.Peer
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true), grpc.Peer(&p))
		if err == nil {
			return Address{Network: p.Addr.Network(), Addr: p.Addr.String()}
		}
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			t.Fatalf("health check over %s: %v", conn.Target(), err)
		}
	}
}

// TestListSpreadsAndFailsOver dials a list of a unix and a tcp address many times: the
// connections spread over both, and those on the unix socket move to the tcp address
// once its server stops.
func TestListSpreadsAndFailsOver(t *testing.T) {
	onUnix := newHealthServer(t, Address{Network: "unix", Addr: filepath.Join(t.TempDir(), "s.sock")})
	onTCP := newHealthServer(t, Address{Network: "tcp", Addr: "127.0.0.1:0"})
	l, err := ParseList(onUnix.addr.String() + "," + onTCP.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	// Each connection picks the first address at random: all 24 on one is a chance of 2^-23.
	var conns []*grpc.ClientConn
	reached := map[Address]int{}
	for range 24 {
		conn := dialList(t, l)
		conns = append(conns, conn)
		reached[check(t, conn)]++
	}
	if len(reached) != 2 || reached[onUnix.addr] == 0 || reached[onTCP.addr] == 0 {
		t.Fatalf("24 connections to %s reached %v, want both addresses", l, reached)
	}

	onUnix.srv.Stop()
	for _, conn := range conns {
		if got := check(t, conn); got != onTCP.addr {
			t.Fatalf("after %s stopped a connection reached %s, want %s", onUnix.addr, got, onTCP.addr)
		}
	}
}

// TestListSkipsServerNotServing lists a server that is up but says NOT_SERVING, as a
// nimbus replica that has not read etcd yet does, and a healthy one: every connection
// sends its calls to the healthy one, and moves to the other once that one serves and
// the first stops serving.
func TestListSkipsServerNotServing(t *testing.T) {
	notReady := newHealthServer(t, Address{Network: "unix", Addr: filepath.Join(t.TempDir(), "a.sock")})
	notReady.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	ready := newHealthServer(t, Address{Network: "unix", Addr: filepath.Join(t.TempDir(), "b.sock")})
	l := List{notReady.addr, ready.addr}
	var conns []*grpc.ClientConn
	for i := range 20 {
		conn := dialList(t, l)
		conns = append(conns, conn)
		if got := check(t, conn); got != ready.addr {
			t.Fatalf("connection %d to %s reached %s, which is not serving; want %s", i+1, l, got, ready.addr)
		}
	}

	notReady.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	ready.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	for i, conn := range conns {
		waitReach(t, conn, notReady.addr, fmt.Sprintf("connection %d", i+1))
	}
}

// TestListOfServersNotServing lists two servers that are up but say NOT_SERVING: a call
// that does not wait for a healthy server reaches one of them, which answers for itself,
// rather than failing with a bare health-check failure.
func TestListOfServersNotServing(t *testing.T) {
	var l List
	for _, name := range []string{"a.sock", "b.sock"} {
		s := newHealthServer(t, Address{Network: "unix", Addr: filepath.Join(t.TempDir(), name)})
		s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
		l = append(l, s.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var p peer.Peer
	resp, err := healthpb.NewHealthClient(dialList(t, l)).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		t.Fatalf("health check over %s, whose servers are up but not serving: %v", l, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING || !slices.Contains(l, Address{Network: p.Addr.Network(), Addr: p.Addr.String()}) {
		t.Errorf("health check over %s = %v from %v, want NOT_SERVING from one of them", l, resp.GetStatus(), p.Addr)
	}
}

// waitReach calls over conn until a call reaches want, within a generous deadline.
func waitReach(t *testing.T, conn *grpc.ClientConn, want Address, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for got := check(t, conn); got != want; got = check(t, conn) {
		if time.Now().After(deadline) {
			t.Fatalf("%s still reaches %s, want %s", what, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestListUnreachable checks that a call over a list of dead addresses fails rather
// than waits when it does not ask to wait.
func TestListUnreachable(t *testing.T) {
	dir := t.TempDir()
	l := List{{"unix", filepath.Join(dir, "a.sock")}, {"unix", filepath.Join(dir, "b.sock")}}
	conn := dialList(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("health check over %s with no server = %v, want Unavailable", l, err)
	}
}

// TestListOfOneHostName checks that one tcp host name is resolved by gRPC: the target
// names the dns resolver, and the connection reaches the server on the name's address.
func TestListOfOneHostName(t *testing.T) {
	srv := newHealthServer(t, Address{Network: "tcp", Addr: "127.0.0.1:0"})
	_, port, err := net.SplitHostPort(srv.addr.Addr)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ParseList("tcp://localhost:" + port)
	if err != nil {
		t.Fatal(err)
	}
	if target, _ := l.GRPCTarget(); target != "dns:///localhost:"+port {
		t.Errorf("target of %s = %q, want dns:///localhost:%s", l, target, port)
	}
	ips, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", "localhost")
	loopback := func(ip netip.Addr) bool { return ip.Unmap() == netip.MustParseAddr("127.0.0.1") }
	if err != nil || !slices.ContainsFunc(ips, loopback) {
		t.Skipf("localhost resolves to %v (%v) here, not to 127.0.0.1", ips, err)
	}
	if got := check(t, dialList(t, l)); got != srv.addr {
		t.Errorf("a connection to %s reached %s, want %s", l, got, srv.addr)
	}
}

// TestListOverTLS dials a list of a unix and a tcp address whose servers speak TLS with a
// nimbus certificate: the client verifies each as the server name its TLS config gives,
// and moves from one to the other.
func TestListOverTLS(t *testing.T) {
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.IssueServer(nil, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	serverCreds := grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{kp.Cert.Raw}, PrivateKey: kp.Key}},
	}))
	servers := map[Address]*healthServer{}
	for _, a := range []Address{{"unix", filepath.Join(t.TempDir(), "s.sock")}, {"tcp", "127.0.0.1:0"}} {
		s := newHealthServer(t, a, serverCreds)
		servers[s.addr] = s
	}
	var l List
	for a := range servers {
		l = append(l, a)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	conn := dialListWith(t, l, credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: pki.DefaultServerName}))
	first := check(t, conn)
	servers[first].srv.Stop()
	if second := check(t, conn); second == first {
		t.Fatalf("after %s stopped the connection reached it again", first)
	}
}

// TestListRouteMoves lists three servers: a call whose Route avoids the server calls go
// to moves them to the server it prefers, once that one is ready, and the calls after it
// stay there; a Route that avoids another server, or none, moves nothing.
func TestListRouteMoves(t *testing.T) {
	dir := t.TempDir()
	var l List
	for _, name := range []string{"a.sock", "b.sock", "c.sock"} {
		l = append(l, newHealthServer(t, Address{Network: "unix", Addr: filepath.Join(dir, name)}).addr)
	}
	conn := dialList(t, l)
	routed := func(r *Route) Address {
		t.Helper()
		var p peer.Peer
		ctx, cancel := context.WithTimeout(WithRoute(context.Background(), r), 20*time.Second)
		defer cancel()
		if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true), grpc.Peer(&p)); err != nil {
			t.Fatalf("health check over %s: %v", l, err)
		}
		got := Address{Network: p.Addr.Network(), Addr: p.Addr.String()}
		if r.Chosen() != got.String() {
			t.Fatalf("Route.Chosen() = %q, but the call reached %s", r.Chosen(), got)
		}
		return got
	}
	cur := routed(&Route{})
	prefer := l[0]
	if prefer == cur {
		prefer = l[1]
	}
	// The other servers may not be connected yet: a call stays where it is while none is,
	// goes to the third while the preferred one is not, and the next one tries again.
	// Without a Route calls never leave the server they reach.
	deadline := time.Now().Add(20 * time.Second)
	for cur != prefer {
		if time.Now().After(deadline) {
			t.Fatalf("calls avoiding the current server never reached the preferred %s", prefer)
		}
		cur = routed(&Route{Avoid: cur.String(), Prefer: prefer.String()})
		time.Sleep(10 * time.Millisecond)
	}
	for _, r := range []*Route{{}, {Avoid: l[2].String()}, {Avoid: "unix:///elsewhere", Prefer: l[2].String()}} {
		if got := routed(r); got != prefer {
			t.Fatalf("a call with Route{Avoid: %q, Prefer: %q} reached %s, want %s, where the move went", r.Avoid, r.Prefer, got, prefer)
		}
	}
	if got := check(t, conn); got != prefer {
		t.Fatalf("a call without a Route reached %s, want %s", got, prefer)
	}
}
