/*
 * ckpt.h - the one public header of libckpt, a checkpoint storage engine
 * for machine-learning training.
 *
 * Design in one paragraph: a training loop opens a `ckpt` handle on a
 * checkpoint root directory once. `ckpt_save()` copies the caller's tensors
 * into a pre-faulted staging pool and returns as soon as every byte is
 * copied; worker threads then compress and hash fixed-size chunks and an
 * io_uring writer puts them into this host's shard files. When every host's
 * part of a step is durable, a single commit record is written last; a step
 * without a valid commit record does not exist for readers. `ckpt_reader`
 * opens one committed step for loading, inspection and verification.
 *
 * Conventions (as in liburing, zstd, LMDB):
 *  - every function that can fail returns int: 0 on success, -errno for
 *    operating-system failures (passed through unchanged) or one of the
 *    CKPT_E_* codes below, which live in a reserved block outside the errno
 *    range. ckpt_strerror() describes both kinds.
 *  - details a code cannot carry (file, offset, tensor name) are in the
 *    handle's last error message: ckpt_errmsg() / ckpt_reader_errmsg().
 *    With a NULL handle they return the calling thread's last message, which
 *    is how the failure of an *_open() call is explained.
 *    See "Threads, messages and fork" below for which message a thread
 *    sees when several threads use one handle.
 *  - destructors accept NULL.
 *  - a ckpt handle may be used from several threads (for example the
 *    training loop and a maintenance watcher); a ckpt_reader handle may be
 *    used by one thread at a time.
 *  - ABI: structs passed in arrays (ckpt_tensor, ckpt_read_req) and structs
 *    the library fills carry `flags` and `reserved` members so they can
 *    grow without changing size. Callers must zero what they do not set
 *    (designated initializers or memset); the library refuses a nonzero
 *    reserved member or an unknown flag with -EINVAL naming the entry.
 *    Array members have fixed sizes that do not follow the enums (see
 *    CKPT_STATS_MAX_CODECS). Only the functions declared here are exported,
 *    each under the version node (CKPT_0.1, ...) that introduced it.
 *
 * Threads, messages and fork:
 *  - callbacks run synchronously on the thread that called the function
 *    taking them, before that function returns: the progress callbacks of
 *    ckpt_reader_verify() and ckpt_reader_copy() between units of work,
 *    the ckpt_gc_fn of ckpt_gc() once per step directory. The library's
 *    worker threads never call user code; the one exception is the
 *    watcher's ckpt_watch_opts.on_notice, which runs on the watcher
 *    thread (see ckpt_watch_start). A callback must not call the
 *    handle it reports on (a reader is used by one thread at a time; see
 *    ckpt_gc for the gc callback).
 *  - each handle keeps one last-error message: the message of the most
 *    recent failure recorded on that handle by any thread, including a
 *    background save's failure once ckpt_save/ckpt_wait/ckpt_poll reports
 *    it, and the warning of a commit that succeeded but could not update
 *    `latest` or apply retention. So with a ckpt handle shared by threads,
 *    a failure on thread B can replace the message of thread A's failure
 *    before A reads it. Other successful calls leave the message as it
 *    was, except that ckpt_reader_open(), ckpt_reader_verify() and
 *    ckpt_reader_copy() clear the reader's on success. ckpt_errmsg(c) returns
 *    a copy, taken under the handle's lock, in a buffer of the calling
 *    thread that stays valid until that thread's next ckpt_errmsg() call.
 *    ckpt_errmsg(NULL) / ckpt_reader_errmsg(NULL) return the calling
 *    thread's own last message, which no other thread can change: right
 *    after a failed call it is exactly that call's message.
 *    ckpt_reader_errmsg(r) returns the reader's own buffer, valid until the
 *    next call on that reader.
 *  - fork(): a handle belongs to the process that opened it; its worker
 *    threads exist only there. In a child process, a handle inherited from
 *    the parent may only be closed: ckpt_close() and ckpt_reader_close()
 *    notice that they run in another process and then only release the
 *    child's copy of the handle's memory (buffers) and of its descriptors
 *    (except the shard files of a save in flight, which are
 *    close-on-exec). The staging pool is not inherited at all
 *    (MADV_DONTFORK: it is pinned for io_uring, and copying it into every
 *    child, such as each DataLoader worker, would cost a whole pool per
 *    child): its address range is unmapped in the child, which must not
 *    touch it, and ckpt_close() there leaves the range alone. They take
 *    no lock, wait for no save and write or remove nothing; the parent's
 *    handle is unaffected. ckpt_close() returns 0 there. Reads, verify
 *    and copy through an inherited reader fail with -ECHILD (its
 *    accessors still work); any other use of an inherited ckpt handle is
 *    undefined. Open new handles in the child if it needs the library.
 *
 * Symbols not declared here are not API.
 *
 * One header on purpose (as zstd.h, sqlite3.h, curl.h): a user reads the
 * whole contract in one file; most of its ~1,100 lines are documentation.
 */
#ifndef CKPT_H
#define CKPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(CKPT_BUILDING_LIBRARY)
#define CKPT_API __attribute__((visibility("default")))
#else
#define CKPT_API
#endif

/* ------------------------------------------------------------------ */
/* Version                                                            */
/* ------------------------------------------------------------------ */

#define CKPT_VERSION_MAJOR 0
#define CKPT_VERSION_MINOR 1
#define CKPT_VERSION_PATCH 0
#define CKPT_VERSION_NUMBER \
	(CKPT_VERSION_MAJOR * 10000 + CKPT_VERSION_MINOR * 100 + CKPT_VERSION_PATCH)

/* On-disk format version written by this library (see SPEC.md). */
#define CKPT_FORMAT_VERSION 1

CKPT_API unsigned ckpt_version_number(void);
CKPT_API const char *ckpt_version_string(void);

/* ------------------------------------------------------------------ */
/* Errors                                                             */
/* ------------------------------------------------------------------ */

/* Library error codes. Always add new codes last; never renumber. */
enum ckpt_error {
	CKPT_E_CORRUPT = -30900,    /* data or metadata failed validation:
	                               checksum, bounds, magic, size */
	CKPT_E_VERSION = -30901,    /* format version not supported */
	CKPT_E_NOTFOUND = -30902,   /* no such checkpoint, step or tensor */
	CKPT_E_BUSY = -30903,       /* a save is already in flight */
	CKPT_E_DUPNAME = -30904,    /* two tensors of one save share a name */
	CKPT_E_INCOMPLETE = -30905, /* commit: some host's part is missing */
	CKPT_E_CODEC = -30906,      /* the compression library failed */
	CKPT_E_EXISTS = -30907,     /* the step is already committed */
	CKPT_E_MISMATCH = -30908,   /* slices of one array disagree (dtype,
	                               global shape, overlap) */
	CKPT_E_CANCELED = -30909,   /* a progress callback asked to stop */
	CKPT_E_PREVIOUS = -30910,   /* an earlier background save failed and
	                               nobody collected its status; see the
	                               message; the new save was not started */
	CKPT_E_LAST = -30910
};

/* Description of 0, a -errno value or a CKPT_E_* code. Never NULL. */
CKPT_API const char *ckpt_strerror(int err);

/* ------------------------------------------------------------------ */
/* Data types                                                         */
/* ------------------------------------------------------------------ */

