package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// describeCommand returns the describe command.
func (c *cli) describeCommand() *cobra.Command {
	var tenant, namespace string
	var nodesLimit int
	cmd := &cobra.Command{
		Use:   "describe KIND NAME",
		Short: "Show one object's propagation to every target node",
		Long: `Show one object's propagation to every target node.

The header says which generation the object is at and how many of its target nodes
have programmed it, failed, are still pending or report a stale status, and when the
last of them caught up. The table that follows has one row per target node: its
phase, the generation it observed, whether its status is stale (its agent has been
disconnected for longer than nimbus's grace period), when it last reported, and why.
A target node that has reported nothing yet is shown with "-". The table lists the
first --nodes-limit nodes by name and, after them, as many FAILED nodes at the most; a
line says how many more nodes it leaves out, and how many of those FAILED.`,
		Example: `  naplesctl describe route to-dc2`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := parseKind(args[0])
			if err != nil {
				return err
			}
			if nodesLimit < 0 {
				return exitstatus.Mark(fmt.Errorf("--nodes-limit %d: must not be negative", nodesLimit))
			}
			key, err := argKey(kind, tenant, namespace, args[1], 2)
			if err != nil {
				return err
			}
			return c.describe(cmd.Context(), key, nodesLimit)
		},
	}
	cmd.Flags().IntVar(&nodesLimit, "nodes-limit", defaultNodesLimit,
		"the most nodes the node table lists, and the most FAILED nodes it lists after them; 0 lists every node")
	cmd.Flags().StringVar(&tenant, "tenant", "", `tenant of the object (default "default")`)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", `namespace of the object (default "default")`)
	return cmd
}

// defaultNodesLimit is the default of describe's --nodes-limit.
const defaultNodesLimit = 1000

// nodeStatusesPage is the most node statuses describe asks nimbus for in one page.
const nodeStatusesPage = 1000

// describe prints the object with key and its status on its target nodes: the first
// nodesLimit of them by name (every one for 0) and the FAILED ones after those.
func (c *cli) describe(ctx context.Context, key *nimbusv1.ObjectKey, nodesLimit int) error {
	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	item, err := sess.get(ctx, key)
	if err != nil {
		return err
	}
	nodes, err := sess.nodeStatuses(ctx, key, nodesLimit)
	if err != nil {
		return err
	}
	return c.writeDescription(c.stdout, item, nodes)
}

// nodeRow is one row of describe's node table: a node and its status, nil when it has
// reported nothing.
type nodeRow struct {
	name string
	st   *nimbusv1.NodeStatus
}

// nodeTable is what describe lists of an object's target nodes.
type nodeTable struct {
	// rows are the nodes listed, by name.
	rows []nodeRow
	// cut is true when nodes were left out.
	cut bool
}

// nodeStatuses reads the object's status on its target nodes with ListNodeStatuses, page
// by page: the first limit nodes by name (every one for 0), then the FAILED nodes after
// those, at most limit of them. It returns nil for a nimbus that does not have
// ListNodeStatuses; its error wraps ErrNotFound when nimbus does not have the object.
func (s *session) nodeStatuses(ctx context.Context, key *nimbusv1.ObjectKey, limit int) (*nodeTable, error) {
	t := &nodeTable{}
	req := &nimbusv1.ListNodeStatusesRequest{Key: key}
	// read appends the nodes the filter selects, from req's page token on, until it has
	// appended max of them (0: no bound) or none are left; it tells whether some are.
	read := func(filter nimbusv1.NodeStatusFilter, max int) (bool, error) {
		req.Filter = filter
		for n := 0; max == 0 || n < max; {
			req.Limit = nodeStatusesPage
			if max > 0 {
				req.Limit = int32(min(max-n, nodeStatusesPage))
			}
			resp, err := s.nimbus.ListNodeStatuses(ctx, req)
			if err != nil {
				return false, err
			}
			for _, e := range resp.GetEntries() {
				t.rows = append(t.rows, nodeRow{e.GetNode(), e.GetStatus()})
			}
			n += len(resp.GetEntries())
			if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
				return false, nil
			}
		}
		return true, nil
	}
	more, err := read(nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_UNSPECIFIED, limit)
	if err == nil && more {
		t.cut = true
		_, err = read(nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_FAILED, limit)
	}
	switch status.Code(err) {
	case codes.OK:
		return t, nil
	case codes.Unimplemented:
		return nil, nil
	case codes.NotFound:
		return nil, notFound(key)
	}
	return nil, fmt.Errorf("listing the node statuses of %s: %w", ref(key), s.rpcError(err))
}

