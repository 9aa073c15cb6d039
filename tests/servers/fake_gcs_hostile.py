"""Hostile modes of the fake Cloud Storage server (test-only, FAKE).

The retry-test interface (gcs_faults.py) makes the server fail the way the
real service does; these rules make it lie, to test that the product
(reader, uploads, ckptctl) never trusts what it cannot check. A rule
applies to API requests whose object name (uploads: ?name= or the
session's name; lists: ?prefix=) contains `match`, `times` times (0 or
absent: until cleared); `fired` counts the answers it really changed (an
error answer is left alone: it is the truth). Normal requests are served
by the documented protocol, untouched.

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
  range-lie        resumable pieces (the last one too) and status
                   queries: the bytes are dropped, the answer is a 308 whose
                   Range claims 1 MiB past the end of the piece
  foreign-location resumable initiation: the session URI names another
                   host (127.0.0.2:9); the session exists all the same
  silent           any request about a matching object (metadata, media,
                   uploads) gets no answer at all: it is held until the
                   rules are cleared (DELETE) or SILENT_MAX_S pass, then
                   its connection is dropped (a bucket that stopped
                   answering; clients wait out their own timeouts)

Hooks (fake_gcs.py calls two functions): control() serves the endpoint;
intercept() is called for each routed API request and answers it itself
(range-lie, endless-list) or installs, on that request's handler only, a
replacement of send_json / send_empty / sendfile (removed again at the
next request of the connection), so the handlers stay as documented.
"""

import itertools
import json
import threading
import urllib.parse

MODES = ("bad-crc", "truncate", "garbage-list", "garbage-stat",
         "garbage-upload", "endless-list", "range-lie", "foreign-location",
         "silent")
SILENT_MAX_S = 600
ENDLESS = itertools.count()
OVERRIDES = ("send_json", "send_empty", "sendfile")
GARBAGE = b'{"kind": "storage#object", "name": "x", "size": '


class Rules:
    """The rules, shared by every handler thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rules = []
        self.ids = itertools.count(1)
        self.cleared = threading.Event()  # set by DELETE: silent ends

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
            self.cleared.clear()
        return r

    def take(self, modes, target):
        """The first live rule of one of `modes` matching target."""
        if target is None:
            return None
        with self.lock:
            for r in self.rules:
                if r["mode"] in modes and r["match"] in target and \
                   (not r["times"] or r["fired"] < r["times"]):
                    return r
        return None

    def fire(self, rule):
        """The rule really changed an answer: counted."""
        with self.lock:
            rule["fired"] += 1


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
            rules.cleared.set()
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


def _garbage(h, rule):
    """send_json lying on success (an error status is the truth)."""
    real = h.send_json

    def send(code, obj, headers=()):
        if code != 200:
            return real(code, obj, headers)
        h.server.hostile.fire(rule)
        h.send_bytes(code, [("Content-Type", "application/json")] +
                     list(headers), GARBAGE)
    return send


def intercept(h, method, params):
    """Installs the rule that applies to this request, if any; True
    when the rule answered the request itself."""
    rules = h.server.hostile
    for name in OVERRIDES:  # one handler serves a whole connection
        h.__dict__.pop(name, None)
    if not rules.rules:
        return False
    target = _target(h, method, params)
    rule = rules.take(("silent",), target)
    if rule:
        _silent(h, rule)
    media = method == "storage.objects.get" and (
        h.args.get("alt") == "media" or
        h.rawpath.startswith("/download/"))
    if method == "storage.objects.list":
        rule = rules.take(("garbage-list", "endless-list"), target)
        if rule and rule["mode"] == "garbage-list":
            h.send_json = _garbage(h, rule)
        elif rule:
            return _endless(h, rule)
    elif media:
        rule = rules.take(("bad-crc", "truncate"), target)
        if rule:
            _media(h, rule)
    elif method == "storage.objects.get":
        rule = rules.take(("garbage-stat",), target)
        if rule:
            h.send_json = _garbage(h, rule)
    elif method == "storage.objects.insert":
        return _upload(h, rules, target)
    return False


def _silent(h, rule):
    """No answer: held until the rules are cleared, then dropped."""
    h.server.hostile.fire(rule)
    h.server.hostile.cleared.wait(SILENT_MAX_S)
    h.drop()


def _endless(h, rule):
    """A page with nothing in it and yet another token, every time."""
    h.server.hostile.fire(rule)
    h.body.drain()
    h.send_json(200, {"kind": "storage#objects",
                      "nextPageToken": "endless-%d" % next(ENDLESS)})
    return True


def _media(h, rule):
    real = h.sendfile

    def sendfile(f, offset, count):
        if count <= 0:
            return
        h.server.hostile.fire(rule)
        if rule["mode"] == "truncate":
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
        rule = rules.take(("foreign-location",), target)
        if rule:
            real = h.send_empty

            def send_empty(code, headers=(), reason=None):
                out = []
                for k, v in headers:
                    if k == "Location":
                        rules.fire(rule)
                        u = urllib.parse.urlsplit(v)
                        v = u._replace(netloc="127.0.0.2:9").geturl()
                    out.append((k, v))
                real(code, out, reason)
            h.send_empty = send_empty
        return False
    rule = rules.take(("range-lie",), target) if resumable_piece else None
    if rule:
        rules.fire(rule)
        # the piece is not stored; the answer claims 1 MiB past its end
        cr = h.headers.get("Content-Range", "")
        rng = cr[6:].partition("/")[0] if cr.startswith("bytes ") else "*"
        end = int(rng.partition("-")[2]) + 1 if "-" in rng else 0
        h.body.drain()
        h.send_empty(308, [("Range", "bytes=0-%d" % (end + (1 << 20) - 1))],
                     "Resume Incomplete")
        return True
    rule = rules.take(("garbage-upload",), target)
    if rule:
        h.send_json = _garbage(h, rule)
    return False
