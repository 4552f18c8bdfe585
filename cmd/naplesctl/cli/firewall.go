package cli

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/naplesnet/naples/internal/manifest"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// maxFirewallBytes bounds the agent's answer to Firewall that naplesctl accepts: a full
// conntrack table of 262144 connections takes about 50 MiB.
const maxFirewallBytes = 256 << 20

// bpfCommand returns the bpf command and its subcommands.
func (c *cli) bpfCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bpf",
		Short: "Show what the eBPF firewall's maps hold on this host",
		Long: `Show what the eBPF firewall's maps hold on this host: its snapshot of endpoints,
identities and policy entries, its counters and its tracked connections.

The bpf commands talk to the agent's local API on the unix socket named by --agent. The
agent reads the maps it pinned in its --bpf-dir, read-only, and names the ids it finds
there by the snapshot its firewall installed last; an id that snapshot does not know is
shown raw. Each command starts with the snapshot in place: its generation, its size,
and whether it is what the firewall installed. -o json and -o yaml print the agent's
answer whole.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(c.bpfPolicyCommand(), c.bpfIdentitiesCommand(), c.bpfConntrackCommand())
	return cmd
}

// bpfPolicyCommand returns the bpf policy command.
func (c *cli) bpfPolicyCommand() *cobra.Command {
	output := outputTree
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Show the firewall's endpoints, policy entries and rule counters",
		Long: `Show the firewall's endpoints, policy entries and rule counters.

The table of endpoints lists each filtered interface: the endpoint on it, its endpoint
id, its subject (the set of policies protecting it, "none" when none does), which
directions are protected (an unprotected one is open) and the packets and bytes the
firewall let through and dropped, and, for an endpoint whose sources are checked (one
with a MAC), the frames it sent from a MAC or IP address not its own, which were
dropped, and the addresses it may send from ("unchecked" for an endpoint without a
MAC). Then each subject lists its policies with their rules
and the rules' counters (the packets of the connections each rule decided, in their
original direction, and those a deny rule dropped), and its policy entries: direction,
protocol class, peer identity and its labels ("any" for every peer), destination ports,
verdict and the rule that decides. The longest entry that matches a packet decides;
a protected direction denies what no entry allows.`,
		Example: `  naplesctl bpf policy
  naplesctl bpf policy -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, outputTree, outputJSON, outputYAML); err != nil {
				return err
			}
			return c.bpf(cmd.Context(), delphiv1.FirewallView_FIREWALL_VIEW_POLICY, output, outputTree, writeFirewallPolicy)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: tree, json or yaml")
	return cmd
}

