package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/pki"
	"github.com/naplesnet/naples/nimbus"
)

// tlsCtl runs naplesctl in-process with the environment vars and returns its stdout.
func tlsCtl(t *testing.T, vars map[string]string, stdin string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	c := &cli{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, now: time.Now}
	err := c.run(t.Context(), args, func(k string) string { return vars[k] })
	return out.String(), err
}

// pairIdentity loads the pair name.crt, name.key of dir and returns who it names.
func pairIdentity(t *testing.T, dir, name string) pki.Identity {
	t.Helper()
	kp, err := pki.LoadKeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	id, err := pki.IdentityOf(kp.Cert)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return id
}

func TestCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	out, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-a,host-b", "--server-hosts", "nimbus.example,10.0.0.1")
	if err != nil {
		t.Fatalf("certs: %v", err)
	}
	for _, name := range []string{"ca", "nimbus", "publisher", "host-a", "host-b"} {
		cert, key := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		if !strings.Contains(out, "wrote   "+cert+", "+key) {
			t.Errorf("output does not say it wrote %s and %s:\n%s", cert, key, out)
		}
		fi, err := os.Stat(key)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", key, fi.Mode().Perm())
		}
	}
	for name, want := range map[string]pki.Identity{
		"publisher": {Role: pki.RolePublisher, Name: "admin"},
		"host-a":    {Role: pki.RoleNode, Name: "host-a"},
		"host-b":    {Role: pki.RoleNode, Name: "host-b"},
	} {
		if got := pairIdentity(t, dir, name); got != want {
			t.Errorf("%s.crt names %v, want %v", name, got, want)
		}
	}
	server, err := pki.LoadKeyPair(filepath.Join(dir, "nimbus.crt"), filepath.Join(dir, "nimbus.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"nimbus", "localhost", "nimbus.example", "10.0.0.1", "::1"} {
		if err := server.Cert.VerifyHostname(h); err != nil {
			t.Errorf("nimbus.crt: %v", err)
		}
	}

	// Again with another node: the CA and the existing certificates are kept as they are.
	before := map[string][]byte{}
	for _, f := range []string{"ca.crt", "ca.key", "nimbus.crt", "host-a.crt", "host-a.key"} {
		before[f], _ = os.ReadFile(filepath.Join(dir, f))
	}
	out, err = tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-a,host-c", "--server-hosts", "10.0.0.1")
	if err != nil {
		t.Fatalf("certs again: %v", err)
	}
	for f, b := range before {
		if now, _ := os.ReadFile(filepath.Join(dir, f)); !bytes.Equal(now, b) {
			t.Errorf("%s changed when certs ran again", f)
		}
	}
	if !strings.Contains(out, "kept    "+filepath.Join(dir, "ca.crt")) || !strings.Contains(out, "wrote   "+filepath.Join(dir, "host-c.crt")) {
		t.Errorf("second run does not say it kept the CA and wrote host-c:\n%s", out)
	}
	ca, err := pki.LoadCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.LoadKeyPair(filepath.Join(dir, "host-c.crt"), filepath.Join(dir, "host-c.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Cert.CheckSignatureFrom(ca.Cert); err != nil {
		t.Errorf("host-c.crt is not issued by the existing CA: %v", err)
	}
}

func TestCertsReplicas(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	// nimbus-1 is also a node: a host may run a replica and an agent.
	out, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--replicas", "nimbus-1,nimbus-2", "--nodes", "nimbus-1",
		"--server-hosts", "nimbus.example")
	if err != nil {
		t.Fatalf("certs: %v", err)
	}
	for name, want := range map[string]pki.Identity{
		"replica-nimbus-1": {Role: pki.RoleReplica, Name: "nimbus-1"},
		"replica-nimbus-2": {Role: pki.RoleReplica, Name: "nimbus-2"},
		"nimbus-1":         {Role: pki.RoleNode, Name: "nimbus-1"},
	} {
		if !strings.Contains(out, "wrote   "+filepath.Join(dir, name+".crt")) {
			t.Errorf("output does not say it wrote %s.crt:\n%s", name, out)
		}
		if got := pairIdentity(t, dir, name); got != want {
			t.Errorf("%s.crt names %v, want %v", name, got, want)
		}
	}
	r1, err := pki.LoadKeyPair(filepath.Join(dir, "replica-nimbus-1.crt"), filepath.Join(dir, "replica-nimbus-1.key"))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"nimbus", "localhost", "nimbus.example", "nimbus-1", "127.0.0.1"} {
		if err := r1.Cert.VerifyHostname(h); err != nil {
			t.Errorf("replica-nimbus-1.crt: %v", err)
		}
	}

	// Served with it, nimbus-1 is a nimbus to naplesctl; presented by nimbus-2, it is
	// a replica, which may not list objects.
	vars := map[string]string{
		ServerEnv:  startTLSNimbusAs(t, dir, "replica-nimbus-1", nimbus.Options{ReplicaName: "nimbus-1"}),
		TLSCertEnv: filepath.Join(dir, "publisher.crt"), TLSKeyEnv: filepath.Join(dir, "publisher.key"),
		TLSCAEnv: filepath.Join(dir, "ca.crt"),
	}
	if out, err := tlsCtl(t, vars, tlsRoute, "apply", "-f", "-"); err != nil || !strings.Contains(out, "created") {
		t.Fatalf("apply to the replica = %q, %v; want created", out, err)
	}
	_, err = tlsCtl(t, vars, "", "get", "routes",
		"--tls-cert", filepath.Join(dir, "replica-nimbus-2.crt"), "--tls-key", filepath.Join(dir, "replica-nimbus-2.key"))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `replica "nimbus-2" may not call List`) {
		t.Errorf("get with nimbus-2's replica certificate = %v, want PermissionDenied naming the replica", err)
	}

	// Again: the replica certificates are kept.
	out, err = tlsCtl(t, nil, "", "certs", "--dir", dir, "--replicas", "nimbus-2", "--server-hosts", "nimbus.example")
	if err != nil || !strings.Contains(out, "kept    "+filepath.Join(dir, "replica-nimbus-2.crt")) {
		t.Errorf("certs again = %v, want replica-nimbus-2.crt kept:\n%s", err, out)
	}
}

func TestCertsRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-a"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "host-a.key")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"another publisher", []string{"--publisher", "ops"}, filepath.Join(dir, "publisher.crt")},
		{"a server host the certificate lacks", []string{"--server-hosts", "other.example"}, "other.example"},
		{"a certificate without its key", []string{"--nodes", "host-a"}, filepath.Join(dir, "host-a.key")},
		{"a node named like a fixed file", []string{"--nodes", "nimbus"}, `"nimbus"`},
		{"a bad node name", []string{"--nodes", "Host_A"}, "Host_A"},
		{"a replica name with a slash", []string{"--replicas", "a/b"}, `"a/b"`},
		{"a replica and a node of one file", []string{"--replicas", "x", "--nodes", "replica-x"}, "replica-x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tlsCtl(t, nil, "", append([]string{"certs", "--dir", dir}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("certs %q = %v, want an error naming %s", tc.args, err, tc.want)
			}
		})
	}
}

// startTLSNimbus serves nimbus with the certificates naplesctl certs wrote into dir, on a
// unix socket, until the test ends, and returns its address.
func startTLSNimbus(t *testing.T, dir string) string {
	t.Helper()
	return startTLSNimbusAs(t, dir, "nimbus", nimbus.Options{})
}

// startTLSNimbusAs is startTLSNimbus with the pair name.crt, name.key of dir as the
// server's certificate and opts.
func startTLSNimbusAs(t *testing.T, dir, name string, opts nimbus.Options) string {
	t.Helper()
	cfg, err := pki.ServerConfig(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"), filepath.Join(dir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	opts.Logger, opts.TLS = slog.New(slog.DiscardHandler), cfg
	srv, err := nimbus.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	addr := address.Address{Network: "unix", Addr: filepath.Join(t.TempDir(), "nimbus.sock")}
	ctx, cancel := context.WithCancel(context.Background())
	lis, err := addr.Listen(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return addr.String()
}

const tlsRoute = `kind: Route
meta: {name: to-dc2, nodes: [host-a]}
spec: {table: 100, prefix: 198.51.100.0/24, nexthops: [{gateway: 10.10.0.2}]}
`

func TestTLSToNimbus(t *testing.T) {
	home := t.TempDir()
	pkiDir := filepath.Join(home, DefaultPKIDir)
	vars := map[string]string{"HOME": home}
	// With no --dir, certs writes where the TLS flags look by default.
	if _, err := tlsCtl(t, vars, "", "certs", "--nodes", "host-a"); err != nil {
		t.Fatalf("certs: %v", err)
	}
	vars[ServerEnv] = startTLSNimbus(t, pkiDir)

	if out, err := tlsCtl(t, vars, tlsRoute, "apply", "-f", "-"); err != nil || !strings.Contains(out, "created") {
		t.Fatalf("apply with the default publisher certificate = %q, %v; want created", out, err)
	}

	node := map[string]string{
		"HOME": home, ServerEnv: vars[ServerEnv],
		TLSCertEnv: filepath.Join(pkiDir, "host-a.crt"), TLSKeyEnv: filepath.Join(pkiDir, "host-a.key"),
	}
	_, err := tlsCtl(t, node, "", "get", "routes")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `node "host-a" may not call List`) {
		t.Errorf("get with a node certificate from $%s = %v, want PermissionDenied naming the node", TLSCertEnv, err)
	}
	_, err = tlsCtl(t, vars, "", "get", "routes", "--tls-cert", filepath.Join(pkiDir, "host-a.crt"), "--tls-key", filepath.Join(pkiDir, "host-a.key"))
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("get with a node certificate from --tls-cert = %v, want PermissionDenied", err)
	}

	_, err = tlsCtl(t, vars, "", "get", "routes", "--insecure")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("plaintext get from a TLS nimbus = %v, want Unavailable", err)
	}
	insecure := map[string]string{"HOME": home, ServerEnv: vars[ServerEnv], InsecureEnv: "1"}
	if _, err := tlsCtl(t, insecure, "", "get", "routes"); status.Code(err) != codes.Unavailable {
		t.Errorf("get with $%s=1 from a TLS nimbus = %v, want Unavailable", InsecureEnv, err)
	}

	missing := filepath.Join(home, "nope.crt")
	_, err = tlsCtl(t, vars, "", "get", "routes", "--tls-cert", missing)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--insecure") {
		t.Errorf("get with a missing certificate = %v, want an error naming %s and --insecure", err, missing)
	}

	if out, err := tlsCtl(t, vars, "", "get", "routes"); err != nil || !strings.Contains(out, "to-dc2") {
		t.Errorf("get routes as publisher = %q, %v; want to-dc2", out, err)
	}
}

