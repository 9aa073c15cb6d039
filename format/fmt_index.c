/*
 * fmt_index.c - the index document of one host (SPEC.md section 7): its
 * shard files, its tensors (name, dtype, global shape, this host's slice,
 * place in the host's data stream) and the chunks that cover the stream.
 *
 * Decoding checks every type, range and cross-reference the engine later
 * relies on (slices inside their shapes, stream ranges disjoint and inside
 * the stream, chunks contiguous, chunk spans inside their files and
 * disjoint), so that the engine can index arrays and compute offsets from
 * a decoded index without further checks. Every allocation is sized by the
 * count of JSON elements actually present (bounded by the document size),
 * never by a number read from the document. What one index cannot check
 * (slices of one tensor across hosts) is fmt_slices.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_json.h"

/* ---- encoding ---- */

int fmt_index_encode(const fmt_index *ix, uint8_t **out, size_t *out_len)
{
	fmt_sbuf b = { 0 };
	char hex[33];
	uint32_t version = ix && ix->version ? ix->version : FMT_VERSION;

	if (!ix || !out || !out_len || ix->step > FMT_JSON_MAX_INT ||
	    ix->stream_bytes > FMT_JSON_MAX_INT || (ix->nfiles && !ix->files) ||
	    (ix->ntensors && !ix->tensors) || (ix->nchunks && !ix->chunks) ||
	    !ckpt_reason_name(ix->reason))
		return -EINVAL;
	for (size_t i = 0; i < ix->ntensors; i++) {
		const fmt_tensor_entry *t = &ix->tensors[i];

		if (!t->name || !fmt_name_valid(t->name, t->name_len) ||
		    !ckpt_dtype_name(t->dtype) || t->ndim > CKPT_MAX_NDIM ||
		    t->stream_offset > FMT_JSON_MAX_INT ||
		    t->nbytes > FMT_JSON_MAX_INT)
			return -EINVAL;
		for (uint32_t d = 0; d < t->ndim; d++)
			if (t->shape[d] > FMT_JSON_MAX_INT ||
			    t->offset[d] > FMT_JSON_MAX_INT ||
			    t->extent[d] > FMT_JSON_MAX_INT)
				return -EINVAL;
	}
	for (size_t i = 0; i < ix->nfiles; i++)
		if (ix->files[i].size > FMT_JSON_MAX_INT ||
		    !memchr(ix->files[i].name, 0, sizeof(ix->files[i].name)))
			return -EINVAL;
	for (size_t i = 0; i < ix->nchunks; i++)
		if (ix->chunks[i].file_offset > FMT_JSON_MAX_INT ||
		    ix->chunks[i].stream_offset > FMT_JSON_MAX_INT)
			return -EINVAL;
	if (version > FMT_VERSION_MAX || (version == 1 && ix->nrefs) ||
	    (ix->nrefs && !ix->refs) || ix->nrefs > FMT_MAX_REFS)
		return -EINVAL;
	for (size_t i = 0; i < ix->nrefs; i++)
		if (ix->refs[i].step >= ix->step ||
		    ix->refs[i].size > FMT_JSON_MAX_INT ||
		    !memchr(ix->refs[i].name, 0, sizeof(ix->refs[i].name)))
			return -EINVAL;

	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", ix->save_id[i]);
	fmt_sb_printf(&b,
		      "{\"format\":%d,\"kind\":\"index\",\"step\":%llu,"
		      "\"save_id\":\"%s\",\"host\":%u,\"hosts\":%u,",
		      version, (unsigned long long)ix->step, hex,
		      ix->host_index, ix->host_count);
	fmt_sb_reason(&b, ix->reason);
	fmt_sb_printf(&b,
		      "\"chunk_bytes\":%u,\"stream_bytes\":%llu,\n\"files\":[",
		      ix->chunk_bytes, (unsigned long long)ix->stream_bytes);
	for (size_t i = 0; i < ix->nfiles; i++) {
		const fmt_file_entry *f = &ix->files[i];

		fmt_sb_file(&b, f, i == 0);
		fmt_sb_str(&b, "}");
	}
	if (version >= FMT_VERSION_DEDUP) {
		fmt_sb_str(&b, "],\n\"refs\":[");
		for (size_t i = 0; i < ix->nrefs; i++) {
			const fmt_ref_entry *f = &ix->refs[i];

			fmt_sb_printf(&b,
				      "%s{\"step\":%llu,\"name\":\"%s\","
				      "\"size\":%llu,\"xxh3\":",
				      i ? ",\n" : "\n",
				      (unsigned long long)f->step, f->name,
				      (unsigned long long)f->size);
			fmt_sb_hash(&b, f->xxh3);
			fmt_sb_str(&b, "}");
		}
	}
	fmt_sb_str(&b, "],\n\"tensors\":[");
	for (size_t i = 0; i < ix->ntensors; i++) {
		const fmt_tensor_entry *t = &ix->tensors[i];

		fmt_sb_str(&b, i ? ",\n{\"name\":" : "\n{\"name\":");
		fmt_sb_json_str(&b, t->name, t->name_len);
		fmt_sb_printf(&b, ",\"dtype\":\"%s\",\"shape\":",
			      ckpt_dtype_name(t->dtype));
		fmt_sb_u64s(&b, t->shape, t->ndim);
		fmt_sb_str(&b, ",\"offset\":");
		fmt_sb_u64s(&b, t->offset, t->ndim);
		fmt_sb_str(&b, ",\"extent\":");
		fmt_sb_u64s(&b, t->extent, t->ndim);
		fmt_sb_printf(&b, ",\"stream_offset\":%llu,\"nbytes\":%llu}",
			      (unsigned long long)t->stream_offset,
			      (unsigned long long)t->nbytes);
	}
	fmt_sb_str(&b, "],\n\"chunks\":[");
	for (size_t i = 0; i < ix->nchunks; i++) {
		const fmt_chunk_entry *ch = &ix->chunks[i];

		fmt_sb_printf(&b, "%s[%u,%llu,%u,%u,%llu,%u,%u,",
			      i ? ",\n" : "\n", ch->file,
			      (unsigned long long)ch->file_offset,
			      ch->stored_len, ch->raw_len,
			      (unsigned long long)ch->stream_offset, ch->codec,
			      ch->elem_width);
		fmt_sb_hash(&b, ch->raw_xxh3);
		if (version >= FMT_VERSION_DEDUP) {
			fmt_sb_str(&b, ",");
			fmt_sb_hash128(&b, ch->h128);
		}
		fmt_sb_str(&b, "]");
	}
	fmt_sb_str(&b, "]}\n");
	return fmt_sb_finish(&b, FMT_META_INDEX, version, out, out_len);
}

