/*
 * test_format_fast.c - the float codec's fast path (fmt_codec.c,
 * encode_float_fast; fmt_huf.c, fmt_huf_encode_elems): the exponent plane
 * coded straight from the elements with a code built from a sample.
 *
 *   - fmt_huf_encode_elems with the exact histogram's code writes the same
 *     bytes as fmt_huf_encode over the split plane (widths 2 and 4, plane
 *     sizes that do and do not divide into the streams, the tail loops);
 *     it refuses a plane holding a symbol without a code (in the fast
 *     loop and in each tail), an incomplete code, a width it does not
 *     know, and a cap it cannot fit;
 *   - chunks of trained-weight-like bf16 and f32 take the fast path
 *     (exponent plane Huffman, the other planes raw) and store at most 1%
 *     more than the exact histogram's code would;
 *   - a chunk holding exponents the sample never saw (far outliers placed
 *     between the sample's windows, zeros, a last element out of range)
 *     still round-trips exactly: the coder refuses it and the exact path
 *     codes it.
 * Uses only fmt.h / ckpt.h (no testutil).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "fmt.h"
#include "fmt_huf.h"
#include "tu_format.h"

/* byte w-1 of each element rotated left by one bit (SPEC.md 5.3) */
static void exp_plane(const uint8_t *src, size_t n, unsigned w, uint8_t *p)
{
	for (size_t i = 0; i < n; i++) {
		uint64_t x = 0;

		for (unsigned k = 0; k < w; k++)
			x |= (uint64_t)src[w * i + k] << (8 * k);
		p[i] = (uint8_t)(x >> (8 * w - 9));
	}
}

/* Exact code of plane p: histograms and lengths; -1 if < 2 symbols. */
static int exact_code(const uint8_t *p, size_t n,
		      uint32_t h[FMT_HUF_STREAMS][256], uint8_t len[256])
{
	uint64_t cnt[256];

	fmt_huf_hist(p, n, h);
	for (unsigned x = 0; x < 256; x++)
		cnt[x] = (uint64_t)h[0][x] + h[1][x] + h[2][x] + h[3][x];
	return fmt_huf_lengths(cnt, len);
}

static void fill(uint8_t *raw, size_t n, unsigned w, double sigma)
{
	if (w == 2)
		tf_fill_bf16_normal(raw, n, sigma);
	else
		tf_fill_f32_normal(raw, n, sigma);
}

START_TEST(test_elems_same_bytes)
{
	static const size_t sizes[] = { 4, 5, 7, 33, 1001, 4099, 65536, 300007 };
	uint32_t *pairs = malloc(FMT_HUF_PAIRS * sizeof(uint32_t));
	const unsigned w = _i ? 4 : 2;

	ck_assert_ptr_nonnull(pairs);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		size_t n = sizes[k], cap = n + FMT_HUF_HDR + 64;
		uint8_t *raw = malloc(n * w), *p = malloc(n);
		uint8_t *a = malloc(cap), *b = malloc(4 * cap), *back = malloc(n);
		uint32_t h[FMT_HUF_STREAMS][256];
		uint8_t len[256];
		size_t la, lb;

		ck_assert(raw && p && a && b && back);
		fill(raw, n, w, 0.02);
		exp_plane(raw, n, w, p);
		if (exact_code(p, n, h, len)) {
			/* one symbol only: no code; only tiny planes */
			ck_assert_uint_lt(n, 100);
			goto next;
		}
		la = fmt_huf_encode(p, n, h, len, a, cap, NULL);
		ck_assert_uint_gt(la, 0);
		/* a quarter of the cap for each stream: 4x the size fits */
		lb = fmt_huf_encode_elems(raw, n, w, len, b, 4 * la, pairs);
		ck_assert_msg(lb == la, "n %zu w %u: %zu bytes, %zu expected", n,
			      w, lb, la);
		ck_assert_msg(!memcmp(a, b, la), "n %zu w %u: bytes differ", n,
			      w);
		ck_assert_int_eq(fmt_huf_decode(b, lb, back, n, "t", NULL, 0),
				 0);
		ck_assert(!memcmp(back, p, n));
		/* no room: every stream cannot fit in a quarter of size - 1 */
		ck_assert_uint_eq(fmt_huf_encode_elems(raw, n, w, len, b, la - 1,
						       pairs), 0);
next:
		free(raw);
		free(p);
		free(a);
		free(b);
		free(back);
	}
	free(pairs);
}
END_TEST

