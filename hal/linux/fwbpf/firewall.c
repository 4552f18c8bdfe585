//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * The naples firewall: a stateful eBPF filter attached with tcx to the host-side
 * interface of every local endpoint. fw_ingress runs at the interface's tcx ingress hook,
 * on packets FROM the endpoint (its egress direction); fw_egress at the tcx egress hook,
 * on packets TO the endpoint (its ingress direction). Both share fw_handle.
 *
 * The design, the map layout and the per-packet algorithm are in docs/firewall.md; the Go
 * side is package fwbpf (doc.go) and package hal/firewall, which builds the snapshots.
 *
 * Headers: the uapi headers and libbpf's, no vmlinux.h; include/ supplies the <asm/...>
 * ones. <linux/icmp.h> is left out (it pulls in glibc's <sys/socket.h>, which does not
 * build for BPF), and TCP headers are read as struct fw_tcp_head, so the ICMPv4 types and
 * TCP flags are #defines of this file.
 *
 * Verifier notes: packets are read with bpf_skb_load_bytes into stack buffers (no direct
 * packet access, so no bounds proofs); every lookup key and value is a stack struct zeroed
 * whole first (padding included: the verifier wants initialised stack) and written with
 * aligned or byte-sized stores (stack accesses must be aligned, and the big-endian fields
 * of struct fw_key are not); the one loop is the IPv6 extension-header walk, bounded by
 * FW_IPV6_EXT_MAX. Everything is inlined into the two programs but fw_snap_lookup, a
 * static subprogram verified at each call; the policy check (fw_check) has two call
 * sites, fw_decide's and the trace path's (fw_trace_endpoint). fw_trace_match is inlined
 * too: as a subprogram its frame on top of fw_handle's (472 bytes) passed the 512 allowed.
 * On kernel 6.18 fw_egress takes about 108k verifier steps of the million allowed and
 * fw_ingress, which also runs the anti-spoofing checks (fw_spoofed), about
 * 119k (59k and 69k before traceflow: the trace path and the live-trace recording at the
 * end of every path roughly double them); the walk, run for the packet and for the one
 * an ICMP error embeds, multiplies the paths.
 */

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <linux/icmpv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* Return codes of a tcx program (enum tcx_action_base of linux/bpf.h, which older uapi
 * headers lack). An allowed packet gets FW_TCX_NEXT: the firewall has no objection, and
 * later programs of the hook still run. */
#define FW_TCX_NEXT -1
#define FW_TCX_PASS 0
#define FW_TCX_DROP 2

/* The tables of a snapshot: data[0] of a struct fw_key. */
#define FW_T_ENDPOINT 1
#define FW_T_IDENTITY 2
#define FW_T_POLICY 3
#define FW_T_SOURCE 4

/* Prefix lengths of the fixed parts of the snapshot keys, in bits. */
#define FW_ENDPOINT_PREFIXLEN 40 /* table, ifindex */
#define FW_IDENTITY_PREFIXLEN 48 /* table, scope, family; + address bits */
#define FW_POLICY_PREFIXLEN 88	 /* table, subject, dir, class, identity; + port bits */
#define FW_SOURCE_PREFIXLEN 48	 /* table, ifindex, family; + address bits */

/* Families of a source entry: the link layer (an Ethernet MAC), IPv4, IPv6. */
#define FW_SRC_MAC 0
#define FW_SRC_IPV4 4
#define FW_SRC_IPV6 6

/* Flags of an endpoint entry: the directions policies protect (1 << FW_DIR_*), and
 * whether what the endpoint sends must come from its own addresses (source entries). */
#define FW_EP_INGRESS 1
#define FW_EP_EGRESS 2
#define FW_EP_GUARD 4

/* Directions, seen from the endpoint. */
#define FW_DIR_INGRESS 0 /* to the endpoint: tcx egress */
#define FW_DIR_EGRESS 1	 /* from the endpoint: tcx ingress */

/* Protocol classes of a policy lookup. */
#define FW_CLASS_TCP 1
#define FW_CLASS_UDP 2
#define FW_CLASS_ICMP 3
#define FW_CLASS_OTHER 4

/* Verdicts of a policy entry. */
#define FW_ALLOW 1
#define FW_DENY 2

/* Identities: every peer (in policy keys), and the world (addresses no prefix covers). */
#define FW_ANY_IDENTITY 0xffffffff
#define FW_WORLD_IDENTITY 0

/* Flags of a conntrack entry. */
#define FW_CT_CLOSING 1 /* FIN or RST seen */
#define FW_CT_REPLIED 2 /* a reply was seen */

/* Conntrack timeouts, in seconds: an entry idle longer is expired. */
#define FW_CT_TIMEOUT_TCP 3600
#define FW_CT_TIMEOUT_TCP_CLOSING 10
#define FW_CT_TIMEOUT_UDP 60
#define FW_CT_TIMEOUT_ICMP 30
#define FW_CT_TIMEOUT_OTHER 60

/* Indexes of fw_stats. */
#define FW_STAT_CT_CREATED 0
#define FW_STAT_CT_DELETED 1
#define FW_STAT_NO_SNAPSHOT 2
#define FW_STAT_SPOOFED 3
#define FW_STAT_FRAG_UNTRACKED 4 /* later fragments whose first was not seen (or expired) */
#define FW_STAT_BAD_HEADERS 5	  /* see FW_PARSE_HOSTILE */
#define FW_STAT_TRACE_STRAY 6	  /* trace packets to an endpoint of no installed trace */
#define FW_STATS 7

/* Flow records (struct fw_flow), when the loader turned them on (fw_flows_on). */
#define FW_FLOW_NEW 1  /* a connection was allowed and is tracked from this packet on */
#define FW_FLOW_DENY 2 /* a packet was dropped, for reason */
#define FW_FLOW_END 3  /* a tracked connection ended, for reason (FW_END_*) */
#define FW_FLOW_ACTIVE 4 /* a tracked connection is active: fw_flows_active_ns since its last record */

/* Reasons of a FW_FLOW_DENY record. */
#define FW_REASON_POLICY 1    /* rule: the DENY rule, 0 when no rule allowed it */
#define FW_REASON_SPOOFED 2   /* not from the endpoint's own addresses; no tuple */
#define FW_REASON_MALFORMED 3 /* headers that cannot be read, or hostile ones */
#define FW_REASON_FRAGMENT 4  /* a later fragment whose first was not seen (or expired) */
#define FW_REASON_VLAN 5      /* VLAN-tagged, on an endpoint's untagged port; no tuple */

/* Reasons of a FW_FLOW_END record. */
#define FW_END_FIN 1  /* closed by both sides: the first packet after both FINs */
#define FW_END_RST 2  /* reset */
#define FW_END_IDLE 3 /* expired (no packet for its timeout); written by the agent's sweep, or
		       * here when a new connection takes the expired one's entry */

#define FW_FLOWS_BYTES (1 << 20)

/* Default capacities of the maps; the agent may change them before loading. */
#define FW_SNAPSHOT_ENTRIES 65536
#define FW_CT_ENTRIES 262144
#define FW_RULE_STATS_ENTRIES 65536
#define FW_EP_STATS_ENTRIES 16384
#define FW_FRAG_ENTRIES 8192

#define FW_NSEC_PER_SEC 1000000000ULL

/* Protocol numbers and header bits used below. */
#define FW_PROTO_ICMP 1
#define FW_PROTO_TCP 6
#define FW_PROTO_UDP 17
#define FW_PROTO_ICMPV6 58
#define FW_IP_OFFSET 0x1fff /* fragment offset bits of iphdr.frag_off */
#define FW_IP_MF 0x2000	    /* more fragments, in iphdr.frag_off */
#define FW_IP6_OFFSET 0xfff8 /* fragment offset bits of an IPv6 fragment header, in bytes */
#define FW_IP6_MF 1	     /* more fragments, in the same field */
#define FW_TCP_FIN 0x01
#define FW_TCP_RST 0x04
#define FW_ICMP_ECHOREPLY 0
#define FW_ICMP_DEST_UNREACH 3
#define FW_ICMP_ECHO 8
#define FW_ICMP_TIME_EXCEEDED 11
#define FW_ICMP_PARAMETERPROB 12
#define FW_ICMPV6_ND_FIRST 133 /* router solicitation */
#define FW_ICMPV6_ND_LAST 137  /* redirect */
#define FW_ICMPV6_MLD_FIRST 130 /* multicast listener query */
#define FW_ICMPV6_MLD_LAST 132  /* multicast listener done */
#define FW_ICMPV6_MLD_REPORT 131 /* MLDv1 report */
#define FW_ICMPV6_MLD_DONE 132
#define FW_ICMPV6_MLD2_REPORT 143
#define FW_IPPROTO_IGMP 2
#define FW_IPV6_HOPOPTS 0
#define FW_IPV6_ROUTING 43
#define FW_IPV6_FRAGMENT 44
#define FW_IPV6_AH 51
#define FW_IPV6_DSTOPTS 60
#define FW_ICMPV6_RS 133
#define FW_ICMPV6_NS 135
#define FW_ICMPV6_NA 136
#define FW_ND_OPT_SOURCE_LL 1
#define FW_ND_OPT_TARGET_LL 2
#define FW_ETH_P_ARP 0x0806
#define FW_DHCP_CLIENT_PORT 68
#define FW_DHCP_SERVER_PORT 67

/* The IPv6 extension headers fw_parse walks (hop-by-hop, routing, fragment, destination
 * options, AH) are bounded: a chain of more headers, or of more bytes, is hostile. */
#define FW_IPV6_EXT_MAX 6
#define FW_IPV6_EXT_BYTES 512

/* Results of fw_parse: a packet whose headers are malformed or truncated is denied; a
 * hostile one (an extension-header chain over the bounds, a first fragment too short
 * for its L4 header, a later fragment that overlaps it, two fragment headers) is denied
 * and counted in FW_STAT_BAD_HEADERS. */
#define FW_PARSE_OK 0
#define FW_PARSE_MALFORMED -1
#define FW_PARSE_HOSTILE -2

/* Kinds of packet, for fragment tracking (fw_l4.frag); an IPv6 atomic fragment (offset 0,
 * no more fragments) is no fragment. */
#define FW_FRAG_NONE 0
#define FW_FRAG_FIRST 1 /* offset 0, more fragments follow: it carries the L4 header */
#define FW_FRAG_LATER 2 /* offset > 0: no L4 header */

/* What a fragment entry gives its datagram's later fragments (fw_frag_value.verdict). */
#define FW_FRAG_PASS 1 /* pass: the first was control traffic or a related ICMP error */
#define FW_FRAG_CONN 2 /* the first's connection decides, as for a packet with its tuple */
#define FW_FRAG_DROP 3 /* drop: the first was denied */

