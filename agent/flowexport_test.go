package agent

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/delphi"
	"github.com/naplesnet/naples/hal"
	"github.com/naplesnet/naples/internal/ipfix"
	"github.com/naplesnet/naples/internal/ipfix/ipfixtest"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// exportEnv is a FlowExportReconciler with a flow log, a delphi store holding endpoints
// of tenant t1, namespace ns1, and a metrics registry.
type exportEnv struct {
	t     *testing.T
	flows *FlowLog
	r     *FlowExportReconciler
	reg   *prometheus.Registry
}

// newExportEnv starts the reconciler with opts, whose Store, Flows and Registerer it
// sets; a log of logSize records.
func newExportEnv(t *testing.T, logSize int, opts FlowExportOptions) *exportEnv {
	t.Helper()
	store, err := delphi.Open(delphi.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	desired, err := store.ClaimDesired()
	if err != nil {
		t.Fatal(err)
	}
	txn := &delphi.DesiredTxn{}
	for _, ep := range []struct{ name, group string }{{"web", ""}, {"db-1", "db"}, {"other", "misc"}} {
		txn.Put(&nimbusv1.Object{
			Meta: &nimbusv1.ObjectMeta{Tenant: "t1", Namespace: "ns1", Name: ep.name, Generation: 1},
			Spec: &nimbusv1.Object_Endpoint{Endpoint: &nimbusv1.EndpointSpec{Network: "net", SecurityGroups: []string{ep.group}}},
		})
	}
	if err := desired.Commit(txn); err != nil {
		t.Fatal(err)
	}
	e := &exportEnv{t: t, reg: prometheus.NewRegistry()}
	if logSize > 0 {
		if e.flows, err = NewFlowLog(logSize, nil); err != nil {
			t.Fatal(err)
		}
	}
	opts.Store, opts.Flows, opts.Registerer, opts.Node = store, e.flows, e.reg, "host-a"
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if e.r, err = NewFlowExportReconciler(opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.r.Close() })
	return e
}

// exportPolicy returns a FlowExportPolicy of tenant t1, namespace ns1.
func exportPolicy(name string, spec *nimbusv1.FlowExportPolicySpec) *nimbusv1.Object {
	return &nimbusv1.Object{
		Meta: &nimbusv1.ObjectMeta{Tenant: "t1", Namespace: "ns1", Name: name, Generation: 1},
		Spec: &nimbusv1.Object_FlowExportPolicy{FlowExportPolicy: spec},
	}
}

// reconcile reconciles the object (nil: deletes the policy of the name) and returns its
// operational data and error.
func (e *exportEnv) reconcile(name string, obj *nimbusv1.Object) (*nimbusv1.FlowExportOperational, error) {
	e.t.Helper()
	key := nimbusv1.NewKey(nimbusv1.Kind_KIND_FLOW_EXPORT_POLICY, "t1", "ns1", name)
	if obj != nil && obj.Validate() != nil {
		e.t.Fatalf("the test's policy is invalid: %v", obj.Validate())
	}
	op, err := e.r.Reconcile(e.t.Context(), key, obj)
	return op.GetFlowExport(), err
}

// eventually polls cond until it holds, failing the test after a generous deadline.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// collector starts an IPFIX collector on loopback for the test.
func collector(t *testing.T, addr string) *ipfixtest.Collector {
	t.Helper()
	c, err := ipfixtest.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// conn returns the records of one connection of endpoint ep, from 10.0.0.1:port to
// 10.0.0.2:80, that started at start: STARTED, ACTIVE and ENDED at the times, with
// the counts both ways.
func conn(ep string, port uint32, start time.Time, event delphiv1.FlowEvent, at time.Time, counts [4]uint64) *delphiv1.Flow {
	f := &delphiv1.Flow{
		Time: timestamppb.New(at), Event: event, Verdict: "allowed", Node: "host-a",
		Endpoint:  &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: "t1", Namespace: "ns1", Name: ep},
		Direction: "egress", Protocol: "tcp", Source: "10.0.0.1", SourcePort: port, Destination: "10.0.0.2", DestinationPort: 80,
		Rule: 12, Policy: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, Tenant: "t1", Namespace: "ns1", Name: "allow-web"},
		RuleName: "egress[0]", StartTime: timestamppb.New(start),
		InitiatorPackets: counts[0], InitiatorBytes: counts[1], ResponderPackets: counts[2], ResponderBytes: counts[3],
	}
	if event == delphiv1.FlowEvent_FLOW_EVENT_ENDED {
		f.Reason = "fin"
	}
	return f
}

