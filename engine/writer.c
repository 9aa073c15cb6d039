/*
 * writer.c - the writer thread: dispatch of encoded chunks to the sinks,
 * then the host index, commit and retention.
 *
 * Design note. One writer thread per handle turns encoded chunks into this
 * host's files. It is a dispatcher: it gives each arriving chunk a file
 * (chunk index mod files) and the next 4096-aligned offset in it, records
 * the chunk in the index, feeds the bytes to that file's streaming XXH3 (in
 * file order, so the whole-file hash is known without reading anything
 * back) and hands the buffer to every sink. Sinks are the extension point
 * (eng_sink_ops; the local one is sink_local.c); an uploader can be added
 * as a second sink receiving the same buffers in the same order. A buffer
 * returns to the pool when its last reference is dropped.
 *
 * The thread sleeps on the handle's eventfd while a save runs: workers post
 * to it when they queue a chunk, the ring posts to it on every completion,
 * and ckpt_save() posts when its copy ends (in borrow mode the worker that
 * ends the last read of the caller's memory does, and the writer releases
 * that memory: borrow_settle). The sleep is bounded (wait_wake) so that a
 * ring that never completes a write is noticed (sink_local.c,
 * ls_stalled). A failure stops submission,
 * drains what is in flight, waits until every buffer of the save is back,
 * then removes this save's temporary files. The previous checkpoint and
 * `latest` are never touched before the new COMMIT exists.
 *
 * Uses pool.c, the sinks' ops and commit.c; nothing in save.c or encode.c.
 */
#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "save_internal.h"

static int remove_stale(struct ckpt *c, eng_job *job)
{
	char pfx1[16], pfx2[16];
	struct dirent *de;
	DIR *d;
	int r = 0;

	snprintf(pfx1, sizeof(pfx1), "h%05u-", c->s.host_index);
	snprintf(pfx2, sizeof(pfx2), "h%05u.", c->s.host_index);
	d = opendir(job->stepdir);
	if (!d)
		return 0;
	while ((de = readdir(d)) != NULL) {
		char *p;
		int e;

		if (strncmp(de->d_name, pfx1, strlen(pfx1)) &&
		    strncmp(de->d_name, pfx2, strlen(pfx2)))
			continue;
		p = eng_path("%s/%s", job->stepdir, de->d_name);
		if (!p) {
			r = eng_job_fail(c, job, -ENOMEM, "out of memory");
			break;
		}
		e = eng_unlink(p);
		if (e < 0 && e != -ENOENT) {
			r = eng_job_fail(c, job, e,
					 "%s: removing a stale file: %s", p,
					 ckpt_strerror(e));
			free(p);
			break;
		}
		free(p);
	}
	closedir(d);
	return r;
}

