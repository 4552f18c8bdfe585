package nimbus

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// batchSize is how many objects the batch tests write in one call.
const batchSize = 1000

// numberedRoutes returns n routes, r0000 on, for every node.
func numberedRoutes(n int) []*nimbusv1.Object {
	objs := make([]*nimbusv1.Object, n)
	for i := range objs {
		objs[i] = route(fmt.Sprintf("r%04d", i), nil, "192.0.2.1")
	}
	return objs
}

// commits returns the number of commits to the server's store file since it was opened.
func commits(t *testing.T, ts *testServer) int {
	t.Helper()
	return ts.srv.backend.(*embeddedStore).disk.file.Commits()
}

// wantStored fails the test unless List returns the objects with these names, in key
// order, at the revision.
func wantStored(t *testing.T, ts *testServer, rev uint64, names ...string) {
	t.Helper()
	list, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, it := range list.GetItems() {
		got = append(got, it.GetObject().GetMeta().GetName())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") || list.GetRevision() != rev {
		t.Fatalf("List = %d objects at revision %d, want %d at %d (got %.200q)", len(got), list.GetRevision(), len(names), rev, got)
	}
}

// histogram returns the count and sum of the server's histogram with the name.
func histogram(t *testing.T, srv *Server, name string) (uint64, float64) {
	t.Helper()
	families, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatalf("histogram %s not registered", name)
	return 0, 0
}

// violations returns the fields of the field violations of st's errdetails.BadRequest,
// and what its errdetails.ErrorInfo says of how many entries are bad ("" without one).
func violations(t *testing.T, st *status.Status) (fields []string, descriptions []string, badEntries string) {
	t.Helper()
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				fields = append(fields, v.GetField())
				descriptions = append(descriptions, v.GetDescription())
			}
		case *errdetails.ErrorInfo:
			if d.GetReason() != nimbusv1.BadEntriesReason || d.GetDomain() != nimbusv1.ErrorDomain {
				t.Errorf("ErrorInfo reason %q domain %q, want %q %q", d.GetReason(), d.GetDomain(), nimbusv1.BadEntriesReason, nimbusv1.ErrorDomain)
			}
			badEntries = d.GetMetadata()[nimbusv1.BadEntriesKey]
		case error:
			t.Fatalf("detail of the refusal: %v", d)
		}
	}
	// Each line of the message is a violation, its text after the position and key the
	// violation's description.
	lines := strings.Split(st.Message(), "\n")
	for i, desc := range descriptions {
		if i >= len(lines) || !strings.HasSuffix(lines[i], "): "+desc) && !strings.HasSuffix(lines[i], "]: "+desc) {
			t.Errorf("violation %d %s %q is not line %d of the message %q", i, fields[i], desc, i, st.Message())
		}
	}
	return fields, descriptions, badEntries
}

