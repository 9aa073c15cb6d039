/*
 * test_format_codec.c - format v1 (format/), its chunk codecs: every
 * codec's round trip over kinds of data, fmt_chunk_decode_parts (and its
 * prepare hook: called on each block of a destination before it is
 * written, at most FMT_PREPARE_BLOCK bytes, covering it all), garbage,
 * truncated and flipped payloads; the float codec's byte planes (checked
 * against an independent reading of SPEC.md 5.3) and its ratio and speed
 * on bf16 weights; its Huffman planes (mode 2), round trip and hostile.
 * Uses only fmt.h / ckpt.h (no testutil).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zstd.h>

#include "ckpt.h"
#include "fmt.h"
#include "fmt_huf.h"
#include "tu_format.h"

static char errbuf[1024];

/* ---- codecs ---- */

enum { D_RANDOM, D_ZERO, D_BF16, D_F32, D_RAMP, D_KINDS };

static void fill_kind(uint8_t *p, size_t n, int kind)
{
	switch (kind) {
	case D_RANDOM: tf_fill_random(p, n); break;
	case D_ZERO: memset(p, 0, n); break;
	case D_BF16:
		tf_fill_bf16_normal(p, n / 2, 0.02);
		if (n % 2)
			p[n - 1] = 0x5a;
		break;
	case D_F32:
		tf_fill_f32_normal(p, n / 4, 1.0);
		for (size_t i = n / 4 * 4; i < n; i++)
			p[i] = (uint8_t)i;
		break;
	default:
		for (size_t i = 0; i < n; i++)
			p[i] = (uint8_t)(i / 7);
		break;
	}
}

static void roundtrip(fmt_codec_ctx *c, int codec, int width, int level,
		      const uint8_t *raw, size_t n, uint8_t *out, uint8_t *back,
		      int *used, size_t *stored)
{
	int rc;

	rc = fmt_chunk_encode(c, codec, level, width, raw, n, out,
			      fmt_codec_bound(n), used, stored);
	ck_assert_msg(rc == 0, "encode codec %d w %d n %zu: %d", codec, width,
		      n, rc);
	ck_assert(*used >= 0 && *used < CKPT_CODEC_COUNT);
	ck_assert(*stored >= 1 && *stored <= n);
	if (*used != CKPT_CODEC_NONE)
		ck_assert(*stored < n);
	else
		ck_assert(*stored == n && memcmp(out, raw, n) == 0);
	if (codec == CKPT_CODEC_NONE)
		ck_assert_int_eq(*used, CKPT_CODEC_NONE);
	if (*used == CKPT_CODEC_FLOAT)
		ck_assert(codec == CKPT_CODEC_FLOAT &&
			  (width == 2 || width == 4 || width == 8));
	memset(back, 0xee, n);
	rc = fmt_chunk_decode(c, *used, width, out, *stored, back, n, errbuf,
			      sizeof(errbuf));
	ck_assert_msg(rc == 0, "decode codec %d w %d n %zu: %s", *used, width,
		      n, errbuf);
	ck_assert_msg(memcmp(raw, back, n) == 0, "codec %d w %d n %zu differs",
		      *used, width, n);
}

START_TEST(test_codec_roundtrip)
{
	static const size_t sizes[] = { 1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31,
		33, 63, 64, 65, 127, 129, 1000, 4095, 4096, 4097, 65535,
		65536, 65537, 65536 * 3 + 5, 1u << 20, (1u << 20) + 3 };
	static const int widths[] = { 1, 2, 4, 8, 3, 0 };
	size_t maxn = (1u << 20) + 3;
	uint8_t *raw = malloc(maxn), *out = malloc(fmt_codec_bound(maxn));
	uint8_t *back = malloc(maxn);
	fmt_codec_ctx *c = fmt_codec_ctx_new();
	int used;
	size_t stored;

	ck_assert(c && raw && out && back);
	for (int kind = 0; kind < D_KINDS; kind++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			size_t n = sizes[si];

			fill_kind(raw, n, kind);
			for (int codec = 0; codec < CKPT_CODEC_COUNT; codec++)
				for (size_t wi = 0; wi < 6; wi++)
					roundtrip(c, codec, widths[wi], 1, raw,
						  n, out, back, &used, &stored);
			/* expectations on what gets chosen */
			roundtrip(c, CKPT_CODEC_FLOAT, 2, 1, raw, n, out, back,
				  &used, &stored);
			if (kind == D_RANDOM)
				ck_assert_int_eq(used, CKPT_CODEC_NONE);
			if (kind == D_ZERO && n >= 4096)
				ck_assert_int_eq(used, CKPT_CODEC_FLOAT);
		}
	}
	/* other levels, including negative (fast) ones */
	fill_kind(raw, 1u << 20, D_BF16);
	for (int level = -5; level <= 9; level += 7)
		roundtrip(c, CKPT_CODEC_FLOAT, 2, level, raw, 1u << 20, out,
			  back, &used, &stored);
	/* argument errors */
	ck_assert_int_eq(fmt_chunk_encode(c, 3, 1, 2, raw, 100, out,
					  fmt_codec_bound(100), &used, &stored),
			 -EINVAL);
	ck_assert_int_eq(fmt_chunk_encode(c, 1, 1, 2, raw, 0, out,
					  fmt_codec_bound(100), &used, &stored),
			 -EINVAL);
	ck_assert_int_eq(fmt_chunk_encode(c, 1, 1, 2, raw, 100, out, 100,
					  &used, &stored), -EINVAL);
	ck_assert_int_eq(fmt_chunk_encode(c, 1, 1000, 2, raw, 100, out,
					  fmt_codec_bound(100), &used, &stored),
			 -EINVAL);
	fmt_codec_ctx_free(c);
	fmt_codec_ctx_free(NULL);
	free(raw);
	free(out);
	free(back);
}
END_TEST

