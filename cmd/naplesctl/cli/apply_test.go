package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/naplesnet/naples/controller"
	"github.com/naplesnet/naples/internal/address"
	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// batchEnv is an env whose nimbus registers its metrics with reg, so that a test counts
// the commits, and with them the batch calls, naplesctl made.
type batchEnv struct {
	*env
	reg *prometheus.Registry
}

// newBatchEnv starts a nimbus as newEnv does, with its metrics on a registry of the test.
func newBatchEnv(t *testing.T) *batchEnv {
	t.Helper()
	reg := prometheus.NewRegistry()
	return &batchEnv{env: newEnvWith(t, nimbus.Options{Registerer: reg}), reg: reg}
}

// commits returns how many commits nimbus made and how many object changes they carried.
func (e *batchEnv) commits() (commits uint64, changes float64) {
	e.t.Helper()
	families, err := e.reg.Gather()
	if err != nil {
		e.t.Fatalf("gathering metrics: %v", err)
	}
	for _, f := range families {
		if f.GetName() == "naples_nimbus_commit_batch_size" {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	e.t.Fatal("naples_nimbus_commit_batch_size is not registered")
	return 0, 0
}

// count returns how many objects of the kind nimbus stores.
func (e *env) count(kind nimbusv1.Kind) int {
	e.t.Helper()
	resp, err := nimbusv1.ListAll(e.t.Context(), e.nimbus, &nimbusv1.ListRequest{Kind: kind})
	if err != nil {
		e.t.Fatalf("List: %v", err)
	}
	return len(resp.GetItems())
}

// manyRoutes writes a JSON manifest of n routes, r00000 on, into the test's directory; the
// route at bad, when bad is in range, has an invalid prefix, and every route has a label
// of pad bytes. It returns the path and the routes.
func (e *env) manyRoutes(name string, n, bad, pad int) (string, []*nimbusv1.Object) {
	e.t.Helper()
	type route struct {
		Kind string               `json:"kind"`
		Meta *nimbusv1.ObjectMeta `json:"meta"`
		Spec *nimbusv1.RouteSpec  `json:"spec"`
	}
	routes := make([]route, n)
	objs := make([]*nimbusv1.Object, n)
	for i := range routes {
		prefix := fmt.Sprintf("10.%d.%d.0/24", i/256, i%256)
		if i == bad {
			prefix = "10.0.0.0/33"
		}
		routes[i] = route{
			Kind: "Route",
			Meta: &nimbusv1.ObjectMeta{Name: fmt.Sprintf("r%05d", i), Nodes: []string{"host-a"}},
			Spec: &nimbusv1.RouteSpec{Table: 100, Prefix: prefix, Nexthops: []*nimbusv1.NextHop{{Gateway: "10.10.0.2"}}},
		}
		if pad > 0 {
			routes[i].Meta.Labels = map[string]string{"pad": strings.Repeat("x", pad)}
		}
		objs[i] = &nimbusv1.Object{Meta: routes[i].Meta, Spec: &nimbusv1.Object_Route{Route: routes[i].Spec}}
	}
	b, err := json.Marshal(routes)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.file(name, string(b)), objs
}

func TestApplyInvalidSecondDocumentStoresNothing(t *testing.T) {
	e := newBatchEnv(t)
	path := e.file("three.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2")+"---\n"+
		routeYAML("bad", "10.0.0.0/33", "10.10.0.5")+"---\n"+
		routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3"))
	err := e.fails("apply", "-f", path)
	contains(t, "apply of a manifest with a bad 2nd document", err,
		path+": document 2: route/bad: "+`spec.prefix "10.0.0.0/33": prefix length out of range`, "nothing applied")
	if strings.Contains(err.Error(), "document 1") || strings.Contains(err.Error(), "document 3") {
		t.Errorf("error %q names a valid document", err)
	}
	if !errors.Is(err, nimbusv1.ErrInvalid) {
		t.Errorf("error %v is not nimbusv1.ErrInvalid", err)
	}
	if n := e.count(nimbusv1.Kind_KIND_ROUTE); n != 0 {
		t.Errorf("nimbus stores %d routes after the refused apply, want none", n)
	}
	if commits, _ := e.commits(); commits != 0 {
		t.Errorf("nimbus made %d commits for a refused apply, want none", commits)
	}
}

func TestApplyLargeManifestInBatches(t *testing.T) {
	const n, pad = 10000, 300 // 6 MiB counted as batches count
	e := newBatchEnv(t)
	path, objs := e.manyRoutes("routes.json", n, -1, pad)
	// Batches count each object with a margin of 256 bytes for its result.
	counted := 0
	for _, o := range objs {
		counted += proto.Size(o) + 256
	}
	// The first call carries up to an eighth of the most a call carries, each next one
	// twice the one before.
	var fewest uint64
	for left, bound := counted, controller.DefaultMaxBatchBytes/8; left > 0; bound = min(2*bound, controller.DefaultMaxBatchBytes) {
		left -= bound
		fewest++
	}

	out := e.ok("apply", "-f", path)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != n || lines[0] != "route/r00000 created" || lines[n-1] != fmt.Sprintf("route/r%05d created", n-1) {
		t.Fatalf("apply printed %d lines from %q to %q, want %d from route/r00000 created", len(lines), lines[0], lines[len(lines)-1], n)
	}
	if got := e.count(nimbusv1.Kind_KIND_ROUTE); got != n {
		t.Errorf("nimbus stores %d routes, want %d", got, n)
	}
	// Every call is one commit here, as nothing else writes.
	calls, changes := e.commits()
	if calls < fewest || calls > fewest+1 || changes != n {
		t.Errorf("apply made %d calls carrying %v objects; want %d or %d calls (%d bytes in calls of up to %d, rising from an eighth of it) carrying %d",
			calls, changes, fewest, fewest+1, counted, controller.DefaultMaxBatchBytes, n)
	}
	t.Logf("%d routes in %d calls", n, calls)

	out = e.ok("delete", "-f", path)
	if got := strings.Count(out, " deleted\n"); got != n {
		t.Errorf("delete -f: %d objects deleted, want %d", got, n)
	}
	if got := e.count(nimbusv1.Kind_KIND_ROUTE); got != 0 {
		t.Errorf("nimbus stores %d routes after delete -f, want none", got)
	}
	// The keys fit one call.
	if after, changes := e.commits(); after != calls+1 || changes != 2*n {
		t.Errorf("delete -f made %d commits of %v changes, want 1 of %d", after-calls, changes-n, n)
	}
}

func TestApplyInvalidInLaterBatchStoresNothing(t *testing.T) {
	const n, bad, pad = 2500, 2497, 2048 // 5.6 MiB: two batches
	e := newBatchEnv(t)
	path, objs := e.manyRoutes("routes.json", n, bad, pad)
	// The premise: the bad object is not in the first batch, as the objects before it are
	// more than a batch holds.
	var before int
	for _, o := range objs[:bad] {
		before += proto.Size(o)
	}
	if before <= controller.DefaultMaxBatchBytes {
		t.Fatalf("the objects before the bad one are %d bytes, which one batch holds", before)
	}

	err := e.fails("apply", "-f", path)
	contains(t, "apply with an invalid object in a later batch", err,
		fmt.Sprintf("%s: document %d: route/r%05d: ", path, bad+1, bad), `spec.prefix "10.0.0.0/33"`, "nothing applied")
	if got := e.count(nimbusv1.Kind_KIND_ROUTE); got != 0 {
		t.Errorf("nimbus stores %d routes, want none", got)
	}
	if commits, _ := e.commits(); commits != 0 {
		t.Errorf("nimbus made %d commits, want none", commits)
	}
}

func TestApplyRefusesDuplicates(t *testing.T) {
	e := newBatchEnv(t)
	a := e.file("a.yaml", routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.2"))
	b := e.file("b.yaml", routeYAML("to-dc3", "203.0.113.0/24", "10.10.0.3")+"---\n"+
		routeYAML("to-dc2", "198.51.100.0/24", "10.10.0.9"))
	err := e.fails("apply", "-f", a, "-f", b)
	contains(t, "apply of one object twice", err,
		b+": document 2: route/to-dc2: "+`meta.name "to-dc2": the same object as `+a+": document 1", "nothing applied")
	if !errors.Is(err, nimbusv1.ErrInvalid) {
		t.Errorf("error %v is not nimbusv1.ErrInvalid", err)
	}
	if got := e.count(nimbusv1.Kind_KIND_ROUTE); got != 0 {
		t.Errorf("nimbus stores %d routes, want none", got)
	}

	err = e.fails("delete", "route", "to-dc2", "to-dc3", "to-dc2")
	contains(t, "delete of one name twice", err,
		`argument 4: route/to-dc2: key.name "to-dc2": the same object as argument 2`, "nothing deleted")
}

// TestApplyNamesDocumentNimbusRefused checks that an object nimbus refuses, which
// naplesctl cannot know to be bad, is named by its document, in a later batch too, and
// that the error says what the batches before stored.
func TestApplyNamesDocumentNimbusRefused(t *testing.T) {
	const n, pad, limit = 2000, 2048, 4096
	e := newEnvWith(t, nimbus.Options{Limits: nimbus.Limits{ObjectBytes: limit}})
	many, objs := e.manyRoutes("routes.json", n, -1, pad)
	// The premise: the routes are more than one batch holds.
	var size int
	for _, o := range objs {
		size += proto.Size(o)
	}
	if size <= controller.DefaultMaxBatchBytes {
		t.Fatalf("the routes are %d bytes, which one batch holds", size)
	}
	big := e.file("big.yaml", strings.Replace(routeYAML("big", "198.51.100.0/24", "10.10.0.2"),
		"  nodes: [host-a]\n", "  nodes: [host-a]\n  labels:\n    pad: "+strings.Repeat("x", limit)+"\n", 1))

	err := e.fails("apply", "-f", big)
	contains(t, "apply of an object over nimbus's limit", err,
		"applying "+big+": document 1 (nothing applied): "+big+": document 1: route/big: object Route/default/default/big: ",
		fmt.Sprintf("over the limit of %d bytes", limit))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("status.Code(%v) = %v, want InvalidArgument", err, status.Code(err))
	}

	out, _, err := e.run("", "apply", "-f", many, "-f", big)
	if err == nil {
		t.Fatal("apply of an object over nimbus's limit after a batch succeeded")
	}
	contains(t, "apply of an object over nimbus's limit after a batch", err,
		"applying "+many+": document ", " to "+big+": document 1 (the ",
		" objects before them were applied): "+big+": document 1: route/big: object Route/default/default/big: ")
	if stored := e.count(nimbusv1.Kind_KIND_ROUTE); stored == 0 || stored >= n || !strings.Contains(err.Error(), fmt.Sprintf("(the %d objects before them were applied)", stored)) {
		t.Errorf("nimbus stores %d routes, error %.300q; want the routes of the batches before, as many as it says", stored, err)
	} else if created := strings.Count(out, " created\n"); created != stored {
		t.Errorf("apply printed %d routes created, want the %d stored", created, stored)
	}
}

// TestBatchErrorNamesDocuments checks that nimbus's refusal of a batch, by position in the
// call, comes out naming the documents.
func TestBatchErrorNamesDocuments(t *testing.T) {
	s := &session{addr: address.List{{Network: "unix", Addr: "/run/n.sock"}}}
	// The objects applied before are 5, these the 6th and 7th.
	srcs := []source{
		{file: "a.yaml", doc: 7, obj: &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "ok"}, Spec: &nimbusv1.Object_Route{}}},
		{file: "a.yaml", doc: 8, obj: &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "x"}, Spec: &nimbusv1.Object_Route{}}},
	}
	msg := `objects[1] (Route/default/default/x): spec.prefix "10.0.0.0/33": prefix length out of range` + "\n" +
		`objects[1] (Route/default/default/x): spec.nexthops[0].gateway "nope": not an IP address` + "\n" +
		"(3 more bad entries not shown)"
	be := &controller.BatchError{First: 5, End: 7, Omitted: 3, Err: status.Error(codes.InvalidArgument, msg), Entries: []controller.BatchEntry{
		{Index: 6, Field: "spec.prefix", Message: `spec.prefix "10.0.0.0/33": prefix length out of range`},
		{Index: 6, Field: "spec.nexthops[0].gateway", Message: `spec.nexthops[0].gateway "nope": not an IP address`},
	}}
	where := func(i int) string { return fmt.Sprintf("%v: %s", srcs[i-5], ref(srcs[i-5].obj.Key())) }
	err := s.batchError(be, where)
	equal(t, "mapped refusal", err.Error(), ""+
		`a.yaml: document 8: route/x: spec.prefix "10.0.0.0/33": prefix length out of range`+"\n"+
		`a.yaml: document 8: route/x: spec.nexthops[0].gateway "nope": not an IP address`+"\n"+
		"(3 more bad entries not shown)")
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("status.Code(%v) = %v, want InvalidArgument", err, status.Code(err))
	}
	err = s.batchFailed("applying", "applied", be, func(first, end int) string { return describeSpan(srcs[first-5 : end-5]) }, where)
	if !strings.HasPrefix(err.Error(), "applying a.yaml: documents 7 to 8 (the 5 objects before them were applied):\na.yaml: document 8") {
		t.Errorf("error of a later batch = %q, want it to say which documents and that the ones before were applied", err)
	}
}

