package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// applyCommand returns the apply command.
func (c *cli) applyCommand() *cobra.Command {
	var (
		files  []string
		wait   bool
		o      waitOptions
		dryRun dryRunMode
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE... [--wait [--timeout D] | --dry-run=client|server]",
		Short: "Create or update the objects in manifest files",
		Long: `Create or update the objects in manifest files.

Every object of every file is validated first, and an object may appear only once; if
any is invalid, nothing is applied. The objects are then sent in order, in as few
batches as their size allows (up to 1 MiB each); nimbus applies each batch whole or not
at all. For each object a line says whether it was created, configured (with its new
generation) or unchanged.

With --wait, apply then waits until every applied object, changed or not, is PROGRAMMED
on every target node at the generation apply stored, as the wait command does, and
fails as soon as a node reports a terminal FAILED, or when --timeout passes, naming the
objects (the first 20 of them when it timed out). Made for manifests of thousands of
objects, it shows its progress on stderr in one line, "1200 of 2000 programmed, 2
failing (host-a, host-c)": rewritten in place a few times a second when stderr is a
terminal, printed every 5s when not; an object that FAILED on a node and is being
retried gets a line of its own, once, naming the nodes and their messages. Once every
object is programmed, a last line on stdout says so ("2000 of 2000 programmed on every
target node").

With --dry-run=server, nimbus checks the objects as apply would, field by field and
against the objects it holds and each other (an address or VNI another object holds, an
endpoint outside its network), refuses them as apply would, and otherwise says for each
what apply would do, "route/to-dc2 created (server dry run)"; it stores nothing. With
--dry-run=client, naplesctl only validates the objects, without asking nimbus.`,
		Example: `  naplesctl apply -f route.yaml
  naplesctl apply -f manifests/ -R
  cat route.yaml | naplesctl apply -f -
  naplesctl apply -f route.yaml --wait --timeout 30s
  naplesctl apply -f route.yaml --dry-run=server`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dryRun != dryRunNone {
				if wait {
					return exitstatus.Mark(errors.New("--dry-run does not go with --wait: a dry run stores nothing to wait for"))
				}
				return c.applyDryRun(cmd.Context(), files, dryRun)
			}
			var timeout time.Duration
			if wait {
				var err error
				if timeout, err = o.parseTimeout(); err != nil {
					return err
				}
			} else if cmd.Flags().Changed("timeout") {
				return exitstatus.Mark(errors.New("--timeout needs --wait"))
			}
			return c.apply(cmd.Context(), files, wait, timeout)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, filenameUsage("to apply"))
	c.addRecursiveFlag(cmd)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every object is programmed on every target node")
	o.addTimeoutFlag(cmd, "with --wait")
	addDryRunFlag(cmd, &dryRun)
	_ = cmd.MarkFlagRequired("filename") // cannot fail: the flag exists
	return cmd
}

// apply validates every object of files and, when all are valid and none appears twice,
// applies them in order, in batches; with wait, it then waits for them for up to timeout.
func (c *cli) apply(ctx context.Context, files []string, wait bool, timeout time.Duration) error {
	srcs, err := c.validManifests(files, "nothing applied")
	if err != nil {
		return err
	}

	sess, kit, closeAll, err := c.connectController()
	if err != nil {
		return err
	}
	defer closeAll()
	objs := make([]*nimbusv1.Object, len(srcs))
	for i, s := range srcs {
		objs[i] = s.obj
	}
	targets := make([]waitTarget, 0, len(srcs))
	_, err = kit.ApplyWith(ctx, objs, controller.ApplyOptions{
		// apply needs only the generation of each stored object, so nimbus leaves the
		// objects out of its answer.
		OmitObjects: true,
		// validManifests has validated them, naming each bad field by its file.
		Validated: true,
		Applied: func(first int, results []*nimbusv1.ApplyResponse) error {
			// The lines of a batch go out in one write, not one per object.
			var out bytes.Buffer
			for i, r := range results {
				result, gen := applyResult(r)
				key := srcs[first+i].obj.Key()
				fmt.Fprintf(&out, "%s %s\n", ref(key), result)
				targets = append(targets, waitTarget{key: key, generation: gen})
			}
			if _, err := c.stdout.Write(out.Bytes()); err != nil {
				return fmt.Errorf("writing results: %w", err)
			}
			return nil
		},
	})
	if err != nil {
		return sess.batchFailed("applying", "applied", err,
			func(first, end int) string { return describeSpan(srcs[first:end]) },
			func(i int) string { return fmt.Sprintf("%v: %s", srcs[i], ref(srcs[i].obj.Key())) })
	}
	if !wait {
		return nil
	}
	return c.wait(ctx, sess, targets, timeout, c.bulkProgress())
}

