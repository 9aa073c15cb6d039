/*
 * reader.c - loading a committed step: open (the COMMIT record and every
 * host's index, merged into one table of global tensors), reads of whole
 * tensors and of boxes assembled from stored slices, verification, copy.
 *
 * Nothing on disk is trusted before it is checked. COMMIT lists every file
 * with its size and XXH3; an index is compared with that listing before it
 * is parsed, and every number later used to index memory is re-validated
 * here even though the format module validates it too: a wrong bound is a
 * crash, not a wrong answer.
 *
 * A read is planned as "targets" (one per request x stored slice that
 * intersect), each a run of equally long rows mapping a range of a host's
 * data stream onto the destination, plus the chunks those rows touch. The
 * calling thread keeps up to queue_depth chunk reads in flight through
 * io_uring, in file order, into a bounded pool of aligned buffers; worker
 * threads check each chunk (header against the index, decode, XXH3 of the
 * raw bytes) and copy it into every destination row it overlaps. Memory is
 * bounded by the buffer pool, never by the size of the checkpoint. When a
 * chunk lies inside one destination row it is decoded in place.
 *
 * Verification runs the same pipeline over a shard file's chunks in file
 * order ("ordered" batches): the calling thread hashes each buffer into
 * the whole-file XXH3 as the reads complete in sequence, then hands the
 * chunk to the workers, so each file is read once.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "internal.h"

#define RD_BUF_BUDGET (128ull << 20) /* chunk buffers per reader */
#define RD_COPY_BLOCK (8u << 20)
#define RD_MAX_QD 1024u
#define RD_DEFAULT_QD 32u
#define RD_MAX_THREADS 256u

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
	uint32_t inflight;
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

struct rd_piece {
	uint32_t host;
	const fmt_tensor_entry *te;
};

struct rd_tensor {
	const char *name;
	int32_t dtype;
	uint32_t ndim;
	const uint64_t *shape;
	uint64_t nbytes;
	uint64_t stored_bytes;
	size_t first; /* into r->pieces */
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
	size_t nfiles;
	struct rd_file *files;
	size_t *files_by_name;

	size_t ntensors;
	struct rd_tensor *tensors;
	size_t npieces;
	struct rd_piece *pieces;
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
			   with reads in flight (exit at close) */

	/* last chunk decoded by a one-chunk read: reads of neighbouring small
	 * tensors (which share chunks) are then served without I/O */
	uint8_t *cache;
	size_t cache_cap;
	uint32_t cache_host, cache_chunk;
	int cache_valid;
};

