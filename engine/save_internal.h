/*
 * save_internal.h - what the save side of the engine shares. Not API.
 *
 * Files, each using only those below it (arrows point one way):
 *
 *   handle.c      ckpt_open/close, settings: builds all of the below
 *     save.c      ckpt_save validation + copy, ckpt_wait/poll
 *     encode.c    worker threads: hash, codec, chunk framing
 *     writer.c    writer thread: dispatch to sinks, index, commit (commit.c)
 *     sink_local.c the local shard-file sink (io_uring / pwrite)
 *     sink_gcs.c   the upload sink (Cloud Storage; sink_gcs_up.c, its
 *                  thread; sink_gcs_bg.c, steps after the save; journal.c)
 *   pool.c        buffers, refcounts, free lists, job status (bottom layer)
 *
 * save.c, encode.c, writer.c and the sinks never call each other: they meet
 * in the pool and the queues below (work queue, writer queue, eventfd).
 *
 * Data path of one save:
 *
 *   caller's tensors --copy (caller's thread)--> staging slot
 *     --> worker: XXH3 of the raw bytes, codec, chunk header, zero pad
 *   (borrow mode, CKPT_SAVE_BORROW: no copy in the caller's thread; a
 *    worker reads each chunk from the caller's memory: encoded into an
 *    output buffer, or with codec none copied + hashed into a slot in one
 *    pass, or, spanning tensors, gathered into a slot; then as above.
 *    The sinks only ever see pool buffers; see encode.c)
 *     --> writer thread: assigns file + 4096-aligned offset (file order),
 *         updates that file's streaming XXH3, hands the buffer to every sink
 *     --> sinks: sink 0, the local shard files through io_uring (decides
 *         the save); further sinks (an uploader) get the very same
 *         buffers in file order, each with its own status, and are
 *         detached if they hold more than sink_lag_max buffers
 *     --> last sink reference dropped: buffer back to its free list, which
 *         wakes a copier blocked on a full pool.
 *
 * Every buffer (staging slot or compressed-output buffer) carries one chunk
 * at a time and its descriptor (eng_buf) holds that chunk's metadata, so the
 * hot path allocates nothing. A chunk is reference counted: the writer holds
 * one reference while it dispatches and hashes, each sink holds one until it
 * is done with the bytes.
 *
 * Locking: one mutex per handle (c->mu) guards queues, free lists, progress
 * and job status. The writer sleeps on an eventfd during a save because it
 * must wake both for new chunks (workers) and for io_uring completions (the
 * ring signals the same eventfd).
 */
#ifndef CKPT_ENGINE_SAVE_INTERNAL_H
#define CKPT_ENGINE_SAVE_INTERNAL_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>

#include "internal.h"

struct eng_job;
struct eng_sink;

#define ENG_MAX_SINKS 4

/* One staging slot or output buffer, and the chunk it currently carries. */
typedef struct eng_buf {
	uint8_t *p; /* 4096-aligned */
	size_t cap;
	int fixed;            /* registered buffer index, or -1 */
	int is_out;           /* output buffer (else staging slot) */
	int is_hdr;           /* a shard header (owned by a sink) */
	struct eng_buf *next; /* free list / queue link (under c->mu) */

	/* the chunk carried */
	struct eng_job *job;
	uint64_t k; /* chunk index in the host stream */
	uint32_t raw_len;
	uint32_t stored_len;
	uint8_t codec;
	uint8_t elem_width;
	uint64_t raw_xxh3;
	uint64_t h128[2]; /* dedup: seeded XXH3-128 of the raw bytes */
	int reuse;        /* dedup: same bytes as the base's chunk k: not
			     encoded, written nor uploaded (dedup.c) */
	uint64_t payload; /* tensor bytes in this chunk (progress) */
	uint64_t span;    /* bytes written: align(64 + stored, 4096) */
	uint32_t file;    /* assigned by the writer */
	uint64_t file_offset;
	atomic_int refs;

	/* local file sink state */
	uint64_t io_done;        /* bytes of span written so far */
	struct eng_buf *io_next; /* sink's pending queue */
	int io_inflight;         /* taken by the kernel, not reaped */
} eng_buf;

