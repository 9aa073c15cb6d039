/*
 * writer.c - the writer thread and the local shard-file sink.
 *
 * Design note. One writer thread per handle turns encoded chunks into this
 * host's files. It is a dispatcher: it gives each arriving chunk a file
 * (chunk index mod files) and the next 4096-aligned offset in it, records
 * the chunk in the index, feeds the bytes to that file's streaming XXH3 (in
 * file order, so the whole-file hash is known without reading anything
 * back) and hands the buffer to every sink. Sinks are the extension point:
 * the local sink below writes through io_uring (or pwrite); an uploader can
 * be added as a second sink receiving the same buffers in the same order.
 * A buffer returns to the pool when its last reference is dropped.
 *
 * The thread sleeps on the handle's eventfd while a save runs: workers post
 * to it when they queue a chunk, the ring posts to it on every completion,
 * and ckpt_save() posts when its copy ends. A failure stops submission,
 * drains what is in flight, waits until every buffer of the save is back,
 * then removes this save's temporary files. The previous checkpoint and
 * `latest` are never touched before the new COMMIT exists.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "save_internal.h"

/* ------------------------------------------------------------------ */
/* Local file sink                                                    */
/* ------------------------------------------------------------------ */

typedef struct local_sink {
	eng_sink base;
	eng_job *job;
	uint32_t nfiles;
	int *fd;
	int *buffered; /* O_DIRECT dropped after an unaligned short write */
	char **tmp, **fin;
	eng_buf *hdr; /* pseudo chunks for the shard headers */
	eng_buf *pend_head, *pend_tail;
	unsigned inflight;
	int uring, direct, prealloc;
	int failed;
	int renamed, published;
} local_sink;

static void ls_clear(local_sink *ls)
{
	uint32_t f;

	for (f = 0; f < ls->nfiles; f++) {
		if (ls->fd && ls->fd[f] >= 0)
			eng_close(ls->fd[f]);
		if (ls->tmp)
			free(ls->tmp[f]);
		if (ls->fin)
			free(ls->fin[f]);
	}
	free(ls->fd);
	free(ls->buffered);
	free(ls->tmp);
	free(ls->fin);
	free(ls->hdr);
	ls->fd = ls->buffered = NULL;
	ls->tmp = ls->fin = NULL;
	ls->hdr = NULL;
	ls->nfiles = 0;
	ls->job = NULL;
	ls->pend_head = ls->pend_tail = NULL;
	ls->inflight = 0;
	ls->failed = ls->renamed = ls->published = 0;
}

static int ls_fail_write(local_sink *ls, eng_buf *b, int r, uint64_t off,
			 size_t len)
{
	eng_job *job = ls->job;

	ls->failed = 1;
	if (b->is_hdr)
		return eng_job_fail(ls->base.c, job, r,
				    "%s: writing the shard header: %s",
				    ls->tmp[b->file], ckpt_strerror(r));
	return eng_job_fail(ls->base.c, job, r,
			    "%s: write of %zu bytes at offset %llu (chunk at "
			    "stream offset %llu): %s",
			    ls->tmp[b->file], len, (unsigned long long)off,
			    (unsigned long long)b->k * job->chunk_bytes,
			    ckpt_strerror(r));
}

static void ls_done(local_sink *ls, eng_buf *b)
{
	struct ckpt *c = ls->base.c;

	if (b->is_hdr)
		return;
	pthread_mutex_lock(&c->mu);
	c->bytes_written += b->payload;
	c->bytes_stored += b->span;
	pthread_mutex_unlock(&c->mu);
	eng_buf_unref(c, b);
}

static void ls_drop(local_sink *ls, eng_buf *b)
{
	if (!b->is_hdr)
		eng_buf_unref(ls->base.c, b);
}

static void ls_enqueue(local_sink *ls, eng_buf *b, int front)
{
	b->io_next = NULL;
	if (!ls->pend_head) {
		ls->pend_head = ls->pend_tail = b;
	} else if (front) {
		b->io_next = ls->pend_head;
		ls->pend_head = b;
	} else {
		ls->pend_tail->io_next = b;
		ls->pend_tail = b;
	}
}

static void ls_sync_write(local_sink *ls, eng_buf *b)
{
	int r = eng_pwrite_all(ls->fd[b->file], b->p, b->span, b->file_offset);

	if (r < 0) {
		ls_fail_write(ls, b, r, b->file_offset, b->span);
		ls_drop(ls, b);
		return;
	}
	ls_done(ls, b);
}

