/*
 * fmt_codec.c - chunk codecs of format v1 (SPEC.md section 5).
 *
 * none:  the raw bytes.
 * zstd:  exactly one zstd frame whose content size is recorded and equals
 *        raw_len.
 * float: for elements of w = 2, 4 or 8 bytes. Each little-endian element
 *        is rotated left by one bit (the sign goes to bit 0, so the most
 *        significant byte holds the high exponent bits), then split into w
 *        byte planes, most significant byte first. The exponent plane of
 *        trained weights is a few skewed byte values: a static Huffman
 *        code (fmt_huf.c) stores it as small as zstd, several times
 *        faster. The mantissa planes are close to random, so each plane is
 *        first sampled and stored raw when nothing would gain, and zstd is
 *        kept for planes where it clearly wins (runs, repeats). Layout:
 *            u8 w, u8 nplanes (= w),
 *            nplanes x { u8 mode (0 raw, 1 zstd, 2 huffman),
 *                        u32 stored_len },
 *            the plane payloads in order, then raw_len % w tail bytes.
 *
 * Decoding trusts nothing: every length is checked against the payload
 * size and the expected raw size before it is used, every zstd frame
 * must be a single frame of exactly the expected content size, and every
 * Huffman plane must decode to exactly its size (fmt_huf_decode).
 *
 * The byte-plane transforms (fmt_planes.c) are the hot loops (they run
 * over every byte written and read). Chunks of trained
 * weights of those widths skip most of them (encode_float_fast): the
 * exponent plane is coded straight from the elements with a code taken
 * from a sample, so it is neither split off nor counted whole.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZSTD_STATIC_LINKING_ONLY /* ZSTD_c_literalCompressionMode, see plane_params */
#include <xxhash.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "fmt.h"
#include "fmt_huf.h"
#include "fmt_internal.h"
#include "fmt_planes.h"

#define SAMPLE_BYTES (16u * 1024u)
/* A plane is compressed only if the sample shrinks below this fraction
 * (SAMPLE_NUM / SAMPLE_DEN) of its size. */
#define SAMPLE_NUM 97u
#define SAMPLE_DEN 100u
#define FLOAT_HDR(w) (2u + 5u * (unsigned)(w))
/* fmt_chunk_decode_parts produces and hashes this many raw bytes at a
 * time (a multiple of 8: whole elements of every width). */
#define PART_BLOCK (32u * 1024u)

struct fmt_codec_ctx {
	ZSTD_CCtx *cctx;
	ZSTD_DCtx *dctx;
	uint8_t *scratch;       /* byte planes, up to FMT_MAX_CHUNK */
	size_t scratch_cap;
	uint8_t *sample;        /* ZSTD_compressBound(SAMPLE_BYTES) */
	size_t sample_cap;
	uint32_t *huf_pairs;    /* FMT_HUF_PAIRS, Huffman encoder scratch */
	XXH3_state_t *hs;       /* fmt_chunk_decode_parts */
	uint8_t *blk;           /* PART_BLOCK: raw bytes nobody wants */
	void (*prepare)(void *dst, size_t n); /* fmt_codec_ctx_set_prepare */
};

fmt_codec_ctx *fmt_codec_ctx_new(void)
{
	fmt_codec_ctx *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->cctx = ZSTD_createCCtx();
	c->dctx = ZSTD_createDCtx();
	c->sample_cap = ZSTD_compressBound(SAMPLE_BYTES);
	c->sample = malloc(c->sample_cap);
	c->huf_pairs = malloc(FMT_HUF_PAIRS * sizeof(uint32_t));
	c->hs = XXH3_createState();
	c->blk = malloc(PART_BLOCK);
	if (!c->cctx || !c->dctx || !c->sample || !c->huf_pairs || !c->hs ||
	    !c->blk) {
		fmt_codec_ctx_free(c);
		return NULL;
	}
	return c;
}

void fmt_codec_ctx_free(fmt_codec_ctx *c)
{
	if (!c)
		return;
	ZSTD_freeCCtx(c->cctx);
	ZSTD_freeDCtx(c->dctx);
	free(c->scratch);
	free(c->sample);
	free(c->huf_pairs);
	XXH3_freeState(c->hs);
	free(c->blk);
	free(c);
}

void fmt_codec_ctx_set_prepare(fmt_codec_ctx *c,
			       void (*fn)(void *dst, size_t n))
{
	c->prepare = fn;
}

