#!/usr/bin/python3
"""fake_metadata: a scriptable loopback GCE metadata server for ckpt's tests.

Python 3 standard library only. Started by the tests on 127.0.0.1 with port
0; the chosen port is printed ("fake_metadata listening on
http://127.0.0.1:PORT") and, with --port-file, written atomically to a file
once the scenario's time-0 values are in place. SIGTERM/SIGINT stop it
cleanly (open long-polls are woken and their connections closed).

    python3 tests/servers/fake_metadata.py --port-file P \
        [--scenario FILE] [--absent KEY]... [--verbose]

Clients find it as they find the real one: GCE_METADATA_HOST=127.0.0.1:PORT
(Go, Python, gcloud's google-auth), GCE_METADATA_IP (Node's gcp-metadata,
google-auth's ping), GCE_METADATA_ROOT (gcloud's own on-GCE check).

  client --GET ...?wait_for_change=true&last_etag=E--> Handler --waits on-->
  Store.cond <--notify_all-- Store.set <-- /_fake/set | scenario thread

THE REAL PROTOCOL (what a VM's metadata server does; FAKE marks guesses
and simplifications):
- GET /computeMetadata/v1/<path>. Every request must carry
  `Metadata-Flavor: Google`, else 403 (an HTML body naming the missing
  header); a request carrying X-Forwarded-For is refused with 403 as well.
  Every reply (errors and redirects too) carries `Metadata-Flavor: Google`,
  `Server: Metadata Server for VM` and, for values, an `ETag` (16 hex
  digits; FAKE: a hash of the value, so a value set back gets its old
  ETag again).
  Methods other than GET/HEAD: 405. `/` and `/computeMetadata/` list the
  next level.
- A key that is not defined: 404. A directory without its trailing slash:
  301 to the slash form (FAKE: the query string kept). A directory lists
  its entries one per line (subdirectories end in `/`; the default
  service account appears twice, as `default/` and under its email);
  `?recursive=true` returns the whole subtree as JSON with camelCase
  names, names chosen by users (attribute keys, account emails) kept, and
  no token; FAKE: `?recursive=true&alt=text` gives "path value" lines.
- Leaves are text (`Content-Type: application/text`), numbers or JSON
  documents (token, upcoming-maintenance: `application/json`).
  `?alt=json` returns any value as JSON (a text value as a JSON string),
  `?alt=text` as text.
- `?wait_for_change=true`: hangs until the ETag of the value differs from
  `last_etag` (returns at once if it already differs) or, without
  last_etag, until the value changes from what it was when the request
  arrived; `timeout_sec=S` bounds the wait, after which the current value
  and its unchanged ETag are returned (200). Works on directories too
  (any change under them). FAKE: a key that is absent answers 404 at once,
  it does not wait for the key to appear. Any number of concurrent
  watchers.
- Keys served by default (a TPU VM, worker 0 of a v4-8 slice): see
  DEFAULTS below. instance/maintenance-event is NONE,
  MIGRATE_ON_HOST_MAINTENANCE, TERMINATE_ON_HOST_MAINTENANCE or
  SHUTDOWN_ON_HOST_MAINTENANCE; instance/preempted TRUE/FALSE;
  instance/upcoming-maintenance a JSON document with snake_case keys, or
  one of the "nothing scheduled" forms: {}, {"error": "no notifications
  have been received yet, try again later"}, NONE, absent (404) or a
  status override (503). The token's expires_in counts down from the
  value set (FAKE: it is never re-minted by itself).

TEST-ONLY EXTENSIONS (not part of any Google protocol; never faulted, no
Metadata-Flavor needed; bodies and replies are JSON):
- POST /_fake/set {"key": K, "value": V}: V a string, number, list (a
  text list, one item a line) or object (a JSON leaf). {"key": K,
  "absent": true} removes it (404). {"key": K, "status": 503, "body": B}
  makes the key answer that status. Reply: {"key", "etag", "changed",
  "at"} (at: time.monotonic() of the change, CLOCK_MONOTONIC, comparable
  across processes on Linux). {"set": [ITEM, ...]} applies several at
  once (one wake-up).
- GET /_fake/get?key=K: {"present", "value", "etag", "status"}.
- POST /_fake/scenario {"events": [EVENT, ...]} schedules events relative
  to now; EVENT is {"at_seconds": T (or "at"), "key": K, and "value": V |
  "absent": true | "status": N}. --scenario FILE loads the same (a list of
  events, or {"events": [...]}) relative to server start; events at T <= 0
  are applied before the port file is written.
- POST /_fake/fault {"kind": KIND, "count": N | "seconds": T, "key":
  PREFIX, "code": C, "hang_seconds": H, "open": true}: the next N matching
  requests (or every one for T seconds; default count 1) get the fault.
  key limits it to paths starting with PREFIX (relative to
  /computeMetadata/v1/). open: also hit the long-polls already waiting on
  a matching key. Kinds:
    status     answer C (default 503) with a short text body;
    hang       read the request and answer nothing for H s (default 10),
               then close the connection;
    garbage    200 with valid headers and a body of random bytes;
    not_http   a reply that is not HTTP at all;
    truncated  200, Transfer-Encoding: chunked, a chunk cut short, close;
    no_flavor  the normal reply without Metadata-Flavor;
    reset      close with SO_LINGER 0 (TCP RST) without answering.
  DELETE /_fake/fault (or POST {"kind": "clear"}) drops all faults.
- GET /_fake/stats: {"requests", "by_key": {path: n}, "long_polls",
  "open_long_polls", "open_by_key", "forbidden", "faults": {kind: n},
  "changes"}.
- GET /_fake/wait?long_polls=N[&key=K][&cmp=le][&timeout=S]: returns when
  at least (cmp=le: at most) N long-polls (on K, written without leading
  or trailing slash) are open (200) or after S s (default 30; 408), so
  tests change a value only once a watcher is really waiting, and see a
  watcher's abandoned polls go, without sleeping. A long-poll whose client
  has hung up is dropped within GONE_CHECK s, so open counts are true.
"""