// TestCertsEtcdMembers makes etcd's certificates beside naples's and checks them in real
// TLS handshakes, as etcd makes them with --client-cert-auth and --peer-client-cert-auth:
// a member serves the replicas' client certificate and the other members, under each of
// its names; it refuses a naples node certificate, whose CA is not etcd's.
func TestCertsEtcdMembers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	out, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--nodes", "host-a", "--etcd-members", "etcd-1=10.0.0.11,etcd-2")
	if err != nil {
		t.Fatalf("certs: %v", err)
	}
	etcd := filepath.Join(dir, "etcd")
	for _, name := range []string{"ca", "etcd-1", "etcd-2", "nimbus"} {
		cert, key := filepath.Join(etcd, name+".crt"), filepath.Join(etcd, name+".key")
		if !strings.Contains(out, "wrote   "+cert+", "+key) {
			t.Errorf("output does not say it wrote %s and %s:\n%s", cert, key, out)
		}
		if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want mode 0600", key, err, fi.Mode().Perm())
		}
	}
	load := func(dir, name string) tls.Certificate {
		t.Helper()
		pair, err := tls.LoadX509KeyPair(filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key"))
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	pool := func(dir string) *x509.CertPool {
		t.Helper()
		pem, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
		if err != nil {
			t.Fatal(err)
		}
		p := x509.NewCertPool()
		if !p.AppendCertsFromPEM(pem) {
			t.Fatalf("no certificate in %s/ca.crt", dir)
		}
		return p
	}
	etcdCAs := pool(etcd)
	member := &tls.Config{Certificates: []tls.Certificate{load(etcd, "etcd-1")}, ClientCAs: etcdCAs, ClientAuth: tls.RequireAndVerifyClientCert}
	for _, tc := range []struct {
		client, serverName string
	}{
		{"nimbus", "etcd-1"}, {"nimbus", "10.0.0.11"}, {"nimbus", "localhost"}, {"nimbus", "127.0.0.1"}, {"etcd-2", "etcd-1"},
	} {
		client := &tls.Config{Certificates: []tls.Certificate{load(etcd, tc.client)}, RootCAs: etcdCAs, ServerName: tc.serverName}
		if err := handshake(t, member, client); err != nil {
			t.Errorf("etcd-1 as %s, with %s's certificate: %v", tc.serverName, tc.client, err)
		}
	}
	node := &tls.Config{Certificates: []tls.Certificate{load(dir, "host-a")}, RootCAs: etcdCAs, ServerName: "etcd-1"}
	if err := handshake(t, member, node); err == nil {
		t.Error("etcd-1 took the naples node certificate of host-a, want it refused")
	}

	// Again: everything is kept.
	out, err = tlsCtl(t, nil, "", "certs", "--dir", dir, "--etcd-members", "etcd-2,etcd-1=10.0.0.11")
	if err != nil || strings.Contains(out, "wrote") || !strings.Contains(out, "kept    "+filepath.Join(etcd, "etcd-1.crt")) {
		t.Errorf("certs again = %v, want everything kept:\n%s", err, out)
	}
	for _, tc := range []struct{ arg, want string }{
		{"etcd-1=10.0.0.99", "10.0.0.99"},
		{"ca", `"ca"`},
		{"nimbus", `"nimbus"`},
		{"etcd-3=", `"etcd-3="`},
		{"a,a", `"a" is listed twice`},
		{"a/b", `"a/b"`},
	} {
		if _, err := tlsCtl(t, nil, "", "certs", "--dir", dir, "--etcd-members", tc.arg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("certs --etcd-members %s = %v, want an error naming %s", tc.arg, err, tc.want)
		}
	}
}

// handshake makes a TLS connection over loopback TCP from a client of config client to a
// server of config server, and returns the server's handshake error: with TLS 1.3 a
// client learns that its certificate was refused only later.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	served := make(chan error, 1)
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			served <- err
			return
		}
		defer conn.Close()
		served <- conn.(*tls.Conn).Handshake()
	}()
	conn, err := tls.Dial("tcp", lis.Addr().String(), client)
	if err != nil {
		<-served
		return fmt.Errorf("client: %w", err)
	}
	defer conn.Close()
	return <-served
}

