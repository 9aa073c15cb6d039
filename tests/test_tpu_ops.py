#!/usr/bin/python3
"""ckptctl health, events --audit and recover (issue 9) against the
loopback Cloud TPU and Logging APIs (tests/servers/fake_tpu.py).

Usage: /usr/bin/python3 tests/test_tpu_ops.py /path/to/ckptctl [PATTERN]

Each test starts its own fake_tpu.py (port 0), points ckptctl at it the way
a user points gcloud (CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU / _LOGGING,
CLOUDSDK_AUTH_ACCESS_TOKEN_FILE, CLOUDSDK_CORE_PROJECT; or the loopback
metadata server for project and token), and checks what ckptctl prints and
exits with AND what the server received (GET /_fake/requests): a recreate
must send the create body the test computes itself from the node it put
(every settable field, the startup script byte for byte), a dry run and a
refusal must send no DELETE or POST. Nothing here asserts a duration;
waits are bounded only to turn a hang into a failure. The guide end to
end and the comparison with gcloud are in test_tpu_guide.py, on the same
helpers (TpuCase, Server).

Prints "N passed, M failed, K skipped" last; exit 0 if all passed, 1
otherwise.
"""

import calendar
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVERS = os.path.join(HERE, "servers")
sys.path.insert(0, HERE)
import testutil  # noqa: E402
ROOT = os.path.dirname(HERE)
STARTUP = os.path.join(ROOT, "examples", "startup-script.sh")
CKPTCTL = None
PATIENCE = 120  # seconds before a wait is called a hang (not a timing)

P, Z = "ckpt-ops", "us-central2-b"
PARENT = "projects/%s/locations/%s" % (P, Z)
TOKEN = "ya29.ops-secret-token-5f2e"
# the Node fields a create accepts (Cloud TPU API v2 reference: all others
# are output only)
SETTABLE = ("description", "acceleratorType", "acceleratorConfig",
            "runtimeVersion", "networkConfig", "networkConfigs", "cidrBlock",
            "serviceAccount", "schedulingConfig", "labels", "metadata",
            "tags", "dataDisks", "shieldedInstanceConfig", "bootDiskConfig")
STATES = ("CREATING", "READY", "RESTARTING", "REIMAGING", "DELETING",
          "REPAIRING", "STOPPED", "STOPPING", "STARTING", "PREEMPTED",
          "TERMINATED", "HIDING", "HIDDEN", "UNHIDING")
HEALTHS = (None, "HEALTHY", "TIMEOUT", "UNHEALTHY_TENSORFLOW",
           "UNHEALTHY_MAINTENANCE")


def startup_script():
    with open(STARTUP, encoding="utf-8") as f:
        return f.read()


def full(node):
    return "%s/nodes/%s" % (PARENT, node)