/* Random tilings of [0, n) for fmt_chunk_decode_parts: boundaries on
 * multiples of w, every third part (about) wanted by nobody. */
static size_t random_parts(fmt_part *p, size_t max, size_t n, unsigned w,
			   uint8_t *back)
{
	size_t np = 0, pos = 0;

	while (pos < n) {
		size_t len = np + 1 == max ? n - pos :
					     1 + tf_rnd() % (n / 3 + 1);

		len = (len + w - 1) / w * w;
		if (len > n - pos)
			len = n - pos;
		p[np].off = pos;
		p[np].len = len;
		p[np].dst = tf_rnd() % 3 == 0 ? NULL : back + pos;
		pos += len;
		np++;
	}
	return np;
}

/* The prepare hook's record: which bytes of `back` it was called on; a
 * call on bytes already written, or too large, is counted as wrong. */
static uint8_t *prep_base, *prep_seen;
static size_t prep_n, prep_wrong;

static void prep_hook(void *dst, size_t n)
{
	uint8_t *d = dst;

	if (d < prep_base || n > FMT_PREPARE_BLOCK ||
	    n > prep_n - (size_t)(d - prep_base)) {
		prep_wrong++;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		prep_wrong += d[i] != 0xee; /* written before prepared */
		prep_seen[d - prep_base + i] = 1;
	}
}

/* One encoded chunk of n bytes through fmt_chunk_decode_parts. */
static void check_parts(fmt_codec_ctx *c, const uint8_t *raw, size_t n,
			int codec, int w, uint8_t *out, uint8_t *back,
			uint8_t *ref)
{
	fmt_part p[16], bad[2];
	size_t stored, np;
	uint64_t h;
	unsigned pw;
	int used;

	roundtrip(c, codec, w, 1, raw, n, out, ref, &used, &stored);
	pw = used == CKPT_CODEC_FLOAT ? (unsigned)w : 1u;
	for (int iter = 0; iter < 8; iter++) {
		memset(back, 0xee, n);
		np = random_parts(p, 16, n, pw, back);
		/* odd iterations with the hook */
		fmt_codec_ctx_set_prepare(c, iter & 1 ? prep_hook : NULL);
		prep_base = back;
		prep_n = n;
		prep_wrong = 0;
		memset(prep_seen, 0, n);
		ck_assert_int_eq(fmt_chunk_decode_parts(c, used, w, out, stored,
							n, p, np, &h, errbuf,
							sizeof(errbuf)),
				 0);
		ck_assert(h == fmt_xxh3(raw, n));
		for (size_t i = 0; i < np; i++) {
			size_t k = p[i].off, e = k + p[i].len;

			if (p[i].dst) {
				ck_assert(!memcmp(back + k, raw + k, e - k));
				if (iter & 1)
					ck_assert(!memchr(prep_seen + k, 0,
							  e - k));
				continue;
			}
			if (iter & 1)
				ck_assert(!memchr(prep_seen + k, 1, e - k));
			while (k < e && back[k] == 0xee)
				k++;
			ck_assert_uint_eq(k, e);
		}
		ck_assert_uint_eq(prep_wrong, 0);
	}
	if (n % pw && n > pw) { /* a part of the tail bytes alone */
		bad[0] = (fmt_part){ 0, n - n % pw, back };
		bad[1] = (fmt_part){ n - n % pw, n % pw, back + n - n % pw };
		memset(back, 0xee, n);
		memset(prep_seen, 0, n);
		ck_assert_int_eq(fmt_chunk_decode_parts(c, used, w, out, stored,
							n, bad, 2, &h, errbuf,
							sizeof(errbuf)),
				 0);
		ck_assert(!memcmp(back, raw, n) && !memchr(prep_seen, 0, n));
		ck_assert_uint_eq(prep_wrong, 0);
	}
	fmt_codec_ctx_set_prepare(c, NULL);
	/* a short tiling, a hole, a boundary inside an element */
	bad[0] = (fmt_part){ 0, n, back };
	ck_assert_int_eq(fmt_chunk_decode_parts(c, used, w, out, stored, n + 1,
						bad, 1, &h, errbuf,
						sizeof(errbuf)),
			 used == CKPT_CODEC_NONE ? CKPT_E_CORRUPT : -EINVAL);
	if (n > 1) {
		bad[0] = (fmt_part){ 0, 1, back };
		bad[1] = (fmt_part){ 2, n - 2, back + 2 };
		ck_assert_int_eq(fmt_chunk_decode_parts(c, used, w, out, stored,
							n, bad, 2, &h, errbuf,
							sizeof(errbuf)),
				 -EINVAL);
		bad[1] = (fmt_part){ 1, n - 1, back + 1 };
		ck_assert_int_eq(fmt_chunk_decode_parts(c, used, w, out, stored,
							n, bad, 2, &h, errbuf,
							sizeof(errbuf)),
				 pw > 1 ? -EINVAL : 0);
	}
	/* a damaged payload is an error, not a wrong hash only */
	if (used != CKPT_CODEC_NONE && stored > 1) {
		bad[0] = (fmt_part){ 0, n, back };
		ck_assert_int_lt(fmt_chunk_decode_parts(
					 c, used, w, out, stored - 1, n, bad, 1,
					 &h, errbuf, sizeof(errbuf)),
				 0);
	}
}

/* fmt_chunk_decode_parts gives the bytes and the hash fmt_chunk_decode
 * and fmt_xxh3 give, leaves bytes nobody wants alone, and refuses a
 * tiling with holes, overlaps or a boundary inside an element. */
