"""ckpt: Python binding of libckpt, the checkpoint storage engine.

    import ckpt
    with ckpt.Checkpointer("/ckpt/run1", every_steps=1000) as c:
        start = c.latest_step()              # None: a fresh run
        state = init() if start is None else c.restore(start)
        for step in range((start or 0) + 1, steps + 1):
            train_step(state)
            if c.should_save(step):
                c.save(step, state)          # returns once staged
            if c.should_exit():              # a notice's save is durable
                break                        # then exit(ckpt.EXIT_RESTART)

Design note. A thin layer over the C API through ctypes (_lib.py): one
`ckpt` handle per Checkpointer, opened with the settings given as keyword
arguments, with the watcher (or the periodic policy alone) started at
once. save() flattens the state (_tree.py) into one ckpt tensor per array
(pointing at the array's own memory, _arrays.py) plus a JSON tree, and
calls ckpt_save_ex, which copies the bytes into the staging pool and
returns; the engine writes them in the background. With borrow=True
(CKPT_SAVE_BORROW) nothing is copied before it returns: the engine's
workers read the arrays themselves, and the Checkpointer holds every
object whose memory the tensors point at (the caller's arrays and any
temporary made from them) until the engine releases that memory
(ckpt_wait_released, or a wait, the next save, close). save() keeps the
cyclic GC off while the caller waits on it (a collection walks every object
of the process, 25 ms with torch loaded). restore() reads the tree,
allocates each destination with its exact dtype and shape (or, with
into=, takes the caller's matching array) and fills them all with one
ckpt_read_batch.

  state --_tree.flatten--> [ckpt_tensor] --ckpt_save_ex--> staging pool
        (borrow: [ckpt_tensor] held in _borrowed --workers--> pool,
         dropped once ckpt_wait_released says the engine is done)
  location --ckpt_reader_open--> tree --np.empty/torch.empty--> read_batch

Errors: every failing call raises a CkptError subclass with the engine's
code and message (file, offset, tensor). A background save that failed
raises from the next save(), wait() or close(), never silently.
"""

import ctypes
import errno
import gc
import json
import operator
import warnings

import numpy as np

from . import _arrays, _lib, _tree
from ._lib import EXIT_RESTART

__all__ = ["Checkpointer", "Reason", "CkptError", "CorruptError",
           "VersionError", "NotFoundError", "BusyError", "DupNameError",
           "IncompleteError", "CodecError", "ExistsError", "MismatchError",
           "CanceledError", "PreviousError", "CkptOSError", "EXIT_RESTART",
           "events", "event_append", "load", "version"]

_L = _lib.lib


# ------------------------------------------------------------------ errors

class CkptError(Exception):
    """A libckpt call failed. .code is the negative code the C function
    returned (-errno or CKPT_E_*), .message the engine's message (naming
    file, offset, tensor), .strerror the description of the code."""

    def __init__(self, code, message="", what=""):
        Exception.__init__(self, code, message)
        self.code = code
        self.message = message
        self.what = what
        self.strerror = _lib.text(_L.ckpt_strerror(code))

    def __str__(self):
        head = "%s: " % self.what if self.what else ""
        if self.message:
            return "%s%s (%s)" % (head, self.message, self.strerror)
        return head + self.strerror


class CorruptError(CkptError):
    """CKPT_E_CORRUPT: data or metadata failed validation."""


class VersionError(CkptError):
    """CKPT_E_VERSION: format version not supported."""


class NotFoundError(CkptError):
    """CKPT_E_NOTFOUND: no such checkpoint, step or tensor."""


class BusyError(CkptError):
    """CKPT_E_BUSY: a save is already in flight."""


class DupNameError(CkptError):
    """CKPT_E_DUPNAME: two tensors of one save share a name."""


class IncompleteError(CkptError):
    """CKPT_E_INCOMPLETE: some host's part is missing."""


class CodecError(CkptError):
    """CKPT_E_CODEC: the compression library failed."""


class ExistsError(CkptError):
    """CKPT_E_EXISTS: the step is already committed."""


class MismatchError(CkptError):
    """CKPT_E_MISMATCH: slices of one array disagree."""


class CanceledError(CkptError):
    """CKPT_E_CANCELED: a progress callback asked to stop."""


