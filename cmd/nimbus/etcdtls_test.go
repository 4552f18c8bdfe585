package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/testetcd"
)

// TestRunOnEtcdOverTLS runs a replica against an etcd that serves TLS and requires client
// certificates, with the --etcd-cacert, --etcd-cert and --etcd-key flags.
func TestRunOnEtcdOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CAOptions{CommonName: "etcd CA"})
	if err != nil {
		t.Fatal(err)
	}
	file := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(file("ca.crt"), pki.EncodeCertificate(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	server, err := ca.IssueServer([]string{"127.0.0.1"}, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.IssuePublisher("nimbus", pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := server.WriteFiles(file("etcd.crt"), file("etcd.key")); err != nil {
		t.Fatal(err)
	}
	if err := client.WriteFiles(file("client.crt"), file("client.key")); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	url := fmt.Sprintf("https://127.0.0.1:%d", port)
	var etcdOut bytes.Buffer
	etcd := exec.Command(testetcd.Binary(t), "--data-dir", file("etcd"), "--name", "m0",
		"--listen-client-urls", url, "--advertise-client-urls", url,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		"--initial-cluster-state", "new", "--log-level", "warn", "--unsafe-no-fsync",
		"--client-cert-auth", "--trusted-ca-file", file("ca.crt"),
		"--cert-file", file("etcd.crt"), "--key-file", file("etcd.key"))
	etcd.Env = []string{}
	etcd.Stdout, etcd.Stderr = &etcdOut, &etcdOut
	if err := etcd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		etcd.Process.Kill()
		etcd.Wait()
		if t.Failed() {
			t.Logf("etcd output:\n%s", etcdOut.String())
		}
	})

	sock := filepath.Join(dir, "n.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", "unix://" + sock, "--insecure", "--store", "etcd", "--etcd-endpoints", url,
			"--etcd-cacert", file("ca.crt"), "--etcd-cert", file("client.crt"), "--etcd-key", file("client.key")}, &stderr)
	}()
	applyWhenReady(t, sock, &stderr)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run = %v", err)
	}

	// Without a client certificate etcd refuses the replica, which stays unready.
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	var refused bytes.Buffer
	go func() {
		done <- run(ctx2, []string{"--listen", "unix://" + filepath.Join(dir, "n2.sock"), "--insecure", "--store", "etcd",
			"--etcd-endpoints", url, "--etcd-cacert", file("ca.crt"), "--metrics", metrics}, &refused)
	}()
	var code int
	var body string
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
			// Serve has started once the only reason left is the store's.
			if !strings.Contains(body, "not serving yet") {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd") {
		t.Fatalf("/readyz of a replica etcd refuses = %d %q, want 503 naming etcd", code, body)
	}
	cancel2()
	if err := <-done; err != nil {
		t.Fatalf("run without a client certificate = %v; log:\n%s", err, refused.String())
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
