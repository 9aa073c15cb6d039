#!/usr/bin/python3
"""demo.py - ckpt in one command: a training run survives a TPU VM's
maintenance stop without losing a step, with no cloud account.

    /usr/bin/python3 examples/demo.py [--quick] [--keep] [--build DIR]

Design note. The story, each step checked (the demo exits 1 naming the
first step that did not happen):
  1. start the loopback Cloud Storage and metadata servers
     (tests/servers/fake_gcs.py, fake_metadata.py; ports from port files);
  2. `ckptctl run --location DIR --remote gs://demo/run1` starts
     examples/train_torch.py (or, --trainer c, examples/train), which
     saves periodically to the directory and the bucket on the loopback
     server;
  3. the metadata server announces TERMINATE_ON_HOST_MAINTENANCE;
  4. the trainer saves early, the step is durable (and uploaded) before
     the deadline, and it exits 75 ("restart me");
  5. at the deadline the VM "stops": any trainer still running is killed;
     then the maintenance is over (the key back to NONE);
  6. `ckptctl run` restarts the trainer, which resumes at the next step
     and finishes;
  7. every step was computed exactly once (steps lost: 0) and the final
     state's digest equals that of an uninterrupted run without
     checkpoints (a reference run, made while the "VM" is stopped);
  8. the step is committed in the bucket; `ckptctl ls`, `inspect` and
     `events` show the result, and two lines sum it up, with the times
     from the notice to durable and to committed in the bucket taken
     from the event journal.
Why Python: the servers are Python already, and the demo reads JSON
(`ckptctl --json`, the journal), talks HTTP to the fakes and manages
process groups; /usr/bin/python3 with its standard library only.

  demo --spawn--> fake_gcs, fake_metadata       (own sessions)
       --spawn--> ckptctl run --fork--> trainer  (one process group)
       <--tail--  trainer stdout, ckptctl run stderr (files in WORK)
       --POST /_fake/set--> metadata server --long-poll--> watchers

Every process it starts is in a process group it kills on exit, on
failure and on Ctrl-C (--keep leaves the servers and WORK for a look).
--quick (CI, the meson suite 'demo'): a small model, a 20 s window;
no timing figure is asserted except the story's own: durable before the
deadline, with a window of many times what the save needs.
"""

import argparse
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"
ME = "instance/maintenance-event"
BUCKET, PREFIX = "demo", "run1"
T0 = time.monotonic()


class Failed(Exception):
    """A step of the story did not happen: "N. what" (N as in STORY)."""

    def __str__(self):
        n, _, what = self.args[0].partition(". ")
        return "step %s of the story (%s): %s" % (n, STORY.get(n, "?"),
                                                   what)


STORY = {"1": "the servers start", "2": "the run trains",
         "3": "the notice", "4": "the early checkpoint, durable in time",
         "5": "the VM stops at the deadline",
         "6": "ckptctl run restarts, the run resumes at the next step",
         "7": "no step lost, bit-identical to an uninterrupted run",
         "8": "the result, in the bucket and the journal"}


def say(tag, text):
    print("[%6.1fs] %-8s %s" % (time.monotonic() - T0, tag, text),
          flush=True)


def patience(args):
    m = float(os.environ.get("CKPT_TEST_TIMEOUT_MULT", "1") or 1)
    return 120.0 * max(m, 1.0) + args.window


# ---- processes ----

def _die_with_parent():
    """Child side: SIGTERM when the demo dies (prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Procs:
    def __init__(self):
        self.groups = []  # (name, Popen, keep)

    def spawn(self, name, argv, out, err, env, keep=False):
        """argv in a session of its own, stdout to `out`, stderr to `err`
        (files, appended); killed with the demo unless `keep`."""
        with open(out, "ab") as o, open(err, "ab") as e:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=o,
                                 stderr=e, env=env, start_new_session=True,
                                 preexec_fn=None if keep else
                                 _die_with_parent)
        self.groups.append((name, p, keep))
        return p

    def stop(self, keep_servers):
        for name, p, keep in reversed(self.groups):
            if keep and keep_servers:
                continue
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                except ProcessLookupError:
                    pass
            # the trainer, if `ckptctl run` left one behind
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def wait_port(path, proc, what, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            with open(path) as f:
                port = int(f.read().strip() or 0)
            if port:
                return port
        except (OSError, ValueError):
            pass
        if proc.poll() is not None:
            raise Failed("1. %s exited (status %s) before listening"
                         % (what, proc.returncode))
        time.sleep(0.05)
    raise Failed("1. %s did not start within %.0f s" % (what, limit))


def md_set(md, key, value, step):
    """Sets a metadata key through the fake's /_fake/set."""
    req = urllib.request.Request(
            "http://%s/_fake/set" % md, method="POST",
            data=json.dumps({"key": key, "value": value}).encode())
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.load(r)
    except (OSError, ValueError) as e:
        raise Failed("%s. setting %s to %s: %s" % (step, key, value, e))


