package cli

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// The values of get's --output flag.
const (
	outputTable = "table"
	outputJSON  = "json"
	outputYAML  = "yaml"
)

// getOptions are the flags of get.
type getOptions struct {
	output    string
	tenant    string
	namespace string
}

// getCommand returns the get command.
func (c *cli) getCommand() *cobra.Command {
	var o getOptions
	cmd := &cobra.Command{
		Use:   "get KIND [NAME]",
		Short: "Show objects of a kind and how far their programming has come",
		Long: `Show objects of a kind and how far their programming has come.

KIND is a kind name in any case, singular, plural or short: route, Routes, rt, sg
(naplesctl api-resources lists them).
Without NAME every object of the kind is listed, in every tenant and namespace unless
--tenant or --namespace narrow it; with NAME tenant and namespace default to "default".

The table's GENERATION is the object's current generation. PROGRAMMED counts the target
nodes that run it, out of all target nodes; FAILED counts those that failed to program
it and PENDING those that have done neither yet; STALE counts the target nodes whose
status is stale because their agent has been disconnected for a while. naplesctl
describe lists every node. -o json and
-o yaml print objects in manifest shape with their per-node status, and can be applied
again.`,
		Example: `  naplesctl get routes
  naplesctl get route to-dc2 -o yaml`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := parseKind(args[0])
			if err != nil {
				return err
			}
			switch o.output {
			case outputTable, outputJSON, outputYAML:
			default:
				return exitstatus.Mark(fmt.Errorf("--output %q: want %s, %s or %s", o.output, outputTable, outputJSON, outputYAML))
			}
			if len(args) == 2 {
				return c.getOne(cmd.Context(), nimbusv1.NewKey(kind, o.tenant, o.namespace, args[1]), o)
			}
			return c.list(cmd.Context(), kind, o)
		},
	}
	cmd.Flags().StringVarP(&o.output, "output", "o", outputTable, "output format: table, json or yaml")
	cmd.Flags().StringVar(&o.tenant, "tenant", "", "tenant of the objects (default: all when listing, \"default\" with NAME)")
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "", "namespace of the objects (default: all when listing, \"default\" with NAME)")
	return cmd
}

// getOne prints the object with key.
func (c *cli) getOne(ctx context.Context, key *nimbusv1.ObjectKey, o getOptions) error {
	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	item, err := sess.get(ctx, key)
	if err != nil {
		return err
	}
	switch o.output {
	case outputJSON:
		return manifest.Encode(c.stdout, manifest.JSON, item.GetObject(), item.GetStatus())
	case outputYAML:
		return manifest.Encode(c.stdout, manifest.YAML, item.GetObject(), item.GetStatus())
	}
	return c.table([]*nimbusv1.ObjectWithStatus{item})
}

// list prints every object of kind, filtered by tenant and namespace when they are set.
func (c *cli) list(ctx context.Context, kind nimbusv1.Kind, o getOptions) error {
	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	// Page by page: each fits the default receive limit, however large the objects.
	resp, err := nimbusv1.ListAll(ctx, sess.nimbus, &nimbusv1.ListRequest{Kind: kind, Tenant: o.tenant, Namespace: o.namespace})
	if err != nil {
		return fmt.Errorf("listing %s objects: %w", kind.Name(), sess.rpcError(err))
	}
	items := make([]*nimbusv1.ObjectWithStatus, 0, len(resp.GetItems()))
	for _, it := range resp.GetItems() {
		items = append(items, withStatus(it))
	}
	slices.SortFunc(items, func(a, b *nimbusv1.ObjectWithStatus) int {
		am, bm := a.GetObject().GetMeta(), b.GetObject().GetMeta()
		return cmp.Or(
			cmp.Compare(am.GetTenant(), bm.GetTenant()),
			cmp.Compare(am.GetNamespace(), bm.GetNamespace()),
			cmp.Compare(am.GetName(), bm.GetName()),
		)
	})
	switch o.output {
	case outputJSON:
		return manifest.EncodeList(c.stdout, manifest.JSON, items)
	case outputYAML:
		return manifest.EncodeList(c.stdout, manifest.YAML, items)
	}
	if len(items) == 0 {
		fmt.Fprintln(c.stderr, "No resources found.")
		return nil
	}
	return c.table(items)
}

// withStatus returns item with an empty status when it has none, so that output always
// has a status.
func withStatus(item *nimbusv1.ObjectWithStatus) *nimbusv1.ObjectWithStatus {
	if item.GetStatus() != nil {
		return item
	}
	return &nimbusv1.ObjectWithStatus{Object: item.GetObject(), Status: &nimbusv1.ObjectStatus{}}
}

// table prints items as a table, one row per object.
func (c *cli) table(items []*nimbusv1.ObjectWithStatus) error {
	tw := newTable(c.stdout, 3)
	fmt.Fprintln(tw, "NAME\tTENANT\tNAMESPACE\tGENERATION\tPROGRAMMED\tFAILED\tPENDING\tSTALE\tAGE")
	now := c.now()
	for _, it := range items {
		m, p := it.GetObject().GetMeta(), propagationOf(it, 0)
		age := "<unknown>"
		if m.GetCreateTime() != nil {
			age = humanDuration(now.Sub(m.GetCreateTime().AsTime()))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%d\t%d\t%d\t%s\n",
			m.GetName(), m.GetTenant(), m.GetNamespace(), m.GetGeneration(),
			p.programmed, p.target, p.failed, p.pendingCount(), p.stale, age)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	return nil
}

// humanDuration formats an age the way kubectl does, with two significant units at most:
// "45s", "5m30s", "3h", "2d4h", "400d", "3y10d".
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	sec := int64(d.Round(time.Second) / time.Second)
	mins, hours, days := sec/60, sec/3600, sec/86400
	switch {
	case sec < 120:
		return strconv.FormatInt(sec, 10) + "s"
	case mins < 10:
		if s := sec % 60; s != 0 {
			return fmt.Sprintf("%dm%ds", mins, s)
		}
		return fmt.Sprintf("%dm", mins)
	case mins < 3*60:
		return fmt.Sprintf("%dm", mins)
	case hours < 8:
		if m := mins % 60; m != 0 {
			return fmt.Sprintf("%dh%dm", hours, m)
		}
		return fmt.Sprintf("%dh", hours)
	case hours < 48:
		return fmt.Sprintf("%dh", hours)
	case hours < 8*24:
		if h := hours % 24; h != 0 {
			return fmt.Sprintf("%dd%dh", days, h)
		}
		return fmt.Sprintf("%dd", days)
	case days < 2*365:
		return fmt.Sprintf("%dd", days)
	case days < 8*365:
		if d := days % 365; d != 0 {
			return fmt.Sprintf("%dy%dd", days/365, d)
		}
		return fmt.Sprintf("%dy", days/365)
	}
	return fmt.Sprintf("%dy", days/365)
}
