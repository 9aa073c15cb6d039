"""_lib: ctypes declarations of libckpt's public API (include/ckpt.h).

Design note. The binding is plain ctypes over the shared library, so it
needs no compiler and no python3-dev: this file mirrors the header's
structs field by field (reserved members included, so sizes and offsets
match; tests/test_python.py compares every one with a C program built from
the header) and declares the argument and result types of each exported
ckpt_* function the package calls. Nothing but the public API is used:
libckpt.so exports nothing else.

Finding the library, first that exists wins:
  1. the environment variable CKPT_LIB (a path to libckpt.so),
  2. a source checkout: ../../build/engine/libckpt.so* beside this package,
  3. ctypes.util.find_library("ckpt"), then "libckpt.so.0".
ctypes releases the GIL during every foreign call, so a save or a read
running in C never blocks other Python threads.
"""

import ctypes
import ctypes.util
import glob
import os

c_u8, c_u32, c_u64 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64
c_i32, c_i64 = ctypes.c_int32, ctypes.c_int64
c_char_p, c_void_p = ctypes.c_char_p, ctypes.c_void_p
c_size_t = ctypes.c_size_t
P_u64 = ctypes.POINTER(c_u64)

# include/ckpt.h constants
E_CORRUPT, E_VERSION, E_NOTFOUND, E_BUSY = -30900, -30901, -30902, -30903
E_DUPNAME, E_INCOMPLETE, E_CODEC, E_EXISTS = -30904, -30905, -30906, -30907
E_MISMATCH, E_CANCELED, E_PREVIOUS = -30908, -30909, -30910

DTYPES = {"bool": 1, "u8": 2, "i8": 3, "u16": 4, "i16": 5, "u32": 6,
          "i32": 7, "u64": 8, "i64": 9, "f16": 10, "bf16": 11, "f32": 12,
          "f64": 13, "f8e4m3": 14, "f8e5m2": 15}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DTYPE_SIZE = {"bool": 1, "u8": 1, "i8": 1, "u16": 2, "i16": 2, "u32": 4,
              "i32": 4, "u64": 8, "i64": 8, "f16": 2, "bf16": 2, "f32": 4,
              "f64": 8, "f8e4m3": 1, "f8e5m2": 1}
CODECS = {"none": 0, "zstd": 1, "float": 2}
REASONS = ["unspecified", "periodic", "maintenance", "preempted", "sigterm",
           "manual", "requested", "upcoming"]

MAX_NDIM = 16
F_NO_DIRECT, F_MANUAL_COMMIT, F_NO_URING, F_WATCH, F_DEDUP = 1, 2, 4, 8, 16
WATCH_NO_METADATA, WATCH_NO_PROBE, WATCH_NO_POD = 1, 2, 4
AFTER_STOP, AFTER_CONTINUE = 0, 1
SAVE_BORROW = 1  # ckpt_save_opts.flags (CKPT_0.3)
EXIT_RESTART = 75
LATEST = 2**64 - 1
SAVE_DEFAULT = -2**31
STATS_MAX_CODECS = 16
WATCH_MAX_KEYS = 4
SAVE_STATES = ["idle", "staging", "writing", "done", "failed"]
UPLOAD_STATES = ["none", "running", "committed", "uploaded", "failed",
                 "pending"]
WKEY_STATES = ["unknown", "ok", "absent", "error"]


class Settings(ctypes.Structure):
    _fields_ = [("staging_bytes", c_u64), ("chunk_bytes", c_u32),
                ("codec", c_i32), ("level", c_i32), ("threads", c_u32),
                ("files_per_host", c_u32), ("host_index", c_u32),
                ("host_count", c_u32), ("queue_depth", c_u32),
                ("keep_last", c_u32), ("keep_every", c_u32),
                ("flags", c_u32), ("remote", c_char_p),
                ("reserved", c_u64 * 7)]


class Tensor(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_i32), ("ndim", c_u32),
                ("shape", P_u64), ("slice_offset", P_u64),
                ("slice_extent", P_u64), ("data", c_void_p),
                ("nbytes", c_u64), ("flags", c_u32), ("reserved0", c_u32),
                ("reserved", c_u64 * 2)]


class Progress(ctypes.Structure):
    _fields_ = [("step", c_u64), ("state", c_i32), ("status", c_i32),
                ("bytes_total", c_u64), ("bytes_staged", c_u64),
                ("bytes_written", c_u64), ("bytes_committed", c_u64),
                ("bytes_stored", c_u64), ("reason", c_i32),
                ("sinks_failed", c_u32), ("reserved", c_u64 * 3)]


