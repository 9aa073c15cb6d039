#!/usr/bin/python3
"""ab.py - two builds of ckpt compared in one run, interleaved.

    /usr/bin/python3 bench/ab.py MIB REPS BUILD_A BUILD_B [CODECS|,] [--ctl]

Design note. A change to the engine is judged by ratios measured in the
same run on this noisy machine, never by one timing: each repetition runs
fio (O_DIRECT write and read, harness/limits.py) and the memcpy limit,
then bench_ops of build A and of build B for each codec (CODECS, default
none,float; "," for none), and with --ctl the one-shot `ckptctl import`
and `export` (page cache dropped before the export) of each build. The
state is the harness's bf16 workload of MIB MiB (harness/workload.py,
seed 1), written once under /var/tmp/hperf-ab. Printed: the median of
each figure with its ratio to the limit measured in the same repetition,
median [min-max] over the repetitions. Build B's directory can be the
worktree's build, A one of main (git archive main | tar -x; meson setup).
Run as root so the page cache is dropped before each load.
"""
import json
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "harness"))
import limits  # noqa: E402
import workload  # noqa: E402

WORK = "/var/tmp/hperf-ab"
KEYS = ("block_s", "first_block_s", "durable_s", "load_all_s")


def ops(build, st, codec, nbytes):
    """One bench_ops run of `build`: its JSON, or None (stderr shown)."""
    d = os.path.join(WORK, "o")
    shutil.rmtree(d, ignore_errors=True)
    p = subprocess.run([os.path.join(build, "bench", "bench_ops"),
                        "--state", st, "--dir", d, "--codec", codec,
                        "--pool", str(int(nbytes * 1.125) >> 20 << 20)],
                       capture_output=True, text=True)
    shutil.rmtree(d, ignore_errors=True)
    if p.returncode:
        print(build, codec, p.stderr[-500:])
        return None
    return json.loads(p.stdout)


def ctl(build, st):
    """Seconds of a one-shot import (the file read first, untimed) and of
    an export (page cache dropped)."""
    d, out = os.path.join(WORK, "ctl"), os.path.join(WORK, "x.st")
    exe = os.path.join(build, "tools", "ckptctl")
    shutil.rmtree(d, ignore_errors=True)
    with open(st, "rb") as f:  # in the page cache, as for run.py's peers
        while f.read(64 << 20):
            pass
    t0 = time.monotonic()
    subprocess.run([exe, "import", st, d + "@1"], check=True,
                   stdout=subprocess.DEVNULL)
    t1 = time.monotonic()
    limits.drop_caches()
    t2 = time.monotonic()
    subprocess.run([exe, "export", d + "@1", "-o", out], check=True,
                   stdout=subprocess.DEVNULL)
    t3 = time.monotonic()
    os.unlink(out)
    shutil.rmtree(d, ignore_errors=True)
    return t1 - t0, t3 - t2


def ratio(key, v, S, nbytes, i):
    """The figure's ratio to its limit in repetition i, and its name."""
    if key.endswith("load_all_s") or key.endswith("export_s"):
        return nbytes / v / S["fio_read"][i], "x fio read"
    if key.endswith("block_s"):
        return v / (nbytes / S["memcpy"][i]), "x memcpy"
    return nbytes / v / S["fio_write"][i], "x fio write"


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    size, reps = int(sys.argv[1]) << 20, int(sys.argv[2])
    builds = {"A": sys.argv[3], "B": sys.argv[4]}
    codecs = ["none", "float"]
    if len(sys.argv) > 5 and not sys.argv[5].startswith("--"):
        codecs = [c for c in sys.argv[5].split(",") if c]
    os.makedirs(WORK, exist_ok=True)
    st = os.path.join(WORK, "state-%d.safetensors" % size)
    if not os.path.exists(st):
        workload.write_st(st, workload.generate(size, "bf16", 1, 2048),
                          "bf16", durable=False)
    nbytes = workload.st_bytes(st)
    S = {}

    def add(k, v):
        S.setdefault(k, []).append(v)

    for rep in range(reps):
        for k, v in limits.fio(WORK, nbytes).items():
            add(k, v)
        add("memcpy", limits.cpu(os.path.join(builds["A"], "bench",
                                              "bench_ops"), st)["memcpy"])
        for codec in codecs:
            for tag, b in builds.items():
                res = ops(b, st, codec, nbytes) or {}
                for k in KEYS:
                    if k in res:
                        add("%s/%s/%s" % (tag, codec, k), res[k])
        if "--ctl" in sys.argv:
            for tag, b in builds.items():
                imp, exp = ctl(b, st)
                add(tag + "/ctl/import_s", imp)
                add(tag + "/ctl/export_s", exp)
        print("rep %d/%d, load %s" % (rep + 1, reps, " ".join(
            open("/proc/loadavg").read().split()[:3])), flush=True)
    med = {k: statistics.median(v) for k, v in S.items()}
    print("state %d bytes; fio read %.0f, write %.0f, memcpy %.0f MiB/s" % (
        nbytes, med["fio_read"] / 2**20, med["fio_write"] / 2**20,
        med["memcpy"] / 2**20))
    for k in sorted(S):
        if "/" not in k:
            continue
        r = [ratio(k, v, S, nbytes, i) for i, v in enumerate(S[k])]
        rs = [x[0] for x in r]
        print("%-24s %7.3f s %6.2f %s [%.2f-%.2f]" % (
            k, med[k], statistics.median(rs), r[0][1], min(rs), max(rs)))


if __name__ == "__main__":
    main()