// TestBatchErrorNamesDocumentsOfAConflict checks that nimbus's refusal of a batch whose
// entry conflicts with a stored object (FailedPrecondition) names the document, and says
// that nothing of the call was applied.
func TestBatchErrorNamesDocumentsOfAConflict(t *testing.T) {
	s := &session{addr: address.List{{Network: "unix", Addr: "/run/n.sock"}}}
	srcs := []source{
		{file: "a.yaml", doc: 3, obj: &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "aaa"}, Spec: &nimbusv1.Object_Endpoint{}}},
	}
	conflict := `endpoint "default/aaa": spec.ips "10.1.0.5" is already used by endpoint "default/web-a" in network "net1"`
	be := &controller.BatchError{First: 0, End: 1, Err: status.Error(codes.FailedPrecondition, `objects[0] (Endpoint/default/default/aaa): `+conflict),
		Entries: []controller.BatchEntry{{Index: 0, Field: "spec.ips", Message: conflict}}}
	err := s.batchFailed("applying", "applied", be, func(first, end int) string { return describeSpan(srcs[first:end]) },
		func(i int) string { return fmt.Sprintf("%v: %s", srcs[i], ref(srcs[i].obj.Key())) })
	equal(t, "mapped conflict", err.Error(), `applying a.yaml: document 3 (nothing applied): a.yaml: document 3: endpoint/aaa: `+conflict)
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("status.Code(%v) = %v, want FailedPrecondition", err, status.Code(err))
	}
}
