package delphi

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func endpoint(tenant, namespace, name, network string, groups []string, nodes ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: tenant, Namespace: namespace, Name: name, Nodes: nodes},
		Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Network: network, SecurityGroups: groups}},
	}
}

func policy(tenant, namespace, name string, groups ...string) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: tenant, Namespace: namespace, Name: name},
		Spec: &nimbusv1.Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &nimbusv1.NetworkSecurityPolicySpec{AttachGroups: groups}},
	}
}

// testIndexes are indexes of the kind reconcilers declare: by reference (scoped names),
// by target node and by a value derived from the spec.
var testIndexes = []Index{
	{Name: "network", Values: func(o *nimbusv1.Object) []string {
		if n := o.GetEndpoint().GetNetwork(); n != "" {
			return []string{ScopedName(nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, o.GetMeta().GetTenant(), o.GetMeta().GetNamespace(), n))}
		}
		return nil
	}},
	{Name: "group", Values: func(o *nimbusv1.Object) []string {
		return scopedAll(o, o.GetEndpoint().GetSecurityGroups())
	}},
	{Name: "attach_group", Values: func(o *nimbusv1.Object) []string {
		return scopedAll(o, o.GetNetworkSecurityPolicy().GetAttachGroups())
	}},
	{Name: "node", Values: func(o *nimbusv1.Object) []string { return o.GetMeta().GetNodes() }},
	{Name: "route_table", Values: func(o *nimbusv1.Object) []string {
		if rt := o.GetRoute(); rt != nil {
			return []string{fmt.Sprint(rt.GetTable())}
		}
		return nil
	}},
}

func scopedAll(o *nimbusv1.Object, names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, ScopedName(nimbusv1.NewKey(nimbusv1.Kind_KIND_SECURITY_GROUP, o.GetMeta().GetTenant(), o.GetMeta().GetNamespace(), n)))
	}
	return out
}

func lookup(t *testing.T, s *Store, index, value string) []string {
	t.Helper()
	objs, err := s.Lookup(index, value)
	if err != nil {
		t.Fatalf("Lookup(%s, %s): %v", index, value, err)
	}
	return names(objs)
}

