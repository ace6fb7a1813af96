/* Checkpoints in global coordinates (runtime/worker/ckpt.h): state written
 * under one plan's layout restores under any other's, every box equal to the
 * pattern; a corrupt or missing file, or one of format 1, another byte order
 * or an unknown checksum kind, is refused with a message; publishing keeps
 * the newest two; an unpublished one is never read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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
/* st: the persistent state of plan p. */
static void state_of(const nrs_spec_t *s, const nrs_plan_t *p, nrs_emu_state_t *st)
{
    char err[512];
    memset(st, 0, sizeof *st);
    if (nrs_emu_state_build(s, p, NRS_EMU_SEL_PERSISTENT, NULL, 0, st, err, sizeof err))
        fail_msg("state of a plan of %d GPUs: %s", p->total_gpus, err);
}

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
        state_of(&s, &a, &sa);
        state_of(&s, &b, &sb);
        snprintf(dir, sizeof dir, "%s/c%d", root, k);
        write_all(dir, 10, &sa);
        assert_int_equal(nrs_ckpt_latest(dir), -1); /* not published yet */
        assert_int_equal(nrs_ckpt_publish(dir, 10, &sa, err, sizeof err), 0);
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
    state_of(&s, &a, &sa);
    snprintf(dir, sizeof dir, "%s/p", root);
    for (long step = 5; step <= 15; step += 5) {
        write_all(dir, step, &sa);
        assert_int_equal(nrs_ckpt_publish(dir, step, &sa, err, sizeof err), 0);
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

/* fsync, as the library calls it, recorded: which files and directories
 * were made durable (by inode). */
static struct {
    dev_t dev;
    ino_t ino;
} synced[4096];
static int nsynced;

int fsync(int fd)
{
    struct stat sb;
    if (!fstat(fd, &sb) && nsynced < (int)(sizeof synced / sizeof synced[0])) {
        synced[nsynced].dev = sb.st_dev;
        synced[nsynced].ino = sb.st_ino;
        nsynced++;
    }
    return (int)syscall(SYS_fsync, fd);
}

static int was_synced(const char *path)
{
    struct stat sb;
    if (stat(path, &sb))
        return 0;
    for (int i = 0; i < nsynced; i++)
        if (synced[i].dev == sb.st_dev && synced[i].ino == sb.st_ino)
            return 1;
    return 0;
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static void build(nrs_spec_t *s, nrs_plan_t *p, nrs_emu_state_t *st, uint64_t seed, int gpus)
{
    tu_rng_t r = {seed};
    tu_spec(s, &r);
    tu_plan(s, &r, gpus, p);
    state_of(s, p, st);
}

/* A write that fails half-way (the file size limit: as ENOSPC would) leaves
 * no descriptor open and no .part file behind. */
static void test_write_failure_cleans_up(void **state)
{
    (void)state;
    nrs_spec_t s;
    nrs_plan_t a;
    nrs_emu_state_t sa;
    char err[512], dir[300], tmp[400];
    build(&s, &a, &sa, 42, 4);
    snprintf(dir, sizeof dir, "%s/f", root);
    int *idx = calloc(sa.nbuf + 1, sizeof(int));
    void **bytes = calloc(sa.nbuf + 1, sizeof(void *));
    for (size_t i = 0; i < sa.nbuf; i++) {
        idx[i] = (int)i;
        bytes[i] = calloc(1, (size_t)sa.buf[i].bytes + 1);
    }
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 40; /* the header fits, the payload does not */
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    int before = count_fds();
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = nrs_ckpt_write(dir, 7, &sa, idx, (int)sa.nbuf, bytes, err, sizeof err);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, was);
    assert_int_equal(rc, -1);
    assert_int_equal(count_fds(), before);
    snprintf(tmp, sizeof tmp, "%s/step-7.tmp", dir);
    DIR *d = opendir(tmp);
    struct dirent *e;
    assert_non_null(d);
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".part"))
            fail_msg("left behind: %s", e->d_name);
    closedir(d);
    for (size_t i = 0; i < sa.nbuf; i++)
        free(bytes[i]);
    free(bytes);
    free(idx);
    nrs_emu_state_free(&sa);
}

