package nimbus

import (
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	nimbusv1 "github.com/naplesnet/naples/proto/nimbus/v1"
)

// Defaults of Limits.
const (
	// DefaultStatusMessageBytes is the default of Limits.StatusMessageBytes.
	DefaultStatusMessageBytes = 1 << 10
	// DefaultStatusReasonBytes is the default of Limits.StatusReasonBytes.
	DefaultStatusReasonBytes = 64
	// DefaultStatusOperationalEntries is the default of Limits.StatusOperationalEntries.
	DefaultStatusOperationalEntries = 32
	// DefaultStatusOperationalKeyBytes is the default of Limits.StatusOperationalKeyBytes.
	DefaultStatusOperationalKeyBytes = 64
	// DefaultStatusOperationalValueBytes is the default of Limits.StatusOperationalValueBytes.
	DefaultStatusOperationalValueBytes = 256
	// DefaultStatusOperationalBytes is the default of Limits.StatusOperationalBytes.
	DefaultStatusOperationalBytes = 2 << 10
	// DefaultStatusDetailsBytes is the default of Limits.StatusDetailsBytes.
	DefaultStatusDetailsBytes = 1 << 20
	// DefaultStatusNodes is the default of Limits.StatusNodes.
	DefaultStatusNodes = 256
	// DefaultObjectBytes is the default of Limits.ObjectBytes.
	DefaultObjectBytes = 1 << 20
	// DefaultListPageBytes is the default of Limits.ListPageBytes.
	DefaultListPageBytes = 2 << 20
	// DefaultNodeStreams is the default of Limits.NodeStreams.
	DefaultNodeStreams = 16
	// DefaultPublisherStreams is the default of Limits.PublisherStreams.
	DefaultPublisherStreams = 64
	// DefaultStatusReportBytesPerSecond is the default of Limits.StatusReportBytesPerSecond.
	DefaultStatusReportBytesPerSecond = 4 << 20
	// DefaultStatusReportBurstBytes is the default of Limits.StatusReportBurstBytes.
	DefaultStatusReportBurstBytes = 32 << 20
	// DefaultNodeStreamStarts is the default of Limits.NodeStreamStarts.
	DefaultNodeStreamStarts = 10
	// DefaultPublisherStreamStarts is the default of Limits.PublisherStreamStarts.
	DefaultPublisherStreamStarts = 100
	// StreamStartBurstSeconds is how many seconds' worth of stream starts an identity may
	// make at once: its burst is this times its rate.
	StreamStartBurstSeconds = 5
	// DefaultRefusalDelay is the default of Limits.RefusalDelay.
	DefaultRefusalDelay = time.Second
	// MaxHeldRefusals bounds the refused streams of one identity that wait out
	// Limits.RefusalDelay at once; the ones beyond are answered at once.
	MaxHeldRefusals = 64
	// DefaultRefusalLogInterval is the default of Limits.RefusalLogInterval.
	DefaultRefusalLogInterval = time.Minute
	// DefaultStatusWatermarkMoves is the default of Limits.StatusWatermarkMoves.
	DefaultStatusWatermarkMoves = 10
	// DefaultFlowObservers is the default of Limits.FlowObservers.
	DefaultFlowObservers = 64
	// DefaultFlowObserverBuffer is the default of Limits.FlowObserverBuffer.
	DefaultFlowObserverBuffer = 4096
	// StatusWatermarkMoveBurstSeconds is how many seconds' worth of watermark moves a
	// node may make at once: its burst is this times Limits.StatusWatermarkMoves.
	StatusWatermarkMoveBurstSeconds = 5
)

