package ipfix

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"
	"unicode/utf8"
)

// EnterpriseNumber is the private enterprise number (PEN) of naples's enterprise
// information elements: 32473, the number IANA reserves for documentation and examples
// (RFC 5612), as naples has none of its own. Collectors that know naples's elements
// decode them under it; the others skip them, as RFC 7011 lets them.
const EnterpriseNumber = 32473

// The template IDs of the data sets an Encoder writes.
const (
	// TemplateIPv4 is the template of records of IPv4 flows.
	TemplateIPv4 = 256
	// TemplateIPv6 is the template of records of IPv6 flows.
	TemplateIPv6 = 257
)

// The IANA information elements (RFC 7012, the IANA IPFIX registry) of the templates.
const (
	IEOctetDeltaCount          = 1
	IEPacketDeltaCount         = 2
	IEProtocolIdentifier       = 4
	IESourceTransportPort      = 7
	IESourceIPv4Address        = 8
	IEDestinationTransportPort = 11
	IEDestinationIPv4Address   = 12
	IESourceIPv6Address        = 27
	IEDestinationIPv6Address   = 28
	IEFlowEndReason            = 136
	IEFlowStartMilliseconds    = 152
	IEFlowEndMilliseconds      = 153
)

// The enterprise information elements of EnterpriseNumber.
const (
	// IEVerdict is the firewall's verdict, unsigned8: VerdictAllowed or VerdictDenied.
	IEVerdict = 1
	// IERuleID is the id of the rule that decided, unsigned64; 0 for none.
	IERuleID = 2
	// IEPolicyName is the NetworkSecurityPolicy of the rule, string,
	// "tenant/namespace/name"; empty for none.
	IEPolicyName = 3
	// IEEndpointName is the local Endpoint, string, "tenant/namespace/name".
	IEEndpointName = 4
	// IERuleName is the rule's name in its policy, string, such as "ingress[0]".
	IERuleName = 5
)

// Verdict is the value of IEVerdict.
type Verdict uint8

// The verdicts.
const (
	VerdictAllowed Verdict = 1
	VerdictDenied  Verdict = 2
)

// EndReason is the value of flowEndReason (RFC 5102 5.11.3).
type EndReason uint8

// The end reasons naples exports.
const (
	// EndIdleTimeout: the connection saw no packet for its conntrack timeout.
	EndIdleTimeout EndReason = 1
	// EndActiveTimeout: the connection is still active; the record carries what it
	// did since the last one.
	EndActiveTimeout EndReason = 2
	// EndOfFlow: a TCP connection closed (FIN from both sides, or RST), or a denied
	// packet, whose flow ends with it.
	EndOfFlow EndReason = 3
)

// Record is one data record: one direction of a flow.
type Record struct {
	// Source and Destination are the addresses, both IPv4 or both IPv6.
	Source, Destination netip.Addr
	// SourcePort and DestinationPort are the transport ports, 0 without ports.
	SourcePort, DestinationPort uint16
	// Protocol is the IP protocol number.
	Protocol uint8
	// Start is when the flow's first packet was seen, End when the record was made.
	Start, End time.Time
	// EndReason says why the record was made.
	EndReason EndReason
	// Packets and Octets count the direction's packets and their IP bytes since the
	// flow's previous record.
	Packets, Octets uint64
	// Verdict is the firewall's verdict.
	Verdict Verdict
	// Rule is the id of the rule that decided; 0 for none.
	Rule uint64
	// Policy, RuleName and Endpoint name the rule's policy, the rule, and the local
	// endpoint. Each is cut to MaxString bytes.
	Policy, RuleName, Endpoint string
}

// MaxString bounds the bytes of a string element: longer strings are cut, at a UTF-8
// character's boundary, so that the length always takes one byte (RFC 7011 7).
const MaxString = 254

// field is one field specifier of a template.
type field struct {
	id, length uint16
	// enterprise is set for the elements of EnterpriseNumber.
	enterprise bool
}

// varLength is the length of a variable-length field in a template (RFC 7011 7).
const varLength = 0xffff

