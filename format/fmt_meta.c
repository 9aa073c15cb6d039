/*
 * fmt_meta.c - index and commit files of format v1 (SPEC.md sections 7-9):
 * the 64-byte frame and the JSON documents inside it.
 *
 * Encoding writes JSON by hand (fixed key order, one array entry per line,
 * fast for indexes with many chunks); decoding uses jansson and then checks
 * every type, range and cross-reference the engine later relies on, so
 * that the engine can index arrays and compute offsets from a decoded
 * index without further checks. Every allocation is sized by the count of
 * JSON elements actually present (bounded by the document size), never by
 * a number read from the document.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "fmt.h"

static const uint8_t meta_magic[8] = { 'C', 'K', 'P', 'T', 'M', 'E', 'T', 'A' };

#define JSON_MAX_INT ((uint64_t)INT64_MAX)

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* ---- frame ---- */

/*
 * 0 magic "CKPTMETA" 8 version u32 12 kind u32 16 body_len u64
 * 24 body xxh3 32..55 zero 56 hash of 0..55.
 */
int fmt_meta_wrap(int kind, const char *body, size_t len, uint8_t **out,
		  size_t *out_len)
{
	uint8_t *p;

	if (!out || !out_len || (!body && len) ||
	    (kind != FMT_META_INDEX && kind != FMT_META_COMMIT) ||
	    len > FMT_MAX_META_BYTES)
		return -EINVAL;
	p = malloc(FMT_META_HDR_SIZE + len);
	if (!p)
		return -ENOMEM;
	memset(p, 0, FMT_META_HDR_SIZE);
	memcpy(p, meta_magic, 8);
	fmt_put_u32(p + 8, FMT_VERSION);
	fmt_put_u32(p + 12, (uint32_t)kind);
	fmt_put_u64(p + 16, len);
	fmt_put_hash(p + 24, fmt_xxh3(body, len));
	fmt_put_hash(p + 56, fmt_xxh3(p, 56));
	if (len)
		memcpy(p + FMT_META_HDR_SIZE, body, len);
	*out = p;
	*out_len = FMT_META_HDR_SIZE + len;
	return 0;
}

static const char *kind_name(int kind)
{
	return kind == FMT_META_INDEX ? "index" :
	       kind == FMT_META_COMMIT ? "commit" : "metadata";
}

int fmt_meta_unwrap(int kind, const uint8_t *file, size_t file_len,
		    const char **body, size_t *body_len, char *err,
		    size_t errlen)
{
	const char *what = kind_name(kind);
	uint32_t version, k;
	uint64_t blen;

	if (!file || file_len < FMT_META_HDR_SIZE)
		return fail(err, errlen, CKPT_E_CORRUPT,
			    "%s: file of %zu bytes is shorter than its %u-byte "
			    "header", what, file ? file_len : 0,
			    FMT_META_HDR_SIZE);
	if (memcmp(file, meta_magic, 8) != 0)
		return fail(err, errlen, CKPT_E_CORRUPT, "%s: bad magic",
			    what);
	version = fmt_get_u32(file + 8);
	if (version > FMT_VERSION)
		return fail(err, errlen, CKPT_E_VERSION,
			    "%s: format version %u, this library reads "
			    "version %u", what, version, FMT_VERSION);
	if (version != FMT_VERSION)
		return fail(err, errlen, CKPT_E_CORRUPT,
			    "%s: bad format version %u", what, version);
	if (fmt_get_hash(file + 56) != fmt_xxh3(file, 56))
		return fail(err, errlen, CKPT_E_CORRUPT,
			    "%s: header checksum mismatch", what);
	for (int i = 32; i < 56; i++)
		if (file[i])
			return fail(err, errlen, CKPT_E_CORRUPT,
				    "%s: reserved header byte %d not zero",
				    what, i);
	k = fmt_get_u32(file + 12);
	if (k != (uint32_t)kind)
		return fail(err, errlen, CKPT_E_CORRUPT,
			    "%s: frame holds kind %u, expected %d", what, k,
			    kind);
	blen = fmt_get_u64(file + 16);
	if (blen > FMT_MAX_META_BYTES || blen != file_len - FMT_META_HDR_SIZE)
		return fail(err, errlen, CKPT_E_CORRUPT,
			    "%s: body length %llu, file has %zu bytes after "
			    "the header", what, (unsigned long long)blen,
			    file_len - FMT_META_HDR_SIZE);
	if (fmt_get_hash(file + 24) !=
	    fmt_xxh3(file + FMT_META_HDR_SIZE, (size_t)blen))
		return fail(err, errlen, CKPT_E_CORRUPT,
			    "%s: body checksum mismatch", what);
	*body = (const char *)file + FMT_META_HDR_SIZE;
	*body_len = (size_t)blen;
	return 0;
}

/* ---- JSON writer ---- */

typedef struct sbuf {
	char *p;
	size_t len, cap;
	int oom;
} sbuf;

static void sb_reserve(sbuf *b, size_t n)
{
	size_t cap;
	char *p;

	if (b->oom || b->cap - b->len >= n)
		return;
	cap = b->cap ? b->cap : 4096;
	while (cap - b->len < n)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = 1;
		return;
	}
	b->p = p;
	b->cap = cap;
}

