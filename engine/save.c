/*
 * save.c - the handle, the staging pool, ckpt_save()'s copy and the
 * compression workers.
 *
 * Design note. Everything that costs page faults or allocations happens in
 * ckpt_open(): one mmap holds every staging slot and compressed-output
 * buffer, pre-faulted (huge pages where the kernel allows) and registered
 * with io_uring. ckpt_save() validates, copies the caller's tensors chunk by
 * chunk into free slots in the caller's thread (blocking while the pool is
 * full: backpressure, so peak memory is the pool whatever the state size)
 * and returns when the last byte is copied. Workers hash and encode each
 * slot; the writer thread (writer.c) puts the results into files.
 *
 * Slot layout: [64-byte chunk header][chunk_bytes raw][pad to 4096], so a
 * chunk that is stored raw is written straight from its slot. A chunk that
 * compresses moves to an output buffer and its slot is freed at once.
 *
 * The caller's copy is what the training loop waits for, so it should not
 * share a core or memory bandwidth with compression: while it runs and the
 * pool has room (more than a quarter free), workers leave compressed-codec
 * chunks queued; they start when the copy ends or the pool fills up. That
 * costs at most the copy time of overlap on a compression-bound save. Raw
 * chunks (codec none: hash only) are processed at once, so the disk starts
 * writing during the copy. Background threads are SCHED_BATCH (they never
 * preempt the copy on wake-up) and workers run at a lower priority.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "save_internal.h"

#define REG_PIECE (1ull << 30) /* io_uring registers at most 1 GiB per iovec */
/* Compressed chunks the writer may have in the device at once (bounded by
 * settings.queue_depth); see alloc_pool(). */
#define OUT_INFLIGHT 8u

CKPT_API void ckpt_settings_default(ckpt_settings *s)
{
	if (!s)
		return;
	memset(s, 0, sizeof(*s));
	s->staging_bytes = 512ull << 20;
	s->chunk_bytes = 4u << 20;
	s->codec = CKPT_CODEC_FLOAT;
	s->level = 1;
	s->threads = 0;
	s->files_per_host = 4;
	s->host_index = 0;
	s->host_count = 1;
	s->queue_depth = 32;
	s->keep_last = 0;
	s->keep_every = 0;
	s->flags = 0;
}

CKPT_API const char *ckpt_errmsg(const ckpt *c)
{
	/* Background threads may write the handle's message at any time:
	 * hand out a copy taken under the lock, never the live buffer. */
	static _Thread_local char copy[ENG_ERRMSG_MAX];
	struct ckpt *m = (struct ckpt *)c;

	if (!c)
		return eng_tls_errmsg();
	pthread_mutex_lock(&m->mu);
	memcpy(copy, c->errmsg, strnlen(c->errmsg, ENG_ERRMSG_MAX - 1));
	copy[strnlen(c->errmsg, ENG_ERRMSG_MAX - 1)] = 0;
	pthread_mutex_unlock(&m->mu);
	return copy;
}

/* Sets the handle's message under its mutex (several threads may fail). */
static int __attribute__((format(printf, 3, 4)))
set_err(struct ckpt *c, int code, const char *fmt, ...)
{
	char m[ENG_ERRMSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&c->mu);
	eng_err(c->errmsg, code, "%s", m);
	pthread_mutex_unlock(&c->mu);
	return code;
}

/* ------------------------------------------------------------------ */
/* Name set                                                           */
/* ------------------------------------------------------------------ */

int eng_nameset_init(eng_nameset *s, size_t expect)
{
	size_t cap = 16;

	memset(s, 0, sizeof(*s));
	while (cap < expect * 2 + 2)
		cap <<= 1;
	s->key = calloc(cap, sizeof(*s->key));
	s->len = calloc(cap, sizeof(*s->len));
	s->val = calloc(cap, sizeof(*s->val));
	if (!s->key || !s->len || !s->val) {
		eng_nameset_free(s);
		return -ENOMEM;
	}
	s->cap = cap;
	return 0;
}

void eng_nameset_free(eng_nameset *s)
{
	free(s->key);
	free(s->len);
	free(s->val);
	memset(s, 0, sizeof(*s));
}

static int nameset_grow(eng_nameset *s)
{
	eng_nameset n;
	size_t i, dummy;
	int r = eng_nameset_init(&n, s->cap);

	if (r < 0)
		return r;
	for (i = 0; i < s->cap; i++)
		if (s->key[i])
			eng_nameset_add(&n, s->key[i], s->len[i], s->val[i],
					&dummy);
	eng_nameset_free(s);
	*s = n;
	return 0;
}

int eng_nameset_add(eng_nameset *s, const char *k, size_t len, size_t v,
		    size_t *val)
{
	size_t i;

	if ((s->n + 1) * 2 > s->cap) {
		int r = nameset_grow(s);

		if (r < 0)
			return r;
	}
	i = (size_t)fmt_xxh3(k, len) & (s->cap - 1);
	while (s->key[i]) {
		if (s->len[i] == len && memcmp(s->key[i], k, len) == 0) {
			*val = s->val[i];
			return 0;
		}
		i = (i + 1) & (s->cap - 1);
	}
	s->key[i] = k;
	s->len[i] = len;
	s->val[i] = v;
	s->n++;
	return 1;
}

/* ------------------------------------------------------------------ */
/* Buffers, queues, job status                                        */
/* ------------------------------------------------------------------ */

