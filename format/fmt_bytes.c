/*
 * fmt_bytes.c - the byte-level part of format v1 (SPEC.md sections 1-4):
 * little-endian integers, canonical XXH3 hashes, hex, file names, name and
 * shape validation, shard and chunk headers, and the public dtype/codec
 * name tables.
 *
 * Header decoders check everything a reader can check without other files:
 * magic, version, their own checksum, every reserved byte being zero and
 * every field's range. A single flipped bit anywhere in a header is thus
 * always reported, and nothing read here can later cause an out-of-range
 * allocation or access.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "fmt.h"
#include "fmt_internal.h"

static const uint8_t shard_magic[8] = { 'C', 'K', 'P', 'T', 'S', 'H', 'R', 'D' };
static const uint8_t chunk_magic[4] = { 'C', 'K', 'C', 'H' };

/* ---- errors ---- */

int fmt_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return code;
}

/* ---- little-endian helpers and canonical hashes ---- */

/* xxHash's canonical representation is big-endian. */
void fmt_put_hash(uint8_t *p, uint64_t h)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(h >> (56 - 8 * i));
}

uint64_t fmt_get_hash(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = (v << 8) | p[i];
	return v;
}

uint64_t fmt_xxh3(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

void fmt_hash_hex(uint64_t h, char out[17])
{
	static const char digits[] = "0123456789abcdef";

	for (int i = 0; i < 16; i++)
		out[i] = digits[(h >> (60 - 4 * i)) & 0xf];
	out[16] = '\0';
}

int fmt_hash_parse(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (!s)
		return -1;
	for (int i = 0; i < 16; i++) {
		char c = s[i];

		if (c >= '0' && c <= '9')
			v = (v << 4) | (uint64_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v = (v << 4) | (uint64_t)(c - 'a' + 10);
		else
			return -1; /* also catches a short string's NUL */
	}
	if (s[16] != '\0')
		return -1;
	*out = v;
	return 0;
}

int fmt_hash128_parse(const char *s, uint64_t out[2])
{
	char half[17];
	uint64_t v[2];

	if (!s || strlen(s) != 32)
		return -1;
	for (int i = 0; i < 2; i++) {
		memcpy(half, s + 16 * i, 16);
		half[16] = 0;
		if (fmt_hash_parse(half, &v[i]) != 0)
			return -1;
	}
	out[0] = v[0];
	out[1] = v[1];
	return 0;
}

void fmt_xxh128(const void *p, size_t n, uint64_t out[2])
{
	XXH128_hash_t h = XXH3_128bits_withSeed(p, n, FMT_H128_SEED);

	out[0] = h.high64;
	out[1] = h.low64;
}

/* Both hashes in one pass: 64 KiB at a time into each, so the second
 * reads from cache (about 20% faster than two passes over 4 MiB). */
uint64_t fmt_xxh3_pair(const void *p, size_t n, uint64_t h128[2])
{
	const uint8_t *b = p;
	XXH3_state_t s64, s128;
	XXH128_hash_t h;
	uint64_t r;

	XXH3_INITSTATE(&s64);
	XXH3_INITSTATE(&s128);
	XXH3_64bits_reset(&s64);
	XXH3_128bits_reset_withSeed(&s128, FMT_H128_SEED);
	for (size_t o = 0; o < n; o += 65536) {
		size_t k = n - o < 65536 ? n - o : 65536;

		XXH3_64bits_update(&s64, b + o, k);
		XXH3_128bits_update(&s128, b + o, k);
	}
	r = XXH3_64bits_digest(&s64);
	h = XXH3_128bits_digest(&s128);
	h128[0] = h.high64;
	h128[1] = h.low64;
	return r;
}

/* ---- names inside a checkpoint root ---- */

void fmt_step_dirname(uint64_t step, char out[32])
{
	snprintf(out, 32, "step-%020llu", (unsigned long long)step);
}

int fmt_step_parse(const char *name, uint64_t *step)
{
	uint64_t v = 0;

	if (!name || strncmp(name, "step-", 5) != 0)
		return -1;
	name += 5;
	for (int i = 0; i < 20; i++) {
		unsigned d;

		if (name[i] < '0' || name[i] > '9')
			return -1;
		d = (unsigned)(name[i] - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	if (name[20] != '\0')
		return -1;
	*step = v;
	return 0;
}

void fmt_shard_name(uint32_t host, uint32_t file, char out[32])
{
	snprintf(out, 32, "h%05u-f%03u.shard", host, file);
}

void fmt_index_name(uint32_t host, char out[32])
{
	snprintf(out, 32, "h%05u.index", host);
}

/* ---- validation helpers ---- */

int fmt_tensor_name_cmp(const fmt_tensor_entry *a, const fmt_tensor_entry *b)
{
	size_t n = a->name_len < b->name_len ? a->name_len : b->name_len;
	int c = memcmp(a->name, b->name, n);

	if (c)
		return c;
	return a->name_len < b->name_len ? -1 : a->name_len > b->name_len;
}

int fmt_name_valid(const char *str, size_t n)
{
	const uint8_t *s = (const uint8_t *)str;
	size_t i = 0;

	if (!s || n < 1 || n > CKPT_MAX_NAME)
		return 0;
	while (i < n) {
		uint8_t c = s[i];
		uint32_t cp;
		size_t len;

		if (c == 0)
			return 0;
		if (c < 0x80) {
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf) {
			len = 2;
			cp = c & 0x1f;
		} else if (c >= 0xe0 && c <= 0xef) {
			len = 3;
			cp = c & 0x0f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			len = 4;
			cp = c & 0x07;
		} else {
			return 0; /* continuation byte, 0xc0/0xc1, > 0xf4 */
		}
		if (n - i < len)
			return 0;
		for (size_t k = 1; k < len; k++) {
			if ((s[i + k] & 0xc0) != 0x80)
				return 0;
			cp = (cp << 6) | (s[i + k] & 0x3f);
		}
		if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
			return 0; /* overlong */
		if (cp >= 0xd800 && cp <= 0xdfff)
			return 0; /* surrogate */
		if (cp > 0x10ffff)
			return 0;
		i += len;
	}
	return 1;
}

int fmt_shape_bytes(const uint64_t *dims, uint32_t ndim, size_t elem,
		    uint64_t *out)
{
	uint64_t v = elem;

	if (ndim > CKPT_MAX_NDIM)
		return -1;
	for (uint32_t i = 0; i < ndim; i++) {
		if (dims[i] != 0 && v > UINT64_MAX / dims[i])
			return -1;
		v *= dims[i];
	}
	*out = v;
	return 0;
}

/* ---- public name tables ---- */

static const struct {
	const char *name;
	size_t size;
} dtypes[CKPT_DTYPE_COUNT] = {
	[CKPT_BOOL] = { "bool", 1 },     [CKPT_U8] = { "u8", 1 },
	[CKPT_I8] = { "i8", 1 },         [CKPT_U16] = { "u16", 2 },
	[CKPT_I16] = { "i16", 2 },       [CKPT_U32] = { "u32", 4 },
	[CKPT_I32] = { "i32", 4 },       [CKPT_U64] = { "u64", 8 },
	[CKPT_I64] = { "i64", 8 },       [CKPT_F16] = { "f16", 2 },
	[CKPT_BF16] = { "bf16", 2 },     [CKPT_F32] = { "f32", 4 },
	[CKPT_F64] = { "f64", 8 },       [CKPT_F8E4M3] = { "f8e4m3", 1 },
	[CKPT_F8E5M2] = { "f8e5m2", 1 },
};

static const char *const codecs[CKPT_CODEC_COUNT] = {
	[CKPT_CODEC_NONE] = "none",
	[CKPT_CODEC_ZSTD] = "zstd",
	[CKPT_CODEC_FLOAT] = "float",
};

/* Save reasons: the names ckpt_reason_name returns and the format records
 * (SPEC.md sections 7 and 8). */
static const char *const reason_names[CKPT_REASON_COUNT] = {
	"unspecified", "periodic", "maintenance", "preempted",
	"sigterm",     "manual",   "requested", "upcoming",
};

CKPT_API const char *ckpt_reason_name(int reason)
{
	return reason >= 0 && reason < CKPT_REASON_COUNT ?
		       reason_names[reason] :
		       NULL;
}

int fmt_reason_from_name(const char *name)
{
	for (int i = 0; name && i < CKPT_REASON_COUNT; i++)
		if (!strcmp(name, reason_names[i]))
			return i;
	return -1;
}

CKPT_API size_t ckpt_dtype_size(int dtype)
{
	if (dtype <= CKPT_DTYPE_INVALID || dtype >= CKPT_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].size;
}

CKPT_API const char *ckpt_dtype_name(int dtype)
{
	if (dtype <= CKPT_DTYPE_INVALID || dtype >= CKPT_DTYPE_COUNT)
		return NULL;
	return dtypes[dtype].name;
}

CKPT_API int ckpt_dtype_from_name(const char *name)
{
	if (!name)
		return CKPT_DTYPE_INVALID;
	for (int i = 1; i < CKPT_DTYPE_COUNT; i++)
		if (strcmp(name, dtypes[i].name) == 0)
			return i;
	return CKPT_DTYPE_INVALID;
}

CKPT_API const char *ckpt_codec_name(int codec)
{
	if (codec < 0 || codec >= CKPT_CODEC_COUNT)
		return NULL;
	return codecs[codec];
}

CKPT_API int ckpt_codec_from_name(const char *name)
{
	if (!name)
		return CKPT_E_NOTFOUND;
	for (int i = 0; i < CKPT_CODEC_COUNT; i++)
		if (strcmp(name, codecs[i]) == 0)
			return i;
	return CKPT_E_NOTFOUND;
}

/* ---- shard file header ---- */

/*
 * 0 magic(8) 8 version u32 12 header_size u32 16 step u64 24 save_id(16)
 * 40 host_index u32 44 host_count u32 48 file_index u32 52 reserved u32
 * 56 hash of 0..55, 64..4095 zero.
 */
void fmt_shard_hdr_encode(const fmt_shard_hdr *h, uint8_t *out)
{
	memset(out, 0, FMT_SHARD_HDR_SIZE);
	memcpy(out, shard_magic, 8);
	fmt_put_u32(out + 8, h->version ? h->version : FMT_VERSION);
	fmt_put_u32(out + 12, FMT_SHARD_HDR_SIZE);
	fmt_put_u64(out + 16, h->step);
	memcpy(out + 24, h->save_id, 16);
	fmt_put_u32(out + 40, h->host_index);
	fmt_put_u32(out + 44, h->host_count);
	fmt_put_u32(out + 48, h->file_index);
	fmt_put_hash(out + 56, fmt_xxh3(out, 56));
}

static int all_zero(const uint8_t *p, size_t n, size_t *first)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i]) {
			*first = i;
			return 0;
		}
	}
	return 1;
}

