/*
 * sink_gcs_up.c - the upload sink's thread (sink_gcs.c): the live step,
 * gs:// alone's commands, and the loop that drives the client.
 *
 * Design note. One thread per handle owns the Cloud Storage client. Each
 * turn of up_main takes the chunks put() queued and appends them to their
 * file's upload (live_append: chunks smaller than min_span and the shard
 * headers are copied into a piece buffer, the rest go as they are and are
 * released once the server confirms them); gives back the fifo's chunks
 * the local sink has written and reads their files up to there
 * (live_run); acts on the writer's handover (ho_done) or reclaim; runs
 * gs:// alone's commands (direct_run); moves the oldest background step
 * on (sink_gcs_bg.c); then polls the client until something happens (2
 * ms while the fifo holds chunks, else up to 200 ms or a wakeup).
 *
 *   queue --> live_append --> upload (staged buffer, or copied if small)
 *   fifo  --> refs == 1 --> the file's mark --> up_file_feed: pread
 *   handover --> fifo emptied, staged buffers left post_save --> steps
 *
 * A live upload that fails is dropped (live_drop: every buffer back, the
 * session kept) and the background resumes it from the local file.
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

static void release_staged(void *arg)
{
	up_rel *r = arg;
	gcs_sink *s = r->s;

	r->inuse = 0;
	if (!r->post) {
		eng_sink_release(&s->base, r->b);
		return;
	}
	/* held past its save (post_save): straight back to the pool */
	r->post = 0;
	atomic_fetch_sub(&s->npost, 1);
	eng_buf_unref(s->base.c, r->b);
	eng_writer_wake(s->base.c);
}

/* ---- the live step ------------------------------------------------ */

/* The small-piece buffer of f goes to the upload (freed once confirmed). */
static int bounce_flush(up_file *f)
{
	int r;

	if (!f->bounce)
		return 0;
	r = gcs_upload_append(f->u, f->bounce, f->blen, free, f->bounce);
	if (r < 0)
		free(f->bounce);
	f->bounce = NULL;
	f->blen = 0;
	return r;
}

/*
 * Staged bytes of the live step go to their file's upload, as they are:
 * the buffer is released once the server confirmed it. Except chunks
 * that compressed to less than min_span (and the 4 KiB shard headers):
 * those are copied into a piece buffer of the sink's own and released at
 * once. A resumable upload of unknown size only sends whole pieces, so
 * without this a file could hold piece / span staged buffers and, with
 * highly compressible data, the whole pool (see piece_bytes): the copy
 * bounds what a file holds to `budget` buffers, and costs little since
 * such chunks are small.
 */
static int live_append(gcs_sink *s, up_step *u, const up_item *it)
{
	up_file *f = &u->f[it->file];
	struct gcs_upload_opts o = { GCS_NO_COND, GCS_SIZE_UNKNOWN, 0, 0 };
	up_rel *rel;
	int r;

	if (!f->u) {
		r = gcs_upload_start(s->gc, s->bucket, f->object, &o, &f->u);
		if (r < 0)
			return r;
	}
	f->appended += it->len;
	if (!s->direct) /* the local file's hash, to finish from it */
		XXH3_64bits_update(f->xs, it->p, it->len);
	if (!it->b || it->len < s->min_span) {
		if (f->bounce && f->blen + it->len > s->piece) {
			r = bounce_flush(f);
			if (r < 0)
				return r;
		}
		if (!f->bounce) {
			f->bounce = malloc(s->piece);
			if (!f->bounce)
				return -ENOMEM;
		}
		memcpy(f->bounce + f->blen, it->p, it->len);
		f->blen += it->len;
		if (it->b)
			eng_sink_release(&s->base, it->b);
		return 0;
	}
	r = bounce_flush(f);
	if (r < 0)
		return r;
	rel = &s->rel[it->b - s->base.c->bufs];
	rel->s = s;
	rel->b = it->b;
	r = gcs_upload_append(f->u, it->p, it->len, release_staged, rel);
	if (r == 0) {
		rel->inuse = 1;
		f->staged_end = f->appended;
	}
	return r;
}

