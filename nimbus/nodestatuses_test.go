package nimbus

import (
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// listNodeStatuses reads every page of the object's node statuses with the limit and
// filter, checking that no page holds more than limit entries; it returns the entries
// and how many pages there were.
func (ts *testServer) listNodeStatuses(t *testing.T, key *nimbusv1.ObjectKey, limit int32, filter nimbusv1.NodeStatusFilter) ([]*nimbusv1.NodeStatusEntry, int) {
	t.Helper()
	var entries []*nimbusv1.NodeStatusEntry
	req := &nimbusv1.ListNodeStatusesRequest{Key: key, Limit: limit, Filter: filter}
	for pages := 1; ; pages++ {
		resp, err := ts.client.ListNodeStatuses(testContext(t), req)
		if err != nil {
			t.Fatalf("ListNodeStatuses %s, page %d: %v", key.ID(), pages, err)
		}
		if limit > 0 && len(resp.GetEntries()) > int(limit) {
			t.Fatalf("page %d holds %d entries, over the limit of %d", pages, len(resp.GetEntries()), limit)
		}
		entries = append(entries, resp.GetEntries()...)
		if resp.GetNextPageToken() == "" {
			return entries, pages
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// nodeEntries returns the entries ListNodeStatuses should list for the object status st:
// its nodes with their statuses, and the pending nodes without one, by name.
func nodeEntries(st *nimbusv1.ObjectStatus) []*nimbusv1.NodeStatusEntry {
	var entries []*nimbusv1.NodeStatusEntry
	listed := map[string]bool{}
	for _, ns := range st.GetNodes() {
		entries = append(entries, &nimbusv1.NodeStatusEntry{Node: ns.GetNode(), Status: ns})
		listed[ns.GetNode()] = true
	}
	for _, n := range st.GetPending() {
		if !listed[n] {
			entries = append(entries, &nimbusv1.NodeStatusEntry{Node: n})
		}
	}
	slices.SortFunc(entries, func(a, b *nimbusv1.NodeStatusEntry) int { return strings.Compare(a.GetNode(), b.GetNode()) })
	return entries
}

// wantEntries fails the test unless got and want are the same entries in the same order.
func wantEntries(t *testing.T, what string, got, want []*nimbusv1.NodeStatusEntry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d", what, len(got), len(want))
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("%s: entry %d = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestListNodeStatuses pages through an object for every one of 1,000 nodes, most of
// whose watermarks pass it, 10 of which report it FAILED, some of which report nothing
// and most of which are stale, and checks that the pages together list exactly what the
// object's status does, in every page size and with each filter.
func TestListNodeStatuses(t *testing.T) {
	const nodes = 1000
	ts := start(t, Options{StaleAfter: 30 * time.Second, Limits: Limits{StatusNodes: 1 << 20}})
	name := func(i int) string { return fmt.Sprintf("n%04d", i) }
	for from := 0; from < nodes; from += 250 {
		var objs []*nimbusv1.Object
		for i := from; i < from+250; i++ {
			objs = append(objs, nodeObject(name(i)))
		}
		if _, err := ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: objs, OmitObjects: true}); err != nil {
			t.Fatal(err)
		}
	}
	// A Node object of another namespace, and a node that only watches, are targets too.
	other := nodeObject("n0500b")
	other.Meta.Namespace = "blue"
	ts.apply(t, other)
	watcher := watch(t, ts.client, "n0700w")
	recvUntilSynced(t, watcher)
	key := routeKey("every")
	obj := ts.apply(t, route("every", nil, "192.0.2.1")).GetObject()
	gr := obj.GenerationRevision()

	// Nine nodes in ten have a watermark past the object; the tenth report nothing. Ten
	// report it FAILED, one PENDING, one with no phase; a few watch, and are not stale
	// once the others are.
	var reports []*nimbusv1.StatusReport
	for i := range nodes {
		if i%10 != 0 {
			reports = append(reports, ts.watermarkReport(name(i), gr))
		}
		switch {
		case i%100 == 5:
			reports = append(reports, statusReport(key, name(i), 1, nimbusv1.Phase_PHASE_FAILED, "adding route: network is unreachable on "+name(i)))
		case i == 42:
			reports = append(reports, statusReport(key, name(i), 1, nimbusv1.Phase_PHASE_PENDING, "waiting"))
		case i == 43:
			reports = append(reports, statusReport(key, name(i), 1, nimbusv1.Phase_PHASE_UNSPECIFIED, ""))
		}
	}
	ts.report(t, reports...)
	for _, n := range []string{"n0001", "n0020", "n0999"} {
		recvUntilSynced(t, watch(t, ts.client, n))
	}
	ts.clock.Advance(31 * time.Second)

	st := ts.get(t, key).GetStatus()
	if st.GetTargetNodes() != nodes+2 || st.GetFailedNodes() != 10 || st.GetStaleNodes() == 0 {
		t.Fatalf("status: target %d, failed %d, stale %d; want %d, 10, some", st.GetTargetNodes(), st.GetFailedNodes(), st.GetStaleNodes(), nodes+2)
	}
	want := nodeEntries(st)
	var notProgrammed, failed []*nimbusv1.NodeStatusEntry
	for _, e := range want {
		ph, gen := e.GetStatus().GetPhase(), e.GetStatus().GetObservedGeneration()
		if gen != 1 || ph != nimbusv1.Phase_PHASE_PROGRAMMED {
			notProgrammed = append(notProgrammed, e)
		}
		if gen == 1 && ph == nimbusv1.Phase_PHASE_FAILED {
			failed = append(failed, e)
		}
	}
	// Not programmed: the 100 tenth nodes, n0043 (no phase), the two nodes without a
	// watermark that are no tenth node, the 10 FAILED and n0042 (PENDING).
	if len(notProgrammed) != 114 || len(failed) != 10 {
		t.Fatalf("status: %d nodes not programmed, %d failed; want 114, 10", len(notProgrammed), len(failed))
	}
	var got []*nimbusv1.NodeStatusEntry
	var pages int
	for _, limit := range []int32{7, 100, 0} {
		got, pages = ts.listNodeStatuses(t, key, limit, nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_UNSPECIFIED)
		wantEntries(t, fmt.Sprintf("every node in pages of %d", limit), got, want)
		if limit > 0 && pages != (len(want)+int(limit)-1)/int(limit) {
			t.Errorf("pages of %d: %d, want %d", limit, pages, (len(want)+int(limit)-1)/int(limit))
		}
		got, _ = ts.listNodeStatuses(t, key, limit, nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_NOT_PROGRAMMED)
		wantEntries(t, fmt.Sprintf("nodes not programmed in pages of %d", limit), got, notProgrammed)
		got, _ = ts.listNodeStatuses(t, key, limit, nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_FAILED)
		wantEntries(t, fmt.Sprintf("failed nodes in pages of %d", limit), got, failed)
	}
	for _, e := range failed {
		if msg := e.GetStatus().GetMessage(); msg != "adding route: network is unreachable on "+e.GetNode() {
			t.Errorf("failed node %s says %q", e.GetNode(), msg)
		}
	}

	// Nodes that become targets while a client pages: those after the page it is at are
	// listed, those before are not, and none twice.
	resp, err := ts.client.ListNodeStatuses(testContext(t), &nimbusv1.ListNodeStatusesRequest{Key: key, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	ts.apply(t, nodeObject("n0050x"))
	ts.apply(t, nodeObject("n0600x"))
	got = resp.GetEntries()
	for req := (&nimbusv1.ListNodeStatusesRequest{Key: key, Limit: 100, PageToken: resp.GetNextPageToken()}); req.PageToken != ""; {
		resp, err := ts.client.ListNodeStatuses(testContext(t), req)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, resp.GetEntries()...)
		req.PageToken = resp.GetNextPageToken()
	}
	i, _ := slices.BinarySearchFunc(want, "n0600x", func(e *nimbusv1.NodeStatusEntry, n string) int { return strings.Compare(e.GetNode(), n) })
	wantEntries(t, "nodes while two become targets", got, slices.Concat(want[:i], []*nimbusv1.NodeStatusEntry{{Node: "n0600x"}}, want[i:]))

	// An object for listed nodes lists those, from the token on.
	ts.apply(t, route("listed", []string{"n0003", "n0005", "n0010", "zz"}, "192.0.2.1"))
	got, pages = ts.listNodeStatuses(t, routeKey("listed"), 1, nimbusv1.NodeStatusFilter_NODE_STATUS_FILTER_UNSPECIFIED)
	wantEntries(t, "listed nodes", got, nodeEntries(ts.get(t, routeKey("listed")).GetStatus()))
	if pages != 4 {
		t.Errorf("listed nodes in pages of 1: %d pages, want 4", pages)
	}
}

// TestListNodeStatusesPaging shows that the pages go on by node name while nodes come
// and go, that a page stays within Limits.ListPageBytes, and the errors of a bad request.
func TestListNodeStatusesPaging(t *testing.T) {
	ts := start(t, Options{Limits: Limits{ListPageBytes: 200}})
	for _, n := range []string{"a", "c", "e", "g"} {
		ts.apply(t, nodeObject(n))
	}
	key := routeKey("every")
	ts.apply(t, route("every", nil, "192.0.2.1"))
	ctx := testContext(t)
	resp, err := ts.client.ListNodeStatuses(ctx, &nimbusv1.ListNodeStatusesRequest{Key: key, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetGeneration() != 1 || resp.GetRevision() != ts.srv.store.read().revision() {
		t.Errorf("page at generation %d, revision %d; want 1, %d", resp.GetGeneration(), resp.GetRevision(), ts.srv.store.read().revision())
	}
	names := func(entries []*nimbusv1.NodeStatusEntry) []string {
		var out []string
		for _, e := range entries {
			out = append(out, e.GetNode())
		}
		return out
	}
	if got := names(resp.GetEntries()); !slices.Equal(got, []string{"a", "c"}) {
		t.Fatalf("first page %q, want [a c]", got)
	}
	// A node before the token comes, one after it goes, one after it comes: the next
	// page goes on after c.
	ts.apply(t, nodeObject("b"))
	if _, err := ts.client.Delete(ctx, &nimbusv1.DeleteRequest{Key: nodeObject("e").Key()}); err != nil {
		t.Fatal(err)
	}
	ts.apply(t, nodeObject("f"))
	resp, err = ts.client.ListNodeStatuses(ctx, &nimbusv1.ListNodeStatusesRequest{Key: key, Limit: 2, PageToken: resp.GetNextPageToken()})
	if err != nil {
		t.Fatal(err)
	}
	if got := names(resp.GetEntries()); !slices.Equal(got, []string{"f", "g"}) || resp.GetNextPageToken() != "" {
		t.Fatalf("second page %q, token %q; want [f g], the last", got, resp.GetNextPageToken())
	}

	// A node that watched and watches no more, without a Node object, is no target.
	watchCtx, stopWatch := context.WithCancel(ctx)
	recvUntilSynced(t, watchFrom(t, watchCtx, ts.client, "d", "", 0))
	if entries, _ := ts.listNodeStatuses(t, key, 0, 0); !slices.Equal(names(entries), []string{"a", "b", "c", "d", "f", "g"}) {
		t.Fatalf("with d watching: %q, want [a b c d f g]", names(entries))
	}
	stopWatch()
	waitWatchers(t, ts, 0)
	if entries, _ := ts.listNodeStatuses(t, key, 0, 0); !slices.Equal(names(entries), []string{"a", "b", "c", "f", "g"}) {
		t.Fatalf("once d stopped watching: %q, want [a b c f g]", names(entries))
	}

	// Statuses with long messages: a page holds what fits in 200 bytes, at least one
	// entry, and ends before the entry that would not fit.
	var reports []*nimbusv1.StatusReport
	for _, n := range []string{"a", "b", "c"} {
		reports = append(reports, statusReport(key, n, 1, nimbusv1.Phase_PHASE_FAILED, strings.Repeat("x", 60)))
	}
	ts.report(t, reports...)
	size := func(e *nimbusv1.NodeStatusEntry) int { return proto.Size(e) + 2 }
	var all []string
	req := &nimbusv1.ListNodeStatusesRequest{Key: key}
	var last []*nimbusv1.NodeStatusEntry
	for {
		resp, err := ts.client.ListNodeStatuses(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		bytes := 0
		for _, e := range resp.GetEntries() {
			bytes += size(e)
		}
		if len(resp.GetEntries()) > 1 && bytes > 200 {
			t.Errorf("page %q takes %d bytes, over 200", names(resp.GetEntries()), bytes)
		}
		if len(last) > 0 && len(resp.GetEntries()) > 0 {
			lastBytes := 0
			for _, e := range last {
				lastBytes += size(e)
			}
			if lastBytes+size(resp.GetEntries()[0]) <= 200 {
				t.Errorf("page %q ended before %s, which fits", names(last), resp.GetEntries()[0].GetNode())
			}
		}
		all = append(all, names(resp.GetEntries())...)
		last = resp.GetEntries()
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	if !slices.Equal(all, []string{"a", "b", "c", "f", "g"}) {
		t.Errorf("pages of at most 200 bytes list %q, want [a b c f g]", all)
	}
	if metricValues(t, ts.srv.Registry())["naples_nimbus_node_status_pages_cut_total"] == 0 {
		t.Error("naples_nimbus_node_status_pages_cut_total is 0 after pages were cut")
	}

	for name, tc := range map[string]struct {
		req  *nimbusv1.ListNodeStatusesRequest
		code codes.Code
		msg  string
	}{
		"bad token": {&nimbusv1.ListNodeStatusesRequest{Key: key, PageToken: "!!"}, codes.InvalidArgument,
			`page_token "!!": not a next_page_token of ListNodeStatuses`},
		"token of no node name": {&nimbusv1.ListNodeStatusesRequest{Key: key, PageToken: base64.RawURLEncoding.EncodeToString([]byte("Bad_Name"))},
			codes.InvalidArgument, `page_token "QmFkX05hbWU": not a next_page_token of ListNodeStatuses`},
		"negative limit": {&nimbusv1.ListNodeStatusesRequest{Key: key, Limit: -1}, codes.InvalidArgument, `limit "-1": must not be negative`},
		"unknown filter": {&nimbusv1.ListNodeStatusesRequest{Key: key, Filter: 99}, codes.InvalidArgument, `filter "99": not a filter nimbus knows`},
		"no key":         {&nimbusv1.ListNodeStatusesRequest{}, codes.InvalidArgument, ""},
		"unknown object": {&nimbusv1.ListNodeStatusesRequest{Key: routeKey("missing")}, codes.NotFound, "object Route/default/default/missing not found"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ts.client.ListNodeStatuses(ctx, tc.req)
			st := wantCode(t, err, tc.code)
			if !strings.Contains(st.Message(), tc.msg) {
				t.Errorf("message %q does not contain %q", st.Message(), tc.msg)
			}
		})
	}
}
