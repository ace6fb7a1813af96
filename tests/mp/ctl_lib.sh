# Shared by the tests/mp drivers that run nereus-controller (test_e2e.sh,
# test_python.sh), sourced after lib.sh. It sets S (the source tree), CTL,
# NRS, WK (the build's controller, CLI and worker), SPEC (tests/mp/e2e.yaml;
# a driver may point it elsewhere) and the UCX and worker environment; the
# functions also need tmp (and CTL_SPEC, optional) by the time they run:
#   ok NAME / ko NAME WHY / check NAME EXPR [WHY]   counted results
#   wait_for SECONDS CMD...   poll CMD every 0.1 s
#   start_ctl DIR LOG [OPTIONS...]   the controller on DIR/ctl.sock ($cpid)
#   stop_ctl NAME             it must still run, and stop cleanly on SIGTERM
#   status_json DIR           its status, as JSON
#   jq_ok DIR FILTER          it answers and FILTER holds on its status
#   show FILE [N]             FILE's last N (25) lines, indented
#   wait_steps TENTHS         wait for the job's two PMIx servers, $spid and
#                             $jpid (a join step): their exit statuses in rc
#                             and jrc, 124 (and SIGKILL) for one still running
#                             after TENTHS tenths of a second
S="${NRS_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}"
CTL="$B/nereus-controller"
NRS="$B/nereus"
WK="$B/nereus-worker"
SPEC="$S/tests/mp/e2e.yaml"
export UCX_NET_DEVICES=lo UCX_TLS="${UCX_TLS:-sm}" NRS_WORKER_TIMEOUT=15
ok() { mp_ok "$1"; }
ko() { mp_ko "$1" "$2"; }
check() { if eval "$2"; then ok "$1"; else ko "$1" "${3:-check failed}"; fi; }
wait_for() { # seconds command...
    local n=$(( $1 * 10 )); shift
    for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
    return 1
}
start_ctl() { # dir log [controller options...]; the spec: $CTL_SPEC, else $SPEC
    local d="$1" log="$2"
    shift 2
    "$CTL" --socket-dir "$d" --transition-timeout 15 --hello-timeout 2 --log "$log" "$@" \
        "${CTL_SPEC:-$SPEC}" 2>>"$tmp/ctl-stderr.log" &
    cpid=$!
    wait_for 10 test -S "$d/ctl.sock"
}
stop_ctl() { # name
    if ! kill -0 "$cpid" 2>/dev/null; then
        ko "$1: the controller was still running" "$(grep -v '^$' "$tmp/ctl-stderr.log" | tail -n 20)"
    fi
    # ours only: a reaped child's pid may be another suite's process by now
    [ "$(cat /proc/"$cpid"/comm 2>/dev/null)" = nereus-controll ] && kill -TERM "$cpid"
    local rc=124
    for _ in $(seq 100); do
        if ! kill -0 "$cpid" 2>/dev/null; then wait "$cpid"; rc=$?; break; fi; sleep 0.1
    done
    [ "$rc" -eq 0 ] && ok "$1: controller stopped cleanly" || ko "$1: controller stopped cleanly" "exit $rc"
    cpid=""
}
status_json() { timeout 5 "$NRS" status --json --socket-dir "$1"; }
jq_ok() { # dir filter: the controller answers and the filter holds
    local j
    j=$(status_json "$1") && [ -n "$j" ] && echo "$j" | jq -e "$2" >/dev/null
}
show() { sed 's/^/    | /' "$1" | tail -n "${2:-25}"; }
wait_steps() {
    rc=124 jrc=124
    for _ in $(seq "$1"); do
        if [ "$rc" -eq 124 ] && ! kill -0 "$spid" 2>/dev/null; then wait "$spid"; rc=$?; fi
        if [ "$jrc" -eq 124 ] && ! kill -0 "$jpid" 2>/dev/null; then wait "$jpid"; jrc=$?; fi
        [ "$rc" -ne 124 ] && [ "$jrc" -ne 124 ] && break
        sleep 0.1
    done
    [ "$rc" -eq 124 ] && kill -KILL "$spid" 2>/dev/null
    [ "$jrc" -eq 124 ] && kill -KILL "$jpid" 2>/dev/null
    spid="" jpid=""
}
