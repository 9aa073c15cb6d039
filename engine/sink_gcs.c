/*
 * sink_gcs.c - the upload sink: the same shard bytes, streamed to Cloud
 * Storage (ckpt_settings.remote), committed in the bucket pod-wide.
 *
 * Design note. Threads: the writer calls this sink through eng_sink_ops
 * like any other; the Cloud Storage client (gcs/) is not thread-safe and
 * is owned by one upload thread per handle, started at ckpt_open. The
 * writer never blocks on the network: put() pushes the buffer on a small
 * queue (no allocation: the queue and the per-buffer release contexts are
 * sized from the pool at begin) and calls gcs_wakeup(); the upload thread
 * appends it to the file's resumable upload, and the release callback,
 * run by the client once the server confirmed the bytes, drops the sink's
 * reference (eng_sink_release wakes the writer's eventfd). So the bytes go
 * out from the staging buffers, never copied. One resumable upload per
 * shard file (object PREFIX/step-N/hH-fF.shard), all files of a step at
 * once over the client's multi interface (CKPT_GCS_STREAMS connections).
 *
 *   writer: begin --> headers (job->hdrs) queued first, then
 *           put(b) --> queue --> upload thread: gcs_upload_append(b->p)
 *                                      --> 308 confirms --> release(b)
 *   writer: finish (local files durable) --> handover, below
 *   upload thread, background: per file resume (status query) and the
 *           rest pread from the local shard file --> finish with crc32c
 *           --> host index (create-only) --> COMMIT in the bucket
 *
 * Local first: at finish() the local sink has made every byte durable.
 * The sink may not hold staging buffers past the save (they belong to the
 * next one), so the writer's finish hands over: every upload gives its
 * staged buffers back (gcs_upload_free releases the unconfirmed ones) and
 * keeps its session URI; the upload thread then resumes each session
 * where the server says it stopped and reads the rest from the local file.
 * A sink detached for lagging (save_internal.h) does the same, from
 * abort(). Thus ckpt_wait() returns when the step is committed locally and
 * the upload finishes in the background; what is unfinished is in the
 * journal (journal.c, DIR/.upload/step-N.journal, written at each state
 * change), and ckpt_open on DIR resumes it. crc32c: every object's crc of
 * the whole file is sent with the last piece, so the server rejects bytes
 * that differ; for a resumed upload the crc of the prefix the server
 * already has is recomputed from the local file.
 *
 * Commit: after its index object is there, each host tries the commit of
 * the step through the gs:// backend (eng_commit_step: every host's index
 * present, COMMIT created with ifGenerationMatch=0). CKPT_E_INCOMPLETE
 * means another host has yet to upload and will commit when it has (the
 * last host to finish sees every index); CKPT_E_EXISTS means another host
 * won: success either way. No coordinator.
 *
 * Size: over the house's ~1,000 lines because the writer side, the upload
 * thread, the journaled background and gs:// alone all work on one upload
 * state (up_step/up_file) that nothing else needs; the natural split is
 * gs:// alone (direct_*) into its own file behind a small header, not done
 * yet.
 *
 * Failures are never silent: a failed step keeps its journal, its status
 * is in ckpt_upload_status_get(), in this sink's ckpt_sink_status and in
 * ckpt_upload_wait()'s result.
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
#include "save_internal.h"

#define UP_PIECE (8u << 20) /* pread size when reading local files */

enum { ST_LIVE, ST_BACKGROUND, ST_DONE, ST_FAILED };
enum { FM_LIVE, FM_FILE }; /* where a file's next bytes come from */
enum { CMD_NONE, CMD_CHECK, CMD_FINISH, CMD_PUBLISH };

typedef struct up_file {
	char name[64];
	char *object;
	uint64_t size;
	uint64_t appended; /* bytes given to u */
	struct gcs_upload *u;
	char *session;
	uint64_t confirmed;
	uint32_t crc;     /* of [0, appended) when reading the file */
	uint64_t xxh3;    /* the local index's hash of the whole file */
	XXH3_state_t *xs; /* of [0, appended) when reading the file */
	uint8_t *bounce;  /* live: small chunks copied (live_append) */
	size_t blen;
	int mode;            /* FM_*: staged buffers, or the local file */
	uint64_t mark;       /* FM_FILE: the local file has [0, mark) */
	uint64_t staged_end; /* end of the last staged buffer appended */
	int finishing;       /* gcs_upload_finish was called */
	int fd;
	int done;
} up_file;

