/* Filesystem work that may hang, done in a child with a bounded wait.
 *
 * A hung NFS server or FUSE daemon (a user can mount one, e.g. sshfs, and
 * stop answering) blocks whoever touches a path on it in the kernel, where
 * no time-out of ours reaches: realpath() or open() of the job's spec in
 * user_init would hold slurmstepd, and with it the step's launch, for good.
 * So slurmstepd forks a child that does the work with the same credentials
 * and working directory, and waits for its answer at most a bound; a child
 * that has not answered by then is SIGKILLed (NFS and FUSE waits are
 * killable) and the caller fails the --nereus step with a clear message.
 * Nothing here runs for a step without --nereus. */
#define _GNU_SOURCE /* closefrom */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nrs_spank.h"

void nrs_reap_bounded(pid_t pid, int ms, int *status)
{
    double end = nrs_now_ms() + ms;

    for (;;) {
        pid_t p = waitpid(pid, status, WNOHANG);

        if (p == pid || (p < 0 && errno != EINTR) || nrs_now_ms() >= end)
            return;
        poll(NULL, 0, 5);
    }
}

/* In the child: every signal blocked (slurmstepd's handlers are not for it;
 * only the parent's SIGKILL ends it), no descriptor of slurmstepd kept but
 * stdio and the answer's pipe (so that one left stuck holds none of the
 * step's), fn's result written, _exit. No slurm_* call: another thread of
 * slurmstepd may have held the log's lock at the fork. */
static void nrs_bounded_child(int wfd, nrs_bounded_fn fn, void *arg, char *out, size_t n)
{
    sigset_t all;
    int rc;

    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    if (wfd != 3) {
        if (dup2(wfd, 3) < 0)
            _exit(1);
        wfd = 3;
    }
    closefrom(4);
    out[0] = '\0';
    rc = fn(arg, out, n);
    out[n - 1] = '\0';
    if (write(wfd, &rc, sizeof(rc)) == (ssize_t)sizeof(rc) &&
        write(wfd, out, strlen(out) + 1) < 0)
        _exit(1);
    _exit(0);
}

/* Read the child's answer from rfd until EOF or deadline into buf[cap]:
 * its length, or -1 at the deadline. */
static ssize_t nrs_bounded_read(int rfd, char *buf, size_t cap, double deadline)
{
    size_t got = 0;

    for (;;) {
        struct pollfd p = {rfd, POLLIN, 0};
        int left = (int)(deadline - nrs_now_ms());
        ssize_t k;

        if (left <= 0)
            return -1;
        if (poll(&p, 1, left) <= 0)
            continue; /* EINTR, or the deadline (checked above) */
        k = read(rfd, buf + got, got < cap ? cap - got : 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0 || got + (size_t)k >= cap)
            return (ssize_t)(got + (size_t)(k > 0 ? k : 0));
        got += (size_t)k;
    }
}

int nrs_bounded_call(int ms, nrs_bounded_fn fn, void *arg, char *out, size_t n)
{
    char buf[sizeof(int) + NRS_BOUNDED_OUT_MAX];
    double deadline = nrs_now_ms() + ms;
    int pfd[2], rc = NRS_BOUNDED_ERROR;
    ssize_t got;
    pid_t pid;

    out[0] = '\0';
    if (n > NRS_BOUNDED_OUT_MAX)
        n = NRS_BOUNDED_OUT_MAX;
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        snprintf(out, n, "pipe: %s", strerror(errno));
        return NRS_BOUNDED_ERROR;
    }
    pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        nrs_bounded_child(pfd[1], fn, arg, out, n);
    }
    close(pfd[1]);
    if (pid < 0) {
        snprintf(out, n, "fork: %s", strerror(errno));
        close(pfd[0]);
        return NRS_BOUNDED_ERROR;
    }
    got = nrs_bounded_read(pfd[0], buf, sizeof(buf), deadline);
    close(pfd[0]);
    if (got < 0) {
        /* Ours, not reaped yet: the pid cannot be another process's. */
        kill(pid, SIGKILL);
        rc = NRS_BOUNDED_TIMEOUT;
    } else if ((size_t)got < sizeof(int)) {
        snprintf(out, n, "the helper process ended without an answer");
    } else {
        memcpy(&rc, buf, sizeof(int));
        got -= (ssize_t)sizeof(int);
        if ((size_t)got >= n)
            got = (ssize_t)n - 1;
        memcpy(out, buf + sizeof(int), (size_t)got);
        out[got] = '\0';
    }
    /* A child stuck in an unkillable wait is left; whoever reaps it then
     * (slurmstepd, init) finds nothing of ours to act on. */
    nrs_reap_bounded(pid, 1000, NULL);
    return rc;
}

static int nrs_fs_lstat(void *arg, char *out, size_t n)
{
    struct stat st;

    (void)out;
    (void)n;
    (void)lstat((const char *)arg, &st); /* any answer will do */
    return 0;
}

int nrs_fs_answers(const char *path, const char *what, char *why, size_t n)
{
    char out[256];

    if (nrs_bounded_call(NRS_FS_WAIT_MS, nrs_fs_lstat, (void *)path, out, sizeof(out)) !=
        NRS_BOUNDED_TIMEOUT)
        return 0;
    nrs_fs_hung_why(why, n, what, path);
    return -1;
}

void nrs_fs_hung_why(char *why, size_t n, const char *what, const char *path)
{
    snprintf(why, n, "%s %.900s: its filesystem did not answer within %d s (a hung NFS or FUSE "
             "mount?)", what, path, NRS_FS_WAIT_MS / 1000);
}
