#!/usr/bin/env bash
# All-to-all UCX exchange of deterministic buffers, 2/4/8 ranks, over sm and
# over tcp (loopback); every XXH64 must match the sender's and the generator's.
. "$(dirname "$0")/lib.sh"
X="$B/tests/mp/mp_xchg"
export UCX_NET_DEVICES=lo
for tls in sm tcp; do
    # odd sizes: chunk tails and a message smaller than one chunk
    mp_case "xchg $tls 2 ranks, 3 x 16 MiB+3, 1 MiB chunks" 0 60 env UCX_TLS=$tls \
        "$SRV" -q -n 2 -t 50 -- "$X" --epochs 3 --bytes $((16 * 1048576 + 3)) --chunk 1048576
    mp_case "xchg $tls 4 ranks, 2 x 4 MiB+4093, 256 KiB chunks" 0 60 env UCX_TLS=$tls \
        "$SRV" -q -n 4 -t 50 -- "$X" --epochs 2 --bytes $((4 * 1048576 + 4093)) --chunk 262144
    mp_case "xchg $tls 8 ranks, 2 x 1 MiB+17, window 2" 0 60 env UCX_TLS=$tls \
        "$SRV" -q -n 8 -t 50 -- "$X" --epochs 2 --bytes $((1048576 + 17)) --chunk 131072 --window 2
done
mp_case "xchg tcp 2 ranks, tiny and empty messages" 0 30 env UCX_TLS=tcp \
    "$SRV" -q -n 2 -t 25 -- "$X" --epochs 2 --bytes 0
# Not taken (refused, or failed at once): a length whose chunk count wrapped
# (SIZE_MAX bytes were "0 chunks", done at once with nothing moved), a tag of
# 33 bits, a send on an endpoint nrs_ucx_disconnect closed (UCX has freed it:
# SIGSEGV).
mp_case "xchg: an overflowing length, a 33-bit tag, a send after disconnect are not taken" 0 30 \
    env UCX_TLS=sm "$SRV" -q -n 1 -t 25 -- "$X" --edges
# An aborted receive UCX cannot cancel (its sender stalls mid-rendezvous)
# keeps its memory until it ends: the data must not land in freed memory.
mp_case "xchg tcp 2 ranks, memory of an uncancellable receive freed at the abort" 0 60 \
    env UCX_TLS=tcp "$SRV" -q -n 2 -t 50 -- "$X" --late-free --bytes $((256 << 20)) \
    --chunk $((256 << 20))
# A rank out of file descriptors cannot read /proc/<pid>/stat: that says
# nothing of its peers (the pid watch took it for their death, and each rank
# declared the other dead within 0.1 s).
mp_case "xchg sm 2 ranks, no file descriptor left: nobody dies" 0 30 env UCX_TLS=sm \
    "$SRV" -q -n 2 -t 25 -- "$X" --epochs 3 --bytes $((4 * 1048576 + 3)) --chunk 1048576 --no-fds
# The pid watch is for peers whose pid names them here: of this host and of
# this pid namespace (another host's pid names some other process here, or
# none). NRS_UCX_ERRMODE=none with a peer on another host: rank 1 gets a host
# of its own, its own hostname and pid namespace.
if [ "$(id -u)" = 0 ] && unshare -u -p -f --mount-proc true 2>/dev/null; then
    mp_case "xchg tcp 2 ranks on 2 hosts, NRS_UCX_ERRMODE=none: nobody dies" 0 60 \
        env UCX_TLS=tcp NRS_UCX_ERRMODE=none "$SRV" -q -n 2 -t 50 -- sh -c \
        '[ "$PMIX_RANK" = 1 ] || exec "$@"; exec unshare -u -p -f --mount-proc sh -c "hostname nrs-other-host && exec \"\$@\"" sh "$@"' \
        sh "$X" --epochs 6 --bytes $((16 * 1048576 + 3)) --chunk 1048576
    # the same host, but rank 1 in a pid namespace of its own (a container)
    mp_case "xchg tcp 2 ranks, one in its own pid namespace: nobody dies" 0 60 \
        env UCX_TLS=tcp "$SRV" -q -n 2 -t 50 -- sh -c \
        '[ "$PMIX_RANK" = 1 ] || exec "$@"; exec unshare -p -f --mount-proc "$@"' \
        sh "$X" --epochs 6 --bytes $((16 * 1048576 + 3)) --chunk 1048576
else
    mp_skip "xchg tcp 2 ranks on 2 hosts, NRS_UCX_ERRMODE=none" "needs root and unshare"
    mp_skip "xchg tcp 2 ranks, one in its own pid namespace" "needs root and unshare"
fi
mp_done