/* One save: metadata copied from the caller, layout, writer state. */
typedef struct eng_job {
	uint64_t step;
	uint8_t save_id[16];
	int32_t codec, level; /* this save's (ckpt_save_opts or settings) */
	int32_t reason;       /* enum ckpt_save_reason */
	int64_t deadline_ns;  /* 0 = none */
	char *stepdir;        /* ROOT/step-N (REMOTE/step-N when to_remote) */
	/* plan.c: a notice's save sent straight to the handle's remote (the
	 * direct sink c->rsink decides it; no local files) because the
	 * network beats the disk here */
	int to_remote;
	struct eng_sink *sinks[ENG_MAX_SINKS]; /* writer: this save's sinks;
						 [0] decides */
	unsigned nsinks;
	uint32_t chunk_bytes;
	size_t ntensors;
	fmt_tensor_entry *tensors; /* names point into `names` */
	char *names;
	const void **data; /* caller's pointers, valid during the copy (or,
			      borrowed, until released: see encode.c) */
	uint64_t stream_bytes;
	uint64_t nchunks;
	uint64_t payload_total;  /* sum of tensor nbytes */
	fmt_chunk_entry *chunks; /* [nchunks], filled by the writer */
	uint32_t nfiles;
	fmt_file_entry *files; /* final names; size/xxh3 set at finish */
	uint8_t *hdrs;         /* nfiles shard headers of 4096 bytes */
	uint64_t *file_end;    /* writer: next free offset per file */
	uint64_t *file_cap;    /* writer: planned (upper bound) size */
	void **fhash;          /* writer: XXH3_state_t per file */
	uint64_t received;     /* writer: chunks dispatched */
	/* dedup.c: format version of this save's files (0: 1), the base
	 * index reused chunks come from, and (writer) the refs made */
	uint32_t version;
	fmt_index *base;
	fmt_ref_entry *refs;
	size_t nrefs;
	uint32_t *ref_of; /* base file number -> refs index or UINT32_MAX */

	/* under c->mu */
	int finishing; /* the writer publishes it: too late to cancel */
	int copy_done; /* nobody reads the caller's memory any more: the copy
			  is over, or (borrow) the writer released it */
	int borrow;        /* CKPT_SAVE_BORROW: workers read the caller's
			      memory; no copy in ckpt_save() */
	uint64_t bnext;    /* borrow: next chunk a worker takes */
	unsigned breading; /* borrow: workers reading the caller's memory */
	int reported;  /* ckpt_save() returned the failure */
	int status;
	char msg[ENG_ERRMSG_MAX];
} eng_job;

/*
 * A destination of encoded chunks. Called only from the writer thread.
 *  begin:   before the first chunk (files created, headers written).
 *  put:     a chunk with file/offset assigned, in file order per file. The
 *           sink owns one reference and drops it with eng_buf_unref().
 *  pump:    non-blocking: submit queued work, reap finished work; sets
 *           *busy when work is outstanding (the sink then guarantees a
 *           wake-up of the writer's eventfd when it progresses). With
 *           `failed` set it submits nothing new and drops queued chunks.
 *  finish:  every chunk put and pump idle: make the output durable.
 *  publish: the host index document (after finish).
 *  abort:   after a failure, once idle: remove partial output.
 * Failures: return a code and describe it with eng_sink_fail() (the local
 * sink, which decides the save, may call eng_job_fail() directly).
 *
 * Several sinks. Sink 0 is the local shard files and is required: its
 * failure fails the save. Any further sink (an uploader; tests register
 * one with eng_sink_add) is secondary: its failure is recorded on the sink
 * (status, message: ckpt_sink_status_get) and the save goes on without it.
 * The writer also bounds how far a secondary sink may fall behind: one
 * that holds c->sink_lag_max buffers (a quarter of the slots) when the
 * next chunk comes is detached for this save with -ENOBUFS: it gets no
 * more chunks and, pumped with `failed` set, drops its queue. Detaching
 * rather than spilling: a backlog would need memory or a second local
 * copy proportional to the lag, while the local sink already makes every
 * byte durable, so a lagging uploader can catch up from the files. Thus a
 * slow sink holds at most sink_lag_max buffers and ckpt_save() never waits
 * on it for the rest of the pool.
 */
