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

	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/internal/version/versiontest"
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
		{name: "burst gc percent", args: []string{"--gc-percent-burst", "0"}, wantLevel: slog.LevelInfo, wantAddrs: []string{defaultListen}},
		{name: "negative burst gc percent", args: []string{"--gc-percent-burst", "-1"}, wantUsage: true},
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
		cfg, err := parseFlags(tc.args, &stderr, noEnv)
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tc.args, err)
		}
		if cfg.limits.StatusNodes != tc.want {
			t.Errorf("parseFlags(%q): StatusNodes = %d, want %d", tc.args, cfg.limits.StatusNodes, tc.want)
		}
	}
}

// noEnv is an environment without variables.
func noEnv(string) string { return "" }

// TestParseFlagsEnvironment shows nimbus taking its flags as naplesctl does: from the
// environment variable named in the help when the command line leaves them, the command
// line winning, and a bad variable or a one-dash long flag refused with a message that
// names it.
func TestParseFlagsEnvironment(t *testing.T) {
	env := map[string]string{"NIMBUS_LOG_LEVEL": "debug", "NIMBUS_STATUS_NODES": "77", "NIMBUS_LISTEN": "unix:///tmp/env.sock"}
	getenv := func(k string) string { return env[k] }
	var stderr bytes.Buffer
	cfg, err := parseFlags([]string{"--status-nodes", "5"}, &stderr, getenv)
	if err != nil {
		t.Fatalf("parseFlags: %v\n%s", err, stderr.String())
	}
	if cfg.logLevel != slog.LevelDebug || cfg.limits.StatusNodes != 5 || len(cfg.listen) != 1 || cfg.listen[0].String() != "unix:///tmp/env.sock" {
		t.Errorf("parseFlags = level %v, status nodes %d, listen %v; want debug from $NIMBUS_LOG_LEVEL, 5 from the command line, unix:///tmp/env.sock from $NIMBUS_LISTEN",
			cfg.logLevel, cfg.limits.StatusNodes, cfg.listen)
	}

	env = map[string]string{"NIMBUS_STATUS_NODES": "many"}
	stderr.Reset()
	if _, err := parseFlags(nil, &stderr, getenv); !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), `invalid value "many" of $NIMBUS_STATUS_NODES (--status-nodes)`) {
		t.Errorf("parseFlags with $NIMBUS_STATUS_NODES=many = %v, printed %q; want a usage error naming the variable and the value", err, stderr.String())
	}

	stderr.Reset()
	if _, err := parseFlags([]string{"-log-level", "debug"}, &stderr, noEnv); !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), "long flags take two dashes: --log-level") {
		t.Errorf("parseFlags(-log-level) = %v, printed %q; want a usage error saying to write --log-level", err, stderr.String())
	}
}

// TestHelp shows nimbus's help in naplesctl's layout on standard output, every flag with
// its variable before its default, and each default once.
func TestHelp(t *testing.T) {
	var stderr bytes.Buffer
	_, err := parseFlags([]string{"--help"}, &stderr, noEnv)
	if !errors.Is(err, cmdline.ErrHelp) || stderr.Len() != 0 {
		t.Fatalf("parseFlags(--help) = %v, printing %q on stderr; want cmdline.ErrHelp, which exits 0, and nothing", err, stderr.String())
	}
	help := versiontest.Help(t, "nimbus")
	for _, want := range []string{
		"--data-dir directory", "($NIMBUS_DATA_DIR)", "--etcd-endpoints URLs", "($NIMBUS_ETCD_ENDPOINTS)", "--max-status-message-bytes",
		"debug, info, warn or error ($NIMBUS_LOG_LEVEL) (default info)\n", "--status-nodes nodes ",
		"the host name when not given ($NIMBUS_REPLICA_NAME) (default ",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("help does not say %q:\n%s", want, help)
		}
	}
	if strings.Contains(help, "$NIMBUS_VERSION") || strings.Contains(help, "$NIMBUS_HELP") {
		t.Errorf("help names a variable for --version or --help, which no variable sets:\n%s", help)
	}
	for line := range strings.Lines(help) {
		if strings.Count(line, "(default") > 1 {
			t.Errorf("help gives a flag two defaults: %s", line)
		}
	}
}
