#!/usr/bin/python3
"""End-to-end tests of ckptctl.

Usage: /usr/bin/python3 tests/test_ckptctl.py /path/to/ckptctl

Checkpoints are made with `ckptctl import` from safetensors files this test
writes itself (numpy arrays of every dtype, bf16 as uint16 bits, scalars,
empty tensors, names with unicode, spaces, quotes, slashes and control
characters). Exported files are read back with the small spec-following
safetensors reader below, which shares no code with ckptctl.

numpy is needed only to make those tensors. Without it (a python that
cannot import numpy) the tests that need no tensor data still run, on a
small checkpoint written byte by byte; the others are reported as skipped
with the reason. Prints "N passed, M failed, K skipped" last; exits 0 if
nothing failed and something ran, 77 (skipped, for meson) if nothing
could run, 1 otherwise.
"""

import json
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import testutil

try:
    import numpy as np
except ImportError:
    np = None

NO_NUMPY = "needs numpy, which %s cannot import" % sys.executable
needs_numpy = unittest.skipIf(np is None, NO_NUMPY)

CKPTCTL = None
TMP = None

# safetensors dtype -> numpy dtype holding the same bytes
ST_NP = {} if np is None else {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "BF16": np.uint16,      # raw bf16 bits
    "F32": np.float32,
    "F64": np.float64,
    "F8_E4M3": np.uint8,    # raw fp8 bits
    "F8_E5M2": np.uint8,
}
ST_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4,
           "I32": 4, "U64": 8, "I64": 8, "F16": 2, "BF16": 2, "F32": 4,
           "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
CKPT_DTYPE = {"BOOL": "bool", "U8": "u8", "I8": "i8", "U16": "u16",
              "I16": "i16", "U32": "u32", "I32": "i32", "U64": "u64",
              "I64": "i64", "F16": "f16", "BF16": "bf16", "F32": "f32",
              "F64": "f64", "F8_E4M3": "f8e4m3", "F8_E5M2": "f8e5m2"}


# --------------------------------------------------------------------------
# An independent safetensors writer and reader (spec: 8-byte LE header
# length, JSON header, byte buffer; offsets relative to the buffer).
# --------------------------------------------------------------------------

def elements(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def st_write(path, tensors, metadata=None):
    """tensors: list of (name, st_dtype, numpy array), written in order."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    off = 0
    blobs = []
    for name, dt, arr in tensors:
        b = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"),
                                             copy=False).tobytes()
        assert len(b) == int(np.prod(arr.shape, dtype=np.int64)) * ST_SIZE[dt]
        header[name] = {"dtype": dt, "shape": list(arr.shape),
                        "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hj = json.dumps(header, ensure_ascii=False).encode("utf-8")
    hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def st_write_raw(path, header_obj, data, pad=True):
    hj = header_obj if isinstance(header_obj, bytes) else \
        json.dumps(header_obj).encode()
    if pad:
        hj += b" " * (-len(hj) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        f.write(data)


class STFile:
    def __init__(self, header_len, header, metadata, order, tensors):
        self.header_len = header_len
        self.header = header
        self.metadata = metadata
        self.order = order          # names in data_offsets order
        self.tensors = tensors      # name -> (st_dtype, shape, bytes)

    def array(self, name):
        dt, shape, b = self.tensors[name]
        return np.frombuffer(b, dtype=np.dtype(ST_NP[dt]).newbyteorder("<")
                             ).reshape(shape)


def st_read(path, strict=True):
    """Reads and validates a safetensors file; with strict=True also checks
    what our exporter promises: header padded with spaces to a multiple of
    8 and tensors stored contiguously from offset 0 to the end."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("file too short")
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise ValueError("header length beyond end of file")
    hbytes = raw[8:8 + n]
    header = json.loads(hbytes.decode("utf-8"))
    if strict:
        if n % 8:
            raise ValueError("header length %d not a multiple of 8" % n)
        stripped = hbytes.rstrip(b" ")
        if not stripped.endswith(b"}"):
            raise ValueError("header padding is not spaces")
    buf = raw[8 + n:]
    metadata = header.pop("__metadata__", None)
    ents = []
    for name, e in header.items():
        dt, shape, (b, end) = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in ST_SIZE:
            raise ValueError("bad dtype %r" % dt)
        if not (0 <= b <= end <= len(buf)):
            raise ValueError("offsets of %r outside buffer" % name)
        if end - b != elements(shape) * ST_SIZE[dt]:
            raise ValueError("size of %r does not match shape" % name)
        ents.append((b, end, name, dt, shape))
    ents.sort()
    pos = 0
    for b, end, name, _, _ in ents:
        if b < pos:
            raise ValueError("overlap at %r" % name)
        if strict and b != pos:
            raise ValueError("gap before %r" % name)
        pos = end
    if strict and pos != len(buf):
        raise ValueError("trailing bytes after the last tensor")
    tensors = {name: (dt, tuple(shape), buf[b:end])
               for b, end, name, dt, shape in ents}
    return STFile(n, header, metadata, [e[2] for e in ents], tensors)


# --------------------------------------------------------------------------
# Test data
# --------------------------------------------------------------------------

ODD_NAMES = [
    "with space",
    'quote"d',
    "single'quote",
    "a/b/c.weight",
    "back\\slash",
    "tab\there",
    "new\nline",
    "esc\x1b[31mred",
    "ünïcødé.日本語.😀",
    " leading and trailing ",
    "x" * 300,
]


def make_tensors(seed=0):
    rng = np.random.default_rng(seed)
    t = []
    t.append(("layers.0.w", "F32",
              rng.standard_normal((64, 33)).astype(np.float32)))
    bf = rng.standard_normal((100, 17)).astype(np.float32)
    t.append(("embed.bf16", "BF16", (bf.view(np.uint32) >> 16).astype(np.uint16)))
    t.append(("f16", "F16", rng.standard_normal((7, 3, 5)).astype(np.float16)))
    t.append(("f64", "F64", rng.standard_normal((129,))))
    t.append(("bool", "BOOL", rng.random((13, 2)) > 0.5))
    t.append(("u8", "U8", rng.integers(0, 256, (300,), dtype=np.uint8)))
    t.append(("i8", "I8", rng.integers(-128, 128, (3, 4), dtype=np.int8)))
    t.append(("u16", "U16", rng.integers(0, 2**16, (5, 5), dtype=np.uint16)))
    t.append(("i16", "I16", rng.integers(-2**15, 2**15, (9,), dtype=np.int16)))
    t.append(("u32", "U32", rng.integers(0, 2**32, (4, 1, 4), dtype=np.uint32)))
    t.append(("i32", "I32", rng.integers(-2**31, 2**31, (11,), dtype=np.int32)))
    t.append(("u64", "U64", rng.integers(0, 2**63, (6,), dtype=np.uint64) * 2 + 1))
    t.append(("i64", "I64", rng.integers(-2**62, 2**62, (2, 3), dtype=np.int64)))
    t.append(("f8e4m3", "F8_E4M3", rng.integers(0, 256, (17,), dtype=np.uint8)))
    t.append(("f8e5m2", "F8_E5M2", rng.integers(0, 256, (8, 8), dtype=np.uint8)))
    t.append(("scalar.f32", "F32", np.array(3.25, dtype=np.float32)))
    t.append(("scalar.i64", "I64", np.array(-7, dtype=np.int64)))
    t.append(("empty.2d", "F32", np.zeros((0, 5), dtype=np.float32)))
    t.append(("empty.1d", "I64", np.zeros((0,), dtype=np.int64)))
    t.append(("empty.mid", "BF16", np.zeros((3, 0, 2), dtype=np.uint16)))
    # Spans several 64 KiB chunks and compresses well.
    t.append(("big.smooth", "F32",
              np.linspace(0, 1, 300 * 257, dtype=np.float32).reshape(300, 257)))
    t.append(("big.zeros", "I32", np.zeros((70000,), dtype=np.int32)))
    for i, name in enumerate(ODD_NAMES):
        t.append((name, "I16", np.arange(i, i + 3 * (i + 1), dtype=np.int16)
                  .reshape(3, i + 1)))
    return t


def tensor_bytes(arr):
    return np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"),
                                            copy=False).tobytes()


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def run(*args, env=None, stdin=None, timeout=300):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run([CKPTCTL] + [str(a) for a in args], stdin=stdin,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=e, timeout=timeout)
    p.out = p.stdout.decode("utf-8", "replace")
    p.err = p.stderr.decode("utf-8", "replace")
    return p


