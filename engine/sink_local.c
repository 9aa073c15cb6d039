/*
 * sink_local.c - the local shard-file sink: this host's shard files under
 * ROOT/step-N, written through io_uring (or pwrite when there is no ring).
 *
 * Design note. The writer (writer.c) calls this sink only through
 * eng_sink_ops, from its own thread; the sink calls back only into the
 * pool (eng_sink_release, eng_job_fail). Each file is created as NAME.tmp
 * (O_DIRECT when the root supports it, preallocated to its planned size),
 * the shard headers and chunks are written at the offsets the writer gave
 * them, and at finish every file is trimmed, fdatasync'ed, closed and
 * renamed to its final name. The host index is published atomically after
 * that. A short write is continued from where it stopped (the file drops
 * O_DIRECT if the remainder is unaligned); an error fails the save, and
 * abort removes this save's files.
 *
 * Stall guard (ls_stalled). A write the kernel takes and never completes
 * (a stuck device or driver, a kernel bug) would hang the save for good:
 * the writer waits until every buffer is back. So when writes are in
 * flight and none came back for stall_ms (30 s), the sink cancels
 * everything in the ring and collects for a second. A cancelled write did
 * nothing and the kernel let go of its buffer: it is written again with
 * pwrite and the save goes on. A write that does not come back even then
 * may still land, later, at its offset: rewriting it and committing would
 * let that late write put whatever the buffer holds by then (the pool
 * reuses it for other chunks) into a committed file. So that save fails;
 * its files are unlinked, where a late write is harmless, and its buffers
 * go back to the pool (the kernel only reads them). Either way the ring
 * is abandoned for the handle's life (pwrite from then on, as after a
 * hard ring error): a completion still to come carries a buffer pointer
 * as user_data and must never be taken for a newer write of that buffer.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "save_internal.h"

typedef struct local_sink {
	eng_sink base;
	eng_job *job;
	uint32_t nfiles;
	int *fd;
	int *buffered; /* O_DIRECT dropped after an unaligned short write */
	char **tmp, **fin;
	eng_buf *hdr; /* pseudo chunks for the shard headers */
	eng_buf *pend_head, *pend_tail; /* not yet in the ring */
	eng_buf *sq_head, *sq_tail; /* in the ring, not taken by the kernel */
	unsigned nsq;
	unsigned inflight;   /* taken by the kernel, completion pending */
	int64_t progress_ns; /* last completion, or first entry taken */
	int uring, direct, prealloc;
	int failed;
	int renamed, published;
} local_sink;

#define LS_STALL_MS_DEFAULT 30000
/* user_data of the stall guard's own entries (no eng_buf lives at 1) */
#define LS_CANCEL_TAG 1

/* See ls_stalled. */
static atomic_uint stall_ms = LS_STALL_MS_DEFAULT;

void eng_writer_stall_ms_set(unsigned ms)
{
	atomic_store(&stall_ms, ms ? ms : LS_STALL_MS_DEFAULT);
}

unsigned eng_writer_stall_ms(void)
{
	return atomic_load(&stall_ms);
}

static void ls_clear(local_sink *ls)
{
	uint32_t f;

	for (f = 0; f < ls->nfiles; f++) {
		if (ls->fd && ls->fd[f] >= 0)
			eng_close(ls->fd[f]);
		if (ls->tmp)
			free(ls->tmp[f]);
		if (ls->fin)
			free(ls->fin[f]);
	}
	free(ls->fd);
	free(ls->buffered);
	free(ls->tmp);
	free(ls->fin);
	free(ls->hdr);
	ls->fd = ls->buffered = NULL;
	ls->tmp = ls->fin = NULL;
	ls->hdr = NULL;
	ls->nfiles = 0;
	ls->job = NULL;
	ls->pend_head = ls->pend_tail = NULL;
	ls->sq_head = ls->sq_tail = NULL;
	ls->nsq = 0;
	ls->inflight = 0;
	ls->failed = ls->renamed = ls->published = 0;
}

static int ls_fail_write(local_sink *ls, eng_buf *b, int r, uint64_t off,
			 size_t len)
{
	eng_job *job = ls->job;

	ls->failed = 1;
	if (b->is_hdr)
		return eng_job_fail(ls->base.c, job, r,
				    "%s: writing the shard header: %s",
				    ls->tmp[b->file], ckpt_strerror(r));
	return eng_job_fail(ls->base.c, job, r,
			    "%s: write of %zu bytes at offset %llu (chunk at "
			    "stream offset %llu): %s",
			    ls->tmp[b->file], len, (unsigned long long)off,
			    (unsigned long long)b->k * job->chunk_bytes,
			    ckpt_strerror(r));
}

