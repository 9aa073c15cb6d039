#!/usr/bin/python3
"""Fidelity of tests/servers/fake_metadata.py, the loopback metadata server.

Usage: /usr/bin/python3 tests/test_metadata_fidelity.py MODE

  protocol     the documented wire behaviour (Metadata-Flavor both ways,
               ETags, alt=json/text, directories, absent keys, every
               "nothing scheduled" form, wait_for_change with and without
               last_etag and timeout_sec, many watchers) and every
               test-only extension (faults, scenarios, stats), spoken with
               http.client;
  curl         curl exactly as Google's docs show it, with
               GCE_METADATA_HOST;
  node         Google's Node client gcp-metadata (pinned below), installed
               with npm into $CKPT_NPM_CACHE/gcp-metadata-VERSION (default
               cache /var/tmp/ckpt-npm) when missing; runs
               test_metadata_fidelity.js;
  gcloud       gcloud with a private CLOUDSDK_CONFIG and no credentials
               but GCE_METADATA_ROOT/HOST/IP: account, project and access
               token all come from the fake server;
  reaction     time from a /_fake/set to a waiting long-poll client having
               the new value, over 100 changes (printed, never asserted);
  npm-install  only install the pinned npm package (used by .ci/run).

Each mode starts its own server (port 0, --port-file) and stops it with
SIGTERM, checking that it exits cleanly. Exit 77 (skipped) only when the
real client is absent, with the reason printed.
"""

import fcntl
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "servers", "fake_metadata.py")
import testutil  # noqa: E402
NODE_PKG = "gcp-metadata"
NODE_VERSION = "8.1.4"  # the last line that runs on node 18 (Debian 12)
ME = "instance/maintenance-event"
UM = "instance/upcoming-maintenance"
FLAVOR = {"Metadata-Flavor": "Google"}
# a bound on how long anything may take before the test calls it a hang;
# never a speed assertion
PATIENCE = 60


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


class FakeMetadata(testutil.Server):
    """fake_metadata.py in a subprocess, for one `with` block."""

    def __init__(self, *extra):
        testutil.Server.__init__(self, SERVER, *extra)

    # ---- helpers speaking to it
    def conn(self, timeout=PATIENCE):
        return http.client.HTTPConnection("127.0.0.1", self.port,
                                          timeout=timeout)

    def get(self, path, headers=FLAVOR, timeout=PATIENCE):
        """(status, headers, body) of one GET on a fresh connection."""
        c = self.conn(timeout)
        try:
            c.request("GET", path, headers=headers)
            r = c.getresponse()
            return r.status, r.headers, r.read()
        finally:
            c.close()

    def md(self, key, query="", **kw):
        return self.get("/computeMetadata/v1/" + key +
                        ("?" + query if query else ""), **kw)

    def control(self, method, what, obj=None):
        c = self.conn()
        body = json.dumps(obj) if obj is not None else None
        c.request(method, "/_fake/" + what, body=body)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, json.loads(data)

    def set(self, key, **item):
        item["key"] = key
        st, rep = self.control("POST", "set", item)
        assert st == 200, rep
        return rep

    def fault(self, **f):
        st, rep = self.control("POST", "fault", f)
        assert st == 200, rep

    def stats(self):
        return self.control("GET", "stats")[1]

    def wait_polls(self, n, key=None):
        q = "wait?long_polls=%d&timeout=%d" % (n, PATIENCE)
        if key:
            q += "&key=" + key
        st, rep = self.control("GET", q)
        assert st == 200, "long-polls never opened: %r" % rep