typedef struct up_step {
	uint64_t step;
	uint32_t nfiles;
	up_file *f;
	int state;
	int index_done;
	char *error; /* journaled once the step failed */
	int dropped; /* live: uploads given up, resumed from the files */
	int stopped; /* live: no more chunks (lag): the rest from the files */
	struct up_step *next;
} up_step;

typedef struct up_item {
	const uint8_t *p;
	size_t len;
	uint32_t file;
	eng_buf *b; /* NULL: a shard header (job memory) */
} up_item;

typedef struct up_rel {
	struct gcs_sink *s;
	eng_buf *b;
	int inuse; /* b is in an upload's segments */
	int post;  /* the save ended: b goes back to the pool, not the sink */
} up_rel;

typedef struct gcs_sink {
	eng_sink base;
	char *remote, *bucket, *prefix;
	struct gcs_client *gc; /* the upload thread's */
	pthread_t thr;
	int thr_started;
	int hold_fd; /* DIR/.upload locked while open (journal.c) */
	uint32_t host, hosts;
	size_t piece;    /* resumable piece (gcs client chunk_bytes) */
	size_t min_span; /* smaller chunks are copied (live_append) */

	pthread_mutex_t mu;
	pthread_cond_t cv; /* writer: handover done; ckpt_upload_wait */
	/* writer -> upload thread (under mu) */
	up_item *q;
	unsigned qcap, qhead, qn;
	up_rel *rel; /* one per pool buffer */
	/* live, FM_FILE: chunks held until the local file has them (put()
	 * adds, the upload thread drains; under mu), and per file the
	 * offset from which its chunks come that way (UINT64_MAX: none) */
	eng_buf **fifo;
	unsigned fhead, fn;
	uint64_t *from_file;
	unsigned switch_at; /* held buffers at which a file goes FM_FILE */
	unsigned fcap;
	atomic_uint npost; /* staged buffers held past their save (post) */
	int handover, detach, stop, reclaim;
	eng_job *ho_job; /* handover: valid until acknowledged */
	int ho_keep;
	/* gs:// alone (sink 0): the writer's finish and publish, run by the
	 * upload thread while the writer waits (under mu) */
	int direct;
	int cmd; /* CMD_* pending, 0 when done */
	const uint8_t *cmd_buf;
	size_t cmd_len;
	int cmd_rc;
	char cmd_msg[ENG_ERRMSG_MAX];
	up_step *live; /* step being saved */
	eng_job *live_job;
	up_step *steps; /* background, oldest first */
	/* status (under mu) */
	ckpt_upload_status st;
	unsigned pending;
	char err[ENG_ERRMSG_MAX];
	int unreported; /* a step failed and no save has said so yet */
	int told;       /* writer: this save named one already */
} gcs_sink;

static const eng_sink_ops gcs_sink_ops;

static void step_free(up_step *u)
{
	uint32_t i;

	if (!u)
		return;
	for (i = 0; i < u->nfiles; i++) {
		gcs_upload_free(u->f[i].u);
		free(u->f[i].bounce);
		XXH3_freeState(u->f[i].xs);
		free(u->f[i].object);
		free(u->f[i].session);
		if (u->f[i].fd >= 0)
			eng_close(u->f[i].fd);
	}
	free(u->f);
	free(u->error);
	free(u);
}

static char *object_name(gcs_sink *s, uint64_t step, const char *name)
{
	char d[32];

	/* prefix: "" or "P/" (eng_loc_parse) */
	fmt_step_dirname(step, d);
	return eng_path("%s%s/%s", s->prefix, d, name);
}

