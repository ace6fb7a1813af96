"""nereus_worker: a ctypes binding of libnereus's worker API.

What one rank (one training process, one GPU) of a Nereus job calls, from
Python, with the standard library only. The C API is include/nereus/nereus.h;
docs/worker-api.md says what each call does. This module mirrors it:

    from nereus_worker import Worker, NereusError, NRS_MEM_AUTO

    with Worker("job.yaml") as w:          # nrs_worker_init ... nrs_worker_finalize
        w.control_plan(30)                 # the plan of the committed epoch
        w.alloc_state(NRS_MEM_AUTO, fill=True)
        for step in range(steps):
            train_one_step(w.roles())      # your trainer
            w.report_stage(NRS_MS_ACTOR_TRAIN, seconds)
            w.report_step(step, response_len)
            if w.control_step():           # True: a transition committed
                rebuild_communicators(w)   # new epoch, GPU index and buffers
            w.weight_sync()                # actor.train -> actor.generate, a collective

Conventions:

- Every C call that fails raises NereusError(code, message): code is the
  NRS_ERR_* value, message nrs_worker_last_error() (the C call sets it on
  every failure, naming the call and the reason), str() adds
  nrs_worker_strerror(code). verify_state() and verify_generation() are the
  exception: a checksum mismatch is a result (its counts), not an error.
- Strings come back as str; paths go in as str (or bytes, or os.PathLike).
- Arguments the C call could not receive as given raise NereusError
  (NRS_ERR_INVAL) naming the call, before it: an int (or an integer with
  __index__, as numpy's) that does not fit its C type (ctypes would wrap it:
  buffer 2**32 would be buffer 0), a path with a NUL byte (C would read it
  cut there).
- The library is $NEREUS_LIB if set, else ctypes.util.find_library("nereus"),
  else "libnereus.so.0" (the dynamic loader's search path).
- Calls that take Nereus structs (nrs_worker_init_spec, nrs_worker_set_plan,
  nrs_worker_transition, nrs_worker_plan) are not bound: from Python, load the
  spec by path and let nereus-controller hand the plans over
  (docs/worker-api.md section 1).
- Not thread-safe, like the C handle: one thread drives a Worker.
- Worker(path, emulated=True) is nrs_worker_init_emulated: the spec's models
  scaled by runtime.emulation_scale, as nereus-worker runs them. Every rank
  of a job must take the same one (a job that mixes Python ranks with
  nereus-worker ranks: emulated=True).

API 4 made the per-step collectives public (nereus.h): control_step (the
step boundary), weight_sync (the actor's train -> generate weights),
sync_stat and verify_generation. API 5 added buffer_layer: one layer's part
of a buffer of a stacked layer tensor (NRS_TENSOR_*), as a framework's
per-layer parameter sees it. API 6 and 7 added the figures of what
runtime.verify hashed (NRS_TS_BYTES_VERIFIED, NRS_SS_BYTES_VERIFIED). API 8
added job_step: the job's step at the last commit, where a joiner that
waited in line for GPUs continues its step loop. API 9 added
NRS_SS_NO_VOTE: weight syncs with nothing to move, which cast no vote
(an older library reports 0). This binding is written
against API 9; load() refuses an older library unless
asked for less (want=).
"""

import ctypes
import ctypes.util
import operator
import os
from collections import namedtuple

__all__ = ["Worker", "NereusError", "NereusLibraryError", "Role", "Buffer", "BufferDesc",
           "LayerPart", "Verified", "load", "api_version", "strerror", "ms_name", "last_error",
           "API_VERSION"]

# The version of include/nereus/nereus.h this binding was written against.
API_VERSION = 9

# ---- constants, mirrored from include/nereus/nereus.h (and the enums it uses)
# python/test_nereus_worker.py parses the headers and fails on any drift.

