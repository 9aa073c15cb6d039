"""State of the fake Cloud Storage server: buckets, objects, upload sessions.

Object bytes live in files under DATA/objects (one immutable file per
generation, never held in memory: checkpoints are multi-GiB); in-flight
resumable uploads under DATA/uploads. Metadata is in memory, guarded by one
lock (a test server: it does not survive a restart). Generations are
microsecond timestamps, strictly increasing, like the real service's.

Errors are raised as GcsError and rendered by the HTTP layer in the real
service's JSON shape:
  {"error": {"code": N, "message": M,
             "errors": [{"message": M, "domain": "global", "reason": R}]}}
"""

import base64
import datetime
import os
import re
import threading
import time
import urllib.parse
import uuid

from gcs_hash import b64_crc, crc32c_combine

QUANTUM = 256 * 1024
MAX_COMPOSE_SOURCES = 32
MAX_COMPONENTS = 1024
PROJECT_NUMBER = "123456789012"

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")

MSG_PRECONDITION = ("At least one of the pre-conditions you specified did "
                    "not hold.")


class GcsError(Exception):
    def __init__(self, code, reason, message, headers=None, extra=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}

    def body(self):
        if self.code == 304:
            return None
        item = {"message": self.message, "domain": "global",
                "reason": self.reason}
        item.update(self.extra)
        return {"error": {"code": self.code, "message": self.message,
                          "errors": [item]}}


def bad_request(message, reason="invalid"):
    return GcsError(400, reason, message)


def no_such_object(bucket, name):
    return GcsError(404, "notFound", "No such object: %s/%s" % (bucket, name))


def no_such_bucket():
    return GcsError(404, "notFound", "The specified bucket does not exist.")


def precondition_failed():
    return GcsError(412, "conditionNotMet", MSG_PRECONDITION,
                    extra={"locationType": "header", "location": "If-Match"})


def not_modified():
    return GcsError(304, "notModified", "Not Modified")


def rfc3339(ts):
    d = datetime.datetime.fromtimestamp(ts, datetime.timezone.utc)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + "%03dZ" % (d.microsecond //
                                                          1000)


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def etag(generation, metageneration):
    # the service's etags are a small protobuf of (generation, metagen)
    raw = b"\x08" + _varint(generation) + b"\x10" + _varint(metageneration)
    return base64.b64encode(raw).decode()


def quote_name(name):
    return urllib.parse.quote(name, safe="")


def parse_int_arg(args, key):
    v = args.get(key)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise bad_request("Invalid value for %s: %s" % (key, v))


def check_preconditions(obj, args, read, prefix="if"):
    """Apply if*Match query preconditions to the live object `obj`.

    Reads answer 304 for the NotMatch forms, as the service does; writes
    answer 412 for every failure.
    """
    gm = parse_int_arg(args, prefix + "GenerationMatch")
    gnm = parse_int_arg(args, prefix + "GenerationNotMatch")
    mm = parse_int_arg(args, prefix + "MetagenerationMatch")
    mnm = parse_int_arg(args, prefix + "MetagenerationNotMatch")
    gen = obj.generation if obj else 0
    mgen = obj.metageneration if obj else 0
    if gm is not None:
        if (gm == 0 and obj) or (gm != 0 and gm != gen):
            raise precondition_failed()
    if mm is not None and (obj is None or mm != mgen):
        raise precondition_failed()
    nm = not_modified if read else precondition_failed
    if gnm is not None:
        if (gnm == 0 and obj is None) or (gnm != 0 and obj and
                                           gnm == gen):
            raise nm()
    if mnm is not None and obj and mnm == mgen:
        raise nm()


