/*
 * reader_open.c - opening a committed step: COMMIT, then every host's index
 * (each compared with COMMIT's listing before it is parsed, then its
 * numbers re-checked), merged into one name-sorted table of global tensors
 * whose slices must agree and not overlap; per-codec statistics; the
 * accessors and ckpt_reader_close.
 *
 * After open the tables are read-only: reads and verification only look
 * things up here (rd_find, rd_file_lookup, rd_host_tensor_at). The data
 * path is described in reader_internal.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reader_internal.h"

#define RD_MAX_QD 1024u
#define RD_DEFAULT_QD 32u
#define RD_MAX_THREADS 256u

/* ------------------------------------------------------------------ */
/* Lookups                                                            */
/* ------------------------------------------------------------------ */

int rd_check_process(ckpt_reader *r, const char *fn)
{
	if (r->pid == getpid())
		return 0;
	return eng_err(r->errmsg, -ECHILD,
		       "%s: the reader was opened by process %ld; it cannot "
		       "be used in process %ld, a child of fork()", fn,
		       (long)r->pid, (long)getpid());
}

/* Name of the first tensor of host h overlapping stream [cs, ce), or NULL. */
const char *rd_host_tensor_at(const ckpt_reader *r, uint32_t h, uint64_t cs,
			      uint64_t ce)
{
	const struct rd_host *ho = &r->hosts[h];
	size_t lo = 0, hi = ho->ix.ntensors;

	/* first tensor (by stream order) ending after cs */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const fmt_tensor_entry *te = &ho->ix.tensors[ho->by_stream[mid]];

		if (te->stream_offset + te->nbytes <= cs)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < ho->ix.ntensors; lo++) {
		const fmt_tensor_entry *te = &ho->ix.tensors[ho->by_stream[lo]];

		if (te->stream_offset >= ce)
			break;
		if (te->nbytes > 0)
			return te->name;
	}
	return NULL;
}
void rd_locate(ckpt_reader *r)
{
	size_t rl, ml, dl = strlen(r->dname), cap = sizeof(r->errmsg);

	if (!r->loc || !r->root || strncmp(r->errmsg, r->dname, dl) ||
	    r->errmsg[dl] != '/')
		return;
	rl = strlen(r->root);
	if (rl && r->root[rl - 1] == '/')
		rl--;
	if (rl + 2 >= cap)
		return;
	ml = strlen(r->errmsg);
	if (rl + 1 + ml >= cap) /* the end of the message gives way */
		ml = cap - rl - 2;
	memmove(r->errmsg + rl + 1, r->errmsg, ml);
	memcpy(r->errmsg, r->root, rl);
	r->errmsg[rl] = '/';
	r->errmsg[rl + 1 + ml] = 0;
}