func TestApplyBatchRefusesInvalidObject(t *testing.T) {
	ts := start(t, Options{DataDir: t.TempDir()})
	before := commits(t, ts)
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)

	badPrefix := numberedRoutes(batchSize)
	badPrefix[737].GetRoute().Prefix = "10.0.0.0/33"
	twoBad := numberedRoutes(batchSize)
	twoBad[3].GetRoute().Prefix = "10.1.2.3/16"
	twoBad[3].GetRoute().Nexthops[0].Gateway = "nope"
	twoBad[999].Meta.Nodes = []string{"Node_A"}
	duplicate := numberedRoutes(batchSize)
	duplicate[900].Meta.Name = "r0005"
	empty := numberedRoutes(batchSize)
	empty[10] = &nimbusv1.Object{}
	for _, tc := range []struct {
		name string
		objs []*nimbusv1.Object
		want []string
		// fields are the fields of the refusal's field violations.
		fields []string
	}{
		{name: "prefix", objs: badPrefix, want: []string{
			`objects[737] (Route/default/default/r0737): spec.prefix "10.0.0.0/33": prefix length out of range`,
		}, fields: []string{"objects[737].spec.prefix"}},
		{name: "every bad field of every bad object", objs: twoBad, want: []string{
			`objects[3] (Route/default/default/r0003): spec.prefix "10.1.2.3/16": host bits set`,
			`objects[3] (Route/default/default/r0003): spec.nexthops[0].gateway "nope"`,
			`objects[999] (Route/default/default/r0999): meta.nodes[0] "Node_A"`,
		}, fields: []string{"objects[3].spec.prefix", "objects[3].spec.nexthops[0].gateway", "objects[999].meta.nodes[0]"}},
		{name: "duplicate key", objs: duplicate, want: []string{
			`objects[900] (Route/default/default/r0005): the key of objects[5] again`,
		}, fields: []string{"objects[900]"}},
		{name: "empty object", objs: empty, want: []string{`objects[10] (KIND_UNSPECIFIED/default/default/): meta "": is required`},
			fields: []string{"objects[10].meta"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: tc.objs})
			st := wantCode(t, err, codes.InvalidArgument)
			for _, want := range tc.want {
				if !strings.Contains(st.Message(), want) {
					t.Errorf("message = %q, want it to contain %q", st.Message(), want)
				}
			}
			if fields, _, bad := violations(t, st); strings.Join(fields, " ") != strings.Join(tc.fields, " ") || bad != "" {
				t.Errorf("violations of fields %q, bad entries %q; want %q and no count", fields, bad, tc.fields)
			}
			wantStored(t, ts, 0)
			if after := commits(t, ts); after != before {
				t.Errorf("state file commits = %d after a refused batch, want %d as before", after, before)
			}
		})
	}

	// The watcher saw nothing of the refused batches: the first event after them is the
	// first change after them.
	ts.apply(t, route("after", nil, "192.0.2.1"))
	wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, routeKey("after"), 1)
}

func TestApplyBatchRefusalIsBounded(t *testing.T) {
	ts := start(t, Options{})
	objs := numberedRoutes(batchSize)
	for _, o := range objs {
		o.GetRoute().Prefix = "10.0.0.0/33"
	}
	_, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	st := wantCode(t, err, codes.InvalidArgument)
	lines := strings.Split(st.Message(), "\n")
	if len(lines) != maxReportedInvalid+1 || lines[len(lines)-1] != "(990 more bad entries not shown)" {
		t.Errorf("refusal of %d bad objects has %d lines, ending %q; want %d lines ending with the count of the rest",
			batchSize, len(lines), lines[len(lines)-1], maxReportedInvalid+1)
	}
	if fields, _, bad := violations(t, st); len(fields) != maxReportedInvalid || fields[9] != "objects[9].spec.prefix" || bad != fmt.Sprint(batchSize) {
		t.Errorf("violations of fields %q, %q bad entries; want %d, the last objects[9].spec.prefix, and %d bad entries",
			fields, bad, maxReportedInvalid, batchSize)
	}
	wantStored(t, ts, 0)
}

