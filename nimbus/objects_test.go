package nimbus

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func TestApplyThenGet(t *testing.T) {
	ts := start(t, Options{})
	in := route("r1", []string{"b", "a"}, "192.0.2.1")
	// What nimbus assigns is ignored when a client sends it.
	in.Meta.Uid = "client-uid"
	in.Meta.Generation = 42
	in.Meta.Revision = 99
	in.Meta.CreateTime = ts.clock.Timestamp()
	ts.clock.Advance(time.Hour)

	resp := ts.apply(t, in)
	if !resp.GetChanged() || !resp.GetCreated() {
		t.Errorf("Apply of a new object: changed = %v, created = %v; want both true", resp.GetChanged(), resp.GetCreated())
	}
	got := ts.get(t, routeKey("r1")).GetObject()
	if !proto.Equal(got, resp.GetObject()) {
		t.Errorf("Get = %v, want what Apply returned %v", got, resp.GetObject())
	}
	m := got.GetMeta()
	if !uuidPattern.MatchString(m.GetUid()) {
		t.Errorf("uid = %q, want a UUID v4", m.GetUid())
	}
	if m.GetGeneration() != 1 {
		t.Errorf("generation = %d, want 1", m.GetGeneration())
	}
	if m.GetRevision() != 1 {
		t.Errorf("revision = %d, want 1", m.GetRevision())
	}
	if m.GetTenant() != "default" || m.GetNamespace() != "default" {
		t.Errorf("tenant/namespace = %q/%q, want default/default", m.GetTenant(), m.GetNamespace())
	}
	if !slices.Equal(m.GetNodes(), []string{"a", "b"}) {
		t.Errorf("nodes = %q, want [a b]", m.GetNodes())
	}
	now := ts.clock.Timestamp()
	if !proto.Equal(m.GetCreateTime(), now) || !proto.Equal(m.GetUpdateTime(), now) {
		t.Errorf("create/update time = %v/%v, want both %v", m.GetCreateTime().AsTime(), m.GetUpdateTime().AsTime(), now.AsTime())
	}
	if !proto.Equal(got.GetRoute(), in.GetRoute()) {
		t.Errorf("spec = %v, want %v", got.GetRoute(), in.GetRoute())
	}
}

func TestApplyAgain(t *testing.T) {
	for _, tc := range []struct {
		name        string
		change      func(o *nimbusv1.Object)
		wantChanged bool
		wantGen     int64
	}{
		{name: "identical", change: func(*nimbusv1.Object) {}, wantGen: 1},
		{name: "nodes reordered", change: func(o *nimbusv1.Object) { o.Meta.Nodes = []string{"b", "a", "a"} }, wantGen: 1},
		{name: "next hop changed", change: func(o *nimbusv1.Object) { o.GetRoute().Nexthops[0].Gateway = "192.0.2.2" }, wantChanged: true, wantGen: 2},
		{name: "next hop added", change: func(o *nimbusv1.Object) {
			o.GetRoute().Nexthops = append(o.GetRoute().Nexthops, &nimbusv1.NextHop{Gateway: "192.0.2.3"})
		}, wantChanged: true, wantGen: 2},
		{name: "labels only", change: func(o *nimbusv1.Object) { o.Meta.Labels = map[string]string{"app": "web"} }, wantChanged: true, wantGen: 1},
		{name: "nodes changed", change: func(o *nimbusv1.Object) { o.Meta.Nodes = []string{"a"} }, wantChanged: true, wantGen: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := start(t, Options{})
			first := ts.apply(t, route("r1", []string{"a", "b"}, "192.0.2.1")).GetObject()
			ts.clock.Advance(time.Minute)

			in := route("r1", []string{"a", "b"}, "192.0.2.1")
			tc.change(in)
			resp := ts.apply(t, in)
			if resp.GetChanged() != tc.wantChanged || resp.GetCreated() {
				t.Errorf("changed = %v, created = %v; want %v, false", resp.GetChanged(), resp.GetCreated(), tc.wantChanged)
			}
			got := ts.get(t, routeKey("r1")).GetObject()
			m, fm := got.GetMeta(), first.GetMeta()
			if m.GetGeneration() != tc.wantGen {
				t.Errorf("generation = %d, want %d", m.GetGeneration(), tc.wantGen)
			}
			if m.GetUid() != fm.GetUid() || !proto.Equal(m.GetCreateTime(), fm.GetCreateTime()) {
				t.Errorf("uid/create time changed: %s %v, first %s %v", m.GetUid(), m.GetCreateTime().AsTime(), fm.GetUid(), fm.GetCreateTime().AsTime())
			}
			if !tc.wantChanged {
				if !proto.Equal(got, first) {
					t.Errorf("unchanged apply modified the object: %v, was %v", got, first)
				}
				return
			}
			if m.GetRevision() <= fm.GetRevision() {
				t.Errorf("revision = %d, want more than %d", m.GetRevision(), fm.GetRevision())
			}
			if fm.GetGenerationRevision() != fm.GetRevision() {
				t.Errorf("created with generation revision %d, want its revision %d", fm.GetGenerationRevision(), fm.GetRevision())
			}
			// The generation revision is the revision of the change that made the generation.
			wantGenRev := fm.GetRevision()
			if tc.wantGen != fm.GetGeneration() {
				wantGenRev = m.GetRevision()
			}
			if m.GetGenerationRevision() != wantGenRev {
				t.Errorf("generation revision = %d, want %d", m.GetGenerationRevision(), wantGenRev)
			}
			if !proto.Equal(m.GetUpdateTime(), ts.clock.Timestamp()) {
				t.Errorf("update time = %v, want %v", m.GetUpdateTime().AsTime(), ts.clock.Now())
			}
			if !proto.Equal(got.GetRoute(), in.GetRoute()) {
				t.Errorf("spec = %v, want %v", got.GetRoute(), in.GetRoute())
			}
		})
	}
}