NRS_OK = 0
NRS_ERR_INVAL = -1
NRS_ERR_NOMEM = -2
NRS_ERR_SPEC = -3
NRS_ERR_RDV = -4
NRS_ERR_XPORT = -5
NRS_ERR_PLAN = -6
NRS_ERR_ABORTED = -7
NRS_ERR_PARTIAL = -8
NRS_ERR_VERIFY = -9
NRS_ERR_UNSUPPORTED = -10
NRS_ERR_RETIRED = -11
NRS_ERR_CHECKPOINT = -12

NRS_MEM_AUTO = 0
NRS_MEM_HOST = 1
NRS_MEM_CUDA = 2

NRS_GROUP_TP = 0
NRS_GROUP_PP = 1
NRS_GROUP_DP = 2

NRS_TS_SECONDS = 0
NRS_TS_PREPARE_S = 1
NRS_TS_EXECUTE_S = 2
NRS_TS_VOTE_S = 3
NRS_TS_COMMIT_S = 4
NRS_TS_BYTES_SENT = 5
NRS_TS_BYTES_RECV = 6
NRS_TS_TRANSFERS = 7
NRS_TS_MAX_INFLIGHT = 8
NRS_TS_FAILED_RANK = 9
NRS_TS_PRESENT = 10
NRS_TS_REBUILDABLE = 11
NRS_TS_LOST = 12
NRS_TS_RESTORED_STEP = 13
NRS_TS_BYTES_VERIFIED = 14
NRS_TS_COUNT = 15

# Model-stages (nrs_ms_t, include/nereus/spec.h): nrs_worker_role's ms and
# the ms argument of report_stage and group.
NRS_MS_ACTOR_GENERATE = 0
NRS_MS_ACTOR_INFER = 1
NRS_MS_CRITIC_INFER = 2
NRS_MS_REF_INFER = 3
NRS_MS_REWARD_INFER = 4
NRS_MS_ACTOR_TRAIN = 5
NRS_MS_CRITIC_TRAIN = 6
NRS_MS_COUNT = 7

# Models (nrs_role_t, spec.h) and state kinds (nrs_emu_kind_t,
# include/nereus/emu.h): what buffer_desc reports.
NRS_ROLE_ACTOR = 0
NRS_ROLE_CRITIC = 1
NRS_ROLE_REF = 2
NRS_ROLE_REWARD = 3
NRS_ROLE_COUNT = 4

NRS_EMU_WEIGHT = 0
NRS_EMU_GRAD = 1
NRS_EMU_MASTER = 2
NRS_EMU_ADAM_M = 3
NRS_EMU_ADAM_V = 4
NRS_EMU_KIND_COUNT = 5

# Fields of nrs_worker_sync_stat (nereus.h, API 4).
NRS_SS_STEPS = 0
NRS_SS_FAILED = 1
NRS_SS_BYTES = 2
NRS_SS_LAST_S = 3
NRS_SS_LAST_BYTES = 4
NRS_SS_TOTAL_S = 5
NRS_SS_SAMPLED = 6
NRS_SS_BYTES_VERIFIED = 7
NRS_SS_NO_VOTE = 8  # API 9

# Tensor ids (buffer_desc's tensor; nereus.h's nrs_worker_buffer_desc, from
# runtime/emu/geometry.h's NRS_EMU_T_* and NRS_EMU_T_GLOBALS + NRS_EMU_LT_*):
# the global tensors, then the layer tensors, each holding every layer
# stacked: QKV, GATE and UP put layer l in columns [l*hidden, (l+1)*hidden),
# O and DOWN in rows [l*hidden, (l+1)*hidden), the norms in row l.
NRS_TENSOR_EMBED = 0
NRS_TENSOR_FINAL_NORM = 1
NRS_TENSOR_HEAD = 2          # lm head, or the value head
NRS_TENSOR_QKV = 3           # the first layer tensor
NRS_TENSOR_O = 4
NRS_TENSOR_GATE = 5
NRS_TENSOR_UP = 6
NRS_TENSOR_DOWN = 7
NRS_TENSOR_NORM1 = 8
NRS_TENSOR_NORM2 = 9
NRS_TENSOR_COUNT = 10