/* A live upload that failed gives its staged buffers back at once: for
 * gs:// alone that fails the save, else the sink is detached and the
 * upload goes on from the local files after the local commit. */
static int live_check(gcs_sink *s, up_step *u)
{
	uint32_t i;

	for (i = 0; i < u->nfiles; i++) {
		struct gcs_op *op = u->f[i].u ? gcs_upload_op(u->f[i].u) : NULL;
		int r;

		if (!op || !gcs_op_done(op) || !(r = gcs_op_wait(op)))
			continue;
		eng_sink_fail(&s->base, s->live_job, eng_gcs_code(r),
			      "gs://%s/%s: %s", s->bucket, u->f[i].object,
			      gcs_op_errmsg(op));
		return r;
	}
	return 0;
}

/* An append refused (the upload failed before it, as a missing bucket's
 * does): says so, naming the object, before live_drop frees the upload. */
static void append_failed(gcs_sink *s, const up_step *u, const up_item *it,
			  int r)
{
	const up_file *f = &u->f[it->file];
	const char *m = f->u ? gcs_op_errmsg(gcs_upload_op(f->u)) : NULL;

	r = eng_gcs_code(r);
	eng_sink_fail(&s->base, s->live_job, r, "gs://%s/%s: %s", s->bucket,
		      f->object, m && *m ? m : ckpt_strerror(r));
}

/* Closes f's upload (its buffers go back), keeping the session and what
 * the server confirmed: the background resumes it from the local file. */
static void close_upload(up_file *f)
{
	const char *sess = gcs_upload_session(f->u);

	free(f->session);
	f->session = sess ? strdup(sess) : NULL;
	f->confirmed = gcs_upload_persisted(f->u);
	gcs_upload_free(f->u);
	f->u = NULL;
	f->appended = 0;
	f->finishing = 0;
	f->staged_end = 0;
	f->mode = FM_LIVE;
}

/* Gives every staged buffer back; sessions are kept for the resume. */
static void live_detach(up_step *u)
{
	uint32_t i;

	for (i = 0; i < u->nfiles; i++) {
		up_file *f = &u->f[i];

		free(f->bounce);
		f->bounce = NULL;
		f->blen = 0;
		if (f->u)
			close_upload(f);
	}
}

/* Upload thread, gs:// alone: the writer's finish (every upload finished
 * and confirmed: the client saw every byte and sends their crc32c) and
 * publish (the index object; with several hosts, the commit attempt). */