static void ls_done(local_sink *ls, eng_buf *b)
{
	struct ckpt *c = ls->base.c;

	if (b->is_hdr)
		return;
	pthread_mutex_lock(&c->mu);
	c->bytes_written += b->payload;
	c->bytes_stored += b->span;
	pthread_mutex_unlock(&c->mu);
	eng_sink_release(&ls->base, b);
}

static void ls_drop(local_sink *ls, eng_buf *b)
{
	if (!b->is_hdr)
		eng_sink_release(&ls->base, b);
}

static void q_push(eng_buf **head, eng_buf **tail, eng_buf *b, int front)
{
	b->io_next = NULL;
	if (!*head) {
		*head = *tail = b;
	} else if (front) {
		b->io_next = *head;
		*head = b;
	} else {
		(*tail)->io_next = b;
		*tail = b;
	}
}

static eng_buf *q_pop(eng_buf **head, eng_buf **tail)
{
	eng_buf *b = *head;

	if (b) {
		*head = b->io_next;
		if (!*head)
			*tail = NULL;
		b->io_next = NULL;
	}
	return b;
}

static void ls_enqueue(local_sink *ls, eng_buf *b, int front)
{
	q_push(&ls->pend_head, &ls->pend_tail, b, front);
}

/* pwrite of what is left of b (all of it, or the rest of a short write). */
static void ls_sync_write(local_sink *ls, eng_buf *b)
{
	uint64_t off = b->file_offset + b->io_done;
	size_t len = (size_t)(b->span - b->io_done);
	int r = eng_pwrite_all(ls->fd[b->file], b->p + b->io_done, len, off);

	atomic_fetch_add_explicit(&ls->base.c->io_st.pwrite_writes, 1,
				  memory_order_relaxed);
	if (r < 0) {
		ls_fail_write(ls, b, r, off, len);
		ls_drop(ls, b);
		return;
	}
	ls_done(ls, b);
}

/* Clears O_DIRECT on file f (pwrite continues at unaligned offsets). */
static int ls_go_buffered(local_sink *ls, uint32_t f)
{
	int fd = ls->fd[f], fl, r;

	if (!ls->direct || ls->buffered[f] || fd < 0)
		return 0;
	fl = eng_fcntl(fd, F_GETFL, 0);
	r = fl < 0 ? fl : eng_fcntl(fd, F_SETFL, fl & ~O_DIRECT);
	if (r < 0) {
		ls->failed = 1;
		return eng_job_fail(ls->base.c, ls->job, r,
				    "%s: fcntl clearing O_DIRECT: %s",
				    ls->tmp[f], ckpt_strerror(r));
	}
	ls->buffered[f] = 1;
	return 0;
}

static int ls_begin(eng_sink *s, eng_job *job)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;
	uint32_t f, n = job->nfiles;
	int r;

	ls_clear(ls);
	ls->job = job;
	/* after a hard ring error the handle stays on pwrite, which cannot
	 * continue short O_DIRECT writes at unaligned offsets */
	ls->uring = c->have_ring && !c->ring_broken;
	ls->direct = c->direct && ls->uring;
	ls->prealloc = 0;
	ls->fd = malloc(n * sizeof(*ls->fd));
	ls->buffered = calloc(n, sizeof(*ls->buffered));
	ls->tmp = calloc(n, sizeof(*ls->tmp));
	ls->fin = calloc(n, sizeof(*ls->fin));
	ls->hdr = calloc(n, sizeof(*ls->hdr));
	if (!ls->fd || !ls->buffered || !ls->tmp || !ls->fin || !ls->hdr) {
		free(ls->fd);
		ls->fd = NULL;
		return eng_job_fail(c, job, -ENOMEM, "out of memory");
	}
	ls->nfiles = n;
	for (f = 0; f < n; f++)
		ls->fd[f] = -1;
	for (f = 0; f < n; f++) {
		ls->tmp[f] = eng_path("%s/%s" FMT_TMP_SUFFIX, job->stepdir,
				      job->files[f].name);
		ls->fin[f] =
			eng_path("%s/%s", job->stepdir, job->files[f].name);
		if (!ls->tmp[f] || !ls->fin[f])
			return eng_job_fail(c, job, -ENOMEM, "out of memory");
	}
	for (f = 0; f < n; f++) {
		int fd = eng_open(ls->tmp[f],
				  O_WRONLY | O_CREAT | O_TRUNC |
					  (ls->direct ? O_DIRECT : 0),
				  0644);

		if (fd < 0)
			return eng_job_fail(c, job, fd, "%s: create: %s",
					    ls->tmp[f], ckpt_strerror(fd));
		ls->fd[f] = fd;
		if (ls->direct)
			atomic_fetch_add_explicit(&c->io_st.direct_files, 1,
						  memory_order_relaxed);
		/* Writes inside the file size run concurrently on ext4/xfs;
		 * extending O_DIRECT writes are serialized and synchronous.
		 * The planned size is an upper bound (raw spans), trimmed at
		 * finish. Only an optimization: failure is ignored. */
		if (ls->direct &&
		    eng_fallocate(fd, 0, 0, (off_t)job->file_cap[f]) == 0)
			ls->prealloc = 1;
	}
	for (f = 0; f < n; f++) {
		eng_buf *h = &ls->hdr[f];

		h->p = job->hdrs + (size_t)f * FMT_SHARD_HDR_SIZE;
		h->cap = h->span = FMT_SHARD_HDR_SIZE;
		h->fixed = -1;
		h->is_hdr = 1;
		h->file = f;
		h->file_offset = 0;
		h->io_done = 0;
		if (ls->uring) {
			ls_enqueue(ls, h, 0);
		} else {
			r = eng_pwrite_all(ls->fd[f], h->p, h->span, 0);
			if (r < 0)
				return ls_fail_write(ls, h, r, 0, h->span);
		}
	}
	return 0;
}