typedef struct eng_sink_ops {
	const char *name;
	int (*begin)(struct eng_sink *s, eng_job *job);
	void (*put)(struct eng_sink *s, eng_buf *b);
	int (*pump)(struct eng_sink *s, int failed, int *busy);
	int (*finish)(struct eng_sink *s, eng_job *job);
	int (*publish)(struct eng_sink *s, eng_job *job, const char *name,
		       const uint8_t *buf, size_t len);
	void (*abort)(struct eng_sink *s, eng_job *job);
	void (*destroy)(struct eng_sink *s);
} eng_sink_ops;

typedef struct eng_sink {
	const eng_sink_ops *ops;
	struct ckpt *c;
	unsigned index; /* 0: the local sink (required) */
	/* per save; `active` and the counters belong to the writer thread,
	 * status and msg are written under c->mu */
	int active;        /* begun, not failed, not detached */
	atomic_int failed; /* eng_sink_fail() was called */
	atomic_uint held;  /* buffers put and not yet released */
	atomic_uint max_held;  /* atomics: ckpt_sink_status_get reads */
	atomic_ullong chunks;  /* them while the writer runs */
	int status; /* 1 running, 0 done, or the error */
	char msg[256];
} eng_sink;

struct ckpt {
	pid_t pid; /* of the process that opened it (see ckpt_close) */
	char *root;
	ckpt_settings s;
	unsigned nworkers;
	int direct; /* O_DIRECT usable under root */
	int remote_only; /* root is gs://: no local files (sink_gcs.c) */
	char errmsg[ENG_ERRMSG_MAX];
	int dedup; /* CKPT_F_DEDUP or CKPT_DEDUP=1 (dedup.c) */

	pthread_mutex_t mu;
	pthread_cond_t slot_cv;   /* copier: a slot was freed / job failed */
	pthread_cond_t work_cv;   /* workers: task queued / shutdown */
	pthread_cond_t out_cv;    /* workers: output buffer freed */
	pthread_cond_t writer_cv; /* writer: job queued / shutdown */
	pthread_cond_t done_cv;   /* ckpt_wait: save finished */
	int efd;                  /* eventfd waking the writer during a job */

	/* buffers: one mmap; bufs[0..nslots) slots, then nout outputs */
	uint8_t *mem;
	size_t mem_bytes;
	int mem_dontfork; /* MADV_DONTFORK took: no copy in a fork() child */
	eng_buf *bufs;
	uint32_t nslots, nout;
	eng_buf *free_slots, *free_outs;
	uint32_t nfree_slots, nfree_outs;

	/* ckpt_save() is copying and compression waits (see worker_main) */
	int copying;
	/* workers that may encode while it copies: the cores the copy
	 * leaves (eng_ncpus() - 1, at most nworkers); workers encoding a
	 * slot now (under mu) */
	unsigned copy_encoders, encoding;
	/* a borrowed save whose chunks the workers read from the caller's
	 * memory (encode.c); cleared when the writer releases it */
	struct eng_job *bjob;
	uint32_t low_slots;

	/* queues (under mu) */
	eng_buf *work_head, *work_tail; /* filled slots for the workers */
	eng_buf *wq_head, *wq_tail;     /* encoded chunks for the writer */

	struct io_uring ring;
	int have_ring;
	int fixed_bufs;
	int ring_broken; /* writer only: a hard submit error, pwrite now */
	struct {         /* which paths this handle's saves took (tests) */
		atomic_ullong uring_writes, pwrite_writes, direct_files,
			submit_retries, uring_fallbacks, uring_stalls;
	} io_st;

	pthread_t *workers;
	unsigned nstarted;
	pthread_t writer;
	int writer_started;
	int shutdown;

	eng_sink *sinks[ENG_MAX_SINKS];
	unsigned nsinks;
	unsigned sink_lag_max; /* buffers a secondary sink may hold */
	/* a directory with a remote: the direct sink on remote_url of the
	 * saves the planner sends there (job->to_remote), made at the first
	 * one (plan.c) */
	eng_sink *rsink;

	/* save state (under mu) */
	eng_job *job;    /* current or last save */
	int job_pending; /* queued, writer has not taken it yet */
	int busy;        /* a save is in flight */
	int state;       /* enum ckpt_save_state */
	int status;      /* of the last finished save */
	int32_t reason;  /* of the current or last save */
	int uncollected; /* failed and nobody was told */
	char status_msg[ENG_ERRMSG_MAX];
	uint64_t step;
	uint64_t bytes_total, bytes_staged, bytes_written, bytes_committed,
		bytes_stored;

