/*
 * reader_pipeline.c - the machinery that executes a batch of jobs: the
 * shard-file descriptor cache, the pool of aligned chunk buffers, io_uring
 * submission and reaping on the calling thread; the worker threads that
 * check, decode and scatter chunks are in reader_worker.c.
 *
 * Locking: r->mu guards the work queue, the buffer free list, r->busy and
 * the current batch's failure fields (stop, fatal, err_*, reqs[].status).
 * Everything else (the ring, the fd cache, job read state) belongs to the
 * calling thread. A buffer is owned by exactly one of: the free list, a job
 * being read, a job queued or being processed by a worker.
 *
 * Errors: a request fails alone (rd_req_fail), a chunk fails the requests
 * it feeds or, in ordered batches, stops the batch (rd_job_fail), and a
 * pipeline failure stops everything (rd_fatal). The message kept is the
 * one of the lowest request (or job) index, so it does not depend on
 * thread timing. The data path is described in reader_internal.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "reader_internal.h"

#define RD_BUF_BUDGET (128ull << 20) /* chunk buffers per reader */
#define RD_RETRY_MAX 3               /* EAGAIN results before a pread */
#define RD_CANCEL_TAG UINT64_MAX     /* user_data of a cancel request */

/* ------------------------------------------------------------------ */
/* Shard files                                                        */
/* ------------------------------------------------------------------ */

static void rd_count(atomic_ullong *n, unsigned long long k)
{
	atomic_fetch_add_explicit(n, k, memory_order_relaxed);
}

void eng_reader_io_stats_get(const ckpt_reader *r, eng_reader_io_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!r)
		return;
	out->uring_reads = atomic_load(&r->io_st.uring_reads);
	out->pread_reads = atomic_load(&r->io_st.pread_reads);
	out->direct_files = atomic_load(&r->io_st.direct_files);
	out->uring_fallbacks = atomic_load(&r->io_st.uring_fallbacks);
	out->uring_stalls = atomic_load(&r->io_st.uring_stalls);
}

/* See rd_ring_stalled. */
static atomic_uint stall_ms = 30000;

/* Buffers of reads a stalled ring never returned: the kernel may still
 * write there, so they are kept, reachable, for the process's life. */
static pthread_mutex_t lost_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t **lost_bufs;
static size_t nlost_bufs;

static void rd_keep_lost(uint8_t *buf)
{
	uint8_t **n;

	pthread_mutex_lock(&lost_mu);
	n = realloc(lost_bufs, (nlost_bufs + 1) * sizeof(*n));
	if (n) {
		lost_bufs = n;
		lost_bufs[nlost_bufs++] = buf;
	}
	pthread_mutex_unlock(&lost_mu);
}

void eng_reader_stall_ms_set(unsigned ms)
{
	atomic_store(&stall_ms, ms ? ms : 30000);
}

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
int rd_file_fd(ckpt_reader *r, size_t i, char *msg, size_t len)
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
		if (fd == -ENOENT && f->is_ref) { /* dedup: SPEC 16 */
			snprintf(msg, len,
				 "step %llu refers to step %llu/%s: "
				 "missing",
				 (ull)r->step, (ull)f->ref_step, f->name);
			return CKPT_E_CORRUPT;
		}
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
	if (direct)
		rd_count(&r->io_st.direct_files, 1);
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
	rd_count(&r->io_st.pread_reads, 1);
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

void rd_req_fail(ckpt_reader *r, struct rd_batch *b, size_t req, int code,
		 const char *msg)
{
	pthread_mutex_lock(&r->mu);
	if (b->reqs[req].status == 0)
		b->reqs[req].status = code;
	rd_note_locked(b, req, code, msg);
	pthread_mutex_unlock(&r->mu);
}