// template returns the fields of the template of the address family, in the order the
// data records have them.
func template(v6 bool) []field {
	src, dst, alen := uint16(IESourceIPv4Address), uint16(IEDestinationIPv4Address), uint16(4)
	if v6 {
		src, dst, alen = IESourceIPv6Address, IEDestinationIPv6Address, 16
	}
	return []field{
		{id: src, length: alen},
		{id: dst, length: alen},
		{id: IESourceTransportPort, length: 2},
		{id: IEDestinationTransportPort, length: 2},
		{id: IEProtocolIdentifier, length: 1},
		{id: IEFlowStartMilliseconds, length: 8},
		{id: IEFlowEndMilliseconds, length: 8},
		{id: IEFlowEndReason, length: 1},
		{id: IEPacketDeltaCount, length: 8},
		{id: IEOctetDeltaCount, length: 8},
		{id: IEVerdict, length: 1, enterprise: true},
		{id: IERuleID, length: 8, enterprise: true},
		{id: IEPolicyName, length: varLength, enterprise: true},
		{id: IERuleName, length: varLength, enterprise: true},
		{id: IEEndpointName, length: varLength, enterprise: true},
	}
}

// Sizes of the parts of a message.
const (
	headerLen    = 16
	setHeaderLen = 4
	// maxRecordLen is the most a record takes: an IPv6 record with three strings of
	// MaxString bytes.
	maxRecordLen = 2*16 + 2 + 2 + 1 + 8 + 8 + 1 + 8 + 8 + 1 + 8 + 3*(1+MaxString)
)

// The bounds of EncoderOptions.MaxMessageBytes.
const (
	// MinMessageBytes fits the templates, and any one record with its headers.
	MinMessageBytes = 1024
	// MaxMessageBytes is the most UDP carries over IPv4.
	MaxMessageBytes = 65507
	// DefaultMessageBytes keeps a message within one packet of a 1500-byte path.
	DefaultMessageBytes = 1400
)

// EncoderOptions configures an Encoder.
type EncoderOptions struct {
	// ObservationDomain is the message header's observation domain ID. Default: 0.
	ObservationDomain uint32
	// MaxMessageBytes bounds a message, MinMessageBytes to MaxMessageBytes. Default:
	// DefaultMessageBytes.
	MaxMessageBytes int
}

// Encoder writes the IPFIX messages of one transport session. It is not safe for
// concurrent use.
type Encoder struct {
	domain   uint32
	maxBytes int
	// seq is the number of data records encoded so far, modulo 2^32: the sequence number
	// of the next message.
	seq uint32
}

// NewEncoder returns an Encoder.
func NewEncoder(opts EncoderOptions) (*Encoder, error) {
	n := opts.MaxMessageBytes
	if n == 0 {
		n = DefaultMessageBytes
	}
	if n < MinMessageBytes || n > MaxMessageBytes {
		return nil, fmt.Errorf("ipfix: message size %d: must be between %d and %d bytes", n, MinMessageBytes, MaxMessageBytes)
	}
	return &Encoder{domain: opts.ObservationDomain, maxBytes: n}, nil
}

// Templates returns a message of the template set that defines TemplateIPv4 and
// TemplateIPv6, stamped with now.
func (e *Encoder) Templates(now time.Time) []byte {
	b := e.header(make([]byte, 0, 256), now)
	set := len(b)
	b = binary.BigEndian.AppendUint16(b, 2) // the template set
	b = binary.BigEndian.AppendUint16(b, 0) // its length, below
	for _, t := range []struct {
		id uint16
		v6 bool
	}{{TemplateIPv4, false}, {TemplateIPv6, true}} {
		fields := template(t.v6)
		b = binary.BigEndian.AppendUint16(b, t.id)
		b = binary.BigEndian.AppendUint16(b, uint16(len(fields)))
		for _, f := range fields {
			id := f.id
			if f.enterprise {
				id |= 0x8000
			}
			b = binary.BigEndian.AppendUint16(b, id)
			b = binary.BigEndian.AppendUint16(b, f.length)
			if f.enterprise {
				b = binary.BigEndian.AppendUint32(b, EnterpriseNumber)
			}
		}
	}
	binary.BigEndian.PutUint16(b[set+2:], uint16(len(b)-set))
	return finish(b)
}

