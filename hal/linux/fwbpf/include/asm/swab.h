/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* See types.h. */
#include <asm-generic/swab.h>