/* ---- decoding ---- */

static int cmp_u64pair(const void *a, const void *b)
{
	const uint64_t *x = a, *y = b;

	if (x[0] != y[0])
		return x[0] < y[0] ? -1 : 1;
	if (x[1] != y[1])
		return x[1] < y[1] ? -1 : 1;
	return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return fmt_tensor_name_cmp(*(const fmt_tensor_entry *const *)a,
				   *(const fmt_tensor_entry *const *)b);
}

static int get_dims(fmt_jrd *r, json_t *t, const char *key, uint64_t *dims,
		    size_t ndim, const char *where)
{
	json_t *a = json_object_get(t, key);
	char k[48];

	if (!json_is_array(a) || json_array_size(a) != ndim)
		return fmt_jr_bad(r, "%s: \"%s\": not an array of %zu integers",
				  where, key, ndim);
	for (size_t d = 0; d < ndim; d++) {
		int rc;

		snprintf(k, sizeof(k), ": \"%s\"[%zu]", key, d);
		rc = fmt_jr_uint(r, json_array_get(a, d), FMT_JSON_MAX_INT,
				 &dims[d], where, k);
		if (rc)
			return rc;
	}
	return 0;
}

static int decode_tensor(fmt_jrd *r, json_t *t, size_t i, fmt_tensor_entry *te,
			 uint64_t stream_bytes)
{
	static const char *const keys[] = { "name",   "dtype",  "shape",
					    "offset", "extent", "stream_offset",
					    "nbytes", NULL };
	char where[96];
	json_t *v, *shape;
	uint64_t total, want;
	size_t ndim, dsize;
	int rc;

	snprintf(where, sizeof(where), "tensors[%zu]", i);
	rc = fmt_jr_keys(r, t, keys, where);
	if (rc)
		return rc;
	v = json_object_get(t, "name");
	if (!json_is_string(v))
		return fmt_jr_bad(r, "%s: \"name\": not a string", where);
	te->name_len = json_string_length(v);
	if (strlen(json_string_value(v)) != te->name_len ||
	    !fmt_name_valid(json_string_value(v), te->name_len))
		return fmt_jr_bad(
			r,
			"%s: \"name\": not 1..%d bytes of UTF-8 without "
			"NUL",
			where, CKPT_MAX_NAME);
	te->name = malloc(te->name_len + 1);
	if (!te->name)
		return -ENOMEM;
	memcpy(te->name, json_string_value(v), te->name_len + 1);
	/* From here messages name the tensor. */
	snprintf(where, sizeof(where), "tensors[%zu] (\"%.48s%s\")", i,
		 te->name, te->name_len > 48 ? "..." : "");

	v = json_object_get(t, "dtype");
	te->dtype = json_is_string(v) ?
			    ckpt_dtype_from_name(json_string_value(v)) :
			    CKPT_DTYPE_INVALID;
	if (te->dtype == CKPT_DTYPE_INVALID)
		return fmt_jr_bad(r, "%s: \"dtype\": unknown type", where);
	dsize = ckpt_dtype_size(te->dtype);
	shape = json_object_get(t, "shape");
	if (!json_is_array(shape) || json_array_size(shape) > CKPT_MAX_NDIM)
		return fmt_jr_bad(r,
				  "%s: \"shape\": not an array of at most %d "
				  "integers",
				  where, CKPT_MAX_NDIM);
	ndim = json_array_size(shape);
	te->ndim = (uint32_t)ndim;
	if ((rc = get_dims(r, t, "shape", te->shape, ndim, where)) ||
	    (rc = get_dims(r, t, "offset", te->offset, ndim, where)) ||
	    (rc = get_dims(r, t, "extent", te->extent, ndim, where)))
		return rc;
	for (size_t d = 0; d < ndim; d++)
		if (te->offset[d] > te->shape[d] ||
		    te->extent[d] > te->shape[d] - te->offset[d])
			return fmt_jr_bad(
				r,
				"%s: dimension %zu: slice [%llu, +%llu) "
				"outside shape %llu",
				where, d, (unsigned long long)te->offset[d],
				(unsigned long long)te->extent[d],
				(unsigned long long)te->shape[d]);
	if (fmt_shape_bytes(te->shape, te->ndim, dsize, &total) != 0 ||
	    total > FMT_JSON_MAX_INT)
		return fmt_jr_bad(r, "%s: \"shape\": size overflows", where);
	fmt_shape_bytes(te->extent, te->ndim, dsize, &want);
	if ((rc = fmt_jr_key_uint(r, t, "stream_offset", FMT_JSON_MAX_INT,
				  &te->stream_offset, where)) ||
	    (rc = fmt_jr_key_uint(r, t, "nbytes", FMT_JSON_MAX_INT, &te->nbytes,
				  where)))
		return rc;
	if (te->nbytes != want)
		return fmt_jr_bad(r,
				  "%s: \"nbytes\" %llu, extent and dtype give "
				  "%llu",
				  where, (unsigned long long)te->nbytes,
				  (unsigned long long)want);
	if (te->stream_offset % FMT_STREAM_ALIGN)
		return fmt_jr_bad(
			r,
			"%s: \"stream_offset\" %llu not a multiple of "
			"%u",
			where, (unsigned long long)te->stream_offset,
			FMT_STREAM_ALIGN);
	if (te->stream_offset > stream_bytes ||
	    te->nbytes > stream_bytes - te->stream_offset)
		return fmt_jr_bad(r,
				  "%s: stream range [%llu, +%llu) beyond "
				  "stream_bytes %llu",
				  where, (unsigned long long)te->stream_offset,
				  (unsigned long long)te->nbytes,
				  (unsigned long long)stream_bytes);
	return 0;
}

