#!/usr/bin/python3
"""peers.py - one contender's save and load, in a process of its own.

    peers.py CASE --state FILE --dir DIR [--codec C] [--pool B]
             [--url URL --object NAME]

run.py starts one of these per contender and repetition, so each peak
RSS (VmHWM, reset between save and load through /proc/self/clear_refs)
is that contender's own. Prints one JSON object: save_s, load_s (page
cache dropped first when root), rss_save, rss_load, stored bytes, and
for "ours-py" the blocking time of its save (block_s). The state is read
from the workload file first (untimed); every load is compared with it
(tar-zstd and gcloud, which run other programs, compare files instead
and never hold the state, whose RSS their children would inherit).

Cases, each made durable (fsync of the files and their directory) as
ckpt's save is:
  torch        torch.save of the state_dict (bf16 as torch.bfloat16) /
               torch.load
  numpy        np.save of each array into a directory / np.load (bf16
               stored as uint16: numpy has no bf16)
  safetensors  workload.write_st / read_st (the harness's own writer and
               reader of the format; Debian 12 has no safetensors)
  tar-zstd     tar -cf - of the safetensors file | zstd -T0 -1, fsync /
               zstd -d -T0 | tar -x, fsync (the archive a user ships)
  gcloud       gcloud storage cp FILE gs://... / cp gs://... FILE against
               the loopback server (--url), download fsync'd
  ours-py      ckpt.Checkpointer(dir, codec=...).save + wait / ckpt.load,
               through the Python binding (one save right after opening,
               then the timed one, as bench_ops does; then a borrowed
               one: borrow_block_s, borrow_release_s)

torch and ours-py then load again into the arrays their first load made
(memory already touched, as a model built before its restore is), page
cache dropped: load_into_s and its peak RSS rss_into. ours-py reads in
place (ckpt.load(into=)); torch loads and copies, as
model.load_state_dict(torch.load(path)) does.
"""

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload  # noqa: E402
from limits import drop_caches  # noqa: E402


TOOLS = ("tar-zstd", "gcloud")  # peers that are other programs


def hwm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def hwm_reset():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def rss(case, own):
    """Peak RSS: the process's own (VmHWM), or for the peers that run
    tools (tar, zstd, gcloud) the largest of those tools."""
    import resource
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return kids if case in TOOLS else max(own, kids)


def fsync_tree(path):
    for root, _dirs, files in os.walk(path):
        for n in files:
            workload.fsync_path(os.path.join(root, n))
        workload.fsync_path(root)
    workload.fsync_path(os.path.dirname(os.path.abspath(path)))


def du(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, n))
               for r, _d, fs in os.walk(path) for n in fs)


def check(state, got):
    if set(state) != set(got):
        raise SystemExit("peers.py: the loaded state has other names")
    for k, a in state.items():
        b = got[k]
        if b.dtype != a.dtype and b.dtype.itemsize == a.dtype.itemsize:
            b = b.view(a.dtype)
        if b.shape != a.shape or not np.array_equal(a, b):
            raise SystemExit("peers.py: tensor %s differs" % k)


def same_file(want, got):
    if not filecmp.cmp(want, got, shallow=False):
        raise SystemExit("peers.py: %s differs from %s" % (got, want))


def as_torch(state, dtype):
    import torch
    out = {}
    for k, a in state.items():
        if dtype == "bf16":  # torch has no uint16: through int16
            out[k] = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        else:
            out[k] = torch.from_numpy(a)
    return out


def from_torch(d):
    import torch
    return {k: (t.view(torch.int16).numpy().view(np.uint16)
                if t.dtype == torch.bfloat16 else t.numpy())
            for k, t in d.items()}


