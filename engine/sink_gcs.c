/*
 * sink_gcs.c - the upload sink: the same shard bytes, streamed to Cloud
 * Storage (ckpt_settings.remote), committed in the bucket pod-wide. This
 * file: the writer's side (eng_sink_ops) and the handle's (open, close,
 * ckpt_upload_status_get, ckpt_upload_wait). The upload thread is in
 * sink_gcs_up.c, the steps in the background in sink_gcs_bg.c; they share
 * sink_gcs.h.
 *
 * Design note. Threads: the writer calls this sink through eng_sink_ops
 * like any other; the Cloud Storage client (gcs/) is not thread-safe and
 * is owned by one upload thread per handle, started at ckpt_open. The
 * writer never blocks on the network: put() pushes the buffer on a small
 * queue (no allocation: the queue, the fifo and the per-buffer release
 * contexts are sized from the pool at begin) and calls gcs_wakeup(); the
 * upload thread appends it to the file's resumable upload, and the
 * release callback, run by the client once the server confirmed the
 * bytes, drops the sink's reference. So the bytes go out from the staging
 * buffers, never copied. One resumable upload per shard file (object
 * PREFIX/step-N/hH-fF.shard), all files of a step at once over the
 * client's multi interface (CKPT_GCS_STREAMS connections).
 *
 *   writer: begin --> headers (job->hdrs) queued first, then
 *           put(b) --> queue --> upload thread: gcs_upload_append(b->p)
 *                                      --> 308 confirms --> release(b)
 *           put(b) once the sink holds 3/4 of its lag bound: that file
 *           from here on --> fifo, b held until the local sink wrote it
 *           (refs == 1) --> upload thread: pread from the local file
 *   writer: publish (local index durable) --> handover: the step goes on
 *           in the background with its uploads as they are
 *   upload thread, background: the rest pread from the local shard
 *           files --> finish with crc32c --> host index (create-only)
 *           --> COMMIT in the bucket
 *
 * Local first: ckpt_wait() returns when the step is committed locally;
 * the upload finishes in the background. The sink is not detached for
 * lagging: when the server is slower than the disk, a file's chunks come
 * from the local file once written (gs_put), so the upload runs all
 * through the save and nothing already sent is dropped. Staged buffers
 * still in an upload at the local commit stay until the server confirms
 * them or the next save needs the pool (post_save, reclaim_staged). What
 * is unfinished is in the journal (journal.c, DIR/.upload/step-N.journal,
 * written at each state change), and ckpt_open on DIR resumes it.
 *
 * gs:// alone (direct): this sink is sink 0 and decides the save; the
 * writer's begin check, finish and publish run on the upload thread while
 * the writer waits (direct_cmd).
 *
 * Failures are never silent: a failed step keeps its journal, its status
 * is in ckpt_upload_status_get(), in this sink's ckpt_sink_status and in
 * ckpt_upload_wait()'s result, and the next save (or the end of the save
 * during which it failed) names it in the handle's message.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "gcs.h"
#include "journal.h"
#include "sink_gcs.h"

static const eng_sink_ops gcs_sink_ops;

/* ---- writer side --------------------------------------------------- */

/* Writer, at the begin and the end of a save: a step whose upload failed
 * since a save last said so is named in the handle's message (the save
 * itself went well), once per save; the upload status keeps the last
 * failure (ckpt_upload_status_get). */
static void report_failure(gcs_sink *s, int at_begin)
{
	struct ckpt *c = s->base.c;
	char m[ENG_ERRMSG_MAX];
	int r;

	if (at_begin)
		s->told = 0;
	if (s->told)
		return;
	pthread_mutex_lock(&s->mu);
	r = s->unreported ? s->st.status : 0;
	snprintf(m, sizeof(m), "%s", s->err);
	s->unreported = 0;
	pthread_mutex_unlock(&s->mu);
	if (!r)
		return;
	s->told = 1;
	pthread_mutex_lock(&c->mu);
	eng_err(c->errmsg, 0,
		"the upload to %s failed (%s), %.300s; it stays journaled "
		"under %s/.upload and resumes at the next ckpt_open",
		s->remote, ckpt_strerror(r), m, c->root);
	pthread_mutex_unlock(&c->mu);
}

