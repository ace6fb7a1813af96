/* Checkpoints of the EMU state in global coordinates (ckpt.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emu/pattern.h"
#include "util/util.h"
#include "worker/ckpt.h"

/* Format 2: layer tensors stacked (runtime/emu/geometry.h). Format 1 had one
 * tensor per layer: its ids and boxes mean other things, so it is refused. */
#define CK_MAGIC "NRSCKPT2"
#define CK_MAGIC_V1 "NRSCKPT1"
/* The header: magic[8], u8 esize, u8 0 [3], u8 checksum, u8 byte order,
 * u8 0 [2], u64 bytes, u64 checksum of the payload; integers little-endian. */
enum { CK_HEAD = 32 };
/* Which checksum (byte 12). Files written before it was recorded hold 0 and
 * an XXH64, or an FNV-1a where that build lacked libxxhash. */
enum { CK_SUM_UNRECORDED, CK_SUM_XXH64 };
/* The byte order of the payload, as the writer held it (byte 13): a restore
 * copies bytes, and the other order's would pass the checksum and be wrong. */
enum { CK_ORDER_UNRECORDED, CK_ORDER_LITTLE, CK_ORDER_BIG };

static int host_order(void)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return CK_ORDER_BIG;
#else
    return CK_ORDER_LITTLE;
#endif
}

typedef struct {
    int role, tensor, kind;
    nrs_emu_rect_t box;
    char name[96];
} ck_file_t;

struct nrs_ckpt {
    char dir[4096];
    long step;
    ck_file_t *f;
    size_t n;
};

static int source_engine(const nrs_emu_state_t *st, int role)
{
    int first = -1;
    for (int e = 0; e < st->nengines; e++)
        if (st->eng[e].role == role) {
            if (st->eng[e].trained)
                return e;
            if (first < 0)
                first = e;
        }
    return first;
}

int nrs_ckpt_wanted(const nrs_emu_state_t *st, const nrs_emu_buf_t *b)
{
    return b->kind != NRS_EMU_GRAD && b->engine == source_engine(st, b->role) &&
           (b->set < 0 || b->replica == 0);
}

static void file_name(char *buf, size_t n, int role, int tensor, int kind, const nrs_emu_rect_t *r)
{
    snprintf(buf, n, "m%d-t%d-k%d-%d_%d_%d_%d.bin", role, tensor, kind, r->r0, r->r1, r->c0,
             r->c1);
}

static void put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            if (!k)
                errno = EIO; /* no progress, and no errno to say why */
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* fsync of directory d: the names made in it are on disk (a file system
 * that cannot sync a directory says EINVAL: nothing to do there). */
static int sync_dir(const char *d)
{
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd), e = errno;
    close(fd);
    if (rc && (e == EINVAL || e == ENOTSUP))
        rc = 0;
    errno = e;
    return rc;
}

