/*
 * reader_worker.c - the worker threads of the read pipeline: each takes a
 * chunk job off the queue, checks its header against the index and its
 * raw bytes against the index's XXH3, decodes it and scatters it into the
 * requests it feeds (straight into their targets when each target's bytes
 * in the chunk are one run), then gives the buffer back.
 *
 * Split from reader_pipeline.c (the calling thread's side: fd cache,
 * buffers, io_uring, dispatch), whose locking rules apply: r->mu guards
 * the queue, the free list and r->busy. The data path is described in
 * reader_internal.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "reader_internal.h"

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
	return rd_host_tensor_at(r, j->host, ce->stream_offset,
			      ce->stream_offset + ce->raw_len);
}

void rd_io_msg(const ckpt_reader *r, const struct rd_batch *b,
	       const struct rd_job *j, char *msg, size_t len, const char *what)
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

/* The chunk header in j->buf against the chunk's index entry. */
static int rd_check_hdr(const ckpt_reader *r, const struct rd_batch *b,
			const struct rd_job *j, char *msg, size_t len)
{
	const fmt_chunk_entry *ce = &r->hosts[j->host].ix.chunks[j->chunk];
	char err[512];
	fmt_chunk_hdr h;
	int rc;

	err[0] = 0;
	rc = fmt_chunk_hdr_decode(j->buf, FMT_CHUNK_HDR_SIZE, &h, err,
				  sizeof(err));
	if (rc < 0) {
		rd_io_msg(r, b, j, msg, len, err);
		return rc == CKPT_E_VERSION ? rc : CKPT_E_CORRUPT;
	}
	if (h.codec != ce->codec || h.elem_width != ce->elem_width ||
	    h.raw_len != ce->raw_len || h.stored_len != ce->stored_len ||
	    h.stream_offset != ce->stream_offset ||
	    h.raw_xxh3 != ce->raw_xxh3) {
		rd_io_msg(r, b, j, msg, len,
			     "chunk header disagrees with the index");
		return CKPT_E_CORRUPT;
	}
	return 0;
}

/* The worker's codec context, made on first use; NULL when out of
 * memory. Decodes fault a target's fresh pages in a block at a time. */
static fmt_codec_ctx *rd_worker_cc(struct rd_worker *w)
{
	if (!w->cc && (w->cc = fmt_codec_ctx_new()))
		fmt_codec_ctx_set_prepare(w->cc, eng_prefault_write);
	return w->cc;
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
	const uint8_t *payload = j->buf + FMT_CHUNK_HDR_SIZE;
	uint8_t *out;
	int rc;

	rc = rd_check_hdr(r, b, j, msg, len);
	if (rc < 0)
		return rc;
	if (ce->codec == CKPT_CODEC_NONE) {
		out = (uint8_t *)payload;
	} else {
		out = into;
		if (!out) {
			if (w->rawcap < ce->raw_len) {
				uint8_t *nb = malloc(ce->raw_len);

				if (!nb) {
					rd_io_msg(r, b, j, msg, len,
						     "out of memory");
					return -ENOMEM;
				}
				free(w->raw);
				w->raw = nb;
				w->rawcap = ce->raw_len;
			}
			out = w->raw;
		}
		if (!rd_worker_cc(w)) {
			rd_io_msg(r, b, j, msg, len, "out of memory");
			return -ENOMEM;
		}
		err[0] = 0;
		rc = fmt_chunk_decode(w->cc, ce->codec, ce->elem_width,
				      payload, ce->stored_len, out,
				      ce->raw_len, err, sizeof(err));
		if (rc < 0) {
			snprintf(what, sizeof(what), "chunk does not decode: %s",
				 err);
			rd_io_msg(r, b, j, msg, len, what);
			return rc == -ENOMEM ? rc : CKPT_E_CORRUPT;
		}
	}
	if (fmt_xxh3(out, ce->raw_len) != ce->raw_xxh3) {
		rd_io_msg(r, b, j, msg, len, "chunk checksum mismatch");
		return CKPT_E_CORRUPT;
	}
	*raw = out;
	return 0;
}

/* Parts of one chunk decoded straight into their targets (on the
 * worker's stack: the read path allocates nothing per chunk). */
#define RD_MAX_PARTS 32

