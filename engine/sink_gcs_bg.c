/*
 * sink_gcs_bg.c - the upload sink's steps (sink_gcs.c): their state,
 * journal and status; the background upload from the local files; the
 * host index and the pod-wide commit; journals left by an earlier process.
 *
 * Design note. Runs on the upload thread only (sink_gcs_up.c). A step is
 * in the background once its local copy is committed. Each file's upload
 * goes on as it was during the save, or (after a drop or a restart) is
 * resumed from its journaled session where the server says it stopped (a
 * status query; the crc32c and XXH3 of the prefix the server has are
 * recomputed from the local file), or is started anew. The rest is pread
 * from the local shard file, three pieces queued per file (up_file_feed).
 * The file's XXH3 must equal the local index's before its last piece
 * goes, with the crc32c of the whole file, so the server rejects bytes
 * that differ and no object completes from a changed file.
 *
 * Commit: after its index object is there, each host tries the commit of
 * the step through the gs:// backend (eng_commit_step_loc: every host's
 * index present, COMMIT created with ifGenerationMatch=0), on a location
 * of its own that ckpt_close cancels (up_side_open), as it cancels the
 * uploads: a close never waits out a silent bucket, and what was cut
 * short stays journaled, not failed. CKPT_E_INCOMPLETE
 * means another host has yet to upload and will commit when it has (the
 * last host to finish sees every index); CKPT_E_EXISTS means another host
 * won: success either way. No coordinator.
 *
 * After a restart (up_probe_remote): deduplicating saves of the directory
 * may refer to its newest step only once the bucket holds that step
 * (dedup.c). The upload thread asks the bucket first thing: if its commit
 * record of that step lists this host's index with the local index's size
 * and XXH3 (the index names every file's hash), the step is the same
 * there, and the first save after the restart need not be sent in full.
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
#include "plan.h"
#include "sink_gcs.h"

#define UP_PIECE (8u << 20) /* pread size when reading local files */

void up_step_free(up_step *u)
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

char *up_object_name(gcs_sink *s, uint64_t step, const char *name)
{
	char d[32];

	/* prefix: "" or "P/" (eng_loc_parse) */
	fmt_step_dirname(step, d);
	return eng_path("%s%s/%s", s->prefix, d, name);
}

up_step *up_step_new(gcs_sink *s, uint64_t step, uint32_t nfiles)
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

int up_step_name_file(gcs_sink *s, up_step *u, uint32_t i, const char *name,
		      uint64_t size)
{
	snprintf(u->f[i].name, sizeof(u->f[i].name), "%s", name);
	u->f[i].size = size;
	u->f[i].object = up_object_name(s, u->step, name);
	u->f[i].xs = XXH3_createState();
	if (!u->f[i].object || !u->f[i].xs)
		return -ENOMEM;
	XXH3_64bits_reset(u->f[i].xs);
	return 0;
}

int up_journal_save(gcs_sink *s, up_step *u)
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
		up_step_failed(s, u, r, err);
	return r;
}

/* ---- status -------------------------------------------------------- */

void up_set_status(gcs_sink *s, up_step *u, int state)
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
void up_step_failed(gcs_sink *s, up_step *u, int r, const char *msg)
{
	struct ckpt *c = s->base.c;
	int was = u->state, closing;

	/* ckpt_close cancelled it (gs_destroy): not a failure, the step
	 * stays journaled as it was for the next ckpt_open */
	pthread_mutex_lock(&s->mu);
	closing = s->stop;
	pthread_mutex_unlock(&s->mu);
	if (r == -ECANCELED && closing)
		return;
	u->state = ST_FAILED;
	r = eng_gcs_code(r);
	/* the journal says so too (ckptctl ls), unless writing it failed */
	if (was != ST_FAILED && !s->direct && !u->error) {
		u->error = strdup(msg);
		if (u->error)
			up_journal_save(s, u);
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
	up_set_status(s, u, CKPT_UPLOAD_FAILED);
}

static int piece_read(up_file *f, uint8_t *p, size_t n, uint64_t off);

/* tmp: UP_PIECE bytes, FMT_ALIGN-aligned (the fd may be O_DIRECT) */
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
		int r = piece_read(f, tmp, n, off);

		if (r < 0)
			return eng_err(err, r, "reading %s: %s", f->name,
				       ckpt_strerror(r));
		f->crc = gcs_crc32c(f->crc, tmp, n);
		XXH3_64bits_update(f->xs, tmp, n);
		off += n;
	}
	return 0;
}

