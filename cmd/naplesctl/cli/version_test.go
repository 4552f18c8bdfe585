package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/version"
	"github.com/naplesnet/naples/nimbus"
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
// nimbus answers over the connection. nimbus runs in a process of its own, this test
// binary started again, with a version other than naplesctl's: the Server line can only
// come from it.
func TestVersionAsksNimbus(t *testing.T) {
	setVersion(t, "v1.2.3-test")
	socket := filepath.Join(t.TempDir(), "nimbus.sock")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe)
	child.Env = append(os.Environ(), nimbusChildSocket+"="+socket, nimbusChildVersion+"=v9.8.7-nimbus")
	child.Stdout, child.Stderr = os.Stderr, os.Stderr
	// The child ends when its standard input does: with this process, whatever ends it.
	if _, err := child.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	// The child listens once it has started.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nimbus child does not listen on %s after 30s", socket)
		}
	}
	e := &env{t: t, vars: map[string]string{ServerEnv: "unix://" + socket, InsecureEnv: "1"}}
	platform := fmt.Sprintf("(%s, %s/%s)", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	want := "naplesctl v1.2.3-test " + platform + "\nServer: nimbus v9.8.7-nimbus " + platform + "\n"
	equal(t, "naplesctl version", e.ok("version"), want)
}

// The environment of the test binary started again as a nimbus: the socket it serves on
// and its version.
const (
	nimbusChildSocket  = "NAPLESCTL_TEST_NIMBUS_SOCKET"
	nimbusChildVersion = "NAPLESCTL_TEST_NIMBUS_VERSION"
)

// serveNimbusChild serves nimbus on the unix socket, with the version of the
// environment, until its standard input ends or the process is killed.
func serveNimbusChild(socket string) {
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	version.Version = os.Getenv(nimbusChildVersion)
	srv, err := nimbus.New(nimbus.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(os.Stderr, "nimbus.New:", err)
		os.Exit(1)
	}
	lis, err := (address.Address{Network: "unix", Addr: socket}).Listen(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, "listening:", err)
		os.Exit(1)
	}
	if err := srv.Serve(context.Background(), lis); err != nil {
		fmt.Fprintln(os.Stderr, "Serve:", err)
		os.Exit(1)
	}
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