static void direct_run(gcs_sink *s, up_step *u, int cmd)
{
	eng_job *job = s->ho_job;
	char err[ENG_ERRMSG_MAX];
	uint32_t i, left;
	int r = 0;

	err[0] = 0;
	if (cmd == CMD_CHECK) {
		/* shard objects have their final names: never over a
		 * committed step */
		char *o = up_object_name(s, job->step, FMT_COMMIT_NAME);
		struct gcs_object m;

		memset(&m, 0, sizeof(m));
		r = o ? gcs_stat(s->gc, s->bucket, o, &m) : -ENOMEM;
		if (r == 0)
			r = eng_err(err, CKPT_E_EXISTS,
				    "gs://%s/%s: step %" PRIu64
				    " is already committed",
				    s->bucket, o, job->step);
		else if (r == -ENOENT)
			r = 0;
		else
			eng_err(err, r, "gs://%s/%s: %s", s->bucket, o,
				gcs_errmsg(s->gc));
		gcs_object_clear(&m);
		free(o);
		pthread_mutex_lock(&s->mu);
		s->cmd_rc = r < 0 ? eng_gcs_code(r) : 0;
		snprintf(s->cmd_msg, sizeof(s->cmd_msg), "%s", err);
		s->cmd = CMD_NONE;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		return;
	}
	if (cmd == CMD_PUBLISH) {
		r = up_put_index(s, u, s->cmd_buf, s->cmd_len, err);
		if (r == 0 && s->hosts > 1) {
			r = eng_commit_step(s->remote, s->hosts, u->step, err);
			if (r == CKPT_E_EXISTS ||
			    (r == CKPT_E_INCOMPLETE &&
			     strstr(err, "has not written its index")))
				r = 0;
		}
		goto out;
	}
	/* an upload that failed says why bytes are missing (once one
	 * failed, the upload thread gave every file's chunks back) */
	for (i = 0; i < u->nfiles && r == 0; i++) {
		struct gcs_op *op = u->f[i].u ? gcs_upload_op(u->f[i].u) : NULL;

		if (op && gcs_op_done(op) && (r = gcs_op_wait(op)) < 0)
			eng_err(err, r, "gs://%s/%s: %s", s->bucket,
				u->f[i].object, gcs_op_errmsg(op));
	}
	for (i = 0; i < u->nfiles && r == 0; i++) {
		up_file *f = &u->f[i];

		if (f->u && f->appended != job->files[i].size)
			r = eng_err(err, -EIO,
				    "gs://%s/%s: %" PRIu64 " bytes sent of "
				    "%" PRIu64,
				    s->bucket, f->object, f->appended,
				    job->files[i].size);
		else if (f->u && (r = bounce_flush(f)) == 0)
			r = gcs_upload_finish(f->u, NULL);
		if (r < 0 && !err[0])
			eng_err(err, r, "gs://%s/%s: %s", s->bucket, f->object,
				gcs_op_errmsg(gcs_upload_op(f->u)));
	}
	for (left = 1; r == 0 && left;) {
		for (i = left = 0; i < u->nfiles && r == 0; i++) {
			up_file *f = &u->f[i];

			if (!f->u || f->done)
				continue;
			if (!gcs_op_done(gcs_upload_op(f->u))) {
				left++;
				continue;
			}
			r = gcs_op_wait(gcs_upload_op(f->u));
			if (r < 0)
				eng_err(err, r, "gs://%s/%s: %s", s->bucket,
					f->object,
					gcs_op_errmsg(gcs_upload_op(f->u)));
			f->done = 1;
		}
		if (left)
			gcs_poll(s->gc, 200);
	}
out:
	up_set_status(s, u, r < 0 ? CKPT_UPLOAD_FAILED : CKPT_UPLOAD_RUNNING);
	pthread_mutex_lock(&s->mu);
	s->cmd_rc = r < 0 ? eng_gcs_code(r) : 0;
	snprintf(s->cmd_msg, sizeof(s->cmd_msg), "%s", err);
	if (cmd == CMD_PUBLISH || r < 0) {
		s->live = NULL;
		s->pending--;
	}
	s->cmd = CMD_NONE;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (cmd == CMD_PUBLISH || r < 0) {
		if (r == 0)
			up_set_status(s, u,
				      s->hosts > 1 ? CKPT_UPLOAD_UPLOADED :
						     CKPT_UPLOAD_COMMITTED);
		for (i = 0; i < u->nfiles; i++) {
			gcs_upload_free(u->f[i].u);
			u->f[i].u = NULL;
		}
		up_step_free(u);
	}
}

/* ---- the live step past what it holds ----------------------------- */

/* f's next bytes come from the local file: this save's NAME.tmp, renamed
 * at finish (the descriptor follows the inode; after it: final). */
static int to_file_mode(gcs_sink *s, up_file *f, int final)
{
	char *path;
	int r = bounce_flush(f);

	if (r < 0)
		return r;
	if (f->fd < 0) {
		path = eng_path("%s/%s%s", s->live_job->stepdir, f->name,
				final ? "" : FMT_TMP_SUFFIX);
		if (!path)
			return -ENOMEM;
		r = up_file_open(f, path);
		free(path);
		if (r < 0)
			return r;
	}
	if (f->mark < f->appended)
		f->mark = f->appended;
	f->mode = FM_FILE;
	return 0;
}

/* Held chunks the local file now has (all: every one) go back to the
 * pool; their file's mark moves past them. In file order per file. */
static void fifo_drain(gcs_sink *s, up_step *u, int all)
{
	pthread_mutex_lock(&s->mu);
	while (s->fn) {
		eng_buf *b = s->fifo[s->fhead];
		up_file *f = &u->f[b->file];

		if (!all && atomic_load(&b->refs) != 1)
			break;
		if (f->mark < b->file_offset + b->span)
			f->mark = b->file_offset + b->span;
		s->fhead = (s->fhead + 1) % s->fcap;
		s->fn--;
		eng_buf_unref(s->base.c, b);
		eng_writer_wake(s->base.c);
	}
	pthread_mutex_unlock(&s->mu);
}