enum ckpt_dtype {
	CKPT_DTYPE_INVALID = 0,
	CKPT_BOOL = 1,
	CKPT_U8 = 2,
	CKPT_I8 = 3,
	CKPT_U16 = 4,
	CKPT_I16 = 5,
	CKPT_U32 = 6,
	CKPT_I32 = 7,
	CKPT_U64 = 8,
	CKPT_I64 = 9,
	CKPT_F16 = 10,
	CKPT_BF16 = 11,
	CKPT_F32 = 12,
	CKPT_F64 = 13,
	CKPT_F8E4M3 = 14,
	CKPT_F8E5M2 = 15,
	CKPT_DTYPE_COUNT = 16
};

/* Bytes per element, or 0 for an invalid dtype. */
CKPT_API size_t ckpt_dtype_size(int dtype);
/* Short lower-case name ("bf16", "f8e4m3", ...), or NULL if invalid. */
CKPT_API const char *ckpt_dtype_name(int dtype);
/* Inverse of ckpt_dtype_name(); CKPT_DTYPE_INVALID if unknown. */
CKPT_API int ckpt_dtype_from_name(const char *name);

/* Maximum number of dimensions of a tensor. */
#define CKPT_MAX_NDIM 16
/* Maximum length in bytes of a tensor name (UTF-8, no NUL). */
#define CKPT_MAX_NAME 4096

/* ------------------------------------------------------------------ */
/* Codecs                                                             */
/* ------------------------------------------------------------------ */

enum ckpt_codec {
	CKPT_CODEC_NONE = 0,  /* raw bytes */
	CKPT_CODEC_ZSTD = 1,  /* one zstd frame per chunk */
	CKPT_CODEC_FLOAT = 2, /* float-aware: bytes of 2/4/8-byte elements
	                         grouped by significance (exponents together),
	                         each group Huffman-coded, zstd-compressed
	                         or stored raw, whichever suits it */
	CKPT_CODEC_COUNT = 3
};

CKPT_API const char *ckpt_codec_name(int codec); /* "none", "zstd", "float" */
/* Inverse of ckpt_codec_name(); CKPT_E_NOTFOUND if unknown or NULL (never a
 * value that could be mistaken for -errno). */
CKPT_API int ckpt_codec_from_name(const char *name);

/* ------------------------------------------------------------------ */
/* Settings                                                           */
/* ------------------------------------------------------------------ */

/* Flags for ckpt_settings.flags. */
#define CKPT_F_NO_DIRECT (1u << 0)    /* never use O_DIRECT */
#define CKPT_F_MANUAL_COMMIT (1u << 1) /* never commit from ckpt_save();
                                        the caller runs ckpt_commit() */
#define CKPT_F_NO_URING (1u << 2)     /* plain pwrite/pread instead of
                                        io_uring (for debugging) */
#define CKPT_F_WATCH (1u << 3)        /* ckpt_open() starts the maintenance
                                         watcher with default options
                                         (see ckpt_watch_start) */
/* Deduplication (SPEC.md section 16): a chunk whose bytes equal those of
 * the same chunk in the newest committed step (frozen layers when
 * fine-tuning) is neither rewritten nor re-uploaded; the new step refers
 * to the older step's bytes, and retention/gc keep referenced steps.
 * Steps are then written in format version 2. A plain directory dedups;
 * so does a directory with `remote`, in both places, once this handle's
 * upload has committed the base step in the bucket (before that, and for
 * the first save after ckpt_open, the save is written in full); so does
 * a gs:// root, against the step this handle committed last (its first
 * save after ckpt_open is sent in full; on a pod, every save is).
 * Off by default for now; the environment variable CKPT_DEDUP=1 turns it
 * on for every handle and CKPT_DEDUP=0 off (overriding the flag). */
#define CKPT_F_DEDUP (1u << 4)

typedef struct ckpt_settings {
	/* Staging pool, allocated and pre-faulted once by ckpt_open().
	 * Default 512 MiB. A save larger than the pool still works: the copy
	 * proceeds as the writer frees buffers, so peak memory stays at the
	 * pool size. 0 makes a handle that cannot save (list, gc, commit). */
	uint64_t staging_bytes;
	/* Raw bytes per chunk: multiple of 4096 in [64 KiB, 64 MiB].
	 * Default 4 MiB. */
	uint32_t chunk_bytes;
	/* Codec for new chunks (enum ckpt_codec). Default CKPT_CODEC_FLOAT,
	 * which falls back to zstd for 1-byte types. A chunk that does not
	 * shrink is always stored raw. */
	int32_t codec;
	/* zstd level for CKPT_CODEC_ZSTD and CKPT_CODEC_FLOAT. Default 1. */
	int32_t level;
	/* Worker threads for compression, hashing and decompression.
	 * 0 (default) = number of online CPUs. */
	uint32_t threads;
	/* Shard files per host written in parallel. Default 4. */
	uint32_t files_per_host;
	/* This host's index and the number of hosts writing each step.
	 * Defaults 0 and 1. With host_count > 1, ckpt_save() writes only this
	 * host's part and a coordinator calls ckpt_commit(). */
	uint32_t host_index;
	uint32_t host_count;
	/* io_uring submission queue depth. Default 32. */
	uint32_t queue_depth;
	/* Retention applied after each commit made through this handle:
	 * keep the newest keep_last committed steps (0 = keep all) and also
	 * every step divisible by keep_every (0 = none). The newest committed
	 * step is never removed. Defaults 0 and 0. */
	uint32_t keep_last;
	uint32_t keep_every;
	uint32_t flags; /* CKPT_F_* */
	/* A Cloud Storage location "gs://BUCKET/PREFIX" that receives the same
	 * bytes as the directory ("both"): the step is saved and committed
	 * locally first, the upload finishes in the background (journaled
	 * under DIR/.upload, resumed by the next ckpt_open on DIR) and the step
	 * is committed in the bucket once every host's part is there. See
	 * ckpt_upload_status(). NULL (default): none. Copied by ckpt_open. */
	const char *remote;
	uint64_t reserved[7]; /* must be zero */
} ckpt_settings;

/* Fills *s with the defaults above. */
CKPT_API void ckpt_settings_default(ckpt_settings *s);

/* ------------------------------------------------------------------ */
/* Saving                                                             */
/* ------------------------------------------------------------------ */

typedef struct ckpt ckpt;

/*
 * Opens (creating it if needed) the checkpoint root directory `dir` and
 * allocates the staging pool. `s` may be NULL for defaults.
 * On success *out owns the handle: release it with ckpt_close().
 * On failure *out is NULL and ckpt_errmsg(NULL) explains.
 */
CKPT_API int ckpt_open(ckpt **out, const char *dir, const ckpt_settings *s);

/*
 * Waits for an in-flight save, then frees everything. Returns the status
 * of that save (0 if there was none or it succeeded). Accepts NULL.
 * With a remote (settings.remote), after the save a notice asked for, it
 * also waits for the upload to be committed in the bucket, until 3 s
 * before the notice's deadline at most: the VM is about to stop, and a
 * node that does not come back keeps nothing local. What is left stays
 * journaled for the next ckpt_open (the journal says which). Requests
 * still in flight to the bucket are cancelled, not waited for: a bucket
 * that stopped answering does not hold up the close.
 * In a child of fork() it only releases the child's copy (see the top).
 */
CKPT_API int ckpt_close(ckpt *c);