static up_step *step_new(gcs_sink *s, uint64_t step, uint32_t nfiles)
{
	up_step *u = calloc(1, sizeof(*u));
	uint32_t i;

	if (!u)
		return NULL;
	u->step = step;
	u->f = calloc(nfiles, sizeof(*u->f));
	if (!u->f) {
		free(u);
		return NULL;
	}
	u->nfiles = nfiles;
	for (i = 0; i < nfiles; i++)
		u->f[i].fd = -1;
	(void)s;
	return u;
}

static int step_name_file(gcs_sink *s, up_step *u, uint32_t i, const char *name,
			  uint64_t size)
{
	snprintf(u->f[i].name, sizeof(u->f[i].name), "%s", name);
	u->f[i].size = size;
	u->f[i].object = object_name(s, u->step, name);
	u->f[i].xs = XXH3_createState();
	if (!u->f[i].object || !u->f[i].xs)
		return -ENOMEM;
	XXH3_64bits_reset(u->f[i].xs);
	return 0;
}

/* ---- journal ------------------------------------------------------- */

static void step_failed(gcs_sink *s, up_step *u, int r, const char *msg);

static int journal_save(gcs_sink *s, up_step *u)
{
	eng_journal j;
	eng_jfile *jf = calloc(u->nfiles, sizeof(*jf));
	char err[ENG_ERRMSG_MAX];
	uint32_t i;
	int r;

	if (!jf)
		return -ENOMEM;
	memset(&j, 0, sizeof(j));
	j.step = u->step;
	j.remote = s->remote;
	j.host = s->host;
	j.hosts = s->hosts;
	j.index_done = u->index_done;
	j.error = u->error;
	j.nfiles = u->nfiles;
	j.files = jf;
	for (i = 0; i < u->nfiles; i++) {
		memcpy(jf[i].name, u->f[i].name, sizeof(jf[i].name));
		jf[i].size = u->f[i].size;
		jf[i].session = u->f[i].session;
		jf[i].confirmed = u->f[i].u ? gcs_upload_persisted(u->f[i].u) :
					      u->f[i].confirmed;
		jf[i].done = u->f[i].done;
	}
	r = eng_journal_write(s->base.c->root, &j, err);
	free(jf);
	if (r < 0) /* no resume without it: say so */
		step_failed(s, u, r, err);
	return r;
}

/* ---- status -------------------------------------------------------- */

static void set_status(gcs_sink *s, up_step *u, int state)
{
	uint64_t tot = 0, conf = 0;
	struct gcs_stats gs;
	uint32_t i;

	for (i = 0; u && i < u->nfiles; i++) {
		tot += u->f[i].size;
		conf += u->f[i].done ? u->f[i].size :
			u->f[i].u    ? gcs_upload_persisted(u->f[i].u) :
				       u->f[i].confirmed;
	}
	gcs_get_stats(s->gc, &gs);
	pthread_mutex_lock(&s->mu);
	if (u) {
		s->st.step = u->step;
		s->st.bytes_total = tot;
		s->st.bytes_confirmed = conf;
	}
	s->st.state = state;
	s->st.retries = gs.retries;
	pthread_mutex_unlock(&s->mu);
}

/* A step's upload failed: kept in the journal, reported everywhere. */
static void step_failed(gcs_sink *s, up_step *u, int r, const char *msg)
{
	struct ckpt *c = s->base.c;
	int was = u->state;

	u->state = ST_FAILED;
	r = eng_gcs_code(r);
	/* the journal says so too (ckptctl ls), unless writing it failed */
	if (was != ST_FAILED && !s->direct && !u->error) {
		u->error = strdup(msg);
		if (u->error)
			journal_save(s, u);
	}
	pthread_mutex_lock(&s->mu);
	s->st.status = r;
	snprintf(s->st.msg, sizeof(s->st.msg), "step %" PRIu64 ": %s", u->step,
		 msg);
	snprintf(s->err, sizeof(s->err), "%s", s->st.msg);
	s->unreported = 1;
	pthread_mutex_lock(&c->mu);
	s->base.status = r;
	snprintf(s->base.msg, sizeof(s->base.msg),
		 "upload of step %" PRIu64 ": %.200s", u->step, msg);
	/* no save in flight (the last one may be ending): its sink status
	 * keeps this; the next save's begin clears it */
	if (!s->live)
		atomic_store(&s->base.failed, 1);
	pthread_mutex_unlock(&c->mu);
	pthread_mutex_unlock(&s->mu);
	set_status(s, u, CKPT_UPLOAD_FAILED);
}