// get returns the object with key and its status; its error wraps ErrNotFound when nimbus
// does not have the object.
func (s *session) get(ctx context.Context, key *nimbusv1.ObjectKey) (*nimbusv1.ObjectWithStatus, error) {
	resp, err := s.nimbus.Get(ctx, &nimbusv1.GetRequest{Key: key})
	if status.Code(err) == codes.NotFound {
		return nil, notFound(key)
	}
	if err != nil {
		return nil, fmt.Errorf("getting %s: %w", ref(key), s.rpcError(err))
	}
	return withStatus(resp.GetItem()), nil
}

// notFound returns the error for an object nimbus does not have, naming tenant and
// namespace when they are not the defaults.
func notFound(key *nimbusv1.ObjectKey) error {
	if key.GetTenant() == nimbusv1.DefaultTenant && key.GetNamespace() == nimbusv1.DefaultNamespace {
		return fmt.Errorf("%s %q %w", kindArg(key.GetKind()), key.GetName(), ErrNotFound)
	}
	return fmt.Errorf("%s %q %w in tenant %q, namespace %q",
		kindArg(key.GetKind()), key.GetName(), ErrNotFound, key.GetTenant(), key.GetNamespace())
}

// writeDescription writes the human-readable description of item to w, with the node
// table nodes, or, when nodes is nil, one made of the object status's nodes and pending
// nodes.
func (c *cli) writeDescription(w io.Writer, item *nimbusv1.ObjectWithStatus, nodes *nodeTable) error {
	obj, st := item.GetObject(), item.GetStatus()
	m := obj.GetMeta()
	p := propagationOf(item, 0)
	now := c.now()

	targets := fmt.Sprintf("all nodes (%d)", p.target)
	if len(m.GetNodes()) > 0 {
		targets = strings.Join(m.GetNodes(), ", ")
	}
	pending := strconv.Itoa(p.pendingCount())
	if names := p.pendingNames(); names != "" {
		pending += " (" + names + ")"
	}
	caughtUp := "-"
	if !p.caughtUp.IsZero() {
		caughtUp = fmt.Sprintf("%s (%s ago)", p.caughtUp.UTC().Format(time.RFC3339), humanDuration(now.Sub(p.caughtUp)))
	}

	tw := newTable(w, 2)
	for _, row := range [][2]string{
		{"Key", obj.Key().ID()},
		{"UID", m.GetUid()},
		{"Generation", strconv.FormatInt(m.GetGeneration(), 10)},
		{"Revision", strconv.FormatUint(m.GetRevision(), 10)},
		{"Targets", targets},
		{"Programmed", fmt.Sprintf("%d/%d", p.programmed, p.target)},
		{"Failed", strconv.Itoa(p.failed)},
		{"Pending", pending},
		{"Stale", strconv.Itoa(p.stale)},
		{"Caught up", caughtUp},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", row[0], row[1])
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing description: %w", err)
	}

	var rows []nodeRow
	if nodes != nil {
		rows = nodes.rows
	} else {
		// One row per node: those that reported, and the pending ones that have not.
		reported := map[string]bool{}
		for _, n := range st.GetNodes() {
			rows = append(rows, nodeRow{n.GetNode(), n})
			reported[n.GetNode()] = true
		}
		for _, name := range p.pending {
			if !reported[name] {
				rows = append(rows, nodeRow{name: name})
			}
		}
		slices.SortFunc(rows, func(a, b nodeRow) int { return strings.Compare(a.name, b.name) })
	}

	fmt.Fprintln(w)
	tw = newTable(w, 3)
	fmt.Fprintln(tw, "NODE\tPHASE\tOBSERVED\tSTALE\tUPDATED\tREASON\tMESSAGE")
	for _, r := range rows {
		if r.st == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\n", r.name)
			continue
		}
		stale := "no"
		if r.st.GetStale() {
			stale = "yes"
		}
		updated := "-"
		if t := r.st.GetUpdateTime(); t != nil {
			updated = humanDuration(now.Sub(t.AsTime())) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.name, phaseName(r.st.GetPhase()),
			r.st.GetObservedGeneration(), stale, updated, orDash(reasonOf(r.st)), orDash(oneLine(r.st.GetMessage())))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing node table: %w", err)
	}
	if nodes != nil && nodes.cut {
		if n := int(st.GetTargetNodes()) - len(rows); n > 0 {
			// As many FAILED nodes as --nodes-limit are listed after the first ones: the
			// line says how many more FAILED.
			failedLeft := p.failed
			for _, r := range rows {
				if r.st.GetPhase() == nimbusv1.Phase_PHASE_FAILED && r.st.GetObservedGeneration() == p.generation {
					failedLeft--
				}
			}
			var failedMore string
			if failedLeft > 0 {
				failedMore = fmt.Sprintf(", %d of them FAILED", failedLeft)
			}
			fmt.Fprintf(w, "... and %d more %s (--nodes-limit)%s\n", n, plural(n, "node", "nodes"), failedMore)
		}
	}
	// Then what each node reports of the object in operation: link state, counters.
	for _, r := range rows {
		op := operationalOf(r.st)
		if len(op) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nOperational on %s:\n", r.name)
		keys := slices.SortedFunc(maps.Keys(op), compareOperational)
		tw = newTable(w, 1)
		for _, k := range keys {
			fmt.Fprintf(tw, "  %s:\t%s\n", k, op[k])
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("writing operational data: %w", err)
		}
		if n := r.st.GetOperationalData().GetEntriesOmitted(); n > 0 {
			fmt.Fprintf(w, "  %d more list %s left out: the data were larger than nimbus keeps (its --max-status-operational-bytes).\n",
				n, plural(int(n), "entry was", "entries were"))
		}
	}
	if p.unnamed > 0 && nodes == nil {
		fmt.Fprintf(w, "%d more target %s reported nothing yet.\n", p.unnamed, plural(p.unnamed, "node has", "nodes have"))
	}
	if n := int(st.GetDetailsOmitted()); n > 0 && nodes == nil {
		fmt.Fprintf(w, "The messages and operational data of %d %s were left out: the object's statuses hold more than nimbus sends for one object (its --status-details-bytes).\n",
			n, plural(n, "node", "nodes"))
	}
	return nil
}