// denied returns the record of a packet of endpoint ep that a policy denied.
func denied(ep string, at time.Time) *delphiv1.Flow {
	return &delphiv1.Flow{
		Time: timestamppb.New(at), Event: delphiv1.FlowEvent_FLOW_EVENT_DENIED, Verdict: "denied", Reason: "policy", Node: "host-a",
		Endpoint:  &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_ENDPOINT, Tenant: "t1", Namespace: "ns1", Name: ep},
		Direction: "ingress", Protocol: "udp", Source: "fd00::9", SourcePort: 5353, Destination: "fd00::1", DestinationPort: 53, Bytes: 76,
		Rule: 3, Policy: &nimbusv1.ObjectKey{Kind: nimbusv1.Kind_KIND_NETWORK_SECURITY_POLICY, Tenant: "t1", Namespace: "ns1", Name: "db"}, RuleName: "ingress[1]",
	}
}

// sameRecords compares the records a collector decoded with those wanted, every field,
// the times to the millisecond.
func sameRecords(t *testing.T, got, want []ipfix.Record) {
	t.Helper()
	norm := func(r ipfix.Record) string {
		s, e := r.Start.UnixMilli(), r.End.UnixMilli()
		r.Start, r.End = time.Time{}, time.Time{}
		return fmt.Sprintf("%+v start %d end %d", r, s, e)
	}
	if len(got) != len(want) {
		t.Fatalf("the collector decoded %d records, want %d:\n%v", len(got), len(want), got)
	}
	for i := range want {
		if g, w := norm(got[i]), norm(want[i]); g != w {
			t.Errorf("record %d:\n got %s\nwant %s", i, g, w)
		}
	}
}