/* ---- writer side --------------------------------------------------- */

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
	u = step_new(s, job->step, job->nfiles);
	if (!u)
		return -ENOMEM;
	for (f = 0; f < job->nfiles; f++)
		if (step_name_file(s, u, f, job->files[f].name, UINT64_MAX)) {
			step_free(u);
			return -ENOMEM;
		}
	pthread_mutex_lock(&s->mu);
	if (s->qcap < cap) {
		up_item *nq = realloc(s->q, cap * sizeof(*nq));

		if (!nq) {
			pthread_mutex_unlock(&s->mu);
			step_free(u);
			return -ENOMEM;
		}
		s->q = nq;
		s->qcap = cap;
	}
	if (s->fcap < cap) {
		eng_buf **nf = realloc(s->fifo, cap * sizeof(*nf));

		if (!nf) {
			pthread_mutex_unlock(&s->mu);
			step_free(u);
			return -ENOMEM;
		}
		s->fifo = nf;
		s->fcap = cap;
	}
	free(s->from_file);
	s->from_file = malloc(job->nfiles * sizeof(*s->from_file));
	if (!s->from_file) {
		pthread_mutex_unlock(&s->mu);
		step_free(u);
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
	r = s->direct ? 0 : journal_save(s, u);
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
	handover(s, job, 1);
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
	 * file once every shard object is there (also after a restart) */
	return 0;
}

static void gs_abort(eng_sink *es, eng_job *job)
{
	/* detached for lagging while the save went on: catch up */
	handover((gcs_sink *)es, job, eng_job_status(es->c, job) == 0);
}

/* ---- upload thread ------------------------------------------------- */

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
	if (!s->direct) { /* the local file's hashes, to finish from it */
		f->crc = gcs_crc32c(f->crc, it->p, it->len);
		XXH3_64bits_update(f->xs, it->p, it->len);
	}
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