class Obj:
    """One live object generation. `path` is never rewritten in place."""

    MUTABLE = ("contentType", "contentEncoding", "contentDisposition",
               "contentLanguage", "cacheControl", "metadata",
               "customTime", "storageClass")

    def __init__(self, bucket, name, generation, path, size, crc, md5,
                 meta, components=0):
        self.bucket = bucket
        self.name = name
        self.generation = generation
        self.metageneration = 1
        self.path = path
        self.size = size
        self.crc = crc
        self.md5 = md5  # base64 string or None (composite objects)
        self.components = components
        now = time.time()
        self.created = now
        self.updated = now
        self.fields = {"contentType": "application/octet-stream",
                       "storageClass": "STANDARD"}
        self.apply(meta or {}, replace=False)

    def apply(self, meta, replace):
        if replace:
            keep = {"storageClass": self.fields.get("storageClass")}
            self.fields = keep
            self.fields.setdefault("contentType",
                                   "application/octet-stream")
        for k in self.MUTABLE:
            if k not in meta:
                continue
            v = meta[k]
            if k == "metadata" and isinstance(v, dict) and \
               not replace:
                cur = dict(self.fields.get("metadata") or {})
                for mk, mv in v.items():
                    if mv is None:
                        cur.pop(mk, None)
                    else:
                        cur[mk] = str(mv)
                v = cur
            if v is None:
                self.fields.pop(k, None)
            else:
                self.fields[k] = v

    def crc_b64(self):
        return b64_crc(self.crc)

    def resource(self, base):
        enc = quote_name(self.name)
        r = {
                "kind": "storage#object",
                "id": "%s/%s/%d" % (self.bucket, self.name,
                                    self.generation),
                "selfLink": "%s/storage/v1/b/%s/o/%s" % (
                        base, self.bucket, enc),
                "mediaLink": "%s/download/storage/v1/b/%s/o/%s?"
                             "generation=%d&alt=media" % (
                                base, self.bucket, enc,
                                self.generation),
                "name": self.name,
                "bucket": self.bucket,
                "generation": str(self.generation),
                "metageneration": str(self.metageneration),
                "size": str(self.size),
                "crc32c": self.crc_b64(),
                "etag": etag(self.generation, self.metageneration),
                "timeCreated": rfc3339(self.created),
                "updated": rfc3339(self.updated),
                "timeStorageClassUpdated": rfc3339(self.created),
        }
        r.update(self.fields)
        if self.md5 is not None:
            r["md5Hash"] = self.md5
        if self.components:
            r["componentCount"] = self.components
        return r


class Bucket:
    def __init__(self, name, meta=None):
        self.name = name
        self.objects = {}
        self.created = time.time()
        self.updated = self.created
        self.metageneration = 1
        meta = meta or {}
        self.location = str(meta.get("location", "US")).upper()
        self.storage_class = meta.get("storageClass", "STANDARD")
        self.labels = dict(meta.get("labels") or {})

    def resource(self, base):
        multi = self.location in ("US", "EU", "ASIA")
        return {
                "kind": "storage#bucket",
                "id": self.name,
                "selfLink": "%s/storage/v1/b/%s" % (base, self.name),
                "projectNumber": PROJECT_NUMBER,
                "name": self.name,
                "timeCreated": rfc3339(self.created),
                "updated": rfc3339(self.updated),
                "metageneration": str(self.metageneration),
                "location": self.location,
                "locationType": "multi-region" if multi else "region",
                "storageClass": self.storage_class,
                "etag": etag(1, self.metageneration),
                "labels": self.labels,
                "iamConfiguration": {
                        "bucketPolicyOnly": {"enabled": True},
                        "uniformBucketLevelAccess": {"enabled": True},
                        "publicAccessPrevention": "inherited",
                },
                "rpo": "DEFAULT",
        }


class Upload:
    """A resumable upload session: bytes [0, persisted) are in `path`."""

    def __init__(self, uid, bucket, name, meta, args, total, path, hasher):
        self.id = uid
        self.bucket = bucket
        self.name = name
        self.meta = meta
        self.args = args
        self.total = total
        self.path = path
        self.hasher = hasher
        self.persisted = 0
        self.state = "open"  # open, done, cancelled, failed
        self.result = None
        self.error = None
        self.lock = threading.Lock()
        self.created = time.time()