static uint64_t min_u64(uint64_t a, uint64_t b)
{
	return a < b ? a : b;
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* ------------------------------------------------------------------ */
/* Geometry of targets                                                */
/* ------------------------------------------------------------------ */

static uint64_t tg_row(const struct rd_target *t, uint64_t row, uint64_t *d)
{
	uint64_t s = t->sbase, dd = t->dbase;

	for (uint32_t k = t->nouter; k-- > 0;) {
		uint64_t i = row % t->cnt[k];

		row /= t->cnt[k];
		s += i * t->sstr[k];
		dd += i * t->dstr[k];
	}
	if (d)
		*d = dd;
	return s;
}

/* First row whose end is past stream position pos (nrows if none). */
static uint64_t tg_first_row(const struct rd_target *t, uint64_t pos)
{
	uint64_t lo = 0, hi = t->nrows;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (tg_row(t, mid, NULL) + t->rowlen <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* 1 if some row overlaps stream range [cs, ce). */
static int tg_touches(const struct rd_target *t, uint64_t cs, uint64_t ce)
{
	uint64_t r = tg_first_row(t, cs);

	return r < t->nrows && tg_row(t, r, NULL) < ce;
}

/* Copies the stream bytes [cs, cs+len) at raw into every row overlapping. */
static void tg_scatter(const struct rd_target *t, uint64_t cs,
		       const uint8_t *raw, uint64_t len)
{
	uint64_t ce = cs + len, idx[CKPT_MAX_NDIM], row, rem, s, d;
	uint32_t k;

	row = tg_first_row(t, cs);
	if (row >= t->nrows)
		return;
	rem = row;
	for (k = t->nouter; k-- > 0;) {
		idx[k] = rem % t->cnt[k];
		rem /= t->cnt[k];
	}
	s = tg_row(t, row, &d);
	for (;;) {
		uint64_t lo, hi;

		if (s >= ce)
			break;
		lo = max_u64(s, cs);
		hi = min_u64(s + t->rowlen, ce);
		if (hi > lo)
			memcpy(t->dst + d + (lo - s), raw + (lo - cs), hi - lo);
		if (++row >= t->nrows)
			break;
		/* odometer step over the outer dimensions */
		k = t->nouter - 1;
		idx[k]++;
		s += t->sstr[k];
		d += t->dstr[k];
		while (idx[k] == t->cnt[k] && k > 0) {
			s -= t->cnt[k] * t->sstr[k];
			d -= t->cnt[k] * t->dstr[k];
			idx[k] = 0;
			k--;
			idx[k]++;
			s += t->sstr[k];
			d += t->dstr[k];
		}
	}
}

/* Where chunk [cs, cs+len) lands if it lies inside one row, else NULL. */
static uint8_t *tg_inside_row(const struct rd_target *t, uint64_t cs,
			      uint64_t len)
{
	uint64_t r = tg_first_row(t, cs), s, d;

	if (r >= t->nrows)
		return NULL;
	s = tg_row(t, r, &d);
	if (s <= cs && cs + len <= s + t->rowlen)
		return t->dst + d + (cs - s);
	return NULL;
}

/* Largest chunk index whose stream_offset <= pos (chunks are contiguous
 * from 0, checked at open). */
static size_t chunk_at(const fmt_index *ix, uint64_t pos)
{
	size_t lo = 0, hi = ix->nchunks;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (ix->chunks[mid].stream_offset <= pos)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* Name of the first tensor of host h overlapping stream [cs, ce), or NULL. */
static const char *host_tensor_at(const ckpt_reader *r, uint32_t h,
				  uint64_t cs, uint64_t ce)
{
	const struct rd_host *ho = &r->hosts[h];
	size_t lo = 0, hi = ho->ix.ntensors;

	/* first tensor (by stream order) ending after cs */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const fmt_tensor_entry *te = &ho->ix.tensors[ho->by_stream[mid]];

		if (te->stream_offset + te->nbytes <= cs)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < ho->ix.ntensors; lo++) {
		const fmt_tensor_entry *te = &ho->ix.tensors[ho->by_stream[lo]];

		if (te->stream_offset >= ce)
			break;
		if (te->nbytes > 0)
			return te->name;
	}
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Shard files                                                        */
/* ------------------------------------------------------------------ */

static void rd_close_idle(ckpt_reader *r, size_t keep)
{
	for (size_t i = 0; i < r->nfiles; i++) {
		struct rd_file *f = &r->files[i];

		if (i != keep && f->fd >= 0 && f->inflight == 0) {
			eng_close(f->fd);
			f->fd = -1;
		}
	}
}

static int rd_open_raw(ckpt_reader *r, size_t i, int direct)
{
	int fd = eng_open(r->files[i].path,
			  O_RDONLY | (direct ? O_DIRECT : 0), 0);

	if (fd == -EMFILE || fd == -ENFILE) {
		rd_close_idle(r, i);
		fd = eng_open(r->files[i].path,
			      O_RDONLY | (direct ? O_DIRECT : 0), 0);
	}
	return fd;
}

/* The file's fd, opened on first use (O_DIRECT when the file system takes
 * it) and checked against the size COMMIT records. */
static int rd_file_fd(ckpt_reader *r, size_t i, char *msg, size_t len)
{
	struct rd_file *f = &r->files[i];
	struct stat st;
	int fd = -EINVAL, direct = 0;

	if (f->fd >= 0)
		return f->fd;
	if (!(r->flags & CKPT_F_NO_DIRECT)) {
		fd = rd_open_raw(r, i, 1);
		direct = fd >= 0;
	}
	if (fd == -EINVAL)
		fd = rd_open_raw(r, i, 0);
	if (fd < 0) {
		if (fd == -ENOENT) {
			snprintf(msg, len, "%s/%s: missing (listed in %s)",
				 r->dname, f->name, FMT_COMMIT_NAME);
			return CKPT_E_CORRUPT;
		}
		snprintf(msg, len, "%s/%s: open: %s", r->dname, f->name,
			 ckpt_strerror(fd));
		return fd;
	}
	if (fstat(fd, &st) < 0) {
		int e = -errno;

		eng_close(fd);
		snprintf(msg, len, "%s/%s: stat: %s", r->dname, f->name,
			 strerror(-e));
		return e;
	}
	if ((uint64_t)st.st_size != f->size) {
		eng_close(fd);
		snprintf(msg, len,
			 "%s/%s: %llu bytes, the commit record says %llu",
			 r->dname, f->name, (ull)st.st_size, (ull)f->size);
		return CKPT_E_CORRUPT;
	}
	f->fd = fd;
	f->direct = direct;
	return fd;
}

/* Reads the rest of job j synchronously, through a buffered descriptor
 * when O_DIRECT cannot continue (unaligned after a short count). */
static int rd_read_rest(ckpt_reader *r, struct rd_job *j)
{
	struct rd_file *f = &r->files[j->file];
	int fd = f->fd, tmp = -1, rc;

	if (f->direct && ((j->off + j->done) % FMT_ALIGN ||
			  (j->len - j->done) % FMT_ALIGN)) {
		tmp = eng_open(f->path, O_RDONLY, 0);
		if (tmp < 0)
			return tmp;
		fd = tmp;
	}
	rc = eng_pread_all(fd, j->buf + j->done, j->len - j->done,
			   j->off + j->done);
	if (rc == -EINVAL && f->direct && tmp < 0) {
		/* a short count inside eng_pread_all left it unaligned */
		tmp = eng_open(f->path, O_RDONLY, 0);
		if (tmp < 0)
			return tmp;
		rc = eng_pread_all(tmp, j->buf + j->done, j->len - j->done,
				   j->off + j->done);
	}
	if (tmp >= 0)
		eng_close(tmp);
	if (rc == 0)
		j->done = j->len;
	return rc;
}

/* ------------------------------------------------------------------ */
/* Failures inside a batch                                            */
/* ------------------------------------------------------------------ */

/* Keeps the message of the lowest key. Call with r->mu held. */
static void rd_note_locked(struct rd_batch *b, size_t key, int code,
			   const char *msg)
{
	if (b->err_code == 0 || key < b->err_key) {
		b->err_key = key;
		b->err_code = code;
		snprintf(b->err_msg, sizeof(b->err_msg), "%s", msg);
	}
}

static void rd_req_fail(ckpt_reader *r, struct rd_batch *b, size_t req,
			int code, const char *msg)
{
	pthread_mutex_lock(&r->mu);
	if (b->reqs[req].status == 0)
		b->reqs[req].status = code;
	rd_note_locked(b, req, code, msg);
	pthread_mutex_unlock(&r->mu);
}

/* A job failed: every request it feeds fails (reads); verify stops. */
static void rd_job_fail(ckpt_reader *r, struct rd_batch *b,
			struct rd_job *j, int code, const char *msg)
{
	pthread_mutex_lock(&r->mu);
	j->failed = 1;
	if (b->ordered) {
		rd_note_locked(b, (size_t)(j - b->jobs), code, msg);
		b->stop = 1;
	}
	for (size_t t = j->t0; t < j->t1; t++) {
		uint32_t q = b->tg[b->tmap[t]].req;

		if (b->reqs[q].status == 0)
			b->reqs[q].status = code;
		rd_note_locked(b, q, code, msg);
	}
	pthread_mutex_unlock(&r->mu);
}

static void rd_fatal(ckpt_reader *r, struct rd_batch *b, int code,
		     const char *msg)
{
	pthread_mutex_lock(&r->mu);
	if (!b->fatal) {
		b->fatal = code;
		b->err_key = 0;
		b->err_code = code;
		snprintf(b->err_msg, sizeof(b->err_msg), "%s", msg);
	}
	b->stop = 1;
	pthread_mutex_unlock(&r->mu);
}

/* 1 if every request fed by j already failed (reading it is pointless). */
static int rd_job_dead(ckpt_reader *r, struct rd_batch *b,
		       const struct rd_job *j)
{
	int dead = 1;

	if (b->ordered)
		return 0;
	pthread_mutex_lock(&r->mu);
	for (size_t t = j->t0; t < j->t1 && dead; t++)
		if (b->reqs[b->tg[b->tmap[t]].req].status == 0)
			dead = 0;
	pthread_mutex_unlock(&r->mu);
	return dead;
}

/* ------------------------------------------------------------------ */
/* Chunk checking (worker threads)                                    */
/* ------------------------------------------------------------------ */

static const char *rd_job_tensor(const ckpt_reader *r,
				 const struct rd_batch *b,
				 const struct rd_job *j)
{
	const fmt_chunk_entry *ce = &r->hosts[j->host].ix.chunks[j->chunk];
	size_t best = SIZE_MAX;

	for (size_t t = j->t0; t < j->t1; t++)
		if (b->tg[b->tmap[t]].req < best)
			best = b->tg[b->tmap[t]].req;
	if (best != SIZE_MAX && b->reqs[best].name)
		return b->reqs[best].name;
	return host_tensor_at(r, j->host, ce->stream_offset,
			      ce->stream_offset + ce->raw_len);
}

static void rd_chunk_msg(const ckpt_reader *r, const struct rd_batch *b,
			 const struct rd_job *j, char *msg, size_t len,
			 const char *what)
{
	const char *tn = rd_job_tensor(r, b, j);

	if (tn)
		snprintf(msg, len, "%s/%s offset %llu: %s (tensor \"%s\")",
			 r->dname, r->files[j->file].name, (ull)j->off, what,
			 tn);
	else
		snprintf(msg, len, "%s/%s offset %llu: %s", r->dname,
			 r->files[j->file].name, (ull)j->off, what);
}

/*
 * Checks the chunk in j->buf against its index entry and decodes it: into
 * `into` when given (raw_len bytes of a destination), else into the
 * worker's buffer, or in place for codec none. *raw gets the raw bytes.
 */
static int rd_check_chunk(struct rd_worker *w, const struct rd_batch *b,
			  const struct rd_job *j, uint8_t *into,
			  const uint8_t **raw, char *msg, size_t len)
{
	const ckpt_reader *r = w->r;
	const fmt_chunk_entry *ce = &r->hosts[j->host].ix.chunks[j->chunk];
	char err[512], what[768];
	fmt_chunk_hdr h;
	const uint8_t *payload = j->buf + FMT_CHUNK_HDR_SIZE;
	uint8_t *out;
	int rc;

	err[0] = 0;
	rc = fmt_chunk_hdr_decode(j->buf, FMT_CHUNK_HDR_SIZE, &h, err,
				  sizeof(err));
	if (rc < 0) {
		rd_chunk_msg(r, b, j, msg, len, err);
		return rc == CKPT_E_VERSION ? rc : CKPT_E_CORRUPT;
	}
	if (h.codec != ce->codec || h.elem_width != ce->elem_width ||
	    h.raw_len != ce->raw_len || h.stored_len != ce->stored_len ||
	    h.stream_offset != ce->stream_offset ||
	    h.raw_xxh3 != ce->raw_xxh3) {
		rd_chunk_msg(r, b, j, msg, len,
			     "chunk header disagrees with the index");
		return CKPT_E_CORRUPT;
	}
	if (ce->codec == CKPT_CODEC_NONE) {
		out = (uint8_t *)payload;
	} else {
		out = into;
		if (!out) {
			if (w->rawcap < ce->raw_len) {
				uint8_t *nb = malloc(ce->raw_len);

				if (!nb) {
					rd_chunk_msg(r, b, j, msg, len,
						     "out of memory");
					return -ENOMEM;
				}
				free(w->raw);
				w->raw = nb;
				w->rawcap = ce->raw_len;
			}
			out = w->raw;
		}
		if (!w->cc) {
			w->cc = fmt_codec_ctx_new();
			if (!w->cc) {
				rd_chunk_msg(r, b, j, msg, len,
					     "out of memory");
				return -ENOMEM;
			}
		}
		err[0] = 0;
		rc = fmt_chunk_decode(w->cc, ce->codec, ce->elem_width,
				      payload, ce->stored_len, out,
				      ce->raw_len, err, sizeof(err));
		if (rc < 0) {
			snprintf(what, sizeof(what), "chunk does not decode: %s",
				 err);
			rd_chunk_msg(r, b, j, msg, len, what);
			return rc == -ENOMEM ? rc : CKPT_E_CORRUPT;
		}
	}
	if (fmt_xxh3(out, ce->raw_len) != ce->raw_xxh3) {
		rd_chunk_msg(r, b, j, msg, len, "chunk checksum mismatch");
		return CKPT_E_CORRUPT;
	}
	*raw = out;
	return 0;
}

static void rd_process(struct rd_worker *w, struct rd_batch *b,
		       struct rd_job *j)
{
	ckpt_reader *r = w->r;
	const fmt_chunk_entry *ce = &r->hosts[j->host].ix.chunks[j->chunk];
	char msg[ENG_ERRMSG_MAX];
	const uint8_t *raw = NULL;
	uint8_t *into = NULL;
	int rc;

	if (j->t1 - j->t0 == 1)
		into = tg_inside_row(&b->tg[b->tmap[j->t0]],
				     ce->stream_offset, ce->raw_len);
	rc = rd_check_chunk(w, b, j,
			    ce->codec != CKPT_CODEC_NONE ? into : NULL, &raw,
			    msg, sizeof(msg));
	if (rc < 0) {
		rd_job_fail(r, b, j, rc, msg);
		return;
	}
	for (size_t t = j->t0; t < j->t1; t++) {
		const struct rd_target *tg = &b->tg[b->tmap[t]];

		if (raw == into)
			break; /* decoded in place, the only target */
		tg_scatter(tg, ce->stream_offset, raw, ce->raw_len);
	}
	if (b->cache_fill && !into) {
		/* only this worker touches the cache during the batch */
		if (r->cache_cap < ce->raw_len) {
			uint8_t *nc = malloc(ce->raw_len);

			if (!nc)
				return;
			free(r->cache);
			r->cache = nc;
			r->cache_cap = ce->raw_len;
		}
		memcpy(r->cache, raw, ce->raw_len);
		r->cache_host = j->host;
		r->cache_chunk = j->chunk;
		r->cache_valid = 1;
	}
}

static void *rd_worker_main(void *arg)
{
	struct rd_worker *w = arg;
	ckpt_reader *r = w->r;

	pthread_mutex_lock(&r->mu);
	for (;;) {
		struct rd_batch *b;
		struct rd_job *j;

		while (!r->stop && r->qlen == 0)
			pthread_cond_wait(&r->cv_work, &r->mu);
		if (r->qlen == 0)
			break;
		b = r->batch;
		j = &b->jobs[r->queue[r->qhead]];
		r->qhead = (r->qhead + 1) % r->qcap;
		r->qlen--;
		pthread_mutex_unlock(&r->mu);
		if (j->kind == JOB_CHUNK)
			rd_process(w, b, j);
		pthread_mutex_lock(&r->mu);
		r->freeb[r->nfree++] = j->buf;
		j->buf = NULL;
		r->busy--;
		pthread_cond_broadcast(&r->cv_done);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* The pipeline (calling thread)                                      */
/* ------------------------------------------------------------------ */

static void rd_free_bufs(ckpt_reader *r)
{
	for (size_t i = 0; i < r->nbufs; i++)
		free(r->bufs[i]);
	free(r->bufs);
	free(r->freeb);
	free(r->queue);
	r->bufs = r->freeb = NULL;
	r->queue = NULL;
	r->nbufs = r->nfree = r->maxbufs = r->bufsize = r->qcap = 0;
}

static void rd_stop_workers(ckpt_reader *r)
{
	if (!r->workers)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = 1;
	pthread_cond_broadcast(&r->cv_work);
	pthread_mutex_unlock(&r->mu);
	for (unsigned i = 0; i < r->nworkers; i++) {
		pthread_join(r->workers[i].th, NULL);
		fmt_codec_ctx_free(r->workers[i].cc);
		free(r->workers[i].raw);
	}
	free(r->workers);
	r->workers = NULL;
	r->nworkers = 0;
}

/* Sizes the buffer pool for buffers of `need` bytes and starts workers.
 * No buffer is in use between batches. */
static int rd_prepare(ckpt_reader *r, uint64_t need)
{
	need = fmt_align_up(need ? need : FMT_ALIGN, FMT_ALIGN);
	if (need > r->bufsize) {
		size_t maxb = 2 * (size_t)r->qd, lim;

		rd_free_bufs(r);
		lim = (size_t)(RD_BUF_BUDGET / need);
		if (lim < r->threads + 1u)
			lim = r->threads + 1u;
		if (lim < 2)
			lim = 2;
		if (maxb > lim)
			maxb = lim;
		if (maxb < 2)
			maxb = 2;
		r->bufs = calloc(maxb, sizeof(*r->bufs));
		r->freeb = calloc(maxb, sizeof(*r->freeb));
		r->queue = calloc(maxb, sizeof(*r->queue));
		if (!r->bufs || !r->freeb || !r->queue) {
			rd_free_bufs(r);
			return -ENOMEM;
		}
		r->maxbufs = r->qcap = maxb;
		r->bufsize = (size_t)need;
		r->qhead = r->qlen = 0;
	}
	if (!r->workers) {
		r->workers = calloc(r->threads, sizeof(*r->workers));
		if (!r->workers)
			return -ENOMEM;
		r->stop = 0;
		for (unsigned i = 0; i < r->threads; i++) {
			r->workers[i].r = r;
			if (pthread_create(&r->workers[i].th, NULL,
					   rd_worker_main, &r->workers[i]) != 0)
				break;
			r->nworkers++;
		}
		if (r->nworkers == 0) {
			free(r->workers);
			r->workers = NULL;
			return -EAGAIN;
		}
	}
	if (r->ring_state == 0 && !(r->flags & CKPT_F_NO_URING)) {
		r->ring_state = io_uring_queue_init(r->qd, &r->ring, 0) == 0
					? 1 : -1;
	}
	return 0;
}

/* A free buffer, a new one while under the cap, or NULL (*err set on
 * allocation failure with nothing to wait for). */
static uint8_t *rd_buf_get(ckpt_reader *r, int *err)
{
	uint8_t *b = NULL;

	*err = 0;
	pthread_mutex_lock(&r->mu);
	if (r->nfree > 0) {
		b = r->freeb[--r->nfree];
	} else if (r->nbufs < r->maxbufs) {
		b = aligned_alloc(FMT_ALIGN, r->bufsize);
		if (b)
			r->bufs[r->nbufs++] = b;
		else if (r->nbufs == 0)
			*err = -ENOMEM;
		else
			r->maxbufs = r->nbufs; /* live with what we have */
	}
	pthread_mutex_unlock(&r->mu);
	return b;
}

static void rd_buf_put(ckpt_reader *r, uint8_t *b)
{
	pthread_mutex_lock(&r->mu);
	r->freeb[r->nfree++] = b;
	pthread_cond_broadcast(&r->cv_done);
	pthread_mutex_unlock(&r->mu);
}

static void rd_dispatch(ckpt_reader *r, struct rd_job *j, size_t idx)
{
	(void)j;
	pthread_mutex_lock(&r->mu);
	r->queue[(r->qhead + r->qlen) % r->qcap] = idx;
	r->qlen++;
	r->busy++;
	pthread_cond_signal(&r->cv_work);
	pthread_mutex_unlock(&r->mu);
}

/* A job whose read failed gives its buffer back and feeds nothing. */
static void rd_job_abort(ckpt_reader *r, struct rd_batch *b,
			 struct rd_job *j, int code, const char *msg)
{
	rd_job_fail(r, b, j, code, msg);
	if (j->buf) {
		rd_buf_put(r, j->buf);
		j->buf = NULL;
	}
	j->ready = 1;
}

static void rd_io_fail(ckpt_reader *r, struct rd_batch *b, struct rd_job *j,
		       int code)
{
	char msg[ENG_ERRMSG_MAX], what[128];

	snprintf(what, sizeof(what), "read: %s", ckpt_strerror(code));
	rd_chunk_msg(r, b, j, msg, sizeof(msg), what);
	rd_job_abort(r, b, j, code, msg);
}

/* Ordered mode: the shard header is checked by the calling thread. */
static int rd_check_shard_hdr(ckpt_reader *r, struct rd_batch *b,
			      struct rd_job *j, char *msg, size_t len)
{
	const struct rd_file *f = &r->files[j->file];
	const fmt_shard_hdr *want = b->want_hdr;
	fmt_shard_hdr h;
	char err[512];
	int rc;

	err[0] = 0;
	rc = fmt_shard_hdr_decode(j->buf, FMT_SHARD_HDR_SIZE, &h, err,
				  sizeof(err));
	if (rc < 0) {
		snprintf(msg, len, "%s/%s offset 0: %s", r->dname, f->name,
			 err);
		return rc == CKPT_E_VERSION ? rc : CKPT_E_CORRUPT;
	}
	if (h.step != want->step || h.host_index != want->host_index ||
	    h.host_count != want->host_count ||
	    h.file_index != want->file_index ||
	    memcmp(h.save_id, want->save_id, sizeof(h.save_id)) != 0) {
		snprintf(msg, len,
			 "%s/%s offset 0: shard header says step %llu host "
			 "%u of %u file %u, expected step %llu host %u of %u "
			 "file %u of the same save",
			 r->dname, f->name, (ull)h.step, h.host_index,
			 h.host_count, h.file_index, (ull)want->step,
			 want->host_index, want->host_count, want->file_index);
		return CKPT_E_CORRUPT;
	}
	return 0;
}

/* A job's read is complete. Ordered batches advance their cursor: hash,
 * report progress, check the header or hand the chunk to a worker. */
static void rd_complete(ckpt_reader *r, struct rd_batch *b, struct rd_job *j)
{
	j->ready = 1;
	if (!b->ordered) {
		rd_dispatch(r, j, (size_t)(j - b->jobs));
		return;
	}
	while (b->cursor < b->njobs && b->jobs[b->cursor].ready) {
		struct rd_job *c = &b->jobs[b->cursor];

		b->cursor++;
		if (c->failed || !c->buf)
			continue;
		XXH3_64bits_update(b->hs, c->buf, c->len);
		*b->pdone += c->len;
		if (b->fn && !b->canceled &&
		    b->fn(b->fnarg, *b->pdone, b->ptotal) != 0) {
			b->canceled = 1;
			pthread_mutex_lock(&r->mu);
			b->stop = 1;
			pthread_mutex_unlock(&r->mu);
		}
		if (c->kind == JOB_SHARD_HDR) {
			char msg[ENG_ERRMSG_MAX];
			int rc = rd_check_shard_hdr(r, b, c, msg, sizeof(msg));

			if (rc < 0)
				rd_job_fail(r, b, c, rc, msg);
			rd_buf_put(r, c->buf);
			c->buf = NULL;
		} else {
			rd_dispatch(r, c, (size_t)(c - b->jobs));
		}
	}
}

static int rd_submit(ckpt_reader *r, struct rd_job *j, size_t idx)
{
	struct rd_file *f = &r->files[j->file];
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
	int rc;

	if (!sqe)
		return -EBUSY; /* cannot happen: in flight <= ring size */
	io_uring_prep_read(sqe, f->fd, j->buf + j->done,
			   (unsigned)(j->len - j->done), j->off + j->done);
	io_uring_sqe_set_data64(sqe, (uint64_t)idx);
	do
		rc = io_uring_submit(&r->ring);
	while (rc == -EINTR);
	if (rc < 0)
		return rc;
	f->inflight++;
	return 0;
}

static void rd_reap_one(ckpt_reader *r, struct rd_batch *b,
			struct io_uring_cqe *cqe, size_t *inflight)
{
	uint64_t idx = io_uring_cqe_get_data64(cqe);
	struct rd_job *j;
	struct rd_file *f;
	uint64_t want;
	long res;

	(*inflight)--;
	if (idx >= b->njobs)
		return; /* not ours: cannot happen */
	j = &b->jobs[idx];
	f = &r->files[j->file];
	f->inflight--;
	want = j->len - j->done;
	res = eng_filter_read(f->fd, j->off + j->done, (size_t)want,
			      cqe->res);
	if (res > (long)want)
		res = (long)want;
	if (res == -EINTR || res == -EAGAIN)
		res = -EAGAIN; /* retry below, as a zero-progress short read */
	if (res < 0 && res != -EAGAIN && !(res == -EINVAL && f->direct)) {
		rd_io_fail(r, b, j, (int)res);
		return;
	}
	if (res == 0) {
		char msg[ENG_ERRMSG_MAX], what[128];

		snprintf(what, sizeof(what), "file ends at %llu, inside the "
			 "chunk", (ull)(j->off + j->done));
		rd_chunk_msg(r, b, j, msg, sizeof(msg), what);
		rd_job_abort(r, b, j, CKPT_E_CORRUPT, msg);
		return;
	}
	if (res > 0)
		j->done += (uint64_t)res;
	if (j->done < j->len) {
		int rc;

		if (res == -EINVAL || b->ring_broken ||
		    (f->direct && (j->done % FMT_ALIGN) != 0)) {
			rc = rd_read_rest(r, j);
		} else {
			rc = rd_submit(r, j, (size_t)idx);
			if (rc == 0) {
				(*inflight)++;
				return;
			}
			b->ring_broken = 1;
			rc = rd_read_rest(r, j);
		}
		if (rc < 0) {
			rd_io_fail(r, b, j, rc);
			return;
		}
	}
	rd_complete(r, b, j);
}

static int rd_pipeline(ckpt_reader *r, struct rd_batch *b)
{
	size_t next = 0, inflight = 0;
	unsigned depth;
	int use_ring, rc = 0, stop, ring_dead = 0;
	char msg[ENG_ERRMSG_MAX];

	if (b->njobs == 0)
		return 0;
	rc = 0;
	{
		uint64_t need = 0;

		for (size_t i = 0; i < b->njobs; i++)
			need = max_u64(need, b->jobs[i].len);
		rc = rd_prepare(r, need);
		if (rc < 0) {
			snprintf(msg, sizeof(msg), "reader: cannot set up the "
				 "read pipeline: %s", ckpt_strerror(rc));
			rd_fatal(r, b, rc, msg);
			return rc;
		}
	}
	use_ring = r->ring_state == 1;
	depth = r->qd;
	if (depth > r->maxbufs)
		depth = (unsigned)r->maxbufs;
	pthread_mutex_lock(&r->mu);
	r->batch = b;
	pthread_mutex_unlock(&r->mu);

	for (;;) {
		pthread_mutex_lock(&r->mu);
		stop = b->stop;
		pthread_mutex_unlock(&r->mu);
		while (!stop && next < b->njobs &&
		       (!use_ring || b->ring_broken || inflight < depth)) {
			struct rd_job *j = &b->jobs[next];
			uint8_t *buf;
			int fd, err;

			if (rd_job_dead(r, b, j)) {
				j->ready = 1;
				j->failed = 1;
				next++;
				continue;
			}
			buf = rd_buf_get(r, &err);
			if (!buf) {
				if (err) {
					rd_fatal(r, b, err, "reader: out of "
						 "memory for read buffers");
					stop = 1;
				}
				break;
			}
			j->buf = buf;
			j->done = 0;
			next++;
			fd = rd_file_fd(r, j->file, msg, sizeof(msg));
			if (fd < 0) {
				rd_job_abort(r, b, j, fd, msg);
				if (b->ordered)
					rd_complete(r, b, j);
				continue;
			}
			if (use_ring && !b->ring_broken) {
				err = rd_submit(r, j, (size_t)(j - b->jobs));
				if (err == 0) {
					inflight++;
					continue;
				}
				b->ring_broken = 1;
			}
			err = rd_read_rest(r, j);
			if (err < 0) {
				rd_io_fail(r, b, j, err);
				if (b->ordered)
					rd_complete(r, b, j);
			} else {
				rd_complete(r, b, j);
			}
			pthread_mutex_lock(&r->mu);
			stop = b->stop;
			pthread_mutex_unlock(&r->mu);
		}
		if (inflight == 0) {
			pthread_mutex_lock(&r->mu);
			if (b->stop || next >= b->njobs) {
				while (r->busy > 0)
					pthread_cond_wait(&r->cv_done, &r->mu);
				pthread_mutex_unlock(&r->mu);
				break;
			}
			while (r->nfree == 0 && r->nbufs >= r->maxbufs &&
			       r->busy > 0)
				pthread_cond_wait(&r->cv_done, &r->mu);
			if (r->nfree == 0 && r->nbufs >= r->maxbufs) {
				/* nothing will free a buffer: cannot happen */
				pthread_mutex_unlock(&r->mu);
				rd_fatal(r, b, -EDEADLK,
					 "reader: read pipeline stalled");
				continue;
			}
			pthread_mutex_unlock(&r->mu);
			continue;
		}
		{
			struct io_uring_cqe *cqe;
			int w = io_uring_wait_cqe(&r->ring, &cqe);

			if (w == -EINTR || w == -EAGAIN)
				continue;
			if (w < 0) {
				/* the ring is unusable; in-flight reads
				 * cannot be collected: keep their buffers
				 * (leaked to the pool) and give up */
				snprintf(msg, sizeof(msg),
					 "reader: io_uring wait: %s",
					 ckpt_strerror(w));
				rd_fatal(r, b, w, msg);
				ring_dead = 1;
				break;
			}
			do {
				rd_reap_one(r, b, cqe, &inflight);
				io_uring_cqe_seen(&r->ring, cqe);
			} while (inflight > 0 &&
				 io_uring_peek_cqe(&r->ring, &cqe) == 0);
		}
	}
	if (ring_dead) {
		/* reads may still land in their buffers: never reuse those,
		 * nor the ring (both are freed by ckpt_reader_close) */
		r->ring_state = -2;
		pthread_mutex_lock(&r->mu);
		r->maxbufs = r->nbufs;
		pthread_mutex_unlock(&r->mu);
	} else if (b->ring_broken && r->ring_state == 1) {
		io_uring_queue_exit(&r->ring);
		r->ring_state = -1;
	}
	/* buffers of jobs read but never handed on (a stopped batch) */
	for (size_t i = 0; i < b->njobs && !ring_dead; i++) {
		if (b->jobs[i].buf) {
			rd_buf_put(r, b->jobs[i].buf);
			b->jobs[i].buf = NULL;
		}
	}
	pthread_mutex_lock(&r->mu);
	r->batch = NULL;
	rc = b->fatal;
	pthread_mutex_unlock(&r->mu);
	return rc;
}

/* ------------------------------------------------------------------ */
/* Reads                                                              */
/* ------------------------------------------------------------------ */

static int rd_find(const ckpt_reader *r, const char *name, size_t *idx)
{
	size_t lo = 0, hi = r->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(r->tensors[mid].name, name);

		if (c == 0) {
			*idx = mid;
			return 0;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return CKPT_E_NOTFOUND;
}

static int rd_add_target(struct rd_batch *b, struct rd_target **out)
{
	if (b->ntg == b->tgcap) {
		size_t ncap = b->tgcap ? b->tgcap * 2 : 16;
		struct rd_target *n = realloc(b->tg, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		b->tg = n;
		b->tgcap = ncap;
	}
	*out = &b->tg[b->ntg++];
	memset(*out, 0, sizeof(**out));
	return 0;
}

/*
 * Plans request i: validates the box, adds one target per stored slice
 * that intersects it and checks the slices cover the box. Failures of the
 * request itself are recorded; the return value is only for fatal ones.
 */
static int rd_plan_req(ckpt_reader *r, struct rd_batch *b, size_t i)
{
	ckpt_read_req *q = &b->reqs[i];
	const struct rd_tensor *t;
	uint64_t off[CKPT_MAX_NDIM], ext[CKPT_MAX_NDIM];
	uint64_t esize, box_elems = 1, box_bytes, covered = 0;
	size_t ti, saved = b->ntg;
	char msg[ENG_ERRMSG_MAX];

	if (!q->name) {
		rd_req_fail(r, b, i, -EINVAL, "read request: name is NULL");
		return 0;
	}
	if (rd_find(r, q->name, &ti) < 0) {
		snprintf(msg, sizeof(msg), "no tensor \"%s\" in %s", q->name,
			 r->dname);
		rd_req_fail(r, b, i, CKPT_E_NOTFOUND, msg);
		return 0;
	}
	t = &r->tensors[ti];
	esize = ckpt_dtype_size(t->dtype);
	for (uint32_t d = 0; d < t->ndim; d++) {
		off[d] = q->offset ? q->offset[d] : 0;
		if (off[d] > t->shape[d]) {
			snprintf(msg, sizeof(msg), "tensor \"%s\": offset[%u] "
				 "= %llu is outside shape %llu", q->name, d,
				 (ull)off[d], (ull)t->shape[d]);
			rd_req_fail(r, b, i, -EINVAL, msg);
			return 0;
		}
		ext[d] = q->extent ? q->extent[d] : t->shape[d] - off[d];
		if (ext[d] > t->shape[d] - off[d]) {
			snprintf(msg, sizeof(msg), "tensor \"%s\": box "
				 "[%llu, %llu) of dimension %u is outside "
				 "shape %llu", q->name, (ull)off[d],
				 (ull)off[d] + (ull)ext[d], d,
				 (ull)t->shape[d]);
			rd_req_fail(r, b, i, -EINVAL, msg);
			return 0;
		}
		box_elems *= ext[d]; /* <= global elements: no overflow */
	}
	box_bytes = box_elems * esize;
	if (q->dst_bytes != box_bytes) {
		snprintf(msg, sizeof(msg), "tensor \"%s\": dst_bytes is %llu, "
			 "the box holds %llu bytes", q->name,
			 (ull)q->dst_bytes, (ull)box_bytes);
		rd_req_fail(r, b, i, -EINVAL, msg);
		return 0;
	}
	if (box_bytes > 0 && !q->dst) {
		snprintf(msg, sizeof(msg), "tensor \"%s\": dst is NULL",
			 q->name);
		rd_req_fail(r, b, i, -EINVAL, msg);
		return 0;
	}
	if (box_elems == 0)
		return 0;
	for (uint32_t p = 0; p < t->npieces; p++) {
		const struct rd_piece *pc = &r->pieces[t->first + p];
		const fmt_tensor_entry *te = pc->te;
		uint64_t io[CKPT_MAX_NDIM], ie[CKPT_MAX_NDIM], elems = 1;
		uint64_t sstr[CKPT_MAX_NDIM], dstr[CKPT_MAX_NDIM], ss, ds;
		struct rd_target *tg;
		uint32_t d, nd = t->ndim, k;
		int rc;

		for (d = 0; d < nd; d++) {
			uint64_t lo = max_u64(off[d], te->offset[d]);
			uint64_t hi = min_u64(off[d] + ext[d],
					      te->offset[d] + te->extent[d]);

			if (hi <= lo)
				break;
			io[d] = lo;
			ie[d] = hi - lo;
			elems *= ie[d];
		}
		if (d < nd)
			continue;
		rc = rd_add_target(b, &tg);
		if (rc < 0)
			return rc;
		covered += elems;
		ss = ds = esize;
		for (d = nd; d-- > 0;) {
			sstr[d] = ss;
			dstr[d] = ds;
			ss *= te->extent[d];
			ds *= ext[d];
		}
		tg->dst = q->dst;
		tg->req = (uint32_t)i;
		tg->host = pc->host;
		tg->sbase = te->stream_offset;
		tg->dbase = 0;
		for (d = 0; d < nd; d++) {
			tg->sbase += (io[d] - te->offset[d]) * sstr[d];
			tg->dbase += (io[d] - off[d]) * dstr[d];
		}
		/* rows: merge trailing dimensions covered whole in both the
		 * slice and the box, plus the first partial one */
		tg->rowlen = esize;
		k = nd;
		while (k > 0) {
			k--;
			tg->rowlen *= ie[k];
			if (ie[k] != te->extent[k] || ie[k] != ext[k])
				break;
		}
		tg->nrows = 1;
		tg->nouter = 0;
		for (d = 0; d < k; d++) {
			if (ie[d] == 1)
				continue;
			tg->cnt[tg->nouter] = ie[d];
			tg->sstr[tg->nouter] = sstr[d];
			tg->dstr[tg->nouter] = dstr[d];
			tg->nouter++;
			tg->nrows *= ie[d];
		}
	}
	if (covered != box_elems) {
		b->ntg = saved;
		snprintf(msg, sizeof(msg), "tensor \"%s\": part of the box is "
			 "not stored (%llu of %llu elements are)", q->name,
			 (ull)covered, (ull)box_elems);
		rd_req_fail(r, b, i, CKPT_E_NOTFOUND, msg);
	}
	return 0;
}

struct rd_pair {
	uint64_t key; /* host << 32 | chunk */
	size_t tg;
};

static int cmp_pair(const void *a, const void *b)
{
	const struct rd_pair *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->tg < y->tg ? -1 : x->tg > y->tg;
}

static int cmp_job(const void *a, const void *b)
{
	const struct rd_job *x = a, *y = b;

	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->file < y->file ? -1 : x->file > y->file;
}

/* Builds the jobs (chunks to read, in file order) of a read batch. */
static int rd_plan_jobs(ckpt_reader *r, struct rd_batch *b)
{
	struct rd_pair *pairs = NULL;
	size_t np = 0, cap = 0, nj = 0;
	int rc = 0;

	for (size_t ti = 0; ti < b->ntg; ti++) {
		const struct rd_target *t = &b->tg[ti];
		const fmt_index *ix = &r->hosts[t->host].ix;
		uint64_t first = t->sbase;
		uint64_t last = tg_row(t, t->nrows - 1, NULL) + t->rowlen;
		size_t c0 = chunk_at(ix, first), c1 = chunk_at(ix, last - 1);

		for (size_t c = c0; c <= c1; c++) {
			const fmt_chunk_entry *ce = &ix->chunks[c];

			if (t->nrows > 1 &&
			    !tg_touches(t, ce->stream_offset,
					ce->stream_offset + ce->raw_len))
				continue;
			if (np == cap) {
				size_t ncap = cap ? cap * 2 : 64;
				struct rd_pair *n =
					realloc(pairs, ncap * sizeof(*n));

				if (!n) {
					rc = -ENOMEM;
					goto out;
				}
				pairs = n;
				cap = ncap;
			}
			pairs[np].key = (uint64_t)t->host << 32 | c;
			pairs[np].tg = ti;
			np++;
		}
	}
	if (np == 0)
		goto out;
	qsort(pairs, np, sizeof(*pairs), cmp_pair);
	b->tmap = malloc(np * sizeof(*b->tmap));
	b->jobs = calloc(np, sizeof(*b->jobs));
	if (!b->tmap || !b->jobs) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t p = 0; p < np; p++) {
		b->tmap[p] = pairs[p].tg;
		if (p == 0 || pairs[p].key != pairs[p - 1].key) {
			uint32_t h = (uint32_t)(pairs[p].key >> 32);
			uint32_t c = (uint32_t)pairs[p].key;
			const fmt_chunk_entry *ce = &r->hosts[h].ix.chunks[c];
			struct rd_job *j = &b->jobs[nj++];

			j->host = h;
			j->chunk = c;
			j->kind = JOB_CHUNK;
			j->file = r->hosts[h].file_of[ce->file];
			j->off = ce->file_offset;
			j->len = fmt_chunk_span(ce->stored_len);
			j->t0 = p;
		}
		b->jobs[nj - 1].t1 = p + 1;
	}
	/* chunks decoded by an earlier one-chunk read need no I/O */
	if (r->cache_valid) {
		size_t w = 0;

		for (size_t i = 0; i < nj; i++) {
			struct rd_job *j = &b->jobs[i];

			if (j->host == r->cache_host &&
			    j->chunk == r->cache_chunk) {
				const fmt_chunk_entry *ce =
					&r->hosts[j->host].ix.chunks[j->chunk];

				for (size_t t = j->t0; t < j->t1; t++)
					tg_scatter(&b->tg[b->tmap[t]],
						   ce->stream_offset, r->cache,
						   ce->raw_len);
				continue;
			}
			b->jobs[w++] = *j;
		}
		nj = w;
	}
	qsort(b->jobs, nj, sizeof(*b->jobs), cmp_job);
	b->njobs = nj;
	b->cache_fill = nj == 1;
out:
	free(pairs);
	return rc;
}

static void rd_batch_free(struct rd_batch *b)
{
	free(b->jobs);
	free(b->tg);
	free(b->tmap);
	if (b->hs)
		XXH3_freeState(b->hs);
}

CKPT_API int ckpt_read_batch(ckpt_reader *r, ckpt_read_req *reqs, size_t n)
{
	struct rd_batch b;
	int rc = 0;

	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_read_batch: reader is NULL");
	if (n == 0)
		return 0;
	if (!reqs)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_batch: reqs is NULL");
	if (n > UINT32_MAX)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_batch: %zu requests", n);
	memset(&b, 0, sizeof(b));
	b.reqs = reqs;
	b.nreq = n;
	for (size_t i = 0; i < n; i++)
		reqs[i].status = 0;
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = rd_plan_req(r, &b, i);
	if (rc == 0)
		rc = rd_plan_jobs(r, &b);
	if (rc < 0) {
		rd_fatal(r, &b, rc, "reader: out of memory planning reads");
	} else {
		rc = rd_pipeline(r, &b);
	}
	if (b.fatal) {
		for (size_t i = 0; i < n; i++)
			if (reqs[i].status == 0)
				reqs[i].status = b.fatal;
		rc = eng_err(r->errmsg, b.fatal, "%s", b.err_msg);
		goto out;
	}
	rc = 0;
	for (size_t i = 0; i < n; i++) {
		if (reqs[i].status != 0) {
			rc = reqs[i].status;
			break;
		}
	}
	if (rc != 0)
		eng_err(r->errmsg, rc, "%s", b.err_msg);
out:
	rd_batch_free(&b);
	return rc;
}

CKPT_API int ckpt_read(ckpt_reader *r, const char *name, void *dst,
		       uint64_t dst_bytes)
{
	ckpt_read_req q = { .name = name, .dst = dst, .dst_bytes = dst_bytes };

	return ckpt_read_batch(r, &q, 1);
}

CKPT_API int ckpt_read_slice(ckpt_reader *r, const char *name,
			     const uint64_t *offset, const uint64_t *extent,
			     void *dst, uint64_t dst_bytes)
{
	ckpt_read_req q = { .name = name, .offset = offset, .extent = extent,
			    .dst = dst, .dst_bytes = dst_bytes };

	if (r && (!offset || !extent))
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_slice: offset and extent are "
			       "required");
	return ckpt_read_batch(r, &q, 1);
}

CKPT_API int ckpt_read_alloc(ckpt_reader *r, const char *name, void **out,
			     uint64_t *nbytes)
{
	size_t ti;
	void *p;
	int rc;

	if (out)
		*out = NULL;
	if (nbytes)
		*nbytes = 0;
	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_read_alloc: reader is NULL");
	if (!name || !out)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_alloc: name and out are required");
	if (rd_find(r, name, &ti) < 0)
		return eng_err(r->errmsg, CKPT_E_NOTFOUND,
			       "no tensor \"%s\" in %s", name, r->dname);
	if (r->tensors[ti].nbytes > SIZE_MAX)
		return eng_err(r->errmsg, -ENOMEM, "tensor \"%s\": %llu bytes",
			       name, (ull)r->tensors[ti].nbytes);
	p = malloc(r->tensors[ti].nbytes ? (size_t)r->tensors[ti].nbytes : 1);
	if (!p)
		return eng_err(r->errmsg, -ENOMEM,
			       "tensor \"%s\": cannot allocate %llu bytes",
			       name, (ull)r->tensors[ti].nbytes);
	rc = ckpt_read(r, name, p, r->tensors[ti].nbytes);
	if (rc < 0) {
		free(p);
		return rc;
	}
	*out = p;
	if (nbytes)
		*nbytes = r->tensors[ti].nbytes;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Open                                                               */
/* ------------------------------------------------------------------ */

static int cmp_file_name(const void *a, const void *b, void *arg)
{
	const struct rd_file *f = arg;

	return strcmp(f[*(const size_t *)a].name, f[*(const size_t *)b].name);
}

static size_t rd_file_lookup(const ckpt_reader *r, const char *name)
{
	size_t lo = 0, hi = r->nfiles;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(r->files[r->files_by_name[mid]].name, name);

		if (c == 0)
			return r->files_by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return SIZE_MAX;
}

static int parse_shard_name(const char *s, uint32_t *host, uint32_t *file)
{
	unsigned h, f;
	int n = -1;
	char chk[32];

	if (sscanf(s, "h%5u-f%3u.shard%n", &h, &f, &n) != 2 || n < 0 ||
	    s[n] != 0)
		return -1;
	fmt_shard_name(h, f, chk);
	if (strcmp(chk, s) != 0)
		return -1;
	*host = h;
	*file = f;
	return 0;
}

static int cmp_stream(const void *a, const void *b, void *arg)
{
	const fmt_index *ix = arg;
	const fmt_tensor_entry *x = &ix->tensors[*(const size_t *)a];
	const fmt_tensor_entry *y = &ix->tensors[*(const size_t *)b];

	if (x->stream_offset != y->stream_offset)
		return x->stream_offset < y->stream_offset ? -1 : 1;
	return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Re-checks what later code indexes memory with. */
static int rd_check_index(ckpt_reader *r, uint32_t h, const char *iname)
{
	const fmt_index *ix = &r->hosts[h].ix;
	uint64_t pos = 0;

	if (ix->nfiles > FMT_MAX_FILES_PER_HOST || ix->nchunks >= UINT32_MAX)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: too many files or chunks", r->dname,
			       iname);
	for (size_t i = 0; i < ix->ntensors; i++) {
		const fmt_tensor_entry *te = &ix->tensors[i];
		size_t es = ckpt_dtype_size(te->dtype);
		uint64_t nb, gb;

		if (es == 0 || te->ndim > CKPT_MAX_NDIM || !te->name)
			goto bad_tensor;
		for (uint32_t d = 0; d < te->ndim; d++)
			if (te->offset[d] > te->shape[d] ||
			    te->extent[d] > te->shape[d] - te->offset[d])
				goto bad_tensor;
		if (fmt_shape_bytes(te->extent, te->ndim, es, &nb) < 0 ||
		    nb != te->nbytes ||
		    fmt_shape_bytes(te->shape, te->ndim, es, &gb) < 0 ||
		    te->stream_offset > ix->stream_bytes ||
		    te->nbytes > ix->stream_bytes - te->stream_offset)
			goto bad_tensor;
		continue;
bad_tensor:
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: tensor %zu has an inconsistent shape, "
			       "slice or stream range", r->dname, iname, i);
	}
	for (size_t c = 0; c < ix->nchunks; c++) {
		const fmt_chunk_entry *ce = &ix->chunks[c];
		const struct rd_file *f;

		if (ce->stream_offset != pos || ce->raw_len == 0 ||
		    ce->raw_len > FMT_MAX_CHUNK || ce->file >= ix->nfiles ||
		    ce->codec >= CKPT_CODEC_COUNT || ce->stored_len == 0 ||
		    ce->stored_len > fmt_codec_bound(ce->raw_len) ||
		    (ce->codec == CKPT_CODEC_NONE &&
		     ce->stored_len != ce->raw_len) ||
		    ce->file_offset % FMT_ALIGN != 0 ||
		    ce->file_offset < FMT_SHARD_HDR_SIZE)
			goto bad_chunk;
		f = &r->files[r->hosts[h].file_of[ce->file]];
		if (ce->file_offset > f->size ||
		    fmt_chunk_span(ce->stored_len) > f->size - ce->file_offset)
			goto bad_chunk;
		pos += ce->raw_len;
		continue;
bad_chunk:
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: chunk %zu is out of range or not "
			       "contiguous", r->dname, iname, c);
	}
	if (pos != ix->stream_bytes)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: chunks cover %llu bytes of a %llu-byte "
			       "stream", r->dname, iname, (ull)pos,
			       (ull)ix->stream_bytes);
	return 0;
}

static int rd_load_host(ckpt_reader *r, uint32_t h)
{
	struct rd_host *ho = &r->hosts[h];
	const fmt_file_entry *ie = ho->cm_index;
	char iname[32], err[ENG_ERRMSG_MAX];
	char *path = NULL;
	uint8_t *buf = NULL;
	size_t len = 0, nshards = ho->cm_nshards;
	int rc;

	fmt_index_name(h, iname);
	if (!ie || strcmp(ie->name, iname) != 0)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: the commit record lists no index of "
			       "host %u", r->dname, FMT_COMMIT_NAME, h);
	if (ie->size > FMT_MAX_META_BYTES + FMT_META_HDR_SIZE)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: the commit record says %llu bytes",
			       r->dname, iname, (ull)ie->size);
	path = eng_path("%s/%s", r->stepdir, iname);
	if (!path)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	rc = eng_read_file(path, ie->size, &buf, &len, err);
	if (rc == -ENOENT) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: missing (listed in %s)", r->dname, iname,
			     FMT_COMMIT_NAME);
		goto out;
	}
	if (rc == CKPT_E_CORRUPT) {
		rc = eng_err(r->errmsg, rc, "%s/%s: larger than the %llu bytes "
			     "the commit record says", r->dname, iname,
			     (ull)ie->size);
		goto out;
	}
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	if (len != ie->size) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %zu bytes, the commit record says %llu",
			     r->dname, iname, len, (ull)ie->size);
		goto out;
	}
	if (fmt_xxh3(buf, len) != ie->xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: checksum mismatch with the commit record",
			     r->dname, iname);
		goto out;
	}
	err[0] = 0;
	rc = fmt_index_decode(buf, len, &ho->ix, err, sizeof(err));
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc == CKPT_E_VERSION ? rc
				     : rc == -ENOMEM ? rc : CKPT_E_CORRUPT,
			     "%s/%s: %s", r->dname, iname, err);
		goto out;
	}
	ho->loaded = 1;
	if (ho->ix.step != r->step || ho->ix.host_index != h ||
	    ho->ix.host_count != r->nhosts) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: index of step %llu host %u of %u, the "
			     "commit record is step %llu with %u hosts",
			     r->dname, iname, (ull)ho->ix.step,
			     ho->ix.host_index, ho->ix.host_count,
			     (ull)r->step, r->nhosts);
		goto out;
	}
	if (ho->ix.nfiles != nshards || ho->ix.nfiles > FMT_MAX_FILES_PER_HOST) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: lists %zu shard files, the commit record "
			     "%zu", r->dname, iname, ho->ix.nfiles, nshards);
		goto out;
	}
	ho->file_of = calloc(ho->ix.nfiles + 1, sizeof(*ho->file_of));
	ho->by_stream = calloc(ho->ix.ntensors + 1, sizeof(*ho->by_stream));
	ho->gidx = calloc(ho->ix.ntensors + 1, sizeof(*ho->gidx));
	if (!ho->file_of || !ho->by_stream || !ho->gidx) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < ho->ix.nfiles; i++) {
		const fmt_file_entry *fe = &ho->ix.files[i];
		size_t k = rd_file_lookup(r, fe->name);
		struct rd_file *f = k == SIZE_MAX ? NULL : &r->files[k];

		if (!f || f->host != h || f->mapped || f->size != fe->size ||
		    f->xxh3 != fe->xxh3) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
				     "%s/%s: shard file %s disagrees with the "
				     "commit record (missing, duplicated, or "
				     "different size or checksum)",
				     r->dname, iname, fe->name);
			goto out;
		}
		f->mapped = 1;
		f->ixfile = (uint32_t)i;
		ho->file_of[i] = (uint32_t)k;
	}
	rc = rd_check_index(r, h, iname);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < ho->ix.ntensors; i++)
		ho->by_stream[i] = i;
	if (ho->ix.ntensors > 1)
		qsort_r(ho->by_stream, ho->ix.ntensors, sizeof(size_t),
			cmp_stream, &ho->ix);