__all__ += [k for k in list(globals()) if k.startswith("NRS_")]

_TS_NAMES = ("seconds", "prepare_s", "execute_s", "vote_s", "commit_s", "bytes_sent",
             "bytes_recv", "transfers", "max_inflight", "failed_rank", "present",
             "rebuildable", "lost", "restored_step", "bytes_verified")

# ---- results -------------------------------------------------------------

Role = namedtuple("Role", "ms name tp pp dp t p d")
Role.__doc__ = ("A model-stage this rank runs: ms (NRS_MS_*), its name, the layout "
                "(tp, pp, dp) and this rank's coordinates (t, p, d) in it.")
Buffer = namedtuple("Buffer", "ptr nbytes")
Buffer.__doc__ = "Address (int; device memory under NRS_MEM_CUDA) and size of a state buffer."
BufferDesc = namedtuple("BufferDesc", "role tensor kind r0 r1 c0 c1 esize")
BufferDesc.__doc__ = ("What a buffer holds: model (NRS_ROLE_*), tensor id, kind (NRS_EMU_*), "
                      "its box [r0,r1) x [c0,c1) in global coordinates, element size.")
LayerPart = namedtuple("LayerPart", "ptr rows cols pitch r0 c0")
LayerPart.__doc__ = ("One layer's part of a buffer of a layer tensor: rows x cols elements "
                     "from ptr (int; device memory under NRS_MEM_CUDA), pitch bytes from row "
                     "to row; (r0, c0) is where it sits in that layer's own [out, in] weight.")
Verified = namedtuple("Verified", "verified mismatches")
Verified.__doc__ = "Shards checksummed against the pattern, and how many did not match."


class NereusLibraryError(OSError):
    """libnereus could not be loaded, or is older than this binding."""


class NereusError(Exception):
    """A worker API call failed: code (NRS_ERR_*), message (nrs_worker_last_error)."""

    def __init__(self, code, message=""):
        super().__init__(code, message)
        self.code = code
        self.message = message

    @property
    def name(self):
        """nrs_worker_strerror(code)."""
        return strerror(self.code)

    def __str__(self):
        return f"{self.name}: {self.message}" if self.message else self.name


# ---- loading ---------------------------------------------------------------

_P = ctypes.c_void_p
_I, _LL, _D, _S = ctypes.c_int, ctypes.c_longlong, ctypes.c_double, ctypes.c_char_p
_PI, _PLL = ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_longlong)
REPORT_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)