	struct eng_watch *watch; /* when to save (watch.c) */
	struct eng_plan *plan;   /* measurements, notice plans (plan.c) */
	struct eng_jq *jq;       /* the event journal's thread (events.c) */
	char *remote_url;        /* settings.remote: the event journal's
	                            upload (events.c) */
	atomic_int remote_noted; /* DIR/events/remote written */
	eng_sink *upsink; /* settings.remote: the upload sink (sinks[1]) */
	/* 1 + the newest step the upload sink committed in the remote, 0:
	 * none yet; a deduplicating save refers to a base only if it is
	 * this step (dedup.c) */
	atomic_ullong remote_committed;
	/* a gs:// root: this handle's index of the step it committed last,
	 * the base of its next deduplicating save (dedup.c; under mu) */
	fmt_index *last_ix;
};

/* watch.c: the handle's save policy and metadata watcher. open allocates
 * it (and starts the watcher with CKPT_F_WATCH); close stops the thread;
 * save.c reports each save that starts (under mu). */
int eng_watch_open(struct ckpt *c);
void eng_watch_close(struct ckpt *c);
void eng_watch_save_started(struct ckpt *c, uint64_t step, int32_t reason);
/* 1 for the reasons a notice gives (maintenance, preempted, SIGTERM,
 * requested, upcoming). */
int eng_watch_is_notice(int32_t reason);
/* The pending notice (or CONTINUE save) of that reason: its deadline
 * (*deadline kept when nonzero), when it was seen and its number. */
void eng_watch_notice_of(struct ckpt *c, int32_t reason, int64_t *deadline,
			 int64_t *notice_ns, uint64_t *event);
/* writer.c, when a save has finished (status 0: durable, committed unless
 * manual commit): save_done under mu, then save_log without it (the
 * journal lines; ckpt_should_stop() turns true there), both before the
 * handle stops being busy, so before ckpt_wait() returns. */
void eng_watch_save_done(struct ckpt *c, eng_job *job);
void eng_watch_save_log(struct ckpt *c);

/* io_uring registers at most 1 GiB per iovec: buffers are registered in
 * pieces of this size (eng_buf.fixed is the piece index). */
#define ENG_REG_PIECE (1ull << 30)

/* pool.c */
/* mmap, pre-fault and thread the pool's buffers onto their free lists. */
int eng_pool_alloc(struct ckpt *c);
/* Next free slot / output buffer; NULL once the job failed (or, for
 * outputs, at shutdown). Block while none is free. */
eng_buf *eng_pool_get_slot(struct ckpt *c, eng_job *job);
eng_buf *eng_pool_get_out(struct ckpt *c, eng_job *job);
/* Copies stream bytes [lo, hi) of the caller's tensors into slot b
 * (zeros between tensors) and sets its raw_len, payload, elem_width; *ti
 * is a tensor cursor (the first tensor ending after lo, or before it). */
void eng_slot_fill(eng_job *job, eng_buf *b, uint64_t lo, uint64_t hi,
		   size_t *ti);
/* The first tensor whose bytes end after stream offset pos (ntensors if
 * none). */
size_t eng_stream_find(const eng_job *job, uint64_t pos);
/* Copies n bytes to dst (4096-aligned) and returns their XXH3, reading src
 * once. */
uint64_t eng_copy_hash(uint8_t *dst, const uint8_t *src, size_t n);
/* Borrow mode: a worker no longer reads the caller's memory for the chunk
 * it took (payload bytes of it were read, for progress). Wakes the writer
 * when nobody will read it again (the writer then releases it). */
void eng_borrow_done(struct ckpt *c, eng_job *job, uint64_t payload);
/* Back to its free list now (no reference counting). */
void eng_buf_release(struct ckpt *c, eng_buf *b);
/* Drops a reference; the last one releases the buffer. */
void eng_buf_unref(struct ckpt *c, eng_buf *b);
void eng_thread_background(int nice);
void eng_writer_wake(struct ckpt *c);
/* sink_local.c: how long a write may stay in the ring with none coming
 * back (eng_writer_stall_ms_set); the writer wakes at least every third
 * of it to let the sink notice. */
unsigned eng_writer_stall_ms(void);
/* Records the first failure of `job` (message under c->mu) and wakes
 * everybody who waits on it; returns code. */
