/*
 * reader_internal.h - what the reader's files share. Not installed, not API.
 *
 * The reader loads a committed step: open (the COMMIT record and every
 * host's index, merged into one table of global tensors), reads of whole
 * tensors and of boxes assembled from stored slices, verification, copy.
 *
 *   reader_open.c      COMMIT and index loading, merge, accessors, close
 *   reader_plan.c      target geometry, request planning, ckpt_read*
 *   reader_pipeline.c  fd cache, buffer pool, io_uring submit/reap,
 *                      dispatch to the workers
 *   reader_worker.c    the worker threads: chunk checks, decode, scatter
 *   reader_gcs.c       the gs:// range source: ranged GETs on the
 *                      reader's Cloud Storage client, several in flight,
 *                      neighbouring chunks merged into one request
 *   reader_verify.c    ckpt_reader_verify
 *   reader_copy.c      ckpt_reader_copy (DIR or gs:// to DIR or gs://)
 *
 * open and plan use the pipeline; verify uses the pipeline and open's
 * lookups; the pipeline uses only the geometry helpers of plan and the
 * lookups of open.
 *
 * Nothing on disk is trusted before it is checked. COMMIT lists every file
 * with its size and XXH3; an index is compared with that listing before it
 * is parsed, and every number later used to index memory is re-validated
 * here even though the format module validates it too: a wrong bound is a
 * crash, not a wrong answer.
 *
 * Data path. A read is planned as "targets" (one per request x stored slice
 * that intersect), each a run of equally long rows mapping a range of a
 * host's data stream onto the destination, plus the chunks those rows
 * touch (jobs):
 *
 *   requests --plan--> targets --> jobs (chunks, in file order)
 *      calling thread, one of two range sources:
 *        DIR:   fd cache -> io_uring reads (<= queue_depth in flight)
 *        gs://: ranged GETs (<= CKPT_GCS_STREAMS in flight, adjacent
 *               chunks of a file merged up to RD_SPAN_MAX per request)
 *      into a bounded pool of aligned buffers
 *      worker threads: chunk header vs index, decode, XXH3 of the raw
 *      bytes, copy into every destination row the chunk overlaps
 *
 * Memory is bounded by the buffer pool, never by the size of the
 * checkpoint. A chunk whose targets are each one run of its bytes is
 * decoded (codec none: copied) straight into them by
 * fmt_chunk_decode_parts, a block at a time: each block of a destination
 * faulted in (eng_prefault_write, its prepare hook), written and hashed
 * while it is in cache, so a restore into fresh memory reads the chunk
 * once and pays no trap per page.
 *
 * Verification runs the same pipeline over a shard file's chunks in file
 * order ("ordered" batches): the calling thread hashes each buffer into
 * the whole-file XXH3 as the reads complete in sequence, then hands the
 * chunk to the workers, so each file is read once.
 *
 * Prefix `rd_` for everything shared here.
 */
#ifndef CKPT_ENGINE_READER_INTERNAL_H
#define CKPT_ENGINE_READER_INTERNAL_H

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

#include "internal.h"

typedef unsigned long long ull;

struct rd_file { /* a shard file listed in COMMIT */
	char name[32];
	char *path;
	uint64_t size, xxh3;
	uint32_t host;
	uint32_t findex;  /* f of h%05u-f%03u.shard */
	uint32_t ixfile;  /* position in its host's index file list */
	int fd;           /* -1 until first needed */
	int direct;
	int mapped;       /* claimed by the host's index */
	int checked;      /* gs://: object size compared with COMMIT */
	uint32_t inflight;
	int is_ref;        /* version 2: a file of an older step that an
			      index refers to (not listed in COMMIT) */
	uint64_t ref_step; /* its step */
};

struct rd_host {
	const fmt_file_entry *cm_index; /* its index in the COMMIT listing */
	size_t cm_nshards;              /* its shard files listed there */
	fmt_index ix;
	int loaded;
	uint32_t *file_of; /* ix.files[i] -> r->files */
	size_t *by_stream; /* ix.tensors sorted by stream_offset */
	size_t *gidx;      /* ix.tensors[i] -> r->tensors */
};

struct rd_tensor {
	const char *name;
	int32_t dtype;
	uint32_t ndim;
	const uint64_t *shape;
	uint64_t nbytes;
	uint64_t stored_bytes;
	size_t first; /* into r->pieces, npieces slices by host */
	uint32_t npieces;
};

/* Request x stored slice: rows of rowlen bytes. Row i (row-major over the
 * outer dimensions cnt[]) starts at stream offset sbase + sum(idx*sstr)
 * and lands at dst + dbase + sum(idx*dstr). */
