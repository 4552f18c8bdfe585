package gwbpf

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/naplesnet/naples/internal/testns"
)

// skbContext is the start of struct __sk_buff, up to ifindex: the context of a test run.
// The kernel takes the device of a test run's packet from ifindex (0 and 1 mean
// loopback).
type skbContext struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto uint32
	Priority, IngressIfindex, Ifindex                                           uint32
}

// tcxNext is TCX_NEXT (-1), what both programs return.
const tcxNext = ^uint32(0)

// TestPrograms runs the programs on a frame with prog.Run: ingress gives an unmarked
// packet of a bridge in the map the bridge's mark and leaves other marks and other
// interfaces alone; egress clears the marks of naples's range and no other.
func TestPrograms(t *testing.T) {
	testns.RequireRoot(t)
	o, err := Open("", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	const lo, mark = 1, MarkBase | 0x123456
	frame := make([]byte, 64)
	frame[12], frame[13] = 0x08, 0x00 // IPv4
	run := func(prog *ebpf.Program, in uint32) uint32 {
		t.Helper()
		// The kernel copies all of struct __sk_buff out, or fails with ENOSPC.
		out := make([]byte, 256)
		ret, err := prog.Run(&ebpf.RunOptions{Data: frame, Context: skbContext{Ifindex: lo, Mark: in}, ContextOut: out})
		if err != nil {
			t.Fatalf("running %s: %v", prog, err)
		}
		if ret != tcxNext {
			t.Errorf("%s returned %d, want TCX_NEXT", prog, int32(ret))
		}
		return binary.NativeEndian.Uint32(out[8:]) // skbContext.Mark
	}
	if got := run(o.Ingress, 0); got != 0 {
		t.Errorf("ingress of an interface without a mark in the map: mark %#x, want 0", got)
	}
	if _, err := o.SetMark(lo, mark); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		prog     *ebpf.Program
		in, want uint32
	}{
		{"IngressUnmarked", o.Ingress, 0, mark},
		{"IngressMarkedAlready", o.Ingress, 7, 7},
		{"IngressMarkedByAnotherTenant", o.Ingress, MarkBase | 1, MarkBase | 1},
		{"EgressOurs", o.Egress, mark, 0},
		{"EgressOursOfAnotherTenant", o.Egress, MarkBase | 1, 0},
		{"EgressOther", o.Egress, 7, 7},
		{"EgressOtherHighBits", o.Egress, 0x6F000001, 0x6F000001},
		{"EgressUnmarked", o.Egress, 0, 0},
	} {
		if got := run(c.prog, c.in); got != c.want {
			t.Errorf("%s: mark %#x in, %#x out, want %#x", c.name, c.in, got, c.want)
		}
	}
	if wrote, err := o.SetMark(lo, mark); err != nil || wrote {
		t.Errorf("setting the same mark again: wrote %v, %v; want no write", wrote, err)
	}
}

// TestMapFull: a map for one bridge refuses a second one with ErrFull.
func TestMapFull(t *testing.T) {
	testns.RequireRoot(t)
	o, err := Open("", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.SetMark(1, MarkBase); err != nil {
		t.Fatal(err)
	}
	if _, err := o.SetMark(2, MarkBase); !errors.Is(err, ErrFull) {
		t.Errorf("a second bridge in a map for one: %v, want ErrFull", err)
	}
}
