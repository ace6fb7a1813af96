/* Remote context (slurmstepd): one controller per job at a time.
 *
 * The lock on DIR/controller.lock and the record its holder keeps in it;
 * nrs_remote_controller_start (the job's first node: start the job's
 * controller, or join or wait for the one another step runs) and
 * nrs_remote_controller_find (another node: wait for it where the first
 * node's job directory is seen); nrs_remote_stop_watcher, which stops what
 * a step started and lets go of the lock; and the node-local lock file
 * (NRS_NL_LOCK) that stands in for flock where state_dir's filesystem has
 * none. remote.c runs the hooks, makes the job directory and forks the
 * watcher (nrs_remote_spawn). */
#define _GNU_SOURCE /* F_OFD_SETLK */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "ctl_lock.h"

/* ---- the node-local lock: NRS_NL_LOCK ---------------------------------------
 *
 * Where state_dir's filesystem has no flock (Lustre mounted noflock:
 * ENOSYS; some NFS set-ups: ENOLCK; others: EOPNOTSUPP or EINVAL), this
 * node's steps take their locks in NRS_NL_LOCK instead: root's, 0600, on a
 * local filesystem; open-file-description locks (F_OFD_SETLK: released
 * with the descriptor, also when its holder dies, like flock) on one byte
 * of it: byte 0 for <state>/.lock, byte <job id> for the job's
 * controller.lock. Opened by root in init_post_opt and kept for user_init
 * (the user cannot open it). One file for every job: nothing to clean up. */
bool nrs_flock_unsupported(int e)
{
    return e == ENOSYS || e == ENOLCK || e == EOPNOTSUPP || e == EINVAL;
}

/* A new open file description of NRS_NL_LOCK (made if missing), or -1 with
 * why. As root. */
int nrs_nl_open(char *why, size_t n)
{
    struct stat st;
    int dfd, fd;

    if (mkdir(NRS_NL_DIR, 0700) != 0 && errno != EEXIST) {
        snprintf(why, n, "mkdir %s: %s", NRS_NL_DIR, strerror(errno));
        return -1;
    }
    dfd = open(NRS_NL_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 || fstat(dfd, &st) != 0 || st.st_uid != 0 || (st.st_mode & 022) != 0) {
        snprintf(why, n, "%s is not a directory of root's that only root can write to",
                 NRS_NL_DIR);
        if (dfd >= 0)
            close(dfd);
        return -1;
    }
    fd = openat(dfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    close(dfd);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0) {
        snprintf(why, n, "%s: %s", NRS_NL_LOCK, fd < 0 ? strerror(errno) :
                 "not a regular file of root's");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Byte at of NRS_NL_LOCK (fd): type F_WRLCK, F_RDLCK or F_UNLCK, never
 * waiting. 0, or -1 (errno EWOULDBLOCK: someone else holds it). */
int nrs_nl_lock(int fd, short type, off_t at)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = at;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
        return 0;
    if (errno == EACCES || errno == EAGAIN)
        errno = EWOULDBLOCK;
    return -1;
}

/* pid runs nereus-watcher for socket dir dir: its command line has
 * ".../nereus-watcher --socket-dir DIR" (a libtool wrapper runs as "/bin/sh
 * .../nereus-watcher ...", and then as ".../lt-nereus-watcher ..."). Not a
 * zombie (whose command line is empty), nor a reused pid, nor the watcher
 * of another job (another DIR). */
static bool nrs_pid_is_watcher(pid_t pid, const char *dir)
{
    static const char me[] = "nereus-watcher", opt[] = "--socket-dir";
    char path[64], cmd[NRS_SPANK_PATH_MAX + 512];
    const char *arg[3] = {"", "", ""};
    ssize_t k;
    int fd;

    if (pid <= 0)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    k = read(fd, cmd, sizeof(cmd) - 1);
    close(fd);
    if (k <= 0)
        return false;
    cmd[k] = '\0';
    /* Each argument and the two after it (NUL-separated). */
    for (const char *c = cmd; c < cmd + k; c += strlen(c) + 1) {
        size_t l;

        arg[0] = arg[1];
        arg[1] = arg[2];
        arg[2] = c;
        if (strcmp(arg[1], opt) == 0 && strcmp(arg[2], dir) == 0 &&
            (l = strlen(arg[0])) >= sizeof(me) - 1 && strcmp(arg[0] + l - (sizeof(me) - 1), me) == 0)
            return true;
    }
    return false;
}

/* The last non-empty line of a log file of uid's, for NEREUS_ERROR ("" if
 * it is anything else: a FIFO there would block us in open() for good). */
static void nrs_remote_log_tail(const char *path, uid_t uid, char *out, size_t n)
{
    char buf[2048], why[128];
    ssize_t k = -1;
    int fd = nrs_open_user_file(path, O_RDONLY, 0, uid, why, sizeof(why));

    out[0] = '\0';
    if (fd < 0)
        return;
    off_t end = lseek(fd, 0, SEEK_END);
    if (end >= 0 && lseek(fd, end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1 : 0,
                          SEEK_SET) >= 0)
        k = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (k <= 0)
        return;
    while (k > 0 && (buf[k - 1] == '\n' || buf[k - 1] == ' '))
        k--;
    buf[k] = '\0';
    const char *line = strrchr(buf, '\n');
    line = line ? line + 1 : buf;
    size_t len = strlen(line) < n - 1 ? strlen(line) : n - 1;
    memcpy(out, line, len);
    out[len] = '\0';
}

/* Reap the watcher if it is gone; true when it is (or was never ours). */
static bool nrs_watcher_gone(pid_t pid)
{
    pid_t p = waitpid(pid, NULL, WNOHANG);

    return p == pid || (p < 0 && errno == ECHILD);
}

/* One connection attempt that never blocks past deadline: a listener whose
 * backlog is full makes a blocking connect() wait (EAGAIN here). */
static bool nrs_remote_try_connect(const struct sockaddr_un *sa, double deadline)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int ok = 0, err = 0;
    socklen_t len = sizeof(err);

    if (fd < 0)
        return false;
    if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0) {
        ok = 1;
    } else if (errno == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int left = (int)(deadline - nrs_now_ms());

        ok = poll(&p, 1, left > 50 ? 50 : left > 0 ? left : 0) == 1 &&
             getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    close(fd);
    return ok;
}

