package cli

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/naplesnet/naples/controller"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// getOptions are the flags of get.
type getOptions struct {
	output    string
	tenant    string
	namespace string
	// watch is the --watch flag.
	watch bool
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
describe lists every node.

--output (-o) chooses another format:
  wide                     the table and NODES (the target nodes, <all> for every node)
                           and columns of the kind: a Route's TABLE, PREFIX and NEXTHOPS
                           (gateway@device), a Network's VNI, SUBNETS and MTU, an
                           Endpoint's NETWORK, NODE, ADDRESSES and MAC...
  name                     kind/name, one per line: route/to-dc2 (as apply prints it;
                           tenant and namespace are left out)
  json, yaml               the objects in manifest shape with their per-node status, which
                           can be applied again; 64-bit integers are numbers
  jsonpath=TEMPLATE        what a kubectl JSONPath template finds in the document -o json
                           prints: the object, or {"items": [...]} when listing; as
                           kubectl, no newline is added ({"\n"} writes one)
  custom-columns=HEADER:PATH,...
                           a table with a column per HEADER, holding what PATH, a JSONPath
                           in kubectl's relaxed form (.meta.name), finds in each object's
                           -o json document; <none> when it finds nothing

--watch (-w) prints the objects, then every change to them or to their status as nimbus
streams it (a node's report, a new generation), until interrupted: a row per change in
the table formats (when the row changes), a line with -o name, a document with -o json
(one after the other), -o yaml (separated by ---) and -o jsonpath (the template over
each object). A deleted object prints its last row or line followed by DELETED, or its
last document with "deleted": true.`,
		Example: `  naplesctl get routes
  naplesctl get routes -o wide
  naplesctl get route to-dc2 -o yaml
  naplesctl get routes -o name
  naplesctl get routes -w
  naplesctl get route to-dc2 -w -o yaml
  naplesctl get routes -o jsonpath='{range .items[*]}{.meta.name}{"\t"}{.spec.prefix}{"\n"}{end}'
  naplesctl get routes -o custom-columns=NAME:.meta.name,PREFIX:.spec.prefix,PROGRAMMED:.status.programmedNodes`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := parseKind(args[0])
			if err != nil {
				return err
			}
			out, err := parseOutput(o.output)
			if err != nil {
				return err
			}
			if len(args) == 2 {
				key, err := argKey(kind, o.tenant, o.namespace, args[1], 2)
				if err != nil {
					return err
				}
				if o.watch {
					f := controller.Filter{Kind: kind, Tenant: key.GetTenant(), Namespace: key.GetNamespace(), Name: key.GetName()}
					return c.watchObjects(cmd.Context(), kind, f, true, out)
				}
				return c.getOne(cmd.Context(), key, out)
			}
			if o.watch {
				return c.watchObjects(cmd.Context(), kind, controller.Filter{Kind: kind, Tenant: o.tenant, Namespace: o.namespace}, false, out)
			}
			return c.list(cmd.Context(), kind, o, out)
		},
	}
	cmd.Flags().StringVarP(&o.output, "output", "o", outputTable,
		"output format: table, wide, name, json, yaml, jsonpath=TEMPLATE or custom-columns=HEADER:PATH,...")
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false,
		"after the objects, print every change to them or to their status until interrupted")
	cmd.Flags().StringVar(&o.tenant, "tenant", "", "tenant of the objects (default: all when listing, \"default\" with NAME)")
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "", "namespace of the objects (default: all when listing, \"default\" with NAME)")
	return cmd
}

// getOne prints the object with key in format out.
func (c *cli) getOne(ctx context.Context, key *nimbusv1.ObjectKey, out output) error {
	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	item, err := sess.get(ctx, key)
	if err != nil {
		return err
	}
	return c.printObjects(key.GetKind(), []*nimbusv1.ObjectWithStatus{item}, out, true)
}

// list prints every object of kind, filtered by tenant and namespace when they are set,
// in format out.
func (c *cli) list(ctx context.Context, kind nimbusv1.Kind, o getOptions, out output) error {
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
	slices.SortFunc(items, compareItems)
	return c.printObjects(kind, items, out, false)
}

// compareItems orders objects by tenant, namespace and name.
func compareItems(a, b *nimbusv1.ObjectWithStatus) int {
	am, bm := a.GetObject().GetMeta(), b.GetObject().GetMeta()
	return cmp.Or(
		cmp.Compare(am.GetTenant(), bm.GetTenant()),
		cmp.Compare(am.GetNamespace(), bm.GetNamespace()),
		cmp.Compare(am.GetName(), bm.GetName()),
	)
}

// withStatus returns item with an empty status when it has none, so that output always
// has a status.
func withStatus(item *nimbusv1.ObjectWithStatus) *nimbusv1.ObjectWithStatus {
	if item.GetStatus() != nil {
		return item
	}
	return &nimbusv1.ObjectWithStatus{Object: item.GetObject(), Status: &nimbusv1.ObjectStatus{}}
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
