/* Checkpoints in global coordinates (runtime/worker/ckpt.h): state written
 * under one plan's layout restores under any other's, every box equal to the
 * pattern; a corrupt or missing file, or one of format 1, is refused with a
 * message; publishing keeps the newest two; an unpublished one is never read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "emu/pattern.h"
#include "emu/testutil.h"
#include "worker/ckpt.h"

static char root[256];

static int setup(void **st)
{
    (void)st;
    snprintf(root, sizeof root, "%s/nrs-ckpt.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(root));
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    return system(cmd) == 0 ? 0 : -1;
}

/* Every buffer of st, filled with its pattern, as all ranks together would. */
static void write_all(const char *dir, long step, const nrs_emu_state_t *st)
{
    int *idx = calloc(st->nbuf + 1, sizeof(int));
    void **bytes = calloc(st->nbuf + 1, sizeof(void *));
    char err[512];
    for (size_t i = 0; i < st->nbuf; i++) {
        idx[i] = (int)i;
        bytes[i] = malloc((size_t)st->buf[i].bytes + 1);
        nrs_emu_pattern_fill(&st->buf[i], bytes[i]);
    }
    assert_int_equal(nrs_ckpt_write(dir, step, st, idx, (int)st->nbuf, bytes, err, sizeof err), 0);
    for (size_t i = 0; i < st->nbuf; i++)
        free(bytes[i]);
    free(bytes);
    free(idx);
}

static void test_restore_any_layout(void **st)
{
    (void)st;
    tu_rng_t r = {0x5eedc0ffeeULL};
    char err[512], dir[300];
    int cases = 0;
    for (int k = 0; k < 40; k++) {
        nrs_spec_t s;
        nrs_plan_t a, b;
        nrs_emu_state_t sa, sb;
        tu_spec(&s, &r);
        s.runtime.zero1 = tu_int(&r, 0, 1);
        int ga = tu_int(&r, 1, 12), gb = tu_int(&r, 1, 12);
        tu_plan(&s, &r, ga, &a);
        tu_plan(&s, &r, gb, &b);
        memset(&sa, 0, sizeof sa);
        memset(&sb, 0, sizeof sb);
        assert_int_equal(nrs_emu_state_build(&s, &a, NRS_EMU_SEL_PERSISTENT, NULL, 0, &sa, err, sizeof err), 0);
        assert_int_equal(nrs_emu_state_build(&s, &b, NRS_EMU_SEL_PERSISTENT, NULL, 0, &sb, err, sizeof err), 0);
        snprintf(dir, sizeof dir, "%s/c%d", root, k);
        write_all(dir, 10, &sa);
        assert_int_equal(nrs_ckpt_latest(dir), -1); /* not published yet */
        assert_int_equal(nrs_ckpt_publish(dir, 10, err, sizeof err), 0);
        assert_int_equal(nrs_ckpt_latest(dir), 10);
        nrs_ckpt_t *c;
        assert_int_equal(nrs_ckpt_open(&c, dir, 10, err, sizeof err), 0);
        for (size_t i = 0; i < sb.nbuf; i++) {
            const nrs_emu_buf_t *bb = &sb.buf[i];
            unsigned char *got = malloc((size_t)bb->bytes + 1), *scratch = malloc((size_t)bb->bytes + 1);
            memset(got, 0xa5, (size_t)bb->bytes);
            if (nrs_ckpt_fill(c, bb, got, err, sizeof err))
                fail_msg("case %d buffer %zu: %s", k, i, err);
            assert_true(nrs_emu_checksum(got, (size_t)bb->bytes) ==
                        nrs_emu_pattern_checksum(bb, scratch));
            free(got);
            free(scratch);
        }
        nrs_ckpt_close(c);
        nrs_emu_state_free(&sa);
        nrs_emu_state_free(&sb);
        cases++;
    }
    assert_int_equal(cases, 40);
}