class Store:
    def __init__(self, data_dir, rate_limit=False):
        self.dir = data_dir
        self.objdir = os.path.join(data_dir, "objects")
        self.updir = os.path.join(data_dir, "uploads")
        os.makedirs(self.objdir, exist_ok=True)
        os.makedirs(self.updir, exist_ok=True)
        self.lock = threading.Lock()
        self.buckets = {}
        self.uploads = {}
        self.last_gen = 0
        self.rate_limit = rate_limit
        self.last_write = {}

    # --- buckets ---
    def create_bucket(self, name, meta=None):
        if not name or not _BUCKET_RE.match(name) or ".." in name:
            raise bad_request("Invalid bucket name: '%s'" % name)
        with self.lock:
            if name in self.buckets:
                raise GcsError(409, "conflict",
                               "Your previous request to create "
                               "the named bucket succeeded and "
                               "you already own it.")
            b = Bucket(name, meta)
            self.buckets[name] = b
            return b

    def bucket(self, name):
        b = self.buckets.get(name)
        if b is None:
            raise no_such_bucket()
        return b

    def delete_bucket(self, name):
        with self.lock:
            b = self.bucket(name)
            if b.objects:
                raise GcsError(409, "conflict",
                               "The bucket you tried to delete "
                               "is not empty.")
            del self.buckets[name]

    # --- objects ---
    def new_generation(self):
        g = max(self.last_gen + 1, time.time_ns() // 1000)
        self.last_gen = g
        return g

    def temp_path(self, kind="tmp"):
        return os.path.join(self.updir, "%s-%s" % (kind,
                                                   uuid.uuid4().hex))

    def _live(self, bucket, name, args, read):
        """(bucket, live object) after the generation and precondition
        checks; the caller holds the lock."""
        b = self.bucket(bucket)
        obj = b.objects.get(name)
        gen = parse_int_arg(args, "generation")
        if obj is None or (gen is not None and gen != obj.generation):
            raise no_such_object(bucket, name)
        check_preconditions(obj, args, read)
        return b, obj

    def get(self, bucket, name, args, read=True):
        """The live object, after generation and precondition checks."""
        with self.lock:
            return self._live(bucket, name, args, read)[1]

    def commit(self, bucket, name, tmp, size, crc, md5, meta, args,
               components=0):
        """Make the file `tmp` the new live generation of bucket/name."""
        with self.lock:
            try:
                b = self.bucket(bucket)
                old = b.objects.get(name)
                check_preconditions(old, args, read=False)
                self._rate_check(bucket, name)
            except GcsError:
                _unlink(tmp)
                raise
            gen = self.new_generation()
            path = os.path.join(self.objdir, "%d-%s" % (
                    gen, uuid.uuid4().hex[:8]))
            os.rename(tmp, path)
            obj = Obj(bucket, name, gen, path, size, crc, md5, meta,
                      components)
            b.objects[name] = obj
            if old is not None:
                _unlink(old.path)
            return obj

    def _rate_check(self, bucket, name):
        if not self.rate_limit:
            return
        now = time.monotonic()
        last = self.last_write.get((bucket, name))
        if last is not None and now - last < 1.0:
            raise GcsError(429, "rateLimitExceeded",
                           "The object %s/%s exceeded the rate "
                           "limit for object mutation operations "
                           "(create, update, and delete). Please "
                           "reduce your request rate. See "
                           "https://cloud.google.com/storage/docs/"
                           "gcs429." % (bucket, name))
        self.last_write[(bucket, name)] = now

    def delete(self, bucket, name, args):
        with self.lock:
            b, obj = self._live(bucket, name, args, read=False)
            self._rate_check(bucket, name)
            del b.objects[name]
            _unlink(obj.path)

    def patch(self, bucket, name, args, meta, replace):
        with self.lock:
            obj = self._live(bucket, name, args, read=False)[1]
            obj.apply(meta, replace)
            obj.metageneration += 1
            obj.updated = time.time()
            return obj

    def list(self, bucket, args):
        prefix = args.get("prefix", "")
        delim = args.get("delimiter", "")
        start = args.get("startOffset", "")
        end = args.get("endOffset", "")
        trailing = args.get("includeTrailingDelimiter") == "true"
        maxr = parse_int_arg(args, "maxResults")
        if maxr is None or maxr <= 0 or maxr > 1000:
            maxr = 1000
        token = args.get("pageToken", "")
        after = ""
        if token:
            try:
                after = base64.urlsafe_b64decode(
                        token.encode()).decode()
            except (ValueError, UnicodeDecodeError):
                raise bad_request("Invalid pageToken.",
                                  "invalid")
        with self.lock:
            b = self.bucket(bucket)
            names = sorted(n for n in b.objects if
                           n.startswith(prefix))
            objs = b.objects
        items, prefixes, last, more = [], [], None, False
        for n in names:
            if (start and n < start) or (end and n >= end):
                continue
            key = n
            if delim:
                i = n.find(delim, len(prefix))
                if i >= 0:
                    key = n[:i + len(delim)]
            if after and key <= after:
                continue
            if key == last:
                continue
            if len(items) + len(prefixes) >= maxr:
                more = True
                break
            last = key
            if key != n:
                prefixes.append(key)
                o = objs.get(key)
                if trailing and o is not None:
                    items.append(o)
            else:
                items.append(objs[n])
        nxt = None
        if more:
            nxt = base64.urlsafe_b64encode(last.encode()).decode()
        return items, prefixes, nxt

    def compose(self, bucket, name, req, args, copy_range):
        srcs = req.get("sourceObjects")
        if not isinstance(srcs, list) or not srcs:
            raise GcsError(400, "required",
                           "Required field 'sourceObjects' was "
                           "not specified.")
        if len(srcs) > MAX_COMPOSE_SOURCES:
            raise bad_request("The number of source components "
                              "provided (%d) exceeds the maximum "
                              "(%d)" % (len(srcs),
                                         MAX_COMPOSE_SOURCES))
        dest = req.get("destination") or {}
        with self.lock:
            b = self.bucket(bucket)
            parts = []
            for s in srcs:
                sname = s.get("name") if isinstance(s, dict) \
                        else None
                if not sname:
                    raise GcsError(400, "required",
                                   "Required field 'name' "
                                   "was not specified.")
                o = b.objects.get(sname)
                gen = s.get("generation")
                if o is None or (gen is not None and
                                 int(gen) != o.generation):
                    raise no_such_object(bucket, sname)
                pre = (s.get("objectPreconditions") or {}).get(
                        "ifGenerationMatch")
                if pre is not None and int(pre) != o.generation:
                    raise precondition_failed()
                parts.append(o)
            count = sum(max(o.components, 1) for o in parts)
            if count > MAX_COMPONENTS:
                raise bad_request("The number of components in "
                                  "the composite object (%d) "
                                  "exceeds the maximum (%d)" %
                                  (count, MAX_COMPONENTS))
            check_preconditions(b.objects.get(name), args,
                                read=False)
            if "contentType" not in dest:
                dest = dict(dest)
                dest["contentType"] = parts[0].fields.get(
                        "contentType")
            # hold the source files open: a concurrent delete
            # cannot take the bytes away mid-copy
            files = [open(o.path, "rb") for o in parts]
            sizes = [o.size for o in parts]
            crcs = [o.crc for o in parts]
        tmp = self.temp_path("compose")
        try:
            with open(tmp, "wb") as out:
                for f, n in zip(files, sizes):
                    copy_range(f, out, n)
        finally:
            for f in files:
                f.close()
        crc = crcs[0]
        for c, n in zip(crcs[1:], sizes[1:]):
            crc = crc32c_combine(crc, c, n)
        return self.commit(bucket, name, tmp, sum(sizes), crc, None,
                           dest, args, components=count)

    def copy(self, sbucket, sname, dbucket, dname, args, meta):
        sargs = {}
        for k, v in args.items():
            if k.startswith("ifSource"):
                sargs["if" + k[len("ifSource"):]] = v
        if "sourceGeneration" in args:
            sargs["generation"] = args["sourceGeneration"]
        src = self.get(sbucket, sname, sargs, read=False)
        dargs = {k: v for k, v in args.items()
                 if k.startswith("if") and not k.startswith("ifSource")}
        tmp = self.temp_path("copy")
        os.link(src.path, tmp)
        merged = dict(src.fields)
        merged.update(meta or {})
        return self.commit(dbucket, dname, tmp, src.size, src.crc,
                           src.md5, merged, dargs, src.components)

    # --- resumable sessions ---
    def new_upload(self, bucket, name, meta, args, total, hasher):
        uid = "fake-" + uuid.uuid4().hex
        path = os.path.join(self.updir, uid)
        open(path, "wb").close()
        up = Upload(uid, bucket, name, meta, args, total, path, hasher)
        with self.lock:
            self.uploads[uid] = up
        return up

    def upload(self, uid):
        with self.lock:
            return self.uploads.get(uid)

    def object_count(self):
        with self.lock:
            return sum(len(b.objects) for b in self.buckets.values())


def md5_of(hasher):
    return hasher.md5_b64()


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