// compareOperational orders the keys of operational data by name, and the entries of
// one list by their index, so that "observations[2]" comes before "observations[10]".
func compareOperational(a, b string) int {
	an, ai, arest, aok := listEntry(a)
	bn, bi, brest, bok := listEntry(b)
	if aok && bok && an == bn {
		return cmp.Or(cmp.Compare(ai, bi), strings.Compare(arest, brest))
	}
	return strings.Compare(a, b)
}

// listEntry splits the key of a list's entry, "observations[3]" or "rules[3].hits",
// into the list's name, the index and what follows; ok is false for any other key.
func listEntry(key string) (name string, index int, rest string, ok bool) {
	name, after, found := strings.Cut(key, "[")
	if !found {
		return "", 0, "", false
	}
	digits, rest, found := strings.Cut(after, "]")
	index, err := strconv.Atoi(digits)
	if !found || err != nil {
		return "", 0, "", false
	}
	return name, index, rest, true
}

// operationalOf returns a node's operational data as keys and values: the typed data in
// their string form, or the string map alone a node of the release before reports.
func operationalOf(st *nimbusv1.NodeStatus) map[string]string {
	if op := st.GetOperationalData(); op != nil {
		return op.Map()
	}
	return st.GetOperational()
}

// propagation is how far one object has come at one generation across its target nodes.
//
// Nimbus reports generation, current_nodes, pending, stale_nodes and caught_up_time in the
// ObjectStatus; where it leaves them unset (an older nimbus) or they refer to another
// generation, propagationOf derives them from the nodes' reports, the number of target
// nodes and the object's meta.
type propagation struct {
	// generation is the generation the counts refer to.
	generation int64
	// target is the number of target nodes.
	target int
	// programmed and failed count the target nodes PROGRAMMED or FAILED at generation or
	// later; current counts those that observed generation in any phase.
	programmed, failed, current int
	// stale counts the target nodes whose status is stale.
	stale int
	// pending names the target nodes, known by name, that are neither PROGRAMMED nor
	// FAILED at generation, in name order.
	pending []string
	// unnamed counts the pending target nodes whose names are not known: nodes that have
	// not reported an object that targets every node, when nimbus does not name them.
	unnamed int
	// failures are the reports of the nodes FAILED at generation or later; terminal
	// those of them that no retry mends (NodeStatus.terminal), the others being retried.
	failures, terminal []*nimbusv1.NodeStatus
	// waiting are the reports of the nodes PENDING at generation or later that say what
	// they wait for (a message): a policy naming a SecurityGroup that does not exist,
	// say.
	waiting []*nimbusv1.NodeStatus
	// caughtUp is when the last target node reported PROGRAMMED at generation; zero while
	// any has not.
	caughtUp time.Time
	// detailsOmitted counts the nodes listed without their messages and operational data
	// (ObjectStatus.details_omitted).
	detailsOmitted int
}