/* How long a fragment entry lives after its first fragment, in seconds. */
#define FW_FRAG_TIMEOUT 3

/* fw_key is a key of a snapshot (an LPM trie): multi-byte fields of data are big-endian. */
struct fw_key {
	__u32 prefixlen;
	__u8 data[24];
};

/* fw_value is a value of a snapshot; which fields matter depends on the table. */
struct fw_value {
	__u32 id;      /* endpoint id; identity */
	__u32 subject; /* endpoint: its subject, 0 when unprotected */
	__u32 flags;   /* endpoint: FW_EP_INGRESS | FW_EP_EGRESS */
	__u32 gen;     /* endpoint: the snapshot's generation */
	__u32 scope;   /* endpoint: its tenant's scope */
	__u32 verdict; /* policy: FW_ALLOW or FW_DENY */
	__u64 rule;    /* policy: the rule that decides, 0 for none */
};

/* fw_ct_key is the interface and the tuple of a connection's first packet there. */
struct fw_ct_key {
	__u32 ifindex;
	__u8 family; /* 4 or 6 */
	__u8 proto;
	__u16 sport; /* network byte order */
	__u16 dport; /* network byte order */
	__u16 pad;
	__u8 saddr[16]; /* IPv4 in bytes 0-3 */
	__u8 daddr[16];
};

/* fw_ct_value is the state of a connection. Index 0 of packets and bytes counts the
 * packets from the connection's initiator (the key's direction), 1 those from the
 * responder; bytes are IP bytes (the IP header and what follows). Fields several CPUs
 * write at once are written with atomic operations. */
struct fw_ct_value {
	__u64 last_seen; /* bpf_ktime_get_ns() */
	__u64 rule;	 /* the rule that allowed the first packet */
	__u32 gen;	 /* the snapshot generation it was checked against */
	__u8 dir;	 /* FW_DIR_* of the first packet */
	__u8 flags;	 /* FW_CT_* */
	__u16 pad;
	__u32 fins;	 /* bit i: a FIN seen from side i (0 initiator, 1 responder) */
	__u32 ended;	 /* 1 once its FW_FLOW_END record is written */
	__u64 start;	 /* bpf_ktime_get_ns() of its first packet */
	__u64 reported;	 /* of its last FW_FLOW_NEW or FW_FLOW_ACTIVE record */
	__u64 packets[2];
	__u64 bytes[2];
};

/* fw_frag_key is a datagram being fragmented: the interface and direction that saw its
 * first fragment, and its (family, source, destination, identification, protocol). */
struct fw_frag_key {
	__u32 ifindex;
	__u32 id; /* IPv4: the identification, in the low bytes as in the packet; IPv6: the
		   * fragment header's */
	__u8 family;
	__u8 proto; /* IPv4: the protocol; IPv6: the fragment header's next header */
	__u8 dir;   /* FW_DIR_* */
	__u8 pad;
	__u8 saddr[16]; /* IPv4 in bytes 0-3 */
	__u8 daddr[16];
};

/* fw_frag_value is what the first fragment of a datagram left for the later ones. */
struct fw_frag_value {
	__u64 first_seen; /* bpf_ktime_get_ns() */
	__u64 rule;	  /* FW_FRAG_DROP: the rule that denied it, 0 for none */
	__u16 sport;	  /* the first fragment's tuple: ports (network byte order) */
	__u16 dport;
	__u16 l4_end; /* bytes of the fragmentable part up to the end of the L4 header */
	__u8 proto;   /* the L4 protocol */
	__u8 verdict; /* FW_FRAG_* */
};

/* fw_flow is one flow record in fw_flows: what happened (type, reason), when
 * (bpf_ktime_get_ns), to which packet (its interface, endpoint, direction, tuple and
 * length) and the rule that decided, 0 for none. A FW_FLOW_END record carries the
 * connection's original tuple and direction. */
struct fw_flow {
	__u64 time;
	__u64 rule;
	__u32 ifindex;
	__u32 ep;
	__u32 len;
	__u8 type;
	__u8 reason;
	__u8 dir;
	__u8 family; /* 4 or 6; 0 for a spoofed packet, whose tuple is not read */
	__u8 proto;
	__u8 pad;
	__u16 sport; /* network byte order */
	__u16 dport; /* network byte order */
	__u16 pad2;
	__u8 saddr[16]; /* IPv4 in bytes 0-3 */
	__u8 daddr[16];
	/* Of a connection's record (NEW, ACTIVE, END): its start and its counts, as
	 * fw_ct_value's, up to and including this packet. */
	__u64 start;
	__u64 packets[2];
	__u64 bytes[2];
};

/* fw_rule_counters is a value of fw_rule_stats, per CPU. */
struct fw_rule_counters {
	__u64 packets;
	__u64 bytes;
};

/* fw_ep_counters is a value of fw_ep_stats, per CPU. */
struct fw_ep_counters {
	__u64 allowed_packets;
	__u64 allowed_bytes;
	__u64 denied_packets;
	__u64 denied_bytes;
	__u64 spoofed_packets; /* dropped: not from the endpoint's own addresses */
	__u64 spoofed_bytes;
};

/* fw_snapshot is the template of the snapshots fw_snapshots points to. */
struct fw_snapshot {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, FW_SNAPSHOT_ENTRIES);
	__type(key, struct fw_key);
	__type(value, struct fw_value);
};

/* fw_snapshots holds, in slot 0, the current snapshot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct fw_snapshot);
} fw_snapshots SEC(".maps");

/* fw_ct_new is where a new connection's entry is made before it goes into fw_ct: it is
 * too large for the stack beside the rest. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fw_ct_value);
} fw_ct_new SEC(".maps");

/* fw_ct is the conntrack table. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FW_CT_ENTRIES);
	__type(key, struct fw_ct_key);
	__type(value, struct fw_ct_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_ct SEC(".maps");

/* fw_rule_stats counts the packets of each rule; the agent creates the entries. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, FW_RULE_STATS_ENTRIES);
	__type(key, __u64);
	__type(value, struct fw_rule_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_rule_stats SEC(".maps");

/* fw_ep_stats counts the packets of each local endpoint; the agent creates the entries. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, FW_EP_STATS_ENTRIES);
	__type(key, __u32);
	__type(value, struct fw_ep_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_ep_stats SEC(".maps");

/* fw_frag remembers, for a short time, the verdict and tuple of a datagram's first
 * fragment, for its later fragments. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, FW_FRAG_ENTRIES);
	__type(key, struct fw_frag_key);
	__type(value, struct fw_frag_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_frag SEC(".maps");

/* fw_stats holds the program's own counters, FW_STAT_*. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FW_STATS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_stats SEC(".maps");

/* fw_flows carries the flow records to the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FW_FLOWS_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_flows SEC(".maps");

/* fw_flow_type puts struct fw_flow into the object's BTF, for its Go binding: the
 * records themselves are written through a pointer bpf_ringbuf_reserve returns. */
const struct fw_flow *fw_flow_type __attribute__((unused));

/* fw_flow_bucket is an endpoint's budget of flow records on one CPU: a token bucket whose
 * tokens are nanoseconds, a record costing fw_flows_ep_cost_ns of them and the bucket
 * holding at most fw_flows_ep_burst_ns; and the records it suppressed. */
struct fw_flow_bucket {
	__u64 tokens;
	__u64 last; /* bpf_ktime_get_ns() of the last refill */
	__u64 suppressed;
};

/* fw_flow_budget holds the local endpoints' budgets of flow records, per CPU, made by the
 * program on an endpoint's first record; the loader sizes it as fw_ep_stats. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_PERCPU_HASH);
	__uint(max_entries, FW_EP_STATS_ENTRIES);
	__type(key, __u32);
	__type(value, struct fw_flow_bucket);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_flow_budget SEC(".maps");

/* fw_flow_suppressed counts, per CPU, the flow records an endpoint's budget suppressed. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_flow_suppressed SEC(".maps");

/* fw_flow_lost counts, per CPU, the flow records that found fw_flows full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_flow_lost SEC(".maps");

/* fw_flows_on is set by the loader: 0 writes no flow records. fw_flows_wakeup is how
 * many bytes of records wake the reader up: waking it for every record (the ring's
 * default once the reader has caught up) costs a record more than the rest of the
 * program's run, so the reader also polls. */
const volatile __u32 fw_flows_on = 0;
const volatile __u64 fw_flows_wakeup = 0;

/* fw_flows_active_ns is how long after its last record a connection that still sees
 * packets gets a FW_FLOW_ACTIVE record; 0 writes none. */
const volatile __u64 fw_flows_active_ns = 0;

/* fw_flows_ep_cost_ns and fw_flows_ep_burst_ns set each local endpoint's budget of flow
 * records per CPU (fw_flow_bucket): 1e9 / the records a second, and the most tokens it
 * saves up; 0 cost leaves records unbudgeted. */
const volatile __u64 fw_flows_ep_cost_ns = 0;
const volatile __u64 fw_flows_ep_burst_ns = 0;

/*
 * Traceflow. The agent injects a synthetic packet as if a workload sent it, tagged: its
 * DSCP is FW_TRACE_DSCP (43, 0x2b: no standard or common use) and its L4 payload starts
 * with struct fw_trace_tag, whose id names an installed trace (fw_traces) and whose nonce
 * is that trace's. Such a packet is checked against the policy but changes no state
 * (fw_trace_endpoint), and every hook that sees it writes a struct fw_trace_event to
 * fw_trace_events: the endpoint hooks and the observers (fw_trace_tunnel_*,
 * fw_trace_gateway_*). A tagged packet whose id or nonce matches no trace is ordinary
 * traffic.
 */
#define FW_TRACE_DSCP 0x2b
#define FW_TRACES 64
#define FW_TRACE_EVENTS_BYTES (64 * 1024)
#define FW_TRACE_MAGIC 0x525453454c50414eULL /* "NAPLESTR" read as a little-endian __u64 */

/* Verdicts of a trace event. */
#define FW_TRACE_ALLOWED 1   /* the policy let it through: it goes on */
#define FW_TRACE_DENIED 2    /* dropped, for reason (FW_REASON_POLICY, FW_REASON_SPOOFED) */
#define FW_TRACE_SEEN 3	     /* an observer saw it */
#define FW_TRACE_DELIVERED 4 /* the policy let it into the endpoint; dropped before it */