int fmt_shard_hdr_decode(const uint8_t *in, size_t n, fmt_shard_hdr *h,
			 char *err, size_t errlen)
{
	uint32_t version, hsize;
	size_t bad;

	if (!in || n < FMT_SHARD_HDR_SIZE)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: %zu bytes, need %u", in ? n : 0,
				FMT_SHARD_HDR_SIZE);
	if (memcmp(in, shard_magic, 8) != 0)
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"shard header: bad magic (not a ckpt shard file)");
	version = fmt_get_u32(in + 8);
	if (version > FMT_VERSION_MAX)
		return fmt_fail(err, errlen, CKPT_E_VERSION,
				"shard header: format version %u, this library "
				"reads version %u",
				version, FMT_VERSION_MAX);
	if (version == 0)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: bad format version %u", version);
	if (fmt_get_hash(in + 56) != fmt_xxh3(in, 56))
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: checksum mismatch");
	hsize = fmt_get_u32(in + 12);
	if (hsize != FMT_SHARD_HDR_SIZE)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: header_size %u, expected %u",
				hsize, FMT_SHARD_HDR_SIZE);
	if (fmt_get_u32(in + 52) != 0)
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"shard header: reserved field at byte 52 not zero");
	if (!all_zero(in + 64, FMT_SHARD_HDR_SIZE - 64, &bad))
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: padding byte %zu not zero",
				64 + bad);
	h->version = version;
	h->step = fmt_get_u64(in + 16);
	memcpy(h->save_id, in + 24, 16);
	h->host_index = fmt_get_u32(in + 40);
	h->host_count = fmt_get_u32(in + 44);
	h->file_index = fmt_get_u32(in + 48);
	if (h->host_count == 0 || h->host_count > FMT_MAX_HOSTS ||
	    h->host_index >= h->host_count)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: host %u of %u out of range",
				h->host_index, h->host_count);
	if (h->file_index >= FMT_MAX_FILES_PER_HOST)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: file index %u out of range",
				h->file_index);
	if (h->step > (uint64_t)INT64_MAX)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"shard header: step %llu out of range",
				(unsigned long long)h->step);
	return 0;
}