def case_torch(a, state, dtype, res):
    import torch
    path = os.path.join(a.dir, "model.pt")
    sd = as_torch(state, dtype)
    t0 = time.monotonic()
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
    workload.fsync_path(a.dir)
    res["save_s"] = time.monotonic() - t0
    yield path
    t0 = time.monotonic()
    got = torch.load(path)
    res["load_s"] = time.monotonic() - t0
    check(state, from_torch(got))
    yield None
    # a restart into a model already built: torch.load, then
    # load_state_dict's copy_ into its (touched) parameters
    res["into_dropped"] = drop_caches()
    t0 = time.monotonic()
    sd = torch.load(path)
    with torch.no_grad():
        for k, t in got.items():
            t.copy_(sd[k])
    del sd
    res["load_into_s"] = time.monotonic() - t0
    check(state, from_torch(got))


def case_numpy(a, state, dtype, res):
    d = os.path.join(a.dir, "npy")
    os.makedirs(d)
    t0 = time.monotonic()
    for k, arr in state.items():
        np.save(os.path.join(d, k + ".npy"), arr)
    fsync_tree(d)
    res["save_s"] = time.monotonic() - t0
    yield d
    t0 = time.monotonic()
    got = {k: np.load(os.path.join(d, k + ".npy")) for k in state}
    res["load_s"] = time.monotonic() - t0
    check(state, got)


def case_safetensors(a, state, dtype, res):
    path = os.path.join(a.dir, "model.safetensors")
    t0 = time.monotonic()
    workload.write_st(path, state, dtype)
    res["save_s"] = time.monotonic() - t0
    yield path
    t0 = time.monotonic()
    got = workload.read_st(path)
    res["load_s"] = time.monotonic() - t0
    check(state, got)


def sh(cmd):
    subprocess.run(cmd, shell=True, check=True, stdout=subprocess.DEVNULL)


def case_tar_zstd(a, state, dtype, res):
    out = os.path.join(a.dir, "model.tar.zst")
    src = os.path.abspath(a.state)
    t0 = time.monotonic()
    sh("tar -cf - -C '%s' '%s' | zstd -q -T0 -1 -o '%s'"
       % (os.path.dirname(src), os.path.basename(src), out))
    workload.fsync_path(out)
    workload.fsync_path(a.dir)
    res["save_s"] = time.monotonic() - t0
    yield out
    x = os.path.join(a.dir, "x")
    os.makedirs(x)
    t0 = time.monotonic()
    sh("zstd -q -d -T0 -c '%s' | tar -xf - -C '%s'" % (out, x))
    fsync_tree(x)
    res["load_s"] = time.monotonic() - t0
    same_file(a.state, os.path.join(x, os.path.basename(src)))


def gcloud_env(a):
    cfg = os.path.join(a.dir, "gcloud-cfg")
    tok = os.path.join(a.dir, "token")
    os.makedirs(cfg, exist_ok=True)
    with open(tok, "w") as f:
        f.write("dummy-access-token\n")
    env = dict(os.environ, CLOUDSDK_CONFIG=cfg,
               CLOUDSDK_CORE_DISABLE_PROMPTS="1",
               HTTPS_PROXY="http://127.0.0.1:9", NO_PROXY="127.0.0.1,localhost")
    env.pop("STORAGE_EMULATOR_HOST", None)
    for k, v in (("core/project", "ckpt-bench"),
                 ("auth/access_token_file", tok),
                 ("api_endpoint_overrides/storage", a.url + "/storage/v1/"),
                 ("core/disable_usage_reporting", "true"),
                 ("component_manager/disable_update_check", "true")):
        subprocess.run(["gcloud", "config", "set", k, v], env=env,
                       check=True, capture_output=True)
    return env


def case_gcloud(a, state, dtype, res):
    env = gcloud_env(a)
    obj = "gs://" + a.object

    def cp(src, dst):
        p = subprocess.run(["gcloud", "storage", "cp", src, dst], env=env,
                           capture_output=True, text=True)
        if p.returncode:
            raise SystemExit("peers.py: gcloud storage cp: " + p.stderr[-800:])
    t0 = time.monotonic()
    cp(a.state, obj)
    res["save_s"] = time.monotonic() - t0
    yield None
    dst = os.path.join(a.dir, "down.safetensors")
    t0 = time.monotonic()
    cp(obj, dst)
    workload.fsync_path(dst)
    workload.fsync_path(a.dir)
    res["load_s"] = time.monotonic() - t0
    same_file(a.state, dst)


