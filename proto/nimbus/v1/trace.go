package nimbusv1

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The limits and defaults of a Trace's spec, which Validate enforces.
const (
	// MinTracePayload is the smallest payload of a trace packet: its tag.
	MinTracePayload = 24
	// MaxTracePayload bounds spec.payloadSize: the injected frame, with its headers, must
	// fit the page BPF_PROG_RUN's live frames take (4096 bytes less the XDP headroom and
	// the skb's shared info).
	MaxTracePayload = 3400
	// DefaultTraceTimeout is spec.timeout when unset.
	DefaultTraceTimeout = 5 * time.Second
	// MinTraceTimeout and MaxTraceTimeout bound spec.timeout; MaxLiveTraceTimeout bounds
	// it with spec.live.
	MinTraceTimeout     = time.Second
	MaxTraceTimeout     = time.Minute
	MaxLiveTraceTimeout = 10 * time.Minute
	// MaxTraceObservations bounds the observations one node reports of one Trace.
	MaxTraceObservations = 32
)

// The protocols and families of a Trace.
const (
	TraceTCP  = "tcp"
	TraceUDP  = "udp"
	TraceICMP = "icmp"
	TraceIPv4 = "ipv4"
	TraceIPv6 = "ipv6"
)

// TraceProtocol returns spec.protocol with its default, TraceTCP.
func (s *TraceSpec) TraceProtocol() string {
	if s.GetProtocol() == "" {
		return TraceTCP
	}
	return s.GetProtocol()
}

// TraceTimeout returns spec.timeout, or DefaultTraceTimeout when unset.
func (s *TraceSpec) TraceTimeout() time.Duration {
	if s.GetTimeout() == nil {
		return DefaultTraceTimeout
	}
	return s.GetTimeout().AsDuration()
}

// TracePayload returns spec.payloadSize with its default, MinTracePayload.
func (s *TraceSpec) TracePayload() int {
	return max(int(s.GetPayloadSize()), MinTracePayload)
}

// trace checks a Trace's spec.
func (v *validator) trace(s *TraceSpec) {
	v.name("spec.source", s.GetSource(), true)
	switch {
	case s.GetDestination() != "" && s.GetDestinationAddress() != "":
		v.add("spec.destinationAddress", s.GetDestinationAddress(), "must be empty when spec.destination names an endpoint")
	case s.GetDestination() != "":
		v.name("spec.destination", s.GetDestination(), true)
		if s.GetDestination() == s.GetSource() {
			v.add("spec.destination", s.GetDestination(), "is the source")
		}
	case s.GetDestinationAddress() != "":
		if a, ok := v.addr("spec.destinationAddress", s.GetDestinationAddress(), true); ok && s.GetFamily() != "" {
			if fam := familyOf(a); fam != s.GetFamily() {
				v.add("spec.family", s.GetFamily(), "does not match spec.destinationAddress %q (%s)", s.GetDestinationAddress(), fam)
			}
		}
	default:
		v.add("spec.destination", "", "is required (an endpoint's name), or spec.destinationAddress")
	}
	switch f := s.GetFamily(); f {
	case "", TraceIPv4, TraceIPv6:
	default:
		v.add("spec.family", f, `must be "ipv4" or "ipv6"`)
	}
	proto := s.TraceProtocol()
	switch proto {
	case TraceTCP, TraceUDP:
		if s.GetDestinationPort() == 0 || s.GetDestinationPort() > 65535 {
			v.add("spec.destinationPort", strconv.FormatUint(uint64(s.GetDestinationPort()), 10), "must be 1 to 65535 with protocol %q", proto)
		}
		if s.GetSourcePort() > 65535 {
			v.add("spec.sourcePort", strconv.FormatUint(uint64(s.GetSourcePort()), 10), "must be 0 to 65535")
		}
	case TraceICMP:
		if s.GetDestinationPort() != 0 {
			v.add("spec.destinationPort", strconv.FormatUint(uint64(s.GetDestinationPort()), 10), `must be 0 with protocol "icmp"`)
		}
		if s.GetSourcePort() != 0 {
			v.add("spec.sourcePort", strconv.FormatUint(uint64(s.GetSourcePort()), 10), `must be 0 with protocol "icmp"`)
		}
	default:
		v.add("spec.protocol", proto, `must be "tcp", "udp" or "icmp"`)
	}
	if p := s.GetPayloadSize(); p != 0 && (p < MinTracePayload || p > MaxTracePayload) {
		v.add("spec.payloadSize", strconv.FormatUint(uint64(p), 10), "must be %d to %d (the trace's tag takes %d bytes)", MinTracePayload, MaxTracePayload, MinTracePayload)
	}
	if s.GetLive() && s.GetPayloadSize() != 0 {
		v.add("spec.payloadSize", strconv.FormatUint(uint64(s.GetPayloadSize()), 10), "must be 0 with spec.live: a live trace injects no packet")
	}
	if s.GetLive() && proto == TraceICMP {
		v.add("spec.protocol", proto, `must be "tcp" or "udp" with spec.live: a live trace names the packet by its ports`)
	}
	if s.GetLive() && proto != TraceICMP && s.GetSourcePort() == 0 {
		v.add("spec.sourcePort", "0", "is required with spec.live: the 5-tuple names the real packet to follow")
	}
	if t := s.GetTimeout(); t != nil {
		d, most := t.AsDuration(), MaxTraceTimeout
		if s.GetLive() {
			most = MaxLiveTraceTimeout
		}
		if err := t.CheckValid(); err != nil || d < MinTraceTimeout || d > most {
			v.add("spec.timeout", d.String(), "must be %s to %s", MinTraceTimeout, most)
		}
	}
}

