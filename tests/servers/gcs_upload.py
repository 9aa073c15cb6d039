"""Uploads for the fake Cloud Storage server (a mixin of its Handler).

uploadType=media, multipart and resumable; the wire semantics are listed at
the top of fake_gcs.py. Bodies are streamed to a file in pieces of up to
1 MiB (socket reads into a buffer kept per connection) and hashed on the
way; a resumable session appends to its own file, hashing
with marks at each 256 KiB boundary so that a piece cut short (fault or
client gone) is rolled back to whole quanta without re-reading the file.

  Body.readinto --> receive() --> session/tmp file + Hasher
                                    |  (final piece / media / multipart)
                                    v
                           check_hashes --> Store.commit (preconditions)
"""

import json
import mmap
import os
import time

from gcs_hash import Hasher, parse_goog_hash
from gcs_store import (QUANTUM, GcsError, bad_request, check_preconditions,
                       md5_of, quote_name)

PIECE = 1 << 20
RECV_BUF = 1 << 20  # 4 MiB measured worse: no longer stays in cache


def parse_content_range(value):
    """(first, last, total) with None for '*'; raises 400 when malformed."""
    v = value.strip()
    if not v.startswith("bytes "):
        raise bad_request("Failed to parse Content-Range header.")
    rng, sep, total = v[6:].strip().partition("/")
    try:
        t = None if total == "*" else int(total)
        if rng == "*":
            return None, None, t
        a, _, b = rng.partition("-")
        return int(a), int(b), t
    except ValueError:
        raise bad_request("Failed to parse Content-Range header.")


def _after_line(m, i):
    """Offset just past the end of the line holding offset i (-1: none)."""
    if i < 0:
        return -1
    j = m.find(b"\n", i)
    return -1 if j < 0 else j + 1


def _headers_end(m, p):
    """(end of the headers, start of the part body) from offset p."""
    if p < 0:
        raise bad_request("Invalid multipart request with 0 mime parts.")
    if m[p:p + 2] == b"\r\n":
        return p, p + 2
    if m[p:p + 1] == b"\n":
        return p, p + 1
    crlf, lf = m.find(b"\r\n\r\n", p), m.find(b"\n\n", p)
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, crlf + 4
    if lf < 0:
        raise bad_request("Invalid multipart request with 0 mime parts.")
    return lf, lf + 2


def _part_end(m, start, marker):
    """Offset where a part starting at `start` ends (before CR LF --B)."""
    e = m.find(marker, start)
    if e < 0:
        raise bad_request("Invalid multipart request with 0 mime parts.")
    if e > start and m[e - 1:e] == b"\r":
        e -= 1
    return e