static void ls_put(eng_sink *s, eng_buf *b)
{
	local_sink *ls = (local_sink *)s;

	b->io_done = 0;
	if (ls->failed)
		ls_drop(ls, b);
	else if (ls->uring)
		ls_enqueue(ls, b, 0);
	else
		ls_sync_write(ls, b);
}

static void ls_complete(local_sink *ls, eng_buf *b, long res, int failed)
{
	int fd = ls->fd[b->file];
	uint64_t off = b->file_offset + b->io_done;
	size_t len = (size_t)(b->span - b->io_done);

	res = eng_filter_write(fd, off, len, res);
	if (res < 0 || res == 0) {
		if (!ls->failed && !failed)
			ls_fail_write(ls, b, res < 0 ? (int)res : -EIO, off,
				      len);
		ls->failed = 1;
		ls_drop(ls, b);
		return;
	}
	if ((size_t)res < len) {
		/* Short count: continue with the remainder. O_DIRECT cannot
		 * write from an unaligned offset, so this file goes buffered
		 * (made durable by the fdatasync at finish anyway). */
		b->io_done += (uint64_t)res;
		if (failed || ls->failed) {
			ls_drop(ls, b);
			return;
		}
		if ((b->io_done % FMT_ALIGN) != 0 &&
		    ls_go_buffered(ls, b->file) < 0) {
			ls_drop(ls, b);
			return;
		}
		ls_enqueue(ls, b, 1);
		return;
	}
	ls_done(ls, b);
}

/* Reaps every available completion; returns how many. */
static unsigned ls_reap(local_sink *ls, int failed)
{
	struct ckpt *c = ls->base.c;
	struct io_uring_cqe *cqe;
	unsigned n = 0;

	while (ls->inflight > 0 && io_uring_peek_cqe(&c->ring, &cqe) == 0) {
		eng_buf *b = io_uring_cqe_get_data(cqe);
		long res = cqe->res;

		io_uring_cqe_seen(&c->ring, cqe);
		b->io_inflight = 0;
		ls->inflight--;
		n++;
		ls_complete(ls, b, res, failed);
	}
	if (n > 0)
		ls->progress_ns = eng_mono_ns();
	return n;
}

/* The sink stops using the ring: its files drop O_DIRECT (pwrite cannot
 * continue an unaligned short write) and the entries the kernel did not
 * take go to the pwrite queue (order does not matter: every buffer has
 * its own file range). */
static void ls_leave_ring(local_sink *ls)
{
	eng_buf *b;
	uint32_t f;

	ls->uring = 0;
	for (f = 0; f < ls->nfiles && !ls->failed; f++)
		ls_go_buffered(ls, f);
	while ((b = q_pop(&ls->sq_head, &ls->sq_tail)) != NULL) {
		ls->nsq--;
		ls_enqueue(ls, b, 0);
	}
}

