package watermark

import (
	"errors"
	"slices"
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

// reporterFixture returns a clock, a Reporter of node n1 that reads it, and what the node
// holds: routes a, b and f, made at revisions 10, 11 and 12; a and b PROGRAMMED, f FAILED.
func reporterFixture() (*clock, *Reporter, *source) {
	c := &clock{now: time.Unix(1700000000, 0)}
	r := NewReporter("n1", Options{Now: c.Now, ExceptionAfter: time.Second})
	a, b, f := key("a"), key("b"), key("f")
	src := &source{
		objs: map[nimbusv1.Key]*nimbusv1.Object{a: route("a", 1, 10, 10), b: route("b", 1, 11, 11), f: route("f", 1, 12, 12)},
		sts: map[nimbusv1.Key]*nimbusv1.NodeStatus{
			a: {Phase: nimbusv1.Phase_PHASE_PROGRAMMED, ObservedGeneration: 1},
			b: {Phase: nimbusv1.Phase_PHASE_PROGRAMMED, ObservedGeneration: 1},
			f: {Phase: nimbusv1.Phase_PHASE_FAILED, ObservedGeneration: 1, Message: "refused"},
		},
	}
	return c, r, src
}

// checkSent fails the test unless got is want.
func checkSent(t *testing.T, got []sent, want ...sent) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("sent %+v, want %+v", got, want)
	}
}

func TestReporter(t *testing.T) {
	c, r, src := reporterFixture()
	a, b, f := key("a"), key("b"), key("f")
	delete(src.sts, b)
	check := func(got []sent, want ...sent) { checkSent(t, got, want...) }
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

// A new stream costs the exceptions: after Restart, the next Report sends the statuses
// nimbus held from the stream before and the watermark, without being told every key
// again, and it sends what a failed Report did not get to.
func TestReporterRestart(t *testing.T) {
	_, r, src := reporterFixture()
	a, b, f := key("a"), key("b"), key("f")
	check := func(got []sent, want ...sent) { checkSent(t, got, want...) }
	// What a new stream hears while f is the only exception.
	fAndMark := []sent{{key: "f", phase: nimbusv1.Phase_PHASE_FAILED}, {watermark: 12}}
	check(report(t, r, src, 12, a, b, f), fAndMark...)
	// A new stream: the exception and the watermark again, not a or b.
	r.Restart()
	check(report(t, r, src, 12), fAndMark...)
	check(report(t, r, src, 12))

	// b fails; then it is done while the stream breaks at the send that would clear it.
	src.sts[b] = &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_FAILED, ObservedGeneration: 1, Message: "refused too"}
	check(report(t, r, src, 12, b),
		sent{key: "b", phase: nimbusv1.Phase_PHASE_FAILED})
	src.sts[b] = &nimbusv1.NodeStatus{Phase: nimbusv1.Phase_PHASE_PROGRAMMED, ObservedGeneration: 1}
	sends := 0
	_, err := r.Report(src, "e1", 12, []nimbusv1.Key{b}, false, nil, func(*nimbusv1.StatusReport) error {
		sends++
		return errors.New("stream broken")
	})
	if err == nil || sends != 1 {
		t.Fatalf("Report on a broken stream: %v after %d sends, want an error after 1", err, sends)
	}
	// The next stream hears what the broken one did not: b is done, which clears the
	// FAILED status nimbus may still hold; and f.
	r.Restart()
	check(report(t, r, src, 12),
		sent{key: "b", phase: nimbusv1.Phase_PHASE_PROGRAMMED},
		sent{key: "f", phase: nimbusv1.Phase_PHASE_FAILED},
		sent{watermark: 12})
	r.Restart()
	check(report(t, r, src, 12), fAndMark...)
}
