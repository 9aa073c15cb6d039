/*
 * pool.c - the bottom layer of the save side: the staging pool (slots and
 * compressed-output buffers), their reference counts and free lists, and
 * the status of a save (eng_job). Everything above (save.c, encode.c,
 * writer.c, the sinks, handle.c) uses this file; it uses none of them.
 *
 * Design note. Everything that costs page faults or allocations happens in
 * ckpt_open(): one mmap holds every staging slot and compressed-output
 * buffer, pre-faulted (huge pages where the kernel allows), left out of
 * fork() children (MADV_DONTFORK) and registered with io_uring by
 * handle.c. Slot layout: [64-byte chunk header][chunk_bytes
 * raw][pad to 4096], so a chunk that is stored raw is written straight from
 * its slot. A chunk that compresses moves to an output buffer and its slot
 * is freed at once. A buffer goes back to its free list when its last
 * reference is dropped; that wakes a copier or worker waiting for one, and
 * the writer if it is draining a failed save.
 *
 * Also here, because save.c (copy) and encode.c (borrow mode) both fill
 * slots from the caller's tensors: the slot fill, the fused copy + hash
 * of a chunk, and the count of workers reading borrowed memory.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "save_internal.h"

/* Compressed chunks the writer may have in the device at once (bounded by
 * settings.queue_depth); see eng_pool_alloc(). */
#define OUT_INFLIGHT 8u

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

void eng_buf_release(struct ckpt *c, eng_buf *b)
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
		eng_buf_release(c, b);
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

void eng_sink_release(eng_sink *s, eng_buf *b)
{
	atomic_fetch_sub_explicit(&s->held, 1, memory_order_relaxed);
	eng_buf_unref(s->c, b);
	if (s->index > 0)
		eng_writer_wake(s->c);
}

int eng_sink_fail(eng_sink *s, eng_job *job, int code, const char *fmt, ...)
{
	struct ckpt *c = s->c;
	char m[ENG_ERRMSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	if (s->index == 0)
		return eng_job_fail(c, job, code, "%s", m);
	pthread_mutex_lock(&c->mu);
	if (!atomic_load(&s->failed)) {
		s->status = code;
		snprintf(s->msg, sizeof(s->msg), "%.*s",
			 (int)sizeof(s->msg) - 1, m);
		atomic_store(&s->failed, 1);
	}
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
	eng_dedup_end(job);
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

void eng_slot_fill(eng_job *job, eng_buf *b, uint64_t lo, uint64_t hi,
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

size_t eng_stream_find(const eng_job *job, uint64_t pos)
{
	size_t lo = 0, hi = job->ntensors;

	/* tensor ends do not decrease along the stream */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const fmt_tensor_entry *e = &job->tensors[mid];

		if (e->stream_offset + e->nbytes <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Hash a block while it is in this core's cache, then stream it out: the
 * source crosses the memory bus once (copy, then hash of the copy, would
 * read it back). */
#define COPY_HASH_BLOCK (256u << 10)
uint64_t eng_copy_hash(uint8_t *dst, const uint8_t *src, size_t n)
{
	XXH3_state_t st;
	size_t off, k;

	XXH3_64bits_reset(&st);
	for (off = 0; off < n; off += k) {
		k = n - off < COPY_HASH_BLOCK ? n - off : COPY_HASH_BLOCK;
		XXH3_64bits_update(&st, src + off, k);
		copy_to_slot(dst + off, src + off, k);
	}
	return XXH3_64bits_digest(&st);
}

void eng_borrow_done(struct ckpt *c, eng_job *job, uint64_t payload)
{
	int wake;

	pthread_mutex_lock(&c->mu);
	job->breading--;
	c->bytes_staged += payload;
	wake = job->breading == 0 &&
	       (job->bnext == job->nchunks || job->status != 0);
	pthread_mutex_unlock(&c->mu);
	if (wake)
		eng_writer_wake(c);
}

/* Next free slot; NULL once the job failed. */
eng_buf *eng_pool_get_slot(struct ckpt *c, eng_job *job)
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

/* Next free output buffer; NULL once the job failed or at shutdown. */
eng_buf *eng_pool_get_out(struct ckpt *c, eng_job *job)
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
int eng_pool_alloc(struct ckpt *c)
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
		/* gs:// alone: no device, but the upload holds a compressed
		 * chunk's buffer until the piece it is in fills up and the
		 * server confirms it, and a piece fills only with more
		 * chunks. The sink sizes its pieces so that the unfilled
		 * ones hold at most half the output buffers (piece_size in
		 * sink_gcs.c); with a quarter of the pool (or 2 per worker
		 * + 8) that made pieces of one chunk, every chunk copied.
		 * Half the pool, at least 2 per file. */
		if (c->remote_only) {
			uint32_t nf =
				c->s.files_per_host ? c->s.files_per_host : 1;

			nout = (uint32_t)(budget / (2 * out_cap));
			if (nout < 2 * nf)
				nout = 2 * nf;
		}
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
	/* Not inherited by fork(): the pool is pinned by io_uring, and
	 * recent kernels copy pinned anonymous pages into the child at fork
	 * (no copy-on-write for them), which would cost every child (a
	 * DataLoader worker) a whole pool at once. A child must not touch
	 * the pool; ckpt_close there leaves the range alone (handle.c). */
	c->mem_dontfork = madvise(m, c->mem_bytes, MADV_DONTFORK) == 0;
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
		b->fixed = start / ENG_REG_PIECE == (start + b->cap - 1) /
							    ENG_REG_PIECE ?
				   (int)(start / ENG_REG_PIECE) :
				   -1;
		atomic_init(&b->refs, 0);
		buf_release_locked(c, b);
	}
	return 0;
}