func TestDeclaredIndexes(t *testing.T) {
	s, d, _ := openWith(t, Options{Indexes: testIndexes})
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(endpoint("", "", "ep-1", "blue", []string{"web", "db"}, "host-a"))
		txn.Put(endpoint("", "", "ep-2", "blue", []string{"web"}, "host-a", "host-b"))
		txn.Put(endpoint("", "", "ep-3", "red", nil))
		// The same names in another tenant are other objects.
		txn.Put(endpoint("t2", "", "ep-4", "blue", []string{"web"}, "host-a"))
		txn.Put(policy("", "", "allow-web", "web"))
		txn.Put(policy("", "", "allow-both", "web", "db"))
		txn.Put(policy("t2", "", "t2-web", "web"))
		txn.Put(route("r1", 100, "10.1.0.0/24", "10.0.0.1"))
		txn.Put(route("r2", 100, "10.2.0.0/24", "10.0.0.1"))
		txn.Put(route("r3", 10, "10.3.0.0/24", "10.0.0.1"))
	})
	netKey := nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK, "", "", "blue")
	tests := []struct {
		index, value string
		want         []string
	}{
		{"network", ScopedName(netKey), []string{"ep-1", "ep-2"}},
		{"network", "t2/default/blue", []string{"ep-4"}},
		{"network", "default/default/red", []string{"ep-3"}},
		{"network", "blue", nil},
		{"group", "default/default/web", []string{"ep-1", "ep-2"}},
		{"group", "default/default/db", []string{"ep-1"}},
		{"attach_group", "default/default/web", []string{"allow-both", "allow-web"}},
		{"attach_group", "default/default/db", []string{"allow-both"}},
		{"attach_group", "t2/default/web", []string{"t2-web"}},
		{"node", "host-a", []string{"ep-1", "ep-2", "ep-4"}},
		{"node", "host-b", []string{"ep-2"}},
		{"route_table", "100", []string{"r1", "r2"}},
		{"route_table", "10", []string{"r3"}},
		{"route_table", "1", nil},
	}
	for _, tt := range tests {
		if got := lookup(t, s, tt.index, tt.value); !slices.Equal(got, tt.want) {
			t.Errorf("Lookup(%s, %s) = %v, want %v", tt.index, tt.value, got, tt.want)
		}
		obj, id, err := s.LookupFirst(tt.index, tt.value)
		switch {
		case err != nil:
			t.Errorf("LookupFirst(%s, %s): %v", tt.index, tt.value, err)
		case len(tt.want) == 0 && (obj != nil || !id.IsZero()):
			t.Errorf("LookupFirst(%s, %s) = %s; want none", tt.index, tt.value, id)
		case len(tt.want) > 0 && (obj.GetMeta().GetName() != tt.want[0] || id != obj.TypedKey()):
			t.Errorf("LookupFirst(%s, %s) = %v, %s; want %s", tt.index, tt.value, obj.GetMeta().GetName(), id, tt.want[0])
		}
		if first, err := s.LookupFirstKey(tt.index, tt.value); err != nil || first != id {
			t.Errorf("LookupFirstKey(%s, %s) = %q, %v; want %q as LookupFirst", tt.index, tt.value, first, err, id)
		}
		objs, _ := s.Lookup(tt.index, tt.value)
		var wantKeys []nimbusv1.Key
		for _, o := range objs {
			wantKeys = append(wantKeys, o.TypedKey())
		}
		if keys, err := s.LookupKeys(tt.index, tt.value); err != nil || !slices.Equal(keys, wantKeys) {
			t.Errorf("LookupKeys(%s, %s) = %q, %v; want %q, the keys of Lookup", tt.index, tt.value, keys, err, wantKeys)
		}
	}

	// Changing and deleting objects moves and drops their index entries.
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(endpoint("", "", "ep-1", "red", []string{"db"}))
		txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "", "", "allow-web"))
		txn.Put(route("r2", 10, "10.2.0.0/24", "10.0.0.1"))
	})
	after := []struct {
		index, value string
		want         []string
	}{
		{"network", "default/default/blue", []string{"ep-2"}},
		{"network", "default/default/red", []string{"ep-1", "ep-3"}},
		{"group", "default/default/web", []string{"ep-2"}},
		{"attach_group", "default/default/web", []string{"allow-both"}},
		{"node", "host-a", []string{"ep-2", "ep-4"}},
		{"route_table", "100", []string{"r1"}},
		{"route_table", "10", []string{"r2", "r3"}},
	}
	for _, tt := range after {
		if got := lookup(t, s, tt.index, tt.value); !slices.Equal(got, tt.want) {
			t.Errorf("after changes: Lookup(%s, %s) = %v, want %v", tt.index, tt.value, got, tt.want)
		}
	}

	// An index nobody declared is an error, not an empty answer.
	for _, index := range []string{"route_dst", "id", "kind"} {
		if _, _, err := s.LookupFirst(index, "x"); !errors.Is(err, ErrUnknownIndex) {
			t.Errorf("LookupFirst(%s) error = %v, want ErrUnknownIndex", index, err)
		}
		if _, err := s.Lookup(index, "x"); !errors.Is(err, ErrUnknownIndex) {
			t.Errorf("Lookup(%s) error = %v, want ErrUnknownIndex", index, err)
		}
		if _, err := s.LookupFirstKey(index, "x"); !errors.Is(err, ErrUnknownIndex) {
			t.Errorf("LookupFirstKey(%s) error = %v, want ErrUnknownIndex", index, err)
		}
		if _, err := s.LookupKeys(index, "x"); !errors.Is(err, ErrUnknownIndex) {
			t.Errorf("LookupKeys(%s) error = %v, want ErrUnknownIndex", index, err)
		}
	}
}