// Limits bound what one client can make a Server hold or send. Every limit has a default;
// a zero field takes it, a negative one is refused. docs/limits.md lists them with the
// flags of cmd/nimbus and the metrics that show them being hit.
type Limits struct {
	// NodeStreams bounds the streams of each method (Watch, ReportStatus) a node
	// certificate may have open at once, with TLS; see streams.go. Default:
	// DefaultNodeStreams (16).
	NodeStreams int
	// PublisherStreams bounds the streams of each method (Watch, WatchStatus) a publisher
	// certificate may have open at once, with TLS. Default: DefaultPublisherStreams (64).
	PublisherStreams int
	// StatusReportBytesPerSecond bounds the rate of the status reports one node
	// certificate streams, in encoded bytes per second over all its ReportStatus streams
	// together; see rates.go. A stream over it waits before its next report is read, so
	// that gRPC's flow control holds the node back. Default:
	// DefaultStatusReportBytesPerSecond (4 MiB/s), some 18 times what an agent sends that
	// reports 100,000 statuses every minute.
	StatusReportBytesPerSecond int
	// StatusReportBurstBytes is how many bytes of reports a node certificate may send at
	// once before StatusReportBytesPerSecond holds it back. Default:
	// DefaultStatusReportBurstBytes (32 MiB): an agent reporting 100,000 statuses at once
	// sends some 14 MB (about 140 bytes a report), and is not held back.
	StatusReportBurstBytes int
	// NodeStreamStarts bounds the streams (Watch, ReportStatus) a node certificate may
	// start per second, with TLS, StreamStartBurstSeconds' worth at once; one more is
	// refused with codes.ResourceExhausted. Default: DefaultNodeStreamStarts (10).
	NodeStreamStarts int
	// PublisherStreamStarts bounds the streams (Watch, WatchStatus) a publisher
	// certificate may start per second, as NodeStreamStarts. Default:
	// DefaultPublisherStreamStarts (100).
	PublisherStreamStarts int
	// RefusalDelay is how long nimbus waits before it answers a stream it refuses for
	// its identity's count or rate of streams, up to MaxHeldRefusals of an identity at
	// once: a client that opens streams again as soon as they are refused does so once
	// a delay, not as fast as it can, and an agent backs off anyway. Default:
	// DefaultRefusalDelay (1s).
	RefusalDelay time.Duration
	// RefusalLogInterval is how often at most a refusal is logged per client identity
	// (or, for a refused TLS handshake, per peer host and reason); the next line says how
	// many were refused meanwhile. Default: DefaultRefusalLogInterval (1m).
	RefusalLogInterval time.Duration
	// ObjectBytes bounds the encoded size of an object, as the client sends it to Apply
	// or ApplyBatch: a larger one is refused with codes.InvalidArgument naming it, its
	// size and the limit. Default: DefaultObjectBytes (1 MiB), so that an object with its
	// status fits every reader's default 4 MiB receive limit: naplesctl, controllers,
	// the agents' watch and the agents' local API.
	ObjectBytes int
	// ListPageBytes bounds a page of List in bytes: a page ends before the item that
	// would take it beyond, and always holds at least one. Default: DefaultListPageBytes
	// (2 MiB), which with the largest object and status stays below 4 MiB.
	ListPageBytes int
	// StatusMessageBytes bounds the message of a node's status: a longer one is cut to
	// fit and ends with "… [truncated N bytes]". Default: DefaultStatusMessageBytes
	// (1 KiB), which holds any kernel error.
	StatusMessageBytes int
	// StatusReasonBytes bounds the reason of a node's status, a short CamelCase cause,
	// as StatusMessageBytes bounds the message. Default: DefaultStatusReasonBytes (64).
	StatusReasonBytes int
	// StatusOperationalEntries bounds the entries of a status's operational data: the
	// ones after the first that many, in key order, are dropped. Default:
	// DefaultStatusOperationalEntries (32).
	StatusOperationalEntries int
	// StatusOperationalKeyBytes bounds an operational key: an entry with a longer one is
	// dropped. Default: DefaultStatusOperationalKeyBytes (64).
	StatusOperationalKeyBytes int
	// StatusOperationalValueBytes bounds an operational value: a longer one is cut to fit
	// and ends with the truncation marker. Default: DefaultStatusOperationalValueBytes (256).
	StatusOperationalValueBytes int
	// StatusOperationalBytes bounds the keys and values of a status's operational data
	// together: the entries, in key order, that would go beyond are dropped. It bounds
	// the encoded size of its typed operational data too: their lists keep the first
	// entries that fit, and operational_data.entries_omitted counts the others. Default:
	// DefaultStatusOperationalBytes (2 KiB).
	StatusOperationalBytes int
	// StatusDetailsBytes bounds the messages and operational data of the node statuses
	// that one object's status carries in Get, List and WatchStatus: taking the nodes in
	// order, a node whose details would take the sum beyond that goes without them, and
	// ObjectStatus.details_omitted counts those nodes. The rest of every node's status
	// (phase, reason, generation, time) is always there, so with the defaults an object's
	// status stays below 2.5 MiB up to some 10,000 nodes, and fits a 4 MiB message with
	// a 1 MiB object. Default: DefaultStatusDetailsBytes (1 MiB).
	StatusDetailsBytes int
	// StatusWatermarkMoves bounds the moves of one node's status watermark, per second,
	// StatusWatermarkMoveBurstSeconds' worth at once; see watermarkrate.go. A move beyond
	// is neither refused nor lost: the stream's reports from that watermark on are held
	// and applied, its latest watermark of the node with them, when the node's bucket
	// allows, at most 1/StatusWatermarkMoves later. The limit is kept by the replica the
	// node reports to; peer replicas apply what it recorded. Default:
	// DefaultStatusWatermarkMoves (10).
	StatusWatermarkMoves int
	// StatusNodes bounds the node statuses (ObjectStatus.nodes) and the pending nodes
	// (ObjectStatus.pending) that one object's status lists in Get, List and
	// WatchStatus; nodes_omitted and pending_omitted count the ones left out, and the
	// counts always count every node. The nodes kept are those with something to tell
	// first (FAILED, then the other statuses nodes reported and stale ones), then those
	// PROGRAMMED at the generation; the pending ones kept are those furthest behind
	// (docs/status.md). Default: DefaultStatusNodes (256).
	StatusNodes int
	// FlowObservers bounds the ObserveFlows streams open at once, those of the peer
	// replicas included; one more is refused with codes.ResourceExhausted (see flows.go).
	// Default: DefaultFlowObservers (64).
	FlowObservers int
	// FlowObserverBuffer bounds the flow records queued for one observer: the records
	// that come while it is full are dropped for that observer alone, counted and
	// reported to it as lost_nimbus. Default: DefaultFlowObserverBuffer (4096).
	FlowObserverBuffer int
}

