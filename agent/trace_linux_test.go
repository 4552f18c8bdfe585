package agent

import (
	"net/netip"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// TestTraceTag checks that a Trace's id and nonce follow from its uid alone, the same on
// every node, and differ between uids.
func TestTraceTag(t *testing.T) {
	id, nonce := traceTag("3f2a")
	id2, nonce2 := traceTag("3f2a")
	if id != id2 || nonce != nonce2 {
		t.Fatalf("traceTag of one uid: %#x/%#x, then %#x/%#x", id, nonce, id2, nonce2)
	}
	if id == 0 {
		t.Fatal("traceTag made id 0")
	}
	if other, otherNonce := traceTag("3f2b"); other == id || otherNonce == nonce {
		t.Fatalf("traceTag of two uids: %#x/%#x and %#x/%#x", id, nonce, other, otherNonce)
	}
}

// TestTraceAddresses checks the family a trace's packet takes, and the error that names
// a missing one.
func TestTraceAddresses(t *testing.T) {
	ep := func(ips ...string) *nimbusv1.Object {
		return &nimbusv1.Object{Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Ips: ips}}}
	}
	dual, v6 := ep("10.1.0.2", "fd00::2"), ep("fd00::3")
	for _, tc := range []struct {
		name     string
		spec     *nimbusv1.TraceSpec
		src, dst *nimbusv1.Object
		want     [2]string
		err      string
	}{
		{"ipv4 first", &nimbusv1.TraceSpec{Source: "a"}, dual, ep("10.1.0.3", "fd00::3"), [2]string{"10.1.0.2", "10.1.0.3"}, ""},
		{"ipv6 asked", &nimbusv1.TraceSpec{Source: "a", Family: "ipv6"}, dual, ep("10.1.0.3", "fd00::3"), [2]string{"fd00::2", "fd00::3"}, ""},
		{"ipv6 only", &nimbusv1.TraceSpec{Source: "a"}, dual, v6, [2]string{"fd00::2", "fd00::3"}, ""},
		{"address", &nimbusv1.TraceSpec{Source: "a", DestinationAddress: "10.2.0.9"}, dual, nil, [2]string{"10.1.0.2", "10.2.0.9"}, ""},
		{"no ipv4", &nimbusv1.TraceSpec{Source: "a", Family: "ipv4"}, dual, v6, [2]string{},
			`the source "a" and the destination have no ipv4 addresses to make the packet with`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, d, err := traceAddresses(tc.spec, tc.src, tc.dst)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("traceAddresses = %v, want %s", err, tc.err)
				}
				return
			}
			if err != nil || s != netip.MustParseAddr(tc.want[0]) || d != netip.MustParseAddr(tc.want[1]) {
				t.Fatalf("traceAddresses = %v, %v, %v; want %s", s, d, err, tc.want)
			}
		})
	}
}