/* Writer: the upload thread acts on one flag set under mu (handover,
 * reclaim) and clears it; wait for that. */
static void ask_upload_thread(gcs_sink *s, int *flag)
{
	*flag = 1;
	gcs_wakeup(s->gc);
	while (*flag)
		pthread_cond_wait(&s->cv, &s->mu);
}

static void q_put(gcs_sink *s, const uint8_t *p, size_t len, uint32_t file,
		  eng_buf *b)
{
	up_item *it;

	pthread_mutex_lock(&s->mu);
	it = &s->q[(s->qhead + s->qn++) % s->qcap];
	it->p = p;
	it->len = len;
	it->file = file;
	it->b = b;
	pthread_mutex_unlock(&s->mu);
	gcs_wakeup(s->gc);
}

/* Drops the queue (under s->mu): the buffers go back. */
static void q_drop(gcs_sink *s)
{
	while (s->qn) {
		up_item *it = &s->q[s->qhead];

		s->qhead = (s->qhead + 1) % s->qcap;
		s->qn--;
		if (it->b)
			eng_sink_release(&s->base, it->b);
	}
}

static int direct_cmd(gcs_sink *s, eng_job *job, int cmd, const uint8_t *buf,
		      size_t len);

static int gs_begin(eng_sink *es, eng_job *job)
{
	gcs_sink *s = (gcs_sink *)es;
	struct ckpt *c = es->c;
	unsigned cap = c->nslots + c->nout + job->nfiles + 1;
	up_step *u;
	uint32_t f;
	int r;

	if (s->direct) {
		r = direct_cmd(s, job, CMD_CHECK, NULL, 0);
		if (r < 0)
			return r;
	} else {
		report_failure(s, 1);
	}
	u = up_step_new(s, job->step, job->nfiles);
	if (!u)
		return -ENOMEM;
	for (f = 0; f < job->nfiles; f++)
		if (up_step_name_file(s, u, f, job->files[f].name,
				      UINT64_MAX)) {
			up_step_free(u);
			return -ENOMEM;
		}
	pthread_mutex_lock(&s->mu);
	if (s->qcap < cap) {
		up_item *nq = realloc(s->q, cap * sizeof(*nq));

		if (!nq) {
			pthread_mutex_unlock(&s->mu);
			up_step_free(u);
			return -ENOMEM;
		}
		s->q = nq;
		s->qcap = cap;
	}
	if (s->fcap < cap) {
		eng_buf **nf = realloc(s->fifo, cap * sizeof(*nf));

		if (!nf) {
			pthread_mutex_unlock(&s->mu);
			up_step_free(u);
			return -ENOMEM;
		}
		s->fifo = nf;
		s->fcap = cap;
	}
	free(s->from_file);
	s->from_file = malloc(job->nfiles * sizeof(*s->from_file));
	if (!s->from_file) {
		pthread_mutex_unlock(&s->mu);
		up_step_free(u);
		return -ENOMEM;
	}
	for (f = 0; f < job->nfiles; f++)
		s->from_file[f] = UINT64_MAX;
	/* buffers of the last save still held: this save needs the pool
	 * (the uploads holding them go on from the local files) */
	if (atomic_load(&s->npost))
		ask_upload_thread(s, &s->reclaim);
	s->qhead = s->qn = 0;
	s->fhead = s->fn = 0;
	s->handover = s->detach = 0;
	pthread_mutex_lock(&c->mu); /* a failure of an earlier step's */
	atomic_store(&es->failed, 0);
	es->status = 1;
	es->msg[0] = 0;
	pthread_mutex_unlock(&c->mu);
	s->live = u;
	s->live_job = job;
	s->pending++;
	s->st.step = job->step;
	s->st.state = CKPT_UPLOAD_RUNNING;
	s->st.bytes_total = job->stream_bytes;
	s->st.bytes_confirmed = 0;
	pthread_mutex_unlock(&s->mu);
	/* from here on a restart knows of this step (sizes: local index);
	 * gs:// alone has no local copy to resume from */
	r = s->direct ? 0 : up_journal_save(s, u);
	if (r < 0)
		return r;
	for (f = 0; f < job->nfiles; f++)
		q_put(s, job->hdrs + (size_t)f * FMT_SHARD_HDR_SIZE,
		      FMT_SHARD_HDR_SIZE, f, NULL);
	return 0;
}