func TestIndexDeclarationsChecked(t *testing.T) {
	values := func(*nimbusv1.Object) []string { return nil }
	for _, tt := range []struct {
		name    string
		indexes []Index
		want    string
	}{
		{"no name", []Index{{Values: values}}, "Options.Indexes[0].Name: is required"},
		{"no values", []Index{{Name: "x"}}, `Options.Indexes[0].Values (index "x"): is required`},
		{"twice", []Index{{Name: "x", Values: values}, {Name: "x", Values: values}}, `Options.Indexes[1].Name "x"`},
		{"built in", []Index{{Name: "kind", Values: values}}, `Options.Indexes[0].Name "kind"`},
	} {
		s, err := Open(Options{Indexes: tt.indexes})
		if err == nil {
			s.Close()
			t.Errorf("%s: Open succeeded", tt.name)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Open error = %v, want it to say %q", tt.name, err, tt.want)
		}
	}
}

func TestKeySubscription(t *testing.T) {
	s, d, st := open(t)
	key := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "watched")
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("watched", 1, "10.0.0.0/8", "10.0.0.1"))
		txn.Put(route("other", 1, "10.0.0.0/8", "10.0.0.1"))
	})
	sub, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired, TableStatus}, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if got := next(t, sub); !slices.Equal(got, []string{key.ID()}) {
		t.Fatalf("first Next = %v, want only the watched key", got)
	}

	// Changes to other keys, of the same kind or the same name, are not handed out.
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(route("other", 2, "10.0.0.0/8", "10.0.0.1"))
		txn.Put(&nimbusv1.Object{Meta: &nimbusv1.ObjectMeta{Name: "watched"}, Spec: &nimbusv1.Object_Node{Node: &nimbusv1.NodeSpec{}}})
	})
	if err := st.Set(nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "other"), &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED}); err != nil {
		t.Fatal(err)
	}
	if pending(sub) {
		t.Fatal("a change to another key was handed out")
	}

	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("watched", 2, "10.0.0.0/8", "10.0.0.1")) })
	if got := next(t, sub); !slices.Equal(got, []string{key.ID()}) {
		t.Errorf("Next after a change = %v", got)
	}
	if err := st.Set(key, &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED, UpdateTime: timestamppb.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := next(t, sub); !slices.Equal(got, []string{key.ID()}) {
		t.Errorf("Next after a status change = %v", got)
	}
	commit(t, d, func(txn *DesiredTxn) { txn.Delete(key) })
	if got := next(t, sub); !slices.Equal(got, []string{key.ID()}) {
		t.Errorf("Next after delete = %v", got)
	}
	if _, ok := s.Get(key); ok {
		t.Error("the watched key survived its delete")
	}

	// A subscription to an absent key starts with nothing and hears of its creation.
	absent := nimbusv1.NewKey(nimbusv1.Kind_KIND_ROUTE, "", "", "later")
	later, err := s.Subscribe(SubscribeOptions{Tables: []Table{TableDesired}, Key: absent})
	if err != nil {
		t.Fatal(err)
	}
	defer later.Close()
	if pending(later) {
		t.Error("a subscription to an absent key starts with a key")
	}
	commit(t, d, func(txn *DesiredTxn) { txn.Put(route("later", 1, "10.0.0.0/8", "10.0.0.1")) })
	if got := next(t, later); !slices.Equal(got, []string{absent.ID()}) {
		t.Errorf("Next after creation = %v", got)
	}
}

