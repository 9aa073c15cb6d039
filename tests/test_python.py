#!/usr/bin/python3
"""test_python.py - the Python binding (python/ckpt) against libckpt.

Run by meson (test 'python', suite 'python') under /usr/bin/python3 with
CKPT_LIB (the built libckpt.so), PYTHONPATH (the source tree's python/),
CKPT_PY_LAYOUT (tests/py_layout, the C structs' layout) and
CKPT_TEST_SRCDIR (tests/, for the fake metadata server). Exits 77 (meson:
SKIP) when python3 lacks numpy or torch.

What it checks: the ctypes structs match the header byte for byte; every
dtype numpy and torch have round-trips exactly (values, dtype, shape,
type), as do nested states of every plain type, non-contiguous inputs
and a state larger than the staging pool; unsupported values fail with
the path named; a failed background save raises from the next call; a
training run stopped, restored in a new process and continued is
bit-identical to one that never stopped (and is not without the RNG
states); the watcher's notice turns into a "maintenance" save, a durable
step and should_exit(); borrow mode restores exactly, returns while the
engine still reads the arrays (a bucket whose server is stopped) and
holds them until the release, and fails cleanly; save() runs no
cyclic-GC collection while it stalls the caller; the README's Python
example runs.

Also a worker: test_python.py --train MODE DIR N K (see train_worker).
"""

import collections
import ctypes
import gc
import hashlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
import weakref

try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: %s lacks numpy or torch (%s); install python3-numpy and "
          "python3-torch" % (sys.executable, e))
    sys.exit(77)

import ckpt
from ckpt import _lib
from ckpt.pytorch import load_training_state, training_state

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("CKPT_TEST_SRCDIR", HERE)
sys.path.insert(0, HERE)
import testutil  # noqa: E402
MULT = float(os.environ.get("CKPT_TEST_TIMEOUT_MULT", "1") or 1)
PATIENCE = 120 * MULT  # seconds before a wait is a failure (never a measure)


def tmpdir(test):
    d = tempfile.mkdtemp(prefix="ckpt-py-")
    if not os.environ.get("CKPT_TEST_KEEP"):
        test.addCleanup(shutil.rmtree, d, True)
    return d


def same(test, a, b, path="/"):
    """a and b equal with the same types all the way down (bitwise for
    arrays and tensors: NaNs equal, -0.0 != 0.0)."""
    test.assertIs(type(a), type(b), path)
    if isinstance(a, np.ndarray):
        test.assertEqual(a.dtype, b.dtype, path)
        test.assertEqual(a.dtype.str, b.dtype.str, path)
        test.assertEqual(a.shape, b.shape, path)
        test.assertEqual(np.ascontiguousarray(a).tobytes(),
                         np.ascontiguousarray(b).tobytes(), path)
    elif isinstance(a, np.generic):
        test.assertEqual(a.dtype, b.dtype, path)
        test.assertEqual(np.asarray(a).tobytes(), np.asarray(b).tobytes(),
                         path)
    elif isinstance(a, torch.Tensor):
        test.assertEqual(a.dtype, b.dtype, path)
        test.assertEqual(a.shape, b.shape, path)
        test.assertEqual(a.requires_grad, b.requires_grad, path)
        test.assertEqual(tensor_bytes(a), tensor_bytes(b), path)
    elif isinstance(a, dict):
        test.assertEqual(list(a.keys()), list(b.keys()), path)
        for k in a:
            same(test, a[k], b[k], "%s%r/" % (path, k))
        test.assertEqual(getattr(a, "_metadata", None),
                         getattr(b, "_metadata", None), path)
    elif isinstance(a, (list, tuple)):
        test.assertEqual(len(a), len(b), path)
        for i, (x, y) in enumerate(zip(a, b)):
            same(test, x, y, "%s%d/" % (path, i))
    elif isinstance(a, float):
        test.assertEqual(struct_bits(a), struct_bits(b), path)
    else:
        test.assertEqual(a, b, path)


def struct_bits(f):
    return ctypes.c_uint64.from_buffer_copy(ctypes.c_double(f)).value


def tensor_bytes(t):
    """The raw bytes of a tensor of any dtype (quantized: its integers
    and scale/zero point)."""
    t = t.detach()
    if t.is_quantized:
        return (tensor_bytes(t.int_repr()), t.q_scale(), t.q_zero_point())
    t = t.resolve_conj().resolve_neg().contiguous()
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


class Base(unittest.TestCase):
    def open(self, d=None, **kw):
        kw.setdefault("watch", False)
        kw.setdefault("staging_bytes", 16 << 20)
        c = ckpt.Checkpointer(d or tmpdir(self), **kw)
        self.addCleanup(c.close)
        return c

    def roundtrip(self, state, **kw):
        c = self.open(**kw)
        c.save(1, state, wait=True)
        got = c.restore()
        same(self, state, got)
        return c, got