static int prepare(struct ckpt *c, eng_job *job)
{
	uint64_t nf64 = job->nchunks ? job->nchunks : 1, k;
	uint32_t n, f;
	void *hdrs = NULL;
	int r;

	/* gs:// (alone, or a notice's save the planner sent to the
	 * remote): no directory; objects are replaced or create-only */
	int remote = c->remote_only || job->to_remote;

	r = remote ? 0 : eng_mkdir(job->stepdir, 0755);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s: mkdir: %s", job->stepdir,
				    ckpt_strerror(r));
	r = remote ? 0 : remove_stale(c, job);
	if (r < 0)
		return r;
	n = nf64 < c->s.files_per_host ? (uint32_t)nf64 : c->s.files_per_host;
	job->nfiles = n;
	job->files = calloc(n, sizeof(*job->files));
	job->file_end = calloc(n, sizeof(*job->file_end));
	job->file_cap = calloc(n, sizeof(*job->file_cap));
	job->fhash = calloc(n, sizeof(*job->fhash));
	if (posix_memalign(&hdrs, FMT_ALIGN, (size_t)n * FMT_SHARD_HDR_SIZE))
		hdrs = NULL;
	job->hdrs = hdrs;
	if (!job->files || !job->file_end || !job->file_cap || !job->fhash ||
	    !job->hdrs)
		return eng_job_fail(c, job, -ENOMEM, "out of memory");
	for (f = 0; f < n; f++) {
		fmt_shard_hdr h;

		fmt_shard_name(c->s.host_index, f, job->files[f].name);
		job->files[f].host = c->s.host_index;
		job->files[f].kind = CKPT_FILE_SHARD;
		memset(&h, 0, sizeof(h));
		h.step = job->step;
		memcpy(h.save_id, job->save_id, sizeof(h.save_id));
		h.host_index = c->s.host_index;
		h.host_count = c->s.host_count;
		h.file_index = f;
		h.version = job->version;
		fmt_shard_hdr_encode(
			&h, job->hdrs + (size_t)f * FMT_SHARD_HDR_SIZE);
		job->file_end[f] = job->file_cap[f] = FMT_SHARD_HDR_SIZE;
		job->fhash[f] = XXH3_createState();
		if (!job->fhash[f])
			return eng_job_fail(c, job, -ENOMEM, "out of memory");
		XXH3_64bits_reset(job->fhash[f]);
		XXH3_64bits_update(job->fhash[f],
				   job->hdrs + (size_t)f * FMT_SHARD_HDR_SIZE,
				   FMT_SHARD_HDR_SIZE);
	}
	for (k = 0; k < job->nchunks; k++) {
		uint64_t lo = k * job->chunk_bytes;
		uint64_t raw = job->stream_bytes - lo < job->chunk_bytes ?
				       job->stream_bytes - lo :
				       job->chunk_bytes;

		job->file_cap[k % n] += fmt_chunk_span((uint32_t)raw);
	}
	return 0;
}

/* A secondary sink that holds sink_lag_max buffers is detached for this
 * save (save_internal.h explains why not a backlog). */
static int sink_takes(struct ckpt *c, eng_job *job, eng_sink *s)
{
	unsigned held;

	if (!s->active)
		return 0;
	if (atomic_load(&s->failed)) {
		s->active = 0;
		return 0;
	}
	held = atomic_load(&s->held);
	if (s->index > 0 && held >= c->sink_lag_max) {
		eng_sink_fail(s, job, -ENOBUFS,
			      "step %llu: sink %s fell behind by %u chunk "
			      "buffers: detached for this save (the local "
			      "files have every byte)",
			      (unsigned long long)job->step, s->ops->name,
			      held);
		s->active = 0;
		return 0;
	}
	return 1;
}

static void dispatch(struct ckpt *c, eng_job *job, eng_buf *b, unsigned nsinks)
{
	uint32_t f = (uint32_t)(b->k % job->nfiles);
	fmt_chunk_entry *ce = &job->chunks[b->k];
	eng_sink *to[ENG_MAX_SINKS];
	unsigned i, n = 0;
	int r;

	if (b->reuse) { /* the base's bytes: no file space, no sink */
		r = eng_dedup_ref(job, b->k, ce);
		if (r < 0)
			eng_job_fail(c, job, r, "%s: out of memory",
				     job->stepdir);
		atomic_store(&b->refs, 1);
		job->received++;
		return;
	}
	b->file = f;
	b->file_offset = job->file_end[f];
	job->file_end[f] += b->span;
	ce->file = f;
	ce->codec = b->codec;
	ce->elem_width = b->elem_width;
	ce->raw_len = b->raw_len;
	ce->stored_len = b->stored_len;
	ce->file_offset = b->file_offset;
	ce->stream_offset = b->k * job->chunk_bytes;
	ce->raw_xxh3 = b->raw_xxh3;
	memcpy(ce->h128, b->h128, sizeof(ce->h128));
	for (i = 0; i < nsinks; i++)
		if (sink_takes(c, job, job->sinks[i]))
			to[n++] = job->sinks[i];
	/* one reference per sink plus ours, held until hashed */
	atomic_store(&b->refs, (int)n + 1);
	for (i = 0; i < n; i++) {
		unsigned held = atomic_fetch_add(&to[i]->held, 1) + 1;

		if (held > atomic_load(&to[i]->max_held))
			atomic_store(&to[i]->max_held, held);
		atomic_fetch_add(&to[i]->chunks, 1);
		to[i]->ops->put(to[i], b);
	}
	job->received++;
}