out:
	free(buf);
	free(path);
	return rc;
}

struct rd_ent {
	const fmt_tensor_entry *te;
	uint32_t host;
	size_t idx;
};

static int cmp_ent(const void *a, const void *b)
{
	const struct rd_ent *x = a, *y = b;
	int c = strcmp(x->te->name, y->te->name);

	if (c)
		return c;
	return x->host < y->host ? -1 : x->host > y->host;
}

static int boxes_overlap(const fmt_tensor_entry *a, const fmt_tensor_entry *b)
{
	for (uint32_t d = 0; d < a->ndim; d++) {
		if (a->extent[d] == 0 || b->extent[d] == 0)
			return 0;
		if (a->offset[d] >= b->offset[d] + b->extent[d] ||
		    b->offset[d] >= a->offset[d] + a->extent[d])
			return 0;
	}
	return 1;
}

static int cmp_piece_dim(const void *a, const void *b, void *arg)
{
	uint32_t d = *(const uint32_t *)arg;
	const struct rd_piece *x = a, *y = b;

	if (x->te->offset[d] != y->te->offset[d])
		return x->te->offset[d] < y->te->offset[d] ? -1 : 1;
	return x->host < y->host ? -1 : x->host > y->host;
}

static int cmp_piece_host(const void *a, const void *b)
{
	const struct rd_piece *x = a, *y = b;

	return x->host < y->host ? -1 : x->host > y->host;
}