/* Gives every staged buffer back; sessions are kept for the resume. */
static void live_detach(up_step *u)
{
	uint32_t i;

	for (i = 0; i < u->nfiles; i++) {
		up_file *f = &u->f[i];
		const char *sess = f->u ? gcs_upload_session(f->u) : NULL;

		free(f->bounce);
		f->bounce = NULL;
		f->blen = 0;
		if (!f->u)
			continue;
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
}

static int crc_file(up_file *f, uint64_t end, uint8_t *tmp, char *err)
{
	uint64_t off = 0;

	f->crc = 0;
	if (!f->xs)
		f->xs = XXH3_createState();
	if (!f->xs)
		return eng_err(err, -ENOMEM, "out of memory");
	XXH3_64bits_reset(f->xs);
	while (off < end) {
		size_t n = end - off < UP_PIECE ? (size_t)(end - off) :
						  UP_PIECE;
		int r = eng_pread_all(f->fd, tmp, n, off);

		if (r < 0)
			return eng_err(err, r, "reading %s: %s", f->name,
				       ckpt_strerror(r));
		f->crc = gcs_crc32c(f->crc, tmp, n);
		XXH3_64bits_update(f->xs, tmp, n);
		off += n;
	}
	return 0;
}

/* Opens the local file and reattaches to (or starts) the upload. */
static int file_start(gcs_sink *s, up_step *u, up_file *f, char *err)
{
	struct gcs_upload_opts o = { GCS_NO_COND, f->size, 0, 0 };
	char d[32], *path;
	uint64_t persisted = 0;
	uint8_t *tmp;
	int r;

	fmt_step_dirname(u->step, d);
	path = eng_path("%s/%s/%s", s->base.c->root, d, f->name);
	if (!path)
		return eng_err(err, -ENOMEM, "out of memory");
	if (f->fd < 0)
		f->fd = eng_open(path, O_RDONLY | O_CLOEXEC, 0);
	r = f->fd < 0 ? f->fd : 0;
	if (r < 0) {
		eng_err(err, r, "%s: %s", path, ckpt_strerror(r));
		free(path);
		return r;
	}
	free(path);
	if (f->session) {
		r = gcs_upload_resume(s->gc, s->bucket, f->object, f->session,
				      &o, &persisted, &f->u);
		if (r == GCS_E_SESSION || r == -ENOENT) {
			free(f->session);
			f->session = NULL;
		} else if (r < 0) {
			return eng_err(err, r, "gs://%s/%s: resuming: %s",
				       s->bucket, f->object, gcs_errmsg(s->gc));
		}
	}
	if (!f->u) {
		persisted = 0;
		r = gcs_upload_start(s->gc, s->bucket, f->object, &o, &f->u);
		if (r < 0)
			return eng_err(err, r, "gs://%s/%s: %s", s->bucket,
				       f->object, gcs_errmsg(s->gc));
	}
	f->finishing = 0;
	if (gcs_op_done(gcs_upload_op(f->u))) {
		/* it was complete before the restart: step_run collects it */
		f->appended = f->size;
		f->finishing = 1;
		return 0;
	}
	if (persisted > f->size)
		return eng_err(err, GCS_E_PROTOCOL,
			       "%s: the server has %" PRIu64
			       " bytes of %" PRIu64,
			       f->object, persisted, f->size);
	tmp = malloc(UP_PIECE);
	if (!tmp)
		return eng_err(err, -ENOMEM, "out of memory");
	r = crc_file(f, persisted, tmp, err);
	free(tmp);
	f->appended = persisted;
	return r;
}

/* A piece read from a local file; once confirmed, the upload thread's
 * gcs_poll() returns at once to read the next (the owner may call
 * gcs_wakeup too: it only ends the poll early). */
typedef struct read_piece {
	gcs_sink *s;
	uint8_t data[];
} read_piece;

static void release_read(void *arg)
{
	read_piece *rp = arg;

	gcs_wakeup(rp->s->gc);
	free(rp);
}

/* Keeps up to three pieces of the file queued (one on the wire, two to
 * go), reading up to lim (what the local file has); finishes with the
 * crc once every byte of the file is in. */
static int file_feed(gcs_sink *s, up_file *f, uint64_t lim, char *err)
{
	int r;

	while (f->appended < lim &&
	       gcs_upload_pending(f->u) < 3 * (uint64_t)s->piece) {
		size_t n = lim - f->appended < UP_PIECE ?
				   (size_t)(lim - f->appended) :
				   UP_PIECE;
		read_piece *rp = malloc(sizeof(*rp) + n);
		uint8_t *p = rp ? rp->data : NULL;

		if (!rp)
			return eng_err(err, -ENOMEM, "out of memory");
		rp->s = s;
		r = eng_pread_all(f->fd, p, n, f->appended);
		if (r < 0) {
			free(rp);
			return eng_err(err, r, "reading %s at %" PRIu64 ": %s",
				       f->name, f->appended, ckpt_strerror(r));
		}
		f->crc = gcs_crc32c(f->crc, p, n);
		XXH3_64bits_update(f->xs, p, n);
		r = gcs_upload_append(f->u, p, n, release_read, rp);
		if (r < 0) {
			free(rp);
			return eng_err(err, r, "gs://%s/%s: %s", s->bucket,
				       f->object, gcs_errmsg(s->gc));
		}
		f->appended += n;
	}
	if (f->appended != f->size || f->finishing)
		return 0;
	/* bytes that differ from what the writer hashed (the local file
	 * changed since) never complete an object */
	if (XXH3_64bits_digest(f->xs) != f->xxh3)
		return eng_err(err, CKPT_E_CORRUPT,
			       "%s: the local file does not match its XXH3 in "
			       "the index: not uploaded",
			       f->name);
	f->finishing = 1;
	r = gcs_upload_finish(f->u, &f->crc);
	if (r < 0)
		eng_err(err, r, "gs://%s/%s: %s", s->bucket, f->object,
			gcs_op_errmsg(gcs_upload_op(f->u)));
	return r;
}

/* The host index object, create-only: doc, or else the local file. */
static int put_index(gcs_sink *s, up_step *u, const uint8_t *doc,
		     size_t doc_len, char *err)
{
	char iname[32], d[32], *path, *obj;
	uint8_t *buf = NULL;
	const uint8_t *p;
	size_t len = doc_len;
	int r;

	fmt_index_name(s->host, iname);
	fmt_step_dirname(u->step, d);
	path = eng_path("%s/%s/%s", s->base.c->root, d, iname);
	obj = object_name(s, u->step, iname);
	r = path && obj ? 0 : eng_err(err, -ENOMEM, "out of memory");
	if (r == 0 && !doc)
		r = eng_read_file(path, FMT_MAX_META_BYTES, &buf, &len, err);
	p = doc ? doc : buf;
	if (r == 0) {
		r = gcs_put(s->gc, s->bucket, obj, p, len, GCS_CREATE_ONLY,
			    NULL);
		if (r == GCS_E_PRECONDITION) {
			/* an earlier run of ours got there: the same bytes? */
			struct gcs_object m;

			memset(&m, 0, sizeof(m));
			r = gcs_stat(s->gc, s->bucket, obj, &m);
			if (r == 0 && (m.size != len || !m.has_crc32c ||
				       m.crc32c != gcs_crc32c(0, p, len)))
				r = CKPT_E_EXISTS;
			gcs_object_clear(&m);
		}
		if (r < 0)
			eng_err(err, r, "gs://%s/%s: %s", s->bucket, obj,
				r == CKPT_E_EXISTS ?
					"a different index is already there" :
					gcs_errmsg(s->gc));
	}
	free(buf);
	free(path);
	free(obj);
	return r;
}

/* Index, then the pod-wide commit through the gs:// backend. */
static void step_commit(gcs_sink *s, up_step *u)
{
	char err[ENG_ERRMSG_MAX];
	int r, state = CKPT_UPLOAD_COMMITTED;

	err[0] = 0;
	if (!u->index_done) {
		r = put_index(s, u, NULL, 0, err);
		if (r < 0) {
			step_failed(s, u, r, err);
			return;
		}
		u->index_done = 1;
		journal_save(s, u);
	}
	r = eng_commit_step(s->remote, s->hosts, u->step, err);
	/* another host's part is missing: it commits when it lands */
	if (r == CKPT_E_INCOMPLETE && s->hosts > 1 &&
	    strstr(err, "has not written its index"))
		state = CKPT_UPLOAD_UPLOADED;
	else if (r < 0 && r != CKPT_E_EXISTS) {
		step_failed(s, u, r, err);
		return;
	}
	u->state = ST_DONE;
	eng_journal_remove(s->base.c->root, u->step);
	set_status(s, u, state);
}

/* One turn over the oldest background step. */
static void step_run(gcs_sink *s, up_step *u)
{
	char err[ENG_ERRMSG_MAX];
	uint32_t i, done = 0;
	int r = 0, changed = 0;

	for (i = 0; i < u->nfiles && r == 0; i++) {
		up_file *f = &u->f[i];
		const char *sess;

		if (f->done) {
			done++;
			continue;
		}
		if (!f->u)
			r = file_start(s, u, f, err);
		if (r == 0)
			r = file_feed(s, f, f->size, err);
		if (r < 0)
			break;
		sess = gcs_upload_session(f->u);
		if (sess && (!f->session || strcmp(sess, f->session))) {
			free(f->session);
			f->session = strdup(sess);
			changed = 1;
		}
		if (!gcs_op_done(gcs_upload_op(f->u)))
			continue;
		r = gcs_op_wait(gcs_upload_op(f->u));
		if (r < 0) {
			eng_err(err, r, "gs://%s/%s: %s", s->bucket, f->object,
				gcs_op_errmsg(gcs_upload_op(f->u)));
			break;
		}
		f->done = 1;
		f->confirmed = f->size;
		gcs_upload_free(f->u);
		f->u = NULL;
		eng_close(f->fd);
		f->fd = -1;
		changed = 1;
		done++;
	}
	if (r < 0) {
		step_failed(s, u, r, err);
		return;
	}
	if (changed)
		journal_save(s, u);
	set_status(s, u, CKPT_UPLOAD_RUNNING);
	if (done == u->nfiles)
		step_commit(s, u);
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
		char *o = object_name(s, job->step, FMT_COMMIT_NAME);
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
		r = put_index(s, u, s->cmd_buf, s->cmd_len, err);
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
	set_status(s, u, r < 0 ? CKPT_UPLOAD_FAILED : CKPT_UPLOAD_RUNNING);
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
			set_status(s, u,
				   s->hosts > 1 ? CKPT_UPLOAD_UPLOADED :
						  CKPT_UPLOAD_COMMITTED);
		for (i = 0; i < u->nfiles; i++) {
			gcs_upload_free(u->f[i].u);
			u->f[i].u = NULL;
		}
		step_free(u);
	}
}