struct rd_target {
	uint8_t *dst;
	uint32_t req;
	uint32_t host;
	uint32_t nouter;
	uint64_t rowlen, nrows, sbase, dbase;
	uint64_t cnt[CKPT_MAX_NDIM];
	uint64_t sstr[CKPT_MAX_NDIM];
	uint64_t dstr[CKPT_MAX_NDIM];
};

enum { JOB_CHUNK = 0, JOB_SHARD_HDR = 1 };

struct rd_job {
	uint64_t off, len, done; /* file range and bytes read so far */
	uint32_t file, host, chunk, kind;
	size_t t0, t1; /* targets: b->tmap[t0..t1) */
	uint8_t *buf;
	int ready, failed;
	uint8_t in_ring; /* a read of it is in the ring */
	uint8_t retries; /* zero-progress (EAGAIN) results in a row */
};

struct rd_batch {
	struct rd_job *jobs;
	size_t njobs;
	struct rd_target *tg;
	size_t ntg, tgcap;
	size_t *tmap;
	ckpt_read_req *reqs;
	size_t nreq;
	/* ordered (verify) mode */
	int ordered;
	size_t cursor;
	XXH3_state_t *hs;
	const fmt_shard_hdr *want_hdr;
	uint64_t *pdone, ptotal;
	ckpt_progress_fn fn;
	void *fnarg;
	int canceled;
	/* under r->mu once workers run */
	int stop;
	int fatal;
	size_t err_key; /* request (reads) or job (verify) of err_msg */
	int err_code;
	char err_msg[ENG_ERRMSG_MAX];
	int ring_broken;
	int cache_fill;
};

struct rd_worker {
	struct ckpt_reader *r;
	pthread_t th;
	fmt_codec_ctx *cc;
	uint8_t *raw;
	size_t rawcap;
};

struct ckpt_reader {
	char errmsg[ENG_ERRMSG_MAX];
	pid_t pid; /* of the process that opened it: its workers live there */
	char *root;
	char *stepdir;
	char dname[32];
	uint64_t step;
	unsigned threads, qd, flags;

	fmt_commit cm;
	int cm_loaded;
	uint64_t commit_size, commit_xxh3;

	uint32_t nhosts;
	struct rd_host *hosts;
	size_t nfiles;  /* COMMIT's shard files, then the refs' files */
	size_t nlisted; /* COMMIT's: files[0..nlisted), files_by_name */
	struct rd_file *files;
	size_t *files_by_name;

	size_t ntensors;
	struct rd_tensor *tensors;
	size_t npieces;
	fmt_slice *pieces;
	ckpt_stats stats;

	/* pipeline; the mutex guards the queue, buffer free list, busy and
	 * the current batch's failure fields */
	pthread_mutex_t mu;
	pthread_cond_t cv_work, cv_done;
	int sync_init;
	struct rd_worker *workers;
	unsigned nworkers;
	int stop;
	size_t *queue;
	size_t qcap, qhead, qlen;
	size_t busy;
	struct rd_batch *batch;
	uint8_t **bufs, **freeb;
	size_t nbufs, nfree, maxbufs, bufsize;
	struct io_uring ring;
	int ring_state; /* 0 not tried, 1 ready, -1 unusable, -2 failed
			   with reads in flight (exit at close), -3
			   stalled: abandoned, pread from then on */
	struct {        /* which paths the pipeline took (tests) */
		atomic_ullong uring_reads, pread_reads, direct_files,
			uring_fallbacks, uring_stalls;
	} io_st;

	/* gs:// roots: the location (its client does every ranged read, on
	 * the calling thread) and the merge buffers of reader_gcs.c */
	eng_loc *loc;
	uint8_t **spans;
	size_t nspans, spancap;

	/* last chunk decoded by a one-chunk read: reads of neighbouring small
	 * tensors (which share chunks) are then served without I/O */
	uint8_t *cache;
	size_t cache_cap;
	uint32_t cache_host, cache_chunk;
	int cache_valid;
};

static inline uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

static inline uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* ---- open (reader_open.c) ------------------------------------------ */

/* -ECHILD (with message) when called in a child of the process that
 * opened r, whose worker threads and ring are not there; else 0. */
int rd_check_process(ckpt_reader *r, const char *fn);
/* A gs:// reader's message about "step-N/FILE" names the whole object:
 * gs://BUCKET/PREFIX/step-N/FILE (called on the public calls' failure). */
void rd_locate(ckpt_reader *r);
/* Index of the global tensor `name` in r->tensors; CKPT_E_NOTFOUND. */
int rd_find(const ckpt_reader *r, const char *name, size_t *idx);
/* Index of the shard file `name` in r->files, or SIZE_MAX. */
size_t rd_file_lookup(const ckpt_reader *r, const char *name);
/* Name of the first tensor of host h overlapping stream [cs, ce), or NULL. */
const char *rd_host_tensor_at(const ckpt_reader *r, uint32_t h, uint64_t cs,
			      uint64_t ce);