/* Last error message of this handle (a copy, valid until the calling
 * thread's next ckpt_errmsg() call); the calling thread's last message
 * with NULL. */
CKPT_API const char *ckpt_errmsg(const ckpt *c);

/* One tensor (or this host's slice of a global array) to save. */
typedef struct ckpt_tensor {
	const char *name;   /* UTF-8, 1..CKPT_MAX_NAME bytes; unique per save */
	int32_t dtype;      /* enum ckpt_dtype */
	uint32_t ndim;      /* 0 (scalar) .. CKPT_MAX_NDIM */
	const uint64_t *shape;        /* global shape, ndim entries */
	const uint64_t *slice_offset; /* NULL: this host holds the whole array */
	const uint64_t *slice_extent; /* NULL: the whole array */
	const void *data;   /* row-major bytes of the slice */
	uint64_t nbytes;    /* must equal product(extent) * dtype size */
	uint32_t flags;     /* none defined yet: must be 0 */
	uint32_t reserved0; /* must be 0 */
	uint64_t reserved[2]; /* must be 0 */
} ckpt_tensor;

/*
 * Starts saving `count` tensors as step `step`. Returns as soon as every
 * byte has been copied into the staging pool (blocking while the pool is
 * full), so the caller may modify its tensors right after. Persistence
 * continues in the background: collect the outcome with ckpt_wait()
 * (ckpt_poll() watches without collecting). May be called from any
 * thread.
 *
 * Errors: -EINVAL (bad argument, message names the tensor; a step above
 * 2^63-1, which the format cannot record), CKPT_E_DUPNAME,
 * CKPT_E_BUSY (a save is in flight), CKPT_E_EXISTS (step committed),
 * CKPT_E_PREVIOUS (an earlier save failed and its status was never
 * collected: that status is consumed by this call), or a background error
 * that happened while the copy was still running. A save that fails is
 * over when ckpt_save() returns (its partial output is gone), so the
 * caller may retry at once.
 */
CKPT_API int ckpt_save(ckpt *c, uint64_t step, const ckpt_tensor *tensors,
		       size_t count);

enum ckpt_save_state {
	CKPT_STATE_IDLE = 0,      /* no save has been started */
	CKPT_STATE_STAGING = 1,   /* ckpt_save() is copying, or (borrow
	                             mode) the engine still reads the
	                             caller's buffers */
	CKPT_STATE_WRITING = 2,   /* copy done (buffers released), writing
	                             in background */
	CKPT_STATE_DONE = 3,      /* this host's part is durable (and the
	                             step committed, unless manual commit) */
	CKPT_STATE_FAILED = 4
};

typedef struct ckpt_progress {
	uint64_t step;
	int32_t state;            /* enum ckpt_save_state */
	int32_t status;           /* 0 or the error of a failed save */
	uint64_t bytes_total;     /* raw bytes of this host's save */
	uint64_t bytes_staged;    /* raw bytes copied into the pool */
	uint64_t bytes_written;   /* raw bytes whose chunks reached the files */
	uint64_t bytes_committed; /* bytes_total once durable/committed */
	uint64_t bytes_stored;    /* bytes written to files (after codec) */
	int32_t reason;           /* enum ckpt_save_reason of this save */
	uint32_t sinks_failed;    /* secondary sinks failed or detached
	                             (see ckpt_sink_status) */
	uint64_t reserved[3];
} ckpt_progress;

/*
 * Waits for the in-flight save (if any) to finish and returns its status:
 * 0 when this host's part is durable and, unless CKPT_F_MANUAL_COMMIT or
 * host_count > 1, the step is committed. Collects the status: a failed save
 * reported here is not reported again by the next ckpt_save() (repeated
 * ckpt_wait() calls keep returning it until the next save starts).
 */
CKPT_API int ckpt_wait(ckpt *c);

/*
 * Non-blocking progress. Returns 1 while a save is in flight, 0 when idle
 * or finished successfully, or the failed save's error. It only observes:
 * a failure seen here is still reported by ckpt_wait(), or by the next
 * ckpt_save() (CKPT_E_PREVIOUS) or ckpt_close() if nobody waited, so a
 * thread watching progress never takes the error from the training loop.
 * `p` may be NULL.
 */
CKPT_API int ckpt_poll(ckpt *c, ckpt_progress *p);

/* Why a save was taken (ckpt_save_opts.reason). */
enum ckpt_save_reason {
	CKPT_REASON_UNSPECIFIED = 0,
	CKPT_REASON_PERIODIC = 1,    /* the regular schedule */
	CKPT_REASON_MAINTENANCE = 2, /* host maintenance announced */
	CKPT_REASON_PREEMPTED = 3,   /* preemption notice */
	CKPT_REASON_SIGTERM = 4,     /* the process is being stopped */
	CKPT_REASON_MANUAL = 5,      /* an operator asked */
	CKPT_REASON_REQUESTED = 6,   /* the orchestrator asked */
	CKPT_REASON_UPCOMING = 7,    /* a maintenance window is scheduled */
	CKPT_REASON_COUNT = 8
};

/* "unspecified", "periodic", ...; NULL if unknown. */
CKPT_API const char *ckpt_reason_name(int reason);

/* ckpt_save_opts.codec / .level: use the handle's setting. */
#define CKPT_SAVE_DEFAULT INT32_MIN

/*
 * Options of one save (ckpt_save_ex). Fill with ckpt_save_opts_default()
 * first: fields added later take their place in `reserved`.
 */
typedef struct ckpt_save_opts {
	/* Codec and zstd level for this save only (CKPT_SAVE_DEFAULT: the
	 * handle's). A handle opened with CKPT_CODEC_NONE has no compression
	 * buffers: asking it for a codec is -EINVAL. */
	int32_t codec;
	int32_t level;
	int32_t reason;      /* enum ckpt_save_reason; recorded in the
	                        step's index and commit record (SPEC.md 7,
	                        8), reported by ckpt_list and
	                        ckpt_reader_stats */
	uint32_t flags;      /* CKPT_SAVE_* below; others must be 0 */
	/* Wall-clock deadline (unix ns, 0 = none). A save asked for after
	 * its deadline is refused with -ETIMEDOUT before anything is copied;
	 * later the deadline is advisory (a started save always completes or
	 * fails on its own). */
	int64_t deadline_ns;
	uint64_t reserved[6]; /* must be zero */
} ckpt_save_opts;

/*
 * ckpt_save_opts.flags: borrow mode. The caller lends its tensors' memory
 * instead of having it copied: ckpt_save_ex() only validates, queues the
 * save and returns (no staging copy, so the call blocks for microseconds
 * whatever the state size); the worker threads then read each chunk
 * straight from the caller's memory, compress it into the pool's output
 * buffers or, for chunks stored raw (codec none, or a chunk that does not
 * shrink), copy it into a staging slot in the same pass as its checksum.
 * Raw chunks are copied because a chunk's file bytes are a 64-byte header
 * followed by the payload, which O_DIRECT (block-aligned memory and
 * lengths) cannot write from the caller's memory; the disk and an upload
 * (settings.remote, gs://) only ever see the pool's buffers, so neither
 * holds the caller's memory: the release does not wait for the disk or
 * the server.
 *
 * The caller promises not to modify (or free) the memory of any tensor
 * until the engine releases it, which happens once every chunk has been
 * read (long before the step is durable when the pool is large enough),
 * or once the save has failed and no worker reads any more. The caller
 * learns of it by any of:
 *  - ckpt_wait_released(): blocks (or polls, or times out) until then;
 *  - ckpt_poll(): progress.state leaves CKPT_STATE_STAGING;
 *  - ckpt_wait() (and ckpt_close()) return only after it.
 * If ckpt_save_ex() itself fails, nothing is borrowed when it returns. The
 * memory may have any alignment. Reading it while it is borrowed is fine.
 * The failure semantics are those of ckpt_save(): a failed save leaves
 * nothing visible.
 */