/* ---- upload thread: the live step past what it holds ------------- */

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
		f->fd = eng_open(path, O_RDONLY | O_CLOEXEC, 0);
		free(path);
		if (f->fd < 0)
			return f->fd;
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
		r = file_feed(s, f, f->mark, err);
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
			const char *sess;

			if (!f->u || gcs_upload_persisted(f->u) >= f->staged_end)
				continue;
			sess = gcs_upload_session(f->u);
			free(f->session);
			f->session = sess ? strdup(sess) : NULL;
			f->confirmed = gcs_upload_persisted(f->u);
			gcs_upload_free(f->u);
			f->u = NULL;
			f->appended = 0;
			f->finishing = 0;
			f->staged_end = 0;
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

			/* errors: the upload's, seen by step_run */
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
		journal_save(s, u);
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
		step_free(u);
}

/* Upload thread: the live step after a batch of chunks. */
static void live_run(gcs_sink *s, up_step *u, int failed, int detach,
		     int check)
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

static void *upload_main(void *arg)
{
	gcs_sink *s = arg;
	up_item *batch = NULL;
	unsigned cap = 0, n, i;

	eng_thread_background(0);
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
			if (live && !live->dropped && detach < 2 &&
			    live_append(s, live, &batch[i]) == 0)
				continue;
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
			step_run(s, bg);

		pthread_mutex_lock(&s->mu);
		if (bg && bg->state != ST_BACKGROUND) {
			s->steps = bg->next;
			s->pending--;
			pthread_cond_broadcast(&s->cv);
			pthread_mutex_unlock(&s->mu);
			step_free(bg);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->qn || s->handover || s->reclaim || s->cmd || s->stop)
			continue;
		pthread_mutex_unlock(&s->mu);
		/* chunks held for the local sink: look again soon */
		gcs_poll(s->gc, s->fn ? 2 : 200);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	free(batch);
	return NULL;
}