class PreviousError(CkptError):
    """CKPT_E_PREVIOUS: an earlier background save failed (see message)."""


class CkptOSError(CkptError, OSError):
    """A -errno from the operating system; also an OSError (.errno)."""

    def __init__(self, code, message="", what=""):
        CkptError.__init__(self, code, message, what)
        OSError.__init__(self, -code, self.strerror)
        self.code, self.message, self.what = code, message, what

    __str__ = CkptError.__str__


_ERRORS = {_lib.E_CORRUPT: CorruptError, _lib.E_VERSION: VersionError,
           _lib.E_NOTFOUND: NotFoundError, _lib.E_BUSY: BusyError,
           _lib.E_DUPNAME: DupNameError, _lib.E_INCOMPLETE: IncompleteError,
           _lib.E_CODEC: CodecError, _lib.E_EXISTS: ExistsError,
           _lib.E_MISMATCH: MismatchError, _lib.E_CANCELED: CanceledError,
           _lib.E_PREVIOUS: PreviousError}


def _error(code, message, what):
    cls = _ERRORS.get(code) or (CkptOSError if -4096 < code < 0 else
                                CkptError)
    return cls(code, message, what)


def _check(rc, what, handle=None):
    if rc < 0:
        raise _error(rc, _lib.text(_L.ckpt_errmsg(handle)), what)
    return rc


def _check_reader(rc, what, reader=None):
    if rc < 0:
        raise _error(rc, _lib.text(_L.ckpt_reader_errmsg(reader)), what)
    return rc


def version():
    """The library's version string."""
    return _lib.text(_L.ckpt_version_string())


# ------------------------------------------------------------------ advice

class Reason(str):
    """Why a save is due: "periodic", "maintenance", "preempted",
    "sigterm", "requested", "upcoming" or "manual" (a str, so truthy).
    .deadline / .notice_time: unix seconds (None for periodic); .event:
    the notice's number; .pod: the pod's agreed step."""

    def __new__(cls, name, code=0, deadline_ns=0, notice_ns=0, event=0,
                pod=False):
        r = str.__new__(cls, name)
        r.code = code
        r.deadline_ns = deadline_ns
        r.deadline = deadline_ns / 1e9 if deadline_ns else None
        r.notice_time = notice_ns / 1e9 if notice_ns else None
        r.event = event
        r.pod = pod
        return r


def _reason_code(name):
    try:
        return _lib.REASONS.index(name)
    except ValueError:
        raise ValueError("ckpt: unknown save reason %r (one of %s)"
                         % (name, ", ".join(_lib.REASONS[1:]))) from None


_NOTICE_REASONS = {"maintenance", "preempted", "sigterm", "requested",
                   "upcoming"}


# ------------------------------------------------------------------ settings

_SETTINGS = {f for f, _ in _lib.Settings._fields_} - {"reserved", "flags",
                                                      "remote", "codec"}
_WATCH = {f for f, _ in _lib.WatchOpts._fields_} - {
    "reserved", "flags", "on_notice", "arg", "after_save", "every_steps",
    "every_seconds"}
_SETTING_FLAGS = {"no_direct": _lib.F_NO_DIRECT,
                  "manual_commit": _lib.F_MANUAL_COMMIT,
                  "no_uring": _lib.F_NO_URING, "dedup": _lib.F_DEDUP}
_WATCH_FLAGS = {"no_probe": _lib.WATCH_NO_PROBE, "no_pod": _lib.WATCH_NO_POD}


def _set(st, name, value):
    """st.name = value, refusing what the C field cannot hold (ctypes
    would wrap a negative or too large value silently)."""
    ctype = dict(st._fields_)[name]
    v = operator.index(value)
    bits = 8 * ctypes.sizeof(ctype)
    signed = ctype in (ctypes.c_int32, ctypes.c_int64)
    lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else \
        (0, 1 << bits)
    if not lo <= v < hi:
        raise ValueError("ckpt: %s=%d is out of range" % (name, v))
    setattr(st, name, v)


def _codec(v):
    if isinstance(v, str):
        if v not in _lib.CODECS:
            raise ValueError("ckpt: unknown codec %r (none, zstd, float)" % v)
        return _lib.CODECS[v]
    return int(v)


