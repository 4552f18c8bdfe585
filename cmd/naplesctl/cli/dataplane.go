package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/naplesnet/naples/internal/manifest"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// outputTree is the default value of dataplane's --output flag: the readable tree.
const outputTree = "tree"

// maxDataplaneBytes bounds the agent's answer to Dataplane that naplesctl accepts: about
// 170 bytes an endpoint, far more than gRPC's default 4 MiB allows on a host whose
// networks hold tens of thousands of endpoints.
const maxDataplaneBytes = 256 << 20

// dataplaneCommand returns the dataplane command.
func (c *cli) dataplaneCommand() *cobra.Command {
	output := outputTree
	cmd := &cobra.Command{
		Use:   "dataplane",
		Short: "Show the overlay dataplane of this host: what delphi wants and what the kernel has",
		Long: `Show the overlay dataplane of this host: for every network the agent holds in
delphi, what the network wants, this node's status of it, and what the kernel of the
namespace the agent programs has of it.

Each network lists its subnets, its bridge and VXLAN device, its remote VTEPs (the
head-end replication entries of the VXLAN device that flood broadcast traffic to the
other nodes with endpoints in the network) and its endpoints with their status: an
endpoint on this node with its interface, which must be a port of the bridge, an
endpoint on another node with its forwarding entry (its MAC to its node's VTEP) and
its neighbour entries (each IP to its MAC). Every kernel object reads "ok", "MISSING",
or "WRONG:" followed by how it differs from what naples wants; "NOT WANTED" marks a
remote VTEP no endpoint needs.

Like the delphi commands, dataplane talks to the agent's local API on the unix socket
named by --agent. -o json and -o yaml print the agent's answer whole.`,
		Example: `  naplesctl dataplane
  naplesctl dataplane -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, outputTree, outputJSON, outputYAML); err != nil {
				return err
			}
			return c.dataplane(cmd.Context(), output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: tree, json or yaml")
	return cmd
}

// dataplane prints the agent's dataplane view.
func (c *cli) dataplane(ctx context.Context, output string) error {
	sess, err := c.connectAgent()
	if err != nil {
		return err
	}
	defer sess.Close()
	resp, err := sess.delphi.Dataplane(ctx, &delphiv1.DataplaneRequest{}, grpc.MaxCallRecvMsgSize(maxDataplaneBytes))
	if err != nil {
		return fmt.Errorf("reading the dataplane: %w", sess.rpcError(err))
	}
	if output != outputTree {
		raw, err := manifest.MarshalMessage(resp) // 64-bit integers as numbers
		if err != nil {
			return fmt.Errorf("encoding the dataplane: %w", err)
		}
		return writeDoc(c.stdout, output, raw, false)
	}
	if len(resp.GetNetworks()) == 0 {
		fmt.Fprintln(c.stderr, "No networks found.")
	}
	return writeDataplane(c.stdout, resp)
}

// writeDataplane writes the dataplane to w as a tree: the node, then each network with
// its subnets, devices, remote VTEPs and endpoints, one kernel object a line.
func writeDataplane(w io.Writer, resp *delphiv1.DataplaneResponse) error {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s, vtep %s\n", resp.GetNode(), orNone(resp.GetVtep()))
	for _, n := range resp.GetNetworks() {
		k := n.GetKey()
		mtu := ""
		if n.GetMtu() != 0 {
			mtu = fmt.Sprintf(", mtu %d", n.GetMtu())
		}
		fmt.Fprintf(&b, "\nnetwork %s/%s/%s: vni %d%s, %s\n", k.GetTenant(), k.GetNamespace(), k.GetName(),
			n.GetVni(), mtu, statusText(n.GetStatus(), n.GetGeneration()))
		for _, s := range n.GetSubnets() {
			fmt.Fprintf(&b, "  subnet %s, gateway %s\n", s.GetCidr(), orNone(s.GetGateway()))
		}
		br, vx := n.GetBridge(), n.GetVxlan()
		fmt.Fprintf(&b, "  bridge %s: %s\n", br.GetName(), linkText(br,
			fmt.Sprintf("mac %s", br.GetMac()), "addresses "+orNone(strings.Join(br.GetAddresses(), " "))))
		fmt.Fprintf(&b, "  vxlan %s: %s\n", vx.GetName(), linkText(vx,
			fmt.Sprintf("vni %d", vx.GetVni()), "local "+orNone(vx.GetLocal()), fmt.Sprintf("dstport %d", vx.GetDstPort()),
			"master "+orNone(vx.GetMaster())))
		for _, t := range n.GetRemoteVteps() {
			nodes := ""
			if len(t.GetNodes()) > 0 {
				nodes = " (" + strings.Join(t.GetNodes(), ", ") + ")"
			}
			fmt.Fprintf(&b, "  remote vtep %s%s: %s\n", t.GetAddress(), nodes, vtepText(t))
		}
		for _, e := range n.GetEndpoints() {
			writeEndpoint(&b, e)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("writing the dataplane: %w", err)
	}
	return nil
}

// writeEndpoint writes one endpoint and its kernel objects.
func writeEndpoint(b *strings.Builder, e *delphiv1.DataplaneEndpoint) {
	st := statusText(e.GetStatus(), e.GetGeneration())
	if e.GetLocal() {
		fmt.Fprintf(b, "  endpoint %s on %s (local): %s\n", e.GetKey().GetName(), e.GetNode(), st)
		if l := e.GetLink(); l != nil {
			fmt.Fprintf(b, "    interface %s: %s\n", l.GetName(), linkText(l, "master "+orNone(l.GetMaster())))
		} else {
			b.WriteString("    no interface\n")
		}
		return
	}
	fmt.Fprintf(b, "  endpoint %s on %s (vtep %s): %s\n", e.GetKey().GetName(), orNone(e.GetNode()), orNone(e.GetVtep()), st)
	if f := e.GetFdb(); f != nil {
		fmt.Fprintf(b, "    fdb %s dst %s: %s\n", f.GetMac(), orNone(e.GetVtep()), fdbText(f, e.GetVtep()))
	} else {
		fmt.Fprintf(b, "    fdb: no valid mac (%q)\n", e.GetMac())
	}
	for _, n := range e.GetNeighbors() {
		fmt.Fprintf(b, "    neighbour %s lladdr %s: %s\n", n.GetIp(), orNone(e.GetFdb().GetMac()), neighborText(n, e.GetFdb().GetMac()))
	}
}

// statusText describes a node status of an object at generation gen: "PROGRAMMED",
// "PENDING WaitingForNode: waiting for Node ...", "no status yet".
func statusText(st *nimbusv1.NodeStatus, gen int64) string {
	if st == nil {
		return "no status yet"
	}
	s := phaseName(st.GetPhase())
	if st.GetObservedGeneration() != gen {
		s += fmt.Sprintf(" at generation %d of %d", st.GetObservedGeneration(), gen)
	}
	if r := st.GetReason(); r != "" {
		s += " " + r
	}
	if m := oneLine(st.GetMessage()); m != "" {
		s += ": " + m
	}
	return s
}

// verdict sums up problems: "ok" without any, "MISSING" when the object is missing,
// "WRONG: " and the problems otherwise.
func verdict(problems []string) string {
	switch {
	case len(problems) == 0:
		return "ok"
	case len(problems) == 1 && problems[0] == "missing":
		return "MISSING"
	}
	return "WRONG: " + strings.Join(problems, ", ")
}

// linkText describes a link: its verdict, then, when present, whether it is up (unless
// the verdict says it is down), its MTU and facts.
func linkText(l *delphiv1.DataplaneLink, facts ...string) string {
	s := verdict(l.GetProblems())
	if !l.GetPresent() {
		return s
	}
	var all []string
	switch {
	case l.GetUp():
		all = append(all, "up")
	case !slices.Contains(l.GetProblems(), "down"):
		all = append(all, "down")
	}
	all = append(all, fmt.Sprintf("mtu %d", l.GetMtu()))
	return s + "; " + strings.Join(append(all, facts...), ", ")
}

// vtepText describes a head-end replication entry.
func vtepText(t *delphiv1.DataplaneVtep) string {
	switch {
	case t.GetWanted() && t.GetPresent():
		return "ok"
	case t.GetWanted():
		return "MISSING"
	}
	return "NOT WANTED"
}

// fdbText describes the forwarding entries of a remote endpoint's MAC, which should go to
// vtep (empty: unknown).
func fdbText(f *delphiv1.DataplaneFdb, vtep string) string {
	var problems []string
	other := slices.DeleteFunc(slices.Clone(f.GetDsts()), func(d string) bool { return d == vtep })
	switch {
	case !f.GetPresent() && len(other) == 0 && !f.GetBridgePresent():
		return "MISSING"
	case !f.GetPresent() && len(other) == 0:
		problems = append(problems, "no entry on the vxlan device")
	case !f.GetPresent():
		problems = append(problems, "dst "+strings.Join(other, " ")+" (want "+orNone(vtep)+")")
	case len(other) > 0:
		problems = append(problems, "also dst "+strings.Join(other, " "))
	}
	if !f.GetBridgePresent() {
		problems = append(problems, "no static entry on the bridge")
	}
	return verdict(problems)
}

// neighborText describes the neighbour entry of a remote endpoint's IP, which should be
// a permanent one for mac.
func neighborText(n *delphiv1.DataplaneNeighbor, mac string) string {
	switch {
	case n.GetPresent():
		return "ok"
	case n.GetMac() == "" && n.GetState() == "":
		return "MISSING"
	case n.GetMac() != mac:
		return fmt.Sprintf("WRONG: lladdr %s %s", orNone(n.GetMac()), n.GetState())
	}
	return fmt.Sprintf("WRONG: %s (want permanent)", n.GetState())
}

// orNone returns s, or "none" when s is empty.
func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