/* ---- one controller per job: DIR/controller.lock ---------------------------
 *
 * DIR is the job directory on the job's first node. The step that runs the
 * job's controller holds an flock on DIR/controller.lock from before it forks
 * the watcher until the watcher and the controller are gone (user_init, then
 * task_exit or exit). The lock goes with its holder, so it is never stale: a
 * slurmstepd that dies lets go too. The file is not removed while the job
 * runs (an unlink would let the next step lock a new file while another
 * still holds the old one: two controllers); the epilog removes it with the
 * job directory. Without flock on state_dir's filesystem the lock is byte
 * <job id> of NRS_NL_LOCK (node-local) and the file keeps only the record.
 * The holder keeps one record in it, NRS_REC_LEN bytes padded with spaces
 * (so a rewrite in place never changes the length: no truncate), rewritten
 * at each change:
 *
 *   STATE SEQ STEP PID HOST UNTIL SPEC WHY
 *
 * STATE: starting (lock taken, watcher forked, no answer yet), running (the
 * controller answered), stopping, stopped, failed (WHY: the reason); SEQ: the
 * attempt (each holder adds one); STEP: the holder's step id; PID: its
 * watcher, on machine HOST; UNTIL: the wall-clock time (ms) by which the
 * holder leaves STATE (0: no bound, running); SPEC: the controller's spec
 * (its path, %XX-encoded).
 *
 * Another step of the job that finds the lock taken (on the first node; or
 * on a node that sees DIR: a state_dir shared by the nodes, or the local test
 * cluster; there it only probes with a shared lock, never taking it) waits,
 * bounded by NRS_CTL_WAIT_MS or the holder's UNTIL (NRS_INIT_WAIT_MS in
 * all), for one of: the controller answers on ctl.sock while the record says
 * starting or running (the step joins it); the lock is let go (stopped, or
 * the holder died: a step on the first node takes the lock and starts a new
 * controller; failed, in the attempt it waited for: it fails at once with
 * that reason instead of trying again); the watcher of a running record is
 * gone (it fails at once with the controller's last words). A controller
 * with another spec than the step's is neither joined nor waited for: the
 * step fails at once and says whose it is. A free lock whose record says
 * the watcher of DIR still runs here (its step's slurmstepd died, and
 * proctrack left it) is that controller: joined once it answers, waited for
 * while it goes away. */
enum { NRS_REC_LEN = 4096, NRS_SPEC_ENC_MAX = 2048 };

typedef struct {
    char state[16]; /* "": no record, or one being written */
    unsigned seq, step;
    int pid;
    char host[64];
    long long until;
    char spec[NRS_SPEC_ENC_MAX + 32]; /* encoded, as in the file; "" none */
    char why[NRS_SPANK_MSG_MAX];
} nrs_ctl_rec_t;

static long long nrs_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The machine's name, for the record (one word). */
static void nrs_host_name(char *buf, size_t n)
{
    nrs_remote_host_name(buf, n);
    for (char *c = buf; *c != '\0'; c++)
        if (*c == ' ' || *c == '\n' || *c == '\t')
            *c = '_';
}

/* "batch", "interactive" or the number: for messages. */
static const char *nrs_step_name(uint32_t step, char *buf, size_t n)
{
    if (step == SLURM_BATCH_SCRIPT)
        return "batch";
    if (step == SLURM_INTERACTIVE_STEP)
        return "interactive";
    snprintf(buf, n, "%u", step);
    return buf;
}

static bool nrs_rec_is(const nrs_ctl_rec_t *rec, const char *state)
{
    return strcmp(rec->state, state) == 0;
}

/* The spec path as one word of the record: every byte outside '!'..'~' and
 * '%' as %XX; a path that would not fit: '#' and its FNV-1a hash. */
static void nrs_spec_encode(const char *spec, char *out, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;

    for (const unsigned char *c = (const unsigned char *)spec; *c != '\0'; c++) {
        if (o + 4 > n || o + 4 > NRS_SPEC_ENC_MAX) {
            unsigned long long h = 1469598103934665603ULL;

            for (c = (const unsigned char *)spec; *c != '\0'; c++)
                h = (h ^ *c) * 1099511628211ULL;
            snprintf(out, n, "#%016llx", h);
            return;
        }
        if (*c <= ' ' || *c > '~' || *c == '%') {
            out[o++] = '%';
            out[o++] = hex[*c >> 4];
            out[o++] = hex[*c & 15];
        } else
            out[o++] = (char)*c;
    }
    out[o] = '\0';
    if (o == 0)
        snprintf(out, n, "-");
}

