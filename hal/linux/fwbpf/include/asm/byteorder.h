/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* See types.h: only the little-endian target (bpfel) is built. */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "firewall.c is built for bpfel only"
#endif
#include <linux/byteorder/little_endian.h>