/* Opens the local file and reattaches to its session (the status query
 * is answered later: file_resumed) or starts a new upload. */
static int file_start(gcs_sink *s, up_step *u, up_file *f, char *err)
{
	struct gcs_upload_opts o = { GCS_NO_COND, f->size, 0, 0 };
	char d[32], *path;
	int r;

	fmt_step_dirname(u->step, d);
	path = eng_path("%s/%s/%s", s->base.c->root, d, f->name);
	if (!path)
		return eng_err(err, -ENOMEM, "out of memory");
	r = f->fd < 0 ? up_file_open(f, path) : 0;
	if (r < 0) {
		eng_err(err, r, "%s: %s", path, ckpt_strerror(r));
		free(path);
		return r;
	}
	free(path);
	f->finishing = 0;
	f->resuming = 1;
	f->resumed = 0;
	if (f->session)
		r = gcs_upload_reattach(s->gc, s->bucket, f->object, f->session,
					&o, &f->u);
	else
		r = gcs_upload_start(s->gc, s->bucket, f->object, &o, &f->u);
	if (r < 0)
		return eng_err(err, r, "gs://%s/%s: %s", s->bucket, f->object,
			       gcs_errmsg(s->gc));
	return 0;
}

/* After file_start: 0 while the server has not said where the session
 * stands, 1 once the upload can go on (the crc32c and XXH3 of what the
 * server has recomputed from the local file), or an error. A session the
 * server no longer knows is started anew. */
static int file_resumed(gcs_sink *s, up_file *f, char *err)
{
	struct gcs_upload_opts o = { GCS_NO_COND, f->size, 0, 0 };
	uint64_t persisted = 0;
	uint8_t *tmp;
	int r = f->session ? gcs_upload_reattached(f->u, &persisted) : 1;

	if (r == 0)
		return 0;
	if (r == GCS_E_SESSION || r == -ENOENT) {
		gcs_upload_free(f->u);
		f->u = NULL;
		free(f->session);
		f->session = NULL;
		persisted = 0;
		r = gcs_upload_start(s->gc, s->bucket, f->object, &o, &f->u);
	}
	if (r < 0)
		return eng_err(err, r, "gs://%s/%s: resuming: %s", s->bucket,
			       f->object,
			       f->u ? gcs_op_errmsg(gcs_upload_op(f->u)) :
				      gcs_errmsg(s->gc));
	f->resuming = 0;
	f->resumed = f->session != NULL;
	if (f->session && gcs_op_done(gcs_upload_op(f->u))) {
		/* it was complete before the restart: up_step_run collects it */
		f->appended = f->size;
		f->finishing = 1;
		return 1;
	}
	if (persisted > f->size)
		return eng_err(err, GCS_E_PROTOCOL,
			       "%s: the server has %" PRIu64
			       " bytes of %" PRIu64,
			       f->object, persisted, f->size);
	tmp = aligned_alloc(FMT_ALIGN, UP_PIECE);
	if (!tmp)
		return eng_err(err, -ENOMEM, "out of memory");
	r = crc_file(f, persisted, tmp, err);
	free(tmp);
	f->appended = persisted;
	return r < 0 ? r : 1;
}

/* A piece read from a local file; once confirmed, the upload thread's
 * gcs_poll() returns at once to read the next (the owner may call
 * gcs_wakeup too: it only ends the poll early). */
typedef struct read_piece {
	gcs_sink *s;
	struct read_piece *next; /* in s->rp_free */
	uint8_t pad[FMT_ALIGN - 2 * sizeof(void *)];
	uint8_t data[]; /* FMT_ALIGN-aligned */
} read_piece;

/*
 * Pieces are kept and reused while steps are in the background, instead
 * of one malloc and free of 8 MiB each: glibc maps and unmaps such blocks,
 * so every piece faulted its pages in again, and on a VM with shadow page
 * tables the first user touch of each fresh page is a trip to the
 * hypervisor (the profile of a 2 GiB background upload: 63% of the upload
 * thread in XXH3 over just-read pieces). At most three per file are in
 * use (up_file_feed), so at most that many are kept.
 */
#define UP_KEEP_PIECES 32