START_TEST(test_codec_parts)
{
	static const size_t sizes[] = { 1, 7, 64, 4097, 65537, 200001,
					1000003 };
	static const int widths[] = { 2, 4, 8 };
	size_t maxn = 1000003;
	uint8_t *raw = malloc(maxn), *out = malloc(fmt_codec_bound(maxn));
	uint8_t *back = malloc(maxn), *ref = malloc(maxn);
	fmt_codec_ctx *c = fmt_codec_ctx_new();

	prep_seen = malloc(maxn);
	ck_assert(c && raw && out && back && ref && prep_seen);
	for (int kind = 0; kind < D_KINDS; kind++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]);
		     si++) {
			fill_kind(raw, sizes[si], kind);
			for (int codec = 0; codec < CKPT_CODEC_COUNT; codec++)
				for (size_t wi = 0; wi < 3; wi++)
					check_parts(c, raw, sizes[si], codec,
						    widths[wi], out, back, ref);
		}
	}
	fmt_codec_ctx_free(c);
	free(raw);
	free(out);
	free(back);
	free(ref);
	free(prep_seen);
}
END_TEST

/* Decoding garbage, truncated or flipped payloads never crashes; garbage
 * and truncations are errors. Runs under ASan in CI. */
START_TEST(test_codec_garbage)
{
	size_t n = 70000;
	uint8_t *raw = malloc(n), *out = malloc(fmt_codec_bound(n));
	uint8_t *back = malloc(n), *junk = malloc(fmt_codec_bound(n));
	fmt_codec_ctx *c = fmt_codec_ctx_new();
	int used, rc;
	size_t stored;

	for (int iter = 0; iter < 3000; iter++) {
		int codec = 1 + (int)(tf_rnd() % 2);
		int w = (int)(2u << (tf_rnd() % 3));
		size_t len = 1 + tf_rnd() % 300;

		tf_fill_random(junk, len);
		if (codec == CKPT_CODEC_FLOAT && len >= 2 && (iter & 1)) {
			junk[0] = junk[1] = (uint8_t)w; /* get past the header */
			for (int j = 0; j < w && 2 + 5 * j + 5 <= (int)len; j++) {
				junk[2 + 5 * j] = (uint8_t)(tf_rnd() % 3);
				fmt_put_u32(junk + 3 + 5 * j,
					    (uint32_t)(tf_rnd() % 64));
			}
		}
		rc = fmt_chunk_decode(c, codec, w, junk, len, back,
				      1 + tf_rnd() % 4096, errbuf,
				      sizeof(errbuf));
		ck_assert_int_eq(rc, CKPT_E_CORRUPT);
	}
	/* truncations and flips of real payloads */
	for (int kind = D_ZERO; kind <= D_F32; kind++) {
		fill_kind(raw, n, kind);
		for (int codec = 1; codec < CKPT_CODEC_COUNT; codec++) {
			int w = kind == D_F32 ? 4 : 2;

			rc = fmt_chunk_encode(c, codec, 1, w, raw, n, out,
					      fmt_codec_bound(n), &used,
					      &stored);
			ck_assert_int_eq(rc, 0);
			ck_assert(used == codec);
			for (size_t cut = 0; cut < stored; cut += 1 + cut / 8) {
				rc = fmt_chunk_decode(c, used, w, out, cut,
						      back, n, errbuf,
						      sizeof(errbuf));
				ck_assert_msg(rc == CKPT_E_CORRUPT,
					      "cut %zu of %zu", cut, stored);
			}
			/* wrong raw_len */
			ck_assert_int_eq(fmt_chunk_decode(c, used, w, out,
							  stored, back, n - 1,
							  errbuf,
							  sizeof(errbuf)),
					 CKPT_E_CORRUPT);
			/* wrong width for float */
			if (used == CKPT_CODEC_FLOAT)
				ck_assert_int_eq(fmt_chunk_decode(c, used, 8,
						out, stored, back, n, errbuf,
						sizeof(errbuf)), CKPT_E_CORRUPT);
			for (int f = 0; f < 400; f++) {
				size_t pos = tf_rnd() % stored;

				memcpy(junk, out, stored);
				junk[pos] ^= (uint8_t)(1 + tf_rnd() % 255);
				rc = fmt_chunk_decode(c, used, w, junk, stored,
						      back, n, errbuf,
						      sizeof(errbuf));
				ck_assert(rc == 0 || rc == CKPT_E_CORRUPT);
			}
		}
	}
	/* codec none, unknown codec */
	ck_assert_int_eq(fmt_chunk_decode(c, CKPT_CODEC_NONE, 1, raw, 10, back,
					  11, errbuf, sizeof(errbuf)),
			 CKPT_E_CORRUPT);
	ck_assert_int_eq(fmt_chunk_decode(c, 7, 1, raw, 10, back, 10, errbuf,
					  sizeof(errbuf)), CKPT_E_CORRUPT);
	/* two concatenated zstd frames are not one frame */
	{
		size_t a = ZSTD_compress(out, fmt_codec_bound(n), raw, 100, 1);
		size_t b = ZSTD_compress(out + a, fmt_codec_bound(n) - a,
					 raw + 100, 100, 1);

		ck_assert_int_eq(fmt_chunk_decode(c, CKPT_CODEC_ZSTD, 1, out,
						  a + b, back, 200, errbuf,
						  sizeof(errbuf)),
				 CKPT_E_CORRUPT);
	}
	fmt_codec_ctx_free(c);
	free(raw);
	free(out);
	free(back);
	free(junk);
}
END_TEST