int nrs_ckpt_write(const char *dir, long step, const nrs_emu_state_t *st, const int *idx, int n,
                   void *const *bytes, char *err, size_t errlen)
{
    char tmp[4200], path[4400], part[4500], name[96];
    snprintf(tmp, sizeof tmp, "%s/step-%ld.tmp", dir, step);
    if ((mkdir(dir, 0755) && errno != EEXIST) || (mkdir(tmp, 0755) && errno != EEXIST)) {
        nrs_seterr(err, errlen, "checkpoint: mkdir %s: %s", tmp, strerror(errno));
        return -1;
    }
    for (int k = 0; k < n; k++) {
        const nrs_emu_buf_t *b = &st->buf[idx[k]];
        if (!nrs_ckpt_wanted(st, b))
            continue;
        unsigned char head[CK_HEAD];
        memset(head, 0, sizeof head);
        memcpy(head, CK_MAGIC, 8);
        head[8] = b->esize;
        head[12] = CK_SUM_XXH64;
        head[13] = (unsigned char)host_order();
        put64(head + 16, (uint64_t)b->bytes);
        put64(head + 24, nrs_emu_checksum(bytes[k], (size_t)b->bytes));
        file_name(name, sizeof name, b->role, b->tensor, b->kind, &b->box);
        snprintf(path, sizeof path, "%s/%s", tmp, name);
        snprintf(part, sizeof part, "%s.%d.part", path, (int)getpid());
        int fd = open(part, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), e = 0;
        if (fd < 0) {
            e = errno;
        } else {
            /* a failed write (ENOSPC, EIO) still closes and removes the part */
            if (write_all(fd, head, sizeof head) || write_all(fd, bytes[k], (size_t)b->bytes) ||
                fsync(fd)) /* on disk before it is named: a vote says it is there */
                e = errno;
            if (close(fd) && !e)
                e = errno;
            if (!e && rename(part, path))
                e = errno;
            if (e)
                unlink(part);
        }
        if (e) {
            nrs_seterr(err, errlen, "checkpoint: %s: %s", path, strerror(e));
            return -1;
        }
    }
    if (sync_dir(tmp)) { /* the names of this rank's files */
        nrs_seterr(err, errlen, "checkpoint: fsync %s: %s", tmp, strerror(errno));
        return -1;
    }
    return 0;
}

/* Files by (model, tensor, kind), then box: a buffer's candidates are one run. */
static int file_cmp(const void *x, const void *y)
{
    const ck_file_t *a = x, *b = y;
    const int ka[] = {a->role, a->tensor, a->kind, a->box.r0, a->box.c0, a->box.r1, a->box.c1};
    const int kb[] = {b->role, b->tensor, b->kind, b->box.r0, b->box.c0, b->box.r1, b->box.c1};
    for (size_t i = 0; i < sizeof ka / sizeof ka[0]; i++)
        if (ka[i] != kb[i])
            return ka[i] < kb[i] ? -1 : 1;
    return 0;
}

/* Name n as a checkpoint file's into f; 0 if it is not one. */
static int parse_name(const char *n, ck_file_t *f)
{
    int used = 0;
    return sscanf(n, "m%d-t%d-k%d-%d_%d_%d_%d.bin%n", &f->role, &f->tensor, &f->kind, &f->box.r0,
                  &f->box.r1, &f->box.c0, &f->box.c1, &used) == 7 &&
           n[used] == '\0' &&
           /* a box as written: not one whose width or area overflows */
           f->box.r0 >= 0 && f->box.r1 > f->box.r0 && f->box.c0 >= 0 && f->box.c1 > f->box.c0;
}

/* Remove from tmp whatever is not a file of st's checkpoint: files left by
 * an attempt at the same step that never published (another layout: their
 * boxes overlap ours and the checkpoint would not restore), stale parts. */
static int prune_strays(const char *tmp, const nrs_emu_state_t *st, char *err, size_t errlen)
{
    ck_file_t *want = calloc(st->nbuf + 1, sizeof(*want));
    size_t n = 0;
    if (!want) {
        nrs_seterr(err, errlen, "checkpoint: out of memory");
        return -1;
    }
    for (size_t i = 0; i < st->nbuf; i++) {
        const nrs_emu_buf_t *b = &st->buf[i];
        if (!nrs_ckpt_wanted(st, b))
            continue;
        want[n].role = b->role;
        want[n].tensor = b->tensor;
        want[n].kind = b->kind;
        want[n].box = b->box;
        n++;
    }
    qsort(want, n, sizeof(*want), file_cmp);
    DIR *dp = opendir(tmp);
    if (!dp) {
        nrs_seterr(err, errlen, "checkpoint: %s: %s", tmp, strerror(errno));
        free(want);
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(dp))) {
        ck_file_t f;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (!parse_name(e->d_name, &f) || !bsearch(&f, want, n, sizeof(*want), file_cmp))
            unlinkat(dirfd(dp), e->d_name, 0);
    }
    closedir(dp);
    free(want);
    return 0;
}