static int scratch_reserve(fmt_codec_ctx *c, size_t n)
{
	uint8_t *p;

	if (n <= c->scratch_cap)
		return 0;
	if (n > FMT_MAX_CHUNK)
		return -EINVAL;
	p = malloc(n);
	if (!p)
		return -ENOMEM;
	free(c->scratch);
	c->scratch = p;
	c->scratch_cap = n;
	return 0;
}

/*
 * n + n/256 + 128 covers ZSTD_compressBound(n) (n + n/256 + at most 64)
 * and the float header (at most 42 bytes over raw_len). It is a format
 * constant: readers reject larger stored_len values.
 */
size_t fmt_codec_bound(size_t raw_len)
{
	return raw_len + (raw_len >> 8) + 128;
}

static int zstd_err_code(size_t r)
{
	return ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation ?
		-ENOMEM : CKPT_E_CODEC;
}

/* ---- encoding ---- */

/* Compresses src into dst (capacity cap); *len = 0 means "did not fit". */
static int zstd_into(fmt_codec_ctx *c, int level, const void *src, size_t n,
		     void *dst, size_t cap, size_t *len)
{
	size_t r = ZSTD_compressCCtx(c->cctx, dst, cap, src, n, level);

	*len = 0;
	if (ZSTD_isError(r)) {
		if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
			return 0;
		return zstd_err_code(r);
	}
	*len = r;
	return 0;
}

/*
 * zstd parameters for byte planes. Match finding is wasted effort there:
 * an exponent plane is a stream of a few frequent symbols whose short
 * repeats cost more as sequences than as Huffman-coded literals, and the
 * mantissa planes are noise. So planes are compressed with the fast
 * strategy, a tiny hash table and the longest minimum match, whatever the
 * level: about twice as fast as plain level 1 and better on exponent
 * planes (0.33 vs 0.36 of their size for bf16 weights; higher levels
 * measured no better and 50-300x slower). Negative levels keep their
 * acceleration, but would turn off literal compression, the one thing
 * that helps, so it is forced back on (best effort: an experimental zstd
 * parameter). Decoders do not care: every plane is a plain zstd frame.
 */
static int plane_params(fmt_codec_ctx *c, int level)
{
	ZSTD_CCtx_reset(c->cctx, ZSTD_reset_session_and_parameters);
	if (ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx,
						ZSTD_c_compressionLevel,
						level < 0 ? level : 1)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_strategy,
						ZSTD_fast)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_minMatch,
						ZSTD_MINMATCH_MAX)) ||
	    ZSTD_isError(ZSTD_CCtx_setParameter(c->cctx, ZSTD_c_hashLog,
						ZSTD_HASHLOG_MIN)))
		return CKPT_E_CODEC;
	if (level < 0)
		(void)ZSTD_CCtx_setParameter(c->cctx,
					     ZSTD_c_literalCompressionMode,
					     ZSTD_ps_enable);
	return 0;
}

/* Compresses with the parameters set by plane_params(). */
static int plane_zstd(fmt_codec_ctx *c, const void *src, size_t n,
		      void *dst, size_t cap, size_t *len)
{
	size_t r = ZSTD_compress2(c->cctx, dst, cap, src, n);

	*len = 0;
	if (ZSTD_isError(r)) {
		if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall)
			return 0;
		return zstd_err_code(r);
	}
	*len = r;
	return 0;
}

/* Huffman (mode 2) size of plane[0..n), with its histograms and lengths;
 * UINT64_MAX if fewer than two symbols occur. */
static uint64_t huf_plan(const uint8_t *plane, size_t n,
			 uint32_t h[FMT_HUF_STREAMS][256], uint8_t len[256])
{
	uint64_t cnt[256];

	fmt_huf_hist(plane, n, h);
	for (unsigned x = 0; x < 256; x++)
		cnt[x] = (uint64_t)h[0][x] + h[1][x] + h[2][x] + h[3][x];
	if (fmt_huf_lengths(cnt, len))
		return UINT64_MAX;
	return fmt_huf_size(h, len);
}

/* zstd is used over Huffman only if it stores less than this fraction
 * (ZSTD_NUM / ZSTD_DEN) of the Huffman size: Huffman is several times
 * faster both ways. */
#define ZSTD_NUM 97u
#define ZSTD_DEN 100u

