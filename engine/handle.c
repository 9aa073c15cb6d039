/*
 * handle.c - ckpt_open()/ckpt_close(), settings, the handle's message.
 *
 * Design note. The top of the save side: ckpt_open() validates settings,
 * builds the pool (pool.c), sets up the io_uring ring and registers the
 * pool with it, creates the local sink (sink_local.c) and starts the
 * workers (encode.c) and the writer (writer.c); ckpt_close() waits for the
 * in-flight save and tears everything down in reverse. Nothing below calls
 * back into this file. A handle opened with staging_bytes 0 has no pool,
 * threads or ring: it only lists, commits and collects garbage.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include "events.h"
#include "plan.h"
#include "save_internal.h"

CKPT_API void ckpt_settings_default(ckpt_settings *s)
{
	if (!s)
		return;
	memset(s, 0, sizeof(*s));
	s->staging_bytes = 512ull << 20;
	s->chunk_bytes = 4u << 20;
	s->codec = CKPT_CODEC_FLOAT;
	s->level = 1;
	s->threads = 0;
	s->files_per_host = 4;
	s->host_index = 0;
	s->host_count = 1;
	s->queue_depth = 32;
	s->keep_last = 0;
	s->keep_every = 0;
	s->flags = 0;
}

CKPT_API const char *ckpt_errmsg(const ckpt *c)
{
	/* Background threads may write the handle's message at any time:
	 * hand out a copy taken under the lock, never the live buffer. */
	static _Thread_local char copy[ENG_ERRMSG_MAX];
	struct ckpt *m = (struct ckpt *)c;

	if (!c)
		return eng_tls_errmsg();
	pthread_mutex_lock(&m->mu);
	memcpy(copy, c->errmsg, strnlen(c->errmsg, ENG_ERRMSG_MAX - 1));
	copy[strnlen(c->errmsg, ENG_ERRMSG_MAX - 1)] = 0;
	pthread_mutex_unlock(&m->mu);
	return copy;
}

/* `remote` took the place of one reserved member: the size is ABI. */
_Static_assert(sizeof(void *) != 8 || sizeof(ckpt_settings) == 120,
	       "ckpt_settings changed size");

static int check_settings(const ckpt_settings *s)
{
	size_t i;

	for (i = 0; i < sizeof(s->reserved) / sizeof(s->reserved[0]); i++)
		if (s->reserved[i])
			return eng_err(NULL, -EINVAL,
				       "settings.reserved[%zu] must be zero",
				       i);
	if (s->chunk_bytes % FMT_ALIGN || s->chunk_bytes < FMT_MIN_CHUNK ||
	    s->chunk_bytes > FMT_MAX_CHUNK)
		return eng_err(NULL, -EINVAL,
			       "settings.chunk_bytes: %u is not a multiple of "
			       "4096 in [%u, %u]",
			       s->chunk_bytes, FMT_MIN_CHUNK, FMT_MAX_CHUNK);
	if (s->codec < 0 || s->codec >= CKPT_CODEC_COUNT)
		return eng_err(NULL, -EINVAL,
			       "settings.codec: unknown codec %d",
			       (int)s->codec);
	if (s->level < ZSTD_minCLevel() || s->level > ZSTD_maxCLevel())
		return eng_err(NULL, -EINVAL,
			       "settings.level: %d outside zstd's [%d, %d]",
			       (int)s->level, ZSTD_minCLevel(),
			       ZSTD_maxCLevel());
	if (s->threads > 1024)
		return eng_err(NULL, -EINVAL,
			       "settings.threads: %u is more than 1024",
			       s->threads);
	if (s->files_per_host < 1 || s->files_per_host > FMT_MAX_FILES_PER_HOST)
		return eng_err(NULL, -EINVAL,
			       "settings.files_per_host: %u outside [1, %u]",
			       s->files_per_host, FMT_MAX_FILES_PER_HOST);
	if (s->host_count < 1 || s->host_count > FMT_MAX_HOSTS)
		return eng_err(NULL, -EINVAL,
			       "settings.host_count: %u outside [1, %u]",
			       s->host_count, FMT_MAX_HOSTS);
	if (s->host_index >= s->host_count)
		return eng_err(NULL, -EINVAL,
			       "settings.host_index: %u is not below "
			       "host_count %u",
			       s->host_index, s->host_count);
	if (s->queue_depth < 1 || s->queue_depth > 4096)
		return eng_err(NULL, -EINVAL,
			       "settings.queue_depth: %u outside [1, 4096]",
			       s->queue_depth);
	if (s->flags & ~ENG_SETTINGS_FLAGS)
		return eng_err(NULL, -EINVAL,
			       "settings.flags: unknown bits 0x%x",
			       s->flags & ~ENG_SETTINGS_FLAGS);
	if (s->staging_bytes > (1ull << 46))
		return eng_err(NULL, -EINVAL,
			       "settings.staging_bytes: %llu is absurdly large",
			       (unsigned long long)s->staging_bytes);
	return 0;
}