#define CKPT_SAVE_BORROW (1u << 0)

/* Fills *o with: codec and level CKPT_SAVE_DEFAULT, reason unspecified, no
 * deadline, no flags. */
CKPT_API void ckpt_save_opts_default(ckpt_save_opts *o);

/* ckpt_save() with options; `o` NULL is ckpt_save(). Same errors, plus
 * -EINVAL for bad options and -ETIMEDOUT (see deadline_ns). */
CKPT_API int ckpt_save_ex(ckpt *c, uint64_t step, const ckpt_tensor *tensors,
			  size_t count, const ckpt_save_opts *o);

/*
 * Borrow mode (CKPT_SAVE_BORROW): waits until the engine no longer reads
 * the caller's memory for the save in flight, then returns 0; at once
 * when no borrowed save is being read (none in flight, a copying save, or
 * already released). timeout_ms < 0 waits for ever, 0 only checks;
 * -ETIMEDOUT if the memory is still borrowed at the end. The outcome of
 * the save is not reported here (ckpt_wait, ckpt_poll): a failed save
 * releases the memory too.
 */
CKPT_API int ckpt_wait_released(ckpt *c, int timeout_ms);

/*
 * Sinks. A save writes to the local shard files (sink 0, always present)
 * and to any further sinks the handle has (an uploader, say). The local
 * sink decides the save: its failure fails the save, which is reported by
 * ckpt_wait() etc. as before. A further sink that fails, or that falls
 * behind by more buffers than it may hold (a quarter of the staging pool),
 * is detached for that save: it is given no more chunks, it drops what it
 * has queued, its status says why (-ENOBUFS when it fell behind), and the
 * save goes on; the bytes are durable in the local files, from which such
 * a sink can catch up. So a slow sink never holds the staging pool and
 * never blocks ckpt_save() for longer than the local files would.
 */
typedef struct ckpt_sink_status {
	char name[32];       /* "local", ... */
	int32_t status;      /* 1 in progress, 0 done, or the error */
	uint32_t required;   /* 1 for the local sink: decides the save */
	uint64_t chunks;     /* chunks this sink was given */
	uint64_t max_held;   /* most chunk buffers it held at once */
	char msg[256];       /* why it failed ("" if it did not) */
	uint64_t reserved[4];
} ckpt_sink_status;

/*
 * Status of each sink in the current or last save, sink 0 first. Fills up
 * to `max` entries of `out` and sets *count to the number of sinks.
 */
CKPT_API int ckpt_sink_status_get(ckpt *c, ckpt_sink_status *out,
				  size_t max, size_t *count);

/* State of the background upload (ckpt_settings.remote). */
enum ckpt_upload_state {
	CKPT_UPLOAD_NONE = 0,      /* no remote, or nothing uploaded yet */
	CKPT_UPLOAD_RUNNING = 1,   /* bytes moving (live or from the files) */
	CKPT_UPLOAD_COMMITTED = 2, /* last step committed in the bucket */
	CKPT_UPLOAD_UPLOADED = 3,  /* this host's part is there; another host
	                              commits the step when its part lands */
	CKPT_UPLOAD_FAILED = 4,    /* see status and msg; the journal stays */
	CKPT_UPLOAD_PENDING = 5    /* ckpt_upload_list: no process is uploading
	                              it; the next ckpt_open of the directory
	                              with this remote resumes it */
};

typedef struct ckpt_upload_status {
	uint64_t step;            /* step of the upload described */
	int32_t state;            /* enum ckpt_upload_state */
	int32_t status;           /* 0 or the error of the last failure */
	uint64_t bytes_total;     /* of this host's shard files */
	uint64_t bytes_confirmed; /* the server has them */
	uint32_t pending_steps;   /* steps not yet uploaded (incl. this) */
	uint32_t reserved0;
	uint64_t retries;         /* HTTP attempts that repeated one */
	char msg[256];            /* last failure ("" if none) */
	uint64_t reserved[4];
} ckpt_upload_status;

/* The upload's status; -ENOENT if the handle has no remote. */
CKPT_API int ckpt_upload_status_get(ckpt *c, ckpt_upload_status *out);
/* Blocks until every pending upload is committed in the bucket (or this
 * host's part is there) or failed, at most timeout_ms (< 0: no limit);
 * with CKPT_F_DEDUP, also until the upload thread has asked the bucket
 * whether it holds the directory's newest step (done once, at open).
 * Returns 0, the upload's error, or -ETIMEDOUT. */
CKPT_API int ckpt_upload_wait(ckpt *c, int timeout_ms);

/* A step of a directory not yet committed in its remote location. */
typedef struct ckpt_upload_step {
	uint64_t step;
	int32_t state;            /* CKPT_UPLOAD_RUNNING: a process has the
	                             directory open with its remote (uploading
	                             it, or about to); CKPT_UPLOAD_FAILED: its
	                             last attempt failed (msg), retried by the
	                             next ckpt_open with the remote;
	                             CKPT_UPLOAD_PENDING (see above) */
	uint32_t files;           /* this host's shard files */
	uint64_t bytes_total;     /* of the files whose size is known */
	uint64_t bytes_confirmed; /* the server had them when last recorded */
	uint32_t sizes_known;     /* 0 while the local save is still running */
	uint32_t host;            /* this host's index */
	char remote[256];         /* gs://BUCKET/PREFIX */
	char msg[256];            /* why the last attempt failed, or "" */
	uint64_t reserved[4];
} ckpt_upload_step;

/*
 * The upload state of the steps of directory `dir` that are not yet in
 * its remote location, ascending, from the upload journals under
 * DIR/.upload, without opening the directory for writing (any process
 * may ask, e.g. `ckptctl ls`, while another saves). A new array *out of
 * *count entries (free with ckpt_free; NULL and 0 when every upload is
 * done or there was none). -ENOENT if dir does not exist, -EINVAL for a
 * gs:// location (it has no journals).
 */
CKPT_API int ckpt_upload_list(const char *dir, ckpt_upload_step **out,
			      size_t *count);

/*
 * Writes the commit record of `step` after checking that every host's
 * index (1..host_count) is present and intact. Any process may call it,
 * typically the coordinator of a pod once every host reported its part
 * durable. Then updates the `latest` pointer and applies retention.
 * `latest` is a hint (readers find the newest COMMIT by scanning), so a
 * failure to update it, or of retention, does not fail a durable commit;
 * its message is left in ckpt_errmsg(). If the commit record was renamed
 * into place but the directory could not be synced, the record is removed
 * again and the error returned: a step is never left visible but not
 * known durable.
 * Errors: CKPT_E_INCOMPLETE (names the missing host), CKPT_E_CORRUPT,
 * CKPT_E_EXISTS (already committed: nothing changed).
 */
CKPT_API int ckpt_commit(ckpt *c, uint64_t step);

