package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/exitstatus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Sizes of the batches apply and delete send.
const (
	// maxBatchBytes bounds what one ApplyBatch or DeleteBatch call carries, counted as
	// the encoded objects or keys plus applyEntryOverhead or deleteEntryOverhead each: a
	// quarter of the 16 MiB nimbus accepts, so that nimbus commits, and the agents start
	// on, the first objects of a large manifest while the next are on their way. (apply
	// asks nimbus to leave the stored objects out of its answer, which is then small.)
	maxBatchBytes = 4 << 20
	// applyEntryOverhead bounds what one object adds to an ApplyBatch call beyond its
	// encoded size: the framing of the request, and in the answer the uid, generation,
	// revision, times, defaulted tenant and namespace and the result's flags (about 130
	// bytes).
	applyEntryOverhead = 256
	// deleteEntryOverhead bounds what one key adds to a DeleteBatch call beyond its
	// encoded size: the framing of the request and its result in the answer.
	deleteEntryOverhead = 32
	// maxBatchResponse is the receive limit of a batch call: a margin above what
	// maxBatchBytes lets an answer be.
	maxBatchResponse = 16 << 20
)

// applyCommand returns the apply command.
func (c *cli) applyCommand() *cobra.Command {
	var (
		files []string
		wait  bool
		o     waitOptions
	)
	cmd := &cobra.Command{
		Use:   "apply -f FILE... [--wait [--timeout D]]",
		Short: "Create or update the objects in manifest files",
		Long: `Create or update the objects in manifest files.

Every object of every file is validated first, and an object may appear only once; if
any is invalid, nothing is applied. The objects are then sent in order, in as few
batches as their size allows (up to 4 MiB each); nimbus applies each batch whole or not
at all. For each object a line says whether it was created, configured (with its new
generation) or unchanged.

With --wait, apply then waits until every applied object, changed or not, is PROGRAMMED
on every target node at the generation apply stored, as the wait command does: a line
on stderr shows each change of progress, and apply fails as soon as a node reports
FAILED, or when --timeout passes.`,
		Example: `  naplesctl apply -f route.yaml
  cat route.yaml | naplesctl apply -f -
  naplesctl apply -f route.yaml --wait --timeout 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, `manifest file to apply, "-" for stdin; repeatable`)
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until every object is programmed on every target node")
	o.addTimeoutFlag(cmd, "with --wait")
	_ = cmd.MarkFlagRequired("filename") // cannot fail: the flag exists
	return cmd
}

// apply validates every object of files and, when all are valid and none appears twice,
// applies them in order, in batches; with wait, it then waits for them for up to timeout.
func (c *cli) apply(ctx context.Context, files []string, wait bool, timeout time.Duration) error {
	srcs, err := c.readManifests(files)
	if err != nil {
		return err
	}
	var invalid []error
	for _, s := range srcs {
		if err := s.obj.Validate(); err != nil {
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
		return fmt.Errorf("validating objects, nothing applied:\n%w", errors.Join(invalid...))
	}

	sess, err := c.connect()
	if err != nil {
		return err
	}
	defer sess.Close()
	targets := make([]waitTarget, 0, len(srcs))
	for _, sp := range batches(len(srcs), func(i int) int { return proto.Size(srcs[i].obj) + applyEntryOverhead }) {
		part := srcs[sp.start:sp.end]
		results, err := sess.applyBatch(ctx, part)
		if err != nil {
			return batchFailed("applying", "applied", describeSpan(part), sp, err)
		}
		// The lines of a batch go out in one write, not one per object.
		var out bytes.Buffer
		for i, r := range results {
			result, gen := applyResult(r)
			key := part[i].obj.Key()
			fmt.Fprintf(&out, "%s %s\n", ref(key), result)
			targets = append(targets, waitTarget{key: key, generation: gen})
		}
		if _, err := c.stdout.Write(out.Bytes()); err != nil {
			return fmt.Errorf("writing results: %w", err)
		}
	}
	if !wait {
		return nil
	}
	return c.wait(ctx, sess, targets, timeout)
}

// applyBatch applies the objects of srcs in one ApplyBatch call and returns the results
// in their order. A refusal of an invalid object names its document.
func (s *session) applyBatch(ctx context.Context, srcs []source) ([]*nimbusv1.ApplyResponse, error) {
	// apply needs only the generation of each stored object, so nimbus leaves the objects
	// out of its answer.
	req := &nimbusv1.ApplyBatchRequest{Objects: make([]*nimbusv1.Object, len(srcs)), OmitObjects: true}
	for i, src := range srcs {
		req.Objects[i] = src.obj
	}
	resp, err := s.nimbus.ApplyBatch(ctx, req, grpc.MaxCallRecvMsgSize(maxBatchResponse))
	if err != nil {
		return nil, s.batchError(err, "objects", func(i int) string {
			return fmt.Sprintf("%v: %s", srcs[i], ref(srcs[i].obj.Key()))
		})
	}
	if n := len(resp.GetResults()); n != len(srcs) {
		return nil, fmt.Errorf("nimbus answered %d results for %d objects", n, len(srcs))
	}
	return resp.GetResults(), nil
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
	first := make(map[string]int, len(keys))
	for i, k := range keys {
		id := k.ID()
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

// span is the entries start to end, end excluded, that one batch call carries.
type span struct{ start, end int }

// batches splits n entries, whose cost in bytes cost tells, into consecutive spans that
// each cost at most maxBatchBytes. An entry too large for a batch of its own goes alone,
// and nimbus decides.
func batches(n int, cost func(i int) int) []span {
	var out []span
	start, bytes := 0, 0
	for i := range n {
		b := cost(i)
		if i > start && bytes+b > maxBatchBytes {
			out = append(out, span{start, i})
			start, bytes = i, 0
		}
		bytes += b
	}
	if n > start {
		out = append(out, span{start, n})
	}
	return out
}

// entryLine matches the start of a line of nimbus's refusal of a batch: the entry's
// position in the call, and its key, as in `objects[3] (Route/default/default/x): `.
var entryLine = regexp.MustCompile(`^(objects|keys)\[(\d+)\](?: \([^)]*\))?: `)

// batchError turns the error of a batch call into one that reads well, as rpcError does,
// and names the entries of a refusal by where names them instead of by their position in
// the call. The gRPC status stays reachable with status.FromError.
func (s *session) batchError(err error, field string, where func(i int) string) error {
	st, ok := status.FromError(err)
	// Invalid entries, and entries that conflict with stored objects, are named by
	// position.
	if !ok || (st.Code() != codes.InvalidArgument && st.Code() != codes.FailedPrecondition) {
		return s.rpcError(err)
	}
	lines := strings.Split(st.Message(), "\n")
	for n, l := range lines {
		m := entryLine.FindStringSubmatchIndex(l)
		if m == nil || l[m[2]:m[3]] != field {
			continue
		}
		if i, err := strconv.Atoi(l[m[4]:m[5]]); err == nil {
			lines[n] = where(i) + ": " + l[m[1]:]
		}
	}
	return &statusError{st: status.New(st.Code(), strings.Join(lines, "\n")), addr: s.addr}
}

// batchFailed returns the error of the batch call for the span sp, whose entries what
// names: verb says what was being done ("applying"), done what the calls before it did
// ("applied"). It says what is known to be stored: the entries of the calls before, and
// nothing of the refused call when nimbus refused it before looking at the store.
func batchFailed(verb, done, what string, sp span, err error) error {
	var note string
	switch {
	case sp.start == 1:
		note = " (the object before them was " + done + ")"
	case sp.start > 1:
		note = fmt.Sprintf(" (the %d objects before them were %s)", sp.start, done)
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
	return fmt.Errorf("%s %s%s:%s%w", verb, what, note, sep, err)
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