def case_ours_py(a, state, dtype, res):
    import ckpt
    try:
        st = as_torch(state, dtype)
    except ImportError:  # no torch: bf16 goes as uint16
        st = state
    root = os.path.join(a.dir, "ours-py")
    kw = {"codec": a.codec, "watch": False}
    if a.pool:
        kw["staging_bytes"] = a.pool
    with ckpt.Checkpointer(root, **kw) as c:
        # the loop trains between opening and its first save (bench_ops.c)
        for v in state.values():
            workload.warm(v)
        t0 = time.monotonic()
        c.save(1, st)
        res["first_block_s"] = time.monotonic() - t0
        c.wait()
        t0 = time.monotonic()
        c.save(2, st)
        res["block_s"] = time.monotonic() - t0
        c.wait()
        res["save_s"] = time.monotonic() - t0
        t0 = time.monotonic()  # borrow mode: no staging copy
        c.save(3, st, borrow=True)
        res["borrow_block_s"] = time.monotonic() - t0
        c.wait_released()
        res["borrow_release_s"] = time.monotonic() - t0
        c.wait()
    yield root
    t0 = time.monotonic()
    got = ckpt.load(root, 2)
    res["load_s"] = time.monotonic() - t0
    check(state, from_torch(got) if st is not state else got)
    yield None
    # the same into a model already built: read in place (into=)
    res["into_dropped"] = drop_caches()
    t0 = time.monotonic()
    again = ckpt.load(root, 2, into=got)
    res["load_into_s"] = time.monotonic() - t0
    if any(again[k] is not got[k] for k in got):
        raise SystemExit("peers.py: into= did not read in place")
    check(state, from_torch(got) if st is not state else got)


CASES = {"torch": case_torch, "numpy": case_numpy,
         "safetensors": case_safetensors, "tar-zstd": case_tar_zstd,
         "gcloud": case_gcloud, "ours-py": case_ours_py}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=sorted(CASES))
    p.add_argument("--state", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--codec", default="float")
    p.add_argument("--pool", type=int, default=0)
    p.add_argument("--url", default="")
    p.add_argument("--object", default="")
    a = p.parse_args()
    need = {"torch": "torch", "ours-py": "ckpt"}.get(a.case)
    tool = {"tar-zstd": "zstd", "gcloud": "gcloud"}.get(a.case)
    try:
        if need:
            __import__(need)
    except ImportError as e:
        print("peers.py: %s" % e, file=sys.stderr)
        sys.exit(77)
    if tool and not shutil.which(tool):
        print("peers.py: %s not installed" % tool, file=sys.stderr)
        sys.exit(77)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    dtype = workload.st_dtype(a.state)
    # The tools' peers never hold the state: a child forked from a big
    # process inherits its RSS high-water mark (kept across exec), and
    # theirs are checked file against file.
    state = None if a.case in TOOLS else workload.read_st(a.state)
    res = {"case": a.case, "bytes": workload.st_bytes(a.state)}
    hwm_reset()
    steps = CASES[a.case](a, state, dtype, res)
    stored = next(steps)
    res["rss_save"] = rss(a.case, hwm())
    res["stored_bytes"] = du(stored) if stored else res["bytes"]
    res["caches_dropped"] = drop_caches()
    hwm_reset()
    next(steps, None)
    res["rss_load"] = rss(a.case, hwm())
    hwm_reset()
    for _ in steps:
        pass
    if "load_into_s" in res:
        res["rss_into"] = rss(a.case, hwm())
    shutil.rmtree(a.dir, ignore_errors=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