/* A job failed: every request it feeds fails (reads); verify stops. */
void rd_job_fail(ckpt_reader *r, struct rd_batch *b,
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

void rd_fatal(ckpt_reader *r, struct rd_batch *b, int code, const char *msg)
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
int rd_job_dead(ckpt_reader *r, struct rd_batch *b, const struct rd_job *j)
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
/* The pipeline (calling thread)                                      */
/* ------------------------------------------------------------------ */

void rd_free_bufs(ckpt_reader *r)
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

void rd_stop_workers(ckpt_reader *r, int in_child)
{
	if (!r->workers)
		return;
	if (!in_child) {
		pthread_mutex_lock(&r->mu);
		r->stop = 1;
		pthread_cond_broadcast(&r->cv_work);
		pthread_mutex_unlock(&r->mu);
	}
	for (unsigned i = 0; i < r->nworkers; i++) {
		if (!in_child)
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
		uint8_t **bufs, **freeb;
		size_t *queue;

		lim = (size_t)(RD_BUF_BUDGET / need);
		if (lim < r->threads + 1u)
			lim = r->threads + 1u;
		if (lim < 2)
			lim = 2;
		if (maxb > lim)
			maxb = lim;
		if (maxb < 2)
			maxb = 2;
		bufs = calloc(maxb, sizeof(*bufs));
		freeb = calloc(maxb, sizeof(*freeb));
		queue = calloc(maxb, sizeof(*queue));
		if (!bufs || !freeb || !queue) {
			free(bufs);
			free(freeb);
			free(queue);
			return -ENOMEM;
		}
		/* Workers from an earlier batch are idle but wake (spuriously
		 * too) and read the queue under r->mu: swap it under r->mu. */
		pthread_mutex_lock(&r->mu);
		rd_free_bufs(r);
		r->bufs = bufs;
		r->freeb = freeb;
		r->queue = queue;
		r->maxbufs = r->qcap = maxb;
		r->bufsize = (size_t)need;
		r->qhead = r->qlen = 0;
		pthread_mutex_unlock(&r->mu);
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
	if (r->ring_state == 0 && !(r->flags & CKPT_F_NO_URING) && !r->loc) {
		r->ring_state =
			eng_uring_queue_init(r->qd, &r->ring, 0) == 0 ? 1 : -1;
		if (r->ring_state < 0)
			rd_count(&r->io_st.uring_fallbacks, 1);
	}
	return 0;
}

/* A free buffer, a new one while under the cap, or NULL (*err set on
 * allocation failure with nothing to wait for). */
uint8_t *rd_buf_get(ckpt_reader *r, int *err)
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

void rd_buf_put(ckpt_reader *r, uint8_t *b)
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
void rd_job_abort(ckpt_reader *r, struct rd_batch *b, struct rd_job *j,
		  int code, const char *msg)
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
	rd_io_msg(r, b, j, msg, sizeof(msg), what);
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
void rd_complete(ckpt_reader *r, struct rd_batch *b, struct rd_job *j)
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
		rc = eng_uring_submit(&r->ring);
	while (rc == -EINTR);
	if (rc < 0)
		return rc;
	if (rc == 0) /* not taken: no completion will come for it */
		return -EAGAIN;
	j->in_ring = 1;
	f->inflight++;
	rd_count(&r->io_st.uring_reads, 1);
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
	j->in_ring = 0;
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
		rd_io_msg(r, b, j, msg, sizeof(msg), what);
		rd_job_abort(r, b, j, CKPT_E_CORRUPT, msg);
		return;
	}
	if (res > 0)
		j->done += (uint64_t)res;
	j->retries = res == -EAGAIN ? (uint8_t)(j->retries + 1) : 0;
	if (j->done < j->len) {
		int rc;

		/* a ring that keeps answering EAGAIN gets a blocking pread */
		if (res == -EINVAL || b->ring_broken ||
		    j->retries > RD_RETRY_MAX ||
		    (f->direct && (j->done % FMT_ALIGN) != 0)) {
			rc = rd_read_rest(r, j);
		} else {
			rc = rd_submit(r, j, (size_t)idx);
			if (rc == 0) {
				(*inflight)++;
				return;
			}
			b->ring_broken = 1;
			rd_count(&r->io_st.uring_fallbacks, 1);
			rc = rd_read_rest(r, j);
		}
		if (rc < 0) {
			rd_io_fail(r, b, j, rc);
			return;
		}
	}
	rd_complete(r, b, j);
}