// withDefaults returns the limits with every zero field at its default, or an error naming
// a negative one.
func (l Limits) withDefaults() (Limits, error) {
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"NodeStreams", &l.NodeStreams, DefaultNodeStreams},
		{"PublisherStreams", &l.PublisherStreams, DefaultPublisherStreams},
		{"StatusReportBytesPerSecond", &l.StatusReportBytesPerSecond, DefaultStatusReportBytesPerSecond},
		{"StatusReportBurstBytes", &l.StatusReportBurstBytes, DefaultStatusReportBurstBytes},
		{"NodeStreamStarts", &l.NodeStreamStarts, DefaultNodeStreamStarts},
		{"PublisherStreamStarts", &l.PublisherStreamStarts, DefaultPublisherStreamStarts},
		{"ObjectBytes", &l.ObjectBytes, DefaultObjectBytes},
		{"ListPageBytes", &l.ListPageBytes, DefaultListPageBytes},
		{"StatusMessageBytes", &l.StatusMessageBytes, DefaultStatusMessageBytes},
		{"StatusReasonBytes", &l.StatusReasonBytes, DefaultStatusReasonBytes},
		{"StatusOperationalEntries", &l.StatusOperationalEntries, DefaultStatusOperationalEntries},
		{"StatusOperationalKeyBytes", &l.StatusOperationalKeyBytes, DefaultStatusOperationalKeyBytes},
		{"StatusOperationalValueBytes", &l.StatusOperationalValueBytes, DefaultStatusOperationalValueBytes},
		{"StatusOperationalBytes", &l.StatusOperationalBytes, DefaultStatusOperationalBytes},
		{"StatusDetailsBytes", &l.StatusDetailsBytes, DefaultStatusDetailsBytes},
		{"StatusWatermarkMoves", &l.StatusWatermarkMoves, DefaultStatusWatermarkMoves},
		{"StatusNodes", &l.StatusNodes, DefaultStatusNodes},
		{"FlowObservers", &l.FlowObservers, DefaultFlowObservers},
		{"FlowObserverBuffer", &l.FlowObserverBuffer, DefaultFlowObserverBuffer},
	} {
		switch {
		case *f.v < 0:
			return l, fmt.Errorf("Limits.%s %d: must not be negative: %w", f.name, *f.v, ErrInvalidOptions)
		case *f.v == 0:
			*f.v = f.def
		}
	}
	switch {
	case l.RefusalDelay < 0:
		return l, fmt.Errorf("Limits.RefusalDelay %v: must not be negative: %w", l.RefusalDelay, ErrInvalidOptions)
	case l.RefusalDelay == 0:
		l.RefusalDelay = DefaultRefusalDelay
	}
	switch {
	case l.RefusalLogInterval < 0:
		return l, fmt.Errorf("Limits.RefusalLogInterval %v: must not be negative: %w", l.RefusalLogInterval, ErrInvalidOptions)
	case l.RefusalLogInterval == 0:
		l.RefusalLogInterval = DefaultRefusalLogInterval
	}
	return l, nil
}

