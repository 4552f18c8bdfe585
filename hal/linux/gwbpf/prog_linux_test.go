package gwbpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

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

// BenchmarkAttach measures attaching the programs to both tcx hooks of 200 bridges, one
// after another, as the network reconciler does for each network's bridge, in a fresh
// namespace: the time of one attach (the kernel takes it under the rtnl lock and waits
// for an RCU grace period in it), its median and 99th percentile, and the CPU the
// process spent on each. Run with -benchtime 1x.
func BenchmarkAttach(b *testing.B) {
	const n = 200
	ns := testns.Named(b, "naples-gwbench")
	var batch strings.Builder
	for i := range n {
		fmt.Fprintf(&batch, "link add gwb%d up type bridge\n", i)
	}
	path := filepath.Join(b.TempDir(), "bridges")
	if err := os.WriteFile(path, []byte(batch.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	testns.Run(b, "ip", "-n", ns, "-batch", path)
	h := testns.Handle(b, ns)
	o, err := Open("", 0)
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	var took []time.Duration
	var cpu time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		// The attaches run on a thread in the namespace, which the runtime discards after.
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			if err := netns.Set(h); err != nil {
				errc <- err
				return
			}
			ifcs, err := net.Interfaces()
			if err != nil {
				errc <- err
				return
			}
			var ru0, ru1 unix.Rusage
			unix.Getrusage(unix.RUSAGE_SELF, &ru0)
			b.StartTimer()
			for _, ifc := range ifcs {
				if !strings.HasPrefix(ifc.Name, "gwb") {
					continue
				}
				start := time.Now()
				if _, err := o.Attach(ifc.Name, ifc.Index); err != nil {
					errc <- err
					return
				}
				took = append(took, time.Since(start)/2)
			}
			b.StopTimer()
			unix.Getrusage(unix.RUSAGE_SELF, &ru1)
			cpu += time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
			for i := range n {
				if err := o.Detach(fmt.Sprintf("gwb%d", i)); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(took)
	attaches := float64(2 * n * b.N)
	var total time.Duration
	for _, d := range took {
		total += 2 * d
	}
	b.ReportMetric(float64(total.Microseconds())/attaches, "µs/attach")
	b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs/attach")
	b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs/attach")
	b.ReportMetric(float64(cpu.Microseconds())/attaches, "cpu-µs/attach")
	b.ReportMetric(0, "ns/op")
}