static int mkdir_p(const char *dir)
{
	char *p = strdup(dir), *q;
	int r = 0;

	if (!p)
		return -ENOMEM;
	for (q = p + 1; *q; q++) {
		if (*q != '/')
			continue;
		*q = 0;
		r = eng_mkdir(p, 0755);
		*q = '/';
		if (r < 0 && r != -EEXIST)
			break;
		r = 0;
	}
	if (r == 0)
		r = eng_mkdir(p, 0755);
	free(p);
	return r;
}

static void setup_ring(struct ckpt *c)
{
	struct iovec *iov;
	size_t n, i;

	if (c->s.flags & CKPT_F_NO_URING)
		return;
	if (eng_uring_queue_init(c->s.queue_depth, &c->ring, 0) < 0)
		return;
	if (io_uring_register_eventfd(&c->ring, c->efd) < 0) {
		eng_uring_queue_exit(&c->ring);
		return;
	}
	c->have_ring = 1;
	n = (c->mem_bytes + ENG_REG_PIECE - 1) / ENG_REG_PIECE;
	iov = calloc(n, sizeof(*iov));
	if (!iov)
		return;
	for (i = 0; i < n; i++) {
		size_t off = i * ENG_REG_PIECE;

		iov[i].iov_base = c->mem + off;
		iov[i].iov_len = c->mem_bytes - off < ENG_REG_PIECE ?
					 c->mem_bytes - off :
					 ENG_REG_PIECE;
	}
	/* Pinning may fail (memlock limits): then plain writes. */
	c->fixed_bufs = io_uring_register_buffers(&c->ring, iov, (unsigned)n) ==
			0;
	free(iov);
}

/* The ring, eventfd, pool and plain memory: all that ckpt_close in a child
 * of fork() may release, since the threads, the locks and any save in
 * flight are the parent's (what the sinks hold is left: small, and their
 * descriptors are O_CLOEXEC). A child has no pool when it was mapped
 * MADV_DONTFORK (pool.c): its range is free there, and may since hold a
 * mapping of the child's own, so the child leaves it alone. */
static void handle_release(struct ckpt *c, int in_child)
{
	if (c->have_ring)
		eng_uring_queue_exit(&c->ring);
	if (c->efd >= 0)
		close(c->efd);
	if (c->mem && !(in_child && c->mem_dontfork))
		munmap(c->mem, c->mem_bytes);
	eng_job_free(c->job);
	free(c->bufs);
	free(c->workers);
	free(c->root);
	free(c->remote_url);
	eng_dedup_forget(c);
	/* in a fork() child: their threads are the parent's */
	free(c->jq);
	free(c->plan);
}

static void handle_free(struct ckpt *c)
{
	unsigned i;

	if (!c)
		return;
	eng_watch_close(c);
	pthread_mutex_lock(&c->mu);
	c->shutdown = 1;
	pthread_cond_broadcast(&c->work_cv);
	pthread_cond_broadcast(&c->writer_cv);
	pthread_cond_broadcast(&c->out_cv);
	pthread_mutex_unlock(&c->mu);
	for (i = 0; i < c->nstarted; i++)
		pthread_join(c->workers[i], NULL);
	if (c->writer_started)
		pthread_join(c->writer, NULL);
	for (i = 0; i < c->nsinks; i++)
		c->sinks[i]->ops->destroy(c->sinks[i]);
	if (c->rsink)
		c->rsink->ops->destroy(c->rsink);
	eng_events_close(c); /* every line's producer is gone */
	if (c->remote_url)   /* journal lines the rate limit held back */
		eng_events_flush();
	eng_plan_close(c);
	handle_release(c, 0);
	pthread_mutex_destroy(&c->mu);
	pthread_cond_destroy(&c->slot_cv);
	pthread_cond_destroy(&c->work_cv);
	pthread_cond_destroy(&c->out_cv);
	pthread_cond_destroy(&c->writer_cv);
	pthread_cond_destroy(&c->done_cv);
	free(c);
}

