package firewall

import (
	"errors"
	"net/netip"
	"testing"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

func TestKeyString(t *testing.T) {
	tests := []struct {
		key  Key
		want string
	}{
		{EndpointKey(7), "endpoint ifindex=7"},
		{IdentityKey(0x9a3c, netip.MustParsePrefix("10.1.0.0/16")), "identity scope=0x9a3c 10.1.0.0/16"},
		{IdentityKey(1, netip.MustParsePrefix("fd00::1/128")), "identity scope=0x1 fd00::1/128"},
		{IdentityKey(1, netip.MustParsePrefix("::ffff:10.0.0.0/104")), "identity scope=0x1 ::ffff:10.0.0.0/104"},
		{PolicyKey(0x1a2b, DirIngress, ClassTCP, 0x33, 8000, 10),
			"policy subject=0x1a2b dir=ingress class=tcp identity=0x33 ports=8000-8063"},
		{PolicyKey(0x1a2b, DirEgress, ClassOther, AnyIdentity, 0, 0),
			"policy subject=0x1a2b dir=egress class=other identity=any ports=any"},
		{PolicyKey(5, DirEgress, ClassUDP, 9, 53, 16), "policy subject=0x5 dir=egress class=udp identity=0x9 ports=53"},
		{Key{PrefixLen: 3, Data: [24]byte{9, 1}}, "key prefixlen=3 data=090100000000000000000000000000000000000000000000"},
	}
	for _, tt := range tests {
		if got := tt.key.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
		if tt.key.Data[0] == 9 {
			continue
		}
		back, err := parseKey(tt.want)
		if err != nil || back != tt.key {
			t.Errorf("parseKey(%q) = %v, %v; want the key back", tt.want, back, err)
		}
	}
}

func TestParseKeyErrors(t *testing.T) {
	for _, s := range []string{
		"",
		"route ifindex=1",
		"endpoint",
		"endpoint ifindex=x",
		"endpoint ifindex=1 extra=2",
		"endpoint ifindex=1 ifindex=2",
		"identity scope=1",
		"identity scope=1 10.0.0.0/33",
		"policy subject=1 dir=up class=tcp identity=any ports=any",
		"policy subject=1 dir=ingress class=sctp identity=any ports=any",
		"policy subject=1 dir=ingress class=tcp identity=any ports=8000-8080",
		"policy subject=1 dir=ingress class=tcp identity=any",
	} {
		if k, err := parseKey(s); !errors.Is(err, errBadKey) {
			t.Errorf("parseKey(%q) = %v, %v; want an errBadKey error", s, k, err)
		}
	}
	// A bare address is its full-length prefix; numbers may be decimal.
	k, err := parseKey("identity scope=10 10.0.0.1")
	if err != nil || k != IdentityKey(10, netip.MustParsePrefix("10.0.0.1/32")) {
		t.Errorf("parseKey of a bare address = %v, %v", k, err)
	}
}

// TestDescribeSnapshot describes every entry of a compiled snapshot and parses each key
// back from its description.
func TestDescribeSnapshot(t *testing.T) {
	s := Compile(Input{
		Endpoints: []*nimbusv1.Object{
			endpointObj("acme", "web1", []string{"10.0.0.1"}, "web"),
			endpointObj("acme", "app1", []string{"fd00::5"}, "app"),
		},
		Policies: []*nimbusv1.Object{policyObj("acme", "p", []string{"web"}, []r{
			{action: "allow", proto: "tcp", ports: ports("8000-8063"), peers: peers("app")},
			{action: "deny", proto: "icmp"},
		}, nil)},
		Local: []Local{{Endpoint: epKey("acme", "web1"), Ifindex: 7}},
	})
	for _, e := range s.Entries {
		d := DescribeEntry(e)
		keyText, _, ok := cutArrow(d)
		if !ok {
			t.Fatalf("%q: no arrow", d)
		}
		if k, err := parseKey(keyText); err != nil || k != e.Key {
			t.Errorf("parseKey(%q) = %v, %v; want %v", keyText, k, err, e.Key)
		}
	}
	want := map[Key]string{
		EndpointKey(7): "endpoint ifindex=7 → id=" + hex(fnv32aStd(epKey("acme", "web1"))) +
			" subject=" + hex(fnv32aStd("NetworkSecurityPolicy/acme/default/p")) + " flags=ingress scope=" +
			hex(fnv32aStd("acme")) + " gen=" + hex(s.Gen),
		IdentityKey(fnv32aStd("acme"), netip.MustParsePrefix("fd00::5/128")): "identity scope=" + hex(fnv32aStd("acme")) +
			" fd00::5/128 → identity=" + hex(fnv32aStd("group:SecurityGroup/acme/default/app")),
		PolicyKey(fnv32aStd("NetworkSecurityPolicy/acme/default/p"), DirIngress, ClassTCP,
			fnv32aStd("group:SecurityGroup/acme/default/app"), 8000, 10): "policy subject=" +
			hex(fnv32aStd("NetworkSecurityPolicy/acme/default/p")) + " dir=ingress class=tcp identity=" +
			hex(fnv32aStd("group:SecurityGroup/acme/default/app")) + " ports=8000-8063 → allow rule=" +
			hex64(fnv64aStd("NetworkSecurityPolicy/acme/default/p|ingress|0")),
		PolicyKey(fnv32aStd("NetworkSecurityPolicy/acme/default/p"), DirIngress, ClassICMP, AnyIdentity, 0, 0): "policy subject=" +
			hex(fnv32aStd("NetworkSecurityPolicy/acme/default/p")) + " dir=ingress class=icmp identity=any ports=any → deny rule=" +
			hex64(fnv64aStd("NetworkSecurityPolicy/acme/default/p|ingress|1")),
	}
	if len(s.Entries) != len(want) {
		t.Errorf("%d entries, want %d:\n%s", len(s.Entries), len(want), describeAll(s))
	}
	for _, e := range s.Entries {
		if got := DescribeEntry(e); got != want[e.Key] {
			t.Errorf("DescribeEntry:\n got %s\nwant %s", got, want[e.Key])
		}
	}
	if got := DescribeEntry(Entry{Key: PolicyKey(1, DirEgress, ClassUDP, 2, 53, 16), Value: Value{Verdict: VerdictDeny}}); got !=
		"policy subject=0x1 dir=egress class=udp identity=0x2 ports=53 → deny rule=none" {
		t.Errorf("DescribeEntry of a default deny: %q", got)
	}
}

// cutArrow splits a description at its arrow.
func cutArrow(s string) (key, value string, ok bool) {
	for i := range len(s) - 2 {
		if s[i:i+3] == "→" {
			return s[:i-1], s[i+4:], true
		}
	}
	return "", "", false
}

func hex(v uint32) string   { return "0x" + hexDigits(uint64(v)) }
func hex64(v uint64) string { return "0x" + hexDigits(v) }

func hexDigits(v uint64) string {
	const digits = "0123456789abcdef"
	if v == 0 {
		return "0"
	}
	var b []byte
	for ; v > 0; v >>= 4 {
		b = append([]byte{digits[v&15]}, b...)
	}
	return string(b)
}