class SaveOpts(ctypes.Structure):
    _fields_ = [("codec", c_i32), ("level", c_i32), ("reason", c_i32),
                ("flags", c_u32), ("deadline_ns", c_i64),
                ("reserved", c_u64 * 6)]


class UploadStatus(ctypes.Structure):
    _fields_ = [("step", c_u64), ("state", c_i32), ("status", c_i32),
                ("bytes_total", c_u64), ("bytes_confirmed", c_u64),
                ("pending_steps", c_u32), ("reserved0", c_u32),
                ("retries", c_u64), ("msg", ctypes.c_char * 256),
                ("reserved", c_u64 * 4)]


class StepInfo(ctypes.Structure):
    _fields_ = [("step", c_u64), ("host_count", c_u32),
                ("file_count", c_u32), ("tensor_count", c_u64),
                ("raw_bytes", c_u64), ("stored_bytes", c_u64),
                ("commit_unix_ns", c_i64), ("reason", c_i32),
                ("reserved32", c_u32), ("referenced_by", c_u64),
                ("reserved", c_u64 * 2)]


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_i32), ("ndim", c_u32),
                ("shape", P_u64), ("nbytes", c_u64),
                ("slice_count", c_u32), ("reserved0", c_u32),
                ("stored_bytes", c_u64), ("reserved", c_u64 * 4)]


class ReadReq(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("offset", P_u64), ("extent", P_u64),
                ("dst", c_void_p), ("dst_bytes", c_u64), ("status", c_i32),
                ("flags", c_u32), ("reserved", c_u64 * 2)]


NOTICE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)


class WatchOpts(ctypes.Structure):
    _fields_ = [("flags", c_u32), ("every_steps", c_u32),
                ("every_seconds", c_u32), ("time_scale", c_u32),
                ("timeout_sec", c_u32), ("http_slack_ms", c_u32),
                ("upcoming_interval_ms", c_u32),
                ("absent_recheck_ms", c_u32), ("backoff_min_ms", c_u32),
                ("backoff_max_ms", c_u32), ("maintenance_window_ms", c_u32),
                ("preempted_window_ms", c_u32),
                ("sigterm_window_ms", c_u32), ("on_notice", NOTICE_FN),
                ("arg", c_void_p), ("after_save", c_i32),
                ("upcoming_lead_s", c_u32), ("pod_interval_ms", c_u32),
                ("pod_slack_ms", c_u32), ("reserved", c_u64 * 6)]


class SaveAdvice(ctypes.Structure):
    _fields_ = [("reason", c_i32), ("flags", c_u32), ("deadline_ns", c_i64),
                ("notice_ns", c_i64), ("event", c_u64),
                ("reserved", c_u64 * 4)]


class WatchKey(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char * 48), ("value", ctypes.c_char * 256),
                ("etag", ctypes.c_char * 40), ("error", ctypes.c_char * 160),
                ("state", c_i32), ("flags", c_u32), ("changed_ns", c_i64),
                ("ok_ns", c_i64), ("requests", c_u64), ("errors", c_u64),
                ("changes", c_u64), ("reserved", c_u64 * 4)]


class WatchInfo(ctypes.Structure):
    _fields_ = [("running", c_i32), ("healthy", c_i32), ("nkeys", c_u32),
                ("sigterm", c_u32), ("notices", c_u64), ("degraded", c_u64),
                ("host", ctypes.c_char * 128), ("pod_state", c_u32),
                ("pod_requests_lost", c_u32), ("pod_request", c_u64),
                ("pod_target", c_u64), ("pod_requests_made", c_u64),
                ("reserved", c_u64 * 2),
                ("keys", WatchKey * WATCH_MAX_KEYS)]


class Plan(ctypes.Structure):
    _fields_ = [("event", c_u64), ("reason", c_i32), ("codec", c_i32),
                ("dest", c_i32), ("inflight", c_i32), ("deadline_ns", c_i64),
                ("planned_ns", c_i64), ("state_bytes", c_u64),
                ("predicted_s", ctypes.c_double), ("left_s", ctypes.c_double),
                ("step", c_u64), ("status", c_i32), ("deadline_met", c_i32),
                ("durable_ns", c_i64), ("margin_s", ctypes.c_double),
                ("local_bps", ctypes.c_double),
                ("remote_bps", ctypes.c_double),
                ("encode_bps", ctypes.c_double * STATS_MAX_CODECS),
                ("ratio", ctypes.c_double * STATS_MAX_CODECS),
                ("reserved", c_u64 * 8)]


EVENT_FN = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p, c_u32, c_char_p)

