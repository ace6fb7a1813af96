/* runtime/worker/ckpt: checkpoints of the EMU state in global coordinates
 * (docs/worker-api.md §6). A checkpoint is a directory DIR/step-S of files,
 * one per box of (model, tensor, kind) the plan's source engine holds (the
 * trained stage of a model, else its first stage; one replica of what dp
 * replicates; grads are not kept: they are zero at a step boundary). Any
 * later plan's buffers are filled from it by intersecting boxes, whatever
 * the layout that wrote it. Ranks write their files into DIR/step-S.tmp;
 * once all have (the caller's barrier), one publishes it: rename to
 * DIR/step-S, DIR/LATEST names it, older ones but the previous are removed. */
#ifndef NRS_WORKER_CKPT_H
#define NRS_WORKER_CKPT_H

#include <stddef.h>

#include "emu/geometry.h"

/* Whether buffer b of st is written by the rank holding it. */
int nrs_ckpt_wanted(const nrs_emu_state_t *st, const nrs_emu_buf_t *b);

/* Write the bytes (host memory, b->bytes each) of the buffers idx[0..n) of
 * st that are wanted into DIR/step-S.tmp. 0, or -1 with err. */
int nrs_ckpt_write(const char *dir, long step, const nrs_emu_state_t *st, const int *idx, int n,
                   void *const *bytes, char *err, size_t errlen);
/* Publish DIR/step-S.tmp as DIR/step-S. st is the plan that wrote it: what
 * else is there (an earlier attempt's files at step S under another layout
 * that never published, a dead writer's .part) is removed first. */
int nrs_ckpt_publish(const char *dir, long step, const nrs_emu_state_t *st, char *err,
                     size_t errlen);
/* The newest published step, -1 if none. */
long nrs_ckpt_latest(const char *dir);

typedef struct nrs_ckpt nrs_ckpt_t;
int nrs_ckpt_open(nrs_ckpt_t **out, const char *dir, long step, char *err, size_t errlen);
/* Fill dst (b->bytes) with b's contents from the checkpoint (every file
 * read is checksummed); -1 with err naming what is missing or corrupt. */
int nrs_ckpt_fill(const nrs_ckpt_t *c, const nrs_emu_buf_t *b, void *dst, char *err,
                  size_t errlen);
long nrs_ckpt_step(const nrs_ckpt_t *c);
void nrs_ckpt_close(nrs_ckpt_t *c);

#endif