/* Slices of one name must not overlap: a sweep along the first dimension
 * in which they differ keeps the common shardings near-linear. */
static int rd_check_overlap(ckpt_reader *r, struct rd_tensor *t)
{
	struct rd_piece *p = &r->pieces[t->first];
	uint32_t n = t->npieces, d0 = 0;
	int rc = 0;

	if (n < 2)
		return 0;
	if (t->ndim == 0)
		return eng_err(r->errmsg, CKPT_E_MISMATCH,
			       "tensor \"%s\": scalar stored by hosts %u and %u",
			       t->name, p[0].host, p[1].host);
	for (d0 = 0; d0 < t->ndim; d0++) {
		uint32_t i;

		for (i = 1; i < n; i++)
			if (p[i].te->offset[d0] != p[0].te->offset[d0])
				break;
		if (i < n)
			break;
	}
	if (d0 == t->ndim)
		d0 = 0;
	qsort_r(p, n, sizeof(*p), cmp_piece_dim, &d0);
	for (uint32_t i = 0; i < n && rc == 0; i++) {
		uint64_t end = p[i].te->offset[d0] + p[i].te->extent[d0];

		for (uint32_t j = i + 1; j < n; j++) {
			if (p[j].te->offset[d0] >= end)
				break;
			if (boxes_overlap(p[i].te, p[j].te)) {
				rc = eng_err(r->errmsg, CKPT_E_MISMATCH,
					     "tensor \"%s\": slices stored by "
					     "hosts %u and %u overlap", t->name,
					     p[i].host, p[j].host);
				break;
			}
		}
	}
	qsort(p, n, sizeof(*p), cmp_piece_host);
	return rc;
}