// familyOf returns TraceIPv4 or TraceIPv6, the family of a.
func familyOf(a netip.Addr) string {
	if a.Unmap().Is4() {
		return TraceIPv4
	}
	return TraceIPv6
}

// fill adds the trace's entries of the operational map to m.
func (t *TraceOperational) fill(m map[string]string) {
	if t.GetPacket() != "" {
		m["packet"] = t.GetPacket()
	}
	m["done"] = strconv.FormatBool(t.GetDone())
	for i, o := range t.GetObservations() {
		m[fmt.Sprintf("observations[%d]", i)] = o.Line()
	}
}

// StageName returns the stage's short name: "source", "tunnel-out", ...
func (s TraceStage) StageName() string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s.String(), "TRACE_STAGE_")), "_", "-")
}

// ActionName returns the action's short name: "allowed", "delivered", ...
func (a TraceAction) ActionName() string {
	return strings.ToLower(strings.TrimPrefix(a.String(), "TRACE_ACTION_"))
}

// Line returns the observation in one line: stage, action and what decided.
func (o *TraceObservation) Line() string {
	var b strings.Builder
	b.WriteString(o.GetStage().StageName())
	b.WriteString(" ")
	b.WriteString(o.GetAction().ActionName())
	if o.GetReason() != "" {
		b.WriteString(" (" + o.GetReason() + ")")
	}
	if o.GetMessage() != "" {
		b.WriteString(": " + o.GetMessage())
	}
	return b.String()
}

// TraceResult is where a Trace stands, as its nodes' statuses tell it.
type TraceResult int

// The results of a Trace.
const (
	// TraceRunning: the packet's fate is not known yet.
	TraceRunning TraceResult = iota
	// TraceDelivered: the packet reached the destination, allowed.
	TraceDelivered
	// TraceDropped: the packet was denied or dropped (TraceOutcome.Reason says why).
	TraceDropped
	// TraceTimedOut: the node of the source is done, and the packet neither arrived nor
	// was seen dropped.
	TraceTimedOut
)

// String returns "running", "delivered", "dropped" or "timed out".
func (r TraceResult) String() string {
	switch r {
	case TraceDelivered:
		return "delivered"
	case TraceDropped:
		return "dropped"
	case TraceTimedOut:
		return "timed out"
	}
	return "running"
}

// TraceHop is one observation, with the node that made it.
type TraceHop struct {
	Node string
	*TraceObservation
}