/* Stages of a trace event: where it was seen. */
#define FW_TRACE_FROM_ENDPOINT 1 /* tcx ingress of an endpoint's interface */
#define FW_TRACE_TO_ENDPOINT 2	 /* tcx egress of an endpoint's interface */
#define FW_TRACE_TUNNEL_OUT 3	 /* tcx egress of a tunnel device, before encapsulation */
#define FW_TRACE_TUNNEL_IN 4	 /* tcx ingress of a tunnel device, after decapsulation */
#define FW_TRACE_GATEWAY_IN 5	 /* tcx ingress of a bridge: up to the host's routing */
#define FW_TRACE_GATEWAY_OUT 6	 /* tcx egress of a bridge: routed into its network */

/* fw_trace_tag starts the L4 payload of a trace packet; id is big-endian, zero is 0. */
struct fw_trace_tag {
	__u8 magic[8];
	__be32 id;
	__u32 zero;
	__u64 nonce;
};

/* fw_trace_ctl holds how many traces are installed: 0 lets every packet skip the rest
 * of the recognition; and how many of them are live traces (fw_trace_live), 0 letting
 * every packet skip the tuple lookup. */
struct fw_trace_ctl {
	__u32 active; /* traces installed: fw_traces' entries and fw_trace_live's */
	__u32 live;   /* fw_trace_live's entries */
};

/* fw_trace is an installed trace: the nonce its packets carry. */
struct fw_trace {
	__u64 nonce;
	__u32 flags;
	__u32 pad;
};

/* fw_trace_event is what a hook saw of a trace packet. */
struct fw_trace_event {
	__u64 time; /* bpf_ktime_get_ns */
	__u64 rule; /* the deciding rule, 0 for none */
	__u32 id;
	__u32 ifindex;
	__u32 endpoint; /* the snapshot's endpoint id; 0 at observers */
	__u32 len;
	__u8 stage;   /* FW_TRACE_FROM_ENDPOINT... */
	__u8 verdict; /* FW_TRACE_ALLOWED... */
	__u8 reason;  /* DENIED: FW_REASON_* */
	__u8 live;    /* a real packet of a live trace (fw_trace_live) */
	__u8 smac[6];
	__u8 dmac[6];
};

/* fw_trace_ctl holds, in its one entry, how many traces are installed. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fw_trace_ctl);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_trace_ctl SEC(".maps");

/* fw_traces holds the installed traces by id. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FW_TRACES);
	__type(key, __u32);
	__type(value, struct fw_trace);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_traces SEC(".maps");

/* fw_trace_live_value is a live trace: its id, and the stages (bits 1 << FW_TRACE_*)
 * where a packet of its tuple was recorded already. */
struct fw_trace_live_value {
	__u32 id;
	__u32 seen;
};

/* fw_trace_live holds the live traces by tuple: a struct fw_ct_key whose ifindex is 0.
 * A real packet of the tuple is recorded once per stage, with the verdict the firewall
 * gave it, and otherwise treated as always. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FW_TRACES);
	__type(key, struct fw_ct_key);
	__type(value, struct fw_trace_live_value);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_trace_live SEC(".maps");

/* fw_trace_events carries the trace events to the agent. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FW_TRACE_EVENTS_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_trace_events SEC(".maps");

/* fw_trace_lost counts, per CPU, the trace events that found fw_trace_events full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} fw_trace_lost SEC(".maps");

/* fw_trace_event_type puts struct fw_trace_event into the object's BTF. */
const struct fw_trace_event *fw_trace_event_type __attribute__((unused));

/* fw_trace_enabled is set by the loader: 0 leaves every trace check out of the programs
 * (the verifier prunes them), the baseline of their cost. */
const volatile __u8 fw_trace_enabled = 1;

/* fw_ep is what a packet needs of its interface's endpoint entry. */
struct fw_ep {
	__u32 id;
	__u32 subject;
	__u32 flags;
	__u32 gen;
	__u32 scope;
};

/* fw_l4 is what the parser learnt of a packet besides its tuple. */
struct fw_l4 {
	__u32 off;	 /* offset of the L4 header */
	__u8 has_l4;	 /* the L4 header was read (not a non-first fragment) */
	__u8 tcp_flags;	 /* TCP: the flags byte */
	__u8 icmp_type;	 /* ICMP/ICMPv6: the type */
	__u8 frag;	 /* FW_FRAG_* */
	__u32 frag_id;	 /* a fragment's identification, as fw_frag_key.id */
	__u16 frag_off;	 /* FIRST: fw_frag_value.l4_end; LATER: its offset, in bytes */
	__u8 frag_proto; /* a fragment's fw_frag_key.proto */
	__u8 l4_hlen;	 /* TCP, UDP: the L4 header's length in bytes */
};

/* fw_ext_head is the start of an IPv6 extension header: a fragment header whole. */
struct fw_ext_head {
	__u8 nexthdr;
	__u8 len;     /* in 8-byte units after the first 8 (AH: 4-byte units after the first 8) */
	__be16 frag;  /* a fragment header's offset and M flag */
	__be32 id;    /* a fragment header's identification */
};

/* fw_verdict is the result of a policy check. */
struct fw_verdict {
	__u64 rule;
	__u32 verdict;
};

/* fw_tcp_head is the start of a TCP header, up to the flags. */
struct fw_tcp_head {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff;
	__u8 flags;
};

/* fw_icmp_head is an ICMP or ICMPv6 header. */
struct fw_icmp_head {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__be16 id;
	__be16 sequence;
};

/*
 * fw_snap_lookup looks a key up in a snapshot. It is the one function that is not inlined:
 * a real function's parameter and result types go into the object's BTF in full, which
 * gives the snapshot template's key and value their types (clang would emit the structs
 * it only sees through the template as forward declarations).
 */
static __noinline const struct fw_value *fw_snap_lookup(void *snap, const struct fw_key *key)
{
	return bpf_map_lookup_elem(snap, key);
}

static __always_inline void fw_stat(__u32 index)
{
	__u64 *c = bpf_map_lookup_elem(&fw_stats, &index);

	if (c)
		*c += 1;
}

static __always_inline void fw_count_rule(__u64 rule, __u32 len)
{
	struct fw_rule_counters *c;

	if (!rule)
		return;
	c = bpf_map_lookup_elem(&fw_rule_stats, &rule);
	if (c) {
		c->packets += 1;
		c->bytes += len;
	}
}

static __always_inline int fw_allow(__u32 ep_id, __u32 len)
{
	struct fw_ep_counters *c = bpf_map_lookup_elem(&fw_ep_stats, &ep_id);

	if (c) {
		c->allowed_packets += 1;
		c->allowed_bytes += len;
	}
	return FW_TCX_NEXT;
}

static __always_inline int fw_deny(__u32 ep_id, __u32 len)
{
	struct fw_ep_counters *c = bpf_map_lookup_elem(&fw_ep_stats, &ep_id);

	if (c) {
		c->denied_packets += 1;
		c->denied_bytes += len;
	}
	return FW_TCX_DROP;
}

static __always_inline int fw_spoofed_drop(__u32 ep_id, __u32 len)
{
	struct fw_ep_counters *c = bpf_map_lookup_elem(&fw_ep_stats, &ep_id);

	if (c) {
		c->spoofed_packets += 1;
		c->spoofed_bytes += len;
	}
	fw_stat(FW_STAT_SPOOFED);
	return FW_TCX_DROP;
}

/* fw_flow_budget_take takes a record's cost from the budget of the endpoint ep_id on this
 * CPU at now, and tells whether it could; a record it could not take is counted
 * suppressed, for the endpoint and in all. An endpoint's first record makes its bucket,
 * full. */
static __always_inline int fw_flow_budget_take(__u32 ep_id, __u64 now)
{
	struct fw_flow_bucket *b = bpf_map_lookup_elem(&fw_flow_budget, &ep_id);
	__u64 tokens;
	__u32 zero = 0;

	if (!b) {
		struct fw_flow_bucket nb = {.tokens = fw_flows_ep_burst_ns - fw_flows_ep_cost_ns, .last = now};

		bpf_map_update_elem(&fw_flow_budget, &ep_id, &nb, BPF_NOEXIST);
		return 1;
	}
	tokens = b->tokens;
	if (now > b->last)
		tokens += now - b->last;
	if (tokens > fw_flows_ep_burst_ns)
		tokens = fw_flows_ep_burst_ns;
	b->last = now;
	if (tokens < fw_flows_ep_cost_ns) {
		__u64 *c = bpf_map_lookup_elem(&fw_flow_suppressed, &zero);

		b->tokens = tokens;
		b->suppressed += 1;
		if (c)
			*c += 1;
		return 0;
	}
	b->tokens = tokens - fw_flows_ep_cost_ns;
	return 1;
}

/* fw_flow_emit writes a flow record of the packet with tuple t (NULL: none read) and, for
 * a connection's record, its conntrack entry c (NULL: none), or counts it lost when
 * fw_flows is full. */
static __always_inline void fw_flow_emit(__u8 type, __u8 reason, __u8 dir, __u32 ifindex,
					 const struct fw_ct_key *t, const struct fw_ct_value *c,
					 __u32 ep_id, __u64 rule, __u32 len)
{
	struct fw_flow *f;
	__u32 zero = 0;

	if (!fw_flows_on)
		return;
	if (fw_flows_ep_cost_ns && ep_id && !fw_flow_budget_take(ep_id, bpf_ktime_get_ns()))
		return;
	f = bpf_ringbuf_reserve(&fw_flows, sizeof(*f), 0);
	if (!f) {
		__u64 *c = bpf_map_lookup_elem(&fw_flow_lost, &zero);

		if (c)
			*c += 1;
		return;
	}
	__builtin_memset(f, 0, sizeof(*f));
	f->time = bpf_ktime_get_ns();
	f->rule = rule;
	f->ifindex = ifindex;
	f->ep = ep_id;
	f->len = len;
	f->type = type;
	f->reason = reason;
	f->dir = dir;
	if (t) {
		f->family = t->family;
		f->proto = t->proto;
		f->sport = t->sport;
		f->dport = t->dport;
		__builtin_memcpy(f->saddr, t->saddr, sizeof(f->saddr));
		__builtin_memcpy(f->daddr, t->daddr, sizeof(f->daddr));
	}
	if (c) {
		f->start = c->start;
		f->packets[0] = c->packets[0];
		f->packets[1] = c->packets[1];
		f->bytes[0] = c->bytes[0];
		f->bytes[1] = c->bytes[1];
	}
	bpf_ringbuf_submit(f, bpf_ringbuf_query(&fw_flows, BPF_RB_AVAIL_DATA) >= fw_flows_wakeup ? BPF_RB_FORCE_WAKEUP
											  : BPF_RB_NO_WAKEUP);
}