func TestApplyRefusesInvalidObjects(t *testing.T) {
	ts := start(t, Options{})
	hostBits := route("r1", nil, "192.0.2.1")
	hostBits.GetRoute().Prefix = "10.1.2.3/16"
	badLength := route("r1", nil, "192.0.2.1")
	badLength.GetRoute().Prefix = "10.0.0.0/33"
	for _, tc := range []struct {
		name string
		obj  *nimbusv1.Object
		want string
	}{
		{name: "prefix length", obj: badLength, want: `spec.prefix "10.0.0.0/33": prefix length out of range`},
		{name: "gateway", obj: route("r1", nil, "nope"), want: `spec.nexthops[0].gateway "nope"`},
		{name: "host bits", obj: hostBits, want: `spec.prefix "10.1.2.3/16": host bits set`},
		{name: "missing name", obj: route("", nil, "192.0.2.1"), want: `meta.name "": is required`},
		{name: "bad node", obj: route("r1", []string{"Node_A"}, "192.0.2.1"), want: `meta.nodes[0] "Node_A"`},
		{name: "no spec", obj: &nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "r1"}}, want: `spec "": is required`},
		{name: "no object", obj: nil, want: `object "": is required`},
		{name: "multicast mac", obj: endpoint("ep1", "net1", "host-a", "", "01:00:5e:00:00:01"),
			want: `spec.mac "01:00:5e:00:00:01": a multicast or broadcast address`},
		{name: "broadcast mac", obj: endpoint("ep1", "net1", "host-a", "", "ff:ff:ff:ff:ff:ff"),
			want: `spec.mac "ff:ff:ff:ff:ff:ff": a multicast or broadcast address`},
		{name: "zero mac", obj: endpoint("ep1", "net1", "host-a", "", "00:00:00:00:00:00"),
			want: `spec.mac "00:00:00:00:00:00": the all-zero address`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: tc.obj})
			st := wantCode(t, err, codes.InvalidArgument)
			if !strings.Contains(st.Message(), tc.want) {
				t.Errorf("message = %q, want it to contain %q", st.Message(), tc.want)
			}
		})
	}
	list, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetItems()) != 0 || list.GetRevision() != 0 {
		t.Errorf("List after refused applies = %d items at revision %d, want none at 0", len(list.GetItems()), list.GetRevision())
	}
}

