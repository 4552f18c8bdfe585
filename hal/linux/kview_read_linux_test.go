package linux

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/naplesnet/naples/hal/linux/rtnl"
	"github.com/naplesnet/naples/internal/testns"
)

// TestKernelViewReads reads a namespace through a view, a bridge with an address, a port
// that does not learn and one that does, a VXLAN device with a remote and a neighbour,
// and finds each: the links with their settings, the bridge ports with their learning
// flags, the address, the FDB entries of the VXLAN device and of the bridge, and the
// neighbour. A read with an ended context fails.
func TestKernelViewReads(t *testing.T) {
	ns := testns.Named(t, "naples-vread")
	nsh := testns.Handle(t, ns)
	ip := func(args ...string) { testns.Run(t, "ip", append([]string{"-n", ns}, args...)...) }
	bridge := func(args ...string) { testns.Run(t, "bridge", append([]string{"-n", ns}, args...)...) }
	ip("link", "add", "br0", "type", "bridge")
	ip("link", "set", "br0", "alias", "naples:test", "up")
	ip("addr", "add", "10.0.0.1/24", "dev", "br0")
	ip("link", "add", "p0", "type", "veth", "peer", "name", "q0")
	ip("link", "add", "p1", "type", "veth", "peer", "name", "q1")
	ip("link", "set", "p0", "master", "br0")
	ip("link", "set", "p1", "master", "br0")
	bridge("link", "set", "dev", "p0", "learning", "off")
	bridge("fdb", "add", "02:00:00:00:00:05", "dev", "p0", "master", "static")
	ip("link", "add", "vx0", "type", "vxlan", "id", "100", "local", "192.0.2.1", "dstport", "4789", "nolearning")
	bridge("fdb", "append", "00:00:00:00:00:00", "dev", "vx0", "dst", "192.0.2.2")
	ip("neigh", "add", "10.0.0.2", "lladdr", "02:00:00:00:00:02", "dev", "br0", "nud", "permanent")
	view := NewKernelView(KernelViewOptions{Namespace: &nsh})
	ctx := t.Context()
	read := view.Read()
	defer read.Close()

	links, err := view.Links(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]rtnl.Link{}
	for _, l := range links {
		if l.Family != unix.AF_UNSPEC {
			t.Errorf("link %s of family %d, want AF_UNSPEC", l.Name, l.Family)
		}
		byName[l.Name] = l
	}
	br, vx := byName["br0"], byName["vx0"]
	if len(links) != 7 || br.Kind != "bridge" || br.Alias != "naples:test" || !br.Up() {
		t.Errorf("links %d (want 7: lo, br0, p0, q0, p1, q1, vx0); br0 %+v", len(links), br)
	}
	if want := (rtnl.VXLANInfo{VNI: 100, Local: netip.MustParseAddr("192.0.2.1"), Port: 4789}); vx.Kind != "vxlan" || vx.VXLAN != want {
		t.Errorf("vx0 %s %+v, want vxlan %+v", vx.Kind, vx.VXLAN, want)
	}
	if p0 := byName["p0"]; p0.Master != br.Index {
		t.Errorf("p0's master %d, want br0's index %d", p0.Master, br.Index)
	}

	ports, err := read.BridgePorts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	learning := map[string]bool{}
	for _, p := range ports {
		learning[p.Name] = p.Port.Learning
	}
	if want := map[string]bool{"p0": false, "p1": true}; len(learning) != 2 || learning["p0"] || !learning["p1"] {
		t.Errorf("bridge ports' learning %v, want %v", learning, want)
	}

	addrs, err := read.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range addrs {
		p, ok := a.Prefix()
		found = found || ok && a.Index == br.Index && p == netip.MustParsePrefix("10.0.0.1/24")
	}
	if !found {
		t.Errorf("addresses %+v, want 10.0.0.1/24 on br0", addrs)
	}

	fdb, err := read.FDB(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var remote, static bool
	for _, e := range fdb {
		if e.Family != unix.AF_BRIDGE {
			t.Errorf("fdb entry %+v of family %d, want AF_BRIDGE", e, e.Family)
		}
		remote = remote || e.Index == vx.Index && e.Flags&unix.NTF_SELF != 0 && e.Dst == netip.MustParseAddr("192.0.2.2")
		static = static || e.Index == byName["p0"].Index && e.Master == br.Index && e.MAC == [6]byte{2, 0, 0, 0, 0, 5}
	}
	if !remote || !static {
		t.Errorf("fdb %+v: vx0's remote 192.0.2.2 %v, br0's static entry on p0 %v; want both", fdb, remote, static)
	}

	neighs, err := read.Neighbours(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found = false
	for _, n := range neighs {
		if n.Family != unix.AF_INET && n.Family != unix.AF_INET6 {
			t.Errorf("neighbour %+v of family %d", n, n.Family)
		}
		found = found || n.Index == br.Index && n.Dst == netip.MustParseAddr("10.0.0.2") &&
			n.MAC == [6]byte{2, 0, 0, 0, 0, 2} && n.State&unix.NUD_PERMANENT != 0
	}
	if !found {
		t.Errorf("neighbours %+v, want 10.0.0.2 permanent on br0", neighs)
	}

	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := view.Links(ended); err == nil {
		t.Error("reading links with an ended context succeeded")
	}
}

// TestKernelViewReadsTables checks that a reading of a namespace whose reconcilers watch
// through the view (an interface reconciler's observer, which keeps the link and address
// tables current) dumps neither links, bridge ports nor addresses, and finds what a dump
// finds of them; that its dumps of FDB entries and neighbours share one reader; and that
// a reading of a view no observer watches dumps every kind.
func TestKernelViewReadsTables(t *testing.T) {
	h := newIfaceHost(t, -1)
	ip := func(args ...string) { testns.Run(t, "ip", append([]string{"-n", h.ns}, args...)...) }
	bridge := func(args ...string) { testns.Run(t, "bridge", append([]string{"-n", h.ns}, args...)...) }
	ip("link", "add", "br0", "type", "bridge")
	ip("link", "set", "br0", "alias", "naples:test", "up")
	ip("addr", "add", "10.0.0.1/24", "dev", "br0")
	ip("addr", "add", "10.9.0.1", "peer", "10.9.0.2/24", "dev", "br0")
	ip("addr", "add", "fd00::1/64", "dev", "br0", "nodad")
	ip("link", "add", "p0", "type", "veth", "peer", "name", "q0")
	ip("link", "add", "p1", "type", "veth", "peer", "name", "q1")
	ip("link", "set", "p0", "master", "br0")
	ip("link", "set", "p1", "master", "br0")
	bridge("link", "set", "dev", "p0", "learning", "off")
	ip("link", "add", "vx0", "type", "vxlan", "id", "100", "local", "192.0.2.1", "dstport", "4789", "nolearning")
	ip("link", "set", "vx0", "master", "br0", "mtu", "1400")
	ctx := t.Context()

	dumped := NewKernelView(KernelViewOptions{Namespace: &h.nsh})
	dumpRead := dumped.Read()
	wantLinks, wantPorts, wantAddrs := readLinksAndAddrs(t, dumpRead)
	dumpRead.Close()
	if n := dumped.readDumps.Load(); n != 3 {
		t.Errorf("a view no observer watches dumped %d times for links, ports and addresses; want 3", n)
	}

	view := NewKernelView(KernelViewOptions{Namespace: &h.nsh})
	rec, err := NewInterfaceReconciler(InterfaceOptions{Store: h.store, Namespace: &h.nsh, View: view, StatsInterval: -1,
		StateFile: filepath.Join(t.TempDir(), "interfaces.json"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	runObserver(t, rec)
	read := view.Read()
	defer read.Close()
	links, ports, addrs := readLinksAndAddrs(t, read)
	if n := view.readDumps.Load(); n != 0 {
		t.Errorf("reading links, ports and addresses through watched tables took %d dumps; want 0", n)
	}
	if n := view.readers.Load(); n != 0 {
		t.Errorf("reading links, ports and addresses through watched tables opened %d readers; want 0", n)
	}
	if !slices.Equal(links, wantLinks) {
		t.Errorf("links from the table\n%v\nwant, as dumped,\n%v", links, wantLinks)
	}
	if !slices.Equal(ports, wantPorts) {
		t.Errorf("bridge ports from the table %v, want, as dumped, %v", ports, wantPorts)
	}
	if !slices.Equal(addrs, wantAddrs) {
		t.Errorf("addresses from the table %v, want, as dumped, %v", addrs, wantAddrs)
	}
	if _, err := read.FDB(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := read.Neighbours(ctx); err != nil {
		t.Fatal(err)
	}
	if d, r := view.readDumps.Load(), view.readers.Load(); d != 2 || r != 1 {
		t.Errorf("reading FDB entries and neighbours took %d dumps on %d readers; want 2 on 1", d, r)
	}
}

// readLinksAndAddrs reads the links, bridge ports and addresses of read's namespace, in
// forms that compare whatever the reading read them from, sorted.
func readLinksAndAddrs(t *testing.T, read *KernelRead) (links, ports, addrs []string) {
	t.Helper()
	ls, err := read.Links(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		links = append(links, fmt.Sprintf("%d %s alias=%q kind=%s master=%d mtu=%d up=%t oper=%d mac=%x vxlan=%+v",
			l.Index, l.Name, l.Alias, l.Kind, l.Master, l.MTU, l.Up(), l.OperState, l.MAC, l.VXLAN))
	}
	ps, err := read.BridgePorts(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		ports = append(ports, fmt.Sprintf("%d learning=%t", p.Index, p.Port.Learning))
	}
	as, err := read.Addrs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		p, ok := a.Prefix()
		peer := a.Local.IsValid() && (a.Family != unix.AF_INET || a.Address != a.Local)
		addrs = append(addrs, fmt.Sprintf("%d %s %t peer=%t flags=%#x proto=%d", a.Index, p, ok, peer, a.Flags, a.Protocol))
	}
	slices.Sort(links)
	slices.Sort(ports)
	slices.Sort(addrs)
	return links, ports, addrs
}

// TestTableReaderQueueOrder checks that a reader's queue hands its watcher the changes in
// the order they came, whatever the interleaving of pushes and takes, as its array is
// used again, compacted and grown; and that a detach leaves exactly the changes not
// taken in the backlog.
func TestTableReaderQueueOrder(t *testing.T) {
	r := &tableReader[int, int]{backlog: map[int]*tableChange[int, int]{}}
	w := &viewWatcher{limit: 1 << 30, wake: make(chan struct{}, 1)}
	r.w = w
	var got []int
	src := &tableSource[int, int]{r: r, handle: func(c tableChange[int, int]) { got = append(got, c.key) }}
	pushed := 0
	push := func(n int) {
		for range n {
			r.push(tableChange[int, int]{key: pushed, new: pushed, has: true})
			pushed++
		}
	}
	take := func(n int) {
		for range n {
			src.next()
		}
	}
	// Pushes ahead of takes, by a little and by a lot, a drain, then more than
	// keptQueue at once.
	for range 50 {
		push(3)
		take(2)
	}
	for range 20 {
		push(100)
		take(1)
	}
	take(pushed)
	push(keptQueue + 10)
	take(keptQueue + 10)
	if r.queue != nil {
		t.Errorf("a drained queue of %d changes keeps room for %d, want none above %d", keptQueue+10, cap(r.queue), keptQueue)
	}
	push(7)
	take(3)
	for i, k := range got {
		if k != i {
			t.Fatalf("change %d taken was %d, want them in the order pushed", i, k)
		}
	}
	if len(got) != pushed-4 {
		t.Fatalf("took %d changes of %d pushed, want all but the last 4", len(got), pushed)
	}
	src.detach()
	if len(r.backlog) != 4 {
		t.Fatalf("the backlog after detach holds %d changes, want the 4 not taken", len(r.backlog))
	}
	for k := pushed - 4; k < pushed; k++ {
		if _, ok := r.backlog[k]; !ok {
			t.Errorf("the backlog after detach misses change %d", k)
		}
	}
}
