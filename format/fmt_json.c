/*
 * fmt_json.c - the JSON writer and reader helpers of the metadata
 * documents (see fmt_json.h). The writer is hand-made (fixed key order,
 * one array entry per line: fast for indexes with many chunks); the reader
 * wraps jansson and turns every type or range error into CKPT_E_CORRUPT
 * with a message naming the document, the entry and the key.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt_json.h"

/* ---- JSON writer ---- */

static void sb_reserve(fmt_sbuf *b, size_t n)
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

void fmt_sb_put(fmt_sbuf *b, const char *s, size_t n)
{
	sb_reserve(b, n);
	if (b->oom)
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
}

void fmt_sb_str(fmt_sbuf *b, const char *s)
{
	fmt_sb_put(b, s, strlen(s));
}

void fmt_sb_printf(fmt_sbuf *b, const char *fmt, ...)
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

void fmt_sb_json_str(fmt_sbuf *b, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";

	sb_reserve(b, n + 2);
	fmt_sb_put(b, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];

		if (ch == '"' || ch == '\\') {
			char e[2] = { '\\', (char)ch };

			fmt_sb_put(b, e, 2);
		} else if (ch < 0x20) {
			char e[6] = { '\\', 'u', '0', '0', hex[ch >> 4],
				      hex[ch & 15] };

			fmt_sb_put(b, e, 6);
		} else {
			fmt_sb_put(b, (const char *)&ch, 1);
		}
	}
	fmt_sb_put(b, "\"", 1);
}

void fmt_sb_hash(fmt_sbuf *b, uint64_t h)
{
	char hex[17];

	fmt_hash_hex(h, hex);
	fmt_sb_put(b, "\"", 1);
	fmt_sb_put(b, hex, 16);
	fmt_sb_put(b, "\"", 1);
}

void fmt_sb_u64s(fmt_sbuf *b, const uint64_t *v, uint32_t n)
{
	fmt_sb_put(b, "[", 1);
	for (uint32_t i = 0; i < n; i++)
		fmt_sb_printf(b, i ? ",%llu" : "%llu",
			      (unsigned long long)v[i]);
	fmt_sb_put(b, "]", 1);
}

void fmt_sb_file(fmt_sbuf *b, const fmt_file_entry *f, int first)
{
	fmt_sb_str(b, first ? "\n{\"name\":" : ",\n{\"name\":");
	fmt_sb_json_str(b, f->name, strlen(f->name));
	fmt_sb_printf(b, ",\"size\":%llu,\"xxh3\":",
		      (unsigned long long)f->size);
	fmt_sb_hash(b, f->xxh3);
}

void fmt_sb_reason(fmt_sbuf *b, int32_t reason)
{
	if (reason > CKPT_REASON_UNSPECIFIED)
		fmt_sb_printf(b, "\"reason\":\"%s\",",
			      ckpt_reason_name(reason));
}

void fmt_sb_hash128(fmt_sbuf *b, const uint64_t h[2])
{
	char hi[17], lo[17];

	fmt_hash_hex(h[0], hi);
	fmt_hash_hex(h[1], lo);
	fmt_sb_printf(b, "\"%s%s\"", hi, lo);
}

int fmt_sb_finish(fmt_sbuf *b, int kind, uint32_t version, uint8_t **out,
		  size_t *out_len)
{
	int rc;

	if (b->oom) {
		free(b->p);
		return -ENOMEM;
	}
	rc = fmt_meta_wrap_v(kind, version, b->p, b->len, out, out_len);
	free(b->p);
	return rc;
}

/* ---- JSON reader ---- */

int fmt_jr_bad(fmt_jrd *r, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return fmt_fail(r->err, r->errlen, CKPT_E_CORRUPT, "%s: %s", r->doc,
			msg);
}

int fmt_jr_keys(fmt_jrd *r, json_t *obj, const char *const *keys,
		const char *where)
{
	return fmt_jr_keys_opt(r, obj, keys, NULL, where);
}

static int key_in(const char *k, const char *const *list)
{
	for (; list && *list; list++)
		if (!strcmp(k, *list))
			return 1;
	return 0;
}

int fmt_jr_reason(fmt_jrd *r, json_t *root, int32_t *reason)
{
	json_t *v = json_object_get(root, "reason");
	int x;

	*reason = CKPT_REASON_UNSPECIFIED;
	if (!v)
		return 0;
	if (!json_is_string(v))
		return fmt_jr_bad(r, "\"reason\": not a string");
	x = fmt_reason_from_name(json_string_value(v));
	if (x > 0)
		*reason = x;
	return 0;
}

int fmt_jr_keys_opt(fmt_jrd *r, json_t *obj, const char *const *keys,
		    const char *const *opt, const char *where)
{
	const char *k;
	json_t *v;
	size_t n = 0;

	if (!json_is_object(obj))
		return fmt_jr_bad(r, "%s: not a JSON object", where);
	for (; keys[n]; n++)
		if (!json_object_get(obj, keys[n]))
			return fmt_jr_bad(r, "%s: missing key \"%s\"", where,
					  keys[n]);
	json_object_foreach(obj, k, v) {
		size_t i;

		for (i = 0; i < n && strcmp(k, keys[i]) != 0; i++)
			;
		if (i == n && !key_in(k, opt))
			return fmt_jr_bad(r, "%s: unknown key \"%.64s\"", where,
					  k);
	}
	return 0;
}

