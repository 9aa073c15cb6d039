/*
 * reader_gcs.c - the reader's gs:// range source: the jobs of a batch
 * (chunks, in file order) become ranged GETs on the reader's Cloud Storage
 * client, several in flight at once, neighbouring chunks of one object
 * merged into one request.
 *
 * Design note. The pipeline (reader_pipeline.c) owns the buffer pool, the
 * worker threads and the ordering of verify; this file only replaces its
 * io_uring loop. On the calling thread:
 *
 *   jobs --merge adjacent (same object, gap <= RD_SPAN_GAP, span <=
 *        spancap)--> span --gcs_start_read--> merge buffer (or, for a
 *        one-job span, the job's own pool buffer: no copy)
 *   gcs_poll (all spans progress together, <= CKPT_GCS_STREAMS) -->
 *   done span: each job's bytes copied from the merge buffer into its pool
 *        buffer --> rd_complete (workers check XXH3, decode, scatter)
 *
 * Memory stays bounded: the pool as for DIR plus at most `streams` merge
 * buffers of spancap bytes (together <= RD_SPAN_BUDGET; CKPT_GCS_MERGE_MAX
 * lowers the cap), kept for the reader's life. Nothing is trusted from the wire: an object whose size
 * differs from COMMIT, a short range or a failed request fail the jobs it
 * feeds with a message naming the object, the offset and the client's
 * message (HTTP status, server message); bad bytes are caught by the
 * per-chunk XXH3 in the workers (ranged reads carry no crc32c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcs.h"
#include "reader_internal.h"

#define RD_SPAN_MAX (32u << 20)       /* one merged request at most */
#define RD_SPAN_BUDGET (128ull << 20) /* all merge buffers together */
#define RD_SPAN_GAP (256u << 10)      /* bytes read and dropped to merge */
#define RD_MAX_SPANS 256u

struct rd_span { /* stays put while its read runs: the client writes got */
	struct gcs_op *op; /* NULL: the slot is free */
	uint8_t *buf;      /* where the bytes land */
	uint8_t *merge;    /* the merge buffer, or NULL (one job, direct) */
	uint64_t off;
	size_t len, got;
	size_t j0, j1; /* jobs [j0, j1) */
};

struct rd_gcs_run {
	ckpt_reader *r;
	struct rd_batch *b;
	struct gcs_client *c;
	struct rd_span sp[RD_MAX_SPANS];
	size_t nact, nmax;
	uint8_t *mfree[RD_MAX_SPANS];
	size_t nmfree;
};

static struct gcs_client *rd_client(ckpt_reader *r)
{
	return (struct gcs_client *)r->loc->priv;
}

/* The object name of shard file i: its path after "gs://BUCKET/". */
static const char *rd_object(const ckpt_reader *r, size_t i)
{
	return r->files[i].path + 5 + strlen(r->loc->bucket) + 1;
}

void rd_gcs_free(ckpt_reader *r)
{
	for (size_t i = 0; i < r->nspans; i++)
		free(r->spans[i]);
	free(r->spans);
	r->spans = NULL;
	r->nspans = r->spancap = 0;
}

int rd_get_doc(ckpt_reader *r, const char *name, uint64_t max_len,
	       uint8_t **out, size_t *len, char *err)
{
	char *key;
	int rc;

	if (!r->loc)
		return eng_get_doc(r->root, r->dname, name, max_len, out, len,
				   err);
	*out = NULL;
	*len = 0;
	key = eng_path("%s/%s", r->dname, name);
	if (!key)
		return eng_err(err, -ENOMEM, "out of memory");
	rc = r->loc->be->get(r->loc, key, max_len, out, len, err);
	free(key);
	return rc;
}

int rd_gcs_pread(ckpt_reader *r, size_t i, uint64_t off, void *buf,
		 size_t len, size_t *got, char *msg, size_t msglen)
{
	int rc = gcs_read(rd_client(r), r->loc->bucket, rd_object(r, i), off,
			  len, buf, got);

	if (rc == -ERANGE) { /* HTTP 416: off is at or past its end */
		*got = 0;
		return 0;
	}
	if (rc < 0 && rc != -ENOENT)
		snprintf(msg, msglen, "%s", gcs_errmsg(rd_client(r)));
	return rc < 0 ? eng_gcs_code(rc) : 0;
}