/* fw_put_be32 stores v big-endian at p, a byte at a time (p need not be aligned). */
static __always_inline void fw_put_be32(__u8 *p, __u32 v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

static __always_inline int fw_is_icmp(__u8 family, __u8 proto)
{
	return (family == 4 && proto == FW_PROTO_ICMP) || (family == 6 && proto == FW_PROTO_ICMPV6);
}

static __always_inline __u8 fw_class(__u8 family, __u8 proto)
{
	if (proto == FW_PROTO_TCP)
		return FW_CLASS_TCP;
	if (proto == FW_PROTO_UDP)
		return FW_CLASS_UDP;
	if (fw_is_icmp(family, proto))
		return FW_CLASS_ICMP;
	return FW_CLASS_OTHER;
}

/* fw_icmp_error tells whether an ICMP type is an error that embeds the packet it is about. */
static __always_inline int fw_icmp_error(__u8 family, __u8 type)
{
	if (family == 4)
		return type == FW_ICMP_DEST_UNREACH || type == FW_ICMP_TIME_EXCEEDED ||
		       type == FW_ICMP_PARAMETERPROB;
	return type >= ICMPV6_DEST_UNREACH && type <= ICMPV6_PARAMPROB;
}

/* fw_l4_min returns the bytes of the protocol's L4 header that the checks read, and that
 * a first fragment must hold whole (RFC 1858): TCP's 20, UDP's and ICMP's 8, none of other
 * protocols. */
static __always_inline __u32 fw_l4_min(__u8 family, __u8 proto)
{
	if (proto == FW_PROTO_TCP)
		return 20;
	if (proto == FW_PROTO_UDP || fw_is_icmp(family, proto))
		return 8;
	return 0;
}

/* fw_ipv6_ext tells whether the IPv6 next header is an extension header fw_parse walks. */
static __always_inline int fw_ipv6_ext(__u8 nh)
{
	return nh == FW_IPV6_HOPOPTS || nh == FW_IPV6_ROUTING || nh == FW_IPV6_FRAGMENT ||
	       nh == FW_IPV6_DSTOPTS || nh == FW_IPV6_AH;
}

/*
 * fw_parse reads the IP header of the family at off, IPv6's extension headers, and the L4
 * header, into the tuple k (whose other fields must be zero) and l4 (zeroed). inner is
 * set for the packet an ICMP error embeds, of which only 8 bytes of L4 header are
 * guaranteed, and whose fragments are not checked. A fragment's protocol is that of its
 * L4 header; a later fragment (offset > 0) has no ports. It returns FW_PARSE_OK,
 * FW_PARSE_MALFORMED when the packet is malformed or truncated, or FW_PARSE_HOSTILE.
 */
static __always_inline int fw_parse(struct __sk_buff *skb, __u32 off, __u8 family,
				    struct fw_ct_key *k, struct fw_l4 *l4, const int inner)
{
	__u32 l4off, end, fragpart = 0;
	__u16 fo = 0, more = 0;

	if (family == 4) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0)
			return FW_PARSE_MALFORMED;
		if (ip.version != 4 || ip.ihl < 5)
			return FW_PARSE_MALFORMED;
		k->family = 4;
		k->proto = ip.protocol;
		__builtin_memcpy(k->saddr, &ip.saddr, 4);
		__builtin_memcpy(k->daddr, &ip.daddr, 4);
		l4off = off + ip.ihl * 4;
		end = off + bpf_ntohs(ip.tot_len);
		fo = (bpf_ntohs(ip.frag_off) & FW_IP_OFFSET) * 8;
		more = ip.frag_off & bpf_htons(FW_IP_MF);
		l4->frag_id = ip.id;
		l4->frag_proto = ip.protocol;
		fragpart = l4off;
	} else {
		struct ipv6hdr ip6;
		__u8 nh;
		int i, frags = 0;

		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0)
			return FW_PARSE_MALFORMED;
		if (ip6.version != 6)
			return FW_PARSE_MALFORMED;
		k->family = 6;
		__builtin_memcpy(k->saddr, &ip6.saddr, 16);
		__builtin_memcpy(k->daddr, &ip6.daddr, 16);
		l4off = off + sizeof(ip6);
		end = l4off + bpf_ntohs(ip6.payload_len);
		nh = ip6.nexthdr;
		for (i = 0; i < FW_IPV6_EXT_MAX && fw_ipv6_ext(nh); i++) {
			struct fw_ext_head h;

			if (bpf_skb_load_bytes(skb, l4off, &h, sizeof(h)) < 0)
				return FW_PARSE_MALFORMED;
			if (nh == FW_IPV6_FRAGMENT) {
				if (frags++)
					return FW_PARSE_HOSTILE;
				fo = bpf_ntohs(h.frag) & FW_IP6_OFFSET;
				more = bpf_ntohs(h.frag) & FW_IP6_MF;
				l4->frag_id = h.id;
				l4->frag_proto = h.nexthdr;
				l4off += sizeof(h);
				fragpart = l4off;
			} else if (nh == FW_IPV6_AH) {
				l4off += (h.len + 2) * 4;
			} else {
				l4off += (h.len + 1) * 8;
			}
			nh = h.nexthdr;
			if (l4off - (off + sizeof(ip6)) > FW_IPV6_EXT_BYTES)
				return FW_PARSE_HOSTILE;
			if (fo)
				break; /* a later fragment: the headers after are in the first */
		}
		if (!fo && fw_ipv6_ext(nh))
			return FW_PARSE_HOSTILE; /* more headers than FW_IPV6_EXT_MAX */
		k->proto = nh;
	}
	l4->off = l4off;
	if (fo) {
		/* A later fragment: no L4 header, ports 0. */
		if (inner)
			return FW_PARSE_OK;
		l4->frag = FW_FRAG_LATER;
		l4->frag_off = fo;
		/* One that overlaps the L4 header (RFC 1858) is hostile. */
		if (fo < fw_l4_min(family, l4->frag_proto))
			return FW_PARSE_HOSTILE;
		return FW_PARSE_OK;
	}

	if (more && !inner) {
		/* A first fragment must hold the whole L4 header (RFC 1858, RFC 7112). */
		__u32 l4end = l4off + fw_l4_min(family, k->proto);

		if (l4end > end || l4end - fragpart > 0xffff)
			return FW_PARSE_HOSTILE;
		l4->frag = FW_FRAG_FIRST;
		l4->frag_off = l4end - fragpart;
	}
	if (k->proto == FW_PROTO_TCP) {
		struct fw_tcp_head th;

		if (inner) {
			if (bpf_skb_load_bytes(skb, l4off, &th, 8) < 0)
				return FW_PARSE_MALFORMED;
		} else {
			if (bpf_skb_load_bytes(skb, l4off, &th, sizeof(th)) < 0)
				return FW_PARSE_MALFORMED;
			l4->tcp_flags = th.flags;
		}
		k->sport = th.source;
		k->dport = th.dest;
		l4->l4_hlen = (th.doff >> 4) * 4;
		l4->has_l4 = 1;
	} else if (k->proto == FW_PROTO_UDP) {
		struct udphdr uh;

		if (bpf_skb_load_bytes(skb, l4off, &uh, sizeof(uh)) < 0)
			return FW_PARSE_MALFORMED;
		k->sport = uh.source;
		k->dport = uh.dest;
		l4->l4_hlen = sizeof(uh);
		l4->has_l4 = 1;
	} else if (fw_is_icmp(family, k->proto)) {
		struct fw_icmp_head ih;

		if (bpf_skb_load_bytes(skb, l4off, &ih, sizeof(ih)) < 0)
			return FW_PARSE_MALFORMED;
		l4->icmp_type = ih.type;
		l4->has_l4 = 1;
		if (ih.type == (family == 4 ? FW_ICMP_ECHO : ICMPV6_ECHO_REQUEST))
			k->sport = ih.id;
		else if (ih.type == (family == 4 ? FW_ICMP_ECHOREPLY : ICMPV6_ECHO_REPLY))
			k->dport = ih.id;
	}
	return FW_PARSE_OK;
}

/* fw_reverse writes into r the tuple of the other direction of k. */
static __always_inline void fw_reverse(const struct fw_ct_key *k, struct fw_ct_key *r)
{
	r->ifindex = k->ifindex;
	r->family = k->family;
	r->proto = k->proto;
	r->sport = k->dport;
	r->dport = k->sport;
	r->pad = 0;
	__builtin_memcpy(r->saddr, k->daddr, 16);
	__builtin_memcpy(r->daddr, k->saddr, 16);
}

/* fw_ct_timeout returns how long, in nanoseconds, an idle entry of the protocol lives. */
static __always_inline __u64 fw_ct_timeout(__u8 family, __u8 proto, __u8 flags)
{
	if (proto == FW_PROTO_TCP)
		return (flags & FW_CT_CLOSING ? FW_CT_TIMEOUT_TCP_CLOSING : FW_CT_TIMEOUT_TCP) *
		       FW_NSEC_PER_SEC;
	if (proto == FW_PROTO_UDP)
		return FW_CT_TIMEOUT_UDP * FW_NSEC_PER_SEC;
	if (fw_is_icmp(family, proto))
		return FW_CT_TIMEOUT_ICMP * FW_NSEC_PER_SEC;
	return FW_CT_TIMEOUT_OTHER * FW_NSEC_PER_SEC;
}

/*
 * fw_ct_lookup returns the live conntrack entry of k, NULL when there is none or it has
 * expired. An entry another CPU touched after now was read is live.
 */
static __always_inline struct fw_ct_value *fw_ct_lookup(const struct fw_ct_key *k, __u64 now)
{
	struct fw_ct_value *v = bpf_map_lookup_elem(&fw_ct, k);

	if (!v)
		return NULL;
	if (now > v->last_seen && now - v->last_seen > fw_ct_timeout(k->family, k->proto, v->flags))
		return NULL;
	return v;
}

/* fw_ct_lookup_stale is fw_ct_lookup that also sets *stale to the entry of k when it
 * expired (NULL otherwise). */
static __always_inline struct fw_ct_value *fw_ct_lookup_stale(const struct fw_ct_key *k, __u64 now,
							      struct fw_ct_value **stale)
{
	struct fw_ct_value *v = bpf_map_lookup_elem(&fw_ct, k);

	*stale = NULL;
	if (!v)
		return NULL;
	if (now > v->last_seen && now - v->last_seen > fw_ct_timeout(k->family, k->proto, v->flags)) {
		*stale = v;
		return NULL;
	}
	return v;
}

/*
 * fw_check decides a connection's first packet (or re-checks a connection) against the
 * snapshot: dir is the direction of its first packet, peer the address of the other end,
 * class its protocol class and port its destination port (network byte order, 0 but for
 * TCP and UDP).
 */
