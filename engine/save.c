/*
 * save.c - ckpt_save(): validation, the layout of the host stream, and the
 * copy of the caller's tensors into staging slots; ckpt_wait/ckpt_poll.
 *
 * Design note. ckpt_save() validates, copies the caller's tensors chunk by
 * chunk into free slots in the caller's thread (blocking while the pool is
 * full: backpressure, so peak memory is the pool whatever the state size)
 * and returns when the last byte is copied. Workers (encode.c) hash and
 * encode each slot; the writer thread (writer.c) puts the results into the
 * sinks. This file talks to them only through the pool and the queues
 * (pool.c, save_internal.h): it calls nothing in encode.c or writer.c.
 *
 * Borrow mode (CKPT_SAVE_BORROW): ckpt_save_ex() validates, queues the job
 * with c->bjob set and returns: the workers read the caller's memory
 * (encode.c) and the writer gives it back (writer.c, borrow_settle);
 * ckpt_wait_released() waits for that.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "plan.h"
#include "save_internal.h"

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

CKPT_API void ckpt_save_opts_default(ckpt_save_opts *o)
{
	if (!o)
		return;
	memset(o, 0, sizeof(*o));
	o->codec = CKPT_SAVE_DEFAULT;
	o->level = CKPT_SAVE_DEFAULT;
	o->reason = CKPT_REASON_UNSPECIFIED;
}

/* Validates o against the handle; fills codec/level/reason/deadline. */
static int apply_opts(struct ckpt *c, const ckpt_save_opts *o, int32_t *codec,
		      int32_t *level, int32_t *reason, int64_t *deadline)
{
	struct timespec now;
	size_t i;

	*codec = c->s.codec;
	*level = c->s.level;
	*reason = CKPT_REASON_UNSPECIFIED;
	*deadline = 0;
	if (!o)
		return 0;
	for (i = 0; i < sizeof(o->reserved) / sizeof(o->reserved[0]); i++)
		if (o->reserved[i])
			return set_err(c, -EINVAL,
				       "ckpt_save_ex: opts.reserved[%zu] must "
				       "be zero (use ckpt_save_opts_default)",
				       i);
	if (o->flags & ~CKPT_SAVE_BORROW)
		return set_err(c, -EINVAL,
			       "ckpt_save_ex: opts.flags: unknown bits 0x%x",
			       o->flags & ~CKPT_SAVE_BORROW);
	if (o->reason < 0 || o->reason >= CKPT_REASON_COUNT)
		return set_err(c, -EINVAL,
			       "ckpt_save_ex: opts.reason: unknown reason %d",
			       (int)o->reason);
	if (o->codec != CKPT_SAVE_DEFAULT) {
		if (o->codec < 0 || o->codec >= CKPT_CODEC_COUNT)
			return set_err(c, -EINVAL,
				       "ckpt_save_ex: opts.codec: unknown "
				       "codec %d",
				       (int)o->codec);
		if (o->codec != CKPT_CODEC_NONE && c->nout == 0)
			return set_err(c, -EINVAL,
				       "ckpt_save_ex: opts.codec %s: this "
				       "handle was opened with codec none and "
				       "has no compression buffers",
				       ckpt_codec_name(o->codec));
		*codec = o->codec;
	}
	if (o->level != CKPT_SAVE_DEFAULT) {
		if (o->level < ZSTD_minCLevel() || o->level > ZSTD_maxCLevel())
			return set_err(c, -EINVAL,
				       "ckpt_save_ex: opts.level: %d outside "
				       "zstd's [%d, %d]",
				       (int)o->level, ZSTD_minCLevel(),
				       ZSTD_maxCLevel());
		*level = o->level;
	}
	if (o->deadline_ns < 0)
		return set_err(c, -EINVAL,
			       "ckpt_save_ex: opts.deadline_ns is negative");
	clock_gettime(CLOCK_REALTIME, &now);
	if (o->deadline_ns &&
	    o->deadline_ns <= (int64_t)now.tv_sec * 1000000000 + now.tv_nsec)
		return set_err(c, -ETIMEDOUT,
			       "ckpt_save_ex: the deadline has passed; "
			       "nothing was saved");
	*reason = o->reason;
	*deadline = o->deadline_ns;
	return 0;
}

CKPT_API int ckpt_save(ckpt *c, uint64_t step, const ckpt_tensor *tensors,
		       size_t count)
{
	return ckpt_save_ex(c, step, tensors, count, NULL);
}