static int ls_begin(eng_sink *s, eng_job *job)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;
	uint32_t f, n = job->nfiles;
	int r;

	ls_clear(ls);
	ls->job = job;
	ls->uring = c->have_ring;
	ls->direct = c->direct;
	ls->prealloc = 0;
	ls->fd = malloc(n * sizeof(*ls->fd));
	ls->buffered = calloc(n, sizeof(*ls->buffered));
	ls->tmp = calloc(n, sizeof(*ls->tmp));
	ls->fin = calloc(n, sizeof(*ls->fin));
	ls->hdr = calloc(n, sizeof(*ls->hdr));
	if (!ls->fd || !ls->buffered || !ls->tmp || !ls->fin || !ls->hdr) {
		free(ls->fd);
		ls->fd = NULL;
		return eng_job_fail(c, job, -ENOMEM, "out of memory");
	}
	ls->nfiles = n;
	for (f = 0; f < n; f++)
		ls->fd[f] = -1;
	for (f = 0; f < n; f++) {
		ls->tmp[f] = eng_path("%s/%s" FMT_TMP_SUFFIX, job->stepdir,
				      job->files[f].name);
		ls->fin[f] =
			eng_path("%s/%s", job->stepdir, job->files[f].name);
		if (!ls->tmp[f] || !ls->fin[f])
			return eng_job_fail(c, job, -ENOMEM, "out of memory");
	}
	for (f = 0; f < n; f++) {
		int fd = eng_open(ls->tmp[f],
				  O_WRONLY | O_CREAT | O_TRUNC |
					  (ls->direct ? O_DIRECT : 0),
				  0644);

		if (fd < 0)
			return eng_job_fail(c, job, fd, "%s: create: %s",
					    ls->tmp[f], ckpt_strerror(fd));
		ls->fd[f] = fd;
		/* Writes inside the file size run concurrently on ext4/xfs;
		 * extending O_DIRECT writes are serialized and synchronous.
		 * The planned size is an upper bound (raw spans), trimmed at
		 * finish. Only an optimization: failure is ignored. */
		if (ls->direct &&
		    fallocate(fd, 0, 0, (off_t)job->file_cap[f]) == 0)
			ls->prealloc = 1;
	}
	for (f = 0; f < n; f++) {
		eng_buf *h = &ls->hdr[f];

		h->p = job->hdrs + (size_t)f * FMT_SHARD_HDR_SIZE;
		h->cap = h->span = FMT_SHARD_HDR_SIZE;
		h->fixed = -1;
		h->is_hdr = 1;
		h->file = f;
		h->file_offset = 0;
		h->io_done = 0;
		if (ls->uring) {
			ls_enqueue(ls, h, 0);
		} else {
			r = eng_pwrite_all(ls->fd[f], h->p, h->span, 0);
			if (r < 0)
				return ls_fail_write(ls, h, r, 0, h->span);
		}
	}
	return 0;
}

static void ls_put(eng_sink *s, eng_buf *b)
{
	local_sink *ls = (local_sink *)s;

	b->io_done = 0;
	if (ls->failed)
		ls_drop(ls, b);
	else if (ls->uring)
		ls_enqueue(ls, b, 0);
	else
		ls_sync_write(ls, b);
}

static void ls_complete(local_sink *ls, eng_buf *b, long res, int failed)
{
	int fd = ls->fd[b->file];
	uint64_t off = b->file_offset + b->io_done;
	size_t len = (size_t)(b->span - b->io_done);

	res = eng_filter_write(fd, off, len, res);
	if (res < 0 || res == 0) {
		if (!ls->failed && !failed)
			ls_fail_write(ls, b, res < 0 ? (int)res : -EIO, off,
				      len);
		ls->failed = 1;
		ls_drop(ls, b);
		return;
	}
	if ((size_t)res < len) {
		/* Short count: continue with the remainder. O_DIRECT cannot
		 * write from an unaligned offset, so this file goes buffered
		 * (made durable by the fdatasync at finish anyway). */
		b->io_done += (uint64_t)res;
		if (failed || ls->failed) {
			ls_drop(ls, b);
			return;
		}
		if (ls->direct && !ls->buffered[b->file] &&
		    (b->io_done % FMT_ALIGN) != 0) {
			int fl = fcntl(fd, F_GETFL);

			if (fl >= 0)
				fcntl(fd, F_SETFL, fl & ~O_DIRECT);
			ls->buffered[b->file] = 1;
		}
		ls_enqueue(ls, b, 1);
		return;
	}
	ls_done(ls, b);
}

