#!/usr/bin/python3
"""bench_python.py - what the Python binding costs over the C API.

    CKPT_LIB=build/engine/libckpt.so PYTHONPATH=python \\
        /usr/bin/python3 bench/bench_python.py --dir /var/tmp/b [--size 1G]

Design note. Two measurements, each printed beside what it compares to:
  1. A bf16 transformer-like state of torch tensors (d_model 1024, about
     nine tensors a layer, values N(0, 0.02), --size bytes in all) saved
     through ckpt.Checkpointer as bench_core saves its state through
     ckpt_save (same handle settings: pool = 1.125 x size, codec none
     then float; one save right after opening, then the timed one):
     save() blocking time, save to durable (save + wait), and restore()
     (page cache dropped when permitted). Compare with `bench_core --dir
     DIR --size 1G --no-rss` run the same way (the C path).
  2. The Python-side overhead per save of a state of --small (1,000)
     small tensors: flattening the state and building the ckpt_tensor
     array, against the ckpt_save_ex call itself on that array, median
     of --reps saves.
Public API only (through the ckpt package).
"""

import argparse
import ctypes
import os
import shutil
import statistics
import sys
import time

import numpy as np
import torch

import ckpt
from ckpt import _lib

MIB = 1 << 20


def size_arg(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(float(s.rstrip("kKmMgG")) * mult)


def transformer(size, d=1024):
    g = torch.Generator().manual_seed(1)
    state, total, layer = {}, 0, 0
    state["embed"] = torch.empty(8 * d, d, dtype=torch.bfloat16)
    total += state["embed"].numel() * 2
    while total < size:
        lyr = {}
        for name, shape in (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)),
                            ("wo", (d, d)), ("up", (3 * d, d)),
                            ("down", (d, 3 * d)), ("ln1", (d,)),
                            ("ln2", (d,)), ("bias", (3 * d,))):
            lyr[name] = torch.empty(shape, dtype=torch.bfloat16)
            total += lyr[name].numel() * 2
        state["layer%d" % layer] = lyr
        layer += 1
    for t in tensors(state):
        t.normal_(0, 0.02, generator=g)
    return state, total


def tensors(state):
    for v in state.values():
        if isinstance(v, dict):
            yield from tensors(v)
        else:
            yield v


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def big(args):
    state, total = transformer(args.size)
    n = sum(1 for _ in tensors(state))
    print("state %.2f GiB in %d bf16 torch tensors, pool %.2f GiB"
          % (total / (1 << 30), n, total * 1.125 / (1 << 30)))
    for codec in ("none", "float"):
        root = os.path.join(args.dir, "big-" + codec)
        shutil.rmtree(root, ignore_errors=True)
        t0 = time.perf_counter()
        with ckpt.Checkpointer(root, watch=False, codec=codec,
                               staging_bytes=int(total * 1.125)) as c:
            t_open = time.perf_counter() - t0
            c.save(1001, state, wait=True)
            t0 = time.perf_counter()
            c.save(1, state)
            t1 = time.perf_counter()
            c.wait()
            t2 = time.perf_counter()
        dropped = drop_caches()
        t3 = time.perf_counter()
        got = ckpt.load(root, 1)
        t4 = time.perf_counter()
        assert torch.equal(got["layer0"]["wq"], state["layer0"]["wq"])
        print("codec %-5s  save blocking %.3f s   save to durable %.1f MiB/s"
              "   restore %.1f MiB/s%s   (open %.2f s)"
              % (codec, t1 - t0, total / (t2 - t0) / MIB,
                 total / (t4 - t3) / MIB,
                 "" if dropped else " (page cache not dropped)", t_open))
        shutil.rmtree(root)


def small(args):
    g = torch.Generator().manual_seed(2)
    per = 10
    state = {"layer%d" % i: {"p%d" % j: torch.randn(256, generator=g)
                             for j in range(per)}
             for i in range(args.small // per)}
    root = os.path.join(args.dir, "small")
    shutil.rmtree(root, ignore_errors=True)
    flat, call, total = [], [], []
    with ckpt.Checkpointer(root, watch=False, codec="none",
                           staging_bytes=64 * MIB) as c:
        opts = _lib.SaveOpts()
        _lib.lib.ckpt_save_opts_default(ctypes.byref(opts))
        for step in range(1, args.reps + 1):
            t0 = time.perf_counter()
            c.save(2 * step, state)
            total.append(time.perf_counter() - t0)
            c.wait()
            t0 = time.perf_counter()
            arr, n, keep = ckpt._tensor_array(state)
            t1 = time.perf_counter()
            rc = _lib.lib.ckpt_save_ex(c._h, 2 * step + 1, arr, n,
                                       ctypes.byref(opts))
            t2 = time.perf_counter()
            assert rc == 0, rc
            assert _lib.lib.ckpt_wait(c._h) == 0  # not c.wait(): not its save
            flat.append(t1 - t0)
            call.append(t2 - t1)
            del keep
        c.wait()
    shutil.rmtree(root)
    med = statistics.median
    print("%d small tensors (1 KiB each), median of %d saves: save() %.2f ms"
          " = Python side (flatten + ckpt_tensor array) %.2f ms + "
          "ckpt_save_ex %.2f ms; %.1f us of Python per tensor"
          % (args.small, args.reps, med(total) * 1e3, med(flat) * 1e3,
             med(call) * 1e3, med(flat) / args.small * 1e6))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--size", type=size_arg, default=1 << 30)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    print("ckpt %s (%s), torch %s, numpy %s" % (ckpt.version(), _lib.path,
                                              torch.__version__,
                                              np.__version__))
    if not args.skip_big:
        big(args)
    small(args)


if __name__ == "__main__":
    sys.exit(main())
