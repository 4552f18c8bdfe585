package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// batchCalls counts the ApplyBatch and DeleteBatch calls a client makes and the largest
// request of each.
type batchCalls struct {
	mu      sync.Mutex
	calls   map[string]int
	largest map[string]int
	entries map[string]int
}

func (b *batchCalls) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	b.mu.Lock()
	name := method[strings.LastIndex(method, "/")+1:]
	b.calls[name]++
	b.largest[name] = max(b.largest[name], proto.Size(req.(proto.Message)))
	switch r := req.(type) {
	case *nimbusv1.ApplyBatchRequest:
		b.entries[name] += len(r.GetObjects())
	case *nimbusv1.DeleteBatchRequest:
		b.entries[name] += len(r.GetKeys())
	}
	b.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

func TestApplyAndDeleteInChunks(t *testing.T) {
	const (
		objects  = 300
		maxBytes = 4 << 10
	)
	socket := socketPath(t)
	serve(t, socket, "")
	calls := &batchCalls{calls: map[string]int{}, largest: map[string]int{}, entries: map[string]int{}}
	c := newClient(t, socket, Options{
		MaxBatchBytes: maxBytes,
		DialOptions:   []grpc.DialOption{grpc.WithChainUnaryInterceptor(calls.intercept)},
	})
	ctx := testContext(t)
	var objs []*nimbusv1.Object
	var keys []*nimbusv1.ObjectKey
	for i := range objects {
		objs = append(objs, route(fmt.Sprintf("r%03d", i), "192.0.2.1", "host-a"))
		keys = append(keys, routeKey(fmt.Sprintf("r%03d", i)))
	}

	results, err := c.Apply(ctx, objs...)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	if len(results) != objects {
		t.Fatalf("Apply returned %d results, want %d", len(results), objects)
	}
	for i, r := range results {
		if !r.GetCreated() || r.GetObject().GetMeta().GetName() != objs[i].GetMeta().GetName() || r.GetObject().GetMeta().GetGeneration() != 1 {
			t.Fatalf("result %d = created %v %s generation %d; want objects[%d] created at generation 1",
				i, r.GetCreated(), r.GetObject().GetMeta().GetName(), r.GetObject().GetMeta().GetGeneration(), i)
		}
	}
	if calls.calls["ApplyBatch"] < 2 || calls.entries["ApplyBatch"] != objects || calls.largest["ApplyBatch"] > maxBytes {
		t.Fatalf("ApplyBatch calls %d carrying %d objects, the largest %d bytes; want several of at most %d bytes carrying %d",
			calls.calls["ApplyBatch"], calls.entries["ApplyBatch"], calls.largest["ApplyBatch"], maxBytes, objects)
	}
	list, err := nimbusv1.ListAll(ctx, rawClient(t, socket), &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, it := range list.GetItems() {
		names = append(names, it.GetObject().GetMeta().GetName())
	}
	if len(names) != objects || names[0] != "r000" || names[objects-1] != fmt.Sprintf("r%03d", objects-1) {
		t.Fatalf("nimbus holds %d routes (%q...), want all %d", len(names), names[:min(3, len(names))], objects)
	}

	// Applying the same again changes nothing.
	results, err = c.Apply(ctx, objs...)
	if err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if slices.ContainsFunc(results, (*nimbusv1.ApplyResponse).GetChanged) {
		t.Errorf("applying the same objects again changed some")
	}

	// Deleted hears of each call's results in order, the calls one after the other.
	next := 0
	deleted, err := c.DeleteWith(ctx, keys, DeleteOptions{Deleted: func(first int, results []*nimbusv1.DeleteResponse) error {
		if first != next || len(results) == 0 {
			t.Errorf("Deleted(%d, %d results), want the results from %d", first, len(results), next)
		}
		next = first + len(results)
		return nil
	}})
	if err != nil {
		t.Fatalf("DeleteWith: %v", err)
	}
	if next != objects {
		t.Errorf("Deleted heard of %d keys, want %d", next, objects)
	}
	if len(deleted) != objects || slices.ContainsFunc(deleted, func(r *nimbusv1.DeleteResponse) bool { return !r.GetFound() }) {
		t.Fatalf("Delete returned %d results, not all found; want %d found", len(deleted), objects)
	}
	if calls.calls["DeleteBatch"] < 2 || calls.entries["DeleteBatch"] != objects || calls.largest["DeleteBatch"] > maxBytes {
		t.Fatalf("DeleteBatch calls %d carrying %d keys, the largest %d bytes; want several of at most %d bytes carrying %d",
			calls.calls["DeleteBatch"], calls.entries["DeleteBatch"], calls.largest["DeleteBatch"], maxBytes, objects)
	}
	list, err = nimbusv1.ListAll(ctx, rawClient(t, socket), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 0 {
		t.Fatalf("nimbus holds %d objects after Delete, want none", len(list.GetItems()))
	}
	// Deleting what is gone succeeds, found false.
	deleted, err = c.Delete(ctx, keys[:3]...)
	if err != nil || len(deleted) != 3 || deleted[0].GetFound() {
		t.Fatalf("deleting again: %v found %v; want 3 results, not found", err, deleted)
	}
}

func TestApplyRefusesBadObjectsWhole(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{MaxBatchBytes: 512})
	bad := route("r2", "192.0.2.1")
	bad.GetRoute().Prefix = "10.0.0.0/33"
	_, err := c.Apply(testContext(t), route("r1", "192.0.2.1"), bad, route("r3", "192.0.2.1"), route("r1", "192.0.2.9"))
	if !errors.Is(err, nimbusv1.ErrInvalid) {
		t.Fatalf("Apply of a bad object: %v, want an error wrapping nimbusv1.ErrInvalid", err)
	}
	for _, want := range []string{`objects[1] (Route/default/default/r2): spec.prefix "10.0.0.0/33"`, "objects[3] (Route/default/default/r1): the key of objects[0] again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	wantEntries(t, err, 0, 0, 0, BatchEntry{1, "spec.prefix", `spec.prefix "10.0.0.0/33": prefix length out of range`},
		BatchEntry{3, "", "the key of objects[0] again: invalid object"})
	list, err := nimbusv1.ListAll(testContext(t), rawClient(t, socket), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 0 {
		t.Fatalf("nimbus holds %d objects after a refused Apply, want none", len(list.GetItems()))
	}
	// A nil object is as invalid as a bad field.
	_, err = c.Apply(testContext(t), route("r1", "192.0.2.1"), nil)
	if !errors.Is(err, nimbusv1.ErrInvalid) || !strings.Contains(err.Error(), `objects[1]: object "": is required`) {
		t.Errorf("Apply of a nil object: %v, want an error wrapping nimbusv1.ErrInvalid that names objects[1]", err)
	}
	wantEntries(t, err, 0, 0, 0, BatchEntry{1, "", `object "": is required`})
	// So is a bad key.
	_, err = c.Delete(testContext(t), routeKey("r1"), routeKey("R 1"))
	if !errors.Is(err, nimbusv1.ErrInvalid) {
		t.Errorf("Delete of a bad key: %v, want an error wrapping nimbusv1.ErrInvalid", err)
	}
	wantEntries(t, err, 0, 0, 0, BatchEntry{1, "name", `key.name "R 1": must be lower-case letters, digits, '-' and '.', at most 253 characters`})
}

// TestApplyValidatedLeavesChecksToNimbus checks that ApplyOptions.Validated skips the
// client's validation and nothing else: an invalid object then reaches nimbus, which
// refuses its call whole and names it, and a key given twice is still refused first.
func TestApplyValidatedLeavesChecksToNimbus(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	bad := route("r2", "192.0.2.1")
	bad.GetRoute().Prefix = "10.0.0.0/33"
	var calls int
	_, err := c.ApplyWith(testContext(t), []*nimbusv1.Object{route("r1", "192.0.2.1"), bad}, ApplyOptions{Validated: true,
		Applied: func(int, []*nimbusv1.ApplyResponse) error { calls++; return nil }})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), `spec.prefix "10.0.0.0/33"`) || calls != 0 {
		t.Fatalf("ApplyWith(Validated) of a bad object: %v (code %v) after %d calls answered; want nimbus's refusal of the call (InvalidArgument) naming spec.prefix",
			err, status.Code(err), calls)
	}
	wantEntries(t, err, 0, 2, 0, BatchEntry{1, "spec.prefix", `spec.prefix "10.0.0.0/33": prefix length out of range`})
	_, err = c.ApplyWith(testContext(t), []*nimbusv1.Object{route("r1", "192.0.2.1"), route("r1", "192.0.2.9")}, ApplyOptions{Validated: true})
	wantEntries(t, err, 0, 0, 0, BatchEntry{1, "", "the key of objects[0] again: invalid object"})
	list, err := nimbusv1.ListAll(testContext(t), rawClient(t, socket), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 0 {
		t.Fatalf("nimbus holds %d objects after refused applies, want none", len(list.GetItems()))
	}
}

// wantEntries fails the test unless err is a *BatchError of the call carrying entries
// [first, end), with the entries and omitting as many.
func wantEntries(t *testing.T, err error, first, end, omitted int, entries ...BatchEntry) *BatchError {
	t.Helper()
	var be *BatchError
	if !errors.As(err, &be) {
		t.Fatalf("error %v is not a *BatchError", err)
	}
	if be.First != first || be.End != end || be.Omitted != omitted || fmt.Sprint(be.Entries) != fmt.Sprint(entries) {
		t.Fatalf("BatchError of entries [%d:%d] omitting %d: %+v; want [%d:%d] omitting %d: %+v",
			be.First, be.End, be.Omitted, be.Entries, first, end, omitted, entries)
	}
	return be
}

// TestApplyNamesEntriesNimbusRefused checks that the entries nimbus refuses are named by
// their index in the objects applied, in a later call too, with the call's status.
func TestApplyNamesEntriesNimbusRefused(t *testing.T) {
	const objects, limit = 40, 512
	socket := socketPath(t)
	serveWith(t, socket, nimbus.Options{Limits: nimbus.Limits{ObjectBytes: limit}})
	c := newClient(t, socket, Options{MaxBatchBytes: 4 << 10})
	var objs []*nimbusv1.Object
	for i := range objects {
		objs = append(objs, route(fmt.Sprintf("r%03d", i), "192.0.2.1"))
	}
	// overLimit makes an object larger than nimbus takes, which Apply does not know.
	overLimit := func(o *nimbusv1.Object) { o.Meta.Labels = map[string]string{"pad": strings.Repeat("x", limit)} }
	refusal := func(i int) string {
		return fmt.Sprintf("object Route/default/default/r%03d: %d bytes, over the limit of %d bytes (nimbus --max-object-bytes)", i, objs[i].SizeVT(), limit)
	}
	overLimit(objs[30])
	var calls [][2]int
	results, err := c.ApplyWith(testContext(t), objs, ApplyOptions{OmitObjects: true, Applied: func(first int, results []*nimbusv1.ApplyResponse) error {
		calls = append(calls, [2]int{first, first + len(results)})
		return nil
	}})
	var be *BatchError
	if !errors.As(err, &be) || be.First == 0 || be.First > 30 || be.End <= 30 || len(results) != be.First || len(calls) == 0 || calls[len(calls)-1][1] != be.First {
		t.Fatalf("ApplyWith = %d results, calls %v, %v; want the results of the calls before the refused one and a *BatchError", len(results), calls, err)
	}
	wantEntries(t, err, be.First, be.End, 0, BatchEntry{Index: 30, Message: refusal(30)})
	if status.Code(err) != codes.InvalidArgument || !errors.Is(err, nimbusv1.ErrInvalid) {
		t.Errorf("status.Code(%v) = %v, want InvalidArgument, matching nimbusv1.ErrInvalid", err, status.Code(err))
	}
	if m := results[0].GetObject().GetMeta(); m.GetGeneration() != 1 || m.GetName() != "" {
		t.Errorf("result 0 = %v, want the generation alone (OmitObjects)", results[0])
	}

	// nimbus names a few of many bad entries, and counts the rest.
	for _, o := range objs[20:] {
		overLimit(o)
	}
	_, err = newClient(t, socket, Options{}).Apply(testContext(t), objs[:35]...)
	var want []BatchEntry
	for i := 20; i < 30; i++ {
		want = append(want, BatchEntry{Index: i, Message: refusal(i)})
	}
	wantEntries(t, err, 0, 35, 5, want...)
}

// TestApplyStopsWhenAppliedFails checks that an error of ApplyOptions.Applied ends the
// apply after the call it was told of.
func TestApplyStopsWhenAppliedFails(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{MaxBatchBytes: 4 << 10})
	var objs []*nimbusv1.Object
	for i := range 100 {
		objs = append(objs, route(fmt.Sprintf("r%03d", i), "192.0.2.1"))
	}
	errStop := errors.New("stop")
	calls := 0
	results, err := c.ApplyWith(testContext(t), objs, ApplyOptions{Applied: func(int, []*nimbusv1.ApplyResponse) error {
		calls++
		return errStop
	}})
	if err != errStop || calls != 1 || len(results) == 0 || len(results) == len(objs) {
		t.Fatalf("ApplyWith = %d results after %d calls, %v; want the first call's results and the callback's error", len(results), calls, err)
	}
	list, err := nimbusv1.ListAll(testContext(t), rawClient(t, socket), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != len(results) {
		t.Errorf("nimbus holds %d objects, want the %d of the first call", len(list.GetItems()), len(results))
	}
}

func TestChunks(t *testing.T) {
	for _, tt := range []struct {
		sizes []int
		// first is the bound of the first chunk; 0 stands for max.
		first, max int
		want       [][2]int
	}{
		{nil, 0, 100, nil},
		{[]int{10, 10, 10}, 0, 100, [][2]int{{0, 3}}},
		// Each entry takes 12 bytes with its tag and length.
		{[]int{10, 10, 10}, 0, 24, [][2]int{{0, 2}, {2, 3}}},
		{[]int{10, 10, 10}, 0, 23, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		// Too large for any chunk: alone.
		{[]int{10, 500, 10}, 0, 100, [][2]int{{0, 1}, {1, 2}, {2, 3}}},
		// Bounds rising from 12: 12, 24, 48, then 50.
		{[]int{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, 12, 50, [][2]int{{0, 1}, {1, 3}, {3, 7}, {7, 11}, {11, 12}}},
	} {
		first := tt.first
		if first == 0 {
			first = tt.max
		}
		var got [][2]int
		for lo, hi := range chunks(len(tt.sizes), func(i int) int { return tt.sizes[i] }, first, tt.max) {
			got = append(got, [2]int{lo, hi})
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("chunks(%v, %d, %d) = %v, want %v", tt.sizes, first, tt.max, got, tt.want)
		}
	}
}

func TestNewRefusesBadOptions(t *testing.T) {
	for _, opts := range []Options{
		{},
		{Address: "http://nimbus"},
		{Address: "unix:///run/n.sock", MaxBatchBytes: -1},
		{Address: "unix:///run/n.sock", MinBackoff: 10, MaxBackoff: 5},
	} {
		if _, err := New(opts); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New(%+v) = %v, want ErrInvalidOptions", opts, err)
		}
	}
}

func TestCloseEndsWatchAndCalls(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	done := make(chan error, 1)
	synced := make(chan struct{})
	go func() {
		done <- c.WatchStatus(context.Background(), Filter{}, ReactorFuncs{Synced: func() { close(synced) }})
	}()
	<-synced
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Fatalf("WatchStatus after Close = %v, want ErrClosed", err)
	}
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Apply after Close = %v, want ErrClosed", err)
	}
}