// TestPutOwnedKeepsNoViews stores an object decoded as nimbusclient decodes it, with
// every string a view of the received bytes, and a resume point whose epoch is such a
// view, then overwrites those bytes: what delphi stored and indexed is unchanged, so it
// kept copies and no view of them.
func TestPutOwnedKeepsNoViews(t *testing.T) {
	s, d, _ := openWith(t, Options{Indexes: testIndexes})
	want := endpoint("", "", "ep-1", "blue", []string{"web"}, "host-a")
	wire, err := want.MarshalVT()
	if err != nil {
		t.Fatal(err)
	}
	received := &nimbusv1.Object{}
	if err := received.UnmarshalVTUnsafe(wire); err != nil {
		t.Fatal(err)
	}
	epochBytes := []byte("epoch-1")
	epoch := unsafe.String(&epochBytes[0], len(epochBytes)) // as a decoded event's epoch
	commit(t, d, func(txn *DesiredTxn) {
		txn.PutOwned(received)
		txn.SetResume(epoch, 7)
	})
	clear(wire)
	clear(epochBytes)
	received = nil
	runtime.GC() // drops any decoded object delphi caches, so reads decode what it stored

	if got, _ := s.Get(want.Key()); !proto.Equal(got, want) {
		t.Errorf("stored object after its received bytes were overwritten = %v, want %v", got, want)
	}
	if e, rev := s.Resume(); e != "epoch-1" || rev != 7 {
		t.Errorf("resume point after its received bytes were overwritten = %q %d, want epoch-1 7", e, rev)
	}
	for _, tt := range []struct{ index, value string }{
		{"network", "default/default/blue"}, {"group", "default/default/web"}, {"node", "host-a"},
	} {
		if got := lookup(t, s, tt.index, tt.value); !slices.Equal(got, []string{"ep-1"}) {
			t.Errorf("Lookup(%s, %s) after the received bytes were overwritten = %v, want [ep-1]", tt.index, tt.value, got)
		}
	}
}

// TestIndexValuesInRecord: a record holds the values it is listed under in one string of
// its own, with their indexes, whether a transaction put it or a restore read it, and
// every entry of the indexes holds its value as a part of that string; lookups find the
// records by every value.
func TestIndexValuesInRecord(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(endpoint("", "", "ep-1", "blue", []string{"web", "db"}, "host-a"))
		txn.Put(endpoint("", "", "ep-2", "blue", []string{"db"}, "host-a", "host-b"))
	})
	commit(t, d, func(txn *DesiredTxn) { txn.Put(endpoint("", "", "ep-3", "blue", nil, "host-a")) })
	want := map[string][]string{
		"ep-1": {"network=default/default/blue", "group=default/default/web", "group=default/default/db", "node=host-a"},
		"ep-2": {"network=default/default/blue", "group=default/default/db", "node=host-a", "node=host-b"},
		"ep-3": {"network=default/default/blue", "node=host-a"},
	}
	check := func(s *Store, when string) {
		t.Helper()
		st := s.desired.Load()
		for name, values := range want {
			rec, ok := st.byID.Get(&record{key: nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "", "", name)})
			if !ok {
				t.Fatalf("%s: no record of %s", when, name)
			}
			var got []string
			for pos, val := range rec.indexedValues() {
				got = append(got, testIndexes[pos].Name+"="+val)
			}
			if !slices.Equal(got, values) {
				t.Errorf("%s: the values of %s = %q, want %q", when, name, got, values)
			}
		}
		within := func(val, in string) bool {
			p, lo := uintptr(unsafe.Pointer(unsafe.StringData(val))), uintptr(unsafe.Pointer(unsafe.StringData(in)))
			return len(val) > 0 && p >= lo && p+uintptr(len(val)) <= lo+uintptr(len(in))
		}
		entries := 0
		for i, ix := range st.indexes {
			ix.Scan(func(e indexEntry) bool {
				entries++
				if !within(e.val(), e.rec.indexed()) {
					t.Errorf("%s: index %s lists %s under %q, not a part of its record's values", when, testIndexes[i].Name, e.rec.key, e.val())
				}
				return true
			})
		}
		if entries != 10 {
			t.Errorf("%s: the indexes hold %d entries, want 10", when, entries)
		}
		for _, tt := range []struct {
			index, value string
			want         []string
		}{
			{"network", "default/default/blue", []string{"ep-1", "ep-2", "ep-3"}},
			{"group", "default/default/db", []string{"ep-1", "ep-2"}},
			{"node", "host-b", []string{"ep-2"}},
		} {
			if got := lookup(t, s, tt.index, tt.value); !slices.Equal(got, tt.want) {
				t.Errorf("%s: Lookup(%s, %s) = %v, want %v", when, tt.index, tt.value, got, tt.want)
			}
		}
	}
	check(s, "after the transactions")
	s.Close()
	s, _ = openDir(t, dir)
	check(s, "after a restore")
}

