package nimbus

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// oversizedReport is a report of the node about the object with a message of msgBytes
// and, when entries is above zero, that many operational entries of 300 bytes each.
func oversizedReport(key *nimbusv1.ObjectKey, node string, msgBytes, entries int) *nimbusv1.StatusReport {
	r := statusReport(key, node, 1, nimbusv1.Phase_PHASE_FAILED, strings.Repeat("é", msgBytes/2))
	if entries > 0 {
		r.Status.Operational = map[string]string{}
		for i := range entries {
			r.Status.Operational[fmt.Sprintf("counter.%05d", i)] = strings.Repeat("7", 300)
		}
	}
	return r
}

// wantBounded fails the test unless the node status fits the default limits and shows
// where it was cut.
func wantBounded(t *testing.T, ns *nimbusv1.NodeStatus) {
	t.Helper()
	msg := ns.GetMessage()
	if len(msg) > DefaultStatusMessageBytes || !strings.HasSuffix(msg, " bytes]") || !strings.Contains(msg, "… [truncated ") {
		t.Errorf("node %s: message of %d bytes ending %q, want at most %d ending with the truncation marker",
			ns.GetNode(), len(msg), msg[max(len(msg)-40, 0):], DefaultStatusMessageBytes)
	}
	op := ns.GetOperational()
	if len(op) == 0 {
		return
	}
	size := 0
	for k, v := range op {
		if k != OperationalTruncatedKey {
			size += len(k) + len(v)
		}
	}
	if len(op) > DefaultStatusOperationalEntries+1 || size > DefaultStatusOperationalBytes || op[OperationalTruncatedKey] == "" {
		t.Errorf("node %s: %d operational entries of %d bytes, marker %q; want at most %d of %d bytes and the marker",
			ns.GetNode(), len(op), size, op[OperationalTruncatedKey], DefaultStatusOperationalEntries, DefaultStatusOperationalBytes)
	}
}