static int ls_pump(eng_sink *s, int failed, int *busy)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;
	struct io_uring_cqe *cqe;
	unsigned prepared = 0;

	*busy = 0;
	if (!ls->uring)
		return 0;
	while (ls->inflight > 0 && io_uring_peek_cqe(&c->ring, &cqe) == 0) {
		eng_buf *b = io_uring_cqe_get_data(cqe);
		long res = cqe->res;

		io_uring_cqe_seen(&c->ring, cqe);
		ls->inflight--;
		ls_complete(ls, b, res, failed);
	}
	if (failed || ls->failed) {
		while (ls->pend_head) {
			eng_buf *b = ls->pend_head;

			ls->pend_head = b->io_next;
			ls_drop(ls, b);
		}
		ls->pend_tail = NULL;
	}
	while (ls->pend_head && ls->inflight < c->s.queue_depth) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&c->ring);
		eng_buf *b = ls->pend_head;
		uint8_t *p = b->p + b->io_done;
		unsigned len = (unsigned)(b->span - b->io_done);
		uint64_t off = b->file_offset + b->io_done;

		if (!sqe)
			break;
		ls->pend_head = b->io_next;
		if (!ls->pend_head)
			ls->pend_tail = NULL;
		if (c->fixed_bufs && b->fixed >= 0)
			io_uring_prep_write_fixed(sqe, ls->fd[b->file], p, len,
						  off, b->fixed);
		else
			io_uring_prep_write(sqe, ls->fd[b->file], p, len, off);
		io_uring_sqe_set_data(sqe, b);
		ls->inflight++;
		prepared++;
	}
	if (prepared) {
		int r;

		do
			r = io_uring_submit(&c->ring);
		while (r == -EINTR);
		if (r < 0 && !ls->failed) {
			/* The entries stay in the ring and are submitted by
			 * the next io_uring_enter; the save is lost anyway. */
			ls->failed = 1;
			eng_job_fail(c, ls->job, r, "%s: io_uring submit: %s",
				     ls->job->stepdir, ckpt_strerror(r));
		}
	}
	*busy = ls->inflight > 0 || ls->pend_head != NULL;
	return ls->failed ? -EIO : 0;
}

static int ls_finish(eng_sink *s, eng_job *job)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;
	uint32_t f;
	int r;

	for (f = 0; f < ls->nfiles; f++) {
		int fd = ls->fd[f];

		if (ls->prealloc &&
		    ftruncate(fd, (off_t)job->file_end[f]) < 0) {
			r = -errno;
			return eng_job_fail(
				c, job, r, "%s: truncate to %llu: %s",
				ls->tmp[f],
				(unsigned long long)job->file_end[f],
				ckpt_strerror(r));
		}
		r = eng_fdatasync(fd);
		if (r < 0)
			return eng_job_fail(c, job, r, "%s: fdatasync: %s",
					    ls->tmp[f], ckpt_strerror(r));
		ls->fd[f] = -1;
		r = eng_close(fd);
		if (r < 0)
			return eng_job_fail(c, job, r, "%s: close: %s",
					    ls->tmp[f], ckpt_strerror(r));
	}
	for (f = 0; f < ls->nfiles; f++) {
		r = eng_rename(ls->tmp[f], ls->fin[f]);
		if (r < 0)
			return eng_job_fail(c, job, r, "%s: rename: %s",
					    ls->tmp[f], ckpt_strerror(r));
		ls->renamed = 1;
	}
	return 0;
}

static int ls_publish(eng_sink *s, eng_job *job, const char *name,
		      const uint8_t *buf, size_t len)
{
	local_sink *ls = (local_sink *)s;
	struct ckpt *c = s->c;
	char err[ENG_ERRMSG_MAX];
	int r;

	err[0] = 0;
	r = eng_write_file_atomic(job->stepdir, name, buf, len, err);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s", err);
	ls->published = 1;
	/* the step directory's own entry */
	r = eng_fsync_dir(c->root);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s: fsync directory: %s",
				    c->root, ckpt_strerror(r));
	return 0;
}

static void ls_abort(eng_sink *s, eng_job *job)
{
	local_sink *ls = (local_sink *)s;
	uint32_t f;

	(void)job;
	for (f = 0; f < ls->nfiles; f++) {
		if (ls->fd[f] >= 0) {
			eng_close(ls->fd[f]);
			ls->fd[f] = -1;
		}
		if (ls->tmp[f])
			eng_unlink(ls->tmp[f]);
		/* Without this host's index the shards are unreachable; with
		 * it (a failed commit) they stay for a later ckpt_commit. */
		if (ls->renamed && !ls->published && ls->fin[f])
			eng_unlink(ls->fin[f]);
	}
}

static void ls_destroy(eng_sink *s)
{
	local_sink *ls = (local_sink *)s;

	if (!ls)
		return;
	ls_clear(ls);
	free(ls);
}

static const eng_sink_ops local_ops = {
	.name = "local",
	.begin = ls_begin,
	.put = ls_put,
	.pump = ls_pump,
	.finish = ls_finish,
	.publish = ls_publish,
	.abort = ls_abort,
	.destroy = ls_destroy,
};

