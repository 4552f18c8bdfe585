package naplesctl

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// deleteCommand returns the delete command.
func (c *cli) deleteCommand() *cobra.Command {
	var (
		files             []string
		tenant, namespace string
	)
	cmd := &cobra.Command{
		Use:   "delete (KIND NAME... | -f FILE...)",
		Short: "Delete objects by kind and name or as listed in manifest files",
		Long: `Delete objects by kind and name or as listed in manifest files.

Deleting an object that does not exist is not an error: it is reported as not found.
With -f only the kind, tenant, namespace and name of each object are read.`,
		Example: `  naplesctl delete route to-dc2
  naplesctl delete -f route.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(files) > 0 {
				if len(args) > 0 {
					return fmt.Errorf("delete takes either KIND NAME or -f, not both (got %q)", args)
				}
				return nil
			}
			if len(args) < 2 {
				return errors.New("delete needs KIND and NAME, or -f FILE")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var keys []*nimbusv1.ObjectKey
			if len(files) > 0 {
				if tenant != "" || namespace != "" {
					return errors.New("--tenant and --namespace cannot be used with -f: the manifest names them")
				}
				srcs, err := c.readManifests(files)
				if err != nil {
					return err
				}
				var invalid []error
				for _, s := range srcs {
					keys = append(keys, s.obj.Key())
					if err := s.obj.Key().Validate(); err != nil {
						for _, fe := range fieldErrors(err) {
							invalid = append(invalid, fmt.Errorf("%v: %w", s, fe))
						}
					}
				}
				if len(invalid) > 0 {
					return fmt.Errorf("reading keys, nothing deleted:\n%w", errors.Join(invalid...))
				}
			} else {
				kind, err := parseKind(args[0])
				if err != nil {
					return err
				}
				for _, name := range args[1:] {
					keys = append(keys, nimbusv1.NewKey(kind, tenant, namespace, name))
				}
			}
			return c.delete(cmd.Context(), keys)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `manifest file whose objects to delete, "-" for stdin; repeatable`)
	cmd.Flags().StringVar(&tenant, "tenant", "", `tenant of the objects (default "default")`)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", `namespace of the objects (default "default")`)
	return cmd
}

// delete deletes keys in order and prints per key whether it was deleted or not found.
func (c *cli) delete(ctx context.Context, keys []*nimbusv1.ObjectKey) error {
	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	for _, k := range keys {
		resp, err := sess.nimbus.Delete(ctx, &nimbusv1.DeleteRequest{Key: k})
		if err != nil {
			return fmt.Errorf("deleting %s: %w", ref(k), sess.rpcError(err))
		}
		result := "deleted"
		if !resp.GetFound() {
			result = "not found"
		}
		fmt.Fprintf(c.stdout, "%s %s\n", ref(k), result)
	}
	return nil
}
