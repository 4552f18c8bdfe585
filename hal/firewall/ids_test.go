package firewall

import (
	"hash/fnv"
	"strconv"
	"testing"
)

// fnv32aStd and fnv64aStd are the FNV-1a hashes of hash/fnv, which the compiler's inlined
// ones must equal.
func fnv32aStd(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}

func fnv64aStd(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func TestFNVMatchesHashFNV(t *testing.T) {
	for _, s := range []string{"", "a", "acme", "Endpoint/acme/default/web1", "NetworkSecurityPolicy/a/b/c|ingress|12"} {
		if got, want := fnv32a(s), fnv32aStd(s); got != want {
			t.Errorf("fnv32a(%q) = %#x, want %#x", s, got, want)
		}
		if got, want := fnv64a(s), fnv64aStd(s); got != want {
			t.Errorf("fnv64a(%q) = %#x, want %#x", s, got, want)
		}
	}
}

func TestAssignIDsProbing(t *testing.T) {
	// hashes gives the test's strings chosen hashes, so that they collide.
	hashes := map[string]uint32{
		"a": 5, "b": 5, "c": 6, "d": 5, // a takes 5, b 6 (5 taken), c 7, d 8
		"zero": 0, "any": 0xffffffff, "wrap": 0xfffffffe, "wrap2": 0xfffffffe,
	}
	hash := func(s string) uint32 { return hashes[s] }
	tests := []struct {
		name  string
		names []string
		want  map[string]uint32
	}{
		{"no collision", []string{"a", "c"}, map[string]uint32{"a": 5, "c": 6}},
		{"collisions probe in sorted order", []string{"d", "c", "b", "a"},
			map[string]uint32{"a": 5, "b": 6, "c": 7, "d": 8}},
		{"order of input does not matter", []string{"a", "b", "c", "d"},
			map[string]uint32{"a": 5, "b": 6, "c": 7, "d": 8}},
		{"duplicates get one id", []string{"b", "a", "b"}, map[string]uint32{"a": 5, "b": 6}},
		{"0 and AnyIdentity are skipped, wrapping around", []string{"zero", "any", "wrap", "wrap2"},
			// sorted: any, wrap, wrap2, zero. any: 0xffffffff reserved → 0 reserved → 1.
			// wrap: 0xfffffffe. wrap2: 0xfffffffe taken → 0xffffffff, 0 reserved → 1 taken → 2.
			// zero: 0 reserved → 1, 2 taken → 3.
			map[string]uint32{"any": 1, "wrap": 0xfffffffe, "wrap2": 2, "zero": 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := assignIDs(tt.names, hash, 0, AnyIdentity)
			if len(got) != len(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			for n, id := range tt.want {
				if got[n] != id {
					t.Errorf("%s: id %#x, want %#x (all: %v)", n, got[n], id, got)
				}
			}
		})
	}
}

func TestIDsAreFNVWithoutCollision(t *testing.T) {
	var names []string
	for i := range 1000 {
		names = append(names, "Endpoint/acme/default/ep"+strconv.Itoa(i))
	}
	ids := ids32(append([]string(nil), names...))
	seen := map[uint32]bool{}
	for _, n := range names {
		if ids[n] != fnv32aStd(n) {
			t.Errorf("%s: id %#x, want fnv32a %#x", n, ids[n], fnv32aStd(n))
		}
		if seen[ids[n]] {
			t.Errorf("%s: id %#x given twice", n, ids[n])
		}
		seen[ids[n]] = true
	}
}

func TestGenerationIgnoresGen(t *testing.T) {
	entries := []Entry{
		{Key: EndpointKey(4), Value: Value{ID: 1, Subject: 2, Flags: 3, Scope: 4}},
		{Key: PolicyKey(2, DirIngress, ClassTCP, 9, 80, 16), Value: Value{Verdict: VerdictAllow, Rule: 77}},
	}
	g := generation(entries)
	if g == 0 {
		t.Fatal("generation 0")
	}
	entries[0].Value.Gen = 12345
	if generation(entries) != g {
		t.Errorf("generation follows the Gen field")
	}
	entries[1].Value.Rule = 78
	if generation(entries) == g {
		t.Errorf("generation ignores a rule id")
	}
	entries[1].Value.Rule = 77
	entries[1].Key = PolicyKey(2, DirIngress, ClassTCP, 9, 80, 15)
	if generation(entries) == g {
		t.Errorf("generation ignores a prefix length")
	}
}