/* ---- handle side --------------------------------------------------- */

static void gs_destroy(eng_sink *es)
{
	gcs_sink *s = (gcs_sink *)es;
	up_step *u;

	if (s->thr_started) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		pthread_mutex_unlock(&s->mu);
		gcs_wakeup(s->gc);
		pthread_join(s->thr, NULL);
	}
	/* unfinished steps stay in their journals for the next open */
	step_free(s->live);
	while ((u = s->steps)) {
		s->steps = u->next;
		step_free(u);
	}
	gcs_client_free(s->gc);
	if (s->hold_fd >= 0)
		eng_close(s->hold_fd);
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

/* Sizes (of a journal written at the start of a save) and hashes of the
 * journal's files, from the local index: -ENOENT if the save never
 * completed locally. */
static int sizes_from_index(gcs_sink *s, eng_journal *j)
{
	char d[32], iname[32], err[256], *path;
	uint8_t *buf = NULL;
	size_t len = 0, i, k;
	fmt_index ix;
	int r;

	fmt_step_dirname(j->step, d);
	fmt_index_name(s->host, iname);
	path = eng_path("%s/%s/%s", s->base.c->root, d, iname);
	r = path ? eng_read_file(path, FMT_MAX_META_BYTES, &buf, &len, NULL) :
		   -ENOMEM;
	free(path);
	if (r < 0)
		return r;
	memset(&ix, 0, sizeof(ix));
	r = fmt_index_decode(buf, len, &ix, err, sizeof(err));
	free(buf);
	for (i = 0; r == 0 && i < j->nfiles; i++) {
		for (k = 0; k < ix.nfiles; k++)
			if (!strcmp(ix.files[k].name, j->files[i].name))
				break;
		if (k == ix.nfiles)
			r = -ENOENT;
		else if (j->files[i].size == UINT64_MAX ||
			 j->files[i].size == ix.files[k].size) {
			j->files[i].size = ix.files[k].size;
			j->files[i].xxh3 = ix.files[k].xxh3;
		} else {
			r = CKPT_E_CORRUPT;
		}
	}
	fmt_index_free(&ix);
	return r;
}