/*
 * The sink streams the staged buffers while the server keeps up. Once it
 * holds switch_at of them (the network is slower than the disk), the
 * file of the chunk goes to the local file: from then on its chunks are
 * held only until the local sink has written them (the other references
 * are gone: refs == 1; not counted as the sink's, they are the local
 * sink's lag), and the upload reads them from the file. So the sink is
 * not detached for lagging, nothing already sent is dropped, and the
 * upload runs all through the save.
 */
static void gs_put(eng_sink *es, eng_buf *b)
{
	gcs_sink *s = (gcs_sink *)es;

	if (!s->direct) {
		pthread_mutex_lock(&s->mu);
		if (s->from_file[b->file] == UINT64_MAX &&
		    atomic_load(&es->held) >= s->switch_at)
			s->from_file[b->file] = b->file_offset;
		if (s->from_file[b->file] != UINT64_MAX) {
			atomic_fetch_sub(&es->held, 1);
			s->fifo[(s->fhead + s->fn++) % s->fcap] = b;
			pthread_mutex_unlock(&s->mu);
			gcs_wakeup(s->gc);
			return;
		}
		pthread_mutex_unlock(&s->mu);
	}
	q_put(s, b->p, b->span, b->file, b);
}

/* Failed: the save failed (or gs:// alone, where this sink is the save):
 * every buffer goes back, and the writer waits for them (detach 2). Else
 * detached for lagging or for an upload error: no more chunks, what is
 * held goes on (detach 1) and the rest comes from the local files. The
 * upload never holds up the local save: at finish the sink keeps only
 * buffers the pool may spare (post_save). */
static int gs_pump(eng_sink *es, int failed, int *busy)
{
	gcs_sink *s = (gcs_sink *)es;
	int drop = 0;

	if (failed) {
		drop = s->direct || !s->live_job ||
		       eng_job_status(es->c, s->live_job) != 0;
		pthread_mutex_lock(&s->mu);
		if (drop)
			q_drop(s);
		if (s->detach < 1 + drop) {
			s->detach = 1 + drop;
			gcs_wakeup(s->gc);
		}
		pthread_mutex_unlock(&s->mu);
	}
	*busy = drop && atomic_load(&es->held) > 0;
	return 0;
}

/* Writer: the local files are durable (or the save failed: keep=0). The
 * upload thread takes what is queued, and the step goes on in the
 * background (see ho_done). */
static void handover(gcs_sink *s, eng_job *job, int keep)
{
	pthread_mutex_lock(&s->mu);
	if (s->live) {
		if (!keep)
			q_drop(s);
		s->ho_job = job;
		s->ho_keep = keep;
		ask_upload_thread(s, &s->handover);
	}
	pthread_mutex_unlock(&s->mu);
	report_failure(s, 0);
}

/* Writer: runs cmd on the upload thread and waits for it (gs:// alone). */
static int direct_cmd(gcs_sink *s, eng_job *job, int cmd, const uint8_t *buf,
		      size_t len)
{
	int r;

	pthread_mutex_lock(&s->mu);
	s->ho_job = job;
	s->cmd_buf = buf;
	s->cmd_len = len;
	s->cmd = cmd;
	gcs_wakeup(s->gc);
	while (s->cmd)
		pthread_cond_wait(&s->cv, &s->mu);
	r = s->cmd_rc;
	pthread_mutex_unlock(&s->mu);
	if (r < 0)
		eng_sink_fail(&s->base, job, r, "%s", s->cmd_msg);
	return r;
}

static int gs_finish(eng_sink *es, eng_job *job)
{
	gcs_sink *s = (gcs_sink *)es;

	if (s->direct)
		return direct_cmd(s, job, CMD_FINISH, NULL, 0);
	/* handover at publish: the local index must exist before the
	 * upload thread, done with the shards, reads it back */
	return 0;
}

static int gs_publish(eng_sink *es, eng_job *job, const char *name,
		      const uint8_t *buf, size_t len)
{
	gcs_sink *s = (gcs_sink *)es;

	(void)name;
	if (s->direct)
		return direct_cmd(s, job, CMD_PUBLISH, buf, len);
	/* with a local copy the index object is read back from the local
	 * file once every shard object is there (also after a restart);
	 * the local sink, sink 0, has just published it */
	handover(s, job, 1);
	return 0;
}

