#!/usr/bin/python3
"""fake_gcs: a loopback Cloud Storage (JSON API) server for ckpt's tests.

Python 3 standard library only (ctypes to ISA-L for CRC32C when present).
Started by the tests on 127.0.0.1 with port 0; the chosen port is printed
("fake_gcs listening on http://127.0.0.1:PORT") and, with --port-file, written
atomically to a file. SIGTERM/SIGINT stop it cleanly (the data directory is
removed unless --data-dir was given).

    python3 tests/servers/fake_gcs.py --port-file P --bucket ckpt \
        [--data-dir D] [--fault-rate 0.1 --fault-seed 7] [--rate-limit]
        [--hash-headers joined|split] [--no-md5] [--verbose]

Data path: request bodies are read from the socket in pieces of up to 1 MiB
into one buffer per connection and written straight into a file under the
data directory (hashed on the way: MD5 by hashlib in a helper thread, CRC32C
by ISA-L; both drop the GIL, so streams hash in parallel), downloads go out
with sendfile(2) from the object's file; nothing is held whole in memory.
Its own ceiling on loopback: bench/gcs_ceiling.sh.

  client --PUT/POST--> Body.readinto --> file in DATA/uploads --rename-->
  DATA/objects/GEN-x (immutable) --sendfile--> client (GET ?alt=media)

What it implements (as Cloud Storage does; differences are marked FAKE):
- Paths: /storage/v1/b[/B[/o[/NAME[/compose|/copyTo/b/B/o/N|/rewriteTo/..]]]]
  (NAME percent-encoded, %2F for '/'), /upload/storage/v1/b/B/o (and its
  alias /resumable/upload/storage/v1/b/B/o, which gcloud's apitools uses),
  /download/storage/v1/b/B/o/NAME. ?alt=media downloads the bytes.
- Buckets: insert (409 if it exists), get, list, patch/update, delete (409
  when not empty), getStorageLayout (flat namespace). --bucket NAME
  precreates one (repeatable).
- Uploads: uploadType=media (raw body, ?name=), multipart (multipart/related:
  a JSON metadata part, then the media part) and resumable: POST gives 200
  with `Location: http://HOST/upload/storage/v1/b/B/o?uploadType=resumable&
  name=N&upload_id=ID` (same host as the request). PUT with `Content-Range:
  bytes A-B/*` (more to come), `bytes A-B/T` (last piece) or `bytes */T`
  (finalize), `bytes */*` (status query). A non-final piece is persisted only
  up to the last 256 KiB boundary it reaches (the rest is dropped, as the
  service may do); bytes already persisted are skipped when a piece overlaps;
  a piece starting past the persisted end is a 400. Open session: 308 with
  `Range: bytes=0-N` (no Range header when nothing is persisted). Final
  piece: 200 with the object resource; a finished session answers 200 with
  the same resource again. DELETE on the session URI cancels: 499, later
  requests on it get 410. Preconditions are checked at initiation and again
  at finalization. X-Upload-Content-Length, if given, must match the total.
- Checksums: crc32c/md5Hash in the metadata (multipart part, resumable
  initiation body) and `x-goog-hash: crc32c=..,md5=..` on the request that
  completes the upload are checked; a mismatch is 400 (reason invalid,
  "Provided CRC32C \"X\" doesn't match calculated CRC32C \"Y\".") and no
  object is created (a resumable session is then dead: 410).
- Downloads: x-goog-hash (crc32c and, for non-composite objects, md5; one
  joined header, or two with --hash-headers split), x-goog-generation,
  x-goog-metageneration, x-goog-stored-content-length,
  x-goog-stored-content-encoding, ETag; `Range: bytes=a-b | a- | -n` gives 206
  with Content-Range; an unsatisfiable range gives 416 with `Content-Range:
  bytes */SIZE` and a JSON error (requestedRangeNotSatisfiable); a malformed
  or multi-part Range is ignored (200, whole object).
- Objects: get (?generation=), list (prefix, delimiter -> prefixes,
  startOffset, endOffset, includeTrailingDelimiter, maxResults <= 1000
  counting items and prefixes, pageToken/nextPageToken), delete (204),
  patch/update (metageneration + 1), compose (1..32 sources, else 400; at most
  1024 components; the CRC32C is combined, no md5Hash, componentCount set),
  copyTo and rewriteTo (done in one call).
- Preconditions: ifGenerationMatch (0 = must not exist),
  ifGenerationNotMatch, ifMetagenerationMatch, ifMetagenerationNotMatch, and
  ifSource* on copy/rewrite: 412 conditionNotMet; on reads the NotMatch forms
  give 304 with no body. 404 notFound for missing objects and buckets.
- --no-md5: FAKE, test-only, for benchmarks: MD5 (the server's costliest
  step, a few hundred MB/s per stream) is not computed: objects carry no
  md5Hash and downloads no md5= in x-goog-hash, exactly as the service
  does for composite objects (clients then validate with crc32c), and an
  MD5 given by the client is not checked. CRC32C is still checked.
- --rate-limit: FAKE opt-in: a second write to one object name within 1 s is
  429 rateLimitExceeded (the service's documented limit, enforced loosely
  there; off by default).

Fault injection, storage-testbench's retry-test interface:
- POST /retry_test {"instructions": {METHOD: [INSTR, ...]}} -> 200
  {"id", "instructions", "transport", "completed": false}; GET
  /retry_test/ID (404 if unknown); DELETE /retry_test/ID; GET /retry_tests.
- A request with `x-retry-test-id: ID` is mapped to its method name
  (storage.objects.insert for every upload request, POST and PUT;
  storage.objects.delete for cancelling a session, as the testbench does;
  storage.objects.get/list/compose/delete/patch/update/copy/rewrite,
  storage.buckets.list/insert/get/patch/update/delete) and takes the first
  queued instruction of that method:
  return-X: answers X at once with a JSON error (the request body is read
    and dropped first, so the client sees the answer).
  return-X-after-YK (uploads only): the upload's bytes are taken up to
    object offset Y KiB (for a resumable session, persisted up to the last
    256 KiB boundary not past Y), the rest of the body is read and dropped,
    then X is answered. A request whose session already holds >= Y KiB
    gets X at once (as the testbench). A request that never reaches Y KiB
    is served normally and the instruction stays queued. FAKE: simple and
    multipart uploads count body bytes (the testbench ignores them).
  return-reset-connection: SO_LINGER 0 + close, before reading the body.
  return-broken-stream: the status line, headers and the first 4 bytes of
    the answer body are sent, then the connection is shut down.
  return-broken-stream-after-YK: same after Y KiB of the answer body.
    An answer no longer than the limit is sent whole, not consumed.
  stall-for-Ts-after-YK: after Y KiB of the upload body (uploads) or of the
    answer body (other requests) the server sleeps T s, then goes on.
- FAKE random faults for soaks: --fault-rate P --fault-seed S (see
  gcs_faults.RandomFaults). GET /_fake/stats returns {"requests" (API
  requests), "methods": {method: n}, "faults": {label: n} (faults that
  really fired, by instruction or random-KIND), "faults_total", "bytes_in",
  "bytes_out", "objects" (live objects), "uploads_open" (resumable
  sessions neither finished nor cancelled; ?prefix=P counts only those of
  objects named P...), "uploads" (up to 16 of those: name, bytes
  persisted)}. The control paths
  (/retry_test*, /_fake/*, /) never fault.
- FAKE hostile modes (POST /_fake/hostile): answers that lie (a flipped
  byte under a true x-goog-hash, a truncated body, garbage JSON, an
  endless list, a 308 claiming unsent bytes, a session URI on another
  host) or no answer at all, for matching objects only; see
  fake_gcs_hostile.py.
- FAKE lost replies (POST /_fake/lost_reply {"bucket", "name", "times"}):
  the request completing an upload to that object stores it, then the
  connection is reset instead of answering, `times` times; see
  gcs_faults.py.

Not implemented: ACLs/IAM, object versioning (noncurrent generations),
XML API, batch requests, gRPC, signed URLs, retention/holds, CSEK/KMS,
gzip transcoding, per-request auth (any or no Authorization is accepted).
"""

