//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)

/*
 * The naples gateway marks: two tcx programs on every network's bridge that let the host
 * answer from the network's anycast gateway with the right tenant's routing.
 *
 * gw_ingress runs at the bridge's tcx ingress hook, which sees what the bridge passes up
 * into the host stack (frames to the gateway, and those the host routes on). It gives a
 * packet without a mark the mark gw_marks holds for the bridge (the tenant's table id):
 * the kernel reflects it onto its replies and errors (net.ipv4.fwmark_reflect and
 * friends), and a rule `fwmark MARK lookup TABLE` routes those in the tenant's table.
 * A packet that has a mark already keeps it.
 *
 * gw_egress runs at the bridge's tcx egress hook, after routing and after the forwarding
 * path's MTU check: it clears a mark of the naples range (GW_MARK_MASK, GW_MARK_BASE), so
 * that the mark never reaches the VXLAN device, whose outer route lookup would use it.
 *
 * Both return TCX_NEXT: later programs of the hook still run, and nothing is dropped.
 */

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* enum tcx_action_base of linux/bpf.h, which older uapi headers lack. */
#define GW_TCX_NEXT -1

/* The marks naples gives: GW_MARK_BASE plus 24 bits (the tenant table ids). */
#define GW_MARK_MASK 0xFF000000u
#define GW_MARK_BASE 0x6E000000u

/* gw_marks maps a bridge's interface index to the mark of its tenant. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 4096);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} gw_marks SEC(".maps");

SEC("tcx/ingress")
int gw_ingress(struct __sk_buff *skb)
{
	__u32 ifindex = skb->ifindex;
	__u32 *mark;

	if (skb->mark != 0)
		return GW_TCX_NEXT;
	mark = bpf_map_lookup_elem(&gw_marks, &ifindex);
	if (mark)
		skb->mark = *mark;
	return GW_TCX_NEXT;
}

SEC("tcx/egress")
int gw_egress(struct __sk_buff *skb)
{
	if ((skb->mark & GW_MARK_MASK) == GW_MARK_BASE)
		skb->mark = 0;
	return GW_TCX_NEXT;
}

char __license[] SEC("license") = "Dual BSD/GPL";
