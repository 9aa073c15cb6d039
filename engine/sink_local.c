/*
 * sink_local.c - the local shard-file sink: this host's shard files under
 * ROOT/step-N, written through io_uring (or pwrite when there is no ring).
 *
 * Design note. The writer (writer.c) calls this sink only through
 * eng_sink_ops, from its own thread; the sink calls back only into the
 * pool (eng_buf_unref, eng_job_fail). Each file is created as NAME.tmp
 * (O_DIRECT when the root supports it, preallocated to its planned size),
 * the shard headers and chunks are written at the offsets the writer gave
 * them, and at finish every file is trimmed, fdatasync'ed, closed and
 * renamed to its final name. The host index is published atomically after
 * that. A short write is continued from where it stopped (the file drops
 * O_DIRECT if the remainder is unaligned); an error fails the save, and
 * abort removes this save's files.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "save_internal.h"

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
