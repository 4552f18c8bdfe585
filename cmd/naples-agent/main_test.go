package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
)

func TestRunRefusesBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		// want are what stderr, all a user sees of a usage error, must say.
		want []string
	}{
		{name: "unknown flag", args: []string{"--no-such-flag"}, want: []string{"no-such-flag"}},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: []string{"log-level", `"loud"`}},
		{name: "argument", args: []string{"run"}, want: []string{`"run"`}},
		{name: "metrics without port", args: []string{"--metrics", "localhost"}, want: []string{"metrics", `"localhost"`, "host:port"}},
		{name: "expiry warning not positive", args: []string{"--tls-expiry-warning", "0s"}, want: []string{"tls-expiry-warning", "0s", "positive"}},
		{name: "bad nimbus in a list", args: []string{"--nimbus", "unix:///run/a.sock,ftp://x:1"}, want: []string{"-nimbus", `"ftp://x:1"`}},
		{name: "empty nimbus list", args: []string{"--nimbus", ""}, want: []string{"-nimbus", "no address"}},
		{name: "zero gateway check", args: []string{"--gateway-check-interval", "0s"}, want: []string{"-gateway-check-interval", `"0s"`, "positive"}},
		{name: "zero gateway bridges", args: []string{"--gateway-bridges", "0"}, want: []string{"-gateway-bridges", "0", "positive"}},
		{name: "zero flow export policies", args: []string{"--flow-export-max-policies", "0"}, want: []string{"-flow-export-max-policies", "0", "positive"}},
		{name: "tiny IPFIX messages", args: []string{"--flow-export-message-bytes", "100"}, want: []string{"-flow-export-message-bytes", "100", "1024 to 65507"}},
		{name: "bad gc percent", args: []string{"--gc-percent", "half"}, want: []string{"gc-percent", `"half"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(context.Background(), tc.args, &stderr)
			if !errors.Is(err, errUsage) {
				t.Fatalf("run(%q) = %v, want a usage error (exit status 2)", tc.args, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("run(%q) printed %q, want it to say %s", tc.args, stderr.String(), w)
				}
			}
			if !strings.Contains(stderr.String(), "-state-dir") {
				t.Errorf("run(%q) printed no usage:\n%s", tc.args, stderr.String())
			}
		})
	}
}

func TestRunHelpIsNoError(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--help"}, &stderr)
	if !errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsage) {
		t.Errorf("run(--help) = %v, want flag.ErrHelp, which exits 0", err)
	}
	if !strings.Contains(stderr.String(), "-discard-state") {
		t.Errorf("run(--help) printed no usage:\n%s", stderr.String())
	}
}

func TestRunWithoutCredentials(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "node.crt")
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--tls-cert", missing, "--log-level", "debug"}, &stderr)
	if exitstatus.Of(err) != exitstatus.Config || errors.Is(err, errUsage) || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "--insecure") {
		t.Errorf("run with a missing certificate = %v, want a configuration error (exit status 2) naming %s and --insecure", err, missing)
	}
}