def _split_location(location, remote):
    if isinstance(location, (list, tuple)):
        if len(location) != 2 or remote is not None:
            raise ValueError("ckpt: location must be DIR, gs://BUCKET/PREFIX"
                             " or (DIR, gs://...)")
        location, remote = location
    location = str(location)
    if remote is not None:
        remote = str(remote)
        if location.startswith("gs://") or not remote.startswith("gs://"):
            raise ValueError("ckpt: with a remote, the location is a "
                             "directory and the remote gs://BUCKET/PREFIX")
    return location, remote


# ------------------------------------------------------------------ reading

_NO_TREE = object()  # a step saved without a tree (by C code)


def _read_tree(r, what):
    idx = ctypes.c_size_t()
    rc = _L.ckpt_reader_find(r, _tree.TREE_NAME.encode(), ctypes.byref(idx))
    if rc == _lib.E_NOTFOUND:
        return _NO_TREE
    _check_reader(rc, what, r)
    info = _lib.TensorInfo()
    _check_reader(_L.ckpt_reader_tensor(r, idx.value, ctypes.byref(info)),
                  what, r)
    buf = (ctypes.c_char * info.nbytes)()
    _check_reader(_L.ckpt_read(r, _tree.TREE_NAME.encode(), buf,
                               info.nbytes), what, r)
    return _tree.parse(buf.raw)


def _plain_targets(r, what):
    """Destinations for a step saved without a tree: every tensor."""
    out = []
    info = _lib.TensorInfo()
    for i in range(_L.ckpt_reader_tensor_count(r)):
        _check_reader(_L.ckpt_reader_tensor(r, i, ctypes.byref(info)),
                      what, r)
        shape = tuple(info.shape[k] for k in range(info.ndim))
        obj, ptr, nbytes = _arrays.plain(info.dtype, shape)
        out.append((_lib.text(info.name), obj, ptr, nbytes, None))
    return out


def _read_all(r, targets, what):
    n = len(targets)
    if not n:
        return
    reqs = (_lib.ReadReq * n)()
    for i, (name, _obj, ptr, nbytes, _fin) in enumerate(targets):
        reqs[i].name = name.encode()
        reqs[i].dst = ptr
        reqs[i].dst_bytes = nbytes
    rc = _L.ckpt_read_batch(r, reqs, n)
    if rc < 0:
        bad = next((targets[i][0] for i in range(n) if reqs[i].status), "?")
        raise _error(rc, _lib.text(_L.ckpt_reader_errmsg(r)),
                     "%s: tensor %s" % (what, bad))


def load(location, step=None, into=None):
    """The state saved as `step` (None: the latest) at a location (a
    directory or gs://BUCKET/PREFIX), with its structure and types. A
    step saved without a tree (by C code) comes back as a dict of tensor
    name -> numpy array (bf16 / f8 as torch tensors when torch imports).

    into: a state of the same structure (the live model's, e.g.
    ckpt.pytorch.training_state(model, optimizer)) whose arrays are read
    into in place where one matches the saved array exactly (same path,
    dtype and shape; dense, C-contiguous, writable, on the CPU); the
    result holds those very objects, and new ones where nothing matched.
    No second copy of the state is made, and memory already touched is
    not faulted in again. If the load fails, those arrays may hold part
    of the step."""
    return _load(location, step, None, into)


def _latest_at(location):
    """The latest committed step at a location, or None."""
    s = _lib.Settings()
    _L.ckpt_settings_default(ctypes.byref(s))
    s.staging_bytes = 0
    h = ctypes.c_void_p()
    _check(_L.ckpt_open(ctypes.byref(h), str(location).encode(),
                        ctypes.byref(s)), "open %s" % location, None)
    try:
        v = _lib.c_u64()
        rc = _L.ckpt_latest(h, ctypes.byref(v))
        if rc == _lib.E_NOTFOUND:
            return None
        _check(rc, "latest %s" % location, h)
        return v.value
    finally:
        _L.ckpt_close(h)