/* After submission, so the device is busy while we hash. */
static void hash_dispatched(struct ckpt *c, eng_job *job, eng_buf *list)
{
	while (list) {
		eng_buf *next = list->next;

		list->next = NULL;
		if (!list->reuse)
			XXH3_64bits_update(job->fhash[list->file], list->p,
					   list->span);
		eng_buf_unref(c, list);
		list = next;
	}
}

/*
 * Borrow mode (under mu): once no worker reads the caller's memory and
 * none will (every chunk taken and read, or the save failed: workers take
 * no more), it is the caller's again: copy_done, the state leaves STAGING
 * and ckpt_wait_released() returns. The writer decides it because it is
 * woken by every event that can make it true (the last read, a failure).
 */
static void borrow_settle(struct ckpt *c, eng_job *job)
{
	if (!job->borrow || job->copy_done || job->breading ||
	    (job->bnext < job->nchunks && job->status == 0))
		return;
	c->bjob = NULL;
	free(job->data); /* a late read would fault, not see stale data */
	job->data = NULL;
	job->copy_done = 1;
	if (c->state == CKPT_STATE_STAGING)
		c->state = CKPT_STATE_WRITING;
	pthread_cond_broadcast(&c->done_cv);
}

/* Sleeps until the eventfd is posted, or at most a third of the sink's
 * stall time (and at most 1 s): a ring that stopped answering posts
 * nothing, and the local sink notices it only when pumped (ls_stalled). */
static void wait_wake(struct ckpt *c)
{
	unsigned ms = eng_writer_stall_ms() / 3;
	struct pollfd pfd = { .fd = c->efd, .events = POLLIN };
	uint64_t v;

	if (ms > 1000)
		ms = 1000;
	if (poll(&pfd, 1, ms ? (int)ms : 1) <= 0 || !(pfd.revents & POLLIN))
		return;
	while (read(c->efd, &v, sizeof(v)) < 0 && errno == EINTR)
		;
}