/* Tensors' stream ranges must not overlap, names must be unique and the
 * stream may end at most in the padding after the last tensor. */
static int check_tensors(fmt_jrd *r, fmt_index *ix)
{
	fmt_tensor_entry **byname = NULL;
	uint64_t *ranges = NULL, end = 0, maxend = 0, maxidx = 0;
	size_t n = ix->ntensors;
	int rc = 0;

	if (n == 0) {
		if (ix->stream_bytes != 0)
			rc = fmt_jr_bad(r,
					"\"stream_bytes\" %llu without tensors",
					(unsigned long long)ix->stream_bytes);
		return rc;
	}
	byname = malloc(n * sizeof(*byname));
	ranges = malloc(n * 3 * sizeof(*ranges));
	if (!byname || !ranges) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		byname[i] = &ix->tensors[i];
		ranges[3 * i] = ix->tensors[i].stream_offset;
		ranges[3 * i + 1] = ix->tensors[i].nbytes;
		ranges[3 * i + 2] = i;
		if (ranges[3 * i] + ranges[3 * i + 1] > end)
			end = ranges[3 * i] + ranges[3 * i + 1];
	}
	qsort(byname, n, sizeof(*byname), cmp_tensor_name);
	for (size_t i = 1; i < n; i++) {
		if (cmp_tensor_name(&byname[i - 1], &byname[i]) == 0) {
			rc = fmt_jr_bad(r, "tensors: duplicate name \"%.64s\"",
					byname[i]->name);
			goto out;
		}
	}
	/* Sorted by offset, a non-empty range must start at or after the end
	 * of every non-empty range before it. */
	qsort(ranges, n, 3 * sizeof(*ranges), cmp_u64pair);
	for (size_t i = 0; i < n; i++) {
		if (!ranges[3 * i + 1])
			continue;
		if (ranges[3 * i] < maxend) {
			rc = fmt_jr_bad(
				r,
				"tensors[%llu] (\"%.64s\"): stream range "
				"[%llu, +%llu) overlaps tensors[%llu] "
				"(\"%.64s\")",
				(unsigned long long)ranges[3 * i + 2],
				ix->tensors[ranges[3 * i + 2]].name,
				(unsigned long long)ranges[3 * i],
				(unsigned long long)ranges[3 * i + 1],
				(unsigned long long)maxidx,
				ix->tensors[maxidx].name);
			goto out;
		}
		maxend = ranges[3 * i] + ranges[3 * i + 1];
		maxidx = ranges[3 * i + 2];
	}
	if (ix->stream_bytes > fmt_align_up(end, FMT_STREAM_ALIGN))
		rc = fmt_jr_bad(
			r,
			"\"stream_bytes\" %llu beyond the last tensor's "
			"end %llu",
			(unsigned long long)ix->stream_bytes,
			(unsigned long long)end);