class Layout(unittest.TestCase):
    def test_structs_match_header(self):
        """Every ctypes struct has the C struct's size, alignment and
        fields (name, offset, size) as tests/py_layout prints them."""
        prog = os.environ.get("CKPT_PY_LAYOUT")
        if not prog:
            self.skipTest("CKPT_PY_LAYOUT not set (run through meson)")
        out = subprocess.run([prog], check=True, capture_output=True,
                             text=True).stdout
        c_structs = {}
        for line in out.splitlines():
            f = line.split()
            if not line.startswith(" "):
                cur = c_structs[f[0]] = {"size": int(f[1]),
                                         "align": int(f[2]), "fields": []}
            else:
                cur["fields"].append((f[0], int(f[1]), int(f[2])))
        self.assertEqual(set(c_structs), set(_lib.STRUCTS))
        for name, cls in _lib.STRUCTS.items():
            c = c_structs[name]
            self.assertEqual(ctypes.sizeof(cls), c["size"], name)
            self.assertEqual(ctypes.alignment(cls), c["align"], name)
            py = [(f, getattr(cls, f).offset, getattr(cls, f).size)
                  for f, _ in cls._fields_]
            self.assertEqual(py, c["fields"], name)


def numpy_samples():
    """One array of every numpy scalar type (flexible ones sized), plus
    byte orders, units and structured dtypes."""
    rng = np.random.default_rng(1)
    out = {}
    types = sorted({t for t in np.sctypeDict.values()}, key=str)
    for t in types:
        dt = np.dtype(t)
        if dt.kind == "O":
            continue
        if dt.itemsize == 0 or dt.kind in "Mm":
            dt = np.dtype({"S": "S7", "U": "U5", "V": "V3", "M": "M8[ns]",
                           "m": "m8[s]"}[dt.kind])
        raw = rng.integers(0, 256, size=(3, 4) + (dt.itemsize,),
                           dtype=np.uint8)
        a = raw.view(dt).reshape(3, 4)
        if dt.kind in "fc":  # real values (raw bytes also include NaNs)
            a = rng.standard_normal((3, 4)).astype(dt)
            a[0, 0] = np.nan
            a[0, 1] = -0.0
        out[dt.str] = a
    for s in (">i4", ">f8", ">c16", ">u2", "M8[D]", "m8[us]", "M8", ">U3",
              "S1"):
        out["x" + s] = (np.arange(6) * 7 + 1).astype(s)
    rec = np.dtype([("a", "<i4"), ("b", ">f8", (2,)), ("c", "S3"),
                    ("d", [("x", "u1"), ("y", "<f2")])])
    out["record"] = np.zeros(4, rec)
    out["record"]["a"] = [1, 2, 3, 4]
    out["record"]["b"][:, 1] = 2.5
    out["record"]["c"] = b"abc"
    out["record"]["d"]["y"] = 0.5
    out["aligned"] = np.zeros(2, np.dtype([("a", "u1"), ("b", "<f8")],
                                          align=True))
    out["zero_d"] = np.array(3.25, dtype=np.float32)
    out["empty"] = np.zeros((0, 5), dtype=np.int16)
    out["empty3"] = np.zeros((2, 0, 3), dtype=np.complex64)
    out["bools"] = rng.integers(0, 2, 17).astype(bool)
    return out


def torch_samples():
    """A tensor of every dtype torch has (quantized ones through
    quantize_per_tensor), plus 0-d, empty and a Parameter."""
    g = torch.Generator().manual_seed(2)
    out = {}
    for dt in sorted({v for v in vars(torch).values()
                      if isinstance(v, torch.dtype)}, key=str):
        name = str(dt)
        if dt.is_floating_point or dt.is_complex:
            f = torch.randn(3, 5, generator=g, dtype=torch.float64)
            if dt.is_complex:
                f = torch.complex(f, -f * 2)
            t = f.to(dt)
        elif dt == torch.bool:
            t = torch.randint(0, 2, (3, 5), generator=g).bool()
        elif str(dt).startswith("torch.q"):
            t = torch.quantize_per_tensor(torch.rand(3, 5, generator=g),
                                          0.05, 3, dt)
        else:
            info = torch.iinfo(dt)
            t = torch.randint(max(info.min, -2**62), min(info.max, 2**62),
                              (3, 5), generator=g, dtype=dt)
        out[name] = t
    out["bf16_0d"] = torch.tensor(1.5, dtype=torch.bfloat16)
    out["empty"] = torch.zeros(0, 4, dtype=torch.bfloat16)
    out["param"] = torch.nn.Parameter(torch.randn(2, 2, generator=g))
    out["grad"] = torch.randn(3, generator=g).requires_grad_()
    return out


class Dtypes(Base):
    def test_every_numpy_dtype(self):
        state = numpy_samples()
        self.assertGreater(len(state), 25)
        self.roundtrip(state)

    def test_numpy_scalars(self):
        self.roundtrip({"f32": np.float32(1.25), "i8": np.int8(-3),
                        "u64": np.uint64(2**64 - 1), "b": np.bool_(True),
                        "c": np.complex128(1 - 2j), "dt":
                        np.datetime64("2026-12-03T11:00", "m"),
                        "s": np.str_("héllo"), "by": np.bytes_(b"x\0y"),
                        "ld": np.longdouble(1) / 3})

    def test_every_torch_dtype(self):
        state = torch_samples()
        for want in (torch.bfloat16, torch.complex32, torch.quint4x2,
                     torch.float16, torch.bool, torch.uint8):
            self.assertIn(str(want), state)
        self.roundtrip(state)

    def test_stored_dtypes_and_names(self):
        """bf16 is stored as bf16 (not f32), complex as float pairs, a
        datetime as i64, and names are the escaped key paths."""
        state = {"w": torch.zeros(4, 4, dtype=torch.bfloat16),
                 "c": np.zeros(3, np.complex64),
                 "t": np.zeros(2, "M8[ns]"),
                 "odd/key%": {0: np.zeros(1), "0": np.ones(1)}}
        c = self.open()
        c.save(1, state, wait=True)
        got = tensors_of(c.location)
        self.assertEqual(got["w"], ("bf16", [4, 4]))
        self.assertEqual(got["c"], ("f32", [3, 2]))
        self.assertEqual(got["t"], ("i64", [2]))
        self.assertEqual(got["odd%2Fkey%25/0"], ("f64", [1]))
        self.assertEqual(got["odd%2Fkey%25/0~1"], ("f64", [1]))
        self.assertIn("__ckpt_tree__", got)
        same(self, state, c.restore())


