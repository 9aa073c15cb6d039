/*
 * fmt_frame.c - the 64-byte frame around the JSON document of an index or
 * commit file (SPEC.md section 6):
 *
 *     0 magic "CKPTMETA"  8 version u32  12 kind u32  16 body_len u64
 *     24 body xxh3        32..55 zero    56 xxh3 of bytes 0..55
 *
 * The frame makes a torn or truncated metadata file detectable before any
 * JSON is parsed, and tells a newer format version (CKPT_E_VERSION) from
 * damage (CKPT_E_CORRUPT).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"
#include "fmt_internal.h"

static const uint8_t meta_magic[8] = { 'C', 'K', 'P', 'T', 'M', 'E', 'T', 'A' };

int fmt_meta_wrap(int kind, const char *body, size_t len, uint8_t **out,
		  size_t *out_len)
{
	return fmt_meta_wrap_v(kind, FMT_VERSION, body, len, out, out_len);
}

int fmt_meta_wrap_v(int kind, uint32_t version, const char *body, size_t len,
		    uint8_t **out, size_t *out_len)
{
	uint8_t *p;

	if (!out || !out_len || (!body && len) || version == 0 ||
	    version > FMT_VERSION_MAX ||
	    (kind != FMT_META_INDEX && kind != FMT_META_COMMIT) ||
	    len > FMT_MAX_META_BYTES)
		return -EINVAL;
	p = malloc(FMT_META_HDR_SIZE + len);
	if (!p)
		return -ENOMEM;
	memset(p, 0, FMT_META_HDR_SIZE);
	memcpy(p, meta_magic, 8);
	fmt_put_u32(p + 8, version);
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
	return kind == FMT_META_INDEX  ? "index" :
	       kind == FMT_META_COMMIT ? "commit" :
					 "metadata";
}

int fmt_meta_unwrap(int kind, const uint8_t *file, size_t file_len,
		    const char **body, size_t *body_len, char *err,
		    size_t errlen)
{
	const char *what = kind_name(kind);
	uint32_t version, k;
	uint64_t blen;

	if (!file || file_len < FMT_META_HDR_SIZE)
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"%s: file of %zu bytes is shorter than its %u-byte "
			"header",
			what, file ? file_len : 0, FMT_META_HDR_SIZE);
	if (memcmp(file, meta_magic, 8) != 0)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT, "%s: bad magic",
				what);
	version = fmt_get_u32(file + 8);
	if (version > FMT_VERSION_MAX)
		return fmt_fail(err, errlen, CKPT_E_VERSION,
				"%s: format version %u, this library reads "
				"version %u",
				what, version, FMT_VERSION_MAX);
	if (version == 0)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"%s: bad format version %u", what, version);
	if (fmt_get_hash(file + 56) != fmt_xxh3(file, 56))
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"%s: header checksum mismatch", what);
	for (int i = 32; i < 56; i++)
		if (file[i])
			return fmt_fail(err, errlen, CKPT_E_CORRUPT,
					"%s: reserved header byte %d not zero",
					what, i);
	k = fmt_get_u32(file + 12);
	if (k != (uint32_t)kind)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"%s: frame holds kind %u, expected %d", what, k,
				kind);
	blen = fmt_get_u64(file + 16);
	if (blen > FMT_MAX_META_BYTES || blen != file_len - FMT_META_HDR_SIZE)
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"%s: body length %llu, file has %zu bytes after "
			"the header",
			what, (unsigned long long)blen,
			file_len - FMT_META_HDR_SIZE);
	if (fmt_get_hash(file + 24) !=
	    fmt_xxh3(file + FMT_META_HDR_SIZE, (size_t)blen))
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"%s: body checksum mismatch", what);
	*body = (const char *)file + FMT_META_HDR_SIZE;
	*body_len = (size_t)blen;
	return 0;
}