// Values of the field label of naples_nimbus_status_truncated_total: what of a status
// report was cut or dropped to fit Limits.
const (
	truncatedMessage          = "message"
	truncatedReason           = "reason"
	truncatedOperationalEntry = "operational_entries"
	truncatedOperationalKey   = "operational_key"
	truncatedOperationalValue = "operational_value"
	truncatedOperationalBytes = "operational_bytes"
)

// truncatedFields are the values of the field label, each present from the start.
var truncatedFields = []string{
	truncatedMessage, truncatedReason, truncatedOperationalEntry,
	truncatedOperationalKey, truncatedOperationalValue, truncatedOperationalBytes,
}

// OperationalTruncatedKey is the operational entry that a status whose operational data
// was cut to fit Limits carries, saying how many entries were dropped.
const OperationalTruncatedKey = "nimbus.truncated"

// boundStatus cuts the status, which the caller owns, to fit the limits, and returns the
// fields it cut (truncated* values), or none.
func (l *Limits) boundStatus(st *nimbusv1.NodeStatus) []string {
	var cut []string
	if s, ok := truncate(st.GetMessage(), l.StatusMessageBytes); ok {
		st.Message = s
		cut = append(cut, truncatedMessage)
	}
	if s, ok := truncate(st.GetReason(), l.StatusReasonBytes); ok {
		st.Reason = s
		cut = append(cut, truncatedReason)
	}
	if l.boundOperationalData(st) {
		cut = append(cut, truncatedOperationalBytes)
	}
	op := st.GetOperational()
	if len(op) == 0 {
		return cut
	}
	// The marker of an earlier cut, such as a peer replica's, does not count against
	// the limits, so that a status cut once is not cut again.
	marker, marked := op[OperationalTruncatedKey]
	size, entries := 0, 0
	for k, v := range op {
		if k != OperationalTruncatedKey {
			size += len(k) + len(v)
			entries++
		}
	}
	if entries <= l.StatusOperationalEntries && size <= l.StatusOperationalBytes && !l.oversizedEntry(op) {
		return cut
	}
	kept := make(map[string]string, min(len(op), l.StatusOperationalEntries+1))
	size, dropped := 0, 0
	var reasons [4]bool // entries, key, value, bytes
	for _, k := range slices.Sorted(maps.Keys(op)) {
		v := op[k]
		switch {
		case k == OperationalTruncatedKey:
			continue
		case len(k) > l.StatusOperationalKeyBytes:
			reasons[1] = true
			dropped++
			continue
		case len(kept) == l.StatusOperationalEntries:
			reasons[0] = true
			dropped++
			continue
		}
		if t, ok := truncate(v, l.StatusOperationalValueBytes); ok {
			v = t
			reasons[2] = true
		}
		if size+len(k)+len(v) > l.StatusOperationalBytes {
			reasons[3] = true
			dropped++
			continue
		}
		kept[k] = v
		size += len(k) + len(v)
	}
	for i, f := range []string{truncatedOperationalEntry, truncatedOperationalKey, truncatedOperationalValue, truncatedOperationalBytes} {
		if reasons[i] && !slices.Contains(cut, f) {
			cut = append(cut, f)
		}
	}
	switch {
	case dropped > 0:
		kept[OperationalTruncatedKey] = strconv.Itoa(dropped) + " entries dropped over nimbus's limits"
	case marked:
		kept[OperationalTruncatedKey], _ = truncate(marker, l.StatusOperationalValueBytes)
	}
	st.Operational = kept
	return cut
}