/* Information about one committed step. */
typedef struct ckpt_step_info {
	uint64_t step;
	uint32_t host_count;
	uint32_t file_count;      /* shard files + indexes */
	uint64_t tensor_count;    /* distinct global tensors */
	uint64_t raw_bytes;       /* logical bytes */
	uint64_t stored_bytes;    /* bytes of all files */
	int64_t commit_unix_ns;   /* when the commit record was written */
	int32_t reason;           /* enum ckpt_save_reason the commit records
	                             (host 0's, or the lowest host's that
	                             gave one); unspecified if none */
	uint32_t reserved32;
	/* Dedup (CKPT_F_DEDUP): the newest listed step whose chunks refer to
	 * this step's bytes, so retention and gc keep it; 0 if none. */
	uint64_t referenced_by;
	uint64_t reserved[2];
} ckpt_step_info;

/*
 * Lists committed steps in ascending order into a new array *out of *count
 * entries (free with ckpt_free). Directories without a valid commit record
 * are never listed.
 */
CKPT_API int ckpt_list(ckpt *c, ckpt_step_info **out, size_t *count);

/* Newest committed step; CKPT_E_NOTFOUND if there is none. */
CKPT_API int ckpt_latest(ckpt *c, uint64_t *step);

#define CKPT_GC_DRY_RUN (1u << 0) /* report, remove nothing */
/* Also remove committed steps whose upload to the remote location is not
 * finished (DIR/.upload has their journal); by default they are kept. */
#define CKPT_GC_UNUPLOADED (1u << 1)

typedef struct ckpt_gc_report {
	uint64_t steps_removed;   /* committed steps removed by retention */
	uint64_t debris_removed;  /* uncommitted directories / temp files */
	uint64_t bytes_freed;
	uint64_t reserved[4];
} ckpt_gc_report;

/*
 * Called by ckpt_gc once for every step directory it removes (with
 * CKPT_GC_DRY_RUN: would remove). committed is 1 for a committed step
 * removed by the retention policy, 0 for an uncommitted directory
 * (debris); bytes is the size of its files (what bytes_freed counts for
 * it).
 */
typedef void (*ckpt_gc_fn)(void *arg, uint64_t step, int committed,
			   uint64_t bytes);

/*
 * Removes committed steps outside the retention policy (keep the newest
 * keep_last, 0 = all, and every step divisible by keep_every, 0 = none;
 * the newest committed step always stays) and uncommitted debris older
 * than the newest committed step, and stray temporary files in the root.
 * Never touches a step being saved through this handle. `report` may be
 * NULL.
 *
 * `fn` (may be NULL) is called synchronously, on the caller's thread,
 * before ckpt_gc returns, once per removed step directory, in ascending
 * step order, right after that directory is gone (dry run: instead of
 * removing it). Stray temporary files in the root are not reported
 * through `fn`, only counted in `report`. `arg` is passed through
 * untouched and stays owned by the caller; the library keeps neither
 * `fn` nor `arg` after ckpt_gc returns. No library lock is held during
 * the call, but `fn` must not call ckpt_gc on the same root. If ckpt_gc
 * fails part way, the calls already made name the step directories fully
 * removed before the failure (the one that failed is not reported;
 * `report` still counts what was freed).
 */
CKPT_API int ckpt_gc(ckpt *c, uint32_t keep_last, uint32_t keep_every,
		     unsigned flags, ckpt_gc_fn fn, void *arg,
		     ckpt_gc_report *report);

/* Frees memory returned by the library (ckpt_list, ckpt_read_alloc). */
CKPT_API void ckpt_free(void *p);

/* ------------------------------------------------------------------ */
/* Loading, inspecting, verifying                                     */
/* ------------------------------------------------------------------ */

typedef struct ckpt_reader ckpt_reader;

#define CKPT_LATEST UINT64_MAX

/*
 * Opens committed step `step` (or CKPT_LATEST) under root `dir`. Reads and
 * validates the commit record and every host's index. `s` may be NULL; only
 * threads, queue_depth and flags are used (the settings given to ckpt_open
 * are accepted as they are: flags that only concern saving are ignored).
 * On failure *out is NULL and ckpt_reader_errmsg(NULL) explains.
 */
CKPT_API int ckpt_reader_open(ckpt_reader **out, const char *dir,
			      uint64_t step, const ckpt_settings *s);
CKPT_API void ckpt_reader_close(ckpt_reader *r);
CKPT_API const char *ckpt_reader_errmsg(const ckpt_reader *r);

CKPT_API uint64_t ckpt_reader_step(const ckpt_reader *r);
CKPT_API uint32_t ckpt_reader_host_count(const ckpt_reader *r);
CKPT_API int64_t ckpt_reader_commit_time(const ckpt_reader *r); /* unix ns */

/* A global tensor as recorded in the checkpoint. Pointers stay valid until
 * the reader is closed. */
typedef struct ckpt_tensor_info {
	const char *name;
	int32_t dtype;
	uint32_t ndim;
	const uint64_t *shape;    /* global shape */
	uint64_t nbytes;          /* bytes of the whole global array */
	uint32_t slice_count;     /* pieces it is stored as (over all hosts) */
	uint32_t reserved0;
	uint64_t stored_bytes;    /* bytes on disk attributed to it, after codec
	                             (chunks shared by several tensors are
	                             attributed pro rata) */
	uint64_t reserved[4];
} ckpt_tensor_info;

/* One stored piece of a global tensor. */
typedef struct ckpt_slice_info {
	uint32_t host;
	uint32_t reserved0;
	const uint64_t *offset;   /* ndim entries */
	const uint64_t *extent;   /* ndim entries */
	uint64_t nbytes;
	uint64_t reserved[2];
} ckpt_slice_info;

/* Tensors are numbered 0..count-1 in name order (bytewise). */
CKPT_API size_t ckpt_reader_tensor_count(const ckpt_reader *r);
CKPT_API int ckpt_reader_tensor(const ckpt_reader *r, size_t i,
				ckpt_tensor_info *out);
/* Index of tensor `name`, or CKPT_E_NOTFOUND. */
CKPT_API int ckpt_reader_find(const ckpt_reader *r, const char *name,
			      size_t *index);
CKPT_API int ckpt_reader_slice(const ckpt_reader *r, size_t tensor,
			       uint32_t j, ckpt_slice_info *out);

/*
 * Reads the whole global tensor `name` into dst (dst_bytes must equal its
 * nbytes). Every chunk is checksummed; a mismatch is CKPT_E_CORRUPT with a
 * message naming tensor, file and offset, and dst contents are then
 * unspecified.
 */
CKPT_API int ckpt_read(ckpt_reader *r, const char *name, void *dst,
		       uint64_t dst_bytes);

/*
 * Reads the box [offset, offset+extent) of global tensor `name`, assembled
 * from whichever stored slices overlap it, row-major into dst
 * (dst_bytes = product(extent) * dtype size). CKPT_E_NOTFOUND if part of
 * the box is not covered by any stored slice.
 */
CKPT_API int ckpt_read_slice(ckpt_reader *r, const char *name,
			     const uint64_t *offset, const uint64_t *extent,
			     void *dst, uint64_t dst_bytes);

/* Several reads done together: chunks are read in file order through
 * io_uring and decoded on all workers. Each request gets its own status;
 * the return value is the first failure (or 0). A request with a nonzero
 * flags or reserved member fails alone with -EINVAL. */
