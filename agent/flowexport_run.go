package agent

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/naplesnet/naples/internal/ipfix"
	"github.com/naplesnet/naples/internal/manifest"
	delphiv1 "github.com/naplesnet/naples/proto/delphi/v1"
	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Timing of an exporter's sends.
const (
	// exportTick is how often an idle exporter wakes to send templates that are due,
	// to check that its targets took what it sent, and to retry a target that failed.
	exportTick = time.Second
	// exportWriteTimeout bounds one write, and exportResolveTimeout the resolution of a
	// target's host name, so that a stuck target holds up its own exporter only so long.
	exportWriteTimeout   = time.Second
	exportResolveTimeout = 2 * time.Second
	// exportCheckAfter is how long after a send the exporter looks for the ICMP error
	// that says the target refused it.
	exportCheckAfter = 200 * time.Millisecond
)

// flowExporter is the exporter of one FlowExportPolicy: a goroutine that follows the
// flow log from where it was when the exporter started.
type flowExporter struct {
	r      *FlowExportReconciler
	key    nimbusv1.Key
	policy string
	spec   *nimbusv1.FlowExportPolicySpec
	// endpoints and groups are the selection's names, as sets; verdicts the verdicts
	// selected, nil for both.
	endpoints, groups, verdicts map[string]bool
	interval                    time.Duration
	targets                     []*exportTarget

	selected, dropped atomic.Uint64
	connCount         atomic.Int64

	// conns are the connections tracked for their delta counts; the exporter's goroutine
	// alone uses it.
	conns map[connKey]*connState

	cancel context.CancelFunc
	done   chan struct{}
}

// connKey identifies a connection at one endpoint.
type connKey struct {
	protocol         string
	src, dst         string
	srcPort, dstPort uint32
	endpoint         nimbusv1.Key
}

// sameStart bounds how far apart the start times of two records may be that are of one
// connection: a record's times are converted from the firewall's clock to wall time as it
// is read, and may move by as much as the wall clock was adjusted in between. Records of
// one tuple further apart are of a new connection, which took the tuple after the old one
// ended.
const sameStart = time.Second

// connState is what an exporter exported of a connection so far.
type connState struct {
	// start is when the connection started, as its first record said.
	start time.Time
	// last is when the connection was last exported, or started.
	last time.Time
	// the counts exported so far.
	iPackets, iBytes, rPackets, rBytes uint64
}

// exportTarget is one target of an exporter: a collector's UDP address, or the file or
// standard output of JSON lines. Its counters and error are read by reconciles; the
// rest belongs to the exporter's goroutine.
type exportTarget struct {
	name                   string
	sent, messages, errors atomic.Uint64
	mRecords, mErrors      prometheus.Counter
	// mu guards lastErr and lastErrTime.
	mu          sync.Mutex
	lastErr     string
	lastErrTime time.Time

	// IPFIX: the encoder of the target's transport session, its socket (nil until dialed,
	// and after a failure), when it may be dialed again, when templates were last sent
	// (zero: they are due), and the time of the first send not yet checked for an ICMP
	// error (zero: none).
	enc        *ipfix.Encoder
	conn       *net.UDPConn
	retryAt    time.Time
	templates  time.Time
	unverified time.Time
	// JSON lines: where they go (nil until the file is open), and the file to close.
	w    io.Writer
	file *os.File
}

// start starts the exporter of the policy with the key. Called with r.mu held.
func (r *FlowExportReconciler) start(id nimbusv1.Key, spec *nimbusv1.FlowExportPolicySpec) (*flowExporter, error) {
	x := &flowExporter{r: r, key: id, policy: policyName(id), spec: spec, interval: spec.ExportInterval(),
		endpoints: set(spec.GetEndpoints()), groups: set(spec.GetSecurityGroups()), conns: map[connKey]*connState{}, done: make(chan struct{})}
	if len(spec.GetVerdicts()) > 0 {
		x.verdicts = set(spec.GetVerdicts())
	}
	names := spec.GetTargets()
	if spec.ExportFormat() == nimbusv1.FlowExportJSON {
		names = []string{"stdout"}
		if spec.GetFile() != "" {
			names = []string{spec.GetFile()}
		}
	}
	for _, n := range names {
		t := &exportTarget{name: n, mRecords: r.metrics.records.WithLabelValues(x.policy, n), mErrors: r.metrics.errors.WithLabelValues(x.policy, n)}
		if spec.ExportFormat() == nimbusv1.FlowExportIPFIX {
			enc, err := newIPFIXEncoder(r.opts.Node, r.opts.MessageBytes)
			if err != nil {
				return nil, err
			}
			t.enc = enc
		}
		x.targets = append(x.targets, t)
	}
	r.metrics.dropped.WithLabelValues(x.policy)
	r.metrics.connections.WithLabelValues(x.policy)
	ctx, cancel := context.WithCancel(r.ctx)
	x.cancel = cancel
	// The exporter follows the log from the record after the last one it holds now.
	go x.run(ctx, r.opts.Flows.tail())
	return x, nil
}

