package main

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/cmdline"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/version/versiontest"
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
		{name: "expiry warning not positive", args: []string{"--tls-expiry-warning", "0s"}, want: []string{"--tls-expiry-warning", "0s", "positive"}},
		{name: "bad nimbus in a list", args: []string{"--nimbus", "unix:///run/a.sock,ftp://x:1"}, want: []string{"--nimbus", `"ftp://x:1"`}},
		{name: "empty nimbus list", args: []string{"--nimbus", ""}, want: []string{"--nimbus", "no address"}},
		{name: "zero gateway check", args: []string{"--gateway-check-interval", "0s"}, want: []string{"--gateway-check-interval", `"0s"`, "positive"}},
		{name: "zero gateway bridges", args: []string{"--gateway-bridges", "0"}, want: []string{"--gateway-bridges", "0", "positive"}},
		{name: "zero flow export policies", args: []string{"--flow-export-max-policies", "0"}, want: []string{"--flow-export-max-policies", "0", "positive"}},
		{name: "too many traces", args: []string{"--max-traces", "65"}, want: []string{"--max-traces", "65", "1 to 64"}},
		{name: "no traces", args: []string{"--max-traces", "0"}, want: []string{"--max-traces", "0", "1 to 64"}},
		{name: "tiny IPFIX messages", args: []string{"--flow-export-message-bytes", "100"}, want: []string{"--flow-export-message-bytes", "100", "1024 to 65507"}},
		{name: "pprof without metrics", args: []string{"--pprof"}, want: []string{"--pprof", "give --metrics too"}},
		{name: "bad gc percent", args: []string{"--gc-percent", "half"}, want: []string{"gc-percent", `"half"`}},
		{name: "negative burst gc percent", args: []string{"--gc-percent-burst", "-1"}, want: []string{"--gc-percent-burst", "-1", "0 or more"}},
		{name: "one dash", args: []string{"-state-dir", "/x"}, want: []string{"long flags take two dashes: --state-dir"}},
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

// TestRunHelpIsNoError shows the agent's help in naplesctl's layout on standard output,
// every flag with its variable before its default.
func TestRunHelpIsNoError(t *testing.T) {
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--help"}, &stderr)
	if !errors.Is(err, cmdline.ErrHelp) || errors.Is(err, errUsage) || stderr.Len() != 0 {
		t.Errorf("run(--help) = %v, printing %q on stderr; want cmdline.ErrHelp, which exits 0, and nothing", err, stderr.String())
	}
	help := versiontest.Help(t, "naples-agent")
	for _, want := range []string{"--discard-state", "($NAPLES_AGENT_DISCARD_STATE)", "--node name", "($NAPLES_AGENT_NODE)", "debug, info, warn or error ($NAPLES_AGENT_LOG_LEVEL) (default info)\n"} {
		if !strings.Contains(help, want) {
			t.Errorf("naples-agent --help does not say %q:\n%s", want, help)
		}
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

// TestRunTakesTheEnvironment shows a flag set by its variable, named in the help, and a
// bad value of one refused naming the variable, before the agent starts.
func TestRunTakesTheEnvironment(t *testing.T) {
	t.Setenv("NAPLES_AGENT_NODE", "Not_A_Node")
	var stderr bytes.Buffer
	err := run(context.Background(), []string{"--insecure"}, &stderr)
	if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), `invalid value "Not_A_Node" for flag --node`) {
		t.Errorf("run with $NAPLES_AGENT_NODE=Not_A_Node = %v, printed %q; want the node name refused", err, stderr.String())
	}
	t.Setenv("NAPLES_AGENT_GATEWAY_BRIDGES", "many")
	stderr.Reset()
	err = run(context.Background(), []string{"--insecure", "--node", "host-a"}, &stderr)
	if !errors.Is(err, errUsage) || !strings.Contains(stderr.String(), `invalid value "many" of $NAPLES_AGENT_GATEWAY_BRIDGES (--gateway-bridges)`) {
		t.Errorf("run with $NAPLES_AGENT_GATEWAY_BRIDGES=many = %v, printed %q; want the variable named", err, stderr.String())
	}
}
