"""workload.py - the synthetic model state every contender saves.

Design note. A state is planned from (size, dtype, seed, small): a
transformer-like shape mix with
  - a few very large matrices: embedding and LM head (16 d x d each,
    together 32 d^2 of the 192 d^2 parameters);
  - many medium ones: 16 layers of q, k, v, o (d x d), up and gate
    (2d x d each) and down (d x 2d): 10 d^2 a layer;
  - thousands of small vectors (`small`, default 2048, spread over the
    layers): norm weights (1 + N(0, 0.02)) and biases (N(0, 0.02)) of d
    elements.
d (a multiple of 32) is picked so the whole state is close to `size`
bytes (within a few percent from 256 MiB up; the actual bytes are
reported). Matrices hold N(0, 0.02) with one value in 10^4 an outlier
(N(0, 1)), as trained weights have. With dtype f32 the state is that of
mixed-precision training: f32 master weights plus Adam's exp_avg (N(0,
1e-3)) and exp_avg_sq (squares of N(0, 1e-3), times 1e-1) for each, so
the parameters are a third of `size`. Every tensor is drawn from its own
generator (seed, index): a plan is a pure function of its arguments.

The state is written once per size as a safetensors file (write_st):
bench_ops.c and every peer read it from there (untimed), so all of them
save exactly the same bytes. bf16 values are kept in numpy as uint16
(numpy has no bf16); torch views them as torch.bfloat16.

Debian 12 has no safetensors package: write_st / read_st are this
harness's own writer and reader of the format (an 8-byte little-endian
header length, a JSON header of name -> dtype, shape, data_offsets, then
the data), used both to make the workload and as the "safetensors" peer.
"""

import json
import math
import os
import struct

import numpy as np

LAYERS = 16
ST_DTYPE = {"bf16": "BF16", "f32": "F32"}


def plan(size, dtype, small=2048):
    """[(name, shape, kind)] for a state of about `size` bytes."""
    esz = 2 if dtype == "bf16" else 4
    params = size // esz // (3 if dtype == "f32" else 1)
    d = max(32, int(math.sqrt(max(params - small * 64, 0) / 192)) // 32 * 32)
    out = [("embed.weight", (16 * d, d), "w")]
    per = -(-small // LAYERS)
    for i in range(LAYERS):
        p = "layers.%d." % i
        for n in ("q", "k", "v", "o"):
            out.append((p + "attn.%s.weight" % n, (d, d), "w"))
        out.append((p + "mlp.up.weight", (2 * d, d), "w"))
        out.append((p + "mlp.gate.weight", (2 * d, d), "w"))
        out.append((p + "mlp.down.weight", (d, 2 * d), "w"))
        for k in range(per):
            kind = "norm" if k % 2 == 0 else "w"
            out.append((p + "vec%d.%s" % (k // 2, "weight" if kind == "norm"
                                         else "bias"), (d,), kind))
    out.append(("head.weight", (16 * d, d), "w"))
    if dtype == "f32":
        out = out + [("optim.exp_avg." + n, s, "m") for n, s, _k in out] + \
            [("optim.exp_avg_sq." + n, s, "v") for n, s, _k in out]
    return out


def bf16(x):
    """float32 array -> bf16 bits (uint16), rounded to nearest even."""
    u = x.view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def tensor(seed, index, shape, kind, dtype):
    g = np.random.default_rng([seed, index])
    n = int(np.prod(shape))
    if kind == "m":
        x = g.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
    elif kind == "v":
        x = g.standard_normal(n, dtype=np.float32) * np.float32(1e-3)
        x = x * x * np.float32(0.1)
    else:
        x = g.standard_normal(n, dtype=np.float32) * np.float32(0.02)
        if kind == "norm":
            x += np.float32(1.0)
        else:
            k = max(1, n // 10000)
            x[g.integers(0, n, k)] = g.standard_normal(k, dtype=np.float32)
    x = x.reshape(shape)
    return bf16(x) if dtype == "bf16" else x


def generate(size, dtype, seed, small=2048):
    """{name: numpy array} (bf16 as uint16), in plan order."""
    return {n: tensor(seed, i, s, k, dtype)
            for i, (n, s, k) in enumerate(plan(size, dtype, small))}


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_st(path, state, dtype, durable=True):
    """Writes `state` as a safetensors file the way a user's save_file
    does (header, then each tensor's bytes in order), fsync'd."""
    hdr, off = {}, 0
    for name, a in state.items():
        hdr[name] = {"dtype": ST_DTYPE[dtype], "shape": list(a.shape),
                     "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in state.values():
            f.write(memoryview(np.ascontiguousarray(a)).cast("B"))
        if durable:
            f.flush()
            os.fsync(f.fileno())
    if durable:
        fsync_path(os.path.dirname(os.path.abspath(path)))


def read_st(path):
    """{name: numpy array} from a safetensors file of BF16/F32 tensors,
    each read into its own array (as load_file gives separate tensors)."""
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
        for name, v in hdr.items():
            if name == "__metadata__":
                continue
            b, e = v["data_offsets"]
            a = np.empty(v["shape"], dtype=np.uint16 if v["dtype"] == "BF16"
                         else np.float32)
            f.seek(8 + n + b)
            if f.readinto(memoryview(a).cast("B")) != e - b:
                raise IOError("%s: short read of %s" % (path, name))
            warm(a)
            out[name] = a
    return out


def warm(a):
    """Reads a byte of every page of array `a` from user space. The kernel
    wrote them, and on some VMs the first user-mode touch of such a page
    is slow; a training loop's state is warm (bench_ops.c warm() does the
    same for the C API, and says why it is done again after opening)."""
    if a.nbytes:
        int(np.frombuffer(a, dtype=np.uint8)[::4096].sum())


def st_bytes(path):
    """Bytes of tensor data in a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    return sum(v["data_offsets"][1] - v["data_offsets"][0]
               for k, v in hdr.items() if k != "__metadata__")


def st_dtype(path):
    """'bf16' or 'f32': the first tensor's dtype in a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(n))
    for name, v in hdr.items():
        if name != "__metadata__":
            return "bf16" if v["dtype"] == "BF16" else "f32"
    return "bf16"


def picks(names):
    """(one, slice): the tensors the one-tensor and slice loads read:
    layer 0's q projection (its size grows with d only) and the
    embedding (the largest matrix)."""
    return "layers.0.attn.q.weight", "embed.weight"