import argparse
import hashlib
import http.server
import json
import os
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse

BASE = "/computeMetadata/v1/"
NO_FLAVOR_BODY = (
        "<!DOCTYPE html>\n<html lang=en>\n"
        "<title>Error 403 (Forbidden)</title>\n"
        "<p><b>403.</b> That's an error.\n<p>Your client does not have "
        "permission to get URL <code>%s</code> from this server. Missing "
        "Metadata-Flavor:Google header.\n")
UPCOMING_NONE_ERROR = {
        "error": "no notifications have been received yet, try again later"}

SA_EMAIL = "123456789012-compute@developer.gserviceaccount.com"
DEFAULTS = {
        "instance/attributes/accelerator-type": "v4-8",
        "instance/attributes/agent-worker-number": "0",
        "instance/attributes/tpu-env":
        "ACCELERATOR_TYPE: 'v4-8'\nNODE_ID: 'ckpt-test'\n"
        "WORKER_ID: '0'\nZONE: 'us-central2-b'\n",
        "instance/description": "ckpt test TPU VM",
        "instance/hostname":
        "t1v-n-0000-w-0.us-central2-b.c.ckpt-test.internal",
        "instance/id": 4660123456789012345,
        "instance/machine-type":
        "projects/123456789012/machineTypes/ct4p-hightpu-4t",
        "instance/maintenance-event": "NONE",
        "instance/name": "t1v-n-0000-w-0",
        "instance/preempted": "FALSE",
        "instance/scheduling/automatic-restart": "TRUE",
        "instance/scheduling/on-host-maintenance": "TERMINATE",
        "instance/scheduling/preemptible": "FALSE",
        "instance/service-accounts/default/aliases": ["default"],
        "instance/service-accounts/default/email": SA_EMAIL,
        "instance/service-accounts/default/scopes":
        ["https://www.googleapis.com/auth/cloud-platform"],
        "instance/service-accounts/default/token": {
        "access_token": "ya29.fake-metadata-token-1",
        "expires_in": 3599, "token_type": "Bearer"},
        "instance/upcoming-maintenance": UPCOMING_NONE_ERROR,
        # the default account is listed twice, as on a VM: as "default/" and
        # under its email (gcloud's `auth list` looks for the latter)
        "instance/zone": "projects/123456789012/zones/us-central2-b",
        "project/numeric-project-id": 123456789012,
        "project/project-id": "ckpt-test",
        "universe/universe-domain": "googleapis.com",
        }
for _k in [k for k in DEFAULTS if k.startswith("instance/service-accounts/")]:
    DEFAULTS[_k.replace("/default/", "/%s/" % SA_EMAIL)] = DEFAULTS[_k]
