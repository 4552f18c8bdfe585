package fwbpf

import "time"

// The names of the programs and maps in the object, as in firewall.c.
const (
	// ProgIngress is the program for an endpoint interface's tcx ingress hook: packets
	// from the endpoint.
	ProgIngress = "fw_ingress"
	// ProgEgress is the program for the tcx egress hook: packets to the endpoint.
	ProgEgress = "fw_egress"

	// MapSnapshots is the array of maps whose slot 0 holds the current snapshot, an LPM
	// trie of firewall.Key to firewall.Value.
	MapSnapshots = "fw_snapshots"
	// MapCT is the conntrack table, an LRU hash of CTKey to CTValue.
	MapCT = "fw_ct"
	// MapRuleStats counts packets per rule: a per-CPU hash of uint64 rule ids to
	// RuleStats.
	MapRuleStats = "fw_rule_stats"
	// MapEndpointStats counts packets per local endpoint: a per-CPU hash of uint32
	// endpoint ids to EndpointStats.
	MapEndpointStats = "fw_ep_stats"
	// MapFrag remembers the first fragments of datagrams for their later fragments: an
	// LRU hash of FragKey to FragValue, whose entries live FragTimeout.
	MapFrag = "fw_frag"
	// MapStats holds the program's own counters: a per-CPU array of NumStats uint64,
	// indexed by the Stat constants.
	MapStats = "fw_stats"
	// MapFlows is the ring buffer of flow records (FlowRecord), written when the
	// programs were loaded with flow records on (Capacities.FlowRing).
	MapFlows = "fw_flows"
	// MapFlowLost counts the flow records that found MapFlows full: a per-CPU array of
	// one uint64.
	MapFlowLost = "fw_flow_lost"
	// MapFlowBudget holds each local endpoint's budget of flow records per CPU
	// (Capacities.FlowEndpointRate): a per-CPU LRU hash of uint32 endpoint ids to
	// FlowBucket, made by the programs. MapFlowSuppressed counts the records budgets
	// suppressed: a per-CPU array of one uint64.
	MapFlowBudget     = "fw_flow_budget"
	MapFlowSuppressed = "fw_flow_suppressed"
	// varFlowsOn is the program's constant that turns the flow records on, and
	// varFlowsWakeup the one that says how many bytes of records in the ring wake the
	// reader: a share of the ring (flowWakeupShare), below which it polls.
	varFlowsOn     = "fw_flows_on"
	varFlowsWakeup = "fw_flows_wakeup"
	// varFlowsActive is the program's constant of Capacities.FlowActive, in nanoseconds.
	varFlowsActive = "fw_flows_active_ns"
	// varFlowsEPCost and varFlowsEPBurst are the constants of an endpoint's budget of
	// flow records: nanoseconds of tokens a record costs, and the most it saves up.
	varFlowsEPCost  = "fw_flows_ep_cost_ns"
	varFlowsEPBurst = "fw_flows_ep_burst_ns"

	// ProgTraceTunnelOut and ProgTraceTunnelIn observe trace packets at a tunnel
	// device's tcx egress (before encapsulation) and ingress (after decapsulation);
	// ProgTraceGatewayIn and ProgTraceGatewayOut at a bridge's tcx ingress (up to the
	// host's routing) and egress (routed into the bridge's network). They never change a
	// packet's fate.
	ProgTraceTunnelOut  = "fw_trace_tunnel_out"
	ProgTraceTunnelIn   = "fw_trace_tunnel_in"
	ProgTraceGatewayIn  = "fw_trace_gateway_in"
	ProgTraceGatewayOut = "fw_trace_gateway_out"
	// ProgTraceInject is an XDP program that passes its packet: run with live frames, it
	// puts a trace packet into the stack as if an interface received it.
	ProgTraceInject = "fw_trace_inject"
	// MapTraceCtl holds, in its one entry, how many traces are installed and how many
	// of them are live: an array of one pair of uint32.
	MapTraceCtl = "fw_trace_ctl"
	// MapTraces holds the installed traces: a hash of uint32 trace ids to TraceEntry,
	// at most MaxTraces.
	MapTraces = "fw_traces"
	// MapTraceEvents is the ring buffer of trace events (TraceEvent).
	MapTraceEvents = "fw_trace_events"
	// MapTraceLost counts the trace events that found MapTraceEvents full: a per-CPU
	// array of one uint64.
	MapTraceLost = "fw_trace_lost"
	// MapTraceLive holds the live traces: a hash of their tuples (a CTKey of interface
	// 0) to their id and the stages that recorded a packet, at most MaxTraces.
	MapTraceLive = "fw_trace_live"
	// varTraceEnabled is the program's constant that, 0, leaves the trace checks out.
	varTraceEnabled = "fw_trace_enabled"
)