// boundOperationalData cuts the status's typed operational data to
// StatusOperationalBytes encoded: its lists (a policy's rule counters, a network's remote
// VTEPs) keep as many of their first entries as fit, every list as many at most, and
// entries_omitted counts those left out; data that do not fit even without list entries,
// which no agent sends, are dropped whole. It reports whether it cut anything.
func (l *Limits) boundOperationalData(st *nimbusv1.NodeStatus) bool {
	op := st.GetOperationalData()
	if op.SizeVT() <= l.StatusOperationalBytes {
		return false
	}
	lists := operationalLists(op.ProtoReflect(), nil)
	full := make([][]protoreflect.Value, len(lists))
	longest := 0
	for i, list := range lists {
		for j := range list.Len() {
			full[i] = append(full[i], list.Get(j))
		}
		longest = max(longest, list.Len())
	}
	omitted := op.GetEntriesOmitted()
	keepAtMost := func(n int) {
		dropped := 0
		for i, list := range lists {
			list.Truncate(0)
			for _, v := range full[i][:min(n, len(full[i]))] {
				list.Append(v)
			}
			dropped += len(full[i]) - list.Len()
		}
		op.EntriesOmitted = omitted + uint32(dropped)
	}
	// The fewest entries per list that do not fit: one fewer do. With them all the data
	// are as large as they came, so that number is at most longest.
	n := sort.Search(longest+1, func(n int) bool {
		keepAtMost(n)
		return op.SizeVT() > l.StatusOperationalBytes
	})
	if n == 0 {
		st.OperationalData = nil
		return true
	}
	keepAtMost(n - 1)
	return true
}

// operationalLists appends the lists of m and of the messages it holds, as mutable
// lists, to out.
func operationalLists(m protoreflect.Message, out []protoreflect.List) []protoreflect.List {
	var fields []protoreflect.FieldDescriptor
	m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		fields = append(fields, fd)
		return true
	})
	for _, fd := range fields {
		switch {
		case fd.IsList():
			out = append(out, m.Mutable(fd).List())
		case fd.Message() != nil && !fd.IsMap():
			out = operationalLists(m.Mutable(fd).Message(), out)
		}
	}
	return out
}

// oversizedEntry tells whether an operational entry has a key or a value over the limits.
func (l *Limits) oversizedEntry(op map[string]string) bool {
	for k, v := range op {
		if len(k) > l.StatusOperationalKeyBytes || len(v) > l.StatusOperationalValueBytes {
			return true
		}
	}
	return false
}

