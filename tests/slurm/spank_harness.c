/* The plugin's own code driven outside Slurm, through the fake SPANK API of
 * fake_spank.c: cases a live cluster cannot stage (or not cheaply), each a
 * way the job's user could make slurmstepd or root's epilog hang, reach
 * what the user could not, or pick the wrong node. Built and run, as root,
 * by test_harness.sh:
 *
 *   spank_harness CASE BASE RUNTIME_DIR SPEC
 *
 * BASE: an empty directory of root's (not writable by others) for the state
 * dir and the cases' files; prints "PASS: ..." or "FAIL: ..." and exits 0 or
 * 1 (3: hung, ended by the alarm; a case that may block in the kernel is
 * ended by a watchdog process instead, which SIGKILLs it), or "SKIP: ..."
 * and 77. Uids 1000 and 1001 stand for two users (setpriv --reuid: they
 * need not exist).
 *
 *   spank_harness --socket-dir DIR ...
 *
 * is a look-alike of a job's nereus-watcher (its command line, when run as
 * ".../nereus-watcher"): it waits to be killed.
 *
 * test_harness.sh links it with -Wl,--wrap=fork,--wrap=clock_gettime: the
 * plugin's forks and clock go through __wrap_fork and __wrap_clock_gettime
 * below, which do as the real ones unless a case says otherwise. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ctl_lock.h"

extern int fake_ctx;
extern uint32_t fake_job, fake_step;
extern uid_t fake_uid;
extern gid_t fake_gid;
extern struct spank_option *fake_opt;
extern char *fake_argv0;
void fake_setenv(const char *name, const char *value);

static const char *base, *rt, *spec;
static char *conf[3];

#define AS_1000 "setpriv --reuid=1000 --regid=1000 --clear-groups "
#define AS_1001 "setpriv --reuid=1001 --regid=1001 --clear-groups "

static int result(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "PASS" : "FAIL", what);
    return ok ? 0 : 1;
}

static int skip(const char *why)
{
    printf("SKIP: %s\n", why);
    return 77;
}

static void on_alarm(int sig)
{
    static const char m[] = "FAIL: still blocked when the alarm rang (a hang)\n";

    (void)sig;
    if (write(1, m, sizeof(m) - 1) < 0)
        _exit(3);
    _exit(3);
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    return system(cmd);
}

/* ---- another thread of slurmstepd forks meanwhile -------------------------------
 *
 * With hold_next_fork set, the next fork (the plugin's) first forks a holder:
 * a process that keeps a copy of every descriptor open until killed, as a
 * process that another thread of slurmstepd forks (without an exec) between
 * the plugin's pipe2 and its close of the pipe's write end does. Its pid is
 * in fork_holder (holder_end kills it); it dies with us (PDEATHSIG). */
pid_t __real_fork(void);
pid_t __wrap_fork(void);
static bool hold_next_fork;
static pid_t fork_holder;

pid_t __wrap_fork(void)
{
    if (hold_next_fork) {
        pid_t h = __real_fork();

        hold_next_fork = false;
        if (h == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            for (;;)
                pause();
        }
        fork_holder = h;
    }
    return __real_fork();
}

static void holder_end(void)
{
    if (fork_holder > 0 && kill(fork_holder, SIGKILL) == 0)
        waitpid(fork_holder, NULL, 0);
    fork_holder = 0;
}

/* With clock_frozen set, CLOCK_MONOTONIC (the plugin's nrs_now_ms) stands
 * still: a wait then ends only by what it waits for, never by its deadline. */
int __real_clock_gettime(clockid_t c, struct timespec *ts);
int __wrap_clock_gettime(clockid_t c, struct timespec *ts);
static bool clock_frozen;

int __wrap_clock_gettime(clockid_t c, struct timespec *ts)
{
    static struct timespec at;

    if (!clock_frozen || c != CLOCK_MONOTONIC)
        return __real_clock_gettime(c, ts);
    if (at.tv_sec == 0 && __real_clock_gettime(c, &at) != 0)
        return -1;
    *ts = at;
    return 0;
}

/* A job directory of root's, as the plugin leaves it for user_init. */
static void job_dir(nrs_remote_t *r, const char *name)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->job_dir, sizeof(r->job_dir), "%s/%s", base, name);
    sh("rm -rf %s; mkdir -m 700 %s", r->job_dir, r->job_dir);
    snprintf(r->ctl_dir, sizeof(r->ctl_dir), "%s", r->job_dir);
    snprintf(r->spec, sizeof(r->spec), "%s", spec);
    r->job_id = fake_job;
    r->uid = getuid();
    r->gid = getgid();
    r->ctl_here = true;
    r->lock_fd = -1;
}

/* F1: watcher.log a FIFO: nrs_remote_spawn refuses it at once. */
static int case_fifo_spawn(void)
{
    char prog[NRS_SPANK_PATH_MAX + 32];
    nrs_remote_t r;
    pid_t pid;

    job_dir(&r, "fifo-spawn");
    sh("mkfifo %s/watcher.log", r.job_dir);
    snprintf(prog, sizeof(prog), "%s/nereus-watcher", rt);
    alarm(10);
    pid = nrs_remote_spawn(NULL, &r, prog);
    alarm(0);
    if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return result(pid < 0 && strstr(nrs_spank_last_error, "watcher.log") != NULL,
                  "a FIFO as watcher.log: nrs_remote_spawn refuses it at once");
}

/* F2: the record says "running" (another process holds the lock), its
 * watcher is gone, controller.log is a FIFO: the join fails at once with no
 * hang in nrs_remote_log_tail. */
static int case_fifo_join(void)
{
    char lock[NRS_SPANK_PATH_MAX + 32], rec[4096], host[64];
    nrs_remote_t r;
    pid_t holder;
    int fd, rc, n;

    job_dir(&r, "fifo-join");
    sh("mkfifo %s/controller.log %s/watcher.log", r.job_dir, r.job_dir);
    snprintf(lock, sizeof(lock), "%s/controller.lock", r.job_dir);
    nrs_remote_host_name(host, sizeof(host));
    n = snprintf(rec, sizeof(rec), "running 1 0 999999 %s 0 %s ", host, spec);
    memset(rec + n, ' ', sizeof(rec) - (size_t)n);
    rec[sizeof(rec) - 1] = '\n';
    fd = open(lock, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || write(fd, rec, sizeof(rec)) != (ssize_t)sizeof(rec))
        return result(0, "cannot write the record");
    holder = fork();
    if (holder == 0) { /* another step holds the lock */
        flock(fd, LOCK_EX);
        sleep(30);
        _exit(0);
    }
    close(fd);
    usleep(200000);
    alarm(25);
    rc = nrs_remote_controller_start(NULL, &r);
    alarm(0);
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    return result(rc < 0 && strstr(nrs_spank_last_error, "no longer running") != NULL,
                  "a FIFO as controller.log of a gone controller: the join fails at once");
}

/* F4: this node is nodeB, the job's first node is nodeA, in a node list
 * longer than 8 KiB (nodes every other number, as Slurm compresses a
 * fragmented allocation); or a node list that does not parse. */
static int post_opt_on_nodeB(const char *job_list, const char *step_list)
{
    fake_setenv("SLURM_JOB_NODELIST", job_list);
    fake_setenv("SLURM_NODELIST", job_list);
    fake_setenv("SLURM_STEP_NODELIST", step_list);
    setenv("SLURMD_NODENAME", "nodeB", 1);
    fake_ctx = S_CTX_REMOTE;
    if (slurm_spank_init(NULL, 3, conf) != 0)
        return -2;
    fake_opt->cb(fake_opt->val, spec, 1);
    return slurm_spank_init_post_opt(NULL, 3, conf);
}

