package naplesctl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Defaults of waiting.
const (
	// defaultWaitTimeout is the default of --timeout.
	defaultWaitTimeout = "60s"
	// defaultPoll is how often a wait asks nimbus how far an object has come.
	defaultPoll = 200 * time.Millisecond
)

// waitOptions are the flags of wait and of apply --wait.
type waitOptions struct {
	// timeout is the --timeout flag as given.
	timeout string
}

// addTimeoutFlag adds --timeout to cmd.
func (o *waitOptions) addTimeoutFlag(cmd *cobra.Command, what string) {
	cmd.Flags().StringVar(&o.timeout, "timeout", defaultWaitTimeout,
		"how long to wait "+what+", a duration such as 30s or 2m")
}

// parseTimeout returns the --timeout duration; its error names the flag and the value.
func (o *waitOptions) parseTimeout() (time.Duration, error) {
	d, err := time.ParseDuration(o.timeout)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--timeout %q: want a positive duration such as 30s or 2m", o.timeout)
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
says so. wait exits 0 once every object is; it fails as soon as a target node reports
FAILED, with that node's reason and message, and when --timeout passes, naming the
nodes still pending.`,
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
			var targets []waitTarget
			for _, name := range args[1:] {
				targets = append(targets, waitTarget{key: nimbusv1.NewKey(kind, tenant, namespace, name)})
			}
			sess, err := c.connect()
			if err != nil {
				return err
			}
			defer sess.Close()
			return c.wait(cmd.Context(), sess, targets, timeout)
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
	// line is the last progress line printed.
	line string
	// last is the last propagation read.
	last propagation
	done bool
}

// wait polls nimbus until every target is PROGRAMMED on all its target nodes at its
// generation or later, printing a progress line to stderr whenever one changes and a line
// to stdout when a target is done. It returns an error wrapping ErrProgrammingFailed as
// soon as a target node reports FAILED at that generation, and one wrapping ErrWaitTimeout
// that names the pending nodes when timeout passes first.
func (c *cli) wait(ctx context.Context, sess *session, targets []waitTarget, timeout time.Duration) error {
	pollCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ticker := time.NewTicker(cmp.Or(c.poll, defaultPoll))
	defer ticker.Stop()
	states := make([]*waitState, len(targets))
	for i, t := range targets {
		states[i] = &waitState{waitTarget: t}
	}
	for {
		var failed []error
		for _, s := range states {
			if s.done {
				continue
			}
			if err := c.check(pollCtx, sess, s); err != nil {
				if ctx.Err() == nil && pollCtx.Err() != nil {
					return timedOut(states, timeout)
				}
				return err
			}
			if len(s.last.failures) > 0 {
				failed = append(failed, failure(s))
			}
		}
		if len(failed) > 0 {
			return errors.Join(failed...)
		}
		if allDone(states) {
			return nil
		}
		select {
		case <-pollCtx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("waiting: %w", ctx.Err())
			}
			return timedOut(states, timeout)
		case <-ticker.C:
		}
	}
}

// check reads how far the target of s has come and prints what changed.
func (c *cli) check(ctx context.Context, sess *session, s *waitState) error {
	item, err := sess.get(ctx, s.key)
	if errors.Is(err, ErrNotFound) {
		return fmt.Errorf("waiting for %s: %w: it was deleted", ref(s.key), err)
	}
	if err != nil {
		return fmt.Errorf("waiting: %w", err)
	}
	if s.generation == 0 {
		s.generation = item.GetObject().GetMeta().GetGeneration()
	}
	s.last = propagationOf(item, s.generation)
	if line := s.last.progress(s.key); line != s.line {
		fmt.Fprintln(c.stderr, line)
		s.line = line
	}
	if s.last.done() && len(s.last.failures) == 0 {
		s.done = true
		fmt.Fprintf(c.stdout, "%s programmed on %d/%d nodes (generation %d)\n",
			ref(s.key), s.last.programmed, s.last.target, s.generation)
	}
	return nil
}

// progress is the progress line of an object: "route/to-dc2: 3/4 nodes programmed
// (generation 2)".
func (p propagation) progress(key *nimbusv1.ObjectKey) string {
	return fmt.Sprintf("%s: %d/%d nodes programmed (generation %d)", ref(key), p.programmed, p.target, p.generation)
}

// allDone reports whether every wait is done.
func allDone(states []*waitState) bool {
	for _, s := range states {
		if !s.done {
			return false
		}
	}
	return true
}

// failure returns the error for a target that a node reported FAILED, one line per
// failed node: "node host-b: KernelError: <message>".
func failure(s *waitState) error {
	var b strings.Builder
	for _, n := range s.last.failures {
		b.WriteString("\n  node " + n.GetNode() + ": ")
		if r := n.GetReason(); r != "" {
			b.WriteString(r + ": ")
		}
		b.WriteString(orDash(oneLine(n.GetMessage())))
	}
	return fmt.Errorf("%s: %w on %d of %d nodes (generation %d):%s",
		ref(s.key), ErrProgrammingFailed, len(s.last.failures), s.last.target, s.generation, b.String())
}

// timedOut returns the error for a wait whose timeout passed: per target not done, how
// many nodes are programmed and which are pending.
func timedOut(states []*waitState, timeout time.Duration) error {
	var errs []error
	for _, s := range states {
		if s.done {
			continue
		}
		key := ref(s.key)
		switch {
		case s.line == "":
			errs = append(errs, fmt.Errorf("%s: %w after %v before nimbus answered", key, ErrWaitTimeout, timeout))
		case s.last.target == 0:
			errs = append(errs, fmt.Errorf("%s: %w after %v: the object targets no nodes (generation %d)",
				key, ErrWaitTimeout, timeout, s.generation))
		default:
			errs = append(errs, fmt.Errorf("%s: %w after %v: %d/%d nodes programmed (generation %d); pending: %s",
				key, ErrWaitTimeout, timeout, s.last.programmed, s.last.target, s.generation, s.last.pendingNames()))
		}
	}
	return errors.Join(errs...)
}