int rd_find(const ckpt_reader *r, const char *name, size_t *idx)
{
	size_t lo = 0, hi = r->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(r->tensors[mid].name, name);

		if (c == 0) {
			*idx = mid;
			return 0;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return CKPT_E_NOTFOUND;
}

/* ------------------------------------------------------------------ */
/* Open                                                               */
/* ------------------------------------------------------------------ */

static int cmp_file_name(const void *a, const void *b, void *arg)
{
	const struct rd_file *f = arg;

	return strcmp(f[*(const size_t *)a].name, f[*(const size_t *)b].name);
}

size_t rd_file_lookup(const ckpt_reader *r, const char *name)
{
	size_t lo = 0, hi = r->nlisted;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(r->files[r->files_by_name[mid]].name, name);

		if (c == 0)
			return r->files_by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return SIZE_MAX;
}

static int parse_shard_name(const char *s, uint32_t *host, uint32_t *file)
{
	unsigned h, f;
	int n = -1;
	char chk[32];

	if (sscanf(s, "h%5u-f%3u.shard%n", &h, &f, &n) != 2 || n < 0 ||
	    s[n] != 0)
		return -1;
	fmt_shard_name(h, f, chk);
	if (strcmp(chk, s) != 0)
		return -1;
	*host = h;
	*file = f;
	return 0;
}

static int cmp_stream(const void *a, const void *b, void *arg)
{
	const fmt_index *ix = arg;
	const fmt_tensor_entry *x = &ix->tensors[*(const size_t *)a];
	const fmt_tensor_entry *y = &ix->tensors[*(const size_t *)b];

	if (x->stream_offset != y->stream_offset)
		return x->stream_offset < y->stream_offset ? -1 : 1;
	return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Re-checks what later code indexes memory with. */
static int rd_check_index(ckpt_reader *r, uint32_t h, const char *iname)
{
	const fmt_index *ix = &r->hosts[h].ix;
	uint64_t pos = 0;

	if (ix->nfiles > FMT_MAX_FILES_PER_HOST || ix->nchunks >= UINT32_MAX)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: too many files or chunks", r->dname,
			       iname);
	for (size_t i = 0; i < ix->ntensors; i++) {
		const fmt_tensor_entry *te = &ix->tensors[i];
		size_t es = ckpt_dtype_size(te->dtype);
		uint64_t nb, gb;

		if (es == 0 || te->ndim > CKPT_MAX_NDIM || !te->name)
			goto bad_tensor;
		for (uint32_t d = 0; d < te->ndim; d++)
			if (te->offset[d] > te->shape[d] ||
			    te->extent[d] > te->shape[d] - te->offset[d])
				goto bad_tensor;
		if (fmt_shape_bytes(te->extent, te->ndim, es, &nb) < 0 ||
		    nb != te->nbytes ||
		    fmt_shape_bytes(te->shape, te->ndim, es, &gb) < 0 ||
		    te->stream_offset > ix->stream_bytes ||
		    te->nbytes > ix->stream_bytes - te->stream_offset)
			goto bad_tensor;
		continue;
bad_tensor:
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: tensor %zu has an inconsistent shape, "
			       "slice or stream range", r->dname, iname, i);
	}
	for (size_t c = 0; c < ix->nchunks; c++) {
		const fmt_chunk_entry *ce = &ix->chunks[c];
		const struct rd_file *f;

		if (ce->stream_offset != pos || ce->raw_len == 0 ||
		    ce->raw_len > FMT_MAX_CHUNK ||
		    ce->file >= ix->nfiles + ix->nrefs ||
		    ce->codec >= CKPT_CODEC_COUNT || ce->stored_len == 0 ||
		    ce->stored_len > fmt_codec_bound(ce->raw_len) ||
		    (ce->codec == CKPT_CODEC_NONE &&
		     ce->stored_len != ce->raw_len) ||
		    ce->file_offset % FMT_ALIGN != 0 ||
		    ce->file_offset < FMT_SHARD_HDR_SIZE)
			goto bad_chunk;
		f = &r->files[r->hosts[h].file_of[ce->file]];
		if (ce->file_offset > f->size ||
		    fmt_chunk_span(ce->stored_len) > f->size - ce->file_offset)
			goto bad_chunk;
		pos += ce->raw_len;
		continue;
bad_chunk:
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: chunk %zu is out of range or not "
			       "contiguous", r->dname, iname, c);
	}
	if (pos != ix->stream_bytes)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: chunks cover %llu bytes of a %llu-byte "
			       "stream", r->dname, iname, (ull)pos,
			       (ull)ix->stream_bytes);
	return 0;
}

/* Version 2: the older files host h's index refers to, appended to
 * r->files (ROOT/step-P/name, size as the ref records). */
static int rd_add_refs(ckpt_reader *r, uint32_t h)
{
	struct rd_host *ho = &r->hosts[h];
	struct rd_file *nf;

	if (ho->ix.nrefs == 0)
		return 0;
	if (ho->ix.nrefs > FMT_MAX_REFS)
		return eng_err(r->errmsg, CKPT_E_CORRUPT, "%s: too many refs",
			       r->dname);
	nf = realloc(r->files, (r->nfiles + ho->ix.nrefs + 1) * sizeof(*nf));
	if (!nf)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	r->files = nf;
	for (size_t i = 0; i < ho->ix.nrefs; i++) {
		const fmt_ref_entry *re = &ho->ix.refs[i];
		struct rd_file *f = &r->files[r->nfiles];
		char dname[32];

		memset(f, 0, sizeof(*f));
		f->fd = -1;
		fmt_step_dirname(re->step, dname);
		memcpy(f->name, re->name, sizeof(f->name));
		f->name[sizeof(f->name) - 1] = 0;
		f->size = re->size;
		f->xxh3 = re->xxh3;
		f->host = h;
		f->findex = re->file;
		f->ixfile = (uint32_t)(ho->ix.nfiles + i);
		f->mapped = 1;
		f->is_ref = 1;
		f->ref_step = re->step;
		f->path = eng_path("%s/%s/%s", r->root, dname, f->name);
		if (!f->path)
			return eng_err(r->errmsg, -ENOMEM, "out of memory");
		ho->file_of[ho->ix.nfiles + i] = (uint32_t)r->nfiles;
		r->nfiles++;
	}
	return 0;
}