static char *long_list(const char *first, int nodes)
{
    char *list = malloc(16 * (size_t)nodes + 64), *p = list;

    p += sprintf(p, "%s,node[", first);
    for (int i = 0; i < nodes; i++)
        p += sprintf(p, "%s%05d", i ? "," : "", 2 * i + 1);
    sprintf(p, "]");
    return list;
}

static int case_long_nodelist(void)
{
    char path[NRS_SPANK_PATH_MAX], got[64] = "";
    char *list = long_list("nodeA", 3000);
    FILE *f;
    int rc;

    fake_job = 4301;
    rc = post_opt_on_nodeB(list, "nodeB");
    snprintf(path, sizeof(path), "%s/state/nodeB/%u/ctl_node", base, fake_job);
    if ((f = fopen(path, "r")) != NULL) {
        if (fgets(got, sizeof(got), f) == NULL)
            got[0] = '\0';
        fclose(f);
    }
    got[strcspn(got, "\n")] = '\0';
    printf("  SLURM_JOB_NODELIST of %zu bytes: post_opt %d, ctl_node '%s'\n", strlen(list), rc,
           got);
    free(list);
    return result(rc == 0 && strcmp(got, "nodeA") == 0,
                  "a node list over 8 KiB: the job's first node is still its first (nodeA)");
}

static int case_bad_nodelist(void)
{
    char path[NRS_SPANK_PATH_MAX];
    struct stat st;
    int rc;

    fake_job = 4302;
    rc = post_opt_on_nodeB("node[5-1]", "nodeB");
    snprintf(path, sizeof(path), "%s/state/nodeB/%u", base, fake_job);
    printf("  post_opt %d: %s\n", rc, nrs_spank_last_error);
    return result(rc < 0 && strstr(nrs_spank_last_error, "cannot tell the job's first node") &&
                  stat(path, &st) != 0,
                  "a node list that does not parse: Nereus refused for the step, said why, "
                  "no guess from the host name");
}

static int case_has_first(void)
{
    char *list = long_list("nodeC", 3000);
    nrs_remote_t r;
    int no, bad;

    memset(&r, 0, sizeof(r));
    snprintf(r.first, sizeof(r.first), "nodeA");
    fake_setenv("SLURM_STEP_NODELIST", list);
    no = nrs_remote_step_has_first(NULL, &r);
    fake_setenv("SLURM_STEP_NODELIST", "node[5-1]");
    bad = nrs_remote_step_has_first(NULL, &r);
    printf("  long step list without nodeA: %d; unparsable: %d\n", no, bad);
    free(list);
    return result(no == 0 && bad < 0,
                  "nrs_remote_step_has_first reads a step node list over 8 KiB, refuses a bad one");
}

/* F3: the user moved into their job dir a directory they may rename,
 * holding another user's private directory: root's epilog must not remove
 * what the user could not. */
static int case_epilog_foreign(void)
{
    char victim[NRS_SPANK_PATH_MAX], jd[NRS_SPANK_PATH_MAX];

    fake_job = 4303;
    fake_uid = 1000;
    fake_gid = 1000;
    fake_ctx = S_CTX_JOB_SCRIPT;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    snprintf(jd, sizeof(jd), "%s/state/nodeB/%u", base, fake_job);
    sh("mkdir -p -m 755 %s/state %s/state/nodeB && rm -rf %s %s/home", base, base, jd, base);
    if (sh("mkdir -m 755 %s/home && chown 1000:1000 %s/home && mkdir -m 777 %s/home/shared && "
           "chown 1000:1000 %s/home/shared && " AS_1001 "sh -c 'mkdir -m 755 %s/home/shared/b "
           "&& echo data >%s/home/shared/b/file' && mkdir -m 700 %s && echo nodeB >%s/ctl_node "
           "&& chown 1000:1000 %s && " AS_1000 "mv %s/home/shared %s/ && " AS_1000
           "mkdir %s/own && " AS_1000 "touch %s/own/f",
           base, base, base, base, base, base, jd, jd, jd, base, jd, jd, jd) != 0)
        return result(0, "cannot stage the case (setpriv?)");
    setenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus", spec, 1);
    slurm_spank_job_epilog(NULL, 3, conf);
    unsetenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus");
    snprintf(victim, sizeof(victim), "%s/shared/b/file", jd);
    printf("  uid 1001's file after the epilog of uid 1000's job: %s; the user's own "
           "directory: %s\n", access(victim, F_OK) == 0 ? "kept" : "REMOVED",
           sh("test -e %s/own", jd) == 0 ? "kept" : "removed");
    return result(access(victim, F_OK) == 0 && sh("test -e %s/own", jd) != 0,
                  "root's clean-up leaves another user's directory in the job dir alone");
}

/* F7: a job without --nereus, whose id an earlier --nereus job of another
 * user had (its first node's logs are kept): the epilog says nothing. */
static int case_epilog_not_ours(void)
{
    char log[NRS_SPANK_PATH_MAX];
    struct stat st;
    int saved = dup(2), fd, quiet;

    fake_job = 4304;
    fake_uid = 1000;
    fake_ctx = S_CTX_JOB_SCRIPT;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    unsetenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus");
    sh("mkdir -p -m 755 %s/state %s/state/nodeB; d=%s/state/nodeB/%u; rm -rf $d; mkdir -m 700 $d "
       "&& touch $d/controller.log && chown -R 1001:1001 $d", base, base, base, fake_job);
    snprintf(log, sizeof(log), "%s/epilog-not-ours.err", base);
    fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    slurm_spank_job_epilog(NULL, 3, conf);
    dup2(saved, 2);
    close(fd);
    quiet = stat(log, &st) == 0 && st.st_size == 0;
    if (!quiet)
        sh("sed 's/^/  | /' %s", log);
    return result(quiet, "the epilog of a job without --nereus at another's kept job id is a "
                         "no-op and says nothing");
}

/* F6: ctl.sock a link to a socket the user cannot reach: task_exit (root)
 * never connects to it. */
static int case_sock_link(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    nrs_remote_t r;
    int ls, n = 0;
    pid_t w;

    job_dir(&r, "sock-link");
    r.uid = 1000;
    r.gid = 1000;
    sh("mkdir -m 700 %s/rootonly && chown 1000:1000 %s", base, r.job_dir);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/rootonly/private.sock", base);
    ls = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (ls < 0 || bind(ls, (void *)&sa, sizeof(sa)) != 0 || listen(ls, 64) != 0 ||
        sh(AS_1000 "ln -s %s %s/ctl.sock", sa.sun_path, r.job_dir) != 0)
        return result(0, "cannot stage the case");
    r.lock_fd = open("/dev/null", O_RDONLY);
    r.locked = true;
    w = fork();
    if (w == 0)
        _exit(0); /* the watcher has exited already */
    r.watcher = w;
    usleep(100000);
    nrs_remote_stop_watcher(&r, 3000, NULL);
    for (int c; (c = accept(ls, NULL, NULL)) >= 0; n++)
        close(c);
    printf("  connections to the root-only socket: %d\n", n);
    return result(n == 0, "stop_watcher (root) never connects through a ctl.sock link");
}

