package nimbus

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestHealthServiceNeedsOnlyACertificate: a stock gRPC health probe presenting any
// certificate the CAs issued, here a node's, hears SERVING; readiness says the same.
func TestHealthServiceNeedsOnlyACertificate(t *testing.T) {
	ts, p := startTLS(t)
	kp, err := p.ca.IssueNode("host-a", pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+ts.path, grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(kp))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := testContext(t)
	hc := healthpb.NewHealthClient(conn)
	for _, service := range []string{"", nimbusv1.Nimbus_ServiceDesc.ServiceName} {
		got, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
		if err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health Check(%q) as a node = %v, %v; want SERVING", service, got, err)
		}
	}
	if reasons := ts.srv.Ready(); len(reasons) != 0 {
		t.Errorf("Ready() while serving = %q, want none", reasons)
	}
	ts.srv.Close()
	if reasons := ts.srv.Ready(); len(reasons) == 0 {
		t.Error("Ready() after Close says ready")
	}
}
