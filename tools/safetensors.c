/*
 * safetensors.c - safetensors reader/writer for ckptctl (see safetensors.h).
 *
 * The reader maps the whole file and hands out pointers into the mapping,
 * so importing a file larger than memory never copies it twice. All
 * validation happens in st_open(): after it succeeds every tensor's
 * [begin, end) lies inside the byte buffer, no two non-empty tensors
 * overlap and end - begin == product(shape) * dtype size.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct {
	int dtype;
	const char *name;
} st_dtypes[] = {
	{ CKPT_BOOL, "BOOL" },      { CKPT_U8, "U8" },
	{ CKPT_I8, "I8" },          { CKPT_U16, "U16" },
	{ CKPT_I16, "I16" },        { CKPT_U32, "U32" },
	{ CKPT_I32, "I32" },        { CKPT_U64, "U64" },
	{ CKPT_I64, "I64" },        { CKPT_F16, "F16" },
	{ CKPT_BF16, "BF16" },      { CKPT_F32, "F32" },
	{ CKPT_F64, "F64" },        { CKPT_F8E4M3, "F8_E4M3" },
	{ CKPT_F8E5M2, "F8_E5M2" },
};

#define ST_NDTYPES (sizeof(st_dtypes) / sizeof(st_dtypes[0]))

/* Element sizes, local so the tool does not depend on the library for a
 * table this small (and the parser can run before the library is up). */
static size_t st_elem_size(int dtype)
{
	switch (dtype) {
	case CKPT_BOOL:
	case CKPT_U8:
	case CKPT_I8:
	case CKPT_F8E4M3:
	case CKPT_F8E5M2:
		return 1;
	case CKPT_U16:
	case CKPT_I16:
	case CKPT_F16:
	case CKPT_BF16:
		return 2;
	case CKPT_U32:
	case CKPT_I32:
	case CKPT_F32:
		return 4;
	case CKPT_U64:
	case CKPT_I64:
	case CKPT_F64:
		return 8;
	default:
		return 0;
	}
}

const char *st_dtype_name(int ckpt_dtype)
{
	for (size_t i = 0; i < ST_NDTYPES; i++)
		if (st_dtypes[i].dtype == ckpt_dtype)
			return st_dtypes[i].name;
	return NULL;
}

int st_dtype_from_name(const char *name)
{
	for (size_t i = 0; i < ST_NDTYPES; i++)
		if (strcmp(st_dtypes[i].name, name) == 0)
			return st_dtypes[i].dtype;
	return CKPT_DTYPE_INVALID;
}

/* ---- escaping ------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (1..4), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, uint32_t *cp)
{
	unsigned char c = s[0];
	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if (c >= 0xc2 && c <= 0xdf) {
		if ((s[1] & 0xc0) != 0x80)
			return 0;
		*cp = ((uint32_t)(c & 0x1f) << 6) | (s[1] & 0x3f);
		return 2;
	}
	if (c >= 0xe0 && c <= 0xef) {
		if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
			return 0;
		if (c == 0xe0 && s[1] < 0xa0)
			return 0; /* overlong */
		if (c == 0xed && s[1] > 0x9f)
			return 0; /* surrogate */
		*cp = ((uint32_t)(c & 0x0f) << 12) |
		      ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
		return 3;
	}
	if (c >= 0xf0 && c <= 0xf4) {
		if ((s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 ||
		    (s[3] & 0xc0) != 0x80)
			return 0;
		if (c == 0xf0 && s[1] < 0x90)
			return 0;
		if (c == 0xf4 && s[1] > 0x8f)
			return 0;
		*cp = ((uint32_t)(c & 0x07) << 18) |
		      ((uint32_t)(s[1] & 0x3f) << 12) |
		      ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
		return 4;
	}
	return 0;
}

/* Code points that are printable but can reorder or hide text on a
 * terminal (bidi controls, line separators): shown as \uXXXX. */
