package controller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/naplesnet/naples/nimbus"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// waiting is a Wait running in the background.
type waiting struct {
	done     chan error
	progress chan string
}

// startWait runs c.Wait for the targets in the background.
func startWait(t *testing.T, c *Client, targets ...Target) *waiting {
	t.Helper()
	return startWaitWith(t, c, WaitOptions{}, targets...)
}

// startWaitWith runs c.Wait for the targets in the background with opts, its Progress
// set.
func startWaitWith(t *testing.T, c *Client, opts WaitOptions, targets ...Target) *waiting {
	t.Helper()
	w := &waiting{done: make(chan error, 1), progress: make(chan string, 100)}
	ctx := testContext(t)
	opts.Progress = func(i int, tg Target, item *nimbusv1.ObjectWithStatus) {
		if got := item.GetObject().Key().ID(); got != tg.Key.ID() {
			t.Errorf("progress of %s handed an item of %s", tg.Key.ID(), got)
		}
		if want := targets[i].Key.Defaulted().ID(); tg.Key.ID() != want {
			t.Errorf("progress of target %d handed %s, want %s", i, tg.Key.ID(), want)
		}
		w.progress <- fmt.Sprintf("%s@%d: %d/%d", tg.Key.GetName(), tg.Generation,
			item.GetStatus().GetProgrammedNodes(), item.GetStatus().GetTargetNodes())
	}
	go func() { w.done <- c.Wait(ctx, targets, opts) }()
	t.Cleanup(func() { <-w.done })
	return w
}

// wantProgress fails the test unless the next progress is line.
func (w *waiting) wantProgress(t *testing.T, line string) {
	t.Helper()
	if got := recorder(w.progress).next(t); got != line {
		t.Fatalf("progress = %q, want %q", got, line)
	}
}

// result returns what Wait returned.
func (w *waiting) result(t *testing.T) error {
	t.Helper()
	err := <-w.done
	w.done <- err // for the cleanup
	return err
}

// forEachWait runs test with a wait that follows whole statuses and with a brief one
// (WaitOptions.Brief): the two must end alike and show the same progress.
func forEachWait(t *testing.T, test func(t *testing.T, opts WaitOptions)) {
	for _, brief := range []bool{false, true} {
		t.Run(fmt.Sprintf("brief=%v", brief), func(t *testing.T) { test(t, WaitOptions{Brief: brief}) })
	}
}

func TestWaitUntilProgrammed(t *testing.T) { forEachWait(t, testWaitUntilProgrammed) }

func testWaitUntilProgrammed(t *testing.T, opts WaitOptions) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	api := rawClient(t, socket)
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", "a", "b"), route("r2", "192.0.2.1", "a")); err != nil {
		t.Fatal(err)
	}
	report(t, api, "r2", "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")

	w := startWaitWith(t, c, opts, Target{Key: routeKey("r1")}, Target{Key: routeKey("r2")})
	w.wantProgress(t, "r1@1: 0/2")
	w.wantProgress(t, "r2@1: 1/1")
	report(t, api, "r1", "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	w.wantProgress(t, "r1@1: 1/2")
	select {
	case err := <-w.done:
		t.Fatalf("Wait returned %v with r1 programmed on 1 of 2 nodes", err)
	default:
	}
	report(t, api, "r1", "b", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	if err := w.result(t); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestWaitForGeneration waits for a generation not programmed yet: statuses of the one
// before do not count.
func TestWaitForGeneration(t *testing.T) { forEachWait(t, testWaitForGeneration) }

func testWaitForGeneration(t *testing.T, opts WaitOptions) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	api := rawClient(t, socket)
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", "a")); err != nil {
		t.Fatal(err)
	}
	report(t, api, "r1", "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	res, err := c.Apply(testContext(t), route("r1", "192.0.2.2", "a"))
	if err != nil {
		t.Fatal(err)
	}
	gen := res[0].GetObject().GetMeta().GetGeneration()
	w := startWaitWith(t, c, opts, Target{Key: routeKey("r1"), Generation: gen})
	w.wantProgress(t, "r1@2: 0/1")
	report(t, api, "r1", "a", 2, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	if err := w.result(t); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

func TestWaitFailsFast(t *testing.T) { forEachWait(t, testWaitFailsFast) }

func testWaitFailsFast(t *testing.T, opts WaitOptions) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	api := rawClient(t, socket)
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", "a", "b", "c")); err != nil {
		t.Fatal(err)
	}
	w := startWaitWith(t, c, opts, Target{Key: routeKey("r1")})
	w.wantProgress(t, "r1@1: 0/3")
	reportStatus(t, api, "r1", &nimbusv1.NodeStatus{Node: "b", ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED,
		Terminal: true, Reason: "InvalidSpec", Message: "spec.table 255: reserved"})
	err := w.result(t)
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, ErrFailed) {
		t.Fatalf("Wait = %v, want a WaitError wrapping ErrFailed", err)
	}
	want := "Route/default/default/r1: programming failed on 1 of 3 nodes (generation 1): node b: InvalidSpec: spec.table 255: reserved"
	if err.Error() != want {
		t.Fatalf("Wait error = %q, want %q", err, want)
	}
	if len(we.Failed) != 1 || we.Failed[0].GetNode() != "b" || we.Item.GetStatus().GetFailedNodes() != 1 {
		t.Fatalf("WaitError = failed %v, item status %v; want node b's status and the item", we.Failed, we.Item.GetStatus())
	}
}