def tensors_of(location, step=None):
    """name -> (dtype name, shape) of a step, through the C reader."""
    r = ctypes.c_void_p()
    rc = _lib.lib.ckpt_reader_open(ctypes.byref(r), location.encode(),
                                   _lib.LATEST if step is None else step,
                                   None)
    assert rc == 0, rc
    out = {}
    info = _lib.TensorInfo()
    for i in range(_lib.lib.ckpt_reader_tensor_count(r)):
        assert _lib.lib.ckpt_reader_tensor(r, i, ctypes.byref(info)) == 0
        out[info.name.decode()] = (_lib.DTYPE_NAMES[info.dtype],
                                   [info.shape[k] for k in range(info.ndim)])
    _lib.lib.ckpt_reader_close(r)
    return out


class Nested(Base):
    def test_nested_plain_values(self):
        od = collections.OrderedDict([("b", 1), ("a", [2, 3])])
        od._metadata = {"": {"version": 1}}
        state = {
            "ints": [0, -1, 2**70, -(2**63)], "floats": (0.1, -0.0,
                                                         math.inf,
                                                         -math.inf,
                                                         math.nan, 1e308),
            "str": "ünïcode/with%slash", "none": None, "t": True,
            "f": False, 7: "int key", (1, "x"): "tuple key", None: 1,
            2.5: "float key", "od": od, "empty": {}, "el": [], "et": (),
            "deep": [[[{"x": [np.arange(3)]}]]], "bytes": b"\x00\xff",
            "ba": bytearray(b"abc"), "b0": b"", "ba0": bytearray(),
            "size": torch.Size([2, 3]),
            "dtype": torch.bfloat16, "mixed": [torch.ones(2), np.ones(2),
                                               1, "s", None],
            "": {"/": np.zeros(1), "%": np.ones(1)},
            "__ckpt_tree__": np.arange(2),
        }
        self.roundtrip(state)

    def test_buffer_protocol_objects_come_back_as_numpy(self):
        import array
        c = self.open()
        a = array.array("h", [1, -2, 3])
        c.save(1, {"mv": memoryview(b"xyz"), "arr": a}, wait=True)
        got = c.restore()
        same(self, np.frombuffer(b"xyz", np.uint8), got["mv"])
        same(self, np.asarray(a), got["arr"])

    def test_top_level_values(self):
        for state in (np.arange(5), torch.ones(2, dtype=torch.bfloat16),
                      [1, 2], (np.zeros(1),), 5, "s", None):
            self.roundtrip(state)

    def test_non_contiguous(self):
        """Views come back with their values, contiguous (one copy on
        save, documented)."""
        base = np.arange(120, dtype=np.float64).reshape(4, 5, 6)
        tb = torch.arange(120, dtype=torch.float32).reshape(4, 5, 6)
        state = {"np_step": base[:, ::2, 1:5], "np_T": base.T,
                 "np_F": np.asfortranarray(base), "np_neg": base[::-1],
                 "t_step": tb[:, ::2], "t_T": tb.transpose(0, 2),
                 "t_expand": torch.ones(3, 1).expand(3, 4),
                 "t_bf16": tb.bfloat16()[1:, :, ::3],
                 "t_conj": torch.randn(3, dtype=torch.complex64).conj(),
                 "t_offset": tb.view(-1)[7:19]}
        c = self.open()
        c.save(1, state, wait=True)
        got = c.restore()
        for k, v in state.items():
            if isinstance(v, np.ndarray):
                self.assertTrue(got[k].flags.c_contiguous)
                np.testing.assert_array_equal(got[k], v)
                self.assertEqual(got[k].dtype, v.dtype)
            else:
                self.assertTrue(got[k].is_contiguous())
                self.assertEqual(got[k].dtype, v.dtype)
                self.assertTrue(torch.equal(got[k], v.resolve_conj()), k)

    def test_unsupported_values_name_the_path(self):
        c = self.open()
        Point = collections.namedtuple("Point", "x y")
        cases = [({"a": [1, {"objs": np.array([1, "x"], dtype=object)}]},
                  "/a/1/objs"),
                 ({"m": {"k": object()}}, "/m/k"),
                 ({"p": Point(1, 2)}, "/p"),
                 ({"d": collections.defaultdict(int)}, "/d"),
                 ({"rec": np.zeros(2, [("o", object)])}, "/rec"),
                 ({"sp": torch.eye(2).to_sparse()}, "/sp")]
        loop = {"x": [1]}
        loop["x"].append(loop)
        cases.append((loop, "/x/1"))
        for state, path in cases:
            with self.assertRaises(TypeError) as cm:
                c.save(1, state)
            self.assertIn(path, str(cm.exception))
        self.assertIsNone(c.latest_step())

    def test_larger_than_staging_pool(self):
        """About 40 MB through a 1 MiB pool with 64 KiB chunks."""
        g = torch.Generator().manual_seed(3)
        state = {"big": torch.randn(4 << 20, generator=g).bfloat16(),
                 "many": [np.random.default_rng(i).standard_normal(50_000)
                          for i in range(60)],
                 "f32": torch.randn(2 << 20, generator=g)}
        c, _ = self.roundtrip(state, staging_bytes=1 << 20,
                              chunk_bytes=64 << 10, codec="zstd")
        self.assertGreater(c.steps()[-1]["raw_bytes"], 38 << 20)


