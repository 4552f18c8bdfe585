// Package ipfixtest is a collector of IPFIX for tests: it decodes what it receives with
// goflow2's decoder (github.com/netsampler/goflow2/v2), an implementation independent of
// package ipfix, and returns the data records as ipfix.Record values, so that tests
// compare what an exporter sent with what it meant to, field by field.
package ipfixtest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/netsampler/goflow2/v2/decoders/netflow"

	"github.com/naplesnet/naples/internal/ipfix"
)

// Message is one decoded message: its header and data records.
type Message struct {
	// ExportTime, Sequence and Domain are the header's export time (seconds), sequence
	// number and observation domain ID.
	ExportTime, Sequence, Domain uint32
	// Templates is the number of template records the message carried.
	Templates int
	// Records are the data records decoded.
	Records []ipfix.Record
	// Raw is the number of data sets that could not be decoded for want of a template.
	Raw int
}

// Decoder decodes the messages of one transport session, learning its templates.
type Decoder struct{ templates netflow.NetFlowTemplateSystem }

// NewDecoder returns a Decoder that knows no template yet.
func NewDecoder() *Decoder { return &Decoder{templates: netflow.CreateTemplateSystem()} }

// Decode decodes one message. A data record whose elements are not those of package
// ipfix's templates, each once with its length, is an error.
func (d *Decoder) Decode(msg []byte) (Message, error) {
	var pkt netflow.IPFIXPacket
	if err := netflow.DecodeMessageVersion(bytes.NewBuffer(msg), d.templates, nil, &pkt); err != nil && !errors.Is(err, netflow.ErrorTemplateNotFound) {
		return Message{}, fmt.Errorf("goflow2 decoding a message of %d bytes: %w", len(msg), err)
	}
	if pkt.Version != 10 || int(pkt.Length) != len(msg) {
		return Message{}, fmt.Errorf("message of %d bytes: version %d, length %d", len(msg), pkt.Version, pkt.Length)
	}
	m := Message{ExportTime: pkt.ExportTime, Sequence: pkt.SequenceNumber, Domain: pkt.ObservationDomainId}
	for _, fs := range pkt.FlowSets {
		switch s := fs.(type) {
		case netflow.TemplateFlowSet:
			m.Templates += len(s.Records)
		case netflow.DataFlowSet:
			for _, r := range s.Records {
				rec, err := record(r.Values)
				if err != nil {
					return m, err
				}
				m.Records = append(m.Records, rec)
			}
		case netflow.RawFlowSet:
			m.Raw++
		default:
			return m, fmt.Errorf("unexpected set %T", fs)
		}
	}
	return m, nil
}

