package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Defaults of waiting.
const (
	// defaultWaitTimeout is the default of --timeout.
	defaultWaitTimeout = "60s"
)

// waitOptions are the flags of wait and of apply --wait.
type waitOptions struct {
	// timeout is the --timeout flag as given.
	timeout string
}

// addTimeoutFlag adds --timeout to cmd.
func (o *waitOptions) addTimeoutFlag(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&o.timeout, "timeout", defaultWaitTimeout,
		strings.TrimSpace("how long to wait "+what)+", a duration such as 30s or 2m")
}

// parseTimeout returns the --timeout duration; its error names the flag and the value.
func (o *waitOptions) parseTimeout() (time.Duration, error) {
	d, err := time.ParseDuration(o.timeout)
	if err != nil || d <= 0 {
		return 0, exitstatus.Mark(fmt.Errorf("--timeout %q: want a positive duration such as 30s or 2m", o.timeout))
	}
	return d, nil
}

// waitCommand returns the wait command.
func (c *cli) waitCommand() *cobra.Command {
	var (
		o                 waitOptions
		tenant, namespace string
	)
	cmd := &cobra.Command{
		Use:   "wait KIND NAME...",
		Short: "Wait until objects are programmed on every target node",
		Long: `Wait until objects are programmed on every target node.

Each object is waited on at the generation it has when the wait starts. While waiting,
a line on stderr shows each change of progress ("route/to-dc2: 3/4 nodes programmed
(generation 2)"); when an object is PROGRAMMED on every target node, a line on stdout
says so. A node that reports FAILED while its agent retries (a kernel error, a conflict)
is shown as progress ("host-a: FAILED KernelError (retrying): ...") and waited on, and
so is a node PENDING with a message saying what it waits for ("host-a: PENDING
WaitingForSecurityGroup: ..."): another object, which may be on its way or misnamed. wait
exits 0 once every object is programmed; it fails as soon as a target node reports a
terminal FAILED (an invalid spec, which no retry mends), with that node's reason and
message, and when --timeout passes, naming the nodes still pending, waiting or failing.`,
		Example: `  naplesctl wait route to-dc2
  naplesctl wait route to-dc2 to-dc3 --timeout 2m`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := parseKind(args[0])
			if err != nil {
				return err
			}
			timeout, err := o.parseTimeout()
			if err != nil {
				return err
			}
			// A name nimbus would refuse is named here, by its argument, as delete does:
			// a wait for one object asks nimbus by its fields and would only find nothing.
			var targets []waitTarget
			var keys []*nimbusv1.ObjectKey
			for i, name := range args[1:] {
				key, err := argKey(kind, tenant, namespace, name, i+2)
				if err != nil {
					return err
				}
				targets = append(targets, waitTarget{key: key})
				keys = append(keys, key)
			}
			// A name given twice is refused, as delete refuses it, rather than waited on
			// and shown twice.
			if dups := duplicates(keys, "key.name", func(i int) string { return fmt.Sprintf("argument %d", i+2) }); len(dups) > 0 {
				return exitstatus.Mark(errors.Join(dups...))
			}
			sess, err := c.connect()
			if err != nil {
				return err
			}
			defer sess.Close()
			return c.wait(cmd.Context(), sess, targets, timeout, &objectLines{c: c})
		},
	}
	o.addTimeoutFlag(cmd, "")
	cmd.Flags().StringVar(&tenant, "tenant", "", `tenant of the objects (default "default")`)
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", `namespace of the objects (default "default")`)
	return cmd
}

// waitTarget is an object to wait for and the generation it must be programmed at.
type waitTarget struct {
	key *nimbusv1.ObjectKey
	// generation is the generation to wait for; 0 means the one the object has when the
	// wait starts.
	generation int64
}

// waitState is where the wait for one target stands.
type waitState struct {
	waitTarget
	// seen tells that nimbus sent the target's status at least once; last is the last
	// propagation read from it.
	seen bool
	last propagation
	// done tells that the target is PROGRAMMED on every target node and FAILED on none.
	done bool
	// line is the last progress line objectLines printed; shown tells that bulkProgress
	// printed the target's failure.
	line  string
	shown bool
}

// waitPrinter shows a wait's progress. Its methods are called on the goroutine of the
// wait.
type waitPrinter interface {
	// start is called before the wait, with its targets.
	start(states []*waitState)
	// observed is called when the status of the target s changed: s.last and s.done
	// are new.
	observed(s *waitState)
	// end is called once the wait ended; ok tells that every target is programmed.
	end(ok bool)
	// brief tells that the printer shows of an object whose status has nothing to tell
	// but its counts only those counts, so that the wait may follow a brief status
	// stream (controller.WaitOptions.Brief).
	brief() bool
}

// objectLines is the waitPrinter of wait: a line on stderr for each change of an
// object's progress and one on stdout when an object is programmed.
type objectLines struct{ c *cli }

// start does nothing: objectLines prints as the statuses come.
func (p *objectLines) start([]*waitState) {}

