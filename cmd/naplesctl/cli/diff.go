package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/exitstatus"
	"github.com/naplesnet/naples/internal/manifest"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// ErrDiffers is returned by diff when applying the manifests would change an object in
// nimbus. The command has printed the differences: naplesctl exits with status 1 and
// prints nothing more, as diff(1) and kubectl diff do.
var ErrDiffers = errors.New("the manifests differ from what nimbus holds")

// diffContext is how many unchanged lines diff shows around each change, as diff -u.
const diffContext = 3

// diffCommand returns the diff command.
func (c *cli) diffCommand() *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "diff -f FILE...",
		Short: "Show what applying manifest files would change in nimbus",
		Long: `Show what applying manifest files would change in nimbus, object by object, as a
unified diff (diff -u) of the YAML manifest of what nimbus holds ("live") and of what
apply would store ("merged"): kind, meta and spec, without status, generation, revision,
uid or times. nimbus works out what apply would store with a server dry run (apply
--dry-run=server), which also checks the objects against the ones it holds and each
other, and stores nothing. A new object shows as all added; an object apply would leave
unchanged shows nothing.

Exit status: 0 when apply would change nothing, 1 when it would change something, 2 when
the diff could not be made (a bad manifest, an object nimbus would refuse, nimbus out of
reach), as kubectl diff.`,
		Example: `  naplesctl diff -f overlay.yaml
  naplesctl diff -R -f manifests/
  naplesctl diff -f overlay.yaml && echo "nothing to apply"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := c.diff(cmd.Context(), files)
			if err == nil || errors.Is(err, ErrDiffers) {
				return err
			}
			// Any failure exits 2, to tell it from a difference.
			return exitstatus.Mark(err)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, filenameUsage("to compare"))
	c.addRecursiveFlag(cmd)
	_ = cmd.MarkFlagRequired("filename") // cannot fail: the flag exists
	return cmd
}

// diff prints, for each object of files that apply would change, the unified diff of
// what nimbus holds and what apply would store, and returns ErrDiffers when it printed
// any.
func (c *cli) diff(ctx context.Context, files []string) error {
	srcs, err := c.validManifests(files, "nothing compared")
	if err != nil {
		return err
	}
	sess, kit, closeAll, err := c.connectController()
	if err != nil {
		return err
	}
	defer closeAll()
	results, err := c.serverDryRun(ctx, sess, kit, srcs, nil)
	if err != nil {
		return err
	}
	lives, err := liveObjects(ctx, sess, srcs, results)
	if err != nil {
		return err
	}
	differs := false
	var out bytes.Buffer
	for i, r := range results {
		if !r.GetChanged() {
			continue
		}
		key := srcs[i].obj.Key()
		a, err := diffLines(lives[i])
		if err != nil {
			return err
		}
		b, err := diffLines(r.GetObject())
		if err != nil {
			return err
		}
		name := kindArg(key.GetKind()) + "/" + key.Defaulted().GetTenant() + "/" + key.Defaulted().GetNamespace() + "/" + key.GetName()
		hunks := unifiedDiff(a, b, diffContext)
		if hunks == "" {
			// A change of what the manifest shape leaves out; none is known.
			continue
		}
		differs = true
		fmt.Fprintf(&out, "diff -u -N live/%s merged/%s\n--- live/%s\n+++ merged/%s\n%s", name, name, name, name, hunks)
		if out.Len() >= 64<<10 {
			if _, err := c.stdout.Write(out.Bytes()); err != nil {
				return fmt.Errorf("writing the diff: %w", err)
			}
			out.Reset()
		}
	}
	if _, err := c.stdout.Write(out.Bytes()); err != nil {
		return fmt.Errorf("writing the diff: %w", err)
	}
	if differs {
		return ErrDiffers
	}
	return nil
}

// diffGets is how many Gets diff has in flight at once.
const diffGets = 8

// liveObjects returns, by the index of results, the objects nimbus holds that the dry
// run's results say apply would change (nil for those it would create, and for those
// deleted since), asked for diffGets at a time: one Get after the other made the diff
// of a bulk manifest wait a round trip per object. Its error is the first failed Get's
// in manifest order.
func liveObjects(ctx context.Context, sess *session, srcs []source, results []*nimbusv1.ApplyResponse) ([]*nimbusv1.Object, error) {
	lives := make([]*nimbusv1.Object, len(results))
	errs := make([]error, len(results))
	cancelled := make([]bool, len(results))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slots := make(chan struct{}, diffGets)
	var wg sync.WaitGroup
	for i, r := range results {
		if !r.GetChanged() || r.GetCreated() {
			continue
		}
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			key := srcs[i].obj.Key()
			resp, err := sess.nimbus.Get(ctx, &nimbusv1.GetRequest{Key: key})
			switch {
			case status.Code(err) == codes.NotFound:
				// Deleted since the dry run: it would be created.
			case err != nil:
				errs[i] = fmt.Errorf("getting %s: %w", ref(key), sess.rpcError(err))
				cancelled[i] = status.Code(err) == codes.Canceled
				cancel()
			default:
				lives[i] = resp.GetItem().GetObject()
			}
		})
	}
	wg.Wait()
	// A Get the first failure cancelled does not hide it.
	var first error
	firstCancelled := false
	for i, err := range errs {
		if err != nil && (first == nil || firstCancelled && !cancelled[i]) {
			first, firstCancelled = err, cancelled[i]
		}
	}
	if first != nil {
		return nil, first
	}
	return lives, nil
}

// diffLines returns the lines of the YAML manifest of obj as diff compares it: kind,
// meta and spec, without what nimbus assigns (uid, generation, revision, generation
// revision, times). A nil obj, an object nimbus does not hold, has none.
func diffLines(obj *nimbusv1.Object) ([]string, error) {
	if obj == nil {
		return nil, nil
	}
	obj = proto.Clone(obj).(*nimbusv1.Object)
	if m := obj.GetMeta(); m != nil {
		m.Uid, m.Generation, m.Revision, m.GenerationRevision = "", 0, 0, 0
		m.CreateTime, m.UpdateTime = nil, nil
	}
	var buf bytes.Buffer
	if err := manifest.Encode(&buf, manifest.YAML, obj, nil); err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n"), nil
}