static int rd_merge(ckpt_reader *r)
{
	struct rd_ent *e = NULL;
	size_t n = 0, k = 0;
	int rc = 0;

	for (uint32_t h = 0; h < r->nhosts; h++)
		n += r->hosts[h].ix.ntensors;
	e = calloc(n + 1, sizeof(*e));
	r->pieces = calloc(n + 1, sizeof(*r->pieces));
	r->tensors = calloc(n + 1, sizeof(*r->tensors));
	if (!e || !r->pieces || !r->tensors) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t h = 0; h < r->nhosts; h++) {
		for (size_t i = 0; i < r->hosts[h].ix.ntensors; i++) {
			e[k].te = &r->hosts[h].ix.tensors[i];
			e[k].host = h;
			e[k].idx = i;
			k++;
		}
	}
	if (n > 1)
		qsort(e, n, sizeof(*e), cmp_ent);
	r->npieces = n;
	for (size_t i = 0; i < n;) {
		struct rd_tensor *t = &r->tensors[r->ntensors];
		const fmt_tensor_entry *f = e[i].te;
		size_t j = i;
		uint64_t gb;

		t->name = f->name;
		t->dtype = f->dtype;
		t->ndim = f->ndim;
		t->shape = f->shape;
		t->first = i;
		fmt_shape_bytes(f->shape, f->ndim, ckpt_dtype_size(f->dtype),
				&gb);
		t->nbytes = gb;
		for (; j < n && strcmp(e[j].te->name, f->name) == 0; j++) {
			const fmt_tensor_entry *g = e[j].te;

			if (j > i && e[j].host == e[j - 1].host) {
				rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
					     "tensor \"%s\" listed twice by "
					     "host %u", f->name, e[j].host);
				goto out;
			}
			if (g->dtype != f->dtype || g->ndim != f->ndim ||
			    memcmp(g->shape, f->shape,
				   f->ndim * sizeof(uint64_t)) != 0) {
				rc = eng_err(r->errmsg, CKPT_E_MISMATCH,
					     "tensor \"%s\": host %u stores "
					     "%s with %u dims, host %u %s with "
					     "%u dims or another global shape",
					     f->name, e[i].host,
					     ckpt_dtype_name(f->dtype), f->ndim,
					     e[j].host,
					     ckpt_dtype_name(g->dtype), g->ndim);
				goto out;
			}
			r->pieces[j].host = e[j].host;
			r->pieces[j].te = g;
			r->hosts[e[j].host].gidx[e[j].idx] = r->ntensors;
		}
		if (j - i > UINT32_MAX) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT, "too many slices");
			goto out;
		}
		t->npieces = (uint32_t)(j - i);
		r->ntensors++;
		rc = rd_check_overlap(r, t);
		if (rc < 0)
			goto out;
		i = j;
	}