def run_json(*args, **kw):
    p = run(*args, **kw)
    return p, (json.loads(p.stdout) if p.stdout.strip() else None)


def fresh_dir(name):
    d = os.path.join(TMP, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    return d


def shard_files(root, step):
    sd = os.path.join(root, "step-%020d" % step)
    return sorted((os.path.join(sd, f) for f in os.listdir(sd)
                   if f.endswith(".shard")), key=os.path.getsize)


SRC = None          # source safetensors file
TENSORS = None      # list of (name, dtype, array)
ROOT = None         # checkpoint imported from SRC at step 7


def setUpModule():
    global TMP, SRC, TENSORS, ROOT
    TMP = tempfile.mkdtemp(prefix="test_ckptctl.")
    SRC = os.path.join(TMP, "src.safetensors")
    if np is not None:
        TENSORS = make_tensors()
        st_write(SRC, TENSORS, {"origin": "test"})
    else:
        # Enough of a checkpoint for the tests that need no tensor data.
        write_small(SRC, 0, {"origin": "test"})
    ROOT = os.path.join(TMP, "root")
    p = run("import", "--chunk", "64K", SRC, ROOT + "@7")
    if p.returncode != 0:
        raise RuntimeError("import failed: %s" % p.err)


def write_small(path, n, metadata=None):
    """A small valid safetensors file: the first n of TENSORS, or without
    numpy two tensors written byte by byte."""
    if np is not None:
        st_write(path, TENSORS[:n], metadata)
        return
    header = {"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
              "b": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}
    if metadata is not None:
        header["__metadata__"] = metadata
    st_write_raw(path, header, bytes(range(24)))


def tearDownModule():
    if TMP and not os.environ.get("KEEP_TMP"):
        shutil.rmtree(TMP, ignore_errors=True)


class CkptctlTest(unittest.TestCase):
    maxDiff = None

    def assertUsage(self, p):
        self.assertEqual(p.returncode, 2, p.err)
        self.assertTrue(p.err.startswith("ckptctl: "), p.err)
        self.assertEqual(p.out, "")

    def assertFails(self, p, cmd, *fragments):
        self.assertEqual(p.returncode, 1, (p.out, p.err))
        self.assertTrue(p.err.startswith("ckptctl: %s: " % cmd), p.err)
        for f in fragments:
            self.assertIn(f, p.err)

    def assertExportMatches(self, path, tensors, step=None):
        st = st_read(path)
        self.assertEqual(set(st.tensors), {t[0] for t in tensors})
        for name, dt, arr in tensors:
            sdt, shape, b = st.tensors[name]
            self.assertEqual(sdt, dt, name)
            self.assertEqual(shape, tuple(arr.shape), name)
            self.assertEqual(b, tensor_bytes(arr), name)
            got = st.array(name)
            if dt == "BOOL":
                np.testing.assert_array_equal(got, arr)
            else:
                self.assertEqual(got.shape, arr.shape, name)
                self.assertEqual(got.tobytes(), np.ascontiguousarray(arr).tobytes(), name)
        self.assertIsInstance(st.metadata, dict)
        if step is not None:
            self.assertEqual(st.metadata.get("ckpt_step"), str(step))
        self.assertIn("ckpt_source", st.metadata)
        return st


class TestHelp(CkptctlTest):
    COMMANDS = ["ls", "inspect", "verify", "restore", "export", "import", "gc",
                "push"]

    def test_global_help(self):
        for args in (["--help"], ["-h"], ["help"]):
            p = run(*args)
            self.assertEqual(p.returncode, 0)
            self.assertIn("Usage:", p.out)
            for c in self.COMMANDS:
                self.assertIn(c, p.out)

    def test_version(self):
        p = run("--version")
        self.assertEqual(p.returncode, 0)
        self.assertRegex(p.out, r"^ckptctl \d+\.\d+\.\d+")

    def test_command_help(self):
        for c in self.COMMANDS:
            for args in ([c, "--help"], [c, "-h"], ["help", c]):
                p = run(*args)
                self.assertEqual(p.returncode, 0, (c, p.err))
                self.assertIn("Usage: ckptctl " + c, p.out)
                self.assertIn("Options:", p.out)
                self.assertIn("Examples:", p.out)
                self.assertIn("Exit status: 0 ", p.out)
                self.assertEqual(p.err, "")

    # A value of the right kind for each argument placeholder in the help.
    ARG_VALUES = {"N": "1", "K": "1", "BYTES": "64K", "FMT": "safetensors",
                  "FILE": "x", "NAME": "x", "OUTDIR": "x", "DEST": "x",
                  "none|zstd|float": "zstd", "REASON": "manual"}

    def test_help_options_exist(self):
        # Every option a command's help lists is accepted, in both spellings
        # and with an argument exactly when the help shows one: a later
        # --help then still prints the help (a missing or unknown option
        # would be a usage error, a wrongly taken argument would eat it).
        for c in self.COMMANDS:
            p = run(c, "--help")
            opts = re.findall(r"^  (-\w), (--[\w-]+)(?: (\S+))?",
                              p.out.split("Options:\n", 1)[1], re.M)
            self.assertIn(("-h", "--help", ""), opts, c)
            self.assertIn(("-j", "--json", ""), opts, c)
            for short, long_, arg in opts:
                for spelling in (short, long_):
                    args = [c, spelling]
                    if arg:
                        args.append(self.ARG_VALUES[arg])
                    with self.subTest(args=args):
                        q = run(*args, "--help")
                        self.assertEqual(q.returncode, 0, q.err)
                        self.assertEqual(q.out, p.out)


class TestUsageErrors(CkptctlTest):
    def test_usage_errors(self):
        d = ROOT
        cases = [
            [],
            ["frobnicate"],
            ["--bogus"],
            ["help", "frobnicate"],
            ["ls"],
            ["ls", d, d],
            ["ls", "--bogus", d],
            ["ls", "-Z", d],
            ["inspect"],
            ["inspect", d + "@99999999999999999999999"],
            ["inspect", d + "@18446744073709551615"],   # reserved (latest)
            ["verify", "--all", d + "@7"],
            ["verify", "--nope", d],
            ["restore", d],
            ["restore", d, "--to"],
            ["export", d],
            ["export", d, "-o"],
            ["export", d, "-o", "x", "--format", "npz"],
            ["import", SRC],
            ["import", SRC, d, "--codec", "lzma"],
            ["import", SRC, d, "--level", "abc"],
            ["import", SRC, d, "--chunk", "12Q"],
            ["import", SRC, d, "--reason", "bogus"],
            ["import", SRC, d, "--reason", "unspecified"],
            ["import", SRC, d, "extra"],
            ["gc", d],
            ["gc", d, "--keep", "-1"],
            ["gc", d, "--keep", "2", "--keep-every", "x"],
            ["inspect", "@5"],
        ]
        for args in cases:
            with self.subTest(args=args):
                p = run(*args)
                self.assertUsage(p)


class TestImportExport(CkptctlTest):
    @needs_numpy
    def test_export_roundtrip_all(self):
        out = os.path.join(TMP, "all.safetensors")
        p = run("export", ROOT + "@7", "--format", "safetensors", "-o", out)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(p.err, "")  # no progress when not a tty
        self.assertFalse(os.path.exists(out + ".tmp"))
        st = self.assertExportMatches(out, TENSORS, step=7)
        # Default order is the checkpoint's (bytewise name order).
        self.assertEqual(st.order, sorted(st.order, key=lambda s: s.encode()))

    @needs_numpy
    def test_export_latest_is_default(self):
        out = os.path.join(TMP, "latest.safetensors")
        p = run("export", ROOT, "-o", out)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertExportMatches(out, TENSORS, step=7)

    @needs_numpy
    def test_export_selected_tensors(self):
        out = os.path.join(TMP, "sel.safetensors")
        names = ["u64", ODD_NAMES[6], "scalar.f32", "empty.2d", ODD_NAMES[8]]
        args = ["export", ROOT + "@7", "-o", out]
        for n in names:
            args += ["--tensor", n]
        p, js = run_json(*args, "--json")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["tensors"], len(names))
        st = self.assertExportMatches(out, [t for t in TENSORS if t[0] in names])
        # --tensor order is kept (empty tensors sit at their position too).
        hdr_order = sorted(st.header, key=lambda k: st.header[k]["data_offsets"])
        self.assertEqual(hdr_order, names)

    @needs_numpy
    def test_export_unknown_tensor(self):
        out = os.path.join(TMP, "nope.safetensors")
        p = run("export", ROOT, "-o", out, "--tensor", "no.such\ttensor")
        self.assertFails(p, "export", "not found", "no.such\\ttensor")
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(out + ".tmp"))
        p = run("export", ROOT, "-o", out, "--tensor", "u8", "--tensor", "u8")
        self.assertEqual(p.returncode, 1)
        self.assertFalse(os.path.exists(out))

    @needs_numpy
    def test_export_in_pieces(self):
        # The hidden knob makes export read every tensor in tiny boxes,
        # exercising the bounded-memory path used for huge tensors.
        for piece in ("1", "7", "64", "1000"):
            out = os.path.join(TMP, "pieces%s.safetensors" % piece)
            p = run("export", ROOT, "-o", out, env={"CKPTCTL_EXPORT_PIECE": piece})
            self.assertEqual(p.returncode, 0, p.err)
            self.assertExportMatches(out, TENSORS)

    @needs_numpy
    def test_export_write_paths(self):
        # O_DIRECT in whole blocks, the rest carried to the next piece; and
        # the buffered writes of a file system refusing O_DIRECT (hook).
        for env in ({}, {"CKPTCTL_EXPORT_BUFFERED": "1"}):
            for piece in ("999", "4096", "64M"):
                out = os.path.join(TMP, "paths.safetensors")
                p = run("export", ROOT, "-o", out,
                        env=dict(env, CKPTCTL_EXPORT_PIECE=piece))
                self.assertEqual(p.returncode, 0, (env, piece, p.err))
                self.assertExportMatches(out, TENSORS, step=7)
            # A write that fails (file size limit, as a full disk would):
            # the error names FILE.tmp, nothing is left behind.
            out = os.path.join(TMP, "fsize.safetensors")
            for limit in (1000, 5000, 70000):
                def small_files():
                    import resource
                    import signal
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
                p = subprocess.run([CKPTCTL, "export", ROOT, "-o", out],
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE,
                                   env=dict(os.environ, **env),
                                   preexec_fn=small_files, timeout=300)
                p.out, p.err = p.stdout.decode(), p.stderr.decode()
                self.assertFails(p, "export", out + ".tmp", "File too large")
                self.assertFalse(os.path.exists(out))
                self.assertFalse(os.path.exists(out + ".tmp"))

    @needs_numpy
    def test_codecs_roundtrip(self):
        for codec, extra in (("none", []), ("zstd", ["--level", "3"]),
                             ("float", []), ("float", ["--chunk", "128K"])):
            with self.subTest(codec=codec, extra=extra):
                root = fresh_dir("codec_" + codec)
                p, js = run_json("import", "--json", "--codec", codec, *extra,
                                 SRC, root)
                self.assertEqual(p.returncode, 0, p.err)
                self.assertEqual(js["step"], 0)   # no @STEP: step 0
                self.assertEqual(js["tensors"], len(TENSORS))
                p, ins = run_json("inspect", "--json", root + "@0")
                self.assertEqual(p.returncode, 0, p.err)
                if codec == "none":
                    self.assertEqual(ins["codecs"]["zstd"]["chunks"], 0)
                    self.assertEqual(ins["codecs"]["float"]["chunks"], 0)
                else:
                    # big.zeros and big.smooth compress under any real codec
                    self.assertGreater(ins["raw_bytes"], ins["stored_bytes"])
                out = os.path.join(TMP, "codec_%s.safetensors" % codec)
                p = run("export", root, "-o", out)
                self.assertEqual(p.returncode, 0, p.err)
                self.assertExportMatches(out, TENSORS, step=0)
                self.assertEqual(run("verify", root).returncode, 0)

    @needs_numpy
    def test_reimport_export(self):
        # export -> import -> export gives identical tensor bytes and header.
        a = os.path.join(TMP, "re_a.safetensors")
        b = os.path.join(TMP, "re_b.safetensors")
        self.assertEqual(run("export", ROOT, "-o", a).returncode, 0)
        root = fresh_dir("reimport")
        p = run("import", a, root + "@123")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(run("export", root, "-o", b).returncode, 0)
        sa, sb = st_read(a), st_read(b)
        self.assertEqual(sa.tensors, sb.tensors)
        self.assertEqual(sb.metadata["ckpt_step"], "123")

    def test_import_existing_step_fails(self):
        p = run("import", SRC, ROOT + "@7")
        self.assertFails(p, "import")

    @needs_numpy
    def test_import_empty_file_of_tensors(self):
        f = os.path.join(TMP, "none.safetensors")
        st_write(f, [], {"a": "b"})
        root = fresh_dir("empty_import")
        p = run("import", f, root + "@1")
        if p.returncode == 0:
            out = os.path.join(TMP, "none_out.safetensors")
            self.assertEqual(run("export", root, "-o", out).returncode, 0)
            self.assertEqual(st_read(out).tensors, {})
        else:
            self.assertFails(p, "import")