func TestApplyBatchCommitsOnce(t *testing.T) {
	dir := t.TempDir()
	ts := start(t, Options{DataDir: dir})
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)
	before := commits(t, ts)

	objs := numberedRoutes(batchSize)
	resp, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	if err != nil {
		t.Fatalf("ApplyBatch: %v", err)
	}
	if after := commits(t, ts); after != before+1 || resp.GetTransactions() != 1 {
		t.Errorf("state file commits = %d, and the response says %d; want 1", after-before, resp.GetTransactions())
	}
	if resp.GetRevision() != batchSize || len(resp.GetResults()) != batchSize {
		t.Fatalf("ApplyBatch = %d results at revision %d, want %d at %d", len(resp.GetResults()), resp.GetRevision(), batchSize, batchSize)
	}
	for i, r := range resp.GetResults() {
		m := r.GetObject().GetMeta()
		if !r.GetChanged() || !r.GetCreated() || m.GetName() != objs[i].GetMeta().GetName() ||
			m.GetRevision() != uint64(i+1) || m.GetGeneration() != 1 || !uuidPattern.MatchString(m.GetUid()) {
			t.Fatalf("result %d = changed %v created %v %s revision %d generation %d uid %q; want a created %s at revision %d, generation 1",
				i, r.GetChanged(), r.GetCreated(), m.GetName(), m.GetRevision(), m.GetGeneration(), m.GetUid(), objs[i].GetMeta().GetName(), i+1)
		}
		if !proto.Equal(ts.get(t, objs[i].Key()).GetObject(), r.GetObject()) {
			t.Fatalf("Get %s differs from the result", objs[i].Key().ID())
		}
	}
	for i, o := range objs {
		wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_PUT, o.Key(), uint64(i+1))
	}
	wantMetrics(t, ts.srv, "naples_nimbus_objects 1000", "naples_nimbus_revision 1000", "naples_nimbus_commits_total 1")
	if n, sum := histogram(t, ts.srv, "naples_nimbus_commit_batch_size"); n != 1 || sum != batchSize {
		t.Errorf("commit batch sizes: %d commits of %v changes in all, want 1 of %d", n, sum, batchSize)
	}

	// Applying the same objects again changes nothing and writes nothing.
	before = commits(t, ts)
	resp, err = ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	if err != nil {
		t.Fatalf("second ApplyBatch: %v", err)
	}
	for i, r := range resp.GetResults() {
		if r.GetChanged() || r.GetObject().GetMeta().GetRevision() != uint64(i+1) {
			t.Fatalf("second ApplyBatch result %d = changed %v revision %d, want unchanged at %d",
				i, r.GetChanged(), r.GetObject().GetMeta().GetRevision(), i+1)
		}
	}
	if after := commits(t, ts); after != before || resp.GetRevision() != batchSize || resp.GetTransactions() != 0 {
		t.Errorf("unchanged batch: %d state file commits (the response says %d), revision %d; want none at %d",
			after-before, resp.GetTransactions(), resp.GetRevision(), batchSize)
	}

	// The objects are durable: a server on the same directory has all of them.
	ts.srv.Close()
	again := start(t, Options{DataDir: dir})
	var names []string
	for _, o := range objs {
		names = append(names, o.GetMeta().GetName())
	}
	wantStored(t, again, batchSize, names...)
}

// TestApplyBatchCallsBurst checks that an ApplyBatch of BurstObjects objects or more
// calls Options.Burst as it starts, and a smaller one does not.
func TestApplyBatchCallsBurst(t *testing.T) {
	var bursts atomic.Int32
	ts := start(t, Options{Burst: func() { bursts.Add(1) }})
	for _, tc := range []struct {
		objects int
		want    int32
	}{{BurstObjects - 1, 0}, {BurstObjects, 1}, {4 * BurstObjects, 2}} {
		if _, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: numberedRoutes(tc.objects)}); err != nil {
			t.Fatalf("ApplyBatch of %d objects: %v", tc.objects, err)
		}
		if n := bursts.Load(); n != tc.want {
			t.Errorf("after an ApplyBatch of %d objects Burst was called %d times in all; want %d", tc.objects, n, tc.want)
		}
	}
}

