#!/usr/bin/env python3
"""py_worker: one rank of a synthetic PPO/GRPO job in Python, over the ctypes
binding python/nereus_worker.py: the essential loop of nereus-worker
(runtime/worker/worker_main.c), for tests/mp/test_python.sh.

Per rank: join the job (nrs_worker_init_emulated: the spec scaled by its
runtime.emulation_scale, as nereus-worker, so both build the same graphs in
one job), take the controller's plan
(control_plan), allocate the EMU state filled with the pattern
(alloc_state(fill=1)), then per step: "run" the model-stages this rank holds
(sleeps whose measured wall time is reported, report_stage), close the step
(report_step with the response length, growing linearly from --response-len
to --max-response-len), and poll the controller (control_poll: a transition
the controller announced runs there, as a collective). After the last step:
follow the controller until it is quiet, verify every shard, finalize. The
output lines are nereus-worker's, so the same greps count them:
    rank R of N: pid P, epoch E, GPU G, B buffer(s), control connected, S step(s)
    rank R: step S: epoch E committed (GPU G, B buffer(s), T s)
    rank R: epoch E, K transition(s): verified M shards, X mismatches

Stage times: nereus-worker sleeps for the cost model's prediction of each
stage (nrs_cost_stage, not part of the worker API); here each stage the rank
runs takes --step-ms / 7 at step 0 and grows with the tokens it processes
(generate: the response; the others: prompt + response), times the factor
of $NEREUS_EMU_FACTORS ('actor.generate=1.3,...', as nereus-worker).

--sync: also run nereus-worker's per-step collectives (the step boundary
agreement and the actor's weight sync: control_step, weight_sync, API 4) so
Python ranks can share a job with nereus-worker ranks. --check-buffers:
before the loop, read and corrupt the state through memoryviews and check
verify_state sees it (then restore it). --rerun A:B: after step B go back to
step A and run (and report) steps A..B again, as a trainer that restored the
checkpoint of step A would; the controller ignores those reports and keeps
the channel (printed at the end: "rank R: control connected after the last
step"). --check-layers: on the first state and again at the end, take every
buffer of a layer tensor apart by layer (buffer_layer, API 5) and check each
part against the geometry computed here from its box (hidden: the width of
the rank's hidden-wide weights, so it holds for a scaled spec too): shape,
pitch, place in the layer's own weight, address and bytes, the parts tiling
the box, a layer outside it and a global tensor's buffer refused:
    rank R: layer views (WHEN): B buffer(s), P part(s) tile their boxes, N refused, X wrong

Exit status as nereus-worker: 0 every checksum verified; 1 a mismatch or a
failure; 2 usage; 3 a transition failed past its point of no return; 4
retired by the controller.
"""

import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import nereus_worker as nw  # noqa: E402  (after the path is set)

PROG = "py_worker"


def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default=os.environ.get("NEREUS_SPEC"), help="job spec")
    # the spec's workload is not readable through the worker API: explicit
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--step-ms", type=float, default=30.0, help="wall time of step 0, ms")
    ap.add_argument("--response-len", type=float, default=32.0, help="at step 0")
    ap.add_argument("--max-response-len", type=float, default=256.0, help="at the last step")
    ap.add_argument("--prompt-len", type=float, default=32.0, help="for the stage times")
    ap.add_argument("--gpus-per-host", type=int, default=0,
                    help="name this rank's host node<rank/G> ($NEREUS_HOSTNAME)")
    ap.add_argument("--quiet-s", type=float, default=2.0,
                    help="after the last step, follow the controller until quiet for S s")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("NEREUS_CHECKPOINT_DIR"))
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--mem", choices=("auto", "host", "cuda"), default="auto")
    ap.add_argument("--join", action="store_true", help="a join step's rank ($NEREUS_JOIN=1)")
    ap.add_argument("--sync", action="store_true",
                    help="per-step agreement and weight sync, as nereus-worker")
    ap.add_argument("--rerun", metavar="A:B", default=None,
                    help="after step B, run steps A..B again (as after a checkpoint restore)")
    ap.add_argument("--check-buffers", action="store_true",
                    help="check buffer access through memoryviews before the loop")
    ap.add_argument("--check-layers", action="store_true",
                    help="check the per-layer views of the layer tensors (first and last state)")
    a = ap.parse_args(argv)
    if not a.spec:
        ap.error("no spec: --spec FILE or NEREUS_SPEC")
    if a.step_ms <= 0 or a.quiet_s < 0 or a.checkpoint_every < 0 or a.response_len <= 0:
        ap.error("bad arguments")
    if a.checkpoint_every and not a.checkpoint_dir:
        ap.error("--checkpoint-every needs --checkpoint-dir (or $NEREUS_CHECKPOINT_DIR)")
    if a.rerun is not None:
        try:
            a.rerun = tuple(int(x) for x in a.rerun.split(":"))
        except ValueError:
            a.rerun = ()
        if len(a.rerun) != 2 or not 0 <= a.rerun[0] <= a.rerun[1] < a.steps:
            ap.error("--rerun A:B needs 0 <= A <= B < --steps")
    return a