/*
 * An independent, slow reading of SPEC.md 5.3 mode 2: canonical codes of
 * DEFLATE, read bit by bit. Returns 0 and fills out[0..n), or -1.
 */
static int ref_huf_decode(const uint8_t *p, size_t len, uint8_t *out,
			  size_t n)
{
	unsigned L[256], count[12] = { 0 }, next[12], code[256], kraft = 0;
	size_t size[4], off = 144, q = (n + 3) / 4;

	if (len < 144)
		return -1;
	for (unsigned x = 0; x < 256; x++) {
		L[x] = (p[x / 2] >> (4 * (x % 2))) & 15;
		if (L[x] > 11)
			return -1;
		if (L[x]) {
			count[L[x]]++;
			kraft += 1u << (11 - L[x]);
		}
	}
	if (kraft != 2048)
		return -1;
	next[1] = 0;
	for (unsigned l = 2; l <= 11; l++)
		next[l] = (next[l - 1] + count[l - 1]) << 1;
	for (unsigned x = 0; x < 256; x++)
		code[x] = L[x] ? next[L[x]]++ : 0;
	for (unsigned s = 0; s < 4; s++) {
		size[s] = fmt_get_u32(p + 128 + 4 * s);
		off += size[s];
	}
	if (off != len)
		return -1;
	off = 144;
	for (unsigned s = 0; s < 4; s++) {
		size_t lo = s * q < n ? s * q : n;
		size_t hi = (s + 1) * q < n ? (s + 1) * q : n, bit = 0;

		for (size_t i = lo; i < hi; i++) {
			unsigned c = 0, l = 0, x = 256;

			while (x == 256) {
				if (bit >= 8 * size[s] || l == 11)
					return -1;
				c = c << 1 | ((p[off + bit / 8] >> (bit % 8)) & 1);
				bit++;
				l++;
				for (unsigned y = 0; y < 256; y++)
					if (L[y] == l && code[y] == c)
						x = y;
			}
			out[i] = (uint8_t)x;
		}
		if ((bit + 7) / 8 != size[s])
			return -1;
		for (; bit < 8 * size[s]; bit++)
			if ((p[off + bit / 8] >> (bit % 8)) & 1)
				return -1;
		off += size[s];
	}
	return 0;
}

/*
 * An independent reading of SPEC.md 5.3: parse a float payload, rebuild
 * each plane, compare with planes computed from the raw bytes by the
 * spec's formulas, and rebuild the raw bytes from the planes.
 */
static void check_float_layout(const uint8_t *raw, size_t raw_len,
			       unsigned w, const uint8_t *p, size_t len)
{
	size_t n = raw_len / w, t = raw_len % w, pos = 2 + 5 * w;
	uint8_t *plane = malloc(n + 1), *rebuilt = malloc(raw_len);
	uint8_t *planes = malloc(n * w + 1);

	ck_assert(p[0] == w && p[1] == w);
	for (unsigned j = 0; j < w; j++) {
		uint8_t mode = p[2 + 5 * j];
		uint32_t l = (uint32_t)p[3 + 5 * j] | (uint32_t)p[4 + 5 * j] << 8 |
			     (uint32_t)p[5 + 5 * j] << 16 |
			     (uint32_t)p[6 + 5 * j] << 24;

		ck_assert(pos + l <= len);
		if (mode == 0) {
			ck_assert_uint_eq(l, n);
			memcpy(plane, p + pos, n);
		} else if (mode == 2) {
			ck_assert_int_eq(ref_huf_decode(p + pos, l, plane, n), 0);
		} else {
			ck_assert_int_eq(mode, 1);
			ck_assert(ZSTD_getFrameContentSize(p + pos, l) == n);
			ck_assert_uint_eq(ZSTD_decompress(plane, n, p + pos, l), n);
		}
		for (size_t i = 0; i < n; i++) {
			uint64_t x = 0, r;

			for (unsigned b = 0; b < w; b++)
				x |= (uint64_t)raw[i * w + b] << (8 * b);
			r = (x << 1) | (x >> (8 * w - 1));
			if (w < 8)
				r &= (1ull << (8 * w)) - 1;
			ck_assert_msg(plane[i] == (uint8_t)(r >> (8 * (w - 1 - j))),
				      "w %u plane %u element %zu", w, j, i);
		}
		memcpy(planes + j * n, plane, n);
		pos += l;
	}
	ck_assert_uint_eq(pos + t, len);
	ck_assert(memcmp(p + pos, raw + n * w, t) == 0);
	for (size_t i = 0; i < n; i++) {
		uint64_t r = 0, x;

		for (unsigned j = 0; j < w; j++)
			r |= (uint64_t)planes[j * n + i] << (8 * (w - 1 - j));
		x = (r >> 1) | (r << (8 * w - 1));
		for (unsigned b = 0; b < w; b++)
			rebuilt[i * w + b] = (uint8_t)(x >> (8 * b));
	}
	memcpy(rebuilt + n * w, p + pos, t);
	ck_assert(memcmp(rebuilt, raw, raw_len) == 0);
	free(plane);
	free(planes);
	free(rebuilt);
}