// validManifests reads every object of files, in order, and validates them: when one is
// invalid or appears twice, its error names each bad field by where it was read, after
// "validating objects, " and nothing ("nothing applied").
func (c *cli) validManifests(files []string, nothing string) ([]source, error) {
	srcs, err := c.readManifests(files, false)
	if err != nil {
		return nil, err
	}
	var invalid []error
	for i, err := range validateAll(srcs) {
		if err != nil {
			s := srcs[i]
			for _, fe := range fieldErrors(err) {
				invalid = append(invalid, fmt.Errorf("%v: %s: %w", s, ref(s.obj.Key()), fe))
			}
		}
	}
	keys := make([]*nimbusv1.ObjectKey, len(srcs))
	for i, s := range srcs {
		keys[i] = s.obj.Key()
	}
	invalid = append(invalid, duplicates(keys, "meta.name", func(i int) string { return srcs[i].String() })...)
	if len(invalid) > 0 {
		return nil, fmt.Errorf("validating objects, %s:\n%w", nothing, errors.Join(invalid...))
	}
	return srcs, nil
}

// validateAll returns the error of each object's Validate, by index: the objects are
// validated on every CPU, as a manifest of thousands waits for it before anything is
// sent.
func validateAll(srcs []source) []error {
	errs := make([]error, len(srcs))
	workers := min(runtime.GOMAXPROCS(0), len(srcs))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w * len(srcs) / workers; i < (w+1)*len(srcs)/workers; i++ {
				errs[i] = srcs[i].obj.Validate()
			}
		})
	}
	wg.Wait()
	return errs
}

// applyResult says what an apply did: "created", "configured (generation 2)" or
// "unchanged", and which generation the stored object has.
func applyResult(r *nimbusv1.ApplyResponse) (string, int64) {
	gen := r.GetObject().GetMeta().GetGeneration()
	switch {
	case !r.GetChanged():
		return "unchanged", gen
	case r.GetCreated():
		return "created", gen
	}
	return fmt.Sprintf("configured (generation %d)", gen), gen
}

// duplicates returns an error for every key that appears again after its first place,
// naming both places with where. The error is a *nimbusv1.FieldError for the field that
// holds the name, as the keys come from objects (meta.name) or were given as keys
// (key.name).
func duplicates(keys []*nimbusv1.ObjectKey, field string, where func(i int) string) []error {
	var errs []error
	first := make(map[nimbusv1.Key]int, len(keys))
	for i, k := range keys {
		id := k.Key()
		if j, ok := first[id]; ok {
			fe := &nimbusv1.FieldError{Field: field, Value: k.GetName(),
				Reason: "the same object as " + where(j) + " (an object may appear once)"}
			errs = append(errs, fmt.Errorf("%s: %s: %w", where(i), ref(k), fe))
			continue
		}
		first[id] = i
	}
	return errs
}

// batchFailed returns the error of an apply or delete whose call to nimbus failed: verb
// says what was being done ("applying"), done what the calls before it did ("applied"),
// describe names the entries [first, end) of the failed call, and where names an entry
// refused. It says what is known to be stored: the entries of the calls before, and
// nothing of the refused call when nimbus refused it before looking at the store. An err
// that is no *controller.BatchError of a call is returned as it is.
func (s *session) batchFailed(verb, done string, err error, describe func(first, end int) string, where func(i int) string) error {
	var be *controller.BatchError
	if !errors.As(err, &be) || be.End == 0 {
		return err
	}
	err = s.batchError(be, where)
	var note string
	switch {
	case be.First == 1:
		note = " (the object before them was " + done + ")"
	case be.First > 1:
		note = fmt.Sprintf(" (the %d objects before them were %s)", be.First, done)
	default:
		switch status.Code(err) {
		case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.Unauthenticated, codes.ResourceExhausted:
			note = " (nothing " + done + ")"
		}
	}
	sep := " "
	if strings.Contains(err.Error(), "\n") {
		sep = "\n"
	}
	return fmt.Errorf("%s %s%s:%s%w", verb, describe(be.First, be.End), note, sep, err)
}

// batchError turns the error of a failed batch call into one that reads well, as
// rpcError does, and names the entries nimbus refused, invalid or in conflict with stored
// objects, by where instead of by their position: a line per refused field,
// `routes.yaml: document 3: route/x: spec.prefix "10.0.0.0/33": prefix length out of
// range`. The gRPC status stays reachable with status.FromError.
func (s *session) batchError(be *controller.BatchError, where func(i int) string) error {
	st, ok := status.FromError(be.Err)
	if !ok || len(be.Entries) == 0 || (st.Code() != codes.InvalidArgument && st.Code() != codes.FailedPrecondition) {
		return s.rpcError(be.Err)
	}
	lines := make([]string, 0, len(be.Entries)+1)
	for _, e := range be.Entries {
		lines = append(lines, where(e.Index)+": "+e.Message)
	}
	if be.Omitted > 0 {
		lines = append(lines, fmt.Sprintf("(%d more bad entries not shown)", be.Omitted))
	}
	return &statusError{st: status.New(st.Code(), strings.Join(lines, "\n")), addr: s.addr, tls: s.tls}
}

// describeSpan names where consecutive objects were read: "routes.yaml: document 3",
// "routes.yaml: documents 1 to 5000", "a.yaml: document 2 to b.yaml: document 7".
func describeSpan(srcs []source) string {
	first, last := srcs[0], srcs[len(srcs)-1]
	switch {
	case len(srcs) == 1:
		return first.String()
	case first.file == last.file:
		return fmt.Sprintf("%s: documents %d to %d", first.file, first.doc, last.doc)
	}
	return fmt.Sprintf("%v to %v", first, last)
}