// propagationOf returns how far item has come at generation gen; 0 means the object's
// current generation.
func propagationOf(item *nimbusv1.ObjectWithStatus, gen int64) propagation {
	obj, st := item.GetObject(), item.GetStatus()
	if gen == 0 {
		gen = obj.GetMeta().GetGeneration()
	}
	p := propagation{generation: gen, target: int(st.GetTargetNodes()), detailsOmitted: int(st.GetDetailsOmitted())}
	// settled is made when a node is: a status whose generation nimbus aggregated, as a
	// wait's most often is, never reads it.
	var settled map[string]bool
	settle := func(node string) {
		if settled == nil {
			settled = map[string]bool{}
		}
		settled[node] = true
	}
	var latest time.Time
	// later tells that nimbus aggregated a later generation than gen; listedLater counts
	// the nodes the status lists PROGRAMMED and FAILED at that one.
	later := st.GetGeneration() > gen
	var listedLater struct{ programmed, failed int }
	for _, n := range st.GetNodes() {
		if n.GetStale() {
			p.stale++
		}
		if n.GetObservedGeneration() == gen {
			p.current++
		}
		if n.GetObservedGeneration() < gen {
			continue
		}
		if later && n.GetObservedGeneration() == st.GetGeneration() {
			switch n.GetPhase() {
			case nimbusv1.Phase_PHASE_PROGRAMMED:
				listedLater.programmed++
			case nimbusv1.Phase_PHASE_FAILED:
				listedLater.failed++
			}
		}
		switch n.GetPhase() {
		case nimbusv1.Phase_PHASE_PROGRAMMED:
			p.programmed++
			settle(n.GetNode())
			if t := n.GetUpdateTime(); t != nil && t.AsTime().After(latest) {
				latest = t.AsTime()
			}
		case nimbusv1.Phase_PHASE_FAILED:
			p.failed++
			settle(n.GetNode())
			p.failures = append(p.failures, n)
			if n.GetTerminal() {
				p.terminal = append(p.terminal, n)
			}
		case nimbusv1.Phase_PHASE_PENDING:
			if n.GetMessage() != "" {
				p.waiting = append(p.waiting, n)
			}
		}
	}
	switch {
	case st.GetGeneration() != 0 && st.GetGeneration() == gen:
		// Nimbus aggregated this very generation: its counts and names are authoritative,
		// and it knows the target nodes that have reported nothing.
		p.programmed, p.failed, p.current = int(st.GetProgrammedNodes()), int(st.GetFailedNodes()), int(st.GetCurrentNodes())
		p.stale = int(st.GetStaleNodes())
		p.pending = slices.Sorted(slices.Values(st.GetPending()))
		p.caughtUp = time.Time{}
		if t := st.GetCaughtUpTime(); t != nil {
			p.caughtUp = t.AsTime()
		}
	case later:
		// Nimbus aggregated a later generation: its counts count every node at that one,
		// of which the status lists only some (its --status-nodes); the nodes listed at
		// gen or later but short of that one count beside them. Its pending nodes are
		// short of that one, and of gen unless they are listed as settled at it.
		p.programmed += int(st.GetProgrammedNodes()) - listedLater.programmed
		p.failed += int(st.GetFailedNodes()) - listedLater.failed
		p.stale = int(st.GetStaleNodes())
		for _, name := range st.GetPending() {
			if !settled[name] {
				p.pending = append(p.pending, name)
			}
		}
		slices.Sort(p.pending)
		if p.done() {
			p.caughtUp = latest
			if t := st.GetCaughtUpTime(); t != nil && t.AsTime().After(latest) {
				p.caughtUp = t.AsTime()
			}
		}
	default:
		names := obj.GetMeta().GetNodes()
		if len(names) == 0 {
			for _, n := range st.GetNodes() {
				names = append(names, n.GetNode())
			}
		}
		for _, name := range names {
			if !settled[name] {
				p.pending = append(p.pending, name)
			}
		}
		slices.Sort(p.pending)
		p.pending = slices.Compact(p.pending)
		if p.done() {
			p.caughtUp = latest
		}
	}
	p.unnamed = max(0, p.target-p.programmed-p.failed-len(p.pending))
	return p
}