/*
 * A hard ring error (not EAGAIN/EBUSY/EINTR, or a ring that takes nothing
 * for ENG_SUBMIT_TRIES attempts while idle): this handle writes with pwrite
 * from now on. Entries still in the ring were not taken by the kernel and
 * never will be (nothing enters the ring again; ls_stalled, which submits
 * a cancel, makes them NOPs first), so their buffers are written here;
 * what the kernel took completes as usual.
 */
static void ls_fallback(local_sink *ls, int err)
{
	struct ckpt *c = ls->base.c;

	c->ring_broken = 1;
	atomic_fetch_add_explicit(&c->io_st.uring_fallbacks, 1,
				  memory_order_relaxed);
	/* not a failure of the save: noted for ckpt_errmsg() */
	pthread_mutex_lock(&c->mu);
	eng_err(c->errmsg, err,
		"%s: io_uring submit: %s; this handle writes with pwrite now",
		ls->job->stepdir, ckpt_strerror(err));
	pthread_mutex_unlock(&c->mu);
	ls_leave_ring(ls);
}

/* Moves the first n entries of the ring queue to the in-flight count. */
static void ls_taken(local_sink *ls, unsigned n)
{
	struct ckpt *c = ls->base.c;

	if (n > ls->nsq)
		n = ls->nsq;
	if (n > 0 && ls->inflight == 0)
		ls->progress_ns = eng_mono_ns();
	for (unsigned i = 0; i < n; i++)
		q_pop(&ls->sq_head, &ls->sq_tail)->io_inflight = 1;
	ls->nsq -= n;
	ls->inflight += n;
	atomic_fetch_add_explicit(&c->io_st.uring_writes, n,
				  memory_order_relaxed);
}

/*
 * Submission. The kernel may take fewer entries than queued (the rest stay
 * in the ring and go with the next submit), or none with EAGAIN/EBUSY
 * (short of memory, or the completion queue is full): then reap and retry.
 * Only entries the kernel took are in flight, so the writer never waits
 * for a completion that cannot come. While nothing is in flight no
 * completion will wake the writer: retry here after a short sleep, and
 * treat a ring that takes nothing for ENG_SUBMIT_TRIES attempts as broken.
 */
#define ENG_SUBMIT_TRIES 1000
static void ls_submit(local_sink *ls, int failed)
{
	struct ckpt *c = ls->base.c;
	unsigned idle_tries = 0;

	while (ls->nsq > 0) {
		int r = eng_uring_submit(&c->ring);

		if (r == -EINTR)
			continue;
		if (r > 0) {
			if ((unsigned)r < ls->nsq)
				atomic_fetch_add_explicit(
					&c->io_st.submit_retries, 1,
					memory_order_relaxed);
			ls_taken(ls, (unsigned)r);
			idle_tries = 0;
			continue;
		}
		if (r == 0 || r == -EAGAIN || r == -EBUSY) {
			atomic_fetch_add_explicit(&c->io_st.submit_retries, 1,
						  memory_order_relaxed);
			if (ls_reap(ls, failed) > 0)
				continue;
			if (ls->inflight > 0)
				return; /* a completion wakes the writer */
			if (++idle_tries < ENG_SUBMIT_TRIES) {
				struct timespec ts = { 0, 1000000 };

				nanosleep(&ts, NULL);
				continue;
			}
			if (r == 0)
				r = -EAGAIN;
		}
		ls_fallback(ls, r);
		return;
	}
}

/* Entries in the ring the kernel has not taken (still on sq_head, or
 * moved to the pending queue by ls_fallback) become NOPs, so that no later
 * submit starts them. Without SQPOLL the kernel reads entries only inside
 * io_uring_enter, which only this thread calls. */
static void ls_nop_untaken(struct io_uring *ring)
{
	unsigned head = io_uring_smp_load_acquire(ring->sq.khead);

	for (unsigned i = head; i != ring->sq.sqe_tail; i++) {
		struct io_uring_sqe *sqe =
			&ring->sq.sqes[i & *ring->sq.kring_mask];

		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data64(sqe, LS_CANCEL_TAG);
	}
}

/* A result that says the write was stopped by the cancel, not done. */
static int ls_cancelled(long res)
{
	/* -ERESTARTSYS .. -ERESTART_RESTARTBLOCK: kernel-internal codes */
	return res == -ECANCELED || res == -EINTR || res == -EAGAIN ||
	       (res <= -512 && res >= -516);
}