// bpfIdentitiesCommand returns the bpf identities command.
func (c *cli) bpfIdentitiesCommand() *cobra.Command {
	output := outputTable
	cmd := &cobra.Command{
		Use:   "identities",
		Short: "Show the firewall's peer identities, per tenant",
		Long: `Show the firewall's peer identities, per tenant.

A peer's identity is the set of labels of the prefixes holding its address in the
tenant's scope: "group:<SecurityGroup key>" for the endpoints that list the group and
the group's CIDRs, "cidr:<prefix>" for a rule's CIDR. Each row is one identity: its id,
its labels and the prefixes that map to it. An address no prefix holds is of the world
identity, 0.`,
		Example: `  naplesctl bpf identities
  naplesctl bpf identities -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, outputTable, outputJSON, outputYAML); err != nil {
				return err
			}
			return c.bpf(cmd.Context(), delphiv1.FirewallView_FIREWALL_VIEW_IDENTITIES, output, outputTable, writeFirewallIdentities)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: table, json or yaml")
	return cmd
}

// bpfConntrackCommand returns the bpf ct command.
func (c *cli) bpfConntrackCommand() *cobra.Command {
	output := outputTable
	cmd := &cobra.Command{
		Use:     "ct",
		Aliases: []string{"conntrack"},
		Short:   "Show the firewall's tracked connections and the program's counters",
		Long: `Show the firewall's tracked connections and the program's counters.

Each row is a live connection: the interface it was seen on and its endpoint, the
protocol and the tuple of its first packet there (an ICMP echo shows its id), the
direction of that packet (ingress: to the endpoint, egress: from it), how long it has
been idle and how long before it expires, its flags (replied: a reply was seen,
closing: a TCP FIN or RST was), the snapshot generation it was last checked against
("old" when that is not the snapshot's: its next packet is checked again) and the rule
that allowed it ("none" for an open direction). Above the table are the program's
counters: the connections it started tracking, those it cut off because a new snapshot
denied them, the packets it dropped because no snapshot held their interface, and the
frames it dropped because an endpoint sent them from an address not its own; then the
later fragments of datagrams it dropped because their first fragment was not seen on
their interface within 3 seconds (or its entry was evicted from the table of fragments,
whose size follows), and the packets it dropped for hostile headers (an IPv6
extension-header chain over its bounds, a first fragment too short for its L4 header, a
later fragment overlapping it).`,
		Example: `  naplesctl bpf ct
  naplesctl bpf ct -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, outputTable, outputJSON, outputYAML); err != nil {
				return err
			}
			return c.bpf(cmd.Context(), delphiv1.FirewallView_FIREWALL_VIEW_CONNTRACK, output, outputTable, writeFirewallConntrack)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: table, json or yaml")
	return cmd
}

// bpf asks the agent for a view of the firewall and prints it: with write when output
// is text, the readable form, else the answer whole as JSON or YAML.
func (c *cli) bpf(ctx context.Context, view delphiv1.FirewallView, output, text string,
	write func(w, notes io.Writer, resp *delphiv1.FirewallResponse) error,
) error {
	sess, err := c.connectAgent()
	if err != nil {
		return err
	}
	defer sess.Close()
	resp, err := sess.delphi.Firewall(ctx, &delphiv1.FirewallRequest{View: view}, grpc.MaxCallRecvMsgSize(maxFirewallBytes))
	if err != nil {
		return fmt.Errorf("reading the firewall: %w", sess.rpcError(err))
	}
	if output != text {
		raw, err := manifest.MarshalMessage(resp) // 64-bit integers as numbers
		if err != nil {
			return fmt.Errorf("encoding the firewall: %w", err)
		}
		return writeDoc(c.stdout, output, raw, false)
	}
	return write(c.stdout, c.stderr, resp)
}

// writeFirewallHeader writes what every view starts with: the node and directory, the
// snapshot in place and the problems of delphi's objects.
func writeFirewallHeader(b *strings.Builder, resp *delphiv1.FirewallResponse) {
	fmt.Fprintf(b, "node %s, bpf dir %s\n", resp.GetNode(), resp.GetBpfDir())
	b.WriteString("snapshot: " + snapshotText(resp.GetSnapshot()) + "\n")
	for _, p := range resp.GetProblems() {
		b.WriteString("problem: " + oneLine(p) + "\n")
	}
}

// snapshotText describes the snapshot in place: "generation 0x1a2b3c4d, 57 entries of
// 65536, as the firewall installed it", or how it differs from what the firewall installed.
func snapshotText(s *delphiv1.FirewallSnapshot) string {
	if !s.GetPresent() {
		return fmt.Sprintf("NONE: every packet of a filtered interface is dropped (the firewall installed generation %#x)",
			s.GetCompiledGeneration())
	}
	text := fmt.Sprintf("generation %s, %d %s of %d", genText(s.GetGeneration()), s.GetEntries(),
		plural(int(s.GetEntries()), "entry", "entries"), s.GetCapacity())
	if s.GetCurrent() {
		return text + ", as the firewall installed it"
	}
	var diffs []string
	if n := s.GetStaleEntries(); n > 0 {
		diffs = append(diffs, fmt.Sprintf("%d %s the firewall did not install", n, plural(int(n), "entry", "entries")))
	}
	if n := s.GetMissingEntries(); n > 0 {
		diffs = append(diffs, fmt.Sprintf("%d installed %s missing", n, plural(int(n), "entry", "entries")))
	}
	return fmt.Sprintf("%s; NOT CURRENT: %s (the firewall installed generation %#x)", text, strings.Join(diffs, ", "), s.GetCompiledGeneration())
}

// genText writes a generation in hex, "none" for 0.
func genText(gen uint32) string {
	if gen == 0 {
		return "none"
	}
	return fmt.Sprintf("%#x", gen)
}

// writeFirewallPolicy writes the policy view as a tree: the header, the table of
// endpoints, then each subject with its policies, their rules and its policy entries.
func writeFirewallPolicy(w, notes io.Writer, resp *delphiv1.FirewallResponse) error {
	var b strings.Builder
	writeFirewallHeader(&b, resp)
	if len(resp.GetEndpoints()) == 0 {
		fmt.Fprintln(notes, "No endpoints found.")
	} else {
		b.WriteString("\n")
		tw := newTable(&b, 3)
		fmt.Fprintln(tw, "ENDPOINT\tINTERFACE\tID\tSUBJECT\tINGRESS\tEGRESS\tALLOWED\tDENIED\tSPOOFED\tSOURCES")
		for _, e := range resp.GetEndpoints() {
			allowed, denied, spoofed, sources := "-", "-", "-", "unchecked"
			if c := e.GetCounters(); c != nil {
				allowed = countText(c.GetAllowedPackets(), c.GetAllowedBytes())
				denied = countText(c.GetDeniedPackets(), c.GetDeniedBytes())
				if e.GetGuarded() {
					spoofed = countText(c.GetSpoofedPackets(), c.GetSpoofedBytes())
				}
			}
			if e.GetGuarded() {
				sources = strings.Join(e.GetSources(), " ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%#x\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", keyText(e.GetKey()), interfaceText(e.GetInterface(), e.GetIfindex()),
				e.GetId(), idText(e.GetSubject()), protectedText(e.GetIngressProtected()), protectedText(e.GetEgressProtected()),
				allowed, denied, spoofed, sources)
		}
		tw.Flush()
	}

	rulesOf := map[string][]*delphiv1.FirewallRule{}
	var unknownRules []*delphiv1.FirewallRule
	for _, r := range resp.GetRules() {
		if r.GetPolicy() == nil {
			unknownRules = append(unknownRules, r)
			continue
		}
		id := r.GetPolicy().ID()
		rulesOf[id] = append(rulesOf[id], r)
	}
	for _, s := range resp.GetSubjects() {
		fmt.Fprintf(&b, "\nsubject %#x", s.GetId())
		if s.GetTenant() != "" {
			fmt.Fprintf(&b, ", tenant %s", s.GetTenant())
		}
		if len(s.GetPolicies()) == 0 {
			b.WriteString(": not known to the firewall's snapshot")
		}
		b.WriteString("\n")
		for _, p := range s.GetPolicies() {
			fmt.Fprintf(&b, "  policy %s/%s/%s\n", p.GetTenant(), p.GetNamespace(), p.GetName())
			for _, r := range rulesOf[p.ID()] {
				fmt.Fprintf(&b, "    %s[%d]: %s: %s\n", r.GetDirection(), r.GetIndex(), ruleText(r), ruleCountText(r))
			}
		}
		if len(s.GetEntries()) == 0 {
			b.WriteString("  no policy entries\n")
			continue
		}
		tw := newTable(&b, 3)
		fmt.Fprintln(tw, "  DIRECTION\tCLASS\tPEER\tPORTS\tVERDICT\tRULE")
		for _, e := range s.GetEntries() {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", e.GetDirection(), e.GetClass(), peerText(e), e.GetPorts(),
				e.GetVerdict(), ruleRef(e.GetRule(), e.GetRuleName()))
		}
		tw.Flush()
	}
	if len(unknownRules) > 0 {
		b.WriteString("\nrule counters the firewall's snapshot does not know:\n")
		for _, r := range unknownRules {
			fmt.Fprintf(&b, "  rule %#x: %s\n", r.GetId(), ruleCountText(r))
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("writing the firewall's policy: %w", err)
	}
	return nil
}

// keyText names an object as "tenant/namespace/name", "unknown" for nil.
func keyText(k *nimbusv1.ObjectKey) string {
	if k == nil {
		return "unknown"
	}
	return k.GetTenant() + "/" + k.GetNamespace() + "/" + k.GetName()
}

// interfaceText names an interface: "veth-web (7)", "ifindex 7" when it has no name.
func interfaceText(name string, ifindex uint32) string {
	if name == "" {
		return fmt.Sprintf("ifindex %d", ifindex)
	}
	return fmt.Sprintf("%s (%d)", name, ifindex)
}

// idText writes an id in hex, "none" for 0.
func idText(id uint32) string {
	if id == 0 {
		return "none"
	}
	return fmt.Sprintf("%#x", id)
}

// protectedText says whether a direction is protected.
func protectedText(protected bool) string {
	if protected {
		return "protected"
	}
	return "open"
}

// countText writes packets and bytes: "12 pkts 1180 B".
func countText(packets, bytes uint64) string {
	return fmt.Sprintf("%d %s %d B", packets, plural(int(packets), "pkt", "pkts"), bytes)
}

// ruleCountText writes a rule's counter: "3 packets, 126 bytes", "no counter".
func ruleCountText(r *delphiv1.FirewallRule) string {
	if !r.GetCounted() {
		return "no counter"
	}
	return fmt.Sprintf("%d %s, %d %s", r.GetPackets(), plural(int(r.GetPackets()), "packet", "packets"),
		r.GetBytes(), plural(int(r.GetBytes()), "byte", "bytes"))
}

// ruleText writes a rule as written: "allow tcp 80,8000-8080 from group:..., cidr:...".
func ruleText(r *delphiv1.FirewallRule) string {
	proto := r.GetProtocol()
	if proto == "" {
		proto = "any protocol"
	}
	ports := "all ports"
	if len(r.GetPorts()) > 0 {
		ports = strings.Join(r.GetPorts(), ",")
	}
	if proto != "tcp" && proto != "udp" && len(r.GetPorts()) == 0 {
		ports = ""
	}
	side := "from"
	if r.GetDirection() == "egress" {
		side = "to"
	}
	peers := "any peer"
	if len(r.GetPeers()) > 0 {
		peers = strings.Join(r.GetPeers(), ", ")
	}
	return strings.Join(strings.Fields(strings.Join([]string{r.GetAction(), proto, ports, side, peers}, " ")), " ")
}

// peerText describes the peer of a policy entry: "any", "0x33 group:..., cidr:...", or
// the raw identity.
func peerText(e *delphiv1.FirewallPolicyEntry) string {
	if e.GetAnyPeer() {
		return "any"
	}
	s := fmt.Sprintf("%#x", e.GetIdentity())
	if len(e.GetLabels()) > 0 {
		s += " " + strings.Join(e.GetLabels(), ", ")
	}
	return s
}

// ruleRef names a deciding rule: its name, its raw id when unknown, "none" for 0.
func ruleRef(id uint64, name string) string {
	switch {
	case id == 0:
		return "none"
	case name == "":
		return fmt.Sprintf("%#x", id)
	}
	return name
}

// writeFirewallIdentities writes the identities view: the header, then a table of
// identities per tenant scope.
func writeFirewallIdentities(w, notes io.Writer, resp *delphiv1.FirewallResponse) error {
	var b strings.Builder
	writeFirewallHeader(&b, resp)
	if len(resp.GetScopes()) == 0 {
		fmt.Fprintln(notes, "No identities found.")
	}
	for _, s := range resp.GetScopes() {
		tenant := s.GetTenant()
		if tenant == "" {
			tenant = "unknown"
		}
		fmt.Fprintf(&b, "\ntenant %s, scope %#x\n", tenant, s.GetScope())
		tw := newTable(&b, 3)
		fmt.Fprintln(tw, "  IDENTITY\tLABELS\tPREFIXES")
		for _, id := range s.GetIdentities() {
			labels := "unknown"
			if len(id.GetLabels()) > 0 {
				labels = strings.Join(id.GetLabels(), ", ")
			}
			fmt.Fprintf(tw, "  %#x\t%s\t%s\n", id.GetId(), labels, strings.Join(id.GetPrefixes(), " "))
		}
		tw.Flush()
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("writing the firewall's identities: %w", err)
	}
	return nil
}

// writeFirewallConntrack writes the conntrack view: the header, the program's counters,
// then a table of the connections.
func writeFirewallConntrack(w, notes io.Writer, resp *delphiv1.FirewallResponse) error {
	var b strings.Builder
	writeFirewallHeader(&b, resp)
	st := resp.GetStats()
	fmt.Fprintf(&b, "conntrack: %d live %s of %d\n", st.GetConntrackEntries(),
		plural(int(st.GetConntrackEntries()), "connection", "connections"), st.GetConntrackCapacity())
	fmt.Fprintf(&b, "program: %d %s tracked, %d cut off by a new snapshot, %d %s dropped for want of a snapshot, %d spoofed %s dropped\n",
		st.GetConntrackCreated(), plural(int(st.GetConntrackCreated()), "connection", "connections"), st.GetConntrackDenied(),
		st.GetNoSnapshotDrops(), plural(int(st.GetNoSnapshotDrops()), "packet", "packets"),
		st.GetSpoofedDrops(), plural(int(st.GetSpoofedDrops()), "frame", "frames"))
	fmt.Fprintf(&b, "fragments: %d later %s dropped for want of their first (tracked %d at once), %d %s dropped for hostile headers\n",
		st.GetFragmentUntrackedDrops(), plural(int(st.GetFragmentUntrackedDrops()), "fragment", "fragments"), st.GetFragmentCapacity(),
		st.GetBadHeaderDrops(), plural(int(st.GetBadHeaderDrops()), "packet", "packets"))
	if len(resp.GetConnections()) == 0 {
		fmt.Fprintln(notes, "No connections found.")
	} else {
		b.WriteString("\n")
		gen := resp.GetSnapshot().GetGeneration()
		tw := newTable(&b, 3)
		fmt.Fprintln(tw, "INTERFACE\tENDPOINT\tPROTO\tSOURCE\tDESTINATION\tDIRECTION\tIDLE\tEXPIRES\tFLAGS\tGENERATION\tRULE")
		for _, c := range resp.GetConnections() {
			g := genText(c.GetGeneration())
			if c.GetGeneration() != gen {
				g += " (old)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", interfaceText(c.GetInterface(), c.GetIfindex()),
				keyText(c.GetEndpoint()), c.GetProtocolName(), tupleText(c, c.GetSource(), c.GetSourcePort()),
				tupleText(c, c.GetDestination(), c.GetDestinationPort()), c.GetDirection(),
				durationText(c.GetIdle().AsDuration()), durationText(c.GetExpiresIn().AsDuration()), flagsText(c), g,
				ruleRef(c.GetRule(), c.GetRuleName()))
		}
		tw.Flush()
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("writing the firewall's connections: %w", err)
	}
	return nil
}

// tupleText writes one end of a connection: "10.1.0.2:40000", "[fd00::2]:80" for TCP
// and UDP, "10.1.0.2 id 7" for the end of an ICMP echo that holds its id, the address
// alone otherwise.
func tupleText(c *delphiv1.FirewallConnection, addr string, port uint32) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return orDash(addr)
	}
	switch c.GetProtocolName() {
	case "tcp", "udp":
		return netip.AddrPortFrom(a, uint16(port)).String()
	}
	if port != 0 {
		return fmt.Sprintf("%s id %d", a, port)
	}
	return a.String()
}

// durationText writes a duration rounded to the second, or to the millisecond below one
// second.
func durationText(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// flagsText writes a connection's flags: "replied", "replied,closing", "-".
func flagsText(c *delphiv1.FirewallConnection) string {
	var flags []string
	if c.GetReplied() {
		flags = append(flags, "replied")
	}
	if c.GetClosing() {
		flags = append(flags, "closing")
	}
	if len(flags) == 0 {
		return "-"
	}
	return strings.Join(flags, ",")
}