// TestLayoutIndexedShares: a record's values that another one holds, or that begin with
// what another ends with, share their bytes, and read back as they were, in order.
func TestLayoutIndexedShares(t *testing.T) {
	const net = "Network/default/default/blue"
	for _, tt := range []struct {
		name   string
		parts  []indexPart
		values int // the length of the values laid out
	}{
		{"an endpoint's", []indexPart{{pos: 0, val: net}, {pos: 1, val: "node-3"},
			{pos: 3, val: "02:00:00:00:00:01|" + net}, {pos: 4, val: net + "|10.64.1.1"}, {pos: 4, val: net + "|fd00::1"}},
			len("02:00:00:00:00:01|" + net + "|10.64.1.1" + net + "|fd00::1" + "node-3")},
		{"none shared", []indexPart{{pos: 0, val: "a"}, {pos: 1, val: "bc"}}, 3},
		{"one held twice", []indexPart{{pos: 0, val: "abc"}, {pos: 1, val: "abc"}, {pos: 2, val: ""}}, 3},
		{"ending with another's beginning", []indexPart{{pos: 0, val: "xyab"}, {pos: 1, val: "abcd"}}, 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			indexed := appendIndexed(nil, slices.Clone(tt.parts))
			row := append(newRow(0, indexed), indexed...)
			r := &record{row: string(row)}
			var got, want []string
			for pos, val := range r.indexedValues() {
				got = append(got, fmt.Sprint(pos, "=", val))
			}
			for _, p := range tt.parts {
				want = append(want, fmt.Sprint(p.pos, "=", p.val))
			}
			if !slices.Equal(got, want) {
				t.Errorf("values = %q, want %q", got, want)
			}
			size, n := stringUvarint(r.indexed())
			if laid := len(r.indexed()) - n - int(size); laid != tt.values {
				t.Errorf("the values take %d bytes, want %d", laid, tt.values)
			}
		})
	}
}

// TestRecordLeavesOutKey: a record's data leaves out the meta's tenant, namespace and
// name that equal its key's, and Get and a restore give back the object as it was put,
// with those it did not leave out (an empty tenant, say) as they were.
func TestRecordLeavesOutKey(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	objs := []*nimbusv1.Object{
		endpoint("default", "default", "ep-1", "blue", []string{"web"}, "host-a"),
		endpoint("", "prod", "ep-2", "blue", nil),
		endpoint("acme", "", "ep-3", "blue", nil),
		endpoint("", "", "ep-4", "", nil),
		endpoint("acme", "prod", "ep-5", "", nil),
	}
	objs[0].Meta.Generation = 7
	commit(t, d, func(txn *DesiredTxn) {
		for _, o := range objs {
			txn.Put(o)
		}
	})
	check := func(s *Store, when string) {
		t.Helper()
		for _, want := range objs {
			key := want.TypedKey()
			got, ok := s.Get(key.Proto())
			if !ok || !proto.Equal(got, want) {
				t.Errorf("%s: Get(%s) = %v, %v; want %v", when, key, got, ok, want)
			}
		}
		rec, _ := s.desired.Load().byID.Get(probe(objs[4].TypedKey()))
		b, left := rec.wire()
		if left != leftTenant|leftNamespace|leftName || len(rec.data()) != 1+len(b) || bytes.Contains(b, []byte("ep-5")) {
			t.Errorf("%s: the record of ep-5 holds %q, which leaves out %b; want its key left out", when, rec.data(), left)
		}
		rec, _ = s.desired.Load().byID.Get(probe(objs[0].TypedKey()))
		if gen := rec.generation(); gen != 7 {
			t.Errorf("%s: the generation read from ep-1's data is %d, want 7", when, gen)
		}
	}
	check(s, "after the transaction")
	s.Close()
	s, _ = openDir(t, dir)
	check(s, "after a restore")
}