# name: (restype, argtypes), for every function this module calls
_PUBLIC = {
    "nrs_worker_api_version": (_I, []),
    "nrs_worker_strerror": (_S, [_I]),
    "nrs_worker_init": (_I, [ctypes.POINTER(_P), _S]),
    "nrs_worker_init_emulated": (_I, [ctypes.POINTER(_P), _S]),
    "nrs_worker_finalize": (_I, [_P]),
    "nrs_worker_last_error": (_S, [_P]),
    "nrs_worker_rank": (_I, [_P]),
    "nrs_worker_size": (_I, [_P]),
    "nrs_worker_is_singleton": (_I, [_P]),
    "nrs_worker_transport": (_S, [_P]),
    "nrs_worker_control": (_S, [_P]),
    "nrs_worker_epoch": (_I, [_P]),
    "nrs_worker_nroles": (_I, [_P]),
    "nrs_worker_role": (_I, [_P, _I] + [_PI] * 7),
    "nrs_worker_group": (_I, [_P, _I, _I, _PI, _I]),
    "nrs_worker_ms_name": (_S, [_I]),
    "nrs_worker_alloc_state": (_I, [_P, _I, _I]),
    "nrs_worker_mem_kind": (_I, [_P]),
    "nrs_worker_nbuffers": (_I, [_P]),
    "nrs_worker_buffer": (_I, [_P, _I, ctypes.POINTER(_P), _PLL]),
    "nrs_worker_buffer_desc": (_I, [_P, _I] + [_PI] * 8),
    "nrs_worker_buffer_layer": (_I, [_P, _I, _I, ctypes.POINTER(_P), _PI, _PI, _PLL, _PI, _PI]),
    "nrs_worker_verify_state": (_I, [_P, _PLL, _PLL]),
    "nrs_worker_set_report_sink": (_I, [_P, REPORT_FN, _P]),
    "nrs_worker_report_stage": (_I, [_P, _I, _D]),
    "nrs_worker_report_memory": (_I, [_P, _LL, _LL, _I]),
    "nrs_worker_report_step": (_I, [_P, _I, _D]),
    "nrs_worker_transition_stat": (_D, [_P, _I]),
    "nrs_worker_set_checkpoint_dir": (_I, [_P, _S]),
    "nrs_worker_checkpoint": (_I, [_P, ctypes.c_long]),
    "nrs_worker_joined_at": (_I, [_P]),
    "nrs_worker_job_step": (_I, [_P]),
    "nrs_worker_control_plan": (_I, [_P, _D]),
    "nrs_worker_control_poll": (_I, [_P, _D]),
    "nrs_worker_gpu": (_I, [_P]),
    "nrs_worker_control_step": (_I, [_P]),
    "nrs_worker_weight_sync": (_I, [_P]),
    "nrs_worker_sync_stat": (_D, [_P, _I]),
    "nrs_worker_verify_generation": (_I, [_P, _PLL, _PLL]),
}

_lib = None


def _find_library():
    path = os.environ.get("NEREUS_LIB")
    if path:
        return path
    return ctypes.util.find_library("nereus") or "libnereus.so.0"


# Functions newer than API 1, with the API that added them (nereus.h's
# history): a library that has only an older API (load(want=4)) lacks them,
# and using one says so.
_SINCE = {"nrs_worker_control_plan": 2, "nrs_worker_control_poll": 2, "nrs_worker_gpu": 2,
          "nrs_worker_set_checkpoint_dir": 3, "nrs_worker_checkpoint": 3,
          "nrs_worker_joined_at": 3, "nrs_worker_init_emulated": 4,
          "nrs_worker_control_step": 4, "nrs_worker_weight_sync": 4,
          "nrs_worker_sync_stat": 4, "nrs_worker_verify_generation": 4,
          "nrs_worker_buffer_layer": 5, "nrs_worker_job_step": 8}


def _declare(lib, table, have=API_VERSION):
    """Set restype and argtypes of every function of table the library's API
    version (have) has."""
    for name, (restype, argtypes) in table.items():
        if _SINCE.get(name, 0) > have:
            continue
        try:
            fn = getattr(lib, name)  # cached on lib: the types stay set
        except AttributeError:
            raise NereusLibraryError(f"{lib._name}: no symbol {name}") from None
        fn.restype, fn.argtypes = restype, argtypes


def _function(lib, name):
    """lib's function `name`, or NereusLibraryError when the library's API
    is older than the one that added it (a library taken with want=)."""
    need, have = _SINCE.get(name, 0), getattr(lib, "_nrs_api", API_VERSION)
    if need > have:
        raise NereusLibraryError(f"{name} needs worker API {need}; the library has {have}")
    return getattr(lib, name)