// TestWaitThroughRetriedFailure: a FAILED status that the agent retries (not terminal)
// is progress; Wait waits on, and succeeds once the node reports PROGRAMMED.
func TestWaitThroughRetriedFailure(t *testing.T) { forEachWait(t, testWaitThroughRetriedFailure) }

func testWaitThroughRetriedFailure(t *testing.T, opts WaitOptions) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	api := rawClient(t, socket)
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", "a")); err != nil {
		t.Fatal(err)
	}
	w := startWaitWith(t, c, opts, Target{Key: routeKey("r1")})
	w.wantProgress(t, "r1@1: 0/1")
	report(t, api, "r1", "a", 1, nimbusv1.Phase_PHASE_FAILED, "KernelError", "adding route: network is unreachable")
	w.wantProgress(t, "r1@1: 0/1") // the failure, seen
	select {
	case err := <-w.done:
		w.done <- err // for the cleanup
		t.Fatalf("Wait returned %v on a failure that is being retried", err)
	default:
	}
	report(t, api, "r1", "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	if err := w.result(t); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

func TestWaitNotFound(t *testing.T) { forEachWait(t, testWaitNotFound) }

func testWaitNotFound(t *testing.T, opts WaitOptions) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", "a")); err != nil {
		t.Fatal(err)
	}
	err := c.Wait(testContext(t), []Target{{Key: routeKey("r1")}, {Key: routeKey("missing")}}, opts)
	if !errors.Is(err, ErrNotFound) || err.Error() != "Route/default/default/missing: object not found" {
		t.Fatalf("Wait for a missing object = %v, want it not found", err)
	}

	// Deleted while waited for.
	w := startWaitWith(t, c, opts, Target{Key: routeKey("r1")})
	w.wantProgress(t, "r1@1: 0/1")
	if _, err := c.Delete(testContext(t), routeKey("r1")); err != nil {
		t.Fatal(err)
	}
	err = w.result(t)
	if !errors.Is(err, ErrNotFound) || err.Error() != "Route/default/default/r1: object not found: it was deleted" {
		t.Fatalf("Wait for a deleted object = %v, want it deleted", err)
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", "a")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testContext(t))
	err := c.Wait(ctx, []Target{{Key: routeKey("r1")}}, WaitOptions{Progress: func(int, Target, *nimbusv1.ObjectWithStatus) { cancel() }})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v after its context ended, want context.Canceled", err)
	}
}

// TestWaitBeyondStatusNodes waits for objects of more nodes than nimbus lists in a
// status (its --status-nodes): a wait counts them all and ends, and a failed one names
// the FAILED nodes listed and says how many more failed.
func TestWaitBeyondStatusNodes(t *testing.T) { forEachWait(t, testWaitBeyondStatusNodes) }

func testWaitBeyondStatusNodes(t *testing.T, opts WaitOptions) {
	socket := socketPath(t)
	serveWith(t, socket, nimbus.Options{Limits: nimbus.Limits{StatusNodes: 3}})
	c := newClient(t, socket, Options{})
	api := rawClient(t, socket)
	var nodes []string
	for i := range 8 {
		nodes = append(nodes, fmt.Sprintf("n%d", i))
	}
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", nodes...), route("r2", "192.0.2.1", nodes...)); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		report(t, api, "r1", n, 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
		if i%2 == 0 {
			reportStatus(t, api, "r2", &nimbusv1.NodeStatus{Node: n, ObservedGeneration: 1, Phase: nimbusv1.Phase_PHASE_FAILED,
				Terminal: true, Reason: "InvalidSpec", Message: "no"})
		}
	}
	if err := c.Wait(testContext(t), []Target{{Key: routeKey("r1")}}, opts); err != nil {
		t.Fatalf("Wait for a route programmed on its 8 nodes, 3 of them listed: %v", err)
	}
	err := c.Wait(testContext(t), []Target{{Key: routeKey("r2")}}, opts)
	want := "Route/default/default/r2: programming failed on 3 of 8 nodes (generation 1): node n0: InvalidSpec: no; node n2: InvalidSpec: no; node n4: InvalidSpec: no; and 1 more FAILED node"
	if !errors.Is(err, ErrFailed) || err.Error() != want {
		t.Fatalf("Wait = %v, want %q", err, want)
	}
}

