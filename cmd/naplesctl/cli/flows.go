package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/naplesnet/naples/internal/exitstatus"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// flowsCommand returns the flows command.
func (c *cli) flowsCommand() *cobra.Command {
	output := outputTable
	var follow bool
	var since time.Duration
	req := &delphiv1.FlowsRequest{}
	cmd := &cobra.Command{
		Use:   "flows",
		Short: "Show the flows the firewall of this host saw: connections allowed, packets denied",
		Long: `Show the flows the firewall of this host saw: each connection it allowed (with the
rule that allowed it), each packet it dropped (with the reason and the rule), each
connection still active every active timeout, and each connection's end (fin, rst or
idle), with the connection's packets and bytes from its source and back.

The flows command talks to the agent's local API on the unix socket named by --agent. The
agent keeps the latest records (its --flows-ring); -f prints them, then every new one
until interrupted. Filters: --from and --to take an endpoint's name (name,
namespace/name or tenant/namespace/name; this host's or a peer's) or an address,
--verdict allowed or denied, --policy a NetworkSecurityPolicy's name, --since a duration.

Records are never lost silently: when the firewall's ring was full, or the agent let go
of records before this command read them, a line on standard error says how many.
-o json prints one record per line, as the agent sends it.`,
		Example: `  naplesctl --agent /run/naples/agent.sock flows
  naplesctl flows -f --verdict denied
  naplesctl flows --from web-1 --to 10.1.0.7 --since 5m -o json`,
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
			return c.flows(cmd.Context(), req, output)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print new flows as they come, until interrupted")
	cmd.Flags().StringVar(&req.From, "from", "", "only flows from this endpoint, local or peer (name, namespace/name, tenant/namespace/name), or address")
	cmd.Flags().StringVar(&req.To, "to", "", "only flows to this endpoint or address")
	cmd.Flags().StringVar(&req.Verdict, "verdict", "", "only flows with this verdict: allowed or denied")
	cmd.Flags().StringVar(&req.Policy, "policy", "", "only flows a rule of this NetworkSecurityPolicy decided")
	cmd.Flags().DurationVar(&since, "since", 0, "only flows of this long ago or later, e.g. 5m")
	cmd.Flags().Uint32Var(&req.Limit, "last", 0, "only the latest N of the recent flows (0: all the agent keeps)")
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: table or json")
	return cmd
}

// flows prints the flows the agent sends for the request.
func (c *cli) flows(ctx context.Context, req *delphiv1.FlowsRequest, output string) error {
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
	first := true
	// Each response's lines are aligned, and printed before the next is waited for.
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
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
		if output == outputTable && first {
			fmt.Fprintln(tw, flowHeader)
		}
		for _, f := range resp.GetFlows() {
			if output == outputJSON {
				raw, err := protojson.Marshal(f)
				if err != nil {
					return fmt.Errorf("encoding a flow: %w", err)
				}
				if err := writeDoc(c.stdout, outputJSON, raw, true); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintln(tw, flowLine(f))
		}
		if err := tw.Flush(); err != nil {
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
		first = false
	}
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