def in_thread(fn, *args):
    """Runs fn in a thread; returns a getter that joins and gives its
    result (or raises its exception)."""
    out = {}

    def run():
        try:
            out["v"] = fn(*args)
        except BaseException as e:  # handed to the caller
            out["e"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()

    def result():
        t.join(PATIENCE)
        assert not t.is_alive(), "request still running"
        if "e" in out:
            raise out["e"]
        return out["v"]
    return result


# --------------------------------------------------------------------------
# protocol

class Protocol(unittest.TestCase):
    srv = None

    @classmethod
    def setUpClass(cls):
        cls.ctx = FakeMetadata("--absent", "instance/attributes/tpu-env")
        cls.srv = cls.ctx.__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.ctx.__exit__(None, None, None)

    def setUp(self):
        self.srv.control("DELETE", "fault")
        self.srv.set(ME, value="NONE")

    def test_flavor_required_and_always_sent(self):
        s = self.srv
        st, h, body = s.md(ME, headers={})
        self.assertEqual(st, 403)
        self.assertIn(b"Metadata-Flavor", body)
        self.assertEqual(h["Metadata-Flavor"], "Google")
        st, _, _ = s.md(ME, headers={"Metadata-Flavor": "google-ish"})
        self.assertEqual(st, 403)
        st, _, _ = s.md(ME, headers=dict(FLAVOR, **{
            "X-Forwarded-For": "10.0.0.1"}))
        self.assertEqual(st, 403)
        for key, want in ((ME, 200), ("instance/nope", 404),
                          ("instance", 301), ("instance/", 200)):
            st, h, _ = s.md(key)
            self.assertEqual(st, want, key)
            self.assertEqual(h["Metadata-Flavor"], "Google", key)
        c = s.conn()
        c.request("POST", "/computeMetadata/v1/" + ME, body=b"x",
                  headers=FLAVOR)
        r = c.getresponse()
        r.read()
        c.close()
        self.assertEqual((r.status, r.headers["Metadata-Flavor"]),
                         (405, "Google"))
        st, h, _ = s.get("/", headers=FLAVOR)  # google-auth's ping
        self.assertEqual((st, h["Metadata-Flavor"]), (200, "Google"))
        self.assertGreaterEqual(s.stats()["forbidden"], 3)

    def test_etags(self):
        s = self.srv
        st, h, body = s.md(ME)
        self.assertEqual((st, body), (200, b"NONE"))
        e1 = h["ETag"]
        self.assertRegex(e1, r"^[0-9a-f]{16}$")
        self.assertEqual(s.md(ME)[1]["ETag"], e1)  # stable
        rep = s.set(ME, value="MIGRATE_ON_HOST_MAINTENANCE")
        self.assertTrue(rep["changed"])
        st, h, body = s.md(ME)
        self.assertEqual(body, b"MIGRATE_ON_HOST_MAINTENANCE")
        self.assertNotEqual(h["ETag"], e1)
        self.assertEqual(h["ETag"], rep["etag"])
        self.assertFalse(s.set(ME, value="MIGRATE_ON_HOST_MAINTENANCE")
                         ["changed"])
        s.set(ME, value="NONE")
        self.assertEqual(s.md(ME)[1]["ETag"], e1)  # content-derived
        for key in ("instance/", "instance/id", "project/project-id",
                    "instance/service-accounts/default/token", UM):
            self.assertRegex(s.md(key)[1]["ETag"], r"^[0-9a-f]{16}$", key)

    def test_alt_json_and_text(self):
        s = self.srv
        st, h, body = s.md(ME, "alt=json")
        self.assertEqual(json.loads(body), "NONE")
        self.assertEqual(h["Content-Type"], "application/json")
        st, h, body = s.md(ME, "alt=text")
        self.assertEqual((body, h["Content-Type"]),
                         (b"NONE", "application/text"))
        st, h, body = s.md("project/numeric-project-id", "alt=json")
        self.assertEqual(json.loads(body), 123456789012)
        self.assertEqual(s.md("project/numeric-project-id")[2],
                         b"123456789012")
        tok = json.loads(s.md("instance/service-accounts/default/token")[2])
        self.assertEqual(set(tok), {"access_token", "expires_in",
                                    "token_type"})
        self.assertEqual(tok["token_type"], "Bearer")
        scopes = "instance/service-accounts/default/scopes"
        self.assertEqual(s.md(scopes)[2],
                         b"https://www.googleapis.com/auth/cloud-platform\n")
        self.assertEqual(json.loads(s.md(scopes, "alt=json")[2]),
                         ["https://www.googleapis.com/auth/cloud-platform"])

    def test_keys_of_a_tpu_vm(self):
        s = self.srv
        want = {"project/project-id": b"ckpt-test",
                "instance/zone": b"projects/123456789012/zones/us-central2-b",
                "instance/attributes/accelerator-type": b"v4-8",
                "instance/attributes/agent-worker-number": b"0",
                "instance/preempted": b"FALSE"}
        for key, value in want.items():
            self.assertEqual(s.md(key)[::2], (200, value), key)
        for key in ("instance/name", "instance/hostname", "instance/id",
                    "instance/description",
                    "instance/service-accounts/default/email"):
            st, _, body = s.md(key)
            self.assertEqual(st, 200, key)
            self.assertTrue(body, key)
        # --absent: this VM has no tpu-env
        self.assertEqual(s.md("instance/attributes/tpu-env")[0], 404)

    def test_directories(self):
        s = self.srv
        st, h, body = s.md("instance")
        self.assertEqual((st, h["Location"]),
                         (301, "/computeMetadata/v1/instance/"))
        st, _, body = s.md("instance/")
        names = body.decode().split("\n")
        for n in ("attributes/", "maintenance-event", "preempted",
                  "service-accounts/", "upcoming-maintenance", "zone"):
            self.assertIn(n, names)
        st, h, body = s.md("instance/", "recursive=true")
        self.assertEqual(h["Content-Type"], "application/json")
        tree = json.loads(body)
        self.assertEqual(tree["maintenanceEvent"], "NONE")
        self.assertEqual(tree["attributes"]["agent-worker-number"], "0")
        self.assertNotIn("token", tree["serviceAccounts"]["default"])
        email = s.md("instance/service-accounts/default/email")[2].decode()
        self.assertEqual(tree["serviceAccounts"][email]["email"], email)
        self.assertEqual(tree["scheduling"]["onHostMaintenance"],
                         "TERMINATE")
        sa = json.loads(s.md("instance/service-accounts/default/",
                             "recursive=true")[2])
        self.assertEqual(sorted(sa), ["aliases", "email", "scopes"])
        st, _, body = s.md("instance/service-accounts/")
        self.assertIn(b"default/\n", body)
        self.assertIn(sa["email"].encode() + b"/\n", body)

    def test_upcoming_maintenance_forms(self):
        s = self.srv
        window = {"type": "SCHEDULED", "maintenance_status": "PENDING",
                  "window_start_time": "2026-12-10T04:00:00Z",
                  "window_end_time": "2026-12-10T08:00:00Z",
                  "latest_window_start_time": "2026-12-11T04:00:00Z",
                  "can_reschedule": "true",
                  "maintenance_reasons": ["HOST_UPDATE"]}
        forms = [({"value": {}}, 200, {}),
                 ({"value": {"error": "no notifications have been received"
                             " yet, try again later"}}, 200, None),
                 ({"value": "NONE"}, 200, "NONE"),
                 ({"absent": True}, 404, None),
                 ({"status": 503}, 503, None),
                 ({"value": window}, 200, window)]
        for item, code, value in forms:
            s.set(UM, **item)
            st, h, body = s.md(UM, "alt=json")
            self.assertEqual(st, code, item)
            self.assertEqual(h["Metadata-Flavor"], "Google")
            if value is not None:
                self.assertEqual(json.loads(body), value)
            if code == 503:  # no hanging on a key that is failing
                st, _, _ = s.md(UM, "wait_for_change=true")
                self.assertEqual(st, 503)

    def test_absent_and_back(self):
        s = self.srv
        s.set("instance/preempted", absent=True)
        self.assertEqual(s.md("instance/preempted")[0], 404)
        self.assertEqual(s.md("instance/preempted",
                              "wait_for_change=true")[0], 404)
        self.assertNotIn("preempted", s.md("instance/")[2].decode()
                         .split("\n"))
        s.set("instance/preempted", value="TRUE")
        self.assertEqual(s.md("instance/preempted")[::2], (200, b"TRUE"))
        s.set("instance/preempted", value="FALSE")

    def test_wait_for_change_without_etag_waits_for_next_change(self):
        s = self.srv
        res = in_thread(s.md, ME, "wait_for_change=true")
        s.wait_polls(1, ME)
        rep = s.set(ME, value="TERMINATE_ON_HOST_MAINTENANCE")
        st, h, body = res()
        self.assertEqual((st, body),
                         (200, b"TERMINATE_ON_HOST_MAINTENANCE"))
        self.assertEqual(h["ETag"], rep["etag"])

    def test_wait_for_change_with_etag(self):
        s = self.srv
        e0 = s.md(ME)[1]["ETag"]
        s.set(ME, value="SHUTDOWN_ON_HOST_MAINTENANCE")
        # the value already differs from e0: returns at once (no set will
        # come to wake it; a hang would end in the PATIENCE timeout)
        st, h, body = s.md(ME, "wait_for_change=true&last_etag=" + e0)
        self.assertEqual(body, b"SHUTDOWN_ON_HOST_MAINTENANCE")
        e1 = h["ETag"]
        res = in_thread(s.md, ME, "wait_for_change=true&last_etag=" + e1)
        s.wait_polls(1, ME)
        s.set(ME, value="NONE")
        st, h, body = res()
        self.assertEqual((body, h["ETag"]), (b"NONE", e0))

    def test_timeout_sec_returns_current_value(self):
        s = self.srv
        e0 = s.md(ME)[1]["ETag"]
        t0 = time.monotonic()
        st, h, body = s.md(ME, "wait_for_change=true&timeout_sec=1&"
                           "last_etag=" + e0)
        self.assertGreaterEqual(time.monotonic() - t0, 1.0)
        self.assertEqual((st, body, h["ETag"]), (200, b"NONE", e0))
        # writing the same value is no change: the poll still times out
        res = in_thread(s.md, ME, "wait_for_change=true&timeout_sec=1")
        s.wait_polls(1, ME)
        self.assertFalse(s.set(ME, value="NONE")["changed"])
        st, h, body = res()
        self.assertEqual((st, body, h["ETag"]), (200, b"NONE", e0))
        self.assertEqual(s.md(ME, "wait_for_change=true&timeout_sec=x")[0],
                         400)

    def test_many_watchers(self):
        s = self.srv
        n = 64
        before = s.stats()["long_polls"]
        polls = [in_thread(s.md, ME, "wait_for_change=true")
                 for _ in range(n)]
        s.wait_polls(n, ME)
        self.assertEqual(s.stats()["open_by_key"][ME], n)
        rep = s.set(ME, value="TERMINATE_ON_HOST_MAINTENANCE")
        for p in polls:
            st, h, body = p()
            self.assertEqual((body, h["ETag"]),
                             (b"TERMINATE_ON_HOST_MAINTENANCE", rep["etag"]))
        st = s.stats()
        self.assertGreaterEqual(st["long_polls"] - before, n)
        self.assertNotIn(ME, st["open_by_key"])

    def test_abandoned_long_poll_is_dropped(self):
        s = self.srv
        # a client whose own timeout is shorter than the wait gives up;
        # the server must not keep counting (or holding) its poll
        with self.assertRaises(socket.timeout):
            s.md(ME, "wait_for_change=true", timeout=0.3)
        st, rep = s.control("GET", "wait?long_polls=0&cmp=le&key=%s&"
                            "timeout=%d" % (ME, PATIENCE))
        self.assertEqual((st, rep["open"]), (200, 0))

    def test_directory_watch(self):
        s = self.srv
        key = "instance/attributes/"
        res = in_thread(s.md, key, "recursive=true&wait_for_change=true")
        s.wait_polls(1, "instance/attributes")
        s.set("instance/attributes/agent-worker-number", value="3")
        st, _, body = res()
        self.assertEqual(json.loads(body)["agent-worker-number"], "3")
        s.set("instance/attributes/agent-worker-number", value="0")

    def test_token_counts_down(self):
        s = self.srv
        key = "instance/service-accounts/default/token"
        s.set(key, value={"access_token": "ya29.short", "expires_in": 3,
                          "token_type": "Bearer"})
        tok = json.loads(s.md(key)[2])
        self.assertEqual(tok["access_token"], "ya29.short")
        self.assertLessEqual(tok["expires_in"], 3)
        time.sleep(1.1)
        self.assertLess(json.loads(s.md(key)[2])["expires_in"], 3)

    def test_fault_status_burst_by_count_and_time(self):
        s = self.srv
        s.fault(kind="status", code=503, count=2, key=ME)
        self.assertEqual(s.md("instance/zone")[0], 200)  # other key
        self.assertEqual([s.md(ME)[0] for _ in range(3)], [503, 503, 200])
        s.fault(kind="status", seconds=PATIENCE)
        self.assertEqual([s.md(ME)[0] for _ in range(5)], [503] * 5)
        self.assertEqual(s.md(ME)[1]["Metadata-Flavor"], "Google")
        s.control("DELETE", "fault")
        self.assertEqual(s.md(ME)[0], 200)
        self.assertGreaterEqual(s.stats()["faults"]["status"], 7)

    def test_fault_hang(self):
        s = self.srv
        s.fault(kind="hang", hang_seconds=PATIENCE, key=ME)
        with self.assertRaises(socket.timeout):
            s.md(ME, timeout=0.5)
        self.assertEqual(s.md(ME)[0], 200)  # only one request hung

    def test_fault_malformed_replies(self):
        s = self.srv
        s.fault(kind="garbage", key=ME)
        st, h, body = s.md(ME)
        self.assertEqual((st, len(body)), (200, 64))
        s.fault(kind="not_http", key=ME)
        with self.assertRaises(http.client.HTTPException):
            s.md(ME)
        s.fault(kind="truncated", key=ME)
        with self.assertRaises(http.client.IncompleteRead):
            s.md(ME)
        s.fault(kind="no_flavor", key=ME)
        st, h, body = s.md(ME)
        self.assertEqual((st, body), (200, b"NONE"))
        self.assertIsNone(h["Metadata-Flavor"])
        s.fault(kind="reset", key=ME)
        with self.assertRaises((ConnectionResetError,
                                http.client.RemoteDisconnected)):
            s.md(ME)
        self.assertEqual(s.md(ME)[::2], (200, b"NONE"))

    def test_fault_hits_open_long_polls(self):
        s = self.srv
        res = in_thread(s.md, ME, "wait_for_change=true")
        s.wait_polls(1, ME)
        s.fault(kind="reset", key=ME, open=True)
        with self.assertRaises((ConnectionResetError,
                                http.client.RemoteDisconnected)):
            res()

    def test_scenario_endpoint(self):
        s = self.srv
        res = in_thread(s.md, ME, "wait_for_change=true")
        s.wait_polls(1, ME)
        st, rep = s.control("POST", "scenario", {"events": [
            {"at_seconds": 0.2, "key": ME,
             "value": "TERMINATE_ON_HOST_MAINTENANCE"},
            {"at": 0.2, "key": "instance/preempted", "absent": True}]})
        self.assertEqual((st, rep["scheduled"]), (200, 2))
        self.assertEqual(res()[2], b"TERMINATE_ON_HOST_MAINTENANCE")
        for _ in range(PATIENCE * 20):
            if s.md("instance/preempted")[0] == 404:
                break
            time.sleep(0.05)
        self.assertEqual(s.md("instance/preempted")[0], 404)
        s.set("instance/preempted", value="FALSE")
        self.assertEqual(s.control("POST", "fault", {"kind": "nope"})[0],
                         400)
        self.assertEqual(s.control("POST", "set", {"key": ME})[0], 400)

    def test_control_get_and_set_many(self):
        s = self.srv
        st, rep = s.control("POST", "set", {"set": [
            {"key": "instance/preempted", "value": "TRUE"},
            {"key": ME, "value": "TERMINATE_ON_HOST_MAINTENANCE"}]})
        self.assertEqual((st, rep["changed"]), (200, [True, True]))
        st, got = s.control("GET", "get?key=" + ME)
        self.assertEqual((got["present"], got["value"], got["etag"]),
                         (True, "TERMINATE_ON_HOST_MAINTENANCE",
                          rep["etags"][1]))
        self.assertEqual(s.md(ME)[1]["ETag"], got["etag"])
        self.assertEqual(s.md("instance/preempted")[2], b"TRUE")
        s.set("instance/preempted", value="FALSE")
        st, got = s.control("GET", "get?key=instance/nope")
        self.assertFalse(got["present"])

    def test_stats_count_keys(self):
        s = self.srv
        before = s.stats()["by_key"].get("instance/zone", 0)
        for _ in range(3):
            s.md("instance/zone")
        self.assertEqual(s.stats()["by_key"]["instance/zone"], before + 3)


def scenario_file_and_sigterm():
    """A scenario file from server start; SIGTERM with polls open."""
    tmp = tempfile.mkdtemp(prefix="md-scenario-")
    path = os.path.join(tmp, "scenario.json")
    with open(path, "w") as f:
        json.dump({"events": [
            {"at_seconds": 0, "key": "instance/preempted", "absent": True},
            {"at_seconds": 0, "key": UM, "value": "NONE"},
            {"at_seconds": 0.5, "key": ME,
             "value": "TERMINATE_ON_HOST_MAINTENANCE"}]}, f)
    with FakeMetadata("--scenario", path) as s:
        # time-0 events are in place before the port file exists
        assert s.md("instance/preempted")[0] == 404
        assert s.md(UM)[2] == b"NONE"
        e0 = s.md(ME)[1]["ETag"]
        st, h, body = s.md(ME, "wait_for_change=true&last_etag=" + e0)
        assert body == b"TERMINATE_ON_HOST_MAINTENANCE", body
        polls = [in_thread(s.md, ME, "wait_for_change=true")
                 for _ in range(8)]
        s.wait_polls(8, ME)
    # __exit__ sent SIGTERM and checked exit status 0; the polls ended
    for p in polls:
        try:
            p()
        except (ConnectionError, http.client.HTTPException):
            pass
    shutil.rmtree(tmp, ignore_errors=True)
    print("scenario file + SIGTERM with 8 open long-polls: ok")


def run_protocol():
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Protocol)
    ok = unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful()
    scenario_file_and_sigterm()
    return 0 if ok else 1