func TestFlowExportIPFIX(t *testing.T) {
	e := newExportEnv(t, 64, FlowExportOptions{})
	c := collector(t, "127.0.0.1:0")
	spec := &nimbusv1.FlowExportPolicySpec{Endpoints: []string{"web"}, SecurityGroups: []string{"db"}, Targets: []string{c.Addr().String()},
		Interval: durationpb.New(time.Minute)}
	if op, err := e.reconcile("to-collector", exportPolicy("to-collector", spec)); err != nil || len(op.GetTargets()) != 1 {
		t.Fatalf("Reconcile = %v, %v; want a target and no error", op, err)
	}
	// The templates go out at once, before any record.
	eventually(t, "the templates at the collector", func() bool {
		msgs, _ := c.Messages()
		return len(msgs) > 0 && msgs[0].Templates == 2
	})
	now := time.Now()
	start := now.Add(-2 * time.Minute)
	e.flows.Add([]*delphiv1.Flow{
		conn("web", 40001, start, delphiv1.FlowEvent_FLOW_EVENT_STARTED, start, [4]uint64{1, 60, 0, 0}),
		// Active for longer than the interval: exported with what it did so far.
		conn("web", 40001, start, delphiv1.FlowEvent_FLOW_EVENT_ACTIVE, now, [4]uint64{10, 1000, 8, 5000}),
		// Active again within the interval: not exported. Its start, converted from the
		// firewall's clock again, is a few microseconds off: the same connection.
		conn("web", 40001, start.Add(3*time.Microsecond), delphiv1.FlowEvent_FLOW_EVENT_ACTIVE, now, [4]uint64{11, 1050, 8, 5000}),
		// Not selected: another endpoint, another tenant.
		conn("other", 40002, start, delphiv1.FlowEvent_FLOW_EVENT_ENDED, now, [4]uint64{3, 180, 3, 180}),
		func() *delphiv1.Flow {
			f := conn("web", 40003, start, delphiv1.FlowEvent_FLOW_EVENT_ENDED, now, [4]uint64{3, 180, 3, 180})
			f.Endpoint.Tenant = "t2"
			return f
		}(),
		// The rest at the end.
		conn("web", 40001, start, delphiv1.FlowEvent_FLOW_EVENT_ENDED, now.Add(time.Second), [4]uint64{12, 1100, 9, 5100}),
		// A member of group db.
		denied("db-1", now),
	}, 0)
	base := ipfix.Record{Source: netip.MustParseAddr("10.0.0.1"), Destination: netip.MustParseAddr("10.0.0.2"), SourcePort: 40001, DestinationPort: 80,
		Protocol: 6, Start: start, End: now, Verdict: ipfix.VerdictAllowed, Rule: 12, Policy: "t1/ns1/allow-web", RuleName: "egress[0]", Endpoint: "t1/ns1/web"}
	reverse := func(r ipfix.Record) ipfix.Record {
		r.Source, r.Destination, r.SourcePort, r.DestinationPort = r.Destination, r.Source, r.DestinationPort, r.SourcePort
		return r
	}
	with := func(r ipfix.Record, end time.Time, reason ipfix.EndReason, packets, octets uint64) ipfix.Record {
		r.End, r.EndReason, r.Packets, r.Octets = end, reason, packets, octets
		return r
	}
	want := []ipfix.Record{
		with(base, now, ipfix.EndActiveTimeout, 10, 1000),
		with(reverse(base), now, ipfix.EndActiveTimeout, 8, 5000),
		with(base, now.Add(time.Second), ipfix.EndOfFlow, 2, 100),
		with(reverse(base), now.Add(time.Second), ipfix.EndOfFlow, 1, 100),
		// The denied packet's IP bytes: its frame's 76 less the Ethernet header.
		{Source: netip.MustParseAddr("fd00::9"), Destination: netip.MustParseAddr("fd00::1"), SourcePort: 5353, DestinationPort: 53, Protocol: 17,
			Start: now, End: now, EndReason: ipfix.EndOfFlow, Packets: 1, Octets: 62, Verdict: ipfix.VerdictDenied, Rule: 3,
			Policy: "t1/ns1/db", RuleName: "ingress[1]", Endpoint: "t1/ns1/db-1"},
	}
	eventually(t, "5 records at the collector", func() bool { return len(c.Records()) >= len(want) })
	sameRecords(t, c.Records(), want)
	msgs, errs := c.Messages()
	if len(errs) > 0 {
		t.Errorf("the collector could not decode: %v", errs)
	}
	last := msgs[len(msgs)-1]
	if last.Domain != observationDomain("host-a") || last.Sequence+uint32(len(last.Records)) != uint32(len(want)) {
		t.Errorf("last message: domain %d, sequence %d; want %d, %d", last.Domain, last.Sequence, observationDomain("host-a"), len(want)-len(last.Records))
	}
	op, err := e.reconcile("to-collector", exportPolicy("to-collector", spec))
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if ts := op.GetTargets(); op.GetRecordsSelected() != 5 || op.GetConnections() != 0 || ts[0].GetRecordsSent() != 5 || ts[0].GetErrors() != 0 || ts[0].GetLastError() != "" {
		t.Errorf("operational data %v; want 5 records selected (started, active twice, ended, denied), 5 sent, no connection left, no error", op)
	}
	policy := "t1/ns1/to-collector"
	if got := testutil.ToFloat64(e.r.metrics.records.WithLabelValues(policy, c.Addr().String())); got != 5 {
		t.Errorf("naples_agent_flow_export_records_total = %v, want 5", got)
	}
	// Deleting the policy stops its exporter and forgets its metrics.
	if _, err := e.reconcile("to-collector", nil); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(e.r.metrics.records); n != 0 {
		t.Errorf("%d record series left after the policy went", n)
	}
	e.flows.Add([]*delphiv1.Flow{denied("db-1", now)}, 0)
	if op, _ := e.reconcile("again", exportPolicy("again", &nimbusv1.FlowExportPolicySpec{Targets: []string{"127.0.0.1:9"}})); op.GetRecordsSelected() != 0 {
		t.Errorf("a new exporter selected %d records from before it started", op.GetRecordsSelected())
	}
}

// TestFlowExportTemplateRefresh checks that the templates go again every template
// interval, also while no record comes.
func TestFlowExportTemplateRefresh(t *testing.T) {
	e := newExportEnv(t, 64, FlowExportOptions{})
	c := collector(t, "127.0.0.1:0")
	spec := &nimbusv1.FlowExportPolicySpec{Targets: []string{c.Addr().String()}, TemplateInterval: durationpb.New(time.Second)}
	if _, err := e.reconcile("refresh", exportPolicy("refresh", spec)); err != nil {
		t.Fatal(err)
	}
	var times []uint32
	eventually(t, "the templates three times", func() bool {
		msgs, _ := c.Messages()
		times = times[:0]
		for _, m := range msgs {
			if m.Templates == 2 {
				times = append(times, m.ExportTime)
			}
		}
		return len(times) >= 3
	})
	if times[2]-times[0] < 2 {
		t.Errorf("templates sent at %v: want them a second apart at least", times)
	}
}

