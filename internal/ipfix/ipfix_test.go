package ipfix

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/netsampler/goflow2/v2/decoders/netflow"
)

// decoded is a data record as goflow2's decoder returns it, by information element:
// the enterprise elements under their id plus 1<<16.
type decoded map[uint32][]byte

// decode decodes the messages with goflow2's IPFIX decoder, an implementation
// independent of this package, and returns the headers and the data records.
// Sets it could not decode, for want of their template, are counted in raw.
func decode(t *testing.T, templates netflow.NetFlowTemplateSystem, msgs ...[]byte) (pkts []netflow.IPFIXPacket, recs []decoded, raw int) {
	t.Helper()
	for _, m := range msgs {
		var pkt netflow.IPFIXPacket
		if err := netflow.DecodeMessageVersion(bytes.NewBuffer(m), templates, nil, &pkt); err != nil && !errors.Is(err, netflow.ErrorTemplateNotFound) {
			t.Fatalf("goflow2 decoding a message of %d bytes: %v", len(m), err)
		}
		if int(pkt.Length) != len(m) {
			t.Errorf("message length field %d, message %d bytes", pkt.Length, len(m))
		}
		pkts = append(pkts, pkt)
		for _, fs := range pkt.FlowSets {
			switch s := fs.(type) {
			case netflow.DataFlowSet:
				for _, r := range s.Records {
					d := decoded{}
					for _, v := range r.Values {
						id := uint32(v.Type)
						if v.PenProvided {
							if v.Pen != EnterpriseNumber {
								t.Errorf("element %d of enterprise %d, want %d", v.Type, v.Pen, EnterpriseNumber)
							}
							id |= 1 << 16
						}
						d[id] = v.Value.([]byte)
					}
					recs = append(recs, d)
				}
			case netflow.TemplateFlowSet:
			case netflow.RawFlowSet:
				raw++
			default:
				t.Errorf("unexpected set %T", fs)
			}
		}
	}
	return pkts, recs, raw
}

// check compares a decoded record with the record encoded, every field.
func check(t *testing.T, i int, got decoded, want Record) {
	t.Helper()
	u := func(id uint32) uint64 {
		b := got[id]
		var v uint64
		for _, c := range b {
			v = v<<8 | uint64(c)
		}
		return v
	}
	src, dst := uint32(IESourceIPv4Address), uint32(IEDestinationIPv4Address)
	if want.Source.Is6() {
		src, dst = IESourceIPv6Address, IEDestinationIPv6Address
	}
	addr := func(id uint32) netip.Addr { a, _ := netip.AddrFromSlice(got[id]); return a }
	const e = 1 << 16
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"source", addr(src), want.Source},
		{"destination", addr(dst), want.Destination},
		{"sourceTransportPort", u(IESourceTransportPort), uint64(want.SourcePort)},
		{"destinationTransportPort", u(IEDestinationTransportPort), uint64(want.DestinationPort)},
		{"protocolIdentifier", u(IEProtocolIdentifier), uint64(want.Protocol)},
		{"flowStartMilliseconds", u(IEFlowStartMilliseconds), uint64(want.Start.UnixMilli())},
		{"flowEndMilliseconds", u(IEFlowEndMilliseconds), uint64(want.End.UnixMilli())},
		{"flowEndReason", u(IEFlowEndReason), uint64(want.EndReason)},
		{"packetDeltaCount", u(IEPacketDeltaCount), want.Packets},
		{"octetDeltaCount", u(IEOctetDeltaCount), want.Octets},
		{"verdict", u(e | IEVerdict), uint64(want.Verdict)},
		{"ruleId", u(e | IERuleID), want.Rule},
		{"policyName", string(got[e|IEPolicyName]), cut(want.Policy)},
		{"ruleName", string(got[e|IERuleName]), cut(want.RuleName)},
		{"endpointName", string(got[e|IEEndpointName]), cut(want.Endpoint)},
		{"elements", len(got), 15},
	} {
		if c.got != c.want {
			t.Errorf("record %d %s = %v, want %v", i, c.name, c.got, c.want)
		}
	}
}

