package gwbpf

// The eBPF object and its Go bindings (gateway_bpfel.go, gateway_bpfel.o) are generated
// from gateway.c by bpf2go (`make bpf`, which puts the pinned bpf2go on PATH) and
// committed, so that building naples needs no clang. ../fwbpf/include holds the few
// <asm/...> headers the uapi headers want.
//go:generate bpf2go -target bpfel gateway gateway.c -- -I../fwbpf/include -Wall -Werror -mcpu=v3