static void sb_put(sbuf *b, const char *s, size_t n)
{
	sb_reserve(b, n);
	if (b->oom)
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

static void sb_str(sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	sb_reserve(b, 256);
	if (b->oom)
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= b->cap - b->len) {
		b->oom = 1; /* only used for short numeric output */
		return;
	}
	b->len += (size_t)n;
}

/* JSON string of a valid UTF-8 name: escapes '"', '\\' and controls. */
static void sb_json_str(sbuf *b, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	sb_reserve(b, n + 2);
	sb_put(b, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\') {
			char e[2] = { '\\', (char)ch };

			sb_put(b, e, 2);
		} else if (ch < 0x20) {
			char e[6] = { '\\', 'u', '0', '0', hex[ch >> 4],
				      hex[ch & 15] };

			sb_put(b, e, 6);
		} else {
			sb_put(b, (const char *)&ch, 1);
		}
	}
	sb_put(b, "\"", 1);
}

static void sb_hash(sbuf *b, uint64_t h)
{
	char hex[17];

	fmt_hash_hex(h, hex);
	sb_put(b, "\"", 1);
	sb_put(b, hex, 16);
	sb_put(b, "\"", 1);
}

static void sb_u64s(sbuf *b, const uint64_t *v, uint32_t n)
{
	sb_put(b, "[", 1);
	for (uint32_t i = 0; i < n; i++)
		sb_printf(b, i ? ",%llu" : "%llu", (unsigned long long)v[i]);
	sb_put(b, "]", 1);
}

static int sb_finish(sbuf *b, int kind, uint8_t **out, size_t *out_len)
{
	int rc;

	if (b->oom) {
		free(b->p);
		return -ENOMEM;
	}
	rc = fmt_meta_wrap(kind, b->p, b->len, out, out_len);
	free(b->p);
	return rc;
}

static const char *file_kind_name(int kind)
{
	return kind == CKPT_FILE_INDEX ? "index" : "shard";
}

int fmt_index_encode(const fmt_index *ix, uint8_t **out, size_t *out_len)
{
	sbuf b = { 0 };
	char hex[33];

	if (!ix || !out || !out_len || ix->step > JSON_MAX_INT ||
	    ix->stream_bytes > JSON_MAX_INT ||
	    (ix->nfiles && !ix->files) || (ix->ntensors && !ix->tensors) ||
	    (ix->nchunks && !ix->chunks))
		return -EINVAL;
	for (size_t i = 0; i < ix->ntensors; i++) {
		const fmt_tensor_entry *t = &ix->tensors[i];

		if (!t->name || !fmt_name_valid(t->name, t->name_len) ||
		    !ckpt_dtype_name(t->dtype) || t->ndim > CKPT_MAX_NDIM ||
		    t->stream_offset > JSON_MAX_INT || t->nbytes > JSON_MAX_INT)
			return -EINVAL;
		for (uint32_t d = 0; d < t->ndim; d++)
			if (t->shape[d] > JSON_MAX_INT ||
			    t->offset[d] > JSON_MAX_INT ||
			    t->extent[d] > JSON_MAX_INT)
				return -EINVAL;
	}
	for (size_t i = 0; i < ix->nfiles; i++)
		if (ix->files[i].size > JSON_MAX_INT ||
		    !memchr(ix->files[i].name, 0, sizeof(ix->files[i].name)))
			return -EINVAL;
	for (size_t i = 0; i < ix->nchunks; i++)
		if (ix->chunks[i].file_offset > JSON_MAX_INT ||
		    ix->chunks[i].stream_offset > JSON_MAX_INT)
			return -EINVAL;

	for (int i = 0; i < 16; i++)
		snprintf(hex + 2 * i, 3, "%02x", ix->save_id[i]);
	sb_printf(&b, "{\"format\":%d,\"kind\":\"index\",\"step\":%llu,"
		  "\"save_id\":\"%s\",\"host\":%u,\"hosts\":%u,",
		  FMT_VERSION, (unsigned long long)ix->step, hex,
		  ix->host_index, ix->host_count);
	sb_printf(&b, "\"chunk_bytes\":%u,\"stream_bytes\":%llu,\n\"files\":[",
		  ix->chunk_bytes, (unsigned long long)ix->stream_bytes);
	for (size_t i = 0; i < ix->nfiles; i++) {
		const fmt_file_entry *f = &ix->files[i];

		sb_str(&b, i ? ",\n{\"name\":" : "\n{\"name\":");
		sb_json_str(&b, f->name, strlen(f->name));
		sb_printf(&b, ",\"size\":%llu,\"xxh3\":",
			  (unsigned long long)f->size);
		sb_hash(&b, f->xxh3);
		sb_str(&b, "}");
	}
	sb_str(&b, "],\n\"tensors\":[");
	for (size_t i = 0; i < ix->ntensors; i++) {
		const fmt_tensor_entry *t = &ix->tensors[i];

		sb_str(&b, i ? ",\n{\"name\":" : "\n{\"name\":");
		sb_json_str(&b, t->name, t->name_len);
		sb_printf(&b, ",\"dtype\":\"%s\",\"shape\":",
			  ckpt_dtype_name(t->dtype));
		sb_u64s(&b, t->shape, t->ndim);
		sb_str(&b, ",\"offset\":");
		sb_u64s(&b, t->offset, t->ndim);
		sb_str(&b, ",\"extent\":");
		sb_u64s(&b, t->extent, t->ndim);
		sb_printf(&b, ",\"stream_offset\":%llu,\"nbytes\":%llu}",
			  (unsigned long long)t->stream_offset,
			  (unsigned long long)t->nbytes);
	}
	sb_str(&b, "],\n\"chunks\":[");
	for (size_t i = 0; i < ix->nchunks; i++) {
		const fmt_chunk_entry *ch = &ix->chunks[i];

		sb_printf(&b, "%s[%u,%llu,%u,%u,%llu,%u,%u,", i ? ",\n" : "\n",
			  ch->file, (unsigned long long)ch->file_offset,
			  ch->stored_len, ch->raw_len,
			  (unsigned long long)ch->stream_offset, ch->codec,
			  ch->elem_width);
		sb_hash(&b, ch->raw_xxh3);
		sb_str(&b, "]");
	}
	sb_str(&b, "]}\n");
	return sb_finish(&b, FMT_META_INDEX, out, out_len);
}