static void gs_abort(eng_sink *es, eng_job *job)
{
	/* detached for lagging while the save went on: catch up */
	handover((gcs_sink *)es, job, eng_job_status(es->c, job) == 0);
}

/* ---- handle side --------------------------------------------------- */

static void gs_destroy(eng_sink *es)
{
	gcs_sink *s = (gcs_sink *)es;
	up_step *u;

	if (s->thr_started) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		/* no waiting out a silent bucket's deadline: what is
		 * unfinished stays journaled (up_step_failed) */
		if (s->side_gc)
			gcs_cancel(s->side_gc);
		pthread_mutex_unlock(&s->mu);
		gcs_cancel(s->gc);
		pthread_join(s->thr, NULL);
	}
	/* unfinished steps stay in their journals for the next open */
	up_step_free(s->live);
	while ((u = s->steps)) {
		s->steps = u->next;
		up_step_free(u);
	}
	gcs_client_free(s->gc);
	up_pieces_trim(s);
	if (s->hold_fd >= 0)
		eng_close(s->hold_fd);
	pthread_mutex_destroy(&s->rp_mu);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->cv);
	free(s->q);
	free(s->fifo);
	free(s->from_file);
	free(s->rel);
	free(s->remote);
	free(s->bucket);
	free(s->prefix);
	free(s);
}

static const eng_sink_ops gcs_sink_ops = {
	.name = "gcs",
	.begin = gs_begin,
	.put = gs_put,
	.pump = gs_pump,
	.finish = gs_finish,
	.publish = gs_publish,
	.abort = gs_abort,
	.destroy = gs_destroy,
};

/* A resumable upload of unknown size sends whole pieces only, holding
 * the buffers of the piece being filled: each file gets a budget of half
 * its share of what the sink may hold (the lag bound; all of the pool for
 * gs:// alone), so another piece can fill while one is on the wire; a
 * piece is `budget` chunks, and chunks smaller than piece / budget are
 * copied (live_append). So a file's unfilled piece holds at most `budget`
 * buffers (each staged one has more than piece / budget bytes), and the
 * files' together at most half of `bufs`.
 *
 * With a codec, compressed chunks live in output buffers only, and an
 * encode worker waits for a free one: counted in all buffers, the
 * unfilled pieces could hold every output buffer while each needed
 * another chunk to fill, and the save hung (gs:// alone, a compressing
 * codec). So with a codec the budget is a share of the output buffers
 * (pool.c gives gs:// alone at least 2 per file): the server confirming
 * what was sent always leaves one free. */
static void piece_size(gcs_sink *s, const struct ckpt *c, int direct)
{
	uint32_t nf = c->s.files_per_host ? c->s.files_per_host : 1;
	uint64_t bufs = direct ? c->nslots + c->nout : c->sink_lag_max;
	uint64_t budget, p;

	if (c->s.codec != CKPT_CODEC_NONE && bufs > c->nout)
		bufs = c->nout;
	budget = bufs / (2ull * nf);

	if (budget < 1)
		budget = 1;
	p = budget * c->s.chunk_bytes;
	if (p > (16u << 20))
		p = 16u << 20;
	p -= p % GCS_PIECE;
	s->piece = p < GCS_PIECE ? GCS_PIECE : (size_t)p;
	s->min_span = s->piece / budget + 1;
}