def say(line):
    # one write per line: the ranks share stdout (and PYTHONUNBUFFERED would
    # split a print() into two writes that interleave with the others')
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def factors():
    """True/predicted time per model-stage: $NEREUS_EMU_FACTORS, default
    actor.generate=1.3 as nereus-worker."""
    f = [1.0] * nw.NRS_MS_COUNT
    f[nw.NRS_MS_ACTOR_GENERATE] = 1.3
    names = {nw.ms_name(ms): ms for ms in range(nw.NRS_MS_COUNT)}
    for item in os.environ.get("NEREUS_EMU_FACTORS", "").split(","):
        name, _, val = item.partition("=")
        try:
            if name in names and float(val) > 0:
                f[names[name]] = float(val)
        except ValueError:
            pass
    return f


def stage_seconds(a, ms, rl, f):
    """Wall time of model-stage ms at response length rl (see the docstring)."""
    if ms == nw.NRS_MS_ACTOR_GENERATE:
        grow = rl / a.response_len
    else:
        grow = (a.prompt_len + rl) / (a.prompt_len + a.response_len)
    return a.step_ms / 1000.0 / nw.NRS_MS_COUNT * grow * f[ms]


def run_step(w, a, rl, f):
    """Run (sleep through) each stage this rank holds; report what it measured.
    A rank that holds none (a joiner in line) waits a step's time, as
    nereus-worker's does, so that it keeps the job's pace."""
    roles = w.roles()
    if not roles:
        time.sleep(sum(stage_seconds(a, ms, rl, f) for ms in range(nw.NRS_MS_COUNT)))
    for r in roles:
        t0 = time.perf_counter()
        time.sleep(stage_seconds(a, r.ms, rl, f))
        w.report_stage(r.ms, time.perf_counter() - t0)


