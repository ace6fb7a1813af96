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
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
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

int nrs_pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    return -1;
#endif
}

/* Whether the child pid has exited, without reaping it (its pid stays ours,
 * for the kill and nrs_reap_bounded after): pidfd, where there is one, is
 * readable once it has (revents: its poll's); else waitid(WNOWAIT). A child
 * that someone else reaped (ECHILD) is gone too. */
static bool nrs_child_exited(pid_t pid, int pidfd, short revents)
{
    siginfo_t si;

    if (pidfd >= 0)
        return revents != 0;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        return errno == ECHILD;
    return si.si_pid == pid;
}

/* The output's end is not EOF alone: a process that another thread of
 * slurmstepd forked while the pipe's write end was open here holds a copy
 * of it (close-on-exec closes it only if that process execs), and EOF would
 * then come only when it exits. Every write of the child's is in the pipe
 * once it has exited: its exit is looked at first, then the pipe read, so
 * that what this read misses was never written. */
ssize_t nrs_child_read(int rfd, pid_t pid, int pidfd, bool *exited, void *buf, size_t n,
                       double deadline, int wait_ms)
{
    double now = nrs_now_ms(), until = wait_ms < 0 ? deadline : now + wait_ms;

    for (;; now = nrs_now_ms()) {
        struct pollfd p[2] = {{rfd, POLLIN, 0}, {pidfd, POLLIN, 0}};
        int left = (int)((until < deadline ? until : deadline) - now);
        ssize_t k;

        if (now >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (left < 0)
            left = 0;
        if (pidfd < 0 && left > NRS_EXIT_POLL_MS)
            left = NRS_EXIT_POLL_MS;
        if (poll(p, pidfd >= 0 ? 2 : 1, left) < 0 && errno != EINTR)
            return -1;
        *exited = *exited || nrs_child_exited(pid, pidfd, p[1].revents);
        if (p[0].revents != 0 || *exited) {
            k = read(rfd, buf, n);
            if (k >= 0)
                return k; /* data, or EOF */
            if (errno != EINTR && errno != EAGAIN)
                return -1;
            if (errno == EAGAIN && *exited)
                return 0; /* drained */
        }
        if (nrs_now_ms() >= until && until < deadline) {
            errno = EAGAIN;
            return -1;
        }
    }
}

/* Read the child pid's answer from rfd (non-blocking) into buf[cap] until
 * its output has ended (nrs_child_read: the child has exited and its answer
 * is drained, or EOF), buf is full, or the deadline: its length, or -1 at
 * the deadline. */
static ssize_t nrs_bounded_read(int rfd, pid_t pid, char *buf, size_t cap, double deadline)
{
    int pidfd = nrs_pidfd_open(pid);
    bool exited = false;
    size_t got = 0;
    ssize_t k = 1;

    while (got < cap && (k = nrs_child_read(rfd, pid, pidfd, &exited, buf + got, cap - got,
                                            deadline, -1)) > 0)
        got += (size_t)k;
    if (pidfd >= 0)
        close(pidfd);
    return k < 0 && errno == ETIMEDOUT ? -1 : (ssize_t)got;
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
    /* Close-on-exec: a process another thread forks and execs meanwhile
     * keeps no copy of it (one that only forks does: nrs_bounded_read). */
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        snprintf(out, n, "pipe: %s", strerror(errno));
        return NRS_BOUNDED_ERROR;
    }
    if (fcntl(pfd[0], F_SETFL, O_NONBLOCK) != 0) { /* the read end only */
        snprintf(out, n, "fcntl: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
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
    got = nrs_bounded_read(pfd[0], pid, buf, sizeof(buf), deadline);
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