/* The job's targets as the parts of its chunk (gaps: hash only), sorted;
 * 0 when they do not fit that form (a target over several rows, overlaps,
 * a boundary inside an element, too many). */
static size_t rd_parts(const ckpt_reader *r, const struct rd_batch *b,
		       const struct rd_job *j, fmt_part *p)
{
	const fmt_chunk_entry *ce = &r->hosts[j->host].ix.chunks[j->chunk];
	fmt_part run[RD_MAX_PARTS / 2];
	size_t n = 0, np = 0;
	uint64_t pos = 0;

	if (j->t1 - j->t0 > RD_MAX_PARTS / 2)
		return 0;
	for (size_t t = j->t0; t < j->t1; t++) {
		uint64_t lo, hi;
		uint8_t *dst;
		int k = rd_tg_span(&b->tg[b->tmap[t]], ce->stream_offset,
				   ce->raw_len, &lo, &hi, &dst);
		size_t i;

		if (k < 0)
			return 0;
		if (k == 0)
			continue;
		for (i = n; i > 0 && run[i - 1].off > lo; i--)
			run[i] = run[i - 1];
		run[i].off = lo;
		run[i].len = hi - lo;
		run[i].dst = dst;
		n++;
	}
	for (size_t i = 0; i < n; i++) {
		if (run[i].off < pos)
			return 0; /* two targets want the same bytes */
		if (run[i].off > pos)
			p[np++] = (fmt_part){ pos, run[i].off - pos, NULL };
		p[np++] = run[i];
		pos = run[i].off + run[i].len;
	}
	if (pos < ce->raw_len)
		p[np++] = (fmt_part){ pos, ce->raw_len - pos, NULL };
	for (size_t i = 0; i + 1 < np; i++)
		if ((p[i].off + p[i].len) % ce->elem_width)
			return 0;
	return np;
}

/*
 * A chunk feeding its targets, each one run of its bytes: decoded (codec
 * none: copied) once straight into them, hashed on the way a block at a
 * time (no decode into the worker's buffer and copy out, no second pass
 * for the hash). 1 done, 0 not that case, < 0 failed (*msg set).
 */
static int rd_decode_parts(struct rd_worker *w, const struct rd_batch *b,
			   const struct rd_job *j, char *msg, size_t len)
{
	const ckpt_reader *r = w->r;
	const fmt_chunk_entry *ce = &r->hosts[j->host].ix.chunks[j->chunk];
	fmt_part parts[RD_MAX_PARTS + 1];
	char err[512], what[768];
	size_t np;
	uint64_t h;
	int rc;

	if (b->cache_fill)
		return 0;
	if (!rd_worker_cc(w))
		return 0; /* the general path says it */
	np = rd_parts(r, b, j, parts);
	if (np == 0)
		return 0;
	rc = rd_check_hdr(r, b, j, msg, len);
	if (rc < 0)
		return rc;
	err[0] = 0;
	rc = fmt_chunk_decode_parts(w->cc, ce->codec, ce->elem_width,
				    j->buf + FMT_CHUNK_HDR_SIZE, ce->stored_len,
				    ce->raw_len, parts, np, &h, err,
				    sizeof(err));
	if (rc == -EINVAL && !err[0])
		return 0; /* parts refused: the general path */
	if (rc < 0) {
		snprintf(what, sizeof(what), "chunk does not decode: %s", err);
		rd_io_msg(r, b, j, msg, len, what);
		return rc == -ENOMEM ? rc : CKPT_E_CORRUPT;
	}
	if (h != ce->raw_xxh3) {
		rd_io_msg(r, b, j, msg, len, "chunk checksum mismatch");
		return CKPT_E_CORRUPT;
	}
	return 1;
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
		into = rd_tg_inside_row(&b->tg[b->tmap[j->t0]],
				     ce->stream_offset, ce->raw_len);
	/* through the parts path even for one target (one part): each
	 * block is copied or decoded into its target and hashed while in
	 * the cache, instead of hashing the whole chunk in a second pass
	 * (warm 4 GiB float restore: workers' time -18%) */
	rc = rd_decode_parts(w, b, j, msg, sizeof(msg));
	if (rc < 0)
		rd_job_fail(r, b, j, rc, msg);
	if (rc != 0)
		return;
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
		rd_tg_scatter(tg, ce->stream_offset, raw, ce->raw_len);
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

void *rd_worker_main(void *arg)
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
