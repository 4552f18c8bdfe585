package delphi

import (
	"slices"
	"testing"

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

func TestReferenceIndexes(t *testing.T) {
	s, d, _ := open(t)
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
		name string
		got  []*nimbusv1.Object
		want []string
	}{
		{"EndpointsOn(blue)", s.EndpointsOn(ScopedName(netKey)), []string{"ep-1", "ep-2"}},
		{"EndpointsOn(t2 blue)", s.EndpointsOn("t2/default/blue"), []string{"ep-4"}},
		{"EndpointsOn(red)", s.EndpointsOn("default/default/red"), []string{"ep-3"}},
		{"EndpointsOn(unscoped name)", s.EndpointsOn("blue"), nil},
		{"EndpointsInGroup(web)", s.EndpointsInGroup("default/default/web"), []string{"ep-1", "ep-2"}},
		{"EndpointsInGroup(db)", s.EndpointsInGroup("default/default/db"), []string{"ep-1"}},
		{"PoliciesFor(web)", s.PoliciesFor("default/default/web"), []string{"allow-both", "allow-web"}},
		{"PoliciesFor(db)", s.PoliciesFor("default/default/db"), []string{"allow-both"}},
		{"PoliciesFor(t2 web)", s.PoliciesFor("t2/default/web"), []string{"t2-web"}},
		{"ObjectsFor(host-a)", s.ObjectsFor("host-a"), []string{"ep-1", "ep-2", "ep-4"}},
		{"ObjectsFor(host-b)", s.ObjectsFor("host-b"), []string{"ep-2"}},
		{"RoutesInTable(100)", s.RoutesInTable(100), []string{"r1", "r2"}},
		{"RoutesInTable(10)", s.RoutesInTable(10), []string{"r3"}},
		{"RoutesInTable(1)", s.RoutesInTable(1), nil},
	}
	for _, tt := range tests {
		if got := names(tt.got); !slices.Equal(got, tt.want) {
			t.Errorf("%s = %v, want %v", tt.name, got, tt.want)
		}
	}

	// Changing and deleting objects moves and drops their index entries.
	commit(t, d, func(txn *DesiredTxn) {
		txn.Put(endpoint("", "", "ep-1", "red", []string{"db"}))
		txn.Delete(nimbusv1.NewKey(nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, "", "", "allow-web"))
		txn.Put(route("r2", 10, "10.2.0.0/24", "10.0.0.1"))
	})
	after := []struct {
		name string
		got  []*nimbusv1.Object
		want []string
	}{
		{"EndpointsOn(blue)", s.EndpointsOn("default/default/blue"), []string{"ep-2"}},
		{"EndpointsOn(red)", s.EndpointsOn("default/default/red"), []string{"ep-1", "ep-3"}},
		{"EndpointsInGroup(web)", s.EndpointsInGroup("default/default/web"), []string{"ep-2"}},
		{"PoliciesFor(web)", s.PoliciesFor("default/default/web"), []string{"allow-both"}},
		{"ObjectsFor(host-a)", s.ObjectsFor("host-a"), []string{"ep-2", "ep-4"}},
		{"RoutesInTable(100)", s.RoutesInTable(100), []string{"r1"}},
		{"RoutesInTable(10)", s.RoutesInTable(10), []string{"r2", "r3"}},
	}
	for _, tt := range after {
		if got := names(tt.got); !slices.Equal(got, tt.want) {
			t.Errorf("after changes: %s = %v, want %v", tt.name, got, tt.want)
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
