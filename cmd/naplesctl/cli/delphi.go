package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/manifest"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Defaults of the --agent flag.
const (
	// DefaultAgent is the socket of the agent's local API used when neither --agent nor
	// NAPLES_AGENT is set.
	DefaultAgent = "/run/naples/agent.sock"
	// AgentEnv names the environment variable that sets the default of --agent.
	AgentEnv = "NAPLES_AGENT"
)

// addAgentFlag adds the global --agent flag to root.
func (c *cli) addAgentFlag(root *cobra.Command, getenv func(string) string) {
	agent := getenv(AgentEnv)
	c.agentEnv = agent != ""
	if agent == "" {
		agent = DefaultAgent
	}
	root.PersistentFlags().StringVar(&c.agent, "agent", agent,
		"unix `socket` of the local agent's read-only API, for the delphi commands ($"+AgentEnv+")")
}

// delphiCommand returns the delphi command and its subcommands.
func (c *cli) delphiCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delphi",
		Short: "Show what the agent on this host holds in delphi",
		Long: `Show what the agent on this host holds in delphi: the desired objects it received
from nimbus and this node's status of each.

The delphi commands talk to the agent's read-only local API on the unix socket named by
--agent, not to nimbus.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(c.delphiListCommand(), c.delphiGetCommand(), c.delphiWatchCommand())
	return cmd
}

// delphiListCommand returns the delphi list command.
func (c *cli) delphiListCommand() *cobra.Command {
	output := outputTable
	cmd := &cobra.Command{
		Use:   "list [KIND]",
		Short: "List the entries delphi holds, of every kind or of one",
		Long: `List the entries delphi holds, of every kind or of one.

The table starts with the nimbus epoch and revision delphi's desired objects correspond
to and whether delphi holds a complete snapshot (synced). Each row is one key: the
object's generation and this node's phase, observed generation and message. A key
delphi holds only a status for has "-" as its generation.`,
		Example: `  naplesctl delphi list
  naplesctl delphi list routes -o yaml`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := nimbusv1.Kind_KIND_UNSPECIFIED
			if len(args) == 1 {
				var err error
				if kind, err = parseKind(args[0]); err != nil {
					return err
				}
			}
			if err := checkOutput(output, outputTable, outputJSON, outputYAML); err != nil {
				return err
			}
			return c.delphiList(cmd.Context(), kind, output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: table, json or yaml")
	return cmd
}

// delphiGetCommand returns the delphi get command.
func (c *cli) delphiGetCommand() *cobra.Command {
	var tenant, namespace string
	output := outputYAML
	cmd := &cobra.Command{
		Use:   "get KIND NAME",
		Short: "Show one entry of delphi: the desired object and this node's status",
		Long: `Show one entry of delphi: the desired object in manifest shape, with this node's
status of it under "status".`,
		Example: `  naplesctl delphi get route to-dc2`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := parseKind(args[0])
			if err != nil {
				return err
			}
			if err := checkOutput(output, outputJSON, outputYAML); err != nil {
				return err
			}
			return c.delphiGet(cmd.Context(), nimbusv1.NewKey(kind, tenant, namespace, args[1]), output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: json or yaml")
	cmd.Flags().StringVar(&tenant, "tenant", "", `tenant of the object (default "default")`)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", `namespace of the object (default "default")`)
	return cmd
}

// delphiWatchCommand returns the delphi watch command.
func (c *cli) delphiWatchCommand() *cobra.Command {
	output := outputYAML
	cmd := &cobra.Command{
		Use:   "watch [KIND]",
		Short: "Print delphi's entries, then every change, until interrupted",
		Long: `Print delphi's entries, then every change, until interrupted.

