// Command naplesctl applies, gets and deletes naples desired-state objects in nimbus. See
// package cli for the commands.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/naplesnet/naples/cmd/naplesctl/cli"
	"github.com/naplesnet/naples/internal/exitstatus"
)

func main() {
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
