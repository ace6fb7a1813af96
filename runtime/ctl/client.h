/* The peer side of the control channel (blocking, with time-outs): used by
 * `nereus status`, `nereus delta`, the test workers and the bench, and the
 * starting point of the worker side of libnereus. */
#ifndef NRS_CTL_CLIENT_H
#define NRS_CTL_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "ctl/proto.h"

/* Connect to DIR/ctl.sock, or to HOST:PORT, within NRS_CLIENT_CONNECT_S: a
 * connected fd (sends on it block as long as the peer needs), or -1 with err. */
enum { NRS_CLIENT_CONNECT_S = 30 };
int nrs_client_connect_unix(const char *dir, char *err, size_t errlen);
int nrs_client_connect_tcp(const char *hostport, char *err, size_t errlen);
/* The same within timeout_s (> 0), which also bounds each send on the fd
 * (SO_SNDTIMEO): a unix connect waits while the controller's backlog is
 * full, a TCP connect to a host that does not answer for minutes. */
int nrs_client_connect_unix_within(const char *dir, double timeout_s, char *err, size_t errlen);
int nrs_client_connect_tcp_within(const char *hostport, double timeout_s, char *err,
                                  size_t errlen);

/* Write a whole encoded frame: 0, or -1 with err (also when the fd's send
 * time-out passes with no byte taken). */
int nrs_client_send(int fd, const uint8_t *frame, int n, char *err, size_t errlen);

/* Read one frame within timeout_s into buf[cap] (cap >= NRS_PROTO_HDR +
 * NRS_PROTO_MAX_PAYLOAD): 0 with *h and the payload at buf + NRS_PROTO_HDR,
 * or -1 with err (time-out, EOF, bad header). */
int nrs_client_recv(int fd, uint8_t *buf, size_t cap, nrs_hdr_t *h, double timeout_s, char *err,
                    size_t errlen);

/* After a failed send: an ERROR the controller left before closing (e.g. a
 * refused uid, a retired rank), behind up to 63 other frames it had queued,
 * becomes err ("the controller refused: ..."); 0 when found. */
int nrs_client_refusal(int fd, char *err, size_t errlen);

/* HELLO as a CLI (or watcher) peer. */
int nrs_client_hello(int fd, int role, char *err, size_t errlen);

/* The socket directory: opt, else $NEREUS_SOCKET_DIR; NULL when neither. */
const char *nrs_client_socket_dir(const char *opt);

#endif
