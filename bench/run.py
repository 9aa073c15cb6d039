#!/usr/bin/python3
"""bench/run.py - ckpt against the physical limits and the tools users
would pick instead, in one run, on the same data (see bench/README.md).

    /usr/bin/python3 bench/run.py [--build build] [--dir /var/tmp/ckpt-bench]
        [--sizes 256M,512M,1G] [--dtypes bf16,f32] [--reps 3]
        [--codecs none,zstd,float] [--out bench-out] [--markdown FILE]
    /usr/bin/python3 bench/run.py --smoke      # tiny, one repetition, checks

Design note. For each dtype and size the workload (harness/workload.py)
is written once as a safetensors file; then each repetition runs, in
this order and each in a process of its own (so each peak RSS is its
own): the limits (fio, memcpy/XXH3/zstd, the loopback server's ceiling;
harness/limits.py), ckpt through the C API per codec (bench_ops), ckpt
saving to a directory with a gs:// remote on the loopback server
(bench_ops --remote), ckpt through the Python binding (harness/peers.py
ours-py), ckptctl import/export (one-shot), and every peer
(harness/peers.py). Interleaving keeps the noise of a shared machine
spread over all contenders alike. A contender whose tool is missing
(torch, gcloud, fio) is left out and named in the output.

Outputs in --out: table.txt (also printed), results.json (every sample,
the summaries, the machine), save.png, load.png, stall.png, memory.png
(gnuplot) and their .dat files; --markdown FILE writes the README's
section. --smoke also checks those outputs are there and well formed
(never the timings) and exits 1 if not.

    workload.st --> bench_ops (C API) / peers.py (Python, peers) --> JSON
                                                     \\-> report.py -> table,
                                                          JSON, PNG, markdown
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "harness"))
import limits  # noqa: E402
import report  # noqa: E402
import workload  # noqa: E402
import smoke  # noqa: E402

PY = "/usr/bin/python3"
PEER_CASES = ["torch", "numpy", "safetensors", "tar-zstd"]


def size_arg(s):
    s = s.strip()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:].upper(), 1)
    return int(float(s.rstrip("kKmMgG")) * mult)


def run(cmd, env=None):
    """(stdout's JSON, None, seconds) or (None, why, seconds); why starts
    with "missing: " when the contender's tool is not installed (exit
    77), else it is an error."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.monotonic() - t0
    if p.returncode:
        return None, "%s%s: exit %d: %s" % (
            "missing: " if p.returncode == 77 else "",
            os.path.basename(cmd[0]) if cmd[0] != PY else cmd[2],
            p.returncode, p.stderr[-600:]), dt
    return json.loads(p.stdout.strip().splitlines()[-1]), None, dt