class Server(testutil.Server):
    """A test server (fake_tpu.py, fake_metadata.py, ...) in a subprocess."""

    def __init__(self, script, *args):
        testutil.Server.__init__(self, os.path.join(SERVERS, script), *args)
        self.start()
        self.url += "/"

    def call(self, method, path, body=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port,
                                       timeout=PATIENCE)
        try:
            c.request(method, path, body=None if body is None else
                      json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            raw = r.read()
            if r.status != 200:
                raise AssertionError("%s %s: %d %r" % (method, path,
                                                       r.status, raw))
            return json.loads(raw) if raw else None
        finally:
            c.close()


class TpuCase(unittest.TestCase):
    """A fake_tpu.py per test, ckptctl's environment pointed at it."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="tpu-ops-")
        self.tpu = Server("fake_tpu.py")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.addCleanup(self.tpu.stop)
        self.tpu.call("POST", "/_fake/config", {"op_delay_s": 0.3})
        tok = os.path.join(self.tmp, "token")
        with open(tok, "w") as f:
            f.write(TOKEN + "\n")
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("CLOUDSDK_") or k in ("GCE_METADATA_HOST",
                                                 "CKPT_LOCATION"):
                del self.env[k]
        self.env.update({
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_TPU": self.tpu.url,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_LOGGING": self.tpu.url,
            "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": tok,
            "CLOUDSDK_CORE_PROJECT": P,
            "CKPT_API_BACKOFF_S": "0.05",
            # nothing may reach a real metadata server
            "GCE_METADATA_HOST": "127.0.0.1:9",
        })
        self.loc = os.path.join(self.tmp, "ckpt")

    def run_ckptctl(self, *args, env=None):
        p = subprocess.run([CKPTCTL] + list(args), env=env or self.env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=PATIENCE)
        out, err = p.stdout.decode(), p.stderr.decode()
        # the token is never printed, whatever happened
        self.assertNotIn(TOKEN, out + err)
        return p.returncode, out, err

    def put(self, name, **fields):
        n = {"name": full(name)}
        n.update(fields)
        return self.tpu.call("POST", "/_fake/nodes", n)[0]

    def node(self, name):
        for n in self.tpu.call("GET", "/_fake/nodes"):
            if n["name"] == full(name):
                return n
        return None

    def requests(self, method=None):
        return [r for r in self.tpu.call("GET", "/_fake/requests")
                if method is None or r["method"] == method]

    def journal(self):
        rc, out, err = self.run_ckptctl("events", "--json", self.loc)
        self.assertEqual(rc, 0, err)
        return [json.loads(line) for line in out.splitlines()]

    def recover_lines(self, action=None):
        return [j for j in self.journal() if j.get("source") == "recover" and
                (action is None or j["action"] == action)]

    def rich_node(self, name, **kw):
        """A node with every kind of setting a recreate must keep."""
        fields = {
            "acceleratorType": "v4-16",
            "runtimeVersion": "tpu-ubuntu2204-base",
            "description": "training run 1 \u2014 \"ckpt\"",
            "networkConfig": {
                "network": "projects/%s/global/networks/train" % P,
                "subnetwork": "projects/%s/regions/us-central2/subnetworks/"
                "train-a" % P, "enableExternalIps": False,
                "canIpForward": True},
            "serviceAccount": {"email": "trainer@%s.iam.gserviceaccount.com"
                               % P, "scope": [
                                   "https://www.googleapis.com/auth/"
                                   "cloud-platform"]},
            "schedulingConfig": {"preemptible": False, "spot": True},
            "labels": {"team": "ml", "run": "r1"},
            "tags": ["tpu", "train"],
            "metadata": {"startup-script": startup_script(),
                         "ckpt-remote": "gs://bkt/run1",
                         "ckpt-train": "python3 train.py --lr 'a b'"},
            "dataDisks": [{"sourceDisk": "projects/%s/zones/%s/disks/data"
                           % (P, Z), "mode": "READ_ONLY"}],
            "shieldedInstanceConfig": {"enableSecureBoot": True},
        }
        fields.update(kw)
        return self.put(name, **fields)

    def expected_body(self, node):
        body = {k: node[k] for k in SETTABLE if k in node}
        # the API returns both of each pair; a create takes one of them
        # (acceleratorType cannot be used with acceleratorConfig, nor
        # networkConfig with networkConfigs)
        if "acceleratorType" in body:
            body.pop("acceleratorConfig", None)
        if "networkConfig" in body:
            body.pop("networkConfigs", None)
        return body


# --------------------------------------------------------------------------
# health

class Health(TpuCase):
    def health(self, name):
        rc, out, err = self.run_ckptctl("health", "--node", name, "--zone",
                                        Z, "--json")
        self.assertIn(rc, (0, 3), err)
        return rc, json.loads(out)

    def test_every_state_and_health(self):
        i = 0
        for state in STATES:
            for health in HEALTHS:
                i += 1
                name = "n%d" % i
                self.put(name, state=state, health=health)
                rc, j = self.health(name)
                healthy = state == "READY" and health in (None, "HEALTHY")
                with self.subTest(state=state, health=health):
                    self.assertEqual(rc, 0 if healthy else 3)
                    self.assertEqual(j["healthy"], healthy)
                    self.assertEqual(j["state"], state)
                    self.assertEqual(j.get("health"), health)
                    self.assertEqual(j["name"], full(name))
                    want = ("healthy" if healthy else
                            "terminal" if state in ("PREEMPTED", "TERMINATED")
                            else "deleting" if state == "DELETING"
                            else "stopped" if state in (
                                "STOPPED", "STOPPING", "HIDING", "HIDDEN")
                            else "busy" if state != "READY"
                            else "maintenance"
                            if health == "UNHEALTHY_MAINTENANCE"
                            else "unhealthy")
                    self.assertEqual(j["verdict"], want)
                    self.assertTrue(j["verdict_text"].startswith(
                        "healthy" if healthy else "had maintenance"
                        if want == "maintenance" else "unhealthy"),
                        j["verdict_text"])

    def test_text_as_describe_grep_health(self):
        self.put("m1")
        node = self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("m1"), "kind": "terminate",
            "time": "2026-11-30T03:44:36.265703305Z"})
        rc, out, err = self.run_ckptctl("health", "-n", "m1", "-z", Z)
        self.assertEqual(rc, 3, err)
        lines = out.splitlines()
        # the lines `gcloud ... describe | grep health` shows, unchanged
        self.assertIn("health: UNHEALTHY_MAINTENANCE", lines)
        self.assertIn("healthDescription: " + node["healthDescription"],
                      lines)
        self.assertIn("state: READY", lines)
        self.assertEqual(lines[-1], "verdict: had maintenance at "
                         "2026-11-30T03:44:36.265Z")

    def test_symptoms_and_upcoming_window(self):
        um = {"type": "SCHEDULED", "canReschedule": True,
              "windowStartTime": "2026-12-10T01:00:00Z",
              "windowEndTime": "2026-12-10T05:00:00Z",
              "latestWindowStartTime": "2026-12-12T01:00:00Z",
              "maintenanceStatus": "PENDING"}
        sym = [{"createTime": "2026-12-03T01:02:03Z",
                "symptomType": "HBM_OUT_OF_MEMORY", "details": "worker 1",
                "workerId": "1"}]
        self.put("s1", upcomingMaintenance=um, symptoms=sym)
        rc, j = self.health("s1")
        self.assertEqual(rc, 0)
        self.assertEqual(j["upcomingMaintenance"], um)
        self.assertEqual(j["symptoms"], sym)
        self.assertIn("maintenance announced: SCHEDULED PENDING window "
                      "2026-12-10T01:00:00Z to 2026-12-10T05:00:00Z",
                      j["verdict_text"])
        rc, out, err = self.run_ckptctl("health", "-n", "s1", "-z", Z)
        self.assertEqual(rc, 0, err)
        self.assertIn("upcomingMaintenance:", out)
        self.assertIn("  windowStartTime: 2026-12-10T01:00:00Z", out)
        self.assertIn("- createTime: 2026-12-03T01:02:03Z", out)
        self.assertIn("  symptomType: HBM_OUT_OF_MEMORY", out)

    def test_unhealthy_since_from_audit_log(self):
        self.put("p1")
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("p1"), "kind": "terminate", "state": "PREEMPTED",
            "health": "HEALTHY", "healthDescription": "",
            "time": "2026-12-01T08:00:00.250Z"})
        rc, j = self.health("p1")
        self.assertEqual(rc, 3)
        self.assertEqual(j["since"], "2026-12-01T08:00:00.250Z")
        self.assertEqual(j["since_from"], "audit")
        self.assertTrue(j["verdict_text"].startswith(
            "unhealthy since 2026-12-01T08:00:00.250Z: state PREEMPTED"),
            j["verdict_text"])

    def test_metadata_server_gives_project_and_token(self):
        md = Server("fake_metadata.py")
        self.addCleanup(md.stop)
        env = dict(self.env)
        del env["CLOUDSDK_CORE_PROJECT"]
        del env["CLOUDSDK_AUTH_ACCESS_TOKEN_FILE"]
        env["GCE_METADATA_HOST"] = "127.0.0.1:%d" % md.port
        project = md.call("GET", "/_fake/get?key=project/project-id")["value"]
        tok = md.call("GET", "/_fake/get?key=instance/service-accounts/"
                      "default/token")["value"]["access_token"]
        self.tpu.call("POST", "/_fake/nodes", {
            "name": "projects/%s/locations/%s/nodes/v1" % (project, Z)})
        # the zone from the metadata server too (instance/zone)
        p = subprocess.run([CKPTCTL, "health", "-n", "v1"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=PATIENCE)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn(tok, (p.stdout + p.stderr).decode())
        got = self.requests("GET")[-1]
        self.assertEqual(got["path"], "/v2/projects/%s/locations/%s/nodes/v1"
                         % (project, Z))
        self.assertEqual(got["authorization"], "Bearer " + tok)

    def test_token_file_is_sent_never_printed(self):
        self.put("t1")
        rc, _, err = self.run_ckptctl("health", "-n", "t1", "-z", Z)
        self.assertEqual(rc, 0, err)
        self.assertEqual(self.requests()[-1]["authorization"],
                         "Bearer " + TOKEN)
        # a server that echoes the token back: scrubbed from the message
        self.tpu.call("POST", "/_fake/fail", {
            "path": "/nodes/t1", "status": 400,
            "message": "bad token %s here" % TOKEN})
        rc, _, err = self.run_ckptctl("health", "-n", "t1", "-z", Z)
        self.assertEqual(rc, 1)
        self.assertIn("bad token [token] here", err)

    def test_api_errors_name_the_node_and_quote_the_api(self):
        self.put("e1")
        cases = [
            (403, "Permission 'tpu.nodes.get' denied on 'projects/x'",
             "PERMISSION_DENIED", "lacks the permission"),
            (409, "The node is busy.", "ALREADY_EXISTS", "conflict"),
            (500, "Internal error. Please retry.", "INTERNAL",
             "after 6 attempts"),
            (503, "The service is currently unavailable.", "UNAVAILABLE",
             "after 6 attempts"),
        ]
        for status, msg, name, hint in cases:
            with self.subTest(status=status):
                self.tpu.call("DELETE", "/_fake/fail")
                self.tpu.call("POST", "/_fake/fail", {
                    "method": "GET", "path": "/nodes/e1", "status": status,
                    "message": msg, "count": 100})
                rc, out, err = self.run_ckptctl("health", "-n", "e1", "-z", Z)
                self.assertEqual(rc, 1)
                self.assertIn(full("e1"), err)
                self.assertIn("HTTP %d %s: %s" % (status, name, msg), err)
                self.assertIn(hint, err)
        self.tpu.call("DELETE", "/_fake/fail")
        rc, _, err = self.run_ckptctl("health", "-n", "nosuch", "-z", Z)
        self.assertEqual(rc, 1)
        self.assertIn(full("nosuch"), err)
        self.assertIn("HTTP 404 NOT_FOUND: Resource '%s' was not found"
                      % full("nosuch"), err)

    def test_429_is_retried(self):
        self.put("r1")
        self.tpu.call("POST", "/_fake/fail", {
            "method": "GET", "path": "/nodes/r1", "status": 429,
            "count": 2, "message": "Quota exceeded for quota metric "
            "'Read requests'"})
        rc, _, err = self.run_ckptctl("health", "-n", "r1", "-z", Z)
        self.assertEqual(rc, 0, err)
        self.assertEqual(len([r for r in self.requests("GET")
                              if r["path"].endswith("/nodes/r1")]), 3)
        # given up after the retries: the API's words, the node's name
        self.tpu.call("POST", "/_fake/fail", {
            "method": "GET", "path": "/nodes/r1", "status": 429,
            "count": 50, "message": "Quota exceeded for quota metric"})
        rc, _, err = self.run_ckptctl("health", "-n", "r1", "-z", Z)
        self.assertEqual(rc, 1)
        self.assertIn("node %s: cannot read it: HTTP 429 RESOURCE_EXHAUSTED:"
                      " Quota exceeded for quota metric (after 6 attempts)"
                      % full("r1"), err)

    def test_usage(self):
        rc, _, err = self.run_ckptctl("health", "--zone", Z)
        self.assertEqual(rc, 2)
        self.assertIn("missing --node", err)
        rc, _, err = self.run_ckptctl("health", "-n", "a/b", "-z", Z)
        self.assertEqual(rc, 2)
        rc, out, _ = self.run_ckptctl("health", "--help")
        self.assertEqual(rc, 0)
        self.assertIn("Exit status: 0 healthy, 3 not healthy", out)
        # a full resource name sets project and zone
        self.put("f1")
        rc, _, err = self.run_ckptctl("health", "-n", full("f1"))
        self.assertEqual(rc, 0, err)


# --------------------------------------------------------------------------
# events --audit

class Audit(TpuCase):
    def entry(self, node, method, ts, reason=None, zone=Z, project=P):
        e = {"logName": "projects/%s/logs/cloudaudit.googleapis.com%%2F"
             "system_event" % project, "timestamp": ts,
             "severity": "NOTICE", "insertId": "%s-%s-%s" % (node, method,
                                                             ts),
             "resource": {"type": "tpu_worker", "labels": {
                 "node_id": node, "zone": zone, "project_id": project}},
             "protoPayload": {"methodName": method, "resourceName":
                              "projects/%s/locations/%s/nodes/%s" %
                              (project, zone, node)}}
        if reason:
            e["protoPayload"]["metadata"] = {"terminateReason": reason}
        return e

    def iso(self, offset_s):
        t = time.time() + offset_s
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + \
            ".%03dZ" % int(t * 1000 % 1000)

    def test_merged_with_the_journal_in_time_order(self):
        t1, t3, t4 = self.iso(-3600), self.iso(-1800), self.iso(-1200)
        self.tpu.call("POST", "/_fake/logs", [
            self.entry("a1", "tpu.nodes.restart", t4),
            self.entry("a1", "tpu.nodes.terminate", t3,
                       "Instance was terminated by maintenance"),
            # not this node, not this zone, not a maintenance method
            self.entry("a2", "tpu.nodes.terminate", t3, "other node"),
            self.entry("a1", "tpu.nodes.terminate", t3, "other zone",
                       zone="us-east5-a"),
            self.entry("a1", "google.cloud.tpu.v2.Tpu.DeleteNode", t3),
            # older than --since
            self.entry("a1", "tpu.nodes.terminate", self.iso(-90000),
                       "too old"),
        ])
        # the VM side: a notice, a durable save, a resume
        os.makedirs(os.path.join(self.loc, "events"))
        lines = [
            {"time": t1, "host": 0, "source": "metadata",
             "key": "instance/maintenance-event", "action": "save"},
            {"time": self.iso(-1900), "host": 0, "source": "metadata",
             "action": "save", "step": 41, "durable_s": 3.5},
            {"time": self.iso(-600), "host": 1, "source": "run",
             "action": "start", "step": 41},
        ]
        for h in (0, 1):
            with open(os.path.join(self.loc, "events", "h%05d.jsonl" % h),
                      "w") as f:
                for ln in lines:
                    if ln["host"] == h:
                        f.write(json.dumps(ln) + "\n")
        rc, out, err = self.run_ckptctl("events", "--audit", "-n", "a1",
                                        "-z", Z, "--since", "1d", "--json",
                                        self.loc)
        self.assertEqual(rc, 0, err)
        got = [json.loads(x) for x in out.splitlines()]
        self.assertEqual([(g["time"], g["source"], g["action"]) for g in got],
                         [(t1, "metadata", "save"),
                          (lines[1]["time"], "metadata", "save"),
                          (t3, "audit", "terminate"),
                          (t4, "audit", "restart"),
                          (lines[2]["time"], "run", "start")])
        self.assertEqual(got[2]["reason"],
                         "Instance was terminated by maintenance")
        self.assertEqual(got[2]["method"], "tpu.nodes.terminate")
        self.assertEqual(got[4]["step"], 41)
        # the filter asked the server for this node's maintenance entries
        q = self.requests("POST")[-1]["body"]
        self.assertEqual(q["resourceNames"], ["projects/" + P])
        self.assertIn('protoPayload.methodName=("tpu.nodes.terminate" OR '
                      '"tpu.nodes.restart")', q["filter"])
        self.assertIn('resource.labels.node_id="a1"', q["filter"])
        self.assertIn("timestamp>=", q["filter"])
        # the table: audit rows have no host
        rc, out, err = self.run_ckptctl("events", "--audit", "-n", "a1",
                                        "-z", Z, self.loc)
        self.assertEqual(rc, 0, err)
        row = [x for x in out.splitlines() if "reason=Instance" in x][0]
        self.assertTrue(row.startswith(t3 + "     -  audit     terminate"),
                        row)
        self.assertIn("reason=Instance was terminated by maintenance", row)
        # without a location: the audit entries alone
        rc, out, err = self.run_ckptctl("events", "--audit", "-n", "a1",
                                        "-z", Z, "--json", "-s", "86000s")
        self.assertEqual(rc, 0, err)
        self.assertEqual([json.loads(x)["action"] for x in out.splitlines()],
                         ["terminate", "restart"])
        # the default is a week
        rc, out, err = self.run_ckptctl("events", "--audit", "-n", "a1",
                                        "-z", Z, "--json")
        self.assertEqual(rc, 0, err)
        self.assertEqual([json.loads(x).get("reason") for x in
                          out.splitlines()],
                         ["too old", "Instance was terminated by "
                          "maintenance", None])

    def test_paging(self):
        n = 2345
        base = time.time() - 3600
        entries = []
        for i in range(n):
            t = base + i * 0.5
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + \
                ".%03dZ" % int(t * 1000 % 1000)
            entries.append(self.entry("pg", "tpu.nodes.terminate", ts,
                                      "r%d" % i))
        self.tpu.call("POST", "/_fake/logs", entries)
        rc, out, err = self.run_ckptctl("events", "--audit", "-n", "pg",
                                        "-z", Z, "--json")
        self.assertEqual(rc, 0, err)
        got = [json.loads(x)["reason"] for x in out.splitlines()]
        self.assertEqual(got, ["r%d" % i for i in range(n)])
        self.assertGreaterEqual(len(self.requests("POST")), 3)

    def test_logging_errors(self):
        self.tpu.call("POST", "/_fake/fail", {
            "path": "entries:list", "status": 403, "count": 10,
            "message": "Permission 'logging.privateLogEntries.list' denied"})
        rc, _, err = self.run_ckptctl("events", "--audit", "-n", "x1", "-z",
                                      Z)
        self.assertEqual(rc, 1)
        self.assertIn(full("x1"), err)
        self.assertIn("HTTP 403 PERMISSION_DENIED: Permission "
                      "'logging.privateLogEntries.list' denied", err)

    def test_usage(self):
        rc, _, err = self.run_ckptctl("events", "--node", "x", self.tmp)
        self.assertEqual(rc, 2)
        rc, _, err = self.run_ckptctl("events", "--audit", "-z", Z)
        self.assertEqual(rc, 2)
        self.assertIn("missing --node", err)
        rc, _, err = self.run_ckptctl("events", "--since", "7x", self.tmp)
        self.assertEqual(rc, 2)


# --------------------------------------------------------------------------
# recover

class Recover(TpuCase):
    def recover(self, name, *extra, yes=True):
        args = ["recover", "--node", name, "--zone", Z, "--location",
                self.loc] + (["--yes"] if yes else [])
        return self.run_ckptctl(*(args + list(extra)))

    def assert_recreated(self, name, before):
        """Deleted, then created with exactly `before`'s settings."""
        reqs = self.requests()
        dels = [i for i, r in enumerate(reqs) if r["method"] == "DELETE"]
        posts = [i for i, r in enumerate(reqs) if r["method"] == "POST"
                 and r["path"].endswith("/nodes")]
        self.assertEqual(len(dels), 1)
        self.assertEqual(len(posts), 1)
        self.assertLess(dels[0], posts[0])
        create = reqs[posts[0]]
        self.assertEqual(create["path"], "/v2/%s/nodes" % PARENT)
        self.assertEqual(create["query"]["nodeId"], name)
        self.assertTrue(create["query"].get("requestId"))
        self.assertEqual(create["body"], self.expected_body(before))
        self.assertEqual(create["body"]["metadata"]["startup-script"],
                         startup_script())
        after = self.node(name)
        self.assertEqual(after["state"], "READY")
        self.assertEqual(after["health"], "HEALTHY")
        actions = [j["action"] for j in self.recover_lines()]
        self.assertEqual(actions[-4:], ["delete", "deleted", "create",
                                        "created"])
        for j in self.recover_lines("delete") + self.recover_lines("create"):
            self.assertEqual(j["settings"], self.expected_body(before))
            self.assertEqual(j["node"], full(name))

    def no_changes(self):
        self.assertEqual([r for r in self.requests()
                          if r["method"] in ("DELETE", "POST")], [])

    def test_preempted(self):
        before = self.rich_node("pre1", state="PREEMPTED")
        rc, out, err = self.recover("pre1")
        self.assertEqual(rc, 0, err)
        self.assertIn("recreated", out)
        self.assert_recreated("pre1", before)

    def test_terminated(self):
        before = self.rich_node("ter1", state="TERMINATED",
                                health="UNHEALTHY_MAINTENANCE")
        rc, out, err = self.recover("ter1", "--timeout", "1h")
        self.assertEqual(rc, 0, err)
        self.assert_recreated("ter1", before)

    def test_stuck_in_maintenance_past_timeout(self):
        self.rich_node("mt1")
        before = self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("mt1"), "kind": "terminate"})
        # just happened: recover gives it --timeout from then, polling,
        # and acts only once that has passed
        rc, out, err = self.recover("mt1", "--timeout", "3s")
        self.assertEqual(rc, 0, err)
        self.assert_recreated("mt1", before)
        when = before["healthDescription"].rsplit(" ", 1)[1]
        t = calendar.timegm(time.strptime(when[:19], "%Y-%m-%dT%H:%M:%S"))
        frac = when[19:].rstrip("Z")
        ms = int((float(frac) if frac else 0) * 1000)
        until = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t + 3)) + \
            ".%03dZ" % ms
        deleted = self.recover_lines("delete")[0]["time"]
        self.assertGreaterEqual(deleted, until)
        for w in self.recover_lines("wait"):  # unless the machine was slow
            self.assertEqual(w["until"], until)
            self.assertEqual(w["health"], "UNHEALTHY_MAINTENANCE")

    def test_maintenance_long_ago_acts_at_once(self):
        self.rich_node("mt2")
        before = self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("mt2"), "kind": "terminate",
            "time": "2026-01-01T00:00:00Z"})
        rc, out, err = self.recover("mt2", "--timeout", "10m")
        self.assertEqual(rc, 0, err)
        self.assertNotIn("waiting until", err)
        self.assert_recreated("mt2", before)

    def test_comes_back_while_waiting(self):
        self.rich_node("mt3")
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("mt3"), "kind": "terminate"})
        p = subprocess.Popen(
            [CKPTCTL, "recover", "-n", "mt3", "-z", Z, "--timeout", "1h",
             "--yes", "-l", self.loc], env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        # once it waits, the node heals
        line = p.stderr.readline().decode()
        self.assertIn("waiting until", line)
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("mt3"), "kind": "restart", "health": "HEALTHY",
            "healthDescription": ""})
        out, err = p.communicate(timeout=PATIENCE)
        self.assertEqual(p.returncode, 0, err)
        self.assertIn("came back by itself", out.decode())
        self.no_changes()
        self.assertEqual(self.recover_lines()[-1]["action"], "recovered")

    def test_interrupted_while_waiting(self):
        self.rich_node("mt4")
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("mt4"), "kind": "terminate"})
        p = subprocess.Popen(
            [CKPTCTL, "recover", "-n", "mt4", "-z", Z, "--timeout", "1h",
             "--yes", "-l", self.loc], env=self.env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.assertIn("waiting until", p.stderr.readline().decode())
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=PATIENCE)
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("interrupted", err.decode())
        self.assertEqual([j["action"] for j in self.recover_lines()],
                         ["check", "wait", "interrupted"])
        self.no_changes()
        # deleted by someone else since: recover never deleted it, so it
        # does not recreate it (not even from an older recover's settings)
        self.tpu.call("DELETE", "/_fake/nodes?name=" + full("mt4"))
        rc, out, err = self.recover("mt4")
        self.assertEqual(rc, 1)
        self.assertIn("ended with 'interrupted'", err)
        self.assertIn("not recreating it", err)
        self.no_changes()

    def test_refuses_a_healthy_node(self):
        self.rich_node("ok1")
        rc, out, err = self.recover("ok1")
        self.assertEqual(rc, 0, err)
        self.assertIn("nothing to do (recover never deletes a healthy node)",
                      out)
        self.no_changes()
        self.assertEqual([j["action"] for j in self.recover_lines()],
                         ["check", "refuse"])
        # a node stopped by its owner is not recovered either
        self.rich_node("st1", state="STOPPED")
        rc, out, err = self.recover("st1")
        self.assertEqual(rc, 1)
        self.assertIn("stopped by its owner", err)
        self.no_changes()
        # nor one a queued resource owns
        self.rich_node("qr1", state="PREEMPTED", queuedResource="projects/"
                       "%s/locations/%s/queuedResources/q" % (P, Z))
        rc, out, err = self.recover("qr1")
        self.assertEqual(rc, 1)
        self.assertIn("belongs to the queued resource", err)
        self.no_changes()

    def test_dry_run_by_default(self):
        before = self.rich_node("dr1", state="PREEMPTED")
        rc, out, err = self.recover("dr1", yes=False)
        self.assertEqual(rc, 0, err)
        self.assertIn("would delete node %s" % full("dr1"), out)
        self.assertIn("dry run: nothing was changed", out)
        # the settings it shows are the create body
        body = out[out.index("{"):out.rindex("}") + 1]
        self.assertEqual(json.loads(body), self.expected_body(before))
        self.no_changes()
        self.assertEqual(self.node("dr1"), before)
        self.assertFalse(os.path.exists(self.loc))
        # --yes needs a journal
        rc, _, err = self.run_ckptctl("recover", "-n", "dr1", "-z", Z,
                                      "--yes")
        self.assertEqual(rc, 2)
        self.assertIn("--yes needs --location", err)
        self.no_changes()

    def test_quota_exhausted_keeps_settings_then_retry(self):
        before = self.rich_node("q1", state="PREEMPTED")
        self.tpu.call("POST", "/_fake/config", {"quota_exhausted": True})
        rc, out, err = self.recover("q1")
        self.assertEqual(rc, 1)
        self.assertIn("node %s: the create failed: RESOURCE_EXHAUSTED (8): "
                      "Quota 'TPUV4sPodPerProjectPerZoneForTPUAPI' exhausted"
                      % full("q1"), err)
        self.assertIn("settings are kept in the journal at %s" % self.loc,
                      err)
        self.assertIsNone(self.node("q1"))
        failed = self.recover_lines("create-failed")
        self.assertEqual(len(failed), 1)
        self.assertEqual(failed[0]["settings"], self.expected_body(before))
        self.assertEqual(failed[0]["status"], "RESOURCE_EXHAUSTED")
        self.assertIn("exhausted", failed[0]["error"])
        # the node is gone; a dry run says it would recreate it
        rc, out, err = self.recover("q1", yes=False)
        self.assertEqual(rc, 0, err)
        self.assertIn("does not exist", out)
        self.assertIn("would create it", out)
        # quota back: the same command again recreates it from the journal
        self.tpu.call("POST", "/_fake/config", {"quota_exhausted": False})
        self.tpu.call("DELETE", "/_fake/requests")
        rc, out, err = self.recover("q1")
        self.assertEqual(rc, 0, err)
        posts = self.requests("POST")
        self.assertEqual(len(posts), 1)
        self.assertEqual(posts[0]["body"], self.expected_body(before))
        self.assertEqual(self.node("q1")["state"], "READY")
        self.assertEqual(self.recover_lines()[-1]["action"], "created")
        # recreated and then deleted by someone: not recreated again
        self.tpu.call("DELETE", "/_fake/nodes?name=" + full("q1"))
        rc, out, err = self.recover("q1")
        self.assertEqual(rc, 1)
        self.assertIn("not recreating it", err)

    def test_settings_too_long_for_the_journal(self):
        # a journal line is at most 64 KiB: settings that do not fit could
        # not recreate the node after a failed create, so nothing is deleted
        self.rich_node("big", state="PREEMPTED", metadata={
            "startup-script": "#!/bin/sh\n" + "# padding\n" * 8000})
        rc, out, err = self.recover("big")
        self.assertEqual(rc, 1)
        self.assertIn("not deleting node %s: its settings could not be "
                      "journaled" % full("big"), err)
        self.no_changes()

    def test_no_such_node_and_no_journal(self):
        rc, out, err = self.recover("ghost")
        self.assertEqual(rc, 1)
        self.assertIn("HTTP 404 NOT_FOUND", err)
        self.assertIn("nothing to recreate it from", err)
        self.no_changes()

    def test_create_conflict_and_retries(self):
        before = self.rich_node("c1", state="TERMINATED")
        # 429 twice on the create: retried with the same requestId
        self.tpu.call("POST", "/_fake/fail", {
            "method": "POST", "path": "/nodes", "status": 429, "count": 2,
            "message": "Rate exceeded."})
        rc, out, err = self.recover("c1")
        self.assertEqual(rc, 0, err)
        posts = [r for r in self.requests("POST")]
        self.assertEqual(len(posts), 3)
        self.assertEqual(len({p["query"]["requestId"] for p in posts}), 1)
        self.assertEqual(posts[-1]["body"], self.expected_body(before))
        # a 409 on the create: the API's words, the settings journaled
        self.tpu.call("POST", "/_fake/maintenance", {
            "node": full("c1"), "kind": "terminate", "state": "PREEMPTED"})
        before = self.node("c1")  # as the first recreate left it
        self.tpu.call("POST", "/_fake/fail", {
            "method": "POST", "path": "/nodes", "status": 409,
            "message": "Resource already exists"})
        rc, out, err = self.recover("c1")
        self.assertEqual(rc, 1)
        self.assertIn("HTTP 409 ALREADY_EXISTS: Resource already exists",
                      err)
        self.assertIn(full("c1"), err)
        self.assertEqual(self.recover_lines("create-failed")[-1]["settings"],
                         self.expected_body(before))

    def test_delete_forbidden(self):
        self.rich_node("d1", state="PREEMPTED")
        self.tpu.call("POST", "/_fake/fail", {
            "method": "DELETE", "status": 403,
            "message": "Permission 'tpu.nodes.delete' denied"})
        rc, out, err = self.recover("d1")
        self.assertEqual(rc, 1)
        self.assertIn("node %s: cannot delete it: HTTP 403 PERMISSION_DENIED:"
                      " Permission 'tpu.nodes.delete' denied" % full("d1"),
                      err)
        self.assertEqual(self.recover_lines()[-1]["action"], "delete-failed")
        self.assertEqual(self.requests("POST"), [])

    def test_operation_deadline(self):
        self.rich_node("o1", state="PREEMPTED")
        self.tpu.call("POST", "/_fake/config", {"op_delay_s": 3600})
        rc, out, err = self.recover("o1", "--op-timeout", "1s")
        self.assertEqual(rc, 1)
        self.assertIn("not done after", err)
        self.assertIn("deadline passed", err)
        self.assertEqual(self.recover_lines()[-1]["action"], "delete-failed")
        self.assertEqual(self.requests("POST"), [])


def main():
    global CKPTCTL
    if len(sys.argv) < 2:
        print("usage: test_tpu_ops.py /path/to/ckptctl [PATTERN]",
              file=sys.stderr)
        return 2
    CKPTCTL = os.path.abspath(sys.argv[1])
    loader = unittest.defaultTestLoader
    if len(sys.argv) > 2:
        loader.testNamePatterns = ["*%s*" % sys.argv[2]]
    suite = loader.loadTestsFromModule(sys.modules[__name__])
    result = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(suite)
    failed = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 0 if result.wasSuccessful() and passed else 1


if __name__ == "__main__":
    sys.exit(main())