static int rd_load_host(ckpt_reader *r, uint32_t h)
{
	struct rd_host *ho = &r->hosts[h];
	const fmt_file_entry *ie = ho->cm_index;
	char iname[32], err[ENG_ERRMSG_MAX];
	uint8_t *buf = NULL;
	size_t len = 0, nshards = ho->cm_nshards;
	int rc;

	fmt_index_name(h, iname);
	if (!ie || strcmp(ie->name, iname) != 0)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: the commit record lists no index of "
			       "host %u", r->dname, FMT_COMMIT_NAME, h);
	if (ie->size > FMT_MAX_META_BYTES + FMT_META_HDR_SIZE)
		return eng_err(r->errmsg, CKPT_E_CORRUPT,
			       "%s/%s: the commit record says %llu bytes",
			       r->dname, iname, (ull)ie->size);
	rc = rd_get_doc(r, iname, ie->size, &buf, &len, err);
	if (rc == -ENOENT) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: missing (listed in %s)", r->dname, iname,
			     FMT_COMMIT_NAME);
		goto out;
	}
	if (rc == CKPT_E_CORRUPT) {
		rc = eng_err(r->errmsg, rc, "%s/%s: larger than the %llu bytes "
			     "the commit record says", r->dname, iname,
			     (ull)ie->size);
		goto out;
	}
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	if (len != ie->size) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: %zu bytes, the commit record says %llu",
			     r->dname, iname, len, (ull)ie->size);
		goto out;
	}
	if (fmt_xxh3(buf, len) != ie->xxh3) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: checksum mismatch with the commit record",
			     r->dname, iname);
		goto out;
	}
	err[0] = 0;
	rc = fmt_index_decode(buf, len, &ho->ix, err, sizeof(err));
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc == CKPT_E_VERSION ? rc
				     : rc == -ENOMEM ? rc : CKPT_E_CORRUPT,
			     "%s/%s: %s", r->dname, iname, err);
		goto out;
	}
	ho->loaded = 1;
	if (ho->ix.step != r->step || ho->ix.host_index != h ||
	    ho->ix.host_count != r->nhosts) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: index of step %llu host %u of %u, the "
			     "commit record is step %llu with %u hosts",
			     r->dname, iname, (ull)ho->ix.step,
			     ho->ix.host_index, ho->ix.host_count,
			     (ull)r->step, r->nhosts);
		goto out;
	}
	if (ho->ix.nfiles != nshards || ho->ix.nfiles > FMT_MAX_FILES_PER_HOST) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: lists %zu shard files, the commit record "
			     "%zu", r->dname, iname, ho->ix.nfiles, nshards);
		goto out;
	}
	ho->file_of =
		calloc(ho->ix.nfiles + ho->ix.nrefs + 1, sizeof(*ho->file_of));
	ho->by_stream = calloc(ho->ix.ntensors + 1, sizeof(*ho->by_stream));
	ho->gidx = calloc(ho->ix.ntensors + 1, sizeof(*ho->gidx));
	if (!ho->file_of || !ho->by_stream || !ho->gidx) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < ho->ix.nfiles; i++) {
		const fmt_file_entry *fe = &ho->ix.files[i];
		size_t k = rd_file_lookup(r, fe->name);
		struct rd_file *f = k == SIZE_MAX ? NULL : &r->files[k];

		if (!f || f->host != h || f->mapped || f->size != fe->size ||
		    f->xxh3 != fe->xxh3) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
				     "%s/%s: shard file %s disagrees with the "
				     "commit record (missing, duplicated, or "
				     "different size or checksum)",
				     r->dname, iname, fe->name);
			goto out;
		}
		f->mapped = 1;
		f->ixfile = (uint32_t)i;
		ho->file_of[i] = (uint32_t)k;
	}
	rc = rd_add_refs(r, h);
	if (rc < 0)
		goto out;
	rc = rd_check_index(r, h, iname);
	if (rc < 0)
		goto out;
	for (size_t i = 0; i < ho->ix.ntensors; i++)
		ho->by_stream[i] = i;
	if (ho->ix.ntensors > 1)
		qsort_r(ho->by_stream, ho->ix.ntensors, sizeof(size_t),
			cmp_stream, &ho->ix);
