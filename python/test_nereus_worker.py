#!/usr/bin/env python3
"""Tests of python/nereus_worker.py that need no job (run by
tests/mp/test_python.sh; alone: NEREUS_LIB=<build>/.libs/libnereus.so.0
python3 python/test_nereus_worker.py -v).

- the constants and the API version mirror the C headers (parsed here, so a
  header change the binding did not follow fails), the tensor ids
  (NRS_TENSOR_*) runtime/emu/geometry.h's; every bound function's types are
  those its nereus.h prototype declares;
- the library's version check, the error paths (bad, malformed or missing
  spec; calls out of order; a finalized handle) raise NereusError with the C
  library's message, which names the call and the reason, never a stale one;
- every function nereus.h declares, called through ctypes with a NULL handle
  (and NULL for every pointer), returns its failure value without crashing
  and says which call in nrs_worker_last_error(NULL); the message of a failed
  init outlives its handle;
- a singleton handle (no PMIx server, no controller) answers every accessor
  (no transition yet: failed_rank -1), takes NULL output pointers, and
  reports reach a Python sink as JSON.

The tests that call libnereus are skipped when it cannot be loaded and
$NEREUS_LIB is unset; with $NEREUS_LIB set, a load failure is a failure.
"""

import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import nereus_worker as nw  # noqa: E402

SRC = os.environ.get("NRS_SRCDIR") or os.path.dirname(HERE)
INCLUDE = os.path.join(SRC, "include", "nereus")
SPEC = os.path.join(SRC, "tests", "mp", "e2e.yaml")

# header -> (prefixes of the constants the binding mirrors, enum name or None
# for every anonymous enum of the header)
MIRRORED = [
    ("include/nereus/nereus.h", ("NRS_OK", "NRS_ERR_", "NRS_MEM_", "NRS_GROUP_", "NRS_TS_",
                                 "NRS_SS_"), None),
    ("include/nereus/spec.h", ("NRS_MS_",), "nrs_ms_t"),
    ("include/nereus/spec.h", ("NRS_ROLE_",), "nrs_role_t"),
    ("include/nereus/emu.h", ("NRS_EMU_",), "nrs_emu_kind_t"),
]
# The tensor ids buffer_desc reports (nereus.h documents them: 0..2 global
# tensors, 3..9 the stacked layer tensors) come from an internal header: the
# binding's NRS_TENSOR_X is geometry.h's NRS_EMU_T_X (a global tensor) or
# NRS_EMU_T_GLOBALS + NRS_EMU_LT_X (a layer tensor; COUNT: all of them).
GEOMETRY = "runtime/emu/geometry.h"


def strip_comments(text):
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", text, flags=re.S))


def c_int_expr(expr, known):
    """The value of a constant integer expression of C (literals, earlier
    enumerators, + - * ~ << >> | & and parentheses); None if it is more."""
    expr = re.sub(r"\b(\d+)[uUlL]+\b", r"\1", expr)
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: str(known.get(m.group(0), "?")), expr)
    if not re.fullmatch(r"[0-9xXa-fA-F\s()<>|&+\-*~]+", expr):
        return None
    return int(eval(expr, {"__builtins__": {}}))  # only the characters above


def c_enums(text):
    """[(typedef name or None, {NAME: value})] of every enum in C source text,
    with C's implicit +1 after the last explicit value."""
    out, known = [], {}
    pat = r"(typedef\s+)?enum\s*\w*\s*\{(.*?)\}\s*(\w*)\s*;"
    for m in re.finditer(pat, strip_comments(text), flags=re.S):
        values, nxt = {}, 0
        for item in filter(None, (x.strip() for x in m.group(2).split(","))):
            name, _, val = (s.strip() for s in item.partition("="))
            nxt = c_int_expr(val, known) if val else nxt
            values[name] = known[name] = nxt
            nxt = None if nxt is None else nxt + 1
        out.append((m.group(3) or None, values))
    return out


def c_prototypes(text):
    """{name: (return type, [parameter declarations])} of every nrs_worker_*
    function C header text declares."""
    out = {}
    pat = r"([A-Za-z_][\w\s*]*?)\b(nrs_worker_\w+)\s*\(([^()]*)\)\s*;"
    for m in re.finditer(pat, strip_comments(text)):
        ret = " ".join(m.group(1).replace("*", " * ").split())
        params = [" ".join(p.split()) for p in m.group(3).split(",")]
        out[m.group(2)] = (ret, [] if params == ["void"] else params)
    return out


def c_define(text, name):
    m = re.search(rf"^\s*#\s*define\s+{name}\s+(\S+)", text, flags=re.M)
    return int(m.group(1), 0) if m else None