def load(path=None, want=API_VERSION):
    """Load libnereus (path, else the default search above), declare every
    function's types and check its API version: a library older than `want`
    lacks functions this binding calls (the API only grows, so a newer one is
    fine). Returns the ctypes.CDLL; later calls return the same one (checked
    against their own `want`)."""
    global _lib
    if _lib is not None and path is None:
        if _lib._nrs_api < want:
            raise NereusLibraryError(f"{_lib._name}: worker API version {_lib._nrs_api}, "
                                     f"asked for {want}: install a newer libnereus")
        return _lib
    name = path or _find_library()
    try:
        lib = ctypes.CDLL(name)
    except OSError as e:
        raise NereusLibraryError(f"cannot load libnereus ({name}): {e}; "
                                 "set NEREUS_LIB to its path") from None
    # checked before the other symbols: an old library would fail on those
    # with a less helpful message
    try:
        version = lib.nrs_worker_api_version
    except AttributeError:
        raise NereusLibraryError(f"{name} is not libnereus: no nrs_worker_api_version") from None
    version.restype, version.argtypes = _I, []
    have = version()
    if have < want:
        raise NereusLibraryError(f"{name}: worker API version {have}, this binding "
                                 f"(nereus_worker.py) needs {want}: install a newer libnereus")
    _declare(lib, _PUBLIC, have)
    lib._nrs_api = have
    if path is None:
        _lib = lib
    return lib


def _loaded():
    """The library load() took first (whatever it was asked for), else load()."""
    return _lib if _lib is not None else load()


def _text(b):
    return b.decode("utf-8", "replace") if b is not None else ""


def _path(p, fn):
    if p is None:
        return None
    b = os.fsencode(p)
    if b"\0" in b:  # C would take the path cut at the NUL
        raise NereusError(NRS_ERR_INVAL, f"{fn}: path {p!r}: embedded NUL byte")
    return b


# bits of the C integer types of the bound calls' arguments
_BITS = {_I: 8 * ctypes.sizeof(_I), ctypes.c_long: 8 * ctypes.sizeof(ctypes.c_long),
         _LL: 8 * ctypes.sizeof(_LL)}


def _check_ints(fn, name, args):
    """Refuse an int argument (after the handle) that its C type cannot hold:
    ctypes would pass it wrapped, silently (2**32 as 0). An integer that is
    not an int (numpy.int64: __index__) is one too: ctypes takes and wraps it
    the same."""
    for k, (t, a) in enumerate(zip((getattr(fn, "argtypes", None) or [])[1:], args)):
        bits = _BITS.get(t)
        if bits and not isinstance(a, int) and hasattr(type(a), "__index__"):
            a = operator.index(a)
        if bits and isinstance(a, int) and not -(1 << (bits - 1)) <= a < 1 << (bits - 1):
            raise NereusError(NRS_ERR_INVAL, f"{name}: argument {k + 1} = {a}: does not fit "
                                             f"its C type ({bits}-bit)")


def api_version():
    """nrs_worker_api_version() of the loaded library."""
    return _loaded().nrs_worker_api_version()


def strerror(code):
    """nrs_worker_strerror(code): the name of an NRS_ERR_* code."""
    return _text(_loaded().nrs_worker_strerror(code))


def ms_name(ms):
    """nrs_worker_ms_name(ms): e.g. 'actor.train'; '?' for an unknown id."""
    return _text(_loaded().nrs_worker_ms_name(ms))


def last_error():
    """nrs_worker_last_error(NULL): the message of the last call of this
    thread that failed without a handle to keep it (an init, a finalize, a
    call given a NULL handle); '' if none."""
    return _text(_loaded().nrs_worker_last_error(None))


# ---- the handle ------------------------------------------------------------