// record maps the decoded fields of one data record to an ipfix.Record.
func record(values []netflow.DataField) (ipfix.Record, error) {
	var r ipfix.Record
	seen := map[uint32]bool{}
	for _, v := range values {
		b, _ := v.Value.([]byte)
		id := uint32(v.Type)
		if v.PenProvided {
			if v.Pen != ipfix.EnterpriseNumber {
				return r, fmt.Errorf("element %d of enterprise %d", v.Type, v.Pen)
			}
			id |= 1 << 16
		}
		if seen[id] {
			return r, fmt.Errorf("element %d twice", v.Type)
		}
		seen[id] = true
		want := map[uint32]int{
			ipfix.IESourceIPv4Address: 4, ipfix.IEDestinationIPv4Address: 4, ipfix.IESourceIPv6Address: 16, ipfix.IEDestinationIPv6Address: 16,
			ipfix.IESourceTransportPort: 2, ipfix.IEDestinationTransportPort: 2, ipfix.IEProtocolIdentifier: 1,
			ipfix.IEFlowStartMilliseconds: 8, ipfix.IEFlowEndMilliseconds: 8, ipfix.IEFlowEndReason: 1,
			ipfix.IEPacketDeltaCount: 8, ipfix.IEOctetDeltaCount: 8, 1<<16 | ipfix.IEVerdict: 1, 1<<16 | ipfix.IERuleID: 8,
			1<<16 | ipfix.IEPolicyName: -1, 1<<16 | ipfix.IERuleName: -1, 1<<16 | ipfix.IEEndpointName: -1,
		}
		n, known := want[id]
		if !known || n >= 0 && len(b) != n {
			return r, fmt.Errorf("element %d (enterprise: %v) of %d bytes: not one of the templates'", v.Type, v.PenProvided, len(b))
		}
		u := uint64(0)
		for _, c := range b {
			u = u<<8 | uint64(c)
		}
		addr, _ := netip.AddrFromSlice(b)
		switch id {
		case ipfix.IESourceIPv4Address, ipfix.IESourceIPv6Address:
			r.Source = addr
		case ipfix.IEDestinationIPv4Address, ipfix.IEDestinationIPv6Address:
			r.Destination = addr
		case ipfix.IESourceTransportPort:
			r.SourcePort = uint16(u)
		case ipfix.IEDestinationTransportPort:
			r.DestinationPort = uint16(u)
		case ipfix.IEProtocolIdentifier:
			r.Protocol = uint8(u)
		case ipfix.IEFlowStartMilliseconds:
			r.Start = time.UnixMilli(int64(u))
		case ipfix.IEFlowEndMilliseconds:
			r.End = time.UnixMilli(int64(u))
		case ipfix.IEFlowEndReason:
			r.EndReason = ipfix.EndReason(u)
		case ipfix.IEPacketDeltaCount:
			r.Packets = u
		case ipfix.IEOctetDeltaCount:
			r.Octets = u
		case 1<<16 | ipfix.IEVerdict:
			r.Verdict = ipfix.Verdict(u)
		case 1<<16 | ipfix.IERuleID:
			r.Rule = u
		case 1<<16 | ipfix.IEPolicyName:
			r.Policy = string(b)
		case 1<<16 | ipfix.IERuleName:
			r.RuleName = string(b)
		case 1<<16 | ipfix.IEEndpointName:
			r.Endpoint = string(b)
		}
	}
	if len(seen) != 15 {
		return r, fmt.Errorf("a data record of %d elements, want 15", len(seen))
	}
	return r, nil
}

// Collector receives IPFIX over UDP and keeps what it decodes.
type Collector struct {
	conn *net.UDPConn
	done chan struct{}

	// mu guards msgs and errs.
	mu   sync.Mutex
	msgs []Message
	errs []error
}

// Listen starts a Collector on the UDP address, "127.0.0.1:0" for instance.
func Listen(addr string) (*Collector, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	conn, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	c := &Collector{conn: conn, done: make(chan struct{})}
	go c.run()
	return c, nil
}

// Addr returns the address the collector listens on.
func (c *Collector) Addr() netip.AddrPort { return c.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// run decodes what comes until the collector is closed, with one decoder for each
// exporter's address.
func (c *Collector) run() {
	defer close(c.done)
	decoders := map[netip.AddrPort]*Decoder{}
	buf := make([]byte, 1<<16)
	for {
		n, from, err := c.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		d := decoders[from]
		if d == nil {
			d = NewDecoder()
			decoders[from] = d
		}
		m, err := d.Decode(buf[:n])
		c.mu.Lock()
		if err != nil {
			c.errs = append(c.errs, err)
		} else {
			c.msgs = append(c.msgs, m)
		}
		c.mu.Unlock()
	}
}

// Messages returns the messages decoded so far, and the errors of those that could not
// be.
func (c *Collector) Messages() ([]Message, []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Message(nil), c.msgs...), append([]error(nil), c.errs...)
}

// Records returns the data records decoded so far, in the order they came.
func (c *Collector) Records() []ipfix.Record {
	msgs, _ := c.Messages()
	var recs []ipfix.Record
	for _, m := range msgs {
		recs = append(recs, m.Records...)
	}
	return recs
}

// Close stops the collector. It is safe to call twice.
func (c *Collector) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}