out:
	free(byname);
	free(ranges);
	return rc;
}

static int decode_chunk(fmt_jrd *r, json_t *a, size_t k, const fmt_index *ix,
			fmt_chunk_entry *ch)
{
	char where[48];
	uint64_t v[7], want_raw;
	int rc;

	size_t nvals = r->version >= FMT_VERSION_DEDUP ? 9 : 8;
	uint64_t fsize;

	snprintf(where, sizeof(where), "chunks[%zu]", k);
	if (!json_is_array(a) || json_array_size(a) != nvals)
		return fmt_jr_bad(r, "%s: not an array of %zu values", where,
				  nvals);
	static const char *const names[7] = {
		": file",          ": file_offset", ": stored_len", ": raw_len",
		": stream_offset", ": codec",       ": elem_width"
	};
	for (int i = 0; i < 7; i++) {
		rc = fmt_jr_uint(r, json_array_get(a, (size_t)i),
				 FMT_JSON_MAX_INT, &v[i], where, names[i]);
		if (rc)
			return rc;
	}
	json_t *h = json_array_get(a, 7);
	if (!json_is_string(h) || json_string_length(h) != 16 ||
	    fmt_hash_parse(json_string_value(h), &ch->raw_xxh3) != 0)
		return fmt_jr_bad(r, "%s: xxh3: not 16 lower-case hex digits",
				  where);
	h = nvals > 8 ? json_array_get(a, 8) : NULL;
	if (h && (!json_is_string(h) || json_string_length(h) != 32 ||
		  fmt_hash128_parse(json_string_value(h), ch->h128) != 0))
		return fmt_jr_bad(r, "%s: xxh128: not 32 lower-case hex digits",
				  where);
	if (v[0] >= ix->nfiles + ix->nrefs)
		return fmt_jr_bad(r,
				  "%s: file %llu, index lists %zu files "
				  "and %zu refs",
				  where, (unsigned long long)v[0], ix->nfiles,
				  ix->nrefs);
	if (v[1] < FMT_SHARD_HDR_SIZE || v[1] % FMT_ALIGN)
		return fmt_jr_bad(
			r,
			"%s: file_offset %llu not a multiple of %u after "
			"the shard header",
			where, (unsigned long long)v[1], FMT_ALIGN);
	if (v[4] != (uint64_t)k * ix->chunk_bytes)
		return fmt_jr_bad(
			r,
			"%s: stream_offset %llu, expected %llu (chunks "
			"are sorted and contiguous)",
			where, (unsigned long long)v[4],
			(unsigned long long)k * ix->chunk_bytes);
	want_raw = ix->stream_bytes - v[4];
	if (want_raw > ix->chunk_bytes)
		want_raw = ix->chunk_bytes;
	if (v[3] != want_raw)
		return fmt_jr_bad(r, "%s: raw_len %llu, expected %llu", where,
				  (unsigned long long)v[3],
				  (unsigned long long)want_raw);
	if (v[5] >= CKPT_CODEC_COUNT)
		return fmt_jr_bad(r, "%s: unknown codec %llu", where,
				  (unsigned long long)v[5]);
	if (!(v[6] == 1 || v[6] == 2 || v[6] == 4 || v[6] == 8) ||
	    (v[5] == CKPT_CODEC_FLOAT && v[6] == 1))
		return fmt_jr_bad(r, "%s: bad elem_width %llu", where,
				  (unsigned long long)v[6]);
	if (v[2] < 1 || v[2] > fmt_codec_bound(v[3]) ||
	    (v[5] == CKPT_CODEC_NONE && v[2] != v[3]))
		return fmt_jr_bad(
			r,
			"%s: stored_len %llu invalid for raw_len %llu "
			"and codec %s",
			where, (unsigned long long)v[2],
			(unsigned long long)v[3], ckpt_codec_name((int)v[5]));
	fsize = v[0] < ix->nfiles ? ix->files[v[0]].size :
				    ix->refs[v[0] - ix->nfiles].size;
	if (v[1] > fsize || fmt_chunk_span((uint32_t)v[2]) > fsize - v[1])
		return fmt_jr_bad(
			r,
			"%s: span [%llu, +%llu) beyond the %llu bytes "
			"of %s",
			where, (unsigned long long)v[1],
			(unsigned long long)fmt_chunk_span((uint32_t)v[2]),
			(unsigned long long)fsize,
			fmt_index_file_name(ix, (uint32_t)v[0]));
	ch->file = (uint32_t)v[0];
	ch->file_offset = v[1];
	ch->stored_len = (uint32_t)v[2];
	ch->raw_len = (uint32_t)v[3];
	ch->stream_offset = v[4];
	ch->codec = (uint8_t)v[5];
	ch->elem_width = (uint8_t)v[6];
	return 0;
}

