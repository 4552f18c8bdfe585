package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/pki"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestRunWithoutCertificatesFails(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nimbus.crt")
	var stderr bytes.Buffer
	err := run(t.Context(), []string{"--listen", "unix://" + filepath.Join(dir, "n.sock"), "--ephemeral", "--tls-cert", missing}, &stderr)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--insecure") {
		t.Fatalf("run without certificate files = %v, want an error naming %s and --insecure", err, missing)
	}
}

// writePKI writes a CA, nimbus's certificate and the named node's into dir.
func writePKI(t *testing.T, dir, node string) {
	t.Helper()
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.IssueServer(nil, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.IssueNode(node, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for name, kp := range map[string]pki.KeyPair{"ca": ca.KeyPair, "nimbus": server, node: client} {
		if err := kp.WriteFiles(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")); err != nil {
			t.Fatal(err)
		}
	}
}

// addNode writes a certificate for node into dir, issued by the CA writePKI wrote
// there, and returns that CA.
func addNode(t *testing.T, dir, node string) *pki.CA {
	t.Helper()
	ca, err := pki.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.IssueNode(node, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kp.WriteFiles(filepath.Join(dir, node+".crt"), filepath.Join(dir, node+".key")); err != nil {
		t.Fatal(err)
	}
	return ca
}

// TestRunRefusesClientCertificateAsServer starts nimbus with a node's certificate as its
// own, which every client would refuse: it exits with a configuration error naming the
// file.
func TestRunRefusesClientCertificateAsServer(t *testing.T) {
	dir := t.TempDir()
	writePKI(t, dir, "host-a")
	crt := filepath.Join(dir, "host-a.crt")
	// Without the check nimbus would serve until the context ends.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := run(ctx, []string{"--listen", "unix://" + filepath.Join(dir, "n.sock"), "--ephemeral",
		"--tls-cert", crt, "--tls-key", filepath.Join(dir, "host-a.key"), "--tls-ca", filepath.Join(dir, "ca.crt")}, io.Discard)
	if exitstatus.Of(err) != 2 || !strings.Contains(err.Error(), "--tls-cert "+crt) || !strings.Contains(err.Error(), `node "host-a" is not a server certificate`) {
		t.Errorf("run with host-a's certificate as --tls-cert = %v (exit status %d), want exit status 2 and an error naming the file and the node", err, exitstatus.Of(err))
	}
}

func TestRunServesTLS(t *testing.T) {
	dir := t.TempDir()
	writePKI(t, dir, "host-a")
	sock := filepath.Join(dir, "n.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "unix://" + sock, "--ephemeral",
			"--tls-cert", filepath.Join(dir, "nimbus.crt"), "--tls-key", filepath.Join(dir, "nimbus.key"),
			"--tls-ca", filepath.Join(dir, "ca.crt")}, &stderr)
	}()

	conn := dialAs(t, dir, sock, "host-a")
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	defer callCancel()
	// A node's certificate is verified and then refused a publisher's call.
	_, err := nimbusv1.NewNimbusClient(conn).List(callCtx, &nimbusv1.ListRequest{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("List with a node certificate = %v, want PermissionDenied", err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run = %v, want nil after cancellation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancellation")
	}
	if !strings.Contains(stderr.String(), "tls=true") {
		t.Errorf("log does not say it serves TLS:\n%s", stderr.String())
	}
}