CKPT_API int ckpt_open(ckpt **out, const char *dir, const ckpt_settings *s)
{
	struct ckpt *c = NULL;
	const char *remote;
	size_t len;
	unsigned i;
	int r;

	if (!out)
		return eng_err(NULL, -EINVAL, "ckpt_open: out is NULL");
	*out = NULL;
	if (!dir || !*dir)
		return eng_err(NULL, -EINVAL, "ckpt_open: directory is %s",
			       dir ? "empty" : "NULL");
	c = calloc(1, sizeof(*c));
	if (!c)
		return eng_err(NULL, -ENOMEM, "out of memory");
	c->efd = -1;
	c->pid = getpid();
	pthread_mutex_init(&c->mu, NULL);
	pthread_cond_init(&c->slot_cv, NULL);
	pthread_cond_init(&c->work_cv, NULL);
	pthread_cond_init(&c->out_cv, NULL);
	pthread_cond_init(&c->writer_cv, NULL);
	pthread_cond_init(&c->done_cv, NULL);
	if (s)
		c->s = *s;
	else
		ckpt_settings_default(&c->s);
	r = check_settings(&c->s);
	if (r < 0)
		goto fail;
	c->dedup = !!(c->s.flags & CKPT_F_DEDUP);
	if (getenv("CKPT_DEDUP")) /* dedup.c */
		c->dedup = strcmp(getenv("CKPT_DEDUP"), "0") != 0;
	/* the upload sink keeps its own copy (sink_gcs.c) */
	remote = c->s.remote;
	c->s.remote = NULL;
	if (remote && !(c->remote_url = strdup(remote))) {
		r = eng_err(NULL, -ENOMEM, "out of memory");
		goto fail;
	}
	c->nworkers = c->s.threads ? c->s.threads : eng_ncpus();
	c->copy_encoders = eng_ncpus() > 1 ? eng_ncpus() - 1 : 0;
	if (c->copy_encoders > c->nworkers)
		c->copy_encoders = c->nworkers;
	c->root = strdup(dir);
	if (!c->root) {
		r = eng_err(NULL, -ENOMEM, "out of memory");
		goto fail;
	}
	len = strlen(c->root);
	while (len > 1 && c->root[len - 1] == '/')
		c->root[--len] = 0;
	r = eng_loc_check(c->root);
	if (r < 0)
		goto fail;
	/* gs:// alone: the upload sink is sink 0 (sink_gcs.c) */
	c->remote_only = !strncmp(c->root, "gs://", 5);
	if (c->remote_only && remote) {
		r = eng_err(NULL, -EINVAL, "%s: settings.remote is for a "
			    "directory location", c->root);
		goto fail;
	}
	r = c->remote_only ? 0 : mkdir_p(c->root);
	if (r < 0) {
		eng_err(NULL, r, "%s: cannot create directory: %s", c->root,
			ckpt_strerror(r));
		goto fail;
	}
	c->efd = eventfd(0, EFD_CLOEXEC);
	if (c->efd < 0) {
		r = eng_err(NULL, -errno, "eventfd: %s", strerror(errno));
		goto fail;
	}
	if (c->s.staging_bytes > 0) {
		r = eng_pool_alloc(c);
		if (r < 0)
			goto fail;
		if (!c->remote_only)
			setup_ring(c);
		/* O_DIRECT only with io_uring: the plain-pwrite path cannot
		 * continue a short write at an unaligned offset. */
		c->direct = c->have_ring && !(c->s.flags & CKPT_F_NO_DIRECT) &&
			    eng_probe_direct(c->root);
		r = c->remote_only ?
			    eng_gcs_sink_new(c, c->root, 1, &c->sinks[0]) :
			    eng_local_sink_new(c, &c->sinks[0]);
		if (r < 0) {
			if (!c->remote_only)
				eng_err(NULL, r, "out of memory");
			goto fail;
		}
		c->nsinks = 1;
		c->sinks[0]->index = 0;
		c->sink_lag_max = c->nslots / 4 > 2 ? c->nslots / 4 : 2;
		c->workers = calloc(c->nworkers, sizeof(*c->workers));
		if (!c->workers) {
			r = eng_err(NULL, -ENOMEM, "out of memory");
			goto fail;
		}
		for (i = 0; i < c->nworkers; i++) {
			r = -pthread_create(&c->workers[i], NULL,
					    eng_worker_main, c);
			if (r < 0) {
				eng_err(NULL, r, "cannot start a worker: %s",
					strerror(-r));
				goto fail;
			}
			c->nstarted++;
		}
		r = -pthread_create(&c->writer, NULL, eng_writer_main, c);
		if (r < 0) {
			eng_err(NULL, r, "cannot start the writer: %s",
				strerror(-r));
			goto fail;
		}
		c->writer_started = 1;
		if (remote) {
			eng_sink *up;

			r = eng_gcs_sink_new(c, remote, 0, &up);
			if (r == 0)
				r = eng_sink_add(c, up);
			if (r < 0)
				goto fail;
			c->upsink = up;
		}
	}
	r = eng_plan_open(c);
	if (r == 0)
		r = eng_events_open(c);
	if (r == 0)
		r = eng_watch_open(c);
	if (r < 0) {
		eng_err(NULL, r, "cannot set up the watcher: %s",
			ckpt_strerror(r));
		goto fail;
	}
	c->state = CKPT_STATE_IDLE;
	*out = c;
	return 0;
fail:
	handle_free(c);
	return r;
}