out:
	free(buf);
	return rc;
}

static int cmp_piece_host(const void *a, const void *b)
{
	const fmt_slice *x = a, *y = b;

	return x->host < y->host ? -1 : x->host > y->host;
}

/*
 * One table of global tensors, sorted by name, each with its slices
 * (r->pieces[first..first+npieces), by host). fmt_slices_check enforces
 * the rule across hosts: slices of one name agree on dtype and global
 * shape, lie inside it and do not overlap.
 */
static int rd_merge(ckpt_reader *r)
{
	char err[ENG_ERRMSG_MAX];
	size_t n = 0, k = 0;
	int rc;

	for (uint32_t h = 0; h < r->nhosts; h++)
		n += r->hosts[h].ix.ntensors;
	r->pieces = calloc(n + 1, sizeof(*r->pieces));
	r->tensors = calloc(n + 1, sizeof(*r->tensors));
	if (!r->pieces || !r->tensors)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	for (uint32_t h = 0; h < r->nhosts; h++) {
		for (size_t i = 0; i < r->hosts[h].ix.ntensors; i++) {
			r->pieces[k].t = &r->hosts[h].ix.tensors[i];
			r->pieces[k].host = h;
			k++;
		}
	}
	r->npieces = n;
	err[0] = 0;
	rc = fmt_slices_check(r->pieces, n, NULL, err, sizeof(err));
	if (rc < 0)
		return eng_err(r->errmsg, rc == -EINVAL ? CKPT_E_CORRUPT : rc,
			       "%s: %s", r->dname, err);
	/* sorted by name; each name's slices go back to host order */
	for (size_t i = 0, j; i < n; i = j) {
		struct rd_tensor *t = &r->tensors[r->ntensors];
		const fmt_tensor_entry *f = r->pieces[i].t;
		uint64_t gb;

		for (j = i + 1;
		     j < n && strcmp(r->pieces[j].t->name, f->name) == 0; j++)
			;
		if (j - i > UINT32_MAX)
			return eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "too many slices");
		qsort(&r->pieces[i], j - i, sizeof(*r->pieces), cmp_piece_host);
		for (size_t q = i; q < j; q++) {
			const fmt_slice *p = &r->pieces[q];
			struct rd_host *ho = &r->hosts[p->host];

			if (q > i && p->host == p[-1].host)
				return eng_err(r->errmsg, CKPT_E_CORRUPT,
					       "tensor \"%s\" listed twice by "
					       "host %u", f->name, p->host);
			ho->gidx[p->t - ho->ix.tensors] = r->ntensors;
		}
		t->name = f->name;
		t->dtype = f->dtype;
		t->ndim = f->ndim;
		t->shape = f->shape;
		t->first = i;
		t->npieces = (uint32_t)(j - i);
		fmt_shape_bytes(f->shape, f->ndim, ckpt_dtype_size(f->dtype),
				&gb);
		t->nbytes = gb;
		r->ntensors++;
	}
	return 0;
}

/* Stats by codec, and chunk payload bytes attributed to tensors pro rata
 * of the bytes of each chunk they occupy. */
