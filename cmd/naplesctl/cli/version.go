package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/naplesnet/naples/internal/version"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// versionTimeout bounds how long version waits for nimbus's answer.
const versionTimeout = 10 * time.Second

// addVersion makes root answer --version with the line version.String makes for
// naplesctl, without asking nimbus, and adds the version command, which prints that line
// and then nimbus's.
func (c *cli) addVersion(root *cobra.Command) {
	root.Version = version.Get()
	// The template is the line itself: version.String never holds "{{".
	root.SetVersionTemplate(version.String("naplesctl") + "\n")
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version [--client]",
		Short: "Print the version of naplesctl and of nimbus",
		Long: `Print the version of naplesctl, the Go release it was built with and its platform, then
the same of the nimbus at --server, asked over the usual connection:

  naplesctl v1.2.0 (go1.26.0, linux/arm64)
  Server: nimbus v1.2.0 (go1.26.0, linux/amd64)

When nimbus cannot be reached, or does not answer within 10s, version prints naplesctl's
line, says why on stderr and exits with status 1. With --client, and with
naplesctl --version, it prints naplesctl's line only, without asking nimbus.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := fmt.Fprintln(c.stdout, version.String("naplesctl")); err != nil {
				return err
			}
			if clientOnly {
				return nil
			}
			return c.serverVersion(cmd.Context())
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "print naplesctl's version only, without asking nimbus")
	root.AddCommand(cmd)
}

// serverVersion asks nimbus for its version and prints it: "Server: nimbus v1.2.0
// (go1.26.0, linux/amd64)".
func (c *cli) serverVersion(ctx context.Context) error {
	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	v, err := sess.nimbus.Version(ctx, &nimbusv1.VersionRequest{})
	if err != nil {
		return fmt.Errorf("asking nimbus for its version: %w", sess.rpcError(err))
	}
	_, err = fmt.Fprintf(c.stdout, "Server: nimbus %s (%s, %s)\n", v.GetVersion(), v.GetGoVersion(), v.GetPlatform())
	return err
}