func TestDeleteBatchCommitsOnce(t *testing.T) {
	dir := t.TempDir()
	ts := start(t, Options{DataDir: dir})
	objs := numberedRoutes(batchSize)
	if _, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs}); err != nil {
		t.Fatalf("ApplyBatch: %v", err)
	}
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)
	before := commits(t, ts)

	// The keys in reverse order, with an absent one in the middle.
	var keys []*nimbusv1.ObjectKey
	for i := len(objs) - 1; i >= 0; i-- {
		keys = append(keys, objs[i].Key())
		if i == batchSize/2 {
			keys = append(keys, routeKey("absent"))
		}
	}
	resp, err := ts.client.DeleteBatch(testContext(t), &nimbusv1.DeleteBatchRequest{Keys: keys})
	if err != nil {
		t.Fatalf("DeleteBatch: %v", err)
	}
	if after := commits(t, ts); after != before+1 {
		t.Errorf("state file commits = %d, want 1", after-before)
	}
	if resp.GetRevision() != 2*batchSize || len(resp.GetResults()) != len(keys) {
		t.Fatalf("DeleteBatch = %d results at revision %d, want %d at %d", len(resp.GetResults()), resp.GetRevision(), len(keys), 2*batchSize)
	}
	rev := uint64(batchSize)
	for i, r := range resp.GetResults() {
		if keys[i].GetName() == "absent" {
			if r.GetFound() || r.GetRevision() != rev {
				t.Errorf("result for the absent key = found %v revision %d, want not found at %d", r.GetFound(), r.GetRevision(), rev)
			}
			continue
		}
		rev++
		if !r.GetFound() || r.GetRevision() != rev {
			t.Fatalf("result %d = found %v revision %d, want found at %d", i, r.GetFound(), r.GetRevision(), rev)
		}
		wantEvent(t, ts, recv(t, w), nimbusv1.WatchEvent_TYPE_DELETE, keys[i], rev)
	}
	wantStored(t, ts, 2*batchSize)
	wantMetrics(t, ts.srv, "naples_nimbus_objects 0", "naples_nimbus_revision 2000", "naples_nimbus_commits_total 2")

	ts.srv.Close()
	again := start(t, Options{DataDir: dir})
	wantStored(t, again, 2*batchSize)
}

func TestDeleteBatchRefusesBadKeys(t *testing.T) {
	ts := start(t, Options{DataDir: t.TempDir()})
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	before := commits(t, ts)
	for _, tc := range []struct {
		name  string
		keys  []*nimbusv1.ObjectKey
		want  string
		field string
	}{
		{name: "bad name", keys: []*nimbusv1.ObjectKey{routeKey("r1"), routeKey("R 1")},
			want: `keys[1] (Route/default/default/R 1): key.name "R 1"`, field: "keys[1].name"},
		{name: "no kind", keys: []*nimbusv1.ObjectKey{routeKey("r1"), {Name: "r1"}},
			want: `keys[1] (KIND_UNSPECIFIED/default/default/r1): key.kind "KIND_UNSPECIFIED": unknown kind`, field: "keys[1].kind"},
		{name: "duplicate key", keys: []*nimbusv1.ObjectKey{routeKey("r1"), {Kind: nimbusv1.Kind_KIND_ROUTE, Name: "r1", Tenant: "default"}},
			want: `keys[1] (Route/default/default/r1): the key of keys[0] again`, field: "keys[1]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ts.client.DeleteBatch(testContext(t), &nimbusv1.DeleteBatchRequest{Keys: tc.keys})
			st := wantCode(t, err, codes.InvalidArgument)
			if !strings.Contains(st.Message(), tc.want) {
				t.Errorf("message = %q, want it to contain %q", st.Message(), tc.want)
			}
			if fields, _, _ := violations(t, st); len(fields) != 1 || fields[0] != tc.field {
				t.Errorf("violations of fields %q, want %q", fields, tc.field)
			}
			wantStored(t, ts, 1, "r1")
			if after := commits(t, ts); after != before {
				t.Errorf("state file commits after a refused batch = %d, want none", after-before)
			}
		})
	}
}