START_TEST(test_float_layout)
{
	static const size_t sizes[] = { 200003, 65536 * 2 + 7, 4097, 3333 };
	size_t maxn = 200003;
	uint8_t *raw = malloc(maxn), *out = malloc(fmt_codec_bound(maxn));
	fmt_codec_ctx *c = fmt_codec_ctx_new();

	for (unsigned w = 2; w <= 8; w *= 2) {
		for (size_t si = 0; si < 4; si++) {
			size_t n = sizes[si], stored;
			int used;

			/* sign and small exponents vary, low bytes random */
			for (size_t i = 0; i + w <= n; i += w) {
				uint64_t v = tf_rnd();

				for (unsigned b = 0; b + 1 < w; b++)
					raw[i + b] = (uint8_t)(v >> (8 * b));
				raw[i + w - 1] = (uint8_t)(0x3c | (v >> 63) << 7 |
							   ((v >> 60) & 1));
			}
			for (size_t i = n / w * w; i < n; i++)
				raw[i] = (uint8_t)(0xa0 + i);
			ck_assert_int_eq(fmt_chunk_encode(c, CKPT_CODEC_FLOAT, 1,
					(int)w, raw, n, out,
					fmt_codec_bound(n), &used, &stored), 0);
			ck_assert_msg(used == CKPT_CODEC_FLOAT, "w %u n %zu: %d",
				      w, n, used);
			check_float_layout(raw, n, w, out, stored);
		}
	}
	fmt_codec_ctx_free(c);
	free(raw);
	free(out);
}
END_TEST

static double mbps(size_t bytes, double s)
{
	return s > 0 ? bytes / s / 1e6 : 0;
}

/* The float codec's reason to exist: bf16 weights ~ N(0, 0.02). */
START_TEST(test_bf16_ratio)
{
	const size_t chunk = 4u << 20, nchunks = 8, total = chunk * nchunks;
	uint8_t *raw = malloc(total), *out = malloc(fmt_codec_bound(chunk));
	uint8_t *back = malloc(chunk);
	uint8_t *enc = malloc(nchunks * fmt_codec_bound(chunk));
	size_t encl[8], fstored = 0, zstored = 0;
	int used[8];
	fmt_codec_ctx *c = fmt_codec_ctx_new();
	double t0, tf_enc = 0, tf_dec = 0, tz_enc = 0, tz_dec = 0;

	tf_rng_state = 12345;
	tf_fill_bf16_normal(raw, total / 2, 0.02);

	for (int codec = CKPT_CODEC_ZSTD; codec <= CKPT_CODEC_FLOAT; codec++) {
		size_t sum = 0;

		t0 = tf_now_s();
		for (size_t k = 0; k < nchunks; k++) {
			ck_assert_int_eq(fmt_chunk_encode(c, codec, 1, 2,
					raw + k * chunk, chunk,
					enc + k * fmt_codec_bound(chunk),
					fmt_codec_bound(chunk), &used[k],
					&encl[k]), 0);
			ck_assert_int_eq(used[k], codec);
			if (codec == CKPT_CODEC_FLOAT) /* exponent plane */
				ck_assert_int_eq(enc[k * fmt_codec_bound(chunk) + 2],
						 2);
			sum += encl[k];
		}
		double te = tf_now_s() - t0;

		t0 = tf_now_s();
		for (size_t k = 0; k < nchunks; k++)
			ck_assert_int_eq(fmt_chunk_decode(c, used[k], 2,
					enc + k * fmt_codec_bound(chunk),
					encl[k], back, chunk, errbuf,
					sizeof(errbuf)), 0);
		double td = tf_now_s() - t0;

		ck_assert(memcmp(back, raw + (nchunks - 1) * chunk, chunk) == 0);
		if (codec == CKPT_CODEC_ZSTD) {
			zstored = sum;
			tz_enc = te;
			tz_dec = td;
		} else {
			fstored = sum;
			tf_enc = te;
			tf_dec = td;
		}
	}
	printf("bf16 N(0,0.02), %zu x 4 MiB chunks, level 1:\n", nchunks);
	printf("  zstd : ratio %.4f  encode %7.1f MB/s  decode %7.1f MB/s\n",
	       (double)zstored / total, mbps(total, tz_enc),
	       mbps(total, tz_dec));
	printf("  float: ratio %.4f  encode %7.1f MB/s  decode %7.1f MB/s\n",
	       (double)fstored / total, mbps(total, tf_enc),
	       mbps(total, tf_dec));
	ck_assert_msg((double)fstored <= 0.70 * total, "float ratio %.4f",
		      (double)fstored / total);
	ck_assert_msg(fstored < zstored, "float %zu not better than zstd %zu",
		      fstored, zstored);

	/* f32 N(0,1): reported only */
	tf_fill_f32_normal(raw, total / 4, 1.0);
	for (int codec = CKPT_CODEC_ZSTD; codec <= CKPT_CODEC_FLOAT; codec++) {
		size_t sum = 0, got;
		int u;

		t0 = tf_now_s();
		for (size_t k = 0; k < nchunks; k++) {
			ck_assert_int_eq(fmt_chunk_encode(c, codec, 1, 4,
					raw + k * chunk, chunk, out,
					fmt_codec_bound(chunk), &u, &got), 0);
			sum += got;
		}
		printf("  f32 N(0,1) %-5s: ratio %.4f  encode %7.1f MB/s\n",
		       ckpt_codec_name(codec), (double)sum / total,
		       mbps(total, tf_now_s() - t0));
	}
	fflush(stdout);
	fmt_codec_ctx_free(c);
	free(raw);
	free(out);
	free(back);
	free(enc);
}
END_TEST

/* ---- Huffman planes (float codec mode 2) ---- */

/* ck_assert logs every passing check; these run in hot loops */
#define QUIET_ASSERT(cond, ...)                                        \
	do {                                                           \
		if (!(cond))                                           \
			ck_abort_msg(__VA_ARGS__);                     \
	} while (0)

enum { H_TWO, H_GEO50, H_GEO90, H_GEO99, H_UNIFORM, H_FEW, H_FIB, H_EXP,
       H_RAMP, H_KINDS };

