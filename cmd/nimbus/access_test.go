package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/internal/telemetry/telemetrytest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestCertificateExpiry serves with a server certificate that expires in 10 days: the
// expiry gauge holds its NotAfter and the CA's, and /readyz answers 200 with a warning
// naming the file, until --tls-expiry-warning is shorter than what is left.
func TestCertificateExpiry(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	server, err := ca.IssueServer(nil, pki.CertOptions{Validity: 10*24*time.Hour + time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if err := ca.WriteFiles(p("ca.crt"), p("ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := server.WriteFiles(p("nimbus.crt"), p("nimbus.key")); err != nil {
		t.Fatal(err)
	}
	args := []string{"--listen", "unix://" + p("n.sock"), "--ephemeral", "--metrics", "127.0.0.1:0",
		"--tls-cert", p("nimbus.crt"), "--tls-key", p("nimbus.key"), "--tls-ca", p("ca.crt")}
	url, stop := runNimbus(t, args...)
	base := strings.TrimSuffix(url, "/metrics")

	_, body := telemetrytest.Get(t, url)
	m := telemetrytest.Parse(t, body)
	for series, want := range map[string]time.Time{
		`naples_nimbus_tls_certificate_expiry_seconds{certificate="server",file="` + p("nimbus.crt") + `"}`: server.Cert.NotAfter,
		`naples_nimbus_tls_certificate_expiry_seconds{certificate="ca",file="` + p("ca.crt") + `"}`:         ca.Cert.NotAfter,
	} {
		if v, ok := m[series]; !ok || v != float64(want.Unix()) {
			t.Errorf("%s = %v (present %v), want %d", series, v, ok, want.Unix())
		}
	}
	want := "warning: certificate " + p("nimbus.crt") + " expires in 10 days (" + server.Cert.NotAfter.UTC().Format(time.RFC3339) + ")"
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := telemetrytest.Get(t, base+"/readyz")
		if code == http.StatusOK {
			if body != "ready\n"+want+"\n" {
				t.Errorf("/readyz = %q, want ready and %q", body, want)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q, want 200 within 10s", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()

	url, _ = runNimbus(t, append(args, "--tls-expiry-warning", strconv.Itoa(9*24)+"h")...)
	deadline = time.Now().Add(10 * time.Second)
	for {
		code, body := telemetrytest.Get(t, strings.TrimSuffix(url, "/metrics")+"/readyz")
		if code == http.StatusOK {
			if body != "ready\n" {
				t.Errorf("/readyz with --tls-expiry-warning 216h = %q, want no warning", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %q, want 200 within 10s", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCertificateRenewedInPlace serves with a server certificate that expires in 10 days,
// writes a renewed one over its files, and checks that new connections get the new one
// without a restart, and that the expiry gauge and /readyz follow it.
func TestCertificateRenewedInPlace(t *testing.T) {
	dir := t.TempDir()
	ca, err := pki.NewCA(pki.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	if err := ca.WriteFiles(p("ca.crt"), p("ca.key")); err != nil {
		t.Fatal(err)
	}
	old, err := ca.IssueServer(nil, pki.CertOptions{Validity: 10 * 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	renewed, err := ca.IssueServer(nil, pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.IssueNode("host-a", pki.CertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for kp, name := range map[*pki.KeyPair]string{&old: "nimbus", &node: "host-a"} {
		if err := kp.WriteFiles(p(name+".crt"), p(name+".key")); err != nil {
			t.Fatal(err)
		}
	}
	url, _ := runNimbus(t, "--listen", "unix://"+p("n.sock"), "--ephemeral", "--metrics", "127.0.0.1:0",
		"--tls-cert", p("nimbus.crt"), "--tls-key", p("nimbus.key"), "--tls-ca", p("ca.crt"))
	// served returns the serial of the certificate nimbus presents to a new connection,
	// once it listens.
	served := func() string {
		cfg, err := pki.ClientConfig(p("host-a.crt"), p("host-a.key"), p("ca.crt"), "")
		if err != nil {
			t.Fatal(err)
		}
		cfg.NextProtos = []string{"h2"}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			conn, err := tls.Dial("unix", p("n.sock"), cfg)
			if err == nil {
				defer conn.Close()
				return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
			}
			if time.Now().After(deadline) {
				t.Fatalf("handshake with nimbus: %v", err)
			}
		}
	}
	if got := served(); got != old.Cert.SerialNumber.String() {
		t.Fatalf("nimbus serves serial %s, want %s", got, old.Cert.SerialNumber)
	}
	if err := renewed.WriteFiles(p("nimbus.crt"), p("nimbus.key")); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour) // a file system's coarse clock must not hide the change
	for _, f := range []string{"nimbus.crt", "nimbus.key"} {
		if err := os.Chtimes(p(f), later, later); err != nil {
			t.Fatal(err)
		}
	}
	gauge := `naples_nimbus_tls_certificate_expiry_seconds{certificate="server",file="` + p("nimbus.crt") + `"}`
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		got := served()
		_, body := telemetrytest.Get(t, url)
		expiry := telemetrytest.Parse(t, body)[gauge]
		code, ready := telemetrytest.Get(t, strings.TrimSuffix(url, "/metrics")+"/readyz")
		if got == renewed.Cert.SerialNumber.String() && expiry == float64(renewed.Cert.NotAfter.Unix()) && code == http.StatusOK && ready == "ready\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the renewal nimbus serves serial %s (want %s), %s = %v (want %d), /readyz %d %q (want 200 without a warning)",
				got, renewed.Cert.SerialNumber, gauge, expiry, renewed.Cert.NotAfter.Unix(), code, ready)
		}
	}
}

// TestRevocation serves with --tls-crl: once a node's certificate is added to the list,
// its open watch ends within the reload interval and its new handshakes are refused,
// while another node's watch goes on.
func TestRevocation(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	writePKI(t, dir, "host-a")
	ca := addNode(t, dir, "host-b")
	crl, err := ca.RevocationList(nil, nil, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteRevocationList(p("ca.crl"), crl); err != nil {
		t.Fatal(err)
	}
	sock := p("n.sock")
	url, _ := runNimbus(t, "--listen", "unix://"+sock, "--ephemeral", "--metrics", "127.0.0.1:0",
		"--tls-cert", p("nimbus.crt"), "--tls-key", p("nimbus.key"), "--tls-ca", p("ca.crt"),
		"--tls-crl", p("ca.crl"), "--tls-crl-interval", "100ms")

	// watch opens a watch as node and returns the error that ends it.
	watch := func(node string) <-chan error {
		conn := dialAs(t, dir, sock, node)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		stream, err := nimbusv1.NewNimbusClient(conn).Watch(ctx, &nimbusv1.WatchRequest{Node: node}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("Watch as %s: %v", node, err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("Watch as %s: first frame: %v", node, err)
		}
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					ended <- err
					return
				}
			}
		}()
		return ended
	}
	endedA, endedB := watch("host-a"), watch("host-b")

	hostA, err := pki.ReadCertificates(p("host-a.crt"))
	if err != nil {
		t.Fatal(err)
	}
	prev, err := pki.ReadRevocationList(p("ca.crl"), []*x509.Certificate{ca.Cert})
	if err != nil {
		t.Fatal(err)
	}
	if crl, err = ca.RevocationList(prev, hostA[:1], time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteRevocationList(p("ca.crl"), crl); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-endedA:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("host-a's watch ended with %v, want Unavailable (its connection closed)", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("host-a's watch still runs 10s after its certificate was revoked")
	}
	select {
	case err := <-endedB:
		t.Fatalf("host-b's watch ended with %v; only host-a's certificate is revoked", err)
	default:
	}

	// host-a's new connections are refused at the handshake; its client sees why.
	conn := dialAs(t, dir, sock, "host-a")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = nimbusv1.NewNimbusClient(conn).Watch(ctx, &nimbusv1.WatchRequest{Node: "host-a"})
	if err == nil {
		stream, _ := nimbusv1.NewNimbusClient(conn).Watch(ctx, &nimbusv1.WatchRequest{Node: "host-a"})
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("a new watch as host-a = %v, want Unavailable (handshake refused)", err)
	}

	// The client may see the refusal before nimbus counts it.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, body := telemetrytest.Get(t, url)
		m := telemetrytest.Parse(t, body)
		closed, refused := m["naples_nimbus_tls_revoked_connections_closed_total"], m[`naples_nimbus_tls_handshakes_refused_total{reason="revoked"}`]
		if closed == 1 && refused >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s, %v connections closed for revocation and %v handshakes refused as revoked; want 1 and 1 at least", closed, refused)
		}
	}
}

// dialAs returns a client of the nimbus on the unix socket sock that presents the
// certificate name.crt of dir, closed when the test ends.
func dialAs(t *testing.T, dir, sock, name string) *grpc.ClientConn {
	t.Helper()
	cfg, err := pki.ClientConfig(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, "ca.crt"), "")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// otherGroup returns a group, not the process's own, that the process may give its files
// to: any group for root, else one it is a member of. It skips the test when there is
// none, outside CI.
func otherGroup(t *testing.T) *user.Group {
	t.Helper()
	member, err := os.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"naples", "daemon", "nogroup", "users", "adm", "bin", "sys"} {
		g, err := user.LookupGroup(name)
		if err != nil {
			continue
		}
		gid, _ := strconv.Atoi(g.Gid)
		if gid != os.Getgid() && (os.Geteuid() == 0 || slices.Contains(member, gid)) {
			return g
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no group to give the socket to")
	}
	t.Skip("no group to give the socket to: run as root, or as a member of a second group")
	return nil
}

// TestSocketGroup serves the unix socket mode 0660 to --socket-group, and refuses a
// group that does not exist when the command line names it.
func TestSocketGroup(t *testing.T) {
	g := otherGroup(t)
	sock := filepath.Join(t.TempDir(), "n.sock")
	runNimbus(t, "--listen", "unix://"+sock, "--insecure", "--ephemeral", "--metrics", "127.0.0.1:0", "--socket-group", g.Name)
	// nimbus serves metrics before it listens: wait for the socket to be shared.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		fi, err := os.Stat(sock)
		var gid uint32
		if err == nil {
			gid = fi.Sys().(*syscall.Stat_t).Gid
			if fi.Mode()&os.ModeSocket != 0 && fi.Mode().Perm() == 0o660 && strconv.Itoa(int(gid)) == g.Gid {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket %s after 10s: %v, gid %d, error %v; want a socket of mode 0660 and group %s (%s)", sock, fi, gid, err, g.Name, g.Gid)
		}
	}

	sock = filepath.Join(t.TempDir(), "n.sock")
	err := run(t.Context(), []string{"--listen", "unix://" + sock, "--insecure", "--ephemeral", "--socket-group", "no-such-group-naples"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `--socket-group "no-such-group-naples"`) {
		t.Errorf("run with --socket-group no-such-group-naples = %v, want an error naming the flag and the group", err)
	}
}