/* Steps journaled by an earlier process for this remote: resumed. A save
 * that never completed locally has nothing to upload: its journal goes. */
static void load_journals(gcs_sink *s)
{
	const char *root = s->base.c->root;
	uint64_t *steps = NULL;
	size_t n = 0, k;
	up_step **pp = &s->steps;

	if (eng_journal_list(root, &steps, &n) < 0)
		return;
	for (k = 0; k < n; k++) {
		char err[ENG_ERRMSG_MAX];
		eng_journal j;
		up_step *u;
		uint32_t i;

		if (eng_journal_read(root, steps[k], &j, err) < 0)
			continue;
		/* sizes (if not known yet) and hashes from the local index;
		 * without one the save never completed here */
		if (!strcmp(j.remote, s->remote) && j.host == s->host &&
		    sizes_from_index(s, &j) < 0) {
			eng_journal_remove(root, j.step);
			eng_journal_free(&j);
			continue;
		}
		u = strcmp(j.remote, s->remote) || j.host != s->host ?
			    NULL :
			    step_new(s, j.step, j.nfiles);
		for (i = 0; u && i < j.nfiles; i++) {
			if (step_name_file(s, u, i, j.files[i].name,
					   j.files[i].size)) {
				step_free(u);
				u = NULL;
				break;
			}
			u->f[i].done = j.files[i].done;
			u->f[i].xxh3 = j.files[i].xxh3;
			u->f[i].confirmed = j.files[i].confirmed;
			u->f[i].session = j.files[i].session;
			j.files[i].session = NULL;
		}
		if (u) {
			u->index_done = j.index_done;
			u->state = ST_BACKGROUND;
			*pp = u;
			pp = &u->next;
			s->pending++;
			if (j.error) /* tried again: no longer failed */
				journal_save(s, u);
		}
		eng_journal_free(&j);
	}
	free(steps);
}

/* A resumable upload of unknown size sends whole pieces only, holding
 * the buffers of the piece being filled: each file gets a budget of half
 * its share of what the sink may hold (the lag bound; all of the pool for
 * gs:// alone), so another piece can fill while one is on the wire; a
 * piece is `budget` chunks, and chunks smaller than piece / budget are
 * copied (live_append). */
static void piece_size(gcs_sink *s, const struct ckpt *c, int direct)
{
	uint32_t nf = c->s.files_per_host ? c->s.files_per_host : 1;
	uint64_t bufs = direct ? c->nslots + c->nout : c->sink_lag_max;
	uint64_t budget = bufs / (2ull * nf), p;

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
		load_journals(s);
	}
	if (r == 0) {
		r = -pthread_create(&s->thr, NULL, upload_main, s);
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
	clock_gettime(CLOCK_REALTIME, &dl);
	if (timeout_ms >= 0) {
		dl.tv_sec += timeout_ms / 1000;
		dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (dl.tv_nsec >= 1000000000) {
			dl.tv_sec++;
			dl.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&s->mu);
	while (s->pending > 0 && s->st.state != CKPT_UPLOAD_FAILED && r == 0) {
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