def check_buffers(w):
    """The state is real memory: non-zero pattern, sizes as described, and a
    byte flipped through a memoryview is what verify_state sees. True if so."""
    me, n = w.rank, w.nbuffers
    if n == 0:
        say(f"rank {me}: buffers: none held")
        return True
    total, wrong, weights = 0, 0, []
    for i in range(n):
        b, d = w.buffer(i), w.buffer_desc(i)
        if b.nbytes != (d.r1 - d.r0) * (d.c1 - d.c0) * d.esize:
            say(f"rank {me}: buffer {i}: {b.nbytes} bytes, its box {d} says otherwise")
            return False
        v = w.buffer_view(i)
        total += len(v)
        # the pattern: grads start at zero, every other kind is non-zero data
        wrong += any(v) == (d.kind == nw.NRS_EMU_GRAD)
        if d.kind == nw.NRS_EMU_WEIGHT:
            weights.append(i)
    base = w.verify_state()
    say(f"rank {me}: buffers: {n} host buffer(s), {total} bytes, {wrong} with the wrong "
        f"zeroness for their kind, sizes match their boxes; verify_state: {base.verified} "
        f"shards, {base.mismatches} mismatches")
    if not weights:
        return False
    i = weights[len(weights) // 2]
    v = w.buffer_view(i)
    k = len(v) // 2
    v[k] ^= 0xFF
    bad = w.verify_state()
    say(f"rank {me}: byte {k} of weight buffer {i} flipped through a memoryview: "
        f"verify_state: {bad.verified} shards, {bad.mismatches} mismatches")
    v[k] ^= 0xFF
    back = w.verify_state()
    say(f"rank {me}: byte restored: verify_state: {back.verified} shards, "
        f"{back.mismatches} mismatches")
    return wrong == 0 and base == (n, 0) and bad == (n, 1) and back == (n, 0)


# buffer_layer's geometry (nereus.h): qkv, gate and up stack layer l in
# columns [l*hidden, (l+1)*hidden), o and down in rows, the norms in row l
BY_COLUMN = (nw.NRS_TENSOR_QKV, nw.NRS_TENSOR_GATE, nw.NRS_TENSOR_UP)
NORMS = (nw.NRS_TENSOR_NORM1, nw.NRS_TENSOR_NORM2)
HIDDEN_WIDE = (nw.NRS_TENSOR_EMBED, nw.NRS_TENSOR_FINAL_NORM, nw.NRS_TENSOR_HEAD) + NORMS


def hidden_sizes(w, descs):
    """{role: hidden}: the width of the role's weights that are hidden wide
    (the norms, embedding, heads: every column); None if they disagree."""
    seen = {}
    for d in descs:
        if d.kind == nw.NRS_EMU_WEIGHT and d.tensor in HIDDEN_WIDE:
            seen.setdefault(d.role, set()).add((d.c0, d.c1))
    if any(len(v) != 1 or next(iter(v))[0] != 0 for v in seen.values()):
        say(f"rank {w.rank}: layer views: hidden-wide weights of different widths: {seen}")
        return None
    return {role: next(iter(v))[1] for role, v in seen.items()}


def refused(w, i, layer):
    """buffer_layer(i, layer) raises NRS_ERR_INVAL naming the call and the layer."""
    try:
        w.buffer_layer(i, layer)
    except nw.NereusError as e:
        return (e.code == nw.NRS_ERR_INVAL and
                re.match(rf"nrs_worker_buffer_layer: .*\blayer {layer}(?!\d)", e.message)
                is not None)
    return False


def layer_part_ok(w, i, d, b, layer, hidden, host):
    """One layer's part of buffer i (desc d, Buffer b): (rows * cols, ok)."""
    span = 1 if d.tensor in NORMS else hidden
    bycol = d.tensor in BY_COLUMN
    r0, r1, c0, c1 = d.r0, d.r1, d.c0, d.c1
    if bycol:
        c0, c1 = max(c0, layer * span), min(c1, (layer + 1) * span)
    else:
        r0, r1 = max(r0, layer * span), min(r1, (layer + 1) * span)
    width, es = d.c1 - d.c0, d.esize
    want_at = (d.r0, c0 - layer * span) if bycol else (r0 - layer * span, d.c0)
    off = ((r0 - d.r0) * width + (c0 - d.c0)) * es
    try:
        p = w.buffer_layer(i, layer)
    except nw.NereusError as e:
        say(f"rank {w.rank}: buffer {i} {d}, layer {layer}: {e}")
        return 0, False
    ok = ((p.rows, p.cols, p.pitch, (p.r0, p.c0)) == (r1 - r0, c1 - c0, width * es, want_at) and
          p.rows > 0 and p.cols > 0 and p.ptr - b.ptr == off and
          off + (p.rows - 1) * p.pitch + p.cols * es <= b.nbytes)
    if ok and host:
        # the bytes through the view's rows are those at the place the box puts them
        whole, n = w.buffer_view(i), p.cols * es
        rows = w.buffer_layer_view(i, layer)
        ok = len(rows) == p.rows and all(
            bytes(v) == bytes(whole[off + r * width * es:off + r * width * es + n])
            for r, v in enumerate(rows))
    if not ok:
        say(f"rank {w.rank}: buffer {i} {d} (hidden {hidden}), layer {layer}: {p}; wanted "
            f"{r1 - r0} x {c1 - c0}, pitch {width * es}, at {want_at}, {off} bytes in, the "
            "buffer's bytes")
    return p.rows * p.cols, ok


def check_layers(w, when):
    """Every buffer of a layer tensor taken apart by layer (see the docstring).
    True if every check held."""
    me, host = w.rank, w.mem_kind == nw.NRS_MEM_HOST
    descs = [w.buffer_desc(i) for i in range(w.nbuffers)]
    hidden = hidden_sizes(w, descs)
    if hidden is None:
        return False
    nlayer = nparts = nref = wrong = 0
    for i, d in enumerate(descs):
        if d.tensor < nw.NRS_TENSOR_QKV:  # a global tensor: no layer
            nref += 1
            wrong += not refused(w, i, 0)
            continue
        if d.role not in hidden:
            say(f"rank {me}: buffer {i} {d}: no hidden-wide weight of its model")
            wrong += 1
            continue
        b, h = w.buffer(i), hidden[d.role]
        span = 1 if d.tensor in NORMS else h
        lo, hi = (d.c0, d.c1) if d.tensor in BY_COLUMN else (d.r0, d.r1)
        l0, l1 = lo // span, (hi - 1) // span + 1
        nlayer += 1
        area = 0
        for layer in range(l0, l1):
            n, ok = layer_part_ok(w, i, d, b, layer, h, host)
            area += n
            nparts += 1
            wrong += not ok
        if area != (d.r1 - d.r0) * (d.c1 - d.c0):
            say(f"rank {me}: buffer {i} {d}: layers {l0}..{l1 - 1} cover {area} elements")
            wrong += 1
        for layer in ([l0 - 1] if l0 > 0 else []) + [l1, -1]:  # outside the box
            nref += 1
            if not refused(w, i, layer):
                say(f"rank {me}: buffer {i} {d}: layer {layer} not refused ({w.last_error})")
                wrong += 1
    say(f"rank {me}: layer views ({when}): {nlayer} buffer(s), {nparts} part(s) tile their "
        f"boxes, {nref} refused, {wrong} wrong")
    return wrong == 0


class Job:
    """The step loop's state: counts and the exit status, like worker_main."""

    def __init__(self, w, a):
        self.w, self.a = w, a
        self.me = w.rank
        self.controlled = w.control == "connected"
        self.ntrans = 0
        self.exitc = 0
        self.partial = False
        self.sync_err = 0
        # a joiner in line (no GPU) counts steps of its own: at every commit it
        # takes the job's, announced when a commit (or a partial one) places it
        self.in_line = w.joined_at >= 0 and w.gpu < 0

    def take_job_step(self, s):
        """In line: the job's step at this commit (job_step, API 8), else s."""
        j = self.w.job_step
        if not self.in_line or j < 0:
            return s
        if self.w.gpu >= 0:
            self.in_line = False
            say(f"rank {self.me}: step {s}: placed at the job's step {j}: continues from it")
        return j

    def poll(self, s):
        """The step boundary: take what the controller announced. The step
        the loop goes on from: s, or the job's for a joiner in line."""
        w = self.w
        try:
            committed = w.control_step() if self.a.sync else w.control_poll(0)
        except nw.NereusError as e:
            return self.failed(s, e)
        if committed:
            self.ntrans += 1
            self.partial = False
            say(f"rank {self.me}: step {s}: epoch {w.epoch} committed (GPU {w.gpu}, "
                f"{w.nbuffers} buffer(s), {w.transition_stat(nw.NRS_TS_SECONDS):.3f} s)")
            s = self.take_job_step(s)
            if w.transition_stat(nw.NRS_TS_RESTORED_STEP) >= 0:
                say(f"rank {self.me}: step {s}: {w.last_error}")
        return s

    def failed(self, s, e):
        """A failed step boundary; returns the step to go on from, as poll."""
        me, w = self.me, self.w
        if e.code == nw.NRS_ERR_ABORTED:
            say(f"rank {me}: step {s}: transition aborted, staying on epoch {w.epoch}: "
                f"{e.message}")
        elif e.code == nw.NRS_ERR_PARTIAL:
            say(f"rank {me}: step {s}: {e.message}")
            s = self.take_job_step(s)
            if self.controlled:  # the controller's next epoch rebuilds or restores it
                say(f"rank {me}: step {s}: waiting for the recovery (replicas, else the "
                    "checkpoint)")
                self.partial = True
            else:
                self.exitc = 3
        elif e.code == nw.NRS_ERR_RETIRED:
            say(f"rank {me}: step {s}: retired: {e.message}")
            self.exitc = 4
        else:
            say(f"rank {me}: step {s}: {e}")
        return s

    def weight_sync(self, s):
        """--sync: the actor's train -> generate sync, every step."""
        try:
            self.w.weight_sync()
        except nw.NereusError as e:
            if e.code == nw.NRS_ERR_PLAN:  # no actor.train + actor.generate: nothing to sync
                return
            if e.code == nw.NRS_ERR_VERIFY:
                self.exitc = 1
            if e.code == nw.NRS_ERR_VERIFY or not self.sync_err:
                say(f"rank {self.me}: step {s}: weight sync: {e}")
            self.sync_err += 1

    def checkpoint(self, s):
        a = self.a
        if a.checkpoint_every and (s + 1) % a.checkpoint_every == 0 and s + 1 < a.steps:
            try:
                self.w.checkpoint(s + 1)
            except nw.NereusError as e:
                say(f"rank {self.me}: step {s}: {e}")

    def schedule(self, s0):
        """The steps to run: s0 .. steps-1, with A..B twice under --rerun A:B."""
        a = self.a
        if not a.rerun or a.rerun[1] < s0:
            return list(range(s0, a.steps))
        lo, hi = a.rerun
        return list(range(s0, hi + 1)) + list(range(max(lo, s0), a.steps))

    def steps(self, s0=None):
        """The step loop, from the step this rank joined at (or s0)."""
        a, w, f = self.a, self.w, factors()
        if s0 is None:
            s0 = max(w.joined_at, 0)
            if w.joined_at >= 0:
                say(f"rank {self.me} of {w.size}: joined the job at step {s0}")
        prev = -1
        todo = self.schedule(s0)
        while todo and not self.exitc:
            s = todo.pop(0)
            if s <= prev:
                say(f"rank {self.me}: step {prev}: re-running from step {s} (as after a "
                    "checkpoint restore)")
            prev = s
            rl = (a.response_len + (a.max_response_len - a.response_len) * s / (a.steps - 1)
                  if a.steps > 1 else a.response_len)
            run_step(w, a, rl, f)
            w.report_step(s, rl)
            t = self.poll(s)
            if t != s:  # placed (or in line) at the job's step t: on from t + 1
                s, prev, todo = t, t, list(range(t + 1, a.steps))
            self.tail(s)

    def tail(self, s):
        """The rest of step s's boundary: weight sync (--sync), checkpoint."""
        if not self.exitc and self.a.sync:
            self.weight_sync(s)
        if not self.exitc:
            self.checkpoint(s)

    def follow(self):
        """A transition decided on the last steps is a collective every rank
        must take part in: poll until the controller is quiet. A joiner in
        line placed here while the job's steps are not done goes back to
        them: the step to go on from, else None."""
        left = self.a.quiet_s
        if self.in_line and self.controlled and not self.exitc:
            say(f"rank {self.me}: its steps done, in line: following the controller "
                f"({left:g} s quiet at most)")
        while self.controlled and not self.exitc and left > 0:
            left -= 0.1
            try:
                if self.w.control_poll(0.1):
                    self.ntrans += 1
                    left = self.a.quiet_s
                    say(f"rank {self.me}: after the last step: epoch {self.w.epoch} "
                        f"committed (GPU {self.w.gpu})")
                    was = self.in_line
                    s = self.take_job_step(self.a.steps)
                    if was and not self.in_line and s + 1 < self.a.steps:
                        self.tail(s)  # the others are at the rest of step s's boundary
                        return None if self.exitc else s + 1
            except nw.NereusError as e:
                if e.code == nw.NRS_ERR_PARTIAL:
                    self.exitc = 3
                elif e.code == nw.NRS_ERR_RETIRED:
                    self.exitc = 4
                elif e.code == nw.NRS_ERR_ABORTED:
                    left = self.a.quiet_s

    def verify(self):
        w = self.w
        if self.a.rerun:  # the controller ignored the re-run steps' reports, kept the channel
            say(f"rank {self.me}: control {w.control} after the last step")
        if self.partial and not self.exitc:
            say(f"rank {self.me}: epoch {w.epoch}: the state is still partial: no recovery came")
            self.exitc = 3
        if self.exitc:
            return
        v = w.verify_state()
        say(f"rank {self.me}: epoch {w.epoch}, {self.ntrans} transition(s): verified "
            f"{v.verified} shards, {v.mismatches} mismatches")
        if v.mismatches:
            self.exitc = 1
        if self.a.check_layers and not check_layers(w, f"epoch {w.epoch}, at the end"):
            self.exitc = 1
        if self.a.sync and w.gpu >= 0:
            self.verify_generation()

    def verify_generation(self):
        w = self.w
        try:
            g = w.verify_generation()
        except nw.NereusError as e:
            if e.code != nw.NRS_ERR_INVAL:
                say(f"rank {self.me}: verify generation: {e}")
                self.exitc = 1
                return
            # a transition after the last step: its generation buffers are not filled yet
            self.weight_sync(self.a.steps)
            try:
                g = w.verify_generation()
            except nw.NereusError as e2:  # no sync ever succeeded on this epoch
                say(f"rank {self.me}: verify generation: {e2}")
                self.exitc = 1
                return
        n, st = w.sync_stat(nw.NRS_SS_STEPS), w.sync_stat
        per = st(nw.NRS_SS_TOTAL_S) / n if n > 0 else 0.0
        say(f"rank {self.me}: weight sync: {n:.0f} steps, {st(nw.NRS_SS_BYTES):.0f} bytes, "
            f"{st(nw.NRS_SS_FAILED):.0f} failed, {per:.6f} s/step; verified {g.verified} "
            f"generation shards, {g.mismatches} mismatches ({st(nw.NRS_SS_SAMPLED):.0f} sampled); "
            f"{st(nw.NRS_SS_BYTES_VERIFIED):.0f} bytes hashed")
        if g.mismatches:
            self.exitc = 1


MEM = {"auto": nw.NRS_MEM_AUTO, "host": nw.NRS_MEM_HOST, "cuda": nw.NRS_MEM_CUDA}


def start(w, a):
    """The first plan and the state; an exit status on failure, else None."""
    if a.checkpoint_dir:
        w.set_checkpoint_dir(a.checkpoint_dir)
    if w.control != "connected":
        # nereus-worker plans for itself here (nrs_plan_best): not in the worker API
        say(f"{PROG}: rank {w.rank}: no control channel ({w.control}): a Python rank takes "
            "its plan from nereus-controller ($NEREUS_SOCKET_DIR)")
        return 1
    try:
        w.control_plan(30)
        w.alloc_state(MEM[a.mem], fill=True)
    except nw.NereusError as e:
        say(f"{PROG}: rank {w.rank}: {e} (control: {w.control})")
        return 4 if e.code == nw.NRS_ERR_RETIRED else 1
    say(f"rank {w.rank} of {w.size}: pid {os.getpid()}, epoch {w.epoch}, GPU {w.gpu}, "
        f"{w.nbuffers} buffer(s), control {w.control}, {a.steps} step(s)")
    return None


def main(argv):
    a = parse_args(argv)
    if a.join:
        os.environ["NEREUS_JOIN"] = "1"
    if a.gpus_per_host > 0:  # before init: the HELLO carries it
        rank = int(os.environ.get("PMIX_RANK", 0))
        os.environ["NEREUS_HOSTNAME"] = f"node{rank // a.gpus_per_host}"
    try:
        w = nw.Worker(a.spec, emulated=True)  # the state nereus-worker's ranks hold
    except nw.NereusError as e:
        say(f"{PROG}: init: {e}")
        return 1
    try:
        rc = start(w, a)
        if rc is None and a.check_buffers and not check_buffers(w):
            rc = 1
        if rc is None and a.check_layers and not check_layers(w, "initial state"):
            rc = 1
        if rc is None:
            job = Job(w, a)
            job.steps()
            s = job.follow()
            while s is not None:  # placed after its own last step
                job.steps(s)
                s = job.follow()
            job.verify()
            rc = job.exitc
    finally:
        try:
            w.finalize()
        except nw.NereusError as e:
            say(f"{PROG}: rank finalize: {e}")
            rc = rc or 1
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