# ---- the trainer's and ckptctl run's output ----

class Story:
    """What the trainer printed (train: ...) and what run said, parsed as
    it arrives; `show` prints the interesting lines."""

    def __init__(self, out_path, run_path):
        self.files = [[out_path, 0, b""], [run_path, 0, b""]]
        self.count = {}           # step -> times computed
        self.pids = []
        self.starts = []          # (restart, resume)
        self.saves = []           # (step, reason)
        self.durable = {}         # step -> monotonic time seen
        self.uploaded = set()
        self.stops = []
        self.resumed = []
        self.first_after_resume = None
        self.last_before_stop = 0
        self.done = None          # (step, digest)
        self.run_lines = []
        self._after_resume = False
        self.notice_at = None

    def poll(self):
        for i, f in enumerate(self.files):
            try:
                with open(f[0], "rb") as fh:
                    fh.seek(f[1])
                    data = fh.read()
            except OSError:
                continue
            f[1] += len(data)
            buf = f[2] + data
            lines = buf.split(b"\n")
            f[2] = lines.pop()
            for line in lines:
                text = line.decode("utf-8", "replace")
                if i == 0:
                    self._trainer(text)
                else:
                    self._run(text)

    def _trainer(self, line):
        w = line.split()
        if len(w) < 2 or w[0] != "train:":
            if line.strip():
                say("trainer", line.strip())
            return
        what, rest = w[1], w[2:]
        if what == "step":
            s = int(rest[0])
            self.count[s] = self.count.get(s, 0) + 1
            if self._after_resume:
                self.first_after_resume = s
                self._after_resume = False
            if not self.stops:
                self.last_before_stop = s
        elif what == "start":
            kv = dict(x.split("=", 1) for x in rest)
            self.pids.append(int(kv["pid"]))
            self.starts.append((kv["restart"], kv["resume"]))
            say("trainer", "started, pid %s, %s" % (
                kv["pid"], "from scratch" if kv["resume"] == "-" else
                "resuming after step " + kv["resume"]))
        elif what == "resumed":
            self.resumed.append(int(rest[0]))
            self._after_resume = True
            say("trainer", "restored step %s from %s" % (
                rest[0], "the bucket" if rest[-1].startswith("gs://")
                else "the directory"))
        elif what == "save":
            s, why = int(rest[0]), rest[1]
            self.saves.append((s, why))
            if why == "periodic" and self.notice_at is not None:
                return  # the ones after the restart: not the story
            say("trainer", "%s save of step %d%s" % (
                why, s, "" if why == "periodic" else
                " (the notice's early checkpoint)"))
        elif what == "durable":
            s = int(rest[0])
            self.durable[s] = time.monotonic()
            say("trainer", "step %d durable%s" % (
                s, self._since_notice()))
        elif what == "uploaded":
            self.uploaded.add(int(rest[0]))
            say("trainer", "step %s committed in the bucket%s" % (
                rest[0], self._since_notice()))
        elif what == "stop":
            self.stops.append(int(rest[0]))
            say("trainer", "stops after step %s: exit 75, \"restart me\""
                % rest[0])
        elif what == "done":
            self.done = (int(rest[0]), rest[1].split("=", 1)[1])
            say("trainer", "finished step %s, digest %s" % self.done)
        elif what not in ("loss",):
            say("trainer", " ".join(w[1:]))

    def _since_notice(self):
        if self.notice_at is None:
            return ""
        return ", %.2f s after the notice" % (time.monotonic()
                                               - self.notice_at)

    def _run(self, line):
        line = line.strip()
        if not line:
            return
        self.run_lines.append(line)
        if line.startswith("ckptctl: run: "):
            line = line[len("ckptctl: run: "):]
        say("run", line)

    def alive_trainers(self, run_pid):
        """Trainer processes still running under ckptctl run."""
        alive = []
        for pid in self.pids:
            try:
                with open("/proc/%d/stat" % pid) as f:
                    st = f.read()
            except OSError:
                continue
            fields = st[st.rindex(")") + 2:].split()
            if fields[0] != "Z" and int(fields[1]) == run_pid:
                alive.append(pid)
        return alive