class TestImportValidation(CkptctlTest):
    def bad(self, name, header, data, *fragments, raw_file=None, pad=True):
        f = os.path.join(TMP, "bad_%s.safetensors" % name)
        if raw_file is not None:
            with open(f, "wb") as fh:
                fh.write(raw_file)
        else:
            st_write_raw(f, header, data, pad=pad)
        root = fresh_dir("bad_root_" + name)
        p = run("import", f, root)
        self.assertFails(p, "import", *fragments)
        # Nothing was committed.
        if os.path.isdir(root):
            p, js = run_json("ls", "--json", root)
            self.assertEqual(js["steps"], [])

    def test_bad_files(self):
        ok = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
        self.bad("short", None, None, "too short", raw_file=b"\x01\x00")
        self.bad("hdrlen", None, None, "exceeds",
                 raw_file=struct.pack("<Q", 1 << 40) + b"{}")
        self.bad("hdrlen2", None, None, "exceeds",
                 raw_file=struct.pack("<Q", 100) + b'{"a": 1}')
        self.bad("json", b'{"a": {"dtype": ', b"", "JSON")
        self.bad("notobj", b"[1, 2, 3]", b"", "object")
        self.bad("dup", b'{"t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},'
                 b' "t": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}',
                 b"\x00", "JSON")
        self.bad("dtype", {"weird.t": {"dtype": "C64", "shape": [1],
                                       "data_offsets": [0, 8]}},
                 b"\x00" * 8, "weird.t", "dtype")
        self.bad("shape", {"neg": {"dtype": "F32", "shape": [-1],
                                   "data_offsets": [0, 4]}},
                 b"\x00" * 4, "neg", "shape")
        self.bad("shape2", {"s": {"dtype": "F32", "shape": "2",
                                  "data_offsets": [0, 8]}}, b"\x00" * 8, '"s"')
        self.bad("ndim", {"deep": {"dtype": "U8", "shape": [1] * 17,
                                   "data_offsets": [0, 1]}}, b"\x00", "deep",
                 "dimensions")
        self.bad("oob", {"far": {"dtype": "F32", "shape": [4],
                                 "data_offsets": [0, 16]}},
                 b"\x00" * 8, "far", "outside")
        self.bad("order", {"rev": {"dtype": "U8", "shape": [0],
                                   "data_offsets": [4, 2]}},
                 b"\x00" * 8, "rev")
        self.bad("size", {"sz": {"dtype": "F32", "shape": [3],
                                 "data_offsets": [0, 8]}},
                 b"\x00" * 12, "sz", "need")
        self.bad("overflow", {"huge": {"dtype": "F64", "shape": [2**62, 2**62],
                                       "data_offsets": [0, 8]}},
                 b"\x00" * 8, "huge")
        self.bad("overlap", {"a1": ok,
                             "b2": {"dtype": "U8", "shape": [4],
                                    "data_offsets": [6, 10]}},
                 b"\x00" * 16, "overlaps", "a1", "b2")
        self.bad("offsets", {"o": {"dtype": "U8", "shape": [1],
                                   "data_offsets": [0]}}, b"\x00", '"o"')
        self.bad("meta", {"__metadata__": {"k": 5}, "t": ok}, b"\x00" * 8,
                 "__metadata__")
        self.bad("emptyname", {"": ok}, b"\x00" * 8, "empty")
        self.bad("entry", {"e": [1, 2]}, b"", '"e"')
        self.bad("ctrl", {"evil\x1b[2J": {"dtype": "X", "shape": [],
                                          "data_offsets": [0, 0]}},
                 b"", "evil\\x1b[2J")
        p = run("import", os.path.join(TMP, "does-not-exist.safetensors"),
                fresh_dir("bad_missing"))
        self.assertFails(p, "import", "does-not-exist")

    @needs_numpy
    def test_mutated_headers_never_crash(self):
        # Random damage to the length prefix and header: import must fail
        # cleanly (exit 1) or succeed, never crash or hang.
        good = os.path.join(TMP, "fuzz_src.safetensors")
        st_write(good, [t for t in TENSORS if t[0] in
                        ("u8", "scalar.f32", "empty.2d", "i64", ODD_NAMES[1])])
        with open(good, "rb") as f:
            orig = f.read()
        (hlen,) = struct.unpack("<Q", orig[:8])
        rng = np.random.default_rng(1234)
        root = fresh_dir("fuzz_root")
        f = os.path.join(TMP, "fuzz.safetensors")
        for i in range(80):
            b = bytearray(orig)
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(0, 8 + hlen))
                b[pos] = int(rng.integers(0, 256))
            if i % 10 == 9:
                b = b[:int(rng.integers(0, len(b)))]
            with open(f, "wb") as fh:
                fh.write(bytes(b))
            p = run("import", f, "%s@%d" % (root, i), timeout=60)
            self.assertIn(p.returncode, (0, 1), (i, p.err))
            if p.returncode == 1:
                self.assertTrue(p.err.startswith("ckptctl: import: "), p.err)
                self.assertEqual(p.err.count("\n"), 1, p.err)

    def test_lenient_but_valid(self):
        # Unpadded header, a gap between tensors and an unknown extra key
        # are all legal safetensors.
        f = os.path.join(TMP, "lenient.safetensors")
        hdr = {"b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]},
               "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2],
                     "extra": True}}
        st_write_raw(f, json.dumps(hdr).encode() + b"  ", b"\x01\x02\x00\x00\x03\x04",
                     pad=False)
        root = fresh_dir("lenient")
        p = run("import", f, root)
        self.assertEqual(p.returncode, 0, p.err)
        out = os.path.join(TMP, "lenient_out.safetensors")
        self.assertEqual(run("export", root, "-o", out).returncode, 0)
        st = st_read(out)
        self.assertEqual(st.tensors["a"][2], b"\x01\x02")
        self.assertEqual(st.tensors["b"][2], b"\x03\x04")


