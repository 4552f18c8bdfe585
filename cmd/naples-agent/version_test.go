package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/version"
)

// runMainEnv, set in the environment of the test binary, makes it run main instead of the
// tests, with the arguments it was given, and with version.Version set to the variable's
// value, as the linker's -X sets it in a release: the test binary is then naples-agent itself.
const runMainEnv = "NAPLES_TEST_RUN_MAIN_VERSION"

func TestMain(m *testing.M) {
	if v, ok := os.LookupEnv(runMainEnv); ok {
		version.Version = v
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestVersionFlag(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// --log-level makes sure --version wins over the flags that configure a run.
	cmd := exec.CommandContext(ctx, os.Args[0], "--log-level", "debug", "--version")
	cmd.Env = append(os.Environ(), runMainEnv+"=v1.2.3-test", "GORACE=atexit_sleep_ms=0")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("naples-agent --version: %v, want exit status 0; stderr:\n%s", err, stderr.String())
	}
	want := fmt.Sprintf("naples-agent v1.2.3-test (%s, %s/%s)\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if stdout.String() != want || stderr.Len() != 0 {
		t.Errorf("naples-agent --version printed %q on stdout and %q on stderr, want %q on stdout only", stdout.String(), stderr.String(), want)
	}
}