static void rd_stats(ckpt_reader *r)
{
	ckpt_stats *s = &r->stats;

	_Static_assert(CKPT_CODEC_COUNT <= CKPT_STATS_MAX_CODECS,
		       "ckpt_stats has room for CKPT_STATS_MAX_CODECS codecs");

	memset(s, 0, sizeof(*s));
	for (size_t i = 0; i < r->cm.nfiles; i++)
		s->file_bytes += r->cm.files[i].size;
	s->file_bytes += r->commit_size;
	for (uint32_t h = 0; h < r->nhosts; h++) {
		const struct rd_host *ho = &r->hosts[h];
		const fmt_index *ix = &ho->ix;
		size_t p = 0;

		for (size_t c = 0; c < ix->nchunks; c++) {
			const fmt_chunk_entry *ce = &ix->chunks[c];
			uint64_t cs = ce->stream_offset, cend = cs + ce->raw_len;
			uint64_t used = 0;
			size_t q;

			s->raw_bytes += ce->raw_len;
			s->stored_bytes += ce->stored_len;
			s->chunks++;
			s->chunks_by_codec[ce->codec]++;
			s->raw_by_codec[ce->codec] += ce->raw_len;
			s->stored_by_codec[ce->codec] += ce->stored_len;
			while (p < ix->ntensors) {
				const fmt_tensor_entry *te =
					&ix->tensors[ho->by_stream[p]];

				if (te->stream_offset + te->nbytes > cs)
					break;
				p++;
			}
			for (q = p; q < ix->ntensors; q++) {
				const fmt_tensor_entry *te =
					&ix->tensors[ho->by_stream[q]];
				uint64_t lo, hi;

				if (te->stream_offset >= cend)
					break;
				lo = max_u64(te->stream_offset, cs);
				hi = min_u64(te->stream_offset + te->nbytes,
					     cend);
				if (hi > lo)
					used += hi - lo;
			}
			if (used == 0)
				continue;
			for (q = p; q < ix->ntensors; q++) {
				size_t ti = ho->by_stream[q];
				const fmt_tensor_entry *te = &ix->tensors[ti];
				uint64_t lo, hi;

				if (te->stream_offset >= cend)
					break;
				lo = max_u64(te->stream_offset, cs);
				hi = min_u64(te->stream_offset + te->nbytes,
					     cend);
				if (hi > lo)
					r->tensors[ho->gidx[ti]].stored_bytes +=
						(uint64_t)((unsigned __int128)
							   ce->stored_len *
							   (hi - lo) / used);
			}
		}
	}
}

/* Reads COMMIT once: the document, and its size and hash for listings. */
static int rd_load_commit(ckpt_reader *r)
{
	char err[ENG_ERRMSG_MAX];
	uint8_t *buf = NULL;
	size_t len = 0;
	int rc;

	rc = rd_get_doc(r, FMT_COMMIT_NAME,
			 FMT_MAX_META_BYTES + FMT_META_HDR_SIZE, &buf, &len,
			 err);
	if (rc == -ENOENT || rc == -ENOTDIR) {
		rc = eng_err(r->errmsg, CKPT_E_NOTFOUND,
			     "%s: step %llu is not committed (no %s/%s)",
			     r->root, (ull)r->step, r->dname,
			     FMT_COMMIT_NAME);
		goto out;
	}
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc, "%s", err);
		goto out;
	}
	err[0] = 0;
	rc = fmt_commit_decode(buf, len, &r->cm, err, sizeof(err));
	if (rc < 0) {
		rc = eng_err(r->errmsg, rc == CKPT_E_VERSION || rc == -ENOMEM
				     ? rc : CKPT_E_CORRUPT,
			     "%s/%s: %s", r->dname, FMT_COMMIT_NAME, err);
		goto out;
	}
	r->cm_loaded = 1;
	if (r->cm.step != r->step) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
			     "%s/%s: records step %llu", r->dname,
			     FMT_COMMIT_NAME, (ull)r->cm.step);
		goto out;
	}
	if (r->cm.host_count == 0 || r->cm.host_count > FMT_MAX_HOSTS) {
		rc = eng_err(r->errmsg, CKPT_E_CORRUPT, "%s/%s: %u hosts",
			     r->dname, FMT_COMMIT_NAME, r->cm.host_count);
		goto out;
	}
	r->commit_size = len;
	r->commit_xxh3 = fmt_xxh3(buf, len);
out:
	free(buf);
	return rc;
}