class TestInspect(CkptctlTest):
    @needs_numpy
    def test_ls(self):
        p = run("ls", ROOT)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("7 *", p.out)
        p, js = run_json("ls", "--json", ROOT)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["latest"], 7)
        self.assertEqual(len(js["steps"]), 1)
        s = js["steps"][0]
        self.assertEqual(s["step"], 7)
        self.assertTrue(s["latest"])
        self.assertEqual(s["hosts"], 1)
        self.assertEqual(s["tensors"], len(TENSORS))
        self.assertEqual(s["raw_bytes"], sum(tensor_bytes(a).__len__() for _, _, a in TENSORS))
        self.assertGreater(s["stored_bytes"], 0)
        self.assertGreater(s["commit_unix_ns"], 0)

    def test_reason(self):
        """A step imported with --reason shows it in ls and inspect (text
        and JSON); one imported without shows "unspecified"."""
        root = fresh_dir("reason_root")
        p = run("import", "--reason", "maintenance", SRC, root + "@3")
        self.assertEqual(p.returncode, 0, p.err)
        p = run("import", SRC, root + "@4")
        self.assertEqual(p.returncode, 0, p.err)
        p, js = run_json("ls", "--json", root)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual([(s["step"], s["reason"]) for s in js["steps"]],
                         [(3, "maintenance"), (4, "unspecified")])
        p = run("ls", root)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("REASON", p.out)
        rows = {l.split()[0]: l.split()[-1]   # between header and footer
                for l in p.out.splitlines()[1:-1]}
        self.assertEqual(rows, {"3": "maintenance", "4": "unspecified"})
        p, js = run_json("inspect", "--json", root + "@3")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["reason"], "maintenance")
        p = run("inspect", root + "@3")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertRegex(p.out, r"\n  reason +maintenance\n")

    def test_ls_errors(self):
        p = run("ls", os.path.join(TMP, "no-such-dir"))
        self.assertFails(p, "ls", "no-such-dir")
        self.assertFalse(os.path.exists(os.path.join(TMP, "no-such-dir")))
        p = run("ls", SRC)
        self.assertFails(p, "ls", "not a directory")
        empty = fresh_dir("empty_root")
        os.makedirs(empty)
        p, js = run_json("ls", "--json", empty)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["steps"], [])
        self.assertIsNone(js["latest"])
        self.assertEqual(run("ls", empty).returncode, 0)

    @needs_numpy
    def test_inspect_json(self):
        p, js = run_json("inspect", "--json", ROOT + "@7")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["step"], 7)
        self.assertEqual(js["hosts"], 1)
        self.assertEqual(js["tensor_count"], len(TENSORS))
        by = {t["name"]: t for t in js["tensors"]}
        self.assertEqual(set(by), {t[0] for t in TENSORS})   # exact names
        for name, dt, arr in TENSORS:
            t = by[name]
            self.assertEqual(t["dtype"], CKPT_DTYPE[dt], name)
            self.assertEqual(t["safetensors_dtype"], dt, name)
            self.assertEqual(tuple(t["shape"]), arr.shape, name)
            self.assertEqual(t["nbytes"], len(tensor_bytes(arr)), name)
            self.assertEqual(t["slice_count"], len(t["slices"]))
            self.assertGreaterEqual(t["slice_count"], 1)
        names = [t["name"] for t in js["tensors"]]
        self.assertEqual(names, sorted(names, key=lambda s: s.encode()))
        # Chunk totals include the zero gaps that align each tensor to 64.
        self.assertGreaterEqual(js["raw_bytes"], sum(t["nbytes"] for t in js["tensors"]))
        self.assertEqual(set(js["codecs"]), {"none", "zstd", "float"})
        self.assertEqual(sum(c["chunks"] for c in js["codecs"].values()), js["chunks"])
        self.assertGreaterEqual(sum(c["raw_bytes"] for c in js["codecs"].values()),
                                js["raw_bytes"])
        kinds = {f["kind"] for f in js["files"]}
        self.assertIn("shard", kinds)
        step_dir = os.path.join(ROOT, "step-%020d" % 7)
        for f in js["files"]:
            path = os.path.join(step_dir, f["name"])
            self.assertTrue(os.path.exists(path), f["name"])
            self.assertEqual(os.path.getsize(path), f["size"])
            self.assertRegex(f["xxh3"], r"^[0-9a-f]{16}$")

    @needs_numpy
    def test_inspect_table_escapes(self):
        p = run("inspect", ROOT)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("TENSORS", p.out)
        self.assertIn("CODECS", p.out)
        self.assertIn("FILES", p.out)
        self.assertNotIn("\x1b", p.out)
        self.assertNotIn("\t", p.out)
        self.assertIn("esc\\x1b[31mred", p.out)
        self.assertIn("tab\\there", p.out)
        self.assertIn("new\\nline", p.out)
        self.assertIn("back\\\\slash", p.out)
        self.assertIn("ünïcødé.日本語.😀", p.out)
        self.assertIn("a/b/c.weight", p.out)
        # One line per tensor: the newline in a name did not split a row.
        rows = p.out.split("TENSORS\n", 1)[1].split("\n\n", 1)[0].splitlines()
        self.assertEqual(len(rows), 1 + len(TENSORS))
        for line in rows[1:]:
            self.assertRegex(line, r"^(bool|u8|i8|u16|i16|u32|i32|u64|i64|f16|bf16|"
                                   r"f32|f64|f8e4m3|f8e5m2) ")

    def test_inspect_missing_step(self):
        p = run("inspect", ROOT + "@8")
        self.assertFails(p, "inspect")
        p = run("inspect", os.path.join(TMP, "nothing-here"))
        self.assertFails(p, "inspect", "nothing-here")