/* A symbol without a code is refused wherever it sits: in the paired
 * loop, in each stream's tail, as the plane's last element. */
START_TEST(test_elems_refuses)
{
	const size_t n = 65536 + 11; /* tails of 2 or 3 elements */
	const unsigned w = 2;
	uint32_t *pairs = malloc(FMT_HUF_PAIRS * sizeof(uint32_t));
	uint8_t *raw = malloc(n * w), *p = malloc(n), *dst = malloc(4 * n);
	size_t q = (n + 3) / 4;
	const size_t at[] = { 0, 1, 100, q + 7, 2 * q + 5, q - 1, 2 * q - 1,
			      3 * q - 1, n - 1, n - 2 };
	uint32_t h[FMT_HUF_STREAMS][256];
	uint8_t len[256], bad[256];

	ck_assert(pairs && raw && p && dst);
	tf_fill_bf16_normal(raw, n, 0.02);
	exp_plane(raw, n, w, p);
	ck_assert_int_eq(exact_code(p, n, h, len), 0);
	ck_assert_uint_gt(fmt_huf_encode_elems(raw, n, w, len, dst, 4 * n,
					       pairs), 0);
	ck_assert_uint_eq(fmt_huf_encode_elems(raw, n, 3, len, dst, 4 * n,
					       pairs), 0);
	ck_assert_uint_eq(fmt_huf_encode_elems(raw, n, w, len, dst, 4 * n,
					       NULL), 0);
	memcpy(bad, len, sizeof(bad));
	for (unsigned x = 0; x < 256; x++)
		if (bad[x]) {
			bad[x]++; /* no longer complete */
			break;
		}
	ck_assert_uint_eq(fmt_huf_encode_elems(raw, n, w, bad, dst, 4 * n,
					       pairs), 0);
	for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
		uint8_t save[2];

		memcpy(save, raw + 2 * at[k], 2);
		raw[2 * at[k]] = 0x80;
		raw[2 * at[k] + 1] = 0x7f; /* +inf: exponent 255, no code */
		ck_assert_uint_eq(len[255], 0);
		ck_assert_msg(fmt_huf_encode_elems(raw, n, w, len, dst, 4 * n,
						   pairs) == 0,
			      "element %zu without a code was accepted",
			      at[k]);
		memcpy(raw + 2 * at[k], save, 2);
	}
	free(pairs);
	free(raw);
	free(p);
	free(dst);
}
END_TEST

/* Plane j's mode and stored length from the float header. */
static void plane_hdr(const uint8_t *out, unsigned j, unsigned *mode,
		      size_t *len)
{
	*mode = out[2 + 5 * j];
	*len = (size_t)out[3 + 5 * j] | (size_t)out[4 + 5 * j] << 8 |
	       (size_t)out[5 + 5 * j] << 16 | (size_t)out[6 + 5 * j] << 24;
}

/* Encodes raw as one float chunk, checks the round trip; returns the
 * stored size and plane 0's header. */
static size_t enc_check(fmt_codec_ctx *c, const uint8_t *raw, size_t bytes,
			unsigned w, uint8_t *out, unsigned *mode0,
			size_t *len0)
{
	uint8_t *back = malloc(bytes);
	size_t stored;
	int used;

	ck_assert_ptr_nonnull(back);
	ck_assert_int_eq(fmt_chunk_encode(c, CKPT_CODEC_FLOAT, 0, (int)w, raw,
					  bytes, out, fmt_codec_bound(bytes),
					  &used, &stored),
			 0);
	ck_assert_int_eq(used, CKPT_CODEC_FLOAT);
	ck_assert_int_eq(fmt_chunk_decode(c, used, (int)w, out, stored, back,
					  bytes, NULL, 0),
			 0);
	ck_assert_msg(!memcmp(back, raw, bytes), "round trip differs");
	plane_hdr(out, 0, mode0, len0);
	free(back);
	return stored;
}

/* Trained-weight-like chunks (4 MiB, one outlier in 10^4) take the fast
 * path and lose at most 1% against the exact code. The plane's code tells
 * the paths apart: the exact one gives no length to a symbol the chunk
 * lacks, the sampled one gives lengths to the exponents around the
 * sample's range, some of which the chunk lacks. */