/* Files whose chunks now come through the fifo switch once every chunk
 * before went into their uploads. */
static int live_switch(gcs_sink *s, up_step *u)
{
	uint32_t i;
	int r = 0;

	for (i = 0; i < u->nfiles && r == 0; i++) {
		up_file *f = &u->f[i];
		uint64_t from;

		pthread_mutex_lock(&s->mu);
		from = s->from_file[i];
		pthread_mutex_unlock(&s->mu);
		if (f->mode == FM_LIVE && f->u && f->appended == from)
			r = to_file_mode(s, f, 0);
	}
	return r;
}

/* FM_FILE files read on up to their marks. */
static int live_feed(gcs_sink *s, up_step *u)
{
	char err[ENG_ERRMSG_MAX];
	uint32_t i;
	int r;

	for (i = 0; i < u->nfiles; i++) {
		up_file *f = &u->f[i];

		if (f->mode != FM_FILE || !f->u)
			continue;
		r = up_file_feed(s, f, f->mark, err);
		if (r < 0) {
			eng_sink_fail(&s->base, s->live_job, eng_gcs_code(r),
				      "%s", err);
			return r;
		}
	}
	return 0;
}

/* The live uploads are given up (an upload failed, or the save did):
 * every buffer back; after a local commit the step is resumed from the
 * files with the sessions kept. */
static void live_drop(gcs_sink *s, up_step *u)
{
	fifo_drain(s, u, 1);
	live_detach(u);
	u->dropped = 1;
}

/* The save ended and the step goes on: staged buffers still in an upload
 * stay until the server has them (gone from the sink's count; the pool
 * gets them back from release_staged), or until the next save begins
 * (reclaim_staged). */
static void post_save(gcs_sink *s)
{
	struct ckpt *c = s->base.c;
	unsigned i, n = c->nslots + c->nout;

	for (i = 0; i < n; i++) {
		up_rel *r = &s->rel[i];

		if (!r->inuse || r->post)
			continue;
		r->post = 1;
		atomic_fetch_add(&s->npost, 1);
		pthread_mutex_lock(&c->mu);
		r->b->job = NULL; /* the job ends with the save */
		pthread_mutex_unlock(&c->mu);
		atomic_fetch_sub(&s->base.held, 1);
	}
}

/* The next save needs the pool: uploads that still hold staged buffers
 * are closed (sessions kept) and resumed from the local files. */