Each event is one document: the entry in the shape of delphi get, with "deleted: true"
added when delphi no longer holds anything for the key. YAML documents start with
"---"; JSON documents are one per line. Changes that follow each other quickly are
coalesced: the entry printed is always the key's latest.`,
		Example: `  naplesctl delphi watch
  naplesctl delphi watch routes -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind := nimbusv1.Kind_KIND_UNSPECIFIED
			if len(args) == 1 {
				var err error
				if kind, err = parseKind(args[0]); err != nil {
					return err
				}
			}
			if err := checkOutput(output, outputJSON, outputYAML); err != nil {
				return err
			}
			return c.delphiWatch(cmd.Context(), kind, output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", output, "output format: json or yaml")
	return cmd
}

// checkOutput refuses an --output value that is not one of valid.
func checkOutput(output string, valid ...string) error {
	for _, v := range valid {
		if output == v {
			return nil
		}
	}
	want := strings.Join(valid, " or ")
	if len(valid) > 2 {
		want = strings.Join(valid[:len(valid)-1], ", ") + " or " + valid[len(valid)-1]
	}
	return exitstatus.Mark(fmt.Errorf("--output %q: want %s", output, want))
}

// agentSession is a connection to the local agent's API for one command.
type agentSession struct {
	delphi delphiv1.DelphiClient
	conn   *grpc.ClientConn
	// socket is the path of the agent's socket.
	socket string
}

// connectAgent returns a session with the agent whose socket --agent names: a path, or
// unix:///path. The connection is plaintext over the unix socket, which file permissions
// protect. Close the session when done.
func (c *cli) connectAgent() (*agentSession, error) {
	socket := c.agent
	if strings.Contains(socket, "://") {
		addr, err := address.Parse(socket)
		if err != nil {
			return nil, exitstatus.Mark(fmt.Errorf("parsing --agent: %w", err))
		}
		if addr.Network != "unix" {
			return nil, exitstatus.Mark(fmt.Errorf("--agent %q: the agent serves its api on a unix socket only", c.agent))
		}
		socket = addr.Addr
	}
	if socket == "" {
		return nil, exitstatus.Mark(errors.New("--agent: is required"))
	}
	socket, err := filepath.Abs(socket)
	if err != nil {
		return nil, exitstatus.Mark(fmt.Errorf("--agent %q: %w", c.agent, err))
	}
	addr := address.Address{Network: "unix", Addr: socket}
	conn, err := grpc.NewClient(addr.GRPCTarget(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connecting to the agent at %s: %w", socket, err)
	}
	return &agentSession{delphi: delphiv1.NewDelphiClient(conn), conn: conn, socket: socket}, nil
}

// Close closes the connection.
func (s *agentSession) Close() error { return s.conn.Close() }

// rpcError turns the error of a call into one that reads well: the agent's message, with
// its socket when it cannot be reached. The gRPC status stays reachable with
// status.FromError.
func (s *agentSession) rpcError(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return &agentError{st: st, socket: s.socket}
}

// agentError is a gRPC status error of a call to the agent at socket.
type agentError struct {
	st     *status.Status
	socket string
}

// Error returns the agent's message, with the socket or the code where they help.
func (e *agentError) Error() string {
	switch e.st.Code() {
	case codes.InvalidArgument, codes.NotFound:
		return e.st.Message()
	case codes.Unavailable:
		return fmt.Sprintf("the agent at %s is unavailable: %s", e.socket, e.st.Message())
	}
	return fmt.Sprintf("%s (%s)", e.st.Message(), e.st.Code())
}

// GRPCStatus returns the status, for status.FromError and status.Code.
func (e *agentError) GRPCStatus() *status.Status { return e.st }

// delphiList prints the entries of kind.
func (c *cli) delphiList(ctx context.Context, kind nimbusv1.Kind, output string) error {
	sess, err := c.connectAgent()
	if err != nil {
		return err
	}
	defer sess.Close()
	resp, err := listDelphi(ctx, sess.delphi, kind)
	if err != nil {
		return fmt.Errorf("listing delphi entries: %w", sess.rpcError(err))
	}
	if output != outputTable {
		doc := struct {
			Epoch    string            `json:"epoch"`
			Revision uint64            `json:"revision"`
			Synced   bool              `json:"synced"`
			Items    []json.RawMessage `json:"items"`
		}{Epoch: resp.GetEpoch(), Revision: resp.GetRevision(), Synced: resp.GetSynced(), Items: []json.RawMessage{}}
		for _, e := range resp.GetEntries() {
			raw, err := entryJSON(e, false)
			if err != nil {
				return err
			}
			doc.Items = append(doc.Items, raw)
		}
		raw, err := marshalJSON(doc)
		if err != nil {
			return err
		}
		return writeDoc(c.stdout, output, raw, false)
	}

	fmt.Fprintf(c.stdout, "epoch: %s   revision: %d   synced: %t\n",
		orDash(resp.GetEpoch()), resp.GetRevision(), resp.GetSynced())
	if len(resp.GetEntries()) == 0 {
		fmt.Fprintln(c.stderr, "No entries found.")
		return nil
	}
	tw := newTable(c.stdout, 3)
	fmt.Fprintln(tw, "KIND\tNAME\tTENANT\tNAMESPACE\tGENERATION\tPHASE\tOBSERVED\tMESSAGE")
	for _, e := range resp.GetEntries() {
		k := e.GetKey()
		gen := "-"
		if e.GetObject() != nil {
			gen = fmt.Sprint(e.GetObject().GetMeta().GetGeneration())
		}
		phase, observed, msg := "-", "-", "-"
		if st := e.GetStatus(); st != nil {
			phase, observed, msg = phaseName(st.GetPhase()), fmt.Sprint(st.GetObservedGeneration()), orDash(oneLine(st.GetMessage()))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n",
			k.GetKind().Name(), k.GetName(), k.GetTenant(), k.GetNamespace(), gen, phase, observed, msg)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	return nil
}

// delphiGet prints the entry of key.
func (c *cli) delphiGet(ctx context.Context, key *nimbusv1.ObjectKey, output string) error {
	sess, err := c.connectAgent()
	if err != nil {
		return err
	}
	defer sess.Close()
	resp, err := sess.delphi.Get(ctx, &delphiv1.GetRequest{Key: key})
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("%w in delphi", notFound(key))
	}
	if err != nil {
		return fmt.Errorf("getting %s from delphi: %w", ref(key), sess.rpcError(err))
	}
	raw, err := entryJSON(resp.GetEntry(), false)
	if err != nil {
		return err
	}
	return writeDoc(c.stdout, output, raw, false)
}

// delphiWatch prints every entry of kind, then every change, until ctx ends, which is a
// clean end.
func (c *cli) delphiWatch(ctx context.Context, kind nimbusv1.Kind, output string) error {
	sess, err := c.connectAgent()
	if err != nil {
		return err
	}
	defer sess.Close()
	stream, err := sess.delphi.Watch(ctx, &delphiv1.WatchRequest{Kind: kind})
	if err != nil {
		return fmt.Errorf("watching delphi: %w", sess.rpcError(err))
	}
	for {
		ev, err := stream.Recv()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("watching delphi: the agent at %s ended the watch", sess.socket)
		}
		if err != nil {
			return fmt.Errorf("watching delphi: %w", sess.rpcError(err))
		}
		raw, err := entryJSON(ev.GetEntry(), ev.GetDeleted())
		if err != nil {
			return err
		}
		if err := writeDoc(c.stdout, output, raw, true); err != nil {
			return err
		}
	}
}

// entryJSON returns e as compact JSON in manifest shape: kind, meta and spec of the object
// (only kind and the key's names in meta when delphi holds no object), this node's status
// under "status" when there is one, and "deleted": true when deleted is set.
func entryJSON(e *delphiv1.Entry, deleted bool) (json.RawMessage, error) {
	doc := map[string]json.RawMessage{}
	key := e.GetKey().Defaulted()
	if obj := e.GetObject(); obj != nil {
		raw, err := manifest.Marshal(obj, nil)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			return nil, fmt.Errorf("encoding %s: %w", key.ID(), err)
		}
	} else {
		var err error
		if doc["kind"], err = marshalJSON(key.GetKind().Name()); err != nil {
			return nil, err
		}
		meta := map[string]string{"tenant": key.GetTenant(), "namespace": key.GetNamespace(), "name": key.GetName()}
		if doc["meta"], err = marshalJSON(meta); err != nil {
			return nil, err
		}
	}
	if st := e.GetStatus(); st != nil {
		raw, err := manifest.MarshalMessage(st)
		if err != nil {
			return nil, fmt.Errorf("encoding status of %s: %w", key.ID(), err)
		}
		doc["status"] = raw
	}
	if deleted {
		doc["deleted"] = json.RawMessage("true")
	}
	return marshalJSON(doc)
}

// marshalJSON encodes v as compact JSON without escaping <, > and &, which may appear in
// messages.
func marshalJSON(v any) (json.RawMessage, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("encoding JSON: %w", err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// writeDoc writes the compact JSON raw to w as one document in format output. In a
// stream, JSON documents take one line each and YAML documents start with "---";
// otherwise JSON is indented.
func writeDoc(w io.Writer, output string, raw json.RawMessage, stream bool) error {
	var out []byte
	switch output {
	case outputJSON:
		if stream {
			out = append(raw, '\n')
			break
		}
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return fmt.Errorf("indenting JSON: %w", err)
		}
		buf.WriteByte('\n')
		out = buf.Bytes()
	case outputYAML:
		y, err := yaml.JSONToYAML(raw)
		if err != nil {
			return fmt.Errorf("converting JSON to YAML: %w", err)
		}
		if stream {
			y = append([]byte("---\n"), y...)
		}
		out = y
	default:
		return exitstatus.Mark(fmt.Errorf("--output %q: want %s or %s", output, outputJSON, outputYAML))
	}
	if _, err := w.Write(out); err != nil {
		return fmt.Errorf("writing %s: %w", output, err)
	}
	return nil
}

// listDelphi lists every entry of the kind, asking the agent for one page after the other
// so that each fits the default receive limit however large the objects; the position
// and synced are those of the last page.
func listDelphi(ctx context.Context, api delphiv1.DelphiClient, kind nimbusv1.Kind) (*delphiv1.ListResponse, error) {
	req := &delphiv1.ListRequest{Kind: kind}
	all := &delphiv1.ListResponse{}
	for {
		resp, err := api.List(ctx, req)
		if err != nil {
			return nil, err
		}
		all.Entries = append(all.Entries, resp.GetEntries()...)
		all.Epoch, all.Revision, all.Synced = resp.GetEpoch(), resp.GetRevision(), resp.GetSynced()
		if resp.GetNextPageToken() == "" {
			return all, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}
