//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

// The generated bindings exist for little-endian machines only (bpf2go -target bpfel), and
// so does this file: the build constraint is theirs.

package fwbpf

import "github.com/cilium/ebpf"

// CTKey is a key of MapCT: the interface and the tuple of a connection's first packet
// there (struct fw_ct_key). Family is 4 or 6; an IPv4 address fills bytes 0-3 of Saddr
// and Daddr; Sport and Dport hold the bytes of the ports in network order (port 80 reads
// as 0x5000 on a little-endian machine; for ICMP echo, the request's id is Sport and the
// reply's Dport, 0 otherwise); Pad is zero.
type CTKey = firewallFwCtKey

// CTValue is a value of MapCT (struct fw_ct_value): when the connection last saw a packet
// (LastSeen, CLOCK_MONOTONIC nanoseconds, bpf_ktime_get_ns), the rule that allowed it,
// the snapshot generation it was checked against, the direction of its first packet
// (DirIngress or DirEgress) and its flags (CTClosing, CTReplied).
type CTValue = firewallFwCtValue

// FragKey is a key of MapFrag (struct fw_frag_key): the interface and direction
// (DirIngress, DirEgress) that saw a datagram's first fragment, its family (4 or 6),
// source and destination (IPv4 in bytes 0-3), its identification (IPv4's 16 bits, or
// IPv6's fragment header's 32, as the packet's bytes read on this machine) and its
// protocol (IPv6: the fragment header's next header).
type FragKey = firewallFwFragKey

// FragValue is a value of MapFrag (struct fw_frag_value): when the first fragment was
// seen (FirstSeen, as CTValue.LastSeen), what its later fragments get (Verdict,
// FragPass, FragConn or FragDrop, and the rule that denied it), its L4 protocol and
// ports (network order, as CTKey's), and how many bytes of the fragmentable part its L4
// header takes up (L4End: a later fragment with a smaller offset overlaps it).
type FragValue = firewallFwFragValue

// RuleStats is a rule's counter in MapRuleStats (struct fw_rule_counters): one CPU's,
// or, as Objects and Pinned return it, summed over CPUs. It counts the packets (and their
// bytes) of the connections the rule decided, in their original direction, and the
// packets a DENY rule dropped.
type RuleStats = firewallFwRuleCounters

// EndpointStats is a local endpoint's counter in MapEndpointStats (struct
// fw_ep_counters): one CPU's, or summed over CPUs: the packets (and bytes) to and from it
// that the firewall let through and dropped.
type EndpointStats = firewallFwEpCounters

// FlowBucket is an endpoint's budget of flow records on one CPU in MapFlowBudget (struct
// fw_flow_bucket): its tokens (nanoseconds), when it was last refilled, and the records it
// suppressed.
type FlowBucket = firewallFwFlowBucket

// LoadSpec returns the programs and maps of the firewall, as compiled into the package.
// Every map is pinned by name (ebpf.PinByName): loading it needs a pin path, or the
// pinning cleared.
func LoadSpec() (*ebpf.CollectionSpec, error) {
	return loadFirewall()
}

// CTExpired tells whether the conntrack entry k, v has expired at now (CLOCK_MONOTONIC
// nanoseconds, as bpf_ktime_get_ns): the program treats such an entry as absent. An
// entry that saw a packet after now is live.
func CTExpired(k *CTKey, v *CTValue, now uint64) bool {
	return now > v.LastSeen && now-v.LastSeen > uint64(CTTimeout(k.Family, k.Proto, v.Flags))
}