int eng_local_sink_new(struct ckpt *c, eng_sink **out)
{
	local_sink *ls = calloc(1, sizeof(*ls));

	*out = NULL;
	if (!ls)
		return -ENOMEM;
	ls->base.ops = &local_ops;
	ls->base.c = c;
	*out = &ls->base;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Writer thread                                                      */
/* ------------------------------------------------------------------ */

/* Removes this host's files left by an earlier attempt at this step. */
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

	r = eng_mkdir(job->stepdir, 0755);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s: mkdir: %s", job->stepdir,
				    ckpt_strerror(r));
	r = remove_stale(c, job);
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

static void dispatch(struct ckpt *c, eng_job *job, eng_buf *b, unsigned nsinks)
{
	uint32_t f = (uint32_t)(b->k % job->nfiles);
	fmt_chunk_entry *ce = &job->chunks[b->k];
	unsigned i;

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
	/* one reference per sink plus ours, held until hashed */
	atomic_store(&b->refs, (int)nsinks + 1);
	for (i = 0; i < nsinks; i++)
		c->sinks[i]->ops->put(c->sinks[i], b);
	job->received++;
}

/* After submission, so the device is busy while we hash. */
static void hash_dispatched(struct ckpt *c, eng_job *job, eng_buf *list)
{
	while (list) {
		eng_buf *next = list->next;

		list->next = NULL;
		XXH3_64bits_update(job->fhash[list->file], list->p, list->span);
		eng_buf_unref(c, list);
		list = next;
	}
}

static void wait_wake(struct ckpt *c)
{
	uint64_t v;

	while (read(c->efd, &v, sizeof(v)) < 0 && errno == EINTR)
		;
}

/* Index, commit and retention once every chunk is in the sinks. */
static int finish_job(struct ckpt *c, eng_job *job)
{
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
	for (i = 0; i < c->nsinks; i++) {
		r = c->sinks[i]->ops->finish(c->sinks[i], job);
		if (r < 0)
			return r;
	}
	memset(&ix, 0, sizeof(ix));
	ix.step = job->step;
	memcpy(ix.save_id, job->save_id, sizeof(ix.save_id));
	ix.host_index = c->s.host_index;
	ix.host_count = c->s.host_count;
	ix.chunk_bytes = job->chunk_bytes;
	ix.stream_bytes = job->stream_bytes;
	ix.nfiles = job->nfiles;
	ix.files = job->files;
	ix.ntensors = job->ntensors;
	ix.tensors = job->tensors;
	ix.nchunks = (size_t)job->nchunks;
	ix.chunks = job->chunks;
	r = fmt_index_encode(&ix, &buf, &len);
	if (r < 0)
		return eng_job_fail(c, job, r, "%s: encoding the index: %s",
				    job->stepdir, ckpt_strerror(r));
	fmt_index_name(c->s.host_index, name);
	for (i = 0; i < c->nsinks && r == 0; i++)
		r = c->sinks[i]->ops->publish(c->sinks[i], job, name, buf, len);
	free(buf);
	if (r < 0)
		return r;
	if (c->s.host_count == 1 && !(c->s.flags & CKPT_F_MANUAL_COMMIT)) {
		err[0] = 0;
		r = eng_commit_step(c->root, 1, job->step, err);
		if (r < 0)
			return eng_job_fail(c, job, r, "%s", err);
		/* Problems with the `latest` hint or retention do not undo a
		 * durable commit; their message is kept for ckpt_errmsg(). */
		if (c->s.keep_last || c->s.keep_every)
			eng_gc_run(c->root, c->s.keep_last, c->s.keep_every, 0,
				   0, UINT64_MAX, NULL, NULL, NULL, err);
		if (err[0]) {
			pthread_mutex_lock(&c->mu);
			eng_err(c->errmsg, 0, "%s", err);
			pthread_mutex_unlock(&c->mu);
		}
	}
	return 0;
}

static void run_job(struct ckpt *c, eng_job *job)
{
	unsigned begun = 0, i;
	uint32_t f;
	int r;

	r = prepare(c, job);
	for (i = 0; r == 0 && i < c->nsinks; i++) {
		r = c->sinks[i]->ops->begin(c->sinks[i], job);
		begun++;
	}
	if (r < 0) /* no-op if already described */
		eng_job_fail(c, job, r, "%s: preparing the save: %s",
			     job->stepdir, ckpt_strerror(r));
	for (;;) {
		eng_buf *list, *b;
		int failed, copy_done, idle, busy_any = 0;

		pthread_mutex_lock(&c->mu);
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
			int busy = 0;

			c->sinks[i]->ops->pump(c->sinks[i], failed, &busy);
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

	if (eng_job_status(c, job) == 0)
		finish_job(c, job);
	if (eng_job_status(c, job) != 0) {
		for (i = 0; i < begun; i++)
			c->sinks[i]->ops->abort(c->sinks[i], job);
		/* An empty directory we made is no checkpoint. With several
		 * hosts another one may be about to write into it. */
		if (c->s.host_count == 1)
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
