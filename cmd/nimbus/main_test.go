package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		wantLevel slog.Level
		wantAddrs []string
		wantUsage bool
	}{
		{name: "defaults", wantLevel: slog.LevelInfo, wantAddrs: []string{defaultListen}},
		{
			name:      "repeated listen",
			args:      []string{"--listen", "unix:///tmp/a.sock", "--listen=tcp://127.0.0.1:9000", "--log-level", "debug"},
			wantLevel: slog.LevelDebug,
			wantAddrs: []string{"unix:///tmp/a.sock", "tcp://127.0.0.1:9000"},
		},
		{name: "level case", args: []string{"--log-level=WARN"}, wantLevel: slog.LevelWarn, wantAddrs: []string{defaultListen}},
		{name: "bad level", args: []string{"--log-level", "loud"}, wantUsage: true},
		{name: "bad scheme", args: []string{"--listen", "http://x:1"}, wantUsage: true},
		{name: "relative socket", args: []string{"--listen", "unix://n.sock"}, wantUsage: true},
		{name: "unknown flag", args: []string{"--no-such-flag", "/x"}, wantUsage: true},
		{name: "argument", args: []string{"serve"}, wantUsage: true},
		{name: "limit", args: []string{"--max-status-message-bytes", "4096"}, wantLevel: slog.LevelInfo, wantAddrs: []string{defaultListen}},
		{name: "zero limit", args: []string{"--max-status-message-bytes", "0"}, wantUsage: true},
		{name: "bad limit", args: []string{"--status-details-bytes", "1M"}, wantUsage: true},
		{name: "status nodes", args: []string{"--status-nodes", "1000"}, wantLevel: slog.LevelInfo, wantAddrs: []string{defaultListen}},
		{name: "zero status nodes", args: []string{"--status-nodes", "0"}, wantUsage: true},
		{name: "log interval", args: []string{"--refusal-log-interval", "10s"}, wantLevel: slog.LevelInfo, wantAddrs: []string{defaultListen}},
		{name: "bad log interval", args: []string{"--refusal-log-interval", "-1s"}, wantUsage: true},
		{name: "watermark moves", args: []string{"--status-watermark-moves", "20"}, wantLevel: slog.LevelInfo, wantAddrs: []string{defaultListen}},
		{name: "zero watermark moves", args: []string{"--status-watermark-moves", "0"}, wantUsage: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseFlags(tc.args, &stderr)
			if tc.wantUsage {
				if !errors.Is(err, errUsage) || stderr.Len() == 0 {
					t.Fatalf("parseFlags(%q) = %v with output %q, want a usage error explained on stderr", tc.args, err, stderr.String())
				}
				return
			}
			if err != nil {
				t.Fatalf("parseFlags(%q): %v", tc.args, err)
			}
			var addrs []string
			for _, a := range cfg.listen {
				addrs = append(addrs, a.String())
			}
			if cfg.logLevel != tc.wantLevel || !slices.Equal(addrs, tc.wantAddrs) {
				t.Errorf("parseFlags(%q) = level %v listen %q, want %v %q", tc.args, cfg.logLevel, addrs, tc.wantLevel, tc.wantAddrs)
			}
		})
	}
}

func TestRunServesUntilCanceled(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "n.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"--listen", "unix://" + sock, "--insecure", "--ephemeral"}, &stderr) }()

	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	defer callCancel()
	// WaitForReady rides out the moment before run listens.
	if _, err := nimbusv1.NewNimbusClient(conn).List(callCtx, &nimbusv1.ListRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("List: %v", err)
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
	if !strings.Contains(stderr.String(), "msg=serving") || !strings.Contains(stderr.String(), "unix://"+sock) {
		t.Errorf("log does not say where it serves:\n%s", stderr.String())
	}
}

func TestParseFlagsStatusNodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{nil, nimbus.DefaultStatusNodes},
		{[]string{"--status-nodes", "10000"}, 10000},
		{[]string{"--status-nodes=1"}, 1},
	} {
		var stderr bytes.Buffer
		cfg, err := parseFlags(tc.args, &stderr)
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tc.args, err)
		}
		if cfg.limits.StatusNodes != tc.want {
			t.Errorf("parseFlags(%q): StatusNodes = %d, want %d", tc.args, cfg.limits.StatusNodes, tc.want)
		}
	}
}