static void fill_huf(uint8_t *p, size_t n, int kind)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t r = tf_rnd();
		unsigned x = 0;

		switch (kind) {
		case H_TWO: x = 0x40 + (unsigned)(r & 1) * 0x80; break;
		case H_GEO50: while (x < 255 && (r >> x & 1)) x++; break;
		case H_GEO90: while (x < 255 && r % 10) { x++; r /= 10; }
			break;
		case H_GEO99: x = r % 100 ? 7 : (unsigned)(r >> 8) % 256;
			break;
		case H_UNIFORM: x = (unsigned)(r >> 56); break;
		case H_FEW: x = (unsigned)(r % 5) * 51; break;
		case H_FIB:
			/* value k with probability ~ 2^-(k+1): a Huffman code
			 * 40 deep, which must be limited to 11 */
			x = r ? (unsigned)__builtin_ctzll(r) : 64;
			x = 200 + x % 50;
			break;
		case H_EXP: {
			uint16_t b = tf_f32_to_bf16((float)(((double)(r >> 11) /
				9007199254740992.0 - 0.5) * 0.05));

			b = (uint16_t)(b << 1 | b >> 15);
			x = b >> 8;
			break;
		}
		default: x = (unsigned)(i / 3) & 0xff; break;
		}
		p[i] = (uint8_t)x;
	}
}

/* Encodes p[0..n) as a mode-2 plane into a fresh exact-size buffer; NULL
 * if fewer than two distinct values. Checks the code is limited and
 * complete and the size is as predicted. */
static uint8_t *huf_enc(const uint8_t *p, size_t n, uint32_t *pairs,
			size_t *len)
{
	uint32_t h[4][256];
	uint64_t cnt[256], size;
	uint8_t L[256], *out;
	unsigned distinct = 0, kraft = 0;

	fmt_huf_hist(p, n, h);
	for (unsigned x = 0; x < 256; x++) {
		cnt[x] = (uint64_t)h[0][x] + h[1][x] + h[2][x] + h[3][x];
		distinct += cnt[x] != 0;
	}
	if (fmt_huf_lengths(cnt, L)) {
		ck_assert_uint_lt(distinct, 2);
		return NULL;
	}
	for (unsigned x = 0; x < 256; x++) {
		ck_assert_uint_le(L[x], FMT_HUF_MAXLEN);
		ck_assert((L[x] != 0) == (cnt[x] != 0));
		if (L[x])
			kraft += 2048u >> L[x];
	}
	ck_assert_uint_eq(kraft, 2048);
	size = fmt_huf_size(h, L);
	out = malloc(size);
	ck_assert_uint_eq(fmt_huf_encode(p, n, h, L, out, size - 1, pairs), 0);
	*len = fmt_huf_encode(p, n, h, L, out, size, pairs);
	ck_assert_uint_eq(*len, size);
	return out;
}

static int huf_try(const uint8_t *e, size_t len, size_t n)
{
	uint8_t *in = malloc(len ? len : 1), *out = malloc(n ? n : 1);
	int rc;

	memcpy(in, e, len);
	rc = fmt_huf_decode(in, len, out, n, "t", errbuf, sizeof(errbuf));
	QUIET_ASSERT(rc == 0 || rc == CKPT_E_CORRUPT, "rc %d", rc);
	QUIET_ASSERT(rc == 0 || strncmp(errbuf, "t: huffman: ", 12) == 0,
		     "message %s", errbuf);
	free(in);
	free(out);
	return rc;
}

START_TEST(test_huf_roundtrip)
{
	static const size_t sizes[] = { 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31,
		33, 63, 64, 65, 100, 127, 129, 1000, 4095, 4097, 65539,
		(1u << 20) + 5 };
	size_t maxn = (1u << 20) + 5;
	uint8_t *p = malloc(maxn);
	uint32_t *pairs = malloc(FMT_HUF_PAIRS * sizeof(uint32_t));

	for (int kind = 0; kind < H_KINDS; kind++) {
		for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
			size_t n = sizes[si], len;

			fill_huf(p, n, kind);
			for (int usep = 0; usep < 2; usep++) {
				uint8_t *e = huf_enc(p, n, usep ? pairs : NULL,
						     &len);
				uint8_t *back = malloc(n), *ref = malloc(n);

				if (!e) {
					free(back);
					free(ref);
					continue;
				}
				ck_assert_msg(fmt_huf_decode(e, len, back, n,
						"t", errbuf, sizeof(errbuf)) == 0,
					      "kind %d n %zu: %s", kind, n,
					      errbuf);
				ck_assert_msg(memcmp(back, p, n) == 0,
					      "kind %d n %zu differs", kind, n);
				if (n <= 5000) {
					ck_assert_int_eq(ref_huf_decode(e, len,
							ref, n), 0);
					ck_assert(memcmp(ref, p, n) == 0);
				}
				/* another element count: no crash (it may
				 * decode when every stream keeps its size) */
				huf_try(e, len, n - 1);
				huf_try(e, len, n + 1);
				free(e);
				free(back);
				free(ref);
			}
		}
	}
	/* through the codec: planes of skewed bytes are coded with mode 2 */
	{
		size_t n = 40001;
		uint8_t *raw = malloc(n), *out = malloc(fmt_codec_bound(n));
		uint8_t *back = malloc(n);
		fmt_codec_ctx *c = fmt_codec_ctx_new();
		int used, seen2 = 0;
		size_t stored;

		for (int kind = 0; kind < H_KINDS; kind++) {
			fill_huf(raw, n, kind);
			for (unsigned w = 2; w <= 8; w *= 2) {
				roundtrip(c, CKPT_CODEC_FLOAT, (int)w, 1, raw,
					  n, out, back, &used, &stored);
				if (used == CKPT_CODEC_FLOAT) {
					for (unsigned j = 0; j < w; j++)
						seen2 |= out[2 + 5 * j] == 2;
					check_float_layout(raw, n, w, out,
							   stored);
				}
			}
		}
		ck_assert(seen2);
		fmt_codec_ctx_free(c);
		free(raw);
		free(out);
		free(back);
	}
	free(p);
	free(pairs);
}
END_TEST