// TestApplyBatchAsApplies checks that a batch changes objects as the same Applies one
// after the other do: generations, unchanged objects, retargets dropping statuses.
func TestApplyBatchAsApplies(t *testing.T) {
	ts := start(t, Options{})
	for _, name := range []string{"same", "labels", "spec", "moved"} {
		ts.apply(t, route(name, []string{"a", "b"}, "192.0.2.1"))
	}
	ts.report(t, statusReport(routeKey("moved"), "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""),
		statusReport(routeKey("moved"), "b", 1, nimbusv1.Phase_PHASE_PROGRAMMED, ""))
	labels := route("labels", []string{"b", "a"}, "192.0.2.1")
	labels.Meta.Labels = map[string]string{"site": "dc2"}
	resp, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{
		route("same", []string{"b", "a"}, "192.0.2.1"),
		labels,
		route("spec", []string{"a", "b"}, "192.0.2.2"),
		route("new", nil, "192.0.2.1"),
		route("moved", []string{"b"}, "192.0.2.1"),
	}})
	if err != nil {
		t.Fatalf("ApplyBatch: %v", err)
	}
	for i, want := range []struct {
		changed, created bool
		rev              uint64
		gen              int64
	}{
		{changed: false, rev: 1, gen: 1},
		{changed: true, rev: 5, gen: 1},
		{changed: true, rev: 6, gen: 2},
		{changed: true, created: true, rev: 7, gen: 1},
		{changed: true, rev: 8, gen: 2},
	} {
		r := resp.GetResults()[i]
		m := r.GetObject().GetMeta()
		if r.GetChanged() != want.changed || r.GetCreated() != want.created || m.GetRevision() != want.rev || m.GetGeneration() != want.gen {
			t.Errorf("result %d (%s) = changed %v created %v revision %d generation %d; want %v %v %d %d",
				i, m.GetName(), r.GetChanged(), r.GetCreated(), m.GetRevision(), m.GetGeneration(),
				want.changed, want.created, want.rev, want.gen)
		}
	}
	if resp.GetRevision() != 8 {
		t.Errorf("revision after the batch = %d, want 8", resp.GetRevision())
	}
	// The retarget away from a dropped its status; b's stays.
	wantStatus(t, ts, routeKey("moved"), 1, 0, 0, "b")
}

func TestApplyBatchEmpty(t *testing.T) {
	ts := start(t, Options{DataDir: t.TempDir()})
	ts.apply(t, route("r1", nil, "192.0.2.1"))
	before := commits(t, ts)
	resp, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{})
	if err != nil || resp.GetRevision() != 1 || len(resp.GetResults()) != 0 {
		t.Fatalf("empty ApplyBatch = %v, %v; want no results at revision 1", resp, err)
	}
	dresp, err := ts.client.DeleteBatch(testContext(t), &nimbusv1.DeleteBatchRequest{})
	if err != nil || dresp.GetRevision() != 1 || len(dresp.GetResults()) != 0 {
		t.Fatalf("empty DeleteBatch = %v, %v; want no results at revision 1", dresp, err)
	}
	if after := commits(t, ts); after != before {
		t.Errorf("empty batches wrote %d state file commits, want none", after-before)
	}
}

func TestApplyBatchTooLarge(t *testing.T) {
	ts := start(t, Options{})
	objs := numberedRoutes(17)
	for _, o := range objs {
		o.Meta.Labels = map[string]string{"padding": strings.Repeat("x", 1<<20)}
	}
	_, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs})
	wantCode(t, err, codes.ResourceExhausted)
	wantStored(t, ts, 0)
}

func TestBatchesArePublisherOnly(t *testing.T) {
	ts, p := startTLS(t)
	a := p.node(t, ts, "host-a")
	ctx := testContext(t)
	objs := []*nimbusv1.Object{route("r1", nil, "192.0.2.1")}
	_, err := a.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs})
	wantDenied(t, err, `node "host-a"`, "ApplyBatch", "publisher certificate")
	_, err = a.DeleteBatch(ctx, &nimbusv1.DeleteBatchRequest{Keys: []*nimbusv1.ObjectKey{routeKey("r1")}})
	wantDenied(t, err, `node "host-a"`, "DeleteBatch", "publisher certificate")
	wantStored(t, ts, 0)

	if _, err := ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: objs}); err != nil {
		t.Fatalf("publisher's ApplyBatch: %v", err)
	}
	if _, err := ts.client.DeleteBatch(ctx, &nimbusv1.DeleteBatchRequest{Keys: []*nimbusv1.ObjectKey{routeKey("r1")}}); err != nil {
		t.Fatalf("publisher's DeleteBatch: %v", err)
	}
	wantStored(t, ts, 2)
}