DEFAULTS["instance/service-accounts/%s/aliases" % SA_EMAIL] = ["default"]
# The token's expires_in is computed at request time (not in its ETag).
TOKEN_SUFFIX = "/token"
# how often a waiting long-poll checks that its client is still there
GONE_CHECK = 0.2
# directories whose entries are named by users, not by the server
USER_NAMED = ("attributes", "service-accounts")


def camel(name):
    return re.sub(r"-([a-z0-9])", lambda m: m.group(1).upper(), name)


def etag_of(obj):
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def text_of(v):
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "".join("%s\n" % x for x in v)
    if isinstance(v, dict):
        return json.dumps(v)
    return str(v)


class Leaf:
    """One key: a value, or a forced status (set with "status")."""

    def __init__(self, value=None, status=200, body=""):
        self.value = value
        self.status = status
        self.body = body
        self.set_at = time.monotonic()

    def token_view(self):
        """The token with expires_in counted down since it was set."""
        v = dict(self.value)
        left = int(v.get("expires_in", 0) -
                   (time.monotonic() - self.set_at))
        v["expires_in"] = max(0, left)
        return v


class Store:
    """The key tree (flat paths) under one lock and condition."""

    def __init__(self):
        self.cond = threading.Condition()
        self.leaves = {k: Leaf(v) for k, v in DEFAULTS.items()}
        self.changes = 0
        self.stopping = False

    def apply(self, item):
        """One set/absent/status item; caller holds cond. -> changed."""
        key = item["key"].strip("/")
        if not key or key.startswith("_fake"):
            raise ValueError("bad key %r" % item["key"])
        old = self.snapshot(key)
        if item.get("absent"):
            self.leaves.pop(key, None)
        elif "status" in item:
            self.leaves[key] = Leaf(None, int(item["status"]),
                                    item.get("body", ""))
        elif "value" in item:
            self.leaves[key] = Leaf(item["value"])
        else:
            raise ValueError("item needs value, absent or status")
        return self.snapshot(key) != old

    def set_many(self, items):
        with self.cond:
            changed = [self.apply(i) for i in items]
            self.changes += sum(changed)
            at = time.monotonic()
            self.cond.notify_all()
        return changed, at

    def snapshot(self, key):
        """Comparable state of a key or directory (caller holds cond)."""
        leaf = self.leaves.get(key)
        if leaf is not None:
            return ("leaf", leaf.status, leaf.body,
                    json.dumps(leaf.value, sort_keys=True))
        sub = self.subtree(key)
        return ("dir", json.dumps(sub, sort_keys=True)) if sub else None

    def children(self, key):
        """Direct entries of directory key: {name: is_dir}."""
        pre = key + "/" if key else ""
        out = {}
        for k in self.leaves:
            if k.startswith(pre):
                rest = k[len(pre):]
                name, sep, _ = rest.partition("/")
                out[name] = out.get(name, False) or bool(sep)
        return out

    def subtree(self, key, camelize=False):
        """Nested dict of the values under directory key."""
        pre = key + "/" if key else ""
        root = {}
        for k in sorted(self.leaves):
            if not k.startswith(pre) or self.leaves[k].status != 200 \
                    or k.endswith(TOKEN_SUFFIX):
                continue  # as on a VM: no token in listings
            parts = k[len(pre):].split("/")
            node = root
            full = k.split("/")
            off = len(full) - len(parts)
            for i, p in enumerate(parts):
                # names chosen by users (attribute keys, account emails)
                # are kept; built-in ones become camelCase
                user = off + i > 0 and full[off + i - 1] in USER_NAMED
                name = camel(p) if camelize and not user else p
                if i == len(parts) - 1:
                    node[name] = self.leaves[k].value
                else:
                    node = node.setdefault(name, {})
        return root


