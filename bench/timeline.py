#!/usr/bin/python3
"""timeline.py - where a run's time goes, second by second: CPU of the
command and of other processes (a loopback server), and what the disk does.

    bench/timeline.py [--interval S] [--disk DEV] [--also PID ...] \\
        -- COMMAND [ARG ...]

Runs COMMAND and, every --interval seconds (default 0.1) until it exits,
prints one line: time since start, CPU % of COMMAND's process (all its
threads; 200% is two cores) and of each --also PID, and the disk's read
and write MiB/s, requests completed and requests in flight
(/proc/diskstats of DEV, default the device the current directory is on).
A window where every CPU figure is 0 and the disk completes nothing while
requests are in flight is the disk stalling everyone (a cache flush, for
one). COMMAND's own output goes where it would; the timeline goes to
stderr, so `2>timeline.txt` keeps it apart. Exit status: COMMAND's.

Design note. Only /proc: no perf, no privileges, nothing to install, so
it runs wherever the benchmarks run. It samples; it is a first look
(which resource is idle when), not a profiler.
"""

import argparse
import os
import subprocess
import sys
import time


def cpu_ticks(pid):
    """utime + stime of every thread of pid, in clock ticks (None once
    the process is gone)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            st = f.read()
    except OSError:
        return None
    fields = st[st.rindex(")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def disk_dev(path):
    """The block device (its name in /proc/diskstats) path is on, or
    the first that is not a loop or ram device."""
    dev = os.stat(path).st_dev
    want = "%d:%d" % (os.major(dev), os.minor(dev))
    names = []
    with open("/proc/diskstats") as f:
        for line in f:
            x = line.split()
            if "%s:%s" % (x[0], x[1]) == want:
                return x[2]
            if not x[2].startswith(("loop", "ram")):
                names.append(x[2])
    # a partition's parent, or a file system without a device (overlay)
    for n in names:
        if os.path.exists("/sys/class/block/%s/dev" % n):
            with open("/sys/class/block/%s/dev" % n) as f:
                if f.read().strip() == want:
                    return n
    return names[0] if names else None


def disk(dev):
    """(sectors read, sectors written, reads done, writes done, in
    flight) of dev."""
    with open("/proc/diskstats") as f:
        for line in f:
            x = line.split()
            if x[2] == dev:
                return (int(x[5]), int(x[9]), int(x[3]), int(x[7]),
                        int(x[11]))
    return (0, 0, 0, 0, 0)


def main():
    p = argparse.ArgumentParser(
        description="CPU of a command and of other processes, and the "
        "disk, sampled while the command runs (see the top of the file).")
    p.add_argument("--interval", type=float, default=0.1,
                   help="seconds between samples (default 0.1)")
    p.add_argument("--disk", help="device name in /proc/diskstats "
                   "(default: the one the current directory is on)")
    p.add_argument("--also", type=int, action="append", default=[],
                   metavar="PID", help="another process to follow")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        p.error("no command (put it after --)")
    dev = a.disk or disk_dev(".")
    if dev is None:
        p.error("no disk found in /proc/diskstats: name one with --disk")
    hz = os.sysconf("SC_CLK_TCK")
    out = sys.stderr
    out.write("# t_s cmd_cpu%% %s rd_MiB/s wr_MiB/s rd_ios wr_ios "
              "inflight  (disk %s)\n"
              % (" ".join("pid%d_cpu%%" % q for q in a.also), dev))
    child = subprocess.Popen(cmd)
    t0 = last_t = time.monotonic()
    pids = [child.pid] + a.also
    last = [cpu_ticks(q) for q in pids]
    last_d = disk(dev)
    while child.poll() is None:
        time.sleep(a.interval)
        now = time.monotonic()
        dt = now - last_t
        cur = [cpu_ticks(q) for q in pids]
        d = disk(dev)
        cpus = []
        for c, l in zip(cur, last):
            cpus.append("-" if c is None or l is None else
                        "%.0f" % (100.0 * (c - l) / hz / dt))
        out.write("%6.2f %s %6.0f %6.0f %5d %5d %3d\n" % (
            now - t0, " ".join("%5s" % c for c in cpus),
            (d[0] - last_d[0]) * 512 / dt / (1 << 20),
            (d[1] - last_d[1]) * 512 / dt / (1 << 20),
            d[2] - last_d[2], d[3] - last_d[3], d[4]))
        last, last_d, last_t = cur, d, now
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
