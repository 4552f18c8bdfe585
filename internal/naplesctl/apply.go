package naplesctl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// applyCommand returns the apply command.
func (c *cli) applyCommand() *cobra.Command {
	var (
		files []string
		wait  bool
		o     waitOptions
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE... [--wait [--timeout D]]",
		Short: "Create or update the objects in manifest files",
		Long: `Create or update the objects in manifest files.

Every object of every file is validated first; if any is invalid, nothing is applied.
The objects are then applied in order, and for each one a line says whether it was
created, configured (with its new generation) or unchanged.

With --wait, apply then waits until every applied object, changed or not, is PROGRAMMED
on every target node at the generation apply stored, as the wait command does: a line
on stderr shows each change of progress, and apply fails as soon as a node reports
FAILED, or when --timeout passes.`,
		Example: `  naplesctl apply -f route.yaml
  cat route.yaml | naplesctl apply -f -
  naplesctl apply -f route.yaml --wait --timeout 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var timeout time.Duration
			if wait {
				var err error
				if timeout, err = o.parseTimeout(); err != nil {
					return err
				}
			} else if cmd.Flags().Changed("timeout") {
				return errors.New("--timeout needs --wait")
			}
			return c.apply(cmd.Context(), files, wait, timeout)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `manifest file to apply, "-" for stdin; repeatable`)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every object is programmed on every target node")
	o.addTimeoutFlag(cmd, "with --wait")
	_ = cmd.MarkFlagRequired("filename") // cannot fail: the flag exists
	return cmd
}

// apply validates every object of files and, when all are valid, applies them in order;
// with wait, it then waits for them for up to timeout.
func (c *cli) apply(ctx context.Context, files []string, wait bool, timeout time.Duration) error {
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
	var targets []waitTarget
	for _, s := range srcs {
		result, gen, err := sess.apply(ctx, s.obj)
		if err != nil {
			return fmt.Errorf("applying %s (%v): %w", ref(s.obj.Key()), s, err)
		}
		fmt.Fprintf(c.stdout, "%s %s\n", ref(s.obj.Key()), result)
		targets = append(targets, waitTarget{key: s.obj.Key(), generation: gen})
	}
	if !wait {
		return nil
	}
	return c.wait(ctx, sess, targets, timeout)
}

// apply applies obj and says what that did: "created", "configured (generation 2)" or
// "unchanged", and which generation the stored object has.
func (s *session) apply(ctx context.Context, obj *nimbusv1.Object) (string, int64, error) {
	resp, err := s.nimbus.Apply(ctx, &nimbusv1.ApplyRequest{Object: obj})
	if err != nil {
		return "", 0, s.rpcError(err)
	}
	gen := resp.GetObject().GetMeta().GetGeneration()
	switch {
	case !resp.GetChanged():
		return "unchanged", gen, nil
	case resp.GetCreated():
		return "created", gen, nil
	}
	return fmt.Sprintf("configured (generation %d)", gen), gen, nil
}