func TestEncodeDecodesWithGoflow2(t *testing.T) {
	start := time.UnixMilli(1_790_000_000_123)
	end := start.Add(2500 * time.Millisecond)
	recs := []Record{
		{Source: netip.MustParseAddr("10.1.0.2"), Destination: netip.MustParseAddr("10.1.0.3"), SourcePort: 40000, DestinationPort: 80,
			Protocol: 6, Start: start, End: end, EndReason: EndOfFlow, Packets: 7, Octets: 1234, Verdict: VerdictAllowed,
			Rule: 1<<40 + 3, Policy: "default/default/web", RuleName: "ingress[0]", Endpoint: "default/default/server"},
		{Source: netip.MustParseAddr("10.1.0.3"), Destination: netip.MustParseAddr("10.1.0.2"), SourcePort: 80, DestinationPort: 40000,
			Protocol: 6, Start: start, End: end, EndReason: EndOfFlow, Packets: 5, Octets: 9876543210, Verdict: VerdictAllowed,
			Endpoint: "default/default/server"},
		{Source: netip.MustParseAddr("fd00::2"), Destination: netip.MustParseAddr("fd00::3"), SourcePort: 5353, DestinationPort: 53,
			Protocol: 17, Start: start, End: end, EndReason: EndIdleTimeout, Packets: 1, Octets: 80, Verdict: VerdictDenied, Rule: 9,
			Policy: strings.Repeat("é", 200), RuleName: "egress[3]", Endpoint: strings.Repeat("x", 300)},
		{Source: netip.MustParseAddr("10.1.0.2"), Destination: netip.MustParseAddr("10.1.0.9"), Protocol: 1,
			Start: start, End: start, EndReason: EndActiveTimeout, Packets: 1, Octets: 84, Verdict: VerdictDenied},
	}
	enc, err := NewEncoder(EncoderOptions{ObservationDomain: 42})
	if err != nil {
		t.Fatal(err)
	}
	templates := netflow.CreateTemplateSystem()
	now := time.Unix(1_790_000_100, 0)
	msgs, skipped := enc.Encode(now, recs)
	if skipped != 0 || len(msgs) != 1 {
		t.Fatalf("Encode = %d messages, %d skipped; want 1, 0", len(msgs), skipped)
	}
	// Without the templates first, a collector cannot decode the data.
	if _, got, raw := decode(t, templates, msgs...); len(got) != 0 || raw != 3 {
		t.Fatalf("without templates goflow2 decoded %d records and left %d sets raw; want 0 and 3 (IPv4, IPv6, IPv4)", len(got), raw)
	}
	pkts, got, raw := decode(t, templates, enc.Templates(now), msgs[0])
	if raw != 0 || len(got) != len(recs) {
		t.Fatalf("goflow2 decoded %d records and left %d sets raw; want %d and 0", len(got), raw, len(recs))
	}
	for i, r := range recs {
		check(t, i, got[i], r)
	}
	for i, p := range pkts {
		if p.Version != 10 || p.ExportTime != uint32(now.Unix()) || p.ObservationDomainId != 42 {
			t.Errorf("message %d header: version %d, export time %d, domain %d; want 10, %d, 42", i, p.Version, p.ExportTime, p.ObservationDomainId, now.Unix())
		}
	}
	// The sequence number counts the data records sent before the message.
	again, _ := enc.Encode(now, recs[:1])
	if seq := binary.BigEndian.Uint32(again[0][8:]); seq != uint32(len(recs)) {
		t.Errorf("sequence number of the second data message = %d, want %d", seq, len(recs))
	}
	if p, _, _ := decode(t, templates, again...); p[0].SequenceNumber != uint32(len(recs)) {
		t.Errorf("goflow2 read sequence number %d, want %d", p[0].SequenceNumber, len(recs))
	}
}

func TestEncodeSplitsMessages(t *testing.T) {
	enc, err := NewEncoder(EncoderOptions{MaxMessageBytes: MinMessageBytes})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_790_000_100, 0)
	var recs []Record
	for i := range 100 {
		src := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})
		if i%3 == 0 {
			src = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)})
		}
		dst := netip.MustParseAddr("10.9.9.9")
		if src.Is6() {
			dst = netip.MustParseAddr("fd00::9")
		}
		recs = append(recs, Record{Source: src, Destination: dst, SourcePort: uint16(i), Protocol: 17, Start: now, End: now,
			Packets: uint64(i), Verdict: VerdictAllowed, Endpoint: strings.Repeat("e", i*3)})
	}
	recs = append(recs, Record{Source: netip.MustParseAddr("10.0.0.1"), Destination: netip.MustParseAddr("fd00::1")})
	msgs, skipped := enc.Encode(now, recs)
	if skipped != 1 {
		t.Errorf("skipped %d records, want 1 (the one of two families)", skipped)
	}
	if len(msgs) < 2 {
		t.Fatalf("%d messages, want several of at most %d bytes", len(msgs), MinMessageBytes)
	}
	for i, m := range msgs {
		if len(m) > MinMessageBytes {
			t.Errorf("message %d is %d bytes, more than %d", i, len(m), MinMessageBytes)
		}
	}
	_, got, raw := decode(t, netflow.CreateTemplateSystem(), append([][]byte{enc.Templates(now)}, msgs...)...)
	if raw != 0 || len(got) != 100 {
		t.Fatalf("goflow2 decoded %d records and left %d sets raw; want 100 and 0", len(got), raw)
	}
	for i := range got {
		check(t, i, got[i], recs[i])
	}
}

func TestNewEncoderBounds(t *testing.T) {
	for _, n := range []int{MinMessageBytes - 1, MaxMessageBytes + 1, -1} {
		if _, err := NewEncoder(EncoderOptions{MaxMessageBytes: n}); err == nil {
			t.Errorf("NewEncoder(MaxMessageBytes %d) succeeded, want an error", n)
		}
	}
}