// done reports whether every target node, and at least one, is PROGRAMMED at the
// generation.
func (p propagation) done() bool { return p.target > 0 && p.programmed >= p.target }

// unlistedFailed returns how many of the nodes FAILED at the generation or later the
// object's status does not list (nimbus lists at most its --status-nodes nodes, FAILED
// ones first).
func (p propagation) unlistedFailed() int { return max(0, p.failed-len(p.failures)) }

// pendingCount returns the number of target nodes neither PROGRAMMED nor FAILED at the
// generation.
func (p propagation) pendingCount() int { return len(p.pending) + p.unnamed }

// pendingNames lists the pending nodes for a person: "host-c, host-d and 2 more".
func (p propagation) pendingNames() string {
	names := strings.Join(p.pending, ", ")
	switch {
	case p.unnamed == 0:
		return names
	case names == "":
		return fmt.Sprintf("%d %s not reported", p.unnamed, plural(p.unnamed, "node has", "nodes have"))
	}
	return fmt.Sprintf("%s and %d more", names, p.unnamed)
}

// reasonOf is how a node's reason is shown: for a FAILED node, followed by whether its
// agent retries ("KernelError (retrying)") or no retry mends it ("InvalidSpec
// (terminal)").
func reasonOf(n *nimbusv1.NodeStatus) string {
	r := n.GetReason()
	if n.GetPhase() != nimbusv1.Phase_PHASE_FAILED {
		return r
	}
	if r == "" {
		r = "Failed"
	}
	if n.GetTerminal() {
		return r + " (terminal)"
	}
	return r + " (retrying)"
}

// phaseName is how a phase is shown in tables: "PROGRAMMED".
func phaseName(ph nimbusv1.Phase) string { return strings.TrimPrefix(ph.String(), "PHASE_") }

// orDash returns s, or "-" when s is empty, so that table cells are never blank.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine folds line breaks and tabs into spaces, so that a message stays in its cell.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// plural returns one when n is 1 and many otherwise.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
