#!/usr/bin/python3
"""Fidelity of tests/servers/fake_gcs.py, the loopback Cloud Storage server.

Usage: /usr/bin/python3 tests/test_gcs_fidelity.py protocol|gcloud|node
       /usr/bin/python3 tests/test_gcs_fidelity.py npm-install  (.ci/run)

  protocol  the documented JSON API wire behaviour (resumable 308/Range
            rules, multipart, checksums, ranges/416, list pages, compose
            cap, preconditions, error bodies) and the storage-testbench
            retry-test interface, spoken with http.client;
  gcloud    Google's gcloud CLI (`gcloud storage cp/ls/cat`, up and down, a
            small file and a >150 MiB one so that resumable, parallel
            composite and sliced transfers are used; `cp -r` of a
            directory tree up and down), through a private
            CLOUDSDK_CONFIG with api_endpoint_overrides/storage;
  node      the official Node client @google-cloud/storage (pinned below),
            installed with npm into $CKPT_NPM_CACHE/@google-cloud+storage-V
            (default cache /var/tmp/ckpt-npm) when missing (npm-install
            does only that); runs test_gcs_fidelity.js, then its soak
            against the server's seeded random fault mode.

Each mode starts its own server (port 0, --port-file) and stops it with
SIGTERM, checking that it exits cleanly. Exit 77 (skipped) only when the
real client is absent, with the reason printed.
"""

import base64
import fcntl
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "servers", "fake_gcs.py")
import testutil  # noqa: E402
NODE_PKG = "@google-cloud/storage"
NODE_VERSION = "7.22.0"  # the 7.x line supports node >= 14 (Debian 12: 18)
BUCKET = "ckpt-test"
Q = 256 * 1024


def skip(msg):
    print("SKIP: " + msg)
    sys.exit(77)


class FakeGcs(testutil.Server):
    """fake_gcs.py in a subprocess, for one `with` block."""

    def __init__(self, *extra):
        testutil.Server.__init__(self, SERVER, "--data-dir",
                                 "", "--bucket", BUCKET, *extra)
        self.args[1] = os.path.join(self.dir, "data")

    def start(self):
        testutil.Server.start(self)
        self.base = self.url
        return self


