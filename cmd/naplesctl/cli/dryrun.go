package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/naplesnet/naples/controller"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// dryRunMode is the value of apply's --dry-run: what apply does instead of storing the
// objects. It is a pflag.Value, so that a value that is none of the modes is refused as
// a usage error naming it.
type dryRunMode string

// The modes of --dry-run.
const (
	// dryRunNone applies the objects.
	dryRunNone dryRunMode = "none"
	// dryRunClient validates the objects in naplesctl only, without asking nimbus.
	dryRunClient dryRunMode = "client"
	// dryRunServer has nimbus check the objects as the apply would, against its store
	// and each other, and say what the apply would do, storing nothing.
	dryRunServer dryRunMode = "server"
)

// String returns the mode.
func (m *dryRunMode) String() string { return string(*m) }

// Set sets the mode from the flag's value; its error names the value and the modes.
func (m *dryRunMode) Set(s string) error {
	switch mode := dryRunMode(s); mode {
	case dryRunNone, dryRunClient, dryRunServer:
		*m = mode
		return nil
	}
	return fmt.Errorf("%q: want none, client or server", s)
}

// Type names the flag's values in the help.
func (m *dryRunMode) Type() string { return "none|client|server" }

// addDryRunFlag adds --dry-run to apply, setting mode, which starts at dryRunNone.
func addDryRunFlag(cmd *cobra.Command, mode *dryRunMode) {
	*mode = dryRunNone
	cmd.Flags().Var(mode, "dry-run", "check the objects without storing them: client validates them in naplesctl only; "+
		"server has nimbus check them as apply would, against the objects it holds and each other, and say what apply would do")
}

// applyDryRun checks the objects of files as apply would, in the mode, and prints for
// each what apply would do, without storing anything: "route/to-dc2 created (server dry
// run)". A client dry run only validates them ("route/to-dc2 valid (client dry run)").
func (c *cli) applyDryRun(ctx context.Context, files []string, mode dryRunMode) error {
	srcs, err := c.validManifests(files, "nothing applied")
	if err != nil {
		return err
	}
	if mode == dryRunClient {
		var out bytes.Buffer
		for _, s := range srcs {
			fmt.Fprintf(&out, "%s valid (client dry run)\n", ref(s.obj.Key()))
		}
		_, err := c.stdout.Write(out.Bytes())
		return err
	}
	sess, kit, closeAll, err := c.connectController()
	if err != nil {
		return err
	}
	defer closeAll()
	_, err = c.serverDryRun(ctx, sess, kit, srcs, func(first int, results []*nimbusv1.ApplyResponse) error {
		var out bytes.Buffer
		for i, r := range results {
			fmt.Fprintf(&out, "%s %s\n", ref(srcs[first+i].obj.Key()), dryRunResult(r))
		}
		if _, err := c.stdout.Write(out.Bytes()); err != nil {
			return fmt.Errorf("writing results: %w", err)
		}
		return nil
	})
	return err
}

// serverDryRun has nimbus check the objects of srcs as apply would, without storing
// them, and returns what it answered for each, in order; applied, when set, is called
// with the results of each call (controller.ApplyOptions.Applied). A refusal names the
// objects refused by where they were read, as apply's does.
func (c *cli) serverDryRun(ctx context.Context, sess *session, kit *controller.Client, srcs []source,
	applied func(first int, results []*nimbusv1.ApplyResponse) error) ([]*nimbusv1.ApplyResponse, error) {
	objs := make([]*nimbusv1.Object, len(srcs))
	for i, s := range srcs {
		objs[i] = s.obj
	}
	results, err := kit.ApplyWith(ctx, objs, controller.ApplyOptions{DryRun: true, Applied: applied})
	if err == nil {
		return results, nil
	}
	var be *controller.BatchError
	if !errors.As(err, &be) || be.End == 0 {
		return nil, err
	}
	err = sess.batchError(be, func(i int) string { return fmt.Sprintf("%v: %s", srcs[i], ref(srcs[i].obj.Key())) })
	sep := " "
	if strings.Contains(err.Error(), "\n") {
		sep = "\n"
	}
	return nil, fmt.Errorf("server dry run of %s (nothing applied):%s%w", describeSpan(srcs[be.First:be.End]), sep, err)
}

// dryRunResult says what an apply would do, as applyResult says what it did:
// "created (server dry run)", "configured (generation 3, server dry run)" or
// "unchanged (server dry run)".
func dryRunResult(r *nimbusv1.ApplyResponse) string {
	switch {
	case !r.GetChanged():
		return "unchanged (server dry run)"
	case r.GetCreated():
		return "created (server dry run)"
	}
	return fmt.Sprintf("configured (generation %d, server dry run)", r.GetObject().GetMeta().GetGeneration())
}