out:
	free(e);
	return rc;
}

/* Stats by codec, and chunk payload bytes attributed to tensors pro rata
 * of the bytes of each chunk they occupy. */
static void rd_stats(ckpt_reader *r)
{
	ckpt_stats *s = &r->stats;

	memset(s, 0, sizeof(*s));
	for (size_t i = 0; i < r->cm.nfiles; i++)
		s->file_bytes += r->cm.files[i].size;
	s->file_bytes += r->commit_size;
	for (uint32_t h = 0; h < r->nhosts; h++) {
		const struct rd_host *ho = &r->hosts[h];
		const fmt_index *ix = &ho->ix;
		size_t p = 0;

		for (size_t c = 0; c < ix->nchunks; c++) {
			const fmt_chunk_entry *ce = &ix->chunks[c];
			uint64_t cs = ce->stream_offset, cend = cs + ce->raw_len;
			uint64_t used = 0;
			size_t q;

			s->raw_bytes += ce->raw_len;
			s->stored_bytes += ce->stored_len;
			s->chunks++;
			s->chunks_by_codec[ce->codec]++;
			s->raw_by_codec[ce->codec] += ce->raw_len;
			s->stored_by_codec[ce->codec] += ce->stored_len;
			while (p < ix->ntensors) {
				const fmt_tensor_entry *te =
					&ix->tensors[ho->by_stream[p]];

				if (te->stream_offset + te->nbytes > cs)
					break;
				p++;
			}
			for (q = p; q < ix->ntensors; q++) {
				const fmt_tensor_entry *te =
					&ix->tensors[ho->by_stream[q]];
				uint64_t lo, hi;

				if (te->stream_offset >= cend)
					break;
				lo = max_u64(te->stream_offset, cs);
				hi = min_u64(te->stream_offset + te->nbytes,
					     cend);
				if (hi > lo)
					used += hi - lo;
			}
			if (used == 0)
				continue;
			for (q = p; q < ix->ntensors; q++) {
				size_t ti = ho->by_stream[q];
				const fmt_tensor_entry *te = &ix->tensors[ti];
				uint64_t lo, hi;

				if (te->stream_offset >= cend)
					break;
				lo = max_u64(te->stream_offset, cs);
				hi = min_u64(te->stream_offset + te->nbytes,
					     cend);
				if (hi > lo)
					r->tensors[ho->gidx[ti]].stored_bytes +=
						(uint64_t)((unsigned __int128)
							   ce->stored_len *
							   (hi - lo) / used);
			}
		}
	}
}

/* Reads COMMIT once: the document, and its size and hash for listings. */
static int rd_load_commit(ckpt_reader *r)
{
	char *path = eng_path("%s/" FMT_COMMIT_NAME, r->stepdir);
	char err[ENG_ERRMSG_MAX];
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	if (!path)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	rc = eng_read_file(path, FMT_MAX_META_BYTES + FMT_META_HDR_SIZE, &buf,
			   &len, err);
	if (rc == -ENOENT || rc == -ENOTDIR) {
		rc = eng_err(r->errmsg, CKPT_E_NOTFOUND,
			     "%s: step %llu is not committed (no %s/%s)",
			     r->root, (ull)r->step, r->dname,
			     FMT_COMMIT_NAME);
		goto out;
	}
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	err[0] = 0;
	rc = fmt_commit_decode(buf, len, &r->cm, err, sizeof(err));
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc == CKPT_E_VERSION || rc == -ENOMEM
				     ? rc : CKPT_E_CORRUPT,
			     "%s/%s: %s", r->dname, FMT_COMMIT_NAME, err);
		goto out;
	}
	r->cm_loaded = 1;
	if (r->cm.step != r->step) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: records step %llu", r->dname,
			     FMT_COMMIT_NAME, (ull)r->cm.step);
		goto out;
	}
	if (r->cm.host_count == 0 || r->cm.host_count > FMT_MAX_HOSTS) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT, "%s/%s: %u hosts",
			     r->dname, FMT_COMMIT_NAME, r->cm.host_count);
		goto out;
	}
	r->commit_size = len;
	r->commit_xxh3 = fmt_xxh3(buf, len);
out:
	free(buf);
	free(path);
	return rc;
}

