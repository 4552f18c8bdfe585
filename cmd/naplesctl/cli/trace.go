package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Timing of a trace.
const (
	// traceGrace is how long after the Trace's timeout naplesctl trace still waits for
	// the nodes' last reports before it gives up.
	traceGrace = 2 * time.Second
	// traceDeleteTimeout bounds the deletion of the Trace when the command ends,
	// interrupted or not, and traceApplyTimeout its storing, which an interrupt does not
	// cut short.
	traceDeleteTimeout = 5 * time.Second
	traceApplyTimeout  = 10 * time.Second
)

// traceOptions are the flags of trace.
type traceOptions struct {
	// from, to and toAddress are --from, --to and --to-address.
	from, to, toAddress string
	// proto and family are --proto and --family.
	proto, family string
	// port, sourcePort and payloadSize are --port, --source-port and --payload-size.
	port, sourcePort, payloadSize uint32
	// live and keep are --live and --keep.
	live, keep bool
	// timeout is --timeout, the Trace's spec.timeout.
	timeout time.Duration
	// name is --name; empty: trace-FROM-<6 random hex digits>.
	name string
	// tenant and namespace are --tenant and --namespace, of the Trace and its endpoints.
	tenant, namespace string
	// output is --output: table or json.
	output string
}

// traceFlags names, by field of the Trace, the flag that sets it, so that a bad value is
// reported as the flag the user gave.
var traceFlags = map[string]string{
	"meta.name":               "--name",
	"meta.tenant":             "--tenant",
	"meta.namespace":          "--namespace",
	"spec.source":             "--from",
	"spec.destination":        "--to",
	"spec.destinationAddress": "--to-address",
	"spec.protocol":           "--proto",
	"spec.destinationPort":    "--port",
	"spec.sourcePort":         "--source-port",
	"spec.payloadSize":        "--payload-size",
	"spec.timeout":            "--timeout",
	"spec.family":             "--family",
}