// end does nothing: objectLines printed all as the statuses came.
func (p *objectLines) end(bool) {}

// brief is false: a progress line names the pending nodes.
func (p *objectLines) brief() bool { return false }

// observed prints the target's progress when it changed, and a line on stdout when the
// target is done.
func (p *objectLines) observed(s *waitState) {
	if line := s.last.progress(s.key); line != s.line {
		fmt.Fprintln(p.c.stderr, line)
		s.line = line
	}
	if s.done {
		fmt.Fprintf(p.c.stdout, "%s programmed on %d/%d nodes (generation %d)\n",
			ref(s.key), s.last.programmed, s.last.target, s.generation)
	}
}

// wait follows nimbus's status stream until every target is PROGRAMMED on all its target
// nodes at its generation or later, showing its progress with printer. It returns an error wrapping ErrProgrammingFailed as soon as a target
// node reports a terminal FAILED at that generation, one
// wrapping ErrNotFound when a target does not exist or is deleted, and one wrapping
// ErrWaitTimeout that names the pending nodes when timeout passes first.
func (c *cli) wait(ctx context.Context, sess *session, targets []waitTarget, timeout time.Duration, printer waitPrinter) error {
	waitCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	kit, err := sess.controller()
	if err != nil {
		return fmt.Errorf("waiting: %w", err)
	}
	defer kit.Close()
	states := make([]*waitState, len(targets))
	byKey := make(map[nimbusv1.Key][]*waitState, len(targets))
	kitTargets := make([]controller.Target, len(targets))
	for i, t := range targets {
		states[i] = &waitState{waitTarget: t}
		k := t.key.Key()
		byKey[k] = append(byKey[k], states[i])
		kitTargets[i] = controller.Target{Key: t.key, Generation: t.generation}
	}
	// Progress is called on this goroutine, and never after Wait returned.
	progress := func(i int, t controller.Target, item *nimbusv1.ObjectWithStatus) {
		if s := states[i]; !s.done {
			s.generation = t.Generation
			s.last = propagationOf(withStatus(item), s.generation)
			s.seen = true
			s.done = s.last.done() && len(s.last.failures) == 0
			printer.observed(s)
		}
	}
	printer.start(states)
	err = kit.Wait(waitCtx, kitTargets, controller.WaitOptions{Progress: progress, Brief: printer.brief()})
	if err != nil && printer.brief() && ctx.Err() == nil && waitCtx.Err() != nil {
		// A brief stream told of a pending object its counts only: the error of the
		// timeout names the pending nodes of those it names, as Get tells them.
		refreshPending(ctx, sess, states)
	}
	printer.end(err == nil)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, controller.ErrFailed) || errors.Is(err, controller.ErrNotFound):
		var errs []error
		for _, we := range waitErrors(err) {
			key := we.Target.Key
			switch {
			case errors.Is(we, controller.ErrNotFound) && we.Item == nil:
				errs = append(errs, fmt.Errorf("waiting for %s: %w", ref(key), notFound(key)))
			case errors.Is(we, controller.ErrNotFound):
				errs = append(errs, fmt.Errorf("waiting for %s: %w: it was deleted", ref(key), notFound(key)))
			default:
				errs = append(errs, failureOf(byKey[key.Key()], we))
			}
		}
		return errors.Join(errs...)
	case ctx.Err() != nil:
		return fmt.Errorf("waiting: %w", ctx.Err())
	case waitCtx.Err() != nil:
		return timedOut(states, timeout)
	}
	// The call's own status reads better than the kit's wrapping of it.
	var rpc interface{ GRPCStatus() *status.Status }
	if errors.As(err, &rpc) {
		if e, ok := rpc.(error); ok {
			err = sess.rpcError(e)
		}
	}
	return fmt.Errorf("waiting: %w", err)
}

// refreshGetTimeout bounds each Get of refreshPending.
const refreshGetTimeout = 5 * time.Second

// refreshPending reads again the status of each target seen and not done, as many as
// timedOut names, to have its pending nodes; a target whose Get fails keeps what the
// wait last saw.
func refreshPending(ctx context.Context, sess *session, states []*waitState) {
	n := 0
	for _, s := range states {
		if s.done {
			continue
		}
		if n++; n > maxTimedOut {
			return
		}
		if !s.seen {
			continue
		}
		getCtx, cancel := context.WithTimeout(ctx, refreshGetTimeout)
		resp, err := sess.nimbus.Get(getCtx, &nimbusv1.GetRequest{Key: s.key})
		cancel()
		if err == nil {
			s.last = propagationOf(withStatus(resp.GetItem()), s.generation)
		}
	}
}

// failureOf returns the error for the failed target of we, from the state of the
// target's wait among states; we itself when no state saw the failure.
func failureOf(states []*waitState, we *controller.WaitError) error {
	for _, s := range states {
		if s.generation == we.Target.Generation && len(s.last.terminal) > 0 {
			return failure(s)
		}
	}
	return fmt.Errorf("%w: %w", ErrProgrammingFailed, we)
}

