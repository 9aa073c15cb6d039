/*
 * fmt_json.h - the JSON writer and reader shared by the index (fmt_index.c)
 * and commit (fmt_commit.c) documents; internal to format/.
 *
 * Writer: a growable buffer that remembers an allocation failure instead
 * of reporting it at every call, so that an encoder writes its document
 * straight through and checks once, in fmt_sb_finish, which also frames it.
 *
 * Reader: jansson parses; these helpers check one key or value each and
 * report CKPT_E_CORRUPT with a message that starts with the document kind
 * ("index: tensors[3] (\"w\"): ..."), so that the decoders stay a list of
 * checks.
 */
#ifndef CKPT_FMT_JSON_H
#define CKPT_FMT_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "fmt.h"
#include "fmt_internal.h"

/* Largest integer a document may hold (jansson's json_int_t is signed). */
#define FMT_JSON_MAX_INT ((uint64_t)INT64_MAX)

/* ---- writer ---- */
typedef struct fmt_sbuf {
	char *p;
	size_t len, cap;
	int oom;
} fmt_sbuf;

void fmt_sb_put(fmt_sbuf *b, const char *s, size_t n);
void fmt_sb_str(fmt_sbuf *b, const char *s);
/* Short output only (numbers, fixed keys): at most 255 bytes. */
void fmt_sb_printf(fmt_sbuf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* JSON string of a valid UTF-8 name: escapes '"', '\\' and controls. */
void fmt_sb_json_str(fmt_sbuf *b, const char *s, size_t n);
/* "16 hex digits" */
void fmt_sb_hash(fmt_sbuf *b, uint64_t h);
/* [v0,v1,...] */
void fmt_sb_u64s(fmt_sbuf *b, const uint64_t *v, uint32_t n);
/* `{"name":...,"size":...,"xxh3":...` of a file entry, preceded by a line
 * break (and a comma unless first); the caller closes the object. */
void fmt_sb_file(fmt_sbuf *b, const fmt_file_entry *f, int first);
/* `"reason":"<name>",` for a reason other than unspecified, else nothing
 * (documents without the key stay readable by every version-1 reader). */
void fmt_sb_reason(fmt_sbuf *b, int32_t reason);
/* Frames the document as a file of `kind` (fmt_meta_wrap) and frees the
 * buffer; -ENOMEM if any write failed. */
int fmt_sb_finish(fmt_sbuf *b, int kind, uint32_t version, uint8_t **out,
		  size_t *out_len);
/* A 128-bit hash as 32 hex digits, high half first. */
void fmt_sb_hash128(fmt_sbuf *b, const uint64_t h[2]);

/* ---- reader ---- */
/* Decoding state: the error buffer and the document kind for messages. */
typedef struct fmt_jrd {
	char *err;
	size_t errlen;
	const char *doc;
	uint32_t version; /* fmt_jr_load: the frame's; fmt_jr_header checks
			     "format" equals it */
} fmt_jrd;

/* Writes "<doc>: <message>" and returns CKPT_E_CORRUPT. */
int fmt_jr_bad(fmt_jrd *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/*
 * Checks the frame of a whole file (fmt_meta_unwrap) and parses its body;
 * returns 0 and the root object (the caller json_decref()s it) or an
 * error and NULL.
 */
int fmt_jr_load(fmt_jrd *r, int kind, const uint8_t *file, size_t file_len,
		json_t **root);
/* "format" is a version this library reads (CKPT_E_VERSION if newer)
 * and equals the frame's; "kind" is `kind`. */
int fmt_jr_header(fmt_jrd *r, json_t *root, const char *kind);
/* Rejects keys not in `keys` (NULL-terminated) and missing keys. */
int fmt_jr_keys(fmt_jrd *r, json_t *obj, const char *const *keys,
		const char *where);
/* The same, also allowing the optional keys `opt` (NULL-terminated). */
int fmt_jr_keys_opt(fmt_jrd *r, json_t *obj, const char *const *keys,
		    const char *const *opt, const char *where);
/* The optional "reason" of an index or commit document (SPEC.md 7, 8):
 * absent or a name this version does not know: CKPT_REASON_UNSPECIFIED;
 * not a string: corrupt. */
int fmt_jr_reason(fmt_jrd *r, json_t *root, int32_t *reason);
/* A non-negative integer <= max; `where` and `key` name it in messages. */
int fmt_jr_uint(fmt_jrd *r, json_t *v, uint64_t max, uint64_t *out,
		const char *where, const char *key);
int fmt_jr_key_uint(fmt_jrd *r, json_t *obj, const char *key, uint64_t max,
		    uint64_t *out, const char *where);
int fmt_jr_key_hash(fmt_jrd *r, json_t *obj, const char *key, uint64_t *out,
		    const char *where);
/* name, size, xxh3 of a file entry (common to index and commit). */
int fmt_jr_file(fmt_jrd *r, json_t *o, fmt_file_entry *fe, const char *where);

#endif /* CKPT_FMT_JSON_H */