int fmt_commit_encode(const fmt_commit *cm, uint8_t **out, size_t *out_len)
{
	sbuf b = { 0 };

	if (!cm || !out || !out_len || cm->step > JSON_MAX_INT ||
	    cm->commit_unix_ns < 0 || cm->tensor_count > JSON_MAX_INT ||
	    cm->raw_bytes > JSON_MAX_INT || cm->stored_bytes > JSON_MAX_INT ||
	    (cm->nfiles && !cm->files))
		return -EINVAL;
	for (size_t i = 0; i < cm->nfiles; i++)
		if (cm->files[i].size > JSON_MAX_INT ||
		    !memchr(cm->files[i].name, 0, sizeof(cm->files[i].name)) ||
		    (cm->files[i].kind != CKPT_FILE_INDEX &&
		     cm->files[i].kind != CKPT_FILE_SHARD))
			return -EINVAL;
	sb_printf(&b, "{\"format\":%d,\"kind\":\"commit\",\"step\":%llu,"
		  "\"hosts\":%u,\"commit_unix_ns\":%lld,",
		  FMT_VERSION, (unsigned long long)cm->step, cm->host_count,
		  (long long)cm->commit_unix_ns);
	sb_printf(&b, "\"tensors\":%llu,\"raw_bytes\":%llu,"
		  "\"stored_bytes\":%llu,\n\"files\":[",
		  (unsigned long long)cm->tensor_count,
		  (unsigned long long)cm->raw_bytes,
		  (unsigned long long)cm->stored_bytes);
	for (size_t i = 0; i < cm->nfiles; i++) {
		const fmt_file_entry *f = &cm->files[i];

		sb_str(&b, i ? ",\n{\"name\":" : "\n{\"name\":");
		sb_json_str(&b, f->name, strlen(f->name));
		sb_printf(&b, ",\"size\":%llu,\"xxh3\":",
			  (unsigned long long)f->size);
		sb_hash(&b, f->xxh3);
		sb_printf(&b, ",\"host\":%u,\"kind\":\"%s\"}", f->host,
			  file_kind_name(f->kind));
	}
	sb_str(&b, "]}\n");
	return sb_finish(&b, FMT_META_COMMIT, out, out_len);
}

/* ---- JSON reader ---- */

/* Decoding state: the error buffer and the document kind for messages. */
typedef struct rd {
	char *err;
	size_t errlen;
	const char *doc;
} rd;

