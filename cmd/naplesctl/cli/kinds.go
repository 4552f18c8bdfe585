package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The values of api-resources' --output flag; the empty string is the table.
const (
	// kindsOutputWide is the table with a FIELDS column.
	kindsOutputWide = "wide"
	// kindsOutputName prints each kind's plural name alone on a line.
	kindsOutputName = "name"
)

// apiResourcesCommand returns the api-resources command.
func (c *cli) apiResourcesCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "api-resources [-o wide|name]",
		Short: "List the object kinds, their short names and their fields",
		Long: `List the object kinds nimbus stores: their plural name, their short name and the
kind as manifests spell it, one kind per line in the order of the API. Every name in
the table is accepted wherever naplesctl takes a kind, in any case: get rt, get routes
and get Route are the same.

-o wide adds FIELDS, the top-level fields of the kind's spec as manifests spell them;
naplesctl explain KIND describes the kind and each field. -o name prints the plural
names alone, one a line. api-resources does not talk to nimbus.`,
		Example: `  naplesctl api-resources
  naplesctl api-resources -o wide
  naplesctl api-resources -o name`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "", kindsOutputWide:
				return c.kindTable(output == kindsOutputWide)
			case kindsOutputName:
				for _, k := range nimbusv1.Kinds() {
					if _, err := fmt.Fprintln(c.stdout, k.Plural()); err != nil {
						return fmt.Errorf("writing kinds: %w", err)
					}
				}
				return nil
			}
			return exitstatus.Mark(fmt.Errorf("--output %q: want %s or %s", output, kindsOutputWide, kindsOutputName))
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: wide (with the spec's fields) or name (plural names only); the default is a table")
	return cmd
}

// kindTable prints the kinds as a table, with their spec's fields when wide.
func (c *cli) kindTable(wide bool) error {
	tw := newTable(c.stdout, 3)
	header := "NAME\tSHORTNAMES\tKIND"
	if wide {
		header += "\tFIELDS"
	}
	fmt.Fprintln(tw, header)
	for _, k := range nimbusv1.Kinds() {
		row := k.Plural() + "\t" + k.ShortName() + "\t" + k.Name()
		if wide {
			row += "\t" + strings.Join(specFieldNames(k), ",")
		}
		fmt.Fprintln(tw, row)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing kinds: %w", err)
	}
	return nil
}

// specFieldNames returns the JSON names of the top-level fields of kind's spec, as
// manifests spell them, in the order of the .proto.
func specFieldNames(kind nimbusv1.Kind) []string {
	return fieldNames(kind.SpecDescriptor())
}

// fieldNames returns the JSON names of md's fields in the order of the .proto, or none
// when md is nil.
func fieldNames(md protoreflect.MessageDescriptor) []string {
	if md == nil {
		return nil
	}
	fields := md.Fields()
	names := make([]string, 0, fields.Len())
	for i := range fields.Len() {
		names = append(names, fields.Get(i).JSONName())
	}
	return names
}