typedef struct ckpt_read_req {
	const char *name;
	const uint64_t *offset;   /* NULL: whole tensor */
	const uint64_t *extent;   /* NULL: whole tensor */
	void *dst;
	uint64_t dst_bytes;
	int32_t status;           /* out */
	uint32_t flags;           /* none defined yet: must be 0 */
	uint64_t reserved[2];     /* must be 0 */
} ckpt_read_req;

CKPT_API int ckpt_read_batch(ckpt_reader *r, ckpt_read_req *reqs, size_t n);

/* Reads the whole tensor into a new buffer (free with ckpt_free). */
CKPT_API int ckpt_read_alloc(ckpt_reader *r, const char *name, void **out,
			     uint64_t *nbytes);

/* Progress callback for long operations; return non-zero to cancel
 * (the operation then fails with CKPT_E_CANCELED). Called on the thread
 * that called the operation, between units of work (verify: after each
 * file or chunk read in file order; copy: after each block written), with
 * done <= total; not called by worker threads. It must not use the
 * reader it reports on. */
typedef int (*ckpt_progress_fn)(void *arg, uint64_t done, uint64_t total);

/*
 * Checks the whole step against its commit record: every file's size and
 * XXH3, every shard and chunk header, every chunk's content hash. Returns
 * 0, or CKPT_E_CORRUPT with a message naming the first bad place (file,
 * offset, tensor). `fn` may be NULL.
 */
CKPT_API int ckpt_reader_verify(ckpt_reader *r, ckpt_progress_fn fn,
				void *arg);

/* A file of the step, as listed by its commit record. */
enum ckpt_file_kind { CKPT_FILE_SHARD = 0, CKPT_FILE_INDEX = 1,
		      CKPT_FILE_COMMIT = 2 };

typedef struct ckpt_file_info {
	const char *name;         /* relative to the step directory */
	uint64_t size;
	uint64_t xxh3;            /* XXH3-64 of the whole file */
	uint32_t host;
	int32_t kind;             /* enum ckpt_file_kind */
	uint64_t reserved[2];
} ckpt_file_info;

CKPT_API size_t ckpt_reader_file_count(const ckpt_reader *r);
CKPT_API int ckpt_reader_file(const ckpt_reader *r, size_t i,
			      ckpt_file_info *out);
/* A deduplicated step (CKPT_F_DEDUP): the older steps whose files it
 * refers to, ascending, into steps[0..max). Returns how many there are
 * (more than max when steps is too short; 0 for a step that refers to
 * none). A copy of the step (ckpt_reader_copy) needs these at its
 * destination first. */
CKPT_API size_t ckpt_reader_ref_steps(const ckpt_reader *r, uint64_t *steps,
				      size_t max);

/* Size of the per-codec arrays of ckpt_stats. Fixed: adding a codec does
 * not change the struct. Entry k counts codec k (enum ckpt_codec); entries
 * of codecs the library does not know are zero. A program built with an
 * older header may loop to CKPT_STATS_MAX_CODECS and name entries with
 * ckpt_codec_name(), which answers for the library it runs against. */
#define CKPT_STATS_MAX_CODECS 16

/* Totals of the step by codec, for inspection. */
typedef struct ckpt_stats {
	uint64_t raw_bytes;
	uint64_t stored_bytes;     /* chunk payloads after codec */
	uint64_t file_bytes;       /* all files incl. headers and padding */
	uint64_t chunks;
	uint64_t chunks_by_codec[CKPT_STATS_MAX_CODECS];
	uint64_t raw_by_codec[CKPT_STATS_MAX_CODECS];
	uint64_t stored_by_codec[CKPT_STATS_MAX_CODECS];
	int32_t reason;            /* as ckpt_step_info.reason */
	uint32_t reserved32;
	uint64_t reserved[3];
} ckpt_stats;

CKPT_API int ckpt_reader_stats(const ckpt_reader *r, ckpt_stats *out);

/*
 * Copies the step's files into root `dst_root` (a directory, created if
 * needed, or gs://BUCKET/PREFIX) as a committed checkpoint of the same
 * step, checking every file's size and XXH3 while copying; the commit
 * record is written last and `latest` updated. On any mismatch nothing is
 * committed at the destination. A deduplicated step (CKPT_F_DEDUP) is
 * copied only where every step it refers to is committed with the same
 * files (else CKPT_E_NOTFOUND, naming the step to copy first). `fn` may
 * be NULL.
 */
CKPT_API int ckpt_reader_copy(ckpt_reader *r, const char *dst_root,
			      ckpt_progress_fn fn, void *arg);

/* ------------------------------------------------------------------ */
/* Maintenance awareness: when to save                                */
/* ------------------------------------------------------------------ */

/*
 * A handle knows when the training loop should save: a periodic policy
 * (every N steps and/or every T seconds, default every 3600 s) and, once
 * the watcher runs, the notices of the GCE metadata server
 * (instance/maintenance-event and instance/preempted under long-polls,
 * instance/upcoming-maintenance polled about once a minute), SIGTERM when
 * the application opted in (ckpt_watch_sigterm) and ckpt_request_save().
 *
 * The watcher is one thread the handle owns (libcurl, one connection per
 * key); it finds the server as Google's clients do (GCE_METADATA_HOST =
 * host[:port], default metadata.google.internal), sends and requires
 * Metadata-Flavor: Google, backs off with jitter on any failure and keeps
 * watching; a key answering 404 is not offered on this VM and is only
 * re-checked rarely. It never blocks the training loop: ckpt_should_save()
 * reads atomics only.
 */

/* Exit status a training program uses when it stopped on purpose after a
 * durable checkpoint forced by a notice (EX_TEMPFAIL): "restart me".
 * `ckptctl run` restarts it without counting a failure. */
#define CKPT_EXIT_RESTART 75

/* ckpt_watch_opts.after_save: what happens once the save a notice asked
 * for (maintenance, preemption, SIGTERM, request, upcoming window) is
 * durable. */
enum ckpt_after_save {
	CKPT_AFTER_STOP = 0,    /* default: ckpt_should_stop() says stop; the
	                           loop exits with CKPT_EXIT_RESTART, so
	                           nothing is computed after the saved step */
	CKPT_AFTER_CONTINUE = 1 /* keep training; ckpt_should_save() asks
	                           for one more save just before the deadline,
	                           leaving the time a save takes here */
};

/* ckpt_watch_opts.flags */
#define CKPT_WATCH_NO_METADATA (1u << 0) /* policy, SIGTERM and requests
                                            only: no watcher thread */
#define CKPT_WATCH_NO_PROBE (1u << 1)    /* do not probe the disk and the
                                            codecs at start (see
                                            ckpt_plan); saves still
                                            measure them */
#define CKPT_WATCH_NO_POD (1u << 2)      /* no pod-wide agreement: each
                                            host saves on its own notices */

/* Called on the watcher thread (or, for SIGTERM, on the watcher thread
 * once it has seen the signal; never in the signal handler) once per new
 * notice. It must return quickly and must not call ckpt_close() on the
 * handle; ckpt_should_save(), ckpt_watch_state() and ckpt_save*() from it
 * are allowed. It runs after the notice is published (ckpt_should_save()
 * reports it, ckpt_watch_fd() is readable), so that a slow callback never
 * delays the loop: the loop may see a notice before its callback runs. */