static __always_inline void fw_check(void *snap, const struct fw_ep *ep, __u8 dir, __u8 family,
				     const __u8 *peer, __u8 class, __u16 port,
				     struct fw_verdict *v)
{
	const struct fw_value *id_entry, *p;
	__u32 p1_verdict = 0, p2_verdict = 0;
	__u64 p1_rule = 0, p2_rule = 0;
	struct fw_key k;
	__u32 identity = FW_WORLD_IDENTITY;

	v->verdict = FW_ALLOW;
	v->rule = 0;
	if (!(ep->flags & (1U << dir)))
		return;

	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = FW_IDENTITY_PREFIXLEN + (family == 4 ? 32 : 128);
	k.data[0] = FW_T_IDENTITY;
	fw_put_be32(&k.data[1], ep->scope);
	k.data[5] = family;
	__builtin_memcpy(&k.data[6], peer, 16);
	id_entry = fw_snap_lookup(snap, &k);
	if (id_entry)
		identity = id_entry->id;

	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = FW_POLICY_PREFIXLEN + 16;
	k.data[0] = FW_T_POLICY;
	fw_put_be32(&k.data[1], ep->subject);
	k.data[5] = dir;
	k.data[6] = class;
	fw_put_be32(&k.data[7], identity);
	__builtin_memcpy(&k.data[11], &port, 2);
	p = fw_snap_lookup(snap, &k);
	if (p) {
		p1_verdict = p->verdict;
		p1_rule = p->rule;
	}
	fw_put_be32(&k.data[7], FW_ANY_IDENTITY);
	p = fw_snap_lookup(snap, &k);
	if (p) {
		p2_verdict = p->verdict;
		p2_rule = p->rule;
	}

	if (p1_verdict == FW_DENY) {
		v->verdict = FW_DENY;
		v->rule = p1_rule;
	} else if (p2_verdict == FW_DENY) {
		v->verdict = FW_DENY;
		v->rule = p2_rule;
	} else if (p1_verdict == FW_ALLOW) {
		v->rule = p1_rule;
	} else if (p2_verdict == FW_ALLOW) {
		v->rule = p2_rule;
	} else {
		v->verdict = FW_DENY; /* a protected direction denies by default */
	}
}

/* fw_arp is an ARP packet for IPv4 over Ethernet. */
struct fw_arp {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[6];
	__u8 spa[4];
	__u8 tha[6];
	__u8 tpa[4];
};

/* fw_nd is the body of an ICMPv6 neighbour solicitation or advertisement, with the
 * first option. */
struct fw_nd {
	__u8 type;
	__u8 code;
	__u16 checksum;
	__u32 reserved;
	__u8 target[16];
	__u8 opt_type;
	__u8 opt_len; /* in units of 8 bytes */
	__u8 opt_mac[6];
};

/*
 * fw_source tells whether the endpoint on ifindex owns the address of the family
 * (FW_SRC_*), len bytes at addr: whether the snapshot holds its source entry.
 */
static __always_inline int fw_source(void *snap, __u32 ifindex, __u8 family, const __u8 *addr,
				     const int len)
{
	struct fw_key k;

	__builtin_memset(&k, 0, sizeof(k));
	k.prefixlen = FW_SOURCE_PREFIXLEN + len * 8;
	k.data[0] = FW_T_SOURCE;
	fw_put_be32(&k.data[1], ifindex);
	k.data[5] = family;
	__builtin_memcpy(&k.data[6], addr, len);
	return fw_snap_lookup(snap, &k) != NULL;
}

/* fw_mac_eq tells whether two MAC addresses are equal. */
static __always_inline int fw_mac_eq(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

/* fw_link_local tells whether an IPv6 address is link-local, fe80::/10. */
static __always_inline int fw_link_local(const __u8 *a)
{
	return a[0] == 0xfe && (a[1] & 0xc0) == 0x80;
}

/* fw_unspecified6 tells whether an IPv6 address is ::. */
static __always_inline int fw_unspecified6(const __u8 *a)
{
	__u64 hi, lo;

	__builtin_memcpy(&hi, a, 8);
	__builtin_memcpy(&lo, a + 8, 8);
	return (hi | lo) == 0;
}

/*
 * fw_spoofed tells whether a frame from a guarded endpoint (on skb->ifindex) does not
 * come from its own addresses: an Ethernet source other than its MAC; an IPv4 source
 * other than its addresses (but 0.0.0.0 for DHCP, UDP 68 to 67); an IPv6 source other
 * than its addresses and link-local ones (but :: for router and neighbour solicitation,
 * and for MLD reports and dones right behind one hop-by-hop header to ff02::/16); an ARP sender other than its MAC and addresses (0.0.0.0 for a probe); a
 * neighbour advertisement for a target not its own (or link-local); an NS or NA whose
 * first option gives a link-layer address other than its MAC. A frame too short to read
 * is left to the checks after (a malformed IP packet is dropped there).
 */
static __always_inline int fw_spoofed(struct __sk_buff *skb, void *snap, __u16 proto)
{
	struct ethhdr eth;
	__u32 ifindex = skb->ifindex;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0)
		return 0;
	if (!fw_source(snap, ifindex, FW_SRC_MAC, eth.h_source, 6))
		return 1;

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		struct udphdr uh;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return 0;
		if (ip.saddr == 0) {
			/* DHCP's discover and request come from 0.0.0.0. */
			if (ip.protocol != FW_PROTO_UDP || ip.ihl < 5 ||
			    bpf_skb_load_bytes(skb, ETH_HLEN + ip.ihl * 4, &uh, sizeof(uh)) < 0)
				return 1;
			return uh.source != bpf_htons(FW_DHCP_CLIENT_PORT) ||
			       uh.dest != bpf_htons(FW_DHCP_SERVER_PORT);
		}
		return !fw_source(snap, ifindex, FW_SRC_IPV4, (const __u8 *)&ip.saddr, 4);
	}

	if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		struct fw_nd nd;
		int has_nd = 0;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return 0;
		__builtin_memset(&nd, 0, sizeof(nd));
		if (ip6.nexthdr == FW_PROTO_ICMPV6 &&
		    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip6), &nd.type, 1) == 0 &&
		    (nd.type == FW_ICMPV6_NS || nd.type == FW_ICMPV6_NA)) {
			if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip6), &nd, sizeof(nd)) == 0)
				has_nd = 1;
			else if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip6), &nd, 24) == 0)
				has_nd = 2; /* no option */
		}
		if (fw_unspecified6(ip6.saddr.in6_u.u6_addr8)) {
			/* Before it has an address: DAD's solicitation, a router solicitation,
			 * and the MLD reports and dones that go with them: ICMPv6 right behind
			 * one hop-by-hop header, to ff02::/16. Nothing else comes from ::. */
			__u8 hbh[2], type;

			if (ip6.nexthdr == FW_PROTO_ICMPV6)
				return nd.type != FW_ICMPV6_NS && nd.type != FW_ICMPV6_RS;
			if (ip6.nexthdr != FW_IPV6_HOPOPTS || ip6.daddr.in6_u.u6_addr8[0] != 0xff ||
			    ip6.daddr.in6_u.u6_addr8[1] != 0x02)
				return 1;
			if (bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip6), hbh, sizeof(hbh)) < 0 ||
			    hbh[0] != FW_PROTO_ICMPV6 ||
			    bpf_skb_load_bytes(skb, ETH_HLEN + sizeof(ip6) + ((__u32)hbh[1] + 1) * 8, &type, 1) < 0)
				return 1;
			return type != FW_ICMPV6_MLD2_REPORT && type != FW_ICMPV6_MLD_REPORT &&
			       type != FW_ICMPV6_MLD_DONE;
		}
		if (!fw_link_local(ip6.saddr.in6_u.u6_addr8) &&
		    !fw_source(snap, ifindex, FW_SRC_IPV6, ip6.saddr.in6_u.u6_addr8, 16))
			return 1;
		if (has_nd && nd.type == FW_ICMPV6_NA && !fw_link_local(nd.target) &&
		    !fw_source(snap, ifindex, FW_SRC_IPV6, nd.target, 16))
			return 1;
		if (has_nd == 1 && (nd.type == FW_ICMPV6_NS || nd.type == FW_ICMPV6_NA) &&
		    (nd.opt_type == FW_ND_OPT_SOURCE_LL || nd.opt_type == FW_ND_OPT_TARGET_LL) &&
		    nd.opt_len == 1 && !fw_mac_eq(nd.opt_mac, eth.h_source))
			return 1;
		return 0;
	}

	if (proto == bpf_htons(FW_ETH_P_ARP)) {
		struct fw_arp arp;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &arp, sizeof(arp)) < 0)
			return 1;
		if (arp.htype != bpf_htons(1) || arp.ptype != bpf_htons(ETH_P_IP) || arp.hlen != 6 ||
		    arp.plen != 4)
			return 1;
		if (!fw_mac_eq(arp.sha, eth.h_source))
			return 1;
		if ((arp.spa[0] | arp.spa[1] | arp.spa[2] | arp.spa[3]) == 0)
			return 0; /* a probe (RFC 5227) */
		return !fw_source(snap, ifindex, FW_SRC_IPV4, arp.spa, 4);
	}
	return 0;
}

/*
 * fw_decide decides a parsed packet of the endpoint ep (t its tuple, l4 the rest), seen in
 * direction dir, counts it and returns its tcx verdict. It sets *pass (FW_FRAG_*) to
 * what the packet's later fragments get, were it a first fragment, and *deny_rule to the
 * rule that denied it.
 */
/* fw_ct_count counts a packet of len bytes (with its Ethernet header) into side i of the
 * connection c: a GSO packet stands for gso_segs packets on the wire, each with its own
 * IP and L4 headers. */
static __always_inline void fw_ct_count(struct fw_ct_value *c, const int i, struct __sk_buff *skb,
					const struct fw_l4 *l4, __u32 len)
{
	__u64 bytes = len - ETH_HLEN;
	__u32 segs = skb->gso_segs;

	if (segs > 1 && l4->off >= ETH_HLEN)
		bytes += (__u64)(segs - 1) * (l4->off - ETH_HLEN + l4->l4_hlen);
	else
		segs = 1;
	__sync_fetch_and_add(&c->packets[i], segs);
	__sync_fetch_and_add(&c->bytes[i], bytes);
}

/*
 * fw_ct_seen counts a packet from side i of the tracked connection c, whose original
 * tuple is orig, and writes the connection's record it calls for: FW_FLOW_END for a
 * reset, or for the first packet without FIN after both sides' FINs (the ACK of the
 * last); FW_FLOW_ACTIVE when fw_flows_active_ns passed since its last record. With flow
 * records off it does nothing: the counts are for the records.
 */
