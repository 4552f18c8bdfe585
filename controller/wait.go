package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Target is an object to wait for.
type Target struct {
	Key *nimbusv1.ObjectKey
	// Generation is the generation the object must be PROGRAMMED at; a later one counts
	// too. Default: 0, the generation the object has when the wait first sees it.
	Generation int64
}

// WaitOptions configures Wait.
type WaitOptions struct {
	// Progress, when set, is called with the index of a target in Wait's targets, the
	// target, its Generation set, and the target's object, its kind, key and generations
	// only (see Filter.StatusOnly), and status, when the wait first sees the object and
	// whenever the object or its status changes, until the target is done. It is called
	// on the goroutine that called Wait. Default: nil.
	Progress func(i int, t Target, item *nimbusv1.ObjectWithStatus)
	// Brief keeps the status stream to what a wait for thousands of objects needs (see
	// nimbusv1.WatchStatusRequest.brief): nimbus then sends of an object whose status
	// has nothing to tell but its counts (no node FAILED, none with a reason or a
	// message) only its generation and counts, and Progress is handed an item with just
	// those: its object a skeleton (nimbusv1.ObjectKey.Skeleton), its status the
	// generation, target_nodes and programmed_nodes, no nodes listed. Default: false.
	Brief bool
}

// WaitError is why Wait gave up on one target.
type WaitError struct {
	// Target is the target, its Generation set when the wait saw the object.
	Target Target
	// Item is the target's object, its kind, key and generations only, and status when
	// the wait gave up; nil when the object was never seen.
	Item *nimbusv1.ObjectWithStatus
	// Failed holds the statuses of the target nodes that reported a terminal FAILED
	// (NodeStatus.terminal) at the generation or a later one, among those the status
	// lists: nimbus lists FAILED nodes first, up to its --status-nodes.
	Failed []*nimbusv1.NodeStatus
	// Err is ErrNotFound or ErrFailed.
	Err error
}

