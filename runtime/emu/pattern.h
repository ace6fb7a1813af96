/* Deterministic contents of every element of every tensor (a function of
 * model role, tensor, kind and global coordinates) and shard checksums, so a
 * transition can be verified on real bytes. */
#ifndef NRS_EMU_PATTERN_H
#define NRS_EMU_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#include "emu/geometry.h"

/* Fill dst (b->bytes) with the contents buffer b must hold. Grads are zero:
 * transitions happen at step boundaries, where gradients are reset. */
void nrs_emu_pattern_fill(const nrs_emu_buf_t *b, void *dst);

/* XXH64 (seed 0, libxxhash's) of n bytes: the same sum in every build and
 * on every host (configure requires xxhash.h). */
uint64_t nrs_emu_checksum(const void *p, size_t n);

/* Checksum b's contents must have; scratch holds at least b->bytes. */
uint64_t nrs_emu_pattern_checksum(const nrs_emu_buf_t *b, void *scratch);

#endif