func TestApplyBatchOmitObjects(t *testing.T) {
	ts := start(t, Options{})
	ts.apply(t, route("same", nil, "192.0.2.1"))
	ts.apply(t, route("spec", nil, "192.0.2.1"))
	resp, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{OmitObjects: true, Objects: []*nimbusv1.Object{
		route("same", nil, "192.0.2.1"),
		route("spec", nil, "192.0.2.2"),
		route("new", nil, "192.0.2.1"),
	}})
	if err != nil {
		t.Fatalf("ApplyBatch: %v", err)
	}
	for i, want := range []struct {
		changed, created bool
		rev              uint64
		gen              int64
	}{
		{changed: false, rev: 1, gen: 1},
		{changed: true, rev: 3, gen: 2},
		{changed: true, created: true, rev: 4, gen: 1},
	} {
		r := resp.GetResults()[i]
		m := r.GetObject().GetMeta()
		if r.GetChanged() != want.changed || r.GetCreated() != want.created || m.GetRevision() != want.rev || m.GetGeneration() != want.gen {
			t.Errorf("result %d = changed %v created %v revision %d generation %d; want %v %v %d %d",
				i, r.GetChanged(), r.GetCreated(), m.GetRevision(), m.GetGeneration(),
				want.changed, want.created, want.rev, want.gen)
		}
		if r.GetObject().GetSpec() != nil || m.GetName() != "" {
			t.Errorf("result %d carries the stored object with omit_objects: %v", i, r.GetObject())
		}
	}
	wantStored(t, ts, 4, "new", "same", "spec")
}

// TestApplyKeepsCallersObjects checks that Apply and ApplyBatch called in the same
// process leave the caller's objects as they were, tenant, namespace and nodes not
// normalized into them, and store objects of their own; over gRPC, where the request is
// the call's own, the stored objects are the same.
func TestApplyKeepsCallersObjects(t *testing.T) {
	ts := start(t, Options{})
	ctx := context.Background()
	one := route("r1", []string{"host-b", "host-a", "host-b"}, "192.0.2.1")
	two := route("r2", []string{"host-b", "host-a"}, "192.0.2.2")
	wantOne, wantTwo := proto.CloneOf(one), proto.CloneOf(two)
	if _, err := ts.srv.Apply(ctx, &nimbusv1.ApplyRequest{Object: one}); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.srv.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{two}}); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(one, wantOne) || !proto.Equal(two, wantTwo) {
		t.Errorf("the caller's objects changed: %v and %v, want %v and %v", one, two, wantOne, wantTwo)
	}
	three := route("r3", []string{"host-b", "host-a", "host-b"}, "192.0.2.3")
	if _, err := ts.client.ApplyBatch(ctx, &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{three}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"r1", "r2", "r3"} {
		got, err := ts.client.Get(ctx, &nimbusv1.GetRequest{Key: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Name: name}})
		if err != nil {
			t.Fatal(err)
		}
		m := got.GetItem().GetObject().GetMeta()
		if m.GetTenant() != "default" || m.GetNamespace() != "default" || !slices.Equal(m.GetNodes(), []string{"host-a", "host-b"}) {
			t.Errorf("%s stored with tenant %q, namespace %q, nodes %v; want default, default, [host-a host-b]", name, m.GetTenant(), m.GetNamespace(), m.GetNodes())
		}
	}
}
