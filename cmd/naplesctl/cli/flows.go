package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/manifest"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	flowsv1 "github.com/naplesnet/naples/proto/nimbus/flows/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// flowsCommand returns the flows command.
func (c *cli) flowsCommand() *cobra.Command {
	output := outputTable
	var follow bool
	var since time.Duration
	var nodes []string
	req := &delphiv1.FlowsRequest{}
	cmd := &cobra.Command{
		Use:   "flows",
		Short: "Show the flows the nodes' firewalls saw: connections allowed, packets denied",
		Long: `Show the flows the nodes' firewalls saw: each connection allowed (with the rule
that allowed it), each packet dropped (with the reason and the rule), each connection
still active every active timeout, and each connection's end (fin, rst or idle), with
the connection's packets and bytes from its source and back.

Without --agent (given on the command line or as $` + AgentEnv + `), the flows command asks
nimbus (--server and the TLS flags, as the other nimbus commands), which relays the
records of every node's agent, or of the nodes named by --node, through any replica.
The filters are applied at each agent, so only the records that match leave a host.
With --agent it talks to that host's agent's local API instead.

Each agent keeps its latest records (its --flows-ring); -f prints them (with --since or
--last; through nimbus, -f alone starts from now), then every new one until interrupted.
Filters: --from and --to take an endpoint's name (name, namespace/name or
tenant/namespace/name; the host's or a peer's) or an address, --verdict allowed or
denied, --policy a NetworkSecurityPolicy's name, --since a duration.

Records are never lost silently: when a firewall's ring was full, an agent let go of
records before they were read, or nimbus dropped some because this command read too
slowly, a line on standard error says how many, per node; so does a line naming the
nodes asked for that are not connected. -o json prints one record per line.`,
		Example: `  naplesctl flows -f
  naplesctl flows -f --node host-a --node host-b --verdict denied
  naplesctl --agent /run/naples/agent.sock flows --from web-1 --to 10.1.0.7 --since 5m -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, outputTable, outputJSON); err != nil {
				return err
			}
			if since < 0 {
				return exitstatus.Mark(fmt.Errorf("--since %v: want a duration of zero or more", since))
			}
			if cmd.Flags().Changed("since") {
				req.Since = durationpb.New(since)
			}
			req.Follow = follow
			return c.streamFlows(cmd, req, nodes, c.newFlowPrinter(output), "flows")
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print new flows as they come, until interrupted")
	cmd.Flags().StringVar(&req.From, "from", "", "only flows from this endpoint, local or peer (name, namespace/name, tenant/namespace/name), or address")
	cmd.Flags().StringVar(&req.To, "to", "", "only flows to this endpoint or address")
	cmd.Flags().StringVar(&req.Verdict, "verdict", "", "only flows with this verdict: allowed or denied")
	cmd.Flags().StringVar(&req.Policy, "policy", "", "only flows a rule of this NetworkSecurityPolicy decided")
	cmd.Flags().DurationVar(&since, "since", 0, "only flows of this long ago or later, e.g. 5m")
	cmd.Flags().Uint32Var(&req.Limit, "last", 0, "only the latest N of the recent flows (0: all the agent keeps)")
	cmd.Flags().StringArrayVar(&nodes, "node", nil, "through nimbus, only the flows of this node (repeat for more; default every node)")
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: table or json")
	return cmd
}

// streamFlows prints with p the flows of the request, what they are called in errors:
// from the agent's local API when --agent (or its variable) is given, else through nimbus
// from the nodes, every node's for none.
func (c *cli) streamFlows(cmd *cobra.Command, req *delphiv1.FlowsRequest, nodes []string, p *flowPrinter, what string) error {
	if err := checkFlowFilter(req); err != nil {
		return err
	}
	if cmd.Flag("agent").Changed || c.agentEnv {
		if len(nodes) > 0 {
			return exitstatus.Mark(fmt.Errorf("--node %s: the agent's local API shows its own node's %s only; leave --agent out to ask nimbus", strings.Join(nodes, ","), what))
		}
		return c.agentFlows(cmd.Context(), req, p)
	}
	for _, n := range nodes {
		if err := nimbusv1.ValidateNodeName(n); err != nil {
			return exitstatus.Mark(fmt.Errorf("--node %q: %w", n, err))
		}
	}
	return c.nimbusFlows(cmd.Context(), &flowsv1.ObserveFlowsRequest{Filter: req, Nodes: nodes}, p)
}

// agentFlows prints with p the flows the agent sends for the request, and on standard
// error the records lost as the count grows.
func (c *cli) agentFlows(ctx context.Context, req *delphiv1.FlowsRequest, p *flowPrinter) error {
	sess, err := c.connectAgent()
	if err != nil {
		return err
	}
	defer sess.Close()
	stream, err := sess.delphi.Flows(ctx, req)
	if err != nil {
		return fmt.Errorf("reading the flows: %w", sess.rpcError(err))
	}
	var lostDatapath, lostAgent, suppressed uint64
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading the flows: %w", sess.rpcError(err))
		}
		first := p.first
		if err := p.print(resp.GetFlows()); err != nil {
			return err
		}
		// Loss is told as it grows, the first time as it is.
		if d := resp.GetLostDatapath(); d != lostDatapath || (first && d > 0) {
			fmt.Fprintf(c.stderr, "naplesctl: the firewall lost %d flow records in all: its ring (the agent's --fw-flow-ring-bytes) was full\n", d)
			lostDatapath = d
		}
		if s := resp.GetSuppressed(); s != suppressed || (first && s > 0) {
			fmt.Fprintf(c.stderr, "naplesctl: the firewall suppressed %d flow records in all: their endpoints wrote more than the agent's --fw-flow-endpoint-rate\n", s)
			suppressed = s
		}
		if a := resp.GetLostAgent(); a != lostAgent {
			fmt.Fprintf(c.stderr, "naplesctl: %d flow records were let go of by the agent before they were read (its --flows-ring is full)\n", a)
			lostAgent = a
		}
	}
}

// nimbusFlows prints with p the flows nimbus relays from the nodes' agents for the request,
// and on standard error each node's losses as they grow, its errors and the nodes asked
// for that are not connected.
func (c *cli) nimbusFlows(ctx context.Context, req *flowsv1.ObserveFlowsRequest, p *flowPrinter) error {
	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	stream, err := flowsv1.NewFlowsClient(sess.conn).ObserveFlows(ctx, req)
	if err != nil {
		return fmt.Errorf("observing the flows: %w", sess.rpcError(err))
	}
	nodes := map[string]*flowsv1.NodeFlows{}
	var notConnected []string
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if p.first {
				if err := p.print(nil); err != nil { // the header alone
					return err
				}
			}
			return nodesFailed(nodes)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("observing the flows: %w", sess.rpcError(err))
		}
		// The table's header goes with the first records, so that they are aligned:
		// nimbus's first response comes at once, before any.
		if len(resp.GetFlows()) > 0 {
			if err := p.print(resp.GetFlows()); err != nil {
				return err
			}
		}
		for _, n := range resp.GetNodes() {
			c.nodeFlowsChanged(nodes[n.GetNode()], n)
			nodes[n.GetNode()] = n
		}
		if nc := resp.GetNotConnected(); !slices.Equal(nc, notConnected) {
			if len(nc) > 0 {
				fmt.Fprintf(c.stderr, "naplesctl: no flows from %s: not connected to nimbus\n", strings.Join(nc, ", "))
			} else if len(notConnected) > 0 {
				fmt.Fprintln(c.stderr, "naplesctl: every node asked for is connected")
			}
			notConnected = nc
		}
	}
}

// nodesFailed returns an error naming the nodes whose part ended with an error (a
// filter their agent refused, a subscription over its limit), each told on standard
// error as it came; nil when none did. A node that is not connected is no failure.
func nodesFailed(nodes map[string]*flowsv1.NodeFlows) error {
	var failed []string
	for node, n := range nodes {
		if n.GetError() != "" {
			failed = append(failed, node)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	slices.Sort(failed)
	return fmt.Errorf("no flows from %s: %s", strings.Join(failed, ", "), nodes[failed[0]].GetError())
}

// nodeFlowsChanged says on standard error what changed of a node's losses and error
// since was (nil: nothing told yet).
func (c *cli) nodeFlowsChanged(was, now *flowsv1.NodeFlows) {
	node := now.GetNode()
	if d := now.GetLostDatapath(); d != was.GetLostDatapath() {
		fmt.Fprintf(c.stderr, "naplesctl: node %s: the firewall lost %d flow records in all: its ring (the agent's --fw-flow-ring-bytes) was full\n", node, d)
	}
	if s := now.GetSuppressed(); s != was.GetSuppressed() {
		fmt.Fprintf(c.stderr, "naplesctl: node %s: the firewall suppressed %d flow records in all: their endpoints wrote more than the agent's --fw-flow-endpoint-rate\n", node, s)
	}
	if a := now.GetLostAgent(); a != was.GetLostAgent() {
		fmt.Fprintf(c.stderr, "naplesctl: node %s: %d flow records were let go of by the agent before nimbus took them (its --flows-ring went round)\n", node, a)
	}
	if n := now.GetLostNimbus(); n != was.GetLostNimbus() {
		fmt.Fprintf(c.stderr, "naplesctl: node %s: %d flow records were dropped by nimbus because this command read them too slowly (nimbus --flow-observer-buffer)\n", node, n)
	}
	if e := now.GetError(); e != "" && e != was.GetError() {
		fmt.Fprintf(c.stderr, "naplesctl: node %s: %s\n", node, e)
	}
}

// flowPrinter prints flows as a table, whose lines it aligns per batch, or as JSON lines.
type flowPrinter struct {
	c      *cli
	output string
	tw     *tabwriter.Writer
	// header is the table's first line ("" for none), line a flow's line of it.
	header string
	line   func(*delphiv1.Flow) string
	// first is set until the first batch is printed.
	first bool
}

// newFlowPrinter returns a printer of the output format.
func (c *cli) newFlowPrinter(output string) *flowPrinter {
	return &flowPrinter{c: c, output: output, tw: tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0), first: true,
		header: flowHeader, line: flowLine}
}

// print prints a batch of flows, the table's header before the first: each batch's lines
// are aligned, and printed before the next is waited for.
func (p *flowPrinter) print(flows []*delphiv1.Flow) error {
	if p.output == outputTable && p.first && p.header != "" {
		fmt.Fprintln(p.tw, p.header)
	}
	p.first = false
	for _, f := range flows {
		if p.output == outputJSON {
			raw, err := manifest.MarshalRecord(f) // 64-bit integers as numbers
			if err != nil {
				return fmt.Errorf("encoding a flow: %w", err)
			}
			if err := writeDoc(p.c.stdout, outputJSON, raw, true); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintln(p.tw, p.line(f))
	}
	return p.tw.Flush()
}

// flowHeader is the header of the flows table.
// PACKETS and BYTES are a connection's, from its source and back ("12/10"), and a
// denied packet's length.
const flowHeader = "TIME\tNODE\tVERDICT\tEVENT\tREASON\tDIR\tENDPOINT\tPEER\tPROTO\tSOURCE\tDESTINATION\tRULE\tPACKETS\tBYTES"

// flowLine is one flow as a line of the table.
func flowLine(f *delphiv1.Flow) string {
	name := func(k *nimbusv1.ObjectKey) string {
		if k == nil {
			return "-"
		}
		return strings.Trim(k.GetTenant()+"/"+k.GetNamespace()+"/"+k.GetName(), "/")
	}
	rule := "-"
	if f.GetRuleName() != "" {
		rule = f.GetRuleName()
	} else if f.GetRule() != 0 {
		rule = strconv.FormatUint(f.GetRule(), 10)
	}
	packets, bytes := "1", strconv.FormatUint(uint64(f.GetBytes()), 10)
	if f.GetEvent() != delphiv1.FlowEvent_FLOW_EVENT_DENIED {
		packets = fmt.Sprintf("%d/%d", f.GetInitiatorPackets(), f.GetResponderPackets())
		bytes = fmt.Sprintf("%d/%d", f.GetInitiatorBytes(), f.GetResponderBytes())
	}
	return strings.Join([]string{
		f.GetTime().AsTime().Local().Format("15:04:05.000000"), f.GetNode(), f.GetVerdict(), flowEvent(f.GetEvent()),
		orDash(f.GetReason()), f.GetDirection(), name(f.GetEndpoint()), name(f.GetPeerEndpoint()), orDash(f.GetProtocol()),
		hostPort(f.GetSource(), f.GetSourcePort()), hostPort(f.GetDestination(), f.GetDestinationPort()), rule,
		packets, bytes,
	}, "\t")
}

// flowEvent names a flow event: "started", "denied", "ended".
func flowEvent(e delphiv1.FlowEvent) string {
	return strings.ToLower(strings.TrimPrefix(e.String(), "FLOW_EVENT_"))
}

// hostPort writes an address and port, "-" for none.
func hostPort(addr string, port uint32) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return "-"
	}
	if port == 0 {
		return a.String()
	}
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// checkFlowFilter refuses, as a usage error naming the flag, a --from, --to, --verdict or
// --policy that neither the agent nor nimbus would take, before asking either: a bad
// filter is the same mistake whichever answers.
func checkFlowFilter(req *delphiv1.FlowsRequest) error {
	for _, f := range []struct{ flag, v string }{{"from", req.GetFrom()}, {"to", req.GetTo()}} {
		if f.v == "" {
			continue
		}
		if _, _, err := delphiv1.ParseFlowPeer(f.v); err != nil {
			return exitstatus.Mark(fmt.Errorf("--%s %q: %w", f.flag, f.v, err))
		}
	}
	switch req.GetVerdict() {
	case "", "allowed", "denied":
	default:
		return exitstatus.Mark(fmt.Errorf("--verdict %q: want allowed or denied", req.GetVerdict()))
	}
	if p := req.GetPolicy(); p != "" {
		if _, err := delphiv1.ParseFlowPolicy(p); err != nil {
			return exitstatus.Mark(fmt.Errorf("--policy %q: %w", p, err))
		}
	}
	return nil
}