static int rd_build_files(ckpt_reader *r)
{
	size_t n = 0;

	for (size_t i = 0; i < r->cm.nfiles; i++)
		if (r->cm.files[i].kind == CKPT_FILE_SHARD)
			n++;
	r->files = calloc(n + 1, sizeof(*r->files));
	r->files_by_name = calloc(n + 1, sizeof(*r->files_by_name));
	if (!r->files || !r->files_by_name)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		const fmt_file_entry *fe = &r->cm.files[i];
		struct rd_file *f;
		uint32_t h, fi;

		if (fe->kind != CKPT_FILE_SHARD)
			continue;
		f = &r->files[r->nfiles];
		f->fd = -1;
		if (parse_shard_name(fe->name, &h, &fi) < 0 || h != fe->host ||
		    h >= r->nhosts)
			return eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: bad shard file entry \"%.32s\"",
				       r->dname, FMT_COMMIT_NAME, fe->name);
		memcpy(f->name, fe->name, sizeof(f->name));
		f->name[sizeof(f->name) - 1] = 0;
		f->size = fe->size;
		f->xxh3 = fe->xxh3;
		f->host = h;
		f->findex = fi;
		f->path = eng_path("%s/%s", r->stepdir, f->name);
		if (!f->path)
			return eng_err(r->errmsg, -ENOMEM, "out of memory");
		r->files_by_name[r->nfiles] = r->nfiles;
		r->nfiles++;
	}
	if (r->nfiles > 1)
		qsort_r(r->files_by_name, r->nfiles, sizeof(size_t),
			cmp_file_name, r->files);
	for (size_t i = 1; i < r->nfiles; i++)
		if (strcmp(r->files[r->files_by_name[i]].name,
			   r->files[r->files_by_name[i - 1]].name) == 0)
			return eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: %s listed twice", r->dname,
				       FMT_COMMIT_NAME,
				       r->files[r->files_by_name[i]].name);
	return 0;
}

CKPT_API int ckpt_reader_open(ckpt_reader **out, const char *dir,
			      uint64_t step, const ckpt_settings *s)
{
	ckpt_reader *r;
	int rc;

	if (out)
		*out = NULL;
	if (!out || !dir)
		return eng_err(NULL, -EINVAL,
			       "ckpt_reader_open: out and dir are required");
	r = calloc(1, sizeof(*r));
	if (!r)
		return eng_err(NULL, -ENOMEM, "out of memory");
	r->qd = RD_DEFAULT_QD;
	r->threads = 0;
	if (s) {
		r->flags = s->flags;
		if (s->queue_depth)
			r->qd = s->queue_depth;
		r->threads = s->threads;
	}
	if (r->qd > RD_MAX_QD)
		r->qd = RD_MAX_QD;
	if (r->threads == 0)
		r->threads = eng_ncpus();
	if (r->threads > RD_MAX_THREADS)
		r->threads = RD_MAX_THREADS;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv_work, NULL);
	pthread_cond_init(&r->cv_done, NULL);
	r->sync_init = 1;
	r->root = strdup(dir);
	if (!r->root) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto fail;
	}
	if (step == CKPT_LATEST) {
		rc = eng_resolve_latest(dir, &step, r->errmsg);
		if (rc < 0)
			goto fail;
	}
	r->step = step;
	fmt_step_dirname(step, r->dname);
	r->stepdir = eng_path("%s/%s", dir, r->dname);
	if (!r->stepdir) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto fail;
	}
	rc = rd_load_commit(r);
	if (rc < 0)
		goto fail;
	r->nhosts = r->cm.host_count;
	r->hosts = calloc(r->nhosts, sizeof(*r->hosts));
	if (!r->hosts) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto fail;
	}
	rc = rd_build_files(r);
	if (rc < 0)
		goto fail;
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		const fmt_file_entry *fe = &r->cm.files[i];

		if (fe->host >= r->nhosts)
			continue; /* rejected by the format module */
		if (fe->kind == CKPT_FILE_INDEX)
			r->hosts[fe->host].cm_index = fe;
		else if (fe->kind == CKPT_FILE_SHARD)
			r->hosts[fe->host].cm_nshards++;
	}
	for (uint32_t h = 0; h < r->nhosts; h++) {
		rc = rd_load_host(r, h);
		if (rc < 0)
			goto fail;
	}
	for (size_t i = 0; i < r->nfiles; i++) {
		if (!r->files[i].mapped) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
				     "%s/%s: lists %s, which no index names",
				     r->dname, FMT_COMMIT_NAME,
				     r->files[i].name);
			goto fail;
		}
	}
	rc = rd_merge(r);
	if (rc < 0)
		goto fail;
	rd_stats(r);
	r->errmsg[0] = 0;
	*out = r;
	return 0;
fail:
	/* the thread-local message must survive the close */
	eng_err(NULL, rc, "%s", r->errmsg);
	ckpt_reader_close(r);
	return rc;
}

CKPT_API void ckpt_reader_close(ckpt_reader *r)
{
	if (!r)
		return;
	rd_stop_workers(r);
	if (r->ring_state == 1 || r->ring_state == -2)
		io_uring_queue_exit(&r->ring);
	rd_free_bufs(r);
	free(r->cache);
	for (size_t i = 0; i < r->nfiles; i++) {
		if (r->files[i].fd >= 0)
			eng_close(r->files[i].fd);
		free(r->files[i].path);
	}
	free(r->files);
	free(r->files_by_name);
	if (r->hosts) {
		for (uint32_t h = 0; h < r->nhosts; h++) {
			fmt_index_free(&r->hosts[h].ix);
			free(r->hosts[h].file_of);
			free(r->hosts[h].by_stream);
			free(r->hosts[h].gidx);
		}
		free(r->hosts);
	}
	free(r->tensors);
	free(r->pieces);
	if (r->cm_loaded)
		fmt_commit_free(&r->cm);
	if (r->sync_init) {
		pthread_mutex_destroy(&r->mu);
		pthread_cond_destroy(&r->cv_work);
		pthread_cond_destroy(&r->cv_done);
	}
	free(r->root);
	free(r->stepdir);
	free(r);
}

CKPT_API const char *ckpt_reader_errmsg(const ckpt_reader *r)
{
	return r ? r->errmsg : eng_tls_errmsg();
}

/* ------------------------------------------------------------------ */
/* Accessors                                                          */
/* ------------------------------------------------------------------ */

CKPT_API uint64_t ckpt_reader_step(const ckpt_reader *r)
{
	return r ? r->step : 0;
}

CKPT_API uint32_t ckpt_reader_host_count(const ckpt_reader *r)
{
	return r ? r->nhosts : 0;
}

CKPT_API int64_t ckpt_reader_commit_time(const ckpt_reader *r)
{
	return r ? r->cm.commit_unix_ns : 0;
}

CKPT_API size_t ckpt_reader_tensor_count(const ckpt_reader *r)
{
	return r ? r->ntensors : 0;
}

CKPT_API int ckpt_reader_tensor(const ckpt_reader *r, size_t i,
				ckpt_tensor_info *out)
{
	const struct rd_tensor *t;

	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_tensor: NULL argument");
	if (i >= r->ntensors)
		return eng_err((char *)r->errmsg, -EINVAL,
			       "tensor index %zu out of range (%zu tensors)", i,
			       r->ntensors);
	t = &r->tensors[i];
	memset(out, 0, sizeof(*out));
	out->name = t->name;
	out->dtype = t->dtype;
	out->ndim = t->ndim;
	out->shape = t->shape;
	out->nbytes = t->nbytes;
	out->slice_count = t->npieces;
	out->stored_bytes = t->stored_bytes;
	return 0;
}

CKPT_API int ckpt_reader_find(const ckpt_reader *r, const char *name,
			      size_t *index)
{
	size_t i;

	if (!r || !name)
		return eng_err(NULL, -EINVAL, "ckpt_reader_find: NULL argument");
	if (rd_find(r, name, &i) < 0)
		return eng_err((char *)r->errmsg, CKPT_E_NOTFOUND,
			       "no tensor \"%s\" in %s", name, r->dname);
	if (index)
		*index = i;
	return 0;
}

CKPT_API int ckpt_reader_slice(const ckpt_reader *r, size_t tensor,
			       uint32_t j, ckpt_slice_info *out)
{
	const struct rd_piece *p;

	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_slice: NULL argument");
	if (tensor >= r->ntensors || j >= r->tensors[tensor].npieces)
		return eng_err((char *)r->errmsg, -EINVAL,
			       "slice %u of tensor %zu out of range", j, tensor);
	p = &r->pieces[r->tensors[tensor].first + j];
	memset(out, 0, sizeof(*out));
	out->host = p->host;
	out->offset = p->te->offset;
	out->extent = p->te->extent;
	out->nbytes = p->te->nbytes;
	return 0;
}

CKPT_API size_t ckpt_reader_file_count(const ckpt_reader *r)
{
	return r ? r->cm.nfiles + 1 : 0;
}

CKPT_API int ckpt_reader_file(const ckpt_reader *r, size_t i,
			      ckpt_file_info *out)
{
	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_file: NULL argument");
	if (i > r->cm.nfiles)
		return eng_err((char *)r->errmsg, -EINVAL,
			       "file index %zu out of range (%zu files)", i,
			       r->cm.nfiles + 1);
	memset(out, 0, sizeof(*out));
	if (i == r->cm.nfiles) {
		out->name = FMT_COMMIT_NAME;
		out->size = r->commit_size;
		out->xxh3 = r->commit_xxh3;
		out->host = 0;
		out->kind = CKPT_FILE_COMMIT;
		return 0;
	}
	out->name = r->cm.files[i].name;
	out->size = r->cm.files[i].size;
	out->xxh3 = r->cm.files[i].xxh3;
	out->host = r->cm.files[i].host;
	out->kind = r->cm.files[i].kind;
	return 0;
}

CKPT_API int ckpt_reader_stats(const ckpt_reader *r, ckpt_stats *out)
{
	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_stats: NULL argument");
	*out = r->stats;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Verify                                                             */
/* ------------------------------------------------------------------ */

static int cmp_job_off(const void *a, const void *b)
{
	const struct rd_job *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

static int rd_progress(ckpt_reader *r, ckpt_progress_fn fn, void *arg,
		       uint64_t done, uint64_t total)
{
	if (fn && fn(arg, done, total) != 0)
		return eng_err(r->errmsg, CKPT_E_CANCELED,
			       "canceled by the progress callback");
	return 0;
}

/* A small file (COMMIT, index): size and hash. */
static int rd_verify_small(ckpt_reader *r, const char *name, uint64_t size,
			   uint64_t xxh3)
{
	char *path = eng_path("%s/%s", r->stepdir, name);
	char err[ENG_ERRMSG_MAX];
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	if (!path)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	rc = eng_read_file(path, size, &buf, &len, err);
	if (rc == -ENOENT)
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT, "%s/%s: missing",
			     r->dname, name);
	else if (rc == CKPT_E_CORRUPT)
		rc = eng_err(r->errmsg, rc, "%s/%s: larger than the %llu "
			     "bytes recorded", r->dname, name, (ull)size);
	else if (rc < 0)
		rc = eng_err(r->errmsg, rc, "%s", err);
	else if (len != size)
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %zu bytes, %llu recorded", r->dname, name,
			     len, (ull)size);
	else if (fmt_xxh3(buf, len) != xxh3)
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s offset 0: whole-file checksum mismatch",
			     r->dname, name);
	free(buf);
	free(path);
	return rc;
}