class Errors(Base):
    def test_failed_background_save_raises(self):
        """A save whose files cannot be written (a directory where a
        shard file must go, which stops root too) raises from the next
        wait(), save() or close(), with the engine's message naming the
        file; the Checkpointer then saves again."""
        state = {"a": np.ones(1000)}
        for nxt in ("wait", "save", "close"):
            d = tmpdir(self)
            c = ckpt.Checkpointer(d, watch=False, staging_bytes=8 << 20)
            blocker = os.path.join(d, "step-%020d" % 5, "h00000-f000.shard")
            os.makedirs(blocker)
            raised_by = None
            try:
                c.save(5, state)
                if nxt == "wait":
                    c.wait()
                elif nxt == "save":
                    c.save(6, state)
                else:
                    c.close()
            except ckpt.CkptError as e:
                raised_by = e
            self.assertIsNotNone(raised_by, nxt)
            self.assertIsInstance(raised_by, ckpt.CkptOSError)
            self.assertIsInstance(raised_by, OSError)
            self.assertIn("h00000-f000.shard", str(raised_by))
            self.assertIn("h00000-f000.shard", raised_by.message)
            self.assertLess(raised_by.code, 0)
            if nxt == "close":
                continue
            self.assertIsNone(c.latest_step())
            os.rmdir(blocker)
            c.save(7, state, wait=True)  # the failure was given: goes on
            self.assertEqual(c.latest_step(), 7)
            c.close()

    def test_failed_save_fails_wait_only_once(self):
        """A failure raised by save() itself is not raised again."""
        d = tmpdir(self)
        c = self.open(d)
        open(os.path.join(d, "step-%020d" % 3), "w").close()
        with self.assertRaises(ckpt.CkptError) as cm:
            c.save(3, {"a": np.ones(4)})
            c.wait()
        self.assertIn("step-00000000000000000003", str(cm.exception))
        c.wait()  # given once: not again
        c.save(4, {"a": np.ones(4)})
        c.wait()
        self.assertEqual(c.latest_step(), 4)
        c.close()

    def test_error_classes(self):
        c = self.open()
        with self.assertRaises(ckpt.NotFoundError):
            c.restore()
        c.save(2, {"x": np.ones(3)}, wait=True)
        with self.assertRaises(ckpt.NotFoundError) as cm:
            c.restore(3)
        self.assertEqual(cm.exception.code, _lib.E_NOTFOUND)
        with self.assertRaises(ckpt.ExistsError):
            c.save(2, {"x": np.ones(3)}, wait=True)
        with self.assertRaises(ValueError):
            c.save(5, {}, reason="sometimes")
        with self.assertRaises(TypeError):
            ckpt.Checkpointer(tmpdir(self), watch=False, no_such_knob=1)
        for bad in ({"staging_bytes": -1}, {"every_steps": 2**32},
                    {"level": 2**31}, {"codec": "lz4"}):
            with self.assertRaises(ValueError):
                ckpt.Checkpointer(tmpdir(self), watch=False, **bad)
        with self.assertRaises(ValueError):
            c.save(-1, {})

    def test_step_saved_by_c_code(self):
        """A step without a tree (saved through the C API) restores as a
        dict of tensor name -> array; bf16 as torch."""
        d = tmpdir(self)
        c = self.open(d)
        w = torch.randn(3, 4).bfloat16()
        n = np.arange(6, dtype=np.int32).reshape(2, 3)
        shapes = [(ctypes.c_uint64 * 2)(3, 4), (ctypes.c_uint64 * 2)(2, 3)]
        ts = (_lib.Tensor * 2)()
        for t, name, dt, shp, ptr, nb in (
                (ts[0], b"w", "bf16", shapes[0], w.data_ptr(), 24),
                (ts[1], b"n", "i32", shapes[1], n.ctypes.data, 24)):
            t.name, t.dtype, t.ndim, t.shape = name, _lib.DTYPES[dt], 2, shp
            t.data, t.nbytes = ptr, nb
        self.assertEqual(_lib.lib.ckpt_save_ex(c._h, 9, ts, 2, None), 0)
        self.assertEqual(_lib.lib.ckpt_wait(c._h), 0)
        got = ckpt.load(d)
        self.assertEqual(sorted(got), ["n", "w"])
        same(self, w, got["w"])
        same(self, n, got["n"])

    def test_corrupt_names_file_and_tensor(self):
        d = tmpdir(self)
        c = self.open(d, codec="none", chunk_bytes=64 << 10)
        c.save(1, {"w": np.arange(100000, dtype=np.int64)}, wait=True)
        step = os.path.join(d, "step-%020d" % 1)
        shard = [f for f in os.listdir(step) if f.endswith(".shard")][0]
        path = os.path.join(step, shard)
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) - 4096 - 100)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xff]))
        with self.assertRaises(ckpt.CorruptError) as cm:
            c.restore()
        self.assertIn(shard, str(cm.exception))
        self.assertIn('tensor "w"', cm.exception.message)

    def test_library_path(self):
        self.assertTrue(os.path.exists(_lib.path))
        self.assertTrue(ckpt.version())