struct ckpt_save_advice;
typedef void (*ckpt_notice_fn)(void *arg,
			       const struct ckpt_save_advice *advice);

typedef struct ckpt_watch_opts {
	uint32_t flags;           /* CKPT_WATCH_* */
	/* Periodic policy: a save is due every every_steps steps (0 = off;
	 * counted from the last save started, or from the first step
	 * rounded down to a multiple) and every every_seconds seconds
	 * (0 = off) since the last save started (or the policy was set).
	 * Defaults 0 and 3600. time_scale (default 1) makes the policy's
	 * clock run that many times faster (tests). */
	uint32_t every_steps;
	uint32_t every_seconds;
	uint32_t time_scale;
	/* Long-polls: timeout_sec (default 60) is sent to the server; the
	 * HTTP timeout is timeout_sec * 1000 + http_slack_ms (default
	 * 10000). upcoming-maintenance is fetched every
	 * upcoming_interval_ms (default 60000); a key that answered 404 is
	 * asked again after absent_recheck_ms (default 600000). Failures
	 * back off from backoff_min_ms (100) doubling to backoff_max_ms
	 * (30000), each delay drawn in [d/2, d]. */
	uint32_t timeout_sec;
	uint32_t http_slack_ms;
	uint32_t upcoming_interval_ms;
	uint32_t absent_recheck_ms;
	uint32_t backoff_min_ms;
	uint32_t backoff_max_ms;
	/* Deadline of each notice, from the moment it was seen: defaults
	 * 60000 (maintenance-event), 30000 (preempted), 300000 (SIGTERM:
	 * Cloud TPU stops the VM at most 5 minutes after it). */
	uint32_t maintenance_window_ms;
	uint32_t preempted_window_ms;
	uint32_t sigterm_window_ms;
	ckpt_notice_fn on_notice; /* NULL: none */
	void *arg;
	/* What the loop is told once the save a notice asked for is durable
	 * (enum ckpt_after_save). Default CKPT_AFTER_STOP. */
	int32_t after_save;
	/* An upcoming-maintenance window (its start days ahead, maybe) is
	 * due only upcoming_lead_s seconds before it starts (default 600;
	 * 0: at once): training goes on until then, and the save that
	 * follows (and, under CKPT_AFTER_STOP, the stop) lands just before
	 * the window. A window closer than that is due at once. */
	uint32_t upcoming_lead_s;
	/* Pod agreement (host_count > 1 and a gs:// location or remote,
	 * unless CKPT_WATCH_NO_POD; SPEC.md "Pod save requests"): every
	 * pod_interval_ms (default 1000; 0 = default) each host reads the
	 * next save-request object; a request's target step leaves
	 * 2 * pod_interval_ms + pod_slack_ms (default 2000) of this host's
	 * measured step time for every host to see it. */
	uint32_t pod_interval_ms;
	uint32_t pod_slack_ms;
	uint64_t reserved[6];     /* must be zero */
} ckpt_watch_opts;

/* Fills *o with the defaults above. */
CKPT_API void ckpt_watch_opts_default(ckpt_watch_opts *o);

/*
 * Sets the policy and, unless CKPT_WATCH_NO_METADATA, starts the watcher
 * thread (CKPT_F_WATCH in the settings does this with defaults inside
 * ckpt_open). `o` NULL means defaults. Call it once, before the training
 * loop starts asking: a second call is CKPT_E_BUSY. Without it a handle
 * still answers ckpt_should_save() with the default periodic policy.
 * The watcher stops in ckpt_close(), even with requests in flight.
 */
CKPT_API int ckpt_watch_start(ckpt *c, const ckpt_watch_opts *o);

/* What ckpt_should_save() advises. */
typedef struct ckpt_save_advice {
	int32_t reason;      /* enum ckpt_save_reason; UNSPECIFIED if not */
	uint32_t flags;      /* CKPT_ADVICE_* */
	int64_t deadline_ns; /* unix ns by which the save should be durable,
	                        0 = none (periodic). Notice seen + the
	                        window (maintenance, preempted, SIGTERM);
	                        the window's start for an upcoming one */
	int64_t notice_ns;   /* unix ns the notice was seen (0: periodic) */
	uint64_t event;      /* number of the notice (1, 2, ...), 0 periodic */
	uint64_t reserved[4];
} ckpt_save_advice;

/* ckpt_save_advice.flags: the save is the pod's agreed step (a save
 * request, SPEC.md "Pod save requests"); reason and deadline are the
 * notice's that raised the request, on whichever host saw it. */
#define CKPT_ADVICE_POD (1u << 0)

/*
 * One cheap call per training step (atomics and the vDSO clock only: no
 * lock, no system call). Returns 1 when a save is due, with the reason
 * and deadline in *advice (may be NULL), else 0 (advice->reason
 * UNSPECIFIED). Of several pending notices the one with the earliest
 * deadline is given; a notice beats the periodic policy. A notice keeps
 * being reported until a save with its reason (ckpt_save_ex, opts.reason)
 * starts; any save that starts resets the periodic timer and step count.
 *
 * On a pod (see ckpt_watch_opts.pod_interval_ms) a notice is not answered
 * at once: the host that sees it publishes a save request, and every
 * host answers 1 (CKPT_ADVICE_POD) at exactly the request's target step,
 * never before. Ask at every step then: a host that finds the target
 * already passed publishes a later one, and all hosts save that step.
 */
CKPT_API int ckpt_should_save(const ckpt *c, uint64_t step,
			      ckpt_save_advice *advice);

/*
 * An eventfd (owned by the handle, EFD_NONBLOCK) that becomes readable
 * when a notice arrives, for loops that wait in poll/epoll. Read 8 bytes
 * to reset it; ckpt_should_save() says what the notice is. -1 if none.
 */
CKPT_API int ckpt_watch_fd(const ckpt *c);

/* Raises a CKPT_REASON_REQUESTED notice with this deadline (unix ns, 0 =
 * none). Safe from any thread; async-signal-safe. */
CKPT_API int ckpt_request_save(ckpt *c, int64_t deadline_ns);

/*
 * Opt-in: installs a SIGTERM handler (once per process; later calls add
 * this handle) that only records the signal, with atomics and a write to
 * eventfds (async-signal-safe), then calls the handler that was installed
 * before it, if any (a previous SIG_DFL or SIG_IGN is not called: the
 * process keeps running so it can save). Every opted-in handle then
 * reports CKPT_REASON_SIGTERM with deadline signal + sigterm_window_ms.
 * The library never installs a handler unless asked.
 */
CKPT_API int ckpt_watch_sigterm(ckpt *c);

/* State of one watched key (ckpt_watch_info.keys). */
enum ckpt_watch_key_state {
	CKPT_WKEY_UNKNOWN = 0, /* not asked yet, or the last reply was not a
	                          clean 200 (the value is kept, not cleared) */
	CKPT_WKEY_OK = 1,      /* the last reply was a valid value */
	CKPT_WKEY_ABSENT = 2,  /* 404: this VM does not get this notice */
	CKPT_WKEY_ERROR = 3    /* failing: backing off and retrying */
};

#define CKPT_WATCH_MAX_KEYS 4