import argparse
import http.server
import json
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fake_gcs_hostile  # noqa: E402
from gcs_faults import LostReplies, RandomFaults, RetryTests  # noqa: E402
from gcs_hash import Hasher, b64_crc  # noqa: E402
from gcs_store import GcsError, Store, bad_request  # noqa: E402
from gcs_upload import PIECE, UploadMixin  # noqa: E402

SOCK_BUF = 4 << 20
JSON_LIMIT = 16 << 20


class Dropped(Exception):
    """The connection was dropped on purpose (a fault): stop handling."""


class Body:
    """The request body: Content-Length or chunked, read once."""

    def __init__(self, rfile, length, chunked):
        self.rfile = rfile
        self.chunked = chunked
        self.left = length  # bytes left (of the current chunk if chunked)
        self.done = (not chunked) and length == 0
        self.total = 0

    def _next_chunk(self):
        line = self.rfile.readline(65537)
        if not line:
            raise ConnectionError("EOF in chunked body")
        self.left = int(line.split(b";")[0].strip() or b"0", 16)
        if self.left == 0:
            while self.rfile.readline(65537) not in (b"\r\n", b"\n",
                                                     b""):
                pass
            self.done = True

    def readinto(self, mv):
        if self.done:
            return 0
        if self.chunked and self.left == 0:
            self._next_chunk()
            if self.done:
                return 0
        n = self.rfile.readinto(mv[:min(len(mv), self.left)])
        if not n:
            raise ConnectionError("EOF in request body")
        self.left -= n
        self.total += n
        if self.left == 0:
            if self.chunked:
                self.rfile.readline(3)
            else:
                self.done = True
        return n

    def read_all(self, limit=JSON_LIMIT):
        out = bytearray()
        buf = bytearray(65536)
        mv = memoryview(buf)
        while True:
            n = self.readinto(mv)
            if not n:
                return bytes(out)
            out += mv[:n]
            if len(out) > limit:
                raise bad_request("Request body too large.")

    def drain(self):
        buf = bytearray(PIECE)
        mv = memoryview(buf)
        while self.readinto(mv):
            pass


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.faults = {}
        self.methods = {}

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def method(self, name):
        with self.lock:
            self.requests += 1
            self.methods[name] = self.methods.get(name, 0) + 1

    def fault(self, label):
        with self.lock:
            self.faults[label] = self.faults.get(label, 0) + 1