class Policy(Base):
    def test_periodic_reason_recorded(self):
        c = self.open(every_steps=5, every_seconds=None)
        saved = []
        for step in range(1, 13):
            r = c.should_save(step)
            if r:
                self.assertEqual(r, "periodic")
                self.assertIsNone(r.deadline)
                c.save(step, {"s": np.array(step)})
                saved.append(step)
        c.wait()
        self.assertEqual(saved, [5, 10])
        self.assertEqual([s["reason"] for s in c.steps()],
                         ["periodic", "periodic"])
        self.assertEqual(c.restore()["s"], np.array(10))
        self.assertFalse(c.should_exit())

    def test_requested_and_sigterm_notices(self):
        """request_save() and SIGTERM (sigterm=True, no metadata watcher)
        come back from should_save() with their deadlines; a save answers
        each."""
        c = self.open(every_seconds=None, sigterm=True)
        self.assertIsNone(c.should_save(1))
        want = time.time() + 100
        c.request_save(deadline=want)
        r = c.should_save(2)
        self.assertEqual(r, "requested")
        self.assertAlmostEqual(r.deadline, want, places=3)
        c.save(2, {"a": np.ones(2)}, wait=True)
        self.assertIsNone(c.should_save(3))
        os.kill(os.getpid(), signal.SIGTERM)
        steps = Stepper(c, 3)
        r = steps.next_due("the SIGTERM advice")
        self.assertEqual(r, "sigterm")
        self.assertAlmostEqual(r.deadline - r.notice_time, 300.0, places=3)
        c.save(steps.step, {"a": np.ones(2)}, wait=True)
        self.assertEqual([s["reason"] for s in c.steps()],
                         ["requested", "sigterm"])
        self.assertTrue(c.should_exit())


# ---------------------------------------------------------------- training

def train_worker(mode, d, n, k):
    """One process of the resume test. full: n steps, no checkpoint.
    first: k steps, save step k, exit. resume / resume-norng: a model
    built from another seed, restored from d (RNG states too, or not),
    steps k+1..n. Prints the digest of the final state."""
    torch.set_num_threads(1)
    seed = 11 if mode in ("full", "first") else 999
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                torch.nn.Dropout(0.3),
                                torch.nn.BatchNorm1d(32),
                                torch.nn.Linear(32, 1))
    model.register_buffer("emb", torch.randn(4, 4).bfloat16())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    start = 1
    if mode.startswith("resume"):
        with ckpt.Checkpointer(d, watch=False, staging_bytes=8 << 20) as c:
            st = load_training_state(c.restore(), model=model, optimizer=opt,
                                     rng=(mode == "resume"))
        start = st["step"] + 1
        assert st["extra"] == {"note": "k"}, st["extra"]
    last = k if mode == "first" else n
    for step in range(start, last + 1):
        x = torch.randn(16, 8)
        noise = torch.from_numpy(np.random.standard_normal((16, 1))
                                 .astype(np.float32))
        y = x.sum(1, keepdim=True) + 0.1 * noise
        scale = random.uniform(0.5, 1.5)
        loss = ((model(x) - y) ** 2).mean() * scale
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            model.emb.add_(0.01 * scale)
    if mode == "first":
        with ckpt.Checkpointer(d, watch=False, staging_bytes=8 << 20) as c:
            c.save(k, training_state(model=model, optimizer=opt, step=k,
                                     extra={"note": "k"}), wait=True)
    h = hashlib.sha256()
    for v in model.state_dict().values():
        h.update(tensor_bytes(v))
    for s in opt.state_dict()["state"].values():
        for v in s.values():
            h.update(tensor_bytes(v))
    print("digest", h.hexdigest())


class Resume(unittest.TestCase):
    def run_worker(self, mode, d, n=30, k=12):
        p = subprocess.run([sys.executable, os.path.abspath(__file__),
                            "--train", mode, d, str(n), str(k)],
                           capture_output=True, text=True,
                           timeout=PATIENCE * 5)
        self.assertEqual(p.returncode, 0, p.stderr)
        return [l for l in p.stdout.splitlines()
                if l.startswith("digest")][-1]

    def test_resumed_run_is_bit_identical(self):
        d = tmpdir(self)
        full = self.run_worker("full", d)
        self.run_worker("first", d)
        resumed = self.run_worker("resume", d)
        self.assertEqual(resumed, full)
        # the test can tell: without the RNG states it differs
        self.assertNotEqual(self.run_worker("resume-norng", d), full)


# ---------------------------------------------------------------- watcher