// truncate returns s cut to at most limit bytes, at a character boundary, ending with
// "… [truncated N bytes]" where N is the number of bytes cut, and true; or s and false
// when it fits. A limit too small for the marker gets the cut string alone.
func truncate(s string, limit int) (string, bool) {
	if len(s) <= limit {
		return s, false
	}
	const markerRoom = len("… [truncated  bytes]") + 20 // the widest count an int has
	keep := max(limit-markerRoom, 0)
	if limit < markerRoom {
		keep = limit
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	if limit < markerRoom {
		return strings.Clone(s[:keep]), true
	}
	// The concatenation copies: the long string is not held on to by the short one.
	return s[:keep] + "… [truncated " + strconv.Itoa(len(s)-keep) + " bytes]", true
}

// statusDetailsSize returns the bytes of a node status's message and operational data,
// the typed data by their encoded size.
func statusDetailsSize(ns *nimbusv1.NodeStatus) int {
	n := len(ns.GetMessage()) + ns.GetOperationalData().SizeVT()
	for k, v := range ns.GetOperational() {
		n += len(k) + len(v)
	}
	return n
}

// withoutDetails returns a copy of the node status without message and operational data.
func withoutDetails(ns *nimbusv1.NodeStatus) *nimbusv1.NodeStatus {
	c := proto.CloneOf(ns)
	c.Message, c.Operational, c.OperationalData = "", nil, nil
	return c
}

// checkObjectSize returns the refusal of an object larger than Limits.ObjectBytes, which
// names it, its size and the limit, and counts it; nil when it fits.
func (s *Server) checkObjectSize(in *nimbusv1.Object) error {
	n, limit := in.SizeVT(), s.opts.Limits.ObjectBytes
	if n <= limit {
		return nil
	}
	s.metrics.objectsTooLarge.Inc()
	return fmt.Errorf("object %s: %d bytes, over the limit of %d bytes (nimbus --max-object-bytes)", in.Key().ID(), n, limit)
}

// listPage is one page of a List under way: the items that fit in Limits.ListPageBytes
// and the request's limit.
type listPage struct {
	resp  *nimbusv1.ListResponse
	bytes int
	// limit and pageBytes are the bounds of the page.
	limit, pageBytes int
	// last is the key of the last item added.
	last nimbusv1.Key
}

// add adds the item with the key to the page, or, when the page is full, ends it with the
// token of the next page and reports false.
func (p *listPage) add(id nimbusv1.Key, item *nimbusv1.ObjectWithStatus) bool {
	n := item.SizeVT()
	n += protowire.SizeTag(1) + protowire.SizeVarint(uint64(n))
	if len(p.resp.Items) > 0 && ((p.limit > 0 && len(p.resp.Items) == p.limit) || p.bytes+n > p.pageBytes) {
		p.resp.NextPageToken = pageToken(p.last)
		return false
	}
	p.resp.Items = append(p.resp.Items, item)
	p.bytes += n
	p.last = id
	return true
}

// pageToken returns the token of the page after the object with the key: its key ID.
func pageToken(key nimbusv1.Key) string {
	return base64.RawURLEncoding.EncodeToString([]byte(key.String()))
}

// parsePageToken returns the key a page token continues after; the zero Key for the first
// page.
func parsePageToken(token string) (nimbusv1.Key, error) {
	if token == "" {
		return nimbusv1.Key{}, nil
	}
	id, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || !utf8.Valid(id) {
		return nimbusv1.Key{}, &nimbusv1.FieldError{Field: "page_token", Value: token, Reason: "not a next_page_token of nimbus"}
	}
	key, err := nimbusv1.ParseKey(string(id))
	if err != nil {
		return nimbusv1.Key{}, &nimbusv1.FieldError{Field: "page_token", Value: token, Reason: "not a next_page_token of nimbus"}
	}
	return key, nil
}