START_TEST(test_fast_weights)
{
	const unsigned w = _i ? 4 : 2;
	const size_t bytes = 4u << 20, n = bytes / w;
	fmt_codec_ctx *c = fmt_codec_ctx_new();
	uint8_t *raw = malloc(bytes + 1), *out = malloc(fmt_codec_bound(bytes + 1));
	uint8_t *p = malloc(n);
	uint32_t h[FMT_HUF_STREAMS][256];
	uint8_t len[256];
	unsigned mode, coded_absent = 0;
	size_t l0, stored;

	ck_assert(c && raw && out && p);
	fill(raw, n, w, 0.02);
	for (size_t i = 0; i < n; i += 9973) { /* outliers, N(0, 1)-sized */
		uint8_t one[4];

		fill(one, 1, w, 1.0);
		memcpy(raw + w * i, one, w);
	}
	raw[bytes] = 0x5a; /* a tail byte */
	stored = enc_check(c, raw, bytes + 1, w, out, &mode, &l0);
	ck_assert_uint_eq(mode, 2);
	for (unsigned j = 1; j < w; j++) {
		unsigned m;
		size_t l;

		plane_hdr(out, j, &m, &l);
		ck_assert_uint_eq(m, 0);
		ck_assert_uint_eq(l, n);
	}
	ck_assert_uint_eq(stored, 2 + 5 * w + l0 + (w - 1) * n + 1);
	exp_plane(raw, n, w, p);
	ck_assert_int_eq(exact_code(p, n, h, len), 0);
	for (unsigned x = 0; x < 256; x++) {
		const uint8_t *lens = out + 2 + 5 * w; /* plane 0's code */

		coded_absent += (lens[x / 2] >> (4 * (x & 1)) & 15) && !len[x];
	}
	ck_assert_msg(coded_absent > 0, "the exponent plane's code is the "
		      "chunk's own: the fast path was not taken");
	ck_assert_msg(l0 * 100 <= fmt_huf_size(h, len) * 101,
		      "exponent plane %zu bytes, exact code %llu", l0,
		      (unsigned long long)fmt_huf_size(h, len));
	printf("w=%u: exponent plane %zu bytes, exact code %llu (%+.2f%%)\n",
	       w, l0, (unsigned long long)fmt_huf_size(h, len),
	       100.0 * ((double)l0 / (double)fmt_huf_size(h, len) - 1));
	fmt_codec_ctx_free(c);
	free(raw);
	free(out);
	free(p);
}
END_TEST

/* Exponents the sample cannot have seen: the chunk still round-trips,
 * its exponent plane still Huffman-coded (the exact path). */
START_TEST(test_fast_unseen)
{
	const unsigned w = _i ? 4 : 2;
	const size_t bytes = 4u << 20, n = bytes / w;
	fmt_codec_ctx *c = fmt_codec_ctx_new();
	uint8_t *raw = malloc(bytes), *out = malloc(fmt_codec_bound(bytes));
	/* windows of the sample start at k * n / 8: these are between */
	const size_t at[] = { n / 8 - 1, n / 2 - 3, n / 4 + n / 16, n - 1 };
	unsigned mode;
	size_t l0;

	ck_assert(c && raw && out);
	for (int kind = 0; kind < 3; kind++) {
		fill(raw, n, w, 0.02);
		for (size_t k = 0; k < sizeof(at) / sizeof(at[0]); k++) {
			uint8_t *e = raw + w * at[k];

			memset(e, 0, w);
			if (kind == 0) /* 2^100 or so: far above */
				e[w - 1] = 0x72;
			else if (kind == 1) /* 2^-100 or so: far below */
				e[w - 1] = 0x0c;
			else /* +inf */
				e[w - 1] = 0x7f, e[w - 2] = 0x80;
		}
		enc_check(c, raw, bytes, w, out, &mode, &l0);
		ck_assert_uint_eq(mode, 2);
	}
	fmt_codec_ctx_free(c);
	free(raw);
	free(out);
}
END_TEST

static Suite *format_fast_suite(void)
{
	Suite *s = suite_create("format_fast");
	TCase *tc = tcase_create("fast");

	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_elems_same_bytes, 0, 2);
	tcase_add_test(tc, test_elems_refuses);
	tcase_add_loop_test(tc, test_fast_weights, 0, 2);
	tcase_add_loop_test(tc, test_fast_unseen, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tf_main(format_fast_suite());
}