class FakeServer(testutil.Server):
    """tests/servers/NAME.py on a loopback port, stopped at cleanup."""

    def __init__(self, test, name, *args):
        testutil.Server.__init__(self, os.path.join(SRC, "servers",
                                                    name + ".py"), *args)
        self.start()
        test.addCleanup(self.stop)

    def call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request("http://%s/_fake/%s" % (self.host, path),
                                     data=data, method=method)
        with urllib.request.urlopen(req, timeout=PATIENCE + 10) as r:
            return json.loads(r.read() or b"null")


class Stepper:
    """A loop's steps: asks should_save() at each until a save is due."""

    def __init__(self, c, step=0):
        self.c, self.step = c, step

    def next_due(self, what):
        def ask():
            self.step += 1
            return self.c.should_save(self.step)
        return until(what, ask)


def until(what, fn):
    """fn()'s first truthy value, polling; fails after PATIENCE."""
    t0 = time.monotonic()
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() - t0 > PATIENCE:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


class Watcher(Base):
    ME = "instance/maintenance-event"

    def announced(self, d=None, **kw):
        """A Checkpointer watching a fake metadata server that then
        announces TERMINATE_ON_HOST_MAINTENANCE (once the watcher's
        long-poll is open)."""
        md = FakeServer(self, "fake_metadata")
        os.environ["GCE_METADATA_HOST"] = md.host
        self.addCleanup(os.environ.pop, "GCE_METADATA_HOST", None)
        c = self.open(d, watch=True, every_seconds=None, no_probe=True,
                      backoff_max_ms=1000, **kw)
        md.call("GET", "wait?long_polls=1&key=%s&timeout=%d"
                % (self.ME, PATIENCE))
        st = c.watch_state()
        self.assertTrue(st["running"])
        self.assertEqual(st["host"], md.host)
        self.assertIsNone(c.should_save(1))
        md.call("POST", "set", {"key": self.ME,
                                "value": "TERMINATE_ON_HOST_MAINTENANCE"})
        return c

    def test_maintenance_notice_to_exit(self):
        d = tmpdir(self)
        c = self.announced(d)
        steps = Stepper(c, 1)
        r = steps.next_due("the maintenance advice")
        self.assertEqual(r, "maintenance")
        self.assertIsInstance(r, ckpt.Reason)
        self.assertAlmostEqual(r.deadline - r.notice_time, 60.0, places=3)
        self.assertFalse(c.should_exit())
        step = steps.step
        state = {"w": torch.randn(1000).bfloat16(), "step": step}
        c.save(step, state)  # the advice's reason: planned, answered
        c.wait()
        self.assertTrue(c.should_exit())
        self.assertEqual(ckpt.EXIT_RESTART, 75)
        self.assertEqual(c.steps()[-1]["reason"], "maintenance")
        self.assertEqual(c.restore()["step"], step)
        plan = c.plan()
        self.assertEqual(plan["reason"], "maintenance")
        self.assertEqual(plan["step"], step)
        self.assertEqual(plan["status"], 0)
        keys = {k["key"]: k for k in c.watch_state()["keys"]}
        self.assertEqual(keys[self.ME]["value"],
                         "TERMINATE_ON_HOST_MAINTENANCE")
        self.assertEqual(keys[self.ME]["state"], "ok")
        self.assertGreaterEqual(c.watch_state()["notices"], 1)

        def journal():
            ev = ckpt.events(d)
            seen = [e for e in ev if e.get("key") == self.ME and
                    e.get("new") == "TERMINATE_ON_HOST_MAINTENANCE"]
            durable = [e for e in ev if e.get("step") == step and
                       "deadline_met" in e]
            return (seen, durable) if seen and durable else None
        seen, durable = until("the journal's lines", journal)
        self.assertTrue(durable[-1]["deadline_met"])
        self.assertEqual(durable[-1]["reason"], "maintenance")

    def test_continue_saves_again_before_the_deadline(self):
        """after_save="continue": training goes on after the notice's
        save and should_save() asks once more before the deadline."""
        c = self.announced(after_save="continue",
                           maintenance_window_ms=int(4000 * MULT))
        steps = Stepper(c, 1)
        first = steps.next_due("the maintenance advice")
        c.save(steps.step, {"s": steps.step}, wait=True)
        self.assertFalse(c.should_exit())
        again = steps.next_due("the save before the deadline")
        self.assertEqual(again, "maintenance")
        self.assertEqual(again.deadline, first.deadline)
        c.save(steps.step, {"s": steps.step}, wait=True)
        self.assertFalse(c.should_exit())
        self.assertEqual(len(c.steps()), 2)