// Error says what happened to the target: "Route/default/default/r1: programming failed
// on 1 of 3 nodes (generation 2): node host-b: KernelError: adding route: ...". When
// nimbus left FAILED nodes out of the status, it ends with "; and N more FAILED nodes".
func (e *WaitError) Error() string {
	id := e.Target.Key.ID()
	if !errors.Is(e.Err, ErrFailed) {
		if e.Item != nil {
			return fmt.Sprintf("%s: %v: it was deleted", id, e.Err)
		}
		return fmt.Sprintf("%s: %v", id, e.Err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v on %d of %d nodes (generation %d):", id, e.Err,
		len(e.Failed), e.Item.GetStatus().GetTargetNodes(), e.Target.Generation)
	for i, n := range e.Failed {
		if i > 0 {
			b.WriteString(";")
		}
		b.WriteString(" node " + n.GetNode() + ": ")
		if r := n.GetReason(); r != "" {
			b.WriteString(r + ": ")
		}
		b.WriteString(n.GetMessage())
	}
	if more := unlistedFailed(e.Item.GetStatus()); more > 0 {
		fmt.Fprintf(&b, "; and %d more FAILED %s", more, plural(more, "node", "nodes"))
	}
	return b.String()
}

// unlistedFailed returns how many of the nodes FAILED at the status's generation it does
// not list (nimbus lists at most its --status-nodes nodes, FAILED ones first).
func unlistedFailed(st *nimbusv1.ObjectStatus) int {
	if st.GetNodesOmitted() == 0 {
		return 0
	}
	listed := 0
	for _, n := range st.GetNodes() {
		if n.GetPhase() == nimbusv1.Phase_PHASE_FAILED && n.GetObservedGeneration() == st.GetGeneration() {
			listed++
		}
	}
	return max(0, int(st.GetFailedNodes())-listed)
}

// plural returns one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// Unwrap returns Err.
func (e *WaitError) Unwrap() error { return e.Err }

// Wait waits, over one status stream, until every target is PROGRAMMED on every node it
// targets at its generation or a later one, and returns nil then. A FAILED status that
// the node's agent retries (NodeStatus.terminal unset: a kernel error, a conflict) is
// progress, handed to WaitOptions.Progress like any other, and Wait waits on through it,
// as `kubectl rollout status` does. It gives up as soon as a target node reports a
// terminal FAILED (an invalid spec, which no retry mends) at that generation or a later
// one, or a target does not exist or is deleted: once it has seen the state of every
// target, it returns a
// *WaitError for each target that failed or is not found, joined with errors.Join. An
// object that targets no node is never done. When ctx ends first, Wait returns its error,
// wrapped. It waits for nimbus when nimbus is unreachable, and rides out restarts.
func (c *Client) Wait(ctx context.Context, targets []Target, opts WaitOptions) error {
	if len(targets) == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &waiter{opts: opts, byKey: make(map[nimbusv1.Key][]*waitState, len(targets)), stop: cancel, open: len(targets)}
	for i, t := range targets {
		t.Key = t.Key.Defaulted()
		s := &waitState{index: i, target: t}
		w.states = append(w.states, s)
		w.byKey[t.Key.Key()] = append(w.byKey[t.Key.Key()], s)
	}
	for _, s := range w.states {
		s.same = w.byKey[s.target.Key.Key()]
	}
	f := filterOf(targets)
	req := &nimbusv1.WatchStatusRequest{Kind: f.Kind, Tenant: f.Tenant, Namespace: f.Namespace, Name: f.Name, OmitObjects: f.StatusOnly, Keys: f.Keys}
	sw := newStatusWatch(w)
	// A brief stream names its objects by their indexes in the keys, which it needs
	// even for one target; a wait whose keys are too many to name watches whole
	// statuses of what they have in common.
	if opts.Brief && (len(targets) == 1 || req.Keys != nil) {
		req.Keys = []*nimbusv1.ObjectKey{w.states[0].target.Key}
		if len(targets) > 1 {
			req.Keys = f.Keys
		}
		req.Brief = true
		sw = newBriefWatch(w, req.Keys)
	}
	err := c.watchStatus(ctx, req, sw)
	if w.finished {
		return w.result
	}
	if err != nil {
		return fmt.Errorf("waiting: %w", err)
	}
	return fmt.Errorf("waiting: %w", context.Cause(ctx))
}

// filterOf returns the narrowest filter that selects every target: the fields they have
// in common, and their keys when they are several, so that a wait for some objects of a
// kind does not follow every object of it.
func filterOf(targets []Target) Filter {
	first := targets[0].Key.Defaulted()
	f := Filter{Kind: first.GetKind(), Tenant: first.GetTenant(), Namespace: first.GetNamespace(), Name: first.GetName(), StatusOnly: true}
	for _, t := range targets[1:] {
		k := t.Key.Defaulted()
		if k.GetKind() != f.Kind {
			f.Kind = nimbusv1.Kind_KIND_UNSPECIFIED
		}
		if k.GetTenant() != f.Tenant {
			f.Tenant = ""
		}
		if k.GetNamespace() != f.Namespace {
			f.Namespace = ""
		}
		if k.GetName() != f.Name {
			f.Name = ""
		}
	}
	if len(targets) > 1 {
		size := 0
		f.Keys = make([]*nimbusv1.ObjectKey, len(targets))
		for i, t := range targets {
			f.Keys[i] = t.Key.Defaulted()
			size += f.Keys[i].SizeVT() + 4 // the tag and length
		}
		if size > maxWaitKeyBytes {
			// A request nimbus would refuse as too large: the fields select the
			// targets all the same.
			f.Keys = nil
		}
	}
	return f
}

// maxWaitKeyBytes bounds the keys a wait's status watch names, a quarter of the request
// size nimbus takes: some 90,000 keys. A wait for more watches what they have in common.
const maxWaitKeyBytes = 4 << 20

// waitState is where the wait for one target stands.
type waitState struct {
	// index is the target's index in Wait's targets.
	index  int
	target Target
	item   *nimbusv1.ObjectWithStatus
	done   bool
	err    *WaitError
	// same holds the targets of the same object, this one among them, as byKey does: a
	// brief entry names its object by the index of a target, and finds them without a
	// lookup by key.
	same []*waitState
}

// waiter is the SyncReactor of one Wait.
type waiter struct {
	opts   WaitOptions
	states []*waitState
	byKey  map[nimbusv1.Key][]*waitState
	// open counts the targets neither done nor given up on, failed those given up on,
	// so that a status costs no walk over every target.
	open, failed int
	// synced is true once the state of every target has been seen.
	synced bool
	// stop ends the wait's status watch.
	stop func()
	// finished tells that result is the wait's result.
	finished bool
	result   error
}

var _ SyncReactor = (*waiter)(nil)

// OnStatus moves the targets of the item's object on.
func (w *waiter) OnStatus(item *nimbusv1.ObjectWithStatus) {
	w.moveOn(w.byKey[item.GetObject().TypedKey()], item)
}

// moveOn moves the targets of item's object, states, on.
func (w *waiter) moveOn(states []*waitState, item *nimbusv1.ObjectWithStatus) {
	for _, s := range states {
		if s.done || s.err != nil {
			continue
		}
		if s.target.Generation == 0 {
			s.target.Generation = item.GetObject().GetMeta().GetGeneration()
		}
		s.item = item
		if w.opts.Progress != nil {
			w.opts.Progress(s.index, s.target, item)
		}
		done, failed := progress(item, s.target.Generation)
		switch {
		case len(failed) > 0:
			w.giveUp(s, &WaitError{Target: s.target, Item: item, Failed: failed, Err: ErrFailed})
		case done:
			s.done = true
			w.open--
		}
	}
	w.check()
}

// onBrief moves the targets of the object with the key index i on, from a brief entry.
func (w *waiter) onBrief(i int, generation int64, target, programmed int32) {
	key := w.states[i].target.Key
	states := w.states[i].same
	if !slices.ContainsFunc(states, func(s *waitState) bool { return !s.done && s.err == nil }) {
		return
	}
	w.moveOn(states, &nimbusv1.ObjectWithStatus{Object: key.Skeleton(generation),
		Status: &nimbusv1.ObjectStatus{Generation: generation, TargetNodes: target, ProgrammedNodes: programmed}})
}

// OnDelete gives up on the targets of the deleted object.
func (w *waiter) OnDelete(key *nimbusv1.ObjectKey) {
	for _, s := range w.byKey[key.Key()] {
		if !s.done && s.err == nil {
			w.giveUp(s, &WaitError{Target: s.target, Item: s.item, Err: ErrNotFound})
		}
	}
	w.check()
}

// OnSynced gives up on the targets not seen, the first time.
func (w *waiter) OnSynced() {
	if w.synced {
		return
	}
	w.synced = true
	for _, s := range w.states {
		if s.item == nil && s.err == nil {
			w.giveUp(s, &WaitError{Target: s.target, Err: ErrNotFound})
		}
	}
	w.check()
}

// giveUp gives up on the open target s with err.
func (w *waiter) giveUp(s *waitState, err *WaitError) {
	s.err = err
	w.open--
	w.failed++
}

// check ends the wait once its result is known: a target was given up on, or every
// target is done.
func (w *waiter) check() {
	if !w.synced || w.finished || (w.failed == 0 && w.open > 0) {
		return
	}
	var errs []error
	for _, s := range w.states {
		if s.err != nil {
			errs = append(errs, s.err)
		}
	}
	w.finished, w.result = true, errors.Join(errs...)
	w.stop()
}

// progress tells whether item is PROGRAMMED on every target node at generation gen or a
// later one, and returns the statuses of the target nodes FAILED at it for good
// (terminal); the FAILED ones that are being retried are still on their way. The nodes
// PROGRAMMED at the status's generation are counted from programmed_nodes, which counts
// them all, as the status lists only some of them (nimbus's --status-nodes); the ones at
// another generation are records nimbus lists before them.
func progress(item *nimbusv1.ObjectWithStatus, gen int64) (done bool, failed []*nimbusv1.NodeStatus) {
	st := item.GetStatus()
	var programmed int32
	counted := st.GetGeneration() != 0 && st.GetGeneration() >= gen
	if counted {
		programmed = st.GetProgrammedNodes()
	}
	for _, n := range st.GetNodes() {
		if n.GetObservedGeneration() < gen {
			continue
		}
		switch n.GetPhase() {
		case nimbusv1.Phase_PHASE_PROGRAMMED:
			if !counted || n.GetObservedGeneration() != st.GetGeneration() {
				programmed++
			}
		case nimbusv1.Phase_PHASE_FAILED:
			if n.GetTerminal() {
				failed = append(failed, n)
			}
		}
	}
	return st.GetTargetNodes() > 0 && programmed >= st.GetTargetNodes(), failed
}