// TestFilterOfNamesTargets: a wait for several objects watches their keys, not every
// object of what they have in common; a wait for one watches it by its fields.
func TestFilterOfNamesTargets(t *testing.T) {
	r2 := &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ROUTE, Tenant: "t1", Name: "r2"}
	f := filterOf([]Target{{Key: routeKey("r1")}, {Key: r2}})
	if f.Kind != nimbusv1.Kind_KIND_ROUTE || f.Tenant != "" || f.Namespace != nimbusv1.DefaultNamespace || f.Name != "" || !f.StatusOnly {
		t.Errorf("filter of r1 and t1's r2 = %+v, want routes of any tenant in the default namespace, statuses only", f)
	}
	var ids []string
	for _, k := range f.Keys {
		ids = append(ids, k.ID())
	}
	if want := []string{"Route/default/default/r1", "Route/t1/default/r2"}; !slices.Equal(ids, want) {
		t.Errorf("filter of r1 and t1's r2 names keys %q, want %q", ids, want)
	}
	f = filterOf([]Target{{Key: routeKey("r1")}})
	if f.Keys != nil || f.Name != "r1" || f.Kind != nimbusv1.Kind_KIND_ROUTE {
		t.Errorf("filter of r1 alone = %+v, want route r1 by its fields, no keys", f)
	}
	// Keys that would make a request larger than nimbus takes are left out.
	many := make([]Target, 150_000)
	for i := range many {
		many[i] = Target{Key: routeKey(fmt.Sprintf("dc2-web-frontend-%06d", i))}
	}
	if f = filterOf(many); f.Keys != nil || f.Kind != nimbusv1.Kind_KIND_ROUTE {
		t.Errorf("filter of 150,000 routes names %d keys, kind %v; want routes, no keys", len(f.Keys), f.Kind)
	}
}

// TestBriefWaitResumesAcrossRestart restarts nimbus, on the same data directory, while a
// brief wait runs, and changes and deletes objects while it is down: after the reconnect
// the wait hears of those changes only, and gives up on the deleted object.
func TestBriefWaitResumesAcrossRestart(t *testing.T) {
	socket, dataDir := socketPath(t), t.TempDir()
	first := serve(t, socket, dataDir)
	c := newClient(t, socket, Options{})
	if _, err := c.Apply(testContext(t), route("a", "192.0.2.1", "x"), route("b", "192.0.2.1", "x"), route("c", "192.0.2.1", "x")); err != nil {
		t.Fatal(err)
	}
	var pending []string
	progress := make(chan string, 100)
	done := make(chan error, 1)
	go func() {
		done <- c.Wait(testContext(t), []Target{{Key: routeKey("a")}, {Key: routeKey("b")}, {Key: routeKey("c")}}, WaitOptions{Brief: true,
			Progress: func(_ int, tg Target, item *nimbusv1.ObjectWithStatus) {
				// A brief entry names no pending node, where a whole status would.
				pending = append(pending, item.GetStatus().GetPending()...)
				progress <- fmt.Sprintf("%s@%d: gen %d %d/%d", tg.Key.GetName(), tg.Generation, item.GetObject().GetMeta().GetGeneration(),
					item.GetStatus().GetProgrammedNodes(), item.GetStatus().GetTargetNodes())
			}})
	}()
	recorder(progress).wantLines(t, "a@1: gen 1 0/1", "b@1: gen 1 0/1", "c@1: gen 1 0/1")

	first.stop()
	otherSocket := filepath.Join(t.TempDir(), "other.sock")
	other := serve(t, otherSocket, dataDir)
	o := newClient(t, otherSocket, Options{})
	if _, err := o.Apply(testContext(t), route("b", "192.0.2.2", "x")); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Delete(testContext(t), routeKey("c")); err != nil {
		t.Fatal(err)
	}
	other.stop()

	serve(t, socket, dataDir)
	recorder(progress).wantNext(t, "b@1: gen 2 0/1")
	err := <-done
	if !errors.Is(err, ErrNotFound) || err.Error() != "Route/default/default/c: object not found: it was deleted" {
		t.Fatalf("Wait = %v, want c deleted", err)
	}
	if len(progress) > 0 {
		t.Errorf("progress after the reconnect: %q more", <-progress)
	}
	if len(pending) > 0 {
		t.Errorf("progress named pending nodes %q: the wait was not brief", pending)
	}
}

// TestBriefWaitForMoreKeysThanARequestTakes waits briefly for more objects than their keys
// fit in a request nimbus takes: the wait watches what they have in common, with whole
// statuses, and still tells each target's fate.
func TestBriefWaitForMoreKeysThanARequestTakes(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	if _, err := c.Apply(testContext(t), route("r1", "192.0.2.1", "a")); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 200)
	targets := []Target{{Key: routeKey("r1")}}
	// More than the 16 MiB of a request nimbus takes.
	for i := range (16<<20)/200 + 1000 {
		targets = append(targets, Target{Key: routeKey(fmt.Sprintf("%s-%06d", long, i))})
	}
	err := c.Wait(testContext(t), targets, WaitOptions{Brief: true})
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok || len(joined.Unwrap()) != len(targets)-1 || !errors.Is(err, ErrNotFound) {
		n := 0
		if ok {
			n = len(joined.Unwrap())
		}
		t.Fatalf("brief Wait for %d missing routes and r1: %d errors, want one not found for each missing route", len(targets)-1, n)
	}
}
