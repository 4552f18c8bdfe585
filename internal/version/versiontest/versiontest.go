// Package versiontest checks the --version and --help flags of a command, and the exit
// status of a command line: the test binary of the command's main package runs main itself, with the
// arguments, as the command would run.
package versiontest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/version"
)

// runMainEnv, set in the environment of a test binary that Main runs, makes it run main
// instead of the tests, with the arguments it was given, and with version.Version set to
// the variable's value, as the linker's -X sets it in a release: the test binary is then
// the command itself.
const runMainEnv = "NAPLES_TEST_RUN_MAIN_VERSION"

// Main is the TestMain of a command's package: it runs main when Flag started the test
// binary, and the tests otherwise.
func Main(m *testing.M, main func()) {
	if v, ok := os.LookupEnv(runMainEnv); ok {
		version.Version = v
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// mainCommand returns the command that runs the test binary as the command, with args
// and the version v1.2.3-test.
func mainCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), runMainEnv+"=v1.2.3-test", "GORACE=atexit_sleep_ms=0")
	return cmd
}

// Flag runs the test binary as the command name with args and --version, and fails the
// test unless it exits 0 having printed the version line, and nothing else. args should
// hold a flag that configures a run, to show that --version wins over it.
func Flag(t *testing.T, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := mainCommand(ctx, append(args, "--version")...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s --version: %v, want exit status 0; stderr:\n%s", name, err, stderr.String())
	}
	want := fmt.Sprintf("%s v1.2.3-test (%s, %s/%s)\n", name, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if stdout.String() != want || stderr.Len() != 0 {
		t.Errorf("%s --version printed %q on stdout and %q on stderr, want %q on stdout only", name, stdout.String(), stderr.String(), want)
	}
}

// Help runs the test binary as the command name with --help, as Flag does, and fails the
// test unless it exits 0 having printed its help, in naplesctl's layout, on standard
// output, where a pager or grep reads it, and nothing on standard error. It returns the
// help.
func Help(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := mainCommand(ctx, "--help")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s --help: %v, want exit status 0; stderr:\n%s", name, err, stderr.String())
	}
	if want := "\n\nUsage:\n  " + name + " [flags]\n\nFlags:\n"; !strings.Contains(stdout.String(), want) || stderr.Len() != 0 {
		t.Errorf("%s --help printed %q on stdout and %q on stderr, want the help, with %q, on stdout only", name, stdout.String(), stderr.String(), want)
	}
	return stdout.String()
}

// ExitStatus runs the test binary as the command with args, as Flag does, and returns
// its exit status and what it wrote on stderr. It fails the test when the command does
// not end within a minute.
func ExitStatus(t *testing.T, args ...string) (status int, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := mainCommand(ctx, args...)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%q did not end within a minute; stderr:\n%s", args, errBuf.String())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, errBuf.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), errBuf.String()
	}
	t.Fatalf("running %q: %v", args, err)
	return 0, ""
}