/* First use of an object: its size must be the one COMMIT records. */
static int rd_gcs_check(ckpt_reader *r, size_t i, char *msg, size_t len)
{
	struct rd_file *f = &r->files[i];
	struct gcs_object o = { 0 };
	char dname[32];
	int rc;

	if (f->checked)
		return 0;
	/* a ref (SPEC.md section 16) is a file of an older step */
	if (f->is_ref)
		fmt_step_dirname(f->ref_step, dname);
	else
		snprintf(dname, sizeof(dname), "%s", r->dname);
	rc = gcs_stat(rd_client(r), r->loc->bucket, rd_object(r, i), &o);
	if (rc == -ENOENT) {
		snprintf(msg, len, "%s/%s: missing (%s)", dname, f->name,
			 f->is_ref ? "referred to by the step read" :
				     "listed in " FMT_COMMIT_NAME);
		return CKPT_E_CORRUPT;
	}
	if (rc < 0) {
		snprintf(msg, len, "%s/%s: %s", dname, f->name,
			 gcs_errmsg(rd_client(r)));
		return eng_gcs_code(rc);
	}
	if (o.size != f->size) {
		snprintf(msg, len, "%s/%s: %llu bytes, the %s says %llu",
			 dname, f->name, (ull)o.size,
			 f->is_ref ? "ref" : "commit record", (ull)f->size);
		gcs_object_clear(&o);
		return CKPT_E_CORRUPT;
	}
	gcs_object_clear(&o);
	f->checked = 1;
	return 0;
}

static void rd_gcs_job_fail(struct rd_gcs_run *g, struct rd_job *j, int code,
			    const char *what)
{
	char msg[ENG_ERRMSG_MAX];

	rd_io_msg(g->r, g->b, j, msg, sizeof(msg), what);
	rd_job_abort(g->r, g->b, j, code, msg);
	if (g->b->ordered)
		rd_complete(g->r, g->b, j);
}

/* A merge buffer: a free one, a new one while under the count, or NULL
 * (then the span stays one job long). */
static uint8_t *rd_merge_get(struct rd_gcs_run *g)
{
	ckpt_reader *r = g->r;
	uint8_t *m;

	if (g->nmfree)
		return g->mfree[--g->nmfree];
	if (!r->spans || r->nspans >= g->nmax)
		return NULL;
	m = malloc(r->spancap);
	if (m)
		r->spans[r->nspans++] = m;
	return m;
}

static void rd_span_done(struct rd_gcs_run *g, struct rd_span *s)
{
	struct rd_batch *b = g->b;
	int rc = gcs_op_wait(s->op);
	char what[ENG_ERRMSG_MAX - 128];

	for (size_t k = s->j0; k < s->j1; k++) {
		struct rd_job *j = &b->jobs[k];

		if (rc < 0) {
			snprintf(what, sizeof(what), "read: %s",
				 gcs_op_errmsg(s->op));
			rd_gcs_job_fail(g, j, eng_gcs_code(rc), what);
		} else if (j->off + j->len > s->off + s->got) {
			snprintf(what, sizeof(what),
				 "object ends at %llu, inside the chunk",
				 (ull)(s->off + s->got));
			rd_gcs_job_fail(g, j, CKPT_E_CORRUPT, what);
		} else {
			if (s->merge)
				memcpy(j->buf, s->merge + (j->off - s->off),
				       j->len);
			j->done = j->len;
			rd_complete(g->r, b, j);
		}
	}
	gcs_op_free(s->op);
	if (s->merge)
		g->mfree[g->nmfree++] = s->merge;
}

/* Job `next` (its buffer taken) and the neighbours that can ride along. */
static size_t rd_span_extend(struct rd_gcs_run *g, struct rd_span *s,
			     size_t next)
{
	struct rd_batch *b = g->b;
	const struct rd_job *j = &b->jobs[s->j0];
	uint64_t end = j->off + j->len;
	int err;

	while (next < b->njobs) {
		struct rd_job *k = &b->jobs[next];
		uint8_t *kb;

		if (k->file != j->file || k->off < end ||
		    k->off - end > RD_SPAN_GAP ||
		    k->off + k->len - s->off > g->r->spancap ||
		    rd_job_dead(g->r, b, k))
			break;
		if (!s->merge) {
			s->merge = rd_merge_get(g);
			if (!s->merge)
				break;
		}
		kb = rd_buf_get(g->r, &err);
		if (!kb)
			break;
		k->buf = kb;
		k->done = 0;
		end = k->off + k->len;
		next++;
	}
	s->j1 = next;
	s->len = (size_t)(end - s->off);
	if (s->j1 - s->j0 == 1 && s->merge) {
		g->mfree[g->nmfree++] = s->merge;
		s->merge = NULL;
	}
	s->buf = s->merge ? s->merge : b->jobs[s->j0].buf;
	return next;
}

