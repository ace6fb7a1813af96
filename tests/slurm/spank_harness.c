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
 * 1 (3: hung, ended by the alarm). Uids 1000 and 1001 stand for two users
 * (setpriv --reuid: they need not exist). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_lock.h"

extern int fake_ctx;
extern uint32_t fake_job, fake_step;
extern uid_t fake_uid;
extern gid_t fake_gid;
extern struct spank_option *fake_opt;
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

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        int (*run)(void);
    } cases[] = {{"fifo-spawn", case_fifo_spawn},       {"fifo-join", case_fifo_join},
                 {"long-nodelist", case_long_nodelist}, {"bad-nodelist", case_bad_nodelist},
                 {"has-first", case_has_first},         {"epilog-foreign", case_epilog_foreign},
                 {"epilog-not-ours", case_epilog_not_ours}, {"sock-link", case_sock_link},
                 {"long-arg", case_long_arg}};
    static char a0[NRS_SPANK_PATH_MAX + 16], a1[NRS_SPANK_PATH_MAX + 16], a2[NRS_SPANK_PATH_MAX + 16];

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