// TraceOutcome is a Trace's result and its path, derived from its status.
type TraceOutcome struct {
	Result TraceResult
	// Reason is the reason of the denial or drop that decided a TraceDropped, or what
	// the last hop was for TraceTimedOut.
	Reason string
	// Hops are every node's observations: the node of the source first, then by time.
	Hops []TraceHop
	// Decided is the hop that decided the result, nil while running.
	Decided *TraceHop
}

// Outcome derives a Trace's result and path from the status its nodes reported, for
// the Trace's generation gen (older reports are left out). source is the node of the
// Trace's source endpoint. The packet is delivered when some node saw it delivered;
// otherwise dropped when a node saw it denied or dropped, or, once the node of the
// source is done, flooded for want of an FDB entry; otherwise it timed out once the
// node of the source is done. A fate another node saw counts once the node of the
// source reported the packet going into the tunnel and that node reported it coming
// out of it (or the node of the source is done), so that the path is whole.
func Outcome(st *ObjectStatus, gen int64, source string) TraceOutcome {
	var out TraceOutcome
	sourceDone := false
	for _, n := range st.GetNodes() {
		if n.GetObservedGeneration() != gen {
			continue
		}
		t := n.GetOperationalData().GetTrace()
		if n.GetNode() == source && t.GetDone() {
			sourceDone = true
		}
		for _, o := range t.GetObservations() {
			out.Hops = append(out.Hops, TraceHop{Node: n.GetNode(), TraceObservation: o})
		}
	}
	slices.SortStableFunc(out.Hops, func(a, b TraceHop) int {
		if (a.Node == source) != (b.Node == source) {
			if a.Node == source {
				return -1
			}
			return 1
		}
		return a.GetTime().AsTime().Compare(b.GetTime().AsTime())
	})
	// A fate seen on another node is the outcome once the node of the source reported
	// the packet leaving through the tunnel and that node reported it coming out of the
	// tunnel: either report may come after the fate's, and the path would miss its
	// stages. (The node of the source sends the packet again for a while, as the other
	// node may install the trace only after the first copy passed its tunnel; a copy
	// that passed the tunnel before and reached the workload after leaves a fate
	// without its arrival, until the next copy's.) Once the node of the source is done,
	// what was reported is all there is.
	left, arrived := false, map[string]bool{}
	for _, h := range out.Hops {
		switch {
		case h.Node == source && h.GetStage() == TraceStage_TRACE_STAGE_TUNNEL_OUT:
			left = true
		case h.Node != source && h.GetStage() == TraceStage_TRACE_STAGE_TUNNEL_IN:
			arrived[h.Node] = true
		}
	}
	decide := func(i int, r TraceResult, reason string) bool {
		if n := out.Hops[i].Node; n != source && !sourceDone && !(left && arrived[n]) {
			return false
		}
		out.Result, out.Reason, out.Decided = r, reason, &out.Hops[i]
		return true
	}
	for i, h := range out.Hops {
		if h.GetAction() == TraceAction_TRACE_ACTION_DELIVERED {
			if decide(i, TraceDelivered, "") {
				return out
			}
			break
		}
	}
	for i, h := range out.Hops {
		if a := h.GetAction(); a == TraceAction_TRACE_ACTION_DENIED || a == TraceAction_TRACE_ACTION_DROPPED {
			if decide(i, TraceDropped, h.GetReason()) {
				return out
			}
			break
		}
	}
	if !sourceDone {
		return out
	}
	for i, h := range out.Hops {
		if h.GetStage() == TraceStage_TRACE_STAGE_FORWARD && h.GetAction() == TraceAction_TRACE_ACTION_FLOODED && decide(i, TraceDropped, h.GetReason()) {
			return out
		}
	}
	out.Result = TraceTimedOut
	if len(out.Hops) > 0 {
		last := out.Hops[len(out.Hops)-1]
		out.Reason = "last seen at " + last.GetStage().StageName() + " on " + last.Node
	} else {
		out.Reason = "no node saw the packet"
	}
	return out
}