/* The mode a plane larger than its sample of sn bytes gets (0 raw, 1
 * zstd, 2 Huffman) from the sample's Huffman and zstd sizes hs, zs. */
static int sample_mode(size_t sn, uint64_t hs, size_t zs)
{
	int zwin = zs && (hs == UINT64_MAX ||
			  (uint64_t)zs * ZSTD_DEN < hs * ZSTD_NUM);

	if (zwin)
		return (uint64_t)zs * SAMPLE_DEN > (uint64_t)sn * SAMPLE_NUM ? 0 : 1;
	if (hs == UINT64_MAX || hs * SAMPLE_DEN > (uint64_t)sn * SAMPLE_NUM)
		return 0;
	return 2;
}

/*
 * Writes one plane at dst (room for `n` bytes at least) and returns its
 * mode and stored length. Compressed output must be strictly smaller than
 * the plane, so it always fits into n bytes.
 *
 * The first SAMPLE_BYTES of the plane (all of it if shorter) are measured
 * with Huffman (exact size from a histogram) and with zstd. zstd is kept
 * where it clearly wins (runs, repeats, constant planes), Huffman where
 * the bytes are merely skewed (exponent planes), and a plane that neither
 * shrinks below SAMPLE_NUM / SAMPLE_DEN is stored raw (mantissa planes).
 */
static int encode_plane(fmt_codec_ctx *c, const uint8_t *plane, size_t n,
			uint8_t *dst, uint8_t *mode, size_t *len)
{
	uint32_t h[FMT_HUF_STREAMS][256];
	uint8_t lens[256];
	size_t sn = n > SAMPLE_BYTES ? SAMPLE_BYTES : n, zs, got;
	uint64_t hs;
	int rc, zwin;

	if (n <= 1)
		goto raw;
	hs = huf_plan(plane, sn, h, lens);
	rc = plane_zstd(c, plane, sn, c->sample, c->sample_cap, &zs);
	if (rc)
		return rc;
	zwin = zs && (hs == UINT64_MAX ||
		      (uint64_t)zs * ZSTD_DEN < hs * ZSTD_NUM);
	if (sn == n) {
		/* the sample is the plane: take the smaller */
		if (zwin && zs < n) {
			memcpy(dst, c->sample, zs);
			*mode = 1;
			*len = zs;
			return 0;
		}
		if (hs < n && fmt_huf_encode(plane, n, h, lens, dst, n - 1,
				     c->huf_pairs)) {
			*mode = 2;
			*len = (size_t)hs;
			return 0;
		}
		if (zs && zs < n) {
			memcpy(dst, c->sample, zs);
			*mode = 1;
			*len = zs;
			return 0;
		}
		goto raw;
	}
	switch (sample_mode(sn, hs, zs)) {
	case 0:
		goto raw;
	case 1:
		rc = plane_zstd(c, plane, n, dst, n - 1, &got);
		if (rc)
			return rc;
		if (got) {
			*mode = 1;
			*len = got;
			return 0;
		}
		goto raw;
	}
	hs = huf_plan(plane, n, h, lens);
	if (hs < n) {
		got = fmt_huf_encode(plane, n, h, lens, dst, n - 1,
				     c->huf_pairs);
		if (got) {
			*mode = 2;
			*len = got;
			return 0;
		}
	}
raw:
	if (n)
		memcpy(dst, plane, n);
	*mode = 0;
	*len = n;
	return 0;
}

/*
 * The fast path of widths 2 and 4, for chunks of at least FAST_MIN
 * elements whose sample (FAST_WINDOWS windows spread over the chunk)
 * says what trained weights say: exponent plane Huffman, every other
 * plane raw. The exponent plane is then coded straight from the elements
 * with a code built from the sample (fmt_huf_encode_elems), so the chunk
 * is neither split into a scratch plane nor counted whole, and the other
 * planes are split straight into place. The code gives a length to every
 * symbol of the sample and to the exponents near its range (FAST_BELOW
 * under it: rarer values of smaller magnitude; FAST_ABOVE over it), at
 * weight 1 against 64 per sampled occurrence; a chunk holding any other
 * symbol is refused by the coder and takes encode_plane's exact path,
 * as does every chunk the sample does not describe so. Returns 1 (done,
 * *stored set), 0 (not taken) or an error.
 */