class TestVerifyRestore(CkptctlTest):
    def test_verify_ok(self):
        p = run("verify", ROOT + "@7")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertRegex(p.out, r"^OK step 7: \d+ files, \d+ bytes verified\n$")
        self.assertEqual(p.err, "")
        p, js = run_json("verify", "--json", ROOT)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertTrue(js["ok"])
        self.assertEqual(js["step"], 7)
        self.assertGreater(js["files"], 0)
        p, ins = run_json("inspect", "--json", ROOT)
        self.assertEqual(js["files"], len(ins["files"]))
        self.assertEqual(js["bytes"], sum(f["size"] for f in ins["files"]))

    def test_progress_on_tty(self):
        master, slave = pty.openpty()
        try:
            p = subprocess.run([CKPTCTL, "verify", ROOT], stdout=subprocess.PIPE,
                               stderr=slave, timeout=120)
            os.close(slave)
            slave = -1
            err = b""
            while True:
                try:
                    b = os.read(master, 65536)
                except OSError:
                    break
                if not b:
                    break
                err += b
        finally:
            if slave >= 0:
                os.close(slave)
            os.close(master)
        self.assertEqual(p.returncode, 0)
        self.assertIn(b"%", err)
        self.assertIn(b"MB/s", err)
        self.assertIn(b"\r", err)
        self.assertNotIn(b"\n", err)   # a single updating line, then cleared

    @needs_numpy
    def test_restore_corrupt_verify(self):
        out = fresh_dir("restored")
        p = run("restore", ROOT + "@7", "--to", out)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("restored step 7", p.out)
        p = run("verify", out)
        self.assertEqual(p.returncode, 0, p.err)
        exp = os.path.join(TMP, "restored.safetensors")
        self.assertEqual(run("export", out, "-o", exp).returncode, 0)
        self.assertExportMatches(exp, TENSORS, step=7)
        self.assertEqual(run("restore", ROOT, "--to", ROOT).returncode, 1)

        # Flip one byte in the middle of the biggest shard's data.
        shard = shard_files(out, 7)[-1]
        size = os.path.getsize(shard)
        pos = 4096 + (size - 4096) // 2 if size > 8192 else size // 2
        with open(shard, "r+b") as f:
            f.seek(pos)
            b = f.read(1)
            f.seek(pos)
            f.write(bytes([b[0] ^ 0x40]))
        p = run("verify", out)
        self.assertFails(p, "verify", os.path.basename(shard))
        self.assertEqual(p.out, "")
        p, js = run_json("verify", "--json", out + "@7")
        self.assertEqual(p.returncode, 1)
        self.assertFalse(js["ok"])
        self.assertIn(os.path.basename(shard), js["error"])
        p = run("verify", "--all", out)
        self.assertEqual(p.returncode, 1)
        # A verified copy refuses corrupt sources and commits nothing.
        out2 = fresh_dir("restored2")
        p = run("restore", out, "--to", out2)
        self.assertFails(p, "restore")
        if os.path.isdir(out2):
            self.assertEqual(run_json("ls", "--json", out2)[1]["steps"], [])

    def test_verify_all(self):
        root = fresh_dir("verify_all")
        small = os.path.join(TMP, "small.safetensors")
        write_small(small, 3)
        for s in (1, 5, 9):
            self.assertEqual(run("import", small, "%s@%d" % (root, s)).returncode, 0)
        p = run("verify", "--all", root)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(p.out.count("OK step"), 3)
        p, js = run_json("verify", "--all", "--json", root)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertTrue(js["ok"])
        self.assertEqual([r["step"] for r in js["results"]], [1, 5, 9])
        with open(shard_files(root, 5)[-1], "r+b") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 1]))
        p, js = run_json("verify", "--all", "--json", root)
        self.assertEqual(p.returncode, 1)
        self.assertEqual([r["ok"] for r in js["results"]], [True, False, True])
        p = run("verify", root + "@9")
        self.assertEqual(p.returncode, 0, p.err)
        p = run("verify", "--all", fresh_dir("verify_all_missing"))
        self.assertEqual(p.returncode, 1)

    def test_verify_names_damaged_file(self):
        for damage in ("index", "truncate"):
            with self.subTest(damage=damage):
                root = fresh_dir("damage_" + damage)
                self.assertEqual(run("restore", ROOT, "--to", root).returncode, 0)
                sd = os.path.join(root, "step-%020d" % 7)
                if damage == "index":
                    victim = [f for f in os.listdir(sd) if f.endswith(".index")][0]
                    with open(os.path.join(sd, victim), "r+b") as f:
                        f.seek(100)
                        c = f.read(1)
                        f.seek(100)
                        f.write(bytes([c[0] ^ 0x20]))
                else:
                    victim = os.path.basename(shard_files(root, 7)[0])
                    path = os.path.join(sd, victim)
                    os.truncate(path, os.path.getsize(path) - 10)
                p = run("verify", root)
                self.assertFails(p, "verify", victim)
                p = run("verify", root + "@7")
                self.assertFails(p, "verify", victim)

    def test_import_bad_chunk_size(self):
        root = fresh_dir("bad_chunk")
        p = run("import", "--chunk", "1000", SRC, root)
        self.assertFails(p, "import", "chunk")


