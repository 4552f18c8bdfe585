package controller

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// wantLines fails the test unless the reactor's next calls are the lines, in any order.
func (r recorder) wantLines(t *testing.T, lines ...string) {
	t.Helper()
	var got []string
	for range lines {
		got = append(got, r.next(t))
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(lines))
	if !slices.Equal(got, want) {
		t.Fatalf("reactor calls = %q, want %q", got, want)
	}
}

// wantNext fails the test unless the reactor's next call is line.
func (r recorder) wantNext(t *testing.T, line string) {
	t.Helper()
	if got := r.next(t); got != line {
		t.Fatalf("reactor call = %q, want %q", got, line)
	}
}

func TestWatchStatusCallsReactor(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	api := rawClient(t, socket)
	ctx := testContext(t)
	if _, err := c.Apply(ctx, route("r1", "192.0.2.1", "a", "b"), route("other", "192.0.2.1", "a")); err != nil {
		t.Fatal(err)
	}

	r := watch(t, c, Filter{Kind: nimbusv1.Kind_KIND_ROUTE, Name: "r1"})
	r.wantNext(t, "status r1 gen 1 programmed 0/2")
	r.wantNext(t, "synced")

	report(t, api, "r1", "a", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	r.wantNext(t, "status r1 gen 1 programmed 1/2")
	report(t, api, "r1", "b", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	r.wantNext(t, "status r1 gen 1 programmed 2/2")
	if _, err := c.Apply(ctx, route("r1", "192.0.2.2", "a", "b")); err != nil {
		t.Fatal(err)
	}
	r.wantNext(t, "status r1 gen 2 programmed 0/2")
	if _, err := c.Delete(ctx, routeKey("other"), routeKey("r1")); err != nil {
		t.Fatal(err)
	}
	r.wantNext(t, "delete r1")
}

// TestWatchStatusResumesAcrossRestart restarts nimbus, on the same data directory, while
// a watch runs, and changes objects while it is down: after the reconnect the reactor
// hears of those changes only.
func TestWatchStatusResumesAcrossRestart(t *testing.T) {
	socket, dataDir := socketPath(t), t.TempDir()
	first := serve(t, socket, dataDir)
	c := newClient(t, socket, Options{})
	if _, err := c.Apply(testContext(t), route("a", "192.0.2.1", "x"), route("b", "192.0.2.1", "x"), route("c", "192.0.2.1", "x")); err != nil {
		t.Fatal(err)
	}
	r := watch(t, c, Filter{})
	r.wantLines(t, "status a gen 1 programmed 0/1", "status b gen 1 programmed 0/1", "status c gen 1 programmed 0/1")
	r.wantNext(t, "synced")

	// While the watch's nimbus is down, another nimbus on the same data changes b,
	// deletes c and creates d.
	first.stop()
	otherSocket := filepath.Join(t.TempDir(), "other.sock")
	other := serve(t, otherSocket, dataDir)
	o := newClient(t, otherSocket, Options{})
	if _, err := o.Apply(testContext(t), route("b", "192.0.2.2", "x"), route("d", "192.0.2.1", "x")); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Delete(testContext(t), routeKey("c")); err != nil {
		t.Fatal(err)
	}
	other.stop()

	serve(t, socket, dataDir)
	r.wantLines(t, "status b gen 2 programmed 0/1", "status d gen 1 programmed 0/1", "delete c")
	r.wantNext(t, "synced")

	// And the watch goes on.
	report(t, rawClient(t, socket), "a", "x", 1, nimbusv1.Phase_PHASE_PROGRAMMED, "", "")
	r.wantNext(t, "status a gen 1 programmed 1/1")
}

func TestWatchStatusRefusedForGood(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	err := c.WatchStatus(testContext(t), Filter{Kind: 99}, ReactorFuncs{})
	if status.Code(errors.Unwrap(err)) != codes.InvalidArgument && status.Code(err) != codes.InvalidArgument {
		t.Fatalf("WatchStatus with an unknown kind = %v, want InvalidArgument at once", err)
	}
}

func TestWatchStatusReturnsWhenContextEnds(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	c := newClient(t, socket, Options{})
	ctx, cancel := context.WithCancel(testContext(t))
	err := c.WatchStatus(ctx, Filter{}, ReactorFuncs{Synced: cancel})
	if err != nil {
		t.Fatalf("WatchStatus = %v once its context ended, want nil", err)
	}
}

// TestWatchStatusEndsQuietlyAtDeadline ends many watches at their contexts' deadline:
// nimbus, which the deadline goes to with the call, may end the stream a moment before
// the context ends, and that is the watch's end, not a break to watch again after.
func TestWatchStatusEndsQuietlyAtDeadline(t *testing.T) {
	socket := socketPath(t)
	serve(t, socket, "")
	var logs bytes.Buffer
	c := newClient(t, socket, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	for range 300 {
		ctx, cancel := context.WithTimeout(testContext(t), 10*time.Millisecond)
		err := c.WatchStatus(ctx, Filter{}, ReactorFuncs{})
		cancel()
		if err != nil {
			t.Fatalf("WatchStatus = %v at its deadline, want nil", err)
		}
	}
	if strings.Contains(logs.String(), "watching again") {
		t.Errorf("WatchStatus logged at its deadline:\n%s", logs.String())
	}
}