// TestListPages lists a kind of large objects whole, though it takes several pages of
// nimbus's List.
func TestListPages(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	var objs []*nimbusv1.Object
	for i := range 10 {
		o := route(fmt.Sprintf("r%d", i), "192.0.2.1")
		o.Meta.Labels = map[string]string{"pad": strings.Repeat("x", nimbus.DefaultObjectBytes-200)}
		objs = append(objs, o)
	}
	if _, err := c.Apply(testContext(t), objs...); err != nil {
		t.Fatal(err)
	}
	items, err := c.List(testContext(t), Filter{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(items) != len(objs) {
		t.Fatalf("listed %d routes, want %d", len(items), len(objs))
	}
	for i, it := range items {
		if got, want := it.GetObject().GetMeta().GetName(), objs[i].GetMeta().GetName(); got != want {
			t.Errorf("item %d is %s, want %s", i, got, want)
		}
	}
}

// TestNodeStatuses pages through the status of a route for more nodes than one page of
// ListNodeStatuses holds: every node, the one that failed, and the error of a route that
// does not exist.
func TestNodeStatuses(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	var nodes []string
	for i := range nimbus.DefaultNodeStatusesPage + 10 {
		nodes = append(nodes, fmt.Sprintf("n%04d", i))
	}
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", nodes...)); err != nil {
		t.Fatal(err)
	}
	api := rawClient(t, socket)
	report(t, api, "r1", "n0003", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	report(t, api, "r1", "n1005", 1, nimbusv1.Phase_PHASE_FAILED, "KernelError", "adding route: network is unreachable")

	entries, err := c.NodeStatuses(testContext(t), routeKey("r1"), nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_UNSPECIFIED)
	if err != nil {
		t.Fatalf("NodeStatuses: %v", err)
	}
	if len(entries) != len(nodes) {
		t.Fatalf("%d node statuses, want %d", len(entries), len(nodes))
	}
	for i, e := range entries {
		reported := e.GetNode() == "n0003" || e.GetNode() == "n1005"
		if e.GetNode() != nodes[i] || (e.GetStatus() != nil) != reported {
			t.Fatalf("entry %d = %v, want %s with a status %v", i, e, nodes[i], reported)
		}
	}
	failed, err := c.NodeStatuses(testContext(t), routeKey("r1"), nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_FAILED)
	if err != nil {
		t.Fatalf("NodeStatuses of the FAILED nodes: %v", err)
	}
	if len(failed) != 1 || failed[0].GetNode() != "n1005" || failed[0].GetStatus().GetMessage() != "adding route: network is unreachable" {
		t.Errorf("FAILED nodes %v, want n1005 with its message", failed)
	}
	if _, err := c.NodeStatuses(testContext(t), routeKey("missing"), 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("NodeStatuses of a missing route: %v, want ErrNotFound", err)
	}
}

// TestApplyDryRunInOneCall dry-runs objects that an apply would send in many calls of
// Options.MaxBatchBytes, more than the first call of an apply carries: they go in one, so
// that nimbus checks them against each other, and two networks of one VNI far apart
// among them are refused, the second named by its index; nothing is stored.
func TestApplyDryRunInOneCall(t *testing.T) {
	socket := socketPath(t)
	reg := prometheus.NewRegistry()
	serveWith(t, socket, nimbus.Options{Registerer: reg})
	c := newClient(t, socket, Options{MaxBatchBytes: 512})
	network := func(name, subnet string) *nimbusv1.Object {
		return &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: name},
			Spec: &nimbusv1.Object_Network{Network: &nimbusv1.NetworkSpec{Vni: 100, Subnet: subnet}}}
	}
	objs := []*nimbusv1.Object{network("blue", "10.1.0.0/24")}
	// Counted with its margin, each route takes some 320 bytes: 6,000 are more than an
	// eighth of DryRunBatchBytes.
	for i := range 6000 {
		objs = append(objs, route(fmt.Sprintf("r%d", i), "192.0.2.1"))
	}
	ok, err := c.ApplyWith(testContext(t), objs, ApplyOptions{DryRun: true})
	if err != nil || len(ok) != len(objs) || !ok[0].GetCreated() || ok[0].GetObject().GetNetwork().GetVni() != 100 {
		t.Fatalf("dry run of %d objects = %v; want each created, with its object", len(objs), err)
	}
	objs = append(objs, network("green", "10.2.0.0/24"))
	_, err = c.ApplyWith(testContext(t), objs, ApplyOptions{DryRun: true})
	wantEntries(t, err, 0, len(objs), 0, BatchEntry{len(objs) - 1, "spec.vni",
		`network "default/green": spec.vni "100" is already used by network "default/blue"`})
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var dryRuns float64
	for _, f := range families {
		if f.GetName() == "naples_nimbus_dry_runs_total" {
			dryRuns = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if dryRuns != 2 {
		t.Errorf("nimbus counted %v dry runs, want the 2 calls", dryRuns)
	}
	list, err := nimbusv1.ListAll(testContext(t), rawClient(t, socket), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 0 || list.GetRevision() != 0 {
		t.Fatalf("nimbus holds %d objects at revision %d after dry runs, want none at 0", len(list.GetItems()), list.GetRevision())
	}
}