#define FAST_WINDOWS 8u
#define FAST_MIN (16u * SAMPLE_BYTES)
#define FAST_BELOW 20u
#define FAST_ABOVE 8u

static int encode_float_fast(fmt_codec_ctx *c, unsigned w, const uint8_t *raw,
			     size_t n, uint8_t *out, size_t *stored)
{
	const size_t win = SAMPLE_BYTES / FAST_WINDOWS;
	uint32_t h[FMT_HUF_STREAMS][256];
	uint64_t cnt[256], hs;
	uint8_t lens[256], *p[8] = { 0 };
	unsigned lo = 256, hi = 0;
	size_t zs, got, pos;
	int rc;

	if ((w != 2 && w != 4) || n < FAST_MIN)
		return 0;
	for (unsigned k = 0; k < FAST_WINDOWS; k++) {
		for (unsigned j = 0; j < w; j++)
			p[j] = c->scratch + j * SAMPLE_BYTES + k * win;
		fmt_planes_split(raw + (size_t)w * (k * (n / FAST_WINDOWS)),
				 win, w, p);
	}
	for (unsigned j = w; j-- > 0;) {
		const uint8_t *sp = c->scratch + j * SAMPLE_BYTES;

		hs = huf_plan(sp, SAMPLE_BYTES, h, lens);
		rc = plane_zstd(c, sp, SAMPLE_BYTES, c->sample, c->sample_cap,
				&zs);
		if (rc)
			return rc;
		if (sample_mode(SAMPLE_BYTES, hs, zs) != (j ? 0 : 2))
			return 0;
	}
	for (unsigned x = 0; x < 256; x++) {
		cnt[x] = 64 * ((uint64_t)h[0][x] + h[1][x] + h[2][x] + h[3][x]);
		if (cnt[x]) {
			lo = x < lo ? x : lo;
			hi = x;
		}
	}
	for (unsigned x = lo > FAST_BELOW ? lo - FAST_BELOW : 0;
	     x <= hi + FAST_ABOVE && x < 256; x++)
		cnt[x]++;
	cnt[0] += !cnt[0]; /* zeros */
	if (fmt_huf_lengths(cnt, lens))
		return 0;
	pos = FLOAT_HDR(w);
	got = fmt_huf_encode_elems(raw, n, w, lens, out + pos, n - 1,
				   c->huf_pairs);
	if (!got)
		return 0;
	out[0] = (uint8_t)w;
	out[1] = (uint8_t)w;
	out[2] = 2;
	fmt_put_u32(out + 3, (uint32_t)got);
	pos += got;
	p[0] = NULL;
	for (unsigned j = 1; j < w; j++) {
		p[j] = out + pos + (j - 1) * n;
		out[2 + 5 * j] = 0;
		fmt_put_u32(out + 3 + 5 * j, (uint32_t)n);
	}
	fmt_planes_split(raw, n, w, p);
	*stored = pos + (w - 1) * n;
	return 1;
}

static int encode_float(fmt_codec_ctx *c, int level, unsigned w,
			const uint8_t *raw, size_t raw_len, uint8_t *out,
			size_t *stored)
{
	size_t n = raw_len / w, tail = raw_len % w;
	size_t pos = FLOAT_HDR(w);
	uint8_t *planes[8];
	int rc;

	rc = scratch_reserve(c, n * w);
	if (!rc)
		rc = plane_params(c, level);
	if (rc)
		return rc;
	rc = encode_float_fast(c, w, raw, n, out, stored);
	if (rc < 0)
		return rc;
	if (rc == 1) {
		memcpy(out + *stored, raw + n * w, tail);
		*stored += tail;
		return 0;
	}
	for (unsigned j = 0; j < w; j++)
		planes[j] = c->scratch + j * n;
	fmt_planes_split(raw, n, w, planes);
	out[0] = (uint8_t)w;
	out[1] = (uint8_t)w;
	for (unsigned j = 0; j < w; j++) {
		uint8_t mode;
		size_t len;

		/* out has fmt_codec_bound(raw_len) >= FLOAT_HDR(w) + raw_len
		 * bytes and every plane takes at most n. */
		rc = encode_plane(c, planes[j], n, out + pos, &mode, &len);
		if (rc)
			return rc;
		out[2 + 5 * j] = mode;
		fmt_put_u32(out + 3 + 5 * j, (uint32_t)len);
		pos += len;
	}
	memcpy(out + pos, raw + n * w, tail);
	*stored = pos + tail;
	return 0;
}

