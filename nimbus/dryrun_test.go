package nimbus

import (
	"context"
	"runtime"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/internal/version"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// dryRunStores are the stores a dry run must leave untouched: each starts a server
// holding net1, web-a and eth1 (see conflictCases), and restarted starts another one on
// the same durable store, nil for memory only.
var dryRunStores = []struct {
	name      string
	start     func(t *testing.T) (ts *testServer, restarted func() *testServer)
	isReplica bool
}{
	{name: "memory", start: func(t *testing.T) (*testServer, func() *testServer) {
		return startWithWebA(t, Options{}), nil
	}},
	{name: "bbolt", start: func(t *testing.T) (*testServer, func() *testServer) {
		dir := t.TempDir()
		ts := startWithWebA(t, Options{DataDir: dir})
		return ts, func() *testServer {
			if err := ts.srv.Close(); err != nil {
				t.Fatal(err)
			}
			return start(t, Options{DataDir: dir})
		}
	}},
	{name: "etcd", isReplica: true, start: func(t *testing.T) (*testServer, func() *testServer) {
		c := cluster(t)
		prefix := testPrefix(t)
		ts := startReplica(t, c.Endpoints(), prefix, true, Options{})
		for _, obj := range []*nimbusv1.Object{network("net1", 100, "10.1.0.0/24"), webA(), hostInterface("eth1", "", "host-b")} {
			ts.apply(t, obj)
		}
		return ts, func() *testServer { return startReplica(t, c.Endpoints(), prefix, true, Options{}) }
	}},
}

// TestDryRunStoresNothing dry-runs a batch that creates, changes and leaves unchanged an
// object, and a single Apply, against each store: the answers say what the apply would
// do, and nothing is stored: Get and List find what was there, at the same revision, a
// watch receives nothing (the next event it receives is that of a real apply after the
// dry runs, at the revision after the one before them), and a server started again on
// the durable store loads nothing of them.
func TestDryRunStoresNothing(t *testing.T) {
	for _, tc := range dryRunStores {
		t.Run(tc.name, func(t *testing.T) {
			ts, restarted := tc.start(t)
			ctx := testContext(t)
			w := watch(t, ts.client, "host-a")
			recvUntilSynced(t, w)
			before, err := ts.client.List(ctx, &nimbusv1.ListRequest{})
			if err != nil {
				t.Fatal(err)
			}
			stored := ts.get(t, webA().Key()).GetObject()
			net1 := ts.get(t, network("net1", 0).Key()).GetObject()

			moved := endpoint("web-a", "net1", "host-a", "veth-a", "02:00:00:00:01:0a", "10.1.0.5", "10.1.0.7")
			resp, err := ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{DryRun: true, Objects: []*nimbusv1.Object{
				route("r1", nil, "192.0.2.1"), moved, network("net1", 100, "10.1.0.0/24"),
			}})
			if err != nil {
				t.Fatalf("ApplyBatch dry run: %v", err)
			}
			if resp.GetRevision() != before.GetRevision() || resp.GetTransactions() != 0 {
				t.Errorf("dry run answered revision %d, %d transactions; want the store's %d and none",
					resp.GetRevision(), resp.GetTransactions(), before.GetRevision())
			}
			res := resp.GetResults()
			if len(res) != 3 {
				t.Fatalf("dry run answered %d results, want 3", len(res))
			}
			created := res[0].GetObject().GetMeta()
			if !res[0].GetCreated() || !res[0].GetChanged() || created.GetGeneration() != 1 || created.GetUid() != "" ||
				created.GetRevision() != 0 || created.GetCreateTime() != nil || created.GetTenant() != "default" {
				t.Errorf("dry run of a new route answered %v, want created at generation 1 without uid, revision or times, tenant defaulted", res[0])
			}
			changed := res[1].GetObject()
			if res[1].GetCreated() || !res[1].GetChanged() || changed.GetMeta().GetGeneration() != 2 ||
				changed.GetMeta().GetUid() != stored.GetMeta().GetUid() || changed.GetMeta().GetRevision() != 0 ||
				!proto.Equal(changed.GetEndpoint(), moved.GetEndpoint()) {
				t.Errorf("dry run of a changed endpoint answered %v, want changed at generation 2 with its uid and new spec, no revision", res[1])
			}
			if res[2].GetChanged() || !proto.Equal(res[2].GetObject(), net1) {
				t.Errorf("dry run of an unchanged network answered %v, want unchanged with the stored object %v", res[2], net1)
			}
			one, err := ts.client.Apply(ctx, &nimbusv1.ApplyRequest{DryRun: true, Object: route("r1", nil, "192.0.2.1")})
			if err != nil || !one.GetCreated() {
				t.Fatalf("Apply dry run = %v, %v; want created", one, err)
			}

			_, err = ts.client.Get(ctx, &nimbusv1.GetRequest{Key: routeKey("r1")})
			wantCode(t, err, codes.NotFound)
			if got := ts.get(t, webA().Key()).GetObject(); !proto.Equal(got, stored) {
				t.Errorf("web-a after the dry run = %v, want it as stored %v", got, stored)
			}
			after, err := ts.client.List(ctx, &nimbusv1.ListRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if after.GetRevision() != before.GetRevision() || len(after.GetItems()) != len(before.GetItems()) {
				t.Errorf("after the dry runs: %d objects at revision %d, want %d at %d", len(after.GetItems()), after.GetRevision(),
					len(before.GetItems()), before.GetRevision())
			}
			wantMetrics(t, ts.srv, "naples_nimbus_dry_runs_total 2")

			// The next change the watch receives is a real one, which takes the revision
			// after the one before the dry runs.
			marker := ts.apply(t, route("marker", nil, "192.0.2.9")).GetObject()
			if !tc.isReplica && marker.GetMeta().GetRevision() != before.GetRevision()+1 {
				t.Errorf("the apply after the dry runs took revision %d, want %d", marker.GetMeta().GetRevision(), before.GetRevision()+1)
			}
			for {
				ev := recv(t, w)
				if ev.GetType() == nimbusv1.WatchEvent_TYPE_BOOKMARK {
					continue
				}
				if ev.GetType() != nimbusv1.WatchEvent_TYPE_PUT || ev.GetObject().GetMeta().GetName() != "marker" {
					t.Fatalf("the watch received %v after the dry runs, want the PUT of marker first", ev)
				}
				break
			}

			if restarted == nil {
				return
			}
			again := restarted()
			list, err := again.client.List(testContext(t), &nimbusv1.ListRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(list.GetItems()) != len(before.GetItems())+1 {
				t.Errorf("restarted on the same store: %d objects, want the %d before the dry runs and marker", len(list.GetItems()), len(before.GetItems())+1)
			}
			if got := again.get(t, webA().Key()).GetObject(); !proto.Equal(got, stored) {
				t.Errorf("web-a restarted on the same store = %v, want it as stored %v", got, stored)
			}
		})
	}
}

// TestDryRunRefusesConflictsAsApply dry-runs each conflicting object of conflictCases,
// and batches whose entries conflict with each other: the refusal is the very status a
// real apply meets, code, message and details, and the dry run of a batch that a real
// apply accepts is accepted.
func TestDryRunRefusesConflictsAsApply(t *testing.T) {
	t.Parallel()
	ts := startWithWebA(t, Options{})
	ctx := testContext(t)
	for _, tc := range conflictCases {
		if tc.want == "" {
			continue
		}
		_, dry := ts.client.Apply(ctx, &nimbusv1.ApplyRequest{DryRun: true, Object: tc.obj})
		_, applied := ts.client.Apply(ctx, &nimbusv1.ApplyRequest{Object: tc.obj})
		wantSameStatus(t, tc.name, dry, applied, codes.FailedPrecondition)
	}

	// Within a batch: aaa takes web-a's address before web-a gives it up...
	moved := endpoint("web-a", "net1", "host-a", "veth-a", "02:00:00:00:01:0a", "10.1.0.6")
	aaa := endpoint("aaa", "net1", "host-b", "veth-b", "02:00:00:00:01:0b", "10.1.0.5")
	refused := []*nimbusv1.Object{route("r1", nil, "192.0.2.1"), aaa, moved}
	_, dry := ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{DryRun: true, Objects: refused})
	_, applied := ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: refused})
	wantSameStatus(t, "batch", dry, applied, codes.FailedPrecondition)
	// ...and two new networks of the batch share a VNI.
	twins := []*nimbusv1.Object{network("net5", 500, "10.5.0.0/24"), network("net6", 500, "10.6.0.0/24")}
	_, dry = ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{DryRun: true, Objects: twins})
	_, applied = ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: twins})
	wantSameStatus(t, "batch of twins", dry, applied, codes.FailedPrecondition)
	// Invalid objects are refused alike too.
	bad := []*nimbusv1.Object{route("r1", nil, "192.0.2.1"), route("r1", nil, "192.0.2.2"), route("R2", nil, "192.0.2.1")}
	_, dry = ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{DryRun: true, Objects: bad})
	_, applied = ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: bad})
	wantSameStatus(t, "invalid batch", dry, applied, codes.InvalidArgument)

	// The other way round, web-a frees the address first, and the dry run accepts it.
	resp, err := ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{DryRun: true, Objects: []*nimbusv1.Object{moved, aaa}})
	if err != nil {
		t.Fatalf("dry run moving web-a's address to aaa: %v", err)
	}
	if !resp.GetResults()[0].GetChanged() || !resp.GetResults()[1].GetCreated() {
		t.Errorf("dry run moving web-a's address to aaa answered %v, want web-a changed and aaa created", resp.GetResults())
	}
	// Nothing of it was stored: web-a still holds the address.
	wantConflict(t, ts, aaa, conflictCases[0].want)
}