int eng_job_fail(struct ckpt *c, eng_job *job, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
int eng_job_status(struct ckpt *c, eng_job *job);
void eng_job_free(eng_job *job);
/* A sink is done with b: drops its reference (and wakes the writer for a
 * secondary sink, whose progress the ring does not signal). */
void eng_sink_release(eng_sink *s, eng_buf *b);
/* Records a sink's first failure: for sink 0 that fails the job
 * (eng_job_fail); a secondary sink is only marked failed. Returns code. */
int eng_sink_fail(eng_sink *s, eng_job *job, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/* save.c */
/* Open-addressing set of byte strings (tensor names). */
typedef struct eng_nameset {
	size_t cap, n;
	const char **key;
	size_t *len;
	size_t *val;
} eng_nameset;
int eng_nameset_init(eng_nameset *s, size_t expect);
/* Inserts; returns 1 if inserted, 0 if already present (*val = existing
 * value), -ENOMEM. */
int eng_nameset_add(eng_nameset *s, const char *k, size_t len, size_t v,
		    size_t *val);
void eng_nameset_free(eng_nameset *s);

/* handle.c */
/* Adds a secondary sink to an idle handle (tests; later an uploader).
 * The handle calls s->ops->destroy at close. -EBUSY / -ENOSPC. */
int eng_sink_add(struct ckpt *c, eng_sink *s);

/* encode.c */
void *eng_worker_main(void *arg);

/* writer.c */
void *eng_writer_main(void *arg);

/* sink_local.c */
int eng_local_sink_new(struct ckpt *c, eng_sink **out);

/* sink_gcs.c */
/* The upload sink for a gs://BUCKET/PREFIX location, with its upload
 * thread. direct: the location itself (sink 0, no local copy); else the
 * remote of a directory, whose journaled uploads it resumes. */
int eng_gcs_sink_new(struct ckpt *c, const char *remote, int direct,
		     eng_sink **out);
/* Staged buffers the directory's upload sink still holds after its save
 * go back to the pool (the uploads go on from the local files): before a
 * save that does not pass through that sink (job->to_remote). */
void eng_gcs_reclaim(struct ckpt *c);

/* dedup.c */
/* 1 if this handle's saves may refer to older steps: a directory, with
 * or without its remote's upload sink, or a gs:// root (see dedup.c for
 * which base each may use). */
int eng_dedup_enabled(const struct ckpt *c);
/* writer.c, a gs:// root: step's index (its encoded bytes) is committed;
 * kept as the base of the next deduplicating save. Frees nothing of the
 * caller's. */
void eng_dedup_committed(struct ckpt *c, const uint8_t *ix, size_t len);
/* handle.c: drops the kept index. */
void eng_dedup_forget(struct ckpt *c);
/* Caller's thread, before the job is queued: the format version and the
 * base index (none: no chunk is reused). */
void eng_dedup_begin(struct ckpt *c, eng_job *job);
/* Frees the base and the refs (eng_job_free). */
void eng_dedup_end(eng_job *job);
/* Worker: b's XXH3-64 of raw, and in version 2 its XXH3-128 (in the same
 * pass) and whether chunk b->k equals the base's (sets b->reuse). */
int eng_dedup_match(const eng_job *job, eng_buf *b, const uint8_t *raw);
/* Writer: the index entry of reused chunk k (a ref to the base's bytes). */
int eng_dedup_ref(eng_job *job, uint64_t k, fmt_chunk_entry *ce);

/* commit.c */
/* The commit of ckpt_commit(): errbuf gets the message. */
int eng_commit_step(const char *root, uint32_t host_count, uint64_t step,
		    char *errbuf);
/* The same on an open location (messages name l->where): a caller that
 * must be able to cancel it holds the location's client. */
int eng_commit_step_loc(eng_loc *l, uint32_t host_count, uint64_t step,
			char *errbuf);
/* Retention + optional debris removal; skip_step is never touched
 * (UINT64_MAX: none). fn (may be NULL) is told of every step directory
 * removed (see ckpt_gc_fn). */
int eng_gc_run(const char *root, uint32_t keep_last, uint32_t keep_every,
	       unsigned flags, int debris, uint64_t skip_step,
	       ckpt_gc_fn fn, void *arg, ckpt_gc_report *report,
	       char *errbuf);

#endif /* CKPT_ENGINE_SAVE_INTERNAL_H */