def wait_until(story, cond, what, limit, proc=None):
    end = time.monotonic() + limit
    while True:
        story.poll()
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            story.poll()
            if cond():
                return
            raise Failed("%s: ckptctl run exited (status %s) first"
                         % (what, proc.returncode))
        if time.monotonic() > end:
            raise Failed("%s: not within %.1f s" % (what, limit))
        time.sleep(0.02)


# ---- ckptctl ----

def ckptctl(args, env, *argv, show=True, rows=None):
    """Runs ckptctl; shows its output (at most `rows` lines of each
    blank-line separated section) unless show=False."""
    r = subprocess.run([args.ckptctl] + list(argv), env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=120)
    text = r.stdout.decode("utf-8", "replace")
    if r.returncode:
        raise Failed("8. ckptctl %s failed (status %d): %s"
                     % (" ".join(argv), r.returncode, text.strip()))
    if show:
        out = []
        for sec in text.rstrip("\n").split("\n\n"):
            lines = sec.split("\n")
            if rows and len(lines) > rows:
                lines = lines[:rows] + ["  ... (%d more)"
                                        % (len(lines) - rows)]
            out.append("\n".join(lines))
        print("\n$ ckptctl %s\n%s" % (" ".join(argv), "\n\n".join(out)))
    return text


def journal(args, env, loc):
    out = ckptctl(args, env, "events", "--json", loc, show=False)
    return [json.loads(x) for x in out.splitlines() if x.strip()]


# ---- the story ----

def trainer_argv(args, steps, step_ms):
    flags = ["--mib", str(args.mib), "--steps", str(steps),
             "--every", str(args.every), "--step-ms", str(step_ms),
             "--window-ms", str(int(args.window * 1000))]
    if args.trainer == "c":
        return [os.path.join(args.build, "examples", "train")] + flags
    return [PY, os.path.join(SRC, "examples", "train_torch.py")] + flags


