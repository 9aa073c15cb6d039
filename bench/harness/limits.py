"""limits.py - the physical limits measured in the same run, and the
loopback Cloud Storage server every Cloud Storage figure goes through.

Design note. Each limit is measured per size and repetition, interleaved
with the contenders (run.py), on the same file system and data:
  fio_write / fio_read  fio O_DIRECT sequential write (fsync at the end)
                        and read of a file of the state's size, 4 MiB
                        blocks, io_uring depth 32 (as bench/run_core.sh);
  memcpy, xxh3, zstd1, unzstd1
                        bench_ops --limits: single-core memcpy into warm
                        memory, XXH3-64, zstd -1 compress / decompress, on
                        the state's own bytes;
  gcs_up / gcs_down     bench/gcs_ceiling.sh: the loopback server's own
                        ceiling, 8 curl streams at once, upload and
                        download of the state's size in random bytes (the
                        server in its default mode, with MD5, as the one
                        the contenders use: gcloud needs the MD5).
All in bytes per second.
"""

import json
import os
import shutil
import subprocess
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.dirname(HERE)
PY = "/usr/bin/python3"


def drop_caches():
    """sync, then drop the page cache if permitted (True if it was)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fio(work, size):
    """{"fio_write": B/s, "fio_read": B/s}, or {} without fio."""
    if not shutil.which("fio"):
        return {}
    f = os.path.join(work, "fio.dat")
    size = max(size + (4 << 20) - 1, 4 << 20) >> 22 << 22  # whole blocks
    common = ["--filename=" + f, "--size=%d" % size, "--bs=4M",
              "--direct=1", "--ioengine=io_uring", "--iodepth=32",
              "--output-format=json"]
    out = {}
    for key, rw, extra in (("fio_write", "write", ["--end_fsync=1"]),
                           ("fio_read", "read", [])):
        drop_caches()
        p = subprocess.run(["fio", "--name=" + rw, "--rw=" + rw] + extra +
                           common, capture_output=True, text=True, check=True)
        out[key] = float(json.loads(p.stdout)["jobs"][0][rw]["bw_bytes"])
    os.unlink(f)
    return out


def cpu(bench_ops, state):
    p = subprocess.run([bench_ops, "--state", state, "--limits"],
                       capture_output=True, text=True, check=True)
    d = json.loads(p.stdout)
    return {"memcpy": d["memcpy_bps"], "xxh3": d["xxh3_bps"],
            "zstd1": d["zstd1_bps"], "unzstd1": d["unzstd1_bps"],
            "zstd1_ratio": d["zstd1_ratio"]}


def gcs_ceiling(work, size):
    """The loopback server's ceiling (MB/s lines of gcs_ceiling.sh)."""
    if not shutil.which("curl"):
        raise FileNotFoundError("curl not installed")
    mib = max(1, size >> 20)
    p = subprocess.run(["bash", os.path.join(HERE, "gcs_ceiling.sh"),
                        "--size", str(mib), "--streams", "8", "--modes",
                        "md5", "--json", "--dir", work],
                       capture_output=True, text=True, check=True)
    for line in p.stdout.splitlines():
        d = json.loads(line)
        if d.get("mode") == "md5":
            return {"gcs_up": d["upload_MBps"] * 1e6,
                    "gcs_down": d["download_MBps"] * 1e6}
    return {}


class Server:
    """tests/servers/fake_gcs.py on a free loopback port, bucket "bench",
    objects under `work`/gcs-store."""

    def __init__(self, work):
        self.store = os.path.join(work, "gcs-store")
        shutil.rmtree(self.store, ignore_errors=True)
        os.makedirs(self.store)
        port = os.path.join(work, "gcs-port")
        if os.path.exists(port):
            os.unlink(port)
        self.log = open(os.path.join(work, "gcs-server.log"), "w")
        self.proc = subprocess.Popen(
            [PY, os.path.join(SRC, "tests", "servers", "fake_gcs.py"),
             "--port-file", port, "--bucket", "bench", "--data-dir",
             self.store], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(port) and os.path.getsize(port):
                break
            time.sleep(0.05)
        with open(port) as f:
            self.url = "http://127.0.0.1:%d" % int(f.read().strip())

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.store, ignore_errors=True)