static void reclaim_staged(gcs_sink *s)
{
	up_step *u;
	uint32_t i;

	for (u = s->steps; u; u = u->next)
		for (i = 0; i < u->nfiles; i++) {
			up_file *f = &u->f[i];

			if (f->u && gcs_upload_persisted(f->u) < f->staged_end)
				close_upload(f);
		}
	pthread_mutex_lock(&s->mu);
	s->reclaim = 0;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/* Upload thread: the writer's handover of the live step (every chunk of
 * it taken): into the background queue, journaled, with its uploads as
 * they are; or dropped with a failed save. Acknowledged last: ho_job is
 * valid until then. */
static void ho_done(gcs_sink *s, up_step *u)
{
	eng_job *job = s->ho_job;
	int keep = s->ho_keep;
	uint32_t f;

	if (!keep && !u->dropped)
		live_drop(s, u);
	if (keep) {
		fifo_drain(s, u, 1);
		for (f = 0; !u->dropped && f < u->nfiles; f++) {
			up_file *uf = &u->f[f];

			/* errors: the upload's, seen by up_step_run */
			if (uf->u && uf->appended < job->files[f].size &&
			    uf->fd < 0)
				to_file_mode(s, uf, 1);
			else
				bounce_flush(uf);
		}
		if (!u->dropped)
			post_save(s);
		for (f = 0; f < u->nfiles; f++) {
			u->f[f].size = job->files[f].size;
			u->f[f].xxh3 = job->files[f].xxh3;
			u->f[f].mark = u->f[f].size;
		}
		u->state = ST_BACKGROUND;
		up_journal_save(s, u);
	}
	pthread_mutex_lock(&s->mu);
	s->live = NULL;
	if (keep) {
		up_step **pp = &s->steps;

		while (*pp)
			pp = &(*pp)->next;
		*pp = u;
	} else {
		s->pending--;
	}
	s->handover = 0;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (!keep)
		up_step_free(u);
}

/* Upload thread: the live step after a batch of chunks. */
static void live_run(gcs_sink *s, up_step *u, int failed, int detach, int check)
{
	uint32_t i;

	if (u->dropped) {
		fifo_drain(s, u, 1);
		return;
	}
	if (failed || detach == 2 || (check && live_check(s, u) < 0)) {
		live_drop(s, u);
		return;
	}
	/* detached: no more chunks; what each file lacks is in its file */
	for (i = 0; detach == 1 && !u->stopped && i < u->nfiles; i++)
		if (u->f[i].mode == FM_LIVE && u->f[i].u &&
		    to_file_mode(s, &u->f[i], 0) < 0) {
			live_drop(s, u);
			return;
		}
	u->stopped |= detach == 1;
	if (s->direct)
		return;
	if (live_switch(s, u) < 0) {
		live_drop(s, u);
		return;
	}
	fifo_drain(s, u, 0);
	if (live_feed(s, u) < 0)
		live_drop(s, u);
}

void *up_main(void *arg)
{
	gcs_sink *s = arg;
	up_item *batch = NULL;
	unsigned cap = 0, n, i, held;

	eng_thread_background(0);
	if (s->probing) { /* set before this thread started */
		up_probe_remote(s);
		pthread_mutex_lock(&s->mu);
		s->probing = 0;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
	pthread_mutex_lock(&s->mu);
	while (!s->stop) {
		up_step *live = s->live, *bg;
		int handover = s->handover, detach = s->detach, cmd = s->cmd;
		int reclaim = s->reclaim, failed = 0;

		if (cap < s->qcap) {
			up_item *nb = realloc(batch, s->qcap * sizeof(*nb));

			if (nb) {
				batch = nb;
				cap = s->qcap;
			}
		}
		for (n = 0; s->qn && n < cap; n++) {
			batch[n] = s->q[s->qhead];
			s->qhead = (s->qhead + 1) % s->qcap;
			s->qn--;
		}
		bg = s->steps;
		pthread_mutex_unlock(&s->mu);

		for (i = 0; i < n; i++) {
			int r = 0;

			if (live && !live->dropped && detach < 2 &&
			    (r = live_append(s, live, &batch[i])) == 0)
				continue;
			/* gs:// alone: no file to resume from, the save fails */
			if (r < 0 && !failed && s->direct)
				append_failed(s, live, &batch[i], r);
			/* no upload for it: the resume reads the file */
			if (batch[i].b)
				eng_sink_release(&s->base, batch[i].b);
			failed = 1;
		}
		if (live)
			live_run(s, live, failed, detach, !cmd);
		if (handover)
			ho_done(s, live);
		if (reclaim)
			reclaim_staged(s);
		if (cmd && (live || cmd == CMD_CHECK))
			direct_run(s, live, cmd);
		if (bg && bg->state == ST_BACKGROUND)
			up_step_run(s, bg);

		pthread_mutex_lock(&s->mu);
		if (bg && bg->state != ST_BACKGROUND) {
			s->steps = bg->next;
			s->pending--;
			pthread_cond_broadcast(&s->cv);
			pthread_mutex_unlock(&s->mu);
			up_step_free(bg);
			if (!s->steps) /* nothing left to read: give back */
				up_pieces_trim(s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->qn || s->handover || s->reclaim || s->cmd || s->stop)
			continue;
		held = s->fn; /* read under mu: the writer resets it */
		pthread_mutex_unlock(&s->mu);
		/* chunks held for the local sink: look again soon */
		gcs_poll(s->gc, held ? 2 : 200);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	free(batch);
	return NULL;
}