static read_piece *piece_get(gcs_sink *s)
{
	read_piece *rp;

	pthread_mutex_lock(&s->rp_mu);
	rp = s->rp_free;
	if (rp) {
		s->rp_free = rp->next;
		s->rp_nfree--;
	}
	pthread_mutex_unlock(&s->rp_mu);
	/* the data aligned for O_DIRECT reads: the header takes a block */
	if (!rp)
		rp = aligned_alloc(FMT_ALIGN, FMT_ALIGN + UP_PIECE);
	if (rp) {
		rp->s = s;
		rp->next = NULL;
	}
	return rp;
}

int up_file_open(up_file *f, const char *path)
{
	f->direct = 1;
	f->fd = eng_open(path, O_RDONLY | O_CLOEXEC | O_DIRECT, 0);
	if (f->fd == -EINVAL) { /* a file system without O_DIRECT */
		f->direct = 0;
		f->fd = eng_open(path, O_RDONLY | O_CLOEXEC, 0);
	}
	return f->fd < 0 ? f->fd : 0;
}

/*
 * Reads [off, off + n) of the file. With O_DIRECT the disk's DMA fills the
 * piece (kept mapped, see above): no page-cache copy, whose reads of
 * just-filled pages dominated the upload thread once pieces were reused
 * (86% in _copy_to_iter), and the checkpoint does not evict the page
 * cache. An unaligned offset or length (a file's tail) drops O_DIRECT for
 * the rest of that file.
 */
static int piece_read(up_file *f, uint8_t *p, size_t n, uint64_t off)
{
	if (f->direct && ((off | n) % FMT_ALIGN) != 0) {
		int fl = fcntl(f->fd, F_GETFL);

		if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_DIRECT) < 0)
			return -errno;
		f->direct = 0;
	}
	return eng_pread_all(f->fd, p, n, off);
}

static void piece_put(gcs_sink *s, read_piece *rp)
{
	pthread_mutex_lock(&s->rp_mu);
	if (s->rp_nfree < UP_KEEP_PIECES) {
		rp->next = s->rp_free;
		s->rp_free = rp;
		s->rp_nfree++;
		rp = NULL;
	}
	pthread_mutex_unlock(&s->rp_mu);
	free(rp);
}

void up_pieces_trim(gcs_sink *s)
{
	read_piece *rp;

	pthread_mutex_lock(&s->rp_mu);
	rp = s->rp_free;
	s->rp_free = NULL;
	s->rp_nfree = 0;
	pthread_mutex_unlock(&s->rp_mu);
	while (rp) {
		read_piece *next = rp->next;

		free(rp);
		rp = next;
	}
}

static void release_read(void *arg)
{
	read_piece *rp = arg;
	gcs_sink *s = rp->s;

	piece_put(s, rp);
	gcs_wakeup(s->gc);
}

/* Keeps up to three pieces of the file queued (one on the wire, two to
 * go), reading up to lim (what the local file has); finishes with the
 * crc once every byte of the file is in. */