def timed(cmd):
    """Seconds and peak RSS (wait4) of a command, or raises."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    _pid, status, ru = os.wait4(p.pid, 0)
    dt = time.monotonic() - t0
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        raise RuntimeError("%s: %s" % (" ".join(cmd[:2]), err[-600:]))
    return dt, ru.ru_maxrss * 1024


class Run:
    def __init__(self, a):
        self.a = a
        self.ops = os.path.join(a.build, "bench", "bench_ops")
        self.ctl = os.path.join(a.build, "tools", "ckptctl")
        self.env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "python"),
                        CKPT_LIB=os.path.join(a.build, "engine",
                                              "libckpt.so"))
        self.skipped = {}
        self.errors = {}
        self.server = None

    def add(self, sz, key, value):
        if value is not None:
            sz["samples"].setdefault(key, []).append(value)

    def skip(self, what, why):
        """A contender left out: its tool is missing ("missing: ..."),
        or it failed (an error: the smoke check fails on those)."""
        book = self.skipped if why.startswith("missing: ") else self.errors
        if what not in book:
            book[what] = why.strip()
            print("  %s %s: %s" % ("skipped" if book is self.skipped else
                                   "FAILED", what, why.strip()[:400]))

    def done(self, what, dt):
        if self.a.verbose:
            print("  %-16s %6.1f s" % (what, dt), flush=True)

    def ours_c(self, sz, st, work, codec, remote, small_pool=False):
        key = ("ours-gcs/" if remote else "ours-c/") + codec
        d = os.path.join(work, "ours")
        shutil.rmtree(d, ignore_errors=True)
        cmd = [self.ops, "--state", st, "--dir", d, "--codec", codec,
               "--pool", str(self.pool(sz)), "--one", sz["one"],
               "--slice", sz["slice"]]
        if small_pool:  # the memory target's setting: a pool of 1/8
            key += "-pool8"
            cmd[cmd.index("--pool") + 1] = str(self.pool(sz, 1 / 8))
            cmd.append("--no-load")
        if remote:
            cmd += ["--remote", "gs://bench/%s-%d" % (key.replace("/", "-"),
                                                     time.monotonic_ns())]
        res, why, dt = run(cmd, env=dict(
            os.environ, STORAGE_EMULATOR_HOST=self.server.url)
            if remote else None)
        shutil.rmtree(d, ignore_errors=True)
        self.done(key, dt)
        if not res:
            return self.skip(key, why)
        names = {"block_s": "block_s", "first_block_s": "first_block_s",
                 "durable_s": "durable_s" if remote else "save_s",
                 "load_all_s": "load_all_s" if remote else "load_s",
                 "load_one_s": "load_one_s", "load_slice_s": "load_slice_s",
                 "rss_save": "rss_save", "rss_load": "rss_load"}
        if remote:
            names.update(bucket_s="save_s", load_remote_s="load_s")
        for k, v in names.items():
            self.add(sz, key + "|" + v, res.get(k))

    def pool(self, sz, frac=None):
        frac = self.a.pool_frac if frac is None else frac
        return max(4 << 20, int(sz["bytes"] * frac) >> 20 << 20)

    def peer(self, sz, st, work, case, codec=None):
        key = case if not codec else "ours-py/" + codec
        cmd = [PY, os.path.join(HERE, "harness", "peers.py"),
               "ours-py" if codec else case, "--state", st,
               "--dir", os.path.join(work, "peer")]
        if codec:
            cmd += ["--codec", codec, "--pool", str(self.pool(sz))]
        if case == "gcloud":
            cmd += ["--url", self.server.url, "--object",
                    "bench/gcloud-%d" % time.monotonic_ns()]
        res, why, dt = run(cmd, env=self.env)
        self.done(key, dt)
        if not res:
            return self.skip(key, why)
        for k in ("save_s", "load_s", "load_into_s", "block_s",
                  "first_block_s", "borrow_block_s", "borrow_release_s",
                  "rss_save", "rss_load", "rss_into", "stored_bytes"):
            self.add(sz, key + "|" + k, res.get(k))

    def ckptctl(self, sz, st, work):
        d = os.path.join(work, "ctl")
        shutil.rmtree(d, ignore_errors=True)
        out = os.path.join(work, "export.safetensors")
        t0 = time.monotonic()
        # like every peer, the state is read before the timed part: the
        # import then starts from the file in the page cache
        with open(st, "rb") as f:
            while f.read(64 << 20):
                pass
        try:
            t, rss = timed([self.ctl, "import", st, d + "@1"])
            limits.drop_caches()
            t2, rss2 = timed([self.ctl, "export", d + "@1", "-o", out])
        except FileNotFoundError as e:
            return self.skip("ckptctl", "missing: %s" % e)
        except (OSError, RuntimeError) as e:
            return self.skip("ckptctl", str(e))
        finally:
            shutil.rmtree(d, ignore_errors=True)
        a, b = workload.read_st(st), workload.read_st(out)
        os.unlink(out)
        if a.keys() != b.keys() or any((a[k] != b[k]).any() for k in a):
            return self.skip("ckptctl", "export differs from the import")
        self.done("ckptctl", time.monotonic() - t0)
        for k, v in (("save_s", t), ("load_s", t2), ("rss_save", rss),
                     ("rss_load", rss2)):
            self.add(sz, "ckptctl|" + k, v)

    def limits(self, sz, st, work):
        for what, fn in (("fio", lambda: limits.fio(work, sz["bytes"])),
                         ("cpu limits", lambda: limits.cpu(self.ops, st)),
                         ("server ceiling", lambda: limits.gcs_ceiling(
                             work, sz["bytes"]))):
            t0 = time.monotonic()
            try:
                got = fn()
                if not got:
                    self.skip(what, "missing: not installed")
                for k, v in got.items():
                    self.add(sz, "limits|" + k, v)
            except FileNotFoundError as e:
                self.skip(what, "missing: %s" % e)
            except (OSError, subprocess.CalledProcessError, ValueError) as e:
                self.skip(what, str(e) + str(getattr(e, "stderr", "")))
            self.done(what, time.monotonic() - t0)

    def one_size(self, dtype, size):
        a = self.a
        work = os.path.join(a.dir, "%s-%d" % (dtype, size))
        os.makedirs(work, exist_ok=True)
        st = os.path.join(work, "state.safetensors")
        state = workload.generate(size, dtype, a.seed, a.small)
        workload.write_st(st, state, dtype, durable=False)
        one, sl = workload.picks(state)
        sz = {"label": "%d MiB" % (size >> 20) if size >= 1 << 20 else
              "%d KiB" % (size >> 10), "target": size, "dtype": dtype,
              "bytes": sum(x.nbytes for x in state.values()),
              "tensors": len(state), "one": one, "slice": sl,
              "pool_frac": a.pool_frac,
              "samples": {}}
        del state
        for rep in range(a.reps):
            print("%s %s rep %d/%d, load %s" % (
                dtype, sz["label"], rep + 1, a.reps,
                " ".join(open("/proc/loadavg").read().split()[:3])),
                flush=True)
            self.limits(sz, st, work)
            for codec in a.codecs:
                self.ours_c(sz, st, work, codec, False)
            self.ours_c(sz, st, work, a.codecs[-1], False, True)
            for codec in a.gcs_codecs:
                self.ours_c(sz, st, work, codec, True)
            for codec in a.py_codecs:
                self.peer(sz, st, work, None, codec)
            self.ckptctl(sz, st, work)
            for case in a.peers:
                self.peer(sz, st, work, case)
        shutil.rmtree(work, ignore_errors=True)
        return sz


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) >> 20
    return "%s, %d CPUs (%s), %d GiB RAM, Linux %s" % (
        platform.node(), os.cpu_count(), cpu, mem, platform.release())


def version(build):
    try:
        return subprocess.run([os.path.join(build, "tools", "ckptctl"),
                               "--version"], capture_output=True, text=True
                              ).stdout.strip()
    except OSError:
        return "?"


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(SRC, "build"),
                   help="meson build directory with ckptctl, bench_core "
                   "and libckpt.so (default: SRC/build)")
    p.add_argument("--dir", default="/var/tmp/ckpt-bench",
                   help="scratch directory on the file system measured "
                   "(not tmpfs: O_DIRECT); needs ~4x the largest size")
    p.add_argument("--sizes", default="256M,512M,1G",
                   help="state sizes, comma-separated, K/M/G suffixes "
                   "(default 256M,512M,1G)")
    p.add_argument("--dtypes", default="bf16,f32",
                   help="bf16 (weights) and/or f32 (master weights and "
                   "Adam moments) (default bf16,f32)")
    p.add_argument("--reps", type=int, default=3,
                   help="interleaved repetitions; tables show the median "
                   "and [min-max] (default 3)")
    p.add_argument("--seed", type=int, default=1,
                   help="seed of the synthetic state (default 1)")
    p.add_argument("--small", type=int, default=2048,
                   help="number of small vectors (norms, biases) in the "
                   "state (default 2048)")
    p.add_argument("--codecs", default="none,zstd,float",
                   help="ckpt codecs measured through the C API (default "
                   "none,zstd,float)")
    p.add_argument("--gcs-codecs", default="none,float",
                   help="codecs uploaded to the loopback Cloud Storage "
                   "server; empty: none (default none,float)")
    p.add_argument("--py-codecs", default="none,float",
                   help="codecs measured through the Python binding; "
                   "empty: none (default none,float)")
    p.add_argument("--peers", default=",".join(PEER_CASES + ["gcloud"]),
                   help="peers measured, comma-separated (default %s)"
                   % ",".join(PEER_CASES + ["gcloud"]))
    p.add_argument("--pool-frac", type=float, default=1.125,
                   help="staging pool as a fraction of the state "
                   "(default 1.125: the save never waits for the disk)")
    p.add_argument("--out", default="bench-out",
                   help="results.json, tables and plots go here "
                   "(default bench-out)")
    p.add_argument("--markdown", help="write the README's section here")
    p.add_argument("--note", default="", help="text for the markdown")
    p.add_argument("--from", dest="from_json", metavar="JSON",
                   help="measure nothing: the outputs again from a "
                   "results.json (e.g. after changing the plots)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print each contender's wall time")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, one repetition, check the outputs")
    a = p.parse_args()
    if a.smoke:
        a.sizes, a.reps = "4M", 1
        a.dir = a.dir + "-smoke-%d" % os.getpid()
    for k in ("codecs", "gcs_codecs", "py_codecs", "peers", "dtypes"):
        setattr(a, k, [x for x in getattr(a, k).split(",") if x])
    a.sizes = [size_arg(s) for s in a.sizes.split(",")]
    return a


def outputs(doc, a):
    """table.txt (printed too), the plots, results.json, --markdown."""
    report.summarize(doc)
    txt = report.text(doc)
    print(txt)
    with open(os.path.join(a.out, "table.txt"), "w") as f:
        f.write(txt)
    doc["plots"] = report.plots(doc, a.out)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(report.markdown(doc) + "\n")


def main():
    a = parse()
    os.makedirs(a.out, exist_ok=True)
    if a.from_json:  # the outputs again from a run's samples
        with open(a.from_json) as f:
            doc = json.load(f)
        return outputs(doc, a)
    r = Run(a)
    if not os.access(r.ops, os.X_OK):
        sys.exit("run.py: %s not built (--build DIR)" % r.ops)
    os.makedirs(a.dir, exist_ok=True)
    r.server = limits.Server(a.dir)
    doc = {"meta": {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"),
        "machine": machine(), "version": version(a.build),
        "load": "load average %s at the start" %
        " ".join(open("/proc/loadavg").read().split()[:3]),
        "command": "bench/run.py " + " ".join(sys.argv[1:]),
        "note": a.note, "reps": a.reps, "seed": a.seed,
        "dir": os.path.abspath(a.dir), "pool_frac": a.pool_frac,
        "root": os.geteuid() == 0}, "sizes": [], "skipped": r.skipped,
        "errors": r.errors}
    try:
        for dtype in a.dtypes:
            for size in a.sizes:
                doc["sizes"].append(r.one_size(dtype, size))
    finally:
        r.server.close()
        if a.smoke:
            shutil.rmtree(a.dir, ignore_errors=True)
    outputs(doc, a)
    if a.smoke:
        bad = smoke.check(a.out, a)
        for b in bad:
            print("smoke: FAILED: " + b)
        print("smoke: %s" % ("outputs well formed" if not bad else
                             "%d problems" % len(bad)))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
