package watermark

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/testrand"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// clock is a settable time for the tracker.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// node is a Tracker with the objects and statuses a node holds, as the agent's store
// holds them, so that each change hands the tracker both.
type node struct {
	*Tracker
	objs map[nimbusv1.Key]*nimbusv1.Object
	sts  map[nimbusv1.Key]*nimbusv1.NodeStatus
}

func (n *node) SetObject(obj *nimbusv1.Object) {
	key := obj.TypedKey()
	n.objs[key] = obj
	n.Set(key, obj, n.sts[key])
}

// DeleteObject drops the object and its status: one of the same name that comes later is
// another object.
func (n *node) DeleteObject(key nimbusv1.Key) {
	delete(n.objs, key)
	delete(n.sts, key)
	n.Set(key, nil, nil)
}

func (n *node) SetStatus(key nimbusv1.Key, st *nimbusv1.NodeStatus) {
	n.sts[key] = st
	n.Set(key, n.objs[key], st)
}

func newTracker(opts Options) (*node, *clock) {
	c := &clock{now: time.Unix(1700000000, 0)}
	opts.Now = c.Now
	return &node{Tracker: New(opts), objs: map[nimbusv1.Key]*nimbusv1.Object{}, sts: map[nimbusv1.Key]*nimbusv1.NodeStatus{}}, c
}

func route(name string, gen int64, genRev, rev uint64) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Name: name, Generation: gen, GenerationRevision: genRev, Revision: rev},
		Spec: &nimbusv1.Object_Route{Route: &nimbusv1.RouteSpec{Prefix: "10.0.0.0/24"}},
	}
}

func key(name string) nimbusv1.Key {
	return nimbusv1.MakeKey(nimbusv1.Kind_KIND_ROUTE, "", "", name)
}

func status(phase nimbusv1.Phase, gen int64) *nimbusv1.NodeStatus {
	return &nimbusv1.NodeStatus{Phase: phase, ObservedGeneration: gen}
}

var (
	programmed = nimbusv1.Phase_PHASE_PROGRAMMED
	failed     = nimbusv1.Phase_PHASE_FAILED
	pendingPh  = nimbusv1.Phase_PHASE_PENDING
)

func wantWatermark(t *testing.T, tr *node, want uint64) {
	t.Helper()
	if _, got := tr.Watermark(); got != want {
		t.Fatalf("watermark %d, want %d (pending %d, exceptions %d)", got, want, tr.Pending(), tr.Exceptions())
	}
}

func TestWatermarkFollowsObjectsProgrammedOutOfOrder(t *testing.T) {
	tr, _ := newTracker(Options{})
	tr.SetPosition("e1", 4)
	wantWatermark(t, tr, 4) // nothing held: everything up to the resume point is done

	for _, o := range []*nimbusv1.Object{route("a", 1, 5, 5), route("b", 1, 7, 7), route("c", 1, 9, 9)} {
		tr.SetObject(o)
	}
	tr.SetPosition("e1", 10)
	wantWatermark(t, tr, 4)
	tr.SetStatus(key("b"), status(programmed, 1))
	wantWatermark(t, tr, 4) // a, below b, still holds it back
	tr.SetStatus(key("a"), status(pendingPh, 1))
	wantWatermark(t, tr, 4)
	tr.SetStatus(key("a"), status(programmed, 1))
	wantWatermark(t, tr, 8)
	tr.SetStatus(key("c"), status(programmed, 0)) // a status of an older generation is not done
	wantWatermark(t, tr, 8)
	tr.SetStatus(key("c"), status(programmed, 1))
	wantWatermark(t, tr, 10)
	if tr.Exceptions() != 0 || len(tr.Changed()) != 0 {
		t.Fatalf("exceptions %d, changed %v; want none", tr.Exceptions(), tr.Changed())
	}

	// A new generation holds the watermark back until it is PROGRAMMED; a change of labels
	// (the same generation and generation revision at a later revision) does not.
	tr.SetObject(route("b", 2, 12, 12))
	tr.SetObject(route("c", 1, 9, 13))
	tr.SetPosition("e1", 13)
	wantWatermark(t, tr, 11)
	tr.SetStatus(key("b"), status(programmed, 2))
	wantWatermark(t, tr, 13)

	// Deleting an object that holds the watermark back lets it go.
	tr.SetObject(route("d", 1, 14, 14))
	tr.SetPosition("e1", 14)
	wantWatermark(t, tr, 13)
	tr.DeleteObject(key("d"))
	wantWatermark(t, tr, 14)
}