/* Index, commit and retention once every chunk is in the sinks. */
static int finish_job(struct ckpt *c, eng_job *job)
{
	const char *root = job->to_remote ? c->remote_url : c->root;
	char name[32], err[ENG_ERRMSG_MAX];
	uint8_t *buf = NULL;
	size_t len = 0;
	fmt_index ix;
	uint32_t f;
	unsigned i;
	int r;

	for (f = 0; f < job->nfiles; f++) {
		job->files[f].size = job->file_end[f];
		job->files[f].xxh3 = XXH3_64bits_digest(job->fhash[f]);
	}
	for (i = 0; i < job->nsinks; i++) {
		if (!sink_takes(c, job, job->sinks[i]))
			continue;
		r = job->sinks[i]->ops->finish(job->sinks[i], job);
		if (r < 0 && i == 0)
			return r;
		if (r < 0) /* no-op if the sink described it */
			eng_sink_fail(job->sinks[i], job, r,
				      "sink %s: finish: %s",
				      job->sinks[i]->ops->name,
				      ckpt_strerror(r));
	}
	memset(&ix, 0, sizeof(ix));
	ix.step = job->step;
	memcpy(ix.save_id, job->save_id, sizeof(ix.save_id));
	ix.host_index = c->s.host_index;
	ix.host_count = c->s.host_count;
	ix.chunk_bytes = job->chunk_bytes;
	ix.stream_bytes = job->stream_bytes;
	ix.reason = job->reason;
	ix.nfiles = job->nfiles;
	ix.files = job->files;
	ix.ntensors = job->ntensors;
	ix.tensors = job->tensors;
	ix.nchunks = (size_t)job->nchunks;
	ix.chunks = job->chunks;
	ix.version = job->version;
	ix.nrefs = job->nrefs;
	ix.refs = job->refs;
	r = fmt_index_encode(&ix, &buf, &len);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s: encoding the index: %s",
				    job->stepdir, ckpt_strerror(r));
	fmt_index_name(c->s.host_index, name);
	for (i = 0; i < job->nsinks && r == 0; i++) {
		eng_sink *s = job->sinks[i];

		if (!sink_takes(c, job, s))
			continue;
		r = s->ops->publish(s, job, name, buf, len);
		if (r < 0 && i > 0) {
			eng_sink_fail(s, job, r, "sink %s: publish: %s",
				      s->ops->name, ckpt_strerror(r));
			r = 0;
		}
	}
	if (r < 0) {
		free(buf);
		return r;
	}
	if (c->s.host_count == 1 && !(c->s.flags & CKPT_F_MANUAL_COMMIT)) {
		err[0] = 0;
		r = eng_commit_step(root, 1, job->step, err);
		if (r < 0) {
			free(buf);
			return eng_job_fail(c, job, r, "%s", err);
		}
		/* a gs:// root: the next save's base (dedup.c) */
		if (c->remote_only && job->version >= FMT_VERSION_DEDUP)
			eng_dedup_committed(c, buf, len);
		/* Problems with the `latest` hint or retention do not undo a
		 * durable commit; their message is kept for ckpt_errmsg(). */
		if (c->s.keep_last || c->s.keep_every)
			eng_gc_run(root, c->s.keep_last, c->s.keep_every, 0, 0,
				   UINT64_MAX, NULL, NULL, NULL, err);
		if (err[0]) {
			pthread_mutex_lock(&c->mu);
			eng_err(c->errmsg, 0, "%s", err);
			pthread_mutex_unlock(&c->mu);
		}
	}
	free(buf);
	return 0;
}

