#!/usr/bin/python3
"""The guide end to end, and gcloud's view of the same setup (issue 9).

Usage: /usr/bin/python3 tests/test_tpu_guide.py /path/to/ckptctl [PATTERN]
(CKPT_TOY_TRAIN names examples/toy_train)

EndToEnd: examples/startup-script.sh starts toy_train under `ckptctl run`
(settings from the VM's metadata attributes on fake_metadata.py),
maintenance is announced, the toy saves and stops, the step is in the
bucket (fake_gcs.py), the node is reported unhealthy on fake_tpu.py,
`ckptctl recover --yes` recreates it with the same settings, the startup
script the server received restores the step on a fresh disk and the toy
resumes at the next step, ending bit-identical to an uninterrupted run;
`ckptctl events --audit` tells the story. SameAsGcloud: gcloud, given the
very environment ckptctl runs with, shows the same health and lists the
same audit entries (skipped without gcloud).

The servers, the environment and the helpers are test_tpu_ops.py's.
Prints "N passed, M failed, K skipped" last; exit 0 if all passed (77 if
everything was skipped), 1 otherwise.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_tpu_ops as ops  # noqa: E402
from test_tpu_ops import (PATIENCE, STARTUP, Z, Server, TpuCase,  # noqa: E402
                          full, startup_script)

CKPTCTL = None

# --------------------------------------------------------------------------
# the guide end to end

TOY = os.environ.get("CKPT_TOY_TRAIN")
STEPS = 60


class Lines:
    """A subprocess's stdout+stderr lines, read by a thread, waited on."""

    def __init__(self, proc):
        self.proc = proc
        self.lines = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self.read, daemon=True)
        self.thread.start()

    def read(self):
        for raw in self.proc.stdout:
            with self.cond:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, pred, what):
        """The first line satisfying pred (from the start)."""
        deadline = time.monotonic() + PATIENCE
        with self.cond:
            while True:
                for ln in self.lines:
                    if pred(ln):
                        return ln
                if self.proc.poll() is not None and not self.thread.is_alive():
                    raise AssertionError("exited before %s:\n%s" % (
                        what, "\n".join(self.lines[-40:])))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no %s in:\n%s" % (
                        what, "\n".join(self.lines[-40:])))
                self.cond.wait(min(left, 1.0))


@unittest.skipUnless(TOY and os.access(TOY, os.X_OK),
                     "CKPT_TOY_TRAIN (examples/toy_train) not given")