def base_env(args):
    env = dict(os.environ)
    for k in ("CKPT_LOCATION", "CKPT_RESUME_STEP", "CKPT_RESTART_COUNT",
              "CKPT_RUN_ID"):
        env.pop(k, None)
    env["CKPT_LIB"] = os.path.join(args.build, "engine", "libckpt.so")
    env["PYTHONPATH"] = os.path.join(SRC, "python") + (
            ":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def start_servers(args, procs, work, env):
    gs_port, md_port = (os.path.join(work, n) for n in ("gcs.port",
                                                        "md.port"))
    os.makedirs(os.path.join(work, "bucket"), exist_ok=True)
    gs = procs.spawn("fake_gcs", [
            PY, os.path.join(SRC, "tests", "servers", "fake_gcs.py"),
            "--port-file", gs_port, "--bucket", BUCKET,
            "--data-dir", os.path.join(work, "bucket")],
            *[os.path.join(work, "fake_gcs.log")] * 2, env, keep=args.keep)
    md = procs.spawn("fake_metadata", [
            PY, os.path.join(SRC, "tests", "servers", "fake_metadata.py"),
            "--port-file", md_port],
            *[os.path.join(work, "fake_metadata.log")] * 2, env,
            keep=args.keep)
    lim = patience(args)
    gs_addr = "127.0.0.1:%d" % wait_port(gs_port, gs, "fake_gcs.py", lim)
    md_addr = "127.0.0.1:%d" % wait_port(md_port, md, "fake_metadata.py",
                                         lim)
    env["STORAGE_EMULATOR_HOST"] = "http://" + gs_addr
    env["GCE_METADATA_HOST"] = md_addr
    say("servers", "Cloud Storage on %s (bucket %s), metadata server on %s"
        % (gs_addr, BUCKET, md_addr))
    return gs, md, gs_addr, md_addr


def run_story(args, procs, work, env, md_addr):
    """Steps 2-6; returns the Story, the step the notice saved and the
    reference run."""
    loc = os.path.join(work, "ckpt")
    remote = "gs://%s/%s" % (BUCKET, PREFIX)
    out, err = (os.path.join(work, n) for n in ("trainer.out", "run.err"))
    lim = patience(args)
    argv = [args.ckptctl, "run", "--location", loc, "--remote", remote,
            "--backoff", "1,5", "--"] + trainer_argv(args, args.steps,
                                                     args.step_ms)
    say("start", "ckptctl run --location %s --remote %s -- %s" % (
        loc, remote, "train_torch.py" if args.trainer == "torch" else
        "train"))
    story = Story(out, err)
    run = procs.spawn("run", argv, out, err, env)

    # 2. training, with a periodic save behind it
    notice_step = args.every + args.every // 2
    wait_until(story, lambda: story.last_before_stop >= notice_step,
               "2. the trainer reaches step %d" % notice_step, lim, run)
    if story.done:
        raise Failed("2. the trainer finished before the notice")

    # 3. the notice
    md_set(md_addr, ME, "TERMINATE_ON_HOST_MAINTENANCE", 3)
    story.notice_at = time.monotonic()
    deadline = story.notice_at + args.window
    say("notice", "%s = TERMINATE_ON_HOST_MAINTENANCE at step %d: the "
        "VM stops in %.0f s" % (ME, story.last_before_stop, args.window))

    saved = early_checkpoint(story, run, deadline)
    ref = start_reference(args, procs, work)
    vm_stops(story, run, md_addr, deadline, saved)
    restart_and_finish(story, run, saved, lim)
    return story, saved, ref


def early_checkpoint(story, run, deadline):
    """4. The notice's save starts, is durable, the trainer exits 75 and
    ckptctl run sees it, all before the deadline. Returns the step."""
    def notice_saves():
        return [s for s, why in story.saves if why == "maintenance"]

    for what, cond in (
            ("the trainer starts the notice's save", notice_saves),
            ("its step becomes durable",
             lambda: set(notice_saves()) & set(story.durable)),
            ("the trainer stops (exit 75)", lambda: story.stops),
            ("ckptctl run sees the exit 75",
             lambda: any("stopped after a checkpoint" in x
                         for x in story.run_lines))):
        wait_until(story, cond, "4. " + what + " before the deadline",
                   deadline - time.monotonic(), run)
    return notice_saves()[0]


def vm_stops(story, run, md_addr, deadline, saved):
    """5. At the deadline the VM stops: a trainer still running is killed
    (and the story failed). Then the maintenance is over."""
    while time.monotonic() < deadline:
        story.poll()
        time.sleep(0.05)
    alive = story.alive_trainers(run.pid)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    if alive:
        raise Failed("5. the trainer (pid %s) was still running at the "
                     "deadline: killed it, steps after %d are lost"
                     % (alive, saved))
    say("deadline", "the VM stops: no trainer process left to kill "
        "(it stopped after step %d)" % saved)
    md_set(md_addr, ME, "NONE", 5)
    say("notice", "%s = NONE: the maintenance is over, the VM is back"
        % ME)


def restart_and_finish(story, run, saved, lim):
    """6. ckptctl run restarts the trainer, which resumes at the step
    after `saved` and finishes; ckptctl run exits 0."""
    wait_until(story, lambda: len(story.starts) >= 2,
               "6. ckptctl run restarts the trainer", lim, run)
    wait_until(story, lambda: story.first_after_resume is not None,
               "6. the trainer resumes", lim, run)
    if story.resumed != [saved] or story.first_after_resume != saved + 1:
        raise Failed("6. the trainer resumed after step %s, first step %s;"
                     " expected %d and %d" % (story.resumed,
                                              story.first_after_resume,
                                              saved, saved + 1))
    say("trainer", "first step after the restart: %d"
        % story.first_after_resume)
    wait_until(story, lambda: run.poll() is not None,
               "6. ckptctl run finishes", lim)
    if run.returncode != 0 or not story.done:
        raise Failed("6. the run did not finish (ckptctl run status %s)"
                     % run.returncode)


def start_reference(args, procs, work):
    """The uninterrupted run without checkpoints, started while the VM is
    "stopped" (the CPU is idle then); reference() collects its digest."""
    out = os.path.join(work, "reference.out")
    env = base_env(args)
    for k in ("GCE_METADATA_HOST", "STORAGE_EMULATOR_HOST"):
        env.pop(k, None)
    return procs.spawn("reference", trainer_argv(args, args.steps, 0), out,
                       out, env), out


def reference(args, ref):
    proc, out = ref
    try:
        proc.wait(timeout=patience(args) * 4)
    except subprocess.TimeoutExpired:
        raise Failed("7. the reference run did not finish") from None
    with open(out) as f:
        done = [x.split() for x in f if x.startswith("train: done ")]
    if proc.returncode or not done:
        raise Failed("7. the reference run failed (status %d), see %s"
                     % (proc.returncode, out))
    return done[-1][3].split("=", 1)[1]


def check_steps(args, story, saved, ref):
    bad = [s for s in range(1, args.steps + 1) if story.count.get(s) != 1]
    extra = [s for s in story.count if s > args.steps]
    if bad or extra:
        raise Failed("7. steps computed other than once: %s" % ", ".join(
            "%d (x%d)" % (s, story.count.get(s, 0)) for s in
            (bad + extra)[:10]))
    lost = story.last_before_stop - saved
    if lost != 0:
        raise Failed("7. steps lost: %d" % lost)
    if story.done[1] != ref:
        raise Failed("7. the resumed run's digest %s differs from the "
                     "uninterrupted run's %s" % (story.done[1], ref))
    say("check", "uninterrupted reference run: digest %s, the same" % ref)
    return lost


def figures(args, env, loc, saved):
    """From the journal, for the notice's save of step `saved`: a dict of
    durable_s and margin_s, plan (where and how it was saved) and
    committed_s (in the bucket; None if that came after the restart)."""
    f = {"committed_s": None}
    for e in journal(args, env, loc):
        if e.get("step") != saved:
            continue
        if e.get("action") == "save" and e.get("reason") == "maintenance" \
                and "durable_s" in e and e.get("deadline_met"):
            f.update((k, e.get(k)) for k in ("durable_s", "margin_s", "plan"))
        if e.get("source") == "upload" and "committed_s" in e:
            f["committed_s"] = e["committed_s"]
    if "durable_s" not in f:
        raise Failed("8. the journal has no save of step %d that met its "
                     "deadline" % saved)
    if (f["plan"] or "").startswith("gcs"):   # saved straight there
        f["committed_s"] = f["durable_s"]
    return f


def bucket_steps(args, env):
    doc = json.loads(ckptctl(args, env, "ls", "--json", "gs://%s/%s" % (
        BUCKET, PREFIX), show=False))
    items = doc.get("steps", doc) if isinstance(doc, dict) else doc
    return {s.get("step") for s in items}


def options():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="small model, short window (CI)")
    ap.add_argument("--keep", action="store_true",
                    help="leave the servers and the work directory")
    ap.add_argument("--build", default=os.path.join(SRC, "build"))
    ap.add_argument("--trainer", choices=("torch", "c"), default="torch",
                    help="examples/train_torch.py or examples/train")
    ap.add_argument("--mib", type=int, help="state size (MiB)")
    ap.add_argument("--window", type=float,
                    help="notice window, seconds (a TPU VM: 60)")
    ap.add_argument("--workdir", help="default: a new dir in /var/tmp")
    ap.add_argument("--skip-missing", action="store_true",
                    help="exit 77 if torch/numpy are missing (tests)")
    args = ap.parse_args()
    args.mib = args.mib or (8 if args.quick else 32)
    args.window = args.window or (20.0 if args.quick else 30.0)
    args.steps, args.every = 80, 10 if args.quick else 20
    args.step_ms = 50 if args.quick else 100
    args.build = os.path.abspath(args.build)
    args.ckptctl = os.path.join(args.build, "tools", "ckptctl")
    need = [args.ckptctl, os.path.join(args.build, "engine", "libckpt.so")]
    if args.trainer == "c":
        need.append(os.path.join(args.build, "examples", "train"))
    for path in need:
        if not os.path.exists(path):
            sys.exit("demo: %s is missing: build first (meson setup build "
                     "&& ninja -C build)" % path)
    if args.trainer == "torch" and subprocess.run(
            [PY, "-c", "import torch, numpy"],
            stderr=subprocess.DEVNULL).returncode:
        print("demo: /usr/bin/python3 cannot import torch and numpy "
              "(Debian: apt-get install python3-torch python3-numpy)")
        sys.exit(77 if args.skip_missing else 1)
    return args