static int rd_build_files(ckpt_reader *r)
{
	size_t n = 0;

	for (size_t i = 0; i < r->cm.nfiles; i++)
		if (r->cm.files[i].kind == CKPT_FILE_SHARD)
			n++;
	r->files = calloc(n + 1, sizeof(*r->files));
	r->files_by_name = calloc(n + 1, sizeof(*r->files_by_name));
	if (!r->files || !r->files_by_name)
		return eng_err(r->errmsg, -ENOMEM, "out of memory");
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		const fmt_file_entry *fe = &r->cm.files[i];
		struct rd_file *f;
		uint32_t h, fi;

		if (fe->kind != CKPT_FILE_SHARD)
			continue;
		f = &r->files[r->nfiles];
		f->fd = -1;
		if (parse_shard_name(fe->name, &h, &fi) < 0 || h != fe->host ||
		    h >= r->nhosts)
			return eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: bad shard file entry \"%.32s\"",
				       r->dname, FMT_COMMIT_NAME, fe->name);
		memcpy(f->name, fe->name, sizeof(f->name));
		f->name[sizeof(f->name) - 1] = 0;
		f->size = fe->size;
		f->xxh3 = fe->xxh3;
		f->host = h;
		f->findex = fi;
		f->path = eng_path("%s/%s", r->stepdir, f->name);
		if (!f->path)
			return eng_err(r->errmsg, -ENOMEM, "out of memory");
		r->files_by_name[r->nfiles] = r->nfiles;
		r->nfiles++;
	}
	r->nlisted = r->nfiles;
	if (r->nfiles > 1)
		qsort_r(r->files_by_name, r->nfiles, sizeof(size_t),
			cmp_file_name, r->files);
	for (size_t i = 1; i < r->nfiles; i++)
		if (strcmp(r->files[r->files_by_name[i]].name,
			   r->files[r->files_by_name[i - 1]].name) == 0)
			return eng_err(r->errmsg, CKPT_E_CORRUPT,
				       "%s/%s: %s listed twice", r->dname,
				       FMT_COMMIT_NAME,
				       r->files[r->files_by_name[i]].name);
	return 0;
}

/* The reader uses threads, queue_depth and flags; reserved members must be
 * zero, as for ckpt_open(). */
static int rd_check_settings(const ckpt_settings *s)
{
	for (size_t i = 0; i < sizeof(s->reserved) / sizeof(*s->reserved); i++)
		if (s->reserved[i])
			return eng_err(NULL, -EINVAL,
				       "ckpt_reader_open: settings.reserved[%zu] "
				       "must be zero", i);
	if (s->flags & ~ENG_SETTINGS_FLAGS)
		return eng_err(NULL, -EINVAL,
			       "ckpt_reader_open: settings.flags: unknown bits "
			       "0x%x", s->flags & ~ENG_SETTINGS_FLAGS);
	return 0;
}

CKPT_API int ckpt_reader_open(ckpt_reader **out, const char *dir,
			      uint64_t step, const ckpt_settings *s)
{
	ckpt_reader *r;
	int rc;

	if (out)
		*out = NULL;
	if (!out || !dir)
		return eng_err(NULL, -EINVAL,
			       "ckpt_reader_open: out and dir are required");
	if (s) {
		rc = rd_check_settings(s);
		if (rc < 0)
			return rc;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return eng_err(NULL, -ENOMEM, "out of memory");
	r->pid = getpid();
	r->qd = RD_DEFAULT_QD;
	r->threads = 0;
	if (s) {
		r->flags = s->flags;
		if (s->queue_depth)
			r->qd = s->queue_depth;
		r->threads = s->threads;
	}
	if (r->qd > RD_MAX_QD)
		r->qd = RD_MAX_QD;
	if (r->threads == 0)
		r->threads = eng_ncpus();
	if (r->threads > RD_MAX_THREADS)
		r->threads = RD_MAX_THREADS;
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv_work, NULL);
	pthread_cond_init(&r->cv_done, NULL);
	r->sync_init = 1;
	r->root = strdup(dir);
	if (!r->root) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto fail;
	}
	if (!strncmp(dir, "gs://", 5)) {
		/* one client for every read of this reader */
		rc = eng_loc_open(dir, &r->loc, r->errmsg);
		if (rc < 0)
			goto fail;
		r->ring_state = -1; /* no io_uring: ranged GETs */
	}
	if (step == CKPT_LATEST) {
		rc = eng_resolve_latest(dir, &step, r->errmsg);
		if (rc < 0)
			goto fail;
	}
	r->step = step;
	fmt_step_dirname(step, r->dname);
	r->stepdir = eng_path("%s/%s", dir, r->dname);
	if (!r->stepdir) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto fail;
	}
	rc = rd_load_commit(r);
	if (rc < 0)
		goto fail;
	r->nhosts = r->cm.host_count;
	r->hosts = calloc(r->nhosts, sizeof(*r->hosts));
	if (!r->hosts) {
		rc = eng_err(r->errmsg, -ENOMEM, "out of memory");
		goto fail;
	}
	rc = rd_build_files(r);
	if (rc < 0)
		goto fail;
	for (size_t i = 0; i < r->cm.nfiles; i++) {
		const fmt_file_entry *fe = &r->cm.files[i];

		if (fe->host >= r->nhosts)
			continue; /* rejected by the format module */
		if (fe->kind == CKPT_FILE_INDEX)
			r->hosts[fe->host].cm_index = fe;
		else if (fe->kind == CKPT_FILE_SHARD)
			r->hosts[fe->host].cm_nshards++;
	}
	for (uint32_t h = 0; h < r->nhosts; h++) {
		rc = rd_load_host(r, h);
		if (rc < 0)
			goto fail;
	}
	for (size_t i = 0; i < r->nfiles; i++) {
		if (!r->files[i].mapped) {
			rc = eng_err(r->errmsg, CKPT_E_CORRUPT,
				     "%s/%s: lists %s, which no index names",
				     r->dname, FMT_COMMIT_NAME,
				     r->files[i].name);
			goto fail;
		}
	}
	rc = rd_merge(r);
	if (rc < 0)
		goto fail;
	rd_stats(r);
	r->errmsg[0] = 0;
	*out = r;
	return 0;