int fmt_chunk_encode(fmt_codec_ctx *c, int codec, int level, int elem_width,
		     const void *raw, size_t raw_len, void *out, size_t out_cap,
		     int *codec_used, size_t *stored_len)
{
	size_t got = 0;
	int rc = 0;

	if (!c || !raw || !out || !codec_used || !stored_len ||
	    codec < 0 || codec >= CKPT_CODEC_COUNT ||
	    raw_len < 1 || raw_len > FMT_MAX_CHUNK ||
	    out_cap < fmt_codec_bound(raw_len) ||
	    level < ZSTD_minCLevel() || level > ZSTD_maxCLevel())
		return -EINVAL;
	if (codec == CKPT_CODEC_FLOAT &&
	    ((elem_width != 2 && elem_width != 4 && elem_width != 8) ||
	     raw_len < (size_t)elem_width))
		codec = CKPT_CODEC_ZSTD;

	if (codec == CKPT_CODEC_ZSTD) {
		rc = zstd_into(c, level, raw, raw_len, out, out_cap, &got);
	} else if (codec == CKPT_CODEC_FLOAT) {
		rc = encode_float(c, level, (unsigned)elem_width, raw, raw_len,
				  out, &got);
	}
	if (rc)
		return rc;
	if (codec == CKPT_CODEC_NONE || got == 0 || got >= raw_len) {
		memcpy(out, raw, raw_len);
		codec = CKPT_CODEC_NONE;
		got = raw_len;
	}
	*codec_used = codec;
	*stored_len = got;
	return 0;
}

/* ---- decoding ---- */

/* One zstd frame of exactly `n` content bytes, filling dst[0..n). */
static int zstd_exact(fmt_codec_ctx *c, const uint8_t *src, size_t len,
		      uint8_t *dst, size_t n, const char *what, char *err,
		      size_t errlen)
{
	unsigned long long csize;
	size_t fsize, r;

	fsize = ZSTD_findFrameCompressedSize(src, len);
	if (ZSTD_isError(fsize) || fsize != len)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"%s: not exactly one zstd frame of %zu bytes",
				what, len);
	csize = ZSTD_getFrameContentSize(src, len);
	if (csize == ZSTD_CONTENTSIZE_UNKNOWN ||
	    csize == ZSTD_CONTENTSIZE_ERROR || csize != n)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"%s: zstd frame does not declare %zu bytes",
				what, n);
	r = ZSTD_decompressDCtx(c->dctx, dst, n, src, len);
	if (ZSTD_isError(r)) {
		if (ZSTD_getErrorCode(r) == ZSTD_error_memory_allocation)
			return -ENOMEM;
		return fmt_fail(err, errlen, CKPT_E_CORRUPT, "%s: zstd: %s",
				what, ZSTD_getErrorName(r));
	}
	if (r != n)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"%s: zstd frame gave %zu bytes, expected %zu",
				what, r, n);
	return 0;
}

/* Checks a float payload and decodes its planes (into the context's
 * scratch, or pointing into `in` for raw planes); *tail gets the
 * raw_len % w trailing bytes. */
