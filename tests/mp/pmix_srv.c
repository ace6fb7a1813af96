/* pmix_srv: the multi-process tests' own PMIx server (docs/protocol-dataplane.md).
 *
 *   pmix_srv [-n N] [-t SECONDS] [-N NSPACE] [-q] [--no-notify]
 *            [--kill-on-fail SECONDS] [--break-fences] [--exits] -- PROG ARGS...
 *
 * Registers one namespace of N ranks, all local, forks N clients running PROG
 * with the PMIx environment (plus NRS_MP_RANK / NRS_MP_SIZE for convenience),
 * waits for every child and exits with the worst child's status (128+signal
 * for a child killed by a signal). When a child dies abnormally the server
 * notifies the others (PMIx_Notify_event PMIX_ERR_PROC_ABORTED, affected
 * proc = the dead rank), as a resource manager would. After -t seconds
 * (default 120) every child still running is SIGKILLed and the exit is 124.
 * With --kill-on-fail S, as Slurm's --kill-on-bad-exit, the children still
 * running S seconds after the first abnormal exit are SIGKILLed; their own
 * status then does not count. With --break-fences, as Slurm 22.05's pmix
 * plugin once nodes left a step, every fence after the first abnormal exit
 * fails (the ranks must agree some other way: the controller's GATHER).
 * With --exits, each child's own end goes to stderr (even with -q), one line
 * a rank, "pmix_srv: rank R ended: exit N" or "pmix_srv: rank R ended:
 * signal S" (" (killed by pmix_srv)" appended after a time-out or
 * --kill-on-fail): the worst status alone hides a survivor that crashed when
 * another rank was killed on purpose.
 *
 * Fence: this is a single-node server, so the PMIx server library has
 * already collected the contributions of all (local) participants when it
 * calls fence_nb; the host's job is to hand the blob straight back.
 *
 * Every run uses a private tmpdir (mkdtemp under $TMPDIR) for the PMIx
 * rendezvous files so parallel tests never collide; it is removed at exit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pmix.h>
#include <pmix_server.h>

#define SRV_MAX_PROCS 256

typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done;
    pmix_status_t status;
} srv_wait_t;

static struct {
    int nprocs;
    int timeout_s;
    bool quiet;
    bool notify;
    double kill_on_fail; /* < 0: never; else seconds after the first failure */
    bool break_fences;
    bool exits; /* --exits: a line per child's end */
    volatile int failed; /* a child exited abnormally (read by the PMIx thread) */
    char nspace[PMIX_MAX_NSLEN + 1];
    char tmpdir[256];
    pid_t pids[SRV_MAX_PROCS];
    int exited[SRV_MAX_PROCS];
    int killed[SRV_MAX_PROCS]; /* by us: their status does not count */
} srv;