CKPT_API int ckpt_close(ckpt *c)
{
	int r;

	if (!c)
		return 0;
	if (c->pid != getpid()) {
		handle_release(c, 1);
		free(c);
		return 0;
	}
	pthread_mutex_lock(&c->mu);
	while (c->busy)
		pthread_cond_wait(&c->done_cv, &c->mu);
	r = c->uncollected ? c->status : 0;
	pthread_mutex_unlock(&c->mu);
	if (r)
		eng_err(NULL, r, "%s", c->status_msg);
	eng_plan_close_upload(c);
	handle_free(c);
	return r;
}

void eng_io_stats_get(const ckpt *c, eng_io_stats *out)
{
	memset(out, 0, sizeof(*out));
	if (!c)
		return;
	out->uring_writes = atomic_load(&c->io_st.uring_writes);
	out->pwrite_writes = atomic_load(&c->io_st.pwrite_writes);
	out->direct_files = atomic_load(&c->io_st.direct_files);
	out->submit_retries = atomic_load(&c->io_st.submit_retries);
	out->uring_fallbacks = atomic_load(&c->io_st.uring_fallbacks);
	out->uring_stalls = atomic_load(&c->io_st.uring_stalls);
}

int eng_sink_add(struct ckpt *c, eng_sink *s)
{
	int r = 0;

	pthread_mutex_lock(&c->mu);
	if (c->busy || !c->writer_started)
		r = -EBUSY;
	else if (c->nsinks == ENG_MAX_SINKS)
		r = -ENOSPC;
	if (r == 0) {
		/* a sink whose thread already runs (the upload sink resuming
		 * journals) set it itself: no second write for it to race */
		if (s->c != c)
			s->c = c;
		s->index = c->nsinks;
		s->status = 0;
		c->sinks[c->nsinks++] = s;
	}
	pthread_mutex_unlock(&c->mu);
	return r;
}

CKPT_API int ckpt_sink_status_get(ckpt *c, ckpt_sink_status *out, size_t max,
				  size_t *count)
{
	unsigned i;

	if (!c || (max && !out))
		return eng_err(NULL, -EINVAL,
			       "ckpt_sink_status_get: %s is NULL",
			       c ? "out" : "handle");
	pthread_mutex_lock(&c->mu);
	for (i = 0; i < c->nsinks && i < max; i++) {
		const eng_sink *s = c->sinks[i];
		ckpt_sink_status *o = &out[i];

		memset(o, 0, sizeof(*o));
		snprintf(o->name, sizeof(o->name), "%s", s->ops->name);
		o->status = s->status;
		o->required = s->index == 0;
		o->chunks = atomic_load(&s->chunks);
		o->max_held = atomic_load(&s->max_held);
		snprintf(o->msg, sizeof(o->msg), "%s", s->msg);
	}
	if (count)
		*count = c->nsinks;
	pthread_mutex_unlock(&c->mu);
	return 0;
}