typedef struct ckpt_watch_key {
	char key[48];        /* "instance/maintenance-event", ... */
	char value[256];     /* last good value ("" before any); truncated */
	char etag[40];       /* its ETag */
	char error[160];     /* last error ("" if none yet) */
	int32_t state;       /* enum ckpt_watch_key_state */
	uint32_t flags;      /* none defined yet */
	int64_t changed_ns;  /* unix ns the value last changed (0: never) */
	int64_t ok_ns;       /* unix ns of the last good reply */
	uint64_t requests;   /* requests sent */
	uint64_t errors;     /* requests that failed (not 404) */
	uint64_t changes;    /* value changes seen */
	uint64_t reserved[4];
} ckpt_watch_key;

typedef struct ckpt_watch_info {
	int32_t running;     /* 1 while the watcher thread runs */
	int32_t healthy;     /* 1 healthy, 0 degraded (a key is failing) */
	uint32_t nkeys;
	uint32_t sigterm;    /* 1 if this handle opted in to SIGTERM */
	uint64_t notices;    /* notices raised so far */
	uint64_t degraded;   /* times the watcher went healthy -> degraded */
	char host[128];      /* the server asked (host[:port]) */
	/* Pod agreement: pod_state 0 off, 1 starting (reading the bucket),
	 * 2 ready, 3 failing (retrying with backoff); the
	 * current request's number and target step (0: none); requests
	 * this host created, and lost to another host's (create-only). */
	uint32_t pod_state;
	uint32_t pod_requests_lost;
	uint64_t pod_request;
	uint64_t pod_target;
	uint64_t pod_requests_made;
	uint64_t reserved[2];
	ckpt_watch_key keys[CKPT_WATCH_MAX_KEYS];
} ckpt_watch_info;

/* A snapshot of the watcher's state (taken under its lock: not for the
 * training loop's hot path). */
CKPT_API int ckpt_watch_state(const ckpt *c, ckpt_watch_info *out);

/*
 * 1 once the save a notice asked for is durable (this host's part; the
 * step committed when the handle commits) and the policy is
 * CKPT_AFTER_STOP: the loop should exit(CKPT_EXIT_RESTART). Nothing
 * computed after the saved step is lost, because nothing after it is
 * kept. 0 otherwise (also for a NULL handle). Atomics only: cheap enough
 * for every step.
 */
CKPT_API int ckpt_should_stop(const ckpt *c);

/*
 * The save a notice asks for is planned against its deadline when the
 * loop starts it (ckpt_save_ex with opts.reason from the advice, codec
 * left CKPT_SAVE_DEFAULT): from what this host measured (each codec's
 * encode speed and ratio, the local disk's and Cloud Storage's write
 * throughput, from the saves it made and a small probe at
 * ckpt_watch_start: 32 MiB written to the disk, and for a directory with a
 * remote CKPT_PROBE_REMOTE_MIB (default 64, 0 = none) uploaded in a
 * background thread and removed), the engine keeps the handle's codec when the save
 * fits the deadline with a margin, else takes the fastest codec; a
 * directory with a remote sends the save straight to the remote when
 * that is predicted faster (enum ckpt_plan_dest). A
 * periodic save still in flight is finished when both it and the
 * notice's save fit, else cancelled (its partial step removed; it is never
 * visible); ckpt_save_ex waits for either. The plan and its outcome are in
 * the journal and here.
 */
enum ckpt_plan_dest {
	CKPT_PLAN_LOCAL = 0,  /* the directory (the upload to a remote goes
	                         on after it, resumed by the next open) */
	CKPT_PLAN_REMOTE = 1  /* Cloud Storage: a gs:// location, or a
	                         directory's remote when the save is
	                         predicted faster there than on the disk
	                         (one host, the remote's throughput
	                         measured): committed in the bucket only,
	                         nothing in the directory (`ckptctl run
	                         --remote` resumes from the newer of both) */
};
enum ckpt_plan_inflight {
	CKPT_INFLIGHT_NONE = 0,   /* no periodic save was in flight */
	CKPT_INFLIGHT_FINISH = 1, /* it was left to finish first */
	CKPT_INFLIGHT_CANCEL = 2  /* it was cancelled */
};

typedef struct ckpt_plan {
	uint64_t event;       /* notice planned for; 0: no plan yet */
	int32_t reason;       /* enum ckpt_save_reason */
	int32_t codec;        /* codec of the notice's save */
	int32_t dest;         /* enum ckpt_plan_dest */
	int32_t inflight;     /* enum ckpt_plan_inflight */
	int64_t deadline_ns;  /* unix ns, 0 = none */
	int64_t planned_ns;   /* unix ns the plan was made */
	uint64_t state_bytes; /* bytes of the save planned */
	double predicted_s;   /* predicted time from planning to durable */
	double left_s;        /* time to the deadline when planned */
	/* the outcome */
	uint64_t step;
	int32_t status;       /* 1 running, 0 durable, or the error */
	int32_t deadline_met; /* 1 yes, 0 no, -1 not known yet / no deadline */
	int64_t durable_ns;   /* unix ns it became durable (0: not yet) */
	double margin_s;      /* deadline - durable (negative: missed) */
	/* the measurements used, bytes per second (0: none yet); encode
	 * and ratio by codec (enum ckpt_codec), ratio = stored / raw */
	double local_bps;
	double remote_bps;
	double encode_bps[CKPT_STATS_MAX_CODECS];
	double ratio[CKPT_STATS_MAX_CODECS];
	uint64_t reserved[8];
} ckpt_plan;

/* The last plan, with the measurements it used; before any plan (event
 * 0) the current measurements. */
CKPT_API int ckpt_plan_get(const ckpt *c, ckpt_plan *out);

/* ------------------------------------------------------------------ */
/* Event journal                                                      */
/* ------------------------------------------------------------------ */

/*
 * Every notice the watcher sees, every save a notice asked for (with its
 * plan, time to durable, whether the deadline was met and the margin) and
 * every restart of `ckptctl run` is one line of a JSON-lines journal
 * beside the checkpoints (SPEC.md, "Event journal"):
 * LOCATION/events/hHHHHH.jsonl for a directory, one file per host,
 * appended with O_APPEND, one write(2) per line, then fsync. When the
 * directory has a remote (ckpt_settings.remote) the file is uploaded to
 * REMOTE/events/hHHHHH.jsonl (replacing it, at most once a second per
 * process; a handle uploads what is left when it closes). For a gs://
 * location alone the object is read, extended and written back under the
 * generation read (retried when another writer got there first), so
 * several writers of one host's journal keep every line.
 *
 * `json` is one JSON object (no newline); "time" (RFC 3339 UTC with
 * milliseconds) and "host" are added first when absent. -EINVAL if it is
 * not a JSON object or is longer than 64 KiB.
 */
CKPT_API int ckpt_event_append(const char *location, uint32_t host,
			       const char *json);

/* Called once per journal line (without its newline, NUL-terminated,
 * valid during the call); non-zero stops the walk and is returned. */
typedef int (*ckpt_event_fn)(void *arg, uint32_t host, const char *line);

/*
 * Calls fn for every line of every host's journal at LOCATION (a directory
 * or gs://), hosts in ascending order, oldest line first per host. A torn
 * last line (no newline: a crash during the append) is skipped. No
 * journal at all is 0 with no call.
 */
CKPT_API int ckpt_events_read(const char *location, ckpt_event_fn fn,
			      void *arg);

#ifdef __cplusplus
}
#endif
#endif /* CKPT_H */
