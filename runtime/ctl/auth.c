/* Socket directory, peer credentials and the per-job secret. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "ctl/auth.h"

int nrs_auth_socket_dir(const char *dir, char *err, size_t errlen)
{
    struct stat st;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
        return -1;
    }
    if (lstat(dir, &st) != 0) {
        snprintf(err, errlen, "%s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: not a directory (or a symlink)", dir);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        snprintf(err, errlen, "%s: owned by uid %u, not %u: refusing it", dir, (unsigned)st.st_uid,
                 (unsigned)geteuid());
        return -1;
    }
    if (st.st_mode & 077) {
        snprintf(err, errlen, "%s: mode %04o lets others in: must be 0700", dir,
                 (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return 0;
}

int nrs_auth_socket_path(const char *dir, char *out, size_t cap)
{
    struct sockaddr_un sa;
    size_t max = sizeof(sa.sun_path) < cap ? sizeof(sa.sun_path) : cap;
    int n = snprintf(out, max, "%s/%s", dir, NRS_CTL_SOCKET_NAME);
    return n < 0 || (size_t)n >= max ? -1 : 0;
}

int nrs_auth_peer_uid(int fd, uid_t *uid)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof(cr))
        return -1;
    *uid = cr.uid;
    return 0;
}

int nrs_auth_load_secret(const char *path, char *out, size_t cap, char *err, size_t errlen)
{
    struct stat st;
    char buf[NRS_PROTO_TOKEN_MAX + 2];
    /* O_NONBLOCK: opening a FIFO (or a tty) must not hang the controller's
     * start before the regular-file check below refuses it */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        goto fail;
    }
    mode_t mode = st.st_mode & 07777; /* docs/protocol.md: 0600 or 0400, nothing else */
    if (st.st_uid != geteuid() || (mode != 0600 && mode != 0400)) {
        snprintf(err, errlen, "%s: must be owned by uid %u with mode 0600 or 0400 (is uid %u, %04o)",
                 path, (unsigned)geteuid(), (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        goto fail;
    }
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    if (n < 16 || (size_t)n >= NRS_PROTO_TOKEN_MAX || (size_t)n >= cap || memchr(buf, 0, (size_t)n)) {
        snprintf(err, errlen, "%s: the secret must be 16..%d bytes of text", path,
                 NRS_PROTO_TOKEN_MAX - 1);
        goto fail;
    }
    memcpy(out, buf, (size_t)n);
    out[n] = 0;
    close(fd);
    return 0;
fail:
    close(fd);
    return -1;
}

bool nrs_auth_token_ok(const char *expected, const char *given)
{
    size_t le = strlen(expected), lg = strnlen(given, NRS_PROTO_TOKEN_MAX);
    unsigned diff = (unsigned)(le ^ lg);
    for (size_t i = 0; i < NRS_PROTO_TOKEN_MAX - 1; i++) {
        unsigned char a = i < le ? (unsigned char)expected[i] : 0;
        unsigned char b = i < lg ? (unsigned char)given[i] : 0;
        diff |= (unsigned)(a ^ b);
    }
    return le > 0 && diff == 0;
}