func TestFailureAndAgeMakeExceptions(t *testing.T) {
	tr, c := newTracker(Options{ExceptionAfter: 2 * time.Second})
	tr.SetPosition("e1", 20)
	for i, name := range []string{"a", "b", "c"} {
		tr.SetObject(route(name, 1, uint64(10+i), uint64(10+i)))
	}
	tr.SetStatus(key("c"), status(programmed, 1))
	// A failure at the object's generation is an exception at once, and lets the watermark
	// pass it; one at an older generation is not.
	tr.SetStatus(key("a"), status(failed, 1))
	if !tr.IsException(key("a")) {
		t.Fatal("a FAILED at its generation is no exception")
	}
	wantWatermark(t, tr, 10) // b holds it back
	if got := tr.Changed(); !slices.Equal(got, []nimbusv1.Key{key("a")}) {
		t.Fatalf("changed %v, want [a]", got)
	}

	// b, pending, becomes an exception once it has been so for ExceptionAfter.
	at, ok := tr.NextAging()
	if !ok || !at.Equal(c.now.Add(2*time.Second)) {
		t.Fatalf("next aging %v %v, want %v", at, ok, c.now.Add(2*time.Second))
	}
	c.Advance(1999 * time.Millisecond)
	wantWatermark(t, tr, 10)
	c.Advance(time.Millisecond)
	wantWatermark(t, tr, 20)
	if !tr.IsException(key("b")) || tr.Exceptions() != 2 {
		t.Fatalf("b exception %v, exceptions %d; want true, 2", tr.IsException(key("b")), tr.Exceptions())
	}
	if got := tr.Changed(); !slices.Equal(got, []nimbusv1.Key{key("b")}) {
		t.Fatalf("changed %v, want [b]", got)
	}
	// An exception stays one while it is short of done, whatever its phase, and stops
	// being one once done.
	tr.SetStatus(key("a"), status(pendingPh, 1))
	if !tr.IsException(key("a")) {
		t.Fatal("a retrying is no exception any more")
	}
	tr.SetStatus(key("a"), status(programmed, 1))
	tr.DeleteObject(key("b"))
	if tr.Exceptions() != 0 || !slices.Equal(tr.Changed(), []nimbusv1.Key{key("a"), key("b")}) {
		t.Fatalf("exceptions %d after a was done and b deleted, want 0 and both changed", tr.Exceptions())
	}
	wantWatermark(t, tr, 20)

	// An object that stops being done below the watermark handed out is an exception at
	// once: the watermark does not go back.
	tr.SetStatus(key("c"), status(pendingPh, 1))
	if !tr.IsException(key("c")) {
		t.Fatal("c, pending again below the watermark, is no exception")
	}
	wantWatermark(t, tr, 20)
}

func TestExceptionsAreBounded(t *testing.T) {
	tr, c := newTracker(Options{MaxExceptions: 2})
	tr.SetPosition("e1", 100)
	for i := range 4 {
		name := fmt.Sprint("r", i)
		tr.SetObject(route(name, 1, uint64(10+i), uint64(10+i)))
		tr.SetStatus(key(name), status(failed, 1))
	}
	if tr.Exceptions() != 2 {
		t.Fatalf("exceptions %d, want the limit, 2", tr.Exceptions())
	}
	// The failures past the limit hold the watermark back, and age does not change that.
	wantWatermark(t, tr, 11)
	c.Advance(time.Hour)
	wantWatermark(t, tr, 11)
	if _, ok := tr.NextAging(); ok {
		t.Fatal("NextAging with no room for exceptions says an object will age")
	}
	// Room made, the oldest waiting becomes one.
	tr.SetStatus(key("r0"), status(programmed, 1))
	wantWatermark(t, tr, 12)
	tr.SetStatus(key("r1"), status(programmed, 1))
	wantWatermark(t, tr, 100)
}

func TestNewEpochStartsOver(t *testing.T) {
	tr, _ := newTracker(Options{})
	tr.SetPosition("e1", 50)
	tr.SetObject(route("a", 1, 40, 40))
	tr.SetStatus(key("a"), status(programmed, 1))
	wantWatermark(t, tr, 50)
	// Another store: the snapshot holds a at revision 3, and its status is old.
	tr.SetPosition("e2", 5)
	tr.SetObject(route("a", 1, 3, 3))
	tr.SetStatus(key("a"), status(pendingPh, 1))
	if tr.IsException(key("a")) {
		t.Fatal("a, pending in a new epoch, is an exception: the old epoch's watermark still counts")
	}
	if epoch, w := tr.Watermark(); epoch != "e2" || w != 2 {
		t.Fatalf("watermark %s %d, want e2 2", epoch, w)
	}
}