class EndToEnd(TpuCase):
    """Training under ckptctl run (started by examples/startup-script.sh),
    maintenance announced, checkpoint in Cloud Storage, the node reported
    unhealthy, recover --yes recreates it, the startup script it installed
    restores from the bucket and training resumes at the next step."""

    def start_vm(self, script, local):
        """Runs a startup script as the VM's boot would, in its own process
        group (the VM)."""
        env = dict(self.env)
        env.update({"CKPT_DIR": local, "CKPTCTL": CKPTCTL,
                    "CKPT_RUN_ARGS": "--upcoming-poll 500 --backoff 0.2,1"})
        p = subprocess.Popen(["/bin/bash", script], env=env,
                             stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
        self.addCleanup(self.kill_vm, p)
        return p, Lines(p)

    def kill_vm(self, p):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()

    def test_guide(self):
        gcs = Server("fake_gcs.py", "--bucket", "bkt")
        self.addCleanup(gcs.stop)
        md = Server("fake_metadata.py")
        self.addCleanup(md.stop)
        remote = "gs://bkt/run1"
        digest_ref = os.path.join(self.tmp, "ref.digest")
        digest = os.path.join(self.tmp, "run.digest")
        train = ("%s --mib 4 --steps %d --step-ms 100 "
                 "--maintenance-window-ms 30000 --digest %s" %
                 (TOY, STEPS, digest))
        self.env.update({"STORAGE_EMULATOR_HOST": "127.0.0.1:%d" % gcs.port,
                         "GCE_METADATA_HOST": "127.0.0.1:%d" % md.port})
        # the VM reads its settings from its metadata attributes
        md.call("POST", "/_fake/set", {"set": [
            {"key": "instance/attributes/ckpt-remote", "value": remote},
            {"key": "instance/attributes/ckpt-train", "value": train}]})
        # the reference: the same training, never interrupted
        subprocess.run([TOY, "--mib", "4", "--steps", str(STEPS),
                        "--digest", digest_ref], env=self.env, check=True,
                       stdout=subprocess.DEVNULL, timeout=PATIENCE)
        before = self.rich_node("train1", metadata={
            "startup-script": startup_script(), "ckpt-remote": remote,
            "ckpt-train": train})

        # VM 1 trains; maintenance is announced; the toy saves and stops
        vm1, out1 = self.start_vm(STARTUP, os.path.join(self.tmp, "vm1"))
        out1.wait_for(lambda ln: ln.startswith("toy: step 8 "), "step 8")
        md.call("POST", "/_fake/set", {
            "key": "instance/maintenance-event",
            "value": "TERMINATE_ON_HOST_MAINTENANCE"})
        saved = int(out1.wait_for(lambda ln: ln.startswith("toy: durable "),
                                  "a durable save").split()[2])
        out1.wait_for(lambda ln: ln == "toy: stop %d" % saved, "the stop")
        # the planner sent the save to the bucket, or to VM 1's disk: then
        # the toy's ckpt_close waits for its upload before the deadline (a
        # recreated node keeps nothing local), so the step reaches the
        # bucket before the VM stops, with no help
        t0 = time.monotonic()
        while True:
            rc, out, err = self.run_ckptctl("ls", remote)
            if rc == 0 and ("%d *" % saved) in out:
                break
            self.assertLess(time.monotonic() - t0, PATIENCE,
                            "step %d never reached %s: %s" % (saved, remote,
                                                              out + err))
            time.sleep(0.1)
        self.kill_vm(vm1)
        shutil.rmtree(os.path.join(self.tmp, "vm1"))
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("train1"), "kind": "terminate",
            "reason": "Instance was terminated by maintenance"})
        rc, out, _ = self.run_ckptctl("health", "-n", "train1", "-z", Z)
        self.assertEqual(rc, 3)
        self.assertIn("health: UNHEALTHY_MAINTENANCE", out)

        # recover: the node's settings, journaled in the bucket
        rc, out, err = self.run_ckptctl("recover", "-n", "train1", "-z", Z,
                                        "--timeout", "1s", "--yes",
                                        "--location", remote)
        self.assertEqual(rc, 0, err)
        create = [r for r in self.requests("POST")
                  if r["path"].endswith("/nodes")][0]
        self.assertEqual(create["body"], self.expected_body(before))

        # VM 2 boots the recreated node: its startup script is the one the
        # server received; the maintenance is over
        md.call("POST", "/_fake/set", {"key": "instance/maintenance-event",
                                       "value": "NONE"})
        script = os.path.join(self.tmp, "startup-received.sh")
        with open(script, "w", encoding="utf-8") as f:
            f.write(create["body"]["metadata"]["startup-script"])
        vm2, out2 = self.start_vm(script, os.path.join(self.tmp, "vm2"))
        out2.wait_for(lambda ln: ln == "startup-script: restoring step %d "
                      "from %s to %s" % (saved, remote,
                                         os.path.join(self.tmp, "vm2")),
                      "the restore")
        out2.wait_for(lambda ln: ln == "toy: resumed %d" % saved,
                      "the resume")
        nxt = out2.wait_for(lambda ln: ln.startswith("toy: step "),
                            "the next step")
        self.assertEqual(int(nxt.split()[2]), saved + 1)
        out2.wait_for(lambda ln: ln.startswith("toy: done %d " % STEPS),
                      "the end")
        self.assertEqual(vm2.wait(PATIENCE), 0)
        with open(digest_ref) as a, open(digest) as b:
            self.assertEqual(a.read(), b.read())

        # the story in one listing: the VM's journal and the audit log
        rc, out, err = self.run_ckptctl(
            "events", "--audit", "-n", "train1", "-z", Z, "--json",
            os.path.join(self.tmp, "vm2"))
        self.assertEqual(rc, 0, err)
        ev = [json.loads(x) for x in out.splitlines()]
        kinds = [(e["source"], e["action"]) for e in ev]
        self.assertIn(("audit", "terminate"), kinds)
        start = [e for e in ev if e["source"] == "run" and
                 e["action"] == "start"][0]
        self.assertEqual(start["step"], saved)
        self.assertLess(kinds.index(("audit", "terminate")), ev.index(start))
        # and recover's own lines, in the bucket
        rc, out, err = self.run_ckptctl("events", "--json", remote)
        self.assertEqual(rc, 0, err)
        mine = [json.loads(x) for x in out.splitlines()]
        mine = [(j["host"], j["action"]) for j in mine
                if j.get("source") == "recover"]
        self.assertEqual(mine[-4:], [(65535, "delete"), (65535, "deleted"),
                                     (65535, "create"), (65535, "created")])


# --------------------------------------------------------------------------
# the same setup, seen through gcloud

GCLOUD = shutil.which("gcloud") or (
    "/usr/bin/gcloud" if os.access("/usr/bin/gcloud", os.X_OK) else None)