/* Every buffer of b restores to its pattern from DIR's checkpoint of step. */
static void check_all(const char *dir, long step, const nrs_emu_state_t *b)
{
    char err[512];
    nrs_ckpt_t *c;
    assert_int_equal(nrs_ckpt_open(&c, dir, step, err, sizeof err), 0);
    for (size_t i = 0; i < b->nbuf; i++) {
        const nrs_emu_buf_t *bb = &b->buf[i];
        unsigned char *got = malloc((size_t)bb->bytes + 1), *scratch = malloc((size_t)bb->bytes + 1);
        if (nrs_ckpt_fill(c, bb, got, err, sizeof err))
            fail_msg("buffer %zu: %s", i, err);
        assert_true(nrs_emu_checksum(got, (size_t)bb->bytes) == nrs_emu_pattern_checksum(bb, scratch));
        free(got);
        free(scratch);
    }
    nrs_ckpt_close(c);
}

/* An attempt at step 30 under one layout that never published (a rank died
 * half-way, or the job was requeued) leaves files in step-30.tmp; a later
 * checkpoint of step 30 under another layout must not publish them with
 * its own: the checkpoint restores. */
static void test_stale_attempt_not_published(void **state)
{
    (void)state;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_emu_state_t sa, sb;
    char err[512], dir[300], path[700];
    tu_rng_t r = {7};
    tu_spec(&s, &r);
    tu_plan(&s, &r, 8, &a);
    tu_plan(&s, &r, 3, &b);
    state_of(&s, &a, &sa);
    state_of(&s, &b, &sb);
    snprintf(dir, sizeof dir, "%s/s", root);
    write_all(dir, 20, &sb);
    assert_int_equal(nrs_ckpt_publish(dir, 20, &sb, err, sizeof err), 0);
    write_all(dir, 30, &sa); /* under layout a: never published */
    snprintf(path, sizeof path, "%s/step-30.tmp/m0-t0-k0-0_1_0_1.bin.1234.part", dir);
    FILE *f = fopen(path, "w"); /* and a dead writer's partial file */
    assert_non_null(f);
    fclose(f);
    write_all(dir, 30, &sb); /* step 30 again, under layout b */
    assert_int_equal(nrs_ckpt_publish(dir, 30, &sb, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_latest(dir), 30);
    check_all(dir, 30, &sb);
    check_all(dir, 30, &sa);
    snprintf(path, sizeof path, "%s/step-30/m0-t0-k0-0_1_0_1.bin.1234.part", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    nrs_emu_state_free(&sa);
    nrs_emu_state_free(&sb);
}

/* What publishing names is on disk first: every file, the step's directory,
 * LATEST and DIR are fsynced (the previous checkpoint is pruned next). */
static void test_published_is_durable(void **state)
{
    (void)state;
    nrs_spec_t s;
    nrs_plan_t a;
    nrs_emu_state_t sa;
    char err[512], dir[300], path[700];
    build(&s, &a, &sa, 42, 4);
    snprintf(dir, sizeof dir, "%s/d", root);
    nsynced = 0;
    write_all(dir, 5, &sa);
    assert_int_equal(nrs_ckpt_publish(dir, 5, &sa, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/step-5", dir);
    DIR *d = opendir(path);
    struct dirent *e;
    int files = 0;
    assert_non_null(d);
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/step-5/%s", dir, e->d_name);
        if (!was_synced(path))
            fail_msg("not fsynced: %s", path);
        files++;
    }
    closedir(d);
    assert_true(files > 0);
    snprintf(path, sizeof path, "%s/step-5", dir);
    assert_true(was_synced(path));
    snprintf(path, sizeof path, "%s/LATEST", dir);
    assert_true(was_synced(path));
    assert_true(was_synced(dir));
    nrs_emu_state_free(&sa);
}

/* A file whose name's box is not one (coordinates that overflow its width
 * and area: 2^64 bytes, 0 in int64) is not read as one: no crash. */
static void test_malformed_box_name(void **state)
{
    (void)state;
    nrs_spec_t s;
    nrs_plan_t a;
    nrs_emu_state_t sa;
    char err[512], dir[300], path[700];
    build(&s, &a, &sa, 42, 4);
    snprintf(dir, sizeof dir, "%s/m", root);
    write_all(dir, 5, &sa);
    assert_int_equal(nrs_ckpt_publish(dir, 5, &sa, err, sizeof err), 0);
    const nrs_emu_buf_t *w = NULL;
    for (size_t i = 0; i < sa.nbuf && !w; i++)
        if (nrs_ckpt_wanted(&sa, &sa.buf[i]) && sa.buf[i].esize == 4)
            w = &sa.buf[i];
    assert_non_null(w);
    /* rows and columns [-1, 2^31-1): 2^31 each, 2^62 elements, 2^64 bytes */
    snprintf(path, sizeof path, "%s/step-5/m%d-t%d-k%d-%d_%d_%d_%d.bin", dir, w->role, w->tensor,
             w->kind, -1, 2147483647, -1, 2147483647);
    unsigned char head[32] = "NRSCKPT2", z = 0;
    head[8] = 4;
    uint64_t sum = nrs_emu_checksum(&z, 0);
    for (int i = 0; i < 8; i++)
        head[24 + i] = (unsigned char)(sum >> (8 * i));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, sizeof head, f), sizeof head);
    fclose(f);
    nrs_ckpt_t *c;
    unsigned char *buf = malloc((size_t)w->bytes + 1);
    assert_int_equal(nrs_ckpt_open(&c, dir, 5, err, sizeof err), 0);
    /* not read as a box (no crash): the files as written restore it */
    if (nrs_ckpt_fill(c, w, buf, err, sizeof err))
        fail_msg("%s", err);
    nrs_ckpt_close(c);
    free(buf);
    nrs_emu_state_free(&sa);
}

/* A step-S already in DIR that LATEST does not name (a run before this one
 * got further; a publish that stopped before LATEST): publishing step S
 * again replaces it, not fails on it. */
static void test_republish_over_old_step(void **state)
{
    (void)state;
    nrs_spec_t s;
    nrs_plan_t a, b;
    nrs_emu_state_t sa, sb;
    char err[512], dir[300], path[700];
    tu_rng_t r = {11};
    tu_spec(&s, &r);
    tu_plan(&s, &r, 8, &a);
    tu_plan(&s, &r, 3, &b);
    state_of(&s, &a, &sa);
    state_of(&s, &b, &sb);
    snprintf(dir, sizeof dir, "%s/o", root);
    write_all(dir, 30, &sa); /* the earlier run, layout a */
    assert_int_equal(nrs_ckpt_publish(dir, 30, &sa, err, sizeof err), 0);
    write_all(dir, 20, &sb); /* this run, layout b */
    assert_int_equal(nrs_ckpt_publish(dir, 20, &sb, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_latest(dir), 20);
    write_all(dir, 30, &sb);
    if (nrs_ckpt_publish(dir, 30, &sb, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(nrs_ckpt_latest(dir), 30);
    check_all(dir, 30, &sb);
    snprintf(path, sizeof path, "%s/step-20", dir); /* the previous one stays */
    assert_int_equal(access(path, F_OK), 0);
    DIR *d = opendir(dir);
    struct dirent *e;
    assert_non_null(d);
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".old") || strstr(e->d_name, ".tmp"))
            fail_msg("left behind: %s", e->d_name);
    closedir(d);
    nrs_emu_state_free(&sa);
    nrs_emu_state_free(&sb);
}

/* Header byte 12 (the checksum kind) and 13 (the payload's byte order), as
 * ckpt.c writes them: XXH64, this host's order. */
enum { SUM_UNRECORDED, SUM_XXH64 };
enum { ORDER_UNRECORDED, ORDER_LITTLE, ORDER_BIG };
static int host_order(void)
{
    const uint16_t one = 1;
    return *(const unsigned char *)&one ? ORDER_LITTLE : ORDER_BIG;
}

/* FNV-1a, which builds without libxxhash once wrote (with byte 12 zero). */
static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* A file of the checkpoint with its header, box and payload, checksum sum of
 * the payload, kind and order in bytes 12 and 13, reserved in byte 14. */
static void plant_as(const char *path, const nrs_emu_buf_t *b, const nrs_emu_rect_t *box,
                     const unsigned char *payload, uint64_t sum, int kind, int order, int reserved)
{
    size_t n = (size_t)nrs_emu_rect_area(box) * b->esize;
    unsigned char head[32];
    memset(head, 0, sizeof head);
    memcpy(head, "NRSCKPT2", 8);
    head[8] = b->esize;
    head[12] = (unsigned char)kind;
    head[13] = (unsigned char)order;
    head[14] = (unsigned char)reserved;
    for (int i = 0; i < 8; i++) {
        head[16 + i] = (unsigned char)((uint64_t)n >> (8 * i));
        head[24 + i] = (unsigned char)(sum >> (8 * i));
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, sizeof head, f), sizeof head);
    assert_int_equal(fwrite(payload, 1, n, f), n);
    fclose(f);
}

/* What the library writes (the test plants files of its own). */
static void plant(const char *path, const nrs_emu_buf_t *b, const nrs_emu_rect_t *box,
                  const unsigned char *payload, int reserved)
{
    uint64_t sum = nrs_emu_checksum(payload, (size_t)nrs_emu_rect_area(box) * b->esize);
    plant_as(path, b, box, payload, sum, SUM_XXH64, host_order(), reserved);
}

/* Files that overlap inside a buffer (its first row planted under as many
 * names as it has rows, "m1-", "m01-", ..., its own file gone) add up to its
 * element count while every row but the first is never read: refused, not
 * restored with what the buffer held before. A header whose reserved bytes
 * are not zero is corrupt (the checksum covers only the payload). */
static void test_overlapping_files_refused(void **state)
{
    (void)state;
    nrs_spec_t s;
    nrs_plan_t a;
    nrs_emu_state_t sa;
    char err[512], dir[300], path[700], name[256], zeros[32];
    build(&s, &a, &sa, 42, 4);
    snprintf(dir, sizeof dir, "%s/v", root);
    write_all(dir, 5, &sa);
    assert_int_equal(nrs_ckpt_publish(dir, 5, &sa, err, sizeof err), 0);
    const nrs_emu_buf_t *w = NULL; /* a wanted buffer of few rows (2..20), full width */
    for (size_t i = 0; i < sa.nbuf; i++) {
        const nrs_emu_buf_t *b = &sa.buf[i];
        int rows = b->box.r1 - b->box.r0;
        if (nrs_ckpt_wanted(&sa, b) && b->kind != NRS_EMU_GRAD && rows >= 2 && rows <= 20 &&
            (!w || rows < w->box.r1 - w->box.r0))
            w = b;
    }
    assert_non_null(w);
    int rows = w->box.r1 - w->box.r0;
    unsigned char *full = malloc((size_t)w->bytes + 1), *got = malloc((size_t)w->bytes + 1);
    nrs_emu_pattern_fill(w, full);
    memset(zeros, '0', sizeof zeros);
    nrs_emu_rect_t row = w->box;
    row.r1 = row.r0 + 1;
    snprintf(path, sizeof path, "%s/step-5/m%d-t%d-k%d-%d_%d_%d_%d.bin", dir, w->role, w->tensor,
             w->kind, w->box.r0, w->box.r1, w->box.c0, w->box.c1);
    assert_int_equal(unlink(path), 0);
    for (int k = 1; k <= rows; k++) {
        snprintf(name, sizeof name, "m%.*s%d-t%d-k%d-%d_%d_%d_%d.bin", k - 1, zeros, w->role,
                 w->tensor, w->kind, row.r0, row.r1, row.c0, row.c1);
        snprintf(path, sizeof path, "%s/step-5/%s", dir, name);
        plant(path, w, &row, full, 0);
    }
    nrs_ckpt_t *c;
    assert_int_equal(nrs_ckpt_open(&c, dir, 5, err, sizeof err), 0);
    memset(got, 0, (size_t)w->bytes);
    assert_int_equal(nrs_ckpt_fill(c, w, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "overlap"));
    nrs_ckpt_close(c);
    for (int k = 2; k <= rows; k++) { /* one copy of the row is left: rows missing */
        snprintf(name, sizeof name, "m%.*s%d-t%d-k%d-%d_%d_%d_%d.bin", k - 1, zeros, w->role,
                 w->tensor, w->kind, row.r0, row.r1, row.c0, row.c1);
        snprintf(path, sizeof path, "%s/step-5/%s", dir, name);
        assert_int_equal(unlink(path), 0);
    }
    assert_int_equal(nrs_ckpt_open(&c, dir, 5, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_fill(c, w, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "elements of model"));
    nrs_ckpt_close(c);
    /* the whole box again, in a header with a reserved byte set */
    snprintf(name, sizeof name, "m%d-t%d-k%d-%d_%d_%d_%d.bin", w->role, w->tensor, w->kind, row.r0,
             row.r1, row.c0, row.c1);
    snprintf(path, sizeof path, "%s/step-5/%s", dir, name);
    assert_int_equal(unlink(path), 0);
    snprintf(path, sizeof path, "%s/step-5/m%d-t%d-k%d-%d_%d_%d_%d.bin", dir, w->role, w->tensor,
             w->kind, w->box.r0, w->box.r1, w->box.c0, w->box.c1);
    plant(path, w, &w->box, full, 1);
    assert_int_equal(nrs_ckpt_open(&c, dir, 5, err, sizeof err), 0);
    assert_int_equal(nrs_ckpt_fill(c, w, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "corrupt"));
    nrs_ckpt_close(c);
    plant(path, w, &w->box, full, 0); /* as written: restores */
    assert_int_equal(nrs_ckpt_open(&c, dir, 5, err, sizeof err), 0);
    if (nrs_ckpt_fill(c, w, got, err, sizeof err))
        fail_msg("%s", err);
    assert_memory_equal(got, full, (size_t)w->bytes);
    nrs_ckpt_close(c);
    free(full);
    free(got);
    nrs_emu_state_free(&sa);
}

/* Fill w from checkpoint step 5 of dir: 0 with got equal to full, or -1
 * with err. */
static int fill_one(const char *dir, const nrs_emu_buf_t *w, const unsigned char *full,
                    unsigned char *got, char *err, size_t errlen)
{
    nrs_ckpt_t *c;
    assert_int_equal(nrs_ckpt_open(&c, dir, 5, err, errlen), 0);
    memset(got, 0xa5, (size_t)w->bytes);
    int rc = nrs_ckpt_fill(c, w, got, err, errlen);
    nrs_ckpt_close(c);
    if (!rc)
        assert_memory_equal(got, full, (size_t)w->bytes);
    return rc;
}

/* The header records which checksum the writer used and its byte order, so
 * every build reads every build's files: one written before that was
 * recorded by a build without libxxhash (FNV-1a, byte 12 zero) restores, not
 * "corrupt"; an unknown checksum kind, or the other byte order (whose bytes
 * would pass the checksum and be wrong), is refused saying so. */
static void test_header_names_checksum_and_order(void **state)
{
    (void)state;
    nrs_spec_t s;
    nrs_plan_t a;
    nrs_emu_state_t sa;
    char err[512], dir[300], path[700];
    unsigned char head[32];
    build(&s, &a, &sa, 42, 4);
    snprintf(dir, sizeof dir, "%s/h", root);
    write_all(dir, 5, &sa);
    assert_int_equal(nrs_ckpt_publish(dir, 5, &sa, err, sizeof err), 0);
    const nrs_emu_buf_t *w = NULL;
    for (size_t i = 0; i < sa.nbuf && !w; i++)
        if (nrs_ckpt_wanted(&sa, &sa.buf[i]) && sa.buf[i].kind != NRS_EMU_GRAD)
            w = &sa.buf[i];
    assert_non_null(w);
    snprintf(path, sizeof path, "%s/step-5/m%d-t%d-k%d-%d_%d_%d_%d.bin", dir, w->role, w->tensor,
             w->kind, w->box.r0, w->box.r1, w->box.c0, w->box.c1);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fread(head, 1, sizeof head, f), sizeof head);
    fclose(f);
    assert_int_equal(head[12], SUM_XXH64);
    assert_int_equal(head[13], host_order());

    size_t n = (size_t)w->bytes;
    unsigned char *full = malloc(n + 1), *got = malloc(n + 1);
    nrs_emu_pattern_fill(w, full);
    uint64_t xxh = nrs_emu_checksum(full, n), fnv = fnv1a(full, n);
    assert_true(xxh != fnv);
    /* written before the kind was recorded: by an XXH64 build or an FNV-1a one */
    plant_as(path, w, &w->box, full, xxh, SUM_UNRECORDED, ORDER_UNRECORDED, 0);
    if (fill_one(dir, w, full, got, err, sizeof err))
        fail_msg("unrecorded XXH64: %s", err);
    plant_as(path, w, &w->box, full, fnv, SUM_UNRECORDED, ORDER_UNRECORDED, 0);
    if (fill_one(dir, w, full, got, err, sizeof err))
        fail_msg("unrecorded FNV-1a: %s", err);
    /* XXH64 recorded: an FNV-1a sum is a mismatch, a changed byte too */
    plant_as(path, w, &w->box, full, fnv, SUM_XXH64, host_order(), 0);
    assert_int_equal(fill_one(dir, w, full, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "corrupt"));
    full[n / 2] ^= 1;
    plant_as(path, w, &w->box, full, xxh, SUM_UNRECORDED, ORDER_UNRECORDED, 0);
    assert_int_equal(fill_one(dir, w, full, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "corrupt"));
    full[n / 2] ^= 1;
    plant_as(path, w, &w->box, full, xxh, 7, host_order(), 0);
    assert_int_equal(fill_one(dir, w, full, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "checksum kind 7, unknown to this version"));
    plant_as(path, w, &w->box, full, xxh, SUM_XXH64, ORDER_LITTLE + ORDER_BIG - host_order(), 0);
    assert_int_equal(fill_one(dir, w, full, got, err, sizeof err), -1);
    assert_non_null(strstr(err, host_order() == ORDER_LITTLE
                                    ? "written on a big-endian host, this one is little-endian"
                                    : "written on a little-endian host, this one is big-endian"));
    plant(path, w, &w->box, full, 0); /* as written: restores */
    if (fill_one(dir, w, full, got, err, sizeof err))
        fail_msg("%s", err);
    free(full);
    free(got);
    nrs_emu_state_free(&sa);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_restore_any_layout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals_and_pruning, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_failure_cleans_up, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_attempt_not_published, setup, teardown),
        cmocka_unit_test_setup_teardown(test_published_is_durable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_box_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_republish_over_old_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlapping_files_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_header_names_checksum_and_order, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