int eng_gcs_sink_new(struct ckpt *c, const char *remote, int direct,
		     eng_sink **out)
{
	gcs_sink *s = calloc(1, sizeof(*s));
	int r;

	*out = NULL;
	if (!s)
		return eng_err(NULL, -ENOMEM, "out of memory");
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->rp_mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->base.ops = &gcs_sink_ops;
	s->base.c = c;
	s->hold_fd = -1;
	s->host = c->s.host_index;
	s->direct = direct;
	s->hosts = c->s.host_count;
	s->remote = strdup(remote);
	s->rel = calloc(c->nslots + c->nout, sizeof(*s->rel));
	r = s->remote && s->rel ?
		    eng_loc_parse(remote, &s->bucket, &s->prefix, NULL) :
		    eng_err(NULL, -ENOMEM, "out of memory");
	if (r == ENG_LOC_POSIX)
		r = eng_err(NULL, -EINVAL,
			    "%s: not a gs://BUCKET/PREFIX "
			    "location",
			    remote);
	if (r >= 0) {
		struct gcs_config cfg = { 0 };

		cfg.streams = eng_gcs_streams();
		if (getenv("CKPT_GCS_DEADLINE")) /* as eng_gcs_client_new */
			cfg.deadline_s =
				strtod(getenv("CKPT_GCS_DEADLINE"), NULL);
		piece_size(s, c, direct);
		s->switch_at = c->sink_lag_max * 3 / 4;
		if (s->switch_at < 1)
			s->switch_at = 1;
		cfg.chunk_bytes = s->piece;
		r = gcs_client_new(&s->gc, &cfg);
		if (r < 0)
			eng_err(NULL, r,
				"%s: cannot set up the Cloud Storage "
				"client: %s",
				remote, ckpt_strerror(r));
	}
	if (r == 0 && !direct) {
		/* best effort: only ckptctl ls's "uploading" depends on it */
		s->hold_fd = eng_journal_hold(c->root);
		up_load_journals(s);
		s->probing = c->dedup; /* only dedup asks (dedup.c) */
	}
	if (r == 0) {
		r = -pthread_create(&s->thr, NULL, up_main, s);
		if (r < 0)
			eng_err(NULL, r, "cannot start the upload thread: %s",
				strerror(-r));
		else
			s->thr_started = 1;
	}
	if (r < 0) {
		gs_destroy(&s->base);
		return r;
	}
	*out = &s->base;
	return 0;
}

static gcs_sink *uploader(ckpt *c)
{
	unsigned i;

	for (i = 0; c && i < c->nsinks; i++)
		if (c->sinks[i]->ops == &gcs_sink_ops)
			return (gcs_sink *)c->sinks[i];
	return NULL;
}

void eng_gcs_reclaim(struct ckpt *c)
{
	gcs_sink *s = uploader(c);

	if (!s || !atomic_load(&s->npost))
		return;
	pthread_mutex_lock(&s->mu);
	ask_upload_thread(s, &s->reclaim);
	pthread_mutex_unlock(&s->mu);
}

CKPT_API int ckpt_upload_status_get(ckpt *c, ckpt_upload_status *out)
{
	gcs_sink *s = uploader(c);

	if (!c || !out)
		return eng_err(NULL, -EINVAL,
			       "ckpt_upload_status_get: %s is "
			       "NULL",
			       c ? "out" : "handle");
	if (!s)
		return eng_err(c->errmsg, -ENOENT, "%s: no remote location",
			       c->root);
	pthread_mutex_lock(&s->mu);
	*out = s->st;
	out->pending_steps = s->pending;
	pthread_mutex_unlock(&s->mu);
	return 0;
}

CKPT_API int ckpt_upload_wait(ckpt *c, int timeout_ms)
{
	gcs_sink *s = uploader(c);
	struct timespec dl;
	int r = 0;

	if (!c)
		return eng_err(NULL, -EINVAL,
			       "ckpt_upload_wait: handle is "
			       "NULL");
	if (!s)
		return eng_err(c->errmsg, -ENOENT, "%s: no remote location",
			       c->root);
	/* the save in flight, if any, comes first */
	pthread_mutex_lock(&c->mu);
	while (c->busy)
		pthread_cond_wait(&c->done_cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	eng_realtime_after_ms(&dl, timeout_ms);
	pthread_mutex_lock(&s->mu);
	while ((s->pending > 0 || s->probing) &&
	       s->st.state != CKPT_UPLOAD_FAILED && r == 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&s->cv, &s->mu);
		else
			r = -pthread_cond_timedwait(&s->cv, &s->mu, &dl);
	}
	if (s->st.state == CKPT_UPLOAD_FAILED) {
		r = s->st.status;
		s->unreported = 0; /* said here */
	}
	if (r)
		eng_err(c->errmsg, r, "%s",
			r == -ETIMEDOUT ? "upload still running" : s->err);
	pthread_mutex_unlock(&s->mu);
	return r;
}