func TestFlowExportSampling(t *testing.T) {
	e := newExportEnv(t, 4096, FlowExportOptions{})
	c := collector(t, "127.0.0.1:0")
	spec := &nimbusv1.FlowExportPolicySpec{Verdicts: []string{"denied"}, Targets: []string{c.Addr().String()}, Sampling: 4}
	if _, err := e.reconcile("sampled", exportPolicy("sampled", spec)); err != nil {
		t.Fatal(err)
	}
	var flows []*delphiv1.Flow
	want := uint64(0)
	for i := range 400 {
		f := denied("web", time.Now())
		f.SourcePort = uint32(10000 + i)
		if sampled(f, 4) {
			want++
		}
		flows = append(flows, f, conn("web", uint32(i), time.Now(), delphiv1.FlowEvent_FLOW_EVENT_ENDED, time.Now(), [4]uint64{1, 1, 1, 1}))
	}
	// 1 in 4 of the denied records only, by a hash of their 5-tuple: about 100.
	if want < 50 || want > 150 {
		t.Fatalf("sampling 1 in 4 of 400 connections takes %d", want)
	}
	e.flows.Add(flows, 0)
	// The exporter reads the log in batches: the counts are waited for, not just equal
	// ones, which a batch read part of the way also gives.
	var op *nimbusv1.FlowExportOperational
	eventually(t, "the exporter to select and send the sampled records", func() bool {
		op, _ = e.reconcile("sampled", exportPolicy("sampled", spec))
		return op.GetRecordsSelected() >= want && op.GetTargets()[0].GetRecordsSent() >= want
	})
	if n := op.GetRecordsSelected(); n != want {
		t.Errorf("sampling 1 in 4 of 400 connections selected %d records, want the %d denied ones sampled", n, want)
	}
	eventually(t, "the records at the collector", func() bool { return uint64(len(c.Records())) == want })
	for _, r := range c.Records() {
		if r.Verdict != ipfix.VerdictDenied {
			t.Fatalf("a record of verdict %d exported, want denied only", r.Verdict)
		}
	}
}

// refusedPort returns a loopback UDP address nothing listens on.
func refusedPort(t *testing.T) string {
	t.Helper()
	l, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	addr := l.LocalAddr().String()
	l.Close()
	return addr
}

// TestFlowExportTargetFailsAndRecovers is a collector that is not there when the policy
// comes, comes, and goes again and comes back: the policy's status says the target
// refuses, with the count of failed sends, and clears when it takes what is sent; the
// collector that comes back gets the templates again and decodes the records.
func TestFlowExportTargetFailsAndRecovers(t *testing.T) {
	e := newExportEnv(t, 64, FlowExportOptions{})
	addr := refusedPort(t)
	spec := &nimbusv1.FlowExportPolicySpec{Targets: []string{addr}, TemplateInterval: durationpb.New(time.Hour)}
	obj := exportPolicy("refused", spec)
	failing := func(want bool) func() bool {
		return func() bool {
			_, err := e.reconcile("refused", obj)
			return (err != nil) == want
		}
	}
	eventually(t, "the status to say the target refuses", failing(true))
	op, err := e.reconcile("refused", obj)
	if hal.ReasonOf(err) != ReasonExportFailed || !strings.Contains(err.Error(), fmt.Sprintf("target %q: ", addr)) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Reconcile error = %v (%s); want %s naming the target and the refusal", err, hal.ReasonOf(err), ReasonExportFailed)
	}
	if ts := op.GetTargets()[0]; ts.GetErrors() == 0 || !strings.Contains(ts.GetLastError(), "connection refused") || ts.GetLastErrorTime() == nil {
		t.Errorf("target status %v; want errors counted and the last one", ts)
	}
	if n := testutil.ToFloat64(e.r.metrics.errors.WithLabelValues("t1/ns1/refused", addr)); n == 0 {
		t.Error("naples_agent_flow_export_errors_total is 0 for a refusing target")
	}
	c := collector(t, addr)
	eventually(t, "the status to clear once the collector listens", failing(false))
	send := func(port uint32) {
		e.flows.Add([]*delphiv1.Flow{conn("web", port, time.Now(), delphiv1.FlowEvent_FLOW_EVENT_ENDED, time.Now(), [4]uint64{2, 120, 1, 60})}, 0)
	}
	send(1)
	eventually(t, "the first connection at the collector", func() bool { return len(c.Records()) == 2 })
	c.Close()
	send(2) // lost: the collector is gone
	eventually(t, "the status to say the target refuses again", failing(true))
	c2 := collector(t, addr)
	eventually(t, "the status to clear once the collector is back", failing(false))
	send(3)
	eventually(t, "the third connection at the new collector", func() bool { return len(c2.Records()) == 2 })
	msgs, errs := c2.Messages()
	if len(errs) > 0 || msgs[0].Templates != 2 {
		t.Errorf("the new collector's first message has %d templates (%v); want the templates sent again", msgs[0].Templates, errs)
	}
	if r := c2.Records()[0]; r.SourcePort != 3 {
		t.Errorf("the new collector got port %d, want 3", r.SourcePort)
	}
}

