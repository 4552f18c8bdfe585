package watermark

import (
	"testing"
	"time"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// source is what a node holds, as a Reporter reads it.
type source struct {
	objs map[nimbusv1.Key]*nimbusv1.Object
	sts  map[nimbusv1.Key]*nimbusv1.NodeStatus
}

func (s *source) Object(key nimbusv1.Key) *nimbusv1.Object     { return s.objs[key] }
func (s *source) Status(key nimbusv1.Key) *nimbusv1.NodeStatus { return s.sts[key] }

// sent is one report as the test reads it: a watermark's revision, or a key and phase.
type sent struct {
	watermark uint64
	key       string
	phase     nimbusv1.Phase
	noStatus  bool
}

// report runs one Report and returns what it sent.
func report(t *testing.T, r *Reporter, src *source, rev uint64, changed ...nimbusv1.Key) []sent {
	t.Helper()
	var out []sent
	_, err := r.Report(src, "e1", rev, changed, false, nil, func(rep *nimbusv1.StatusReport) error {
		if wm := rep.GetWatermark(); wm != nil {
			if wm.GetNode() != "n1" || wm.GetEpoch() != "e1" {
				t.Errorf("watermark %v: want node n1, epoch e1", wm)
			}
			out = append(out, sent{watermark: wm.GetRevision()})
			return nil
		}
		st := rep.GetStatus()
		if st.GetNode() != "n1" {
			t.Errorf("status of %s names node %q, want n1", rep.GetKey().ID(), st.GetNode())
		}
		out = append(out, sent{key: rep.GetKey().GetName(), phase: st.GetPhase(), noStatus: st.GetPhase() == nimbusv1.Phase_PHASE_UNSPECIFIED})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReporter(t *testing.T) {
	c := &clock{now: time.Unix(1700000000, 0)}
	r := NewReporter("n1", Options{Now: c.Now, ExceptionAfter: time.Second})
	a, b, f := key("a"), key("b"), key("f")
	src := &source{
		objs: map[nimbusv1.Key]*nimbusv1.Object{a: route("a", 1, 10, 10), b: route("b", 1, 11, 11), f: route("f", 1, 12, 12)},
		sts: map[nimbusv1.Key]*nimbusv1.NodeStatus{
			a: {Phase: nimbusv1.Phase_PHASE_PROGRAMMED, ObservedGeneration: 1},
			f: {Phase: nimbusv1.Phase_PHASE_FAILED, ObservedGeneration: 1, Message: "refused"},
		},
	}
	check := func(got []sent, want ...sent) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("sent %+v, want %+v", got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("sent %+v, want %+v", got, want)
			}
		}
	}
	// b has no status: it holds the watermark back just below it; f failed: an
	// exception, sent on its own.
	check(report(t, r, src, 12, a, b, f),
		sent{key: "f", phase: nimbusv1.Phase_PHASE_FAILED},
		sent{watermark: 10})
	// Nothing changed, nothing moved: nothing to send.
	check(report(t, r, src, 12))
	// b short of done for ExceptionAfter: an exception without a status, sent as a status
	// without a phase, and the watermark passes it.
	c.Advance(time.Second)
	check(report(t, r, src, 12),
		sent{key: "b", noStatus: true},
		sent{watermark: 12})
	// b done: its status goes up once more to clear the one nimbus holds.
	src.sts[b] = &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED, ObservedGeneration: 1}
	check(report(t, r, src, 12, b),
		sent{key: "b", phase: nimbusv1.Phase_PHASE_PROGRAMMED})
	// f gone: nimbus drops its status itself; the position moves on.
	delete(src.objs, f)
	delete(src.sts, f)
	check(report(t, r, src, 13, f),
		sent{watermark: 13})
	if n := r.Tracker().Exceptions(); n != 0 {
		t.Errorf("%d exceptions left, want 0", n)
	}
}