static void test_refusals_and_pruning(void **st)
{
    (void)st;
    tu_rng_t r = {42};
    nrs_spec_t s;
    nrs_plan_t a;
    nrs_emu_state_t sa;
    char err[512], dir[300], path[700];
    tu_spec(&s, &r);
    tu_plan(&s, &r, 4, &a);
    memset(&sa, 0, sizeof sa);
    assert_int_equal(nrs_emu_state_build(&s, &a, NRS_EMU_SEL_PERSISTENT, NULL, 0, &sa, err, sizeof err), 0);
    snprintf(dir, sizeof dir, "%s/p", root);
    for (long step = 5; step <= 15; step += 5) {
        write_all(dir, step, &sa);
        assert_int_equal(nrs_ckpt_publish(dir, step, err, sizeof err), 0);
    }
    write_all(dir, 20, &sa); /* written, never published */
    assert_int_equal(nrs_ckpt_latest(dir), 15);
    snprintf(path, sizeof path, "%s/step-5", dir);
    assert_int_not_equal(access(path, F_OK), 0); /* only the newest two stay */
    snprintf(path, sizeof path, "%s/step-10", dir);
    assert_int_equal(access(path, F_OK), 0);
    /* the first buffer a checkpoint holds: corrupt one byte of it, then remove it */
    const nrs_emu_buf_t *w = NULL;
    for (size_t i = 0; i < sa.nbuf && !w; i++)
        if (nrs_ckpt_wanted(&sa, &sa.buf[i]) && sa.buf[i].bytes > 0)
            w = &sa.buf[i];
    assert_non_null(w);
    snprintf(path, sizeof path, "%s/step-15/m%d-t%d-k%d-%d_%d_%d_%d.bin", dir, w->role, w->tensor,
             w->kind, w->box.r0, w->box.r1, w->box.c0, w->box.c1);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 40, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 40, SEEK_SET);
    fputc(ch ^ 0xff, f);
    fclose(f);
    nrs_ckpt_t *c;
    unsigned char *buf = malloc((size_t)w->bytes + 1);
    assert_int_equal(nrs_ckpt_open(&c, dir, 15, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_fill(c, w, buf, err, sizeof err), -1);
    assert_non_null(strstr(err, "corrupt"));
    nrs_ckpt_close(c);
    unlink(path);
    assert_int_equal(nrs_ckpt_open(&c, dir, 15, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_fill(c, w, buf, err, sizeof err), -1);
    assert_non_null(strstr(err, "elements of model"));
    nrs_ckpt_close(c);
    /* a file of format 1 (one tensor per layer, before layers were stacked):
     * refused as such, not read as stacked tensors */
    snprintf(path, sizeof path, "%s/step-10/m%d-t%d-k%d-%d_%d_%d_%d.bin", dir, w->role,
             w->tensor, w->kind, w->box.r0, w->box.r1, w->box.c0, w->box.c1);
    f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fwrite("NRSCKPT1", 1, 8, f), 8);
    fclose(f);
    assert_int_equal(nrs_ckpt_open(&c, dir, 10, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_fill(c, w, buf, err, sizeof err), -1);
    assert_non_null(strstr(err, "format 1"));
    assert_non_null(strstr(err, "this version reads format 2"));
    nrs_ckpt_close(c);
    /* grads are not kept: zero */
    nrs_emu_buf_t g = *w;
    g.kind = NRS_EMU_GRAD;
    memset(buf, 1, (size_t)g.bytes);
    assert_int_equal(nrs_ckpt_open(&c, dir, 15, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_fill(c, &g, buf, err, sizeof err), 0);
    for (int64_t i = 0; i < g.bytes; i++)
        assert_int_equal(buf[i], 0);
    nrs_ckpt_close(c);
    assert_int_equal(nrs_ckpt_open(&c, dir, 99, err, sizeof err), -1);
    free(buf);
    nrs_emu_state_free(&sa);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restore_any_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals_and_pruning, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