class UploadMixin:
    """Upload handlers; needs the Handler's body, fault, send_* helpers."""

    def recv_buffer(self):
        """This connection's receive buffer (RECV_BUF bytes, reused)."""
        mv = getattr(self, "_recv_mv", None)
        if mv is None:
            mv = self._recv_mv = memoryview(bytearray(RECV_BUF))
        return mv

    def receive(self, out, hasher, start, keep_lo, keep_hi):
        """_receive(), then wait for the hasher's helper thread."""
        try:
            return self._receive(out, hasher, start, keep_lo, keep_hi)
        finally:
            hasher.sync()

    def _receive(self, out, hasher, start, keep_lo, keep_hi):
        """Read the whole body; body byte i is object byte start+i.

        Bytes at object offsets in [keep_lo, keep_hi) go to `out` (and
        the hasher); the others are read and dropped. Upload-side
        faults act at their object offset. Returns (end of the kept
        bytes, fault that fired with a status to answer, or None).
        """
        f = self.fault
        if f is not None and (f.fired or f.kind not in ("status",
                                                        "stall")):
            f = None
        answer = None
        if f is not None and f.kind == "status" and start >= f.after:
            self.fire(f)
            self.body.drain()
            return start, f
        mv = self.recv_buffer()
        off = start
        kept_end = keep_lo
        while True:
            want = len(mv)
            if f is not None and not f.fired and off < f.after:
                want = min(want, f.after - off)
            n = self.body.readinto(mv[:want])
            if not n:
                break
            lo = max(off, keep_lo)
            hi = min(off + n, keep_hi)
            if hi > lo:
                piece = mv[lo - off:hi - off]
                out.write(piece)
                hasher.update_marked(piece, QUANTUM)
                kept_end = hi
            off += n
            if f is not None and not f.fired and off >= f.after:
                self.fire(f)
                if f.kind == "stall":
                    time.sleep(f.seconds)
                else:
                    answer = f
                    keep_hi = min(keep_hi, off)
        return kept_end, answer

    def check_hashes(self, meta, hasher, header=True):
        want = {}
        if header:
            want = parse_goog_hash(
                    self.headers.get_all("x-goog-hash") or [])
        crc = meta.get("crc32c") or want.get("crc32c")
        md5 = meta.get("md5Hash") or want.get("md5")
        got_crc, got_md5 = hasher.crc_b64(), hasher.md5_b64()
        if crc is not None and crc != got_crc:
            raise bad_request("Provided CRC32C \"%s\" doesn't match "
                              "calculated CRC32C \"%s\"." %
                              (crc, got_crc))
        if md5 is not None and got_md5 is not None and md5 != got_md5:
            raise bad_request("Provided MD5 hash \"%s\" doesn't "
                              "match calculated MD5 hash \"%s\"." %
                              (md5, got_md5))

    def object_name(self, meta):
        name = self.args.get("name") or meta.get("name")
        if not name:
            raise GcsError(400, "required",
                           "Required parameter: name")
        if len(name.encode()) > 1024 or "\r" in name or "\n" in name:
            raise bad_request("The specified object name is not "
                              "valid.")
        return name

    def h_insert(self, bucket):
        st = self.server.store
        with st.lock:
            st.bucket(bucket)
        kind = self.args.get("uploadType")
        if kind == "resumable":
            return self.start_resumable(bucket)
        if kind not in ("media", "multipart"):
            self.body.drain()
            raise bad_request("Upload requests must include an "
                              "uploadType URL parameter and a "
                              "URL-encoded object name.")
        tmp = st.temp_path("body")
        try:
            if kind == "media":
                meta = {}
                ct = self.headers.get("Content-Type")
                if ct:
                    meta["contentType"] = ct
                name = self.object_name(meta)
                hasher = Hasher()
                with open(tmp, "wb") as out:
                    _, f = self.receive(out, hasher, 0, 0,
                                        1 << 62)
                if f is not None:
                    raise self.injected(f.code)
            else:
                meta, hasher = self.receive_multipart(tmp)
                name = self.object_name(meta)
            self.check_hashes(meta, hasher)
            obj = st.commit(bucket, name, tmp, hasher.size,
                            hasher.crc(), md5_of(hasher), meta,
                            self.args)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.lost_reply(bucket, name)
        self.send_json(200, obj.resource(self.base()))

    def receive_multipart(self, tmp):
        """Spool a multipart/related body, keep only its media part."""
        ct = self.headers.get("Content-Type", "")
        bnd = None
        for p in ct.split(";")[1:]:
            k, _, v = p.strip().partition("=")
            if k.lower() == "boundary":
                bnd = v.strip().strip("\"'")
        if not ct.lower().startswith("multipart/related") or not bnd:
            self.body.drain()
            raise bad_request("Invalid multipart request with 0 mime "
                              "parts.")
        spool = tmp + ".mp"
        try:
            with open(spool, "w+b") as sp:
                _, f = self.receive(sp, _NoHash(),
                                    0, 0, 1 << 62)
                if f is not None:
                    raise self.injected(f.code)
                sp.flush()
                return self.split_multipart(sp, bnd.encode(),
                                            tmp)
        finally:
            os.unlink(spool)

    def split_multipart(self, sp, bnd, tmp):
        """Metadata and media of a two-part body (CRLF or LF lines)."""
        bad = bad_request("Invalid multipart request with 0 mime parts.")
        size = os.fstat(sp.fileno()).st_size
        if size == 0:
            raise bad
        with mmap.mmap(sp.fileno(), size, access=mmap.ACCESS_COPY) as m:
            delim = b"--" + bnd
            p1 = _after_line(m, m.find(delim))
            h1, b1 = _headers_end(m, p1)
            e1 = _part_end(m, b1, b"\n" + delim)
            try:
                meta = json.loads(m[b1:e1] or b"{}")
            except ValueError:
                raise GcsError(400, "parseError", "Parse Error")
            p2 = _after_line(m, m.find(b"\n" + delim, e1))
            h2, b2 = _headers_end(m, p2)
            e2 = m.rfind(b"\n" + delim + b"--")
            if p1 < 0 or p2 < 0 or e1 < 0 or e2 < b2:
                raise bad
            if e2 > b2 and m[e2 - 1:e2] == b"\r":
                e2 -= 1
            hdrs = bytes(m[p2:h2]).decode("latin-1")
            for line in hdrs.splitlines():
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-type" and \
                   "contentType" not in meta:
                    meta["contentType"] = v.strip()
            hasher = Hasher()
            mv = memoryview(m)
            with open(tmp, "wb") as out:
                pos = b2
                while pos < e2:
                    piece = mv[pos:min(e2, pos + 8 * PIECE)]
                    out.write(piece)
                    hasher.update(piece)
                    pos += len(piece)
                    del piece
            del mv
        return meta, hasher

    # ---------- resumable ----------
    def start_resumable(self, bucket):
        meta = self.read_json()
        name = self.object_name(meta)
        st = self.server.store
        args = dict(self.args)
        with st.lock:
            check_preconditions(st.bucket(bucket).objects.get(name),
                                args, read=False)
        total = self.headers.get("X-Upload-Content-Length")
        ct = self.headers.get("X-Upload-Content-Type")
        if ct and "contentType" not in meta:
            meta["contentType"] = ct
        up = st.new_upload(bucket, name, meta, args,
                           int(total) if total else None, Hasher())
        loc = "%s/upload/storage/v1/b/%s/o?uploadType=resumable&" \
              "name=%s&upload_id=%s" % (self.base(), quote_name(bucket),
                                        quote_name(name), up.id)
        self.send_empty(200, [("Location", loc),
                              ("X-GUploader-UploadID", up.id)])

    def h_cancel(self, bucket):
        up = self.server.store.upload(self.args.get("upload_id", ""))
        self.body.drain()
        if up is None:
            raise GcsError(404, "notFound", "No such upload.")
        with up.lock:
            if up.state == "open":
                up.state = "cancelled"
                if os.path.exists(up.path):
                    os.unlink(up.path)
        self.send_empty(499, [("X-GUploader-UploadID", up.id)],
                        reason="Client Closed Request")

    def status_308(self, up):
        h = [("X-GUploader-UploadID", up.id)]
        if up.persisted > 0:
            h.append(("Range", "bytes=0-%d" % (up.persisted - 1)))
        self.send_empty(308, h, reason="Resume Incomplete")

    def h_chunk(self, bucket):
        up = self.server.store.upload(self.args.get("upload_id", ""))
        if up is None or up.bucket != bucket:
            self.body.drain()
            raise GcsError(404, "notFound", "No such upload.")
        with up.lock:
            self.chunk_locked(up)

    def chunk_locked(self, up):
        if up.state == "done":
            self.body.drain()
            self.send_json(200, up.result.resource(self.base()))
            return
        if up.state != "open":
            self.body.drain()
            raise GcsError(410, "gone", "The upload session has "
                           "been %s." % up.state)
        cr = self.headers.get("Content-Range")
        length = None if self.body.chunked else self.body.left
        if cr is None:
            if length is None:
                raise bad_request("Content-Range or "
                                  "Content-Length required.")
            first, last, total = (0, length - 1, length) if length \
                    else (None, None, 0)
        else:
            first, last, total = parse_content_range(cr)
        if up.total is not None and total is not None and \
           total != up.total:
            self.body.drain()
            raise bad_request("Upload size %d does not match "
                              "X-Upload-Content-Length %d." %
                              (total, up.total))
        if first is None:  # status query or finalize
            self.body.drain()
            if total is None or total > up.persisted:
                return self.status_308(up)
            if total < up.persisted:
                raise bad_request("Invalid request. The "
                                  "declared total %d is below "
                                  "the %d bytes received." %
                                  (total, up.persisted))
            return self.finalize(up)
        if last < first or (length is not None and
                            length != last - first + 1) or \
           (total is not None and last >= total):
            self.body.drain()
            raise bad_request("Failed to parse Content-Range header.")
        if first > up.persisted:
            self.body.drain()
            raise bad_request("Invalid request. According to the "
                              "Content-Range header, the upload "
                              "offset is %d byte(s), which exceeds "
                              "already uploaded size of %d "
                              "byte(s)." % (first, up.persisted))
        final = total is not None and last + 1 == total
        end = last + 1 if final else (last + 1) // QUANTUM * QUANTUM
        with open(up.path, "r+b") as out:
            out.seek(up.persisted)
            try:
                kept, f = self.receive(out, up.hasher, first,
                                       up.persisted, end)
            except (ConnectionError, OSError):
                # the client went away: keep whole quanta
                self.trim(up, out, up.hasher.size)
                raise
            if f is not None:
                self.trim(up, out, kept)
                raise self.injected(f.code)
        up.persisted = max(up.persisted, kept)
        if final and up.persisted == total:
            return self.finalize(up)
        self.status_308(up)

    def trim(self, up, out, kept):
        """Keep the whole quanta of [0, kept) after a piece was cut."""
        kept = max(up.persisted, kept // QUANTUM * QUANTUM)
        out.truncate(kept)
        if up.hasher.rewind(kept):
            up.persisted = kept
            return
        h = Hasher()
        with open(up.path, "rb") as f:
            while True:
                d = f.read(8 * PIECE)
                if not d:
                    break
                h.update(d)
        up.hasher = h
        up.persisted = kept

    def finalize(self, up):
        try:
            self.check_hashes(up.meta, up.hasher)
        except GcsError:
            up.state = "failed"
            os.unlink(up.path)
            raise
        h = up.hasher
        try:
            obj = self.server.store.commit(
                    up.bucket, up.name, up.path, h.size, h.crc(),
                    md5_of(h), up.meta, up.args)
        except GcsError:
            up.state = "failed"
            raise
        up.state = "done"
        up.result = obj
        self.lost_reply(up.bucket, up.name)
        self.send_json(200, obj.resource(self.base()),
                       [("X-GUploader-UploadID", up.id)])


class _NoHash(Hasher):
    """A Hasher that ignores its input (spooling a multipart body)."""

    def __init__(self):
        self.size = 0
        self._q = None

    def update(self, buf, mark=False):
        self.size += len(buf)