def crc32c_ref(data):
    """Bitwise CRC32C, independent of the server's implementation."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return base64.b64encode((crc ^ 0xFFFFFFFF).to_bytes(4, "big")).decode()


def md5_b64(data):
    return base64.b64encode(hashlib.md5(data).digest()).decode()


# --------------------------------------------------------------------------
# protocol

SRV = None


class Resp:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    def json(self):
        return json.loads(self.body)

    def header(self, name):
        return self.headers.get(name.lower())


def call(method, path, body=b"", headers=None, test_id=None):
    c = http.client.HTTPConnection("127.0.0.1", SRV.port, timeout=120)
    h = dict(headers or {})
    if test_id:
        h["x-retry-test-id"] = test_id
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    hdrs = {}
    for k, v in r.getheaders():
        k = k.lower()
        hdrs[k] = hdrs[k] + "," + v if k in hdrs else v
    c.close()
    return Resp(r.status, hdrs, data)


def obj_path(name, media=False):
    p = "/storage/v1/b/%s/o/%s" % (BUCKET, urllib.parse.quote(name, safe=""))
    return p + ("?alt=media" if media else "")


def upload_media(name, data, query="", headers=None):
    return call("POST", "/upload/storage/v1/b/%s/o?uploadType=media&name=%s%s"
                % (BUCKET, urllib.parse.quote(name, safe=""), query),
                data, headers)


def start_session(name, meta=None, query="", headers=None):
    m = dict(meta or {})
    m["name"] = name
    r = call("POST", "/upload/storage/v1/b/%s/o?uploadType=resumable%s"
             % (BUCKET, query), m, headers)
    return r, r.header("location")


def put(url, data, crange, test_id=None, headers=None):
    u = urllib.parse.urlsplit(url)
    h = {"Content-Range": crange}
    h.update(headers or {})
    return call("PUT", u.path + "?" + u.query, data, h, test_id)


def retry_test(instructions):
    r = call("POST", "/retry_test", {"instructions": instructions})
    assert r.status == 200, r.body
    return r.json()["id"]


class Protocol(unittest.TestCase):
    def assertError(self, r, code, reason):
        self.assertEqual(r.status, code, r.body)
        e = r.json()["error"]
        self.assertEqual(e["code"], code)
        self.assertEqual(e["errors"][0]["reason"], reason)
        self.assertEqual(e["errors"][0]["domain"], "global")
        self.assertEqual(e["errors"][0]["message"], e["message"])

    def test_crc32c_vectors(self):
        for data, want in ((b"", "AAAAAA=="), (b"hello world", "yZRlqg=="),
                           (b"The quick brown fox jumps over the lazy dog",
                            "ImIEBA==")):
            r = upload_media("vec", data)
            self.assertEqual(r.status, 200)
            self.assertEqual(r.json()["crc32c"], want)
            self.assertEqual(r.json()["size"], str(len(data)))

    def test_media_and_download_headers(self):
        data = os.urandom(100000)
        r = upload_media("dir/a b+c%", data, headers={"Content-Type": "x/y"})
        res = r.json()
        self.assertEqual(res["name"], "dir/a b+c%")
        self.assertEqual(res["md5Hash"], md5_b64(data))
        self.assertEqual(res["crc32c"], crc32c_ref(data))
        d = call("GET", obj_path("dir/a b+c%", True))
        self.assertEqual(d.status, 200)
        self.assertEqual(d.body, data)
        self.assertEqual(d.header("content-type"), "x/y")
        self.assertEqual(d.header("x-goog-generation"), res["generation"])
        self.assertEqual(d.header("x-goog-stored-content-length"), "100000")
        h = dict(p.split("=", 1) for p in d.header("x-goog-hash").split(","))
        self.assertEqual(h["md5"], md5_b64(data))
        self.assertEqual(h["crc32c"], res["crc32c"])
        d2 = call("GET", "/download/storage/v1/b/%s/o/%s" % (
            BUCKET, urllib.parse.quote("dir/a b+c%", safe="")))
        self.assertEqual(d2.body, data)

    def test_ranges(self):
        data = os.urandom(5000)
        upload_media("rng", data)
        for rng, lo, hi in (("bytes=10-19", 10, 19), ("bytes=4990-", 4990,
                            4999), ("bytes=-7", 4993, 4999),
                            ("bytes=100-99999", 100, 4999)):
            r = call("GET", obj_path("rng", True), headers={"Range": rng})
            self.assertEqual(r.status, 206, rng)
            self.assertEqual(r.body, data[lo:hi + 1], rng)
            self.assertEqual(r.header("content-range"),
                             "bytes %d-%d/5000" % (lo, hi))
        for rng in ("bytes=5000-", "bytes=6000-7000", "bytes=-0"):
            r = call("GET", obj_path("rng", True), headers={"Range": rng})
            self.assertError(r, 416, "requestedRangeNotSatisfiable")
            self.assertEqual(r.header("content-range"), "bytes */5000")

    def test_multipart_crlf_and_lf(self):
        for eol in (b"\r\n", b"\n"):
            media = os.urandom(3000) + b"\r\n--not-the-boundary\r\n"
            meta = {"name": "mp", "crc32c": crc32c_ref(media),
                    "metadata": {"k": "v"}}
            body = eol.join([b"--BND", b"Content-Type: application/json",
                             b"", json.dumps(meta).encode(), b"--BND",
                             b"Content-Type: image/png", b"", media,
                             b"--BND--", b""])
            r = call("POST", "/upload/storage/v1/b/%s/o?uploadType=multipart"
                     % BUCKET, body,
                     {"Content-Type": "multipart/related; boundary='BND'"})
            self.assertEqual(r.status, 200, r.body)
            self.assertEqual(r.json()["contentType"], "image/png")
            self.assertEqual(r.json()["metadata"], {"k": "v"})
            self.assertEqual(call("GET", obj_path("mp", True)).body, media)

    def test_checksum_mismatch(self):
        r = upload_media("bad", b"abc", headers={"x-goog-hash":
                                                   "crc32c=AAAAAA=="})
        self.assertError(r, 400, "invalid")
        self.assertIn("CRC32C", r.json()["error"]["message"])
        r = upload_media("bad", b"abc", headers={
            "x-goog-hash": "md5=%s" % md5_b64(b"abd")})
        self.assertError(r, 400, "invalid")
        self.assertEqual(call("GET", obj_path("bad")).status, 404)
        r, loc = start_session("bad2", {"crc32c": crc32c_ref(b"x" * 10)})
        r = put(loc, b"y" * 10, "bytes 0-9/10")
        self.assertError(r, 400, "invalid")
        self.assertEqual(call("GET", obj_path("bad2")).status, 404)
        self.assertEqual(put(loc, b"", "bytes */*").status, 410)

    def test_resumable_protocol(self):
        data = os.urandom(3 * Q + 1000)
        r, loc = start_session("res", {"contentType": "a/b"}, headers={
            "X-Upload-Content-Length": str(len(data))})
        self.assertEqual(r.status, 200)
        self.assertTrue(loc.startswith(SRV.base + "/upload/storage/v1/"))
        # nothing persisted: 308 without Range
        r = put(loc, b"", "bytes */*")
        self.assertEqual(r.status, 308)
        self.assertIsNone(r.header("range"))
        # a piece not ending on 256 KiB keeps whole quanta only
        r = put(loc, data[:Q + 5000], "bytes 0-%d/*" % (Q + 4999))
        self.assertEqual((r.status, r.header("range")), (308, "bytes=0-%d"
                                                           % (Q - 1)))
        # a gap is refused, an overlap is accepted from the persisted end
        r = put(loc, data[2 * Q:3 * Q], "bytes %d-%d/*" % (2 * Q, 3 * Q - 1))
        self.assertError(r, 400, "invalid")
        r = put(loc, data[1000:3 * Q], "bytes 1000-%d/*" % (3 * Q - 1))
        self.assertEqual(r.header("range"), "bytes=0-%d" % (3 * Q - 1))
        r = put(loc, b"", "bytes */%d" % len(data))
        self.assertEqual(r.status, 308)
        r = put(loc, data[3 * Q:], "bytes %d-%d/%d" % (3 * Q, len(data) - 1,
                                                       len(data)))
        self.assertEqual(r.status, 200, r.body)
        res = r.json()
        self.assertEqual(res["size"], str(len(data)))
        self.assertEqual(res["md5Hash"], md5_b64(data))
        self.assertEqual(res["contentType"], "a/b")
        self.assertEqual(call("GET", obj_path("res", True)).body, data)
        # a finished session answers with the object again
        self.assertEqual(put(loc, b"", "bytes */*").json()["generation"],
                         res["generation"])
        # empty object, finalize with */0
        r, loc = start_session("empty")
        r = put(loc, b"", "bytes */0")
        self.assertEqual((r.status, r.json()["size"]), (200, "0"))
        # cancel: 499, then the session is gone
        r, loc = start_session("cancelled")
        put(loc, data[:Q], "bytes 0-%d/*" % (Q - 1))
        u = urllib.parse.urlsplit(loc)
        self.assertEqual(call("DELETE", u.path + "?" + u.query).status, 499)
        self.assertEqual(put(loc, b"", "bytes */*").status, 410)
        self.assertEqual(call("GET", obj_path("cancelled")).status, 404)

    def test_list_pages_prefixes(self):
        names = ["l/%03d" % i for i in range(7)] + ["l/d/x", "l/d/y", "l/e/z"]
        for n in names:
            upload_media(n, b"x")
        got, prefixes, pages, token = [], [], 0, None
        while True:
            q = "?prefix=l/&delimiter=/&maxResults=3"
            if token:
                q += "&pageToken=" + urllib.parse.quote(token)
            r = call("GET", "/storage/v1/b/%s/o%s" % (BUCKET, q)).json()
            pages += 1
            got += [i["name"] for i in r.get("items", [])]
            prefixes += r.get("prefixes", [])
            token = r.get("nextPageToken")
            if not token:
                break
        self.assertEqual(got, names[:7])
        self.assertEqual(prefixes, ["l/d/", "l/e/"])
        self.assertEqual(pages, 3)

    def test_compose(self):
        parts = [os.urandom(1000 + i) for i in range(32)]
        for i, p in enumerate(parts):
            upload_media("c/%02d" % i, p)
        src = [{"name": "c/%02d" % i} for i in range(32)]
        r = call("POST", obj_path("c/all") + "/compose",
                 {"sourceObjects": src, "destination": {}})
        self.assertEqual(r.status, 200, r.body)
        whole = b"".join(parts)
        self.assertEqual(r.json()["componentCount"], 32)
        self.assertNotIn("md5Hash", r.json())
        self.assertEqual(r.json()["crc32c"], crc32c_ref(whole))
        self.assertEqual(call("GET", obj_path("c/all", True)).body, whole)
        r = call("POST", obj_path("c/too") + "/compose",
                 {"sourceObjects": src + [{"name": "c/00"}]})
        self.assertError(r, 400, "invalid")
        gen = call("GET", obj_path("c/00")).json()["generation"]
        r = call("POST", obj_path("c/pre") + "/compose", {"sourceObjects": [
            {"name": "c/00", "objectPreconditions": {
                "ifGenerationMatch": int(gen) + 1}}]})
        self.assertError(r, 412, "conditionNotMet")

    def test_preconditions(self):
        r = upload_media("p", b"1", "&ifGenerationMatch=0")
        gen = r.json()["generation"]
        self.assertError(upload_media("p", b"2", "&ifGenerationMatch=0"),
                         412, "conditionNotMet")
        r, _ = start_session("p", query="&ifGenerationMatch=0")
        self.assertError(r, 412, "conditionNotMet")
        self.assertEqual(call("GET", obj_path("p") + "?ifGenerationNotMatch="
                              + gen).status, 304)
        self.assertError(call("GET", obj_path("p") + "?ifMetagenerationMatch"
                              "=2"), 412, "conditionNotMet")
        self.assertError(call("DELETE", obj_path("p") + "?ifGenerationMatch="
                              "1"), 412, "conditionNotMet")
        r = upload_media("p", b"3", "&ifGenerationMatch=" + gen)
        self.assertGreater(int(r.json()["generation"]), int(gen))
        self.assertEqual(call("GET", obj_path("p", True)).body, b"3")
        self.assertEqual(call("DELETE", obj_path("p")).status, 204)
        self.assertError(call("GET", obj_path("p")), 404, "notFound")
        self.assertError(call("GET", "/storage/v1/b/nope/o"), 404,
                         "notFound")

    def test_retry_test_interface(self):
        data = os.urandom(2 * Q)
        upload_media("rt", data)
        tid = retry_test({"storage.objects.get": ["return-503",
                                                  "return-broken-stream"],
                          "storage.objects.list": ["return-429"]})
        t = call("GET", "/retry_test/" + tid).json()
        self.assertFalse(t["completed"])
        self.assertError(call("GET", obj_path("rt", True), test_id=tid),
                         503, "backendError")
        with self.assertRaises((http.client.IncompleteRead, ConnectionError)):
            call("GET", obj_path("rt", True), test_id=tid)
        self.assertEqual(call("GET", obj_path("rt", True), test_id=tid).body,
                         data)
        self.assertEqual(call("GET", "/storage/v1/b/%s/o" % BUCKET,
                              test_id=tid).status, 429)
        self.assertTrue(call("GET", "/retry_test/" + tid).json()["completed"])
        self.assertEqual(call("DELETE", "/retry_test/" + tid).status, 200)
        self.assertEqual(call("GET", "/retry_test/" + tid).status, 404)
        # reset, and a stall that still delivers every byte
        tid = retry_test({"storage.objects.get": [
            "return-reset-connection", "stall-for-1s-after-128K",
            "return-broken-stream-after-256K"]})
        with self.assertRaises(ConnectionError):
            call("GET", obj_path("rt", True), test_id=tid)
        self.assertEqual(call("GET", obj_path("rt", True), test_id=tid).body,
                         data)
        with self.assertRaises(http.client.IncompleteRead) as cm:
            call("GET", obj_path("rt", True), test_id=tid)
        self.assertEqual(len(cm.exception.partial), Q)
        self.assertTrue(call("GET", "/retry_test/" + tid).json()["completed"])

    def test_retry_after_bytes_resumable(self):
        data = os.urandom(4 * Q)
        tid = retry_test({"storage.objects.insert": ["return-503-after-512K"]})
        _, loc = start_session("after")
        r = put(loc, data, "bytes 0-%d/%d" % (len(data) - 1, len(data)),
                test_id=tid)
        self.assertError(r, 503, "backendError")
        r = put(loc, b"", "bytes */*", test_id=tid)
        self.assertEqual(r.header("range"), "bytes=0-%d" % (2 * Q - 1))
        r = put(loc, data[2 * Q:], "bytes %d-%d/%d" % (2 * Q, len(data) - 1,
                                                       len(data)), test_id=tid)
        self.assertEqual(r.status, 200, r.body)
        self.assertEqual(r.json()["md5Hash"], md5_b64(data))
        self.assertTrue(call("GET", "/retry_test/" + tid).json()["completed"])
        bad = call("POST", "/retry_test", {"instructions": {
            "storage.objects.get": ["return-sometimes"]}})
        self.assertEqual(bad.status, 400)

    def test_conformance_file_instructions_known(self):
        # Google's retry conformance file: every instruction it uses must
        # be accepted (the client's runner then plays each case)
        cands = [os.environ.get("CKPT_RETRY_TESTS_JSON", "")] + [
            os.path.join(HERE, *up, "conformance", "storage-retry-tests.json")
            for up in ((), ("..", "..", "shared"),
                       ("..", "..", "..", "shared"))]
        path = next((c for c in cands if c and os.path.exists(c)), None)
        if path is None:
            self.skipTest("storage-retry-tests.json not found (set "
                          "CKPT_RETRY_TESTS_JSON)")
        with open(path) as f:
            suite = json.load(f)
        for sc in suite["retryTests"]:
            for case in sc["cases"]:
                for m in sc["methods"]:
                    r = call("POST", "/retry_test", {"instructions": {
                        m["name"]: case["instructions"]}})
                    self.assertEqual(r.status, 200, (m, case, r.body))


def check_no_md5():
    """--no-md5: crc32c only, still checked, across a cut-short piece."""
    data = os.urandom(4 * Q + 7)
    fails = []
    r = upload_media("nomd5", data)
    if r.status != 200 or "md5Hash" in r.json() or \
       r.json()["crc32c"] != crc32c_ref(data):
        fails.append("media upload %d %r" % (r.status, r.body[:300]))
    d = call("GET", obj_path("nomd5", True))
    if d.body != data or d.header("x-goog-hash") != \
       "crc32c=" + crc32c_ref(data):
        fails.append("download x-goog-hash %r" % d.header("x-goog-hash"))
    r = upload_media("nomd5-bad", data,
                     headers={"x-goog-hash": "crc32c=AAAAAA=="})
    if r.status != 400:
        fails.append("a wrong crc32c gave %d" % r.status)
    tid = retry_test({"storage.objects.insert": ["return-503-after-512K"]})
    _, loc = start_session("nomd5-resumed")
    crange = "bytes %d-%d/%d"
    r1 = put(loc, data, crange % (0, len(data) - 1, len(data)), test_id=tid)
    r2 = put(loc, data[2 * Q:], crange % (2 * Q, len(data) - 1, len(data)))
    if r1.status != 503 or r2.status != 200 or \
       r2.json()["crc32c"] != crc32c_ref(data) or "md5Hash" in r2.json():
        fails.append("resumed session %d %d %r" % (r1.status, r2.status,
                                                   r2.body[:300]))
    for f in fails:
        print("FAIL: --no-md5: " + f)
    return not fails


def run_protocol():
    global SRV
    with FakeGcs() as srv:
        SRV = srv
        suite = unittest.defaultTestLoader.loadTestsFromTestCase(Protocol)
        res = unittest.TextTestRunner(verbosity=2, stream=sys.stdout).run(
            suite)
    with FakeGcs("--no-md5") as srv:  # the benchmarks' mode
        SRV = srv
        if not check_no_md5():
            return 1
    # the random fault mode counts what it injects
    with FakeGcs("--fault-rate", "0.5", "--fault-seed", "3") as srv:
        SRV = srv
        ok = faults = 0
        for i in range(40):
            try:
                r = upload_media("soak/%d" % i, os.urandom(Q + i))
                ok += r.status == 200
            except (ConnectionError, http.client.HTTPException):
                pass
        st = call("GET", "/_fake/stats").json()
        faults = st["faults_total"]
        print("random faults: %d of %d requests, %d uploads ok" % (
            faults, st["requests"], ok))
        if not (0 < faults < 40 and ok == st["objects"] and
                ok + faults >= 40):
            print("FAIL: random fault accounting %r" % st)
            return 1
    return 0 if res.wasSuccessful() else 1


# --------------------------------------------------------------------------
# gcloud

def gcloud_env(cfg, token_file):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("CLOUDSDK_") or k in ("GOOGLE_APPLICATION_CREDENTIALS",
                                              "STORAGE_EMULATOR_HOST"):
            del env[k]
    env.update({
        "CLOUDSDK_CONFIG": cfg,
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    })
    # no network but loopback: anything else goes to a dead proxy
    for k in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        env[k] = "http://127.0.0.1:9"
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def run_gcloud():
    exe = shutil.which("gcloud") or ("/usr/bin/gcloud" if os.access(
        "/usr/bin/gcloud", os.X_OK) else None)
    if exe is None:
        skip("gcloud (Google Cloud CLI) is not installed")
    big_mib = int(os.environ.get("CKPT_GCS_BIG_MIB", "160"))
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with FakeGcs() as srv, tempfile.TemporaryDirectory(
            prefix="gcloud-fidelity-") as tmp:
        cfg = os.path.join(tmp, "cfg")
        os.mkdir(cfg)
        token = os.path.join(tmp, "token")
        with open(token, "w") as f:
            f.write("dummy-access-token\n")
        env = gcloud_env(cfg, token)

        def g(*args, ok=True):
            p = subprocess.run([exe] + list(args), env=env, cwd=tmp,
                               capture_output=True, timeout=900)
            if ok and p.returncode != 0:
                print("gcloud %s failed (%d):\n%s" % (
                    " ".join(args), p.returncode, p.stderr.decode()[-3000:]))
            return p

        for prop, val in (("core/project", "ckpt-test-project"),
                          ("auth/access_token_file", token),
                          ("api_endpoint_overrides/storage",
                           srv.base + "/storage/v1/"),
                          ("core/disable_usage_reporting", "true"),
                          ("component_manager/disable_update_check",
                           "true")):
            check(g("config", "set", prop, val).returncode == 0,
                  "config set " + prop)
        up = os.path.join(tmp, "up")
        os.mkdir(up)
        small = os.urandom(12345)
        with open(os.path.join(up, "small.bin"), "wb") as f:
            f.write(small)
        big_md5 = hashlib.md5()
        with open(os.path.join(up, "big.bin"), "wb") as f:
            for _ in range(big_mib):
                chunk = os.urandom(1 << 20)
                big_md5.update(chunk)
                f.write(chunk)
        dest = "gs://%s/g/" % BUCKET
        p = g("storage", "cp", os.path.join(up, "small.bin"),
              os.path.join(up, "big.bin"), dest)
        check(p.returncode == 0, "gcloud storage cp up (small + %d MiB)"
              % big_mib)
        st = call_stats(srv)
        check(st["methods"].get("storage.objects.insert", 0) >= 3,
              "the big upload took several requests (resumable/composite):"
              " %r" % st["methods"])
        meta = json.loads(urllib_get(srv, "/storage/v1/b/%s/o/g%%2Fbig.bin"
                                     % BUCKET))
        check(meta.get("size") == str(big_mib << 20), "big object size")
        small_meta = json.loads(urllib_get(
            srv, "/storage/v1/b/%s/o/g%%2Fsmall.bin" % BUCKET))
        check(small_meta.get("md5Hash") == md5_b64(small) and
              small_meta.get("crc32c") == crc32c_ref(small),
              "small object hashes")
        p = g("storage", "ls", dest)
        names = sorted(p.stdout.decode().split())
        check(names == [dest + "big.bin", dest + "small.bin"],
              "gcloud storage ls: %r" % names)
        p = g("storage", "ls", "-l", dest)
        out = p.stdout.decode()
        check(str(big_mib << 20) in out and "12345" in out,
              "gcloud storage ls -l sizes")
        p = g("storage", "cat", dest + "small.bin")
        check(p.stdout == small, "gcloud storage cat")
        down = os.path.join(tmp, "down")
        os.mkdir(down)
        p = g("storage", "cp", dest + "*", down)
        check(p.returncode == 0, "gcloud storage cp down")
        got = hashlib.md5()
        with open(os.path.join(down, "big.bin"), "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                got.update(b)
        check(got.digest() == big_md5.digest(), "big file byte-identical")
        with open(os.path.join(down, "small.bin"), "rb") as f:
            check(f.read() == small, "small file byte-identical")
        st2 = call_stats(srv)
        check(st2["methods"].get("storage.objects.get", 0) >
              st["methods"].get("storage.objects.get", 0),
              "downloads went to the fake server")
        # a directory tree: `cp -r` asks the bucket's storage layout first
        tree = os.path.join(tmp, "tree")
        os.makedirs(os.path.join(tree, "sub"))
        leaves = {"a.bin": os.urandom(3000),
                  os.path.join("sub", "b.bin"): os.urandom(5000)}
        for rel, data in leaves.items():
            with open(os.path.join(tree, rel), "wb") as f:
                f.write(data)
        rdest = "gs://%s/r/" % BUCKET
        p = g("storage", "cp", "-r", tree, rdest)
        check(p.returncode == 0, "gcloud storage cp -r DIR up")
        p = g("storage", "ls", "-r", rdest + "**")
        names = sorted(p.stdout.decode().split())
        check(names == [rdest + "tree/a.bin", rdest + "tree/sub/b.bin"],
              "gcloud storage cp -r: the tree's objects: %r" % names)
        rdown = os.path.join(tmp, "rdown")
        os.mkdir(rdown)
        p = g("storage", "cp", "-r", rdest + "tree", rdown)
        same = p.returncode == 0
        for rel, data in leaves.items():
            try:
                with open(os.path.join(rdown, "tree", rel), "rb") as f:
                    same = same and f.read() == data
            except OSError:
                same = False
        check(same, "gcloud storage cp -r down: the tree byte-identical")
        # errors as the real service reports them
        p = g("storage", "cp", "--if-generation-match=0",
              os.path.join(up, "small.bin"), dest + "small.bin", ok=False)
        err = p.stderr.decode()
        check(p.returncode != 0 and ("412" in err or "recondition" in err),
              "create-only precondition refused: %s" % err.strip()[-200:])
        p = g("storage", "cat", dest + "missing", ok=False)
        check(p.returncode != 0 and "matched no objects" in
              p.stderr.decode(), "cat of a missing object fails")
        p = g("storage", "ls", "gs://no-such-bucket-xyz/", ok=False)
        check(p.returncode != 0 and ("404" in p.stderr.decode() or
                                     "not found" in p.stderr.decode()),
              "ls of a missing bucket fails with 404")
    print("%d checks failed" % len(failures))
    return 1 if failures else 0


def urllib_get(srv, path):
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    c.request("GET", path)
    data = c.getresponse().read()
    c.close()
    return data


def call_stats(srv):
    return json.loads(urllib_get(srv, "/_fake/stats"))


# --------------------------------------------------------------------------
# node

def node_modules():
    """node_modules holding the pinned client; installs it if needed.
    The package has its own prefix under the shared cache, so installing
    another package there (suite 'metadata') cannot prune it."""
    root = os.environ.get("CKPT_NPM_CACHE", "/var/tmp/ckpt-npm")
    prefix = os.path.join(root, "%s-%s" % (NODE_PKG.replace("/", "+"),
                                           NODE_VERSION))
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
    env = dict(os.environ, NODE_PATH=mods)
    env.pop("STORAGE_EMULATOR_HOST", None)
    script = os.path.join(HERE, "test_gcs_fidelity.js")
    with FakeGcs() as srv:
        p = subprocess.run([node, script, srv.base, BUCKET], env=env,
                           timeout=600)
    if p.returncode != 0:
        return p.returncode
    # the random fault mode, as a soak would use it (seeded: repeatable)
    with FakeGcs("--fault-rate", "0.3", "--fault-seed", "5") as srv:
        p = subprocess.run([node, script, srv.base, BUCKET, "soak"], env=env,
                           timeout=600)
    return p.returncode


def main():
    modes = {"protocol": run_protocol, "gcloud": run_gcloud,
             "node": run_node, "npm-install": run_npm_install}
    if len(sys.argv) != 2 or sys.argv[1] not in modes:
        print("usage: test_gcs_fidelity.py protocol|gcloud|node|npm-install",
              file=sys.stderr)
        return 2
    socket.setdefaulttimeout(300)
    return modes[sys.argv[1]]()


if __name__ == "__main__":
    sys.exit(main())