/* ---- geometry (reader_plan.c) -------------------------------------- */

/* Copies the stream bytes [cs, cs+len) at raw into every row overlapping. */
void rd_tg_scatter(const struct rd_target *t, uint64_t cs, const uint8_t *raw,
		   uint64_t len);
/* The target's bytes in chunk [cs, cs+len) if they are one run: 1 with
 * [*lo, *hi) relative to cs and *dst where it lands; 0 if none, -1 if
 * they lie in several rows. */
int rd_tg_span(const struct rd_target *t, uint64_t cs, uint64_t len,
	       uint64_t *lo, uint64_t *hi, uint8_t **dst);
/* Where chunk [cs, cs+len) lands if it lies inside one row, else NULL. */
uint8_t *rd_tg_inside_row(const struct rd_target *t, uint64_t cs, uint64_t len);

/* ---- pipeline (reader_pipeline.c) ---------------------------------- */

/* The file's fd, opened on first use (O_DIRECT when the file system takes
 * it) and checked against the size COMMIT records; on failure a negative
 * code and a message in msg. */
int rd_file_fd(ckpt_reader *r, size_t i, char *msg, size_t len);
/* Request req fails with code (first code wins); msg kept if it is the
 * lowest failed request's. */
void rd_req_fail(ckpt_reader *r, struct rd_batch *b, size_t req, int code,
		 const char *msg);
/* Fails the whole batch (first caller's message wins) and stops it. */
void rd_fatal(ckpt_reader *r, struct rd_batch *b, int code, const char *msg);
/* Runs batch b's jobs to the end (or its stop); returns b->fatal. Failures
 * of single requests or jobs are in b->reqs[].status / b->err_*. */
int rd_pipeline(ckpt_reader *r, struct rd_batch *b);
/* Frees a batch's jobs, targets and hash state (not the struct). */
void rd_batch_free(struct rd_batch *b);
/* Stops and joins the worker threads and frees their memory; in_child:
 * only frees (the threads are the parent's). Frees the buffer pool. */
void rd_stop_workers(ckpt_reader *r, int in_child);
void rd_free_bufs(ckpt_reader *r);

/* Shared by the two range sources (reader_pipeline.c): a pool buffer
 * (NULL with *err = 0 when all are in use), giving one back, a job whose
 * read failed (rd_io_msg builds its message: file, offset, tensor, what),
 * a job whose bytes are all in j->buf, and whether a job still feeds a
 * live request. */
uint8_t *rd_buf_get(ckpt_reader *r, int *err);
void rd_buf_put(ckpt_reader *r, uint8_t *b);
void rd_job_abort(ckpt_reader *r, struct rd_batch *b, struct rd_job *j,
		  int code, const char *msg);
void rd_io_msg(const ckpt_reader *r, const struct rd_batch *b,
	       const struct rd_job *j, char *msg, size_t len, const char *what);
void rd_complete(ckpt_reader *r, struct rd_batch *b, struct rd_job *j);
int rd_job_dead(ckpt_reader *r, struct rd_batch *b, const struct rd_job *j);
/* Between the pipeline (reader_pipeline.c) and its workers
 * (reader_worker.c): a chunk failed (the requests it feeds fail; an
 * ordered batch stops), and the worker thread's body. */
void rd_job_fail(ckpt_reader *r, struct rd_batch *b, struct rd_job *j,
		 int code, const char *msg);
void *rd_worker_main(void *arg);
/* Waits until a worker gives a buffer back or nothing is busy; returns 1
 * when the batch is over (stopped or every job issued, workers idle). */
int rd_wait_workers(ckpt_reader *r, struct rd_batch *b, size_t next);

/* ---- gs:// range source (reader_gcs.c) ---------------------------- */

/* Runs b's jobs through ranged GETs; returns when every job was issued
 * (or the batch stopped) and no request is in flight. */
void rd_gcs_run(ckpt_reader *r, struct rd_batch *b);
/* Frees the merge buffers. */
void rd_gcs_free(ckpt_reader *r);
/* Bytes [off, off + len) of file i's object, synchronously (*got < len at
 * its end, 0 past it): 0, -ENOENT if it is absent, or an error whose
 * message (the client's) is in msg. */
int rd_gcs_pread(ckpt_reader *r, size_t i, uint64_t off, void *buf,
		 size_t len, size_t *got, char *msg, size_t msglen);
/* A small document of the step (COMMIT, an index) through the reader's
 * location: eng_get_doc's contract. */
int rd_get_doc(ckpt_reader *r, const char *name, uint64_t max_len,
	       uint8_t **out, size_t *len, char *err);

#endif /* CKPT_ENGINE_READER_INTERNAL_H */