@unittest.skipUnless(GCLOUD, "gcloud (Google Cloud CLI) is not installed")
class SameAsGcloud(TpuCase):
    """gcloud, given the very environment ckptctl runs with (the CLOUDSDK_*
    variables are its properties), shows the health ckptctl health prints
    and lists the entries ckptctl events --audit shows."""

    def gcloud(self, *args):
        cfg = os.path.join(self.tmp, "gcloud-config")
        os.makedirs(cfg, exist_ok=True)
        dead = "http://127.0.0.1:9"  # no route out but loopback
        env = dict(self.env, CLOUDSDK_CONFIG=cfg,
                   CLOUDSDK_CORE_DISABLE_PROMPTS="1",
                   CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="true",
                   CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="true",
                   HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead,
                   https_proxy=dead, NO_PROXY="127.0.0.1",
                   no_proxy="127.0.0.1")
        p = subprocess.run([GCLOUD] + list(args), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=300)
        self.assertEqual(p.returncode, 0, p.stderr.decode()[-2000:])
        return p.stdout.decode()

    def test_describe_and_health_agree(self):
        self.put("g1", symptoms=[{"symptomType": "LOW_MEMORY",
                                  "workerId": "0", "details": "low",
                                  "createTime": "2026-12-03T03:44:36Z"}],
                 upcomingMaintenance={
                     "type": "UNSCHEDULED", "maintenanceStatus": "ONGOING",
                     "windowStartTime": "2026-12-03T04:00:00Z",
                     "windowEndTime": "2026-12-03T05:00:00Z"})
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("g1"), "kind": "terminate"})
        shown = json.loads(self.gcloud("compute", "tpus", "tpu-vm",
                                       "describe", "g1", "--zone", Z,
                                       "--format=json"))
        rc, out, err = self.run_ckptctl("health", "-n", "g1", "-z", Z,
                                        "--json")
        self.assertEqual(rc, 3, err)
        mine = json.loads(out)
        for k in ("name", "state", "health", "healthDescription",
                  "symptoms", "upcomingMaintenance"):
            self.assertEqual(mine[k], shown[k], k)
        # the guide's `describe | grep health`, line for line
        yaml = self.gcloud("compute", "tpus", "tpu-vm", "describe", "g1",
                           "--zone", Z)
        rc, out, err = self.run_ckptctl("health", "-n", "g1", "-z", Z)
        theirs = [x for x in yaml.splitlines() if x.startswith("health")]
        self.assertEqual(len(theirs), 2)
        self.assertEqual([x for x in out.splitlines()
                          if x.startswith("health")], theirs)

    def test_logging_read_and_events_audit_agree(self):
        self.put("g2")
        for kind, health in (("terminate", "UNHEALTHY_MAINTENANCE"),
                             ("restart", "HEALTHY"),
                             ("terminate", "UNHEALTHY_MAINTENANCE")):
            self.tpu.call("POST", "/_fake/maintenance", {
                "node": full("g2"), "kind": kind, "health": health,
                "reason": "maintenance %s" % kind})
        self.put("other")
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("other"), "kind": "terminate"})
        rc, out, err = self.run_ckptctl("events", "--audit", "-n", "g2",
                                        "-z", Z, "--json")
        self.assertEqual(rc, 0, err)
        mine = [json.loads(x) for x in out.splitlines()]
        self.assertEqual([m["action"] for m in mine],
                         ["terminate", "restart", "terminate"])
        filt = self.requests("POST")[-1]["body"]["filter"]
        listed = json.loads(self.gcloud("logging", "read", filt,
                                        "--format=json"))
        listed.reverse()  # gcloud: newest first
        self.assertEqual([m["insertId"] for m in mine],
                         [e["insertId"] for e in listed])
        self.assertEqual([m["method"] for m in mine],
                         [e["protoPayload"]["methodName"] for e in listed])
        self.assertEqual(
            [m.get("reason") for m in mine],
            [e["protoPayload"].get("metadata", {}).get("terminateReason")
             for e in listed])


def main():
    global CKPTCTL
    if len(sys.argv) < 2:
        print("usage: test_tpu_guide.py /path/to/ckptctl [PATTERN]",
              file=sys.stderr)
        return 2
    CKPTCTL = ops.CKPTCTL = os.path.abspath(sys.argv[1])
    loader = unittest.defaultTestLoader
    if len(sys.argv) > 2:
        loader.testNamePatterns = ["*%s*" % sys.argv[2]]
    suite = unittest.TestSuite([loader.loadTestsFromTestCase(c)
                                for c in (EndToEnd, SameAsGcloud)])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    if not result.wasSuccessful():
        return 1
    return 0 if passed else 77


if __name__ == "__main__":
    sys.exit(main())