// newIPFIXEncoder returns the encoder of one target.
func newIPFIXEncoder(node string, messageBytes int) (*ipfix.Encoder, error) {
	return ipfix.NewEncoder(ipfix.EncoderOptions{ObservationDomain: observationDomain(node), MaxMessageBytes: messageBytes})
}

func set(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// stop stops the exporter and waits for its goroutine to end, at most StopWait:
// a write to a standard output that nobody reads blocks the goroutine for as long as
// nobody does, and must not hold up a reconcile or the agent's stop. It tells whether the
// goroutine ended; one that did not ends once its write returns.
func (x *flowExporter) stop() bool {
	x.cancel()
	select {
	case <-x.done:
		return true
	case <-time.After(x.r.opts.StopWait):
		return false
	}
}

// operational returns the exporter's counts, and an error naming the targets that fail.
func (x *flowExporter) operational() (*nimbusv1.OperationalData, error) {
	op := &nimbusv1.FlowExportOperational{
		RecordsSelected: x.selected.Load(), RecordsDropped: x.dropped.Load(), Connections: uint32(x.connCount.Load()),
	}
	for _, t := range x.targets {
		st := &nimbusv1.FlowExportTarget{Target: t.name, RecordsSent: t.sent.Load(), MessagesSent: t.messages.Load(), Errors: t.errors.Load()}
		t.mu.Lock()
		if t.lastErr != "" {
			st.LastError, st.LastErrorTime = t.lastErr, timestamppb.New(t.lastErrTime)
		}
		t.mu.Unlock()
		op.Targets = append(op.Targets, st)
	}
	return &nimbusv1.OperationalData{Kind: &nimbusv1.OperationalData_FlowExport{FlowExport: op}}, joinTargetErrors(x.targets)
}

// failing returns the target's error while it fails, and how many sends failed.
func (t *exportTarget) failing() (string, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lastErr, t.errors.Load()
}

// fail records that a send of n messages to the target failed with err, and tells
// whether the target was healthy until then.
func (t *exportTarget) fail(now time.Time, n int, err error) bool {
	t.lost(n)
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.lastErr
	t.lastErr, t.lastErrTime = err.Error(), now
	return was == ""
}

// lost counts n messages that were not sent while the target waits for its retry after
// a failure; its last error stays what it was.
func (t *exportTarget) lost(n int) {
	t.errors.Add(uint64(max(n, 1)))
	t.mErrors.Add(float64(max(n, 1)))
}

// recover records that the target took what was sent, and tells whether it failed
// until then.
func (t *exportTarget) recover() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.lastErr
	t.lastErr = ""
	return was != ""
}

// run follows the flow log from sequence number seq until ctx ends.
func (x *flowExporter) run(ctx context.Context, seq uint64) {
	defer close(x.done)
	defer x.closeTargets()
	log := x.r.opts.Flows
	tick := time.NewTicker(exportTick)
	defer tick.Stop()
	for {
		batch, next, skipped, _, added := log.from(seq, flowBatch)
		seq = next
		if skipped > 0 {
			x.dropped.Add(skipped)
			x.r.metrics.dropped.WithLabelValues(x.policy).Add(float64(skipped))
		}
		now := time.Now()
		x.export(ctx, now, batch)
		x.maintain(ctx, now)
		if len(batch) == flowBatch {
			if ctx.Err() != nil {
				return
			}
			continue // more to read
		}
		select {
		case <-ctx.Done():
			return
		case <-added:
		case <-tick.C:
		}
	}
}

// tail returns the sequence number of the next record the log takes.
func (l *FlowLog) tail() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.next
}

// closeTargets closes the targets' sockets and files.
func (x *flowExporter) closeTargets() {
	for _, t := range x.targets {
		if t.conn != nil {
			t.conn.Close()
		}
		if t.file != nil {
			t.file.Close()
		}
	}
}