static __always_inline void fw_ct_seen(struct fw_ct_value *c, const int i, struct __sk_buff *skb,
				       const struct fw_ct_key *orig, const struct fw_l4 *l4,
				       __u32 ep_id, __u32 len, __u64 now)
{
	__u64 last;

	if (!fw_flows_on)
		return;
	fw_ct_count(c, i, skb, l4, len);
	if (orig->proto == FW_PROTO_TCP) {
		if (l4->tcp_flags & FW_TCP_RST) {
			if (__sync_lock_test_and_set(&c->ended, 1) == 0)
				fw_flow_emit(FW_FLOW_END, FW_END_RST, c->dir, orig->ifindex, orig, c, ep_id, c->rule, len);
			return;
		}
		if (l4->tcp_flags & FW_TCP_FIN) {
			if (!(c->fins & (1 << i)))
				__sync_fetch_and_or(&c->fins, 1 << i);
			return;
		}
		if (c->fins == 3) {
			if (__sync_lock_test_and_set(&c->ended, 1) == 0)
				fw_flow_emit(FW_FLOW_END, FW_END_FIN, c->dir, orig->ifindex, orig, c, ep_id, c->rule, len);
			return;
		}
	}
	last = c->reported;
	if (fw_flows_active_ns && now > last && now - last >= fw_flows_active_ns && !c->ended &&
	    __sync_val_compare_and_swap(&c->reported, last, now) == last)
		fw_flow_emit(FW_FLOW_ACTIVE, 0, c->dir, orig->ifindex, orig, c, ep_id, c->rule, len);
}

static __always_inline int fw_decide(struct __sk_buff *skb, void *snap, const struct fw_ep *ep,
				     const __u8 dir, __u8 family, struct fw_ct_key *t,
				     const struct fw_l4 *l4, __u32 len, __u8 *pass, __u64 *deny_rule)
{
	struct fw_ct_key rev;
	struct fw_ct_value *e, *r = NULL, *stale;
	struct fw_verdict v = {};
	__u8 class, closing = 0;
	__u64 now;

	/* The link's own control traffic passes, as ARP does: IGMP, and ICMPv6's neighbour
	 * discovery and MLD (which comes behind a hop-by-hop header). Neighbour discovery
	 * behind an extension header (RFC 6980 forbids fragments) is not read by the
	 * anti-spoofing checks, and is dropped. */
	*pass = FW_FRAG_PASS;
	if (family == 4 && t->proto == FW_IPPROTO_IGMP)
		return fw_allow(ep->id, len);
	if (fw_is_icmp(family, t->proto) && l4->has_l4) {
		if (family == 6 && l4->icmp_type >= FW_ICMPV6_ND_FIRST && l4->icmp_type <= FW_ICMPV6_ND_LAST) {
			if (l4->off != ETH_HLEN + sizeof(struct ipv6hdr)) {
				fw_stat(FW_STAT_BAD_HEADERS);
				*pass = FW_FRAG_DROP;
				return fw_deny(ep->id, len);
			}
			return fw_allow(ep->id, len);
		}
		if (family == 6 && ((l4->icmp_type >= FW_ICMPV6_MLD_FIRST && l4->icmp_type <= FW_ICMPV6_MLD_LAST) ||
				    l4->icmp_type == FW_ICMPV6_MLD2_REPORT))
			return fw_allow(ep->id, len);
		if (fw_icmp_error(family, l4->icmp_type)) {
			struct fw_ct_key in;
			struct fw_l4 in_l4 = {};

			/* The error is related when the packet it embeds belongs to a tracked
			 * connection, in either direction. */
			__builtin_memset(&in, 0, sizeof(in));
			in.ifindex = t->ifindex;
			if (fw_parse(skb, l4->off + sizeof(struct fw_icmp_head), family, &in, &in_l4,
				     1) == FW_PARSE_OK) {
				now = bpf_ktime_get_ns();
				if (fw_ct_lookup(&in, now))
					return fw_allow(ep->id, len);
				fw_reverse(&in, &rev);
				if (fw_ct_lookup(&rev, now))
					return fw_allow(ep->id, len);
			}
			/* Unrelated: checked like any ICMP packet. */
		}
	}
	*pass = FW_FRAG_CONN;

	class = fw_class(family, t->proto);
	if (t->proto == FW_PROTO_TCP && (l4->tcp_flags & (FW_TCP_FIN | FW_TCP_RST)))
		closing = FW_CT_CLOSING;
	now = bpf_ktime_get_ns();
	fw_reverse(t, &rev);
	e = fw_ct_lookup_stale(t, now, &stale);
	if (!e)
		r = fw_ct_lookup(&rev, now);

	/* Check the connection's first packet: this one when the connection is new, else
	 * its original direction when the snapshot changed since it was checked. */
	{
		const struct fw_ct_key *orig = t;
		__u8 cdir = dir;
		int need = 1;

		if (e) {
			cdir = e->dir == FW_DIR_EGRESS ? FW_DIR_EGRESS : FW_DIR_INGRESS;
			need = e->gen != ep->gen;
		} else if (r) {
			orig = &rev;
			cdir = r->dir == FW_DIR_EGRESS ? FW_DIR_EGRESS : FW_DIR_INGRESS;
			need = r->gen != ep->gen;
		}
		v.verdict = FW_ALLOW;
		if (need) {
			const __u8 *peer = cdir == FW_DIR_EGRESS ? orig->daddr : orig->saddr;
			__u16 port = class == FW_CLASS_TCP || class == FW_CLASS_UDP ? orig->dport : 0;

			fw_check(snap, ep, cdir, family, peer, class, port, &v);
		}
		if (v.verdict != FW_ALLOW) {
			if (e || r) {
				bpf_map_delete_elem(&fw_ct, orig);
				fw_stat(FW_STAT_CT_DELETED);
			}
			fw_count_rule(v.rule, len);
			*pass = FW_FRAG_DROP;
			*deny_rule = v.rule;
			fw_flow_emit(FW_FLOW_DENY, FW_REASON_POLICY, dir, t->ifindex, t, NULL, ep->id, v.rule, len);
			return fw_deny(ep->id, len);
		}
		if (need && (e || r)) {
			struct fw_ct_value *c = e ? e : r;

			c->gen = ep->gen;
			c->rule = v.rule;
		}
	}

	if (e) {
		e->last_seen = now;
		if (closing && !(e->flags & FW_CT_CLOSING))
			e->flags |= closing;
		fw_ct_seen(e, 0, skb, t, l4, ep->id, len, now);
		fw_count_rule(e->rule, len);
		return fw_allow(ep->id, len);
	}
	if (r) {
		r->last_seen = now;
		if ((r->flags & (FW_CT_REPLIED | closing)) != (FW_CT_REPLIED | closing))
			r->flags |= FW_CT_REPLIED | closing;
		fw_ct_seen(r, 1, skb, &rev, l4, ep->id, len, now);
		return fw_allow(ep->id, len);
	}

	{
		struct fw_ct_value *nv;
		__u32 zero = 0;

		/* An expired entry of this tuple that no record ended yet ends now. */
		if (stale && fw_flows_on && __sync_lock_test_and_set(&stale->ended, 1) == 0)
			fw_flow_emit(FW_FLOW_END, FW_END_IDLE, stale->dir, t->ifindex, t, stale, ep->id, stale->rule, len);
		nv = bpf_map_lookup_elem(&fw_ct_new, &zero);
		if (!nv)
			return fw_deny(ep->id, len);
		__builtin_memset(nv, 0, sizeof(*nv));
		nv->last_seen = now;
		nv->start = now;
		nv->reported = now;
		nv->rule = v.rule;
		nv->gen = ep->gen;
		nv->dir = dir;
		nv->flags = closing;
		if (fw_flows_on)
			fw_ct_count(nv, 0, skb, l4, len);
		if (bpf_map_update_elem(&fw_ct, t, nv, BPF_ANY) == 0) {
			fw_stat(FW_STAT_CT_CREATED);
			fw_flow_emit(FW_FLOW_NEW, 0, dir, t->ifindex, t, nv, ep->id, v.rule, len);
		}
	}
	fw_count_rule(v.rule, len);
	return fw_allow(ep->id, len);
}

/* fw_frag_key_of writes into fk the fragment key of the packet t, l4 seen in dir. */
static __always_inline void fw_frag_key_of(struct fw_frag_key *fk, const struct fw_ct_key *t,
					   const struct fw_l4 *l4, const __u8 dir)
{
	__builtin_memset(fk, 0, sizeof(*fk));
	fk->ifindex = t->ifindex;
	fk->id = l4->frag_id;
	fk->family = t->family;
	fk->proto = l4->frag_proto;
	fk->dir = dir;
	__builtin_memcpy(fk->saddr, t->saddr, 16);
	__builtin_memcpy(fk->daddr, t->daddr, 16);
}

/* fw_endpoint_of returns the snapshot's entry of the local endpoint of the interface,
 * NULL when it has none. */
static __always_inline const struct fw_value *fw_endpoint_of(void *snap, __u32 ifindex)
{
	struct fw_key lk;

	__builtin_memset(&lk, 0, sizeof(lk));
	lk.prefixlen = FW_ENDPOINT_PREFIXLEN;
	lk.data[0] = FW_T_ENDPOINT;
	fw_put_be32(&lk.data[1], ifindex);
	return fw_snap_lookup(snap, &lk);
}

/* fw_drop_tagged drops a VLAN-tagged frame seen in dir, counted and recorded (reason
 * FW_REASON_VLAN) as a local endpoint's when its interface is one's. */
static __always_inline int fw_drop_tagged(struct __sk_buff *skb, const __u8 dir)
{
	const struct fw_value *epv;
	__u32 zero = 0;
	void *snap = bpf_map_lookup_elem(&fw_snapshots, &zero);

	if (!snap)
		return FW_TCX_DROP;
	epv = fw_endpoint_of(snap, skb->ifindex);
	if (!epv)
		return FW_TCX_DROP;
	fw_flow_emit(FW_FLOW_DENY, FW_REASON_VLAN, dir, skb->ifindex, NULL, NULL, epv->id, 0, skb->len);
	return fw_deny(epv->id, skb->len);
}

#define FW_TRACING_ANY 1  /* some trace is installed */
#define FW_TRACING_LIVE 2 /* some live trace is installed */

/* fw_tracing tells whether any trace is installed, and any live trace (FW_TRACING_*):
 * one array lookup. */
