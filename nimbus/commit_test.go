package nimbus

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// applyConcurrently applies n routes, c000 on, each in its own Apply from its own
// goroutine, all let go at once, and returns their errors by index. The route at bad, when
// bad is in range, is invalid.
func applyConcurrently(t *testing.T, ts *testServer, n, bad int, started func()) []error {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := range n {
		obj := route(fmt.Sprintf("c%03d", i), nil, "192.0.2.1")
		if i == bad {
			obj.GetRoute().Prefix = "10.0.0.0/33"
		}
		wg.Go(func() {
			<-gate
			_, errs[i] = ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: obj})
		})
	}
	close(gate)
	if started != nil {
		started()
	}
	wg.Wait()
	return errs
}

// wantOnlyBadFailed fails the test unless the Apply at bad failed as invalid and every
// other one succeeded.
func wantOnlyBadFailed(t *testing.T, errs []error, bad int) {
	t.Helper()
	for i, err := range errs {
		if i == bad {
			st := wantCode(t, err, codes.InvalidArgument)
			if !strings.Contains(st.Message(), `spec.prefix "10.0.0.0/33"`) {
				t.Errorf("invalid Apply refused with %q, want the bad field named", st.Message())
			}
			continue
		}
		if err != nil {
			t.Errorf("Apply c%03d: %v", i, err)
		}
	}
}

// TestGroupCommit checks that concurrent Applies share state file commits, that each is
// durable when it returns, and that an invalid one fails alone.
func TestGroupCommit(t *testing.T) {
	const n, bad = 200, 77
	dir := t.TempDir()
	ts := start(t, Options{DataDir: dir})
	w := watch(t, ts.client, "a")
	recvUntilSynced(t, w)
	before := commits(t, ts)

	wantOnlyBadFailed(t, applyConcurrently(t, ts, n, bad, nil), bad)

	// Every valid Apply took one revision; the watcher saw each once, in revision order.
	seen := map[string]bool{}
	for rev := uint64(1); rev < n; rev++ {
		ev := recv(t, w)
		if ev.GetRevision() != rev || seen[ev.ObjectKey().GetName()] {
			t.Fatalf("event %d = %s at revision %d, want a new object at %d", rev, ev.ObjectKey().ID(), ev.GetRevision(), rev)
		}
		seen[ev.ObjectKey().GetName()] = true
	}
	commits := commits(t, ts) - before
	t.Logf("%d concurrent Applies took %d state file commits", n-1, commits)
	if commits > n/2 {
		t.Errorf("%d concurrent Applies took %d state file commits, want at most %d", n-1, commits, n/2)
	}
	wantMetrics(t, ts.srv, fmt.Sprintf("naples_nimbus_commits_total %d", commits))
	if count, sum := histogram(t, ts.srv, "naples_nimbus_commit_batch_size"); count != uint64(commits) || sum != n-1 {
		t.Errorf("commit batch sizes: %d commits of %v changes, want %d of %d", count, sum, commits, n-1)
	}

	// Each Apply was durable when it returned.
	ts.srv.Close()
	again := start(t, Options{DataDir: dir})
	wantStored(t, again, n-1, validNames(n, bad)...)
}

// TestGroupCommitTakesTheQueue checks the shape of group commit: while a commit is under
// way, every Apply that arrives queues, and the next commit takes all of them. The test
// holds the lock every commit takes, which stands for a commit being written.
func TestGroupCommitTakesTheQueue(t *testing.T) {
	const n, bad = 50, 20
	ts := start(t, Options{DataDir: t.TempDir()})
	before := commits(t, ts)

	ts.srv.mu.Lock()
	locked := true
	defer func() {
		if locked {
			ts.srv.mu.Unlock()
		}
	}()
	errs := applyConcurrently(t, ts, n, bad, func() {
		// The first valid Apply leads and waits for the lock; the other valid ones queue.
		deadline := time.Now().Add(10 * time.Second)
		for queued := 0; queued != n-2; {
			if time.Now().After(deadline) {
				t.Errorf("%d Applies queued after 10s, want %d", queued, n-2)
				break
			}
			runtime.Gosched()
			ts.srv.commits.mu.Lock()
			queued = len(ts.srv.commits.queue)
			ts.srv.commits.mu.Unlock()
		}
		ts.srv.mu.Unlock()
		locked = false
	})
	wantOnlyBadFailed(t, errs, bad)
	if commits := commits(t, ts) - before; commits != 2 {
		t.Errorf("state file commits = %d, want 2: the leader's, then the %d queued meanwhile", commits, n-2)
	}
	if count, sum := histogram(t, ts.srv, "naples_nimbus_commit_batch_size"); count != 2 || sum != n-1 {
		t.Errorf("commit batch sizes: %d commits of %v changes, want 2 of %d", count, sum, n-1)
	}
	wantStored(t, ts, n-1, validNames(n, bad)...)
}

// validNames returns the names of the routes applyConcurrently applies that are valid.
func validNames(n, bad int) []string {
	var names []string
	for i := range n {
		if i != bad {
			names = append(names, fmt.Sprintf("c%03d", i))
		}
	}
	return names
}

// TestCommitAfterClose checks that batches fail with Unavailable once the server is
// closed, and store nothing.
func TestCommitAfterClose(t *testing.T) {
	ts := start(t, Options{})
	wantStored(t, ts, 0) // the server serves
	ts.srv.Close()
	_, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: numberedRoutes(3)})
	wantCode(t, err, codes.Unavailable)
	_, err = ts.client.DeleteBatch(testContext(t), &nimbusv1.DeleteBatchRequest{Keys: []*nimbusv1.ObjectKey{routeKey("r1")}})
	wantCode(t, err, codes.Unavailable)
	wantStored(t, ts, 0)
}