# --------------------------------------------------------------------------
# curl, as in Google's documentation

def curl(srv, url, *opts):
    """curl URL -H "Metadata-Flavor: Google"; (status, headers, body)."""
    exe = shutil.which("curl")
    env = dict(os.environ, GCE_METADATA_HOST=srv.host)
    url = url.replace("$GCE_METADATA_HOST", env["GCE_METADATA_HOST"])
    p = subprocess.run([exe, "-sS", "-D", "-", "--max-time", str(PATIENCE),
                        url, "-H", "Metadata-Flavor: Google"] + list(opts),
                       capture_output=True, env=env, timeout=PATIENCE + 10)
    if p.returncode != 0:
        raise AssertionError("curl %s: exit %d %s" % (url, p.returncode,
                                                     p.stderr.decode()))
    head, _, body = p.stdout.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    hdrs = {k.lower(): v.strip() for k, _, v in
            (ln.partition(":") for ln in lines[1:])}
    return int(lines[0].split()[1]), hdrs, body


def run_curl():
    if shutil.which("curl") is None:
        skip("curl is not installed")
    base = "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/"
    with FakeMetadata() as s:
        st, h, body = curl(s, base + "maintenance-event")
        assert (st, body, h["metadata-flavor"]) == (200, b"NONE", "Google")
        etag = h["etag"]
        # the documented watch: returns when the value changes
        res = in_thread(curl, s, base + "maintenance-event?"
                        "wait_for_change=true")
        s.wait_polls(1, ME)
        rep = s.set(ME, value="TERMINATE_ON_HOST_MAINTENANCE")
        st, h, body = res()
        assert body == b"TERMINATE_ON_HOST_MAINTENANCE", body
        assert h["etag"] == rep["etag"] != etag
        # last_etag older than the value: returns at once
        st, h, body = curl(s, base + "maintenance-event?wait_for_change="
                           "true&last_etag=" + etag)
        assert body == b"TERMINATE_ON_HOST_MAINTENANCE", body
        # last_etag current + timeout_sec: the current value, same ETag
        st, h, body = curl(s, base + "maintenance-event?wait_for_change="
                           "true&last_etag=%s&timeout_sec=1" % rep["etag"])
        assert (st, body, h["etag"]) == (200, b"TERMINATE_ON_HOST_"
                                         b"MAINTENANCE", rep["etag"])
        # with last_etag and a change while waiting
        res = in_thread(curl, s, base + "maintenance-event?wait_for_change="
                        "true&last_etag=%s&timeout_sec=360" % rep["etag"])
        s.wait_polls(1, ME)
        s.set(ME, value="NONE")
        st, h, body = res()
        assert (body, h["etag"]) == (b"NONE", etag), body
        # upcoming-maintenance as JSON, a 404 key, the 403 without header
        st, h, body = curl(s, base + "upcoming-maintenance?alt=json")
        assert "error" in json.loads(body)
        s.set("instance/preempted", absent=True)
        assert curl(s, base + "preempted")[0] == 404
        p = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w",
                            "%{http_code}", "http://%s/computeMetadata/v1/"
                            "instance/maintenance-event" % s.host],
                           capture_output=True, timeout=PATIENCE)
        assert p.stdout == b"403", p.stdout
        # the recursive attributes listing from the docs
        st, h, body = curl(s, base + "attributes/?recursive=true")
        assert json.loads(body)["accelerator-type"] == "v4-8"
    print("curl as documented: ok")
    return 0