// waitErrors returns the WaitErrors err joins, in order.
func waitErrors(err error) []*controller.WaitError {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var out []*controller.WaitError
	for _, e := range errs {
		var we *controller.WaitError
		if errors.As(e, &we) {
			out = append(out, we)
		}
	}
	return out
}

// progress is the progress of an object: "route/to-dc2: 3/4 nodes programmed
// (generation 2)", followed by a line per node FAILED and being retried: "  host-b:
// FAILED KernelError (retrying): <message>".
func (p propagation) progress(key *nimbusv1.ObjectKey) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d/%d nodes programmed (generation %d)", ref(key), p.programmed, p.target, p.generation)
	for _, n := range p.failures {
		if !n.GetTerminal() {
			fmt.Fprintf(&b, "\n  %s: FAILED %s: %s", n.GetNode(), reasonOf(n), orDash(oneLine(n.GetMessage())))
		}
	}
	for _, n := range p.waiting {
		fmt.Fprintf(&b, "\n  %s: PENDING %s: %s", n.GetNode(), orDash(n.GetReason()), oneLine(n.GetMessage()))
	}
	return b.String()
}

// failure returns the error for a target that a node reported FAILED for good, one line
// per such node: "node host-b: InvalidSpec: <message>", one that counts the FAILED nodes
// the object's status does not list, and one that says when it left messages out.
func failure(s *waitState) error {
	var b strings.Builder
	for _, n := range s.last.terminal {
		b.WriteString("\n  node " + n.GetNode() + ": ")
		if r := n.GetReason(); r != "" {
			b.WriteString(r + ": ")
		}
		b.WriteString(orDash(oneLine(n.GetMessage())))
	}
	if more := s.last.unlistedFailed(); more > 0 {
		fmt.Fprintf(&b, "\n  and %d more FAILED %s", more, plural(more, "node", "nodes"))
	}
	if n := s.last.detailsOmitted; n > 0 && slices.ContainsFunc(s.last.terminal, func(n *nimbusv1.NodeStatus) bool { return n.GetMessage() == "" }) {
		fmt.Fprintf(&b, "\n  (the %s of %d %s left out: the object's statuses hold more than nimbus sends for one object, "+
			"its --status-details-bytes; naplesctl describe shows %s)",
			plural(n, "message", "messages"), n, plural(n, "node was", "nodes were"), plural(n, "it", "them"))
	}
	return fmt.Errorf("%s: %w on %d of %d nodes (generation %d):%s",
		ref(s.key), ErrProgrammingFailed, len(s.last.terminal), s.last.target, s.generation, b.String())
}

// maxTimedOut is how many of the targets not done the error of a wait that timed out
// names; it counts the others.
const maxTimedOut = 20

// timedOut returns the error for a wait whose timeout passed: per target not done, up to
// maxTimedOut of them, how many nodes are programmed and which are pending.
func timedOut(states []*waitState, timeout time.Duration) error {
	var errs []error
	more := 0
	for _, s := range states {
		if s.done {
			continue
		}
		if len(errs) == maxTimedOut {
			more++
			continue
		}
		key := ref(s.key)
		switch {
		case !s.seen:
			errs = append(errs, fmt.Errorf("%s: %w after %v before nimbus answered", key, ErrWaitTimeout, timeout))
		case s.last.target == 0:
			errs = append(errs, fmt.Errorf("%s: %w after %v: the object targets no nodes (generation %d)",
				key, ErrWaitTimeout, timeout, s.generation))
		default:
			var failing []string
			for _, n := range s.last.failures {
				failing = append(failing, fmt.Sprintf("%s (%s: %s)", n.GetNode(), orDash(n.GetReason()), orDash(oneLine(n.GetMessage()))))
			}
			var tail string
			if names := s.last.pendingNames(); names != "" || len(failing) == 0 {
				tail = "; pending: " + names
			}
			if len(failing) > 0 {
				tail += "; failing, being retried: " + strings.Join(failing, ", ")
				if more := s.last.unlistedFailed(); more > 0 {
					tail += fmt.Sprintf(" and %d more", more)
				}
			}
			var waiting []string
			for _, n := range s.last.waiting {
				waiting = append(waiting, fmt.Sprintf("%s (%s: %s)", n.GetNode(), orDash(n.GetReason()), oneLine(n.GetMessage())))
			}
			if len(waiting) > 0 {
				tail += "; waiting: " + strings.Join(waiting, ", ")
			}
			errs = append(errs, fmt.Errorf("%s: %w after %v: %d/%d nodes programmed (generation %d)%s",
				key, ErrWaitTimeout, timeout, s.last.programmed, s.last.target, s.generation, tail))
		}
	}
	if more > 0 {
		errs = append(errs, fmt.Errorf("and %d more %s %w after %v, not programmed on every target node",
			more, plural(more, "object", "objects"), ErrWaitTimeout, timeout))
	}
	return errors.Join(errs...)
}