def copy_range(src, dst, n):
    """Copy n bytes from the current offset of src to dst (files)."""
    left = n
    while left > 0:
        try:
            k = os.copy_file_range(src.fileno(), dst.fileno(), left)
        except OSError:
            k = 0
        if k <= 0:
            data = src.read(min(left, PIECE))
            if not data:
                raise IOError("short source object")
            dst.write(data)
            k = len(data)
        left -= k


def parse_range(value, size):
    """(start, end) inclusive, None for no/ignored range, 'unsat' for 416."""
    if not value or not value.startswith("bytes=") or "," in value:
        return None
    a, sep, b = value[6:].strip().partition("-")
    if not sep:
        return None
    try:
        if a == "":
            n = int(b)
            if n <= 0 or size == 0:
                return "unsat"
            return max(0, size - n), size - 1
        start = int(a)
        end = int(b) if b else size - 1
    except ValueError:
        return None
    if start >= size:
        return "unsat"
    if end < start:
        return None
    return start, min(end, size - 1)


class Handler(UploadMixin, http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def version_string(self):
        return "fake_gcs"

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    def do_GET(self):
        self.dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    # ---------- plumbing ----------
    def base(self):
        host = self.headers.get("Host") or "%s:%d" % \
                self.server.server_address[:2]
        return "http://" + host

    def dispatch(self):
        self.fault = None
        self.method = ""
        url = urllib.parse.urlsplit(self.path)
        self.rawpath = url.path
        q = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        self.args = {k: v[-1] for k, v in q.items()}
        te = self.headers.get("Transfer-Encoding", "").lower()
        try:
            cl = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            cl = 0
        self.body = Body(self.rfile, cl, "chunked" in te)
        try:
            if not self.control():
                self.api()
        except GcsError as e:
            self.send_error_json(e)
        except (Dropped, ConnectionError, BrokenPipeError):
            self.close_connection = True
            return
        finally:
            self.server.stats.add(bytes_in=self.body.total)
        if not self.body.done:
            self.close_connection = True

    def api(self):
        route = self.route()
        if route is None:
            self.body.drain()
            raise GcsError(404, "notFound", "Not Found")
        method, fn, params = route
        self.method = method
        st = self.server.stats
        st.method(method)
        if fake_gcs_hostile.intercept(self, method, params):
            return
        tid = self.headers.get("x-retry-test-id")
        if tid:
            self.fault = self.server.retry.next_fault(tid, method)
        elif self.server.random:
            self.fault = self.server.random.next_fault(
                    self.has_upload_body(method),
                    method == "storage.objects.get" and
                    (self.args.get("alt") == "media" or
                     self.rawpath.startswith("/download/")))
        f = self.fault
        if f is not None:
            if f.kind == "reset":
                self.fire(f)
                self.reset()
            if f.kind == "status" and (f.after is None or
                                       not self.has_upload_body(
                                               method)):
                if f.after is not None:
                    self.fault = None  # not applicable
                else:
                    self.fire(f)
                    self.body.drain()
                    raise self.injected(f.code)
        fn(*params)

    def has_upload_body(self, method):
        return method == "storage.objects.insert"

    def fire(self, f):
        f.fire()
        self.server.stats.fault(f.label)

    def lost_reply(self, bucket, name):
        """An upload was just stored: reset instead of answering, if a
        lost-reply rule says so."""
        f = self.server.lost.take(bucket, name)
        if f is not None:
            self.fire(f)
            self.reset()

    def injected(self, code):
        reasons = {400: "invalid", 401: "required", 403: "forbidden",
                   404: "notFound", 408: "requestTimeout",
                   412: "conditionNotMet", 429: "rateLimitExceeded",
                   500: "backendError", 502: "backendError",
                   503: "backendError", 504: "backendError"}
        return GcsError(code, reasons.get(code, "invalid"),
                        "Retry Test: Caused a %d" % code)

    def reset(self):
        s = self.connection
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                         struct.pack("ii", 1, 0))
            os.close(s.detach())
        except OSError:
            pass
        raise Dropped()

    def drop(self):
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        raise Dropped()

    def send_head(self, code, headers, length, reason=None):
        self.send_response(code, reason)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()

    def out_fault(self, length):
        """The answer-side fault (broken/stall), if it applies."""
        f = self.fault
        if f is None or f.fired or f.kind not in ("broken", "stall"):
            return None
        if f.kind == "stall" and self.has_upload_body(self.method):
            return None
        if f.after >= length and not (f.kind == "stall" and
                                      f.after == 0):
            return None
        return f

    def send_bytes(self, code, headers, data, reason=None):
        self.send_head(code, headers, len(data), reason)
        if self.command == "HEAD":
            return
        f = self.out_fault(len(data)) if data else None
        if f is not None:
            self.wfile.write(data[:f.after])
            self.fire(f)
            if f.kind == "broken":
                self.drop()
            time.sleep(f.seconds)
            data = data[f.after:]
        self.wfile.write(data)
        self.server.stats.add(bytes_out=len(data))

    def send_json(self, code, obj, headers=()):
        data = json.dumps(obj).encode()
        h = [("Content-Type", "application/json; charset=UTF-8")]
        self.send_bytes(code, h + list(headers), data)

    def send_empty(self, code, headers=(), reason=None):
        self.send_head(code, list(headers), 0, reason)

    def send_error_json(self, e):
        if not self.body.done:
            try:
                self.body.drain()
            except (ConnectionError, ValueError):
                self.close_connection = True
                return
        body = e.body()
        hdrs = list(e.headers.items())
        if body is None:
            self.send_empty(e.code, hdrs)
        else:
            self.send_json(e.code, body, hdrs)

    def read_json(self):
        raw = self.body.read_all()
        if not raw.strip():
            return {}
        try:
            v = json.loads(raw)
        except ValueError:
            raise GcsError(400, "parseError", "Parse Error")
        if not isinstance(v, dict):
            raise GcsError(400, "parseError", "Parse Error")
        return v

    # ---------- control endpoints (never faulted) ----------
    def control(self):
        p, m = self.rawpath, self.command
        srv = self.server
        if p == "/" and m == "GET":
            self.send_bytes(200, [("Content-Type", "text/plain")],
                            b"OK")
            return True
        if p == "/_fake/stats" and m == "GET":
            st = srv.stats
            with st.lock:
                d = {"requests": st.requests,
                     "bytes_in": st.bytes_in,
                     "bytes_out": st.bytes_out,
                     "faults": dict(st.faults),
                     "faults_total": sum(st.faults.values()),
                     "methods": dict(st.methods)}
            d["objects"] = srv.store.object_count()
            pre = self.args.get("prefix", "")
            op = [u for u in list(srv.store.uploads.values())
                  if u.state == "open" and u.name.startswith(pre)]
            d["uploads_open"] = len(op)
            d["uploads"] = [{"name": u.name, "persisted": u.persisted}
                            for u in op[:16]]
            self.send_json(200, d)
            return True
        if p == "/_fake/hostile":
            return fake_gcs_hostile.control(self, m)
        if p == "/_fake/lost_reply":
            return self.control_lost_reply(m)
        if p == "/retry_tests" and m == "GET":
            self.send_json(200, {"retry_test": srv.retry.list()})
            return True
        if p == "/retry_test" and m == "POST":
            try:
                req = json.loads(self.body.read_all() or b"{}")
                t = srv.retry.create(req.get("instructions"),
                                     req.get("transport",
                                             "HTTP"))
            except (ValueError, AttributeError) as e:
                self.send_bytes(400, [("Content-Type",
                                       "text/plain")],
                                str(e).encode())
                return True
            self.send_json(200, t)
            return True
        if p.startswith("/retry_test/"):
            tid = p[len("/retry_test/"):]
            if m == "GET":
                t = srv.retry.get(tid)
                if t is None:
                    raise GcsError(404, "notFound",
                                   "Retry Test %s not "
                                   "found" % tid)
                self.send_json(200, t)
                return True
            if m == "DELETE":
                if not srv.retry.delete(tid):
                    raise GcsError(404, "notFound",
                                   "Retry Test %s not "
                                   "found" % tid)
                self.send_bytes(200, [("Content-Type",
                                       "text/plain")],
                                ("Deleted %s" % tid).encode())
                return True
        return False

    def control_lost_reply(self, m):
        lost = self.server.lost
        if m == "POST":
            try:
                r = lost.arm(json.loads(self.body.read_all() or b"{}"))
            except ValueError as e:
                self.send_bytes(400, [("Content-Type", "text/plain")],
                                str(e).encode())
                return True
            self.send_json(200, r)
            return True
        if m == "GET":
            self.send_json(200, {"rules": lost.view()})
            return True
        if m == "DELETE":
            lost.clear()
            self.send_empty(204)
            return True
        return False

    # ---------- routing ----------
    def route(self):
        p, m = self.rawpath, self.command
        unq = urllib.parse.unquote
        for prefix, kind in (("/storage/v1/", "json"),
                             ("/upload/storage/v1/", "upload"),
                             ("/resumable/upload/storage/v1/", "upload"),
                             ("/download/storage/v1/", "download")):
            if p.startswith(prefix):
                parts = p[len(prefix):].split("/")
                break
        else:
            return None
        if parts[0] != "b":
            return None
        if kind == "upload":
            if len(parts) != 3 or parts[2] != "o":
                return None
            b = unq(parts[1])
            return {"POST": ("storage.objects.insert",
                             self.h_insert, (b,)),
                    "PUT": ("storage.objects.insert", self.h_chunk,
                            (b,)),
                    "DELETE": ("storage.objects.delete",
                               self.h_cancel, (b,))}.get(m)
        if kind == "download":
            if len(parts) < 4 or parts[2] != "o" or m != "GET":
                return None
            return ("storage.objects.get", self.h_get,
                    (unq(parts[1]), unq("/".join(parts[3:])), True))
        if len(parts) == 1 or (len(parts) == 2 and parts[1] == ""):
            return {"GET": ("storage.buckets.list",
                            self.h_bucket_list, ()),
                    "POST": ("storage.buckets.insert",
                             self.h_bucket_insert, ())}.get(m)
        b = unq(parts[1])
        if m == "POST" and self.headers.get(
                        "X-HTTP-Method-Override", "").upper() == "PATCH":
            m = "PATCH"
        if len(parts) == 2:
            return {"GET": ("storage.buckets.get",
                            self.h_bucket_get, (b,)),
                    "PATCH": ("storage.buckets.patch",
                              self.h_bucket_patch, (b,)),
                    "PUT": ("storage.buckets.update",
                            self.h_bucket_patch, (b,)),
                    "DELETE": ("storage.buckets.delete",
                               self.h_bucket_delete, (b,))}.get(m)
        if parts[2:] == ["storageLayout"] and m == "GET":
            return ("storage.buckets.getStorageLayout",
                    self.h_bucket_layout, (b,))
        if parts[2] != "o":
            return None
        if len(parts) == 3 or (len(parts) == 4 and parts[3] == ""):
            if m == "GET":
                return ("storage.objects.list", self.h_list,
                        (b,))
            return None
        op = parts[3:]
        if m == "POST" and len(op) == 2 and op[1] == "compose":
            return ("storage.objects.compose", self.h_compose,
                    (b, unq(op[0])))
        if m == "POST" and len(op) == 6 and op[2] == "b" and \
           op[4] == "o" and op[1] in ("copyTo", "rewriteTo"):
            meth = "storage.objects." + op[1][:-2]
            return (meth, self.h_copy,
                    (b, unq(op[0]), unq(op[3]), unq(op[5]),
                     op[1] == "rewriteTo"))
        name = unq("/".join(op))
        return {"GET": ("storage.objects.get", self.h_get,
                        (b, name, False)),
                "PATCH": ("storage.objects.patch", self.h_patch,
                          (b, name, False)),
                "PUT": ("storage.objects.update", self.h_patch,
                        (b, name, True)),
                "DELETE": ("storage.objects.delete", self.h_delete,
                           (b, name))}.get(m)

    # ---------- buckets ----------
    def h_bucket_list(self):
        base = self.base()
        with self.server.store.lock:
            bs = sorted(self.server.store.buckets.values(),
                        key=lambda b: b.name)
        prefix = self.args.get("prefix", "")
        items = [b.resource(base) for b in bs
                 if b.name.startswith(prefix)]
        self.send_json(200, {"kind": "storage#buckets",
                             "items": items})

    def h_bucket_insert(self):
        req = self.read_json()
        name = req.get("name") or self.args.get("name", "")
        b = self.server.store.create_bucket(name, req)
        self.send_json(200, b.resource(self.base()))

    def h_bucket_get(self, name):
        st = self.server.store
        with st.lock:
            b = st.bucket(name)
        self.send_json(200, b.resource(self.base()))

    def h_bucket_layout(self, name):
        # buckets.getStorageLayout (gcloud storage cp -r asks it first)
        st = self.server.store
        with st.lock:
            r = st.bucket(name).resource(self.base())
        self.send_json(200, {"kind": "storage#storageLayout",
                             "bucket": name, "location": r["location"],
                             "locationType": r["locationType"],
                             "hierarchicalNamespace": {"enabled": False}})

    def h_bucket_patch(self, name):
        req = self.read_json()
        st = self.server.store
        with st.lock:
            b = st.bucket(name)
            if isinstance(req.get("labels"), dict):
                for k, v in req["labels"].items():
                    if v is None:
                        b.labels.pop(k, None)
                    else:
                        b.labels[k] = str(v)
            b.metageneration += 1
            b.updated = time.time()
        self.send_json(200, b.resource(self.base()))

    def h_bucket_delete(self, name):
        self.server.store.delete_bucket(name)
        self.send_empty(204)

    # ---------- object reads ----------
    def h_list(self, bucket):
        items, prefixes, nxt = self.server.store.list(bucket,
                                                       self.args)
        base = self.base()
        r = {"kind": "storage#objects"}
        if nxt:
            r["nextPageToken"] = nxt
        if prefixes:
            r["prefixes"] = prefixes
        if items:
            r["items"] = [o.resource(base) for o in items]
        self.send_json(200, r)

    def h_get(self, bucket, name, media):
        obj = self.server.store.get(bucket, name, self.args, read=True)
        if not media and self.args.get("alt") != "media":
            self.send_json(200, obj.resource(self.base()))
            return
        try:
            f = open(obj.path, "rb")
        except FileNotFoundError:  # replaced in between
            raise GcsError(404, "notFound", "No such object: "
                           "%s/%s" % (bucket, name))
        with f:
            self.send_media(obj, f)

    def send_media(self, obj, f):
        size = obj.size
        h = [("Content-Type", obj.fields.get("contentType",
                                             "application/octet-stream")),
             ("Cache-Control", "no-cache, no-store, max-age=0, "
              "must-revalidate"),
             ("Accept-Ranges", "bytes"),
             ("ETag", '"%s"' % obj.resource("")["etag"]),
             ("Last-Modified", self.date_time_string(obj.updated)),
             ("x-goog-generation", str(obj.generation)),
             ("x-goog-metageneration", str(obj.metageneration)),
             ("x-goog-stored-content-encoding",
              obj.fields.get("contentEncoding", "identity")),
             ("x-goog-stored-content-length", str(size)),
             ("x-goog-storage-class", "STANDARD")]
        hashes = ["crc32c=" + b64_crc(obj.crc)]
        if obj.md5 is not None:
            hashes.append("md5=" + obj.md5)
        if self.server.split_hash:
            h += [("x-goog-hash", x) for x in hashes]
        else:
            h.append(("x-goog-hash", ",".join(hashes)))
        rng = parse_range(self.headers.get("Range"), size)
        if rng == "unsat":
            raise GcsError(416, "requestedRangeNotSatisfiable",
                           "The requested range cannot be "
                           "satisfied.",
                           headers={"Content-Range":
                                    "bytes */%d" % size})
        code, start, count = 200, 0, size
        if rng is not None:
            code, start, count = 206, rng[0], rng[1] - rng[0] + 1
            h.append(("Content-Range", "bytes %d-%d/%d" % (
                    rng[0], rng[1], size)))
        self.send_head(code, h, count)
        if self.command == "HEAD":
            return
        fault = self.out_fault(count)
        if fault is not None:
            first = fault.after
            self.sendfile(f, start, first)
            self.fire(fault)
            if fault.kind == "broken":
                self.drop()
            time.sleep(fault.seconds)
            start, count = start + first, count - first
        self.sendfile(f, start, count)

    def sendfile(self, f, offset, count):
        if count > 0:
            self.connection.sendfile(f, offset, count)
            self.server.stats.add(bytes_out=count)

    # ---------- object writes ----------
    def h_delete(self, bucket, name):
        self.server.store.delete(bucket, name, self.args)
        self.send_empty(204)

    def h_patch(self, bucket, name, replace):
        req = self.read_json()
        obj = self.server.store.patch(bucket, name, self.args, req,
                                      replace)
        self.send_json(200, obj.resource(self.base()))

    def h_compose(self, bucket, name):
        req = self.read_json()
        obj = self.server.store.compose(bucket, name, req, self.args,
                                        copy_range)
        self.send_json(200, obj.resource(self.base()))

    def h_copy(self, sb, sn, db, dn, rewrite):
        meta = self.read_json()
        st = self.server.store
        with st.lock:
            st.bucket(db)
        obj = st.copy(sb, sn, db, dn, self.args, meta)
        res = obj.resource(self.base())
        if rewrite:
            res = {"kind": "storage#rewriteResponse",
                   "totalBytesRewritten": str(obj.size),
                   "objectSize": str(obj.size), "done": True,
                   "resource": res}
        self.send_json(200, res)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # idle keep-alive connections must not block stop
    request_queue_size = 256
    allow_reuse_address = True

    def get_request(self):
        conn, addr = super().get_request()
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                conn.setsockopt(socket.SOL_SOCKET, opt,
                                SOCK_BUF)
            except OSError:
                pass
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, addr

    def handle_error(self, request, client_address):
        if self.verbose:
            super().handle_error(request, client_address)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--data-dir")
    ap.add_argument("--bucket", action="append", default=[])
    ap.add_argument("--fault-rate", type=float, default=0.0)
    ap.add_argument("--fault-seed", type=int, default=1)
    ap.add_argument("--rate-limit", action="store_true")
    ap.add_argument("--hash-headers", choices=("joined", "split"),
                    default="joined")
    ap.add_argument("--no-md5", action="store_true",
                    help="test-only (benchmarks): no MD5, objects carry "
                    "crc32c only, like composite objects")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()

    tmpdir = None
    data = a.data_dir
    if not data:
        tmpdir = data = tempfile.mkdtemp(prefix="fake-gcs-",
                                         dir=os.environ.get("TMPDIR",
                                                            "/var/tmp"))
    Hasher.with_md5 = not a.no_md5
    srv = Server((a.host, a.port), Handler)
    srv.verbose = a.verbose
    srv.store = Store(data, a.rate_limit)
    srv.retry = RetryTests()
    srv.random = RandomFaults(a.fault_rate, a.fault_seed) \
            if a.fault_rate > 0 else None
    srv.stats = Stats()
    srv.lost = LostReplies()
    srv.hostile = fake_gcs_hostile.Rules()
    srv.split_hash = a.hash_headers == "split"
    for b in a.bucket:
        try:
            srv.store.create_bucket(b)
        except GcsError as e:
            ap.error("--bucket %s: %s" % (b, e.message))
    port = srv.server_address[1]
    if a.port_file:
        tmp = a.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, a.port_file)
    print("fake_gcs listening on http://%s:%d" % (a.host, port),
          flush=True)

    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        srv.serve_forever(poll_interval=0.2)
    finally:
        srv.server_close()
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