static int bad(rd *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int bad(rd *r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return fail(r->err, r->errlen, CKPT_E_CORRUPT, "%s: %s", r->doc, msg);
}

/* Rejects keys not in `keys` (NULL-terminated) and missing keys. */
static int check_keys(rd *r, json_t *obj, const char *const *keys,
		      const char *where)
{
	const char *k;
	json_t *v;
	size_t n = 0;

	if (!json_is_object(obj))
		return bad(r, "%s: not a JSON object", where);
	for (; keys[n]; n++)
		if (!json_object_get(obj, keys[n]))
			return bad(r, "%s: missing key \"%s\"", where, keys[n]);
	json_object_foreach(obj, k, v) {
		size_t i;

		for (i = 0; i < n && strcmp(k, keys[i]) != 0; i++)
			;
		if (i == n)
			return bad(r, "%s: unknown key \"%.64s\"", where, k);
	}
	return 0;
}

/* Non-negative integer <= max. */
static int get_uint(rd *r, json_t *v, uint64_t max, uint64_t *out,
		    const char *where, const char *key)
{
	json_int_t x;

	if (!json_is_integer(v))
		return bad(r, "%s%s: not an integer", where, key);
	x = json_integer_value(v);
	if (x < 0)
		return bad(r, "%s%s: negative value %lld", where, key,
			   (long long)x);
	if ((uint64_t)x > max)
		return bad(r, "%s%s: %lld exceeds %llu", where, key,
			   (long long)x, (unsigned long long)max);
	*out = (uint64_t)x;
	return 0;
}

static int get_key_uint(rd *r, json_t *obj, const char *key, uint64_t max,
			uint64_t *out, const char *where)
{
	char k[64];

	snprintf(k, sizeof(k), "%s\"%s\"", *where ? ": " : "", key);
	return get_uint(r, json_object_get(obj, key), max, out, where, k);
}

static int get_key_hash(rd *r, json_t *obj, const char *key, uint64_t *out,
			const char *where)
{
	json_t *v = json_object_get(obj, key);

	if (!json_is_string(v) || json_string_length(v) != 16 ||
	    fmt_hash_parse(json_string_value(v), out) != 0)
		return bad(r, "%s: \"%s\": not 16 lower-case hex digits",
			   where, key);
	return 0;
}

static int check_header(rd *r, json_t *root, const char *kind)
{
	json_t *f = json_object_get(root, "format");
	json_t *k = json_object_get(root, "kind");

	if (!json_is_integer(f))
		return bad(r, "\"format\": not an integer");
	if (json_integer_value(f) > FMT_VERSION)
		return fail(r->err, r->errlen, CKPT_E_VERSION,
			    "%s: document format %lld, this library reads "
			    "version %d", r->doc,
			    (long long)json_integer_value(f), FMT_VERSION);
	if (json_integer_value(f) != FMT_VERSION)
		return bad(r, "\"format\": %lld, expected %d",
			   (long long)json_integer_value(f), FMT_VERSION);
	if (!json_is_string(k) || strcmp(json_string_value(k), kind) != 0)
		return bad(r, "\"kind\": expected \"%s\"", kind);
	return 0;
}

static json_t *parse(rd *r, const char *body, size_t len, int *rc)
{
	json_error_t je;
	json_t *root;

	root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		*rc = bad(r, "JSON error at line %d column %d: %s", je.line,
			  je.column, je.text);
		return NULL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		*rc = bad(r, "document is not a JSON object");
		return NULL;
	}
	*rc = 0;
	return root;
}

/* Parses "h%05u-f%03u.shard" / "h%05u.index" exactly as the writers
 * produce them (canonical form only). Returns 0 and sets kind/host/file. */
static int parse_file_name(const char *s, int *kind, uint32_t *host,
			   uint32_t *file)
{
	char canon[32];
	uint64_t h = 0, f = 0;
	size_t i = 1, d;

	if (s[0] != 'h')
		return -1;
	for (d = 0; s[i] >= '0' && s[i] <= '9' && d < 10; i++, d++)
		h = h * 10 + (uint64_t)(s[i] - '0');
	if (d == 0 || h >= FMT_MAX_HOSTS)
		return -1;
	if (strcmp(s + i, ".index") == 0) {
		fmt_index_name((uint32_t)h, canon);
		*kind = CKPT_FILE_INDEX;
		f = 0;
	} else {
		if (s[i] != '-' || s[i + 1] != 'f')
			return -1;
		i += 2;
		for (d = 0; s[i] >= '0' && s[i] <= '9' && d < 10; i++, d++)
			f = f * 10 + (uint64_t)(s[i] - '0');
		if (d == 0 || f >= FMT_MAX_FILES_PER_HOST ||
		    strcmp(s + i, ".shard") != 0)
			return -1;
		fmt_shard_name((uint32_t)h, (uint32_t)f, canon);
		*kind = CKPT_FILE_SHARD;
	}
	if (strcmp(canon, s) != 0)
		return -1;
	*host = (uint32_t)h;
	*file = (uint32_t)f;
	return 0;
}

/* name, size, xxh3 of a file entry (common to index and commit). */
static int get_file_common(rd *r, json_t *o, fmt_file_entry *fe,
			   const char *where)
{
	json_t *n = json_object_get(o, "name");
	int rc;

	if (!json_is_string(n) || json_string_length(n) >= sizeof(fe->name) ||
	    strlen(json_string_value(n)) != json_string_length(n))
		return bad(r, "%s: \"name\": not a file name", where);
	memcpy(fe->name, json_string_value(n), json_string_length(n) + 1);
	rc = get_key_uint(r, o, "size", JSON_MAX_INT, &fe->size, where);
	if (!rc)
		rc = get_key_hash(r, o, "xxh3", &fe->xxh3, where);
	return rc;
}

/* ---- index decoding ---- */

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
	const fmt_tensor_entry *x = *(const fmt_tensor_entry *const *)a;
	const fmt_tensor_entry *y = *(const fmt_tensor_entry *const *)b;
	size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
	int c = memcmp(x->name, y->name, n);

	if (c)
		return c;
	return x->name_len < y->name_len ? -1 : x->name_len > y->name_len;
}