static int nrs_hex_digit(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                          : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The other way, for messages (a hash stays as it is): what is not
 * printable ASCII, encoded or not (the record is the user's), becomes '?'. */
static void nrs_spec_decode(const char *enc, char *out, size_t n)
{
    size_t o = 0;

    for (const char *c = enc; *c != '\0' && o + 1 < n; c++) {
        int hi = c[0] == '%' ? nrs_hex_digit(c[1]) : -1, lo = hi >= 0 ? nrs_hex_digit(c[2]) : -1;
        unsigned char v = (unsigned char)*c;

        if (lo >= 0) {
            v = (unsigned char)(hi * 16 + lo);
            c += 2;
        }
        out[o++] = nrs_spank_printable_char((char)v);
    }
    out[o] = '\0';
}

/* The record in fd (the user's file: parsed, never trusted further); state
 * "" when there is none or it is being rewritten (two reads in a row must
 * agree, and end in a newline). */
static void nrs_ctl_rec_read(int fd, nrs_ctl_rec_t *rec)
{
    char a[NRS_REC_LEN + 1], b[NRS_REC_LEN + 1], *nl;
    ssize_t ka = pread(fd, a, NRS_REC_LEN, 0), kb = -1;
    int used = 0;

    memset(rec, 0, sizeof(*rec));
    for (int i = 0; i < 5; i++) {
        kb = pread(fd, b, NRS_REC_LEN, 0);
        if (kb == ka && (ka <= 0 || memcmp(a, b, (size_t)ka) == 0))
            break;
        if (kb > 0)
            memcpy(a, b, (size_t)kb);
        ka = kb;
        kb = -2;
        poll(NULL, 0, 1);
    }
    if (kb != ka || ka <= 0)
        return;
    a[ka] = '\0';
    if ((nl = strchr(a, '\n')) == NULL)
        return;
    *nl = '\0';
    if (sscanf(a, "%15s %u %u %d %63s %lld %2079s %n", rec->state, &rec->seq, &rec->step,
               &rec->pid, rec->host, &rec->until, rec->spec, &used) != 7) {
        memset(rec, 0, sizeof(*rec));
        return;
    }
    snprintf(rec->why, sizeof(rec->why), "%s", a + used);
    for (size_t l = strlen(rec->why); l > 0 && rec->why[l - 1] == ' '; l--)
        rec->why[l - 1] = '\0';
    /* The user's bytes: they go into root's messages (slurmd's log, srun's
     * stderr) only as printable ASCII. */
    nrs_spank_printable(rec->state);
    nrs_spank_printable(rec->host);
    nrs_spank_printable(rec->spec);
    nrs_spank_printable(rec->why);
}

/* Rewrite our record (we hold the lock): all NRS_REC_LEN bytes in place, the
 * same length each time. A failure is logged (waiters then see an older
 * record, and wait for its bound). */
static void nrs_ctl_rec_write(const nrs_remote_t *r, const char *state, long long until,
                              const char *why)
{
    char line[NRS_REC_LEN], host[64], spec[NRS_SPEC_ENC_MAX + 32];
    int k;

    if (!r->locked)
        return;
    nrs_host_name(host, sizeof(host));
    nrs_spec_encode(r->spec, spec, sizeof(spec));
    k = snprintf(line, sizeof(line), "%s %u %u %d %s %lld %s %s", state, r->lock_seq, r->step_id,
                 (int)r->watcher, host, until, spec, why);
    if (k < 0)
        return;
    if ((size_t)k > sizeof(line) - 1)
        k = (int)sizeof(line) - 1;
    for (int i = 0; i < k; i++)
        if (line[i] == '\n' || line[i] == '\0')
            line[i] = ' ';
    memset(line + k, ' ', sizeof(line) - (size_t)k);
    line[sizeof(line) - 1] = '\n';
    errno = 0;
    if (pwrite(r->lock_fd, line, sizeof(line), 0) != (ssize_t)sizeof(line))
        slurm_error(NRS_SPANK_PREFIX "job %u step %u: cannot write '%s' in %s/controller.lock: %s",
                    r->job_id, r->step_id, state, r->job_dir,
                    errno ? strerror(errno) : "short write");
}

/* The lock on DIR/controller.lock (fd): op LOCK_EX or LOCK_SH (never
 * waiting) or LOCK_UN; byte <job id> of NRS_NL_LOCK instead on the first
 * node without flock. 0, or -1 (errno; EWOULDBLOCK: held by another). */
static int nrs_ctl_flock(const nrs_remote_t *r, int fd, int op)
{
    if (r->noflock && r->ctl_here && r->nl_fd > 0)
        return nrs_nl_lock(r->nl_fd, op == LOCK_EX ? F_WRLCK : op == LOCK_SH ? F_RDLCK : F_UNLCK,
                           (off_t)r->job_id);
    return flock(fd, op == LOCK_UN ? LOCK_UN : op | LOCK_NB);
}

/* Let go of the lock, leaving the final record. */
static void nrs_ctl_unlock(nrs_remote_t *r, const char *state, const char *why)
{
    if (!r->locked)
        return;
    nrs_ctl_rec_write(r, state, 0, why);
    nrs_ctl_flock(r, r->lock_fd, LOCK_UN); /* even if a forked copy of the fd lives on */
    close(r->lock_fd);
    r->locked = false;
    r->lock_fd = -1;
}

/* Stop the watcher this step started (it stops the controller on SIGTERM):
 * TERM, up to wait_ms, then KILL; then, for at most NRS_SOCK_GONE_MS, until
 * ctl.sock refuses (a controller whose watcher was killed goes with its
 * parent-death signal, a little later); then let go of the lock, with the
 * record "failed WHY" (why: a start that failed) or "stopped". Never
 * blocks longer, but for a first look (nrs_fs_answers, 10 s) at a job
 * directory whose mount may have stopped answering (nrs_ctl_abandon). */
enum { NRS_SOCK_GONE_MS = 500 };

/* For at most NRS_SOCK_GONE_MS, until DIR/ctl.sock refuses. We are root
 * here (task_exit, exit) and DIR is the user's: ctl.sock may be a link to,
 * or a hard link of, a socket the user cannot reach. So it is opened
 * O_PATH | O_NOFOLLOW, must be a socket of the job's user, and is reached
 * through /proc/self/fd/N, that very inode, never by its name again. */
static void nrs_sock_wait_gone(const nrs_remote_t *r)
{
    char path[NRS_SPANK_PATH_MAX + 32];
    double gone = nrs_now_ms() + NRS_SOCK_GONE_MS;
    struct sockaddr_un sa;
    struct stat st;
    int fd;

    if (nrs_remote_path(path, sizeof(path), r->job_dir, "ctl.sock") < 0)
        return;
    fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return; /* none: nothing answers there */
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == r->uid) {
        memset(&sa, 0, sizeof(sa));
        sa.sun_family = AF_UNIX;
        snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d", fd);
        while (nrs_now_ms() < gone && nrs_remote_try_connect(&sa, gone))
            poll(NULL, 0, 20);
    }
    close(fd);
}

/* The job directory stopped answering while the step ran (a state_dir on a
 * hung NFS or FUSE mount): a write of the record, the look for ctl.sock, the
 * unlock (on NFS a call to the server) or the close (a FUSE flush) would
 * block slurmstepd in the kernel, and with it the end of the step. So none
 * is made: the lock's descriptor is let go of unclosed (slurmstepd's exit
 * or the node's epilog is where it ends) and the record stays as it was. */
static void nrs_ctl_abandon(nrs_remote_t *r, const char *hung)
{
    slurm_error(NRS_SPANK_PREFIX "job %u step %u: %s: the watcher is stopped, but the job "
                "directory's lock and record are left as they are", r->job_id, r->step_id, hung);
    r->locked = false;
    r->lock_fd = -1;
}

void nrs_remote_stop_watcher(nrs_remote_t *r, int wait_ms, const char *why)
{
    double deadline;
    pid_t pid = r->watcher;
    char hung[NRS_SPANK_MSG_MAX];

    /* Bounded (10 s) and before the watcher's own bound starts. */
    if (r->locked && nrs_fs_answers(r->job_dir, "job directory", hung, sizeof(hung)) < 0)
        nrs_ctl_abandon(r, hung);
    deadline = nrs_now_ms() + wait_ms;
    if (pid <= 0) {
        nrs_ctl_unlock(r, why ? "failed" : "stopped", why ? why : "");
        return;
    }
    /* Before the first signal: a step that comes now waits for us to let
     * go (and then starts a new controller) rather than joining this one. */
    nrs_ctl_rec_write(r, "stopping", nrs_wall_ms() + wait_ms + 1500 + NRS_SOCK_GONE_MS, "");
    if (!nrs_watcher_gone(pid) && nrs_pid_is_watcher(pid, r->job_dir)) {
        kill(pid, wait_ms > 0 ? SIGTERM : SIGKILL);
        while (!nrs_watcher_gone(pid) && nrs_now_ms() < deadline)
            poll(NULL, 0, 20);
        if (!nrs_watcher_gone(pid) && nrs_pid_is_watcher(pid, r->job_dir)) {
            slurm_error(NRS_SPANK_PREFIX "job %u: watcher %d still running after %d ms: SIGKILL",
                        r->job_id, (int)pid, wait_ms);
            kill(pid, SIGKILL);
            for (int i = 0; i < 50 && !nrs_watcher_gone(pid); i++)
                poll(NULL, 0, 20);
        }
    }
    r->watcher = 0;
    if (r->locked)
        nrs_sock_wait_gone(r);
    nrs_ctl_unlock(r, why ? "failed" : "stopped", why ? why : "");
    nrs_debug("job %u step %u: watcher and controller stopped", r->job_id, r->step_id);
}

/* The tail of the controller's log, else the watcher's, for a message. */
static void nrs_remote_why_gone(const nrs_remote_t *r, char *why, size_t n, char *log, size_t ln)
{
    nrs_remote_path(log, ln, r->ctl_dir, "controller.log");
    nrs_remote_log_tail(log, r->uid, why, n);
    if (why[0] == '\0') {
        nrs_remote_path(log, ln, r->ctl_dir, "watcher.log");
        nrs_remote_log_tail(log, r->uid, why, n);
    }
}

/* Bounded wait (until deadline) until the controller accepts connections on
 * DIR/ctl.sock; child: our watcher, whose early exit ends the wait with its
 * log's reason. */
static int nrs_remote_wait_socket(const nrs_remote_t *r, pid_t child, double deadline)
{
    struct sockaddr_un sa;
    char log[NRS_SPANK_PATH_MAX + 32], why[512];
    double t0 = nrs_now_ms();

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (nrs_remote_path(sa.sun_path, sizeof(sa.sun_path), r->ctl_dir, "ctl.sock") < 0)
        return -1;
    for (;;) {
        if (nrs_remote_try_connect(&sa, deadline))
            return 0;
        if (child > 0 && nrs_watcher_gone(child)) {
            nrs_remote_why_gone(r, why, sizeof(why), log, sizeof(log));
            nrs_err("the job's controller did not start: %s (%s)", why[0] ? why : "no message",
                    log);
            return -1;
        }
        if (nrs_now_ms() >= deadline) {
            nrs_err("the job's controller did not answer on %s within %.0f s (see %s/controller.log)",
                    sa.sun_path, (nrs_now_ms() - t0) / 1000, r->ctl_dir);
            return -1;
        }
        poll(NULL, 0, 50);
    }
}

enum { NRS_JOIN_JOINED, NRS_JOIN_OURS, NRS_JOIN_NONE, NRS_JOIN_ELSEWHERE, NRS_JOIN_UNKNOWN };

/* The record's controller runs another spec than this step's. */
static bool nrs_rec_other_spec(const nrs_remote_t *r, const nrs_ctl_rec_t *rec)
{
    char mine[NRS_SPEC_ENC_MAX + 32];

    nrs_spec_encode(r->spec, mine, sizeof(mine));
    return rec->spec[0] != '\0' && strcmp(rec->spec, mine) != 0;
}

/* ... so this step neither joins nor waits for it: said (whose it is). */
static int nrs_rec_other_spec_fail(const nrs_remote_t *r, const nrs_ctl_rec_t *rec)
{
    char theirs[NRS_SPANK_PATH_MAX], sn[16];

    nrs_spec_decode(rec->spec, theirs, sizeof(theirs));
    nrs_err("the job's controller runs %s (started by step %s), not this step's --nereus spec "
            "%s: a job has one controller at a time; give this step the same spec, or start it "
            "once step %s has ended", theirs, nrs_step_name(rec->step, sn, sizeof(sn)), r->spec,
            nrs_step_name(rec->step, sn, sizeof(sn)));
    return -1;
}

/* Another step holds DIR/controller.lock (fd) or nobody does: wait, bounded
 * (until end at the latest), as the comment on the lock says.
 * NRS_JOIN_JOINED: the controller answers (*step: whose); NRS_JOIN_OURS:
 * the lock is ours now and nobody runs a controller (may_start: we start
 * it; r->lock_seq is our attempt's); NRS_JOIN_NONE: the same without
 * may_start (the lock let go again); without may_start (a step on another
 * node, which only probes with a shared lock): NRS_JOIN_ELSEWHERE, its
 * holder is on another machine, whose unix socket cannot be reached from
 * here (a shared state_dir); NRS_JOIN_UNKNOWN, the lock cannot be probed
 * from here (NFS without flock of a read-only file: EBADF; no flock at all)
 * (logged); -1: the controller we waited for failed or did not answer, or
 * runs another spec (logged). */
static int nrs_ctl_join(nrs_remote_t *r, int fd, bool may_start, double end, unsigned *step)
{
    struct sockaddr_un sa;
    nrs_ctl_rec_t rec;
    char host[64], sn[16], log[NRS_SPANK_PATH_MAX + 32], why[512];
    double t0 = nrs_now_ms(), deadline = t0 + NRS_CTL_WAIT_MS;
    bool waited = false; /* saw an attempt in progress (starting), number wait_seq */
    bool orphan = false; /* the lock is free, the record's watcher still runs here */
    unsigned wait_seq = 0;
    int op = may_start ? LOCK_EX : LOCK_SH;

    if (deadline > end)
        deadline = end;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (nrs_remote_path(sa.sun_path, sizeof(sa.sun_path), r->ctl_dir, "ctl.sock") < 0)
        return -1;
    nrs_host_name(host, sizeof(host));
    for (;;) {
        bool busy = true;

        if (nrs_ctl_flock(r, fd, op) == 0) {
            nrs_ctl_rec_read(fd, &rec);
            busy = false;
            if (strcmp(rec.host, host) == 0 &&
                (nrs_rec_is(&rec, "starting") || nrs_rec_is(&rec, "running") ||
                 nrs_rec_is(&rec, "stopping")) &&
                nrs_pid_is_watcher((pid_t)rec.pid, r->ctl_dir)) {
                /* Its slurmstepd is gone, its watcher is not: no second one. */
                nrs_ctl_flock(r, fd, LOCK_UN);
                if (!orphan)
                    nrs_info("job %u step %u: the lock of step %s's controller (%s) is free but "
                             "its watcher (pid %d) still runs: joining it, or waiting for it to "
                             "go", r->job_id, r->step_id, nrs_step_name(rec.step, sn, sizeof(sn)),
                             rec.state, rec.pid);
                orphan = true;
            } else if (waited && rec.seq == wait_seq && nrs_rec_is(&rec, "failed") &&
                       !nrs_rec_other_spec(r, &rec)) {
                nrs_ctl_flock(r, fd, LOCK_UN);
                nrs_err("%s (step %s started it; this step waited for it)",
                        rec.why[0] ? rec.why : "the job's controller did not start",
                        nrs_step_name(rec.step, sn, sizeof(sn)));
                return -1;
            } else if (!may_start) {
                nrs_ctl_flock(r, fd, LOCK_UN);
                return NRS_JOIN_NONE;
            } else {
                r->lock_seq = rec.seq + 1;
                return NRS_JOIN_OURS;
            }
        } else if (errno == EWOULDBLOCK || errno == EINTR) {
            nrs_ctl_rec_read(fd, &rec);
            orphan = false;
        } else if (!may_start && (errno == EBADF || nrs_flock_unsupported(errno))) {
            nrs_info("job %u step %u: cannot tell whether a step on %s holds %s/controller.lock "
                     "(flock: %s): the tasks here start without waiting for its controller",
                     r->job_id, r->step_id, r->first, r->ctl_dir, strerror(errno));
            return NRS_JOIN_UNKNOWN;
        } else {
            nrs_err("%s/controller.lock: %s", r->ctl_dir, strerror(errno));
            return -1;
        }
        if (busy && !may_start && rec.host[0] != '\0' && strcmp(rec.host, host) != 0)
            return NRS_JOIN_ELSEWHERE;
        if ((nrs_rec_is(&rec, "starting") || nrs_rec_is(&rec, "running")) &&
            nrs_rec_other_spec(r, &rec))
            return nrs_rec_other_spec_fail(r, &rec);
        if (busy && nrs_rec_is(&rec, "starting")) {
            waited = true;
            wait_seq = rec.seq;
        }
        /* "", stopped, failed with the lock taken: the holder has only just
         * taken it (or is rewriting the record). */
        if ((nrs_rec_is(&rec, "starting") || nrs_rec_is(&rec, "running") ||
             (busy && !nrs_rec_is(&rec, "stopping"))) &&
            nrs_remote_try_connect(&sa, deadline)) {
            unsigned seq = rec.seq;

            nrs_ctl_rec_read(fd, &rec); /* not stopping meanwhile? */
            if (nrs_rec_is(&rec, "running") || (nrs_rec_is(&rec, "starting") && rec.seq == seq)) {
                if (nrs_rec_other_spec(r, &rec))
                    return nrs_rec_other_spec_fail(r, &rec);
                *step = rec.step;
                return NRS_JOIN_JOINED;
            }
        } else if (busy && nrs_rec_is(&rec, "running") && strcmp(rec.host, host) == 0 &&
                   !nrs_pid_is_watcher((pid_t)rec.pid, r->ctl_dir)) {
            unsigned seq = rec.seq;

            /* Its holder writes "stopping" before it stops the watcher: still
             * "running" now means the watcher ended on its own. */
            nrs_ctl_rec_read(fd, &rec);
            if (nrs_rec_is(&rec, "running") && rec.seq == seq) {
                nrs_remote_why_gone(r, why, sizeof(why), log, sizeof(log));
                nrs_err("the job's controller, started by step %s, is no longer running: %s (%s)",
                        nrs_step_name(rec.step, sn, sizeof(sn)), why[0] ? why : "no message", log);
                return -1;
            }
        }
        if (rec.until > 0) { /* the holder says when it will have moved on */
            double ext = nrs_now_ms() + (double)(rec.until - nrs_wall_ms()) + 1000;

            if (ext > deadline)
                deadline = ext < end ? ext : end;
        }
        if (nrs_now_ms() >= deadline) {
            double s = (nrs_now_ms() - t0) / 1000;
            const char *name = nrs_step_name(rec.step, sn, sizeof(sn));

            if (nrs_rec_is(&rec, "stopping"))
                nrs_err("the job's controller of step %s was stopping and %s within %.0f s", name,
                        orphan ? "its watcher, whose step is gone, did not exit"
                               : "its step did not let go of controller.lock", s);
            else
                nrs_err("the job's controller (step %s's, %s) did not answer on %s within %.0f s "
                        "(see %s/controller.log)", name, rec.state[0] ? rec.state : "starting",
                        sa.sun_path, s, r->ctl_dir);
            return -1;
        }
        poll(NULL, 0, 50);
    }
}

/* DIR/controller.lock on the first node, opened as the user (create). fd,
 * or -1 (logged). */
static int nrs_ctl_lock_open(const nrs_remote_t *r)
{
    char lock[NRS_SPANK_PATH_MAX + 32];
    struct stat st;
    int fd;

    if (nrs_remote_path(lock, sizeof(lock), r->ctl_dir, "controller.lock") < 0)
        return -1;
    fd = open(lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0) {
        nrs_err("%s: %s", lock, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        nrs_err("%s is not a regular file", lock);
        close(fd);
        return -1;
    }
    return fd;
}

/* The first node's DIR/controller.lock, from another node, read-only: the
 * first node's state_dir walked with the checks of this node's own
 * (nrs_state_dir_open: every component root's and not writable by others,
 * no link followed), then DIR (a directory of the job's user) and the lock
 * (a regular file of the job's user), each by openat with O_NOFOLLOW: no
 * other user can plant a lock that this step would wait for. fd, or -1 with
 * why (errno ENOENT: something is missing). */
static int nrs_ctl_lock_open_remote(const nrs_remote_t *r, char *why, size_t n)
{
    char state[NRS_SPANK_PATH_MAX], id[16];
    struct stat st;
    int sfd, jfd, fd, e;

    if (nrs_state_dir_expand(r->first, state, sizeof(state)) < 0) {
        snprintf(why, n, "state_dir %.512s for %s: too long", nrs_spank_config.state_dir, r->first);
        errno = ENAMETOOLONG;
        return -1;
    }
    /* This node's own (state_dir without %n) had its look in init_post_opt. */
    if (strcmp(r->ctl_dir, r->job_dir) != 0 &&
        nrs_fs_answers(state, "the first node's state_dir", why, n) < 0) {
        errno = ETIMEDOUT;
        return -1;
    }
    sfd = nrs_state_dir_open(state, false, why, n);
    if (sfd < 0)
        return -1;
    snprintf(id, sizeof(id), "%u", r->job_id);
    jfd = openat(sfd, id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    e = errno;
    close(sfd);
    if (jfd < 0) {
        snprintf(why, n, "%.900s: %s", r->ctl_dir, strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(jfd, &st) != 0 || st.st_uid != r->uid) {
        snprintf(why, n, "%.900s is not the job's user's (uid %u)", r->ctl_dir, (unsigned)r->uid);
        close(jfd);
        errno = EPERM;
        return -1;
    }
    fd = openat(jfd, "controller.lock", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    e = errno;
    close(jfd);
    if (fd < 0) {
        snprintf(why, n, "%.900s/controller.lock: %s", r->ctl_dir, strerror(e));
        errno = e;
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != r->uid) {
        snprintf(why, n, "%.900s/controller.lock is not a regular file of the job's user's",
                 r->ctl_dir);
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

/* In the bounded child: can the user (effective ids) run both programs?
 * 0, or -1 with why in out. */
static int nrs_runtime_access(void *arg, char *out, size_t n)
{
    const char *const *progs = arg;

    for (int i = 0; progs[i] != NULL; i++)
        if (faccessat(AT_FDCWD, progs[i], X_OK, AT_EACCESS) != 0) {
            snprintf(out, n, "cannot run %s: %s (runtime_dir=%s in plugstack.conf; is Nereus "
                     "installed on this node?)", progs[i], strerror(errno),
                     nrs_spank_config.runtime_dir);
            return -1;
        }
    return 0;
}

/* runtime_dir's programs, checked as the user in a bounded child: it is
 * often on a shared filesystem, which may hang. 0, or -1 (logged). */
static int nrs_runtime_check(const char *ctl, const char *watcher)
{
    const char *progs[] = {ctl, watcher, NULL};
    char why[NRS_SPANK_MSG_MAX];
    int rc = nrs_bounded_call(NRS_FS_WAIT_MS, nrs_runtime_access, progs, why, sizeof(why));

    if (rc == NRS_BOUNDED_TIMEOUT)
        nrs_err("runtime_dir %s: its filesystem did not answer within %d s (a hung NFS mount?)",
                nrs_spank_config.runtime_dir, NRS_FS_WAIT_MS / 1000);
    else if (rc < 0)
        nrs_err("%s", why);
    return rc < 0 ? -1 : 0;
}

/* On the job's first node: join the job's controller, or start it (once per
 * job at a time: DIR/controller.lock). Waits at most NRS_INIT_WAIT_MS for
 * the lock and the start together, then at most NRS_STOP_WAIT_MS + ~1.5 s
 * to stop a watcher that did not answer. 0, or -1 (logged). */
int nrs_remote_controller_start(spank_t sp, nrs_remote_t *r)
{
    char watcher[NRS_SPANK_PATH_MAX + 32], ctl[NRS_SPANK_PATH_MAX + 32];
    char why[NRS_SPANK_MSG_MAX], sn[16];
    const char *rt = nrs_spank_config.runtime_dir;
    unsigned step = 0;
    double deadline, end = nrs_now_ms() + NRS_INIT_WAIT_MS;
    int fd, rc;
    pid_t pid;

    if (nrs_remote_path(watcher, sizeof(watcher), rt, "nereus-watcher") < 0 ||
        nrs_remote_path(ctl, sizeof(ctl), rt, "nereus-controller") < 0)
        return -1;
    if (nrs_runtime_check(ctl, watcher) < 0)
        return -1;
    fd = nrs_ctl_lock_open(r);
    if (fd < 0)
        return -1;
    rc = nrs_ctl_join(r, fd, true, end, &step);
    if (rc != NRS_JOIN_OURS) {
        close(fd);
        if (rc == NRS_JOIN_JOINED)
            nrs_debug("job %u step %u: joined the job's controller (step %s's)", r->job_id,
                      r->step_id, nrs_step_name(step, sn, sizeof(sn)));
        return rc == NRS_JOIN_JOINED ? 0 : -1;
    }
    r->lock_fd = fd;
    r->locked = true;
    deadline = nrs_now_ms() + NRS_CTL_WAIT_MS;
    if (deadline > end)
        deadline = end;
    /* Waiters may wait for us until we have failed and stopped the watcher. */
    long long until = nrs_wall_ms() + (long long)(deadline - nrs_now_ms()) + NRS_STOP_WAIT_MS +
                      1500 + NRS_SOCK_GONE_MS;
    nrs_ctl_rec_write(r, "starting", until, "");
    pid = nrs_remote_spawn(sp, r, watcher);
    if (pid < 0)
        goto fail;
    r->watcher = pid;
    nrs_ctl_rec_write(r, "starting", until, "");
    if (nrs_remote_wait_socket(r, pid, deadline) < 0)
        goto fail;
    nrs_ctl_rec_write(r, "running", 0, "");
    nrs_info("job %u step %u: controller started (watcher pid %d, socket dir %s)", r->job_id,
             r->step_id, (int)pid, r->job_dir);
    return 0;
fail:
    nrs_spank_strlcpy(why, nrs_spank_last_error, sizeof(why));
    nrs_remote_stop_watcher(r, NRS_STOP_WAIT_MS, why);
    return -1;
}

/* A step that does not run on the job's first node starts no controller.
 * Where it sees the first node's job directory (a state_dir shared by the
 * nodes, or several nodes on one machine) and a step there holds the lock,
 * it waits for that controller like a step on the first node, so that its
 * tasks find it answering; otherwise it goes on without waiting. It never
 * fails the step (its tasks keep NEREUS_*), but srun's output says when it
 * surely has no controller: the lock is seen and nobody holds it, or the
 * controller it waited for failed or never answered. */
void nrs_remote_controller_find(nrs_remote_t *r)
{
    char sn[16], why[NRS_SPANK_MSG_MAX];
    unsigned step = 0;
    int fd = nrs_ctl_lock_open_remote(r, why, sizeof(why)), rc = NRS_JOIN_NONE;

    if (fd < 0) {
        bool own = strcmp(r->ctl_dir, r->job_dir) == 0;

        if (errno == ENOENT && own)
            /* state_dir without %n: this node's own job directory, the first
             * node's only where state_dir is shared: cannot tell. */
            nrs_info("job %u step %u: no controller.lock in %s, this node's own job directory "
                     "(state_dir without %%n: the first node's %s only where state_dir is "
                     "shared): cannot tell whether a step there runs the job's controller; the "
                     "tasks here start without waiting for it", r->job_id, r->step_id,
                     r->ctl_dir, r->first);
        else if (errno == ENOENT)
            /* A real cluster: the first node's state_dir is on another machine. */
            nrs_info("job %u step %u: this step does not run on the job's first node %s, whose "
                     "job directory is not seen from %s (%s): the tasks here start without "
                     "waiting for its controller", r->job_id, r->step_id, r->first, r->node, why);
        else
            nrs_info("job %u step %u: this step does not run on the job's first node %s, and does "
                     "not wait for its controller: %s", r->job_id, r->step_id, r->first, why);
        return;
    }
    rc = nrs_ctl_join(r, fd, false, nrs_now_ms() + NRS_INIT_WAIT_MS, &step);
    close(fd);
    if (rc == NRS_JOIN_JOINED)
        nrs_debug("job %u step %u: the job's controller (step %s's, on %s) answers", r->job_id,
                  r->step_id, nrs_step_name(step, sn, sizeof(sn)), r->first);
    else if (rc == NRS_JOIN_ELSEWHERE)
        nrs_info("job %u step %u: this step does not run on the job's first node %s, whose "
                 "controller runs on another machine: the tasks here start without waiting for it",
                 r->job_id, r->step_id, r->first);
    else if (rc == NRS_JOIN_NONE) /* said to the user: this step will have no controller */
        slurm_error(NRS_SPANK_PREFIX "job %u step %u: no step of this job runs its controller on "
                    "its first node %s now, and this step does not run there: its tasks start "
                    "without one (include %s in the step, or start a step with --nereus there "
                    "first)", r->job_id, r->step_id, r->first, r->first);
    else if (rc != NRS_JOIN_UNKNOWN)
        slurm_error(NRS_SPANK_PREFIX "job %u step %u: this step does not run on the job's first "
                    "node %s, whose controller it waited for: its tasks start without it",
                    r->job_id, r->step_id, r->first);
}

/* The job's first node is one of this step's nodes (SLURM_STEP_NODELIST, as
 * srun sets it, however long; without one: assume so, as before). A list
 * that is set but cannot be read or parsed: -1, the step runs without
 * Nereus rather than guess. */
int nrs_remote_step_has_first(spank_t sp, const nrs_remote_t *r)
{
    spank_err_t rc;
    char *list = nrs_remote_getenv_dup(sp, "SLURM_STEP_NODELIST", &rc);
    hostlist_t hl = NULL;
    int has;

    if (list == NULL && rc == ESPANK_ENV_NOEXIST)
        return 1;
    if (list == NULL || (hl = slurm_hostlist_create(list)) == NULL) {
        nrs_err("SLURM_STEP_NODELIST %s: cannot tell whether the step runs on the job's first "
                "node: refusing Nereus for this step",
                list == NULL ? spank_strerror(rc) : "is not a node list");
        free(list);
        return -1;
    }
    has = slurm_hostlist_find(hl, r->first) >= 0 ? 1 : 0;
    slurm_hostlist_destroy(hl);
    free(list);
    return has;
}