class Faults:
    """Queued faults; the first matching one is taken by a request."""

    KINDS = ("status", "hang", "garbage", "not_http", "truncated",
             "no_flavor", "reset")

    def __init__(self):
        self.lock = threading.Lock()
        self.items = []
        self.generation = 0  # bumped when an "open" fault is added

    def add(self, f):
        if f.get("kind") not in self.KINDS:
            raise ValueError("unknown fault kind %r" % f.get("kind"))
        f = dict(f)
        if "seconds" in f:
            f["until"] = time.monotonic() + float(f["seconds"])
        else:
            f["count"] = int(f.get("count", 1))
        with self.lock:
            self.items.append(f)
            if f.get("open"):
                self.generation += 1

    def clear(self):
        with self.lock:
            self.items = []

    def take(self, path, for_open=False):
        now = time.monotonic()
        with self.lock:
            self.items = [f for f in self.items
                          if f.get("until", now + 1) > now and
                          f.get("count", 1) > 0]
            for f in self.items:
                if for_open and not f.get("open"):
                    continue
                if not path.startswith(f.get("key", "")):
                    continue
                if "count" in f:
                    f["count"] -= 1
                return f
        return None


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.by_key = {}
        self.long_polls = 0
        self.open_by_key = {}
        self.forbidden = 0
        self.faults = {}

    def count(self, field, key=None):
        with self.lock:
            if key is None:
                setattr(self, field, getattr(self, field) + 1)
            else:
                d = getattr(self, field)
                d[key] = d.get(key, 0) + 1

    def open_poll(self, key, delta):
        with self.lock:
            self.open_by_key[key] = self.open_by_key.get(key, 0) + delta
            if self.open_by_key[key] == 0:
                del self.open_by_key[key]
            if delta > 0:
                self.long_polls += 1

    def view(self, store):
        with self.lock:
            return {"requests": self.requests,
                    "by_key": dict(self.by_key),
                    "long_polls": self.long_polls,
                    "open_long_polls": sum(self.open_by_key.values()),
                    "open_by_key": dict(self.open_by_key),
                    "forbidden": self.forbidden,
                    "faults": dict(self.faults),
                    "changes": store.changes}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def version_string(self):
        return "Metadata Server for VM"

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    # ---- plumbing
    def send(self, code, body, ctype="application/text", etag=None,
             flavor=True, extra=()):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        if flavor:
            self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", ctype)
        if etag:
            self.send_header("ETag", etag)
        self.send_header("X-XSS-Protection", "0")
        self.send_header("X-Frame-Options", "SAMEORIGIN")
        for k, v in extra:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, code, obj):
        self.send(code, json.dumps(obj) + "\n", "application/json")

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_GET(self):
        self.dispatch()

    def do_HEAD(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def dispatch(self):
        url = urllib.parse.urlsplit(self.path)
        self.args = dict(urllib.parse.parse_qsl(url.query,
                                                keep_blank_values=True))
        try:
            if url.path.startswith("/_fake/"):
                return self.control(url.path[len("/_fake/"):])
            return self.metadata(url.path)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ---- the test-only control interface
    def control(self, what):
        srv = self.server
        body = self.read_body()
        try:
            req = json.loads(body) if body.strip() else {}
        except ValueError:
            return self.send_json(400, {"error": "body is not JSON"})
        try:
            if what == "set" and self.command == "POST":
                items = req["set"] if "set" in req else [req]
                changed, at = srv.store.set_many(items)
                with srv.store.cond:
                    tags = [self.etag(i["key"].strip("/"))
                            for i in items]
                if "set" in req:
                    return self.send_json(200, {
                            "changed": changed, "etags": tags,
                            "at": at})
                return self.send_json(200, {
                        "key": req["key"], "etag": tags[0],
                        "changed": changed[0], "at": at})
            if what == "get":
                return self.send_json(200,
                                      self.inspect(self.args["key"]))
            if what == "scenario" and self.command == "POST":
                srv.schedule(req.get("events", []))
                return self.send_json(200, {"scheduled":
                        len(req.get("events", []))})
            if what == "fault" and self.command == "DELETE" or \
                    what == "fault" and req.get("kind") == "clear":
                srv.faults.clear()
                return self.send_json(200, {"cleared": True})
            if what == "fault" and self.command == "POST":
                srv.faults.add(req)
                if req.get("open"):
                    with srv.store.cond:
                        srv.store.cond.notify_all()
                return self.send_json(200, {"queued": req})
            if what == "stats":
                return self.send_json(200,
                                      srv.stats.view(srv.store))
            if what == "wait":
                return self.wait_polls()
        except (KeyError, ValueError, TypeError) as e:
            return self.send_json(400, {"error": repr(e)})
        return self.send_json(404, {"error": "no such control call"})

    def inspect(self, key):
        st = self.server.store
        key = key.strip("/")
        with st.cond:
            leaf = st.leaves.get(key)
            return {"present": st.snapshot(key) is not None,
                    "value": leaf.value if leaf else None,
                    "status": leaf.status if leaf else None,
                    "etag": self.etag(key)}

    def wait_polls(self):
        want = int(self.args.get("long_polls", 1))
        at_most = self.args.get("cmp") == "le"
        key = self.args.get("key")
        end = time.monotonic() + float(self.args.get("timeout", 30))
        stats = self.server.stats
        while True:
            with stats.lock:
                n = stats.open_by_key.get(key, 0) if key else \
                        sum(stats.open_by_key.values())
            if n <= want if at_most else n >= want:
                return self.send_json(200, {"open": n})
            if time.monotonic() >= end:
                return self.send_json(408, {"open": n})
            time.sleep(0.002)

    # ---- the metadata protocol
    def etag(self, key):
        """ETag of a key's state; caller holds store.cond."""
        return etag_of(self.server.store.snapshot(key))

    def metadata(self, path):
        srv = self.server
        srv.stats.count("requests")
        if self.command not in ("GET", "HEAD"):
            self.read_body()
            return self.send(405, "Method not allowed\n")
        if path in ("/", ""):
            return self.send(200, "computeMetadata/\n")
        if path == "/computeMetadata/":
            return self.send(200, "v1/\n")
        if not path.startswith(BASE) and path != BASE[:-1]:
            return self.send(404, "Not Found\n", "text/html")
        if self.headers.get("Metadata-Flavor") != "Google" or \
                self.headers.get("X-Forwarded-For") is not None:
            srv.stats.count("forbidden")
            return self.send(403, NO_FLAVOR_BODY % path, "text/html")
        key = path[len(BASE):]
        trailing = path.endswith("/") and path != BASE[:-1]
        key = key.strip("/")
        srv.stats.count("by_key", key or "/")
        fault = srv.faults.take(key)
        if fault is not None:
            return self.inject(fault, key)
        wait = self.args.get("wait_for_change", "").lower() in \
                ("true", "1")
        try:
            timeout = float(self.args["timeout_sec"]) \
                    if "timeout_sec" in self.args else None
        except ValueError:
            return self.send(400, "Bad timeout_sec\n")
        st = srv.store
        with st.cond:
            snap = st.snapshot(key)
            leaf = st.leaves.get(key)
            if wait and snap is not None and \
                    (leaf is None or leaf.status == 200):
                fault = self.long_poll(key, snap, timeout)
                snap = st.snapshot(key)
            reply = None if fault is not None or snap is None else \
                    self.render(key, snap, trailing, path)
        if fault is not None:
            return self.inject(fault, key)
        if reply is None:
            return self.send(404, "Not Found\n", "text/html")
        self.send(*reply)

    def long_poll(self, key, snap, timeout):
        """Wait (holding store.cond) until key's ETag differs from the
        target; returns a fault if an "open" fault hit this poll."""
        st = self.server.store
        target = self.args.get("last_etag") or etag_of(snap)
        end = None if timeout is None else time.monotonic() + timeout
        gen = self.server.faults.generation
        self.server.stats.open_poll(key or "/", 1)
        try:
            while etag_of(st.snapshot(key)) == target:
                if st.stopping:
                    raise ConnectionResetError("stopping")
                if self.server.faults.generation != gen:
                    gen = self.server.faults.generation
                    f = self.server.faults.take(key, True)
                    if f is not None:
                        return f
                left = None if end is None else \
                        end - time.monotonic()
                if left is not None and left <= 0:
                    break
                st.cond.wait(GONE_CHECK if left is None else
                             min(left, GONE_CHECK))
                if self.client_gone():
                    raise ConnectionResetError("client gone")
        finally:
            self.server.stats.open_poll(key or "/", -1)
        return None

    def client_gone(self):
        """True once the client has closed its end (EOF readable)."""
        sock = self.connection
        if not select.select([sock], [], [], 0)[0]:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def render(self, key, snap, trailing, path):
        """(code, body, ctype, etag[, ...]) for a key (holds cond)."""
        st = self.server.store
        tag = etag_of(snap)
        alt = self.args.get("alt", "")
        recursive = self.args.get("recursive", "").lower() in \
                ("true", "1")
        leaf = st.leaves.get(key)
        if leaf is not None:
            if leaf.status != 200:
                return (leaf.status, leaf.body or "%d\n" %
                        leaf.status, "application/text", tag)
            v = leaf.token_view() if key.endswith(TOKEN_SUFFIX) \
                    else leaf.value
            if alt == "json" or alt != "text" and \
                    isinstance(v, dict):
                return (200, json.dumps(v), "application/json",
                        tag)
            return (200, text_of(v), "application/text", tag)
        if not trailing:
            return (301, "", "text/html", None, True,
                    [("Location", self.path.replace(
                    path, path + "/", 1))])
        if recursive:
            sub = st.subtree(key, camelize=True)
            if alt == "text":
                lines = []
                self.flatten(sub, "", lines)
                return (200, "".join(lines), "application/text",
                        tag)
            return (200, json.dumps(sub), "application/json", tag)
        kids = st.children(key)
        names = sorted(n + ("/" if d else "") for n, d in kids.items())
        if alt == "json":
            return (200, json.dumps(names), "application/json", tag)
        return (200, "".join(n + "\n" for n in names),
                "application/text", tag)

    def flatten(self, node, pre, lines):
        for k in sorted(node):
            v = node[k]
            if isinstance(v, dict) and not pre.endswith("token/"):
                self.flatten(v, pre + k + "/", lines)
            elif isinstance(v, list):
                lines.extend("%s%s %s\n" % (pre, k, x) for x in v)
            else:
                lines.append("%s%s %s\n" % (pre, k, text_of(v)))

    # ---- faults
    def inject(self, f, key):
        srv = self.server
        kind = f["kind"]
        srv.stats.count("faults", kind)
        self.close_connection = kind != "status" and kind != "no_flavor"
        if kind == "status":
            code = int(f.get("code", 503))
            return self.send(code, "%d fault injected\n" % code)
        if kind == "no_flavor":
            with srv.store.cond:
                snap = srv.store.snapshot(key)
                tag = etag_of(snap)
                leaf = srv.store.leaves.get(key)
                body = text_of(leaf.value) if leaf else ""
            return self.send(200 if snap else 404, body,
                             etag=tag, flavor=False)
        if kind == "hang":
            srv.stop_event.wait(float(f.get("hang_seconds", 10)))
            return
        if kind == "garbage":
            return self.send(200, os.urandom(64), etag="0")
        if kind == "not_http":
            self.wfile.write(b"\x16\x03\x01garbage, not HTTP\r\n\r\n")
            return
        if kind == "truncated":
            self.wfile.write(
                    b"HTTP/1.1 200 OK\r\nMetadata-Flavor: Google\r\n"
                    b"Content-Type: application/text\r\n"
                    b"ETag: 0123456789abcdef\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    b"40\r\nTERMINATE_ON")
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            return
        if kind == "reset":
            self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER,
                    struct.pack("ii", 1, 0))
            self.connection.close()
            return


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512
    allow_reuse_address = True

    def __init__(self, addr, verbose=False):
        super().__init__(addr, Handler)
        self.verbose = verbose
        self.store = Store()
        self.faults = Faults()
        self.stats = Stats()
        self.stop_event = threading.Event()
        self.timers = []

    def get_request(self):
        conn, addr = super().get_request()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr

    def handle_error(self, request, client_address):
        if self.verbose:
            super().handle_error(request, client_address)

    def schedule(self, events, now_items=None):
        """Events relative to now; those at <= 0 go to now_items if a
        list is given (applied by the caller before serving)."""
        for ev in events:
            at = float(ev.get("at_seconds", ev.get("at", 0)))
            item = {k: v for k, v in ev.items()
                    if k not in ("at", "at_seconds")}
            if "key" not in item:
                raise ValueError("event without key: %r" % ev)
            if at <= 0 and now_items is not None:
                now_items.append(item)
                continue
            t = threading.Timer(max(at, 0), self.fire, (item,))
            t.daemon = True
            t.start()
            self.timers.append(t)

    def fire(self, item):
        if not self.stop_event.is_set():
            self.store.set_many([item])

    def stop(self):
        self.stop_event.set()
        for t in self.timers:
            t.cancel()
        with self.store.cond:
            self.store.stopping = True
            self.store.cond.notify_all()
        self.shutdown()


def load_scenario(path):
    with open(path) as f:
        sc = json.load(f)
    return sc["events"] if isinstance(sc, dict) else sc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--scenario", help="JSON events, see the file's top")
    ap.add_argument("--absent", action="append", default=[],
                    help="a key this VM does not have (404); repeatable")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()

    srv = Server((a.host, a.port), a.verbose)
    now = [{"key": k, "absent": True} for k in a.absent]
    if a.scenario:
        srv.schedule(load_scenario(a.scenario), now)
    if now:
        srv.store.set_many(now)
    port = srv.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, a.port_file)
    print("fake_metadata listening on http://%s:%d" % (a.host, port),
          flush=True)

    def stop(*_):
        threading.Thread(target=srv.stop, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
