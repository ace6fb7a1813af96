/* Element patterns and checksums (docs/transitions.md §4). */
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "emu/pattern.h"

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

void nrs_emu_pattern_fill(const nrs_emu_buf_t *b, void *dst)
{
    unsigned char *o = dst;
    uint64_t key = mix64(((uint64_t)(uint16_t)b->role << 48) ^ ((uint64_t)b->kind << 40) ^
                         (uint64_t)(uint32_t)b->tensor);
    int es = b->esize;

    if (b->kind == NRS_EMU_GRAD) {
        memset(dst, 0, (size_t)b->bytes);
        return;
    }
    for (int32_t r = b->box.r0; r < b->box.r1; r++)
        for (int32_t c = b->box.c0; c < b->box.c1; c++) {
            uint64_t v = mix64(key ^ ((uint64_t)(uint32_t)r << 32 | (uint32_t)c));
            memcpy(o, &v, (size_t)es); /* low bytes; the order only has to be stable */
            o += es;
        }
}

/* XXH64 with seed 0, libxxhash's, compiled in (XXH_INLINE_ALL: nothing to
 * link, the installed library needs no libxxhash at run time). The same in
 * every build: configure requires xxhash.h, since the ranks of a job compare
 * these sums in their votes and a checkpoint written by one build is read
 * by another (builds without libxxhash once summed with FNV-1a, and ranks
 * or checkpoints of the two could never agree). XXH64 reads its input as
 * little-endian words on every host. */
uint64_t nrs_emu_checksum(const void *p, size_t n)
{
    return XXH64(p, n, 0);
}

uint64_t nrs_emu_pattern_checksum(const nrs_emu_buf_t *b, void *scratch)
{
    nrs_emu_pattern_fill(b, scratch);
    return nrs_emu_checksum(scratch, (size_t)b->bytes);
}