static __always_inline int fw_tracing(void)
{
	__u32 zero = 0;
	struct fw_trace_ctl *ctl;

	if (!fw_trace_enabled)
		return 0;
	ctl = bpf_map_lookup_elem(&fw_trace_ctl, &zero);
	if (!ctl || !ctl->active)
		return 0;
	return ctl->live ? FW_TRACING_ANY | FW_TRACING_LIVE : FW_TRACING_ANY;
}

/*
 * fw_trace_match tells whether the IP packet (proto, the Ethernet type) of skb is a trace
 * packet of an installed trace, and writes its id: DSCP FW_TRACE_DSCP, not a later
 * fragment, TCP, UDP, ICMP or ICMPv6 right after the IP header (trace packets carry no
 * IPv6 extension header), and a tag whose id and nonce are an installed trace's
 * (FW_TRACE_MATCH); FW_TRACE_STRAY for a tagged packet of no installed trace, 0 for any
 * other.
 */
#define FW_TRACE_MATCH 1 /* fw_trace_match: the packet of an installed trace */
#define FW_TRACE_STRAY 2 /* fw_trace_match: tagged, but of no installed trace */
static __always_inline int fw_trace_match(struct __sk_buff *skb, __u16 proto, __u32 *id)
{
	struct fw_trace_tag tag;
	struct fw_trace *tr;
	__u32 l4off, hlen;
	__u8 l4proto, b;

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) < 0)
			return 0;
		if (ip.version != 4 || ip.ihl < 5 || (ip.tos >> 2) != FW_TRACE_DSCP ||
		    (ip.frag_off & bpf_htons(FW_IP_OFFSET)))
			return 0;
		l4off = ETH_HLEN + ip.ihl * 4;
		l4proto = ip.protocol;
		if (l4proto != FW_PROTO_TCP && l4proto != FW_PROTO_UDP && l4proto != FW_PROTO_ICMP)
			return 0;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;

		if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip6, sizeof(ip6)) < 0)
			return 0;
		if (ip6.version != 6 || (((ip6.priority << 4) | (ip6.flow_lbl[0] >> 4)) >> 2) != FW_TRACE_DSCP)
			return 0;
		l4off = ETH_HLEN + sizeof(ip6);
		l4proto = ip6.nexthdr;
		if (l4proto != FW_PROTO_TCP && l4proto != FW_PROTO_UDP && l4proto != FW_PROTO_ICMPV6)
			return 0;
	} else {
		return 0;
	}
	hlen = 8;
	if (l4proto == FW_PROTO_TCP) {
		if (bpf_skb_load_bytes(skb, l4off + 12, &b, 1) < 0)
			return 0;
		hlen = (b >> 4) * 4;
		if (hlen < 20)
			return 0;
	}
	if (bpf_skb_load_bytes(skb, l4off + hlen, &tag, sizeof(tag)) < 0)
		return 0;
	if (*(__u64 *)tag.magic != FW_TRACE_MAGIC || tag.zero != 0)
		return 0;
	*id = bpf_ntohl(tag.id);
	tr = bpf_map_lookup_elem(&fw_traces, id);
	return tr && tr->nonce == tag.nonce ? FW_TRACE_MATCH : FW_TRACE_STRAY;
}

/* fw_trace_emit writes a trace event of the packet of skb, a full ring counted in
 * fw_trace_lost. */
static __always_inline void fw_trace_emit(struct __sk_buff *skb, __u32 id, __u8 stage, __u8 verdict,
					  __u8 reason, __u64 rule, __u32 ep_id, __u8 live)
{
	struct fw_trace_event *ev;
	__u32 zero = 0;

	ev = bpf_ringbuf_reserve(&fw_trace_events, sizeof(*ev), 0);
	if (!ev) {
		__u64 *lost = bpf_map_lookup_elem(&fw_trace_lost, &zero);

		if (lost)
			*lost += 1;
		return;
	}
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->time = bpf_ktime_get_ns();
	ev->rule = rule;
	ev->id = id;
	ev->ifindex = skb->ifindex;
	ev->endpoint = ep_id;
	ev->len = skb->len;
	ev->stage = stage;
	ev->verdict = verdict;
	ev->reason = reason;
	ev->live = live;
	if (bpf_skb_load_bytes(skb, 0, ev->dmac, 6) < 0 || bpf_skb_load_bytes(skb, 6, ev->smac, 6) < 0) {
		bpf_ringbuf_discard(ev, 0);
		return;
	}
	bpf_ringbuf_submit(ev, 0);
}

/*
 * fw_trace_endpoint handles the trace packet id, of tuple t, at an endpoint hook of dir: checks it
 * against the policy as a new connection's first packet, changing no state (no
 * conntrack entry, flow record, counter or fragment), writes its event and returns its
 * fate: from the endpoint, dropped when denied, else on its way; to the endpoint, dropped
 * either way (DELIVERED when the policy let it in).
 */
static __always_inline int fw_trace_endpoint(struct __sk_buff *skb, void *snap, const struct fw_ep *ep,
					     const __u8 dir, __u8 family, const struct fw_ct_key *t, __u32 id)
{
	struct fw_verdict v;
	__u8 stage = dir == FW_DIR_EGRESS ? FW_TRACE_FROM_ENDPOINT : FW_TRACE_TO_ENDPOINT;
	__u8 class = fw_class(family, t->proto);

	fw_check(snap, ep, dir, family, dir == FW_DIR_EGRESS ? t->daddr : t->saddr, class,
		 class == FW_CLASS_TCP || class == FW_CLASS_UDP ? t->dport : 0, &v);
	if (v.verdict != FW_ALLOW) {
		fw_trace_emit(skb, id, stage, FW_TRACE_DENIED, FW_REASON_POLICY, v.rule, ep->id, 0);
		return FW_TCX_DROP;
	}
	if (dir == FW_DIR_EGRESS) {
		fw_trace_emit(skb, id, stage, FW_TRACE_ALLOWED, 0, v.rule, ep->id, 0);
		return FW_TCX_NEXT;
	}
	fw_trace_emit(skb, id, stage, FW_TRACE_DELIVERED, 0, v.rule, ep->id, 0);
	return FW_TCX_DROP;
}

/* fw_trace_live_seen records the packet of skb, whose tuple is k (its ifindex 0), at
 * stage when it belongs to a live trace that did not record this stage yet. */
static __always_inline void fw_trace_live_seen(struct __sk_buff *skb, const struct fw_ct_key *k, __u8 stage,
					       __u8 verdict, __u8 reason, __u64 rule, __u32 ep_id)
{
	struct fw_trace_live_value *lv = bpf_map_lookup_elem(&fw_trace_live, k);
	__u32 bit = 1U << stage;

	if (!lv || (__sync_fetch_and_or(&lv->seen, bit) & bit))
		return;
	fw_trace_emit(skb, lv->id, stage, verdict, reason, rule, ep_id, 1);
}

/* fw_trace_observe writes a SEEN event of stage when the packet of skb is a trace packet;
 * it never changes the packet's fate. */
static __always_inline int fw_trace_observe(struct __sk_buff *skb, __u8 stage)
{
	struct fw_ct_key k;
	struct fw_l4 l4 = {};
	__u16 proto;
	__u32 id = 0;
	int tracing = fw_tracing();

	if (!tracing || skb->vlan_present)
		return FW_TCX_NEXT;
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)) < 0)
		return FW_TCX_NEXT;
	if (proto != bpf_htons(ETH_P_IP) && proto != bpf_htons(ETH_P_IPV6))
		return FW_TCX_NEXT;
	if (fw_trace_match(skb, proto, &id) == FW_TRACE_MATCH) {
		fw_trace_emit(skb, id, stage, FW_TRACE_SEEN, 0, 0, 0, 0);
		return FW_TCX_NEXT;
	}
	if (!(tracing & FW_TRACING_LIVE))
		return FW_TCX_NEXT;
	__builtin_memset(&k, 0, sizeof(k));
	if (fw_parse(skb, ETH_HLEN, proto == bpf_htons(ETH_P_IP) ? 4 : 6, &k, &l4, 0) == FW_PARSE_OK &&
	    l4.frag != FW_FRAG_LATER)
		fw_trace_live_seen(skb, &k, stage, FW_TRACE_SEEN, 0, 0, 0);
	return FW_TCX_NEXT;
}