/* Hostile mode-2 planes never crash (ASan) and are rejected. */
START_TEST(test_huf_hostile)
{
	size_t n = 100003, len, len2;
	uint8_t *p = malloc(n), *e, *e2, *j;

	/* every truncation and extension of real planes */
	fill_huf(p, n, H_EXP);
	e = huf_enc(p, n, NULL, &len);
	for (size_t cut = 0; cut < len; cut += 1 + cut / 64)
		QUIET_ASSERT(huf_try(e, cut, n) == CKPT_E_CORRUPT, "accepted");
	j = malloc(len + 1);
	memcpy(j, e, len);
	j[len] = 0;
	QUIET_ASSERT(huf_try(j, len + 1, n) == CKPT_E_CORRUPT, "accepted");
	/* one more byte in a stream (sizes adjusted) */
	for (unsigned s = 0; s < 4; s++) {
		uint8_t *k = malloc(len + 1);
		size_t at = 144;

		for (unsigned t = 0; t <= s; t++)
			at += fmt_get_u32(e + 128 + 4 * t);
		memcpy(k, e, at);
		k[at] = 0;
		memcpy(k + at + 1, e + at, len - at);
		fmt_put_u32(k + 128 + 4 * s, fmt_get_u32(e + 128 + 4 * s) + 1);
		QUIET_ASSERT(huf_try(k, len + 1, n) == CKPT_E_CORRUPT, "accepted");
		free(k);
	}
	/* random bit flips: any outcome but a crash */
	for (int f = 0; f < 3000; f++) {
		size_t pos = tf_rnd() % len;

		j[pos] ^= (uint8_t)(1u << (tf_rnd() % 8));
		huf_try(j, len, n);
		memcpy(j, e, len);
	}
	/* flips in the header: the lengths or the sizes change */
	for (size_t pos = 0; pos < 144; pos++)
		for (int bit = 0; bit < 8; bit++) {
			j[pos] ^= (uint8_t)(1u << bit);
			QUIET_ASSERT(huf_try(j, len, n) == CKPT_E_CORRUPT,
				     "header byte %zu bit %d", pos, bit);
			j[pos] ^= (uint8_t)(1u << bit);
		}
	free(j);
	/* every bit of small planes */
	for (size_t m = 1; m <= 300; m = m * 3 + 1) {
		fill_huf(p, m, H_GEO50);
		p[0] = 0;
		p[m - 1] = 1;
		e2 = huf_enc(p, m, NULL, &len2);
		ck_assert(e2 != NULL || m == 1);
		if (!e2)
			continue;
		for (size_t pos = 0; pos < len2; pos++)
			for (int bit = 0; bit < 8; bit++) {
				e2[pos] ^= (uint8_t)(1u << bit);
				huf_try(e2, len2, m);
				e2[pos] ^= (uint8_t)(1u << bit);
			}
		for (size_t cut = 0; cut < len2; cut++)
			QUIET_ASSERT(huf_try(e2, cut, m) == CKPT_E_CORRUPT, "accepted");
		free(e2);
	}
	/* bad code lengths: too long, incomplete, oversubscribed */
	{
		uint8_t h[144 + 8];

		memset(h, 0, sizeof(h));
		h[0] = 0x11; /* values 0 and 1, length 1: complete */
		/* n = 64: 16 one-bit symbols, 2 bytes, in each stream */
		for (unsigned t = 0; t < 4; t++)
			fmt_put_u32(h + 128 + 4 * t, 2);
		ck_assert_int_eq(huf_try(h, sizeof(h), 64), 0);
		h[0] = 0xc1; /* length 12 */
		ck_assert_int_eq(huf_try(h, sizeof(h), 64),
				 CKPT_E_CORRUPT);
		h[0] = 0x01; /* one value: incomplete */
		ck_assert_int_eq(huf_try(h, sizeof(h), 64),
				 CKPT_E_CORRUPT);
		h[0] = 0x21; /* 1 + 2: incomplete */
		ck_assert_int_eq(huf_try(h, sizeof(h), 64),
				 CKPT_E_CORRUPT);
		h[0] = 0x11;
		h[1] = 0x01; /* 1 + 1 + 1: oversubscribed */
		ck_assert_int_eq(huf_try(h, sizeof(h), 64),
				 CKPT_E_CORRUPT);
		h[1] = 0;
		h[144] = 0xff; /* fine: other symbols */
		ck_assert_int_eq(huf_try(h, sizeof(h), 64), 0);
		fmt_put_u32(h + 128, 1); /* 16 symbols in 8 bits */
		fmt_put_u32(h + 132, 3);
		ck_assert_int_eq(huf_try(h, sizeof(h), 64),
				 CKPT_E_CORRUPT);
		fmt_put_u32(h + 128, 2);
		fmt_put_u32(h + 132, 2);
		/* 17 symbols per stream need 3 bytes; 8 need 1 */
		ck_assert_int_eq(huf_try(h, sizeof(h), 65),
				 CKPT_E_CORRUPT);
		ck_assert_int_eq(huf_try(h, sizeof(h), 32),
				 CKPT_E_CORRUPT);
		/* n = 61: 16, 16, 16, 13 symbols; sizes 2, 6, 0, 0 */
		fmt_put_u32(h + 132, 6);
		fmt_put_u32(h + 136, 0);
		fmt_put_u32(h + 140, 0);
		ck_assert_int_eq(huf_try(h, sizeof(h), 61),
				 CKPT_E_CORRUPT);
		fmt_put_u32(h + 128, 0xffffffffu); /* sizes overflow */
		fmt_put_u32(h + 132, 0xffffffffu);
		fmt_put_u32(h + 136, 0xffffffffu);
		fmt_put_u32(h + 140, 11);
		ck_assert_int_eq(huf_try(h, sizeof(h), 64),
				 CKPT_E_CORRUPT);
		/* nonzero padding: 4 symbols of 1 bit in one byte */
		memset(h + 128, 0, 16);
		fmt_put_u32(h + 128, 1);
		fmt_put_u32(h + 132, 1);
		fmt_put_u32(h + 136, 1);
		fmt_put_u32(h + 140, 1);
		memset(h + 144, 0, 4);
		ck_assert_int_eq(huf_try(h, 148, 4), 0);
		h[146] = 0x02;
		ck_assert_int_eq(huf_try(h, 148, 4), CKPT_E_CORRUPT);
		h[146] = 0x01;
		ck_assert_int_eq(huf_try(h, 148, 4), 0);
		ck_assert_int_eq(huf_try(h, 148, 9), CKPT_E_CORRUPT);
		ck_assert_int_eq(huf_try(h, 148, 3),
				 CKPT_E_CORRUPT);
	}
	/* random streams under random complete codes */
	for (int it = 0; it < 2000; it++) {
		size_t m = 1 + tf_rnd() % 5000, sl = tf_rnd() % 3000, tot = 0;
		uint8_t *g = malloc(144 + sl + 16), L[256];
		uint64_t cnt[256];

		for (unsigned x = 0; x < 256; x++)
			cnt[x] = tf_rnd() % 3 ? 0 : tf_rnd() >> (tf_rnd() % 64);
		cnt[tf_rnd() % 256] = 1;
		cnt[tf_rnd() % 256] += 1;
		if (fmt_huf_lengths(cnt, L))
			memset(L, 8, sizeof(L));
		for (unsigned x = 0; x < 256; x += 2)
			g[x / 2] = (uint8_t)(L[x] | L[x + 1] << 4);
		for (unsigned s = 0; s < 4; s++) {
			size_t z = s == 3 ? sl - tot :
					    tf_rnd() % (sl - tot + 1);

			fmt_put_u32(g + 128 + 4 * s, (uint32_t)z);
			tot += z;
		}
		tf_fill_random(g + 144, sl);
		huf_try(g, 144 + sl, m);
		free(g);
	}
	/* mode 2 in a float payload: too short, and a real one flipped */
	{
		size_t rn = 65536;
		uint8_t *raw = malloc(rn), *out = malloc(fmt_codec_bound(rn));
		uint8_t *back = malloc(rn);
		fmt_codec_ctx *c = fmt_codec_ctx_new();
		int used;
		size_t stored;

		fill_kind(raw, rn, D_BF16);
		ck_assert_int_eq(fmt_chunk_encode(c, CKPT_CODEC_FLOAT, 1, 2, raw,
				rn, out, fmt_codec_bound(rn), &used, &stored), 0);
		ck_assert_int_eq(used, CKPT_CODEC_FLOAT);
		ck_assert_int_eq(out[2], 2);
		ck_assert_int_eq(fmt_chunk_decode(c, used, 2, out, stored, back,
				rn, errbuf, sizeof(errbuf)), 0);
		/* every bit of the headers, then random bits */
		for (size_t fl = 0; fl < 8 * 200 + 3000; fl++) {
			size_t pos = fl < 8 * 200 ? fl / 8 : tf_rnd() % stored;
			int bit = fl < 8 * 200 ? (int)(fl % 8) :
						 (int)(tf_rnd() % 8), rc;

			out[pos] ^= (uint8_t)(1u << bit);
			rc = fmt_chunk_decode(c, used, 2, out, stored, back, rn,
					      errbuf, sizeof(errbuf));
			QUIET_ASSERT(rc == 0 || rc == CKPT_E_CORRUPT, "rc %d", rc);
			out[pos] ^= (uint8_t)(1u << bit);
		}
		/* plane 0 declared mode 2 with fewer than 144 bytes */
		{
			uint8_t f[2 + 10 + 100 + 2048];

			memset(f, 0, sizeof(f));
			f[0] = f[1] = 2;
			f[2] = 2;
			fmt_put_u32(f + 3, 100);
			f[7] = 0;
			fmt_put_u32(f + 8, 2048);
			ck_assert_int_eq(fmt_chunk_decode(c, CKPT_CODEC_FLOAT, 2,
					f, sizeof(f), back, 4096, errbuf,
					sizeof(errbuf)), CKPT_E_CORRUPT);
		}
		fmt_codec_ctx_free(c);
		free(raw);
		free(out);
		free(back);
	}
	free(e);
	free(p);
}
END_TEST

static Suite *format_codec_suite(void)
{
	Suite *s = suite_create("format_codec");
	TCase *tc = tcase_create("codec");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_codec_roundtrip);
	tcase_add_test(tc, test_codec_garbage);
	tcase_add_test(tc, test_codec_parts);
	tcase_add_test(tc, test_float_layout);
	tcase_add_test(tc, test_bf16_ratio);
	tcase_add_test(tc, test_huf_roundtrip);
	tcase_add_test(tc, test_huf_hostile);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tf_main(format_codec_suite());
}