def dedup_steps(name):
    """Steps 1, 2, 3 of the same tensors imported with CKPT_DEDUP=1:
    steps 2 and 3 refer to step 1's bytes."""
    src = fresh_dir(name)
    f = os.path.join(TMP, name + ".safetensors")
    write_small(f, 6)
    for step in (1, 2, 3):
        p = run("import", "--chunk", "64K", f, "%s@%d" % (src, step),
                env={"CKPT_DEDUP": "1"})
        if p.returncode != 0:
            raise AssertionError("import @%d: %s" % (step, p.err))
    return src


class TestCopyDeduplicated(CkptctlTest):
    """A deduplicated step is copied after the older step it refers to,
    which is copied first only where the destination lacks it."""

    def test_restore_copies_base_first(self):
        src = dedup_steps("dd-src")
        dst = fresh_dir("dd-dst")
        p = run("restore", src + "@3", "--to", dst)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("restored step 1 to", p.out)
        self.assertIn("restored step 3 to", p.out)
        self.assertNotIn("step 2", p.out)
        self.assertLess(p.out.index("step 1"), p.out.index("step 3"))
        for step in (1, 3):
            v = run("verify", "%s@%d" % (dst, step))
            self.assertEqual(v.returncode, 0, v.err)
        # step 2 refers to step 1 too, which dst now holds: copied alone
        p, js = run_json("restore", "--json", src + "@2", "--to", dst)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["step"], 2)
        self.assertEqual(js["copied_first"], [])
        dst2 = fresh_dir("dd-dst2")
        p, js = run_json("restore", "--json", src + "@3", "--to", dst2)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual((js["step"], js["copied_first"]), (3, [1]))
        self.assertEqual(run("verify", dst2 + "@3").returncode, 0)

    def test_base_that_differs_is_not_replaced(self):
        src = dedup_steps("dd-src2")
        dst = fresh_dir("dd-other")
        f = os.path.join(TMP, "dd-other.safetensors")
        write_small(f, 2)
        p = run("import", "--chunk", "64K", f, dst + "@1")
        self.assertEqual(p.returncode, 0, p.err)
        # dst's step 1 is another checkpoint: step 3 is refused, and
        # dst's step 1 stays as it was
        p = run("restore", src + "@3", "--to", dst)
        self.assertFails(p, "restore", "refers to step 1")
        self.assertEqual(run("verify", dst + "@1").returncode, 0)
        self.assertNotEqual(run("verify", dst + "@3").returncode, 0)


