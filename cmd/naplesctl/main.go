// Command naplesctl applies, gets and deletes naples desired-state objects in nimbus. See
// package cli for the commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/naplesnet/naples/cmd/naplesctl/cli"
	"github.com/naplesnet/naples/internal/exitstatus"
)

// gcPercent is the garbage collector's target (GOGC) unless GOGC is set. naplesctl lives
// for seconds, and its live data are the objects it applies or prints: collecting a
// quarter as often as Go's default, 100, costs memory it hands back when it exits and
// saves CPU that nimbus and the agent, often on the same host, need for the same objects.
const gcPercent = 400

func main() {
	if _, ok := os.LookupEnv("GOGC"); !ok {
		debug.SetGCPercent(gcPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	if err != nil {
		// diff has said what differs: its exit status 1 says the rest.
		if !errors.Is(err, cli.ErrDiffers) {
			// The error may quote what nimbus or a node said: escaped, as all output is.
			fmt.Fprintf(os.Stderr, "naplesctl: %s\n", cli.Printable(err.Error()))
		}
		// 2 for a usage error, 1 for any other.
		os.Exit(exitstatus.Of(err))
	}
}