// TestHandshakeErrorsNameTheFlag is issue 19's "refused handshakes" from the client's
// side: a plaintext naplesctl against a TLS nimbus, a TLS one against a plaintext nimbus
// and one with another CA say what is wrong and which flag mends it, rather than gRPC's
// `error reading server preface: EOF`.
func TestHandshakeErrorsNameTheFlag(t *testing.T) {
	home := t.TempDir()
	pkiDir := filepath.Join(home, DefaultPKIDir)
	vars := map[string]string{"HOME": home}
	if _, err := tlsCtl(t, vars, "", "certs"); err != nil {
		t.Fatalf("certs: %v", err)
	}
	otherDir := filepath.Join(t.TempDir(), "other")
	if _, err := tlsCtl(t, nil, "", "certs", "--dir", otherDir); err != nil {
		t.Fatalf("certs: %v", err)
	}
	tlsServer := startTLSNimbus(t, pkiDir)
	plain := newEnv(t)

	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		want string
	}{
		{"plaintext to TLS", map[string]string{"HOME": home, ServerEnv: tlsServer}, []string{"--insecure"}, "drop --insecure"},
		{"TLS to plaintext", map[string]string{"HOME": home, ServerEnv: plain.server}, nil, "give --insecure here too"},
		{"client CA unknown to nimbus", map[string]string{"HOME": home, ServerEnv: tlsServer}, []string{
			"--tls-cert", filepath.Join(otherDir, "publisher.crt"), "--tls-key", filepath.Join(otherDir, "publisher.key"),
		}, "--tls-cert"},
		{"nimbus CA unknown to client", map[string]string{"HOME": home, ServerEnv: tlsServer}, []string{
			"--tls-ca", filepath.Join(otherDir, "ca.crt"),
		}, "give the CA that issued it with --tls-ca"},
	} {
		_, err := tlsCtl(t, tc.vars, "", append([]string{"get", "routes"}, tc.args...)...)
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: get routes = %v, want Unavailable saying %q", tc.name, err, tc.want)
		}
		// A wait's status stream waits for the connection, so the wait itself only
		// times out: it must say on stderr why it cannot connect, with the same hint.
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var errOut bytes.Buffer
			c := &cli{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &errOut, now: time.Now}
			err := c.run(t.Context(), append([]string{"wait", "route", "r1", "--timeout", "2s"}, tc.args...),
				func(k string) string { return tc.vars[k] })
			if err == nil || !strings.Contains(errOut.String(), "cannot connect to nimbus") || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("wait = %v, stderr %q: want it to say it cannot connect, with %q", err, errOut.String(), tc.want)
			}
		})
	}
}

// TestServerNameFromEnvironment: $NAPLES_TLS_SERVER_NAME sets --tls-server-name's
// default, as the other TLS flags' variables set theirs, and the flag wins over it.
func TestServerNameFromEnvironment(t *testing.T) {
	home := t.TempDir()
	if _, err := tlsCtl(t, map[string]string{"HOME": home}, "", "certs"); err != nil {
		t.Fatalf("certs: %v", err)
	}
	vars := map[string]string{"HOME": home, ServerEnv: startTLSNimbus(t, filepath.Join(home, DefaultPKIDir)), TLSServerNameEnv: "elsewhere.example"}
	if _, err := tlsCtl(t, vars, "", "get", "routes"); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "--tls-server-name") {
		t.Errorf("get routes with $%s=elsewhere.example = %v, want Unavailable naming --tls-server-name", TLSServerNameEnv, err)
	}
	if _, err := tlsCtl(t, vars, "", "get", "routes", "--tls-server-name", "localhost"); err != nil {
		t.Errorf("get routes with --tls-server-name localhost over the variable: %v", err)
	}
	vars[TLSServerNameEnv] = "localhost"
	if _, err := tlsCtl(t, vars, "", "get", "routes"); err != nil {
		t.Errorf("get routes with $%s=localhost: %v", TLSServerNameEnv, err)
	}
}
