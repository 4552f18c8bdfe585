package naplesctl

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// applyCommand returns the apply command.
func (c *cli) applyCommand() *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "apply -f FILE...",
		Short: "Create or update the objects in manifest files",
		Long: `Create or update the objects in manifest files.

Every object of every file is validated first; if any is invalid, nothing is applied.
The objects are then applied in order, and for each one a line says whether it was
created, configured (with its new generation) or unchanged.`,
		Example: `  naplesctl apply -f route.yaml
  cat route.yaml | naplesctl apply -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.apply(cmd.Context(), files)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `manifest file to apply, "-" for stdin; repeatable`)
	_ = cmd.MarkFlagRequired("filename") // cannot fail: the flag exists
	return cmd
}

// apply validates every object of files and, when all are valid, applies them in order.
func (c *cli) apply(ctx context.Context, files []string) error {
	srcs, err := c.readManifests(files)
	if err != nil {
		return err
	}
	var invalid []error
	for _, s := range srcs {
		if err := s.obj.Validate(); err != nil {
			for _, fe := range fieldErrors(err) {
				invalid = append(invalid, fmt.Errorf("%v: %s: %w", s, ref(s.obj.Key()), fe))
			}
		}
	}
	if len(invalid) > 0 {
		return fmt.Errorf("validating objects, nothing applied:\n%w", errors.Join(invalid...))
	}

	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	for _, s := range srcs {
		result, err := sess.apply(ctx, s.obj)
		if err != nil {
			return fmt.Errorf("applying %s (%v): %w", ref(s.obj.Key()), s, err)
		}
		fmt.Fprintf(c.stdout, "%s %s\n", ref(s.obj.Key()), result)
	}
	return nil
}

// apply applies obj and says what that did: "created", "configured (generation 2)" or
// "unchanged".
func (s *session) apply(ctx context.Context, obj *nimbusv1.Object) (string, error) {
	resp, err := s.nimbus.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj})
	if err != nil {
		return "", s.rpcError(err)
	}
	switch {
	case !resp.GetChanged():
		return "unchanged", nil
	case resp.GetCreated():
		return "created", nil
	}
	return fmt.Sprintf("configured (generation %d)", resp.GetObject().GetMeta().GetGeneration()), nil
}