/*
 * Writes in flight and none came back for stall_ms (see the note at the
 * top): cancel everything in the ring, collect for up to a second what
 * comes back (a cancelled write is written again with pwrite, a finished
 * one completes as usual), and abandon the ring. Writes still out after
 * that fail the save; their buffers return to the pool.
 */
static void ls_stalled(local_sink *ls, int failed)
{
	struct ckpt *c = ls->base.c;
	struct io_uring *ring = &c->ring;
	struct io_uring_sqe *sqe;
	int64_t until = eng_mono_ns() + 1000000000;
	double secs = atomic_load(&stall_ms) / 1000.0;
	unsigned redone = 0, lost;
	eng_buf *b, *first = NULL;
	int other = 0;

	atomic_fetch_add_explicit(&c->io_st.uring_stalls, 1,
				  memory_order_relaxed);
	ls_nop_untaken(ring);
	sqe = io_uring_get_sqe(ring);
	if (!sqe) { /* the ring is full of those NOPs: let them go first */
		(void)eng_uring_submit(ring);
		sqe = io_uring_get_sqe(ring);
	}
	if (sqe) {
		io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
		io_uring_sqe_set_data64(sqe, LS_CANCEL_TAG);
		(void)eng_uring_submit(ring);
	}
	/* never used again by this handle, as after a hard error */
	c->ring_broken = 1;
	ls_leave_ring(ls);
	while (ls->inflight > 0 && eng_mono_ns() < until) {
		struct __kernel_timespec ts = { .tv_nsec = 50000000 };
		struct io_uring_cqe *cqe;
		uint64_t ud;
		long res;
		int w = io_uring_wait_cqe_timeout(ring, &cqe, &ts);

		if (w == -ETIME || w == -EINTR)
			continue;
		if (w < 0)
			break;
		ud = io_uring_cqe_get_data64(cqe);
		res = cqe->res;
		io_uring_cqe_seen(ring, cqe);
		if (ud == LS_CANCEL_TAG)
			continue;
		b = (eng_buf *)(uintptr_t)ud;
		b->io_inflight = 0;
		ls->inflight--;
		if (!ls_cancelled(res)) {
			ls_complete(ls, b, res, failed);
		} else if (failed || ls->failed) {
			ls_drop(ls, b);
		} else {
			/* the kernel gave the buffer back: pwrite (ls_pump) */
			ls_enqueue(ls, b, 1);
			redone++;
		}
	}
	lost = ls->inflight;
	if (lost > 0) {
		size_t n = (size_t)c->nslots + c->nout;

		/* out of our hands for good: this save fails, so what the
		 * kernel may still write goes to unlinked files */
		for (size_t i = 0; i < n + ls->nfiles; i++) {
			b = i < n ? &c->bufs[i] : &ls->hdr[i - n];
			if (!b->io_inflight)
				continue;
			b->io_inflight = 0;
			if (!first)
				first = b;
			else if (b->file != first->file)
				other = 1;
			ls_drop(ls, b);
		}
		ls->inflight = 0;
		ls->failed = 1;
		eng_job_fail(c, ls->job, -EIO,
			     "%u write%s to %s%s did not complete in %g s and "
			     "could not be cancelled; this save fails and "
			     "this handle writes with pwrite now",
			     lost, lost == 1 ? "" : "s",
			     first ? ls->tmp[first->file] : ls->job->stepdir,
			     other ? " and other files" : "", secs);
		return;
	}
	/* not a failure of the save: noted for ckpt_errmsg() */
	pthread_mutex_lock(&c->mu);
	eng_err(c->errmsg, 0,
		"%s: io_uring: no write came back in %g s; %u cancelled "
		"write%s done again with pwrite; this handle writes with "
		"pwrite now",
		ls->job->stepdir, secs, redone, redone == 1 ? "" : "s");
	pthread_mutex_unlock(&c->mu);
}