class TestGcAndLocations(CkptctlTest):
    def test_gc(self):
        root = fresh_dir("gc")
        small = os.path.join(TMP, "gc_small.safetensors")
        write_small(small, 2)
        for s in range(1, 7):
            self.assertEqual(run("import", small, "%s@%d" % (root, s)).returncode, 0)

        # uncommitted debris older than the newest step: gc removes it
        debris = os.path.join(root, "step-%020d" % 0)
        os.mkdir(debris)
        with open(os.path.join(debris, "h00000-f000.shard.tmp"), "wb") as f:
            f.write(b"debris")

        def steps():
            return [s["step"] for s in run_json("ls", "--json", root)[1]["steps"]]

        p, js = run_json("gc", "--json", "--dry-run", root, "--keep", "2",
                         "--keep-every", "3")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertTrue(js["dry_run"])
        self.assertEqual(js["removed_steps"], [1, 2, 4])
        self.assertEqual(js["removed_debris_steps"], [0])
        self.assertEqual(js["kept_steps"], [3, 5, 6])
        self.assertEqual(js["steps_removed"], 3)
        self.assertEqual(js["debris_removed"], 1)
        self.assertEqual(steps(), [1, 2, 3, 4, 5, 6])
        self.assertTrue(os.path.isdir(debris))

        p = run("gc", "--dry-run", root, "--keep", "2", "--keep-every", "3")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(
            [l for l in p.out.splitlines() if l.startswith("would remove step ")],
            ["would remove step 1", "would remove step 2",
             "would remove step 4"])
        self.assertIn("would remove uncommitted step 0\n", p.out)
        self.assertIn("dry run: would remove 3 steps, 1 debris item,", p.out)
        self.assertEqual(steps(), [1, 2, 3, 4, 5, 6])

        p = run("gc", root, "--keep", "2", "--keep-every", "3")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(
            [l for l in p.out.splitlines() if l.startswith("removed step ")],
            ["removed step 1", "removed step 2", "removed step 4"])
        self.assertIn("removed uncommitted step 0\n", p.out)
        self.assertIn("removed 3 steps, 1 debris item,", p.out)
        self.assertEqual(steps(), [3, 5, 6])
        self.assertFalse(os.path.exists(debris))

        p, js = run_json("gc", "--json", root, "--keep", "1")
        self.assertEqual(p.returncode, 0, p.err)
        self.assertFalse(js["dry_run"])
        self.assertEqual(js["removed_steps"], [3, 5])
        self.assertEqual(js["removed_debris_steps"], [])
        self.assertEqual(js["kept_steps"], [6])
        self.assertEqual(steps(), [6])
        p, js = run_json("gc", "--json", root, "--keep", "0")
        self.assertEqual(js["removed_steps"], [])
        self.assertEqual(js["kept_steps"], [6])
        self.assertEqual(run("verify", root).returncode, 0)
        p = run("gc", os.path.join(TMP, "gc-missing"), "--keep", "1")
        self.assertFails(p, "gc", "gc-missing")

    def test_at_in_directory_names(self):
        base = fresh_dir("at")
        small = os.path.join(TMP, "at_small.safetensors")
        write_small(small, 2)
        d1 = os.path.join(base, "user@host")      # '@' not followed by digits
        d2 = os.path.join(base, "run@2x")
        d3 = os.path.join(base, "v@1")            # needs an explicit step
        self.assertEqual(run("import", small, d1 + "@4").returncode, 0)
        self.assertEqual(run("import", small, d2).returncode, 0)
        self.assertEqual(run("import", small, d3 + "@9").returncode, 0)
        self.assertTrue(os.path.isdir(os.path.join(d1, "step-%020d" % 4)))
        self.assertTrue(os.path.isdir(os.path.join(d2, "step-%020d" % 0)))
        self.assertTrue(os.path.isdir(os.path.join(d3, "step-%020d" % 9)))
        self.assertEqual(run("verify", d1).returncode, 0)
        self.assertEqual(run("verify", d1 + "@4").returncode, 0)
        self.assertEqual(run("verify", d2).returncode, 0)
        self.assertEqual(run("verify", d3 + "@9").returncode, 0)
        p = run("verify", d3)   # parsed as directory ".../v" step 1
        self.assertEqual(p.returncode, 1)
        # ls and gc take a plain directory: '@' is never a step there.
        self.assertEqual(run_json("ls", "--json", d3)[1]["latest"], 9)

    def test_gs_unreachable(self):
        # nothing listens there: a clear failure naming the location
        env = {"STORAGE_EMULATOR_HOST": "127.0.0.1:1",
               "CKPT_GCS_DEADLINE": "2"}
        p = run("ls", "gs://bucket/prefix", env=env)
        self.assertFails(p, "ls", "gs://bucket/prefix")
        p = run("verify", "gs://bucket/prefix@5", env=env)
        self.assertFails(p, "verify", "gs://bucket/prefix")


FAKE_GCS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "servers", "fake_gcs.py")