/* ---- chunk header ---- */

/*
 * 0 magic "CKCH" 4 codec u8 5 elem_width u8 6 reserved u16 8 raw_len u32
 * 12 stored_len u32 16 stream_offset u64 24 raw xxh3 32..55 zero
 * 56 hash of 0..55.
 */
void fmt_chunk_hdr_encode(const fmt_chunk_hdr *h, uint8_t out[64])
{
	memset(out, 0, FMT_CHUNK_HDR_SIZE);
	memcpy(out, chunk_magic, 4);
	out[4] = h->codec;
	out[5] = h->elem_width;
	fmt_put_u32(out + 8, h->raw_len);
	fmt_put_u32(out + 12, h->stored_len);
	fmt_put_u64(out + 16, h->stream_offset);
	fmt_put_hash(out + 24, h->raw_xxh3);
	fmt_put_hash(out + 56, fmt_xxh3(out, 56));
}

static int width_valid(unsigned w)
{
	return w == 1 || w == 2 || w == 4 || w == 8;
}

int fmt_chunk_hdr_decode(const uint8_t *in, size_t n, fmt_chunk_hdr *h,
			 char *err, size_t errlen)
{
	size_t bad;

	if (!in || n < FMT_CHUNK_HDR_SIZE)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: %zu bytes, need %u", in ? n : 0,
				FMT_CHUNK_HDR_SIZE);
	if (memcmp(in, chunk_magic, 4) != 0)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: bad magic");
	if (fmt_get_hash(in + 56) != fmt_xxh3(in, 56))
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: checksum mismatch");
	if (fmt_get_u16(in + 6) != 0 || !all_zero(in + 32, 24, &bad))
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: reserved bytes not zero");
	h->codec = in[4];
	h->elem_width = in[5];
	h->raw_len = fmt_get_u32(in + 8);
	h->stored_len = fmt_get_u32(in + 12);
	h->stream_offset = fmt_get_u64(in + 16);
	h->raw_xxh3 = fmt_get_hash(in + 24);
	if (h->codec >= CKPT_CODEC_COUNT)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: unknown codec %u", h->codec);
	if (!width_valid(h->elem_width) ||
	    (h->codec == CKPT_CODEC_FLOAT && h->elem_width == 1))
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"chunk header: bad element width %u for codec %s",
			h->elem_width, ckpt_codec_name(h->codec));
	if (h->raw_len < 1 || h->raw_len > FMT_MAX_CHUNK)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: raw_len %u out of range [1, %u]",
				h->raw_len, FMT_MAX_CHUNK);
	if (h->stored_len < 1 || h->stored_len > fmt_codec_bound(h->raw_len))
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: stored_len %u out of range for "
				"raw_len %u",
				h->stored_len, h->raw_len);
	if (h->codec == CKPT_CODEC_NONE && h->stored_len != h->raw_len)
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"chunk header: codec none with stored_len %u != "
			"raw_len %u",
			h->stored_len, h->raw_len);
	if (h->stream_offset > (uint64_t)INT64_MAX ||
	    h->stream_offset + h->raw_len > (uint64_t)INT64_MAX)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk header: stream_offset %llu out of range",
				(unsigned long long)h->stream_offset);
	return 0;
}
