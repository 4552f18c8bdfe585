package nimbusv1

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// kindSeeds is one object of every kind, valid, in its wire form, and a few that are not.
func kindSeeds(f *testing.F) [][]byte {
	objs := []*Object{
		validRoute(),
		{Meta: &ObjectMeta{Name: "host-a"}, Spec: &Object_Node{Node: &NodeSpec{Hostname: "host-a", VtepAddress: "192.0.2.1"}}},
		{Meta: &ObjectMeta{Name: "net1", Tenant: "t1"}, Spec: &Object_Network{Network: &NetworkSpec{Vni: 100, Subnet: "10.1.0.0/24", Gateway: "10.1.0.1",
			Subnets: []*Subnet{{Cidr: "fd00:1::/64", Gateway: "fd00:1::1"}}, Mtu: 1450}}},
		{Meta: &ObjectMeta{Name: "web-a", Labels: map[string]string{"app": "web"}}, Spec: &Object_Endpoint{Endpoint: &EndpointSpec{
			Network: "net1", Node: "host-a", Interface: "veth-web-a", Mac: "02:00:00:00:01:0a", Ips: []string{"10.1.0.5", "fd00:1::5"},
			SecurityGroups: []string{"web"}}}},
		{Meta: &ObjectMeta{Name: "web"}, Spec: &Object_SecurityGroup{SecurityGroup: &SecurityGroupSpec{Cidrs: []string{"10.0.0.0/8", "2001:db8::/32"}}}},
		{Meta: &ObjectMeta{Name: "p"}, Spec: &Object_NetworkSecurityPolicy{NetworkSecurityPolicy: &NetworkSecurityPolicySpec{
			AttachGroups: []string{"web"},
			Ingress:      []*PolicyRule{{Action: PolicyRule_ACTION_ALLOW, FromGroups: []string{"db"}, Protocol: "tcp", Ports: []string{"80", "8000-8080"}}},
			Egress:       []*PolicyRule{{Action: PolicyRule_ACTION_DENY, ToCidrs: []string{"0.0.0.0/0"}}},
		}}},
		{Meta: &ObjectMeta{Name: "eth1", Nodes: []string{"host-a"}}, Spec: &Object_Interface{Interface: &InterfaceSpec{
			Device: "eth1", Mtu: 9000, AdminUp: proto.Bool(true), Addresses: []string{"192.0.2.10/24"}}}},
		{Meta: &ObjectMeta{Name: "bad", CreateTime: &timestamppb.Timestamp{Seconds: 1}}, Spec: &Object_Endpoint{Endpoint: &EndpointSpec{Mac: "ff:ff:ff:ff:ff:ff", Ips: []string{"10.1.0.5/24"}}}},
		{Meta: &ObjectMeta{Name: "Bad_Name"}, Spec: &Object_Route{Route: &RouteSpec{Prefix: "10.0.0.0/33"}}},
		{},
	}
	var out [][]byte
	for _, o := range objs {
		b, err := proto.Marshal(o)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzValidate validates any object the wire can carry, of every kind. Validate must not
// panic, and an object that validates must validate again after a round trip through its
// wire form, encoded and decoded by the generated code of either library. The input is
// taken as nimbus takes a request: decoded by UnmarshalVT, with UTF-8 strings (which
// proto.Unmarshal checks). The two decoders differ on a known field sent with the wrong
// wire type, which proto.Unmarshal keeps as an unknown field and UnmarshalVT refuses: such
// input never reaches Validate in nimbus.
func FuzzValidate(f *testing.F) {
	for _, b := range kindSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var obj, check Object
		if obj.UnmarshalVT(data) != nil || proto.Unmarshal(data, &check) != nil {
			return
		}
		key := obj.Key()
		_ = key.Validate()
		_ = key.ID()
		if obj.Validate() != nil {
			return
		}
		if err := key.Validate(); err != nil {
			t.Fatalf("the object validates, but its key %v does not: %v", key, err)
		}
		for _, trip := range []struct {
			name   string
			encode func(*Object) ([]byte, error)
			decode func(*Object, []byte) error
		}{
			{"proto", func(o *Object) ([]byte, error) { return proto.Marshal(o) }, func(o *Object, b []byte) error { return proto.Unmarshal(b, o) }},
			{"vtproto", (*Object).MarshalVT, (*Object).UnmarshalVT},
		} {
			wire, err := trip.encode(&obj)
			if err != nil {
				t.Fatalf("%s: a valid object does not encode: %v", trip.name, err)
			}
			var again Object
			if err := trip.decode(&again, wire); err != nil {
				t.Fatalf("%s: a valid object's wire form does not decode: %v", trip.name, err)
			}
			if err := again.Validate(); err != nil {
				t.Fatalf("%s: valid object %v no longer validates after a round trip: %v", trip.name, &obj, err)
			}
		}
	})
}

// FuzzPooledFrame decodes any input as a watch frame into a PooledFrame whose storage a
// larger frame used before, and with the generated decoder: both must give the same frame,
// or both fail.
func FuzzPooledFrame(f *testing.F) {
	var events []*WatchEvent
	for i, b := range kindSeeds(f) {
		var o Object
		if err := proto.Unmarshal(b, &o); err != nil {
			f.Fatal(err)
		}
		events = append(events, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: &o, Revision: uint64(i + 1)})
	}
	events = append(events,
		&WatchEvent{Type: WatchEvent_TYPE_PUT, Object: slabRoute(1, 3, true), Revision: 20},
		&WatchEvent{Type: WatchEvent_TYPE_DELETE, Key: NewKey(Kind_KIND_ROUTE, "t", "ns", "gone"), Revision: 21},
		&WatchEvent{Type: WatchEvent_TYPE_SYNCED, Revision: 22, Epoch: "e1"})
	f.Add(marshalFrame(f, events, nil))
	f.Add(marshalFrame(f, events[len(events)-3:], nil))
	f.Add(marshalFrame(f, events[:1], map[int][]byte{0: {0xf8, 0x06, 0x07}}))
	f.Add([]byte{})
	var big []*WatchEvent
	for i := range 64 {
		big = append(big, &WatchEvent{Type: WatchEvent_TYPE_PUT, Object: slabRoute(i, 1+i%4, i%2 == 0), Revision: uint64(i + 1)})
	}
	before := marshalFrame(f, big, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		var p PooledFrame
		defer p.Release()
		receive(t, &p, before)
		copy(p.Reserve(len(data)), data)
		err := p.Decode()
		var want WatchFrame
		wantErr := want.UnmarshalVT(data)
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("PooledFrame.Decode() = %v, UnmarshalVT = %v", err, wantErr)
		case err == nil && !proto.Equal(p.Frame(), &want):
			t.Fatalf("PooledFrame decoded\n%v\nUnmarshalVT\n%v", p.Frame(), &want)
		case err == nil && len(p.Events()) != len(want.Events):
			t.Fatalf("PooledFrame has %d events, UnmarshalVT %d", len(p.Events()), len(want.Events))
		}
	})
}
