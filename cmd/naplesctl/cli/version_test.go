package cli

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/version"
)

// setVersion sets the version of the binary for the test.
func setVersion(t *testing.T, v string) {
	old := version.Version
	version.Version = v
	t.Cleanup(func() { version.Version = old })
}

// runWithoutNimbus runs naplesctl with args against an address no nimbus listens at.
func runWithoutNimbus(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == ServerEnv {
			return "unix:///nonexistent/nimbus.sock"
		}
		if k == InsecureEnv {
			return "1"
		}
		return ""
	}
	err = Run(context.Background(), args, nil, &out, &errOut, getenv)
	return out.String(), errOut.String(), err
}

func TestVersion(t *testing.T) {
	setVersion(t, "v1.2.3-test")
	want := fmt.Sprintf("naplesctl v1.2.3-test (%s, %s/%s)\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	for _, args := range [][]string{{"--version"}, {"version", "--client"}} {
		t.Run(args[len(args)-1], func(t *testing.T) {
			// No nimbus listens at the address: printing the client's version must not need one.
			stdout, stderr, err := runWithoutNimbus(args...)
			if err != nil {
				t.Fatalf("naplesctl %s: %v", args, err)
			}
			if stdout != want || stderr != "" {
				t.Errorf("naplesctl %s printed %q on stdout and %q on stderr, want %q on stdout only", args, stdout, stderr, want)
			}
		})
	}
}

// TestVersionAsksNimbus checks that version prints naplesctl's line, then the version
// nimbus answers over the connection.
func TestVersionAsksNimbus(t *testing.T) {
	setVersion(t, "v1.2.3-test")
	e := newEnv(t)
	platform := fmt.Sprintf("(%s, %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	// nimbus runs in the test binary: it has the same version.
	equal(t, "naplesctl version", e.ok("version"), "naplesctl v1.2.3-test "+platform+"\nServer: nimbus v1.2.3-test "+platform+"\n")
}

// TestVersionWithoutNimbus checks that version prints naplesctl's line when nimbus cannot
// be reached, and fails, with status 1, saying so.
func TestVersionWithoutNimbus(t *testing.T) {
	setVersion(t, "v1.2.3-test")
	stdout, _, err := runWithoutNimbus("version")
	if err == nil || exitstatus.Of(err) != exitstatus.Failure {
		t.Fatalf("naplesctl version without nimbus: %v (exit status %d), want a failure (1)", err, exitstatus.Of(err))
	}
	if !strings.HasPrefix(stdout, "naplesctl v1.2.3-test (") || strings.Contains(stdout, "Server") {
		t.Errorf("naplesctl version without nimbus printed %q, want naplesctl's line only", stdout)
	}
	contains(t, "naplesctl version without nimbus", err, "asking nimbus for its version", "unix:///nonexistent/nimbus.sock", "unavailable")
}

func TestVersionRefusesArguments(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := Run(context.Background(), []string{"version", "extra"}, nil, &stdout, &stderr, func(string) string { return "" })
	if err == nil || stdout.Len() != 0 {
		t.Errorf("naplesctl version extra = %v, printing %q; want an error and nothing printed", err, stdout.String())
	}
}