/* F8: --nereus=FILE too long for the remote side says so. */
static int case_long_arg(void)
{
    char *arg = malloc(5001);
    int rc;

    memset(arg, 'a', 5000);
    arg[0] = '/';
    arg[5000] = '\0';
    fake_job = 4305;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    fake_setenv("SLURM_JOB_NODELIST", "nodeB");
    fake_ctx = S_CTX_REMOTE;
    slurm_spank_init(NULL, 3, conf);
    fake_opt->cb(fake_opt->val, arg, 1);
    rc = slurm_spank_init_post_opt(NULL, 3, conf);
    free(arg);
    printf("  post_opt %d: %s\n", rc, nrs_spank_last_error);
    return result(rc < 0 && strstr(nrs_spank_last_error, "path longer than 4095 bytes"),
                  "--nereus=FILE over 4095 bytes: the step says the path is too long");
}

/* A remote step of job (this node nodeB, the job's first) with --nereus=arg
 * (NULL: bare, default_spec) and argv[0] cmd: init_post_opt's result. */
static int remote_post_opt(uint32_t job, const char *arg, char *cmd)
{
    fake_job = job;
    fake_argv0 = cmd;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    fake_setenv("SLURM_JOB_NODELIST", "nodeB");
    fake_ctx = S_CTX_REMOTE;
    slurm_spank_init(NULL, 3, conf);
    fake_opt->cb(fake_opt->val, arg, 1);
    return slurm_spank_init_post_opt(NULL, 3, conf);
}

/* "--nereus job.yaml" where job.yaml's path is long (300 bytes): the message
 * shows the command, cut short. Before: it was copied only if it fitted 256
 * bytes, else a buffer never written was printed (and made printable in
 * place, up to the first zero byte past it: slurmstepd's stack). */
static int case_long_argv(void)
{
    static char cmd[400];
    int rc;

    memset(cmd, 'a', 300);
    cmd[0] = '/';
    snprintf(cmd + 300, sizeof(cmd) - 300, "/job.yaml");
    rc = remote_post_opt(4317, NULL, cmd);
    fake_argv0 = "python";
    printf("  post_opt %d: %.200s...\n", rc, nrs_spank_last_error);
    return result(rc < 0 && strstr(nrs_spank_last_error, "(the command is /aaaa") &&
                      strstr(nrs_spank_last_error, "aaa...)"),
                  "'--nereus FILE' with a 300-byte FILE: the message shows it, cut short");
}

/* The lines of the log file path (printed), in *lines: how many do not begin
 * with prefix or hold a byte that is not printable ASCII; -1: unreadable. */
static int log_lines_bad(const char *path, const char *prefix, int *lines)
{
    char line[4096];
    int bad = 0;
    FILE *f = fopen(path, "r");

    *lines = 0;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f) != NULL) {
        (*lines)++;
        printf("  | %s", line);
        line[strcspn(line, "\n")] = '\0';
        bad += strncmp(line, prefix, strlen(prefix)) != 0;
        for (char *c = line; *c; c++)
            bad += nrs_spank_printable_char(*c) != *c;
    }
    fclose(f);
    return bad;
}

/* A spec path of the user's with a line break and an escape in it, on the
 * remote side: what root's log gets (stderr here) is one line per message,
 * each with the plugin's prefix. Before: the path's "\n" began a line of
 * its own, with no prefix (a forged log line). */
static int case_log_lines(void)
{
    char arg[NRS_SPANK_PATH_MAX], log[NRS_SPANK_PATH_MAX];
    int saved = dup(2), fd, rc, lines, bad;

    snprintf(arg, sizeof(arg), "%s/no\nerror: forged \033[2Jline.yaml", base);
    snprintf(log, sizeof(log), "%s/log-lines.err", base);
    fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    rc = remote_post_opt(4318, arg, "python");
    if (rc == 0)
        rc = slurm_spank_user_init(NULL, 3, conf);
    dup2(saved, 2);
    close(fd);
    bad = log_lines_bad(log, "[error] nereus: ", &lines);
    return result(rc < 0 && lines > 0 && bad == 0 && strchr(nrs_spank_last_error, '\n') == NULL,
                  "a spec path with a line break and an escape: each message one line of "
                  "printable text, with the prefix, in root's log");
}


/* ---- S1: the epilog kills only the job's own daemons -------------------------
 *
 * Its job directory <state>/nodeB/<job> (uid 1000's, mode mode) with a
 * process in it that looks like the job's watcher: this program run as
 * ".../nereus-watcher --socket-dir DIR ...", as uid, working directory DIR. */
static pid_t look_alike(uid_t uid, const char *dir)
{
    char exe[NRS_SPANK_PATH_MAX], path[64], cmd[256];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    pid_t pid;

    if (k <= 0)
        return -1;
    exe[k] = '\0';
    pid = fork();
    if (pid == 0) {
        char *argv[] = {"/opt/nereus/bin/nereus-watcher", "--socket-dir", (char *)dir, "--job",
                        "4306", (char *)spec, NULL};

        if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 ||
            setresuid(uid, uid, uid) != 0 || chdir(dir) != 0)
            _exit(126);
        execv(exe, argv);
        _exit(127);
    }
    /* Until it runs as the look-alike (bounded: the case's alarm). */
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    for (;;) {
        int fd = open(path, O_RDONLY);

        k = fd >= 0 ? read(fd, cmd, sizeof(cmd) - 1) : -1;
        if (fd >= 0)
            close(fd);
        if (k > 0 && memmem(cmd, (size_t)k, "--socket-dir", 12) != NULL)
            return pid;
        if (waitpid(pid, NULL, WNOHANG) != 0)
            return -1;
        usleep(10000);
    }
}

static void epilog_job_dir(const char *jd, unsigned mode)
{
    sh("mkdir -p -m 755 %s/state %s/state/nodeB && rm -rf %s && mkdir -m 700 %s && "
       "echo nodeB >%s/ctl_node && chown -R 1000:1000 %s && chmod %o %s",
       base, base, jd, jd, jd, jd, mode, jd);
}

static void epilog_run(uint32_t job)
{
    fake_job = job;
    fake_uid = 1000;
    fake_gid = 1000;
    fake_ctx = S_CTX_JOB_SCRIPT;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    setenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus", spec, 1);
    slurm_spank_job_epilog(NULL, 3, conf);
    unsetenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus");
}

/* The job's own watcher (uid 1000, its command line, in the job directory)
 * still running at the epilog: SIGKILLed, the directory cleaned. */
static int case_epilog_kill_ours(void)
{
    char jd[NRS_SPANK_PATH_MAX];
    pid_t pid;
    int st = 0;

    snprintf(jd, sizeof(jd), "%s/state/nodeB/4306", base);
    epilog_job_dir(jd, 0700);
    alarm(30);
    pid = look_alike(1000, jd);
    if (pid < 0)
        return result(0, "cannot start the look-alike");
    epilog_run(4306);
    waitpid(pid, &st, 0);
    alarm(0);
    printf("  the job's watcher: %s; job dir: %s\n",
           WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL ? "SIGKILLed" : "NOT killed",
           access(jd, F_OK) == 0 ? "kept" : "removed");
    return result(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL && access(jd, F_OK) != 0,
                  "the job's own watcher left in its job dir is SIGKILLed, the dir cleaned");
}

/* The same command line and working directory, but uid 1001's process (the
 * job's user opened its job directory to others): left alone, and so is the
 * directory. Before: SIGKILLed by root's epilog. */