static int get_dims(rd *r, json_t *t, const char *key, uint64_t *dims,
		    size_t ndim, const char *where)
{
	json_t *a = json_object_get(t, key);
	char k[48];

	if (!json_is_array(a) || json_array_size(a) != ndim)
		return bad(r, "%s: \"%s\": not an array of %zu integers",
			   where, key, ndim);
	for (size_t d = 0; d < ndim; d++) {
		int rc;

		snprintf(k, sizeof(k), ": \"%s\"[%zu]", key, d);
		rc = get_uint(r, json_array_get(a, d), JSON_MAX_INT, &dims[d],
			      where, k);
		if (rc)
			return rc;
	}
	return 0;
}

static int decode_tensor(rd *r, json_t *t, size_t i, fmt_tensor_entry *te,
			 uint64_t stream_bytes)
{
	static const char *const keys[] = { "name", "dtype", "shape", "offset",
		"extent", "stream_offset", "nbytes", NULL };
	char where[96];
	json_t *v, *shape;
	uint64_t total, want;
	size_t ndim, dsize;
	int rc;

	snprintf(where, sizeof(where), "tensors[%zu]", i);
	rc = check_keys(r, t, keys, where);
	if (rc)
		return rc;
	v = json_object_get(t, "name");
	if (!json_is_string(v))
		return bad(r, "%s: \"name\": not a string", where);
	te->name_len = json_string_length(v);
	if (strlen(json_string_value(v)) != te->name_len ||
	    !fmt_name_valid(json_string_value(v), te->name_len))
		return bad(r, "%s: \"name\": not 1..%d bytes of UTF-8 without "
			   "NUL", where, CKPT_MAX_NAME);
	te->name = malloc(te->name_len + 1);
	if (!te->name)
		return -ENOMEM;
	memcpy(te->name, json_string_value(v), te->name_len + 1);
	/* From here messages name the tensor. */
	snprintf(where, sizeof(where), "tensors[%zu] (\"%.48s%s\")", i,
		 te->name, te->name_len > 48 ? "..." : "");

	v = json_object_get(t, "dtype");
	te->dtype = json_is_string(v) ?
		ckpt_dtype_from_name(json_string_value(v)) : CKPT_DTYPE_INVALID;
	if (te->dtype == CKPT_DTYPE_INVALID)
		return bad(r, "%s: \"dtype\": unknown type", where);
	dsize = ckpt_dtype_size(te->dtype);
	shape = json_object_get(t, "shape");
	if (!json_is_array(shape) || json_array_size(shape) > CKPT_MAX_NDIM)
		return bad(r, "%s: \"shape\": not an array of at most %d "
			   "integers", where, CKPT_MAX_NDIM);
	ndim = json_array_size(shape);
	te->ndim = (uint32_t)ndim;
	if ((rc = get_dims(r, t, "shape", te->shape, ndim, where)) ||
	    (rc = get_dims(r, t, "offset", te->offset, ndim, where)) ||
	    (rc = get_dims(r, t, "extent", te->extent, ndim, where)))
		return rc;
	for (size_t d = 0; d < ndim; d++)
		if (te->offset[d] > te->shape[d] ||
		    te->extent[d] > te->shape[d] - te->offset[d])
			return bad(r, "%s: dimension %zu: slice [%llu, +%llu) "
				   "outside shape %llu", where, d,
				   (unsigned long long)te->offset[d],
				   (unsigned long long)te->extent[d],
				   (unsigned long long)te->shape[d]);
	if (fmt_shape_bytes(te->shape, te->ndim, dsize, &total) != 0 ||
	    total > JSON_MAX_INT)
		return bad(r, "%s: \"shape\": size overflows", where);
	fmt_shape_bytes(te->extent, te->ndim, dsize, &want);
	if ((rc = get_key_uint(r, t, "stream_offset", JSON_MAX_INT,
			       &te->stream_offset, where)) ||
	    (rc = get_key_uint(r, t, "nbytes", JSON_MAX_INT, &te->nbytes,
			       where)))
		return rc;
	if (te->nbytes != want)
		return bad(r, "%s: \"nbytes\" %llu, extent and dtype give "
			   "%llu", where, (unsigned long long)te->nbytes,
			   (unsigned long long)want);
	if (te->stream_offset % FMT_STREAM_ALIGN)
		return bad(r, "%s: \"stream_offset\" %llu not a multiple of "
			   "%u", where, (unsigned long long)te->stream_offset,
			   FMT_STREAM_ALIGN);
	if (te->stream_offset > stream_bytes ||
	    te->nbytes > stream_bytes - te->stream_offset)
		return bad(r, "%s: stream range [%llu, +%llu) beyond "
			   "stream_bytes %llu", where,
			   (unsigned long long)te->stream_offset,
			   (unsigned long long)te->nbytes,
			   (unsigned long long)stream_bytes);
	return 0;
}

/* Tensors' stream ranges must not overlap, names must be unique and the
 * stream may end at most in the padding after the last tensor. */