fail:
	/* the thread-local message must survive the close */
	rd_locate(r);
	eng_err(NULL, rc, "%s", r->errmsg);
	ckpt_reader_close(r);
	return rc;
}

/* In a child of fork() (see ckpt.h) only memory and this process's
 * descriptors are released: the threads are the parent's, and a lock may
 * have been held by one of them at the fork. */
CKPT_API void ckpt_reader_close(ckpt_reader *r)
{
	int in_child;

	if (!r)
		return;
	in_child = r->pid != getpid();
	rd_stop_workers(r, in_child);
	if (r->ring_state == 1 || r->ring_state <= -2)
		eng_uring_queue_exit(&r->ring);
	rd_free_bufs(r);
	rd_gcs_free(r);
	eng_loc_close(r->loc);
	free(r->cache);
	for (size_t i = 0; i < r->nfiles; i++) {
		if (r->files[i].fd >= 0)
			eng_close(r->files[i].fd);
		free(r->files[i].path);
	}
	free(r->files);
	free(r->files_by_name);
	if (r->hosts) {
		for (uint32_t h = 0; h < r->nhosts; h++) {
			fmt_index_free(&r->hosts[h].ix);
			free(r->hosts[h].file_of);
			free(r->hosts[h].by_stream);
			free(r->hosts[h].gidx);
		}
		free(r->hosts);
	}
	free(r->tensors);
	free(r->pieces);
	if (r->cm_loaded)
		fmt_commit_free(&r->cm);
	if (r->sync_init && !in_child) {
		pthread_mutex_destroy(&r->mu);
		pthread_cond_destroy(&r->cv_work);
		pthread_cond_destroy(&r->cv_done);
	}
	free(r->root);
	free(r->stepdir);
	free(r);
}

CKPT_API const char *ckpt_reader_errmsg(const ckpt_reader *r)
{
	return r ? r->errmsg : eng_tls_errmsg();
}

/* ------------------------------------------------------------------ */
/* Accessors                                                          */
/* ------------------------------------------------------------------ */

CKPT_API uint64_t ckpt_reader_step(const ckpt_reader *r)
{
	return r ? r->step : 0;
}

CKPT_API uint32_t ckpt_reader_host_count(const ckpt_reader *r)
{
	return r ? r->nhosts : 0;
}

CKPT_API int64_t ckpt_reader_commit_time(const ckpt_reader *r)
{
	return r ? r->cm.commit_unix_ns : 0;
}

CKPT_API size_t ckpt_reader_tensor_count(const ckpt_reader *r)
{
	return r ? r->ntensors : 0;
}

