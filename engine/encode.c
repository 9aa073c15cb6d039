/*
 * encode.c - the compression workers: hash, encode and frame each filled
 * staging slot, then queue it for the writer.
 *
 * Design note. The caller's copy is what the training loop waits for, so
 * it should not share a core or memory bandwidth with compression: while
 * it runs and the pool has room (more than a quarter free), workers leave
 * compressed-codec chunks queued; they start when the copy ends or the pool
 * fills up. That costs at most the copy time of overlap on a
 * compression-bound save. Raw chunks (codec none: hash only) are processed
 * at once, so the disk starts writing during the copy. Workers are
 * SCHED_BATCH at a lower priority (eng_thread_background).
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

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
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
	/* hash + codec time, not the wait for a buffer (plan.c) */
	int64_t t = now_ns();

	b->raw_xxh3 = fmt_xxh3(raw, b->raw_len);
	t = now_ns() - t;
	if (job->codec != CKPT_CODEC_NONE && cx) {
		eng_buf *o = eng_pool_get_out(c, job);
		int r;

		if (!o) {
			eng_buf_release(c, b);
			return;
		}
		t -= now_ns();
		r = fmt_chunk_encode(cx, job->codec, job->level, b->elem_width,
				     raw, b->raw_len, o->p + FMT_CHUNK_HDR_SIZE,
				     o->cap - FMT_CHUNK_HDR_SIZE, &used,
				     &stored);
		t += now_ns();
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
	}
	pthread_mutex_unlock(&c->mu);
	fmt_codec_ctx_free(cx);
	return NULL;
}
