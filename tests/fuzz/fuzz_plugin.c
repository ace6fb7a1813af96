/* libFuzzer target for what the SPANK plugin parses as root from files a
 * job's user writes, or from plugstack.conf: the first input byte picks
 *
 *   0  plugstack.conf's arguments (one per line): the parse must end in a
 *      config or an error message, never a crash; an accepted state_dir is
 *      absolute and its expansion for a good node name ends in that name;
 *   1  DIR/controller.lock's record (the user's file, read by root in
 *      slurmstepd through nrs_ctl_rec_read): whatever it holds, the parsed
 *      record's strings are terminated and printable (they go into root's
 *      messages: slurmd's log, srun's stderr), and so is the decoded spec;
 *   2  a node name (ctl_node, the user's file, read by root's epilog; %n of
 *      state_dir): one accepted is one path component, never "." or ".."
 *      or a '/', and the state_dir made of it is the configured one with
 *      the name in place of %n;
 *   3  a spec path: the record's encoding of it is one word of printable
 *      bytes that decodes back to it (a path too long: a hash).
 *
 * The plugin's sources are compiled in; ctl_lock.c is included here for its
 * statics (the record's reader, the spec's codec). Slurm's own calls are
 * tests/slurm/fake_spank.c's. ASan/UBSan catch the rest. */
#define _GNU_SOURCE
#include "../../spank/ctl_lock.c"

#include <sys/mman.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void must(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_plugin: %s\n", what);
        abort();
    }
}

static void printable(const char *s, size_t cap, const char *what)
{
    size_t l = strnlen(s, cap);

    must(l < cap, what);
    for (size_t i = 0; i < l; i++)
        must((unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f, what);
}

static char *dup_n(const uint8_t *p, size_t n)
{
    char *s = malloc(n + 1);

    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static void fuzz_config(const uint8_t *p, size_t n)
{
    char *text = dup_n(p, n), *words[32], out[NRS_SPANK_PATH_MAX];
    int nw = 0;

    for (char *s = text, *e; s != NULL && nw < 32; s = e) {
        e = strchr(s, '\n');
        if (e != NULL)
            *e++ = '\0';
        words[nw++] = s;
    }
    nrs_spank_config_reset();
    if (nrs_spank_config_parse(nw, words) == 0) {
        must(nrs_spank_config.state_dir[0] == '/', "an accepted state_dir is absolute");
        must(nrs_spank_config.runtime_dir[0] == '/', "an accepted runtime_dir is absolute");
        if (nrs_state_dir_expand("node7", out, sizeof(out)) == 0 &&
            strstr(nrs_spank_config.state_dir, "%n") != NULL)
            must(strstr(out, "node7") != NULL, "%n expands to the node's name");
    } else {
        must(nrs_spank_config.error[0] != '\0', "a refused config says why");
        printable(nrs_spank_config.error, sizeof(nrs_spank_config.error) + 1,
                  "a refused config's message is terminated, printable");
    }
    nrs_spank_config_reset();
    free(text);
}

static void fuzz_record(const uint8_t *p, size_t n)
{
    static nrs_ctl_rec_t rec;
    char dec[NRS_SPEC_ENC_MAX + 64];
    int fd = memfd_create("controller.lock", MFD_CLOEXEC);

    if (fd < 0)
        return;
    if (n > 0 && write(fd, p, n) != (ssize_t)n) {
        close(fd);
        return;
    }
    nrs_ctl_rec_read(fd, &rec);
    close(fd);
    printable(rec.state, sizeof(rec.state), "the record's state");
    printable(rec.host, sizeof(rec.host), "the record's host");
    printable(rec.spec, sizeof(rec.spec), "the record's spec");
    printable(rec.why, sizeof(rec.why), "the record's reason");
    nrs_spec_decode(rec.spec, dec, sizeof(dec));
    printable(dec, sizeof(dec), "the record's spec, decoded");
    nrs_spec_decode(rec.spec, dec, 8); /* a short buffer: cut, terminated */
    must(strlen(dec) < 8, "decoding into a short buffer stays in it");
}

static void fuzz_node(const uint8_t *p, size_t n)
{
    char *name = dup_n(p, n), out[NRS_SPANK_PATH_MAX];

    n = strlen(name); /* as the epilog reads ctl_node: up to a NUL */
    if (nrs_spank_node_name_ok(name)) {
        for (size_t i = 0; i < n; i++)
            must(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-",
                        name[i]) != NULL, "an accepted node name is [A-Za-z0-9._-]+");
        must(n > 0, "an accepted node name is not empty");
        must(strchr(name, '/') == NULL, "an accepted node name is one path component");
        must(strcmp(name, ".") != 0 && strcmp(name, "..") != 0, "not . or ..");
        nrs_spank_config_reset();
        nrs_spank_strlcpy(nrs_spank_config.state_dir, "/var/lib/nereus/%n/x",
                          sizeof(nrs_spank_config.state_dir));
        if (nrs_state_dir_expand(name, out, sizeof(out)) == 0)
            must(strncmp(out, "/var/lib/nereus/", 16) == 0 &&
                     strncmp(out + 16, name, n) == 0 && strcmp(out + 16 + n, "/x") == 0,
                 "state_dir with the name in place of %n");
        else
            must(n + 19 >= sizeof(out), "only a name too long does not expand");
        nrs_spank_config_reset();
    }
    free(name);
}

static void fuzz_spec_path(const uint8_t *p, size_t n)
{
    char *path = dup_n(p, n), enc[NRS_SPEC_ENC_MAX + 32], dec[4 * NRS_SPEC_ENC_MAX];

    nrs_spec_encode(path, enc, sizeof(enc));
    printable(enc, sizeof(enc), "an encoded spec");
    must(strchr(enc, ' ') == NULL && enc[0] != '\0', "an encoded spec is one word");
    if (enc[0] != '#' && path[0] != '\0') {
        nrs_spec_decode(enc, dec, sizeof(dec));
        /* Decoding maps what is not printable to '?', for messages. */
        for (size_t i = 0; path[i] != '\0'; i++)
            if ((unsigned char)path[i] < 0x20 || (unsigned char)path[i] >= 0x7f)
                path[i] = '?';
        must(strcmp(dec, path) == 0, "an encoded spec decodes back to it");
    }
    free(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 3 * NRS_REC_LEN)
        return 0;
    switch (data[0] & 3) {
    case 0:
        fuzz_config(data + 1, size - 1);
        break;
    case 1:
        fuzz_record(data + 1, size - 1);
        break;
    case 2:
        fuzz_node(data + 1, size - 1);
        break;
    default:
        fuzz_spec_path(data + 1, size - 1);
    }
    return 0;
}
