package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/naplesnet/naples/internal/exitstatus"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
)

// monitorTypes are the kinds of events monitor streams.
var monitorTypes = []string{"drop"}

// monitorCommand is naplesctl monitor: every packet the host's firewall drops, as it
// drops it.
func (c *cli) monitorCommand() *cobra.Command {
	typ := "drop"
	output := outputTable
	var since time.Duration
	var nodes []string
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "Stream every packet the nodes' firewalls drop, with the reason, endpoint and rule",
		Long: `Stream every packet the nodes' firewalls drop, as they drop it: the node, the reason
(policy, spoofed, malformed, fragment, vlan), the local endpoint and the direction, the
packet's tuple and length, and the rule that denied it. Ends when interrupted.

With --agent (given on the command line or as $` + AgentEnv + `) the monitor command talks to
that host's agent's local API; without, it asks nimbus, which relays the drops of every
node's agent, or of the nodes named by --node, through any replica, as naplesctl flows
does. The drops are the firewalls' denied flow records (naplesctl flows --verdict denied): each
local endpoint has a budget of records (the agent's --fw-flow-endpoint-rate), and records
the firewall suppressed past it or lost because its ring was full are counted, never
silently, on standard error as the counts grow. --since prints the recent drops of that
long ago first. -o json prints one record per line.`,
		Example: `  naplesctl --agent /run/naples/agent.sock monitor --type drop
  naplesctl --agent /run/naples/agent.sock monitor --since 5m -o json
  naplesctl monitor --node host-a --node host-b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if typ != "drop" {
				return exitstatus.Mark(fmt.Errorf("--type %q: want %s", typ, strings.Join(monitorTypes, " or ")))
			}
			if err := checkOutput(output, outputTable, outputJSON); err != nil {
				return err
			}
			if since < 0 {
				return exitstatus.Mark(fmt.Errorf("--since %v: want a duration of zero or more", since))
			}
			req := &delphiv1.FlowsRequest{Follow: true, Verdict: "denied", Since: durationpb.New(since)}
			p := c.newFlowPrinter(output)
			p.header, p.line = "", dropLine
			return c.streamFlows(cmd, req, nodes, p, "drops")
		},
	}
	cmd.Flags().StringVar(&typ, "type", typ, "the events to stream: "+strings.Join(monitorTypes, ", "))
	cmd.Flags().DurationVar(&since, "since", 0, "print the drops of this long ago first, e.g. 5m (default: from now)")
	cmd.Flags().StringArrayVar(&nodes, "node", nil, "through nimbus, only the drops of this node (repeat for more; default every node)")
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: table or json")
	return cmd
}

// dropLine is one dropped packet as a line: when, where, why, what.
func dropLine(f *delphiv1.Flow) string {
	ep := "-"
	if k := f.GetEndpoint(); k != nil {
		ep = strings.Trim(k.GetTenant()+"/"+k.GetNamespace()+"/"+k.GetName(), "/")
	}
	what := "-"
	if f.GetProtocol() != "" {
		what = fmt.Sprintf("%s %s > %s", f.GetProtocol(), hostPort(f.GetSource(), f.GetSourcePort()), hostPort(f.GetDestination(), f.GetDestinationPort()))
	}
	rule := "-"
	if f.GetRuleName() != "" {
		rule = f.GetRuleName()
	} else if f.GetRule() != 0 {
		rule = fmt.Sprint(f.GetRule())
	}
	return fmt.Sprintf("%s\t%s\tdrop %s\t%s %s\t%s\trule %s\t%d bytes",
		f.GetTime().AsTime().Local().Format("15:04:05.000000"), f.GetNode(), orDash(f.GetReason()), f.GetDirection(), ep, what, rule, f.GetBytes())
}