int rd_wait_workers(ckpt_reader *r, struct rd_batch *b, size_t next)
{
	pthread_mutex_lock(&r->mu);
	if (b->stop || next >= b->njobs) {
		while (r->busy > 0)
			pthread_cond_wait(&r->cv_done, &r->mu);
		pthread_mutex_unlock(&r->mu);
		return 1;
	}
	while (r->nfree == 0 && r->nbufs >= r->maxbufs && r->busy > 0)
		pthread_cond_wait(&r->cv_done, &r->mu);
	if (r->nfree == 0 && r->nbufs >= r->maxbufs) {
		/* nothing will free a buffer: cannot happen */
		pthread_mutex_unlock(&r->mu);
		rd_fatal(r, b, -EDEADLK, "reader: read pipeline stalled");
		return 0;
	}
	pthread_mutex_unlock(&r->mu);
	return 0;
}

/* A job that will not be read: it fails, and an ordered batch's cursor
 * moves past it. */
static void rd_job_drop(ckpt_reader *r, struct rd_batch *b, struct rd_job *j,
			int code, const char *msg)
{
	rd_job_abort(r, b, j, code, msg);
	if (b->ordered)
		rd_complete(r, b, j);
}

/* The rest of job j with pread, then complete (or fail) it. */
static void rd_job_pread(ckpt_reader *r, struct rd_batch *b, struct rd_job *j)
{
	int err = rd_read_rest(r, j);

	if (err < 0) {
		rd_io_fail(r, b, j, err);
		if (b->ordered)
			rd_complete(r, b, j);
	} else {
		rd_complete(r, b, j);
	}
}

/*
 * No read came back for stall_ms with reads in the ring: the kernel stopped
 * serving them (a stuck device or driver, a kernel bug; one CI machine hung
 * a verify this way). Waiting on would hang the restore for good, so:
 *   1. cancel every read in the ring and collect, for up to a second,
 *      those that come back (their buffers are ours again);
 *   2. a read that does not come back keeps its buffer forever, out of the
 *      pool (the kernel may still write there), and the ring is kept,
 *      unused, until ckpt_reader_close;
 *   3. the descriptors of the files concerned are closed, and every job
 *      that was in the ring is read again from its start of the chunk
 *      with pread on a fresh descriptor; the reader uses pread from then on.
 */
static void rd_ring_stalled(ckpt_reader *r, struct rd_batch *b, size_t next,
			    size_t *inflight)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
	int64_t until = eng_mono_ns() + 1000000000;
	size_t lost = 0;

	rd_count(&r->io_st.uring_stalls, 1);
	if (sqe) {
		io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
		io_uring_sqe_set_data64(sqe, RD_CANCEL_TAG);
		(void)eng_uring_submit(&r->ring);
	}
	while (*inflight > 0 && eng_mono_ns() < until) {
		struct __kernel_timespec ts = { .tv_nsec = 50000000 };
		struct io_uring_cqe *cqe;
		uint64_t idx;
		int w = io_uring_wait_cqe_timeout(&r->ring, &cqe, &ts);

		if (w == -ETIME || w == -EINTR)
			continue;
		if (w < 0)
			break;
		idx = io_uring_cqe_get_data64(cqe);
		io_uring_cqe_seen(&r->ring, cqe);
		if (idx >= b->njobs || !b->jobs[idx].in_ring)
			continue; /* the cancel's own answer */
		b->jobs[idx].in_ring = 0;
		r->files[b->jobs[idx].file].inflight--;
		(*inflight)--;
	}
	for (size_t i = 0; i < next; i++) {
		struct rd_job *j = &b->jobs[i];
		struct rd_file *f = &r->files[j->file];

		if (!j->in_ring)
			continue;
		/* its buffer leaves the pool for good (never freed) */
		rd_keep_lost(j->buf);
		pthread_mutex_lock(&r->mu);
		for (size_t k = 0; k < r->nbufs; k++) {
			if (r->bufs[k] == j->buf) {
				r->bufs[k] = r->bufs[--r->nbufs];
				break;
			}
		}
		pthread_mutex_unlock(&r->mu);
		j->buf = NULL;
		lost++;
		if (f->fd >= 0) {
			eng_close(f->fd);
			f->fd = -1;
		}
		f->inflight = 0;
	}
	*inflight = 0;
	b->ring_broken = 1;
	if (lost)
		r->ring_state = -3;
	/* read again, with pread, every job that was in the ring */
	for (size_t i = 0; i < next; i++) {
		struct rd_job *j = &b->jobs[i];
		char msg[ENG_ERRMSG_MAX];
		int fd, err;

		if (j->ready || j->failed)
			continue;
		if (!j->buf) {
			j->buf = rd_buf_get(r, &err);
			if (!j->buf) {
				rd_job_drop(r, b, j, err ? err : -ENOMEM,
					    "reader: no buffer to read again "
					    "after a stalled io_uring");
				continue;
			}
		}
		j->done = 0;
		fd = rd_file_fd(r, j->file, msg, sizeof(msg));
		if (fd < 0)
			rd_job_drop(r, b, j, fd, msg);
		else
			rd_job_pread(r, b, j);
	}
}