def tensor_ids():
    """{NRS_TENSOR_X: id} from GEOMETRY's enums (see above)."""
    with open(os.path.join(SRC, GEOMETRY)) as f:
        known = {}
        for _, values in c_enums(f.read()):
            known.update(values)
    base = known["NRS_EMU_T_GLOBALS"]
    ids = {"NRS_TENSOR_" + k[len("NRS_EMU_T_"):]: v for k, v in known.items()
           if k.startswith("NRS_EMU_T_") and k != "NRS_EMU_T_GLOBALS"}
    ids.update({"NRS_TENSOR_" + k[len("NRS_EMU_LT_"):]: base + v for k, v in known.items()
                if k.startswith("NRS_EMU_LT_")})
    return ids


def header_constants():
    """{NAME: value} of every constant the binding must mirror."""
    want = {}
    for rel, prefixes, enum_name in MIRRORED:
        with open(os.path.join(SRC, rel)) as f:
            text = f.read()
        for name, values in c_enums(text):
            if enum_name is not None and name != enum_name:
                continue
            want.update({k: v for k, v in values.items() if k.startswith(prefixes)})
    want.update(tensor_ids())
    return want


def c_param_type(decl):
    """The type of a parameter declaration ('const nrs_worker_t *w' ->
    'nrs_worker_t *'), const dropped: what a ctypes binding can tell apart."""
    toks = decl.replace("*", " * ").split()
    if len(toks) > 1 and re.fullmatch(r"[A-Za-z_]\w*", toks[-1]) and \
            toks[-1] not in ("int", "long", "double", "char", "void"):
        toks = toks[:-1]  # the name
    return " ".join(t for t in toks if t != "const")


# the ctypes type a binding must declare for each C type nereus.h uses
_P = ctypes.c_void_p
C_TO_CTYPES = {
    "int": ctypes.c_int, "long": ctypes.c_long, "long long": ctypes.c_longlong,
    "double": ctypes.c_double, "char *": ctypes.c_char_p, "void *": _P,
    "void * *": ctypes.POINTER(_P), "int *": ctypes.POINTER(ctypes.c_int),
    "long long *": ctypes.POINTER(ctypes.c_longlong), "nrs_worker_t *": _P,
    "nrs_worker_t * *": ctypes.POINTER(_P), "nrs_report_fn": nw.REPORT_FN,
}


_lib_error = None


def lib_or_skip(test):
    """The loaded library; skips test when it cannot be found (see the docstring)."""
    global _lib_error
    try:
        return nw.load()
    except nw.NereusLibraryError as e:
        _lib_error = e
        if os.environ.get("NEREUS_LIB"):
            raise
        test.skipTest(f"libnereus not found ({e}); set NEREUS_LIB")


class Constants(unittest.TestCase):
    def test_api_version_matches_header(self):
        with open(os.path.join(INCLUDE, "nereus.h")) as f:
            v = c_define(f.read(), "NRS_WORKER_API_VERSION")
        self.assertEqual(nw.API_VERSION, v, "nereus.h's NRS_WORKER_API_VERSION moved: "
                         "bind the new functions and raise API_VERSION")

    def test_parser_sees_the_headers(self):
        # the comparison below is only as good as the parse
        want = header_constants()
        # values the API promises to keep, one per group and header
        fixed = {"NRS_OK": 0, "NRS_ERR_INVAL": -1, "NRS_MEM_HOST": 1, "NRS_GROUP_DP": 2,
                 "NRS_TS_SECONDS": 0, "NRS_MS_ACTOR_GENERATE": 0, "NRS_ROLE_ACTOR": 0,
                 "NRS_EMU_WEIGHT": 0, "NRS_SS_STEPS": 0,
                 # the tensor ids nereus.h documents (nrs_worker_buffer_desc)
                 "NRS_TENSOR_EMBED": 0, "NRS_TENSOR_FINAL_NORM": 1, "NRS_TENSOR_HEAD": 2,
                 "NRS_TENSOR_QKV": 3, "NRS_TENSOR_O": 4, "NRS_TENSOR_GATE": 5,
                 "NRS_TENSOR_UP": 6, "NRS_TENSOR_DOWN": 7, "NRS_TENSOR_NORM1": 8,
                 "NRS_TENSOR_NORM2": 9, "NRS_TENSOR_COUNT": 10}
        self.assertEqual({k: want.get(k) for k in fixed}, fixed)
        for count in ("NRS_TS_COUNT", "NRS_MS_COUNT", "NRS_ROLE_COUNT", "NRS_EMU_KIND_COUNT"):
            self.assertIsInstance(want.get(count), int, count)
        self.assertNotIn("NRS_EMU_ELOST", want)  # another enum of emu.h than the kinds
        self.assertNotIn("NRS_TENSOR_GLOBALS", want)  # a count, not a tensor

    def test_constants_match_headers(self):
        want = header_constants()
        have = {k: v for k, v in vars(nw).items() if k.startswith("NRS_") and isinstance(v, int)}
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        wrong = sorted(f"{k}: header {want[k]}, binding {have[k]}"
                       for k in set(want) & set(have) if want[k] != have[k])
        self.assertEqual((missing, extra, wrong), ([], [], []),
                         "nereus_worker.py's constants drifted from the headers "
                         "(missing, not in any header, different values)")