static int float_planes(fmt_codec_ctx *c, unsigned w, const uint8_t *in,
			size_t len, size_t raw_len, const uint8_t *planes[8],
			const uint8_t **tail_bytes, char *err, size_t errlen)
{
	size_t n = raw_len / w, tail = raw_len % w;
	size_t pos = FLOAT_HDR(w), need;
	uint8_t modes[8];
	size_t lens[8];
	int rc;

	if (len < FLOAT_HDR(w))
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"float payload: %zu bytes, shorter than its header",
			len);
	if (in[0] != w || in[1] != w)
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"float payload: width %u / %u planes, chunk header "
			"says %u",
			in[0], in[1], w);
	need = pos + tail;
	for (unsigned j = 0; j < w; j++) {
		modes[j] = in[2 + 5 * j];
		lens[j] = fmt_get_u32(in + 3 + 5 * j);
		if (modes[j] > 2 || (modes[j] == 0 && lens[j] != n) ||
		    (modes[j] == 1 && lens[j] == 0) ||
		    (modes[j] == 2 && lens[j] < FMT_HUF_HDR))
			return fmt_fail(err, errlen, CKPT_E_CORRUPT,
					"float payload: plane %u: mode %u with "
					"%zu bytes for %zu elements",
					j, modes[j], lens[j], n);
		if (lens[j] > len || need > len - lens[j])
			return fmt_fail(
				err, errlen, CKPT_E_CORRUPT,
				"float payload: plane %u: lengths exceed "
				"the %zu-byte payload",
				j, len);
		need += lens[j];
	}
	if (need != len)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"float payload: %zu bytes, layout needs %zu",
				len, need);
	rc = scratch_reserve(c, n * w);
	if (rc)
		return rc;
	for (unsigned j = 0; j < w; j++) {
		if (modes[j] == 0) {
			planes[j] = in + pos;
		} else {
			char what[48];

			snprintf(what, sizeof(what), "float payload: plane %u",
				 j);
			if (modes[j] == 1)
				rc = zstd_exact(c, in + pos, lens[j],
						c->scratch + j * n, n, what,
						err, errlen);
			else
				rc = fmt_huf_decode(in + pos, lens[j],
						    c->scratch + j * n, n, what,
						    err, errlen);
			if (rc)
				return rc;
			planes[j] = c->scratch + j * n;
		}
		pos += lens[j];
	}
	*tail_bytes = in + pos;
	return 0;
}

static int decode_float(fmt_codec_ctx *c, unsigned w, const uint8_t *in,
			size_t len, uint8_t *raw, size_t raw_len, char *err,
			size_t errlen)
{
	const uint8_t *planes[8], *tail;
	size_t n = raw_len / w;
	int rc = float_planes(c, w, in, len, raw_len, planes, &tail, err,
			      errlen);

	if (rc)
		return rc;
	fmt_planes_join(planes, n, w, raw);
	memcpy(raw + n * w, tail, raw_len % w);
	return 0;
}

/* The checks every decode makes before touching the payload. */
static int decode_check(int codec, int elem_width, size_t stored_len,
			size_t raw_len, char *err, size_t errlen)
{
	if (raw_len < 1 || raw_len > FMT_MAX_CHUNK)
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk: raw_len %zu out of range", raw_len);
	if (stored_len < 1 || stored_len > fmt_codec_bound(raw_len))
		return fmt_fail(
			err, errlen, CKPT_E_CORRUPT,
			"chunk: stored_len %zu out of range for raw_len "
			"%zu",
			stored_len, raw_len);
	switch (codec) {
	case CKPT_CODEC_NONE:
		if (stored_len != raw_len)
			return fmt_fail(
				err, errlen, CKPT_E_CORRUPT,
				"chunk: codec none with stored_len %zu != "
				"raw_len %zu",
				stored_len, raw_len);
		return 0;
	case CKPT_CODEC_ZSTD:
		return 0;
	case CKPT_CODEC_FLOAT:
		if (elem_width != 2 && elem_width != 4 && elem_width != 8)
			return fmt_fail(
				err, errlen, CKPT_E_CORRUPT,
				"chunk: codec float with element width %d",
				elem_width);
		return 0;
	default:
		return fmt_fail(err, errlen, CKPT_E_CORRUPT,
				"chunk: unknown codec %d", codec);
	}
}

int fmt_chunk_decode(fmt_codec_ctx *c, int codec, int elem_width,
		     const void *stored, size_t stored_len, void *raw,
		     size_t raw_len, char *err, size_t errlen)
{
	int rc;

	if (!c || !stored || !raw)
		return -EINVAL;
	rc = decode_check(codec, elem_width, stored_len, raw_len, err, errlen);
	if (rc)
		return rc;
	if (codec == CKPT_CODEC_NONE) {
		memcpy(raw, stored, raw_len);
		return 0;
	}
	if (codec == CKPT_CODEC_ZSTD)
		return zstd_exact(c, stored, stored_len, raw, raw_len,
				  "zstd payload", err, errlen);
	return decode_float(c, (unsigned)elem_width, stored, stored_len, raw,
			    raw_len, err, errlen);
}

/* 1 if parts tile [0, raw_len) in order with boundaries on multiples of
 * w (or raw_len). */
static int parts_tile(const fmt_part *parts, size_t nparts, size_t raw_len,
		      unsigned w)
{
	uint64_t pos = 0;

	for (size_t i = 0; i < nparts; i++) {
		if (parts[i].off != pos || parts[i].len == 0 ||
		    parts[i].len > raw_len - pos)
			return 0;
		pos += parts[i].len;
		if (pos < raw_len && pos % w)
			return 0;
	}
	return pos == raw_len;
}