// TestWatermarkRandom checks, after every step of random changes, what a watermark
// promises: every object held whose generation revision is at or below it is done or an
// exception, it is no further than the resume point, and it is as far as that allows.
func TestWatermarkRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(testrand.Seed(t), 0))
	tr, c := newTracker(Options{ExceptionAfter: time.Second, MaxExceptions: 5})
	type obj struct {
		gen      int64
		genRev   uint64
		phase    nimbusv1.Phase
		observed int64
	}
	held := map[string]*obj{}
	rev := uint64(0)
	tr.SetPosition("e", rev)
	var last uint64
	for step := range 5000 {
		name := fmt.Sprint("r", rng.IntN(30))
		o := held[name]
		switch op := rng.IntN(10); {
		case op < 3: // a change of the object, with a new generation or labels only
			rev++
			if o == nil {
				o = &obj{gen: 1, genRev: rev}
				held[name] = o
			} else if rng.IntN(3) > 0 {
				o.gen, o.genRev = o.gen+1, rev
			}
			tr.SetObject(route(name, o.gen, o.genRev, rev))
			tr.SetPosition("e", rev)
		case op < 4 && o != nil:
			rev++
			delete(held, name)
			tr.DeleteObject(key(name))
			tr.SetPosition("e", rev)
		case o != nil: // the HAL reports, often the current generation
			o.observed = o.gen - int64(rng.IntN(2))
			o.phase = []nimbusv1.Phase{programmed, programmed, pendingPh, failed}[rng.IntN(4)]
			tr.SetStatus(key(name), status(o.phase, o.observed))
		default:
			c.Advance(time.Duration(rng.IntN(800)) * time.Millisecond)
		}
		_, w := tr.Watermark()
		if w > rev {
			t.Fatalf("step %d: watermark %d beyond the resume point %d", step, w, rev)
		}
		if w < last && tr.Exceptions() < 5 {
			// Only an object that stops being done with no room left for exceptions takes
			// the watermark back.
			t.Fatalf("step %d: watermark went back from %d to %d with room for exceptions", step, last, w)
		}
		last = w
		blocked := false
		for name, o := range held {
			isDone := o.phase == programmed && o.observed == o.gen
			if tr.IsException(key(name)) {
				if isDone {
					t.Fatalf("step %d: %s done and still an exception", step, name)
				}
				continue
			}
			if isDone {
				continue
			}
			if o.genRev <= w {
				t.Fatalf("step %d: %s (generation revision %d) neither done nor an exception, below watermark %d", step, name, o.genRev, w)
			}
			if o.genRev == w+1 {
				blocked = true
			}
		}
		if w != rev && !blocked {
			t.Fatalf("step %d: watermark %d short of the resume point %d with nothing at %d holding it back", step, w, rev, w+1)
		}
		if tr.Exceptions() > 5 {
			t.Fatalf("step %d: %d exceptions, over the limit 5", step, tr.Exceptions())
		}
	}
}

// TestQueuesStayBounded checks that an object that comes and goes many times while
// another holds the watermark back leaves no trail: the places it left behind are
// dropped, and the queues stay the size of what is pending.
func TestQueuesStayBounded(t *testing.T) {
	tr, _ := newTracker(Options{})
	tr.SetPosition("e", 100_000)
	tr.SetObject(route("stuck", 1, 2, 2))
	for i := range 10_000 {
		// A new generation each time, pending, then done.
		gen := int64(i + 1)
		tr.SetObject(route("flapping", gen, uint64(10+i), uint64(10+i)))
		tr.SetStatus(key("flapping"), status(programmed, gen))
		if i%100 == 0 {
			wantWatermark(t, tr, 1) // the stuck object holds it back
		}
	}
	wantWatermark(t, tr, 1)
	if tr.Pending() != 1 {
		t.Errorf("%d pending, want 1", tr.Pending())
	}
	if n := max(len(tr.pending.items), len(tr.aging.items)); n > 2+smallRoom {
		t.Errorf("the queues hold %d places for one pending object", n)
	}
	// Once nothing is pending, the queues let go of their room.
	tr.SetStatus(key("stuck"), status(programmed, 1))
	wantWatermark(t, tr, 100_000)
	for i := range 1000 {
		tr.SetObject(route(fmt.Sprintf("burst-%d", i), 1, uint64(200_000+i), uint64(200_000+i)))
	}
	for i := range 1000 {
		tr.SetStatus(key(fmt.Sprintf("burst-%d", i)), status(programmed, 1))
	}
	tr.SetPosition("e", 300_000)
	wantWatermark(t, tr, 300_000)
	if c := max(cap(tr.pending.items), cap(tr.aging.items)); c > smallRoom {
		t.Errorf("the queues keep room for %d places with nothing pending", c)
	}
}