// TestFlowExportObserverReportsFailure checks that a target's failing enqueues its
// policy at once, so that its status changes without waiting for a refresh.
func TestFlowExportObserverReportsFailure(t *testing.T) {
	e := newExportEnv(t, 64, FlowExportOptions{StatsInterval: time.Hour})
	enqueued := make(chan nimbusv1.Key, 16)
	ctx, cancel := context.WithCancel(t.Context())
	observed := make(chan error, 1)
	subscribed := make(chan struct{})
	go func() {
		observed <- e.r.Observe(ctx, func(k nimbusv1.Key) { enqueued <- k }, func() { close(subscribed) })
	}()
	defer func() {
		cancel()
		if err := <-observed; err != nil {
			t.Errorf("Observe: %v", err)
		}
	}()
	<-subscribed
	if _, err := e.reconcile("refused", exportPolicy("refused", &nimbusv1.FlowExportPolicySpec{Targets: []string{refusedPort(t)}})); err != nil {
		t.Fatalf("first Reconcile: %v", err)
	}
	select {
	case k := <-enqueued:
		if k.Name != "refused" {
			t.Errorf("enqueued %v", k)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the failing target did not enqueue its policy")
	}
}

func TestFlowExportBadTargets(t *testing.T) {
	e := newExportEnv(t, 64, FlowExportOptions{})
	spec := &nimbusv1.FlowExportPolicySpec{Targets: []string{"no-such-collector.invalid:4739"}}
	eventually(t, "the status to say the name does not resolve", func() bool {
		_, err := e.reconcile("unresolvable", exportPolicy("unresolvable", spec))
		return err != nil && strings.Contains(err.Error(), `resolving "no-such-collector.invalid"`)
	})
	// A bad target of one policy disturbs no other.
	c := collector(t, "127.0.0.1:0")
	if _, err := e.reconcile("good", exportPolicy("good", &nimbusv1.FlowExportPolicySpec{Targets: []string{c.Addr().String()}})); err != nil {
		t.Fatal(err)
	}
	e.flows.Add([]*delphiv1.Flow{denied("web", time.Now())}, 0)
	eventually(t, "the good policy's record", func() bool { return len(c.Records()) == 1 })
}

func TestFlowExportLimits(t *testing.T) {
	e := newExportEnv(t, 4, FlowExportOptions{MaxPolicies: 1, MaxConnections: 2})
	c := collector(t, "127.0.0.1:0")
	spec := &nimbusv1.FlowExportPolicySpec{Targets: []string{c.Addr().String()}}
	if _, err := e.reconcile("first", exportPolicy("first", spec)); err != nil {
		t.Fatal(err)
	}
	_, err := e.reconcile("second", exportPolicy("second", spec))
	if hal.ReasonOf(err) != ReasonLimitExceeded || !strings.Contains(err.Error(), "--flow-export-max-policies") {
		t.Errorf("a policy over the limit: %v (%s), want %s naming the flag", err, hal.ReasonOf(err), ReasonLimitExceeded)
	}
	if got := testutil.ToFloat64(e.r.metrics.policies); got != 1 {
		t.Errorf("naples_agent_flow_export_policies = %v, want 1", got)
	}
	// A changed spec replaces the running exporter; it does not count twice.
	spec2 := proto.Clone(spec).(*nimbusv1.FlowExportPolicySpec)
	spec2.Verdicts = []string{"denied"}
	if _, err := e.reconcile("first", exportPolicy("first", spec2)); err != nil {
		t.Errorf("changing the running policy: %v", err)
	}
	// Connections past the limit are exported when they end, with their totals.
	start := time.Now()
	var flows []*delphiv1.Flow
	for p := range uint32(3) {
		flows = append(flows, conn("web", p, start, delphiv1.FlowEvent_FLOW_EVENT_STARTED, start, [4]uint64{1, 60, 0, 0}))
	}
	if _, err := e.reconcile("first", exportPolicy("first", spec)); err != nil {
		t.Fatal(err)
	}
	e.flows.Add(flows[:2], 0)
	e.flows.Add(flows[2:], 0)
	eventually(t, "two connections tracked, the most allowed", func() bool {
		op, _ := e.reconcile("first", exportPolicy("first", spec))
		return op.GetConnections() == 2 && op.GetRecordsSelected() == 3
	})
	e.flows.Add([]*delphiv1.Flow{conn("web", 2, start, delphiv1.FlowEvent_FLOW_EVENT_ENDED, start, [4]uint64{4, 240, 3, 180})}, 0)
	eventually(t, "the untracked connection's end", func() bool { return len(c.Records()) == 2 })
	if r := c.Records()[0]; r.Packets != 4 || r.Octets != 240 {
		t.Errorf("untracked connection exported %d packets %d bytes, want its totals 4 and 240", r.Packets, r.Octets)
	}
	// An exporter that falls more than the log behind counts what it lost: the log of
	// 4 records lets 96 of 100 go before anyone reads them.
	var burst []*delphiv1.Flow
	for range 100 {
		burst = append(burst, denied("web", time.Now()))
	}
	e.flows.Add(burst, 0)
	eventually(t, "96 records counted dropped", func() bool {
		op, _ := e.reconcile("first", exportPolicy("first", spec))
		return op.GetRecordsDropped() == 96
	})
	if got := testutil.ToFloat64(e.r.metrics.dropped.WithLabelValues("t1/ns1/first")); got != 96 {
		t.Errorf("naples_agent_flow_export_records_dropped_total = %v, want 96", got)
	}
	// Once the first goes, the second runs.
	if _, err := e.reconcile("first", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reconcile("second", exportPolicy("second", spec)); err != nil {
		t.Errorf("the second policy once the first went: %v", err)
	}
}

func TestFlowExportJSONLines(t *testing.T) {
	dir := t.TempDir()
	var stdout logBuffer
	e := newExportEnv(t, 64, FlowExportOptions{Dir: dir, Stdout: &stdout})
	file := exportPolicy("file", &nimbusv1.FlowExportPolicySpec{Format: "json", File: "flows/web.jsonl", Endpoints: []string{"web"}})
	out := exportPolicy("out", &nimbusv1.FlowExportPolicySpec{Format: "json", Verdicts: []string{"denied"}})
	for _, o := range []*nimbusv1.Object{file, out} {
		if _, err := e.reconcile(o.GetMeta().GetName(), o); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	flows := []*delphiv1.Flow{
		conn("web", 1, now, delphiv1.FlowEvent_FLOW_EVENT_STARTED, now, [4]uint64{1, 60, 0, 0}),
		denied("db-1", now),
		denied("web", now),
	}
	e.flows.Add(flows, 0)
	read := func(b []byte) []*delphiv1.Flow {
		var got []*delphiv1.Flow
		s := bufio.NewScanner(bytes.NewReader(b))
		for s.Scan() {
			f := &delphiv1.Flow{}
			if err := protojson.Unmarshal(s.Bytes(), f); err != nil {
				t.Fatalf("line %q: %v", s.Text(), err)
			}
			got = append(got, f)
		}
		return got
	}
	path := filepath.Join(dir, "flows", "web.jsonl")
	eventually(t, "two lines in the file and two on stdout", func() bool {
		b, _ := os.ReadFile(path)
		return len(read(b)) == 2 && len(read([]byte(stdout.String()))) == 2
	})
	b, _ := os.ReadFile(path)
	for i, f := range read(b) {
		if want := []*delphiv1.Flow{flows[0], flows[2]}[i]; !proto.Equal(f, want) {
			t.Errorf("file line %d = %v, want %v", i, f, want)
		}
	}
	// The counts are JSON numbers, as naplesctl flows -o json prints them.
	if !bytes.Contains(b, []byte(`"initiatorPackets":1,"initiatorBytes":60`)) {
		t.Errorf("file %s = %s, want the counts as numbers", path, b)
	}
	for i, f := range read([]byte(stdout.String())) {
		if want := flows[1+i]; !proto.Equal(f, want) {
			t.Errorf("stdout line %d = %v, want %v", i, f, want)
		}
	}
	// A file where the agent cannot write is the policy's status.
	if err := os.WriteFile(filepath.Join(dir, "blocked"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := exportPolicy("bad", &nimbusv1.FlowExportPolicySpec{Format: "json", File: "blocked/flows.jsonl"})
	if _, err := e.reconcile("bad", bad); err != nil {
		t.Fatal(err)
	}
	e.flows.Add([]*delphiv1.Flow{denied("web", now)}, 0)
	eventually(t, "the status to say the file cannot be written", func() bool {
		_, err := e.reconcile("bad", bad)
		return err != nil && strings.Contains(err.Error(), `target "blocked/flows.jsonl"`) && strings.Contains(err.Error(), "not a directory")
	})
}

// TestFlowExportBlockedOutput is a JSON exporter whose standard output nobody reads: it
// holds up neither the flow log's writer, nor another policy's exporter, nor the
// reconcile that deletes its policy.
func TestFlowExportBlockedOutput(t *testing.T) {
	pr, pw := io.Pipe()
	e := newExportEnv(t, 2048, FlowExportOptions{Stdout: pw, StopWait: 50 * time.Millisecond})
	t.Cleanup(func() { pr.Close() }) // the blocked write returns, and its goroutine ends
	c := collector(t, "127.0.0.1:0")
	for _, o := range []*nimbusv1.Object{
		exportPolicy("blocked", &nimbusv1.FlowExportPolicySpec{Format: "json"}),
		exportPolicy("ipfix", &nimbusv1.FlowExportPolicySpec{Targets: []string{c.Addr().String()}}),
	} {
		if _, err := e.reconcile(o.GetMeta().GetName(), o); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 1000 {
		f := denied("web", time.Now())
		f.SourcePort = uint32(i)
		e.flows.Add([]*delphiv1.Flow{f}, 0) // returns at once, whatever the exporters do
	}
	eventually(t, "the other policy's 1000 records", func() bool { return len(c.Records()) == 1000 })
	done := make(chan error, 1)
	go func() {
		_, err := e.r.Reconcile(context.Background(), nimbusv1.NewKey(nimbusv1.Kind_KIND_FLOW_EXPORT_POLICY, "t1", "ns1", "blocked"), nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("deleting the blocked policy: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("deleting the policy whose output blocks did not return")
	}
}

func TestFlowExportNeeds(t *testing.T) {
	e := newExportEnv(t, 0, FlowExportOptions{})
	_, err := e.reconcile("p", exportPolicy("p", &nimbusv1.FlowExportPolicySpec{Targets: []string{"127.0.0.1:4739"}}))
	if hal.ReasonOf(err) != ReasonNoFlowRecords {
		t.Errorf("without flow records: %v (%s), want %s", err, hal.ReasonOf(err), ReasonNoFlowRecords)
	}
	e = newExportEnv(t, 8, FlowExportOptions{})
	_, err = e.reconcile("p", exportPolicy("p", &nimbusv1.FlowExportPolicySpec{Format: "json", File: "x.jsonl"}))
	if hal.ReasonOf(err) != ReasonNoExportDir || !strings.Contains(err.Error(), `spec.file "x.jsonl"`) {
		t.Errorf("a file without --flow-export-dir: %v (%s), want %s", err, hal.ReasonOf(err), ReasonNoExportDir)
	}
	if _, err := NewFlowExportReconciler(FlowExportOptions{Store: e.r.opts.Store, MessageBytes: 100}); err == nil {
		t.Error("a message size of 100 bytes was taken")
	}
}