static void run_job(struct ckpt *c, eng_job *job)
{
	unsigned begun = 0, i;
	uint32_t f;
	int r;

	/* this save's sinks: the handle's, or the direct sink alone for a
	 * save the planner sent to the remote */
	if (job->to_remote) {
		job->sinks[0] = c->rsink;
		job->nsinks = 1;
	} else {
		memcpy(job->sinks, c->sinks, sizeof(job->sinks));
		job->nsinks = c->nsinks;
	}
	pthread_mutex_lock(&c->mu);
	for (i = 0; i < job->nsinks; i++) {
		eng_sink *s = job->sinks[i];

		s->active = 0;
		atomic_store(&s->failed, 0);
		atomic_store(&s->held, 0);
		atomic_store(&s->max_held, 0);
		atomic_store(&s->chunks, 0);
		s->status = 1;
		s->msg[0] = 0;
	}
	pthread_mutex_unlock(&c->mu);
	r = prepare(c, job);
	for (i = 0; r == 0 && i < job->nsinks; i++) {
		eng_sink *s = job->sinks[i];
		int e = s->ops->begin(s, job);

		begun++;
		s->active = e == 0;
		if (e < 0 && i == 0)
			r = e;
		else if (e < 0)
			eng_sink_fail(s, job, e, "sink %s: begin: %s",
				      s->ops->name, ckpt_strerror(e));
	}
	if (r < 0) /* no-op if already described */
		eng_job_fail(c, job, r, "%s: preparing the save: %s",
			     job->stepdir, ckpt_strerror(r));
	for (;;) {
		eng_buf *list, *b;
		int failed, copy_done, idle, busy_any = 0;

		pthread_mutex_lock(&c->mu);
		borrow_settle(c, job);
		list = c->wq_head;
		c->wq_head = c->wq_tail = NULL;
		failed = job->status != 0;
		copy_done = job->copy_done;
		idle = c->nfree_slots == c->nslots &&
		       c->nfree_outs == c->nout && !c->work_head;
		pthread_mutex_unlock(&c->mu);

		for (b = list; failed && b;) {
			eng_buf *next = b->next;

			b->next = NULL;
			atomic_store(&b->refs, 1);
			eng_buf_unref(c, b);
			b = next;
		}
		for (b = list; !failed && b; b = b->next)
			dispatch(c, job, b, begun);
		for (i = 0; i < begun; i++) {
			eng_sink *s = job->sinks[i];
			int busy = 0;

			/* a failed or detached sink drops what it queued */
			s->ops->pump(s, failed || !sink_takes(c, job, s),
				     &busy);
			busy_any |= busy;
		}
		if (list) {
			if (!failed)
				hash_dispatched(c, job, list);
			continue;
		}
		if (!failed && eng_job_status(c, job) == 0) {
			if (job->received == job->nchunks && copy_done &&
			    !busy_any)
				break;
		} else if (failed && copy_done && idle && !busy_any) {
			break;
		}
		if (failed != (eng_job_status(c, job) != 0))
			continue;
		wait_wake(c);
	}

	/* from here a cancel (plan.c) would come too late: the index and
	 * COMMIT may be out */
	pthread_mutex_lock(&c->mu);
	job->finishing = job->status == 0;
	pthread_mutex_unlock(&c->mu);
	if (eng_job_status(c, job) == 0)
		finish_job(c, job);
	/* a secondary sink that failed or was detached removes its partial
	 * output whatever became of the save */
	for (i = 1; i < begun && eng_job_status(c, job) == 0; i++)
		if (!sink_takes(c, job, job->sinks[i]))
			job->sinks[i]->ops->abort(job->sinks[i], job);
	if (eng_job_status(c, job) != 0) {
		for (i = 0; i < begun; i++)
			job->sinks[i]->ops->abort(job->sinks[i], job);
		/* An empty directory we made is no checkpoint. With several
		 * hosts another one may be about to write into it. */
		if (c->s.host_count == 1 && !c->remote_only && !job->to_remote)
			eng_rmdir(job->stepdir);
	}
	for (f = 0; job->fhash && f < job->nfiles; f++) {
		XXH3_freeState(job->fhash[f]);
		job->fhash[f] = NULL;
	}

	pthread_mutex_lock(&c->mu);
	c->status = job->status;
	memcpy(c->status_msg, job->msg, sizeof(c->status_msg));
	c->uncollected = job->status != 0 && !job->reported;
	c->state = job->status ? CKPT_STATE_FAILED : CKPT_STATE_DONE;
	if (job->status == 0)
		c->bytes_committed = c->bytes_total;
	for (i = 0; i < job->nsinks; i++) {
		eng_sink *s = job->sinks[i];

		if (!atomic_load(&s->failed))
			s->status = job->status;
		if (i == 0 && job->status)
			snprintf(s->msg, sizeof(s->msg), "%.*s",
				 (int)sizeof(s->msg) - 1, job->msg);
	}
	eng_watch_save_done(c, job);
	pthread_mutex_unlock(&c->mu);
	/* the journal line before ckpt_wait() returns and before
	 * ckpt_should_stop() says stop (plan.c) */
	eng_watch_save_log(c);
	pthread_mutex_lock(&c->mu);
	c->busy = 0;
	pthread_cond_broadcast(&c->done_cv);
	pthread_mutex_unlock(&c->mu);
}

void *eng_writer_main(void *arg)
{
	struct ckpt *c = arg;

	eng_thread_background(0);
	pthread_mutex_lock(&c->mu);
	for (;;) {
		eng_job *job;

		while (!c->job_pending && !c->shutdown)
			pthread_cond_wait(&c->writer_cv, &c->mu);
		if (!c->job_pending)
			break;
		job = c->job;
		c->job_pending = 0;
		pthread_mutex_unlock(&c->mu);
		run_job(c, job);
		pthread_mutex_lock(&c->mu);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}
