package hal_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/naplesnet/naples/hal"
)

// obj is a mirrored test object: a next hop, and the interface the kernel chose for it,
// which a write may leave out (0) as a route's gateway without a device does.
type obj struct {
	gw   string
	link int
}

// sameObj is the equality the mirror is built with: a wanted link 0 matches any.
func sameObj(have, want obj) bool {
	return have.gw == want.gw && (want.link == 0 || have.link == want.link)
}

func newMirror(t *testing.T, dump map[string]obj) *hal.Mirror[string, obj] {
	t.Helper()
	m := hal.NewMirror[string, obj](sameObj, nil)
	if _, err := m.Replace(dumpOf(dump)); err != nil {
		t.Fatal(err)
	}
	return m
}

func dumpOf(objs map[string]obj) func(add func(string, obj)) error {
	return func(add func(string, obj)) error {
		for k, v := range objs {
			add(k, v)
		}
		return nil
	}
}

// contents returns what the mirror holds.
func contents(m *hal.Mirror[string, obj]) map[string]obj {
	return maps.Collect(m.All())
}

func wantContents(t *testing.T, m *hal.Mirror[string, obj], want map[string]obj) {
	t.Helper()
	if got := contents(m); !maps.Equal(got, want) {
		t.Errorf("mirror holds %v; want %v", got, want)
	}
	if n := m.Len(); n != len(want) {
		t.Errorf("Len = %d; want %d", n, len(want))
	}
	for k, v := range want {
		if got, ok := m.Get(k); !ok || got != v {
			t.Errorf("Get(%q) = %v, %v; want %v, true", k, got, ok, v)
		}
	}
}