// export sends what the policy selects of the records.
func (x *flowExporter) export(ctx context.Context, now time.Time, batch []*delphiv1.Flow) {
	var flows []*delphiv1.Flow
	for _, f := range batch {
		if x.selects(f) {
			flows = append(flows, f)
		}
	}
	if len(flows) == 0 {
		return
	}
	x.selected.Add(uint64(len(flows)))
	if x.spec.ExportFormat() == nimbusv1.FlowExportJSON {
		x.writeJSON(now, flows)
		return
	}
	var recs []ipfix.Record
	for _, f := range flows {
		recs = x.records(recs, now, f)
	}
	x.connCount.Store(int64(len(x.conns)))
	x.r.metrics.connections.WithLabelValues(x.policy).Set(float64(len(x.conns)))
	if len(recs) == 0 {
		return
	}
	for _, t := range x.targets {
		msgs, _ := t.enc.Encode(now, recs)
		x.send(ctx, now, t, msgs, len(recs))
	}
}

// selects tells whether the policy exports the record: one of a local endpoint of the
// policy's tenant that the selection names, with a verdict selected, of a connection
// the sampling takes.
func (x *flowExporter) selects(f *delphiv1.Flow) bool {
	if x.verdicts != nil && !x.verdicts[f.GetVerdict()] {
		return false
	}
	ep := f.GetEndpoint()
	if ep == nil {
		return false
	}
	k := nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, ep.GetTenant(), ep.GetNamespace(), ep.GetName())
	if k.Tenant != x.key.Tenant {
		return false
	}
	if len(x.endpoints) > 0 || len(x.groups) > 0 {
		named := k.Namespace == x.key.Namespace && x.endpoints[k.Name]
		if !named && len(x.groups) > 0 {
			obj, ok := x.r.opts.Store.Get(k.Proto())
			named = ok && slices.ContainsFunc(obj.GetEndpoint().GetSecurityGroups(), func(g string) bool { return x.groups[g] })
		}
		if !named {
			return false
		}
	}
	return sampled(f, x.spec.GetSampling())
}

// sampled tells whether sampling 1 in n takes the flow record: by a hash of its 5-tuple,
// so that a connection's records are all taken or none. Every record is taken when n is
// 0 or 1.
func sampled(f *delphiv1.Flow, n uint32) bool {
	if n <= 1 {
		return true
	}
	h := fnv.New32a()
	for _, s := range []string{f.GetProtocol(), f.GetSource(), strconv.FormatUint(uint64(f.GetSourcePort()), 10), f.GetDestination(), strconv.FormatUint(uint64(f.GetDestinationPort()), 10)} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return h.Sum32()%n == 0
}

// ethernetHeaderBytes is the length of the Ethernet header of a frame at an endpoint's
// interface, which carries no VLAN tag (the firewall drops tagged frames, without a tuple).
const ethernetHeaderBytes = 14

// ipBytes returns the IP bytes of a denied packet whose record has its frame's length,
// as IPFIX counts octets and the connections' counts do: the IP header and what follows.
func ipBytes(frame uint32) uint64 {
	if frame < ethernetHeaderBytes {
		return 0
	}
	return uint64(frame - ethernetHeaderBytes)
}

