package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/exitstatus"
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
With -f only the kind, tenant, namespace and name of each object are read. Every key is
checked first, and an object may be named only once; if any key is bad, nothing is
deleted. The keys are then sent in order, in as few batches as their size allows (up to
1 MiB each); nimbus deletes each batch whole or not at all.`,
		Example: `  naplesctl delete route to-dc2
  naplesctl delete -f route.yaml
  naplesctl delete -f manifests/ -R`,
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
			if c.recursive {
				return errors.New("-R reads the directories given to -f: it needs -f")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				keys  []*nimbusv1.ObjectKey
				where func(i int) string
				// describe names the entries [first, end) in errors.
				describe func(first, end int) string
			)
			if len(files) > 0 {
				if tenant != "" || namespace != "" {
					return exitstatus.Mark(errors.New("--tenant and --namespace cannot be used with -f: the manifest names them"))
				}
				srcs, err := c.readManifests(files, true)
				if err != nil {
					return err
				}
				for _, s := range srcs {
					keys = append(keys, s.obj.Key())
				}
				where = func(i int) string { return srcs[i].String() }
				describe = func(first, end int) string { return describeSpan(srcs[first:end]) }
			} else {
				kind, err := parseKind(args[0])
				if err != nil {
					return err
				}
				for i, name := range args[1:] {
					key, err := argKey(kind, tenant, namespace, name, i+2)
					if err != nil {
						return fmt.Errorf("reading keys, nothing deleted:\n%w", err)
					}
					keys = append(keys, key)
				}
				// The names are arguments 2 on, after KIND.
				where = func(i int) string { return fmt.Sprintf("argument %d", i+2) }
				describe = func(first, end int) string {
					if end-first == 1 {
						return ref(keys[first])
					}
					return ref(keys[first]) + " to " + ref(keys[end-1])
				}
			}
			// A key read from a manifest is named by the fields that hold it there.
			field := func(f string) string { return f }
			if len(files) > 0 {
				field = func(f string) string { return "meta." + strings.TrimPrefix(f, "key.") }
			}
			var invalid []error
			for i, k := range keys {
				if err := k.Validate(); err != nil {
					for _, fe := range fieldErrors(err) {
						if f := (*nimbusv1.FieldError)(nil); errors.As(fe, &f) {
							fe = &nimbusv1.FieldError{Field: field(f.Field), Value: f.Value, Reason: f.Reason}
						}
						invalid = append(invalid, fmt.Errorf("%s: %s: %w", where(i), ref(k), fe))
					}
				}
			}
			invalid = append(invalid, duplicates(keys, field("key.name"), where)...)
			if len(invalid) > 0 {
				err := fmt.Errorf("reading keys, nothing deleted:\n%w", errors.Join(invalid...))
				if len(files) == 0 {
					err = exitstatus.Mark(err) // a name given twice: a usage error
				}
				return err
			}
			return c.delete(cmd.Context(), keys, where, describe)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, filenameUsage("whose objects to delete"))
	c.addRecursiveFlag(cmd)
	cmd.Flags().StringVar(&tenant, "tenant", "", `tenant of the objects (default "default")`)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", `namespace of the objects (default "default")`)
	return cmd
}

// delete deletes the valid keys in order, in batches, and prints per key whether it was
// deleted or not found. where names a key's place in errors, describe the keys [first,
// end) of a batch.
func (c *cli) delete(ctx context.Context, keys []*nimbusv1.ObjectKey, where func(i int) string, describe func(first, end int) string) error {
	sess, kit, closeAll, err := c.connectController()
	if err != nil {
		return err
	}
	defer closeAll()
	_, err = kit.DeleteWith(ctx, keys, controller.DeleteOptions{
		Deleted: func(first int, results []*nimbusv1.DeleteResponse) error {
			// The lines of a batch go out in one write, not one per key.
			var out bytes.Buffer
			for i, r := range results {
				result := "deleted"
				if !r.GetFound() {
					result = "not found"
				}
				fmt.Fprintf(&out, "%s %s\n", ref(keys[first+i]), result)
			}
			if _, err := c.stdout.Write(out.Bytes()); err != nil {
				return fmt.Errorf("writing results: %w", err)
			}
			return nil
		},
	})
	if err != nil {
		return sess.batchFailed("deleting", "deleted", err, describe, where)
	}
	return nil
}
