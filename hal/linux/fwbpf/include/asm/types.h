/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * The <asm/...> headers the uapi headers firewall.c includes need. Debian keeps the real
 * ones in an architecture's directory (/usr/include/x86_64-linux-gnu/asm, ...), which a
 * BPF build should not depend on: these are the architecture-independent versions, for
 * a 64-bit little-endian target (bpfel).
 */
#include <asm-generic/types.h>