// Encode returns the records as messages of at most the encoder's size, stamped with
// now, in order, and counts them in the sequence numbers. A record whose addresses are
// not of one family is skipped and counted in skipped.
func (e *Encoder) Encode(now time.Time, recs []Record) (msgs [][]byte, skipped int) {
	var b []byte
	set := -1       // the offset of the open set in b, -1 for none
	var open uint16 // the open set's template
	inMsg := uint32(0)
	flush := func() {
		if b == nil {
			return
		}
		if set >= 0 {
			binary.BigEndian.PutUint16(b[set+2:], uint16(len(b)-set))
		}
		msgs = append(msgs, finish(b))
		e.seq += inMsg
		b, set, inMsg = nil, -1, 0
	}
	for i := range recs {
		r := &recs[i]
		tmpl, ok := r.template()
		if !ok {
			skipped++
			continue
		}
		if b != nil && len(b)+setHeaderLen+r.size() > e.maxBytes {
			flush()
		}
		if b == nil {
			b = e.header(make([]byte, 0, e.maxBytes), now)
		}
		if set < 0 || open != tmpl {
			if set >= 0 {
				binary.BigEndian.PutUint16(b[set+2:], uint16(len(b)-set))
			}
			set, open = len(b), tmpl
			b = binary.BigEndian.AppendUint16(b, tmpl)
			b = binary.BigEndian.AppendUint16(b, 0)
		}
		b = r.append(b)
		inMsg++
	}
	flush()
	return msgs, skipped
}

// header appends a message header, whose length finish fills in, to b.
func (e *Encoder) header(b []byte, now time.Time) []byte {
	b = binary.BigEndian.AppendUint16(b, 10)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(now.Unix()))
	b = binary.BigEndian.AppendUint32(b, e.seq)
	return binary.BigEndian.AppendUint32(b, e.domain)
}

// finish fills in the length of the message b.
func finish(b []byte) []byte {
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	return b
}

// template returns the record's template, and false when its addresses are not both
// IPv4 or both IPv6.
func (r *Record) template() (uint16, bool) {
	s, d := r.Source.Unmap(), r.Destination.Unmap()
	switch {
	case s.Is4() && d.Is4():
		return TemplateIPv4, true
	case s.Is6() && d.Is6():
		return TemplateIPv6, true
	}
	return 0, false
}

// size returns the bytes the record takes, no more than maxRecordLen.
func (r *Record) size() int {
	n := 2 + 2 + 1 + 8 + 8 + 1 + 8 + 8 + 1 + 8 + 3
	if r.Source.Unmap().Is4() {
		n += 2 * 4
	} else {
		n += 2 * 16
	}
	return n + len(cut(r.Policy)) + len(cut(r.RuleName)) + len(cut(r.Endpoint))
}

// append appends the record's fields, in the order of its template, to b.
func (r *Record) append(b []byte) []byte {
	b = append(b, r.Source.Unmap().AsSlice()...)
	b = append(b, r.Destination.Unmap().AsSlice()...)
	b = binary.BigEndian.AppendUint16(b, r.SourcePort)
	b = binary.BigEndian.AppendUint16(b, r.DestinationPort)
	b = append(b, r.Protocol)
	b = binary.BigEndian.AppendUint64(b, uint64(r.Start.UnixMilli()))
	b = binary.BigEndian.AppendUint64(b, uint64(r.End.UnixMilli()))
	b = append(b, byte(r.EndReason))
	b = binary.BigEndian.AppendUint64(b, r.Packets)
	b = binary.BigEndian.AppendUint64(b, r.Octets)
	b = append(b, byte(r.Verdict))
	b = binary.BigEndian.AppendUint64(b, r.Rule)
	for _, s := range []string{r.Policy, r.RuleName, r.Endpoint} {
		s = cut(s)
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	return b
}

// cut returns s cut to MaxString bytes at a character's boundary.
func cut(s string) string {
	if len(s) <= MaxString {
		return s
	}
	n := MaxString
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Any record fits a message of MinMessageBytes: the array's length would be negative
// otherwise, and the package would not compile.
var _ [MinMessageBytes - headerLen - setHeaderLen - maxRecordLen]struct{}
