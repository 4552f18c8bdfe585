package grpcserver

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// serve serves the health service, whose Watch runs until the client or the server ends
// it, on a unix socket; it returns the server, a client and the channel Serve's result
// arrives on.
func serve(t *testing.T) (*grpc.Server, healthpb.HealthClient, <-chan error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s.sock")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.WaitForHandlers(true))
	healthpb.RegisterHealthServer(gs, health.NewServer())
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return gs, healthpb.NewHealthClient(conn), served
}

func TestStopWithNothingRunning(t *testing.T) {
	gs, client, served := serve(t)
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	// A context that never ends: Stop returns because the drain is complete.
	if Stop(context.Background(), gs) {
		t.Error("Stop with no RPC running reports cutting the drain short")
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v, want nil after Stop", err)
	}
}

func TestStopCutsDrainShort(t *testing.T) {
	gs, client, served := serve(t)
	watch, err := client.Watch(context.Background(), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil { // the handler is running
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the drain timeout is over at once
	if !Stop(ctx, gs) {
		t.Error("Stop with a watch running reports a complete drain")
	}
	if _, err := watch.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("the running watch ended with %v, want Unavailable", err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve = %v, want nil after Stop", err)
	}
}
