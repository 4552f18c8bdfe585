package fwbpf

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/naplesnet/naples/internal/testns"
)

func TestOpenKeepsThePinnedFragmentTable(t *testing.T) {
	testns.RequireRoot(t)
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("naples-fwbpf-pin-%d", os.Getpid()))
	t.Cleanup(func() { os.RemoveAll(dir) })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	caps := Capacities{Conntrack: 64, Rules: 64, Endpoints: 16, Fragments: 32}
	open := func(c Capacities) *Objects {
		t.Helper()
		o, err := Open(dir, c, quiet)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}

	o := open(caps)
	if got := o.Frag.MaxEntries(); got != 32 {
		t.Errorf("fw_frag holds %d entries, want 32 (Capacities.Fragments)", got)
	}
	k := FragKey{Ifindex: 7, Id: 0x1234, Family: 4, Proto: ipProtoUDP}
	if err := o.Frag.Put(&k, &FragValue{Verdict: FragConn}); err != nil {
		t.Fatal(err)
	}
	o.Close()

	// A restart with the same capacities keeps the entry; the read-only view sees the
	// capacity.
	o = open(caps)
	var v FragValue
	if err := o.Frag.Lookup(&k, &v); err != nil || v.Verdict != FragConn {
		t.Errorf("after a restart, the fragment entry is %+v (%v), want verdict %d", v, err, FragConn)
	}
	o.Close()
	p, err := OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Capacities().Fragments; got != 32 {
		t.Errorf("the pinned view's fragment capacity is %d, want 32", got)
	}
	p.Close()

	// Another capacity makes the map anew.
	caps.Fragments = 48
	o = open(caps)
	defer o.Close()
	if got := o.Frag.MaxEntries(); got != 48 {
		t.Errorf("after a capacity change fw_frag holds %d entries, want 48", got)
	}
	if err := o.Frag.Lookup(&k, &v); err == nil {
		t.Errorf("after a capacity change the old fragment entry %+v is still there", v)
	}
}