static int cp_sneaky(uint32_t cp)
{
	return (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 ||
	       (cp >= 0x202a && cp <= 0x202e) ||
	       (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200e || cp == 0x200f ||
	       cp == 0xfeff;
}

char *st_escape(const char *str, char *buf, size_t len)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t o = 0;

	if (len == 0)
		return buf;
	while (*s) {
		char tmp[16];
		size_t tl, adv;
		uint32_t cp;

		adv = utf8_seq(s, &cp);
		if (adv == 0) {
			snprintf(tmp, sizeof(tmp), "\\x%02x", s[0]);
			adv = 1;
		} else if (cp == '\\') {
			strcpy(tmp, "\\\\");
		} else if (cp == '\n') {
			strcpy(tmp, "\\n");
		} else if (cp == '\t') {
			strcpy(tmp, "\\t");
		} else if (cp == '\r') {
			strcpy(tmp, "\\r");
		} else if (cp < 0x20 || cp == 0x7f) {
			snprintf(tmp, sizeof(tmp), "\\x%02x", (unsigned)cp);
		} else if (cp_sneaky(cp)) {
			snprintf(tmp, sizeof(tmp), "\\u%04x", (unsigned)cp);
		} else {
			memcpy(tmp, s, adv);
			tmp[adv] = '\0';
		}
		tl = strlen(tmp);
		if (o + tl + 4 > len) { /* room for "..." and NUL */
			if (o + 4 <= len) {
				memcpy(buf + o, "...", 3);
				o += 3;
			}
			break;
		}
		memcpy(buf + o, tmp, tl);
		o += tl;
		s += adv;
	}
	buf[o] = '\0';
	return buf;
}

/* ---- reader ----------------------------------------------------------- */

static int st_fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int st_fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

static int get_u64(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -1;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int cmp_begin(const void *a, const void *b)
{
	const st_tensor *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return 0;
}

/* Validates one header entry into *t. */
static int parse_entry(st_file *f, const char *path, const char *name,
		       json_t *v, st_tensor *t, char *err, size_t errlen)
{
	char esc[256];
	json_t *dt, *shape, *offs;
	uint64_t n = 1, esize;
	size_t i;

	st_escape(name, esc, sizeof(esc));
	if (name[0] == '\0')
		return st_fail(err, errlen,
			       "%s: tensor \"\": empty names are not supported",
			       path);
	if (strlen(name) > CKPT_MAX_NAME)
		return st_fail(err, errlen,
			       "%s: tensor \"%s\": name longer than %d bytes",
			       path, esc, CKPT_MAX_NAME);
	if (!json_is_object(v))
		return st_fail(err, errlen,
			       "%s: tensor \"%s\": entry is not a JSON object",
			       path, esc);
	dt = json_object_get(v, "dtype");
	shape = json_object_get(v, "shape");
	offs = json_object_get(v, "data_offsets");
	if (!json_is_string(dt))
		return st_fail(
			err, errlen,
			"%s: tensor \"%s\": missing or non-string \"dtype\"",
			path, esc);
	t->name = name;
	t->dtype = st_dtype_from_name(json_string_value(dt));
	if (t->dtype == CKPT_DTYPE_INVALID) {
		char d[64];
		return st_fail(err, errlen,
			       "%s: tensor \"%s\": unsupported dtype \"%s\"",
			       path, esc,
			       st_escape(json_string_value(dt), d, sizeof(d)));
	}
	esize = st_elem_size(t->dtype);
	if (!json_is_array(shape))
		return st_fail(
			err, errlen,
			"%s: tensor \"%s\": missing or non-array \"shape\"",
			path, esc);
	if (json_array_size(shape) > CKPT_MAX_NDIM)
		return st_fail(
			err, errlen,
			"%s: tensor \"%s\": %zu dimensions (at most %d supported)",
			path, esc, json_array_size(shape), CKPT_MAX_NDIM);
	t->ndim = (uint32_t)json_array_size(shape);
	for (i = 0; i < t->ndim; i++) {
		if (get_u64(json_array_get(shape, i), &t->shape[i]))
			return st_fail(
				err, errlen,
				"%s: tensor \"%s\": shape[%zu] is not a non-negative integer",
				path, esc, i);
	}
	/* Element count with overflow checks; an empty dimension ends it. */
	for (i = 0; i < t->ndim; i++) {
		if (t->shape[i] == 0) {
			n = 0;
			break;
		}
	}
	for (i = 0; n && i < t->ndim; i++) {
		if (n > UINT64_MAX / t->shape[i])
			return st_fail(err, errlen,
				       "%s: tensor \"%s\": shape overflows",
				       path, esc);
		n *= t->shape[i];
	}
	if (n > UINT64_MAX / esize)
		return st_fail(err, errlen,
			       "%s: tensor \"%s\": shape overflows", path, esc);
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    get_u64(json_array_get(offs, 0), &t->begin) ||
	    get_u64(json_array_get(offs, 1), &t->end))
		return st_fail(
			err, errlen,
			"%s: tensor \"%s\": \"data_offsets\" must be [begin, end] "
			"non-negative integers",
			path, esc);
	if (t->begin > t->end || t->end > f->data_len)
		return st_fail(
			err, errlen,
			"%s: tensor \"%s\": data_offsets [%llu, %llu] outside the "
			"byte buffer (%llu bytes)",
			path, esc, (unsigned long long)t->begin,
			(unsigned long long)t->end,
			(unsigned long long)f->data_len);
	if (t->end - t->begin != n * esize)
		return st_fail(
			err, errlen,
			"%s: tensor \"%s\": data_offsets cover %llu bytes but "
			"dtype %s and shape need %llu",
			path, esc, (unsigned long long)(t->end - t->begin),
			json_string_value(dt), (unsigned long long)(n * esize));
	return 0;
}

int st_open(st_file *f, const char *path, char *err, size_t errlen)
{
	struct stat st;
	json_error_t jerr;
	const char *key;
	json_t *v;
	size_t i, n;
	uint64_t hl = 0;

	memset(f, 0, sizeof(*f));
	f->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (f->fd < 0) {
		st_fail(err, errlen, "%s: %s", path, strerror(errno));
		goto fail;
	}
	if (fstat(f->fd, &st) < 0) {
		st_fail(err, errlen, "%s: %s", path, strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		st_fail(err, errlen, "%s: not a regular file", path);
		goto fail;
	}
	f->file_size = (uint64_t)st.st_size;
	if (f->file_size < 8) {
		st_fail(err, errlen,
			"%s: too short for a safetensors file (%llu bytes)",
			path, (unsigned long long)f->file_size);
		goto fail;
	}
	f->map = mmap(NULL, f->file_size, PROT_READ, MAP_PRIVATE, f->fd, 0);
	if (f->map == MAP_FAILED) {
		f->map = NULL;
		st_fail(err, errlen, "%s: mmap: %s", path, strerror(errno));
		goto fail;
	}
	for (i = 0; i < 8; i++)
		hl |= (uint64_t)f->map[i] << (8 * i);
	if (hl > f->file_size - 8) {
		st_fail(err, errlen,
			"%s: header length %llu exceeds the file size (%llu bytes)",
			path, (unsigned long long)hl,
			(unsigned long long)f->file_size);
		goto fail;
	}
	if (hl > ST_MAX_HEADER || hl < 2) {
		st_fail(err, errlen, "%s: implausible header length %llu", path,
			(unsigned long long)hl);
		goto fail;
	}
	f->header_len = hl;
	f->data = f->map + 8 + hl;
	f->data_len = f->file_size - 8 - hl;

	f->root = json_loadb((const char *)f->map + 8, hl,
			     JSON_REJECT_DUPLICATES, &jerr);
	if (!f->root) {
		st_fail(err, errlen,
			"%s: header is not valid JSON: %s (line %d, column %d)",
			path, jerr.text, jerr.line, jerr.column);
		goto fail;
	}
	if (!json_is_object(f->root)) {
		st_fail(err, errlen, "%s: header is not a JSON object", path);
		goto fail;
	}
	n = json_object_size(f->root);
	f->tensors = calloc(n ? n : 1, sizeof(*f->tensors));
	if (!f->tensors) {
		st_fail(err, errlen, "%s: out of memory", path);
		goto fail;
	}
	json_object_foreach (f->root, key, v) {
		if (strcmp(key, "__metadata__") == 0) {
			const char *mk;
			json_t *mv;
			if (!json_is_object(v)) {
				st_fail(err, errlen,
					"%s: \"__metadata__\" is not a JSON object",
					path);
				goto fail;
			}
			json_object_foreach (v, mk, mv) {
				if (!json_is_string(mv)) {
					char e[128];
					st_fail(err, errlen,
						"%s: \"__metadata__\" value of \"%s\" is not a string",
						path,
						st_escape(mk, e, sizeof(e)));
					goto fail;
				}
			}
			f->metadata = v;
			continue;
		}
		if (parse_entry(f, path, key, v, &f->tensors[f->count], err,
				errlen))
			goto fail;
		f->count++;
	}
	qsort(f->tensors, f->count, sizeof(*f->tensors), cmp_begin);
	{
		/* Sorted by begin: a non-empty tensor must start at or after the
		 * furthest end seen so far. */
		uint64_t reach = 0;
		const st_tensor *far = NULL;
		for (i = 0; i < f->count; i++) {
			const st_tensor *t = &f->tensors[i];
			if (t->begin == t->end)
				continue;
			if (far && t->begin < reach) {
				char a[256], b[256];
				st_fail(err, errlen,
					"%s: tensor \"%s\" (bytes %llu..%llu) overlaps tensor "
					"\"%s\" (bytes %llu..%llu)",
					path, st_escape(t->name, a, sizeof(a)),
					(unsigned long long)t->begin,
					(unsigned long long)t->end,
					st_escape(far->name, b, sizeof(b)),
					(unsigned long long)far->begin,
					(unsigned long long)far->end);
				goto fail;
			}
			reach = t->end;
			far = t;
		}
	}
	return 0;
fail:
	st_close(f);
	return -1;
}

void st_close(st_file *f)
{
	if (!f)
		return;
	free(f->tensors);
	if (f->root)
		json_decref(f->root);
	if (f->map)
		munmap(f->map, f->file_size);
	if (f->fd >= 0)
		close(f->fd);
	memset(f, 0, sizeof(*f));
	f->fd = -1;
}

/* ---- writer ----------------------------------------------------------- */

int st_header_build(const st_entry *e, size_t n, const char *const *meta,
		    size_t nmeta, char **out, size_t *outlen, char *err,
		    size_t errlen)
{
	json_t *root = json_object(), *m = NULL;
	char *js = NULL, *buf = NULL;
	uint64_t off = 0;
	size_t jl, padded, i;
	int rc = -1;

	*out = NULL;
	*outlen = 0;
	if (!root)
		goto oom;
	if (nmeta) {
		m = json_object();
		if (!m || json_object_set_new(root, "__metadata__", m))
			goto oom;
		for (i = 0; i < nmeta; i++) {
			json_t *s = json_string(meta[2 * i + 1]);
			if (!s || json_object_set_new(m, meta[2 * i], s)) {
				st_fail(err, errlen,
					"metadata \"%s\" is not valid UTF-8",
					meta[2 * i]);
				goto out;
			}
		}
	}
	for (i = 0; i < n; i++) {
		const char *dn = st_dtype_name(e[i].dtype);
		json_t *t, *shape, *offs;
		char esc[256];

		st_escape(e[i].name, esc, sizeof(esc));
		if (!dn) {
			st_fail(err, errlen,
				"tensor \"%s\": dtype %d has no safetensors equivalent",
				esc, e[i].dtype);
			goto out;
		}
		if (strcmp(e[i].name, "__metadata__") == 0 ||
		    json_object_get(root, e[i].name)) {
			st_fail(err, errlen,
				"tensor \"%s\": name is reserved or used twice",
				esc);
			goto out;
		}
		t = json_object();
		if (!t)
			goto oom;
		/* json_object_set_new() consumes the value even when it fails, so
		 * each object is attached before it is filled. An invalid UTF-8
		 * name fails here. */
		if (json_object_set_new(root, e[i].name, t)) {
			st_fail(err, errlen,
				"tensor \"%s\": name cannot be encoded in JSON",
				esc);
			goto out;
		}
		if (json_object_set_new(t, "dtype", json_string(dn)))
			goto oom;
		shape = json_array();
		if (json_object_set_new(t, "shape", shape))
			goto oom;
		offs = json_array();
		if (json_object_set_new(t, "data_offsets", offs))
			goto oom;
		for (uint32_t d = 0; d < e[i].ndim; d++)
			if (json_array_append_new(
				    shape,
				    json_integer((json_int_t)e[i].shape[d])))
				goto oom;
		if (json_array_append_new(offs,
					  json_integer((json_int_t)off)) ||
		    json_array_append_new(
			    offs,
			    json_integer((json_int_t)(off + e[i].nbytes))))
			goto oom;
		off += e[i].nbytes;
	}
	js = json_dumps(root, JSON_COMPACT);
	if (!js)
		goto oom;
	jl = strlen(js);
	padded = (jl + 7) & ~(size_t)7;
	buf = malloc(8 + padded);
	if (!buf)
		goto oom;
	for (i = 0; i < 8; i++)
		buf[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
	memcpy(buf + 8, js, jl);
	memset(buf + 8 + jl, ' ', padded - jl);
	*out = buf;
	*outlen = 8 + padded;
	buf = NULL;
	rc = 0;
	goto out;
oom:
	st_fail(err, errlen, "out of memory building the safetensors header");
out:
	free(buf);
	free(js);
	json_decref(root);
	return rc;
}