// TestMirrorReplaceFindsDrift: a dump replaces the mirror and names exactly the keys added,
// removed or changed since, judged by the mirror's equality.
func TestMirrorReplaceFindsDrift(t *testing.T) {
	m := newMirror(t, map[string]obj{"same": {"a", 1}, "gone": {"b", 1}, "changed": {"c", 1}, "wrote": {"d", 0}})
	dump := map[string]obj{"same": {"a", 1}, "changed": {"c", 2}, "new": {"e", 1}, "wrote": {"d", 7}}
	drift, err := m.Replace(dumpOf(dump))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(drift)
	if want := []string{"changed", "gone", "new"}; !slices.Equal(drift, want) {
		t.Errorf("Replace found drift in %q; want %q (a link the mirror left open is no drift)", drift, want)
	}
	wantContents(t, m, dump)

	boom := errors.New("netlink: dump interrupted")
	if _, err := m.Replace(func(add func(string, obj)) error {
		add("half", obj{"x", 1})
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("Replace with a failing dump: err = %v; want %v", err, boom)
	}
	wantContents(t, m, dump)
}

// TestMirrorEventsInOrder: events without writes under way apply as they come and are no
// echo.
func TestMirrorEventsInOrder(t *testing.T) {
	m := newMirror(t, map[string]obj{"a": {"gw1", 1}})
	for _, step := range []struct {
		del  bool
		k    string
		v    obj
		want map[string]obj
	}{
		{k: "a", v: obj{"gw2", 1}, want: map[string]obj{"a": {"gw2", 1}}},
		{k: "b", v: obj{"gw1", 2}, want: map[string]obj{"a": {"gw2", 1}, "b": {"gw1", 2}}},
		{del: true, k: "a", want: map[string]obj{"b": {"gw1", 2}}},
		{del: true, k: "a", want: map[string]obj{"b": {"gw1", 2}}},
	} {
		var echo bool
		if step.del {
			echo = m.Remove(step.k)
		} else {
			echo = m.Update(step.k, step.v)
		}
		if echo {
			t.Errorf("event on %s with no write under way reported as an echo", step.k)
		}
		wantContents(t, m, step.want)
	}
}

// TestMirrorWrites covers the backend's own writes against the events that come before,
// with and after their echo.
func TestMirrorWrites(t *testing.T) {
	t.Run("stale event after the write", func(t *testing.T) {
		// The kernel held gw1 and reported it late: the write of gw2 came first.
		m := newMirror(t, map[string]obj{"a": {"gw0", 1}})
		w := m.Expect("a", obj{"gw2", 0})
		w.Done()
		wantContents(t, m, map[string]obj{"a": {"gw2", 0}})
		if m.Update("a", obj{"gw1", 1}) {
			t.Error("a stale event that differs from the write reported as its echo")
		}
		wantContents(t, m, map[string]obj{"a": {"gw2", 0}})
		if !m.Update("a", obj{"gw2", 3}) {
			t.Error("the write's echo not reported as one")
		}
		wantContents(t, m, map[string]obj{"a": {"gw2", 3}})
		// After the echo, events are someone else's.
		if m.Update("a", obj{"gw4", 1}) {
			t.Error("an event after the echo reported as an echo")
		}
		wantContents(t, m, map[string]obj{"a": {"gw4", 1}})
	})
	t.Run("echo before Done", func(t *testing.T) {
		m := newMirror(t, nil)
		w := m.Expect("a", obj{"gw1", 0})
		if !m.Update("a", obj{"gw1", 2}) {
			t.Error("the echo not reported as one")
		}
		m.Remove("a") // someone deletes it right after
		w.Done()
		wantContents(t, m, map[string]obj{})
	})
	t.Run("two writes, echoes late", func(t *testing.T) {
		m := newMirror(t, nil)
		w1 := m.Expect("a", obj{"gw1", 0})
		w1.Done()
		w2 := m.Expect("a", obj{"gw2", 0})
		w2.Done()
		if !m.Update("a", obj{"gw1", 1}) {
			t.Error("the first write's echo not reported as one")
		}
		wantContents(t, m, map[string]obj{"a": {"gw2", 0}})
		if !m.Update("a", obj{"gw2", 1}) {
			t.Error("the second write's echo not reported as one")
		}
		wantContents(t, m, map[string]obj{"a": {"gw2", 1}})
	})
	t.Run("delete", func(t *testing.T) {
		m := newMirror(t, map[string]obj{"a": {"gw1", 1}})
		w := m.ExpectGone("a")
		w.Done()
		wantContents(t, m, map[string]obj{})
		if m.Update("a", obj{"gw1", 1}) {
			t.Error("a stale event reported as the delete's echo")
		}
		wantContents(t, m, map[string]obj{})
		if !m.Remove("a") {
			t.Error("the delete's echo not reported as one")
		}
		if m.Update("a", obj{"gw9", 1}) {
			t.Error("an add after the delete's echo reported as an echo")
		}
		wantContents(t, m, map[string]obj{"a": {"gw9", 1}})
	})
	t.Run("failed write keeps the mirror", func(t *testing.T) {
		m := newMirror(t, map[string]obj{"a": {"gw1", 1}})
		w := m.Expect("a", obj{"gw2", 0})
		w.Fail()
		wantContents(t, m, map[string]obj{"a": {"gw1", 1}})
		if m.Update("a", obj{"gw3", 1}) {
			t.Error("an event after a failed write reported as an echo")
		}
		wantContents(t, m, map[string]obj{"a": {"gw3", 1}})
	})
	t.Run("failed write takes the event passed over", func(t *testing.T) {
		m := newMirror(t, map[string]obj{"a": {"gw1", 1}})
		w := m.Expect("a", obj{"gw2", 0})
		m.Update("a", obj{"gw3", 1}) // someone else's change, during the write
		wantContents(t, m, map[string]obj{"a": {"gw1", 1}})
		w.Fail()
		wantContents(t, m, map[string]obj{"a": {"gw3", 1}})
	})
	t.Run("delete of an absent object", func(t *testing.T) {
		m := newMirror(t, map[string]obj{"a": {"gw1", 1}, "b": {"gw1", 1}})
		m.ExpectGone("a").Gone()
		wb := m.ExpectGone("b")
		m.Update("b", obj{"gw5", 1}) // added again by someone while the delete was under way
		wb.Gone()
		wantContents(t, m, map[string]obj{"b": {"gw5", 1}})
	})
	t.Run("ending twice", func(t *testing.T) {
		m := newMirror(t, map[string]obj{"a": {"gw1", 1}})
		w := m.Expect("a", obj{"gw2", 0})
		w.Done()
		w.Fail()
		w.Done()
		wantContents(t, m, map[string]obj{"a": {"gw2", 0}})
	})
}

// TestMirrorReplaceKeepsNewerState: a dump runs while events and writes go on; what
// changed meanwhile keeps its newer state, and what did not takes the dump's.
func TestMirrorReplaceKeepsNewerState(t *testing.T) {
	m := newMirror(t, map[string]obj{"event": {"gw1", 1}, "write": {"gw1", 1}, "quiet": {"gw1", 1}, "deleted": {"gw1", 1}})
	var inflight *hal.Write[string, obj]
	drift, err := m.Replace(func(add func(string, obj)) error {
		// The dump reads the kernel as it was; meanwhile the kernel moves on.
		add("event", obj{"gw1", 1})
		add("write", obj{"gw1", 1})
		add("quiet", obj{"gw2", 1})
		add("deleted", obj{"gw1", 1})
		m.Update("event", obj{"gw3", 1})
		m.Expect("write", obj{"gw4", 0}).Done()
		m.Remove("deleted")
		inflight = m.Expect("late", obj{"gw5", 0})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"quiet"}; !slices.Equal(drift, want) {
		t.Errorf("drift %q; want %q: the others changed during the dump", drift, want)
	}
	inflight.Done()
	wantContents(t, m, map[string]obj{"event": {"gw3", 1}, "write": {"gw4", 0}, "quiet": {"gw2", 1}, "late": {"gw5", 0}})
}

// TestMirrorReplaceEndsWaits: a write whose echo never comes (the kernel does not report a
// replace that changes nothing, and a subscription started after a write does not carry
// it) waits for it no longer once a dump follows, so later events of the key apply; and a
// write still under way when the dump begins shows its state from Done only if no event
// of its key came first.
func TestMirrorReplaceEndsWaits(t *testing.T) {
	m := newMirror(t, map[string]obj{"a": {"gw1", 1}})
	m.Expect("a", obj{"gw2", 0}).Done()
	inflight := m.Expect("b", obj{"gw2", 0})
	overtaken := m.Expect("c", obj{"gw1", 0})
	if _, err := m.Replace(dumpOf(map[string]obj{"a": {"gw2", 1}})); err != nil {
		t.Fatal(err)
	}
	inflight.Done()
	if m.Update("a", obj{"gw3", 1}) || m.Remove("b") {
		t.Error("an event after the dump reported as the echo of a write from before it")
	}
	if !m.Update("c", obj{"gw1", 4}) {
		t.Error("the echo of a write under way during the dump not reported as one")
	}
	m.Update("c", obj{"gw9", 1}) // someone else's change, before the write's Done
	overtaken.Done()
	wantContents(t, m, map[string]obj{"a": {"gw3", 1}, "c": {"gw9", 1}})
}

// TestMirrorConcurrent runs writers, an event stream and dumps at once (for the race
// detector), each writer on keys of its own as backends do, against a fake kernel that
// reports every change in order; once the events have caught up, the mirror holds the
// last write of every key.
func TestMirrorConcurrent(t *testing.T) {
	m := newMirror(t, nil)
	const writers, keys, rounds = 4, 50, 20
	var kernelMu sync.Mutex
	kernel := map[string]obj{}
	events := make(chan [2]string, writers*keys*rounds)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				for k := range keys {
					key := fmt.Sprintf("w%d-k%d", w, k)
					gw := fmt.Sprintf("gw%d", r)
					wr := m.Expect(key, obj{gw, 0})
					kernelMu.Lock()
					kernel[key] = obj{gw, 1}
					events <- [2]string{key, gw} // the kernel's echo, on its way
					kernelMu.Unlock()
					wr.Done()
				}
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			if _, err := m.Replace(func(add func(string, obj)) error {
				kernelMu.Lock()
				defer kernelMu.Unlock()
				for k, v := range kernel {
					add(k, v)
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
		}
	})
	done := make(chan struct{})
	go func() {
		for e := range events {
			m.Update(e[0], obj{e[1], 1})
		}
		close(done)
	}()
	wg.Wait()
	close(events)
	<-done
	want := map[string]obj{}
	for w := range writers {
		for k := range keys {
			want[fmt.Sprintf("w%d-k%d", w, k)] = obj{fmt.Sprintf("gw%d", rounds-1), 1}
		}
	}
	wantContents(t, m, want)
}

// TestMirrorExpectFuncMatchesPerWrite: a write made with ExpectFunc recognises its echo
// by its own match, not the mirror's equality, and a write made with Expect still by the
// mirror's.
func TestMirrorExpectFuncMatchesPerWrite(t *testing.T) {
	m := newMirror(t, map[string]obj{"a": {gw: "g1", link: 1}, "b": {gw: "g1", link: 1}})

	// Any gateway on link 2: an event of g9 on link 2 is the echo, whatever the equality says.
	anyGW := func(have, want obj) bool { return have.link == want.link }
	w := m.ExpectFunc("a", obj{gw: "g2", link: 2}, anyGW)
	if echo := m.Update("a", obj{gw: "g1", link: 1}); echo {
		t.Errorf("an event of the old state is the echo of the write")
	}
	wantContents(t, m, map[string]obj{"a": {gw: "g1", link: 1}, "b": {gw: "g1", link: 1}})
	if echo := m.Update("a", obj{gw: "g9", link: 2}); !echo {
		t.Errorf("an event that the write's match accepts is not its echo")
	}
	w.Done()
	wantContents(t, m, map[string]obj{"a": {gw: "g9", link: 2}, "b": {gw: "g1", link: 1}})

	// The mirror's equality: g9 on link 2 is not the echo of g2 on link 2.
	w = m.Expect("b", obj{gw: "g2", link: 2})
	if echo := m.Update("b", obj{gw: "g9", link: 2}); echo {
		t.Errorf("an event that the mirror's equality refuses is the echo of an Expect")
	}
	w.Done()
	wantContents(t, m, map[string]obj{"a": {gw: "g9", link: 2}, "b": {gw: "g2", link: 2}})
}

// TestMirrorWriters shares a mirror between two writers and follows it: a write's end
// names its writer, its echo names the writer whose write it was and no other, an event
// of someone else names none, and a Replace's changes are marked as a dump's.
func TestMirrorWriters(t *testing.T) {
	const a, b hal.Writers = 1, 2
	m := newMirror(t, map[string]obj{"r": {"gw1", 1}})
	var got []hal.MirrorChange[string, obj]
	m.Follow(func(c hal.MirrorChange[string, obj]) { got = append(got, c) })
	take := func() []hal.MirrorChange[string, obj] {
		out := got
		got = nil
		return out
	}

	// a writes gw2; b's write of another key is under way meanwhile.
	w := m.ExpectBy(a, "r", obj{gw: "gw2"}, nil)
	wb := m.ExpectGoneBy(b, "s")
	w.Done()
	if c := take(); len(c) != 1 || c[0].Wrote != a || c[0].Old != (obj{"gw1", 1}) || c[0].New != (obj{gw: "gw2"}) || c[0].Dump {
		t.Fatalf("changes after a's write = %+v; want one made by a, gw1 to gw2", c)
	}
	if !m.Update("r", obj{"gw2", 3}) {
		t.Error("the echo of a's write is not reported an echo")
	}
	if c := take(); len(c) != 1 || c[0].Echoes != a || c[0].Wrote != 0 || c[0].New != (obj{"gw2", 3}) {
		t.Fatalf("changes after the echo = %+v; want one that echoes a alone", c)
	}
	wb.Gone()
	if c := take(); len(c) != 0 {
		t.Errorf("a delete of an absent key changed %+v; want nothing", c)
	}

	// Someone else's change echoes no writer.
	if m.Update("r", obj{"gw9", 3}) {
		t.Error("someone else's change is reported an echo")
	}
	if c := take(); len(c) != 1 || c[0].Echoes != 0 || c[0].Wrote != 0 {
		t.Fatalf("changes after someone else's = %+v; want one of no writer", c)
	}

	// A dump that finds r gone.
	if _, err := m.Replace(dumpOf(nil)); err != nil {
		t.Fatal(err)
	}
	if c := take(); len(c) != 1 || !c[0].Dump || !c[0].Had || c[0].Has {
		t.Fatalf("changes after the dump = %+v; want r gone, by a dump", c)
	}
}