/* Emits raw bytes [pos, end) of a float chunk (planes of n elements,
 * then the tail) to out, hashing each block as it is made. */
static void float_emit(fmt_codec_ctx *c, const uint8_t *const planes[8],
		       const uint8_t *tail, size_t n, unsigned w, uint64_t pos,
		       uint64_t end, uint8_t *out)
{
	uint64_t eend = end < (uint64_t)n * w ? end : (uint64_t)n * w;
	uint64_t prepared = pos;

	while (pos < eend) {
		size_t k = eend - pos < PART_BLOCK ? (size_t)(eend - pos) :
						     PART_BLOCK;
		const uint8_t *q[8];
		uint8_t *o = out ? out : c->blk;

		if (out && c->prepare && pos >= prepared) {
			uint64_t m = end - pos < FMT_PREPARE_BLOCK ?
					     end - pos : FMT_PREPARE_BLOCK;

			c->prepare(out, (size_t)m);
			prepared = pos + m;
		}

		for (unsigned j = 0; j < w; j++)
			q[j] = planes[j] + pos / w;
		fmt_planes_join(q, k / w, w, o);
		XXH3_64bits_update(c->hs, o, k);
		pos += k;
		if (out)
			out += k;
	}
	if (pos < end) { /* the tail: fewer than w bytes */
		const uint8_t *t = tail + (pos - (uint64_t)n * w);

		if (out && c->prepare && pos >= prepared)
			c->prepare(out, (size_t)(end - pos));
		if (out)
			memcpy(out, t, (size_t)(end - pos));
		XXH3_64bits_update(c->hs, t, (size_t)(end - pos));
	}
}

int fmt_chunk_decode_parts(fmt_codec_ctx *c, int codec, int elem_width,
			   const void *stored, size_t stored_len,
			   size_t raw_len, const fmt_part *parts, size_t nparts,
			   uint64_t *xxh3, char *err, size_t errlen)
{
	const uint8_t *planes[8], *src = stored, *tail = NULL;
	unsigned w = codec == CKPT_CODEC_FLOAT ? (unsigned)elem_width : 1;
	int rc;

	if (!c || !stored || !parts || !xxh3)
		return -EINVAL;
	rc = decode_check(codec, elem_width, stored_len, raw_len, err, errlen);
	if (rc)
		return rc;
	if (!parts_tile(parts, nparts, raw_len, w))
		return -EINVAL;
	if (codec == CKPT_CODEC_FLOAT)
		rc = float_planes(c, w, stored, stored_len, raw_len, planes,
				  &tail, err, errlen);
	else if (codec == CKPT_CODEC_ZSTD &&
		 !(rc = scratch_reserve(c, raw_len)))
		rc = zstd_exact(c, stored, stored_len, c->scratch, raw_len,
				"zstd payload", err, errlen);
	if (rc)
		return rc;
	if (codec == CKPT_CODEC_ZSTD)
		src = c->scratch;
	XXH3_64bits_reset(c->hs);
	for (size_t i = 0; i < nparts; i++) {
		const fmt_part *p = &parts[i];

		if (codec == CKPT_CODEC_FLOAT) {
			float_emit(c, planes, tail, raw_len / w, w, p->off,
				   p->off + p->len, p->dst);
			continue;
		}
		if (!p->dst) {
			XXH3_64bits_update(c->hs, src + p->off, (size_t)p->len);
			continue;
		}
		/* copied and hashed a block at a time: the source is read
		 * from memory once, the block's fresh pages are prepared
		 * just before they are written (not all first: their zeroes
		 * would leave the cache before the copy) */
		for (uint64_t o = 0; o < p->len; o += FMT_PREPARE_BLOCK) {
			size_t k = p->len - o < FMT_PREPARE_BLOCK ?
					   (size_t)(p->len - o) :
					   FMT_PREPARE_BLOCK;

			if (c->prepare)
				c->prepare(p->dst + o, k);
			memcpy(p->dst + o, src + p->off + o, k);
			XXH3_64bits_update(c->hs, src + p->off + o, k);
		}
	}
	*xxh3 = XXH3_64bits_digest(c->hs);
	return 0;
}