static int rm_tree(const char *d)
{
    DIR *dp = opendir(d);
    struct dirent *e;
    if (!dp)
        return -1;
    while ((e = readdir(dp)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            unlinkat(dirfd(dp), e->d_name, 0);
    closedir(dp);
    return rmdir(d);
}

int nrs_ckpt_publish(const char *dir, long step, const nrs_emu_state_t *st, char *err,
                     size_t errlen)
{
    char tmp[4200], fin[4200], latest[4200], ltmp[4200];
    long prev = nrs_ckpt_latest(dir);
    snprintf(tmp, sizeof tmp, "%s/step-%ld.tmp", dir, step);
    snprintf(fin, sizeof fin, "%s/step-%ld", dir, step);
    snprintf(latest, sizeof latest, "%s/LATEST", dir);
    snprintf(ltmp, sizeof ltmp, "%s/LATEST.%d.tmp", dir, (int)getpid());
    if (st && prune_strays(tmp, st, err, errlen))
        return -1;
    /* a step-S there already (a run before this one in DIR got further, or a
     * publish that stopped before LATEST): set aside, dropped once ours is in
     * (a directory is not renamed over one that is not empty) */
    char old[4300] = "";
    struct stat sb;
    if (!lstat(fin, &sb)) {
        snprintf(old, sizeof old, "%s/step-%ld.old.%d", dir, step, (int)getpid());
        if (rename(fin, old)) {
            nrs_seterr(err, errlen, "checkpoint: rename %s: %s", fin, strerror(errno));
            return -1;
        }
    }
    if (rename(tmp, fin)) {
        nrs_seterr(err, errlen, "checkpoint: rename %s: %s", tmp, strerror(errno));
        if (old[0])
            rename(old, fin);
        return -1;
    }
    /* LATEST and both renames on disk before an older checkpoint goes */
    FILE *f = fopen(ltmp, "w");
    int bad = !f || fprintf(f, "%ld\n", step) < 0 || fflush(f) || fsync(fileno(f)), le = errno;
    if (f && fclose(f) && !bad)
        bad = 1, le = errno;
    if (!bad && rename(ltmp, latest))
        bad = 1, le = errno;
    if (!bad && sync_dir(dir))
        bad = 1, le = errno;
    if (bad) {
        if (f)
            unlink(ltmp);
        nrs_seterr(err, errlen, "checkpoint: %s: %s", latest, strerror(le));
        return -1;
    }
    /* keep this one and the previous; drop older ones and stale partial ones */
    DIR *dp = opendir(dir);
    struct dirent *e;
    while (dp && (e = readdir(dp))) {
        long s;
        char rest[16] = "";
        if (sscanf(e->d_name, "step-%ld%15s", &s, rest) < 1 || s >= step)
            continue;
        if ((!rest[0] && s != prev) || !strcmp(rest, ".tmp") || !strncmp(rest, ".old.", 5)) {
            char p[4400];
            if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
                rm_tree(p);
        }
    }
    if (dp)
        closedir(dp);
    if (old[0])
        rm_tree(old);
    return 0;
}

long nrs_ckpt_latest(const char *dir)
{
    char p[4200];
    long s = -1;
    struct stat sb;
    snprintf(p, sizeof p, "%s/LATEST", dir);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    if (fscanf(f, "%ld", &s) != 1)
        s = -1;
    fclose(f);
    snprintf(p, sizeof p, "%s/step-%ld", dir, s);
    return s >= 0 && !stat(p, &sb) && S_ISDIR(sb.st_mode) ? s : -1;
}

/* The first file of (role, tensor, kind), or c->n. */
static size_t first_file(const nrs_ckpt_t *c, int role, int tensor, int kind)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const ck_file_t *f = &c->f[mid];
        int less = f->role != role ? f->role < role : f->tensor != tensor ? f->tensor < tensor
                                                                          : f->kind < kind;
        if (less)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int nrs_ckpt_open(nrs_ckpt_t **out, const char *dir, long step, char *err, size_t errlen)
{
    nrs_ckpt_t *c = calloc(1, sizeof(*c));
    size_t cap = 0;
    *out = NULL;
    if (!c) {
        nrs_seterr(err, errlen, "checkpoint: out of memory");
        return -1;
    }
    snprintf(c->dir, sizeof c->dir, "%s/step-%ld", dir, step);
    c->step = step;
    DIR *dp = opendir(c->dir);
    if (!dp) {
        nrs_seterr(err, errlen, "checkpoint: %s: %s", c->dir, strerror(errno));
        free(c);
        return -1;
    }
    struct dirent *e;
    while ((e = readdir(dp))) {
        ck_file_t f;
        if (!parse_name(e->d_name, &f))
            continue;
        if (c->n == cap) {
            cap = cap ? 2 * cap : 256;
            ck_file_t *nf = realloc(c->f, cap * sizeof(*nf));
            if (!nf) {
                closedir(dp);
                nrs_ckpt_close(c);
                nrs_seterr(err, errlen, "checkpoint: out of memory");
                return -1;
            }
            c->f = nf;
        }
        size_t nl = strlen(e->d_name);
        if (nl >= sizeof f.name)
            continue;
        memcpy(f.name, e->d_name, nl + 1);
        c->f[c->n++] = f;
    }
    closedir(dp);
    qsort(c->f, c->n, sizeof(*c->f), file_cmp); /* nrs_ckpt_fill searches by tensor */
    *out = c;
    return 0;
}

/* FNV-1a: what a build without libxxhash wrote before the checksum was
 * recorded (a file of CK_SUM_UNRECORDED). */
static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#define CK_CORRUPT "corrupt (header, size or checksum)"

/* Whether header head fits a file of want bytes of esize: 0, or -1 with
 * why[n] saying what is wrong. */
static int head_check(const unsigned char *head, int esize, int64_t want, char *why, size_t n)
{
    static const char *const order[] = {"", "little", "big"};
    if (!memcmp(head, CK_MAGIC_V1, 8))
        snprintf(why, n, "format 1 (one tensor per layer, written by an older Nereus): this "
                 "version reads format 2 (layers stacked)");
    else if (memcmp(head, CK_MAGIC, 8) || head[8] != esize || head[9] || head[10] || head[11] ||
             head[13] > CK_ORDER_BIG || head[14] || head[15] ||
             (int64_t)get64(head + 16) != want)
        snprintf(why, n, CK_CORRUPT);
    else if (head[12] > CK_SUM_XXH64)
        snprintf(why, n, "checksum kind %d, unknown to this version (written by a newer "
                 "Nereus?)", head[12]);
    else if (head[13] && head[13] != host_order())
        snprintf(why, n, "written on a %s-endian host, this one is %s-endian (a checkpoint "
                 "holds its writer's bytes)", order[head[13]], order[host_order()]);
    else
        return 0;
    return -1;
}

/* Whether payload d (n bytes) has the checksum its header names. */
static int sum_ok(const unsigned char *head, const unsigned char *d, size_t n)
{
    uint64_t want = get64(head + 24);
    return nrs_emu_checksum(d, n) == want ||
           (head[12] == CK_SUM_UNRECORDED && fnv1a(d, n) == want);
}

/* The payload of file f, checked (head_check, then the length and the
 * checksum: the checksum covers only the payload). */
static unsigned char *load(const nrs_ckpt_t *c, const ck_file_t *f, int esize, char *err,
                           size_t errlen)
{
    char p[4200], why[200] = CK_CORRUPT;
    unsigned char head[CK_HEAD];
    int64_t area = nrs_emu_rect_area(&f->box);
    int64_t want = esize > 0 && area <= (INT64_MAX - 1) / esize ? area * esize : -1;
    snprintf(p, sizeof p, "%s/%s", c->dir, f->name);
    FILE *fp = fopen(p, "rb");
    unsigned char *d = NULL;
    if (!fp)
        snprintf(why, sizeof why, "%s", strerror(errno));
    if (!fp || want < 0 || fread(head, 1, sizeof head, fp) != sizeof head ||
        head_check(head, esize, want, why, sizeof why) || !(d = malloc((size_t)want + 1)) ||
        fread(d, 1, (size_t)want, fp) != (size_t)want || fgetc(fp) != EOF ||
        !sum_ok(head, d, (size_t)want)) {
        nrs_seterr(err, errlen, "checkpoint: %s: %s", p, why);
        free(d);
        d = NULL;
    }
    if (fp)
        fclose(fp);
    return d;
}

/* Whether two of the files of b's run that meet b overlap there (files of
 * another layout left in, or one name written twice, e.g. "m01-" for "m1-"):
 * the elements counted would add up to b's while some are read twice and
 * others never. 1 with err naming them. */
static int overlap(const nrs_ckpt_t *c, size_t first, size_t end, const nrs_emu_buf_t *b,
                   char *err, size_t errlen)
{
    for (size_t i = first; i < end; i++) {
        nrs_emu_rect_t mi, mj, x;
        if (!nrs_emu_rect_meet(&c->f[i].box, &b->box, &mi))
            continue;
        for (size_t j = i + 1; j < end; j++)
            if (nrs_emu_rect_meet(&c->f[j].box, &b->box, &mj) && nrs_emu_rect_meet(&mi, &mj, &x)) {
                nrs_seterr(err, errlen, "checkpoint: %s/%s and %s overlap (files of two "
                           "checkpoints in one)", c->dir, c->f[i].name, c->f[j].name);
                return 1;
            }
    }
    return 0;
}

int nrs_ckpt_fill(const nrs_ckpt_t *c, const nrs_emu_buf_t *b, void *dst, char *err,
                  size_t errlen)
{
    int64_t area = nrs_emu_rect_area(&b->box), covered = 0;
    int es = b->esize, bw = b->box.c1 - b->box.c0;
    if (b->kind == NRS_EMU_GRAD) {
        memset(dst, 0, (size_t)b->bytes);
        return 0;
    }
    size_t first = first_file(c, b->role, b->tensor, b->kind), end = first;
    while (end < c->n && c->f[end].role == b->role && c->f[end].tensor == b->tensor &&
           c->f[end].kind == b->kind)
        end++; /* b's run */
    if (overlap(c, first, end, b, err, errlen))
        return -1;
    for (size_t i = first; i < end; i++) {
        const ck_file_t *f = &c->f[i];
        nrs_emu_rect_t m;
        if (!nrs_emu_rect_meet(&f->box, &b->box, &m))
            continue;
        unsigned char *src = load(c, f, es, err, errlen);
        if (!src)
            return -1;
        int fw = f->box.c1 - f->box.c0;
        for (int r = m.r0; r < m.r1; r++)
            memcpy((char *)dst + ((int64_t)(r - b->box.r0) * bw + (m.c0 - b->box.c0)) * es,
                   src + ((int64_t)(r - f->box.r0) * fw + (m.c0 - f->box.c0)) * es,
                   (size_t)(m.c1 - m.c0) * (size_t)es);
        free(src);
        covered += nrs_emu_rect_area(&m);
    }
    if (covered != area) {
        nrs_seterr(err, errlen, "checkpoint step %ld: %lld of %lld elements of model %d tensor "
                   "%d %s [%d,%d)x[%d,%d)", c->step, (long long)covered, (long long)area,
                   b->role, b->tensor, nrs_emu_kind_name(b->kind), b->box.r0, b->box.r1,
                   b->box.c0, b->box.c1);
        return -1;
    }
    return 0;
}

long nrs_ckpt_step(const nrs_ckpt_t *c) { return c->step; }

void nrs_ckpt_close(nrs_ckpt_t *c)
{
    if (!c)
        return;
    free(c->f);
    free(c);
}