// wantSameStatus fails the test unless dry and applied, the errors of a dry run and of a real apply, are the same status of the code.
func wantSameStatus(t *testing.T, name string, dry, applied error, code codes.Code) {
	t.Helper()
	dst, rst := status.Convert(dry), status.Convert(applied)
	if rst.Code() != code {
		t.Fatalf("%s: the real apply = %v, want code %v", name, applied, code)
	}
	if !proto.Equal(dst.Proto(), rst.Proto()) {
		t.Errorf("%s: the dry run was refused with\n%v\nthe real apply with\n%v", name, dst.Proto(), rst.Proto())
	}
}

// TestDryRunNeedsPublisher checks that a node may not dry-run an apply, as it may not
// apply, and that a publisher may.
func TestDryRunNeedsPublisher(t *testing.T) {
	ts, p := startTLS(t)
	ctx := testContext(t)
	obj := route("r1", []string{"host-a"}, "192.0.2.1")
	a := p.node(t, ts, "host-a")
	_, err := a.Apply(ctx, &nimbusv1.ApplyRequest{DryRun: true, Object: obj})
	wantDenied(t, err, `node "host-a"`, "Apply", "publisher certificate")
	_, err = a.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{DryRun: true, Objects: []*nimbusv1.Object{obj}})
	wantDenied(t, err, `node "host-a"`, "ApplyBatch", "publisher certificate")
	resp, err := p.publisher(t, ts).Apply(ctx, &nimbusv1.ApplyRequest{DryRun: true, Object: obj})
	if err != nil || !resp.GetCreated() {
		t.Fatalf("a publisher's dry run = %v, %v; want created", resp, err)
	}
}

// TestVersion checks that Version answers the server's version, Go release and
// platform, to a node certificate too.
func TestVersionRPC(t *testing.T) {
	ts, p := startTLS(t)
	want := &nimbusv1.VersionResponse{Version: version.Get(), GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	for name, client := range map[string]nimbusv1.NimbusClient{"publisher": ts.client, "node": p.node(t, ts, "host-a")} {
		got, err := client.Version(context.Background(), &nimbusv1.VersionRequest{})
		if err != nil || !proto.Equal(got, want) {
			t.Errorf("Version as a %s = %v, %v; want %v", name, got, err, want)
		}
	}
}