// traceCommand returns the trace command.
func (c *cli) traceCommand() *cobra.Command {
	o := traceOptions{proto: nimbusv1.TraceTCP, timeout: nimbusv1.DefaultTraceTimeout, output: outputTable}
	cmd := &cobra.Command{
		Use:   "trace --from EP (--to EP | --to-address IP) [--proto P] [--port N]",
		Short: "Follow one packet from an endpoint through the datapath of every node it passes",
		Long: `Follow one packet from an endpoint through the datapath of every node it passes.

trace applies a Trace object: the node of the --from endpoint injects a tagged packet at
the endpoint's host interface, as if the workload had sent it, and every node reports
where the packet passed and what happened to it there (the policy stages, the bridge's
forwarding, the gateway, the VXLAN tunnel). trace follows the Trace's status until the
packet's fate is known, or until --timeout and a grace of 2s passed, and prints the path
hop by hop: the node, the stage, the action, where (interface, network, endpoint), what
decided (a policy's rule, a bridge FDB entry, a routing table) and a message; then a
final line: "delivered", "dropped: REASON (at STAGE on NODE)" or "timed out: REASON".
With --live no packet is made: the next real packet of the 5-tuple within --timeout is
followed (--source-port is then required).

trace exits 0 when the packet was delivered, 1 when it was dropped or timed out, and 2
when the command line is bad or nimbus refuses the Trace (an endpoint that does not
exist, a source on no node). It deletes the Trace when it ends, also when interrupted,
unless --keep is given: then it prints the Trace's name, for naplesctl describe trace
NAME. -o json prints one JSON object: the trace's name, result, reason, packet and
hops, each a node and its observation.`,
		Example: `  naplesctl trace --from web-a --to db-a --port 5432
  naplesctl trace --from web-a --to-address 10.2.0.7 --proto icmp
  naplesctl trace --from web-a --to db-a --proto udp --port 53 --payload-size 1400 -o json
  naplesctl trace --from web-a --to db-a --port 5432 --source-port 40001 --live --timeout 2m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			obj, err := o.object()
			if err != nil {
				return err
			}
			return c.trace(cmd.Context(), obj, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "the endpoint the packet comes from (required)")
	f.StringVar(&o.to, "to", "", "the endpoint the packet goes to")
	f.StringVar(&o.toAddress, "to-address", "", "an IP address the packet goes to, instead of --to: another network's, routed through the gateway")
	f.StringVar(&o.proto, "proto", o.proto, "the packet's protocol: tcp (a SYN), udp or icmp (an echo request)")
	f.Uint32Var(&o.port, "port", 0, "the destination port, required for tcp and udp")
	f.Uint32Var(&o.sourcePort, "source-port", 0, "the source port (default: one picked from the Trace's uid, 32768-60999); required with --live")
	f.Uint32Var(&o.payloadSize, "payload-size", 0,
		fmt.Sprintf("the L4 payload in bytes, %d to %d (default %d, the trace's tag)", nimbusv1.MinTracePayload, nimbusv1.MaxTracePayload, nimbusv1.MinTracePayload))
	f.StringVar(&o.family, "family", "", "ipv4 or ipv6, the addresses used with --to (default: IPv4 when both endpoints have one)")
	f.BoolVar(&o.live, "live", false, "follow the next real packet of the 5-tuple instead of injecting one")
	f.DurationVar(&o.timeout, "timeout", o.timeout,
		fmt.Sprintf("how long the nodes observe, %s to %s (to %s with --live)", nimbusv1.MinTraceTimeout, nimbusv1.MaxTraceTimeout, nimbusv1.MaxLiveTraceTimeout))
	f.BoolVar(&o.keep, "keep", false, "keep the Trace when done, for naplesctl describe trace NAME")
	f.StringVar(&o.name, "name", "", "the Trace's name (default trace-FROM-<6 random hex digits>)")
	f.StringVar(&o.tenant, "tenant", "", `tenant of the endpoints and the Trace (default "default")`)
	f.StringVarP(&o.namespace, "namespace", "n", "", `namespace of the endpoints and the Trace (default "default")`)
	f.StringVarP(&o.output, "output", "o", o.output, "output format: table or json")
	return cmd
}

// object returns the Trace the flags describe, checked; its error, a usage error, names
// the flags whose values are bad.
func (o *traceOptions) object() (*nimbusv1.Object, error) {
	if err := checkOutput(o.output, outputTable, outputJSON); err != nil {
		return nil, err
	}
	switch {
	case o.from == "":
		return nil, exitstatus.Mark(errors.New("--from is required: the endpoint the packet comes from"))
	case o.to == "" && o.toAddress == "":
		return nil, exitstatus.Mark(errors.New("--to (an endpoint) or --to-address (an IP address) is required"))
	case o.to != "" && o.toAddress != "":
		return nil, exitstatus.Mark(fmt.Errorf("--to %q and --to-address %q do not go together: give one", o.to, o.toAddress))
	}
	name := o.name
	if name == "" {
		var tag [3]byte
		_, _ = rand.Read(tag[:]) // never fails
		// The name stays within the 253 characters of a name, however long --from is.
		name = "trace-" + o.from[:min(len(o.from), 240)] + "-" + hex.EncodeToString(tag[:])
	}
	obj := &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: o.tenant, Namespace: o.namespace, Name: name},
		Spec: &nimbusv1.Object_Trace{Trace: &nimbusv1.TraceSpec{
			Source:             o.from,
			Destination:        o.to,
			DestinationAddress: o.toAddress,
			Protocol:           o.proto,
			SourcePort:         o.sourcePort,
			DestinationPort:    o.port,
			PayloadSize:        o.payloadSize,
			Live:               o.live,
			Timeout:            durationpb.New(o.timeout),
			Family:             o.family,
		}},
	}
	if err := obj.Validate(); err != nil {
		var errs []error
		for _, fe := range fieldErrors(err) {
			// A name made of a bad --from is bad for that alone, which is told.
			var nameErr *nimbusv1.FieldError
			if o.name == "" && errors.As(fe, &nameErr) && nameErr.Field == "meta.name" {
				continue
			}
			errs = append(errs, flagError(fe))
		}
		return nil, exitstatus.Mark(errors.Join(errs...))
	}
	return obj, nil
}

// flagError returns err, a field error of the Trace, as an error of the flag that sets the
// field when there is one: `--port "0": must be 1 to 65535 with protocol "tcp"`.
func flagError(err error) error {
	var fe *nimbusv1.FieldError
	if errors.As(err, &fe) {
		if flag, ok := traceFlags[fe.Field]; ok {
			return &nimbusv1.FieldError{Field: flag, Value: fe.Value, Reason: fe.Reason}
		}
	}
	return err
}

// traceRun is one run of naplesctl trace: the Trace applied and what its nodes reported.
type traceRun struct {
	key *nimbusv1.ObjectKey
	// generation is the Trace's generation as applied.
	generation int64
	// sourceNode is the node of the source endpoint, which injects the packet.
	sourceNode string
	// status is the last status of the Trace read, nil when none was.
	status *nimbusv1.ObjectStatus
	// outcome is the result derived from status.
	outcome nimbusv1.TraceOutcome
	// deleted tells that the Trace was deleted while it was followed.
	deleted bool
}

// trace applies obj, follows its status until the packet's fate is known or its
// timeout and traceGrace passed, prints the path and deletes the Trace unless o.keep.
func (c *cli) trace(ctx context.Context, obj *nimbusv1.Object, o traceOptions) (err error) {
	sess, kit, closeAll, err := c.connectController()
	if err != nil {
		return err
	}
	defer closeAll()
	key := obj.Key().Defaulted()
	// A Trace of that name already there would lend its nodes' reports to this one.
	if _, err := sess.get(ctx, key); err == nil {
		return exitstatus.Mark(fmt.Errorf("--name %q: %s already exists; delete it or choose another name", key.GetName(), ref(key)))
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	// The Apply runs to its end even when ctx ends meanwhile: an interrupt while nimbus
	// stores the Trace would otherwise leave it stored, unknown to the deletion below.
	actx, cancelApply := context.WithTimeout(context.WithoutCancel(ctx), traceApplyTimeout)
	results, err := kit.Apply(actx, obj)
	cancelApply()
	if err != nil {
		return applyRefused(sess, key, err)
	}
	run := &traceRun{key: key, generation: results[0].GetObject().GetMeta().GetGeneration()}
	if !o.keep {
		defer func() {
			// The Trace goes also when ctx ended: the deletion has a context of its own.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), traceDeleteTimeout)
			defer cancel()
			if _, derr := kit.Delete(dctx, key); derr != nil {
				err = errors.Join(err, fmt.Errorf("deleting %s: %w", ref(key), sess.rpcError(derr)))
			}
		}()
	}
	if err := ctx.Err(); err != nil {
		return err // interrupted while the Trace was stored; it goes at once
	}
	src, err := sess.get(ctx, nimbusv1.NewKey(nimbusv1.Kind_KIND_ENDPOINT, key.GetTenant(), key.GetNamespace(), obj.GetTrace().GetSource()))
	if err != nil {
		return fmt.Errorf("reading the source endpoint of %s: %w", ref(key), err)
	}
	run.sourceNode = src.GetObject().GetEndpoint().GetNode()
	timeout := obj.GetTrace().TraceTimeout() + traceGrace
	if err := c.follow(ctx, kit, run, timeout); err != nil {
		return err
	}
	if run.deleted {
		return fmt.Errorf("%s was deleted while it ran", ref(key))
	}
	if run.outcome.Result == nimbusv1.TraceRunning {
		run.timedOut()
	}
	run.noteFailedNodes()
	if err := c.printTrace(run, o.output); err != nil {
		return err
	}
	if o.keep {
		fmt.Fprintf(c.stderr, "kept %s: naplesctl describe trace %s%s\n", ref(key), key.GetName(), scopeFlags(key))
	}
	switch run.outcome.Result {
	case nimbusv1.TraceDelivered:
		return nil
	case nimbusv1.TraceDropped:
		return fmt.Errorf("%s: %w: %s", ref(key), ErrTraceDropped, run.outcome.Reason)
	}
	return fmt.Errorf("%s: %w: %s", ref(key), ErrTraceTimedOut, run.outcome.Reason)
}

// scopeFlags returns the --tenant and -n flags that name key's tenant and namespace
// when they are not the defaults: " --tenant blue -n prod".
func scopeFlags(key *nimbusv1.ObjectKey) string {
	var s string
	if t := key.GetTenant(); t != nimbusv1.DefaultTenant {
		s += " --tenant " + t
	}
	if ns := key.GetNamespace(); ns != nimbusv1.DefaultNamespace {
		s += " -n " + ns
	}
	return s
}

// applyRefused returns the error of an Apply of the Trace with key: nimbus's message for
// each refused field, as it is, marked as a usage error when nimbus refused the Trace for
// what the flags said (invalid, or naming an endpoint that is not there).
func applyRefused(sess *session, key *nimbusv1.ObjectKey, err error) error {
	var be *controller.BatchError
	if errors.As(err, &be) && len(be.Entries) > 0 {
		// nimbus's messages name the Trace and the field already.
		msgs := make([]string, len(be.Entries))
		for i, e := range be.Entries {
			msgs[i] = e.Message
		}
		err = sess.rpcError(status.Error(status.Code(be.Err), strings.Join(msgs, "\n")))
	} else {
		err = fmt.Errorf("applying %s: %w", ref(key), sess.rpcError(err))
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.AlreadyExists:
		return exitstatus.Mark(err)
	}
	return err
}

// follow follows the status of run's Trace over a status stream until its outcome is
// complete, the Trace is deleted, or timeout passes; it returns an error only when ctx
// ends first, or the stream fails for good.
func (c *cli) follow(ctx context.Context, kit *controller.Client, run *traceRun, timeout time.Duration) error {
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var readErr error
	r := controller.ReactorFuncs{
		Status: func(item *nimbusv1.ObjectWithStatus) {
			st, err := fullStatus(fctx, kit, run.key, item.GetStatus())
			if err != nil {
				readErr = err
				cancel()
				return
			}
			run.status = st
			run.outcome = nimbusv1.Outcome(st, run.generation, run.sourceNode)
			if run.complete() || run.sourceFailed() {
				cancel()
			}
		},
		Delete: func(*nimbusv1.ObjectKey) {
			run.deleted = true
			cancel()
		},
	}
	err := kit.WatchStatus(fctx, controller.Filter{
		Kind: run.key.GetKind(), Tenant: run.key.GetTenant(), Namespace: run.key.GetNamespace(), Name: run.key.GetName(),
	}, r)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("following %s: %w", ref(run.key), ctx.Err())
	case readErr != nil:
		return fmt.Errorf("following %s: %w", ref(run.key), readErr)
	case err != nil:
		return fmt.Errorf("following %s: %w", ref(run.key), err)
	}
	return nil
}

// complete tells whether run's outcome is decided and its path has the source's part:
// a packet delivered on another node may be reported there before the node of the
// source reports what it saw first, so the outcome waits for that node's report (or its
// done), or for the deadline.
func (run *traceRun) complete() bool {
	if run.outcome.Result == nimbusv1.TraceRunning {
		return false
	}
	src := run.sourceStatus().GetOperationalData().GetTrace()
	return src.GetDone() || len(src.GetObservations()) > 0
}

// sourceFailed tells whether the node of the source failed the Trace at run's
// generation (no trace slot left, its firewall without trace checks, no address to make
// the packet with): it injects nothing, and nothing more is to come.
func (run *traceRun) sourceFailed() bool {
	return run.sourceStatus().GetPhase() == nimbusv1.Phase_PHASE_FAILED
}

// sourceStatus returns the status the node of the source reported at run's generation,
// nil when it has reported none.
func (run *traceRun) sourceStatus() *nimbusv1.NodeStatus {
	for _, n := range run.status.GetNodes() {
		if n.GetNode() == run.sourceNode && n.GetObservedGeneration() == run.generation {
			return n
		}
	}
	return nil
}

// fullStatus returns st, or, when nimbus left nodes or their operational data out of it
// (its --status-nodes, --status-details-bytes), st with every node's status read with
// ListNodeStatuses.
func fullStatus(ctx context.Context, kit *controller.Client, key *nimbusv1.ObjectKey, st *nimbusv1.ObjectStatus) (*nimbusv1.ObjectStatus, error) {
	if st.GetNodesOmitted() == 0 && st.GetDetailsOmitted() == 0 {
		return st, nil
	}
	entries, err := kit.NodeStatuses(ctx, key, nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_UNSPECIFIED)
	if err != nil {
		return nil, err
	}
	full := &nimbusv1.ObjectStatus{Generation: st.GetGeneration(), TargetNodes: st.GetTargetNodes()}
	for _, e := range entries {
		if e.GetStatus() != nil {
			full.Nodes = append(full.Nodes, e.GetStatus())
		}
	}
	return full, nil
}

// timedOut makes run's outcome TraceTimedOut, for a Trace whose time passed before its
// packet's fate was known: the reason says when the node of the source never reported
// or failed the Trace, else where the packet was last seen.
func (run *traceRun) timedOut() {
	out := &run.outcome
	out.Result = nimbusv1.TraceTimedOut
	switch src := run.sourceStatus(); {
	case src == nil:
		out.Reason = "no report from the source's node " + run.sourceNode
	case run.sourceFailed():
		out.Reason = fmt.Sprintf("the source's node %s failed the trace: %s: %s", run.sourceNode, src.GetReason(), oneLine(src.GetMessage()))
	case len(out.Hops) > 0:
		last := out.Hops[len(out.Hops)-1]
		out.Reason = "last seen at " + last.GetStage().StageName() + " on " + last.Node
	default:
		out.Reason = "no node saw the packet"
	}
}

// noteFailedNodes adds to the reason of run's outcome, when it timed out after the source's
// node injected the packet, which other nodes failed the Trace and why: such a node did
// not follow the packet, and its reason may be why the fate is unknown.
func (run *traceRun) noteFailedNodes() {
	out := &run.outcome
	if out.Result != nimbusv1.TraceTimedOut || run.sourceStatus() == nil || run.sourceFailed() {
		return
	}
	for _, n := range run.status.GetNodes() {
		if n.GetNode() != run.sourceNode && n.GetObservedGeneration() == run.generation && n.GetPhase() == nimbusv1.Phase_PHASE_FAILED {
			out.Reason += fmt.Sprintf("; node %s failed the trace: %s: %s", n.GetNode(), n.GetReason(), oneLine(n.GetMessage()))
		}
	}
}

// packet returns the packet the node of the source injected, as it describes it; "" when
// it has not said.
func (run *traceRun) packet() string {
	return run.sourceStatus().GetOperationalData().GetTrace().GetPacket()
}

// printTrace prints run's path and result, as a table and a final line, or as one JSON
// object.
func (c *cli) printTrace(run *traceRun, output string) error {
	out := run.outcome
	if output == outputJSON {
		return c.traceJSON(run)
	}
	if p := run.packet(); p != "" {
		fmt.Fprintf(c.stdout, "packet: %s\n", oneLine(p))
	}
	if len(out.Hops) > 0 {
		tw := newTable(c.stdout, 3)
		fmt.Fprintln(tw, "NODE\tSTAGE\tACTION\tWHERE\tDECIDED BY\tMESSAGE")
		for _, h := range out.Hops {
			action := h.GetAction().ActionName()
			if r := h.GetReason(); r != "" {
				action += " (" + r + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", h.Node, h.GetStage().StageName(), action,
				orDash(where(h.TraceObservation)), orDash(decidedBy(h.TraceObservation)), orDash(oneLine(h.GetMessage())))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("writing the path: %w", err)
		}
	}
	fmt.Fprintln(c.stdout, resultLine(out))
	return nil
}

// resultLine is the last line of a trace: "delivered", "dropped: Policy (at source on
// host-a)" or "timed out: no report from the source's node host-a".
func resultLine(out nimbusv1.TraceOutcome) string {
	switch out.Result {
	case nimbusv1.TraceDelivered:
		return "delivered"
	case nimbusv1.TraceDropped:
		line := "dropped: " + orDash(out.Reason)
		if d := out.Decided; d != nil {
			line += " (at " + d.GetStage().StageName() + " on " + d.Node + ")"
		}
		return line
	}
	return out.Result.String() + ": " + out.Reason
}

// where says where an observation was made: "veth-a net=blue ep=web-a".
func where(o *nimbusv1.TraceObservation) string {
	var parts []string
	if s := o.GetInterface(); s != "" {
		parts = append(parts, s)
	}
	if s := o.GetNetwork(); s != "" {
		parts = append(parts, "net="+s)
	}
	if s := o.GetEndpoint(); s != "" && o.GetStage() != nimbusv1.TraceStage_TRACE_STAGE_FORWARD {
		parts = append(parts, "ep="+s)
	}
	return strings.Join(parts, " ")
}

// decidedBy says what decided at an observation: a policy's rule ("policy
// default/allow-web rule http"), the gateway's table ("table 100"), the FDB entry the
// bridge or the VXLAN device used ("fdb ep=db-a vtep=192.0.2.2 node=host-b"), or, for a
// packet out of the tunnel, the node it came from ("from node=host-a").
func decidedBy(o *nimbusv1.TraceObservation) string {
	if p := o.GetPolicy(); p != nil && p.GetName() != "" {
		s := "policy " + p.GetNamespace() + "/" + p.GetName()
		if t := p.GetTenant(); t != "" && t != nimbusv1.DefaultTenant {
			s = "policy " + t + "/" + p.GetNamespace() + "/" + p.GetName()
		}
		if o.GetRule() != "" {
			s += " rule " + o.GetRule()
		}
		return s
	}
	if o.GetRule() != "" {
		return "rule " + o.GetRule()
	}
	if t := o.GetTable(); t != 0 {
		return fmt.Sprintf("table %d", t)
	}
	switch o.GetStage() {
	case nimbusv1.TraceStage_TRACE_STAGE_FORWARD, nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_OUT:
		var fdb []string
		if o.GetStage() == nimbusv1.TraceStage_TRACE_STAGE_FORWARD && o.GetEndpoint() != "" {
			fdb = append(fdb, "ep="+o.GetEndpoint())
		}
		if s := o.GetVtep(); s != "" {
			fdb = append(fdb, "vtep="+s)
		}
		if s := o.GetPeerNode(); s != "" {
			fdb = append(fdb, "node="+s)
		}
		if len(fdb) > 0 {
			return "fdb " + strings.Join(fdb, " ")
		}
	case nimbusv1.TraceStage_TRACE_STAGE_TUNNEL_IN:
		if s := o.GetPeerNode(); s != "" {
			return "from node=" + s
		}
	}
	if s := o.GetPeerNode(); s != "" {
		return "node=" + s
	}
	return ""
}

// traceJSON is the JSON output of naplesctl trace.
type traceJSON struct {
	Trace  string         `json:"trace"`
	Result string         `json:"result"`
	Reason string         `json:"reason,omitempty"`
	Packet string         `json:"packet,omitempty"`
	Hops   []traceHopJSON `json:"hops"`
}

// traceHopJSON is one hop of traceJSON: the node and its observation, in protojson.
type traceHopJSON struct {
	Node        string          `json:"node"`
	Observation json.RawMessage `json:"observation"`
}

// traceJSON prints run as one JSON object.
func (c *cli) traceJSON(run *traceRun) error {
	out := run.outcome
	doc := traceJSON{Trace: run.key.GetName(), Result: out.Result.String(), Reason: out.Reason, Packet: run.packet(), Hops: []traceHopJSON{}}
	for _, h := range out.Hops {
		b, err := protojson.Marshal(h.TraceObservation)
		if err != nil {
			return fmt.Errorf("encoding an observation of %s: %w", h.Node, err)
		}
		doc.Hops = append(doc.Hops, traceHopJSON{Node: h.Node, Observation: b})
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the trace: %w", err)
	}
	_, err = fmt.Fprintf(c.stdout, "%s\n", b)
	return err
}