// TestKeysShareTenantAndNamespace: records of one tenant and namespace hold one string of
// each, whether a transaction put them, from objects whose strings are views of received
// bytes, or a restore read them; each holds its name apart.
func TestKeysShareTenantAndNamespace(t *testing.T) {
	dir := t.TempDir()
	s, d := openDir(t, dir)
	names := []string{"ep-1", "ep-2", "ep-3"}
	var wires [][]byte
	commit(t, d, func(txn *DesiredTxn) {
		for _, name := range names {
			wire, err := endpoint("acme", "prod", name, "blue", nil, "host-a").MarshalVT()
			if err != nil {
				t.Fatal(err)
			}
			received := &nimbusv1.Object{}
			if err := received.UnmarshalVTUnsafe(wire); err != nil {
				t.Fatal(err)
			}
			txn.PutOwned(received)
			wires = append(wires, wire)
		}
	})
	for _, wire := range wires {
		clear(wire)
	}
	check := func(s *Store, when string) {
		t.Helper()
		var tenants, namespaces, ownNames []*byte
		for _, name := range names {
			key := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, "acme", "prod", name)
			rec, ok := s.desired.Load().byID.Get(&record{key: key})
			if !ok {
				t.Fatalf("%s: no record of %s", when, key)
			}
			if rec.key != key {
				t.Errorf("%s: the record of %s holds the key %s", when, key, rec.key)
			}
			tenants = append(tenants, unsafe.StringData(rec.key.Tenant))
			namespaces = append(namespaces, unsafe.StringData(rec.key.Namespace))
			ownNames = append(ownNames, unsafe.StringData(rec.key.Name))
		}
		distinct := func(ps []*byte) int {
			set := map[*byte]bool{}
			for _, p := range ps {
				set[p] = true
			}
			return len(set)
		}
		got := [3]int{distinct(tenants), distinct(namespaces), distinct(ownNames)}
		if want := [3]int{1, 1, len(names)}; got != want {
			t.Errorf("%s: the records' keys hold %v strings of their tenants, namespaces and names, want %v", when, got, want)
		}
	}
	check(s, "after the transaction")
	s.Close()
	s, _ = openDir(t, dir)
	check(s, "after a restore")
}

// TestRecordGeneration: a record reads its object's generation from its wire form, and
// fits the 96-byte size class without keeping it apart.
func TestRecordGeneration(t *testing.T) {
	s, _, _ := openWith(t, Options{Indexes: testIndexes})
	for _, gen := range []int64{0, 1, 300, 1 << 40} {
		obj := endpoint("t", "ns", "ep-1", "blue", []string{"web"}, "host-a")
		obj.Meta.Uid, obj.Meta.Generation, obj.Meta.Revision = "u-1", gen, 9
		rec, err := s.newRecord(obj)
		if err != nil {
			t.Fatal(err)
		}
		if got := rec.generation(); got != gen {
			t.Errorf("generation() of an object at generation %d = %d", gen, got)
		}
	}
	if n := unsafe.Sizeof(record{}); n > 80 {
		t.Errorf("a record takes %d bytes; want it to fit the 80-byte size class", n)
	}
}