# Every struct above, by its C name (the layout self-check uses this).
STRUCTS = {"ckpt_settings": Settings, "ckpt_tensor": Tensor,
           "ckpt_progress": Progress, "ckpt_save_opts": SaveOpts,
           "ckpt_upload_status": UploadStatus, "ckpt_step_info": StepInfo,
           "ckpt_tensor_info": TensorInfo, "ckpt_read_req": ReadReq,
           "ckpt_watch_opts": WatchOpts, "ckpt_save_advice": SaveAdvice,
           "ckpt_watch_key": WatchKey, "ckpt_watch_info": WatchInfo,
           "ckpt_plan": Plan}

P = ctypes.POINTER
# name: (restype, argtypes)
_PROTOS = {
    "ckpt_version_string": (c_char_p, []),
    "ckpt_strerror": (c_char_p, [ctypes.c_int]),
    "ckpt_settings_default": (None, [P(Settings)]),
    "ckpt_open": (ctypes.c_int, [P(c_void_p), c_char_p, P(Settings)]),
    "ckpt_close": (ctypes.c_int, [c_void_p]),
    "ckpt_errmsg": (c_char_p, [c_void_p]),
    "ckpt_save_ex": (ctypes.c_int, [c_void_p, c_u64, P(Tensor), c_size_t,
                                    P(SaveOpts)]),
    "ckpt_save_opts_default": (None, [P(SaveOpts)]),
    "ckpt_wait_released": (ctypes.c_int, [c_void_p, ctypes.c_int]),
    "ckpt_wait": (ctypes.c_int, [c_void_p]),
    "ckpt_poll": (ctypes.c_int, [c_void_p, P(Progress)]),
    "ckpt_upload_status_get": (ctypes.c_int, [c_void_p, P(UploadStatus)]),
    "ckpt_upload_wait": (ctypes.c_int, [c_void_p, ctypes.c_int]),
    "ckpt_commit": (ctypes.c_int, [c_void_p, c_u64]),
    "ckpt_list": (ctypes.c_int, [c_void_p, P(P(StepInfo)), P(c_size_t)]),
    "ckpt_latest": (ctypes.c_int, [c_void_p, P(c_u64)]),
    "ckpt_free": (None, [c_void_p]),
    "ckpt_reader_open": (ctypes.c_int, [P(c_void_p), c_char_p, c_u64,
                                        P(Settings)]),
    "ckpt_reader_close": (None, [c_void_p]),
    "ckpt_reader_errmsg": (c_char_p, [c_void_p]),
    "ckpt_reader_step": (c_u64, [c_void_p]),
    "ckpt_reader_tensor_count": (c_size_t, [c_void_p]),
    "ckpt_reader_tensor": (ctypes.c_int, [c_void_p, c_size_t,
                                          P(TensorInfo)]),
    "ckpt_reader_find": (ctypes.c_int, [c_void_p, c_char_p, P(c_size_t)]),
    "ckpt_read": (ctypes.c_int, [c_void_p, c_char_p, c_void_p, c_u64]),
    "ckpt_read_batch": (ctypes.c_int, [c_void_p, P(ReadReq), c_size_t]),
    "ckpt_watch_opts_default": (None, [P(WatchOpts)]),
    "ckpt_watch_start": (ctypes.c_int, [c_void_p, P(WatchOpts)]),
    "ckpt_should_save": (ctypes.c_int, [c_void_p, c_u64, P(SaveAdvice)]),
    "ckpt_should_stop": (ctypes.c_int, [c_void_p]),
    "ckpt_request_save": (ctypes.c_int, [c_void_p, c_i64]),
    "ckpt_watch_sigterm": (ctypes.c_int, [c_void_p]),
    "ckpt_watch_state": (ctypes.c_int, [c_void_p, P(WatchInfo)]),
    "ckpt_plan_get": (ctypes.c_int, [c_void_p, P(Plan)]),
    "ckpt_event_append": (ctypes.c_int, [c_char_p, c_u32, c_char_p]),
    "ckpt_events_read": (ctypes.c_int, [c_char_p, EVENT_FN, c_void_p]),
}


def _candidates():
    env = os.environ.get("CKPT_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.join(here, "..", "..", "build", "engine")
    for path in sorted(glob.glob(os.path.join(build, "libckpt.so*"))):
        yield os.path.normpath(path)
    found = ctypes.util.find_library("ckpt")
    if found:
        yield found
    yield "libckpt.so.0"


def _load():
    tried = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
            continue
        for name, (res, args) in _PROTOS.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        return lib, path
    raise ImportError("ckpt: cannot load libckpt; tried: " + "; ".join(tried)
                      + " (set CKPT_LIB to the path of libckpt.so)")


lib, path = _load()


def text(b):
    """A C string (bytes or None) as str."""
    return b.decode("utf-8", "replace") if b else ""
