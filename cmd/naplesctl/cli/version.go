package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/naplesnet/naples/internal/version"
)

// addVersion makes root answer --version, and adds the version command, with the line
// version.String makes for naplesctl. Neither talks to nimbus.
func (c *cli) addVersion(root *cobra.Command) {
	root.Version = version.Get()
	// The template is the line itself: version.String never holds "{{".
	root.SetVersionTemplate(version.String("naplesctl") + "\n")
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version of naplesctl",
		Long: `Print the version of naplesctl, the Go release it was built with and its platform:

  naplesctl v1.2.0 (go1.26.0, linux/arm64)

naplesctl --version prints the same line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := fmt.Fprintln(c.stdout, version.String("naplesctl"))
			return err
		},
	})
}