class CloudStorage(Base):
    def setUp(self):
        srv = FakeServer(self, "fake_gcs", "--bucket", "ckpt")
        os.environ["STORAGE_EMULATOR_HOST"] = "http://" + srv.host
        self.addCleanup(os.environ.pop, "STORAGE_EMULATOR_HOST", None)

    def test_directory_and_bucket(self):
        """(DIR, gs://...): durable locally, then committed in the
        bucket; both read back the same; the journal is readable."""
        d = tmpdir(self)
        state = {"w": torch.randn(300_000).bfloat16(), "n": [1, "x"]}
        c = self.open((d, "gs://ckpt/run1"))
        self.assertEqual(c.remote, "gs://ckpt/run1")
        c.save(3, state, wait=True)
        c.upload_wait(timeout=PATIENCE)
        up = c.upload_status()
        self.assertEqual((up["step"], up["state"]), (3, "committed"))
        same(self, state, c.restore())
        same(self, state, ckpt.load("gs://ckpt/run1"))
        ckpt.event_append(d, {"source": "test", "note": "py"})
        ev = ckpt.events(d)
        self.assertEqual(ev[-1]["note"], "py")
        self.assertEqual(ev[-1]["host"], 0)

    def test_directory_and_bucket_resume_from_the_newer(self):
        """(DIR, gs://...): a step committed only in the bucket (a notice's
        save sent there, or a recreated node) is the latest and restores
        from the bucket; a step in both comes from the directory."""
        d = tmpdir(self)
        old = {"w": np.arange(1000, dtype=np.float32)}
        new = {"w": np.arange(1000, dtype=np.float32) * 2}
        c = self.open((d, "gs://ckpt/run3"))
        c.save(3, old, wait=True)
        c.upload_wait(timeout=PATIENCE)
        b = self.open("gs://ckpt/run3")
        b.save(7, new, wait=True)
        self.assertEqual(c.latest_step(), 7)
        same(self, new, c.restore())
        same(self, new, c.restore(7))
        same(self, old, c.restore(3))
        with self.assertRaises(ckpt.NotFoundError):
            c.restore(5)

    def test_bucket_alone(self):
        c = self.open("gs://ckpt/run2")
        self.assertIsNone(c.latest_step())
        state = {"a": np.arange(10**5, dtype=np.int32)}
        c.save(1, state, wait=True)
        self.assertEqual(c.latest_step(), 1)
        same(self, state, c.restore(1))
        with self.assertRaises(ValueError):
            ckpt.Checkpointer(("gs://ckpt/x", "gs://ckpt/y"), watch=False)


class Borrow(Base):
    """save(borrow=True): the engine reads the caller's arrays after
    save() returns; the Checkpointer holds them until the release."""

    def state(self, seed, n=1 << 20):
        g = torch.Generator().manual_seed(seed)
        big = torch.randn(2 * n, generator=g)
        return {"np": np.random.default_rng(seed).standard_normal(n // 4),
                "bf16": torch.randn(n, generator=g).bfloat16(),
                "strided": big[::2],  # saved through a temporary copy
                "nested": [np.arange(seed, seed + 7), {"s": "x", "i": seed}]}

    def test_round_trip(self):
        """Borrowed saves restore exactly: released and waited for
        explicitly, implicitly by the next save, and with wait=True."""
        d = tmpdir(self)
        c = self.open(d, staging_bytes=1 << 20, chunk_bytes=64 << 10,
                      codec="float")
        c.save(1, self.state(1), borrow=True)
        self.assertTrue(c.wait_released())
        self.assertNotEqual(c.progress()["state"], "staging")
        c.wait()
        c.save(2, self.state(2), borrow=True)
        c.save(3, self.state(3), borrow=True)  # waits for step 2 first
        c.save(4, self.state(4), borrow=True, wait=True)
        self.assertTrue(c.wait_released(timeout=0))
        c.save(5, self.state(5), borrow=True)
        c.close()  # waits for the release and the save
        for step in range(1, 6):
            same(self, self.state(step), ckpt.load(d, step))

    def test_errors(self):
        """A refused save borrows nothing; a save failing in the
        background releases its arrays and raises from wait(); a closed
        Checkpointer refuses wait_released()."""
        d = tmpdir(self)
        c = self.open(d)
        c.save(1, self.state(1), borrow=True, wait=True)
        a = np.ones(1 << 16)
        ref = weakref.ref(a)
        refused = None
        try:
            c.save(1, {"a": a}, borrow=True)
        except ckpt.ExistsError as e:
            refused = e  # its traceback too: save()'s frame is in it
        self.assertIsNotNone(refused)
        del a
        self.assertIsNotNone(refused.__traceback__)
        self.assertIsNone(ref(), "a refused save kept the array")
        self.assertTrue(c.wait_released(timeout=0))
        blocker = os.path.join(d, "step-%020d" % 2, "h00000-f000.shard")
        os.makedirs(blocker)
        b = np.ones(1 << 16)
        ref = weakref.ref(b)
        # the writer thread fails the save; if it does so before
        # ckpt_save_ex returns, save() raises, else the next wait()
        err = None
        try:
            c.save(2, {"b": b}, borrow=True)
        except ckpt.CkptOSError as e:
            err = e
        del b
        if err is None:
            with self.assertRaises(ckpt.CkptOSError) as cm:
                c.wait()
            err = cm.exception
        self.assertIn("h00000-f000.shard", str(err))
        self.assertIsNone(ref(), "a failed save kept the array")
        self.assertTrue(c.wait_released())
        os.rmdir(blocker)
        c.save(3, self.state(3), borrow=True, wait=True)
        self.assertEqual([s["step"] for s in c.steps()], [1, 3])
        c.close()
        with self.assertRaises(ValueError):
            c.wait_released()

    def test_stall_and_references(self):
        """A bucket whose server is stopped (SIGSTOP) takes nothing, so
        the engine cannot read past what the pool and one connection's
        socket buffers hold (a few MiB of 64): save() has returned while
        the arrays are still borrowed, with no timing involved. The
        caller drops its arrays at once; the Checkpointer holds them
        (and the temporary of the strided one) until the release, then
        lets go; the checkpoint holds the original bytes even though new
        arrays were filled with other ones meanwhile."""
        srv = FakeServer(self, "fake_gcs", "--bucket", "ckpt")
        env = {"STORAGE_EMULATOR_HOST": "http://" + srv.host,
               "CKPT_GCS_STREAMS": "1"}
        for k, v in env.items():
            self.addCleanup(os.environ.pop, k, None)
            os.environ[k] = v
        c = self.open("gs://ckpt/borrow", staging_bytes=1 << 20,
                      chunk_bytes=64 << 10)

        def pattern(seed, n=64 << 20):
            return np.random.default_rng(seed).integers(0, 256, n,
                                                        dtype=np.uint8)

        def want():
            return {"a": pattern(3),
                    "t": torch.from_numpy(pattern(5, 32 << 20)),
                    "s": torch.from_numpy(pattern(7, 32 << 20))[::2]}
        state = want()
        a, t = state["a"], state["t"]
        refs = [weakref.ref(a), weakref.ref(t)]
        os.kill(srv.proc.pid, signal.SIGSTOP)
        self.addCleanup(os.kill, srv.proc.pid, signal.SIGCONT)
        c.save(1, state, borrow=True)
        del a, t, state
        garbage = [np.full(64 << 20, 0xEE, dtype=np.uint8) for _ in range(2)]
        p = c.progress()
        self.assertEqual(p["state"], "staging")
        self.assertLess(p["bytes_staged"], p["bytes_total"])
        self.assertFalse(c.wait_released(timeout=0))
        self.assertFalse(c.wait_released(timeout=0.05))
        self.assertTrue(all(r() is not None for r in refs))
        os.kill(srv.proc.pid, signal.SIGCONT)
        self.assertTrue(c.wait_released())
        self.assertTrue(all(r() is None for r in refs))
        c.wait()
        del garbage
        got = c.restore(1)
        w = want()
        w["s"] = w["s"].contiguous()
        same(self, w, got)


class Stall(Base):
    """save() runs no cyclic-GC collection while the caller waits on it
    (one walks every object of the process: 25 ms with torch loaded) and
    leaves the GC enabled or disabled as it found it."""

    def test_no_collection(self):
        c = self.open(codec="none")
        state = {"l%d" % i: {"w": np.full(8, i, np.float32),
                             "b": torch.full((4,), i), "n": [i, "x"]}
                 for i in range(300)}
        seen, inside = [], [False]

        def watch(phase, info):
            if phase == "start" and inside[0]:
                seen.append(info["generation"])
        old = gc.get_threshold()
        gc.callbacks.append(watch)
        self.addCleanup(gc.callbacks.remove, watch)
        self.addCleanup(gc.set_threshold, *old)
        gc.set_threshold(1, 1, 1)  # every tracked allocation collects
        for step in (1, 2):  # 2: save 1 outstanding but done
            deadline = time.monotonic() + PATIENCE
            while c.progress()["running"]:
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.01)
            inside[0] = True
            c.save(step, state)
            inside[0] = False
            self.assertTrue(gc.isenabled())
        gc.disable()
        self.addCleanup(gc.enable)
        c.save(3, state, wait=True)
        self.assertFalse(gc.isenabled())
        gc.enable()
        self.assertEqual(seen, [])
        same(self, state, c.restore(2))