def show_result(args, env, work, story, saved, ref):
    """Steps 7 and 8: the checks, ckptctl's view, the summary."""
    lost = check_steps(args, story, saved, reference(args, ref))
    loc, remote = os.path.join(work, "ckpt"), "gs://%s/%s" % (BUCKET,
                                                             PREFIX)
    f = figures(args, env, loc, saved)
    if not {saved, args.steps} <= bucket_steps(args, env):
        raise Failed("8. steps %d and %d are not both committed in %s"
                     % (saved, args.steps, remote))
    ckptctl(args, env, "ls", loc)
    ckptctl(args, env, "ls", remote)
    ckptctl(args, env, "inspect", "%s@%d" % (remote, saved), rows=12)
    ckptctl(args, env, "events", loc)
    print("\nsteps lost: %d (checkpoint of step %d at the notice, resumed "
          "at step %d, final state bit-identical to an uninterrupted run)"
          % (lost, saved, saved + 1))
    print("notice -> durable: %.2f s (plan %s); notice -> committed in %s: "
          "%s (window %.0f s, margin %.1f s)" % (
              f["durable_s"], f["plan"], remote,
              "after the restart" if f["committed_s"] is None else
              "%.2f s" % f["committed_s"], args.window, f["margin_s"]))


def tell_kept(args, servers, work, ok, failed):
    if args.keep and servers:
        gs, md, gs_addr, md_addr = servers
        print("\nservers left running (stop them: kill %d %d); try:\n"
              "  export STORAGE_EMULATOR_HOST=http://%s "
              "GCE_METADATA_HOST=%s\n"
              "  %s ls gs://%s/%s\n  %s events %s/ckpt\n"
              "  curl -s http://%s/_fake/get?key=%s" % (
                  gs.pid, md.pid, gs_addr, md_addr, args.ckptctl, BUCKET,
                  PREFIX, args.ckptctl, work, md_addr, ME))
    elif ok:
        shutil.rmtree(work, ignore_errors=True)
    if ok:
        return
    print("logs kept in %s (trainer.out, run.err, fake_*.log)" % work,
          file=sys.stderr)
    for name in () if not failed else ("trainer.out", "run.err"):
        try:
            with open(os.path.join(work, name)) as f:
                tail = f.readlines()[-15:]
            print("--- %s (last lines)\n%s" % (name, "".join(tail)),
                  file=sys.stderr)
        except OSError:
            pass


def main():
    args = options()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    work = args.workdir or tempfile.mkdtemp(prefix="ckpt-demo.",
                                            dir="/var/tmp")
    os.makedirs(work, exist_ok=True)
    procs, env, servers, ok, failed = Procs(), base_env(args), None, False, \
        False
    print("ckpt demo: a %s training run (%d MiB of state) under ckptctl "
          "run, saving to\n%s/ckpt and gs://%s/%s on loopback servers\n"
          % ("PyTorch" if args.trainer == "torch" else "C", args.mib,
             work, BUCKET, PREFIX))
    try:
        servers = start_servers(args, procs, work, env)
        story, saved, ref = run_story(args, procs, work, env, servers[3])
        show_result(args, env, work, story, saved, ref)
        ok = True
    except Failed as e:
        print("\ndemo FAILED at %s" % e, file=sys.stderr)
        failed = True
    except KeyboardInterrupt:
        print("\ndemo: interrupted", file=sys.stderr)
    finally:
        procs.stop(args.keep)
    tell_kept(args, servers, work, ok, failed)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