/* fw_handle filters one packet; dir is the direction of the hook (FW_DIR_*). */
static __always_inline int fw_handle(struct __sk_buff *skb, const __u8 dir)
{
	struct fw_ct_key t;
	struct fw_l4 l4 = {};
	const struct fw_value *epv;
	struct fw_ep ep;
	void *snap;
	__u32 zero = 0, len = skb->len;
	__u64 deny_rule = 0;
	__u16 proto;
	__u8 family, pass = FW_FRAG_CONN;
	__u32 trace_id = 0;
	int ret, trace = 0;

	/* An endpoint's interface is an untagged port: a VLAN tag, in the frame or taken
	 * out of it into the skb, would carry traffic past the checks below. */
	if (skb->vlan_present)
		return fw_drop_tagged(skb, dir);
	if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)) < 0)
		return FW_TCX_NEXT;
	if (proto == bpf_htons(ETH_P_IP))
		family = 4;
	else if (proto == bpf_htons(ETH_P_IPV6))
		family = 6;
	else if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD))
		return fw_drop_tagged(skb, dir);
	else if (dir == FW_DIR_INGRESS)
		return FW_TCX_NEXT; /* ARP and other frames to the endpoint */
	else
		family = 0; /* checked for spoofing only */

	/* Frames that are not IP (ARP) pass when nothing is known of their interface. */
	snap = bpf_map_lookup_elem(&fw_snapshots, &zero);
	if (!snap) {
		if (family == 0)
			return FW_TCX_NEXT;
		fw_stat(FW_STAT_NO_SNAPSHOT);
		return FW_TCX_DROP;
	}
	epv = fw_endpoint_of(snap, skb->ifindex);
	if (!epv) {
		if (family == 0)
			return FW_TCX_NEXT;
		fw_stat(FW_STAT_NO_SNAPSHOT);
		return FW_TCX_DROP;
	}
	ep.id = epv->id;
	ep.subject = epv->subject;
	ep.flags = epv->flags;
	ep.gen = epv->gen;
	ep.scope = epv->scope;

	/* A trace packet: checked, recorded and dropped or passed on, changing no state. */
	if (family != 0 && fw_tracing() && fw_trace_match(skb, proto, &trace_id) == FW_TRACE_MATCH)
		trace = 1;

	if (dir == FW_DIR_EGRESS && (ep.flags & FW_EP_GUARD) && fw_spoofed(skb, snap, proto)) {
		if (trace) {
			fw_trace_emit(skb, trace_id, FW_TRACE_FROM_ENDPOINT, FW_TRACE_DENIED, FW_REASON_SPOOFED, 0, ep.id, 0);
			return FW_TCX_DROP;
		}
		fw_flow_emit(FW_FLOW_DENY, FW_REASON_SPOOFED, dir, skb->ifindex, NULL, NULL, ep.id, 0, len);
		return fw_spoofed_drop(ep.id, len);
	}
	if (family == 0)
		return FW_TCX_NEXT;

	__builtin_memset(&t, 0, sizeof(t));
	t.ifindex = skb->ifindex;
	ret = fw_parse(skb, ETH_HLEN, family, &t, &l4, 0);
	if (trace) {
		if (ret == FW_PARSE_OK)
			return fw_trace_endpoint(skb, snap, &ep, dir, family, &t, trace_id);
		fw_trace_emit(skb, trace_id, dir == FW_DIR_EGRESS ? FW_TRACE_FROM_ENDPOINT : FW_TRACE_TO_ENDPOINT,
			      FW_TRACE_DENIED, FW_REASON_MALFORMED, 0, ep.id, 0);
		return FW_TCX_DROP;
	}
	if (ret != FW_PARSE_OK) {
		if (ret == FW_PARSE_HOSTILE)
			fw_stat(FW_STAT_BAD_HEADERS);
		fw_flow_emit(FW_FLOW_DENY, FW_REASON_MALFORMED, dir, skb->ifindex, &t, NULL, ep.id, 0, len);
		return fw_deny(ep.id, len);
	}

	/* A later fragment gets the verdict of its datagram's first, and its tuple. */
	if (l4.frag == FW_FRAG_LATER) {
		struct fw_frag_key fk;
		struct fw_frag_value *fv;
		__u64 now = bpf_ktime_get_ns();

		fw_frag_key_of(&fk, &t, &l4, dir);
		fv = bpf_map_lookup_elem(&fw_frag, &fk);
		if (!fv || (now > fv->first_seen &&
			    now - fv->first_seen > FW_FRAG_TIMEOUT * FW_NSEC_PER_SEC)) {
			fw_stat(FW_STAT_FRAG_UNTRACKED);
			fw_flow_emit(FW_FLOW_DENY, FW_REASON_FRAGMENT, dir, skb->ifindex, &t, NULL, ep.id, 0, len);
			return fw_deny(ep.id, len);
		}
		if (l4.frag_off < fv->l4_end) {
			fw_stat(FW_STAT_BAD_HEADERS); /* it overlaps the L4 header */
			fw_flow_emit(FW_FLOW_DENY, FW_REASON_MALFORMED, dir, skb->ifindex, &t, NULL, ep.id, 0, len);
			return fw_deny(ep.id, len);
		}
		if (fv->verdict == FW_FRAG_PASS)
			return fw_allow(ep.id, len);
		if (fv->verdict != FW_FRAG_CONN) {
			fw_count_rule(fv->rule, len);
			t.proto = fv->proto;
			t.sport = fv->sport;
			t.dport = fv->dport;
			fw_flow_emit(FW_FLOW_DENY, FW_REASON_POLICY, dir, skb->ifindex, &t, NULL, ep.id, fv->rule, len);
			return fw_deny(ep.id, len);
		}
		t.proto = fv->proto;
		t.sport = fv->sport;
		t.dport = fv->dport;
	}

	ret = fw_decide(skb, snap, &ep, dir, family, &t, &l4, len, &pass, &deny_rule);

	/* A first fragment leaves its verdict and tuple for the later ones. */
	if (l4.frag == FW_FRAG_FIRST) {
		struct fw_frag_key fk;
		struct fw_frag_value fv;

		fw_frag_key_of(&fk, &t, &l4, dir);
		__builtin_memset(&fv, 0, sizeof(fv));
		fv.first_seen = bpf_ktime_get_ns();
		fv.rule = deny_rule;
		fv.sport = t.sport;
		fv.dport = t.dport;
		fv.l4_end = l4.frag_off;
		fv.proto = t.proto;
		fv.verdict = pass;
		bpf_map_update_elem(&fw_frag, &fk, &fv, BPF_ANY);
	}

	/* A packet of a live trace is recorded with its verdict (its tuple's last use). The
	 * trace control is looked up again rather than kept from the start: a flag live
	 * across fw_decide multiplies the states the verifier walks past its limit. */
	if (fw_tracing() & FW_TRACING_LIVE) {
		__u8 stage = dir == FW_DIR_EGRESS ? FW_TRACE_FROM_ENDPOINT : FW_TRACE_TO_ENDPOINT;

		t.ifindex = 0;
		if (ret == FW_TCX_DROP)
			fw_trace_live_seen(skb, &t, stage, FW_TRACE_DENIED, FW_REASON_POLICY, deny_rule, ep.id);
		else
			fw_trace_live_seen(skb, &t, stage, dir == FW_DIR_EGRESS ? FW_TRACE_ALLOWED : FW_TRACE_DELIVERED, 0, 0,
					   ep.id);
	}
	return ret;
}

/* fw_ingress runs at the tcx ingress hook of an endpoint's interface: packets from it. */
SEC("tcx/ingress")
int fw_ingress(struct __sk_buff *skb)
{
	return fw_handle(skb, FW_DIR_EGRESS);
}

/*
 * fw_trace_stray tells whether the packet of skb carries a trace tag (DSCP FW_TRACE_DSCP
 * and the magic) but is no installed trace's packet: one that reaches a node before the
 * node installed its trace, or after it ended. Counted in FW_STAT_TRACE_STRAY, it is
 * dropped before an endpoint receives it: a workload never receives a trace packet.
 * fw_egress calls it for packets of the DSCP alone (fw_trace_dscp); a global function,
 * it is verified once, apart from fw_handle.
 */
__attribute__((noinline)) int fw_trace_stray(struct __sk_buff *skb)
{
	void *data, *end;
	struct fw_trace_tag *tag;
	struct fw_trace *tr;
	__u8 *ip, *l4, proto;
	__u32 id, hlen = 8;

	if (!skb)
		return 0;
	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	ip = data + ETH_HLEN;
	if ((void *)(ip + 40) > end)
		return 0;
	/* Everything is read in place: the stack is fw_egress's too. */
	if (((struct ethhdr *)data)->h_proto == bpf_htons(ETH_P_IP)) {
		if ((ip[1] >> 2) != FW_TRACE_DSCP || (ip[0] >> 4) != 4 || (ip[0] & 0x0f) < 5 ||
		    (((ip[6] << 8) | ip[7]) & FW_IP_OFFSET))
			return 0;
		proto = ip[9];
		if (proto != FW_PROTO_TCP && proto != FW_PROTO_UDP && proto != FW_PROTO_ICMP)
			return 0;
		l4 = ip + (ip[0] & 0x0f) * 4;
	} else if (((struct ethhdr *)data)->h_proto == bpf_htons(ETH_P_IPV6)) {
		if ((((ip[0] & 0x0f) << 2) | (ip[1] >> 6)) != FW_TRACE_DSCP || (ip[0] >> 4) != 6)
			return 0;
		proto = ip[6];
		if (proto != FW_PROTO_TCP && proto != FW_PROTO_UDP && proto != FW_PROTO_ICMPV6)
			return 0;
		l4 = ip + 40;
	} else {
		return 0;
	}
	if ((void *)(l4 + 20) > end)
		return 0;
	if (proto == FW_PROTO_TCP) {
		hlen = (l4[12] >> 4) * 4;
		if (hlen < 20)
			return 0;
	}
	tag = (struct fw_trace_tag *)(l4 + hlen);
	if ((void *)(tag + 1) > end)
		return 0;
	if (*(__u64 *)tag->magic != FW_TRACE_MAGIC || tag->zero != 0)
		return 0;
	id = bpf_ntohl(tag->id);
	tr = bpf_map_lookup_elem(&fw_traces, &id);
	if (tr && tr->nonce == tag->nonce)
		return 0; /* an installed trace's: fw_handle takes it */
	fw_stat(FW_STAT_TRACE_STRAY);
	return 1;
}

/* fw_trace_dscp tells whether the packet of skb is IP with DSCP FW_TRACE_DSCP, as a
 * trace packet: read in place, a few instructions for every packet to an endpoint. */
static __always_inline int fw_trace_dscp(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	__u8 *ip = data + ETH_HLEN;
	__u16 proto;

	if ((void *)(ip + 2) > end)
		return 0;
	proto = ((struct ethhdr *)data)->h_proto;
	if (proto == bpf_htons(ETH_P_IP))
		return (ip[1] >> 2) == FW_TRACE_DSCP;
	if (proto == bpf_htons(ETH_P_IPV6))
		return (((ip[0] & 0x0f) << 2) | (ip[1] >> 6)) == FW_TRACE_DSCP;
	return 0;
}

/* fw_egress runs at the tcx egress hook of an endpoint's interface: packets to it. */
SEC("tcx/egress")
int fw_egress(struct __sk_buff *skb)
{
	if (fw_trace_enabled && fw_trace_dscp(skb) && fw_trace_stray(skb))
		return FW_TCX_DROP;
	return fw_handle(skb, FW_DIR_INGRESS);
}

/* fw_trace_tunnel_out runs at the tcx egress hook of a tunnel device: trace packets
 * leaving the node, before encapsulation. */
SEC("tcx/egress")
int fw_trace_tunnel_out(struct __sk_buff *skb)
{
	return fw_trace_observe(skb, FW_TRACE_TUNNEL_OUT);
}

/* fw_trace_tunnel_in runs at the tcx ingress hook of a tunnel device: trace packets
 * coming into the node, decapsulated. */
SEC("tcx/ingress")
int fw_trace_tunnel_in(struct __sk_buff *skb)
{
	return fw_trace_observe(skb, FW_TRACE_TUNNEL_IN);
}

/* fw_trace_gateway_in runs at the tcx ingress hook of a bridge: trace packets going up
 * to the host's routing, the network's gateway. */
SEC("tcx/ingress")
int fw_trace_gateway_in(struct __sk_buff *skb)
{
	return fw_trace_observe(skb, FW_TRACE_GATEWAY_IN);
}

/* fw_trace_gateway_out runs at the tcx egress hook of a bridge: trace packets routed
 * into its network. */
SEC("tcx/egress")
int fw_trace_gateway_out(struct __sk_buff *skb)
{
	return fw_trace_observe(skb, FW_TRACE_GATEWAY_OUT);
}

/* fw_trace_inject only passes its packet on: run with BPF_PROG_RUN and
 * BPF_F_TEST_XDP_LIVE_FRAMES, it puts a trace packet into the stack as if the interface
 * had received it. */
SEC("xdp")
int fw_trace_inject(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char _license[] SEC("license") = "Dual BSD/GPL";