static int case_epilog_kill_foreign(void)
{
    char jd[NRS_SPANK_PATH_MAX];
    pid_t pid, gone;

    snprintf(jd, sizeof(jd), "%s/state/nodeB/4307", base);
    epilog_job_dir(jd, 0755);
    alarm(30);
    pid = look_alike(1001, jd);
    if (pid < 0)
        return result(0, "cannot start the look-alike");
    epilog_run(4307);
    alarm(0);
    gone = waitpid(pid, NULL, WNOHANG);
    printf("  uid 1001's look-alike: %s; job dir: %s\n", gone == 0 ? "running" : "KILLED",
           access(jd, F_OK) == 0 ? "kept" : "removed");
    if (gone == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    return result(gone == 0 && access(jd, F_OK) == 0,
                  "another user's look-alike of the job's watcher in the job dir is not killed "
                  "(the dir is left in place)");
}

/* ---- S4: a hung filesystem never hangs slurmstepd ------------------------------
 *
 * A FUSE mount at dir whose daemon never answers (the connection's
 * /dev/fuse descriptor, returned, is never read): everything below it
 * blocks in the kernel, killably, as on a hung NFS or FUSE mount. -1: no
 * FUSE here. */
static int hung_mount(const char *dir)
{
    char opts[128];
    int fd;

    mkdir(dir, 0755);
    fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0,allow_other", fd);
    if (mount("nrs-hung", dir, "fuse.nrs-hung", MS_NOSUID | MS_NODEV, opts) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Ends the connection (every waiter gets ENOTCONN) and detaches the mount. */
static void hung_umount(const char *dir, int fd)
{
    close(fd);
    umount2(dir, MNT_DETACH);
}

/* A process blocked in the kernel runs no SIGALRM handler (only a fatal
 * signal ends a killable wait): a watchdog process says so after secs and
 * SIGKILLs us. Started before the mount, so it holds no /dev/fuse. */
static pid_t watchdog(int secs)
{
    pid_t parent = getpid(), w = fork();

    if (w == 0) {
        sleep((unsigned)secs);
        printf("FAIL: still blocked after %d s (a hang)\n", secs);
        kill(parent, SIGKILL);
        _exit(3);
    }
    return w;
}

static void watchdog_stop(pid_t w)
{
    kill(w, SIGKILL);
    waitpid(w, NULL, 0);
}

/* The plugin gives up after 10 s (NRS_FS_WAIT_MS); a hang is what outlasts this. */
enum { HUNG_LIMIT_S = 30 };

/* A case's start: the watchdog (*w), then the hung mount at BASE/hung
 * (mnt[n]): its fd, or -1 (no FUSE here; the watchdog stopped: skip). */
static int hung_start(char *mnt, size_t n, pid_t *w)
{
    int fd;

    *w = watchdog(HUNG_LIMIT_S);
    snprintf(mnt, n, "%s/hung", base);
    if ((fd = hung_mount(mnt)) < 0)
        watchdog_stop(*w);
    return fd;
}
#define NO_FUSE "no FUSE mount possible here (/dev/fuse, mount(2))"

/* --nereus=<hung mount>/spec.yaml: user_init (slurmstepd) gives up. */
static int case_hung_spec(void)
{
    char mnt[NRS_SPANK_PATH_MAX], arg[NRS_SPANK_PATH_MAX + 16];
    pid_t w;
    int fd, rc;

    if ((fd = hung_start(mnt, sizeof(mnt), &w)) < 0)
        return skip(NO_FUSE);
    snprintf(arg, sizeof(arg), "%s/spec.yaml", mnt);
    fake_job = 4308;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    fake_setenv("SLURM_JOB_NODELIST", "nodeB");
    fake_ctx = S_CTX_REMOTE;
    rc = slurm_spank_init(NULL, 3, conf);
    fake_opt->cb(fake_opt->val, arg, 1);
    if (rc == 0)
        rc = slurm_spank_init_post_opt(NULL, 3, conf);
    if (rc == 0)
        rc = slurm_spank_user_init(NULL, 3, conf) < 0 ? -1 : 1;
    watchdog_stop(w);
    hung_umount(mnt, fd);
    printf("  user_init %d: %s\n", rc, nrs_spank_last_error);
    return result(rc < 0 && strstr(nrs_spank_last_error, "its filesystem did not answer within"),
                  "a spec on a hung FUSE mount: user_init gives up after its bound, says why");
}

/* --nereus=arg on the submission side: its callback, then init_post_opt's
 * check (which would end the process on a refusal). 0, or -1. */
static int submit_opt(const char *arg)
{
    return fake_opt->cb(fake_opt->val, arg, 0) < 0 ? -1 : nrs_spank_opt_check();
}

/* The submission side (srun, sbatch, salloc: local context, the user's own
 * process): --nereus=<hung mount>/spec.yaml is refused after the bound with
 * the reason; a good spec, given relative, is still taken and resolved. */
static int case_hung_submit(void)
{
    char mnt[NRS_SPANK_PATH_MAX], arg[NRS_SPANK_PATH_MAX + 16], want[PATH_MAX], dir[PATH_MAX];
    const char *slash = strrchr(spec, '/'), *env;
    pid_t w;
    int fd, hung, good;

    if ((fd = hung_start(mnt, sizeof(mnt), &w)) < 0)
        return skip(NO_FUSE);
    snprintf(arg, sizeof(arg), "%s/spec.yaml", mnt);
    fake_ctx = S_CTX_LOCAL;
    unsetenv(NRS_SPEC_PATH_ENV);
    slurm_spank_init(NULL, 3, conf);
    hung = submit_opt(arg);
    watchdog_stop(w);
    hung_umount(mnt, fd);
    printf("  hung: %d: %s\n", hung, nrs_spank_last_error);
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - spec) : 1, slash ? spec : ".");
    if (realpath(spec, want) == NULL || chdir(dir) != 0)
        return result(0, "the good spec's directory");
    good = submit_opt(slash ? slash + 1 : spec);
    env = getenv(NRS_SPEC_PATH_ENV);
    printf("  good: %d: abs %s, %s=%s\n", good, nrs_spank_opt.abs, NRS_SPEC_PATH_ENV,
           env ? env : "(unset)");
    return result(hung < 0 && strstr(nrs_spank_last_error, "its filesystem did not answer within") &&
                      strstr(nrs_spank_last_error, arg) && good == 0 &&
                      strcmp(nrs_spank_opt.abs, want) == 0 && env && strcmp(env, want) == 0,
                  "srun --nereus=<a spec on a hung FUSE mount> is refused after its bound, says "
                  "why; a good relative spec is still resolved and exported");
}

/* The job directory's mount stops answering while the step runs (a hung
 * FUSE mount laid over it after the lock was taken): task_exit's
 * stop_watcher (root) still stops the watcher (a look-alike of it, in the
 * job dir) and returns after its bound, saying why, instead of blocking in
 * the look for ctl.sock. The lock's file is under the mount, so its
 * descriptor still answers: this stages the paths, not a hung descriptor. */
static int case_hung_jobdir(void)
{
    char path[NRS_SPANK_PATH_MAX + 32], log[NRS_SPANK_PATH_MAX + 32], said[2048] = "";
    nrs_remote_t r;
    pid_t w, la;
    int fd, err, k, gone, saved = dup(2);

    job_dir(&r, "hung-jobdir");
    snprintf(path, sizeof(path), "%s/controller.lock", r.job_dir);
    snprintf(log, sizeof(log), "%s/hung-jobdir.err", base);
    r.lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (r.lock_fd < 0 || flock(r.lock_fd, LOCK_EX | LOCK_NB) != 0 ||
        (la = look_alike(getuid(), r.job_dir)) < 0)
        return result(0, "cannot stage the case");
    r.locked = true;
    r.watcher = la;
    w = watchdog(HUNG_LIMIT_S);
    if ((fd = hung_mount(r.job_dir)) < 0) {
        watchdog_stop(w);
        kill(la, SIGKILL);
        return skip(NO_FUSE);
    }
    err = open(log, O_RDWR | O_CREAT | O_TRUNC, 0600);
    dup2(err, 2);
    nrs_remote_stop_watcher(&r, 3000, NULL);
    dup2(saved, 2);
    watchdog_stop(w);
    hung_umount(r.job_dir, fd);
    /* Reaped by stop_watcher, or by us now. */
    gone = waitpid(la, NULL, WNOHANG) == la || (kill(la, 0) != 0 && errno == ESRCH);
    if (!gone)
        kill(la, SIGKILL);
    k = (int)pread(err, said, sizeof(said) - 1, 0);
    said[k > 0 ? k : 0] = '\0';
    close(err);
    printf("  watcher stopped %d, locked %d, said: %s", gone, r.locked, said);
    return result(gone && !r.locked && strstr(said, "job directory") &&
                      strstr(said, "its filesystem did not answer within"),
                  "the job directory's mount hangs mid-step: task_exit stops the watcher, "
                  "returns after its bound, says why");
}

/* runtime_dir on a hung mount: the controller's start gives up. */
static int case_hung_runtime(void)
{
    char mnt[NRS_SPANK_PATH_MAX], saved[NRS_SPANK_PATH_MAX];
    pid_t w;
    nrs_remote_t r;
    int fd, rc;

    if ((fd = hung_start(mnt, sizeof(mnt), &w)) < 0)
        return skip(NO_FUSE);
    job_dir(&r, "hung-runtime-job");
    snprintf(saved, sizeof(saved), "%s", nrs_spank_config.runtime_dir);
    snprintf(nrs_spank_config.runtime_dir, sizeof(nrs_spank_config.runtime_dir), "%s", mnt);
    rc = nrs_remote_controller_start(NULL, &r);
    snprintf(nrs_spank_config.runtime_dir, sizeof(nrs_spank_config.runtime_dir), "%s", saved);
    watchdog_stop(w);
    hung_umount(mnt, fd);
    printf("  controller_start %d: %s\n", rc, nrs_spank_last_error);
    return result(rc < 0 && strstr(nrs_spank_last_error, "its filesystem did not answer within"),
                  "runtime_dir on a hung FUSE mount: the controller's start gives up, says why");
}

/* The watcher's program on a hung mount (its child blocks in execve):
 * nrs_remote_spawn gives up. */
static int case_hung_exec(void)
{
    char mnt[NRS_SPANK_PATH_MAX], prog[NRS_SPANK_PATH_MAX + 32];
    pid_t w, pid;
    nrs_remote_t r;
    int fd;

    if ((fd = hung_start(mnt, sizeof(mnt), &w)) < 0)
        return skip(NO_FUSE);
    job_dir(&r, "hung-exec-job");
    snprintf(prog, sizeof(prog), "%s/nereus-watcher", mnt);
    pid = nrs_remote_spawn(NULL, &r, prog);
    watchdog_stop(w);
    hung_umount(mnt, fd);
    printf("  spawn %d: %s\n", (int)pid, nrs_spank_last_error);
    return result(pid < 0 && strstr(nrs_spank_last_error, "no answer within"),
                  "the watcher's exec blocked on a hung FUSE mount: the spawn gives up, says why");
}

/* The plugstack arguments with state_dir=<mnt>/%n, in hconf, parsed (the
 * plugin parses once per process). */
static char *hconf[3];
static void hung_conf(const char *mnt)
{
    static char a0[NRS_SPANK_PATH_MAX + 16];

    snprintf(a0, sizeof(a0), "state_dir=%s/%%n", mnt);
    hconf[0] = a0;
    hconf[1] = conf[1];
    hconf[2] = conf[2];
    nrs_spank_config_reset();
    if (nrs_spank_config_parse(3, hconf) != 0)
        printf("  plugstack arguments: %s\n", nrs_spank_config.error);
}

/* state_dir on a hung mount: init_post_opt (slurmstepd, root) gives up on
 * Nereus for the step after its bound instead of blocking in its walk. */
static int case_hung_state(void)
{
    char mnt[NRS_SPANK_PATH_MAX];
    pid_t w;
    int fd, rc;

    if ((fd = hung_start(mnt, sizeof(mnt), &w)) < 0)
        return skip(NO_FUSE);
    hung_conf(mnt);
    fake_job = 4310;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    fake_setenv("SLURM_JOB_NODELIST", "nodeB");
    fake_ctx = S_CTX_REMOTE;
    rc = slurm_spank_init(NULL, 3, hconf);
    fake_opt->cb(fake_opt->val, (char *)spec, 1);
    if (rc == 0)
        rc = slurm_spank_init_post_opt(NULL, 3, hconf);
    watchdog_stop(w);
    hung_umount(mnt, fd);
    printf("  init_post_opt %d: %s\n", rc, nrs_spank_last_error);
    return result(strstr(nrs_spank_last_error, "state_dir") &&
                      strstr(nrs_spank_last_error, "its filesystem did not answer within"),
                  "state_dir on a hung FUSE mount: init_post_opt gives up on Nereus after its "
                  "bound, says why");
}

/* state_dir on a hung mount: root's epilog (every job's: with --nereus or,
 * given == false, without) returns after its bound and logs why, instead of
 * holding slurmd's epilog (the node would drain). */
static int hung_state_epilog(bool given)
{
    char mnt[NRS_SPANK_PATH_MAX], log[NRS_SPANK_PATH_MAX];
    pid_t w;
    int fd, lfd, saved, said;

    if ((fd = hung_start(mnt, sizeof(mnt), &w)) < 0)
        return skip(NO_FUSE);
    hung_conf(mnt);
    fake_job = given ? 4311 : 4312;
    fake_uid = 1000;
    fake_gid = 1000;
    fake_ctx = S_CTX_JOB_SCRIPT;
    setenv("SLURMD_NODENAME", "nodeB", 1);
    if (given)
        setenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus", spec, 1);
    else
        unsetenv("SPANK__SLURM_SPANK_OPTION_nereus_nereus");
    snprintf(log, sizeof(log), "%s/hung-state-epilog.err", base);
    lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    saved = dup(2);
    dup2(lfd, 2);
    slurm_spank_job_epilog(NULL, 3, hconf);
    dup2(saved, 2);
    close(lfd);
    close(saved);
    watchdog_stop(w);
    hung_umount(mnt, fd);
    sh("sed 's/^/  | /' %s", log);
    said = sh("grep -q 'did not answer within.*no clean-up' %s", log) == 0;
    return result(said, given ? "state_dir on a hung FUSE mount: the epilog of a job with "
                                "--nereus returns after its bound, says why"
                              : "state_dir on a hung FUSE mount: the epilog of a job without "
                                "--nereus returns after its bound, says why");
}

static int case_hung_state_epilog(void)
{
    return hung_state_epilog(false);
}

static int case_hung_state_epilog_ours(void)
{
    return hung_state_epilog(true);
}

/* A job directory too big to remove within the epilog's budget: root's
 * walk stops at its deadline (slurmd fails an epilog past its time-out, and
 * drains the node), leaves the rest, and a later walk with time finishes.
 * A budget of 0 stands for the 10 s that millions of files would take. */
static int case_rm_late(void)
{
    char d[NRS_SPANK_PATH_MAX];
    bool kept = false;
    int fd, late, left, full, gone;

    snprintf(d, sizeof(d), "%s/rm-late", base);
    if (sh("rm -rf %s && mkdir -p %s/sub && cd %s && touch $(seq 1 300) sub/a sub/b", d, d, d) != 0)
        return result(0, "cannot stage the case");
    fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return result(0, "cannot open the staged directory");
    alarm(30);
    late = nrs_rm_below(fd, false, &kept, 0);
    left = sh("test $(find %s -mindepth 1 | wc -l) -eq 303", d) == 0;
    full = nrs_rm_below(fd, false, &kept, NRS_RM_BUDGET_MS);
    alarm(0);
    close(fd);
    gone = sh("test -z \"$(ls -A %s)\"", d) == 0;
    printf("  budget 0: %d (%s); budget %d ms: %d (%s)\n", late,
           left ? "all 303 entries left" : "SOME REMOVED", NRS_RM_BUDGET_MS, full,
           gone ? "empty" : "NOT EMPTY");
    return result(late == NRS_RM_LATE && left && full == 0 && gone,
                  "root's removal stops at its deadline, leaves the rest, finishes later");
}

/* The job's user mounted a FUSE file system (allow_other, as
 * user_allow_other in /etc/fuse.conf permits) on a directory in their job
 * directory, and its daemon does not answer: root's epilog clean-up leaves
 * the mount alone (another filesystem) without asking its daemon anything,
 * removes the rest and returns, instead of blocking in the kernel until
 * slurmd's epilog time-out drains the node. Before: blocked in openat (the
 * directory's open) and in nrs_keep's stat of a "*.log" mount point. */
static int case_epilog_mount(void)
{
    char jd[NRS_SPANK_PATH_MAX], sub[NRS_SPANK_PATH_MAX + 16], lg[NRS_SPANK_PATH_MAX + 16];
    pid_t w;
    int fs, fl, own, mounted;

    snprintf(jd, sizeof(jd), "%s/state/nodeB/4313", base);
    snprintf(sub, sizeof(sub), "%s/sub", jd);
    snprintf(lg, sizeof(lg), "%s/x.log", jd);
    epilog_job_dir(jd, 0700);
    if (sh(AS_1000 "sh -c 'mkdir %s %s && touch %s/own'", sub, lg, jd) != 0)
        return result(0, "cannot stage the case (setpriv?)");
    w = watchdog(HUNG_LIMIT_S);
    if ((fs = hung_mount(sub)) < 0 || (fl = hung_mount(lg)) < 0) {
        watchdog_stop(w);
        if (fs >= 0)
            hung_umount(sub, fs);
        return skip(NO_FUSE);
    }
    epilog_run(4313);
    watchdog_stop(w);
    own = sh("test -e %s/own", jd) == 0;
    mounted = sh("grep -q ' %s ' /proc/mounts && grep -q ' %s ' /proc/mounts", sub, lg) == 0;
    hung_umount(sub, fs);
    hung_umount(lg, fl);
    printf("  epilog returned; the user's file: %s; the mounts: %s\n", own ? "KEPT" : "removed",
           mounted ? "left" : "GONE");
    return result(!own && mounted, "a hung FUSE mount of the user's in the job dir: root's "
                                   "clean-up leaves it alone, removes the rest, returns");
}

/* A hung FUSE mount on the file path (rootmode: a regular file). */
static int hung_mount_file(const char *path)
{
    char opts[128];
    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);

    if (fd < 0)
        return -1;
    snprintf(opts, sizeof(opts), "fd=%d,rootmode=100000,user_id=0,group_id=0,allow_other", fd);
    if (mount("nrs-hung", path, "fuse.nrs-hung", MS_NOSUID | MS_NODEV, opts) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The same with the mount on the job directory itself (0), or on its
 * ctl_node file (1; 2: a job without --nereus, whose epilog only looks for
 * ctl_node): the epilog leaves the mount alone and returns. Before: blocked
 * in the job directory's open, ctl_node's open, ctl_node's lstat. */
static int case_epilog_mount_top(int on_ctl_node)
{
    char jd[NRS_SPANK_PATH_MAX], at[NRS_SPANK_PATH_MAX + 16];
    pid_t w;
    int fd, own, mounted;

    snprintf(jd, sizeof(jd), "%s/state/nodeB/%d", base, 4314 + on_ctl_node);
    snprintf(at, sizeof(at), on_ctl_node ? "%s/ctl_node" : "%s", jd);
    epilog_job_dir(jd, 0700);
    if (sh(AS_1000 "sh -c 'touch %s/own'", jd) != 0)
        return result(0, "cannot stage the case (setpriv?)");
    w = watchdog(HUNG_LIMIT_S);
    if ((fd = on_ctl_node ? hung_mount_file(at) : hung_mount(at)) < 0) {
        watchdog_stop(w);
        return skip(NO_FUSE);
    }
    if (on_ctl_node == 2) { /* a job without --nereus whose steps had it */
        fake_job = 4316;
        fake_uid = 1000;
        fake_gid = 1000;
        fake_ctx = S_CTX_JOB_SCRIPT;
        setenv("SLURMD_NODENAME", "nodeB", 1);
        slurm_spank_job_epilog(NULL, 3, conf);
    } else {
        epilog_run((uint32_t)(4314 + on_ctl_node));
    }
    watchdog_stop(w);
    mounted = sh("grep -q ' %s ' /proc/mounts", at) == 0;
    hung_umount(at, fd);
    own = sh("test -e %s/own", jd) == 0;
    printf("  epilog returned; the mount: %s; the user's file under it: %s\n",
           mounted ? "left" : "GONE", own ? "kept" : "removed");
    if (on_ctl_node == 2)
        return result(mounted && own, "a hung FUSE mount on ctl_node, a job without --nereus: "
                                      "the epilog does not look through it, returns");
    if (on_ctl_node)
        return result(mounted && !own, "a hung FUSE mount on ctl_node: the epilog leaves it "
                                       "alone, removes the rest, returns");
    return result(mounted && own, "a hung FUSE mount on the job dir: the epilog leaves it "
                                  "alone and returns");
}

static int case_epilog_mount_jobdir(void)
{
    return case_epilog_mount_top(0);
}

static int case_epilog_mount_ctl_node(void)
{
    return case_epilog_mount_top(1);
}

static int case_epilog_mount_no_nereus(void)
{
    return case_epilog_mount_top(2);
}

/* ---- a bounded call's answer, with its pipe held open by another process ----
 *
 * Another thread of slurmstepd that forks while nrs_bounded_call runs gives
 * its child a copy of the answer's pipe (close-on-exec closes it only at an
 * exec): here the bounded child's own child holds it, *holder (shared
 * memory) its pid, until killed. The answer must still come when the child
 * exits, not at the deadline when that copy goes. Before: a time-out. */
static pid_t *holder_pid;

static void bounded_holder(void)
{
    pid_t g = fork();

    if (g == 0)
        for (;;)
            pause(); /* every signal blocked (the bounded child's mask): SIGKILL */
    *holder_pid = g;
}

/* A long answer (several reads of the pipe), while the holder runs. */
static int bounded_answer_held(void *arg, char *out, size_t n)
{
    (void)arg;
    bounded_holder();
    memset(out, 'x', n - 1);
    memcpy(out + n - 8, "answer", 7);
    return 7;
}

/* No answer at all: the child exits first. */
static int bounded_exit_held(void *arg, char *out, size_t n)
{
    (void)arg;
    (void)out;
    (void)n;
    bounded_holder();
    _exit(0);
}

static void holder_kill(void)
{
    if (*holder_pid > 0 && kill(*holder_pid, SIGKILL) == 0)
        waitpid(*holder_pid, NULL, 0); /* ours: we are its subreaper */
    *holder_pid = 0;
}

static int case_bounded_held(void)
{
    static char out[NRS_BOUNDED_OUT_MAX];
    int answer, none, long_ok;

    holder_pid = mmap(NULL, sizeof(*holder_pid), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (holder_pid == MAP_FAILED || prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        return result(0, "mmap, prctl");
    alarm(30);
    *holder_pid = 0;
    answer = nrs_bounded_call(5000, bounded_answer_held, NULL, out, sizeof(out));
    holder_kill();
    long_ok = strlen(out) == sizeof(out) - 2 && strcmp(out + sizeof(out) - 8, "answer") == 0;
    printf("  answer %d, %zu bytes%s\n", answer, strlen(out), long_ok ? ", ending 'answer'" : "");
    none = nrs_bounded_call(5000, bounded_exit_held, NULL, out, sizeof(out));
    holder_kill();
    alarm(0);
    printf("  no answer: %d: %s\n", none, out);
    return result(answer == 7 && long_ok && none == NRS_BOUNDED_ERROR &&
                      strstr(out, "ended without an answer") != NULL,
                  "another process holding a bounded call's pipe open: the child's answer, or "
                  "its exit without one, still ends the call (not the deadline)");
}

/* ---- S5: the hint's whole process group goes -----------------------------------
 *
 * runtime_dir/nereus-watcher a script (as a site's wrapper would be) that
 * starts a helper in the background, writes its pid, and then (hang) waits
 * for it, or exits. After nrs_hint_run the helper must be gone. */
/* runtime_dir/nereus-watcher a shell script of body, in rtd[n] (BASE/hint-rt,
 * made afresh with an out/ directory the hint may write in); runtime_dir is
 * set to it, its old value in saved[n] (hint_restore). 0, or -1. */
static int hint_install(const char *body, char *rtd, size_t n, char *saved, size_t sn)
{
    char prog[NRS_SPANK_PATH_MAX + 32];
    FILE *f;

    snprintf(rtd, n, "%s/hint-rt", base);
    snprintf(prog, sizeof(prog), "%s/nereus-watcher", rtd);
    if (sh("rm -rf %s && mkdir -m 755 %s %s/out && chown 1000:1000 %s/out", rtd, rtd, rtd,
           rtd) != 0 || (f = fopen(prog, "w")) == NULL)
        return -1;
    fprintf(f, "#!/bin/sh\n%s\n", body);
    if (fclose(f) != 0 || chmod(prog, 0755) != 0)
        return -1;
    snprintf(saved, sn, "%s", nrs_spank_config.runtime_dir);
    snprintf(nrs_spank_config.runtime_dir, sizeof(nrs_spank_config.runtime_dir), "%s", rtd);
    return 0;
}

static void hint_restore(const char *saved)
{
    snprintf(nrs_spank_config.runtime_dir, sizeof(nrs_spank_config.runtime_dir), "%s", saved);
}

static int hint_group(bool hang)
{
    char rtd[NRS_SPANK_PATH_MAX], saved[NRS_SPANK_PATH_MAX], pidf[NRS_SPANK_PATH_MAX + 16];
    char body[2 * NRS_SPANK_PATH_MAX];
    struct pollfd p = {-1, POLLIN, 0};
    FILE *f;
    int rc, helper = 0, gone;

    snprintf(pidf, sizeof(pidf), "%s/hint-rt/out/helper.pid", base);
    snprintf(body, sizeof(body), "sleep 3600 </dev/null >/dev/null 2>&1 &\necho $! >%s\n"
             "echo \"fake hint: helper $!\"\n%s", pidf, hang ? "wait" : "exit 0");
    if (hint_install(body, rtd, sizeof(rtd), saved, sizeof(saved)) != 0)
        return result(0, "cannot stage the fake hint");
    alarm(20);
    rc = nrs_hint_run(1000, 1000, 4309, "nodeB", "harness", base, "", false);
    alarm(0);
    hint_restore(saved);
    if ((f = fopen(pidf, "r")) != NULL) {
        if (fscanf(f, "%d", &helper) != 1)
            helper = 0;
        fclose(f);
    }
    if (helper <= 0)
        return result(0, "the fake hint wrote no helper pid");
    /* Its exit, waited for at most 10 s (it would sleep an hour). */
    p.fd = (int)syscall(SYS_pidfd_open, helper, 0);
    gone = p.fd < 0 ? errno == ESRCH : poll(&p, 1, 10000) == 1;
    if (!gone && p.fd >= 0)
        syscall(SYS_pidfd_send_signal, p.fd, SIGKILL, NULL, 0);
    if (p.fd >= 0)
        close(p.fd);
    printf("  hint %d; its background helper %d: %s\n", rc, helper, gone ? "killed" : "STILL RUNNING");
    return result(gone && (hang ? rc < 0 : rc == 0),
                  hang ? "a hint killed at its deadline takes its process group with it"
                       : "a hint that exits leaves nothing of its process group running");
}

/* What the hint prints (as the job's user: it may echo what the job's
 * controller, the user's process, answered) with an escape and a carriage
 * return: root's log gets printable lines, each with the prefix. */
static int case_hint_output(void)
{
    char rtd[NRS_SPANK_PATH_MAX], saved[NRS_SPANK_PATH_MAX], log[NRS_SPANK_PATH_MAX];
    int saved_err = dup(2), fd, rc, lines, bad;

    if (hint_install("printf 'refused: \\033[2J\\rerror: forged\\n'", rtd, sizeof(rtd), saved,
                     sizeof(saved)) != 0)
        return result(0, "cannot stage the fake hint");
    snprintf(log, sizeof(log), "%s/hint-output.err", base);
    fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    alarm(20);
    rc = nrs_hint_run(1000, 1000, 4309, "nodeB", "harness", base, "", false);
    alarm(0);
    dup2(saved_err, 2);
    close(fd);
    hint_restore(saved);
    bad = log_lines_bad(log, "[info] nereus: job 4309: ", &lines);
    return result(rc == 0 && lines == 1 && bad == 0,
                  "the hint's output with an escape and a carriage return: one printable line "
                  "with the prefix in root's log");
}

/* The hint's fork while another process holds its output's pipe (a holder,
 * __wrap_fork): the call ends when the hint has exited and what it wrote is
 * read, not at its deadline; with the clock standing still (clock_frozen)
 * nothing else can end it. Before: it read until EOF or the deadline: here
 * until the alarm (with the clock running, 2 s late every time). */
static int case_hint_held(void)
{
    char rtd[NRS_SPANK_PATH_MAX], saved[NRS_SPANK_PATH_MAX], log[NRS_SPANK_PATH_MAX];
    int saved_err = dup(2), fd, rc, lines, bad;

    if (hint_install("echo 'fake hint: sent'", rtd, sizeof(rtd), saved, sizeof(saved)) != 0)
        return result(0, "cannot stage the fake hint");
    snprintf(log, sizeof(log), "%s/hint-held.err", base);
    fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    alarm(20);
    hold_next_fork = true;
    clock_frozen = true;
    rc = nrs_hint_run(1000, 1000, 4319, "nodeB", "harness", base, "", false);
    clock_frozen = false;
    alarm(0);
    holder_end();
    dup2(saved_err, 2);
    close(fd);
    hint_restore(saved);
    bad = log_lines_bad(log, "[info] nereus: job 4319: fake hint: sent", &lines);
    printf("  hint %d\n", rc);
    return result(rc == 0 && lines == 1 && bad == 0,
                  "another process holding the hint's pipe: the hint's exit ends the call, its "
                  "output logged (not its deadline)");
}

/* The watcher's fork while another process holds the pipe its exec is told
 * on (a holder, __wrap_fork: no EOF at its exec): nrs_remote_spawn still
 * sees the exec and returns its pid. as_user: as slurmstepd in user_init
 * (effective uid and gid the job's user's, 1000; real uid root), which may
 * not look at the child's /proc/PID/exe until it has exec'd (not dumpable
 * after its change of credentials); else as root, which sees its own exe
 * there until then. The pid, or -1 with the error in said[n]. */
static pid_t spawn_held(bool as_user, const char *prog, char *said, size_t n)
{
    nrs_remote_t r;
    pid_t pid;

    job_dir(&r, as_user ? "spawn-held-user" : "spawn-held-root");
    if (as_user) {
        r.uid = 1000;
        r.gid = 1000;
        if (sh("chown 1000:1000 %s", r.job_dir) != 0 || setgroups(0, NULL) != 0 ||
            setegid(1000) != 0 || seteuid(1000) != 0) {
            snprintf(said, n, "cannot become uid 1000");
            return -1;
        }
    }
    hold_next_fork = true;
    pid = nrs_remote_spawn(NULL, &r, prog);
    if (as_user && (seteuid(0) != 0 || setegid(0) != 0))
        printf("  cannot become root again\n");
    holder_end();
    snprintf(said, n, "%s", pid > 0 ? "" : nrs_spank_last_error);
    return pid;
}

/* Whether pid runs another program than this one (it has exec'd). */
static bool execd(pid_t pid)
{
    char path[32], exe[PATH_MAX], self[PATH_MAX];
    ssize_t k, m;

    snprintf(path, sizeof(path), "/proc/%d/exe", (int)pid);
    k = readlink(path, exe, sizeof(exe) - 1);
    m = readlink("/proc/self/exe", self, sizeof(self) - 1);
    return k > 0 && m > 0 && (k != m || memcmp(exe, self, (size_t)k) != 0);
}

static int case_spawn_held(void)
{
    char prog[NRS_SPANK_PATH_MAX + 32], said[2][NRS_SPANK_MSG_MAX];
    pid_t pid[2];
    bool ran[2];
    FILE *f;

    snprintf(prog, sizeof(prog), "%s/spawn-rt", base);
    mkdir(prog, 0755);
    snprintf(prog, sizeof(prog), "%s/spawn-rt/nereus-watcher", base);
    if ((f = fopen(prog, "w")) == NULL || fprintf(f, "#!/bin/sh\nexec sleep 3600\n") < 0 ||
        fclose(f) != 0 || chmod(prog, 0755) != 0)
        return result(0, "cannot stage the fake watcher");
    alarm(40);
    for (int u = 0; u < 2; u++) {
        pid[u] = spawn_held(u == 1, prog, said[u], sizeof(said[u]));
        ran[u] = pid[u] > 0 && execd(pid[u]);
        printf("  as %s: spawn %d%s%s\n", u ? "the user" : "root", (int)pid[u],
               pid[u] > 0 ? (ran[u] ? ", exec'd" : ", NOT EXEC'D") : ": ", said[u]);
        if (pid[u] > 0) {
            kill(pid[u], SIGKILL);
            waitpid(pid[u], NULL, 0);
        }
    }
    alarm(0);
    return result(ran[0] && ran[1], "another process holding the pipe of the watcher's fork: "
                                    "the spawn sees its exec (as root and as the job's user)");
}

static int case_hint_group_hang(void)
{
    return hint_group(true);
}

static int case_hint_group_exit(void)
{
    return hint_group(false);
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(void);
    } cases[] = {{"fifo-spawn", case_fifo_spawn},       {"fifo-join", case_fifo_join},
                 {"long-nodelist", case_long_nodelist}, {"bad-nodelist", case_bad_nodelist},
                 {"has-first", case_has_first},         {"epilog-foreign", case_epilog_foreign},
                 {"epilog-not-ours", case_epilog_not_ours}, {"sock-link", case_sock_link},
                 {"long-arg", case_long_arg},
                 {"epilog-kill-ours", case_epilog_kill_ours},
                 {"epilog-kill-foreign", case_epilog_kill_foreign},
                 {"hung-spec", case_hung_spec},         {"hung-submit", case_hung_submit},
                 {"hung-jobdir", case_hung_jobdir},         {"hung-runtime", case_hung_runtime},
                 {"hung-exec", case_hung_exec},         {"hint-group-hang", case_hint_group_hang},
                 {"hint-group-exit", case_hint_group_exit},
                 {"hung-state", case_hung_state},
                 {"hung-state-epilog", case_hung_state_epilog},
                 {"hung-state-epilog-ours", case_hung_state_epilog_ours},
                 {"rm-late", case_rm_late},
                 {"epilog-mount", case_epilog_mount},
                 {"epilog-mount-jobdir", case_epilog_mount_jobdir},
                 {"epilog-mount-ctl-node", case_epilog_mount_ctl_node},
                 {"epilog-mount-no-nereus", case_epilog_mount_no_nereus},
                 {"bounded-held", case_bounded_held},
                 {"long-argv", case_long_argv}, {"log-lines", case_log_lines},
                 {"hint-output", case_hint_output},
                 {"spawn-held", case_spawn_held},       {"hint-held", case_hint_held}};
    static char a0[NRS_SPANK_PATH_MAX + 16], a1[NRS_SPANK_PATH_MAX + 16], a2[NRS_SPANK_PATH_MAX + 16];

    if (argc > 2 && strcmp(argv[1], "--socket-dir") == 0)
        for (;;)
            pause(); /* a look-alike of a job's watcher (look_alike) */
    if (argc != 5) {
        fprintf(stderr, "usage: spank_harness CASE BASE RUNTIME_DIR SPEC\n");
        return 2;
    }
    base = argv[2];
    rt = argv[3];
    spec = argv[4];
    snprintf(a0, sizeof(a0), "state_dir=%s/state/%%n", base);
    snprintf(a1, sizeof(a1), "runtime_dir=%s", rt);
    snprintf(a2, sizeof(a2), "default_spec=%s", spec);
    conf[0] = a0;
    conf[1] = a1;
    conf[2] = a2;
    signal(SIGALRM, on_alarm);
    setvbuf(stdout, NULL, _IONBF, 0);
    if (nrs_spank_config_parse(3, conf) != 0) {
        printf("FAIL: plugstack arguments: %s\n", nrs_spank_config.error);
        return 1;
    }
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (strcmp(argv[1], cases[i].name) == 0)
            return cases[i].run();
    fprintf(stderr, "spank_harness: no case %s\n", argv[1]);
    return 2;
}