static void srv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void srv_log(const char *fmt, ...)
{
    va_list ap;
    if (srv.quiet)
        return;
    va_start(ap, fmt);
    fprintf(stderr, "pmix_srv: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void wait_init(srv_wait_t *w)
{
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->done = false;
    w->status = PMIX_SUCCESS;
}

static void wait_fini(srv_wait_t *w)
{
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
}

static void wait_signal(srv_wait_t *w, pmix_status_t st)
{
    pthread_mutex_lock(&w->lock);
    w->status = st;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static pmix_status_t wait_for(srv_wait_t *w)
{
    pthread_mutex_lock(&w->lock);
    while (!w->done)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
    return w->status;
}

static void op_done(pmix_status_t st, void *cbdata)
{
    wait_signal(cbdata, st);
}

/* ---- server module --------------------------------------------------------- */

static pmix_status_t m_connected(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cbfunc,
                                 void *cbdata)
{
    (void)proc, (void)obj, (void)cbfunc, (void)cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t m_finalized(const pmix_proc_t *proc, void *obj, pmix_op_cbfunc_t cbfunc,
                                 void *cbdata)
{
    (void)obj, (void)cbfunc, (void)cbdata;
    srv_log("rank %u finalized", proc->rank);
    return PMIX_OPERATION_SUCCEEDED;
}

static void kill_children(int sig);

static pmix_status_t m_abort(const pmix_proc_t *proc, void *obj, int status, const char msg[],
                             pmix_proc_t procs[], size_t nprocs, pmix_op_cbfunc_t cbfunc,
                             void *cbdata)
{
    (void)obj, (void)procs, (void)nprocs, (void)cbfunc, (void)cbdata;
    fprintf(stderr, "pmix_srv: rank %u called PMIx_Abort(%d): %s\n", proc->rank, status,
            msg ? msg : "");
    kill_children(SIGKILL);
    return PMIX_OPERATION_SUCCEEDED;
}

static void fence_release(void *cbdata)
{
    free(cbdata);
}

/* Single node: the library hands us the complete local collection; it is ours
 * (allocated by the library) until we hand it back with a release function. */
static pmix_status_t m_fence_nb(const pmix_proc_t procs[], size_t nprocs, const pmix_info_t info[],
                                size_t ninfo, char *data, size_t ndata,
                                pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    (void)procs, (void)info, (void)ninfo;
    if (srv.break_fences && __atomic_load_n(&srv.failed, __ATOMIC_SEQ_CST)) {
        srv_log("fence over %zu proc entries refused (--break-fences)", nprocs);
        return PMIX_ERR_NOT_SUPPORTED;
    }
    srv_log("fence over %zu proc entries, %zu bytes", nprocs, ndata);
    cbfunc(PMIX_SUCCESS, data, ndata, cbdata, fence_release, data);
    return PMIX_SUCCESS;
}

static pmix_status_t m_dmodex(const pmix_proc_t *proc, const pmix_info_t info[], size_t ninfo,
                              pmix_modex_cbfunc_t cbfunc, void *cbdata)
{
    (void)proc, (void)info, (void)ninfo, (void)cbfunc, (void)cbdata;
    return PMIX_ERR_NOT_FOUND; /* every proc is local: nothing remote to ask */
}

static pmix_status_t m_register_events(pmix_status_t *codes, size_t ncodes,
                                       const pmix_info_t info[], size_t ninfo,
                                       pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)codes, (void)ncodes, (void)info, (void)ninfo, (void)cbfunc, (void)cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t m_deregister_events(pmix_status_t *codes, size_t ncodes,
                                         pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)codes, (void)ncodes, (void)cbfunc, (void)cbdata;
    return PMIX_OPERATION_SUCCEEDED;
}

static pmix_status_t m_notify_event(pmix_status_t code, const pmix_proc_t *source,
                                    pmix_data_range_t range, pmix_info_t info[], size_t ninfo,
                                    pmix_op_cbfunc_t cbfunc, void *cbdata)
{
    (void)code, (void)source, (void)range, (void)info, (void)ninfo, (void)cbfunc, (void)cbdata;
    return PMIX_OPERATION_SUCCEEDED; /* no other servers to forward to */
}

static pmix_server_module_t srv_module = {
    .client_connected = m_connected,
    .client_finalized = m_finalized,
    .abort = m_abort,
    .fence_nb = m_fence_nb,
    .direct_modex = m_dmodex,
    .register_events = m_register_events,
    .deregister_events = m_deregister_events,
    .notify_event = m_notify_event,
};

/* ---- namespace and children ------------------------------------------------- */

static int info_add(void *list, const char *key, const void *val, pmix_data_type_t t)
{
    pmix_status_t rc = PMIx_Info_list_add(list, key, val, t);
    if (rc != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_srv: PMIx_Info_list_add(%s): %s\n", key, PMIx_Error_string(rc));
        return -1;
    }
    return 0;
}

static int add_proc_data(void *list, int rank)
{
    void *pl = PMIx_Info_list_start();
    pmix_data_array_t darr;
    pmix_rank_t r = (pmix_rank_t)rank;
    uint16_t lr = (uint16_t)rank;
    uint32_t nodeid = 0;
    int rc = -1;

    memset(&darr, 0, sizeof darr); /* filled by PMIx_Info_list_convert */
    darr.type = PMIX_INFO;
    if (info_add(pl, PMIX_RANK, &r, PMIX_PROC_RANK) || info_add(pl, PMIX_LOCAL_RANK, &lr, PMIX_UINT16) ||
        info_add(pl, PMIX_NODE_RANK, &lr, PMIX_UINT16) || info_add(pl, PMIX_NODEID, &nodeid, PMIX_UINT32))
        goto out;
    if (PMIx_Info_list_convert(pl, &darr) != PMIX_SUCCESS)
        goto out;
    rc = info_add(list, PMIX_PROC_DATA, &darr, PMIX_DATA_ARRAY);
out:
    PMIX_DATA_ARRAY_DESTRUCT(&darr);
    PMIx_Info_list_release(pl);
    return rc;
}

static int register_nspace(void)
{
    char host[256], peers[SRV_MAX_PROCS * 4 + 1] = "", *regex = NULL, *ppn = NULL;
    uint32_t n = (uint32_t)srv.nprocs, zero = 0;
    void *list = PMIx_Info_list_start();
    pmix_data_array_t darr;
    srv_wait_t w;
    int rc = -1;

    memset(&darr, 0, sizeof darr); /* filled by PMIx_Info_list_convert */
    darr.type = PMIX_INFO;
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    for (int i = 0; i < srv.nprocs; i++) {
        size_t l = strlen(peers);
        snprintf(peers + l, sizeof peers - l, "%s%d", i ? "," : "", i);
    }
    if (PMIx_generate_regex(host, &regex) != PMIX_SUCCESS ||
        PMIx_generate_ppn(peers, &ppn) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_srv: cannot generate the node and proc maps\n");
        goto out;
    }
    if (info_add(list, PMIX_UNIV_SIZE, &n, PMIX_UINT32) || info_add(list, PMIX_JOB_SIZE, &n, PMIX_UINT32) ||
        info_add(list, PMIX_LOCAL_SIZE, &n, PMIX_UINT32) || info_add(list, PMIX_MAX_PROCS, &n, PMIX_UINT32) ||
        info_add(list, PMIX_SPAWNED, &zero, PMIX_UINT32) || info_add(list, PMIX_LOCAL_PEERS, peers, PMIX_STRING) ||
        info_add(list, PMIX_NODE_MAP, regex, PMIX_REGEX) || info_add(list, PMIX_PROC_MAP, ppn, PMIX_REGEX) ||
        info_add(list, PMIX_JOBID, srv.nspace, PMIX_STRING))
        goto out;
    for (int i = 0; i < srv.nprocs; i++)
        if (add_proc_data(list, i))
            goto out;
    if (PMIx_Info_list_convert(list, &darr) != PMIX_SUCCESS)
        goto out;
    wait_init(&w);
    pmix_status_t st = PMIx_server_register_nspace(srv.nspace, srv.nprocs, darr.array, darr.size,
                                                   op_done, &w);
    if (st == PMIX_SUCCESS)
        st = wait_for(&w);
    else if (st == PMIX_OPERATION_SUCCEEDED)
        st = PMIX_SUCCESS;
    wait_fini(&w);
    if (st != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_srv: register_nspace: %s\n", PMIx_Error_string(st));
        goto out;
    }
    rc = 0;
out:
    free(regex);
    free(ppn);
    PMIX_DATA_ARRAY_DESTRUCT(&darr);
    PMIx_Info_list_release(list);
    return rc;
}

static void kill_children(int sig)
{
    for (int i = 0; i < srv.nprocs; i++)
        if (srv.pids[i] > 0 && !srv.exited[i]) {
            srv.killed[i] = 1;
            kill(srv.pids[i], sig);
        }
}

static int spawn_one(int rank, char **argv)
{
    pmix_proc_t proc;
    char **env = NULL;
    srv_wait_t w;
    pmix_status_t st;
    char buf[32];

    PMIX_LOAD_PROCID(&proc, srv.nspace, (pmix_rank_t)rank);
    for (char **e = environ; *e; e++)
        PMIX_ARGV_APPEND(st, env, *e);
    snprintf(buf, sizeof buf, "%d", rank);
    PMIX_SETENV(st, "NRS_MP_RANK", buf, &env);
    snprintf(buf, sizeof buf, "%d", srv.nprocs);
    PMIX_SETENV(st, "NRS_MP_SIZE", buf, &env);
    if ((st = PMIx_server_setup_fork(&proc, &env)) != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_srv: setup_fork(%d): %s\n", rank, PMIx_Error_string(st));
        PMIX_ARGV_FREE(env);
        return -1;
    }
    wait_init(&w);
    st = PMIx_server_register_client(&proc, geteuid(), getegid(), NULL, op_done, &w);
    if (st == PMIX_SUCCESS)
        st = wait_for(&w);
    else if (st == PMIX_OPERATION_SUCCEEDED)
        st = PMIX_SUCCESS;
    wait_fini(&w);
    if (st != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_srv: register_client(%d): %s\n", rank, PMIx_Error_string(st));
        PMIX_ARGV_FREE(env);
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("pmix_srv: fork");
        PMIX_ARGV_FREE(env);
        return -1;
    }
    if (pid == 0) {
        execvpe(argv[0], argv, env);
        fprintf(stderr, "pmix_srv: exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    PMIX_ARGV_FREE(env);
    srv.pids[rank] = pid;
    return 0;
}

static void notify_death(int rank, int status)
{
    pmix_proc_t src, dead;
    pmix_info_t info[2];
    srv_wait_t w;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

    if (!srv.notify)
        return;
    /* The source is the dead rank: with the namespace's wildcard as the source
     * (as before), PMIx 4.2 delivered the event to no client of it. */
    PMIX_LOAD_PROCID(&src, srv.nspace, (pmix_rank_t)rank);
    PMIX_LOAD_PROCID(&dead, srv.nspace, (pmix_rank_t)rank);
    PMIX_INFO_LOAD(&info[0], PMIX_EVENT_AFFECTED_PROC, &dead, PMIX_PROC);
    PMIX_INFO_LOAD(&info[1], PMIX_EXIT_CODE, &code, PMIX_INT);
    wait_init(&w);
    pmix_status_t st = PMIx_Notify_event(PMIX_ERR_PROC_ABORTED, &src, PMIX_RANGE_NAMESPACE, info,
                                         2, op_done, &w);
    if (st == PMIX_SUCCESS)
        st = wait_for(&w);
    wait_fini(&w);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    srv_log("notified rank %d's death (exit %d): %s", rank, code, PMIx_Error_string(st));
}

static int rank_of(pid_t pid)
{
    for (int i = 0; i < srv.nprocs; i++)
        if (srv.pids[i] == pid)
            return i;
    return -1;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reap every child; returns the worst exit code. */
static int reap_children(int nspawned)
{
    int left = nspawned, worst = 0;
    double deadline = now_s() + srv.timeout_s, kill_at = -1;
    bool timed_out = false;

    while (left > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == 0) {
            if (!timed_out && now_s() > deadline) {
                fprintf(stderr, "pmix_srv: time-out after %d s: killing %d remaining rank(s)\n",
                        srv.timeout_s, left);
                kill_children(SIGKILL);
                timed_out = true;
            }
            if (kill_at > 0 && now_s() > kill_at) {
                srv_log("killing %d rank(s) still running after a failure", left);
                kill_children(SIGKILL);
                kill_at = -1;
            }
            usleep(20000); /* 50 wake-ups a second: the ranks it runs are measured */
            continue;
        }
        int r = rank_of(pid);
        if (r < 0)
            continue;
        srv.exited[r] = 1;
        left--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (srv.exits)
            fprintf(stderr, "pmix_srv: rank %d ended: %s %d%s\n", r,
                    WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status),
                    srv.killed[r] ? " (killed by pmix_srv)" : "");
        if (code)
            srv_log("rank %d exited with %s %d", r, WIFEXITED(status) ? "status" : "signal",
                    WIFEXITED(status) ? code : WTERMSIG(status));
        if (srv.killed[r])
            continue;
        if (code > worst)
            worst = code;
        if (code)
            __atomic_store_n(&srv.failed, 1, __ATOMIC_SEQ_CST);
        if (code && left > 0)
            notify_death(r, status);
        if (code && srv.kill_on_fail >= 0 && kill_at < 0)
            kill_at = now_s() + srv.kill_on_fail;
    }
    return timed_out ? 124 : worst;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: pmix_srv [-n N] [-t SECONDS] [-N NSPACE] [-q] [--no-notify] [--kill-on-fail S] [--break-fences] [--exits] -- PROG ARGS...\n");
}

static int parse_args(int argc, char **argv)
{
    srv.nprocs = 2;
    srv.timeout_s = 120;
    srv.notify = true;
    srv.kill_on_fail = -1;
    snprintf(srv.nspace, sizeof srv.nspace, "nrs-mp-%d", (int)getpid());
    int i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) {
            i++;
            break;
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            srv.nprocs = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            srv.timeout_s = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-N") && i + 1 < argc) {
            snprintf(srv.nspace, sizeof srv.nspace, "%s", argv[++i]);
        } else if (!strcmp(argv[i], "--kill-on-fail") && i + 1 < argc) {
            srv.kill_on_fail = atof(argv[++i]);
        } else if (!strcmp(argv[i], "-q")) {
            srv.quiet = true;
        } else if (!strcmp(argv[i], "--break-fences")) {
            srv.break_fences = true;
        } else if (!strcmp(argv[i], "--exits")) {
            srv.exits = true;
        } else if (!strcmp(argv[i], "--no-notify")) {
            srv.notify = false;
        } else if (argv[i][0] != '-') {
            break;
        } else {
            usage();
            return -1;
        }
    }
    if (i >= argc || srv.nprocs < 1 || srv.nprocs > SRV_MAX_PROCS || srv.timeout_s < 1) {
        usage();
        return -1;
    }
    return i;
}

int main(int argc, char **argv)
{
    int first = parse_args(argc, argv), nspawned = 0, rc = 1;
    pmix_info_t info[4];
    bool yes = true, no = false;
    const char *td = getenv("TMPDIR");

    if (first < 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    snprintf(srv.tmpdir, sizeof srv.tmpdir, "%s/nrs-pmix.XXXXXX", td && *td ? td : "/tmp");
    if (!mkdtemp(srv.tmpdir)) {
        perror("pmix_srv: mkdtemp");
        return 1;
    }
    PMIX_INFO_LOAD(&info[0], PMIX_SERVER_TMPDIR, srv.tmpdir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[1], PMIX_SYSTEM_TMPDIR, srv.tmpdir, PMIX_STRING);
    PMIX_INFO_LOAD(&info[2], PMIX_SERVER_TOOL_SUPPORT, &no, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[3], PMIX_SERVER_SYSTEM_SUPPORT, &no, PMIX_BOOL);
    (void)yes;
    pmix_status_t st = PMIx_server_init(&srv_module, info, 4);
    for (int i = 0; i < 4; i++)
        PMIX_INFO_DESTRUCT(&info[i]);
    if (st != PMIX_SUCCESS) {
        fprintf(stderr, "pmix_srv: PMIx_server_init: %s\n", PMIx_Error_string(st));
        goto out_rmdir;
    }
    if (register_nspace())
        goto out_fini;
    for (int r = 0; r < srv.nprocs; r++) {
        if (spawn_one(r, argv + first)) {
            kill_children(SIGKILL);
            break;
        }
        nspawned++;
    }
    rc = reap_children(nspawned);
    if (nspawned < srv.nprocs && rc == 0)
        rc = 1;
    PMIx_server_deregister_nspace(srv.nspace, NULL, NULL);
out_fini:
    PMIx_server_finalize();
out_rmdir:
    nftw(srv.tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    srv_log("exit %d", rc);
    return rc;
}