def _load(location, step, settings, into=None):
    what = "restore %s" % location
    r = ctypes.c_void_p()
    want = _lib.LATEST if step is None else int(step)
    _check_reader(_L.ckpt_reader_open(ctypes.byref(r),
                                      str(location).encode(), want,
                                      settings), what)
    try:
        what = "restore %s step %d" % (location, _L.ckpt_reader_step(r))
        root = _read_tree(r, what)
        if root is _NO_TREE:
            targets = _plain_targets(r, what)
            _read_all(r, targets, what)
            return {name: obj for name, obj, _p, _n, _f in targets}
        targets = []
        mine = _tree.by_name(into) if into is not None else {}
        taken = set()  # memory given once (tied weights: one of them)
        for node in _tree.arrays(root):
            x = mine.get(node["name"])
            got = _arrays.reuse(node, x) if x is not None else None
            if got is not None and got[2] and got[1] in taken:
                got = None
            if got is not None:
                taken.add(got[1])
            obj, ptr, nbytes, fin = got or _arrays.alloc(node)
            targets.append((node["name"], obj, ptr, nbytes, fin))
        _read_all(r, targets, what)
        values = {name: fin(obj) for name, obj, _p, _n, fin in targets}
        return _tree.unflatten(root, values)
    finally:
        _L.ckpt_reader_close(r)


# ------------------------------------------------------------------ journal

def events(location):
    """Every line of every host's event journal at a location (directory
    or gs://), parsed: a list of dicts, hosts in order, oldest first per
    host. A line that is not JSON comes as {"host": H, "raw": LINE}."""
    out = []

    def one(_arg, host, line):
        text = _lib.text(line)
        try:
            ev = json.loads(text)
        except ValueError:
            ev = {"host": host, "raw": text}
        out.append(ev)
        return 0

    cb = _lib.EVENT_FN(one)
    rc = _L.ckpt_events_read(str(location).encode(), cb, None)
    _check(rc, "events %s" % location)
    return out


def event_append(location, event, host=0):
    """Appends one event (a dict, or a JSON object text) to the journal."""
    text = event if isinstance(event, str) else json.dumps(event)
    _check(_L.ckpt_event_append(str(location).encode(), host, text.encode()),
           "event_append %s" % location)


# ------------------------------------------------------------------ handle

# numpy's view of a ckpt_tensor array (pointers as u64): the array of a
# save is filled column by column instead of one ctypes field at a time.
_TENSOR_NP = np.dtype({
    "names": [f for f, _ in _lib.Tensor._fields_ if f != "reserved"],
    "formats": ["u8" if f in ("name", "shape", "slice_offset",
                              "slice_extent", "data", "nbytes")
                else ("i4" if f == "dtype" else "u4")
                for f, _ in _lib.Tensor._fields_ if f != "reserved"],
    "offsets": [getattr(_lib.Tensor, f).offset for f, _ in
                _lib.Tensor._fields_ if f != "reserved"],
    "itemsize": ctypes.sizeof(_lib.Tensor)})


def _tensor_array(state):
    """The ckpt_tensor array of a state: the tree first, then one tensor
    per leaf pointing at its memory. Returns (array, count, objects to
    keep alive until ckpt_save returns)."""
    doc, leaves = _tree.flatten(state)
    n = len(leaves) + 1
    names = [_tree.TREE_NAME.encode()]
    names += [name.encode("utf-8") for name, _ in leaves]
    blob = np.frombuffer(b"\0".join(names) + b"\0", dtype=np.uint8)
    lens = np.fromiter(map(len, names), dtype=np.uint64, count=n) + 1
    ndims = np.fromiter((len(lf.shape) for _, lf in leaves),
                        dtype=np.uint64, count=n - 1)
    dims = np.fromiter((d for _, lf in leaves for d in lf.shape),
                       dtype=np.uint64, count=int(ndims.sum()))
    dims = np.concatenate(([len(doc)], dims)).astype(np.uint64)
    tree = np.frombuffer(doc, dtype=np.uint8)
    rec = np.zeros(n, dtype=_TENSOR_NP)
    rec["name"] = blob.ctypes.data + np.concatenate(
        ([0], np.cumsum(lens)[:-1])).astype(np.uint64)
    rec["ndim"][0] = 1
    rec["ndim"][1:] = ndims
    rec["shape"] = dims.ctypes.data + 8 * np.concatenate(
        ([0], np.cumsum(rec["ndim"])[:-1])).astype(np.uint64)
    rec["dtype"][0] = _lib.DTYPES["u8"]
    rec["dtype"][1:] = [lf.dtype for _, lf in leaves]
    rec["data"][0] = tree.ctypes.data
    rec["data"][1:] = [lf.ptr or 0 for _, lf in leaves]
    rec["nbytes"][0] = len(doc)
    rec["nbytes"][1:] = [lf.nbytes for _, lf in leaves]
    arr = (_lib.Tensor * n).from_buffer(rec)
    return arr, n, [leaves, blob, dims, tree, rec]


