/*
 * reader_plan.c - turning read requests into work for the pipeline, and
 * the ckpt_read* entry points.
 *
 * Each request (a name and a box) becomes one "target" per stored slice it
 * intersects: rows of equal length, row i starting at a stream offset and
 * landing at a destination offset that are affine in i's multi-index over
 * the outer dimensions. The chunks those rows touch become jobs, one per
 * chunk, sorted in file order, each listing the targets it feeds. The
 * geometry helpers (rd_tg_*) are also used by the workers to scatter a
 * decoded chunk. The data path is described in reader_internal.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reader_internal.h"

/* ------------------------------------------------------------------ */
/* Geometry of targets                                                */
/* ------------------------------------------------------------------ */

static uint64_t tg_row(const struct rd_target *t, uint64_t row, uint64_t *d)
{
	uint64_t s = t->sbase, dd = t->dbase;

	for (uint32_t k = t->nouter; k-- > 0;) {
		uint64_t i = row % t->cnt[k];

		row /= t->cnt[k];
		s += i * t->sstr[k];
		dd += i * t->dstr[k];
	}
	if (d)
		*d = dd;
	return s;
}

/* First row whose end is past stream position pos (nrows if none). */
static uint64_t tg_first_row(const struct rd_target *t, uint64_t pos)
{
	uint64_t lo = 0, hi = t->nrows;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;

		if (tg_row(t, mid, NULL) + t->rowlen <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* 1 if some row overlaps stream range [cs, ce). */
static int tg_touches(const struct rd_target *t, uint64_t cs, uint64_t ce)
{
	uint64_t r = tg_first_row(t, cs);

	return r < t->nrows && tg_row(t, r, NULL) < ce;
}

/* Copies the stream bytes [cs, cs+len) at raw into every row overlapping. */
void rd_tg_scatter(const struct rd_target *t, uint64_t cs, const uint8_t *raw,
		   uint64_t len)
{
	uint64_t ce = cs + len, idx[CKPT_MAX_NDIM], row, rem, s, d;
	uint32_t k;

	row = tg_first_row(t, cs);
	if (row >= t->nrows)
		return;
	rem = row;
	for (k = t->nouter; k-- > 0;) {
		idx[k] = rem % t->cnt[k];
		rem /= t->cnt[k];
	}
	s = tg_row(t, row, &d);
	for (;;) {
		uint64_t lo, hi;

		if (s >= ce)
			break;
		lo = max_u64(s, cs);
		hi = min_u64(s + t->rowlen, ce);
		if (hi > lo)
			memcpy(t->dst + d + (lo - s), raw + (lo - cs), hi - lo);
		if (++row >= t->nrows)
			break;
		/* odometer step over the outer dimensions */
		k = t->nouter - 1;
		idx[k]++;
		s += t->sstr[k];
		d += t->dstr[k];
		while (idx[k] == t->cnt[k] && k > 0) {
			s -= t->cnt[k] * t->sstr[k];
			d -= t->cnt[k] * t->dstr[k];
			idx[k] = 0;
			k--;
			idx[k]++;
			s += t->sstr[k];
			d += t->dstr[k];
		}
	}
}

/* Where chunk [cs, cs+len) lands if it lies inside one row, else NULL. */
int rd_tg_span(const struct rd_target *t, uint64_t cs, uint64_t len,
	       uint64_t *lo, uint64_t *hi, uint8_t **dst)
{
	uint64_t r = tg_first_row(t, cs), s, d, a, e;

	if (r >= t->nrows)
		return 0;
	s = tg_row(t, r, &d);
	a = max_u64(s, cs);
	e = min_u64(s + t->rowlen, cs + len);
	if (e <= a)
		return 0;
	if (r + 1 < t->nrows && tg_row(t, r + 1, NULL) < cs + len)
		return -1; /* a second row starts inside the chunk */
	*lo = a - cs;
	*hi = e - cs;
	*dst = t->dst + d + (a - s);
	return 1;
}

uint8_t *rd_tg_inside_row(const struct rd_target *t, uint64_t cs, uint64_t len)
{
	uint64_t r = tg_first_row(t, cs), s, d;

	if (r >= t->nrows)
		return NULL;
	s = tg_row(t, r, &d);
	if (s <= cs && cs + len <= s + t->rowlen)
		return t->dst + d + (cs - s);
	return NULL;
}
/* Largest chunk index whose stream_offset <= pos (chunks are contiguous
 * from 0, checked at open). */
static size_t chunk_at(const fmt_index *ix, uint64_t pos)
{
	size_t lo = 0, hi = ix->nchunks;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;

		if (ix->chunks[mid].stream_offset <= pos)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}
/* ------------------------------------------------------------------ */
/* Reads                                                              */
/* ------------------------------------------------------------------ */

static int rd_add_target(struct rd_batch *b, struct rd_target **out)
{
	if (b->ntg == b->tgcap) {
		size_t ncap = b->tgcap ? b->tgcap * 2 : 16;
		struct rd_target *n = realloc(b->tg, ncap * sizeof(*n));

		if (!n)
			return -ENOMEM;
		b->tg = n;
		b->tgcap = ncap;
	}
	*out = &b->tg[b->ntg++];
	memset(*out, 0, sizeof(**out));
	return 0;
}

/*
 * Plans request i: validates the box, adds one target per stored slice
 * that intersects it and checks the slices cover the box. Failures of the
 * request itself are recorded; the return value is only for fatal ones.
 */
static int rd_plan_req(ckpt_reader *r, struct rd_batch *b, size_t i)
{
	ckpt_read_req *q = &b->reqs[i];
	const struct rd_tensor *t;
	uint64_t off[CKPT_MAX_NDIM], ext[CKPT_MAX_NDIM];
	uint64_t esize, box_elems = 1, box_bytes, covered = 0;
	size_t ti, saved = b->ntg;
	char msg[ENG_ERRMSG_MAX];

	if (!q->name) {
		rd_req_fail(r, b, i, -EINVAL, "read request: name is NULL");
		return 0;
	}
	if (q->flags || q->reserved[0] || q->reserved[1]) {
		snprintf(msg, sizeof(msg), "read request %zu (tensor \"%s\"): "
			 "flags and reserved fields must be zero", i, q->name);
		rd_req_fail(r, b, i, -EINVAL, msg);
		return 0;
	}
	if (rd_find(r, q->name, &ti) < 0) {
		snprintf(msg, sizeof(msg), "no tensor \"%s\" in %s", q->name,
			 r->dname);
		rd_req_fail(r, b, i, CKPT_E_NOTFOUND, msg);
		return 0;
	}
	t = &r->tensors[ti];
	esize = ckpt_dtype_size(t->dtype);
	for (uint32_t d = 0; d < t->ndim; d++) {
		off[d] = q->offset ? q->offset[d] : 0;
		if (off[d] > t->shape[d]) {
			snprintf(msg, sizeof(msg), "tensor \"%s\": offset[%u] "
				 "= %llu is outside shape %llu", q->name, d,
				 (ull)off[d], (ull)t->shape[d]);
			rd_req_fail(r, b, i, -EINVAL, msg);
			return 0;
		}
		ext[d] = q->extent ? q->extent[d] : t->shape[d] - off[d];
		if (ext[d] > t->shape[d] - off[d]) {
			snprintf(msg, sizeof(msg), "tensor \"%s\": box "
				 "[%llu, %llu) of dimension %u is outside "
				 "shape %llu", q->name, (ull)off[d],
				 (ull)off[d] + (ull)ext[d], d,
				 (ull)t->shape[d]);
			rd_req_fail(r, b, i, -EINVAL, msg);
			return 0;
		}
		box_elems *= ext[d]; /* <= global elements: no overflow */
	}
	box_bytes = box_elems * esize;
	if (q->dst_bytes != box_bytes) {
		snprintf(msg, sizeof(msg), "tensor \"%s\": dst_bytes is %llu, "
			 "the box holds %llu bytes", q->name,
			 (ull)q->dst_bytes, (ull)box_bytes);
		rd_req_fail(r, b, i, -EINVAL, msg);
		return 0;
	}
	if (box_bytes > 0 && !q->dst) {
		snprintf(msg, sizeof(msg), "tensor \"%s\": dst is NULL",
			 q->name);
		rd_req_fail(r, b, i, -EINVAL, msg);
		return 0;
	}
	if (box_elems == 0)
		return 0;
	for (uint32_t p = 0; p < t->npieces; p++) {
		const fmt_slice *pc = &r->pieces[t->first + p];
		const fmt_tensor_entry *te = pc->t;
		uint64_t io[CKPT_MAX_NDIM], ie[CKPT_MAX_NDIM], elems = 1;
		uint64_t sstr[CKPT_MAX_NDIM], dstr[CKPT_MAX_NDIM], ss, ds;
		struct rd_target *tg;
		uint32_t d, nd = t->ndim, k;
		int rc;

		for (d = 0; d < nd; d++) {
			uint64_t lo = max_u64(off[d], te->offset[d]);
			uint64_t hi = min_u64(off[d] + ext[d],
					      te->offset[d] + te->extent[d]);

			if (hi <= lo)
				break;
			io[d] = lo;
			ie[d] = hi - lo;
			elems *= ie[d];
		}
		if (d < nd)
			continue;
		rc = rd_add_target(b, &tg);
		if (rc < 0)
			return rc;
		covered += elems;
		ss = ds = esize;
		for (d = nd; d-- > 0;) {
			sstr[d] = ss;
			dstr[d] = ds;
			ss *= te->extent[d];
			ds *= ext[d];
		}
		tg->dst = q->dst;
		tg->req = (uint32_t)i;
		tg->host = pc->host;
		tg->sbase = te->stream_offset;
		tg->dbase = 0;
		for (d = 0; d < nd; d++) {
			tg->sbase += (io[d] - te->offset[d]) * sstr[d];
			tg->dbase += (io[d] - off[d]) * dstr[d];
		}
		/* rows: merge trailing dimensions covered whole in both the
		 * slice and the box, plus the first partial one */
		tg->rowlen = esize;
		k = nd;
		while (k > 0) {
			k--;
			tg->rowlen *= ie[k];
			if (ie[k] != te->extent[k] || ie[k] != ext[k])
				break;
		}
		tg->nrows = 1;
		tg->nouter = 0;
		for (d = 0; d < k; d++) {
			if (ie[d] == 1)
				continue;
			tg->cnt[tg->nouter] = ie[d];
			tg->sstr[tg->nouter] = sstr[d];
			tg->dstr[tg->nouter] = dstr[d];
			tg->nouter++;
			tg->nrows *= ie[d];
		}
	}
	if (covered != box_elems) {
		b->ntg = saved;
		snprintf(msg, sizeof(msg), "tensor \"%s\": part of the box is "
			 "not stored (%llu of %llu elements are)", q->name,
			 (ull)covered, (ull)box_elems);
		rd_req_fail(r, b, i, CKPT_E_NOTFOUND, msg);
	}
	return 0;
}

struct rd_pair {
	uint64_t key; /* host << 32 | chunk */
	size_t tg;
};

static int cmp_pair(const void *a, const void *b)
{
	const struct rd_pair *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->tg < y->tg ? -1 : x->tg > y->tg;
}

static int cmp_job(const void *a, const void *b)
{
	const struct rd_job *x = a, *y = b;

	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->file < y->file ? -1 : x->file > y->file;
}

/* Builds the jobs (chunks to read, in file order) of a read batch. */
static int rd_plan_jobs(ckpt_reader *r, struct rd_batch *b)
{
	struct rd_pair *pairs = NULL;
	size_t np = 0, cap = 0, nj = 0;
	int rc = 0;

	for (size_t ti = 0; ti < b->ntg; ti++) {
		const struct rd_target *t = &b->tg[ti];
		const fmt_index *ix = &r->hosts[t->host].ix;
		uint64_t first = t->sbase;
		uint64_t last = tg_row(t, t->nrows - 1, NULL) + t->rowlen;
		size_t c0 = chunk_at(ix, first), c1 = chunk_at(ix, last - 1);

		for (size_t c = c0; c <= c1; c++) {
			const fmt_chunk_entry *ce = &ix->chunks[c];

			if (t->nrows > 1 &&
			    !tg_touches(t, ce->stream_offset,
					ce->stream_offset + ce->raw_len))
				continue;
			if (np == cap) {
				size_t ncap = cap ? cap * 2 : 64;
				struct rd_pair *n =
					realloc(pairs, ncap * sizeof(*n));

				if (!n) {
					rc = -ENOMEM;
					goto out;
				}
				pairs = n;
				cap = ncap;
			}
			pairs[np].key = (uint64_t)t->host << 32 | c;
			pairs[np].tg = ti;
			np++;
		}
	}
	if (np == 0)
		goto out;
	qsort(pairs, np, sizeof(*pairs), cmp_pair);
	b->tmap = malloc(np * sizeof(*b->tmap));
	b->jobs = calloc(np, sizeof(*b->jobs));
	if (!b->tmap || !b->jobs) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t p = 0; p < np; p++) {
		b->tmap[p] = pairs[p].tg;
		if (p == 0 || pairs[p].key != pairs[p - 1].key) {
			uint32_t h = (uint32_t)(pairs[p].key >> 32);
			uint32_t c = (uint32_t)pairs[p].key;
			const fmt_chunk_entry *ce = &r->hosts[h].ix.chunks[c];
			struct rd_job *j = &b->jobs[nj++];

			j->host = h;
			j->chunk = c;
			j->kind = JOB_CHUNK;
			j->file = r->hosts[h].file_of[ce->file];
			j->off = ce->file_offset;
			j->len = fmt_chunk_span(ce->stored_len);
			j->t0 = p;
		}
		b->jobs[nj - 1].t1 = p + 1;
	}
	/* chunks decoded by an earlier one-chunk read need no I/O */
	if (r->cache_valid) {
		size_t w = 0;

		for (size_t i = 0; i < nj; i++) {
			struct rd_job *j = &b->jobs[i];

			if (j->host == r->cache_host &&
			    j->chunk == r->cache_chunk) {
				const fmt_chunk_entry *ce =
					&r->hosts[j->host].ix.chunks[j->chunk];

				for (size_t t = j->t0; t < j->t1; t++)
					rd_tg_scatter(&b->tg[b->tmap[t]],
						   ce->stream_offset, r->cache,
						   ce->raw_len);
				continue;
			}
			b->jobs[w++] = *j;
		}
		nj = w;
	}
	qsort(b->jobs, nj, sizeof(*b->jobs), cmp_job);
	b->njobs = nj;
	b->cache_fill = nj == 1;
out:
	free(pairs);
	return rc;
}

CKPT_API int ckpt_read_batch(ckpt_reader *r, ckpt_read_req *reqs, size_t n)
{
	struct rd_batch b;
	int rc = 0;

	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_read_batch: reader is NULL");
	rc = rd_check_process(r, "ckpt_read_batch");
	if (rc < 0)
		return rc;
	if (n == 0)
		return 0;
	if (!reqs)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_batch: reqs is NULL");
	if (n > UINT32_MAX)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_batch: %zu requests", n);
	memset(&b, 0, sizeof(b));
	b.reqs = reqs;
	b.nreq = n;
	for (size_t i = 0; i < n; i++)
		reqs[i].status = 0;
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = rd_plan_req(r, &b, i);
	if (rc == 0)
		rc = rd_plan_jobs(r, &b);
	if (rc < 0) {
		rd_fatal(r, &b, rc, "reader: out of memory planning reads");
	} else {
		rc = rd_pipeline(r, &b);
	}
	if (b.fatal) {
		for (size_t i = 0; i < n; i++)
			if (reqs[i].status == 0)
				reqs[i].status = b.fatal;
		rc = eng_err(r->errmsg, b.fatal, "%s", b.err_msg);
		goto out;
	}
	rc = 0;
	for (size_t i = 0; i < n; i++) {
		if (reqs[i].status != 0) {
			rc = reqs[i].status;
			break;
		}
	}
	if (rc != 0)
		eng_err(r->errmsg, rc, "%s", b.err_msg);
out:
	if (rc < 0)
		rd_locate(r);
	rd_batch_free(&b);
	return rc;
}

CKPT_API int ckpt_read(ckpt_reader *r, const char *name, void *dst,
		       uint64_t dst_bytes)
{
	ckpt_read_req q = { .name = name, .dst = dst, .dst_bytes = dst_bytes };

	return ckpt_read_batch(r, &q, 1);
}

CKPT_API int ckpt_read_slice(ckpt_reader *r, const char *name,
			     const uint64_t *offset, const uint64_t *extent,
			     void *dst, uint64_t dst_bytes)
{
	ckpt_read_req q = { .name = name, .offset = offset, .extent = extent,
			    .dst = dst, .dst_bytes = dst_bytes };

	if (r && (!offset || !extent))
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_slice: offset and extent are "
			       "required");
	return ckpt_read_batch(r, &q, 1);
}

