package ipfix_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/naplesnet/naples/internal/ipfix"
	"github.com/naplesnet/naples/internal/ipfix/ipfixtest"
)

// sameRecord tells whether the record decoded is the one encoded: every field equal,
// the times to the millisecond.
func sameRecord(got, want ipfix.Record) bool {
	if got.Start.UnixMilli() != want.Start.UnixMilli() || got.End.UnixMilli() != want.End.UnixMilli() {
		return false
	}
	got.Start, got.End, want.Start, want.End = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return got == want
}

// checkRecords compares the records goflow2 decoded with those encoded.
func checkRecords(t *testing.T, got, want []ipfix.Record) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("goflow2 decoded %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if !sameRecord(got[i], want[i]) {
			t.Errorf("record %d decoded as\n%+v\nwant\n%+v", i, got[i], want[i])
		}
	}
}

func TestEncodeDecodesWithGoflow2(t *testing.T) {
	start := time.UnixMilli(1_790_000_000_123)
	end := start.Add(2500 * time.Millisecond)
	recs := []ipfix.Record{
		{Source: netip.MustParseAddr("10.1.0.2"), Destination: netip.MustParseAddr("10.1.0.3"), SourcePort: 40000, DestinationPort: 80,
			Protocol: 6, Start: start, End: end, EndReason: ipfix.EndOfFlow, Packets: 7, Octets: 1234, Verdict: ipfix.VerdictAllowed,
			Rule: 1<<40 + 3, Policy: "default/default/web", RuleName: "ingress[0]", Endpoint: "default/default/server"},
		{Source: netip.MustParseAddr("10.1.0.3"), Destination: netip.MustParseAddr("10.1.0.2"), SourcePort: 80, DestinationPort: 40000,
			Protocol: 6, Start: start, End: end, EndReason: ipfix.EndOfFlow, Packets: 5, Octets: 9876543210, Verdict: ipfix.VerdictAllowed,
			Endpoint: "default/default/server"},
		{Source: netip.MustParseAddr("fd00::2"), Destination: netip.MustParseAddr("fd00::3"), SourcePort: 5353, DestinationPort: 53,
			Protocol: 17, Start: start, End: end, EndReason: ipfix.EndIdleTimeout, Packets: 1, Octets: 80, Verdict: ipfix.VerdictDenied, Rule: 9,
			Policy: strings.Repeat("é", 200), RuleName: "egress[3]", Endpoint: strings.Repeat("x", 300)},
		{Source: netip.MustParseAddr("10.1.0.2"), Destination: netip.MustParseAddr("10.1.0.9"), Protocol: 1,
			Start: start, End: start, EndReason: ipfix.EndActiveTimeout, Packets: 1, Octets: 84, Verdict: ipfix.VerdictDenied},
	}
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{ObservationDomain: 42})
	if err != nil {
		t.Fatal(err)
	}
	dec := ipfixtest.NewDecoder()
	now := time.Unix(1_790_000_100, 0)
	msgs, skipped := enc.Encode(now, recs)
	if skipped != 0 || len(msgs) != 1 {
		t.Fatalf("Encode = %d messages, %d skipped; want 1, 0", len(msgs), skipped)
	}
	// Without the templates first, a collector cannot decode the data.
	m, err := dec.Decode(msgs[0])
	if err != nil || len(m.Records) != 0 || m.Raw != 3 {
		t.Fatalf("without templates goflow2 decoded %d records and left %d sets raw (%v); want 0 and 3 (IPv4, IPv6, IPv4)", len(m.Records), m.Raw, err)
	}
	tm, err := dec.Decode(enc.Templates(now))
	if err != nil || tm.Templates != 2 || tm.Sequence != uint32(len(recs)) {
		t.Fatalf("template message: %d templates, sequence %d (%v); want 2, %d", tm.Templates, tm.Sequence, err, len(recs))
	}
	if m, err = dec.Decode(msgs[0]); err != nil || m.Raw != 0 {
		t.Fatalf("goflow2 left %d sets raw (%v)", m.Raw, err)
	}
	want := append([]ipfix.Record(nil), recs...)
	want[2].Policy, want[2].Endpoint = strings.Repeat("é", 127), strings.Repeat("x", ipfix.MaxString) // cut at a character's boundary
	checkRecords(t, m.Records, want)
	if m.ExportTime != uint32(now.Unix()) || m.Domain != 42 || m.Sequence != 0 {
		t.Errorf("header: export time %d, domain %d, sequence %d; want %d, 42, 0", m.ExportTime, m.Domain, m.Sequence, now.Unix())
	}
	// The sequence number counts the data records encoded before the message.
	again, _ := enc.Encode(now, recs[:1])
	if m, err := dec.Decode(again[0]); err != nil || m.Sequence != uint32(len(recs)) {
		t.Errorf("goflow2 read sequence number %d (%v), want %d", m.Sequence, err, len(recs))
	}
}

func TestEncodeSplitsMessages(t *testing.T) {
	enc, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageBytes: ipfix.MinMessageBytes})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_790_000_100, 0)
	var recs []ipfix.Record
	for i := range 100 {
		src, dst := netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}), netip.MustParseAddr("10.9.9.9")
		if i%3 == 0 {
			src, dst = netip.AddrFrom16([16]byte{0xfd, 15: byte(i)}), netip.MustParseAddr("fd00::9")
		}
		recs = append(recs, ipfix.Record{Source: src, Destination: dst, SourcePort: uint16(i), Protocol: 17, Start: now, End: now,
			Packets: uint64(i), Verdict: ipfix.VerdictAllowed, Endpoint: strings.Repeat("e", i*2)})
	}
	mixed := ipfix.Record{Source: netip.MustParseAddr("10.0.0.1"), Destination: netip.MustParseAddr("fd00::1")}
	msgs, skipped := enc.Encode(now, append(recs, mixed))
	if skipped != 1 {
		t.Errorf("skipped %d records, want 1 (the one of two families)", skipped)
	}
	if len(msgs) < 2 {
		t.Fatalf("%d messages, want several of at most %d bytes", len(msgs), ipfix.MinMessageBytes)
	}
	dec := ipfixtest.NewDecoder()
	if _, err := dec.Decode(enc.Templates(now)); err != nil {
		t.Fatal(err)
	}
	var got []ipfix.Record
	seq := uint32(0)
	for i, msg := range msgs {
		if len(msg) > ipfix.MinMessageBytes {
			t.Errorf("message %d is %d bytes, more than %d", i, len(msg), ipfix.MinMessageBytes)
		}
		m, err := dec.Decode(msg)
		if err != nil || m.Raw != 0 {
			t.Fatalf("message %d: %d sets raw (%v)", i, m.Raw, err)
		}
		if m.Sequence != seq {
			t.Errorf("message %d: sequence %d, want %d", i, m.Sequence, seq)
		}
		seq += uint32(len(m.Records))
		got = append(got, m.Records...)
	}
	checkRecords(t, got, recs)
}

func TestNewEncoderBounds(t *testing.T) {
	for _, n := range []int{ipfix.MinMessageBytes - 1, ipfix.MaxMessageBytes + 1, -1} {
		if _, err := ipfix.NewEncoder(ipfix.EncoderOptions{MaxMessageBytes: n}); err == nil {
			t.Errorf("NewEncoder(MaxMessageBytes %d) succeeded, want an error", n)
		}
	}
}
