// Package fwbpf is the eBPF half of the naples firewall: the program that enforces
// SecurityGroups and NetworkSecurityPolicies on the host-side interface of every local
// endpoint, its maps, and the Go names and constants that go with them. The design, and
// the layout of every map, are in docs/firewall.md; package hal/firewall computes the
// snapshots the program reads.
//
// firewall.c holds two programs that share one function: fw_ingress (ProgIngress), for
// an interface's tcx ingress hook, sees the packets FROM the endpoint, its egress
// direction (DirEgress); fw_egress (ProgEgress), for the tcx egress hook, sees the packets
// TO it, its ingress direction (DirIngress). For every packet:
//
//   - Frames that are neither IPv4 nor IPv6 (ARP) to the endpoint pass: the program
//     returns TCX_NEXT.
//   - The program reads the current snapshot from slot 0 of fw_snapshots
//     (MapSnapshots), once, and looks the interface up in it. No snapshot, or an
//     interface the snapshot does not know, drops the packet (fail closed) and counts it
//     in fw_stats (StatNoSnapshotDrops); a frame that is not IP passes then.
//   - A frame from a guarded endpoint (firewall.FlagGuard, one with a MAC) that does not
//     come from its own MAC and addresses (the snapshot's source entries; see
//     docs/firewall.md, Anti-spoofing: Ethernet source, IPv4 and IPv6 source, ARP sender,
//     neighbour advertisement target) is dropped and counted as spoofed, in fw_ep_stats
//     and in fw_stats (StatSpoofedDrops). Other frames that are not IP then pass.
//   - A malformed or truncated packet (its IP header, or the TCP, UDP or ICMP header
//     after it) is dropped. IPv6 extension headers are walked (at most IPv6ExtMax
//     headers, IPv6ExtBytes bytes): the protocol after them is the packet's. A packet
//     with hostile headers (a chain over those bounds, two fragment headers, a first
//     fragment too short for its L4 header, a later fragment that overlaps it) is
//     dropped and counted (StatBadHeaderDrops).
//   - A later fragment (offset > 0) takes the verdict its datagram's first fragment left
//     in fw_frag (MapFrag) on the same interface, in the same direction, less than
//     FragTimeout before: it passes as a packet of the first's connection (its tuple),
//     or is dropped. Without one it is dropped and counted (StatFragUntrackedDrops).
//   - IGMP, MLD and ICMPv6 neighbour discovery (types 133-137) pass; neighbour discovery
//     behind an extension header is dropped (StatBadHeaderDrops).
//   - An ICMP error (destination unreachable, time exceeded, parameter problem, packet
//     too big) passes when the packet it embeds belongs to a connection fw_ct tracks.
//   - A packet of a tracked connection (fw_ct, MapCT, keyed by the interface and the
//     tuple of the connection's first packet there), in either direction, passes. When
//     the snapshot's generation changed since the connection was checked, the
//     connection is checked again, as its first packet was; if the snapshot denies it
//     now, its entry is deleted (StatCTDeleted) and the packet dropped.
//   - Any other packet starts a connection: it passes when the direction is unprotected,
//     or some ALLOW entry of the endpoint's subject covers its peer's identity (or any
//     peer), protocol class and destination port and no DENY entry does; then a
//     conntrack entry is made (StatCTCreated).
//   - A first fragment (offset 0, more to come) leaves its verdict and tuple in fw_frag
//     for the later ones.
//
// Allowed packets get TCX_NEXT, so that later programs of the hook still run; dropped
// ones TCX_DROP. Every packet of a known interface counts in fw_ep_stats
// (MapEndpointStats) under the endpoint's id, and the packets of a connection's original
// direction count in fw_rule_stats (MapRuleStats) under the rule that allowed it (a
// dropped packet under the DENY rule, if any). The agent creates the counters; the
// program only increments those that exist.
//
// Traceflow: a packet whose DSCP is TraceDSCP and whose L4 payload starts with the trace
// tag of an installed trace (StartTrace; TracePacket.Frame builds one) is a trace packet.
// After the checks above up to the anti-spoofing one (a spoofed trace packet is recorded
// denied), it is checked against the policy as a new connection's first packet, changes
// no state (no conntrack entry, flow record, counter or fragment entry) and writes a
// TraceEvent to fw_trace_events (MapTraceEvents): from the endpoint it is dropped when
// denied and passes on when allowed; to the endpoint it is dropped either way, delivered
// or denied, so that no workload receives it. The observers (ProgTraceTunnelOut and the
// rest, AttachTraceObserver) record the trace packets that pass a tunnel device or a
// bridge; InjectTrace puts one into the stack. A live trace (StartLiveTrace) records
// instead the first real packet of a tuple at each hook, with its real verdict, and
// changes nothing about it. With no trace installed, the cost to every other packet is
// two lookups of a one-entry array (BenchmarkTraceInactiveCost).
//
// Conntrack entries expire after CTTimeout of idleness (CTExpired): the program treats
// an expired entry as absent, and the agent's garbage collector deletes them, using the
// same rule.
//
// Every map is pinned by name (LIBBPF_PIN_BY_NAME), so a loader with a pin path reuses
// the maps a previous agent left: connections and counters survive a restart.
//
// The object is generated by bpf2go (`make bpf`) and committed with its Go bindings;
// LoadSpec returns its CollectionSpec.
package fwbpf
