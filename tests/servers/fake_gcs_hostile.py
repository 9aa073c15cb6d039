"""Hostile modes of the fake Cloud Storage server (test-only, FAKE).

The retry-test interface (gcs_faults.py) makes the server fail the way the
real service does; these rules make it lie, to test that the product
(reader, uploads, ckptctl) never trusts what it cannot check. A rule
applies to API requests whose object name (uploads: ?name= or the
session's name; lists: ?prefix=) contains `match`, `times` times (0 or
absent: until cleared); normal requests are served by the documented
protocol, untouched.

    POST /_fake/hostile {"mode": M, "match": S, "times": N} -> {"id"}
    GET /_fake/hostile -> {"rules": [{"id", "mode", "match", "fired"}]}
    DELETE /_fake/hostile -> every rule removed

Modes:
  bad-crc          media downloads: one byte of each answer flipped (the
                   x-goog-hash stays that of the stored object)
  truncate         media downloads: the headers promise every byte, half
                   of them are sent, then the connection is shut down
  garbage-list     objects.list answers 200 with half a JSON document
  garbage-stat     objects.get (metadata) answers 200 with half a document
  garbage-upload   the request that completes an upload (final resumable
                   piece, media or multipart insert) stores the object but
                   answers 200 with half a JSON document
  endless-list     objects.list: every page has no items and a new
                   nextPageToken
  range-lie        resumable pieces and status queries: 308 whose Range
                   claims 1 MiB more than the server holds
  foreign-location resumable initiation: the session URI names another
                   host (127.0.0.2:9); the session exists all the same

Hooks (fake_gcs.py calls two functions): control() serves the endpoint;
intercept() is called for each routed API request and installs, on that
request's handler only, a replacement of send_json / send_empty /
sendfile / status_308, so the handlers themselves stay as documented.
"""

import itertools
import json
import threading
import urllib.parse

MODES = ("bad-crc", "truncate", "garbage-list", "garbage-stat",
         "garbage-upload", "endless-list", "range-lie", "foreign-location")
GARBAGE = b'{"kind": "storage#object", "name": "x", "size": '


class Rules:
    """The rules, shared by every handler thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rules = []
        self.ids = itertools.count(1)

    def add(self, req):
        mode = req.get("mode")
        if mode not in MODES:
            raise ValueError("unknown mode %r (one of %s)" %
                             (mode, ", ".join(MODES)))
        r = {"id": next(self.ids), "mode": mode,
             "match": str(req.get("match", "")),
             "times": int(req.get("times") or 0), "fired": 0}
        with self.lock:
            self.rules.append(r)
        return r

    def take(self, modes, target):
        """The first rule of one of `modes` matching target, counted."""
        if target is None:
            return None
        with self.lock:
            for r in self.rules:
                if r["mode"] in modes and r["match"] in target and \
                   (not r["times"] or r["fired"] < r["times"]):
                    r["fired"] += 1
                    return r["mode"]
        return None


def control(h, method):
    """/_fake/hostile on handler h; True when answered."""
    rules = h.server.hostile
    if method == "POST":
        try:
            req = json.loads(h.body.read_all() or b"{}")
            r = rules.add(req)
        except (ValueError, AttributeError, TypeError) as e:
            h.send_bytes(400, [("Content-Type", "text/plain")],
                         str(e).encode())
            return True
        h.send_json(200, {"id": r["id"]})
        return True
    if method == "GET":
        with rules.lock:
            view = [dict(r) for r in rules.rules]
        h.send_json(200, {"rules": view})
        return True
    if method == "DELETE":
        with rules.lock:
            rules.rules = []
        h.send_empty(204)
        return True
    return False


def _target(h, method, params):
    """The object name (or list prefix) a request is about."""
    if method == "storage.objects.list":
        return h.args.get("prefix", "")
    if method == "storage.objects.insert":
        return h.args.get("name")
    if method == "storage.objects.get" and len(params) > 1:
        return params[1]
    return None


def _garbage(h):
    def send(code, obj, headers=()):
        h.send_bytes(code, [("Content-Type", "application/json")] +
                     list(headers), GARBAGE)
    return send


def intercept(h, method, params):
    """Installs the rule that applies to this request, if any."""
    rules = h.server.hostile
    if not rules.rules:
        return
    target = _target(h, method, params)
    media = method == "storage.objects.get" and (
        h.args.get("alt") == "media" or
        h.rawpath.startswith("/download/"))
    if method == "storage.objects.list":
        mode = rules.take(("garbage-list", "endless-list"), target)
        if mode == "garbage-list":
            h.send_json = _garbage(h)
        elif mode == "endless-list":
            _endless(h)
    elif media:
        mode = rules.take(("bad-crc", "truncate"), target)
        if mode:
            _media(h, mode)
    elif method == "storage.objects.get":
        if rules.take(("garbage-stat",), target):
            h.send_json = _garbage(h)
    elif method == "storage.objects.insert":
        _upload(h, rules, target)


def _endless(h):
    real = h.send_json
    count = itertools.count()

    def send(code, obj, headers=()):
        if code == 200 and isinstance(obj, dict):
            obj = {"kind": "storage#objects",
                   "nextPageToken": "endless-%s-%d" % (
                       h.args.get("pageToken", ""), next(count))}
        real(code, obj, headers)
    h.send_json = send


def _media(h, mode):
    real = h.sendfile

    def sendfile(f, offset, count):
        if count <= 0:
            return
        if mode == "truncate":
            real(f, offset, count // 2)
            h.drop()
        f.seek(offset)
        data = bytearray(f.read(count))
        data[len(data) // 2] ^= 0x01
        h.wfile.write(bytes(data))
        h.server.stats.add(bytes_out=count)
    h.sendfile = sendfile


def _upload(h, rules, target):
    resumable_piece = h.command == "PUT"
    initiation = h.command == "POST" and \
        h.args.get("uploadType") == "resumable"
    if initiation:
        if rules.take(("foreign-location",), target):
            real = h.send_empty

            def send_empty(code, headers=(), reason=None):
                out = []
                for k, v in headers:
                    if k == "Location":
                        u = urllib.parse.urlsplit(v)
                        v = u._replace(netloc="127.0.0.2:9").geturl()
                    out.append((k, v))
                real(code, out, reason)
            h.send_empty = send_empty
        return
    if resumable_piece and rules.take(("range-lie",), target):
        real = h.send_empty

        def status_308(up):
            hdr = [("X-GUploader-UploadID", up.id),
                   ("Range", "bytes=0-%d" % (up.persisted +
                                             (1 << 20) - 1))]
            real(308, hdr, "Resume Incomplete")
        h.status_308 = status_308
    if rules.take(("garbage-upload",), target):
        h.send_json = _garbage(h)