@unittest.skipUnless(os.path.exists(FAKE_GCS), "no %s" % FAKE_GCS)
class TestCloudStorage(CkptctlTest):
    """Every location-taking command on gs:// against the loopback fake
    server (tests/servers/fake_gcs.py), plus push and restore both ways."""

    BUCKET = "ctl"

    @classmethod
    def setUpClass(cls):
        cls.srv = testutil.Server(FAKE_GCS, "--bucket", cls.BUCKET)
        try:
            cls.srv.start()
        except RuntimeError as e:
            raise unittest.SkipTest("%s (%s lacks something)"
                                    % (e, sys.executable))
        cls.url = cls.srv.url
        cls.env = {"STORAGE_EMULATOR_HOST": cls.url}

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def gs(self, prefix):
        return "gs://%s/%s" % (self.BUCKET, prefix)

    def ctl(self, *args):
        return run(*args, env=self.env)

    def put_object(self, name, data):
        import urllib.parse
        import urllib.request
        url = "%s/upload/storage/v1/b/%s/o?uploadType=media&name=%s" % (
            self.url, self.BUCKET, urllib.parse.quote(name, safe=""))
        req = urllib.request.Request(url, data=data, method="POST")
        with urllib.request.urlopen(req) as r:
            self.assertEqual(r.status, 200)

    def test_push_and_read_commands(self):
        gs = self.gs("run1")
        p = self.ctl("push", ROOT + "@7", gs)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("pushed step 7 to %s" % gs, p.out)
        p, js = run_json("ls", "--json", gs, env=self.env)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual([s["step"] for s in js["steps"]], [7])
        self.assertEqual(js["latest"], 7)
        loc_js = run_json("inspect", "--json", ROOT + "@7")[1]
        p, gs_js = run_json("inspect", "--json", gs, env=self.env)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(gs_js["tensors"], loc_js["tensors"])
        p = self.ctl("verify", gs + "@7")
        self.assertEqual(p.returncode, 0, p.err)
        # a committed step is not pushed twice
        p = self.ctl("push", ROOT + "@7", gs)
        self.assertFails(p, "push", "already committed")
        if np is not None:
            out = os.path.join(TMP, "gs-export.safetensors")
            p = self.ctl("export", gs, "-o", out)
            self.assertEqual(p.returncode, 0, p.err)
            self.assertExportMatches(out, TENSORS, 7)

    def test_restore_both_ways(self):
        gs = self.gs("run2")
        p, js = run_json("restore", "--json", ROOT + "@7", "--to", gs,
                         env=self.env)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["step"], 7)
        self.assertEqual(js["destination"], gs)
        down = fresh_dir("from-gs")
        p = self.ctl("restore", gs, "--to", down)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("restored step 7", p.out)
        self.assertEqual(run("verify", down).returncode, 0)
        src = os.path.join(ROOT, "step-%020d" % 7)
        dst = os.path.join(down, "step-%020d" % 7)
        self.assertEqual(sorted(os.listdir(src)), sorted(os.listdir(dst)))
        for f in os.listdir(src):
            with open(os.path.join(src, f), "rb") as a, \
                    open(os.path.join(dst, f), "rb") as b:
                self.assertEqual(a.read(), b.read(), f)
        # gs:// to gs://, and onto itself refused
        p = self.ctl("restore", gs + "@7", "--to", self.gs("run2b"))
        self.assertEqual(p.returncode, 0, p.err)
        p = self.ctl("restore", gs, "--to", gs)
        self.assertFails(p, "restore", "same location")

    def test_corrupt_object_detected(self):
        gs = self.gs("run3")
        self.assertEqual(self.ctl("push", ROOT + "@7", gs).returncode, 0)
        name = "step-%020d/h00000-f000.shard" % 7
        with open(os.path.join(ROOT, name), "rb") as f:
            data = bytearray(f.read())
        data[len(data) // 2] ^= 0x20
        self.put_object("run3/" + name, bytes(data))
        p = self.ctl("verify", gs)
        self.assertFails(p, "verify", "h00000-f000.shard", "offset")
        down = fresh_dir("from-gs-bad")
        p = self.ctl("restore", gs, "--to", down)
        self.assertFails(p, "restore", "h00000-f000.shard")
        self.assertEqual(run("ls", down).returncode, 0)
        self.assertIn("no committed steps", run("ls", down).out)

    def test_run_resumes_from_newer_of_dir_and_remote(self):
        """ckptctl run --remote: CKPT_RESUME_STEP is the newer of the
        directory's and the bucket's latest step (a notice's save the
        planner sent straight to the bucket is there only), and
        CKPT_RESUME_LOCATION says where it is."""
        gs = self.gs("run-remote")
        small = os.path.join(TMP, "run_small.safetensors")
        write_small(small, 2)
        local = fresh_dir("run-remote-local")
        other = fresh_dir("run-remote-other")
        out = os.path.join(TMP, "run-remote.env")
        show = ("echo \"$CKPT_RESUME_STEP ${CKPT_RESUME_LOCATION-unset} "
                "$CKPT_REMOTE\" > %s" % out)

        def resumed():
            p = self.ctl("run", "-n", "0", "-l", local, "-r", gs, "--",
                         "sh", "-c", show)
            self.assertEqual(p.returncode, 0, p.err)
            with open(out) as f:
                return f.read().split()

        # nothing anywhere
        self.assertEqual(resumed(), ["unset", gs])
        for step in (3, 5):
            self.assertEqual(run("import", small, "%s@%d" % (local, step))
                             .returncode, 0)
        self.assertEqual(resumed(), ["5", local, gs])
        # the bucket newer: step 8 only there
        self.assertEqual(run("import", small, "%s@8" % other).returncode, 0)
        p = self.ctl("push", "%s@8" % other, gs)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(resumed(), ["8", gs, gs])
        p = self.ctl("run", "-n", "0", "-l", local, "-r", gs, "--",
                     "true")
        self.assertIn("resuming after step 8 in %s" % gs, p.err)
        # the directory newer again
        self.assertEqual(run("import", small, "%s@9" % local).returncode, 0)
        self.assertEqual(resumed(), ["9", local, gs])
        # --remote needs a directory location and a gs:// remote
        self.assertUsage(self.ctl("run", "-r", gs, "--", "true"))
        self.assertUsage(self.ctl("run", "-l", local, "-r", other, "--",
                                  "true"))
        self.assertUsage(self.ctl("run", "-l", gs, "-r", gs, "--", "true"))

    def test_gc_on_bucket(self):
        gs = self.gs("run4")
        small = os.path.join(TMP, "gc_small.safetensors")
        write_small(small, 2)
        local = fresh_dir("gc-local")
        for step in (1, 2, 3, 4):
            self.assertEqual(run("import", small, "%s@%d" % (local, step))
                             .returncode, 0)
            p = self.ctl("push", "%s@%d" % (local, step), gs)
            self.assertEqual(p.returncode, 0, p.err)
        # debris: an uncommitted step below the newest committed one
        self.put_object("run4/step-%020d/h00000-f000.shard" % 0, b"debris")
        p, js = run_json("gc", "--json", gs, "--keep", "2", env=self.env)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertEqual(js["removed_steps"], [1, 2])
        self.assertEqual(js["removed_debris_steps"], [0])
        self.assertEqual(js["kept_steps"], [3, 4])
        p, js = run_json("ls", "--json", gs, env=self.env)
        self.assertEqual([s["step"] for s in js["steps"]], [3, 4])
        self.assertEqual(self.ctl("verify", gs + "@3").returncode, 0)

    def test_push_deduplicated(self):
        src = dedup_steps("dd-push")
        gs = self.gs("dedup")
        p = self.ctl("push", src + "@3", gs)
        self.assertEqual(p.returncode, 0, p.err)
        self.assertIn("pushed step 1 to %s" % gs, p.out)
        self.assertIn("pushed step 3 to %s" % gs, p.out)
        for step in (1, 3):
            v = self.ctl("verify", "%s@%d" % (gs, step))
            self.assertEqual(v.returncode, 0, v.err)

    def test_push_usage(self):
        self.assertUsage(self.ctl("push", ROOT))
        self.assertUsage(self.ctl("push", ROOT, self.gs("x"), "y"))
        self.assertUsage(self.ctl("push", self.gs("a"), self.gs("b")))
        self.assertUsage(self.ctl("push", ROOT, os.path.join(TMP, "d")))
        p = self.ctl("import", SRC, self.gs("imp"))
        self.assertFails(p, "import", "push")


# --------------------------------------------------------------------------

def main():
    global CKPTCTL
    if len(sys.argv) < 2:
        print("usage: test_ckptctl.py /path/to/ckptctl", file=sys.stderr)
        return 2
    CKPTCTL = os.path.abspath(sys.argv[1])
    if not os.access(CKPTCTL, os.X_OK):
        print("not executable: %s" % CKPTCTL, file=sys.stderr)
        return 1
    if np is None:
        print("%s cannot import numpy: the tests that need it are skipped"
              % sys.executable, flush=True)
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    skipped = len(result.skipped)
    passed = max(0, result.testsRun - failed - skipped)
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    if not result.wasSuccessful() or failed:
        return 1
    return 0 if passed else 77


if __name__ == "__main__":
    sys.exit(main())