class Dedup(Base):
    """dedup=True (CKPT_F_DEDUP): a frozen tensor is not written again."""

    def test_frozen_tensor_is_referenced(self):
        """With dedup, step 2 of a state whose big tensor did not change
        is stored in a fraction of step 1's bytes and step 1 is kept as
        referenced by step 2, even with keep_last=1; both restore
        exactly. Without the flag, step 2 is stored whole."""
        os.environ.pop("CKPT_DEDUP", None)  # it would override the flag
        frozen = np.random.default_rng(1).standard_normal(1 << 20)

        def state(step):
            return {"frozen": frozen, "head": np.full(1024, step, "f4"),
                    "step": step}

        stored = {}
        for dedup in (False, True):
            d = tmpdir(self)
            c = self.open(d, dedup=dedup, keep_last=1,
                          chunk_bytes=256 << 10)
            c.save(1, state(1), wait=True)
            c.save(2, state(2), wait=True)
            info = {s["step"]: s for s in c.steps()}
            stored[dedup] = info[2]["stored_bytes"]
            if dedup:
                self.assertEqual(sorted(info), [1, 2])
                self.assertEqual(info[1]["referenced_by"], 2)
                same(self, state(1), c.restore(1))
            else:
                self.assertEqual(sorted(info), [2])
            same(self, state(2), c.restore(2))
        self.assertLess(stored[True], stored[False] / 4, stored)


class Readme(unittest.TestCase):
    def test_readme_python_example_runs(self):
        with open(os.path.join(SRC, "..", "README.md")) as f:
            text = f.read()
        sec = text[text.index("\n## Python\n"):]
        code = sec[sec.index("```python\n") + 10:]
        code = code[:code.index("```")]
        d = tmpdir(self)
        env = dict(os.environ, GCE_METADATA_HOST="127.0.0.1:9")
        for _ in range(2):  # the second run resumes
            p = subprocess.run([sys.executable, "-c", code], cwd=d, env=env,
                               capture_output=True, text=True,
                               timeout=PATIENCE * 5)
            self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("latest step 300", p.stdout)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--train":
        train_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]),
                     int(sys.argv[5]))
        sys.exit(0)
    unittest.main(verbosity=2)