/* Issues spans while there is room; returns the next job to issue. */
static size_t rd_gcs_issue(struct rd_gcs_run *g, size_t next)
{
	ckpt_reader *r = g->r;
	struct rd_batch *b = g->b;
	char msg[ENG_ERRMSG_MAX];
	int stop, err, rc;

	pthread_mutex_lock(&r->mu);
	stop = b->stop;
	pthread_mutex_unlock(&r->mu);
	while (!stop && next < b->njobs && g->nact < g->nmax) {
		struct rd_job *j = &b->jobs[next];
		struct rd_span *s = g->sp;
		uint8_t *buf;

		while (s->op)
			s++; /* a free slot: nact < nmax */
		if (rd_job_dead(r, b, j)) {
			j->ready = 1;
			j->failed = 1;
			next++;
			continue;
		}
		rc = rd_gcs_check(r, j->file, msg, sizeof(msg));
		if (rc < 0) {
			rd_job_abort(r, b, j, rc, msg);
			if (b->ordered)
				rd_complete(r, b, j);
			next++;
			continue;
		}
		buf = rd_buf_get(r, &err);
		if (!buf) {
			if (err)
				rd_fatal(r, b, err,
					 "reader: out of memory for "
					 "read buffers");
			break;
		}
		j->buf = buf;
		j->done = 0;
		memset(s, 0, sizeof(*s));
		s->j0 = next;
		s->off = j->off;
		next = rd_span_extend(g, s, next + 1);
		rc = gcs_start_read(g->c, r->loc->bucket, rd_object(r, j->file),
				    s->off, s->len, s->buf, &s->got, &s->op);
		if (rc < 0) {
			for (size_t k = s->j0; k < s->j1; k++)
				rd_gcs_job_fail(
					g, &b->jobs[k], eng_gcs_code(rc),
					"read: cannot start the request");
			if (s->merge)
				g->mfree[g->nmfree++] = s->merge;
			s->op = NULL;
			continue;
		}
		g->nact++;
		pthread_mutex_lock(&r->mu);
		stop = b->stop;
		pthread_mutex_unlock(&r->mu);
	}
	return next;
}

void rd_gcs_run(ckpt_reader *r, struct rd_batch *b)
{
	struct rd_gcs_run *g = calloc(1, sizeof(*g));
	size_t next = 0, cap;

	if (!g) {
		rd_fatal(r, b, -ENOMEM, "reader: out of memory");
		return;
	}
	g->r = r;
	g->b = b;
	g->c = rd_client(r);
	g->nmax = eng_gcs_streams();
	if (g->nmax > RD_MAX_SPANS)
		g->nmax = RD_MAX_SPANS;
	cap = (size_t)min_u64(RD_SPAN_MAX, RD_SPAN_BUDGET / g->nmax);
	if (getenv("CKPT_GCS_MERGE_MAX")) /* bytes; tuning and tests */
		cap = (size_t)min_u64(
			strtoull(getenv("CKPT_GCS_MERGE_MAX"), NULL, 10), cap);
	if (cap < r->bufsize)
		cap = r->bufsize;
	if (cap != r->spancap || !r->spans) {
		rd_gcs_free(r);
		r->spans = calloc(RD_MAX_SPANS, sizeof(*r->spans));
		r->spancap = cap;
	}
	if (!r->spans)
		g->nmax = 1; /* no merging: one job per request */
	for (size_t i = 0; i < r->nspans && i < RD_MAX_SPANS; i++)
		g->mfree[g->nmfree++] = r->spans[i];
	for (;;) {
		next = rd_gcs_issue(g, next);
		if (g->nact == 0) {
			if (rd_wait_workers(r, b, next))
				break;
			continue;
		}
		gcs_poll(g->c, 20);
		for (size_t i = 0; i < g->nmax; i++) {
			if (!g->sp[i].op || !gcs_op_done(g->sp[i].op))
				continue;
			rd_span_done(g, &g->sp[i]);
			g->sp[i].op = NULL;
			g->nact--;
		}
	}
	free(g);
}