CKPT_API int ckpt_reader_tensor(const ckpt_reader *r, size_t i,
				ckpt_tensor_info *out)
{
	const struct rd_tensor *t;

	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_tensor: NULL argument");
	if (i >= r->ntensors)
		return eng_err((char *)r->errmsg, -EINVAL,
			       "tensor index %zu out of range (%zu tensors)", i,
			       r->ntensors);
	t = &r->tensors[i];
	memset(out, 0, sizeof(*out));
	out->name = t->name;
	out->dtype = t->dtype;
	out->ndim = t->ndim;
	out->shape = t->shape;
	out->nbytes = t->nbytes;
	out->slice_count = t->npieces;
	out->stored_bytes = t->stored_bytes;
	return 0;
}

CKPT_API int ckpt_reader_find(const ckpt_reader *r, const char *name,
			      size_t *index)
{
	size_t i;

	if (!r || !name)
		return eng_err(NULL, -EINVAL, "ckpt_reader_find: NULL argument");
	if (rd_find(r, name, &i) < 0)
		return eng_err((char *)r->errmsg, CKPT_E_NOTFOUND,
			       "no tensor \"%s\" in %s", name, r->dname);
	if (index)
		*index = i;
	return 0;
}

CKPT_API int ckpt_reader_slice(const ckpt_reader *r, size_t tensor,
			       uint32_t j, ckpt_slice_info *out)
{
	const fmt_slice *p;

	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_slice: NULL argument");
	if (tensor >= r->ntensors || j >= r->tensors[tensor].npieces)
		return eng_err((char *)r->errmsg, -EINVAL,
			       "slice %u of tensor %zu out of range", j, tensor);
	p = &r->pieces[r->tensors[tensor].first + j];
	memset(out, 0, sizeof(*out));
	out->host = p->host;
	out->offset = p->t->offset;
	out->extent = p->t->extent;
	out->nbytes = p->t->nbytes;
	return 0;
}

CKPT_API size_t ckpt_reader_file_count(const ckpt_reader *r)
{
	return r ? r->cm.nfiles + 1 : 0;
}

CKPT_API int ckpt_reader_file(const ckpt_reader *r, size_t i,
			      ckpt_file_info *out)
{
	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_file: NULL argument");
	if (i > r->cm.nfiles)
		return eng_err((char *)r->errmsg, -EINVAL,
			       "file index %zu out of range (%zu files)", i,
			       r->cm.nfiles + 1);
	memset(out, 0, sizeof(*out));
	if (i == r->cm.nfiles) {
		out->name = FMT_COMMIT_NAME;
		out->size = r->commit_size;
		out->xxh3 = r->commit_xxh3;
		out->host = 0;
		out->kind = CKPT_FILE_COMMIT;
		return 0;
	}
	out->name = r->cm.files[i].name;
	out->size = r->cm.files[i].size;
	out->xxh3 = r->cm.files[i].xxh3;
	out->host = r->cm.files[i].host;
	out->kind = r->cm.files[i].kind;
	return 0;
}

CKPT_API size_t ckpt_reader_ref_steps(const ckpt_reader *r, uint64_t *steps,
				      size_t max)
{
	uint64_t last = 0;
	size_t n = 0;

	if (!r || (!steps && max))
		return 0;
	/* from the files the indexes refer to, which are what
	 * ckpt_reader_copy checks at the destination (COMMIT's own list of
	 * steps is not compared with them here); they follow COMMIT's files.
	 * Each round takes the smallest step above the last one taken (a
	 * few steps, at most FMT_MAX_REFS files per host) */
	for (;;) {
		uint64_t next = UINT64_MAX;
		int found = 0;

		for (size_t i = r->nlisted; i < r->nfiles; i++) {
			uint64_t st = r->files[i].ref_step;

			if ((n == 0 || st > last) && st <= next) {
				next = st;
				found = 1;
			}
		}
		if (!found)
			return n;
		if (n < max)
			steps[n] = next;
		n++;
		last = next;
	}
}

CKPT_API int ckpt_reader_stats(const ckpt_reader *r, ckpt_stats *out)
{
	if (!r || !out)
		return eng_err(NULL, -EINVAL, "ckpt_reader_stats: NULL argument");
	*out = r->stats;
	out->reason = r->cm.reason;
	return 0;
}