func TestDelete(t *testing.T) {
	ts := start(t, Options{})
	ctx := testContext(t)
	applied := ts.apply(t, route("r1", nil, "192.0.2.1")).GetObject()

	// An explicit default tenant and namespace name the same object as empty ones.
	key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "default", "default", "r1")
	resp, err := ts.client.Delete(ctx, &nimbusv1.DeleteRequest{Key: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Name: "r1"}})
	if err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if !resp.GetFound() || resp.GetRevision() != applied.GetMeta().GetRevision()+1 {
		t.Errorf("Delete = found %v revision %d, want found at revision %d", resp.GetFound(), resp.GetRevision(), applied.GetMeta().GetRevision()+1)
	}

	_, err = ts.client.Get(ctx, &nimbusv1.GetRequest{Key: key})
	st := wantCode(t, err, codes.NotFound)
	if !strings.Contains(st.Message(), key.ID()) {
		t.Errorf("NotFound message %q does not name %s", st.Message(), key.ID())
	}

	again, err := ts.client.Delete(ctx, &nimbusv1.DeleteRequest{Key: key})
	if err != nil {
		t.Fatalf("second Delete: %v", err)
	}
	if again.GetFound() || again.GetRevision() != resp.GetRevision() {
		t.Errorf("second Delete = found %v revision %d, want not found at revision %d", again.GetFound(), again.GetRevision(), resp.GetRevision())
	}
}

func TestBadKeys(t *testing.T) {
	ts := start(t, Options{})
	ctx := testContext(t)
	for _, tc := range []struct {
		name string
		key  *nimbusv1.ObjectKey
		want string
	}{
		{name: "no key", key: nil, want: `key.name "": is required`},
		{name: "no kind", key: &nimbusv1.ObjectKey{Name: "r1"}, want: `key.kind "KIND_UNSPECIFIED": unknown kind`},
		{name: "bad name", key: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Name: "R 1"}, want: `key.name "R 1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ts.client.Delete(ctx, &nimbusv1.DeleteRequest{Key: tc.key})
			if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), tc.want) {
				t.Errorf("Delete message = %q, want it to contain %q", st.Message(), tc.want)
			}
			_, err = ts.client.Get(ctx, &nimbusv1.GetRequest{Key: tc.key})
			if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), tc.want) {
				t.Errorf("Get message = %q, want it to contain %q", st.Message(), tc.want)
			}
		})
	}
}

func TestList(t *testing.T) {
	ts := start(t, Options{})
	objs := []*nimbusv1.Object{
		route("r2", nil, "192.0.2.1"),
		route("r1", nil, "192.0.2.1"),
		nodeObject("n1"),
		route("r3", nil, "192.0.2.1"),
		route("r1", nil, "192.0.2.1"),
	}
	objs[3].Meta.Tenant = "blue"
	objs[4].Meta.Namespace = "prod"
	for _, o := range objs {
		ts.apply(t, o)
	}
	for _, tc := range []struct {
		name string
		req  *nimbusv1.ListRequest
		want []string
	}{
		{name: "all", req: &nimbusv1.ListRequest{}, want: []string{
			"Node/default/default/n1", "Route/blue/default/r3", "Route/default/default/r1",
			"Route/default/default/r2", "Route/default/prod/r1",
		}},
		{name: "routes", req: &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE}, want: []string{
			"Route/blue/default/r3", "Route/default/default/r1", "Route/default/default/r2", "Route/default/prod/r1",
		}},
		{name: "nodes", req: &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_NODE}, want: []string{"Node/default/default/n1"}},
		{name: "networks", req: &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_NETWORK}},
		{name: "tenant", req: &nimbusv1.ListRequest{Tenant: "blue"}, want: []string{"Route/blue/default/r3"}},
		{name: "namespace", req: &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE, Namespace: "prod"}, want: []string{"Route/default/prod/r1"}},
		{name: "tenant and namespace", req: &nimbusv1.ListRequest{Tenant: "default", Namespace: "default"}, want: []string{
			"Node/default/default/n1", "Route/default/default/r1", "Route/default/default/r2",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := ts.client.List(testContext(t), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, it := range resp.GetItems() {
				got = append(got, it.GetObject().Key().ID())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("List = %q, want %q", got, tc.want)
			}
			if resp.GetRevision() != uint64(len(objs)) {
				t.Errorf("revision = %d, want %d", resp.GetRevision(), len(objs))
			}
		})
	}
}