// records appends the IPFIX records of the flow record to recs: a denied packet's one
// record; for a connection that ends, or that is active and was last exported an
// interval ago or more, one record a direction with the packets and bytes since it was
// last exported. A connection's start is not exported: its first record is.
func (x *flowExporter) records(recs []ipfix.Record, now time.Time, f *delphiv1.Flow) []ipfix.Record {
	src, serr := netip.ParseAddr(f.GetSource())
	dst, derr := netip.ParseAddr(f.GetDestination())
	if serr != nil || derr != nil {
		return recs // a spoofed packet, whose headers were not read
	}
	r := ipfix.Record{
		Source: src.Unmap(), Destination: dst.Unmap(), SourcePort: uint16(f.GetSourcePort()), DestinationPort: uint16(f.GetDestinationPort()),
		Protocol: protocolNumber(f.GetProtocol()), Start: f.GetStartTime().AsTime(), End: f.GetTime().AsTime(),
		Verdict: ipfix.VerdictAllowed, Rule: f.GetRule(), RuleName: f.GetRuleName(), Endpoint: keyName(f.GetEndpoint()), Policy: keyName(f.GetPolicy()),
	}
	if f.GetEvent() == delphiv1.FlowEvent_FLOW_EVENT_DENIED {
		r.Verdict, r.EndReason, r.Start = ipfix.VerdictDenied, ipfix.EndOfFlow, r.End
		r.Packets, r.Octets = 1, ipBytes(f.GetBytes())
		return append(recs, r)
	}
	ep := f.GetEndpoint()
	key := connKey{protocol: f.GetProtocol(), src: f.GetSource(), dst: f.GetDestination(), srcPort: f.GetSourcePort(), dstPort: f.GetDestinationPort(),
		endpoint: nimbusv1.MakeKey(nimbusv1.Kind_KIND_ENDPOINT, ep.GetTenant(), ep.GetNamespace(), ep.GetName())}
	c := x.conns[key]
	if c != nil && (r.Start.Sub(c.start) > sameStart || c.start.Sub(r.Start) > sameStart) {
		c = nil // a new connection of the tuple: the old one's end was not seen
		delete(x.conns, key)
	}
	if c == nil && len(x.conns) < x.r.opts.MaxConnections && f.GetEvent() != delphiv1.FlowEvent_FLOW_EVENT_ENDED {
		c = &connState{start: r.Start, last: r.Start}
		x.conns[key] = c
	}
	switch f.GetEvent() {
	case delphiv1.FlowEvent_FLOW_EVENT_ENDED:
		r.EndReason = ipfix.EndOfFlow
		if f.GetReason() == "idle" {
			r.EndReason = ipfix.EndIdleTimeout
		}
		delete(x.conns, key)
	case delphiv1.FlowEvent_FLOW_EVENT_ACTIVE:
		if c == nil || now.Sub(c.last) < x.interval {
			return recs // untracked, or exported less than an interval ago
		}
		r.EndReason = ipfix.EndActiveTimeout
	default:
		return recs
	}
	if c == nil {
		c = &connState{}
	}
	reverse := r
	reverse.Source, reverse.Destination, reverse.SourcePort, reverse.DestinationPort = r.Destination, r.Source, r.DestinationPort, r.SourcePort
	r.Packets, r.Octets = delta(f.GetInitiatorPackets(), c.iPackets), delta(f.GetInitiatorBytes(), c.iBytes)
	reverse.Packets, reverse.Octets = delta(f.GetResponderPackets(), c.rPackets), delta(f.GetResponderBytes(), c.rBytes)
	c.last, c.iPackets, c.iBytes, c.rPackets, c.rBytes = now, f.GetInitiatorPackets(), f.GetInitiatorBytes(), f.GetResponderPackets(), f.GetResponderBytes()
	return append(recs, r, reverse)
}

// delta returns what a count grew by since it was last, and all of it when it shrank.
func delta(now, last uint64) uint64 {
	if now < last {
		return now
	}
	return now - last
}

// keyName returns "tenant/namespace/name", empty for nil.
func keyName(k *nimbusv1.ObjectKey) string {
	if k == nil || k.GetName() == "" {
		return ""
	}
	return policyName(k.Key())
}

// protocolNumber returns the IP protocol number of a record's protocol.
func protocolNumber(p string) uint8 {
	switch p {
	case "tcp":
		return syscall.IPPROTO_TCP
	case "udp":
		return syscall.IPPROTO_UDP
	case "icmp":
		return syscall.IPPROTO_ICMP
	case "icmpv6":
		return syscall.IPPROTO_ICMPV6
	}
	n, _ := strconv.ParseUint(p, 10, 8)
	return uint8(n)
}

// send sends the messages, which carry n records, to the target, with the templates
// first when they are due.
func (x *flowExporter) send(ctx context.Context, now time.Time, t *exportTarget, msgs [][]byte, n int) {
	if t.conn == nil {
		if now.Before(t.retryAt) {
			t.lost(len(msgs))
			return
		}
		if err := x.dial(ctx, t); err != nil {
			x.failed(now, t, len(msgs), err)
			return
		}
	}
	if t.templates.IsZero() || now.Sub(t.templates) >= x.spec.ExportTemplateInterval() {
		msgs = append([][]byte{t.enc.Templates(now)}, msgs...)
	}
	for i, m := range msgs {
		t.conn.SetWriteDeadline(now.Add(exportWriteTimeout))
		if _, err := t.conn.Write(m); err != nil {
			x.failed(now, t, len(msgs)-i, err)
			return
		}
		t.messages.Add(1)
		if isTemplateMessage(m) {
			t.templates = now
		}
	}
	t.sent.Add(uint64(n))
	t.mRecords.Add(float64(n))
	if t.unverified.IsZero() {
		t.unverified = now
	}
}

// isTemplateMessage tells whether the message is a template message: its first set is
// the template set (ID 2).
func isTemplateMessage(m []byte) bool { return len(m) >= 18 && m[16] == 0 && m[17] == 2 }