int fmt_jr_uint(fmt_jrd *r, json_t *v, uint64_t max, uint64_t *out,
		const char *where, const char *key)
{
	json_int_t x;

	if (!json_is_integer(v))
		return fmt_jr_bad(r, "%s%s: not an integer", where, key);
	x = json_integer_value(v);
	if (x < 0)
		return fmt_jr_bad(r, "%s%s: negative value %lld", where, key,
				  (long long)x);
	if ((uint64_t)x > max)
		return fmt_jr_bad(r, "%s%s: %lld exceeds %llu", where, key,
				  (long long)x, (unsigned long long)max);
	*out = (uint64_t)x;
	return 0;
}

int fmt_jr_key_uint(fmt_jrd *r, json_t *obj, const char *key, uint64_t max,
		    uint64_t *out, const char *where)
{
	char k[64];

	snprintf(k, sizeof(k), "%s\"%s\"", *where ? ": " : "", key);
	return fmt_jr_uint(r, json_object_get(obj, key), max, out, where, k);
}

int fmt_jr_key_hash(fmt_jrd *r, json_t *obj, const char *key, uint64_t *out,
		    const char *where)
{
	json_t *v = json_object_get(obj, key);

	if (!json_is_string(v) || json_string_length(v) != 16 ||
	    fmt_hash_parse(json_string_value(v), out) != 0)
		return fmt_jr_bad(r, "%s: \"%s\": not 16 lower-case hex digits",
				  where, key);
	return 0;
}

int fmt_jr_header(fmt_jrd *r, json_t *root, const char *kind)
{
	json_t *f = json_object_get(root, "format");
	json_t *k = json_object_get(root, "kind");

	if (!json_is_integer(f))
		return fmt_jr_bad(r, "\"format\": not an integer");
	if (json_integer_value(f) > FMT_VERSION_MAX)
		return fmt_fail(r->err, r->errlen, CKPT_E_VERSION,
				"%s: document format %lld, this library reads "
				"version %d",
				r->doc, (long long)json_integer_value(f),
				FMT_VERSION_MAX);
	if (json_integer_value(f) != (json_int_t)r->version)
		return fmt_jr_bad(r, "\"format\": %lld, the frame says %u",
				  (long long)json_integer_value(f), r->version);
	if (!json_is_string(k) || strcmp(json_string_value(k), kind) != 0)
		return fmt_jr_bad(r, "\"kind\": expected \"%s\"", kind);
	return 0;
}

/*
 * jansson reports some allocation failures as syntax errors ("string or
 * '}' expected"), others with no error text, and some not at all (its
 * lexer drops a byte it cannot store: a string comes back one byte
 * short). Its allocations go through a wrapper that notes a failure in
 * the calling thread, so that fmt_jr_load() tells -ENOMEM from a bad
 * document. The wrapper chains to the functions installed before
 * (malloc and free unless the application set others), so blocks stay
 * compatible with them.
 */
static json_malloc_t json_prev_malloc;
static _Thread_local int json_alloc_failed;
static pthread_once_t json_hook_once = PTHREAD_ONCE_INIT;

static void *json_malloc_noted(size_t n)
{
	void *p = json_prev_malloc(n);

	if (!p)
		json_alloc_failed = 1;
	return p;
}

static void json_hook_install(void)
{
	json_free_t prev_free;

	json_get_alloc_funcs(&json_prev_malloc, &prev_free);
	json_set_alloc_funcs(json_malloc_noted, prev_free);
}

int fmt_jr_load(fmt_jrd *r, int kind, const uint8_t *file, size_t file_len,
		json_t **root)
{
	const char *body = NULL;
	json_error_t je;
	size_t len = 0;
	int rc;

	*root = NULL;
	rc = fmt_meta_unwrap(kind, file, file_len, &body, &len, r->err,
			     r->errlen);
	if (rc)
		return rc;
	r->version = fmt_get_u32(file + 8);
	pthread_once(&json_hook_once, json_hook_install);
	json_alloc_failed = 0;
	memset(&je, 0, sizeof(je));
	*root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
	/* after any failed allocation even a returned document is suspect */
	if (*root && json_alloc_failed) {
		json_decref(*root);
		*root = NULL;
	}
	if (!*root && (json_alloc_failed ||
		       json_error_code(&je) == json_error_out_of_memory ||
		       !je.text[0]))
		return fmt_fail(r->err, r->errlen, -ENOMEM,
				"%s: out of memory parsing JSON", r->doc);
	if (!*root)
		return fmt_jr_bad(r, "JSON error at line %d column %d: %s",
				  je.line, je.column, je.text);
	if (!json_is_object(*root)) {
		json_decref(*root);
		*root = NULL;
		return fmt_jr_bad(r, "document is not a JSON object");
	}
	return 0;
}

int fmt_jr_file(fmt_jrd *r, json_t *o, fmt_file_entry *fe, const char *where)
{
	json_t *n = json_object_get(o, "name");
	int rc;

	if (!json_is_string(n) || json_string_length(n) >= sizeof(fe->name) ||
	    strlen(json_string_value(n)) != json_string_length(n))
		return fmt_jr_bad(r, "%s: \"name\": not a file name", where);
	memcpy(fe->name, json_string_value(n), json_string_length(n) + 1);
	rc = fmt_jr_key_uint(r, o, "size", FMT_JSON_MAX_INT, &fe->size, where);
	if (!rc)
		rc = fmt_jr_key_hash(r, o, "xxh3", &fe->xxh3, where);
	return rc;
}