/* The DIR range source: io_uring reads on the fd cache (or preads when
 * the ring is unusable). Returns 1 when the ring died with reads in
 * flight. */
static int rd_uring_run(ckpt_reader *r, struct rd_batch *b, int use_ring,
			unsigned depth)
{
	size_t next = 0, inflight = 0;
	int stop, ring_dead = 0;
	int64_t last_cqe = eng_mono_ns();
	char msg[ENG_ERRMSG_MAX];

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
				rd_job_drop(r, b, j, fd, msg);
				continue;
			}
			if (use_ring && !b->ring_broken) {
				err = rd_submit(r, j, (size_t)(j - b->jobs));
				if (err == 0) {
					inflight++;
					continue;
				}
				b->ring_broken = 1;
				rd_count(&r->io_st.uring_fallbacks, 1);
			}
			rd_job_pread(r, b, j);
			pthread_mutex_lock(&r->mu);
			stop = b->stop;
			pthread_mutex_unlock(&r->mu);
		}
		if (inflight == 0) {
			if (rd_wait_workers(r, b, next))
				break;
			continue;
		}
		{
			struct io_uring_cqe *cqe;
			unsigned lim = atomic_load(&stall_ms);
			struct __kernel_timespec ts = {
				.tv_sec = lim < 1000 ? 0 : 1,
				.tv_nsec = lim < 1000 ? lim * 1000000L : 0,
			};
			int w = io_uring_wait_cqe_timeout(&r->ring, &cqe, &ts);

			if (w == -ETIME &&
			    eng_mono_ns() - last_cqe >= (int64_t)lim * 1000000) {
				rd_ring_stalled(r, b, next, &inflight);
				continue;
			}
			if (w == -EINTR || w == -EAGAIN || w == -ETIME)
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
			last_cqe = eng_mono_ns();
			do {
				rd_reap_one(r, b, cqe, &inflight);
				io_uring_cqe_seen(&r->ring, cqe);
			} while (inflight > 0 &&
				 io_uring_peek_cqe(&r->ring, &cqe) == 0);
		}
	}
	return ring_dead;
}

int rd_pipeline(ckpt_reader *r, struct rd_batch *b)
{
	unsigned depth;
	int use_ring, rc = 0, ring_dead = 0;
	char msg[ENG_ERRMSG_MAX];

	if (b->njobs == 0)
		return 0;
	if (r->ring_state == -2) {
		/* rd_prepare could free buffers the kernel still writes */
		rd_fatal(r, b, -EIO, "reader: reads of an earlier batch are "
			 "still in flight after an io_uring failure; close "
			 "and reopen the reader");
		return -EIO;
	}
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
	if (r->loc)
		rd_gcs_run(r, b);
	else
		ring_dead = rd_uring_run(r, b, use_ring, depth);

	if (ring_dead) {
		/* reads may still land in their buffers: never reuse those,
		 * nor the ring (both are freed by ckpt_reader_close) */
		r->ring_state = -2;
		pthread_mutex_lock(&r->mu);
		r->maxbufs = r->nbufs;
		pthread_mutex_unlock(&r->mu);
	} else if (b->ring_broken && r->ring_state == 1) {
		eng_uring_queue_exit(&r->ring);
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
	/* jobs already handed on (only a dead ring leaves the loop with
	 * some): the workers use b until they are done */
	while (r->busy > 0)
		pthread_cond_wait(&r->cv_done, &r->mu);
	r->batch = NULL;
	rc = b->fatal;
	pthread_mutex_unlock(&r->mu);
	return rc;
}

void rd_batch_free(struct rd_batch *b)
{
	free(b->jobs);
	free(b->tg);
	free(b->tmap);
	if (b->hs)
		XXH3_freeState(b->hs);
}

