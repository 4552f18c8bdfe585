package firewall

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/naplesnet/naples/internal/testrand"
)

func TestParsePortRange(t *testing.T) {
	tests := []struct {
		in   string
		want PortRange
		ok   bool
	}{
		{"80", PortRange{80, 80}, true},
		{"8000-8080", PortRange{8000, 8080}, true},
		{"1-65535", PortRange{1, 65535}, true},
		{"65535", PortRange{65535, 65535}, true},
		{"0", PortRange{}, false},
		{"0-10", PortRange{}, false},
		{"65536", PortRange{}, false},
		{"10-9", PortRange{}, false},
		{"", PortRange{}, false},
		{"http", PortRange{}, false},
		{"1-2-3", PortRange{}, false},
		{" 80", PortRange{}, false},
	}
	for _, tt := range tests {
		got, err := ParsePortRange(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParsePortRange(%q) = %v, %v; want %v, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrBadPorts) {
			t.Errorf("ParsePortRange(%q): error %v does not wrap ErrBadPorts", tt.in, err)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tt.in)
		}
	}
}

// checkPrefixes checks that the blocks are aligned, ascending and contiguous and hold
// exactly the ports of the range, and that there are no more than the minimum bound.
func checkPrefixes(t *testing.T, r PortRange) {
	t.Helper()
	blocks := r.Prefixes()
	if len(blocks) == 0 || len(blocks) > 30 {
		t.Fatalf("%v: %d blocks", r, len(blocks))
	}
	next := uint32(r.Lo)
	for _, b := range blocks {
		if b.Bits < 0 || b.Bits > 16 {
			t.Fatalf("%v: block %+v: bits out of range", r, b)
		}
		size := uint32(1) << (16 - b.Bits)
		if uint32(b.Port)%size != 0 {
			t.Fatalf("%v: block %+v not aligned", r, b)
		}
		if uint32(b.Port) != next {
			t.Fatalf("%v: block %+v starts at %d, want %d (blocks %v)", r, b, b.Port, next, blocks)
		}
		if uint32(b.Last()) != uint32(b.Port)+size-1 {
			t.Fatalf("%v: block %+v: last %d", r, b, b.Last())
		}
		next += size
	}
	if next != uint32(r.Hi)+1 {
		t.Fatalf("%v: blocks end at %d, want %d (blocks %v)", r, next-1, r.Hi, blocks)
	}
	// Fewest blocks: no two neighbours could merge into one aligned block.
	for i := 1; i < len(blocks); i++ {
		a, b := blocks[i-1], blocks[i]
		if a.Bits == b.Bits && a.Bits > 0 && a.Port&^uint16(0xffff>>(a.Bits-1)) == a.Port &&
			b.Port&^uint16(0xffff>>(a.Bits-1)) == a.Port {
			t.Fatalf("%v: blocks %v and %v could be one", r, a, b)
		}
	}
}

func TestPortPrefixesExhaustiveSmall(t *testing.T) {
	for lo := 0; lo <= 300; lo++ {
		for hi := lo; hi <= 300; hi++ {
			checkPrefixes(t, PortRange{uint16(lo), uint16(hi)})
		}
	}
	for lo := 65535 - 300; lo <= 65535; lo++ {
		for hi := lo; hi <= 65535; hi++ {
			checkPrefixes(t, PortRange{uint16(lo), uint16(hi)})
		}
	}
}

func TestPortPrefixesRandom(t *testing.T) {
	seed := testrand.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 7))
	for range 20000 {
		a, b := uint16(rng.IntN(65536)), uint16(rng.IntN(65536))
		checkPrefixes(t, PortRange{min(a, b), max(a, b)})
	}
	tests := []struct {
		r    PortRange
		want []PortPrefix
	}{
		{PortRange{0, 65535}, []PortPrefix{{0, 0}}},
		{PortRange{80, 80}, []PortPrefix{{80, 16}}},
		{PortRange{8000, 8080}, []PortPrefix{{8000, 10}, {8064, 12}, {8080, 16}}},
		{PortRange{1, 65535}, nil}, // 30 blocks, checked by count below
	}
	for _, tt := range tests {
		got := tt.r.Prefixes()
		if tt.want == nil {
			if len(got) != 16 {
				t.Errorf("%v: %d blocks, want 16", tt.r, len(got))
			}
			continue
		}
		if len(got) != len(tt.want) {
			t.Errorf("%v: %v, want %v", tt.r, got, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%v: %v, want %v", tt.r, got, tt.want)
			}
		}
	}
	if n := len((PortRange{1, 65534}).Prefixes()); n != 30 {
		t.Errorf("1-65534: %d blocks, want 30, the most", n)
	}
}

func TestPortPrefixContains(t *testing.T) {
	for _, tt := range []struct {
		p, q PortPrefix
		want bool
	}{
		{PortPrefix{0, 0}, PortPrefix{80, 16}, true},
		{PortPrefix{8000, 10}, PortPrefix{8063, 16}, true},
		{PortPrefix{8000, 10}, PortPrefix{8064, 16}, false},
		{PortPrefix{8064, 12}, PortPrefix{8000, 10}, false},
		{PortPrefix{80, 16}, PortPrefix{80, 16}, true},
	} {
		if got := tt.p.Contains(tt.q); got != tt.want {
			t.Errorf("%v.Contains(%v) = %v, want %v", tt.p, tt.q, got, tt.want)
		}
	}
}