class Worker:
    """One rank's handle (nrs_worker_t *): joins the job on construction
    (nrs_worker_init), leaves it on finalize() or at the end of a with block.

    spec_path: the job's YAML (None: $NEREUS_SPEC). emulated=False
    (nrs_worker_init): the state is the spec's models at full size;
    emulated=True (nrs_worker_init_emulated): scaled down by the spec's
    runtime.emulation_scale, as nereus-worker does. Every rank of a job must
    take the same one: their graphs differ otherwise.
    """

    def __init__(self, spec_path=None, lib=None, emulated=False):
        self._lib = lib or _loaded()
        self._sink = None  # keeps the report callback alive while C holds it
        h = _P()
        init = _function(self._lib, "nrs_worker_init_emulated" if emulated else "nrs_worker_init")
        rc = init(ctypes.byref(h), _path(spec_path, init.__name__))
        self._h = h
        if rc:
            # on failure the handle may exist: read why (the library keeps it
            # for nrs_worker_last_error(NULL) too), then free it
            msg = _text(self._lib.nrs_worker_last_error(h if h.value else None))
            self._lib.nrs_worker_finalize(h)
            self._h = None
            raise NereusError(rc, msg)

    # -- plumbing

    def _handle(self):
        # the C calls refuse a NULL handle, but a finalized one is freed
        # memory: refuse it here
        if self._h is None:
            raise NereusError(NRS_ERR_INVAL, "the worker was finalized")
        return self._h

    def _call(self, name, *args):
        """Call nrs_worker_<name>(handle, args...); raise NereusError with the
        call's message (nrs_worker_last_error) if it returns < 0."""
        h = self._handle()
        fn = _function(self._lib, "nrs_worker_" + name)
        _check_ints(fn, "nrs_worker_" + name, args)
        rc = fn(h, *args)
        if rc < 0:
            raise NereusError(rc, _text(self._lib.nrs_worker_last_error(h)))
        return rc

    def _get(self, name):
        return _function(self._lib, "nrs_worker_" + name)(self._handle())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False

    def finalize(self):
        """Leave the job (survivors' barrier, bounded) and free the handle.
        Idempotent. A failure is raised after the handle is gone, with the
        message the library kept (nrs_worker_last_error(NULL))."""
        if self._h is None:
            return
        h, self._h = self._h, None
        self._sink = None
        rc = self._lib.nrs_worker_finalize(h)
        if rc:
            raise NereusError(rc, _text(self._lib.nrs_worker_last_error(None)))

    @property
    def finalized(self):
        return self._h is None

    # -- who and where

    @property
    def last_error(self):
        """nrs_worker_last_error: what the last failing call (or a warning) said."""
        return _text(self._get("last_error"))

    @property
    def rank(self):
        return self._get("rank")

    @property
    def size(self):
        return self._get("size")

    @property
    def is_singleton(self):
        return bool(self._get("is_singleton"))

    @property
    def transport(self):
        """'ucx' or 'local'."""
        return _text(self._get("transport"))

    @property
    def control(self):
        """The control channel: 'connected', 'none', or why it failed."""
        return _text(self._get("control"))

    @property
    def joined_at(self):
        """The step the job was at when this rank joined it; -1 if it started with the job."""
        return self._get("joined_at")

    @property
    def job_step(self):
        """The job's step at the last committed transition of the controller (the
        ranks that held GPUs before it); -1 before the first. A rank that held no
        GPU and got one there continues its step loop after this step."""
        return self._get("job_step")

    # -- the plan and this rank's place in it

    def control_plan(self, timeout_s=30.0):
        """Wait for the controller's plan of the committed epoch and take it."""
        self._call("control_plan", float(timeout_s))

    def control_poll(self, timeout_s=0.0):
        """Handle what the controller sent (waiting up to timeout_s for the
        first frame); an announced transition runs here, as a collective.
        True: a transition committed (new epoch, GPU index and state);
        False: nothing to do. Raises NereusError with NRS_ERR_ABORTED (old
        epoch intact), NRS_ERR_PARTIAL, NRS_ERR_RETIRED, ..."""
        return self._call("control_poll", float(timeout_s)) == 1

    @property
    def epoch(self):
        """Epoch of the current plan; -1 before any."""
        return self._get("epoch")

    @property
    def gpu(self):
        """This rank's GPU in the current plan; -1 when it holds none."""
        return self._get("gpu")

    @property
    def nroles(self):
        return self._get("nroles")

    def role(self, i):
        """The i-th model-stage this rank runs, as a Role."""
        v = [ctypes.c_int() for _ in range(7)]
        self._call("role", i, *[ctypes.byref(x) for x in v])
        ms, tp, pp, dp, t, p, d = (x.value for x in v)
        return Role(ms, ms_name(ms), tp, pp, dp, t, p, d)

    def roles(self):
        return [self.role(i) for i in range(self.nroles)]

    def group(self, ms, which):
        """Ranks of this rank's tp, pp or dp group (NRS_GROUP_*) of model-stage ms."""
        n = self._call("group", ms, which, None, 0)  # the count first
        ranks = (ctypes.c_int * max(n, 1))()
        n = self._call("group", ms, which, ranks, n)
        return list(ranks[:n])

    # -- state

    def alloc_state(self, mem=NRS_MEM_AUTO, fill=False):
        """Allocate this rank's EMU state under the current plan (NRS_MEM_*);
        fill writes the deterministic pattern verify_state checks."""
        self._call("alloc_state", mem, 1 if fill else 0)

    @property
    def mem_kind(self):
        """NRS_MEM_HOST or NRS_MEM_CUDA."""
        return self._get("mem_kind")

    @property
    def nbuffers(self):
        return self._get("nbuffers")

    def buffer(self, i):
        """Buffer i: Buffer(ptr, nbytes). Valid until the state changes
        (a transition, finalize)."""
        ptr, n = _P(), ctypes.c_longlong()
        self._call("buffer", i, ctypes.byref(ptr), ctypes.byref(n))
        return Buffer(ptr.value or 0, n.value)

    def buffer_view(self, i):
        """A writable memoryview of buffer i (host memory only). It points
        into the C state: do not use it after a transition or finalize."""
        if self.mem_kind != NRS_MEM_HOST:
            raise NereusError(NRS_ERR_UNSUPPORTED, f"buffer {i} is in CUDA memory: no host view")
        b = self.buffer(i)
        if not b.ptr or b.nbytes <= 0:
            return memoryview(b"")
        return memoryview((ctypes.c_ubyte * b.nbytes).from_address(b.ptr)).cast("B")

    def buffer_desc(self, i):
        """What buffer i holds, as a BufferDesc."""
        v = [ctypes.c_int() for _ in range(8)]
        self._call("buffer_desc", i, *[ctypes.byref(x) for x in v])
        return BufferDesc(*(x.value for x in v))

    def buffer_layer(self, i, layer):
        """Layer `layer`'s part of buffer i (a layer tensor, tensor >=
        NRS_TENSOR_QKV), as a LayerPart (API 5). Raises NereusError
        NRS_ERR_INVAL when the buffer holds none of that layer or holds a
        global tensor. Valid until the state changes, as buffer()."""
        ptr, pitch = _P(), ctypes.c_longlong()
        v = [ctypes.c_int() for _ in range(4)]  # rows, cols, r0, c0
        self._call("buffer_layer", i, layer, ctypes.byref(ptr), ctypes.byref(v[0]),
                   ctypes.byref(v[1]), ctypes.byref(pitch), ctypes.byref(v[2]),
                   ctypes.byref(v[3]))
        rows, cols, r0, c0 = (x.value for x in v)
        return LayerPart(ptr.value or 0, rows, cols, pitch.value, r0, c0)

    def buffer_layer_view(self, i, layer):
        """Layer `layer`'s part of buffer i as a list of writable memoryviews,
        one per row of the part (host memory only; see buffer_view)."""
        if self.mem_kind != NRS_MEM_HOST:
            raise NereusError(NRS_ERR_UNSUPPORTED, f"buffer {i} is in CUDA memory: no host view")
        part, esize = self.buffer_layer(i, layer), self.buffer_desc(i).esize
        n = part.cols * esize
        if not part.ptr or n <= 0:
            return []
        return [memoryview((ctypes.c_ubyte * n).from_address(part.ptr + r * part.pitch)).cast("B")
                for r in range(part.rows)]

    def verify_state(self):
        """Checksum every buffer against the pattern: Verified(verified,
        mismatches). A mismatch is reported in the counts, not raised."""
        ver, bad = ctypes.c_longlong(), ctypes.c_longlong()
        h = self._handle()
        rc = self._lib.nrs_worker_verify_state(h, ctypes.byref(ver), ctypes.byref(bad))
        if rc < 0 and rc != NRS_ERR_VERIFY:
            raise NereusError(rc, _text(self._lib.nrs_worker_last_error(h)))
        return Verified(ver.value, bad.value)

    # -- reports

    def set_report_sink(self, fn):
        """fn(json_line: str) receives each report (None: back to
        $NEREUS_REPORT_FILE). Exceptions in fn are printed and ignored."""
        cb = REPORT_FN(lambda _arg, js: fn(_text(js))) if fn else REPORT_FN()  # NULL
        self._call("set_report_sink", cb, None)
        self._sink = cb

    def report_stage(self, ms, seconds):
        """Add a measured stage time (NRS_MS_*) to the current step's report."""
        self._call("report_stage", ms, float(seconds))

    def report_memory(self, used_bytes, cap_bytes, alloc_failed=False):
        self._call("report_memory", int(used_bytes), int(cap_bytes), 1 if alloc_failed else 0)

    def report_step(self, step, response_len=0.0):
        """Close step `step` (response_len: mean tokens, 0 unknown): one report.
        A step not above the last one (re-run after a checkpoint restore) is
        ignored by the controller, which keeps the channel."""
        self._call("report_step", step, float(response_len))

    # -- transitions

    def transition_stat(self, which):
        """A figure of the last transition (NRS_TS_*); before any, 0 (-1 for
        failed_rank and restored_step)."""
        _check_ints(self._lib.nrs_worker_transition_stat, "nrs_worker_transition_stat", (which,))
        return self._lib.nrs_worker_transition_stat(self._handle(), which)

    def transition_stats(self):
        """Every NRS_TS_* figure, by name ('seconds', 'bytes_sent', ...)."""
        return {n: self.transition_stat(i) for i, n in enumerate(_TS_NAMES)}

    # -- checkpoints and joins

    def set_checkpoint_dir(self, path):
        """Where checkpoints go (None turns them off)."""
        self._call("set_checkpoint_dir", _path(path, "nrs_worker_set_checkpoint_dir"))

    def checkpoint(self, step):
        """Collective at a step boundary: write and publish the checkpoint of `step`."""
        self._call("checkpoint", step)

    # -- the step boundary and the actor's weight sync (API 4)

    def control_step(self):
        """The step boundary, once per step on every rank of a job with the
        weight sync: the ranks of the plan agree on a pending PREPARE and
        take it at the same step. True: a transition committed (new epoch,
        GPU index and state); False: nothing to do. Raises as control_poll."""
        return self._call("control_step") == 1

    def weight_sync(self):
        """The actor's train -> generate weight sync of the current plan, a
        collective of the ranks holding its GPUs (after control_step each
        step). Raises NereusError: NRS_ERR_ABORTED (failed or skipped; the
        training state is intact), NRS_ERR_VERIFY (the shard checked after it
        does not match), NRS_ERR_PLAN (no actor.train and actor.generate)."""
        self._call("weight_sync")

    def sync_stat(self, which):
        """A weight-sync figure of this rank (NRS_SS_*)."""
        fn = _function(self._lib, "nrs_worker_sync_stat")
        _check_ints(fn, "nrs_worker_sync_stat", (which,))
        return fn(self._handle(), which)

    def verify_generation(self):
        """Checksum every generation weight shard of this rank (filled by the
        last sync): Verified(verified, mismatches). Raises NRS_ERR_INVAL when
        no sync ran since the last epoch change."""
        ver, bad = ctypes.c_longlong(), ctypes.c_longlong()
        h = self._handle()
        rc = _function(self._lib, "nrs_worker_verify_generation")(h, ctypes.byref(ver),
                                                                  ctypes.byref(bad))
        if rc < 0 and rc != NRS_ERR_VERIFY:
            raise NereusError(rc, _text(self._lib.nrs_worker_last_error(h)))
        return Verified(ver.value, bad.value)
