/*
 * encode.c - the compression workers: hash, encode and frame each filled
 * staging slot, then queue it for the writer.
 *
 * Design note. The caller's copy is what the training loop waits for, so
 * it should not share its core with compression: while it runs and the
 * pool has room (more than a quarter free), at most one worker per other
 * core (c->copy_encoders = CPUs - 1) encodes compressed-codec chunks, and
 * the rest of them wait until the copy ends or the pool fills up. On 2
 * cores that is one encoder beside the copy: a 4 GiB bf16 save with the
 * float codec became durable 7% sooner than with none (every worker
 * waiting, as before 2026-12-04), with the same stall. Raw chunks (codec
 * none: hash only) are processed at once, so the disk starts writing
 * during the copy. Workers are SCHED_BATCH at a lower priority
 * (eng_thread_background).
 *
 * Borrow mode (CKPT_SAVE_BORROW): ckpt_save() copies nothing and the
 * workers take chunks straight from the caller's memory (borrow_chunk
 * says how), counting themselves in job->breading while they read it;
 * the writer releases the memory to the caller once no worker reads it
 * and none will (writer.c).
 *
 * Uses pool.c (and adds each chunk's hash + codec time to plan.c's
 * counters, atomics); the writer is reached through the queue wq_head and
 * the eventfd (eng_writer_wake), never by a call into writer.c.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "plan.h"
#include "save_internal.h"

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

/* Frames dst's chunk (header, zero pad) and queues it for the writer. */
static void frame_push(struct ckpt *c, eng_job *job, eng_buf *dst, int used,
		       size_t stored)
{
	fmt_chunk_hdr h;

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

/* Hash, encode, frame one filled slot and hand it to the writer. */
static void encode_chunk(struct ckpt *c, fmt_codec_ctx *cx, eng_buf *b)
{
	eng_job *job = b->job;
	const uint8_t *raw = b->p + FMT_CHUNK_HDR_SIZE;
	eng_buf *dst = b;
	size_t stored = b->raw_len;
	int used = CKPT_CODEC_NONE;
	/* hash + codec time, not the wait for a buffer (plan.c) */
	int64_t t = eng_mono_ns();

	/* XXH3 (and with dedup XXH3-128) of the raw bytes */
	if (eng_dedup_match(job, b, raw)) { /* no codec, no sink */
		push_writer(c, b);
		return;
	}
	t = eng_mono_ns() - t;
	if (job->codec != CKPT_CODEC_NONE && cx) {
		eng_buf *o = eng_pool_get_out(c, job);
		int r;

		if (!o) {
			eng_buf_release(c, b);
			return;
		}
		t -= eng_mono_ns();
		r = fmt_chunk_encode(cx, job->codec, job->level, b->elem_width,
				     raw, b->raw_len, o->p + FMT_CHUNK_HDR_SIZE,
				     o->cap - FMT_CHUNK_HDR_SIZE, &used,
				     &stored);
		t += eng_mono_ns();
		if (r < 0) {
			eng_job_fail(
				c, job, r,
				"step %llu: chunk at stream offset %llu: "
				"encoding with codec %s failed: %s",
				(unsigned long long)job->step,
				(unsigned long long)b->k * job->chunk_bytes,
				ckpt_codec_name(job->codec), ckpt_strerror(r));
			eng_buf_release(c, o);
			eng_buf_release(c, b);
			return;
		}
		if (used != CKPT_CODEC_NONE && stored < b->raw_len) {
			o->job = job;
			o->k = b->k;
			o->raw_len = b->raw_len;
			o->elem_width = b->elem_width;
			o->raw_xxh3 = b->raw_xxh3;
			memcpy(o->h128, b->h128, sizeof(o->h128));
			o->reuse = 0;
			o->payload = b->payload;
			dst = o;
			eng_buf_release(c, b);
		} else {
			used = CKPT_CODEC_NONE;
			stored = b->raw_len;
			eng_buf_release(c, o);
		}
	}
	/* b may be back in the pool (and refilled) by now: not b->raw_len */
	eng_plan_enc(c, job->codec, (uint64_t)t, dst->raw_len, stored);
	frame_push(c, job, dst, used, stored);
}

/*
 * Borrow mode: chunk k read from the caller's memory, which ckpt_save()
 * lent without copying. A chunk inside one tensor is hashed and encoded
 * from there into an output buffer (fmt_chunk_encode copies it there if
 * it does not shrink), or with codec none copied and hashed in one pass
 * into a slot. A chunk that spans tensors (or the zeros between them) is
 * gathered into a slot and takes the copy path. Raw chunks are copied, not
 * written from the caller's memory: the file has the 64-byte chunk header
 * before the payload, so the payload sits at no block boundary and
 * O_DIRECT (block-aligned memory and lengths) cannot take it; buffered
 * writes would copy it into the page cache anyway, and the upload sink
 * would hold the caller's memory until the server confirmed it. So one
 * copy, off the caller's thread, and the sinks see only pool buffers.
 * Nothing reads the caller's memory after eng_borrow_done().
 */
static void borrow_chunk(struct ckpt *c, fmt_codec_ctx *cx, eng_job *job,
			 uint64_t k)
{
	uint64_t lo = k * job->chunk_bytes;
	uint64_t hi = lo + job->chunk_bytes;
	size_t ti, stored;
	const fmt_tensor_entry *e;
	const uint8_t *src;
	int used = CKPT_CODEC_NONE, r = 0;
	eng_buf *b;
	int64_t t;

	if (hi > job->stream_bytes)
		hi = job->stream_bytes;
	ti = eng_stream_find(job, lo);
	e = ti < job->ntensors ? &job->tensors[ti] : NULL;
	if (!e || e->stream_offset > lo || e->stream_offset + e->nbytes < hi) {
		b = eng_pool_get_slot(c, job);
		if (b) {
			eng_slot_fill(job, b, lo, hi, &ti);
			b->job = job;
			b->k = k;
		}
		eng_borrow_done(c, job, b ? b->payload : 0);
		if (b)
			encode_chunk(c, cx, b);
		return;
	}
	src = (const uint8_t *)job->data[ti] + (lo - e->stream_offset);
	b = job->codec == CKPT_CODEC_NONE ? eng_pool_get_slot(c, job) :
					    eng_pool_get_out(c, job);
	if (!b) {
		eng_borrow_done(c, job, 0);
		return;
	}
	b->job = job;
	b->k = k;
	b->raw_len = (uint32_t)(hi - lo);
	b->payload = hi - lo;
	b->elem_width = (uint8_t)ckpt_dtype_size(e->dtype);
	stored = b->raw_len;
	t = eng_mono_ns();
	if (job->version && eng_dedup_match(job, b, src)) {
		eng_borrow_done(c, job, b->payload);
		push_writer(c, b);
		return;
	}
	if (job->codec == CKPT_CODEC_NONE) {
		b->raw_xxh3 = eng_copy_hash(b->p + FMT_CHUNK_HDR_SIZE, src,
					    b->raw_len);
	} else {
		if (!job->version) /* else eng_dedup_match hashed it */
			b->raw_xxh3 = fmt_xxh3(src, b->raw_len);
		r = fmt_chunk_encode(cx, job->codec, job->level, b->elem_width,
				     src, b->raw_len, b->p + FMT_CHUNK_HDR_SIZE,
				     b->cap - FMT_CHUNK_HDR_SIZE, &used,
				     &stored);
	}
	t = eng_mono_ns() - t;
	eng_borrow_done(c, job, r < 0 ? 0 : b->payload);
	if (r < 0) {
		eng_job_fail(c, job, r,
			     "step %llu: chunk at stream offset %llu: "
			     "encoding with codec %s failed: %s",
			     (unsigned long long)job->step,
			     (unsigned long long)lo,
			     ckpt_codec_name(job->codec), ckpt_strerror(r));
		eng_buf_release(c, b);
		return;
	}
	eng_plan_enc(c, job->codec, (uint64_t)t, b->raw_len, stored);
	frame_push(c, job, b, used, stored);
}

/* Work for a worker (under mu): a filled slot, unless compression waits
 * for the copy (see the top). */
static int work_ready(const struct ckpt *c)
{
	if (!c->work_head)
		return 0;
	return !c->copying || c->nfree_slots <= c->low_slots ||
	       c->work_head->job->status != 0 ||
	       c->encoding < c->copy_encoders;
}

/* A borrowed save with chunks left to read (under mu). */
static eng_job *borrow_ready(const struct ckpt *c)
{
	eng_job *j = c->bjob;

	return j && j->status == 0 && j->bnext < j->nchunks ? j : NULL;
}

void *eng_worker_main(void *arg)
{
	struct ckpt *c = arg;
	fmt_codec_ctx *cx = NULL;

	eng_thread_background(5);
	/* a handle opened with codec none has no output buffers, and its
	 * saves cannot ask for a codec (ckpt_save_ex) */
	if (c->s.codec != CKPT_CODEC_NONE)
		cx = fmt_codec_ctx_new();
	pthread_mutex_lock(&c->mu);
	for (;;) {
		eng_buf *b;
		eng_job *bj;
		uint64_t k;
		int failed;

		while (!work_ready(c) && !borrow_ready(c) && !c->shutdown)
			pthread_cond_wait(&c->work_cv, &c->mu);
		b = work_ready(c) || c->shutdown ? c->work_head : NULL;
		if (!b && (bj = borrow_ready(c)) != NULL) {
			k = bj->bnext++;
			bj->breading++;
			pthread_mutex_unlock(&c->mu);
			if (bj->codec != CKPT_CODEC_NONE && !cx)
				cx = fmt_codec_ctx_new();
			if (bj->codec != CKPT_CODEC_NONE && !cx) {
				eng_job_fail(c, bj, -ENOMEM,
					     "step %llu: out of memory for a "
					     "codec context",
					     (unsigned long long)bj->step);
				eng_borrow_done(c, bj, 0);
			} else {
				borrow_chunk(c, cx, bj, k);
			}
			pthread_mutex_lock(&c->mu);
			continue;
		}
		if (!b)
			break;
		c->work_head = b->next;
		if (!c->work_head)
			c->work_tail = NULL;
		b->next = NULL;
		failed = b->job->status != 0;
		c->encoding++;
		pthread_mutex_unlock(&c->mu);
		/* A context that could not be made at startup is retried,
		 * so a passing memory shortage does not fail every save. */
		if (!failed && b->job->codec != CKPT_CODEC_NONE && !cx)
			cx = fmt_codec_ctx_new();
		if (failed) {
			eng_buf_release(c, b);
		} else if (b->job->codec != CKPT_CODEC_NONE && !cx) {
			eng_job_fail(c, b->job, -ENOMEM,
				     "step %llu: out of memory for a codec "
				     "context",
				     (unsigned long long)b->job->step);
			eng_buf_release(c, b);
		} else {
			encode_chunk(c, cx, b);
		}
		pthread_mutex_lock(&c->mu);
		c->encoding--;
	}
	pthread_mutex_unlock(&c->mu);
	fmt_codec_ctx_free(cx);
	return NULL;
}