# --------------------------------------------------------------------------
# node: gcp-metadata

def node_modules():
    """node_modules holding the pinned client; installs it if needed.
    Each npm package lives in its own prefix under the shared cache so
    that one install cannot prune another's."""
    root = os.environ.get("CKPT_NPM_CACHE", "/var/tmp/ckpt-npm")
    prefix = os.path.join(root, "%s-%s" % (NODE_PKG, NODE_VERSION))
    mods = os.path.join(prefix, "node_modules")
    pkg = os.path.join(mods, NODE_PKG, "package.json")

    def have():
        try:
            with open(pkg) as f:
                return json.load(f).get("version") == NODE_VERSION
        except (OSError, ValueError):
            return False
    if have():
        return mods
    npm = shutil.which("npm")
    if npm is None:
        skip("npm is not installed, cannot fetch %s@%s" % (NODE_PKG,
                                                          NODE_VERSION))
    os.makedirs(prefix, exist_ok=True)
    with open(os.path.join(prefix, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one install at a time
        if not have():
            p = subprocess.run([npm, "install", "--prefix", prefix,
                                "--no-audit", "--no-fund", "--no-save",
                                "%s@%s" % (NODE_PKG, NODE_VERSION)],
                               capture_output=True, timeout=600)
            if p.returncode != 0 or not have():
                sys.stdout.write(p.stdout.decode()[-2000:] +
                                 p.stderr.decode()[-2000:])
                skip("npm install %s@%s failed (no registry?)" % (
                    NODE_PKG, NODE_VERSION))
    return mods


def run_npm_install():
    print("%s@%s in %s" % (NODE_PKG, NODE_VERSION, node_modules()))
    return 0


def run_node():
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        skip("node (nodejs) is not installed")
    mods = node_modules()
    with FakeMetadata("--absent", "instance/preempted") as s:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GCE_METADATA", "METADATA_SERVER"))}
        script = os.path.join(HERE, "test_metadata_fidelity.js")
        # reads through GCE_METADATA_IP, then everything through
        # GCE_METADATA_HOST (the watch part changes values)
        env.update(NODE_PATH=mods, GCE_METADATA_IP=s.host)
        p = subprocess.run([node, script, "http://" + s.host, "reads-only"],
                           env=env, timeout=600)
        if p.returncode == 0:
            env.pop("GCE_METADATA_IP")
            env["GCE_METADATA_HOST"] = s.host
            p = subprocess.run([node, script, "http://" + s.host],
                               env=env, timeout=600)
    return p.returncode


# --------------------------------------------------------------------------
# gcloud

def run_gcloud():
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        skip("gcloud is not installed")
    cfg = tempfile.mkdtemp(prefix="md-gcloud-")
    with FakeMetadata() as s:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CLOUDSDK_", "GOOGLE_", "GCE_"))}
        env.update(CLOUDSDK_CONFIG=cfg, GCE_METADATA_ROOT=s.host,
                   GCE_METADATA_HOST=s.host, GCE_METADATA_IP=s.host,
                   CLOUDSDK_CORE_DISABLE_PROMPTS="1",
                   CLOUDSDK_CORE_DISABLE_USAGE_REPORTING="1",
                   CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="1",
                   # a loaded machine must not look like "not on GCE":
                   # gcloud's own check and google-auth's ping default to
                   # 3 s timeouts
                   CLOUDSDK_COMPUTE_GCE_METADATA_CHECK_TIMEOUT_SEC=str(
                       PATIENCE),
                   CLOUDSDK_COMPUTE_GCE_METADATA_READ_TIMEOUT_SEC=str(
                       PATIENCE),
                   GCE_METADATA_TIMEOUT=str(PATIENCE))
        # a token only this run knows, so it can only come from the fake
        token = "ya29.fidelity-%d-%d" % (os.getpid(), time.time_ns())
        s.set("instance/service-accounts/default/token",
              value={"access_token": token, "expires_in": 3599,
                     "token_type": "Bearer"})
        email = s.md("instance/service-accounts/default/email")[2].decode()
        s.set("instance/service-accounts/%s/token" % email,
              value={"access_token": token, "expires_in": 3599,
                     "token_type": "Bearer"})
        s.set("project/project-id", value="ckpt-fidelity")

        def run(*args):
            p = subprocess.run([gcloud] + list(args), env=env,
                               capture_output=True, timeout=300)
            out = p.stdout.decode()
            if p.returncode != 0:
                raise AssertionError("gcloud %s: exit %d\n%s%s" % (
                    " ".join(args), p.returncode, out, p.stderr.decode()))
            return out
        conf = json.loads(run("config", "list", "--format=json"))
        assert conf["core"]["project"] == "ckpt-fidelity", conf
        assert conf["core"]["account"] == email, conf
        accounts = json.loads(run("auth", "list", "--format=json"))
        assert [a["account"] for a in accounts] == [email], accounts
        assert run("auth", "print-access-token").strip() == token
        by_key = s.stats()["by_key"]
        assert by_key.get("project/numeric-project-id"), by_key
        assert any(k.endswith("/token") for k in by_key), by_key
    shutil.rmtree(cfg, ignore_errors=True)
    print("gcloud: account %s, project and access token from the fake "
          "metadata server: ok" % email)
    return 0


# --------------------------------------------------------------------------
# reaction time

def measure_reaction(s, watchers, n):
    """n changes seen by `watchers` long-polls, each on its own keep-alive
    connection (as a real watcher keeps one); per change, the time until
    the last watcher has the new value, from the /_fake/set being sent and
    from the server changing the value. Checks every value and ETag."""
    conns = [s.conn() for _ in range(watchers)]
    conns[0].request("GET", "/computeMetadata/v1/" + ME, headers=FLAVOR)
    r = conns[0].getresponse()
    r.read()
    etag = r.headers["ETag"]
    send_to_recv, change_to_recv = [], []
    values = ("TERMINATE_ON_HOST_MAINTENANCE", "NONE")

    def poll(c, tag):
        c.request("GET", "/computeMetadata/v1/%s?wait_for_change=true&"
                  "last_etag=%s&timeout_sec=%d" % (ME, tag, PATIENCE),
                  headers=FLAVOR)
        r = c.getresponse()
        body = r.read()
        return time.monotonic(), r.headers["ETag"], body
    for i in range(n):
        want = values[i % 2]
        polls = [in_thread(poll, c, etag) for c in conns]
        s.wait_polls(watchers, ME)
        t_send = time.monotonic()
        rep = s.set(ME, value=want)
        got = [p() for p in polls]
        for t_recv, tag, body in got:
            assert body.decode() == want and tag == rep["etag"], (i, body)
        t_last = max(g[0] for g in got)
        etag = rep["etag"]
        send_to_recv.append(t_last - t_send)
        change_to_recv.append(t_last - rep["at"])
    for c in conns:
        c.close()
    return send_to_recv, change_to_recv


def run_reaction(n=100):
    def ms(v):
        return "%.2f ms" % (v * 1e3)
    with FakeMetadata() as s:
        for watchers in (1, 16):
            sent, changed = measure_reaction(s, watchers, n)
            print("reaction over %d changes, %d watcher(s), time until the "
                  "last has the value:" % (n, watchers))
            print("  from /_fake/set sent: median %s, max %s" % (
                ms(statistics.median(sent)), ms(max(sent))))
            print("  from the server's change: median %s, max %s" % (
                ms(statistics.median(changed)), ms(max(changed))))
    return 0


def main():
    modes = {"protocol": run_protocol, "curl": run_curl, "node": run_node,
             "gcloud": run_gcloud, "reaction": run_reaction,
             "npm-install": run_npm_install}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        print("usage: test_metadata_fidelity.py %s" % "|".join(modes),
              file=sys.stderr)
        return 2
    return modes[sys.argv[1]]()


if __name__ == "__main__":
    sys.exit(main())