static int ls_pump(eng_sink *s, int failed, int *busy)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;

	*busy = 0;
	ls_reap(ls, failed);
	if (ls->inflight > 0 &&
	    eng_mono_ns() - ls->progress_ns >=
		    (int64_t)atomic_load(&stall_ms) * 1000000)
		ls_stalled(ls, failed);
	if (failed || ls->failed) {
		eng_buf *b;

		/* entries already in the ring are written and reaped: the
		 * ring must be empty before the next save uses it */
		while ((b = q_pop(&ls->pend_head, &ls->pend_tail)) != NULL)
			ls_drop(ls, b);
	}
	while (ls->uring && ls->pend_head &&
	       ls->inflight + ls->nsq < c->s.queue_depth) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
		eng_buf *b;
		uint8_t *p;
		unsigned len;
		uint64_t off;

		if (!sqe)
			break;
		b = q_pop(&ls->pend_head, &ls->pend_tail);
		p = b->p + b->io_done;
		len = (unsigned)(b->span - b->io_done);
		off = b->file_offset + b->io_done;
		if (c->fixed_bufs && b->fixed >= 0)
			io_uring_prep_write_fixed(sqe, ls->fd[b->file], p, len,
						  off, b->fixed);
		else
			io_uring_prep_write(sqe, ls->fd[b->file], p, len, off);
		io_uring_sqe_set_data(sqe, b);
		q_push(&ls->sq_head, &ls->sq_tail, b, 0);
		ls->nsq++;
	}
	if (ls->uring && ls->nsq > 0)
		ls_submit(ls, failed);
	/* without a ring (or after falling back): write what is queued */
	while (!ls->uring && ls->pend_head) {
		eng_buf *b = q_pop(&ls->pend_head, &ls->pend_tail);

		if (failed || ls->failed)
			ls_drop(ls, b);
		else
			ls_sync_write(ls, b);
	}
	*busy = ls->inflight > 0 || ls->nsq > 0 || ls->pend_head != NULL;
	return ls->failed ? -EIO : 0;
}

static int ls_finish(eng_sink *s, eng_job *job)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;
	uint32_t f;
	int r;

	for (f = 0; f < ls->nfiles; f++) {
		int fd = ls->fd[f];

		if (ls->prealloc &&
		    (r = eng_ftruncate(fd, (off_t)job->file_end[f])) < 0) {
			return eng_job_fail(
				c, job, r, "%s: truncate to %llu: %s",
				ls->tmp[f],
				(unsigned long long)job->file_end[f],
				ckpt_strerror(r));
		}
		r = eng_fdatasync(fd);
		if (r < 0)
			return eng_job_fail(c, job, r, "%s: fdatasync: %s",
					    ls->tmp[f], ckpt_strerror(r));
		ls->fd[f] = -1;
		r = eng_close(fd);
		if (r < 0)
			return eng_job_fail(c, job, r, "%s: close: %s",
					    ls->tmp[f], ckpt_strerror(r));
	}
	for (f = 0; f < ls->nfiles; f++) {
		r = eng_rename(ls->tmp[f], ls->fin[f]);
		if (r < 0)
			return eng_job_fail(c, job, r, "%s: rename: %s",
					    ls->tmp[f], ckpt_strerror(r));
		ls->renamed = 1;
	}
	return 0;
}

static int ls_publish(eng_sink *s, eng_job *job, const char *name,
		      const uint8_t *buf, size_t len)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;
	char err[ENG_ERRMSG_MAX];
	int r;

	err[0] = 0;
	r = eng_write_file_atomic(job->stepdir, name, buf, len, err);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s", err);
	ls->published = 1;
	/* the step directory's own entry */
	r = eng_fsync_dir(c->root);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s: fsync directory: %s",
				    c->root, ckpt_strerror(r));
	return 0;
}

static void ls_abort(eng_sink *s, eng_job *job)
{
	local_sink *ls = (local_sink *)s;
	uint32_t f;

	(void)job;
	for (f = 0; f < ls->nfiles; f++) {
		if (ls->fd[f] >= 0) {
			eng_close(ls->fd[f]);
			ls->fd[f] = -1;
		}
		if (ls->tmp[f])
			eng_unlink(ls->tmp[f]);
		/* Without this host's index the shards are unreachable; with
		 * it (a failed commit) they stay for a later ckpt_commit. */
		if (ls->renamed && !ls->published && ls->fin[f])
			eng_unlink(ls->fin[f]);
	}
}

static void ls_destroy(eng_sink *s)
{
	local_sink *ls = (local_sink *)s;

	if (!ls)
		return;
	ls_clear(ls);
	free(ls);
}

static const eng_sink_ops local_ops = {
	.name = "local",
	.begin = ls_begin,
	.put = ls_put,
	.pump = ls_pump,
	.finish = ls_finish,
	.publish = ls_publish,
	.abort = ls_abort,
	.destroy = ls_destroy,
};

int eng_local_sink_new(struct ckpt *c, eng_sink **out)
{
	local_sink *ls = calloc(1, sizeof(*ls));

	*out = NULL;
	if (!ls)
		return -ENOMEM;
	ls->base.ops = &local_ops;
	ls->base.c = c;
	*out = &ls->base;
	return 0;
}