CKPT_API int ckpt_save_ex(ckpt *c, uint64_t step, const ckpt_tensor *tensors,
			  size_t count, const ckpt_save_opts *o)
{
	eng_job *job = NULL;
	int32_t codec, level, reason;
	int64_t deadline;
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
	/* the index and COMMIT documents hold the step as a JSON integer of
	 * at most 2^63-1 (SPEC.md): refuse before copying anything */
	if (step > (uint64_t)INT64_MAX)
		return set_err(c, -EINVAL,
			       "ckpt_save: step %llu is above 2^63-1, the "
			       "largest step the format records",
			       (unsigned long long)step);
	r = apply_opts(c, o, &codec, &level, &reason, &deadline);
	if (r < 0)
		return r;
	r = build_job(c, step, tensors, count, &job);
	if (r < 0)
		return r;
	job->codec = codec;
	job->level = level;
	job->reason = reason;
	job->deadline_ns = deadline;
	job->borrow = o && (o->flags & CKPT_SAVE_BORROW);
	/* a notice's save: its codec and any periodic save in flight are
	 * planned against the deadline (plan.c) */
	if (eng_watch_is_notice(reason))
		eng_plan_before_save(c, job,
				     o && o->codec != CKPT_SAVE_DEFAULT);
	eng_dedup_begin(c, job);

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
	c->reason = reason;
	eng_watch_save_started(c, step, reason);
	c->bytes_total = job->payload_total;
	c->bytes_staged = c->bytes_written = c->bytes_committed = 0;
	c->bytes_stored = 0;
	c->copying = !job->borrow && job->codec != CKPT_CODEC_NONE;
	if (job->borrow) { /* the workers read the caller's memory now */
		c->bjob = job;
		pthread_cond_broadcast(&c->work_cv);
	}
	pthread_cond_signal(&c->writer_cv);
	pthread_mutex_unlock(&c->mu);

	/* The step directory exists when ckpt_save() returns (the writer
	 * thread may not have run yet); gc spares it while we are busy. */
	r = c->remote_only || job->to_remote ? 0 :
					       eng_mkdir(job->stepdir, 0755);
	if (r < 0)
		eng_job_fail(c, job, r, "%s: mkdir: %s", job->stepdir,
			     ckpt_strerror(r));

	for (k = 0; !job->borrow && k < job->nchunks; k++) {
		uint64_t lo = k * job->chunk_bytes;
		uint64_t hi = lo + job->chunk_bytes;
		eng_buf *b = eng_pool_get_slot(c, job);

		if (!b)
			break;
		if (hi > job->stream_bytes)
			hi = job->stream_bytes;
		eng_slot_fill(job, b, lo, hi, &ti);
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
		if (!c->copying || c->nfree_slots <= c->low_slots ||
		    c->encoding < c->copy_encoders)
			pthread_cond_signal(&c->work_cv);
		pthread_mutex_unlock(&c->mu);
	}

	pthread_mutex_lock(&c->mu);
	/* borrowed: the writer releases it */
	if (!job->borrow) {
		free(job->data); /* the caller's buffers are theirs again */
		job->data = NULL;
		job->copy_done = 1;
		c->copying = 0;
		pthread_cond_broadcast(&c->work_cv);
	}
	r = job->status;
	if (r == 0) {
		if (!job->borrow)
			c->state = CKPT_STATE_WRITING;
		pthread_mutex_unlock(&c->mu);
		eng_writer_wake(c);
		return 0;
	}
	/* The save failed while we copied. Return only once the writer has
	 * finished with it (partial output removed), so that a failed
	 * ckpt_save() is over: the caller may save again at once instead of
	 * racing the clean-up into CKPT_E_BUSY. The first failure's message
	 * does not change; copy it before the job can be replaced. */
	job->reported = 1;
	char msg[ENG_ERRMSG_MAX];
	memcpy(msg, job->msg, sizeof(msg));
	pthread_mutex_unlock(&c->mu);
	eng_writer_wake(c);
	pthread_mutex_lock(&c->mu);
	while (c->busy)
		pthread_cond_wait(&c->done_cv, &c->mu);
	/* borrowed, the writer does not wait for us (copy_done is its own)
	 * and may have finished before `reported` was set: told here */
	if (c->job == job)
		c->uncollected = 0;
	eng_err(c->errmsg, r, "%s", msg);
	pthread_mutex_unlock(&c->mu);
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

CKPT_API int ckpt_wait_released(ckpt *c, int timeout_ms)
{
	struct timespec dl;
	int r = 0;

	if (!c)
		return eng_err(NULL, -EINVAL,
			       "ckpt_wait_released: handle is NULL");
	eng_realtime_after_ms(&dl, timeout_ms);
	pthread_mutex_lock(&c->mu);
	while (c->busy && c->job && c->job->borrow && !c->job->copy_done &&
	       r == 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&c->done_cv, &c->mu);
		else
			r = -pthread_cond_timedwait(&c->done_cv, &c->mu, &dl);
	}
	if (r)
		eng_err(c->errmsg, r,
			"ckpt_wait_released: step %llu: the engine still "
			"reads the caller's buffers",
			(unsigned long long)c->step);
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
		p->reason = c->reason;
		for (unsigned i = 1; i < c->nsinks; i++)
			p->sinks_failed += c->sinks[i]->status < 0;
	}
	/* observes only: the status stays for ckpt_wait(), the next
	 * ckpt_save() (CKPT_E_PREVIOUS) or ckpt_close() */
	if (c->busy) {
		r = 1;
	} else {
		r = c->status;
		if (r)
			eng_err(c->errmsg, r, "%s", c->status_msg);
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}