int up_file_feed(gcs_sink *s, up_file *f, uint64_t lim, char *err)
{
	int r;

	while (f->appended < lim &&
	       gcs_upload_pending(f->u) < 3 * (uint64_t)s->piece) {
		size_t n = lim - f->appended < UP_PIECE ?
				   (size_t)(lim - f->appended) :
				   UP_PIECE;
		read_piece *rp = piece_get(s);
		uint8_t *p = rp ? rp->data : NULL;

		if (!rp)
			return eng_err(err, -ENOMEM, "out of memory");
		r = piece_read(f, p, n, f->appended);
		if (r < 0) {
			piece_put(s, rp);
			return eng_err(err, r, "reading %s at %" PRIu64 ": %s",
				       f->name, f->appended, ckpt_strerror(r));
		}
		if (f->resumed) /* else the client's crc covers it all */
			f->crc = gcs_crc32c(f->crc, p, n);
		XXH3_64bits_update(f->xs, p, n);
		r = gcs_upload_append(f->u, p, n, release_read, rp);
		if (r < 0) {
			piece_put(s, rp);
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
	r = gcs_upload_finish(f->u, f->resumed ? &f->crc : NULL);
	if (r < 0)
		eng_err(err, r, "gs://%s/%s: %s", s->bucket, f->object,
			gcs_op_errmsg(gcs_upload_op(f->u)));
	return r;
}

/* The host index object, create-only: doc, or else the local file. */
int up_put_index(gcs_sink *s, up_step *u, const uint8_t *doc, size_t doc_len,
		 char *err)
{
	char iname[32], d[32], *path, *obj;
	uint8_t *buf = NULL;
	const uint8_t *p;
	size_t len = doc_len;
	int r;

	fmt_index_name(s->host, iname);
	fmt_step_dirname(u->step, d);
	path = eng_path("%s/%s/%s", s->base.c->root, d, iname);
	obj = up_object_name(s, u->step, iname);
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
	eng_loc *l = NULL;

	err[0] = 0;
	if (!u->index_done) {
		r = up_put_index(s, u, NULL, 0, err);
		if (r < 0) {
			up_step_failed(s, u, r, err);
			return;
		}
		u->index_done = 1;
		up_journal_save(s, u);
	}
	r = up_side_open(s, &l, err);
	if (r == 0)
		r = eng_commit_step_loc(l, s->hosts, u->step, err);
	up_side_close(s, l);
	/* another host's part is missing: it commits when it lands */
	if (r == CKPT_E_INCOMPLETE && s->hosts > 1 &&
	    strstr(err, "has not written its index"))
		state = CKPT_UPLOAD_UPLOADED;
	else if (r < 0 && r != CKPT_E_EXISTS) {
		up_step_failed(s, u, r, err);
		return;
	}
	u->state = ST_DONE;
	eng_journal_remove(s->base.c->root, u->step);
	up_set_status(s, u, state);
	/* the newest step committed in the remote: deduplicating saves of
	 * the directory may refer to it (dedup.c); the upload thread is the
	 * only writer */
	if (state == CKPT_UPLOAD_COMMITTED && !s->direct &&
	    atomic_load(&s->base.c->remote_committed) < u->step + 1)
		atomic_store(&s->base.c->remote_committed, u->step + 1);
	/* the upload's pace, for the deadline planner */
	eng_plan_upload_done(s->base.c, u->step, s->st.bytes_total);
}

/* One turn over the oldest background step. */
void up_step_run(gcs_sink *s, up_step *u)
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
		/* every file's status query at once, none waited for */
		if (r == 0 && f->resuming && (r = file_resumed(s, f, err)) == 0)
			continue;
		if (r > 0)
			r = 0;
		if (r == 0)
			r = up_file_feed(s, f, f->size, err);
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
		up_step_failed(s, u, r, err);
		return;
	}
	if (changed)
		up_journal_save(s, u);
	up_set_status(s, u, CKPT_UPLOAD_RUNNING);
	if (done == u->nfiles)
		step_commit(s, u);
}

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
void up_load_journals(gcs_sink *s)
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
			    up_step_new(s, j.step, j.nfiles);
		for (i = 0; u && i < j.nfiles; i++) {
			if (up_step_name_file(s, u, i, j.files[i].name,
					      j.files[i].size)) {
				up_step_free(u);
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
				up_journal_save(s, u);
		}
		eng_journal_free(&j);
	}
	free(steps);
}

int up_side_open(gcs_sink *s, eng_loc **l, char *err)
{
	int r = eng_loc_open(s->remote, l, err), stop;

	if (r < 0)
		return r;
	pthread_mutex_lock(&s->mu);
	stop = s->stop;
	s->side_gc = (*l)->priv;
	pthread_mutex_unlock(&s->mu);
	return stop ? eng_err(err, -ECANCELED, "%s: the handle is closing",
			      s->remote) :
		      0;
}

void up_side_close(gcs_sink *s, eng_loc *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&s->mu);
	s->side_gc = NULL;
	pthread_mutex_unlock(&s->mu);
	eng_loc_close(l);
}

void up_probe_remote(gcs_sink *s)
{
	struct ckpt *c = s->base.c;
	char err[ENG_ERRMSG_MAX], iname[32];
	const fmt_file_entry *le, *re;
	fmt_commit lc, rc;
	uint64_t p;
	eng_loc *l = NULL;
	int r;

	if (eng_resolve_latest(c->root, &p, err) < 0 ||
	    eng_load_commit(c->root, p, &lc, err) < 0)
		return;
	r = up_side_open(s, &l, err);
	if (r == 0)
		r = eng_loc_load_commit(l, p, &rc, err);
	up_side_close(s, l);
	if (r == 0) {
		fmt_index_name(s->host, iname);
		le = fmt_commit_find(&lc, iname);
		re = fmt_commit_find(&rc, iname);
		/* the upload thread is remote_committed's only writer */
		if (le && re && lc.host_count == rc.host_count &&
		    le->size == re->size && le->xxh3 == re->xxh3 &&
		    atomic_load(&c->remote_committed) < p + 1)
			atomic_store(&c->remote_committed, p + 1);
		fmt_commit_free(&rc);
	}
	fmt_commit_free(&lc);
}