// Directions of a conntrack entry (CTValue.Dir), seen from the endpoint; the same values
// as firewall.DirIngress and firewall.DirEgress.
const (
	// DirIngress is traffic to the endpoint, seen by ProgEgress.
	DirIngress = 0
	// DirEgress is traffic from the endpoint, seen by ProgIngress.
	DirEgress = 1
)

// Flags of a conntrack entry (CTValue.Flags).
const (
	// CTClosing: a TCP FIN or RST was seen; the entry expires after
	// CTTimeoutTCPClosing.
	CTClosing = 1
	// CTReplied: a packet of the reply direction was seen.
	CTReplied = 2
)

// How long a conntrack entry lives without a packet, by protocol.
const (
	CTTimeoutTCP        = 3600 * time.Second
	CTTimeoutTCPClosing = 10 * time.Second
	CTTimeoutUDP        = 60 * time.Second
	CTTimeoutICMP       = 30 * time.Second // ICMP and ICMPv6
	CTTimeoutOther      = 60 * time.Second
)

// IP protocol numbers the timeouts depend on.
const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
)

// CTTimeout returns how long a conntrack entry of the family (4 or 6) and IP protocol,
// with the flags, lives without a packet.
func CTTimeout(family, proto, flags uint8) time.Duration {
	switch {
	case proto == protoTCP && flags&CTClosing != 0:
		return CTTimeoutTCPClosing
	case proto == protoTCP:
		return CTTimeoutTCP
	case proto == protoUDP:
		return CTTimeoutUDP
	case family == 4 && proto == protoICMP, family == 6 && proto == protoICMPv6:
		return CTTimeoutICMP
	default:
		return CTTimeoutOther
	}
}

// Indexes of the counters in MapStats.
const (
	// StatCTCreated counts the conntrack entries the program made.
	StatCTCreated = 0
	// StatCTDeleted counts the conntrack entries the program deleted because a new
	// snapshot denies their connection.
	StatCTDeleted = 1
	// StatNoSnapshotDrops counts the packets dropped because there was no snapshot or
	// their interface was not in it.
	StatNoSnapshotDrops = 2
	// StatSpoofedDrops counts the frames dropped because a guarded endpoint sent them
	// from an address that is not its own.
	StatSpoofedDrops = 3
	// StatFragUntrackedDrops counts the later fragments (offset > 0) dropped because
	// the first fragment of their datagram was not seen on their interface, or longer
	// than FragTimeout ago (its entry in MapFrag expired or was evicted).
	StatFragUntrackedDrops = 4
	// StatBadHeaderDrops counts the packets dropped for their headers: an IPv6
	// extension-header chain of more than IPv6ExtMax headers or IPv6ExtBytes bytes, two
	// fragment headers, a first fragment too short for its L4 header, a later fragment
	// that overlaps it (RFC 1858), neighbour discovery behind an extension header.
	StatBadHeaderDrops = 5
	// StatTraceStrayDrops counts the trace packets (TraceDSCP and the tag) of no
	// installed trace dropped before an endpoint received them: those that came before
	// their node installed the trace, or after it ended.
	StatTraceStrayDrops = 6
	// NumStats is the number of counters in MapStats.
	NumStats = 7
)

// Bounds of the IPv6 extension-header walk: a chain of more headers (hop-by-hop, routing,
// fragment, destination options, AH) or more bytes is dropped (StatBadHeaderDrops).
const (
	IPv6ExtMax   = 6
	IPv6ExtBytes = 512
)

// FragTimeout is how long the verdict of a datagram's first fragment is kept for its
// later fragments (an entry of MapFrag lives that long after the first fragment).
const FragTimeout = 3 * time.Second

// Verdicts a first fragment leaves for its later ones (FragValue.Verdict).
const (
	// FragPass: they pass (the first was control traffic or a related ICMP error).
	FragPass = 1
	// FragConn: they are packets of the first's connection, with its tuple.
	FragConn = 2
	// FragDrop: they are dropped, and count under the rule that denied the first.
	FragDrop = 3
)