static int check_tensors(rd *r, fmt_index *ix)
{
	fmt_tensor_entry **byname = NULL;
	uint64_t *ranges = NULL, end = 0, maxend = 0, maxidx = 0;
	size_t n = ix->ntensors;
	int rc = 0;

	if (n == 0) {
		if (ix->stream_bytes != 0)
			rc = bad(r, "\"stream_bytes\" %llu without tensors",
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
			rc = bad(r, "tensors: duplicate name \"%.64s\"",
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
			rc = bad(r, "tensors[%llu] (\"%.64s\"): stream range "
				 "[%llu, +%llu) overlaps tensors[%llu] (\"%.64s\")",
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
		rc = bad(r, "\"stream_bytes\" %llu beyond the last tensor's "
			 "end %llu", (unsigned long long)ix->stream_bytes,
			 (unsigned long long)end);
out:
	free(byname);
	free(ranges);
	return rc;
}

static int decode_chunk(rd *r, json_t *a, size_t k, const fmt_index *ix,
			fmt_chunk_entry *ch)
{
	char where[48];
	uint64_t v[7], want_raw;
	int rc;

	snprintf(where, sizeof(where), "chunks[%zu]", k);
	if (!json_is_array(a) || json_array_size(a) != 8)
		return bad(r, "%s: not an array of 8 values", where);
	static const char *const names[7] = { ": file", ": file_offset",
		": stored_len", ": raw_len", ": stream_offset", ": codec",
		": elem_width" };
	for (int i = 0; i < 7; i++) {
		rc = get_uint(r, json_array_get(a, (size_t)i), JSON_MAX_INT,
			      &v[i], where, names[i]);
		if (rc)
			return rc;
	}
	json_t *h = json_array_get(a, 7);
	if (!json_is_string(h) || json_string_length(h) != 16 ||
	    fmt_hash_parse(json_string_value(h), &ch->raw_xxh3) != 0)
		return bad(r, "%s: xxh3: not 16 lower-case hex digits", where);
	if (v[0] >= ix->nfiles)
		return bad(r, "%s: file %llu, index lists %zu files", where,
			   (unsigned long long)v[0], ix->nfiles);
	if (v[1] < FMT_SHARD_HDR_SIZE || v[1] % FMT_ALIGN)
		return bad(r, "%s: file_offset %llu not a multiple of %u after "
			   "the shard header", where,
			   (unsigned long long)v[1], FMT_ALIGN);
	if (v[4] != (uint64_t)k * ix->chunk_bytes)
		return bad(r, "%s: stream_offset %llu, expected %llu (chunks "
			   "are sorted and contiguous)", where,
			   (unsigned long long)v[4],
			   (unsigned long long)k * ix->chunk_bytes);
	want_raw = ix->stream_bytes - v[4];
	if (want_raw > ix->chunk_bytes)
		want_raw = ix->chunk_bytes;
	if (v[3] != want_raw)
		return bad(r, "%s: raw_len %llu, expected %llu", where,
			   (unsigned long long)v[3],
			   (unsigned long long)want_raw);
	if (v[5] >= CKPT_CODEC_COUNT)
		return bad(r, "%s: unknown codec %llu", where,
			   (unsigned long long)v[5]);
	if (!(v[6] == 1 || v[6] == 2 || v[6] == 4 || v[6] == 8) ||
	    (v[5] == CKPT_CODEC_FLOAT && v[6] == 1))
		return bad(r, "%s: bad elem_width %llu", where,
			   (unsigned long long)v[6]);
	if (v[2] < 1 || v[2] > fmt_codec_bound(v[3]) ||
	    (v[5] == CKPT_CODEC_NONE && v[2] != v[3]))
		return bad(r, "%s: stored_len %llu invalid for raw_len %llu "
			   "and codec %s", where, (unsigned long long)v[2],
			   (unsigned long long)v[3],
			   ckpt_codec_name((int)v[5]));
	if (v[1] > ix->files[v[0]].size ||
	    fmt_chunk_span((uint32_t)v[2]) > ix->files[v[0]].size - v[1])
		return bad(r, "%s: span [%llu, +%llu) beyond the %llu bytes "
			   "of %s", where, (unsigned long long)v[1],
			   (unsigned long long)fmt_chunk_span((uint32_t)v[2]),
			   (unsigned long long)ix->files[v[0]].size,
			   ix->files[v[0]].name);
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
static int check_chunk_spans(rd *r, const fmt_index *ix)
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
			rc = bad(r, "chunks[%llu]: overlaps chunks[%llu] in %s",
				 (unsigned long long)s[3 * k + 2],
				 (unsigned long long)s[3 * k - 1],
				 ix->files[p->file].name);
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

static int decode_index(rd *r, json_t *root, fmt_index *ix)
{
	static const char *const keys[] = { "format", "kind", "step",
		"save_id", "host", "hosts", "chunk_bytes", "stream_bytes",
		"files", "tensors", "chunks", NULL };
	static const char *const fkeys[] = { "name", "size", "xxh3", NULL };
	json_t *files, *tensors, *chunks, *v;
	uint64_t x, nchunks;
	int rc;

	/* The version first: a newer document may well have other keys. */
	if ((rc = check_header(r, root, "index")) ||
	    (rc = check_keys(r, root, keys, "document")) ||
	    (rc = get_key_uint(r, root, "step", JSON_MAX_INT, &ix->step, "")))
		return rc;
	v = json_object_get(root, "save_id");
	if (!json_is_string(v) || json_string_length(v) != 32)
		return bad(r, "\"save_id\": not 32 lower-case hex digits");
	for (int i = 0; i < 32; i++) {
		int d = hexval(json_string_value(v)[i]);

		if (d < 0)
			return bad(r, "\"save_id\": not 32 lower-case hex "
				   "digits");
		if (i % 2 == 0)
			ix->save_id[i / 2] = (uint8_t)(d << 4);
		else
			ix->save_id[i / 2] |= (uint8_t)d;
	}
	if ((rc = get_key_uint(r, root, "hosts", FMT_MAX_HOSTS, &x, "")))
		return rc;
	if (x == 0)
		return bad(r, "\"hosts\": must be at least 1");
	ix->host_count = (uint32_t)x;
	if ((rc = get_key_uint(r, root, "host", ix->host_count - 1, &x, "")))
		return rc;
	ix->host_index = (uint32_t)x;
	if ((rc = get_key_uint(r, root, "chunk_bytes", FMT_MAX_CHUNK, &x, "")))
		return rc;
	if (x < FMT_MIN_CHUNK || x % FMT_ALIGN)
		return bad(r, "\"chunk_bytes\": %llu not a multiple of %u in "
			   "[%u, %u]", (unsigned long long)x, FMT_ALIGN,
			   FMT_MIN_CHUNK, FMT_MAX_CHUNK);
	ix->chunk_bytes = (uint32_t)x;
	if ((rc = get_key_uint(r, root, "stream_bytes", JSON_MAX_INT,
			       &ix->stream_bytes, "")))
		return rc;

	/* files */
	files = json_object_get(root, "files");
	if (!json_is_array(files) ||
	    json_array_size(files) > FMT_MAX_FILES_PER_HOST)
		return bad(r, "\"files\": not an array of at most %u entries",
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
		if ((rc = check_keys(r, json_array_get(files, i), fkeys,
				     where)) ||
		    (rc = get_file_common(r, json_array_get(files, i), fe,
					  where)))
			return rc;
		fmt_shard_name(ix->host_index, (uint32_t)i, want);
		if (strcmp(fe->name, want) != 0)
			return bad(r, "%s: name \"%s\", expected \"%s\"", where,
				   fe->name, want);
		if (fe->size < FMT_SHARD_HDR_SIZE)
			return bad(r, "%s: size %llu smaller than the shard "
				   "header", where,
				   (unsigned long long)fe->size);
		fe->host = ix->host_index;
		fe->kind = CKPT_FILE_SHARD;
	}

	/* tensors */
	tensors = json_object_get(root, "tensors");
	if (!json_is_array(tensors))
		return bad(r, "\"tensors\": not an array");
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
		return bad(r, "\"chunks\": not an array");
	nchunks = (ix->stream_bytes + ix->chunk_bytes - 1) / ix->chunk_bytes;
	if (json_array_size(chunks) != nchunks)
		return bad(r, "\"chunks\": %zu entries, stream_bytes %llu "
			   "needs %llu", json_array_size(chunks),
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
	rd r = { err, errlen, "index" };
	const char *body = NULL;
	size_t len = 0;
	json_t *root;
	int rc;

	if (!ix)
		return -EINVAL;
	memset(ix, 0, sizeof(*ix));
	rc = fmt_meta_unwrap(FMT_META_INDEX, file, file_len, &body, &len, err,
			     errlen);
	if (rc)
		return rc;
	root = parse(&r, body, len, &rc);
	if (!root)
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
	memset(ix, 0, sizeof(*ix));
}

/* ---- commit decoding ---- */

static int cmp_file_name(const void *a, const void *b)
{
	const fmt_file_entry *x = *(const fmt_file_entry *const *)a;
	const fmt_file_entry *y = *(const fmt_file_entry *const *)b;

	return strcmp(x->name, y->name);
}

static int check_commit_files(rd *r, fmt_commit *cm)
{
	fmt_file_entry **sorted;
	uint8_t *has_index = NULL;
	uint64_t total = 0;
	size_t nindex = 0;
	int rc = 0;

	/* Exactly one index per host: at least host_count entries, which
	 * also bounds the allocation below by the document size. */
	if (cm->nfiles < cm->host_count)
		return bad(r, "\"files\": %zu entries cannot hold an index for "
			   "each of %u hosts", cm->nfiles, cm->host_count);
	sorted = malloc(cm->nfiles * sizeof(*sorted));
	has_index = calloc(cm->host_count, 1);
	if (!sorted || !has_index) {
		rc = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < cm->nfiles; i++) {
		sorted[i] = &cm->files[i];
		if (cm->files[i].kind == CKPT_FILE_INDEX) {
			if (has_index[cm->files[i].host]++ == 0)
				nindex++;
		}
		if (cm->files[i].size > JSON_MAX_INT - total) {
			rc = bad(r, "\"files\": total size overflows");
			goto out;
		}
		total += cm->files[i].size;
	}
	qsort(sorted, cm->nfiles, sizeof(*sorted), cmp_file_name);
	for (size_t i = 1; i < cm->nfiles; i++) {
		if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
			rc = bad(r, "\"files\": duplicate \"%s\"",
				 sorted[i]->name);
			goto out;
		}
	}
	if (nindex != cm->host_count) {
		for (uint32_t h = 0; h < cm->host_count; h++) {
			if (!has_index[h]) {
				rc = bad(r, "\"files\": no index of host %u",
					 h);
				goto out;
			}
		}
	}
	if (total != cm->stored_bytes)
		rc = bad(r, "\"stored_bytes\" %llu, files sum to %llu",
			 (unsigned long long)cm->stored_bytes,
			 (unsigned long long)total);
out:
	free(sorted);
	free(has_index);
	return rc;
}

static int decode_commit(rd *r, json_t *root, fmt_commit *cm)
{
	static const char *const keys[] = { "format", "kind", "step", "hosts",
		"commit_unix_ns", "tensors", "raw_bytes", "stored_bytes",
		"files", NULL };
	static const char *const fkeys[] = { "name", "size", "xxh3", "host",
		"kind", NULL };
	json_t *files;
	uint64_t x;
	int rc;

	if ((rc = check_header(r, root, "commit")) ||
	    (rc = check_keys(r, root, keys, "document")) ||
	    (rc = get_key_uint(r, root, "step", JSON_MAX_INT, &cm->step, "")) ||
	    (rc = get_key_uint(r, root, "hosts", FMT_MAX_HOSTS, &x, "")))
		return rc;
	if (x == 0)
		return bad(r, "\"hosts\": must be at least 1");
	cm->host_count = (uint32_t)x;
	if ((rc = get_key_uint(r, root, "commit_unix_ns", JSON_MAX_INT, &x,
			       "")))
		return rc;
	cm->commit_unix_ns = (int64_t)x;
	if ((rc = get_key_uint(r, root, "tensors", JSON_MAX_INT,
			       &cm->tensor_count, "")) ||
	    (rc = get_key_uint(r, root, "raw_bytes", JSON_MAX_INT,
			       &cm->raw_bytes, "")) ||
	    (rc = get_key_uint(r, root, "stored_bytes", JSON_MAX_INT,
			       &cm->stored_bytes, "")))
		return rc;
	files = json_object_get(root, "files");
	if (!json_is_array(files))
		return bad(r, "\"files\": not an array");
	cm->nfiles = json_array_size(files);
	if (cm->nfiles) {
		cm->files = calloc(cm->nfiles, sizeof(*cm->files));
		if (!cm->files)
			return -ENOMEM;
	}
	for (size_t i = 0; i < cm->nfiles; i++) {
		json_t *o = json_array_get(files, i), *k;
		fmt_file_entry *fe = &cm->files[i];
		uint32_t host, fno;
		char where[32];
		int kind;

		snprintf(where, sizeof(where), "files[%zu]", i);
		if ((rc = check_keys(r, o, fkeys, where)) ||
		    (rc = get_file_common(r, o, fe, where)) ||
		    (rc = get_key_uint(r, o, "host", cm->host_count - 1, &x,
				       where)))
			return rc;
		fe->host = (uint32_t)x;
		k = json_object_get(o, "kind");
		if (!json_is_string(k))
			return bad(r, "%s: \"kind\": not a string", where);
		if (strcmp(json_string_value(k), "index") == 0)
			fe->kind = CKPT_FILE_INDEX;
		else if (strcmp(json_string_value(k), "shard") == 0)
			fe->kind = CKPT_FILE_SHARD;
		else
			return bad(r, "%s: \"kind\": not \"index\" or "
				   "\"shard\"", where);
		if (parse_file_name(fe->name, &kind, &host, &fno) != 0 ||
		    kind != fe->kind || host != fe->host)
			return bad(r, "%s: name \"%s\" is not the name of "
				   "a %s file of host %u", where, fe->name,
				   json_string_value(k), fe->host);
		if (fe->size < (kind == CKPT_FILE_INDEX ? FMT_META_HDR_SIZE :
							  FMT_SHARD_HDR_SIZE))
			return bad(r, "%s: size %llu too small for a %s file",
				   where, (unsigned long long)fe->size,
				   json_string_value(k));
	}
	return check_commit_files(r, cm);
}

int fmt_commit_decode(const uint8_t *file, size_t file_len, fmt_commit *cm,
		      char *err, size_t errlen)
{
	rd r = { err, errlen, "commit" };
	const char *body = NULL;
	size_t len = 0;
	json_t *root;
	int rc;

	if (!cm)
		return -EINVAL;
	memset(cm, 0, sizeof(*cm));
	rc = fmt_meta_unwrap(FMT_META_COMMIT, file, file_len, &body, &len, err,
			     errlen);
	if (rc)
		return rc;
	root = parse(&r, body, len, &rc);
	if (!root)
		return rc;
	rc = decode_commit(&r, root, cm);
	json_decref(root);
	if (rc)
		fmt_commit_free(cm);
	return rc;
}

void fmt_commit_free(fmt_commit *cm)
{
	if (!cm)
		return;
	free(cm->files);
	memset(cm, 0, sizeof(*cm));
}