void eng_writer_wake(struct ckpt *c)
{
	uint64_t one = 1;

	while (write(c->efd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

/* Returns 1 if the writer must be woken (it drains a failed job). */
static int buf_release_locked(struct ckpt *c, eng_buf *b)
{
	int wake = b->job && b->job->status != 0;

	b->job = NULL;
	if (b->is_out) {
		b->next = c->free_outs;
		c->free_outs = b;
		c->nfree_outs++;
		pthread_cond_signal(&c->out_cv);
	} else {
		b->next = c->free_slots;
		c->free_slots = b;
		c->nfree_slots++;
		pthread_cond_signal(&c->slot_cv);
	}
	return wake;
}

static void buf_release(struct ckpt *c, eng_buf *b)
{
	int wake;

	pthread_mutex_lock(&c->mu);
	wake = buf_release_locked(c, b);
	pthread_mutex_unlock(&c->mu);
	if (wake)
		eng_writer_wake(c);
}

void eng_buf_unref(struct ckpt *c, eng_buf *b)
{
	if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		buf_release(c, b);
}

int eng_job_fail(struct ckpt *c, eng_job *job, int code, const char *fmt, ...)
{
	char m[ENG_ERRMSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&c->mu);
	if (job->status == 0) {
		job->status = code;
		memcpy(job->msg, m, sizeof(m));
	}
	pthread_cond_broadcast(&c->slot_cv);
	pthread_cond_broadcast(&c->out_cv);
	pthread_mutex_unlock(&c->mu);
	eng_writer_wake(c);
	return code;
}

int eng_job_status(struct ckpt *c, eng_job *job)
{
	int r;

	pthread_mutex_lock(&c->mu);
	r = job->status;
	pthread_mutex_unlock(&c->mu);
	return r;
}

void eng_job_free(eng_job *job)
{
	if (!job)
		return;
	free(job->stepdir);
	free(job->tensors);
	free(job->names);
	free(job->data);
	free(job->chunks);
	free(job->files);
	free(job->hdrs);
	free(job->file_end);
	free(job->file_cap);
	free(job->fhash); /* states themselves are freed by the writer */
	free(job);
}

/* ------------------------------------------------------------------ */
/* Workers                                                            */
/* ------------------------------------------------------------------ */

static eng_buf *acquire_out(struct ckpt *c, eng_job *job)
{
	eng_buf *o = NULL;

	pthread_mutex_lock(&c->mu);
	while (!c->free_outs && job->status == 0 && !c->shutdown)
		pthread_cond_wait(&c->out_cv, &c->mu);
	if (c->free_outs && job->status == 0) {
		o = c->free_outs;
		c->free_outs = o->next;
		c->nfree_outs--;
		o->next = NULL;
	}
	pthread_mutex_unlock(&c->mu);
	return o;
}

static void push_writer(struct ckpt *c, eng_buf *b)
{
	pthread_mutex_lock(&c->mu);
	b->next = NULL;
	if (c->wq_tail)
		c->wq_tail->next = b;
	else
		c->wq_head = b;
	c->wq_tail = b;
	pthread_mutex_unlock(&c->mu);
	eng_writer_wake(c);
}

/* Hash, encode, frame one filled slot and hand it to the writer. */
static void encode_chunk(struct ckpt *c, fmt_codec_ctx *cx, eng_buf *b)
{
	eng_job *job = b->job;
	const uint8_t *raw = b->p + FMT_CHUNK_HDR_SIZE;
	eng_buf *dst = b;
	fmt_chunk_hdr h;
	size_t stored = b->raw_len;
	int used = CKPT_CODEC_NONE;

	b->raw_xxh3 = fmt_xxh3(raw, b->raw_len);
	if (c->s.codec != CKPT_CODEC_NONE && cx) {
		eng_buf *o = acquire_out(c, job);
		int r;

		if (!o) {
			buf_release(c, b);
			return;
		}
		r = fmt_chunk_encode(cx, c->s.codec, c->s.level, b->elem_width,
				     raw, b->raw_len, o->p + FMT_CHUNK_HDR_SIZE,
				     o->cap - FMT_CHUNK_HDR_SIZE, &used,
				     &stored);
		if (r < 0) {
			eng_job_fail(
				c, job, r,
				"step %llu: chunk at stream offset %llu: "
				"encoding with codec %s failed: %s",
				(unsigned long long)job->step,
				(unsigned long long)b->k * job->chunk_bytes,
				ckpt_codec_name(c->s.codec), ckpt_strerror(r));
			buf_release(c, o);
			buf_release(c, b);
			return;
		}
		if (used != CKPT_CODEC_NONE && stored < b->raw_len) {
			o->job = job;
			o->k = b->k;
			o->raw_len = b->raw_len;
			o->elem_width = b->elem_width;
			o->raw_xxh3 = b->raw_xxh3;
			o->payload = b->payload;
			dst = o;
			buf_release(c, b);
		} else {
			used = CKPT_CODEC_NONE;
			stored = b->raw_len;
			buf_release(c, o);
		}
	}
	dst->codec = (uint8_t)used;
	dst->stored_len = (uint32_t)stored;
	dst->span = fmt_chunk_span((uint32_t)stored);
	h.codec = dst->codec;
	h.elem_width = dst->elem_width;
	h.raw_len = dst->raw_len;
	h.stored_len = dst->stored_len;
	h.stream_offset = dst->k * job->chunk_bytes;
	h.raw_xxh3 = dst->raw_xxh3;
	fmt_chunk_hdr_encode(&h, dst->p);
	memset(dst->p + FMT_CHUNK_HDR_SIZE + stored, 0,
	       dst->span - FMT_CHUNK_HDR_SIZE - stored);
	push_writer(c, dst);
}

/*
 * Background threads must not preempt the caller's copy: SCHED_BATCH (no
 * wake-up preemption) and, for workers, a lower priority. Best effort.
 */
void eng_thread_background(int nice)
{
	struct sched_param sp;

	memset(&sp, 0, sizeof(sp));
	pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
	if (nice)
		setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice);
}

static void *worker_main(void *arg)
{
	struct ckpt *c = arg;
	fmt_codec_ctx *cx = NULL;

	eng_thread_background(5);
	if (c->s.codec != CKPT_CODEC_NONE)
		cx = fmt_codec_ctx_new();
	pthread_mutex_lock(&c->mu);
	for (;;) {
		eng_buf *b;
		int failed;

		while ((!c->work_head ||
			(c->copying && c->nfree_slots > c->low_slots &&
			 c->work_head->job->status == 0)) &&
		       !c->shutdown)
			pthread_cond_wait(&c->work_cv, &c->mu);
		b = c->work_head;
		if (!b)
			break;
		c->work_head = b->next;
		if (!c->work_head)
			c->work_tail = NULL;
		b->next = NULL;
		failed = b->job->status != 0;
		pthread_mutex_unlock(&c->mu);
		if (failed) {
			buf_release(c, b);
		} else if (c->s.codec != CKPT_CODEC_NONE && !cx) {
			eng_job_fail(c, b->job, -ENOMEM,
				     "step %llu: out of memory for a codec "
				     "context",
				     (unsigned long long)b->job->step);
			buf_release(c, b);
		} else {
			encode_chunk(c, cx, b);
		}
		pthread_mutex_lock(&c->mu);
	}
	pthread_mutex_unlock(&c->mu);
	fmt_codec_ctx_free(cx);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Open / close                                                       */
/* ------------------------------------------------------------------ */

static int check_settings(const ckpt_settings *s)
{
	size_t i;

	for (i = 0; i < sizeof(s->reserved) / sizeof(s->reserved[0]); i++)
		if (s->reserved[i])
			return eng_err(NULL, -EINVAL,
				       "settings.reserved[%zu] must be zero",
				       i);
	if (s->chunk_bytes % FMT_ALIGN || s->chunk_bytes < FMT_MIN_CHUNK ||
	    s->chunk_bytes > FMT_MAX_CHUNK)
		return eng_err(NULL, -EINVAL,
			       "settings.chunk_bytes: %u is not a multiple of "
			       "4096 in [%u, %u]",
			       s->chunk_bytes, FMT_MIN_CHUNK, FMT_MAX_CHUNK);
	if (s->codec < 0 || s->codec >= CKPT_CODEC_COUNT)
		return eng_err(NULL, -EINVAL,
			       "settings.codec: unknown codec %d",
			       (int)s->codec);
	if (s->level < ZSTD_minCLevel() || s->level > ZSTD_maxCLevel())
		return eng_err(NULL, -EINVAL,
			       "settings.level: %d outside zstd's [%d, %d]",
			       (int)s->level, ZSTD_minCLevel(),
			       ZSTD_maxCLevel());
	if (s->threads > 1024)
		return eng_err(NULL, -EINVAL,
			       "settings.threads: %u is more than 1024",
			       s->threads);
	if (s->files_per_host < 1 || s->files_per_host > FMT_MAX_FILES_PER_HOST)
		return eng_err(NULL, -EINVAL,
			       "settings.files_per_host: %u outside [1, %u]",
			       s->files_per_host, FMT_MAX_FILES_PER_HOST);
	if (s->host_count < 1 || s->host_count > FMT_MAX_HOSTS)
		return eng_err(NULL, -EINVAL,
			       "settings.host_count: %u outside [1, %u]",
			       s->host_count, FMT_MAX_HOSTS);
	if (s->host_index >= s->host_count)
		return eng_err(NULL, -EINVAL,
			       "settings.host_index: %u is not below "
			       "host_count %u",
			       s->host_index, s->host_count);
	if (s->queue_depth < 1 || s->queue_depth > 4096)
		return eng_err(NULL, -EINVAL,
			       "settings.queue_depth: %u outside [1, 4096]",
			       s->queue_depth);
	if (s->flags &
	    ~(CKPT_F_NO_DIRECT | CKPT_F_MANUAL_COMMIT | CKPT_F_NO_URING))
		return eng_err(
			NULL, -EINVAL, "settings.flags: unknown bits 0x%x",
			s->flags & ~(CKPT_F_NO_DIRECT | CKPT_F_MANUAL_COMMIT |
				     CKPT_F_NO_URING));
	if (s->staging_bytes > (1ull << 46))
		return eng_err(NULL, -EINVAL,
			       "settings.staging_bytes: %llu is absurdly large",
			       (unsigned long long)s->staging_bytes);
	return 0;
}

static int mkdir_p(const char *dir)
{
	char *p = strdup(dir), *q;
	int r = 0;

	if (!p)
		return -ENOMEM;
	for (q = p + 1; *q; q++) {
		if (*q != '/')
			continue;
		*q = 0;
		r = eng_mkdir(p, 0755);
		*q = '/';
		if (r < 0 && r != -EEXIST)
			break;
		r = 0;
	}
	if (r == 0)
		r = eng_mkdir(p, 0755);
	free(p);
	return r;
}

typedef struct populate_arg {
	uint8_t *p;
	size_t n;
} populate_arg;

static void *populate_range(void *arg)
{
	populate_arg *a = arg;
	size_t off;

	if (madvise(a->p, a->n, MADV_POPULATE_WRITE) < 0)
		for (off = 0; off < a->n; off += 4096)
			((volatile uint8_t *)a->p)[off] = 0;
	return NULL;
}

/* Faults are slow here (several µs a page); several threads fault in
 * parallel. */
static void populate(uint8_t *m, size_t n, unsigned nthreads)
{
	pthread_t tid[16];
	populate_arg a[16];
	size_t per, off = 0;
	unsigned i, started = 0;

	if (nthreads > 16)
		nthreads = 16;
	if (nthreads < 1 || n < (64u << 20))
		nthreads = 1;
	per = (size_t)fmt_align_up(n / nthreads, 2u << 20);
	for (i = 0; i < nthreads && off < n; i++) {
		a[i].p = m + off;
		a[i].n = n - off < per ? n - off : per;
		off += a[i].n;
		if (i + 1 < nthreads && off < n &&
		    pthread_create(&tid[started], NULL, populate_range,
				   &a[i]) == 0) {
			started++;
			continue;
		}
		populate_range(&a[i]);
	}
	for (i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
}

/* mmap + pre-fault: every page is resident before the first save. */
static int alloc_pool(struct ckpt *c)
{
	uint32_t chunk = c->s.chunk_bytes;
	size_t slot_cap = (size_t)chunk + FMT_ALIGN;
	size_t out_cap = 0, budget, outs = 0;
	uint32_t nout = 0, nslots, i, out_inflight;
	void *m;

	budget = (size_t)fmt_align_up(c->s.staging_bytes, FMT_ALIGN);
	out_inflight = c->s.queue_depth < OUT_INFLIGHT ? c->s.queue_depth :
							  OUT_INFLIGHT;
	if (c->s.codec != CKPT_CODEC_NONE) {
		out_cap = (size_t)fmt_chunk_span(
			(uint32_t)fmt_codec_bound(chunk));
		/* An output buffer is busy from its encode until its write
		 * completes and the writer has hashed it: one per worker
		 * encoding, one per worker queued for the writer, and
		 * OUT_INFLIGHT in the device. With only 2 per worker, about
		 * 2 writes were in flight and the workers spent much of a
		 * save waiting for buffers (the disk reaches its bandwidth
		 * near 8 in flight). At most a quarter of the pool. */
		nout = (uint32_t)(budget / (4 * out_cap));
		if (nout > 2 * c->nworkers + out_inflight)
			nout = 2 * c->nworkers + out_inflight;
		if (nout < 1)
			nout = 1;
		outs = (size_t)nout * out_cap;
	}
	/* Output buffers come out of the staging budget. */
	nslots = budget > outs ? (uint32_t)((budget - outs) / slot_cap) : 0;
	if (nslots < 2)
		nslots = 2;
	c->mem_bytes = (size_t)nslots * slot_cap + outs;
	m = mmap(NULL, c->mem_bytes, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return eng_err(
			NULL, -errno,
			"settings.staging_bytes: cannot map %zu bytes: %s",
			c->mem_bytes, strerror(errno));
	c->mem = m;
	madvise(m, c->mem_bytes, MADV_HUGEPAGE);
	populate(m, c->mem_bytes, eng_ncpus());
	c->bufs = calloc((size_t)nslots + nout, sizeof(*c->bufs));
	if (!c->bufs)
		return eng_err(NULL, -ENOMEM, "out of memory");
	c->nslots = nslots;
	c->nout = nout;
	c->low_slots = nslots / 4;
	for (i = 0; i < nslots + nout; i++) {
		eng_buf *b = &c->bufs[i];
		size_t start = i < nslots ?
				       (size_t)i * slot_cap :
				       (size_t)nslots * slot_cap +
					       (size_t)(i - nslots) * out_cap;

		b->p = c->mem + start;
		b->cap = i < nslots ? slot_cap : out_cap;
		b->is_out = i >= nslots;
		/* fixed index = 1 GiB piece, if the buffer lies inside one */
		b->fixed = start / REG_PIECE ==
					   (start + b->cap - 1) / REG_PIECE ?
				   (int)(start / REG_PIECE) :
				   -1;
		atomic_init(&b->refs, 0);
		buf_release_locked(c, b);
	}
	return 0;
}

static void setup_ring(struct ckpt *c)
{
	struct iovec *iov;
	size_t n, i;

	if (c->s.flags & CKPT_F_NO_URING)
		return;
	if (io_uring_queue_init(c->s.queue_depth, &c->ring, 0) < 0)
		return;
	if (io_uring_register_eventfd(&c->ring, c->efd) < 0) {
		io_uring_queue_exit(&c->ring);
		return;
	}
	c->have_ring = 1;
	n = (c->mem_bytes + REG_PIECE - 1) / REG_PIECE;
	iov = calloc(n, sizeof(*iov));
	if (!iov)
		return;
	for (i = 0; i < n; i++) {
		size_t off = i * REG_PIECE;

		iov[i].iov_base = c->mem + off;
		iov[i].iov_len = c->mem_bytes - off < REG_PIECE ?
					 c->mem_bytes - off :
					 REG_PIECE;
	}
	/* Pinning may fail (memlock limits): then plain writes. */
	c->fixed_bufs = io_uring_register_buffers(&c->ring, iov, (unsigned)n) ==
			0;
	free(iov);
}

/* The ring, eventfd, pool and plain memory: all that ckpt_close in a child
 * of fork() may release, since the threads, the locks and any save in
 * flight are the parent's (what the sinks hold is left: small, and their
 * descriptors are O_CLOEXEC). */
static void handle_release(struct ckpt *c)
{
	if (c->have_ring)
		io_uring_queue_exit(&c->ring);
	if (c->efd >= 0)
		close(c->efd);
	if (c->mem)
		munmap(c->mem, c->mem_bytes);
	eng_job_free(c->job);
	free(c->bufs);
	free(c->workers);
	free(c->root);
}

static void handle_free(struct ckpt *c)
{
	unsigned i;

	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->shutdown = 1;
	pthread_cond_broadcast(&c->work_cv);
	pthread_cond_broadcast(&c->writer_cv);
	pthread_cond_broadcast(&c->out_cv);
	pthread_mutex_unlock(&c->mu);
	for (i = 0; i < c->nstarted; i++)
		pthread_join(c->workers[i], NULL);
	if (c->writer_started)
		pthread_join(c->writer, NULL);
	for (i = 0; i < c->nsinks; i++)
		c->sinks[i]->ops->destroy(c->sinks[i]);
	handle_release(c);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->slot_cv);
	pthread_cond_destroy(&c->work_cv);
	pthread_cond_destroy(&c->out_cv);
	pthread_cond_destroy(&c->writer_cv);
	pthread_cond_destroy(&c->done_cv);
	free(c);
}

CKPT_API int ckpt_open(ckpt **out, const char *dir, const ckpt_settings *s)
{
	struct ckpt *c = NULL;
	size_t len;
	unsigned i;
	int r;

	if (!out)
		return eng_err(NULL, -EINVAL, "ckpt_open: out is NULL");
	*out = NULL;
	if (!dir || !*dir)
		return eng_err(NULL, -EINVAL, "ckpt_open: directory is %s",
			       dir ? "empty" : "NULL");
	c = calloc(1, sizeof(*c));
	if (!c)
		return eng_err(NULL, -ENOMEM, "out of memory");
	c->efd = -1;
	c->pid = getpid();
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->slot_cv, NULL);
	pthread_cond_init(&c->work_cv, NULL);
	pthread_cond_init(&c->out_cv, NULL);
	pthread_cond_init(&c->writer_cv, NULL);
	pthread_cond_init(&c->done_cv, NULL);
	if (s)
		c->s = *s;
	else
		ckpt_settings_default(&c->s);
	r = check_settings(&c->s);
	if (r < 0)
		goto fail;
	c->nworkers = c->s.threads ? c->s.threads : eng_ncpus();
	c->root = strdup(dir);
	if (!c->root) {
		r = eng_err(NULL, -ENOMEM, "out of memory");
		goto fail;
	}
	len = strlen(c->root);
	while (len > 1 && c->root[len - 1] == '/')
		c->root[--len] = 0;
	r = mkdir_p(c->root);
	if (r < 0) {
		eng_err(NULL, r, "%s: cannot create directory: %s", c->root,
			ckpt_strerror(r));
		goto fail;
	}
	c->efd = eventfd(0, EFD_CLOEXEC);
	if (c->efd < 0) {
		r = eng_err(NULL, -errno, "eventfd: %s", strerror(errno));
		goto fail;
	}
	if (c->s.staging_bytes > 0) {
		r = alloc_pool(c);
		if (r < 0)
			goto fail;
		setup_ring(c);
		/* O_DIRECT only with io_uring: the plain-pwrite path cannot
		 * continue a short write at an unaligned offset. */
		c->direct = c->have_ring && !(c->s.flags & CKPT_F_NO_DIRECT) &&
			    eng_probe_direct(c->root);
		r = eng_local_sink_new(c, &c->sinks[0]);
		if (r < 0) {
			eng_err(NULL, r, "out of memory");
			goto fail;
		}
		c->nsinks = 1;
		c->workers = calloc(c->nworkers, sizeof(*c->workers));
		if (!c->workers) {
			r = eng_err(NULL, -ENOMEM, "out of memory");
			goto fail;
		}
		for (i = 0; i < c->nworkers; i++) {
			r = -pthread_create(&c->workers[i], NULL, worker_main,
					    c);
			if (r < 0) {
				eng_err(NULL, r, "cannot start a worker: %s",
					strerror(-r));
				goto fail;
			}
			c->nstarted++;
		}
		r = -pthread_create(&c->writer, NULL, eng_writer_main, c);
		if (r < 0) {
			eng_err(NULL, r, "cannot start the writer: %s",
				strerror(-r));
			goto fail;
		}
		c->writer_started = 1;
	}
	c->state = CKPT_STATE_IDLE;
	*out = c;
	return 0;
fail:
	handle_free(c);
	return r;
}

CKPT_API int ckpt_close(ckpt *c)
{
	int r;

	if (!c)
		return 0;
	if (c->pid != getpid()) {
		handle_release(c);
		free(c);
		return 0;
	}
	pthread_mutex_lock(&c->mu);
	while (c->busy)
		pthread_cond_wait(&c->done_cv, &c->mu);
	r = c->uncollected ? c->status : 0;
	pthread_mutex_unlock(&c->mu);
	if (r)
		eng_err(NULL, r, "%s", c->status_msg);
	handle_free(c);
	return r;
}

/* ------------------------------------------------------------------ */
/* ckpt_save                                                          */
/* ------------------------------------------------------------------ */

/* Validates the tensors and lays out the host stream. */
static int build_job(struct ckpt *c, uint64_t step, const ckpt_tensor *t,
		     size_t n, eng_job **out)
{
	eng_job *job = calloc(1, sizeof(*job));
	eng_nameset ns = { 0 };
	size_t i, names_bytes = 0, *lens = NULL, dup;
	uint64_t cur = 0;
	char dname[32], *np;
	int r;

	*out = NULL;
	if (!job)
		return set_err(c, -ENOMEM, "out of memory");
	job->step = step;
	job->chunk_bytes = c->s.chunk_bytes;
	job->ntensors = n;
	job->tensors = calloc(n ? n : 1, sizeof(*job->tensors));
	job->data = calloc(n ? n : 1, sizeof(*job->data));
	lens = calloc(n ? n : 1, sizeof(*lens));
	if (!job->tensors || !job->data || !lens ||
	    eng_nameset_init(&ns, n) < 0) {
		r = set_err(c, -ENOMEM, "out of memory");
		goto out;
	}
	for (i = 0; i < n; i++) {
		const ckpt_tensor *x = &t[i];
		fmt_tensor_entry *e = &job->tensors[i];
		size_t es, len;
		uint64_t gbytes, nb;
		uint32_t d;

		if (!x->name) {
			r = set_err(c, -EINVAL, "tensor %zu: name is NULL", i);
			goto out;
		}
		if (x->flags || x->reserved0 || x->reserved[0] ||
		    x->reserved[1]) {
			r = set_err(c, -EINVAL,
				    "tensor %zu (\"%.200s\"): flags and "
				    "reserved fields must be zero", i, x->name);
			goto out;
		}
		len = strnlen(x->name, CKPT_MAX_NAME + 1);
		if (!fmt_name_valid(x->name, len)) {
			r = set_err(c, -EINVAL,
				    "tensor %zu: name is not 1..%d bytes of "
				    "valid UTF-8",
				    i, CKPT_MAX_NAME);
			goto out;
		}
		lens[i] = len;
		es = ckpt_dtype_size(x->dtype);
		if (es == 0) {
			r = set_err(c, -EINVAL,
				    "tensor \"%.200s\": invalid dtype %d",
				    x->name, (int)x->dtype);
			goto out;
		}
		if (x->ndim > CKPT_MAX_NDIM) {
			r = set_err(
				c, -EINVAL,
				"tensor \"%.200s\": ndim %u is more than %d",
				x->name, x->ndim, CKPT_MAX_NDIM);
			goto out;
		}
		if (x->ndim > 0 && !x->shape) {
			r = set_err(c, -EINVAL,
				    "tensor \"%.200s\": shape is NULL",
				    x->name);
			goto out;
		}
		e->dtype = x->dtype;
		e->ndim = x->ndim;
		for (d = 0; d < x->ndim; d++) {
			e->shape[d] = x->shape[d];
			e->offset[d] = x->slice_offset ? x->slice_offset[d] : 0;
			e->extent[d] = x->slice_extent ? x->slice_extent[d] :
							 x->shape[d];
			if (e->offset[d] > e->shape[d] ||
			    e->extent[d] > e->shape[d] - e->offset[d]) {
				r = set_err(c, -EINVAL,
					    "tensor \"%.200s\": slice [%llu, "
					    "+%llu) outside shape %llu in "
					    "dimension %u",
					    x->name,
					    (unsigned long long)e->offset[d],
					    (unsigned long long)e->extent[d],
					    (unsigned long long)e->shape[d], d);
				goto out;
			}
		}
		if (fmt_shape_bytes(e->shape, e->ndim, es, &gbytes) < 0 ||
		    fmt_shape_bytes(e->extent, e->ndim, es, &nb) < 0) {
			r = set_err(
				c, -EINVAL,
				"tensor \"%.200s\": shape overflows 64 bits",
				x->name);
			goto out;
		}
		if (nb != x->nbytes) {
			r = set_err(c, -EINVAL,
				    "tensor \"%.200s\": nbytes is %llu, shape "
				    "and dtype say %llu",
				    x->name, (unsigned long long)x->nbytes,
				    (unsigned long long)nb);
			goto out;
		}
		if (nb > 0 && !x->data) {
			r = set_err(c, -EINVAL,
				    "tensor \"%.200s\": data is NULL", x->name);
			goto out;
		}
		r = eng_nameset_add(&ns, x->name, len, i, &dup);
		if (r < 0) {
			r = set_err(c, r, "out of memory");
			goto out;
		}
		if (r == 0) {
			r = set_err(c, CKPT_E_DUPNAME,
				    "tensor %zu: name \"%.200s\" is also used "
				    "by tensor %zu",
				    i, x->name, dup);
			goto out;
		}
		cur = fmt_align_up(cur, FMT_STREAM_ALIGN);
		if (cur > UINT64_MAX - FMT_STREAM_ALIGN - nb) {
			r = set_err(c, -EINVAL,
				    "tensor \"%.200s\": total size overflows",
				    x->name);
			goto out;
		}
		e->stream_offset = cur;
		e->nbytes = nb;
		cur += nb;
		job->payload_total += nb;
		job->data[i] = x->data;
		names_bytes += len + 1;
	}
	job->stream_bytes = cur;
	job->nchunks = (cur + job->chunk_bytes - 1) / job->chunk_bytes;
	if (job->nchunks > SIZE_MAX / sizeof(*job->chunks)) {
		r = set_err(c, -ENOMEM, "step %llu: too many chunks",
			    (unsigned long long)step);
		goto out;
	}
	job->chunks =
		calloc(job->nchunks ? job->nchunks : 1, sizeof(*job->chunks));
	job->names = malloc(names_bytes ? names_bytes : 1);
	fmt_step_dirname(step, dname);
	job->stepdir = eng_path("%s/%s", c->root, dname);
	if (!job->chunks || !job->names || !job->stepdir) {
		r = set_err(c, -ENOMEM, "out of memory");
		goto out;
	}
	for (i = 0, np = job->names; i < n; i++) {
		memcpy(np, t[i].name, lens[i]);
		np[lens[i]] = 0;
		job->tensors[i].name = np;
		job->tensors[i].name_len = lens[i];
		np += lens[i] + 1;
	}
	if (getrandom(job->save_id, sizeof(job->save_id), GRND_NONBLOCK) !=
	    (ssize_t)sizeof(job->save_id)) {
		struct timespec ts;
		uint64_t a, b;

		clock_gettime(CLOCK_REALTIME, &ts);
		a = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		b = (uint64_t)getpid() ^ step;
		memcpy(job->save_id, &a, 8);
		memcpy(job->save_id + 8, &b, 8);
	}
	*out = job;
	job = NULL;
	r = 0;
out:
	eng_nameset_free(&ns);
	free(lens);
	eng_job_free(job);
	return r;
}

static int step_committed(const char *stepdir)
{
	char *p = eng_path("%s/" FMT_COMMIT_NAME, stepdir);
	struct stat st;
	int r;

	if (!p)
		return 0;
	r = stat(p, &st) == 0;
	free(p);
	return r;
}

/* Next free slot; NULL once the job failed. */
static eng_buf *acquire_slot(struct ckpt *c, eng_job *job)
{
	eng_buf *b = NULL;

	pthread_mutex_lock(&c->mu);
	while (!c->free_slots && job->status == 0)
		pthread_cond_wait(&c->slot_cv, &c->mu);
	if (job->status == 0) {
		b = c->free_slots;
		c->free_slots = b->next;
		c->nfree_slots--;
		b->next = NULL;
	}
	pthread_mutex_unlock(&c->mu);
	return b;
}

/*
 * Copy into a slot with streaming stores: the bytes are read next by
 * another core (hash, codec, DMA), so pulling the destination into this
 * core's cache (read-for-ownership) only costs memory bandwidth. dst is
 * 64-byte aligned: segments start at a chunk start or a tensor start.
 */
static void copy_to_slot(uint8_t *dst, const uint8_t *src, size_t n)
{
#ifdef __SSE2__
	if (n >= 65536 && ((uintptr_t)dst & 15) == 0) {
		__m128i *d = (__m128i *)dst;
		const __m128i *s = (const __m128i *)src;
		size_t i, k = n / 64;

		for (i = 0; i < k; i++, d += 4, s += 4) {
			__m128i a = _mm_loadu_si128(s);
			__m128i b = _mm_loadu_si128(s + 1);
			__m128i c = _mm_loadu_si128(s + 2);
			__m128i e = _mm_loadu_si128(s + 3);

			_mm_stream_si128(d, a);
			_mm_stream_si128(d + 1, b);
			_mm_stream_si128(d + 2, c);
			_mm_stream_si128(d + 3, e);
		}
		memcpy(d, s, n % 64);
		_mm_sfence();
		return;
	}
#endif
	memcpy(dst, src, n);
}

/* Copies stream bytes [lo, hi) into b; *ti is the tensor cursor. */
static void fill_slot(eng_job *job, eng_buf *b, uint64_t lo, uint64_t hi,
		      size_t *ti)
{
	uint8_t *dst = b->p + FMT_CHUNK_HDR_SIZE;
	uint64_t pos = lo, payload = 0;
	unsigned ew = 0;

	while (pos < hi) {
		const fmt_tensor_entry *e;
		uint64_t n;

		while (*ti < job->ntensors &&
		       job->tensors[*ti].stream_offset +
				       job->tensors[*ti].nbytes <=
			       pos)
			(*ti)++;
		if (*ti == job->ntensors) {
			memset(dst + (pos - lo), 0, hi - pos);
			break;
		}
		e = &job->tensors[*ti];
		if (!ew)
			ew = (unsigned)ckpt_dtype_size(e->dtype);
		if (pos < e->stream_offset) {
			n = (e->stream_offset < hi ? e->stream_offset : hi) -
			    pos;
			memset(dst + (pos - lo), 0, n);
		} else {
			uint64_t end = e->stream_offset + e->nbytes;

			n = (end < hi ? end : hi) - pos;
			copy_to_slot(dst + (pos - lo),
				     (const uint8_t *)job->data[*ti] +
					     (pos - e->stream_offset),
				     (size_t)n);
			payload += n;
		}
		pos += n;
	}
	b->raw_len = (uint32_t)(hi - lo);
	b->payload = payload;
	b->elem_width = (uint8_t)(ew ? ew : 1);
}

CKPT_API int ckpt_save(ckpt *c, uint64_t step, const ckpt_tensor *tensors,
		       size_t count)
{
	eng_job *job = NULL;
	size_t ti = 0;
	uint64_t k;
	int r;

	if (!c)
		return eng_err(NULL, -EINVAL, "ckpt_save: handle is NULL");
	if (!tensors && count > 0)
		return set_err(c, -EINVAL,
			       "ckpt_save: tensors is NULL but count is %zu",
			       count);
	if (c->s.staging_bytes == 0)
		return set_err(c, -EINVAL,
			       "ckpt_save: this handle was opened with "
			       "staging_bytes 0 and cannot save");
	r = build_job(c, step, tensors, count, &job);
	if (r < 0)
		return r;

	pthread_mutex_lock(&c->mu);
	if (c->busy) {
		r = eng_err(c->errmsg, CKPT_E_BUSY,
			    "ckpt_save(step %llu): step %llu is still being "
			    "saved",
			    (unsigned long long)step,
			    (unsigned long long)c->step);
		goto unlock_fail;
	}
	if (c->uncollected) {
		c->uncollected = 0;
		r = eng_err(c->errmsg, CKPT_E_PREVIOUS,
			    "ckpt_save(step %llu) not started: the save of "
			    "step %llu failed: %s",
			    (unsigned long long)step,
			    (unsigned long long)c->step, c->status_msg);
		goto unlock_fail;
	}
	if (step_committed(job->stepdir)) {
		r = eng_err(c->errmsg, CKPT_E_EXISTS,
			    "%s: step %llu is already committed", job->stepdir,
			    (unsigned long long)step);
		goto unlock_fail;
	}
	eng_job_free(c->job);
	c->job = job;
	c->job_pending = 1;
	c->busy = 1;
	c->state = CKPT_STATE_STAGING;
	c->status = 0;
	c->status_msg[0] = 0;
	c->step = step;
	c->bytes_total = job->payload_total;
	c->bytes_staged = c->bytes_written = c->bytes_committed = 0;
	c->bytes_stored = 0;
	c->copying = c->s.codec != CKPT_CODEC_NONE;
	pthread_cond_signal(&c->writer_cv);
	pthread_mutex_unlock(&c->mu);

	/* The step directory exists when ckpt_save() returns (the writer
	 * thread may not have run yet); gc spares it while we are busy. */
	r = eng_mkdir(job->stepdir, 0755);
	if (r < 0)
		eng_job_fail(c, job, r, "%s: mkdir: %s", job->stepdir,
			     ckpt_strerror(r));

	for (k = 0; k < job->nchunks; k++) {
		uint64_t lo = k * job->chunk_bytes;
		uint64_t hi = lo + job->chunk_bytes;
		eng_buf *b = acquire_slot(c, job);

		if (!b)
			break;
		if (hi > job->stream_bytes)
			hi = job->stream_bytes;
		fill_slot(job, b, lo, hi, &ti);
		b->job = job;
		b->k = k;
		pthread_mutex_lock(&c->mu);
		b->next = NULL;
		if (c->work_tail)
			c->work_tail->next = b;
		else
			c->work_head = b;
		c->work_tail = b;
		c->bytes_staged += b->payload;
		/* deferred workers would only wake up to sleep again */
		if (!c->copying || c->nfree_slots <= c->low_slots)
			pthread_cond_signal(&c->work_cv);
		pthread_mutex_unlock(&c->mu);
	}

	pthread_mutex_lock(&c->mu);
	free(job->data); /* the caller's buffers are theirs again */
	job->data = NULL;
	job->copy_done = 1;
	c->copying = 0;
	pthread_cond_broadcast(&c->work_cv);
	r = job->status;
	if (r == 0) {
		c->state = CKPT_STATE_WRITING;
	} else {
		job->reported = 1;
		eng_err(c->errmsg, r, "%s", job->msg);
	}
	pthread_mutex_unlock(&c->mu);
	eng_writer_wake(c);
	return r;

unlock_fail:
	pthread_mutex_unlock(&c->mu);
	eng_job_free(job);
	return r;
}

CKPT_API int ckpt_wait(ckpt *c)
{
	int r;

	if (!c)
		return eng_err(NULL, -EINVAL, "ckpt_wait: handle is NULL");
	pthread_mutex_lock(&c->mu);
	while (c->busy)
		pthread_cond_wait(&c->done_cv, &c->mu);
	r = c->status;
	if (r) {
		c->uncollected = 0;
		eng_err(c->errmsg, r, "%s", c->status_msg);
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

CKPT_API int ckpt_poll(ckpt *c, ckpt_progress *p)
{
	int r;

	if (!c)
		return eng_err(NULL, -EINVAL, "ckpt_poll: handle is NULL");
	pthread_mutex_lock(&c->mu);
	if (p) {
		memset(p, 0, sizeof(*p));
		p->step = c->step;
		p->state = c->state;
		p->status = c->status;
		p->bytes_total = c->bytes_total;
		p->bytes_staged = c->bytes_staged;
		p->bytes_written = c->bytes_written;
		p->bytes_committed = c->bytes_committed;
		p->bytes_stored = c->bytes_stored;
	}
	if (c->busy) {
		r = 1;
	} else {
		r = c->status;
		if (r) {
			c->uncollected = 0;
			eng_err(c->errmsg, r, "%s", c->status_msg);
		}
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}