class Library(unittest.TestCase):
    def setUp(self):
        self.lib = lib_or_skip(self)

    def test_version_check(self):
        self.assertGreaterEqual(nw.api_version(), nw.API_VERSION)
        path = os.environ.get("NEREUS_LIB") or nw._find_library()
        with self.assertRaisesRegex(nw.NereusLibraryError, rf"version {nw.api_version()}.*"
                                    rf"needs {nw.API_VERSION + 1}"):
            nw.load(path, want=nw.API_VERSION + 1)
        with self.assertRaisesRegex(nw.NereusLibraryError, "cannot load libnereus.*NEREUS_LIB"):
            nw.load("/nonexistent/libnereus.so.0")
        libc = ctypes.util.find_library("c")
        if libc:
            with self.assertRaisesRegex(nw.NereusLibraryError, "is not libnereus"):
                nw.load(libc)

    def test_older_library_when_asked_for_less(self):
        # a library of API 7 (no nrs_worker_job_step): load(want=7) takes it,
        # the default refuses it naming the versions
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler")
        with tempfile.TemporaryDirectory() as d:
            src, so = os.path.join(d, "old.c"), os.path.join(d, "libold.so")
            with open(src, "w") as f:
                f.write("int nrs_worker_api_version(void) { return 7; }\n")
                for name in nw._PUBLIC:
                    if name != "nrs_worker_api_version" and nw._SINCE.get(name, 0) <= 7:
                        f.write(f"int {name}(void) {{ return 0; }}\n")
            subprocess.run([cc, "-shared", "-fPIC", "-o", so, src], check=True)
            lib = nw.load(so, want=7)
            self.assertEqual(lib._nrs_api, 7)
            with self.assertRaisesRegex(nw.NereusLibraryError, rf"version 7.*needs {nw.API_VERSION}"):
                nw.load(so)

    # the API that added each bound function after API 1 (nereus.h's history)
    SINCE = {"nrs_worker_control_plan": 2, "nrs_worker_control_poll": 2, "nrs_worker_gpu": 2,
             "nrs_worker_set_checkpoint_dir": 3, "nrs_worker_checkpoint": 3,
             "nrs_worker_joined_at": 3, "nrs_worker_init_emulated": 4,
             "nrs_worker_control_step": 4, "nrs_worker_weight_sync": 4,
             "nrs_worker_sync_stat": 4, "nrs_worker_verify_generation": 4,
             "nrs_worker_buffer_layer": 5, "nrs_worker_job_step": 8}

    def stub_library(self, d, version):
        """A library of API `version`: the functions this binding binds that
        the API had then (SINCE), each returning 0."""
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler")
        src, so = os.path.join(d, f"old{version}.c"), os.path.join(d, f"libold{version}.so")
        with open(src, "w") as f:
            f.write(f"int nrs_worker_api_version(void) {{ return {version}; }}\n")
            for name in nw._PUBLIC:
                if name != "nrs_worker_api_version" and self.SINCE.get(name, 0) <= version:
                    f.write(f"int {name}(void) {{ return 0; }}\n")
        subprocess.run([cc, "-shared", "-fPIC", "-o", so, src], check=True)
        return so

    def test_any_older_library_when_asked_for_less(self):
        # load(want=N) takes a library of API N for every N, not only 7: the
        # functions added after N are left out, and calling one says which API
        # it needs (nereus.h's history: API 2 the control channel, 3
        # checkpoints and joins, 4 the per-step collectives, 5 buffer_layer)
        with tempfile.TemporaryDirectory() as d:
            for version in range(1, nw.API_VERSION):
                with self.subTest(version=version):
                    lib = nw.load(self.stub_library(d, version), want=version)
                    self.assertEqual(lib._nrs_api, version)
                    w = nw.Worker(lib=lib)  # the stub's init: 0, a NULL handle
                    self.assertEqual(w.epoch, 0)
                    for fn, api in [(lambda: w.control_poll(0), 2), (lambda: w.gpu, 2),
                                    (lambda: w.checkpoint(1), 3), (lambda: w.joined_at, 3),
                                    (w.control_step, 4), (w.weight_sync, 4),
                                    (lambda: w.sync_stat(0), 4), (w.verify_generation, 4),
                                    (lambda: w.buffer_layer(0, 0), 5), (lambda: w.job_step, 8)]:
                        if api <= version:
                            fn()  # the stub's 0
                            continue
                        with self.assertRaisesRegex(nw.NereusLibraryError,
                                                    rf"needs worker API {api}; the library "
                                                    rf"has {version}$"):
                            fn()
                    w.finalize()
                    if version < 4:
                        with self.assertRaisesRegex(nw.NereusLibraryError,
                                                    "nrs_worker_init_emulated needs worker API 4"):
                            nw.Worker(lib=lib, emulated=True)
        self.assertEqual(nw._SINCE, self.SINCE)  # the binding's own table, the same

    def test_loaded_library_checked_against_want(self):
        # load() returns the library it loaded first, but never one older than
        # asked for
        lib = nw.load()
        self.assertIs(nw.load(want=nw.API_VERSION), lib)
        with self.assertRaisesRegex(nw.NereusLibraryError,
                                    rf"version {lib._nrs_api}, asked for {lib._nrs_api + 1}"):
            nw.load(want=lib._nrs_api + 1)
        self.assertIs(nw.load(), lib)

    def test_every_function_has_types(self):
        for name, (restype, argtypes) in nw._PUBLIC.items():
            fn = getattr(self.lib, name)
            self.assertIs(fn.restype, restype, name)
            self.assertEqual(fn.argtypes, argtypes, name)

    def test_every_stable_function_is_bound(self):
        # API 4: the per-step collectives are in nereus.h, and bound as stable;
        # API 5: buffer_layer
        with open(os.path.join(INCLUDE, "nereus.h")) as f:
            declared = set(c_prototypes(f.read()))
        for name in ("nrs_worker_init_emulated", "nrs_worker_control_step",
                     "nrs_worker_weight_sync", "nrs_worker_sync_stat",
                     "nrs_worker_verify_generation", "nrs_worker_buffer_layer"):
            self.assertIn(name, declared)
            self.assertIn(name, nw._PUBLIC)
        # what is not bound takes Nereus structs (module doc) or is bound otherwise
        unbound = declared - set(nw._PUBLIC)
        self.assertEqual(unbound, {"nrs_worker_init_spec", "nrs_worker_set_plan",
                                   "nrs_worker_transition", "nrs_worker_plan"})

    def test_bound_types_match_header(self):
        # the binding's restype and argtypes of every function, from its nereus.h
        # prototype: a parameter added, dropped or retyped in the header fails here
        with open(os.path.join(INCLUDE, "nereus.h")) as f:
            protos = c_prototypes(f.read())
        self.assertEqual(c_param_type("const nrs_worker_t *w"), "nrs_worker_t *")
        self.assertEqual(c_param_type("long long *pitch"), "long long *")
        self.assertEqual(c_param_type("void **ptr"), "void * *")
        self.assertEqual(c_param_type("long step"), "long")
        wrong = []
        for name, (restype, argtypes) in sorted(nw._PUBLIC.items()):
            ret, params = protos[name]
            want_ret = C_TO_CTYPES[c_param_type(ret)]
            want_args = [C_TO_CTYPES[c_param_type(p)] for p in params]
            if (restype, argtypes) != (want_ret, want_args):
                wrong.append(f"{name}: binding {restype}, {argtypes}; nereus.h {ret} ({params})")
        self.assertEqual(wrong, [])
        # buffer_layer (API 5): i, layer, then ptr, rows, cols, pitch, r0, c0
        self.assertEqual([c_param_type(p) for p in protos["nrs_worker_buffer_layer"][1]],
                         ["nrs_worker_t *", "int", "int", "void * *", "int *", "int *",
                          "long long *", "int *", "int *"])

    def test_strerror_names_every_code(self):
        codes = {k: v for k, v in vars(nw).items() if k.startswith(("NRS_ERR_", "NRS_OK"))}
        for name, code in codes.items():
            self.assertNotEqual(nw.strerror(code), "unknown error", name)
        self.assertEqual(nw.strerror(-999), "unknown error")
        self.assertEqual(str(nw.NereusError(nw.NRS_ERR_VERIFY, "x")), "checksum mismatch: x")

    def test_ms_names(self):
        self.assertEqual(nw.ms_name(nw.NRS_MS_ACTOR_GENERATE), "actor.generate")
        self.assertEqual(nw.ms_name(nw.NRS_MS_CRITIC_TRAIN), "critic.train")
        self.assertEqual(nw.ms_name(nw.NRS_MS_COUNT), "?")

    def test_bad_spec_path(self):
        with self.assertRaises(nw.NereusError) as cm:
            nw.Worker("/nonexistent/job.yaml")
        e = cm.exception
        self.assertEqual(e.code, nw.NRS_ERR_SPEC)
        self.assertRegex(e.message, r"^/nonexistent/job.yaml:1:1: .*No such file")
        self.assertTrue(str(e).startswith("job spec could not be loaded: "))

    def test_malformed_spec(self):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write("cluster:\n  gpus_per_node: [1, 2\n")
        try:
            with self.assertRaises(nw.NereusError) as cm:
                nw.Worker(f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(cm.exception.code, nw.NRS_ERR_SPEC)
        self.assertRegex(cm.exception.message, rf"^{re.escape(f.name)}:\d+:\d+: ")

    def test_no_spec(self):
        saved = os.environ.pop("NEREUS_SPEC", None)
        try:
            with self.assertRaisesRegex(nw.NereusError, "no job spec"):
                nw.Worker(None)
            with self.assertRaisesRegex(nw.NereusError, "no job spec"):
                nw.Worker(None, emulated=True)
        finally:
            if saved is not None:
                os.environ["NEREUS_SPEC"] = saved

    def test_failed_init_message_outlives_the_handle(self):
        # the binding finalizes the handle of a failed init, then reads why
        # from nrs_worker_last_error(NULL)
        for emulated in (False, True):
            with self.assertRaises(nw.NereusError) as cm:
                nw.Worker("/nonexistent/job.yaml", emulated=emulated)
            self.assertRegex(cm.exception.message, r"^/nonexistent/job.yaml:1:1: .*No such file")
            self.assertEqual(nw.last_error(), cm.exception.message)
        # a call given a NULL handle says which call, there too
        self.assertEqual(self.lib.nrs_worker_epoch(None), -1)
        self.assertEqual(nw.last_error(), "nrs_worker_epoch: no handle (NULL)")


# (restype, value) of each parameter declaration of nereus.h, for NULL calls
def _null_arg(decl):
    if "*" in decl or decl.startswith("nrs_report_fn"):
        return ctypes.c_void_p, None
    if decl.startswith("double"):
        return ctypes.c_double, 0.0
    if decl.startswith("long long"):
        return ctypes.c_longlong, 0
    if decl.startswith("long"):
        return ctypes.c_long, 0
    if decl.startswith("int"):
        return ctypes.c_int, 0
    raise AssertionError(f"parameter {decl!r}: no ctypes type for it")


_RESTYPES = {"int": ctypes.c_int, "const char *": ctypes.c_char_p, "double": ctypes.c_double,
             "void": None}


class NullHandle(unittest.TestCase):
    """Every function of nereus.h called with a NULL handle and NULL for every
    pointer, straight through ctypes (not the binding, which refuses first)."""

    def setUp(self):
        lib_or_skip(self)
        path = os.environ.get("NEREUS_LIB") or nw._find_library()
        self.raw = ctypes.CDLL(path)  # its own function objects: the binding's keep their types
        with open(os.path.join(INCLUDE, "nereus.h")) as f:
            self.protos = c_prototypes(f.read())

    def call(self, name):
        ret, params = self.protos[name]
        fn = self.raw[name]
        fn.restype = _RESTYPES[ret]
        types, args = zip(*[_null_arg(p) for p in params]) if params else ((), ())
        fn.argtypes = list(types)
        return fn(*args)

    def test_parser_sees_every_function(self):
        # every line of nereus.h that starts a declaration of an nrs_worker_ call
        with open(os.path.join(INCLUDE, "nereus.h")) as f:
            starts = set(re.findall(r"^[a-z][^;(]*?\b(nrs_worker_\w+)\(", strip_comments(f.read()),
                                    flags=re.M))
        self.assertEqual(set(self.protos), starts)
        self.assertGreaterEqual(len(self.protos), 42)
        self.assertEqual(self.protos["nrs_worker_role"][0], "int")
        self.assertEqual(len(self.protos["nrs_worker_buffer_desc"][1]), 10)
        self.assertEqual(len(self.protos["nrs_worker_buffer_layer"][1]), 9)
        self.assertEqual(self.protos["nrs_worker_transport"][0], "const char *")
        self.assertTrue(set(nw._PUBLIC) <= set(self.protos), set(nw._PUBLIC) - set(self.protos))

    def test_every_function_refuses_null(self):
        zero = {"nrs_worker_is_singleton", "nrs_worker_transition_stat", "nrs_worker_sync_stat"}
        strings = {"nrs_worker_transport": "none", "nrs_worker_control": "no handle"}
        called = 0
        for name, (ret, params) in sorted(self.protos.items()):
            if not params or "nrs_worker_t" not in params[0]:
                continue  # api_version, strerror, ms_name: no handle
            with self.subTest(name):
                got = self.call(name)
                called += 1
                if name == "nrs_worker_finalize":
                    self.assertEqual(got, nw.NRS_OK)  # documented: NULL is fine
                    continue
                if name == "nrs_worker_last_error":
                    self.assertIsInstance(got, bytes)  # the thread's message
                    continue
                if "**" in params[0]:  # init*: nowhere to put the handle
                    self.assertEqual(got, nw.NRS_ERR_INVAL)
                    self.assertEqual(nw.last_error(), f"{name}: out is NULL")
                    continue
                if ret == "const char *":
                    self.assertEqual(got, strings[name].encode())
                else:
                    self.assertEqual(got, 0 if name in zero else -1)
                self.assertEqual(nw.last_error(), f"{name}: no handle (NULL)")
        self.assertGreaterEqual(called, 39)


class Singleton(unittest.TestCase):
    """One handle of a job of one rank: no PMIx server, no controller."""

    @classmethod
    def setUpClass(cls):
        cls.w = None
        lib_or_skip(unittest.TestCase())
        for v in ("NEREUS_SOCKET_DIR", "NEREUS_JOB_DIR", "NEREUS_JOIN", "NEREUS_CHECKPOINT_DIR"):
            os.environ.pop(v, None)
        cls.w = nw.Worker(SPEC)

    @classmethod
    def tearDownClass(cls):
        if cls.w:
            cls.w.finalize()

    def setUp(self):
        if self.w is None:
            self.skipTest(f"no library: {_lib_error}")

    def test_accessors(self):
        w = self.w
        self.assertEqual((w.rank, w.size, w.is_singleton), (0, 1, True))
        self.assertEqual((w.transport, w.control), ("local", "none"))
        self.assertEqual((w.epoch, w.gpu, w.nroles, w.nbuffers, w.joined_at, w.job_step),
                         (-1, -1, 0, 0, -1, -1))
        self.assertEqual(w.roles(), [])
        self.assertEqual(w.sync_stat(nw.NRS_SS_STEPS), 0)

    def test_no_transition_yet(self):
        # -1 = none: before any transition no rank failed and nothing was restored
        st = self.w.transition_stats()
        self.assertEqual((st["seconds"], st["bytes_sent"], st["lost"]), (0, 0, 0))
        self.assertEqual(st["failed_rank"], -1)
        self.assertEqual(st["restored_step"], -1)
        self.assertEqual(self.w.transition_stat(nw.NRS_TS_FAILED_RANK), -1)

    def test_null_outputs(self):
        # output pointers may be NULL: the calls still check and say why
        lib, h = self.w._lib, self.w._handle()
        cases = [("buffer", (0, None, None), "nrs_worker_buffer: buffer 0: no state allocated"),
                 ("buffer_desc", (0,) + (None,) * 8,
                  "nrs_worker_buffer_desc: buffer 0: no state allocated"),
                 ("buffer_layer", (0, 0) + (None,) * 7,
                  "nrs_worker_buffer_layer: buffer 0: no state allocated"),
                 ("verify_state", (None, None), "nrs_worker_verify_state: no state allocated"),
                 ("verify_generation", (None, None),
                  "nrs_worker_verify_generation: no weight sync since epoch -1"),
                 ("role", (0,) + (None,) * 7, "nrs_worker_role: role 0: this rank runs 0"),
                 ("group", (nw.NRS_MS_ACTOR_TRAIN, nw.NRS_GROUP_DP, None, 8),
                  r"nrs_worker_group: model-stage 5 \(actor.train\) is not run by this rank")]
        for name, args, pattern in cases:
            with self.subTest(name):
                self.assertEqual(getattr(lib, "nrs_worker_" + name)(h, *args), nw.NRS_ERR_INVAL)
                self.assertRegex(self.w.last_error, "^" + pattern)

    def assertCode(self, code, pattern, fn, *args):
        with self.assertRaises(nw.NereusError) as cm:
            fn(*args)
        self.assertEqual(cm.exception.code, code, str(cm.exception))
        self.assertRegex(cm.exception.message, pattern)

    def test_out_of_order(self):
        w = self.w
        self.assertCode(nw.NRS_ERR_INVAL, "^nrs_worker_control_plan: no control channel: none",
                        w.control_plan, 0.1)
        self.assertCode(nw.NRS_ERR_INVAL, "^nrs_worker_alloc_state: no usable plan",
                        w.alloc_state, nw.NRS_MEM_HOST, True)
        self.assertCode(nw.NRS_ERR_INVAL, "^nrs_worker_checkpoint: no checkpoint directory",
                        w.checkpoint, 1)
        self.assertCode(nw.NRS_ERR_INVAL, "^nrs_worker_weight_sync: no plan or no state",
                        w.weight_sync)
        self.assertFalse(w.control_poll(0))  # no channel: nothing to do
        self.assertFalse(w.control_step())  # alone: nothing to agree on

    def test_messages_name_the_call(self):
        # every failure sets the message, naming the call and the reason: each
        # of these follows another failure, whose message it must not show
        w = self.w
        cases = [
            (w.role, (0,), r"^nrs_worker_role: role 0: this rank runs 0 model-stage\(s\) "
                           r"\(no plan yet\)$"),
            (w.buffer, (3,), r"^nrs_worker_buffer: buffer 3: no state allocated$"),
            (w.group, (nw.NRS_MS_ACTOR_TRAIN, nw.NRS_GROUP_TP),
             r"^nrs_worker_group: model-stage 5 \(actor.train\) is not run by this rank"),
            (w.buffer_desc, (0,), r"^nrs_worker_buffer_desc: buffer 0: no state allocated$"),
            (w.buffer_layer, (2, 5), r"^nrs_worker_buffer_layer: buffer 2: no state allocated$"),
            (w.buffer_desc, (-1,), r"^nrs_worker_buffer_desc: buffer -1: no state allocated$"),
            (w.buffer_layer, (-1, 0),
             r"^nrs_worker_buffer_layer: buffer -1: no state allocated$"),
            (w.buffer_layer_view, (1, 0),
             r"^nrs_worker_buffer_layer: buffer 1: no state allocated$"),
            (w.group, (nw.NRS_MS_ACTOR_TRAIN, 7), r"^nrs_worker_group: group 7: not NRS_GROUP_"),
            (w.verify_state, (), r"^nrs_worker_verify_state: no state allocated$"),
            (w.alloc_state, (7, True), r"^nrs_worker_alloc_state: mem 7: not NRS_MEM_AUTO, _HOST "
                                       r"or _CUDA$"),
            (w.report_stage, (99, 1.0), r"^nrs_worker_report_stage: model-stage 99: not an "
                                        r"nrs_ms_t \(0\.\.6\)$"),
            (w.report_stage, (nw.NRS_MS_ACTOR_TRAIN, -1.0),
             r"^nrs_worker_report_stage: actor.train: -1 seconds$"),
            (w.report_memory, (-1, 10), r"^nrs_worker_report_memory: -1 bytes used of 10"),
            (w.report_step, (-1, 0.0), r"^nrs_worker_report_step: step -1, response length 0"),
            (w.verify_generation, (), r"^nrs_worker_verify_generation: no weight sync since "
                                      r"epoch -1 began"),
        ]
        for fn, args, pattern in cases:
            with self.subTest(fn.__name__):
                self.assertCode(nw.NRS_ERR_INVAL, pattern, fn, *args)
                self.assertRegex(w.last_error, pattern)  # the handle says the same

    def test_reports_reach_a_python_sink(self):
        w, got = self.w, []
        w.set_report_sink(got.append)
        try:
            w.report_stage(nw.NRS_MS_ACTOR_TRAIN, 0.25)
            w.report_stage(nw.NRS_MS_ACTOR_TRAIN, 0.25)  # the same stage again adds up
            w.report_memory(1 << 20, 2 << 20)
            w.report_step(7, 128)
        finally:
            w.set_report_sink(None)
        self.assertEqual(len(got), 1)
        r = json.loads(got[0])
        self.assertEqual((r["type"], r["rank"], r["step"]), ("report", 0, 7))
        self.assertEqual(r["response_len"], 128)
        self.assertEqual(r["stages"], {"actor.train": 0.5})
        self.assertEqual((r["mem_used"], r["mem_cap"]), (1 << 20, 2 << 20))

    def test_buffer_layer_arguments(self):
        # ints only, as every call; the C library is not reached
        w = self.w
        for args in (("0", 0), (0, 1.5), (0,), (0, 0, 0)):
            with self.subTest(args=args):
                with self.assertRaises((ctypes.ArgumentError, TypeError)):
                    w.buffer_layer(*args)
        # a failed call says so, and the next failure says its own
        self.assertCode(nw.NRS_ERR_INVAL, r"^nrs_worker_buffer_layer: buffer 0: no state",
                        w.buffer_layer, 0, -1)
        self.assertCode(nw.NRS_ERR_INVAL, r"^nrs_worker_buffer: buffer 0: no state",
                        w.buffer, 0)
        self.assertEqual(nw.LayerPart._fields, ("ptr", "rows", "cols", "pitch", "r0", "c0"))

    def test_arguments_that_do_not_fit_c(self):
        # ctypes wraps an int that does not fit the C type (2**32 as 0) and C
        # reads a path up to its first NUL: the binding refuses both, naming
        # the call, before the C library sees them
        w = self.w
        for fn, args, pattern in [
                (w.buffer, (2 ** 32,), r"^nrs_worker_buffer: argument 1 = 4294967296: does not "
                                       r"fit its C type \(32-bit\)$"),
                (w.buffer_layer, (0, -2 ** 31 - 1), r"^nrs_worker_buffer_layer: argument 2 = "),
                (w.report_step, (2 ** 32 + 3, 1.0), r"^nrs_worker_report_step: argument 1 = "),
                (w.report_memory, (2 ** 64 + 5, 2 ** 64 + 10),
                 r"^nrs_worker_report_memory: argument 1 = 18446744073709551621: does not fit "
                 r"its C type \(64-bit\)$"),
                (w.checkpoint, (2 ** 64 + 1,), r"^nrs_worker_checkpoint: argument 1 = "),
                (w.transition_stat, (2 ** 32 + nw.NRS_TS_FAILED_RANK,),
                 r"^nrs_worker_transition_stat: argument 1 = "),
                (w.sync_stat, (2 ** 32,), r"^nrs_worker_sync_stat: argument 1 = "),
                (w.set_checkpoint_dir, ("/tmp/a\0b",),
                 r"^nrs_worker_set_checkpoint_dir: path '/tmp/a\\x00b': embedded NUL byte$"),
                (nw.Worker, (SPEC + "\0junk",), r"^nrs_worker_init: path .*: embedded NUL byte$")]:
            with self.subTest(fn.__name__):
                self.assertCode(nw.NRS_ERR_INVAL, pattern, fn, *args)
        # the limits themselves still go through (to the C call's own checks)
        self.assertCode(nw.NRS_ERR_INVAL, r"^nrs_worker_buffer: buffer 2147483647: no state",
                        w.buffer, 2 ** 31 - 1)
        self.assertCode(nw.NRS_ERR_INVAL, r"^nrs_worker_buffer: buffer -2147483648: no state",
                        w.buffer, -2 ** 31)

    def test_integers_that_are_not_int_do_not_fit_c(self):
        # numpy's integers are not int but have __index__, which ctypes takes
        # and wraps as it wraps an int (numpy.int64(2**32 + 3) as buffer 3,
        # as step 3): the binding refuses them as it refuses the int
        class Index:  # numpy.int64 as ctypes sees it (numpy need not be installed)
            def __init__(self, v):
                self.v = v

            def __index__(self):
                return self.v

        kinds = [Index]
        try:
            import numpy
            kinds.append(numpy.int64)
        except ImportError:
            pass
        w = self.w
        for kind in kinds:
            for fn, args, pattern in [
                    (w.buffer, (kind(2 ** 32 + 3),),
                     r"^nrs_worker_buffer: argument 1 = 4294967299: does not fit its C type "
                     r"\(32-bit\)$"),
                    (w.report_step, (kind(2 ** 32 + 3), 1.0),
                     r"^nrs_worker_report_step: argument 1 = 4294967299: "),
                    (w.buffer_layer, (0, kind(-2 ** 31 - 1)),
                     r"^nrs_worker_buffer_layer: argument 2 = "),
                    (w.transition_stat, (kind(2 ** 32 + nw.NRS_TS_FAILED_RANK),),
                     r"^nrs_worker_transition_stat: argument 1 = "),
                    (w.sync_stat, (kind(2 ** 32),), r"^nrs_worker_sync_stat: argument 1 = ")]:
                with self.subTest(kind=kind.__name__, fn=fn.__name__):
                    self.assertCode(nw.NRS_ERR_INVAL, pattern, fn, *args)
            # one that fits goes through, as its int
            with self.subTest(kind=kind.__name__, fn="fits"):
                self.assertCode(nw.NRS_ERR_INVAL, r"^nrs_worker_buffer: buffer 3: no state",
                                w.buffer, kind(3))
        self.assertCode(nw.NRS_ERR_INVAL, r"^nrs_worker_checkpoint: argument 1 = ",
                        w.checkpoint, Index(2 ** 64 + 1))

    def test_checkpoint_dir(self):
        self.w.set_checkpoint_dir(tempfile.gettempdir())
        self.w.set_checkpoint_dir(None)
        self.assertCode(nw.NRS_ERR_INVAL, "no checkpoint directory", self.w.checkpoint, 1)


class Finalized(unittest.TestCase):
    def test_finalized_handle_raises(self):
        lib_or_skip(self)
        w = nw.Worker(SPEC)
        w.finalize()
        w.finalize()  # idempotent
        self.assertTrue(w.finalized)
        # the C accessors would dereference NULL: the binding refuses first
        for fn in (lambda: w.rank, lambda: w.epoch, lambda: w.buffer(0), w.verify_state,
                   lambda: w.control_poll(0), lambda: w.buffer_layer(0, 0)):
            with self.assertRaisesRegex(nw.NereusError, "finalized"):
                fn()


if __name__ == "__main__":
    unittest.main()
