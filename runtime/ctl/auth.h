/* Who may talk to the controller: local peers on a unix socket in a per-job
 * directory of mode 0700 with the controller's own uid (SO_PEERCRED), remote
 * peers over TCP with the per-job secret. Nothing from the wire is executed. */
#ifndef NRS_CTL_AUTH_H
#define NRS_CTL_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "ctl/proto.h"

#define NRS_CTL_SOCKET_NAME "ctl.sock"

/* Create DIR with mode 0700, or accept an existing one only if it is a real
 * directory (not a symlink) owned by the effective uid with no group/other
 * permissions. 0, or -1 with err. */
int nrs_auth_socket_dir(const char *dir, char *err, size_t errlen);

/* DIR/ctl.sock into out[cap]; -1 when it does not fit a sockaddr_un. */
int nrs_auth_socket_path(const char *dir, char *out, size_t cap);

/* SO_PEERCRED uid of a connected unix socket; -1 on error. */
int nrs_auth_peer_uid(int fd, uid_t *uid);

/* Load a per-job secret: a regular file owned by the effective uid, mode 0600
 * or 0400, 16..NRS_PROTO_TOKEN_MAX-1 bytes after stripping one
 * trailing newline, no NUL bytes. 0, or -1 with err. */
int nrs_auth_load_secret(const char *path, char *out, size_t cap, char *err, size_t errlen);

/* Constant-time comparison of two NUL-terminated tokens. */
bool nrs_auth_token_ok(const char *expected, const char *given);

#endif
