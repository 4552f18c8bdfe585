package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestParseStoreAndMetricsFlags(t *testing.T) {
	for _, tc := range []struct {
		name        string
		args        []string
		wantDataDir string
		wantMetrics string
		wantUsage   bool
	}{
		{name: "defaults", wantDataDir: defaultDataDir},
		{name: "data dir", args: []string{"--data-dir", "/srv/nimbus"}, wantDataDir: "/srv/nimbus"},
		{name: "ephemeral", args: []string{"--ephemeral"}, wantDataDir: ""},
		{name: "metrics", args: []string{"--metrics", "127.0.0.1:9090"}, wantDataDir: defaultDataDir, wantMetrics: "127.0.0.1:9090"},
		{name: "metrics any host", args: []string{"--metrics=:9090"}, wantDataDir: defaultDataDir, wantMetrics: ":9090"},
		{name: "ephemeral with data dir", args: []string{"--ephemeral", "--data-dir", "/srv/nimbus"}, wantUsage: true},
		{name: "data dir with ephemeral", args: []string{"--data-dir=/srv/nimbus", "--ephemeral"}, wantUsage: true},
		{name: "empty data dir", args: []string{"--data-dir="}, wantUsage: true},
		{name: "metrics without port", args: []string{"--metrics", "localhost"}, wantUsage: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseFlags(tc.args, &stderr, noEnv)
			if tc.wantUsage {
				if !errors.Is(err, errUsage) || stderr.Len() == 0 {
					t.Fatalf("parseFlags(%q) = %v with output %q, want a usage error explained on stderr", tc.args, err, stderr.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			if cfg.dataDir != tc.wantDataDir || cfg.metrics != tc.wantMetrics {
				t.Errorf("parseFlags(%q) = data dir %q metrics %q, want %q %q", tc.args, cfg.dataDir, cfg.metrics, tc.wantDataDir, tc.wantMetrics)
			}
		})
	}
}

// runNimbus runs the command with the arguments until the test's cleanup, or until stop
// is called, and returns the URL of its metrics endpoint, which the arguments must ask for.
func runNimbus(t *testing.T, args ...string) (metricsURL string, stop func()) {
	t.Helper()
	return runNimbusLogging(t, "serving metrics", args...)
}

// runNimbusLogging runs the command as runNimbus does and returns the URL its log line
// with the message msg names, once it logged it.
func runNimbusLogging(t *testing.T, msg string, args ...string) (url string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := run(ctx, args, w)
		w.Close()
		done <- err
	}()
	// The log is read to its end, so run never blocks writing it.
	urls := make(chan string, 1)
	logged := make(chan string, 1)
	go func() {
		var all strings.Builder
		sc := bufio.NewScanner(r)
		re := regexp.MustCompile(`msg="` + regexp.QuoteMeta(msg) + `" url=(\S+)`)
		for sc.Scan() {
			all.WriteString(sc.Text() + "\n")
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				urls <- m[1]
			}
		}
		logged <- all.String()
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run = %v, want nil after cancellation", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("run did not return after cancellation")
		}
		t.Logf("nimbus log:\n%s", <-logged)
	}
	t.Cleanup(stop)
	select {
	case u := <-urls:
		return u, stop
	case err := <-done:
		t.Fatalf("run = %v before logging %q", err, msg)
	case <-time.After(10 * time.Second):
		t.Fatalf("nimbus did not log %q within 10s", msg)
	}
	return "", stop
}

func TestRunPersistsAndServesMetrics(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(t.TempDir(), "n.sock")
	args := []string{"--listen", "unix://" + sock, "--insecure", "--data-dir", dir, "--metrics", "127.0.0.1:0"}
	url, stop := runNimbus(t, args...)

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := nimbusv1.NewNimbusClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	obj := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: "n1"},
		Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{Hostname: "n1", VtepAddress: "192.0.2.1"}},
	}
	if _, err := client.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Apply: %v", err)
	}

	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %v %v", url, resp.Status, err)
	}
	for _, want := range []string{"naples_nimbus_revision 1", "naples_nimbus_objects 1", "go_goroutines"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	base := strings.TrimSuffix(url, "/metrics")
	for _, probe := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(base + probe)
		if err != nil {
			t.Fatalf("GET %s: %v", probe, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s while serving = %s, want 200", probe, resp.Status)
		}
	}
	// The standard gRPC health service answers on the gRPC listener, and says so until
	// nimbus stops.
	hc := healthpb.NewHealthClient(conn)
	for _, service := range []string{"", nimbusv1.Nimbus_ServiceDesc.ServiceName} {
		got, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health Check(%q) = %v, %v; want SERVING", service, got, err)
		}
	}
	watchCtx, endWatch := context.WithCancel(ctx)
	hw, err := hc.Watch(watchCtx, &healthpb.HealthCheckRequest{Service: nimbusv1.Nimbus_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := hw.Recv(); err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Watch first = %v, %v; want SERVING", got, err)
	}
	// A prober watching health hears NOT_SERVING as soon as nimbus starts to stop, and
	// then goes away, which lets the graceful stop finish.
	afterStop := make(chan *healthpb.HealthCheckResponse, 1)
	go func() {
		got, _ := hw.Recv()
		afterStop <- got
		endWatch()
	}()
	stop()
	if got := <-afterStop; got.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health Watch once nimbus stops = %v; want NOT_SERVING", got)
	}
	if _, err := http.Get(url); err == nil {
		t.Errorf("metrics still served after nimbus stopped")
	}

	// A restart on the same directory has the object.
	runNimbus(t, args...)
	list, err := client.List(ctx, &nimbusv1.ListRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("List after restart: %v", err)
	}
	if len(list.GetItems()) != 1 || list.GetRevision() != 1 {
		t.Errorf("List after restart = %d objects at revision %d, want 1 at 1", len(list.GetItems()), list.GetRevision())
	}
}

func TestRunRefusesCorruptStore(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, nimbus.DBFileName)
	if err := os.WriteFile(path, bytes.Repeat([]byte("garbage!"), 2048), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "n.sock")
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--listen", "unix://" + sock, "--insecure", "--data-dir", dir}, &stderr)
	if !errors.Is(err, nimbus.ErrCorrupt) || errors.Is(err, errUsage) {
		t.Fatalf("run on a corrupt store = %v, want nimbus.ErrCorrupt", err)
	}
	if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "move it aside") {
		t.Errorf("run on a corrupt store = %q, want it to name %s and the way out", msg, path)
	}
}