/* No two chunks of one file may share bytes. */
static int check_chunk_spans(fmt_jrd *r, const fmt_index *ix)
{
	uint64_t *s;
	size_t n = ix->nchunks;
	int rc = 0;

	if (n < 2)
		return 0;
	s = malloc(n * 3 * sizeof(*s));
	if (!s)
		return -ENOMEM;
	for (size_t k = 0; k < n; k++) {
		s[3 * k] = ix->chunks[k].file;
		s[3 * k + 1] = ix->chunks[k].file_offset;
		s[3 * k + 2] = k;
	}
	qsort(s, n, 3 * sizeof(*s), cmp_u64pair);
	for (size_t k = 1; k < n; k++) {
		const fmt_chunk_entry *p = &ix->chunks[s[3 * k - 1]];

		if (s[3 * k] == s[3 * k - 3] &&
		    p->file_offset + fmt_chunk_span(p->stored_len) >
			    s[3 * k + 1]) {
			rc = fmt_jr_bad(
				r, "chunks[%llu]: overlaps chunks[%llu] in %s",
				(unsigned long long)s[3 * k + 2],
				(unsigned long long)s[3 * k - 1],
				fmt_index_file_name(ix, p->file));
			break;
		}
	}
	free(s);
	return rc;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Version 2 "refs": older shard files of this host, each named once. */
static int decode_refs(fmt_jrd *r, json_t *refs, fmt_index *ix)
{
	static const char *const rkeys[] = { "step", "name", "size", "xxh3",
					     NULL };
	int rc;

	if (!json_is_array(refs) || json_array_size(refs) > FMT_MAX_REFS)
		return fmt_jr_bad(r,
				  "\"refs\": not an array of at most %u "
				  "entries",
				  FMT_MAX_REFS);
	ix->nrefs = json_array_size(refs);
	if (ix->nrefs) {
		ix->refs = calloc(ix->nrefs, sizeof(*ix->refs));
		if (!ix->refs)
			return -ENOMEM;
	}
	for (size_t i = 0; i < ix->nrefs; i++) {
		fmt_ref_entry *re = &ix->refs[i];
		json_t *o = json_array_get(refs, i);
		fmt_file_entry fe;
		char where[32], want[32];
		uint64_t f;
		const char *p;

		snprintf(where, sizeof(where), "refs[%zu]", i);
		if ((rc = fmt_jr_keys(r, o, rkeys, where)) ||
		    (rc = fmt_jr_file(r, o, &fe, where)) ||
		    (rc = fmt_jr_key_uint(r, o, "step", FMT_JSON_MAX_INT,
					  &re->step, where)))
			return rc;
		if (re->step >= ix->step)
			return fmt_jr_bad(r,
					  "%s: step %llu is not older than "
					  "step %llu",
					  where, (unsigned long long)re->step,
					  (unsigned long long)ix->step);
		/* h<host>-f<f>.shard of this host, canonical */
		p = strstr(fe.name, "-f");
		f = 0;
		for (p = p ? p + 2 : fe.name;
		     *p >= '0' && *p <= '9' && f < FMT_MAX_FILES_PER_HOST; p++)
			f = f * 10 + (uint64_t)(*p - '0');
		fmt_shard_name(ix->host_index, (uint32_t)f, want);
		if (f >= FMT_MAX_FILES_PER_HOST || strcmp(fe.name, want) != 0)
			return fmt_jr_bad(r,
					  "%s: name \"%s\" is no shard file "
					  "of host %u",
					  where, fe.name, ix->host_index);
		if (fe.size < FMT_SHARD_HDR_SIZE)
			return fmt_jr_bad(r,
					  "%s: size %llu smaller than the "
					  "shard header",
					  where, (unsigned long long)fe.size);
		for (size_t j = 0; j < i; j++)
			if (ix->refs[j].step == re->step &&
			    strcmp(ix->refs[j].name, fe.name) == 0)
				return fmt_jr_bad(r,
						  "%s: same file as refs[%zu]",
						  where, j);
		memcpy(re->name, fe.name, sizeof(re->name));
		re->size = fe.size;
		re->xxh3 = fe.xxh3;
		re->file = (uint32_t)f;
	}
	return 0;
}

const char *fmt_index_file_name(const fmt_index *ix, uint32_t file)
{
	if (file < ix->nfiles)
		return ix->files[file].name;
	if (file - ix->nfiles < ix->nrefs)
		return ix->refs[file - ix->nfiles].name;
	return NULL;
}

static int decode_index(fmt_jrd *r, json_t *root, fmt_index *ix)
{
	static const char *const keys[] = {
		"format", "kind",    "step",        "save_id",
		"host",   "hosts",   "chunk_bytes", "stream_bytes",
		"files",  "tensors", "chunks",      NULL
	};
	static const char *const keys2[] = {
		"format", "kind",  "step",        "save_id",
		"host",   "hosts", "chunk_bytes", "stream_bytes",
		"files",  "refs",  "tensors",     "chunks",
		NULL
	};
	static const char *const opt[] = { "reason", NULL };
	static const char *const fkeys[] = { "name", "size", "xxh3", NULL };
	json_t *files, *tensors, *chunks, *v;
	uint64_t x, nchunks;
	int rc;

	/* The version first: a newer document may well have other keys. */
	if ((rc = fmt_jr_header(r, root, "index")) ||
	    (rc = fmt_jr_keys_opt(
		     r, root, r->version >= FMT_VERSION_DEDUP ? keys2 : keys,
		     opt, "document")) ||
	    (rc = fmt_jr_reason(r, root, &ix->reason)) ||
	    (rc = fmt_jr_key_uint(r, root, "step", FMT_JSON_MAX_INT, &ix->step,
				  "")))
		return rc;
	v = json_object_get(root, "save_id");
	if (!json_is_string(v) || json_string_length(v) != 32)
		return fmt_jr_bad(r,
				  "\"save_id\": not 32 lower-case hex digits");
	for (int i = 0; i < 32; i++) {
		int d = hexval(json_string_value(v)[i]);

		if (d < 0)
			return fmt_jr_bad(r,
					  "\"save_id\": not 32 lower-case hex "
					  "digits");
		if (i % 2 == 0)
			ix->save_id[i / 2] = (uint8_t)(d << 4);
		else
			ix->save_id[i / 2] |= (uint8_t)d;
	}
	if ((rc = fmt_jr_key_uint(r, root, "hosts", FMT_MAX_HOSTS, &x, "")))
		return rc;
	if (x == 0)
		return fmt_jr_bad(r, "\"hosts\": must be at least 1");
	ix->host_count = (uint32_t)x;
	if ((rc = fmt_jr_key_uint(r, root, "host", ix->host_count - 1, &x, "")))
		return rc;
	ix->host_index = (uint32_t)x;
	if ((rc = fmt_jr_key_uint(r, root, "chunk_bytes", FMT_MAX_CHUNK, &x,
				  "")))
		return rc;
	if (x < FMT_MIN_CHUNK || x % FMT_ALIGN)
		return fmt_jr_bad(
			r,
			"\"chunk_bytes\": %llu not a multiple of %u in "
			"[%u, %u]",
			(unsigned long long)x, FMT_ALIGN, FMT_MIN_CHUNK,
			FMT_MAX_CHUNK);
	ix->chunk_bytes = (uint32_t)x;
	if ((rc = fmt_jr_key_uint(r, root, "stream_bytes", FMT_JSON_MAX_INT,
				  &ix->stream_bytes, "")))
		return rc;

	/* files */
	files = json_object_get(root, "files");
	if (!json_is_array(files) ||
	    json_array_size(files) > FMT_MAX_FILES_PER_HOST)
		return fmt_jr_bad(
			r, "\"files\": not an array of at most %u entries",
			FMT_MAX_FILES_PER_HOST);
	ix->nfiles = json_array_size(files);
	if (ix->nfiles) {
		ix->files = calloc(ix->nfiles, sizeof(*ix->files));
		if (!ix->files)
			return -ENOMEM;
	}
	for (size_t i = 0; i < ix->nfiles; i++) {
		fmt_file_entry *fe = &ix->files[i];
		char where[32], want[32];

		snprintf(where, sizeof(where), "files[%zu]", i);
		if ((rc = fmt_jr_keys(r, json_array_get(files, i), fkeys,
				      where)) ||
		    (rc = fmt_jr_file(r, json_array_get(files, i), fe, where)))
			return rc;
		fmt_shard_name(ix->host_index, (uint32_t)i, want);
		if (strcmp(fe->name, want) != 0)
			return fmt_jr_bad(r, "%s: name \"%s\", expected \"%s\"",
					  where, fe->name, want);
		if (fe->size < FMT_SHARD_HDR_SIZE)
			return fmt_jr_bad(
				r,
				"%s: size %llu smaller than the shard "
				"header",
				where, (unsigned long long)fe->size);
		fe->host = ix->host_index;
		fe->kind = CKPT_FILE_SHARD;
	}
	ix->version = r->version;
	if (r->version >= FMT_VERSION_DEDUP &&
	    (rc = decode_refs(r, json_object_get(root, "refs"), ix)))
		return rc;

	/* tensors */
	tensors = json_object_get(root, "tensors");
	if (!json_is_array(tensors))
		return fmt_jr_bad(r, "\"tensors\": not an array");
	ix->ntensors = json_array_size(tensors);
	if (ix->ntensors) {
		ix->tensors = calloc(ix->ntensors, sizeof(*ix->tensors));
		if (!ix->tensors)
			return -ENOMEM;
	}
	for (size_t i = 0; i < ix->ntensors; i++) {
		rc = decode_tensor(r, json_array_get(tensors, i), i,
				   &ix->tensors[i], ix->stream_bytes);
		if (rc)
			return rc;
	}
	if ((rc = check_tensors(r, ix)))
		return rc;

	/* chunks */
	chunks = json_object_get(root, "chunks");
	if (!json_is_array(chunks))
		return fmt_jr_bad(r, "\"chunks\": not an array");
	nchunks = (ix->stream_bytes + ix->chunk_bytes - 1) / ix->chunk_bytes;
	if (json_array_size(chunks) != nchunks)
		return fmt_jr_bad(r,
				  "\"chunks\": %zu entries, stream_bytes %llu "
				  "needs %llu",
				  json_array_size(chunks),
				  (unsigned long long)ix->stream_bytes,
				  (unsigned long long)nchunks);
	ix->nchunks = json_array_size(chunks);
	if (ix->nchunks) {
		ix->chunks = calloc(ix->nchunks, sizeof(*ix->chunks));
		if (!ix->chunks)
			return -ENOMEM;
	}
	for (size_t k = 0; k < ix->nchunks; k++) {
		rc = decode_chunk(r, json_array_get(chunks, k), k, ix,
				  &ix->chunks[k]);
		if (rc)
			return rc;
	}
	return check_chunk_spans(r, ix);
}

int fmt_index_decode(const uint8_t *file, size_t file_len, fmt_index *ix,
		     char *err, size_t errlen)
{
	fmt_jrd r = { err, errlen, "index", 0 };
	json_t *root;
	int rc;

	if (!ix)
		return -EINVAL;
	memset(ix, 0, sizeof(*ix));
	rc = fmt_jr_load(&r, FMT_META_INDEX, file, file_len, &root);
	if (rc)
		return rc;
	rc = decode_index(&r, root, ix);
	json_decref(root);
	if (rc)
		fmt_index_free(ix);
	return rc;
}

void fmt_index_free(fmt_index *ix)
{
	if (!ix)
		return;
	if (ix->tensors)
		for (size_t i = 0; i < ix->ntensors; i++)
			free(ix->tensors[i].name);
	free(ix->tensors);
	free(ix->files);
	free(ix->chunks);
	free(ix->refs);
	memset(ix, 0, sizeof(*ix));
}