static int rd_verify_shard(ckpt_reader *r, size_t fi, uint64_t *done,
			   uint64_t total, ckpt_progress_fn fn, void *arg)
{
	struct rd_file *f = &r->files[fi];
	const struct rd_host *ho = &r->hosts[f->host];
	struct rd_batch b;
	fmt_shard_hdr want;
	char msg[ENG_ERRMSG_MAX];
	size_t n = 1;
	uint64_t expect = FMT_SHARD_HDR_SIZE;
	int rc, fd;

	memset(&b, 0, sizeof(b));
	fd = rd_file_fd(r, fi, msg, sizeof(msg));
	if (fd < 0)
		return eng_err(r->errmsg, fd, "%s", msg);
	for (size_t c = 0; c < ho->ix.nchunks; c++)
		if (ho->ix.chunks[c].file == f->ixfile)
			n++;
	b.jobs = calloc(n, sizeof(*b.jobs));
	b.hs = XXH3_createState();
	if (!b.jobs || !b.hs) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	XXH3_64bits_reset(b.hs);
	b.jobs[0].kind = JOB_SHARD_HDR;
	b.jobs[0].file = (uint32_t)fi;
	b.jobs[0].host = f->host;
	b.jobs[0].off = 0;
	b.jobs[0].len = FMT_SHARD_HDR_SIZE;
	n = 1;
	for (size_t c = 0; c < ho->ix.nchunks; c++) {
		const fmt_chunk_entry *ce = &ho->ix.chunks[c];
		struct rd_job *j;

		if (ce->file != f->ixfile)
			continue;
		j = &b.jobs[n++];
		j->kind = JOB_CHUNK;
		j->file = (uint32_t)fi;
		j->host = f->host;
		j->chunk = (uint32_t)c;
		j->off = ce->file_offset;
		j->len = fmt_chunk_span(ce->stored_len);
	}
	qsort(b.jobs + 1, n - 1, sizeof(*b.jobs), cmp_job_off);
	if (f->size < FMT_SHARD_HDR_SIZE) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %llu bytes, too small for a shard header",
			     r->dname, f->name, (ull)f->size);
		goto out;
	}
	for (size_t i = 1; i < n; i++) {
		const struct rd_job *j = &b.jobs[i];

		if (j->off != expect) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
				     "%s/%s offset %llu: chunks do not tile "
				     "the file (next chunk at %llu)", r->dname,
				     f->name, (ull)expect, (ull)j->off);
			goto out;
		}
		expect += j->len;
	}
	if (expect != f->size) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s offset %llu: %llu bytes after the last "
			     "chunk", r->dname, f->name, (ull)expect,
			     (ull)(f->size - expect));
		goto out;
	}
	want.step = r->step;
	memcpy(want.save_id, ho->ix.save_id, sizeof(want.save_id));
	want.host_index = f->host;
	want.host_count = r->nhosts;
	want.file_index = f->findex;
	b.njobs = n;
	b.ordered = 1;
	b.want_hdr = &want;
	b.pdone = done;
	b.ptotal = total;
	b.fn = fn;
	b.fnarg = arg;
	b.err_key = SIZE_MAX;
	rc = rd_pipeline(r, &b);
	if (b.canceled) {
		rc = eng_err(r->errmsg, CKPT_E_CANCELED,
			     "verify canceled by the progress callback");
		goto out;
	}
	if (b.err_code) {
		rc = eng_err(r->errmsg, b.err_code, "%s", b.err_msg);
		goto out;
	}
	if (rc < 0)
		goto out;
	if (XXH3_64bits_digest(b.hs) != f->xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: whole-file checksum mismatch (every "
			     "header and chunk checks out: the damage is in "
			     "padding)", r->dname, f->name);
		goto out;
	}
	rc = 0;
out:
	rd_batch_free(&b);
	return rc;
}

CKPT_API int ckpt_reader_verify(ckpt_reader *r, ckpt_progress_fn fn,
				void *arg)
{
	uint64_t total, done = 0;
	int rc;

	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_reader_verify: reader is NULL");
	total = r->commit_size;
	for (size_t i = 0; i < r->cm.nfiles; i++)
		total += r->cm.files[i].size;
	rc = rd_verify_small(r, FMT_COMMIT_NAME, r->commit_size,
			     r->commit_xxh3);
	if (rc < 0)
		return rc;
	done += r->commit_size;
	rc = rd_progress(r, fn, arg, done, total);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		const fmt_file_entry *fe = &r->cm.files[i];

		if (fe->kind == CKPT_FILE_INDEX) {
			rc = rd_verify_small(r, fe->name, fe->size, fe->xxh3);
			if (rc < 0)
				return rc;
			done += fe->size;
			rc = rd_progress(r, fn, arg, done, total);
		} else {
			size_t k = rd_file_lookup(r, fe->name);

			if (k == SIZE_MAX)
				return eng_err(r->errmsg, CKPT_E_CORRUPT,
					       "%s: unknown file", fe->name);
			rc = rd_verify_shard(r, k, &done, total, fn, arg);
		}
		if (rc < 0)
			return rc;
	}
	r->errmsg[0] = 0;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Copy                                                               */
/* ------------------------------------------------------------------ */

static int rd_copy_file(ckpt_reader *r, const char *dstdir,
			const fmt_file_entry *fe, uint8_t *buf,
			uint64_t *done, uint64_t total, ckpt_progress_fn fn,
			void *arg)
{
	char *src = eng_path("%s/%s", r->stepdir, fe->name);
	char *tmp = eng_path("%s/%s" FMT_TMP_SUFFIX, dstdir, fe->name);
	char *dst = eng_path("%s/%s", dstdir, fe->name);
	XXH3_state_t *hs = XXH3_createState();
	int in = -1, outfd = -1, rc;
	struct stat st;
	uint64_t off = 0;

	if (!src || !tmp || !dst || !hs) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	in = eng_open(src, O_RDONLY, 0);
	if (in < 0) {
		rc = in == -ENOENT
			     ? eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: missing", r->dname, fe->name)
			     : eng_err(r->errmsg, in, "%s: open: %s", src,
				       ckpt_strerror(in));
		goto out;
	}
	if (fstat(in, &st) < 0) {
		rc = eng_err(r->errmsg, -errno, "%s: stat: %s", src,
			     strerror(errno));
		goto out;
	}
	if ((uint64_t)st.st_size != fe->size) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %llu bytes, the commit record says %llu",
			     r->dname, fe->name, (ull)st.st_size,
			     (ull)fe->size);
		goto out;
	}
	outfd = eng_open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (outfd < 0) {
		rc = eng_err(r->errmsg, outfd, "%s: create: %s", tmp,
			     ckpt_strerror(outfd));
		goto out;
	}
	XXH3_64bits_reset(hs);
	while (off < fe->size) {
		size_t n = (size_t)min_u64(RD_COPY_BLOCK, fe->size - off);

		rc = eng_pread_all(in, buf, n, off);
		if (rc < 0) {
			rc = eng_err(r->errmsg, rc, "%s/%s offset %llu: read: "
				     "%s", r->dname, fe->name, (ull)off,
				     ckpt_strerror(rc));
			goto out;
		}
		XXH3_64bits_update(hs, buf, n);
		rc = eng_pwrite_all(outfd, buf, n, off);
		if (rc < 0) {
			rc = eng_err(r->errmsg, rc, "%s: write: %s", tmp,
				     ckpt_strerror(rc));
			goto out;
		}
		off += n;
		*done += n;
		rc = rd_progress(r, fn, arg, *done, total);
		if (rc < 0)
			goto out;
	}
	if (XXH3_64bits_digest(hs) != fe->xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: whole-file checksum mismatch while "
			     "copying", r->dname, fe->name);
		goto out;
	}
	rc = eng_fsync(outfd);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: fsync: %s", tmp,
			     ckpt_strerror(rc));
		goto out;
	}
	rc = eng_close(outfd);
	outfd = -1;
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: close: %s", tmp,
			     ckpt_strerror(rc));
		goto out;
	}
	rc = eng_rename(tmp, dst);
	if (rc < 0)
		rc = eng_err(r->errmsg, rc, "%s: rename: %s", tmp,
			     ckpt_strerror(rc));
out:
	if (outfd >= 0)
		eng_close(outfd);
	if (in >= 0)
		eng_close(in);
	XXH3_freeState(hs);
	free(src);
	free(tmp);
	free(dst);
	return rc;
}

CKPT_API int ckpt_reader_copy(ckpt_reader *r, const char *dst_root,
			      ckpt_progress_fn fn, void *arg)
{
	char *dstdir = NULL, *cpath = NULL;
	uint8_t *buf = NULL, *cbuf = NULL;
	size_t clen = 0;
	uint64_t total, done = 0, cur = 0;
	int rc, have_latest, created = 0;
	fmt_commit tmpcm;
	char err[ENG_ERRMSG_MAX];

	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_reader_copy: reader is NULL");
	if (!dst_root)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_reader_copy: dst_root is NULL");
	rc = eng_mkdir(dst_root, 0755);
	if (rc < 0)
		return eng_err(r->errmsg, rc, "%s: mkdir: %s", dst_root,
			       ckpt_strerror(rc));
	rc = eng_load_commit(dst_root, r->step, &tmpcm, NULL);
	if (rc == 0) {
		fmt_commit_free(&tmpcm);
		return eng_err(r->errmsg, CKPT_E_EXISTS,
			       "%s: step %llu is already committed there",
			       dst_root, (ull)r->step);
	}
	rc = eng_resolve_latest(dst_root, &cur, NULL);
	have_latest = rc == 0;
	dstdir = eng_path("%s/%s", dst_root, r->dname);
	cpath = eng_path("%s/" FMT_COMMIT_NAME, r->stepdir);
	buf = malloc(RD_COPY_BLOCK);
	if (!dstdir || !cpath || !buf) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	rc = eng_mkdir(dstdir, 0755);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: mkdir: %s", dstdir,
			     ckpt_strerror(rc));
		goto out;
	}
	created = 1;
	rc = eng_fsync_dir(dst_root);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: fsync: %s", dst_root,
			     ckpt_strerror(rc));
		goto out;
	}
	total = r->commit_size;
	for (size_t i = 0; i < r->cm.nfiles; i++)
		total += r->cm.files[i].size;
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		rc = rd_copy_file(r, dstdir, &r->cm.files[i], buf, &done,
				  total, fn, arg);
		if (rc < 0)
			goto out;
	}
	rc = eng_fsync_dir(dstdir);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s: fsync: %s", dstdir,
			     ckpt_strerror(rc));
		goto out;
	}
	rc = eng_read_file(cpath, r->commit_size, &cbuf, &clen, err);
	if (rc < 0 || clen != r->commit_size ||
	    fmt_xxh3(cbuf, clen) != r->commit_xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: changed since the reader opened it",
			     r->dname, FMT_COMMIT_NAME);
		goto out;
	}
	rc = eng_write_file_atomic(dstdir, FMT_COMMIT_NAME, cbuf, clen, err);
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	created = 0; /* committed: never remove it now */
	done += clen;
	if (!have_latest || cur < r->step) {
		rc = eng_write_latest(dst_root, r->step, err);
		if (rc < 0) {
			rc = eng_err(r->errmsg, rc, "%s", err);
			goto out;
		}
	}
	rc = rd_progress(r, fn, arg, done, total);
	if (rc == CKPT_E_CANCELED)
		rc = 0; /* too late to cancel: the copy is committed */
	if (rc == 0)
		r->errmsg[0] = 0;
out:
	if (rc < 0 && created) {
		char saved[ENG_ERRMSG_MAX];

		memcpy(saved, r->errmsg, sizeof(saved));
		eng_remove_tree(dstdir, NULL);
		eng_err(r->errmsg, rc, "%s", saved);
	}
	free(cbuf);
	free(buf);
	free(cpath);
	free(dstdir);
	return rc;
}
