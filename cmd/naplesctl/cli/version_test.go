package cli

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/naplesnet/naples/internal/version"
)

func TestVersion(t *testing.T) {
	old := version.Version
	version.Version = "v1.2.3-test"
	t.Cleanup(func() { version.Version = old })
	want := fmt.Sprintf("naplesctl v1.2.3-test (%s, %s/%s)\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	for _, args := range [][]string{{"--version"}, {"version"}} {
		t.Run(args[0], func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// No nimbus listens at this address: printing the version must not need one.
			getenv := func(k string) string {
				if k == ServerEnv {
					return "unix:///nonexistent/nimbus.sock"
				}
				return ""
			}
			if err := Run(context.Background(), args, nil, &stdout, &stderr, getenv); err != nil {
				t.Fatalf("naplesctl %s: %v", args[0], err)
			}
			if stdout.String() != want || stderr.Len() != 0 {
				t.Errorf("naplesctl %s printed %q on stdout and %q on stderr, want %q on stdout only", args[0], stdout.String(), stderr.String(), want)
			}
		})
	}
}

func TestVersionRefusesArguments(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := Run(context.Background(), []string{"version", "extra"}, nil, &stdout, &stderr, func(string) string { return "" })
	if err == nil || stdout.Len() != 0 {
		t.Errorf("naplesctl version extra = %v, printing %q; want an error and nothing printed", err, stdout.String())
	}
}