_CODEC_NAMES = {v: k for k, v in _lib.CODECS.items()}
# How the fields of the structs returned as dicts read (enums by name,
# char arrays as str, booleans); numbers are kept as they are.
_FIELD_AS = {
    "reason": lambda v: _lib.REASONS[v], "codec": _CODEC_NAMES.get,
    "dest": lambda v: "remote" if v else "local",
    "inflight": ["none", "finish", "cancel"].__getitem__,
    "running": bool, "healthy": bool, "sigterm": bool, "host": _lib.text,
    "key": _lib.text, "value": _lib.text, "etag": _lib.text,
    "error": _lib.text, "msg": _lib.text,
    "encode_bps": lambda a: {n: a[i] for i, n in _CODEC_NAMES.items()},
    "ratio": lambda a: {n: a[i] for i, n in _CODEC_NAMES.items()},
}


def _struct_dict(s, states=None):
    """The fields of a filled struct as a dict, reserved ones left out;
    `states` names the values of its "state" field."""
    d = {}
    for name, _ in s._fields_:
        if name.startswith("reserved") or name in ("nkeys", "keys"):
            continue
        v = getattr(s, name)
        d[name] = (states[v] if name == "state" and states
                   else _FIELD_AS.get(name, lambda x: x)(v))
    return d


