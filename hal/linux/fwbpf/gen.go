package fwbpf

// The eBPF object and its Go bindings (firewall_bpfel.go, firewall_bpfel.o) are generated
// from firewall.c by bpf2go (`make bpf`, which puts the pinned bpf2go on PATH) and
// committed, so that building naples needs no clang. include/ holds the few <asm/...>
// headers the uapi headers want, architecture-independent, so that the object is the
// same whatever machine builds it. -mcpu=v3 (kernel 5.1 and later) lets clang use 32-bit
// jumps and ALU operations.
//go:generate bpf2go -target bpfel -type fw_key -type fw_value -type fw_ct_key -type fw_ct_value -type fw_rule_counters -type fw_ep_counters -type fw_frag_key -type fw_frag_value -type fw_flow -type fw_flow_bucket -type fw_trace -type fw_trace_event firewall firewall.c -- -I./include -Wall -Werror -mcpu=v3