CKPT_API int ckpt_read_alloc(ckpt_reader *r, const char *name, void **out,
			     uint64_t *nbytes)
{
	size_t ti;
	void *p;
	int rc;

	if (out)
		*out = NULL;
	if (nbytes)
		*nbytes = 0;
	if (!r)
		return eng_err(NULL, -EINVAL, "ckpt_read_alloc: reader is NULL");
	if (!name || !out)
		return eng_err(r->errmsg, -EINVAL,
			       "ckpt_read_alloc: name and out are required");
	if (rd_find(r, name, &ti) < 0)
		return eng_err(r->errmsg, CKPT_E_NOTFOUND,
			       "no tensor \"%s\" in %s", name, r->dname);
	if (r->tensors[ti].nbytes > SIZE_MAX)
		return eng_err(r->errmsg, -ENOMEM, "tensor \"%s\": %llu bytes",
			       name, (ull)r->tensors[ti].nbytes);
	p = malloc(r->tensors[ti].nbytes ? (size_t)r->tensors[ti].nbytes : 1);
	if (!p)
		return eng_err(r->errmsg, -ENOMEM,
			       "tensor \"%s\": cannot allocate %llu bytes",
			       name, (ull)r->tensors[ti].nbytes);
	rc = ckpt_read(r, name, p, r->tensors[ti].nbytes);
	if (rc < 0) {
		free(p);
		return rc;
	}
	*out = p;
	if (nbytes)
		*nbytes = r->tensors[ti].nbytes;
	return 0;
}