class Checkpointer:
    """A checkpoint location opened for saving (and restoring).

    location: a directory, "gs://BUCKET/PREFIX", or (DIR, "gs://...")
    (the same as remote=): saved locally, then uploaded.
    every_steps / every_seconds: the periodic policy (None or 0: off).
    watch: True starts the maintenance watcher (GCE_METADATA_HOST), False
    keeps the policy only. keep_last: retention. sigterm: opt in to
    SIGTERM notices. after_save: "stop" (should_exit() turns true once a
    notice's save is durable) or "continue". Any other keyword is a field
    of ckpt_settings or ckpt_watch_opts by name (staging_bytes,
    chunk_bytes, codec="none"|"zstd"|"float", level, threads,
    files_per_host, queue_depth, keep_every, time_scale,
    maintenance_window_ms, ...) or a flag (no_direct, no_uring,
    manual_commit, no_probe, no_pod, dedup). dedup=True: chunks equal to
    the newest committed step's (frozen layers when fine-tuning) are not
    written again; the new step refers to the older one's bytes
    (CKPT_F_DEDUP; a directory, with or without a remote, or a gs://
    root; off by default).

    One thread drives the loop (should_save, save, wait, restore, close);
    progress(), watch_state(), plan() and upload_status() may be called
    from others.
    """

    def __init__(self, location, *, remote=None, every_steps=None,
                 every_seconds=3600, watch=True, keep_last=None,
                 sigterm=False, after_save="stop", host_index=0,
                 host_count=1, **engine_settings):
        self._h = None
        self.location, self.remote = _split_location(location, remote)
        s = _lib.Settings()
        _L.ckpt_settings_default(ctypes.byref(s))
        o = _lib.WatchOpts()
        _L.ckpt_watch_opts_default(ctypes.byref(o))
        _set(s, "host_index", host_index)
        _set(s, "host_count", host_count)
        _set(s, "keep_last", keep_last or 0)
        _set(o, "every_steps", every_steps or 0)
        _set(o, "every_seconds", every_seconds or 0)
        if after_save not in ("stop", "continue"):
            raise ValueError("ckpt: after_save must be 'stop' or 'continue'")
        o.after_save = (_lib.AFTER_STOP if after_save == "stop"
                        else _lib.AFTER_CONTINUE)
        if not watch:
            o.flags |= _lib.WATCH_NO_METADATA
        for k, v in engine_settings.items():
            if k == "codec":
                s.codec = _codec(v)
            elif k in _SETTING_FLAGS:
                s.flags |= _SETTING_FLAGS[k] if v else 0
            elif k in _WATCH_FLAGS:
                o.flags |= _WATCH_FLAGS[k] if v else 0
            elif k in _SETTINGS:
                _set(s, k, v)
            elif k in _WATCH:
                _set(o, k, v)
            else:
                raise TypeError("ckpt: unknown setting %r" % k)
        self._remote_b = self.remote.encode() if self.remote else None
        s.remote = self._remote_b
        self._settings = s
        h = ctypes.c_void_p()
        _check(_L.ckpt_open(ctypes.byref(h), self.location.encode(),
                            ctypes.byref(s)), "open %s" % self.location)
        self._h = h
        self._advice = _lib.SaveAdvice()
        self._advice_ref = ctypes.byref(self._advice)
        self._pending = None
        # a save started whose outcome the caller has not been given yet
        self._outstanding = False
        # borrow mode: what the engine may still read (the tensor array,
        # the leaves and their temporaries), None once released
        self._borrowed = None
        try:
            _check(_L.ckpt_watch_start(h, ctypes.byref(o)), "watch_start",
                   h)
            if sigterm:
                _check(_L.ckpt_watch_sigterm(h), "watch_sigterm", h)
        except CkptError:
            _L.ckpt_close(h)
            self._h = None
            raise

    # -- context manager and lifetime
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
            return False
        try:
            self.close()
        except CkptError as e:  # keep the first error, mention this one
            exc.add_note("ckpt: close: %s" % e)
        return False

    def close(self):
        """Waits for the save in flight, stops the watcher, frees the
        handle. Raises if that save failed."""
        h, self._h = self._h, None
        if h is None:
            return
        rc = _L.ckpt_close(h)  # returns after the release, whatever rc
        self._borrowed = None
        if rc < 0 and self._outstanding:
            raise _error(rc, _lib.text(_L.ckpt_errmsg(None)), "close")

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            try:
                self.close()
            except Exception as e:  # noqa: BLE001 - nowhere to raise
                warnings.warn("ckpt: Checkpointer not closed; its last save "
                              "failed: %s" % e, RuntimeWarning)

    def _handle(self):
        if self._h is None:
            raise ValueError("ckpt: the Checkpointer is closed")
        return self._h

    # -- the loop's questions
    def should_save(self, step):
        """None when no save is due at `step`, else a Reason (truthy).
        The advice is kept: the next save() uses its reason."""
        if self._h is None:
            raise ValueError("ckpt: the Checkpointer is closed")
        if not _L.ckpt_should_save(self._h, step, self._advice_ref):
            self._pending = None
            return None
        a = self._advice
        self._pending = Reason(_lib.REASONS[a.reason]
                               if 0 <= a.reason < len(_lib.REASONS)
                               else "unspecified", a.reason, a.deadline_ns,
                               a.notice_ns, a.event, bool(a.flags & 1))
        return self._pending

    def should_exit(self):
        """True once the save a notice asked for is durable and the policy
        is "stop": the loop should exit with ckpt.EXIT_RESTART (75)."""
        return self._h is not None and bool(_L.ckpt_should_stop(self._h))

    def request_save(self, deadline=None):
        """Raises a "requested" notice (deadline: unix seconds or None)."""
        ns = int(deadline * 1e9) if deadline else 0
        _check(_L.ckpt_request_save(self._handle(), ns), "request_save",
               self._h)

    # -- saving
    def save(self, step, state, *, wait=False, reason=None, borrow=False):
        """Starts saving `state` as step `step`; returns once every byte
        is staged (the arrays may be changed right after). With wait=True
        returns once the step is durable (committed). reason: None takes
        the advice of the last should_save() (a notice's reason is what
        lets the engine plan the save against its deadline), else a
        reason name. Raises if an earlier background save failed; that
        failure is then collected, so calling save() again proceeds.

        borrow=True: nothing is copied before save() returns (it only
        validates and queues, whatever the state's size); the engine
        reads the arrays' memory in the background. The promise: no
        array of `state` is modified (in place: an optimizer step, a
        copy_(), an `a[...] = `) until the engine releases them, which
        wait_released() waits for and which wait(), the next save() and
        close() wait for before they return. The Checkpointer keeps a
        reference to every array (and to any contiguous or CPU copy it
        made of one) until then, so the caller may drop its own at once.
        Suited to arrays nothing writes to meanwhile: host copies of
        device arrays (`t.cpu()` of a CUDA or XLA tensor,
        `np.asarray(jax_array)`, jax.device_get) made for this save.
        Not suited to the live parameters of a model that trains on
        while the save runs: wait_released() before the next step
        writes to them, or borrow=False. If save() raises, nothing is
        borrowed."""
        # The cyclic GC is paused while the caller waits: flattening
        # allocates a few objects per tensor, and a collection they set
        # off walks every object of the process (25 ms with torch
        # loaded) inside the stall. It runs at the next allocation after
        # the save instead.
        gc_was = gc.isenabled()
        gc.disable()
        try:
            h = self._handle()
            step = operator.index(step)
            if not 0 <= step < 2**63:
                raise ValueError("ckpt: step %d outside [0, 2^63)" % step)
            adv = self._pending
            if reason is None:
                reason = adv if adv else "unspecified"
            elif not (adv and adv == reason):
                adv = None
            opts = _lib.SaveOpts()
            _L.ckpt_save_opts_default(ctypes.byref(opts))
            # No opts.deadline_ns: the engine plans a notice's save against
            # the notice's own deadline, and a late save is still worth more
            # than one refused with -ETIMEDOUT.
            opts.reason = _reason_code(reason)
            if borrow:
                opts.flags |= _lib.SAVE_BORROW
            arr, n, keep = _tensor_array(state)  # TypeError before waiting
            if self._outstanding:
                # A notice's save: the engine decides about a save in flight
                # (finish or cancel it); only a failure stops us here.
                # Otherwise the previous save is collected first (other
                # threads may collect garbage while it is waited for).
                busy = _L.ckpt_poll(h, None)
                if reason not in _NOTICE_REASONS or busy < 0:
                    if busy == 1 and gc_was:
                        gc.enable()
                    self._collect("earlier save")
                    gc.disable()
            what = "save step %d" % step
            rc = _L.ckpt_save_ex(h, step, arr, n, ctypes.byref(opts))
            if rc < 0:
                # nothing of this save is borrowed, and the exception's
                # traceback (which a caller may keep) must not hold the
                # arrays through this frame; an earlier (notice path) save
                # may still borrow: keep the promise of returning after it
                del arr, keep, state
                self._release_wait()
                _check(rc, what, h)
            # started: an earlier save is over (else CKPT_E_BUSY), so is any
            # borrowing of its memory
            self._borrowed = [arr, keep] if borrow else None
            self._outstanding = True
            if adv:
                self._pending = None
            del keep
        finally:
            if gc_was:
                gc.enable()
        if wait:
            self._collect(what)

    def _collect(self, what):
        """ckpt_wait: the save's outcome, given once; it returns after
        the release of any borrowed memory, so the references go."""
        self._outstanding = False
        rc = _L.ckpt_wait(self._h)
        self._borrowed = None
        _check(rc, what, self._h)

    def _release_wait(self):
        if self._borrowed is not None and \
                _L.ckpt_wait_released(self._h, -1) == 0:
            self._borrowed = None

    def wait_released(self, timeout=None):
        """Borrow mode: waits until the engine no longer reads the arrays
        of the save in flight (long before the step is durable when the
        staging pool is large enough), then drops the references save()
        kept and returns True; False if they are still borrowed after
        `timeout` seconds (None: no limit, 0: only look). True at once
        when nothing is borrowed. The save's outcome is not reported
        here (wait() does): a failed save releases its arrays too."""
        h = self._handle()
        if self._borrowed is None:
            return True
        ms = (-1 if timeout is None
              else min(max(0, int(timeout * 1000)), 2**31 - 1))
        rc = _L.ckpt_wait_released(h, ms)
        if rc == -errno.ETIMEDOUT:
            return False
        _check(rc, "wait_released", h)
        self._borrowed = None
        return True

    def wait(self):
        """Waits for the save in flight; raises if it failed (once: a
        failure already raised by save() or wait() is not raised again)."""
        self._handle()
        if self._outstanding:
            self._collect("wait")

    def progress(self):
        """The current or last save's progress (ckpt_poll) as a dict;
        "error" holds a failure without collecting it."""
        p = _lib.Progress()
        rc = _L.ckpt_poll(self._handle(), ctypes.byref(p))
        d = _struct_dict(p, _lib.SAVE_STATES)
        d["running"] = rc == 1
        d["error"] = _error(rc, _lib.text(_L.ckpt_errmsg(self._h)),
                            "save step %d" % p.step) if rc < 0 else None
        return d

    def commit(self, step):
        """Commits a step every host saved (manual_commit, host_count>1)."""
        h = self._handle()
        _check(_L.ckpt_commit(h, step), "commit step %d" % step, h)

    # -- reading
    def latest_step(self):
        """The newest committed step, or None. With a remote, the newer of
        the directory's and the bucket's: a notice's save the engine sent
        straight to the bucket (the network being faster than the disk) is
        only there, and so is everything on a recreated node."""
        return self._latest()[0]

    def _latest(self):
        """(step or None, the location holding it)."""
        h = self._handle()
        v = _lib.c_u64()
        rc = _L.ckpt_latest(h, ctypes.byref(v))
        if rc != _lib.E_NOTFOUND:
            _check(rc, "latest", h)
        best = (None if rc == _lib.E_NOTFOUND else v.value, self.location)
        if self.remote:
            r = _latest_at(self.remote)
            if r is not None and (best[0] is None or r > best[0]):
                best = (r, self.remote)
        return best

    def steps(self):
        """Committed steps, ascending, as dicts (ckpt_list)."""
        h = self._handle()
        p = ctypes.POINTER(_lib.StepInfo)()
        n = ctypes.c_size_t()
        _check(_L.ckpt_list(h, ctypes.byref(p), ctypes.byref(n)), "list", h)
        try:
            out = []
            for i in range(n.value):
                out.append(_struct_dict(p[i]))
            return out
        finally:
            _L.ckpt_free(p)

    def restore(self, step=None, into=None):
        """The state saved as `step` (None: the latest, see latest_step),
        with the same nesting and types it was saved with; with a remote,
        from the directory if the step is committed there, else from the
        bucket. NotFoundError if none. into: arrays to read into in place,
        as for ckpt.load()."""
        self._handle()
        where = self.location
        if step is None and self.remote:
            step, where = self._latest()
            if step is None:
                where = self.location
        try:
            return _load(where, step, ctypes.byref(self._settings), into)
        except NotFoundError:
            if not self.remote or where == self.remote:
                raise
            return _load(self.remote, step, ctypes.byref(self._settings),
                         into)

    # -- watcher, plan, upload
    def _get(self, cls, fn, what):
        s = cls()
        h = self._handle()
        _check(fn(h, ctypes.byref(s)), what, h)
        return s

    def watch_state(self):
        """The watcher's state (ckpt_watch_state) as a dict; "keys" lists
        each watched metadata key's state."""
        w = self._get(_lib.WatchInfo, _L.ckpt_watch_state, "watch_state")
        d = _struct_dict(w)
        d["keys"] = [_struct_dict(w.keys[i], _lib.WKEY_STATES)
                     for i in range(min(w.nkeys, _lib.WATCH_MAX_KEYS))]
        return d

    def plan(self):
        """The last plan for a notice's save (ckpt_plan_get) as a dict."""
        return _struct_dict(self._get(_lib.Plan, _L.ckpt_plan_get, "plan"))

    def upload_status(self):
        """The background upload's state (ckpt_upload_status_get)."""
        return _struct_dict(self._get(_lib.UploadStatus,
                                      _L.ckpt_upload_status_get, "upload"),
                            _lib.UPLOAD_STATES)

    def upload_wait(self, timeout=None):
        """With a remote: blocks until every pending upload is committed
        in the bucket (timeout seconds, None: no limit); raises on a failed
        upload or the timeout."""
        h = self._handle()
        ms = -1 if timeout is None else int(timeout * 1000)
        _check(_L.ckpt_upload_wait(h, ms), "upload_wait", h)