// dial resolves the target's address and connects a UDP socket to it.
func (x *flowExporter) dial(ctx context.Context, t *exportTarget) error {
	host, port, err := net.SplitHostPort(t.name)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, exportResolveTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolving %q: %w", host, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return fmt.Errorf("port %q: %w", port, err)
	}
	conn, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(addrs[0].Unmap(), uint16(p))))
	if err != nil {
		return err
	}
	t.conn, t.templates, t.unverified = conn, time.Time{}, time.Time{}
	return nil
}

// failed records that msgs messages (one at least: templates that were due, a check)
// did not go to the target, and closes its socket: the next send dials it again,
// resolving its name afresh, a second later at the earliest, and sends the templates
// first, which a collector that restarted needs.
func (x *flowExporter) failed(now time.Time, t *exportTarget, msgs int, err error) {
	t.templates, t.unverified, t.retryAt = time.Time{}, time.Time{}, now.Add(exportTick)
	if t.conn != nil {
		t.conn.Close()
		t.conn = nil
	}
	if t.fail(now, max(msgs, 1), err) {
		x.r.log.Warn("flow export target failing", "key", x.key, "target", t.name, "err", err)
		x.r.changed(x.key)
	}
}

// maintain sends the templates that are due to every target, even without records to
// send, and checks that what went to each target was not refused: a UDP socket hears of
// an ICMP port unreachable only after the send, as an error of its next operation.
func (x *flowExporter) maintain(ctx context.Context, now time.Time) {
	if x.spec.ExportFormat() != nimbusv1.FlowExportIPFIX {
		return
	}
	for _, t := range x.targets {
		if t.conn == nil || t.templates.IsZero() || now.Sub(t.templates) >= x.spec.ExportTemplateInterval() {
			if t.conn != nil || !now.Before(t.retryAt) {
				x.send(ctx, now, t, nil, 0)
			}
		}
		if t.conn == nil || t.unverified.IsZero() || now.Sub(t.unverified) < exportCheckAfter {
			continue
		}
		t.unverified = time.Time{}
		if err := pendingError(t.conn); err != nil {
			x.failed(now, t, 1, err)
			continue
		}
		if t.recover() {
			x.r.log.Info("flow export target recovered", "key", x.key, "target", t.name)
			x.r.changed(x.key)
		}
	}
}

// pendingError returns the error the socket holds, such as the ECONNREFUSED of an ICMP
// port unreachable, and clears it (getsockopt SO_ERROR): nil when there is none.
func pendingError(c *net.UDPConn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var soErr int
	var gerr error
	if err := raw.Control(func(fd uintptr) { soErr, gerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR) }); err != nil {
		return err
	}
	if gerr != nil {
		return fmt.Errorf("reading the socket's error: %w", gerr)
	}
	if soErr != 0 {
		return &net.OpError{Op: "write", Net: "udp", Addr: c.RemoteAddr(), Err: os.NewSyscallError("write", syscall.Errno(soErr))}
	}
	return nil
}

// writeJSON writes the records as JSON lines, one object a record, as the local API's
// Flows has them, in one write.
func (x *flowExporter) writeJSON(now time.Time, flows []*delphiv1.Flow) {
	t := x.targets[0]
	if t.w == nil {
		if !now.Before(t.retryAt) {
			if err := x.open(t); err != nil {
				x.failed(now, t, 1, err)
				return
			}
		} else {
			t.lost(1)
			return
		}
	}
	var b bytes.Buffer
	for _, f := range flows {
		raw, err := manifest.MarshalRecord(f) // as naplesctl flows -o json prints it
		if err != nil {
			continue
		}
		b.Write(raw)
		b.WriteByte('\n')
	}
	if _, err := t.w.Write(b.Bytes()); err != nil {
		x.failed(now, t, 1, err)
		if t.file != nil {
			t.file.Close()
			t.file, t.w = nil, nil
		}
		return
	}
	t.messages.Add(1)
	t.sent.Add(uint64(len(flows)))
	t.mRecords.Add(float64(len(flows)))
	if t.recover() {
		x.r.changed(x.key)
	}
}

// open opens the JSON lines' file, or takes standard output.
func (x *flowExporter) open(t *exportTarget) error {
	name := x.spec.GetFile()
	if name == "" {
		t.w = x.r.opts.Stdout
		return nil
	}
	p := filepath.Join(x.r.opts.Dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	t.file, t.w = f, f
	return nil
}