// TestStatusReportsBounded is issue 19's defect 2: a node that reports huge messages and
// operational maps must neither grow nimbus's memory nor break the readers, whose
// clients receive at most gRPC's default 4 MiB; deleting the objects frees the statuses.
func TestStatusReportsBounded(t *testing.T) {
	// The reports, some 35 MiB, come at once: more than the default burst of a node's
	// report bytes, which the fake clock would never refill.
	p := newTestPKI(t)
	ts := start(t, Options{TLS: p.serverTLS(t), Limits: Limits{StatusReportBurstBytes: 1 << 30}})
	ts.client = p.publisher(t, ts)
	node := p.node(t, ts, "host-a")
	var keys []*nimbusv1.ObjectKey
	var reports []*nimbusv1.StatusReport
	for i := range 20 {
		name := fmt.Sprintf("r%02d", i)
		ts.apply(t, route(name, []string{"host-a"}, "192.0.2.1"))
		keys = append(keys, routeKey(name))
		entries := 0
		if i == 0 {
			entries = 5000
		}
		msgBytes := 1 << 20
		if i == 1 {
			msgBytes = 15 << 20 // as in the issue
		}
		reports = append(reports, oversizedReport(routeKey(name), "host-a", msgBytes, entries))
	}
	reportWith(t, node, reports...)

	// ts.client is a publisher receiving at most gRPC's default 4 MiB.
	st := wantStatus(t, ts, keys[0], 1, 0, 1, "host-a")
	wantBounded(t, st.GetNodes()[0])
	resp, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(resp.GetItems()) != len(keys) {
		t.Fatalf("List returned %d routes, want %d", len(resp.GetItems()), len(keys))
	}
	for _, it := range resp.GetItems() {
		wantBounded(t, it.GetStatus().GetNodes()[0])
	}
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 20`,
		`naples_nimbus_status_truncated_total{field="message"} 20`,
		`naples_nimbus_status_truncated_total{field="operational_bytes"} 1`,
		`naples_nimbus_status_truncated_total{field="operational_value"} 1`)

	for _, key := range keys {
		ts.del(t, key)
	}
	wantMetrics(t, ts.srv, `naples_nimbus_statuses 0`)
}

// TestStatusDetailsBudget shows that an object's status carries the messages of its
// nodes only up to Limits.StatusDetailsBytes, and counts the nodes left without them.
func TestStatusDetailsBudget(t *testing.T) {
	ts := start(t, Options{Limits: Limits{StatusDetailsBytes: 2500}})
	key := routeKey("r1")
	nodes := []string{"n1", "n2", "n3", "n4"}
	ts.apply(t, route("r1", nodes, "192.0.2.1"))
	for _, n := range nodes {
		ts.report(t, statusReport(key, n, 1, nimbusv1.Phase_PHASE_FAILED, strings.Repeat("x", 1000)))
	}
	st := wantStatus(t, ts, key, 4, 0, 4, nodes...)
	if st.GetDetailsOmitted() != 2 {
		t.Errorf("details omitted for %d nodes, want 2", st.GetDetailsOmitted())
	}
	for i, ns := range st.GetNodes() {
		if want := i < 2; (ns.GetMessage() != "") != want || ns.GetPhase() != nimbusv1.Phase_PHASE_FAILED {
			t.Errorf("node %s: phase %v, message of %d bytes; want FAILED with a message %v", ns.GetNode(), ns.GetPhase(), len(ns.GetMessage()), want)
		}
	}
	wantMetrics(t, ts.srv, `naples_nimbus_status_details_omitted_total 1`)
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in     string
		limit  int
		marked bool
	}{
		{"short", 10, false},
		{strings.Repeat("a", 100), 60, true},
		{strings.Repeat("é", 50), 60, true},
		{strings.Repeat("é", 50), 5, false},
	} {
		got, cut := truncate(tc.in, tc.limit)
		kept, marker, marked := strings.Cut(got, "… [truncated ")
		switch {
		case cut != (len(tc.in) > tc.limit), len(got) > max(tc.limit, len(tc.in)), !utf8.ValidString(got),
			!strings.HasPrefix(tc.in, kept), marked != tc.marked,
			marked && marker != fmt.Sprintf("%d bytes]", len(tc.in)-len(kept)):
			t.Errorf("truncate(%d bytes, %d) = %q, %v", len(tc.in), tc.limit, got, cut)
		}
	}
}

// TestPeerStatusesBoundedAndFreed shows that a peer replica holds a report cut as the
// replica that took it cut it, and that deleting the object frees its statuses on both.
func TestPeerStatusesBoundedAndFreed(t *testing.T) {
	rs := startPeers(t, Options{}, "a", "b")
	a, b := rs[0], rs[1]
	key := routeKey("r1")
	applyToPeers(t, []*nimbusv1.Object{route("r1", []string{"n1"}, "192.0.2.1")}, rs...)
	a.report(t, oversizedReport(key, "n1", 1<<20, 100))
	waitPeerMetric(t, b, "naples_nimbus_statuses", 1)
	wantBounded(t, b.statusOf(t, key).GetNodes()[0])
	for _, r := range rs {
		r.del(t, key)
		waitPeerMetric(t, r, "naples_nimbus_statuses", 0)
	}
}

// TestEtcdDeleteFreesStatuses shows that a replica on etcd drops every status of an
// object that another replica deleted.
func TestEtcdDeleteFreesStatuses(t *testing.T) {
	c := cluster(t)
	a := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	b := startReplica(t, c.Endpoints(), testPrefix(t), true, Options{})
	key := routeKey("r1")
	obj := a.apply(t, route("r1", []string{"n1", "n2"}, "192.0.2.1")).GetObject()
	waitRev(t, b, obj.GetMeta().GetRevision())
	b.report(t, oversizedReport(key, "n1", 1<<20, 0), oversizedReport(key, "n2", 1<<20, 0))
	wantMetrics(t, b.srv, `naples_nimbus_statuses 2`)
	wantBounded(t, b.get(t, key).GetStatus().GetNodes()[1])
	del, err := a.client.Delete(testContext(t), &nimbusv1.DeleteRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	waitRev(t, b, del.GetRevision())
	wantMetrics(t, b.srv, `naples_nimbus_statuses 0`)
}

// TestObjectSizeLimit is issue 19's defect 3: an object larger than Limits.ObjectBytes
// is refused at Apply and ApplyBatch, naming it, its size and the limit.
func TestObjectSizeLimit(t *testing.T) {
	ts := start(t, Options{})
	fits := padded("fits", DefaultObjectBytes-200)
	huge := padded("huge", DefaultObjectBytes)
	if n := fits.SizeVT(); n > DefaultObjectBytes {
		t.Fatalf("test object of %d bytes is over the limit", n)
	}
	ts.apply(t, fits)

	_, err := ts.client.Apply(testContext(t), &nimbusv1.ApplyRequest{Object: huge})
	st := wantCode(t, err, codes.InvalidArgument)
	want := fmt.Sprintf("object Route/default/default/huge: %d bytes, over the limit of %d bytes", huge.SizeVT(), DefaultObjectBytes)
	if !strings.Contains(st.Message(), want) {
		t.Errorf("refusal %q, want it to say %q", st.Message(), want)
	}
	_, err = ts.client.ApplyBatch(testContext(t), &nimbusv1.ApplyBatchRequest{Objects: []*nimbusv1.Object{route("small", nil, "192.0.2.1"), huge}})
	st = wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(st.Message(), "objects[1] (Route/default/default/huge)") || !strings.Contains(st.Message(), want) {
		t.Errorf("batch refusal %q, want it to name objects[1] and say %q", st.Message(), want)
	}
	wantStored(t, ts, 1, "fits")
	wantMetrics(t, ts.srv, `naples_nimbus_objects_too_large_total 2`)
}

// TestListPages shows that List answers in pages that a client with gRPC's default 4 MiB
// receive limit takes, however large the objects, and that the pages together are every
// object once, in order.
func TestListPages(t *testing.T) {
	ts := start(t, Options{})
	var names []string
	for i := range 10 {
		name := fmt.Sprintf("r%d", i)
		ts.apply(t, padded(name, DefaultObjectBytes-200))
		names = append(names, name)
	}
	ts.apply(t, nodeObject("host-a")) // another kind, which the list leaves out
	list := func(req *nimbusv1.ListRequest) []string {
		t.Helper()
		resp, err := nimbusv1.ListAll(testContext(t), ts.client, req)
		if err != nil {
			t.Fatalf("listing %v: %v", req, err)
		}
		var got []string
		for _, it := range resp.GetItems() {
			got = append(got, it.GetObject().GetMeta().GetName())
		}
		return got
	}
	if got := list(&nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE}); !slices.Equal(got, names) {
		t.Errorf("listed %q, want %q", got, names)
	}
	first, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if n := proto.Size(first); n > DefaultListPageBytes+DefaultObjectBytes || first.GetNextPageToken() == "" {
		t.Errorf("first page of %d bytes, next page %q; want at most %d bytes and a next page", n, first.GetNextPageToken(), DefaultListPageBytes+DefaultObjectBytes)
	}
	// A limit pages by items; every kind comes in key order.
	resp, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{Limit: 1})
	if err != nil || len(resp.GetItems()) != 1 || resp.GetItems()[0].GetObject().GetMeta().GetName() != "host-a" {
		t.Fatalf("List with limit 1 = %v, %v; want the Node object alone", resp.GetItems(), err)
	}
	if got := list(&nimbusv1.ListRequest{Limit: 3}); !slices.Equal(got, append([]string{"host-a"}, names...)) {
		t.Errorf("listed every kind by 3 as %q", got)
	}
	_, err = ts.client.List(testContext(t), &nimbusv1.ListRequest{PageToken: "!"})
	if st := wantCode(t, err, codes.InvalidArgument); !strings.Contains(st.Message(), "page_token") {
		t.Errorf("refusal of a bad token %q does not name page_token", st.Message())
	}
	if metricValues(t, ts.srv.Registry())["naples_nimbus_list_pages_cut_total"] == 0 {
		t.Error("naples_nimbus_list_pages_cut_total is 0 after pages were cut")
	}
}

// TestBoundStatusTwice shows that a status cut to the limits is not cut again, as when a
// peer replica takes what another one cut.
func TestBoundStatusTwice(t *testing.T) {
	l, err := Limits{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []*nimbusv1.NodeStatus{
		oversizedReport(routeKey("r"), "n", 1<<20, 5000).GetStatus(), // cut by bytes
		{Operational: map[string]string{}},                           // cut by entries, below
	} {
		for i := range 2 * DefaultStatusOperationalEntries {
			st.Operational[fmt.Sprintf("c%03d", i)] = "1"
		}
		if cut := l.boundStatus(st); len(cut) == 0 {
			t.Fatal("an oversized status was not cut")
		}
		once := proto.CloneOf(st)
		if cut := l.boundStatus(st); len(cut) != 0 || !proto.Equal(st, once) {
			t.Errorf("a status cut once was cut again (%q)", cut)
		}
	}
}

// TestStatusOfManyNodesFits shows that with the default limits but StatusNodes, raised
// to list every node, the status of an object of 10,000 nodes, each of which reported as
// much as it may, still reaches a client with gRPC's default 4 MiB receive limit, by Get
// and by List.
func TestStatusOfManyNodesFits(t *testing.T) {
	if testing.Short() {
		t.Skip("reports 30 MB of statuses")
	}
	const n = 10000
	ts := start(t, Options{Logger: slog.New(slog.DiscardHandler), Limits: Limits{StatusNodes: n}})
	nodes := make([]string, n)
	for i := range nodes {
		nodes[i] = fmt.Sprintf("node-%05d.rack-%03d.example", i, i%100)
	}
	ts.apply(t, route("r1", nodes, "192.0.2.1"))
	key := routeKey("r1")
	op := map[string]string{}
	for i := range DefaultStatusOperationalEntries {
		op[fmt.Sprintf("counter.%02d", i)] = strings.Repeat("9", 50)
	}
	reports := make([]*nimbusv1.StatusReport, n)
	for i, node := range nodes {
		r := statusReport(key, node, 1, nimbusv1.Phase_PHASE_FAILED, strings.Repeat("m", 2*DefaultStatusMessageBytes))
		r.Status.Reason = strings.Repeat("R", DefaultStatusReasonBytes)
		if i < 400 {
			// Enough to spend the details budget; the nodes after it go without details
			// of any size.
			r.Status.Operational = op
		}
		reports[i] = r
	}
	ts.report(t, reports...)

	st := wantStatus(t, ts, key, n, 0, n, nodes...)
	if st.GetDetailsOmitted() == 0 || st.GetDetailsOmitted() == n {
		t.Errorf("details omitted for %d of %d nodes, want some but not all", st.GetDetailsOmitted(), n)
	}
	resp, err := ts.client.List(testContext(t), &nimbusv1.ListRequest{Kind: nimbusv1.Kind_KIND_ROUTE})
	if err != nil || len(resp.GetItems()) != 1 {
		t.Fatalf("List = %d items, %v; want r1", len(resp.GetItems()), err)
	}
	if size := proto.Size(resp); size > 3<<20 {
		t.Errorf("the list of one object of %d nodes takes %d bytes, want at most 3 MiB", n, size)
	}
}

// TestBoundOperationalData shows that typed operational data larger than
// StatusOperationalBytes keep the first entries of their lists that fit, count the
// others in entries_omitted and are not cut again; data too large without list entries
// are dropped.
func TestBoundOperationalData(t *testing.T) {
	l, err := Limits{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	policy := &nimbusv1.SecurityPolicyOperational{ProtectedEndpoints: 3}
	for i := range 1000 {
		policy.Rules = append(policy.Rules, &nimbusv1.PolicyRuleCounters{
			Direction: nimbusv1.PolicyRuleCounters_DIRECTION_INGRESS, Index: uint32(i), Packets: 1 << 40, Bytes: 1 << 50,
		})
	}
	st := &nimbusv1.NodeStatus{OperationalData: &nimbusv1.OperationalData{
		Kind: &nimbusv1.OperationalData_SecurityPolicy{SecurityPolicy: policy},
	}}
	if cut := l.boundStatus(st); !slices.Equal(cut, []string{truncatedOperationalBytes}) {
		t.Errorf("cut %q, want %q", cut, truncatedOperationalBytes)
	}
	op := st.GetOperationalData()
	rules := op.GetSecurityPolicy().GetRules()
	if size := op.SizeVT(); size > DefaultStatusOperationalBytes || size < DefaultStatusOperationalBytes-100 {
		t.Errorf("the cut data take %d bytes, want just below %d", size, DefaultStatusOperationalBytes)
	}
	if len(rules) == 0 || rules[len(rules)-1].GetIndex() != uint32(len(rules)-1) || int(op.GetEntriesOmitted()) != 1000-len(rules) {
		t.Errorf("kept %d rules, the last %v, and %d omitted; want the first ones and the others omitted",
			len(rules), rules[len(rules)-1], op.GetEntriesOmitted())
	}
	if op.GetSecurityPolicy().GetProtectedEndpoints() != 3 {
		t.Errorf("protected_endpoints = %d after the cut, want 3", op.GetSecurityPolicy().GetProtectedEndpoints())
	}
	once := proto.CloneOf(st)
	if cut := l.boundStatus(st); len(cut) != 0 || !proto.Equal(st, once) {
		t.Errorf("data cut once were cut again (%q)", cut)
	}

	// Lists of one network keep as many entries each.
	network := &nimbusv1.NetworkOperational{Mtu: 1450, NodesWithoutVtep: []string{"n1", "n2"}}
	for i := range 500 {
		network.RemoteVteps = append(network.RemoteVteps, fmt.Sprintf("192.0.%d.%d", i/250, i%250))
	}
	st = &nimbusv1.NodeStatus{OperationalData: &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Network{Network: network}}}
	l.boundStatus(st)
	if n := st.GetOperationalData().GetNetwork(); len(n.GetRemoteVteps()) == 0 || len(n.GetRemoteVteps()) == 500 ||
		!slices.Equal(n.GetNodesWithoutVtep(), []string{"n1", "n2"}) || n.GetMtu() != 1450 {
		t.Errorf("network data cut to %d remote VTEPs, nodes without %q, mtu %d; want some VTEPs, both nodes, 1450",
			len(n.GetRemoteVteps()), n.GetNodesWithoutVtep(), n.GetMtu())
	}

	st = &nimbusv1.NodeStatus{OperationalData: &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Network{
		Network: &nimbusv1.NetworkOperational{Underlay: strings.Repeat("u", 3000)},
	}}}
	if cut := l.boundStatus(st); len(cut) != 1 || st.GetOperationalData() != nil {
		t.Errorf("data too large without lists: cut %q, left %v; want them dropped", cut, st.GetOperationalData())
	}
}

// TestStatusDetailsCountTypedData shows that the typed operational data count against
// Limits.StatusDetailsBytes, and go with the message from the nodes beyond it.
func TestStatusDetailsCountTypedData(t *testing.T) {
	big := &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_Network{
		Network: &nimbusv1.NetworkOperational{Underlay: strings.Repeat("u", 1000)},
	}}
	ns := &nimbusv1.NodeStatus{Node: "n1", Message: "m", OperationalData: big}
	if got, want := statusDetailsSize(ns), 1+big.SizeVT(); got != want {
		t.Errorf("details size %d, want %d", got, want)
	}
	if c := withoutDetails(ns); c.GetOperationalData() != nil || c.GetMessage() != "" || c.GetNode() != "n1" {
		t.Errorf("without details: %v", c)
	}
}
