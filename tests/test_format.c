/*
 * test_format.c - format v1 (format/): byte helpers, names, headers,
 * codecs, metadata frames, index and commit documents, and the rejection
 * of hostile input. Uses only fmt.h / ckpt.h (no testutil).
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <zstd.h>

#include "ckpt.h"
#include "fmt.h"
#include "fmt_huf.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	/* splitmix64: fixed seed, reproducible */
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(rnd() >> 56);
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
	return (uint16_t)(u >> 16);
}

/* bf16 values from N(0, sigma), little-endian. */
static void fill_bf16_normal(uint8_t *p, size_t n_elems, double sigma)
{
	for (size_t i = 0; i < n_elems; i += 2) {
		double u1 = ((rnd() >> 11) + 1) * (1.0 / 9007199254740992.0);
		double u2 = (rnd() >> 11) * (1.0 / 9007199254740992.0);
		double r = sqrt(-2.0 * log(u1)) * sigma;
		uint16_t a = f32_to_bf16((float)(r * cos(2 * M_PI * u2)));
		uint16_t b = f32_to_bf16((float)(r * sin(2 * M_PI * u2)));

		p[2 * i] = (uint8_t)a;
		p[2 * i + 1] = (uint8_t)(a >> 8);
		if (i + 1 < n_elems) {
			p[2 * i + 2] = (uint8_t)b;
			p[2 * i + 3] = (uint8_t)(b >> 8);
		}
	}
}

static void fill_f32_normal(uint8_t *p, size_t n_elems, double sigma)
{
	for (size_t i = 0; i < n_elems; i++) {
		double u1 = ((rnd() >> 11) + 1) * (1.0 / 9007199254740992.0);
		double u2 = (rnd() >> 11) * (1.0 / 9007199254740992.0);
		float f = (float)(sqrt(-2.0 * log(u1)) * sigma *
				  cos(2 * M_PI * u2));

		memcpy(p + 4 * i, &f, 4);
	}
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char errbuf[1024];

/* ---- bytes, hashes, names ---- */

START_TEST(test_le_and_hash)
{
	uint8_t b[8];
	char hex[17];
	uint64_t v;

	fmt_put_u16(b, 0x1234);
	ck_assert(b[0] == 0x34 && b[1] == 0x12);
	ck_assert_uint_eq(fmt_get_u16(b), 0x1234);
	fmt_put_u32(b, 0x89abcdefu);
	ck_assert(b[0] == 0xef && b[3] == 0x89);
	ck_assert_uint_eq(fmt_get_u32(b), 0x89abcdefu);
	fmt_put_u64(b, 0x0102030405060708ull);
	ck_assert(b[0] == 8 && b[7] == 1);
	ck_assert(fmt_get_u64(b) == 0x0102030405060708ull);
	fmt_put_hash(b, 0x0102030405060708ull);
	ck_assert(b[0] == 1 && b[7] == 8);
	ck_assert(fmt_get_hash(b) == 0x0102030405060708ull);
	/* XXH3-64 of the empty input (xxHash reference value) */
	ck_assert(fmt_xxh3("", 0) == 0x2d06800538d394c2ull);

	fmt_hash_hex(0x00ab00cd00ef0012ull, hex);
	ck_assert_str_eq(hex, "00ab00cd00ef0012");
	ck_assert_int_eq(fmt_hash_parse(hex, &v), 0);
	ck_assert(v == 0x00ab00cd00ef0012ull);
	ck_assert_int_eq(fmt_hash_parse("00AB00CD00EF0012", &v), -1);
	ck_assert_int_eq(fmt_hash_parse("00ab00cd00ef001", &v), -1);
	ck_assert_int_eq(fmt_hash_parse("00ab00cd00ef00123", &v), -1);
	ck_assert_int_eq(fmt_hash_parse("00ab00cd00ef001g", &v), -1);
	ck_assert_int_eq(fmt_hash_parse("", &v), -1);
	ck_assert_int_eq(fmt_hash_parse(NULL, &v), -1);
	ck_assert_uint_eq(fmt_align_up(4097, 4096), 8192);
	ck_assert_uint_eq(fmt_chunk_span(1), 4096);
	ck_assert_uint_eq(fmt_chunk_span(4096 - 64), 4096);
	ck_assert_uint_eq(fmt_chunk_span(4096 - 63), 8192);
}
END_TEST

START_TEST(test_names)
{
	char s[32];
	uint64_t step;

	fmt_step_dirname(42, s);
	ck_assert_str_eq(s, "step-00000000000000000042");
	ck_assert_int_eq(fmt_step_parse(s, &step), 0);
	ck_assert(step == 42);
	fmt_step_dirname(UINT64_MAX, s);
	ck_assert_int_eq(fmt_step_parse(s, &step), 0);
	ck_assert(step == UINT64_MAX);
	ck_assert_int_eq(fmt_step_parse("step-18446744073709551616", &step), -1);
	ck_assert_int_eq(fmt_step_parse("step-99999999999999999999", &step), -1);
	ck_assert_int_eq(fmt_step_parse("step-0000000000000000042", &step), -1);
	ck_assert_int_eq(fmt_step_parse("step-000000000000000000042", &step), -1);
	ck_assert_int_eq(fmt_step_parse("step-00000000000000000042.tmp", &step), -1);
	ck_assert_int_eq(fmt_step_parse("step-0000000000000000004x", &step), -1);
	ck_assert_int_eq(fmt_step_parse("Step-00000000000000000042", &step), -1);
	ck_assert_int_eq(fmt_step_parse("", &step), -1);
	fmt_shard_name(3, 7, s);
	ck_assert_str_eq(s, "h00003-f007.shard");
	fmt_shard_name(65535, 1023, s);
	ck_assert_str_eq(s, "h65535-f1023.shard");
	fmt_index_name(12, s);
	ck_assert_str_eq(s, "h00012.index");
}
END_TEST

START_TEST(test_name_valid)
{
	static const struct {
		const char *s;
		size_t n;
		int ok;
	} cases[] = {
		{ "a", 1, 1 },
		{ "layers.0.attn/w", 15, 1 },
		{ "\xc3\xa9", 2, 1 },                /* é */
		{ "\xe2\x82\xac", 3, 1 },            /* € */
		{ "\xf0\x9f\x98\x80", 4, 1 },        /* U+1F600 */
		{ "\xf4\x8f\xbf\xbf", 4, 1 },        /* U+10FFFF */
		{ "\xed\x9f\xbf", 3, 1 },            /* U+D7FF */
		{ "", 0, 0 },
		{ "a\0b", 3, 0 },                    /* NUL */
		{ "\x80", 1, 0 },                    /* lone continuation */
		{ "\xc3", 1, 0 },                    /* truncated */
		{ "\xc0\xaf", 2, 0 },                /* overlong '/' */
		{ "\xc1\xbf", 2, 0 },                /* overlong */
		{ "\xe0\x80\xaf", 3, 0 },            /* overlong */
		{ "\xe0\x9f\xbf", 3, 0 },            /* overlong U+7FF */
		{ "\xf0\x80\x80\xaf", 4, 0 },        /* overlong */
		{ "\xf0\x8f\xbf\xbf", 4, 0 },        /* overlong U+FFFF */
		{ "\xed\xa0\x80", 3, 0 },            /* surrogate D800 */
		{ "\xed\xbf\xbf", 3, 0 },            /* surrogate DFFF */
		{ "\xf4\x90\x80\x80", 4, 0 },        /* U+110000 */
		{ "\xf5\x80\x80\x80", 4, 0 },
		{ "\xff", 1, 0 },
		{ "\xe2\x82", 2, 0 },
		{ "\xe2\x28\xa1", 3, 0 },            /* bad continuation */
		{ "ab\xf0\x9f\x98", 5, 0 },
	};
	char *longname = malloc(CKPT_MAX_NAME + 1);

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		ck_assert_msg(fmt_name_valid(cases[i].s, cases[i].n) ==
				      cases[i].ok, "case %zu", i);
	memset(longname, 'x', CKPT_MAX_NAME + 1);
	ck_assert(fmt_name_valid(longname, CKPT_MAX_NAME));
	ck_assert(!fmt_name_valid(longname, CKPT_MAX_NAME + 1));
	ck_assert(!fmt_name_valid(NULL, 1));
	free(longname);
}
END_TEST

START_TEST(test_shape_and_tables)
{
	uint64_t d[3] = { 2, 3, 4 }, out;
	uint64_t big[2] = { 1ull << 32, 1ull << 32 };
	uint64_t zero[2] = { 0, UINT64_MAX };

	ck_assert_int_eq(fmt_shape_bytes(d, 3, 2, &out), 0);
	ck_assert(out == 48);
	ck_assert_int_eq(fmt_shape_bytes(d, 0, 4, &out), 0);
	ck_assert(out == 4);
	ck_assert_int_eq(fmt_shape_bytes(big, 2, 1, &out), -1);
	ck_assert_int_eq(fmt_shape_bytes(big, 1, 2, &out), 0);
	ck_assert_int_eq(fmt_shape_bytes(zero, 2, 8, &out), 0);
	ck_assert(out == 0);
	ck_assert_int_eq(fmt_shape_bytes(d, CKPT_MAX_NDIM + 1, 1, &out), -1);

	for (int t = 1; t < CKPT_DTYPE_COUNT; t++) {
		ck_assert(ckpt_dtype_name(t) != NULL);
		ck_assert_int_eq(ckpt_dtype_from_name(ckpt_dtype_name(t)), t);
		ck_assert(ckpt_dtype_size(t) > 0);
	}
	ck_assert_uint_eq(ckpt_dtype_size(CKPT_BF16), 2);
	ck_assert_uint_eq(ckpt_dtype_size(CKPT_F64), 8);
	ck_assert_uint_eq(ckpt_dtype_size(CKPT_F8E4M3), 1);
	ck_assert_str_eq(ckpt_dtype_name(CKPT_BF16), "bf16");
	ck_assert_str_eq(ckpt_dtype_name(CKPT_F8E5M2), "f8e5m2");
	ck_assert_uint_eq(ckpt_dtype_size(0), 0);
	ck_assert_uint_eq(ckpt_dtype_size(CKPT_DTYPE_COUNT), 0);
	ck_assert_uint_eq(ckpt_dtype_size(-1), 0);
	ck_assert(ckpt_dtype_name(0) == NULL);
	ck_assert(ckpt_dtype_name(99) == NULL);
	ck_assert_int_eq(ckpt_dtype_from_name("bf17"), CKPT_DTYPE_INVALID);
	ck_assert_int_eq(ckpt_dtype_from_name(NULL), CKPT_DTYPE_INVALID);
	ck_assert_str_eq(ckpt_codec_name(CKPT_CODEC_FLOAT), "float");
	ck_assert(ckpt_codec_name(CKPT_CODEC_COUNT) == NULL);
	ck_assert(ckpt_codec_name(-1) == NULL);
	for (int c = 0; c < CKPT_CODEC_COUNT; c++)
		ck_assert_int_eq(ckpt_codec_from_name(ckpt_codec_name(c)), c);
	ck_assert_int_eq(ckpt_codec_from_name("lz4"), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_codec_from_name(NULL), CKPT_E_NOTFOUND);
}
END_TEST

/* ---- headers ---- */

START_TEST(test_shard_hdr)
{
	uint8_t *buf = malloc(FMT_SHARD_HDR_SIZE);
	fmt_shard_hdr h = { .step = 1234567, .host_index = 3,
			    .host_count = 8, .file_index = 2 }, g;
	int rc;

	for (int i = 0; i < 16; i++)
		h.save_id[i] = (uint8_t)(i * 17 + 1);
	fmt_shard_hdr_encode(&h, buf);
	ck_assert(memcmp(buf, "CKPTSHRD", 8) == 0);
	ck_assert_uint_eq(fmt_get_u32(buf + 8), 1);
	ck_assert_uint_eq(fmt_get_u32(buf + 12), 4096);
	ck_assert(fmt_get_u64(buf + 16) == 1234567);
	ck_assert(fmt_get_hash(buf + 56) == fmt_xxh3(buf, 56));
	ck_assert_int_eq(fmt_shard_hdr_decode(buf, FMT_SHARD_HDR_SIZE, &g,
					      errbuf, sizeof(errbuf)), 0);
	ck_assert(g.step == h.step && g.host_index == 3 && g.host_count == 8 &&
		  g.file_index == 2);
	ck_assert(memcmp(g.save_id, h.save_id, 16) == 0);
	ck_assert_int_eq(fmt_shard_hdr_decode(buf, FMT_SHARD_HDR_SIZE - 1, &g,
					      errbuf, sizeof(errbuf)),
			 CKPT_E_CORRUPT);

	/* every single-bit flip anywhere in the 4096 bytes is detected */
	for (size_t i = 0; i < FMT_SHARD_HDR_SIZE; i++) {
		for (int bit = 0; bit < 8; bit++) {
			buf[i] ^= (uint8_t)(1u << bit);
			rc = fmt_shard_hdr_decode(buf, FMT_SHARD_HDR_SIZE, &g,
						  errbuf, sizeof(errbuf));
			if (i >= 8 && i < 12)
				ck_assert_msg(rc == CKPT_E_CORRUPT ||
					      rc == CKPT_E_VERSION,
					      "byte %zu", i);
			else
				ck_assert_msg(rc == CKPT_E_CORRUPT,
					      "byte %zu bit %d: %d", i, bit, rc);
			buf[i] ^= (uint8_t)(1u << bit);
		}
	}
	/* a newer version is reported as such */
	fmt_put_u32(buf + 8, FMT_VERSION_MAX + 1);
	fmt_put_hash(buf + 56, fmt_xxh3(buf, 56));
	ck_assert_int_eq(fmt_shard_hdr_decode(buf, FMT_SHARD_HDR_SIZE, &g,
					      errbuf, sizeof(errbuf)),
			 CKPT_E_VERSION);
	ck_assert(strstr(errbuf, "version") != NULL);
	/* a consistent header with bad ranges is rejected */
	fmt_put_u32(buf + 8, 1);
	fmt_put_u32(buf + 40, 8); /* host_index == host_count */
	fmt_put_hash(buf + 56, fmt_xxh3(buf, 56));
	ck_assert_int_eq(fmt_shard_hdr_decode(buf, FMT_SHARD_HDR_SIZE, &g,
					      errbuf, sizeof(errbuf)),
			 CKPT_E_CORRUPT);
	free(buf);
}
END_TEST

static int chunk_hdr_rehash_decode(uint8_t *b)
{
	fmt_chunk_hdr g;

	fmt_put_hash(b + 56, fmt_xxh3(b, 56));
	return fmt_chunk_hdr_decode(b, 64, &g, errbuf, sizeof(errbuf));
}

START_TEST(test_chunk_hdr)
{
	fmt_chunk_hdr h = { .codec = CKPT_CODEC_FLOAT, .elem_width = 2,
			    .raw_len = 4u << 20, .stored_len = 3000000,
			    .stream_offset = 12ull << 20,
			    .raw_xxh3 = 0x1122334455667788ull }, g;
	uint8_t b[64], c[64];

	fmt_chunk_hdr_encode(&h, b);
	ck_assert(memcmp(b, "CKCH", 4) == 0);
	ck_assert(b[24] == 0x11 && b[31] == 0x88);
	ck_assert_int_eq(fmt_chunk_hdr_decode(b, 64, &g, errbuf,
					      sizeof(errbuf)), 0);
	ck_assert(g.codec == h.codec && g.elem_width == 2 &&
		  g.raw_len == h.raw_len && g.stored_len == h.stored_len &&
		  g.stream_offset == h.stream_offset &&
		  g.raw_xxh3 == h.raw_xxh3);
	ck_assert_int_eq(fmt_chunk_hdr_decode(b, 63, &g, errbuf,
					      sizeof(errbuf)), CKPT_E_CORRUPT);
	for (int i = 0; i < 64; i++) {
		for (int bit = 0; bit < 8; bit++) {
			b[i] ^= (uint8_t)(1u << bit);
			ck_assert_msg(fmt_chunk_hdr_decode(b, 64, &g, errbuf,
							   sizeof(errbuf)) ==
					      CKPT_E_CORRUPT,
				      "byte %d bit %d", i, bit);
			b[i] ^= (uint8_t)(1u << bit);
		}
	}
	/* consistent checksum, invalid fields */
	memcpy(c, b, 64); c[4] = 3;
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); c[5] = 3;
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); c[5] = 1; /* float needs width 2/4/8 */
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); c[5] = 16;
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); c[6] = 1;
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); c[40] = 1;
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); fmt_put_u32(c + 8, 0);
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); fmt_put_u32(c + 8, FMT_MAX_CHUNK + 1);
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); fmt_put_u32(c + 8, FMT_MAX_CHUNK);
	fmt_put_u32(c + 12, FMT_MAX_CHUNK);
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), 0);
	memcpy(c, b, 64); fmt_put_u32(c + 12, 0);
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64);
	fmt_put_u32(c + 12, (uint32_t)fmt_codec_bound(4u << 20) + 1);
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	memcpy(c, b, 64); c[4] = CKPT_CODEC_NONE; /* stored != raw */
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), CKPT_E_CORRUPT);
	fmt_put_u32(c + 12, 4u << 20);
	ck_assert_int_eq(chunk_hdr_rehash_decode(c), 0);
}
END_TEST

START_TEST(test_meta_frame)
{
	const char *body = "{\"hello\":1}";
	uint8_t *f = NULL;
	size_t n = 0, blen;
	const char *bp;
	int rc;

	ck_assert_int_eq(fmt_meta_wrap(FMT_META_COMMIT, body, strlen(body),
				       &f, &n), 0);
	ck_assert_uint_eq(n, 64 + strlen(body));
	ck_assert(memcmp(f, "CKPTMETA", 8) == 0);
	ck_assert_uint_eq(fmt_get_u32(f + 12), FMT_META_COMMIT);
	ck_assert(fmt_get_u64(f + 16) == strlen(body));
	ck_assert_int_eq(fmt_meta_unwrap(FMT_META_COMMIT, f, n, &bp, &blen,
					 errbuf, sizeof(errbuf)), 0);
	ck_assert_uint_eq(blen, strlen(body));
	ck_assert(memcmp(bp, body, blen) == 0);
	ck_assert_int_eq(fmt_meta_unwrap(FMT_META_INDEX, f, n, &bp, &blen,
					 errbuf, sizeof(errbuf)),
			 CKPT_E_CORRUPT);
	for (size_t i = 0; i < n; i++) {
		for (int bit = 0; bit < 8; bit++) {
			f[i] ^= (uint8_t)(1u << bit);
			rc = fmt_meta_unwrap(FMT_META_COMMIT, f, n, &bp, &blen,
					     errbuf, sizeof(errbuf));
			if (i >= 8 && i < 12)
				ck_assert(rc == CKPT_E_CORRUPT ||
					  rc == CKPT_E_VERSION);
			else
				ck_assert_msg(rc == CKPT_E_CORRUPT,
					      "byte %zu bit %d", i, bit);
			f[i] ^= (uint8_t)(1u << bit);
		}
	}
	for (size_t len = 0; len < n; len++)
		ck_assert_int_eq(fmt_meta_unwrap(FMT_META_COMMIT, f, len, &bp,
						 &blen, errbuf, sizeof(errbuf)),
				 CKPT_E_CORRUPT);
	fmt_put_u32(f + 8, FMT_VERSION_MAX + 1);
	fmt_put_hash(f + 56, fmt_xxh3(f, 56));
	ck_assert_int_eq(fmt_meta_unwrap(FMT_META_COMMIT, f, n, &bp, &blen,
					 errbuf, sizeof(errbuf)),
			 CKPT_E_VERSION);
	free(f);
	f = realloc(NULL, 1);
	ck_assert_int_eq(fmt_meta_wrap(3, body, 1, &f, &n), -EINVAL);
	free(f);
}
END_TEST

/* ---- codecs ---- */

enum { D_RANDOM, D_ZERO, D_BF16, D_F32, D_RAMP, D_KINDS };

static void fill_kind(uint8_t *p, size_t n, int kind)
{
	switch (kind) {
	case D_RANDOM: fill_random(p, n); break;
	case D_ZERO: memset(p, 0, n); break;
	case D_BF16:
		fill_bf16_normal(p, n / 2, 0.02);
		if (n % 2)
			p[n - 1] = 0x5a;
		break;
	case D_F32:
		fill_f32_normal(p, n / 4, 1.0);
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
		size_t len = np + 1 == max ? n - pos : 1 + rnd() % (n / 3 + 1);

		len = (len + w - 1) / w * w;
		if (len > n - pos)
			len = n - pos;
		p[np].off = pos;
		p[np].len = len;
		p[np].dst = rnd() % 3 == 0 ? NULL : back + pos;
		pos += len;
		np++;
	}
	return np;
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
	for (int iter = 0; iter < 4; iter++) {
		memset(back, 0xee, n);
		np = random_parts(p, 16, n, pw, back);
		ck_assert_int_eq(fmt_chunk_decode_parts(c, used, w, out, stored,
							n, p, np, &h, errbuf,
							sizeof(errbuf)),
				 0);
		ck_assert(h == fmt_xxh3(raw, n));
		for (size_t i = 0; i < np; i++) {
			size_t k = p[i].off, e = k + p[i].len;

			if (p[i].dst) {
				ck_assert(!memcmp(back + k, raw + k, e - k));
				continue;
			}
			while (k < e && back[k] == 0xee)
				k++;
			ck_assert_uint_eq(k, e);
		}
	}
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
	static const size_t sizes[] = { 1, 7, 64, 4097, 65537, 200001 };
	static const int widths[] = { 2, 4, 8 };
	size_t maxn = 200001;
	uint8_t *raw = malloc(maxn), *out = malloc(fmt_codec_bound(maxn));
	uint8_t *back = malloc(maxn), *ref = malloc(maxn);
	fmt_codec_ctx *c = fmt_codec_ctx_new();

	ck_assert(c && raw && out && back && ref);
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
		int codec = 1 + (int)(rnd() % 2);
		int w = (int)(2u << (rnd() % 3));
		size_t len = 1 + rnd() % 300;

		fill_random(junk, len);
		if (codec == CKPT_CODEC_FLOAT && len >= 2 && (iter & 1)) {
			junk[0] = junk[1] = (uint8_t)w; /* get past the header */
			for (int j = 0; j < w && 2 + 5 * j + 5 <= (int)len; j++) {
				junk[2 + 5 * j] = (uint8_t)(rnd() % 3);
				fmt_put_u32(junk + 3 + 5 * j,
					    (uint32_t)(rnd() % 64));
			}
		}
		rc = fmt_chunk_decode(c, codec, w, junk, len, back,
				      1 + rnd() % 4096, errbuf, sizeof(errbuf));
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
				size_t pos = rnd() % stored;

				memcpy(junk, out, stored);
				junk[pos] ^= (uint8_t)(1 + rnd() % 255);
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
				uint64_t v = rnd();

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

	rng_state = 12345;
	fill_bf16_normal(raw, total / 2, 0.02);

	for (int codec = CKPT_CODEC_ZSTD; codec <= CKPT_CODEC_FLOAT; codec++) {
		size_t sum = 0;

		t0 = now_s();
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
		double te = now_s() - t0;

		t0 = now_s();
		for (size_t k = 0; k < nchunks; k++)
			ck_assert_int_eq(fmt_chunk_decode(c, used[k], 2,
					enc + k * fmt_codec_bound(chunk),
					encl[k], back, chunk, errbuf,
					sizeof(errbuf)), 0);
		double td = now_s() - t0;

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
	fill_f32_normal(raw, total / 4, 1.0);
	for (int codec = CKPT_CODEC_ZSTD; codec <= CKPT_CODEC_FLOAT; codec++) {
		size_t sum = 0, got;
		int u;

		t0 = now_s();
		for (size_t k = 0; k < nchunks; k++) {
			ck_assert_int_eq(fmt_chunk_encode(c, codec, 1, 4,
					raw + k * chunk, chunk, out,
					fmt_codec_bound(chunk), &u, &got), 0);
			sum += got;
		}
		printf("  f32 N(0,1) %-5s: ratio %.4f  encode %7.1f MB/s\n",
		       ckpt_codec_name(codec), (double)sum / total,
		       mbps(total, now_s() - t0));
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
		uint64_t r = rnd();
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
			uint16_t b = f32_to_bf16((float)(((double)(r >> 11) /
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
		size_t pos = rnd() % len;

		j[pos] ^= (uint8_t)(1u << (rnd() % 8));
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
		size_t m = 1 + rnd() % 5000, sl = rnd() % 3000, tot = 0;
		uint8_t *g = malloc(144 + sl + 16), L[256];
		uint64_t cnt[256];

		for (unsigned x = 0; x < 256; x++)
			cnt[x] = rnd() % 3 ? 0 : rnd() >> (rnd() % 64);
		cnt[rnd() % 256] = 1;
		cnt[rnd() % 256] += 1;
		if (fmt_huf_lengths(cnt, L))
			memset(L, 8, sizeof(L));
		for (unsigned x = 0; x < 256; x += 2)
			g[x / 2] = (uint8_t)(L[x] | L[x + 1] << 4);
		for (unsigned s = 0; s < 4; s++) {
			size_t z = s == 3 ? sl - tot : rnd() % (sl - tot + 1);

			fmt_put_u32(g + 128 + 4 * s, (uint32_t)z);
			tot += z;
		}
		fill_random(g + 144, sl);
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
			size_t pos = fl < 8 * 200 ? fl / 8 : rnd() % stored;
			int bit = fl < 8 * 200 ? (int)(fl % 8) :
						 (int)(rnd() % 8), rc;

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

/* ---- index and commit documents ---- */

/*
 * A valid index of host 1 of 2 with chunk_bytes 64 KiB:
 *   "a"  bf16 [4,8] whole       stream [0, 64)
 *   "b"  f32 [200,300] rows 100.. stream [64, 120064)
 *   "c"  u8 scalar               stream [120064, 120065)
 * chunk 0 (65536 raw) in file 0 at 4096, float; chunk 1 (54529 raw) in
 * file 1 at 4096, none.
 */
static void make_index(fmt_index *ix)
{
	static char na[] = "a", nb[] = "b.w\xc3\xa9\"\\", nc[] = "c";
	static fmt_file_entry files[2];
	static fmt_tensor_entry t[3];
	static fmt_chunk_entry ch[2];

	memset(ix, 0, sizeof(*ix));
	memset(files, 0, sizeof(files));
	memset(t, 0, sizeof(t));
	ix->step = 77;
	for (int i = 0; i < 16; i++)
		ix->save_id[i] = (uint8_t)(0xa0 + i);
	ix->host_index = 1;
	ix->host_count = 2;
	ix->chunk_bytes = 65536;
	ix->stream_bytes = 120065;

	t[0] = (fmt_tensor_entry){ .name = na, .name_len = 1,
		.dtype = CKPT_BF16, .ndim = 2, .shape = { 4, 8 },
		.offset = { 0, 0 }, .extent = { 4, 8 }, .stream_offset = 0,
		.nbytes = 64 };
	t[1] = (fmt_tensor_entry){ .name = nb, .name_len = strlen(nb),
		.dtype = CKPT_F32, .ndim = 2, .shape = { 200, 300 },
		.offset = { 100, 0 }, .extent = { 100, 300 },
		.stream_offset = 64, .nbytes = 120000 };
	t[2] = (fmt_tensor_entry){ .name = nc, .name_len = 1,
		.dtype = CKPT_U8, .ndim = 0, .stream_offset = 120064,
		.nbytes = 1 };
	ch[0] = (fmt_chunk_entry){ .file = 0, .codec = CKPT_CODEC_FLOAT,
		.elem_width = 2, .raw_len = 65536, .stored_len = 30000,
		.file_offset = 4096, .stream_offset = 0,
		.raw_xxh3 = 0xfedcba9876543210ull };
	ch[1] = (fmt_chunk_entry){ .file = 1, .codec = CKPT_CODEC_NONE,
		.elem_width = 4, .raw_len = 54529, .stored_len = 54529,
		.file_offset = 4096, .stream_offset = 65536, .raw_xxh3 = 1 };
	fmt_shard_name(1, 0, files[0].name);
	files[0].size = 4096 + fmt_chunk_span(30000);
	files[0].xxh3 = 0x0123456789abcdefull;
	fmt_shard_name(1, 1, files[1].name);
	files[1].size = 4096 + fmt_chunk_span(54529);
	files[1].xxh3 = 42;
	for (int i = 0; i < 2; i++) {
		files[i].host = 1;
		files[i].kind = CKPT_FILE_SHARD;
	}
	ix->nfiles = 2;
	ix->files = files;
	ix->ntensors = 3;
	ix->tensors = t;
	ix->nchunks = 2;
	ix->chunks = ch;
}

START_TEST(test_index_roundtrip)
{
	fmt_index ix, g;
	uint8_t *f;
	size_t n;

	make_index(&ix);
	ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), 0);
	ck_assert_int_eq(fmt_index_decode(f, n, &g, errbuf, sizeof(errbuf)),
			 0);
	ck_assert(g.step == 77 && g.host_index == 1 && g.host_count == 2 &&
		  g.chunk_bytes == 65536 && g.stream_bytes == 120065);
	ck_assert(memcmp(g.save_id, ix.save_id, 16) == 0);
	ck_assert_uint_eq(g.nfiles, 2);
	ck_assert_uint_eq(g.ntensors, 3);
	ck_assert_uint_eq(g.nchunks, 2);
	for (size_t i = 0; i < 2; i++) {
		ck_assert_str_eq(g.files[i].name, ix.files[i].name);
		ck_assert(g.files[i].size == ix.files[i].size &&
			  g.files[i].xxh3 == ix.files[i].xxh3 &&
			  g.files[i].host == 1 &&
			  g.files[i].kind == CKPT_FILE_SHARD);
		ck_assert(memcmp(&g.chunks[i], &ix.chunks[i],
				 sizeof(g.chunks[i])) == 0);
	}
	for (size_t i = 0; i < 3; i++) {
		const fmt_tensor_entry *a = &ix.tensors[i], *b = &g.tensors[i];

		ck_assert_uint_eq(a->name_len, b->name_len);
		ck_assert(memcmp(a->name, b->name, a->name_len + 1) == 0);
		ck_assert(a->dtype == b->dtype && a->ndim == b->ndim &&
			  a->stream_offset == b->stream_offset &&
			  a->nbytes == b->nbytes);
		for (uint32_t d = 0; d < a->ndim; d++)
			ck_assert(a->shape[d] == b->shape[d] &&
				  a->offset[d] == b->offset[d] &&
				  a->extent[d] == b->extent[d]);
	}
	fmt_index_free(&g);
	fmt_index_free(&g);
	fmt_index_free(NULL);

	/* truncations, extensions and flips of the file */
	for (size_t cut = 0; cut < n; cut += 1 + cut / 5)
		ck_assert_int_eq(fmt_index_decode(f, cut, &g, errbuf,
						  sizeof(errbuf)),
				 CKPT_E_CORRUPT);
	for (size_t i = 0; i < n; i += 1 + i / 17) {
		f[i] ^= 0x20;
		int rc = fmt_index_decode(f, n, &g, errbuf, sizeof(errbuf));

		ck_assert_msg(rc == CKPT_E_CORRUPT ||
			      (i >= 8 && i < 12 && rc == CKPT_E_VERSION),
			      "flip at %zu: %d", i, rc);
		f[i] ^= 0x20;
	}
	f = realloc(f, n + 1);
	f[n] = ' ';
	ck_assert_int_eq(fmt_index_decode(f, n + 1, &g, errbuf, sizeof(errbuf)),
			 CKPT_E_CORRUPT);
	free(f);

	/* an empty index (no tensors) is valid */
	ix.stream_bytes = 0;
	ix.ntensors = 0;
	ix.nchunks = 0;
	ix.nfiles = 0;
	ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), 0);
	ck_assert_int_eq(fmt_index_decode(f, n, &g, errbuf, sizeof(errbuf)),
			 0);
	ck_assert_uint_eq(g.ntensors + g.nchunks + g.nfiles, 0);
	fmt_index_free(&g);
	free(f);

	/* encoder refuses what JSON cannot carry */
	make_index(&ix);
	ix.step = (uint64_t)INT64_MAX + 1;
	ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), -EINVAL);
}
END_TEST

/* Parses the body of an encoded valid index into a jansson tree. */
static json_t *index_json(void)
{
	fmt_index ix;
	const char *body;
	size_t n, blen;
	uint8_t *f;
	json_t *root;

	make_index(&ix);
	ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), 0);
	ck_assert_int_eq(fmt_meta_unwrap(FMT_META_INDEX, f, n, &body, &blen,
					 errbuf, sizeof(errbuf)), 0);
	root = json_loadb(body, blen, 0, NULL);
	ck_assert(root != NULL);
	free(f);
	return root;
}

#define OBJ(root, key) json_object_get(root, key)
#define AT(arr, i) json_array_get(arr, i)
#define TENSOR(root, i) AT(OBJ(root, "tensors"), i)
#define CHUNK(root, i) AT(OBJ(root, "chunks"), i)
#define FILEN(root, i) AT(OBJ(root, "files"), i)
#define SETI(obj, key, v) json_object_set_new(obj, key, json_integer(v))
#define SETS(obj, key, v) json_object_set_new(obj, key, json_string(v))

static const char *const hostile_index[] = {
	"missing chunks", "unknown key", "step is a string", "negative step",
	"format 0", "kind commit", "save_id short", "save_id upper case",
	"hosts 0", "host == hosts", "hosts > max", "chunk_bytes unaligned",
	"chunk_bytes too small", "file of another host",
	"file not at its index", "file smaller than header",
	"file xxh3 malformed", "unknown dtype", "ndim 17",
	"shape product overflow", "slice outside shape", "nbytes mismatch",
	"stream_offset unaligned", "tensor beyond stream", "tensors overlap",
	"duplicate names", "name with NUL", "empty name", "name too long",
	"chunks swapped", "chunk raw_len short", "missing last chunk",
	"extra chunk", "chunk file out of range", "file_offset unaligned",
	"file_offset in header", "chunk beyond file", "chunks overlap in file",
	"unknown codec", "bad elem_width", "float with width 1",
	"none with stored != raw", "chunk of 7 values", "chunk xxh3 number",
	"stream_bytes past padding", "stream_bytes before tensor end",
	"tensors not array", "shape real number", "host boolean",
	"too many files", "stored_len above bound", "offset rank differs",
	"negative extent", "document is array", "duplicate key",
	"invalid UTF-8 name", "surrogate in name", "overlong in name",
	"tensor missing key", "tensor extra key", "file extra key",
	"stored_len 0", "shape with 2^63", "stream_bytes without tensors",
	"truncated JSON", "trailing garbage", "files not array",
	"chunk_bytes above max", "scalar nbytes 2",
};
#define N_HOSTILE_INDEX (sizeof(hostile_index) / sizeof(hostile_index[0]))

/* Applies mutation i; may replace the whole document via *text. */
static void mutate_index(json_t *r, size_t i, char **text)
{
	json_t *a;
	char *s;

	switch (i) {
	case 0: json_object_del(r, "chunks"); break;
	case 1: SETI(r, "extra", 1); break;
	case 2: SETS(r, "step", "77"); break;
	case 3: SETI(r, "step", -1); break;
	case 4: SETI(r, "format", 0); break;
	case 5: SETS(r, "kind", "commit"); break;
	case 6: SETS(r, "save_id", "a0a1a2a3a4a5a6a7a8a9aaabacadae"); break;
	case 7: SETS(r, "save_id", "A0A1A2A3A4A5A6A7A8A9AAABACADAEAF"); break;
	case 8: SETI(r, "hosts", 0); break;
	case 9: SETI(r, "host", 2); break;
	case 10: SETI(r, "hosts", FMT_MAX_HOSTS + 1); break;
	case 11: SETI(r, "chunk_bytes", 65536 + 512); break;
	case 12: SETI(r, "chunk_bytes", 32768); break;
	case 13: SETS(FILEN(r, 0), "name", "h00000-f000.shard"); break;
	case 14: SETS(FILEN(r, 1), "name", "h00001-f005.shard"); break;
	case 15: SETI(FILEN(r, 0), "size", 4095); break;
	case 16: SETS(FILEN(r, 0), "xxh3", "0123456789abcdeg"); break;
	case 17: SETS(TENSOR(r, 0), "dtype", "bf17"); break;
	case 18:
		a = json_array();
		for (int k = 0; k < 17; k++)
			json_array_append_new(a, json_integer(1));
		json_object_set(TENSOR(r, 2), "shape", a);
		json_object_set(TENSOR(r, 2), "offset", a);
		json_object_set(TENSOR(r, 2), "extent", a);
		json_decref(a);
		break;
	case 19:
		json_object_set_new(TENSOR(r, 0), "shape",
				    json_pack("[I,I]", (json_int_t)1 << 40,
					      (json_int_t)1 << 40));
		break;
	case 20:
		json_array_set_new(OBJ(TENSOR(r, 1), "offset"), 0,
				   json_integer(101));
		break;
	case 21: SETI(TENSOR(r, 1), "nbytes", 120004); break;
	case 22: SETI(TENSOR(r, 2), "stream_offset", 120063); break;
	case 23: SETI(TENSOR(r, 2), "stream_offset", 120128); break;
	case 24: SETI(TENSOR(r, 2), "stream_offset", 64); break;
	case 25: SETS(TENSOR(r, 2), "name", "a"); break;
	case 26:
		json_object_set_new(TENSOR(r, 0), "name",
				    json_stringn("a\0b", 3));
		break;
	case 27: SETS(TENSOR(r, 0), "name", ""); break;
	case 28:
		s = malloc(CKPT_MAX_NAME + 2);
		memset(s, 'n', CKPT_MAX_NAME + 1);
		s[CKPT_MAX_NAME + 1] = 0;
		SETS(TENSOR(r, 0), "name", s);
		free(s);
		break;
	case 29:
		a = json_deep_copy(CHUNK(r, 0));
		json_array_set(OBJ(r, "chunks"), 0, CHUNK(r, 1));
		json_array_set_new(OBJ(r, "chunks"), 1, a);
		break;
	case 30: json_array_set_new(CHUNK(r, 0), 3, json_integer(65535)); break;
	case 31: json_array_remove(OBJ(r, "chunks"), 1); break;
	case 32:
		json_array_append_new(OBJ(r, "chunks"),
				      json_deep_copy(CHUNK(r, 1)));
		break;
	case 33: json_array_set_new(CHUNK(r, 1), 0, json_integer(2)); break;
	case 34: json_array_set_new(CHUNK(r, 1), 1, json_integer(4097)); break;
	case 35: json_array_set_new(CHUNK(r, 1), 1, json_integer(0)); break;
	case 36: json_array_set_new(CHUNK(r, 1), 1, json_integer(8192)); break;
	case 37:
		/* chunk 1 moved into file 0 at 8192 (chunk 0 spans to 36864) */
		json_array_set_new(CHUNK(r, 1), 0, json_integer(0));
		json_array_set_new(CHUNK(r, 1), 1, json_integer(8192));
		SETI(FILEN(r, 0), "size", 1 << 20);
		break;
	case 38: json_array_set_new(CHUNK(r, 0), 5, json_integer(3)); break;
	case 39: json_array_set_new(CHUNK(r, 0), 6, json_integer(3)); break;
	case 40: json_array_set_new(CHUNK(r, 0), 6, json_integer(1)); break;
	case 41: json_array_set_new(CHUNK(r, 1), 2, json_integer(54528)); break;
	case 42: json_array_remove(CHUNK(r, 0), 7); break;
	case 43: json_array_set_new(CHUNK(r, 0), 7, json_integer(5)); break;
	case 44: SETI(r, "stream_bytes", 120129); break;
	case 45: SETI(r, "stream_bytes", 120064); break;
	case 46: json_object_set_new(r, "tensors", json_object()); break;
	case 47:
		json_array_set_new(OBJ(TENSOR(r, 0), "shape"), 0,
				   json_real(4.0));
		break;
	case 48: json_object_set_new(r, "host", json_true()); break;
	case 49:
		a = OBJ(r, "files");
		for (unsigned k = 2; k <= FMT_MAX_FILES_PER_HOST; k++) {
			json_t *fe = json_deep_copy(AT(a, 1));
			char nm[32];

			fmt_shard_name(1, k, nm);
			SETS(fe, "name", nm);
			json_array_append_new(a, fe);
		}
		break;
	case 50:
		json_array_set_new(CHUNK(r, 0), 2,
				   json_integer((json_int_t)fmt_codec_bound(65536) + 1));
		SETI(FILEN(r, 0), "size", 1 << 20);
		break;
	case 51: json_array_remove(OBJ(TENSOR(r, 0), "offset"), 1); break;
	case 52:
		json_array_set_new(OBJ(TENSOR(r, 0), "extent"), 0,
				   json_integer(-4));
		break;
	case 53: *text = strdup("[1,2,3]"); break;
	case 54:
		s = json_dumps(r, JSON_COMPACT);
		*text = malloc(strlen(s) + 16);
		sprintf(*text, "{\"step\":77,%s", s + 1);
		free(s);
		break;
	case 55: case 56: case 57: {
		static const char *const bad_names[] = { "\"a\xff\"",
			"\"a\\ud800\"", "\"\xc0\xaf\"" };
		char *p;

		s = json_dumps(r, JSON_COMPACT);
		p = strstr(s, "\"name\":\"a\"");
		ck_assert(p != NULL);
		*text = malloc(strlen(s) + 16);
		memcpy(*text, s, (size_t)(p - s) + 7);
		strcpy(*text + (p - s) + 7, bad_names[i - 55]);
		strcat(*text, p + 10);
		free(s);
		break;
	}
	case 58: json_object_del(TENSOR(r, 1), "nbytes"); break;
	case 59: SETI(TENSOR(r, 1), "stride", 1); break;
	case 60: SETI(FILEN(r, 0), "host", 1); break;
	case 61: json_array_set_new(CHUNK(r, 0), 2, json_integer(0)); break;
	case 62:
		json_array_set_new(OBJ(TENSOR(r, 0), "shape"), 0,
				   json_integer(INT64_MAX));
		break;
	case 63:
		json_array_clear(OBJ(r, "tensors"));
		break;
	case 64:
		s = json_dumps(r, JSON_COMPACT);
		s[strlen(s) / 2] = 0;
		*text = s;
		break;
	case 65:
		s = json_dumps(r, JSON_COMPACT);
		*text = malloc(strlen(s) + 8);
		sprintf(*text, "%s {}", s);
		free(s);
		break;
	case 66: json_object_set_new(r, "files", json_null()); break;
	case 67: SETI(r, "chunk_bytes", FMT_MAX_CHUNK + 4096); break;
	case 68: SETI(TENSOR(r, 2), "nbytes", 2); break;
	default: ck_abort_msg("no mutation %zu", i);
	}
}

START_TEST(test_index_hostile)
{
	size_t i = (size_t)_i;
	json_t *r = index_json();
	char *text = NULL;
	uint8_t *f;
	size_t n;
	fmt_index g;
	int rc;

	mutate_index(r, i, &text);
	if (!text)
		text = json_dumps(r, JSON_COMPACT | JSON_ENCODE_ANY);
	ck_assert(text != NULL);
	ck_assert_int_eq(fmt_meta_wrap(FMT_META_INDEX, text, strlen(text), &f,
				       &n), 0);
	errbuf[0] = 0;
	rc = fmt_index_decode(f, n, &g, errbuf, sizeof(errbuf));
	ck_assert_msg(rc == CKPT_E_CORRUPT, "case %zu \"%s\" accepted (%d)", i,
		      hostile_index[i], rc);
	ck_assert_msg(strncmp(errbuf, "index: ", 7) == 0 && strlen(errbuf) > 9,
		      "case %zu: message \"%s\"", i, errbuf);
	ck_assert(g.tensors == NULL && g.files == NULL && g.chunks == NULL);
	if (getenv("CKPT_TEST_VERBOSE"))
		printf("%-32s -> %s\n", hostile_index[i], errbuf);
	json_decref(r);
	free(text);
	free(f);
}
END_TEST

/* The example of SPEC.md section 13, byte for byte. */
START_TEST(test_index_spec_example)
{
	static const char want[] =
		"{\"format\":1,\"kind\":\"index\",\"step\":77,\"save_id\":"
		"\"a0a1a2a3a4a5a6a7a8a9aaabacadaeaf\",\"host\":1,\"hosts\":2,"
		"\"chunk_bytes\":65536,\"stream_bytes\":120065,\n"
		"\"files\":[\n"
		"{\"name\":\"h00001-f000.shard\",\"size\":36864,\"xxh3\":"
		"\"0123456789abcdef\"},\n"
		"{\"name\":\"h00001-f001.shard\",\"size\":61440,\"xxh3\":"
		"\"000000000000002a\"}],\n"
		"\"tensors\":[\n"
		"{\"name\":\"a\",\"dtype\":\"bf16\",\"shape\":[4,8],\"offset\":"
		"[0,0],\"extent\":[4,8],\"stream_offset\":0,\"nbytes\":64},\n"
		"{\"name\":\"b.w\",\"dtype\":\"f32\",\"shape\":[200,300],"
		"\"offset\":[100,0],\"extent\":[100,300],\"stream_offset\":64,"
		"\"nbytes\":120000},\n"
		"{\"name\":\"c\",\"dtype\":\"u8\",\"shape\":[],\"offset\":[],"
		"\"extent\":[],\"stream_offset\":120064,\"nbytes\":1}],\n"
		"\"chunks\":[\n"
		"[0,4096,30000,65536,0,2,2,\"fedcba9876543210\"],\n"
		"[1,4096,54529,54529,65536,0,4,\"0000000000000001\"]]}\n";
	static char bw[] = "b.w";
	fmt_index ix, g;
	const char *body;
	size_t n, blen;
	uint8_t *f;

	make_index(&ix);
	ix.tensors[1].name = bw;
	ix.tensors[1].name_len = 3;
	ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), 0);
	ck_assert_int_eq(fmt_meta_unwrap(FMT_META_INDEX, f, n, &body, &blen,
					 errbuf, sizeof(errbuf)), 0);
	ck_assert_uint_eq(blen, strlen(want));
	ck_assert(memcmp(body, want, blen) == 0);
	ck_assert_int_eq(fmt_index_decode(f, n, &g, errbuf, sizeof(errbuf)),
			 0);
	fmt_index_free(&g);
	free(f);
}
END_TEST

START_TEST(test_index_future_version)
{
	json_t *r = index_json();
	char *text;
	uint8_t *f;
	size_t n;
	fmt_index g;

	SETI(r, "format", FMT_VERSION_MAX + 1);
	SETI(r, "new_in_v2", 1); /* still a version error, not corruption */
	text = json_dumps(r, JSON_COMPACT);
	ck_assert_int_eq(fmt_meta_wrap(FMT_META_INDEX, text, strlen(text), &f,
				       &n), 0);
	ck_assert_int_eq(fmt_index_decode(f, n, &g, errbuf, sizeof(errbuf)),
			 CKPT_E_VERSION);
	json_decref(r);
	free(text);
	free(f);
}
END_TEST

static void make_commit(fmt_commit *cm)
{
	static fmt_file_entry files[5];

	memset(cm, 0, sizeof(*cm));
	memset(files, 0, sizeof(files));
	cm->step = 77;
	cm->host_count = 2;
	cm->commit_unix_ns = 1764686400123456789ll;
	cm->tensor_count = 3;
	cm->raw_bytes = 240130;
	fmt_index_name(0, files[0].name);
	files[0].kind = CKPT_FILE_INDEX;
	files[0].size = 900;
	fmt_shard_name(0, 0, files[1].name);
	files[1].size = 8192;
	fmt_index_name(1, files[2].name);
	files[2].kind = CKPT_FILE_INDEX;
	files[2].host = 1;
	files[2].size = 1000;
	fmt_shard_name(1, 0, files[3].name);
	files[3].host = 1;
	files[3].size = 40960;
	fmt_shard_name(1, 1, files[4].name);
	files[4].host = 1;
	files[4].size = 65536;
	for (int i = 0; i < 5; i++) {
		files[i].xxh3 = 0x1111111111111111ull * (uint64_t)(i + 1);
		cm->stored_bytes += files[i].size;
	}
	cm->nfiles = 5;
	cm->files = files;
}

START_TEST(test_commit_roundtrip)
{
	fmt_commit cm, g;
	uint8_t *f;
	size_t n;

	make_commit(&cm);
	ck_assert_int_eq(fmt_commit_encode(&cm, &f, &n), 0);
	ck_assert_int_eq(fmt_commit_decode(f, n, &g, errbuf, sizeof(errbuf)),
			 0);
	ck_assert(g.step == 77 && g.host_count == 2 &&
		  g.commit_unix_ns == cm.commit_unix_ns &&
		  g.tensor_count == 3 && g.raw_bytes == cm.raw_bytes &&
		  g.stored_bytes == cm.stored_bytes && g.nfiles == 5);
	for (size_t i = 0; i < 5; i++) {
		ck_assert_str_eq(g.files[i].name, cm.files[i].name);
		ck_assert(g.files[i].size == cm.files[i].size &&
			  g.files[i].xxh3 == cm.files[i].xxh3 &&
			  g.files[i].host == cm.files[i].host &&
			  g.files[i].kind == cm.files[i].kind);
	}
	fmt_commit_free(&g);
	fmt_commit_free(NULL);
	/* an index document is not a commit */
	{
		fmt_index ix;
		uint8_t *fi;
		size_t ni;

		make_index(&ix);
		ck_assert_int_eq(fmt_index_encode(&ix, &fi, &ni), 0);
		ck_assert_int_eq(fmt_commit_decode(fi, ni, &g, errbuf,
						   sizeof(errbuf)),
				 CKPT_E_CORRUPT);
		free(fi);
	}
	for (size_t cut = 0; cut < n; cut += 7)
		ck_assert_int_eq(fmt_commit_decode(f, cut, &g, errbuf,
						   sizeof(errbuf)),
				 CKPT_E_CORRUPT);
	f[n - 5] ^= 1;
	ck_assert_int_eq(fmt_commit_decode(f, n, &g, errbuf, sizeof(errbuf)),
			 CKPT_E_CORRUPT);
	free(f);
}
END_TEST

static const char *const hostile_commit[] = {
	"no index of host 1", "duplicate file", "name of other host",
	"kind mismatch", "stored_bytes mismatch", "hosts 0",
	"host >= hosts", "shard smaller than header", "kind commit",
	"bad name", "negative time", "missing key", "unknown key",
	"non-canonical name", "file name too long", "file name with NUL",
	"hosts above max", "kind index of commit doc",
};
#define N_HOSTILE_COMMIT (sizeof(hostile_commit) / sizeof(hostile_commit[0]))

START_TEST(test_commit_hostile)
{
	size_t i = (size_t)_i;
	fmt_commit cm, g;
	const char *body;
	size_t n, blen;
	uint8_t *f, *f2;
	json_t *r, *fs;
	char *text;

	make_commit(&cm);
	ck_assert_int_eq(fmt_commit_encode(&cm, &f, &n), 0);
	ck_assert_int_eq(fmt_meta_unwrap(FMT_META_COMMIT, f, n, &body, &blen,
					 errbuf, sizeof(errbuf)), 0);
	r = json_loadb(body, blen, 0, NULL);
	ck_assert(r != NULL);
	fs = OBJ(r, "files");
	switch (i) {
	case 0:
		json_array_remove(fs, 2);
		SETI(r, "stored_bytes", 900 + 8192 + 40960 + 65536);
		break;
	case 1:
		json_array_append(fs, AT(fs, 1));
		SETI(r, "stored_bytes", cm.stored_bytes + 8192);
		break;
	case 2: SETI(AT(fs, 1), "host", 1); break;
	case 3: SETS(AT(fs, 1), "kind", "index"); break;
	case 4: SETI(r, "stored_bytes", cm.stored_bytes + 1); break;
	case 5: SETI(r, "hosts", 0); break;
	case 6: SETI(AT(fs, 4), "host", 2); break;
	case 7:
		SETI(AT(fs, 1), "size", 4000);
		SETI(r, "stored_bytes", cm.stored_bytes - 4192);
		break;
	case 8: SETS(AT(fs, 1), "kind", "commit"); break;
	case 9: SETS(AT(fs, 1), "name", "../etc/passwd"); break;
	case 10: SETI(r, "commit_unix_ns", -5); break;
	case 11: json_object_del(r, "raw_bytes"); break;
	case 12: SETI(AT(fs, 0), "mode", 0644); break;
	case 13: SETS(AT(fs, 1), "name", "h0-f0.shard"); break;
	case 14: SETS(AT(fs, 1), "name", "h00000-f000.shard.............."
				   "......"); break;
	case 15: json_object_set_new(AT(fs, 1), "name",
				     json_stringn("h00000-f000.shard\0", 18));
		break;
	case 16: SETI(r, "hosts", FMT_MAX_HOSTS + 1); break;
	case 17: SETS(r, "kind", "index"); break;
	default: ck_abort();
	}
	text = json_dumps(r, JSON_COMPACT);
	ck_assert_int_eq(fmt_meta_wrap(FMT_META_COMMIT, text, strlen(text),
				       &f2, &n), 0);
	ck_assert_msg(fmt_commit_decode(f2, n, &g, errbuf, sizeof(errbuf)) ==
			      CKPT_E_CORRUPT, "case %zu \"%s\" accepted", i,
		      hostile_commit[i]);
	ck_assert(strncmp(errbuf, "commit: ", 8) == 0);
	ck_assert(g.files == NULL);
	if (getenv("CKPT_TEST_VERBOSE"))
		printf("%-32s -> %s\n", hostile_commit[i], errbuf);
	json_decref(r);
	free(text);
	free(f);
	free(f2);
}
END_TEST

/* ---- the optional "reason" of index and commit documents ---- */

/* Re-wraps the body of frame f (kind) with "reason" set to v (NULL:
 * removed); the new file in *out. */
static void set_reason(int kind, const uint8_t *f, size_t n, json_t *v,
		       uint8_t **out, size_t *out_len)
{
	const char *body;
	size_t blen;
	json_t *r;
	char *text;

	ck_assert_int_eq(fmt_meta_unwrap(kind, f, n, &body, &blen, errbuf,
					 sizeof(errbuf)), 0);
	r = json_loadb(body, blen, 0, NULL);
	ck_assert(r != NULL);
	if (v)
		json_object_set_new(r, "reason", v);
	else
		json_object_del(r, "reason");
	text = json_dumps(r, JSON_COMPACT);
	ck_assert_int_eq(fmt_meta_wrap(kind, text, strlen(text), out,
				       out_len), 0);
	json_decref(r);
	free(text);
}

/* 1 if the body of frame f has a "reason" key. */
static int has_reason(int kind, const uint8_t *f, size_t n)
{
	const char *body;
	size_t blen;

	ck_assert_int_eq(fmt_meta_unwrap(kind, f, n, &body, &blen, errbuf,
					 sizeof(errbuf)), 0);
	return memmem(body, blen, "\"reason\"", 8) != NULL;
}

/* Without a reason the key is absent (documents old readers accept) and
 * decodes as unspecified; with one it is written by name and read back;
 * a name this version does not know reads as unspecified; a value that is
 * not a string is corrupt; an out-of-range reason is not encoded. */
START_TEST(test_reason_roundtrip)
{
	fmt_index ix, gi;
	fmt_commit cm, gc;
	uint8_t *f, *f2;
	size_t n, n2;

	make_index(&ix);
	make_commit(&cm);
	for (int32_t reason = 0; reason < CKPT_REASON_COUNT; reason++) {
		ix.reason = reason;
		ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), 0);
		ck_assert_int_eq(has_reason(FMT_META_INDEX, f, n), reason != 0);
		ck_assert_int_eq(fmt_index_decode(f, n, &gi, errbuf,
						  sizeof(errbuf)), 0);
		ck_assert_int_eq(gi.reason, reason);
		fmt_index_free(&gi);
		free(f);
		cm.reason = reason;
		ck_assert_int_eq(fmt_commit_encode(&cm, &f, &n), 0);
		ck_assert_int_eq(has_reason(FMT_META_COMMIT, f, n),
				 reason != 0);
		ck_assert_int_eq(fmt_commit_decode(f, n, &gc, errbuf,
						   sizeof(errbuf)), 0);
		ck_assert_int_eq(gc.reason, reason);
		fmt_commit_free(&gc);
		free(f);
	}
	ix.reason = CKPT_REASON_MAINTENANCE;
	ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), 0);
	ck_assert(memmem(f, n, "\"reason\":\"maintenance\"", 22) != NULL);
	/* unknown name: unspecified */
	set_reason(FMT_META_INDEX, f, n, json_string("solar_flare"), &f2, &n2);
	ck_assert_int_eq(fmt_index_decode(f2, n2, &gi, errbuf, sizeof(errbuf)),
			 0);
	ck_assert_int_eq(gi.reason, CKPT_REASON_UNSPECIFIED);
	fmt_index_free(&gi);
	free(f2);
	/* not a string: corrupt */
	set_reason(FMT_META_INDEX, f, n, json_integer(2), &f2, &n2);
	ck_assert_int_eq(fmt_index_decode(f2, n2, &gi, errbuf, sizeof(errbuf)),
			 CKPT_E_CORRUPT);
	ck_assert_msg(strstr(errbuf, "\"reason\""), "%s", errbuf);
	free(f2);
	free(f);
	cm.reason = CKPT_REASON_PREEMPTED;
	ck_assert_int_eq(fmt_commit_encode(&cm, &f, &n), 0);
	set_reason(FMT_META_COMMIT, f, n, json_true(), &f2, &n2);
	ck_assert_int_eq(fmt_commit_decode(f2, n2, &gc, errbuf,
					   sizeof(errbuf)), CKPT_E_CORRUPT);
	free(f2);
	set_reason(FMT_META_COMMIT, f, n, NULL, &f2, &n2);
	ck_assert_int_eq(fmt_commit_decode(f2, n2, &gc, errbuf,
					   sizeof(errbuf)), 0);
	ck_assert_int_eq(gc.reason, CKPT_REASON_UNSPECIFIED);
	fmt_commit_free(&gc);
	free(f2);
	free(f);
	/* out of range: not encoded */
	ix.reason = CKPT_REASON_COUNT;
	ck_assert_int_eq(fmt_index_encode(&ix, &f, &n), -EINVAL);
	cm.reason = -1;
	ck_assert_int_eq(fmt_commit_encode(&cm, &f, &n), -EINVAL);
}
END_TEST

/* ---- slices across hosts (fmt_slices_check) ---- */

/* A slice of tensor `name` stored by some host: ndim dims given as
 * shape/offset/extent triples in `dims` (3 * ndim values). */
static fmt_tensor_entry slice_of(const char *name, int dtype, uint32_t ndim,
				 const uint64_t *dims)
{
	fmt_tensor_entry t;

	memset(&t, 0, sizeof(t));
	t.name = (char *)name;
	t.name_len = strlen(name);
	t.dtype = dtype;
	t.ndim = ndim;
	for (uint32_t d = 0; d < ndim; d++) {
		t.shape[d] = dims[3 * d];
		t.offset[d] = dims[3 * d + 1];
		t.extent[d] = dims[3 * d + 2];
	}
	return t;
}

/* Checks the n slices t[0..n) stored by hosts 0..n-1; returns the code,
 * the message in err and the distinct count in *distinct. */
static int check_slices(const fmt_tensor_entry *t, size_t n,
			uint64_t *distinct, char *err, size_t errlen)
{
	fmt_slice *v = calloc(n ? n : 1, sizeof(*v));
	int rc;

	ck_assert_ptr_nonnull(v);
	for (size_t i = 0; i < n; i++) {
		v[i].t = &t[i];
		v[i].host = (uint32_t)i;
	}
	err[0] = 0;
	rc = fmt_slices_check(v, n, distinct, err, errlen);
	free(v);
	return rc;
}

START_TEST(test_slices_overlap)
{
	/* rows [0,4) and [3,8) of an 8x8 tensor */
	const uint64_t rows[2][6] = { { 8, 0, 4, 8, 0, 8 },
				      { 8, 3, 5, 8, 0, 8 } };
	/* columns [0,5) and [4,8): the offsets differ only in dim 1 */
	const uint64_t cols[2][6] = { { 8, 0, 8, 8, 0, 5 },
				      { 8, 0, 8, 8, 4, 4 } };
	/* a 2x2 grid of 4x4 blocks, and a 2x2 block over its centre */
	const uint64_t grid[5][6] = {
		{ 8, 0, 4, 8, 0, 4 }, { 8, 0, 4, 8, 4, 4 },
		{ 8, 4, 4, 8, 0, 4 }, { 8, 4, 4, 8, 4, 4 },
		{ 8, 3, 2, 8, 3, 2 },
	};
	fmt_tensor_entry t[5];
	char err[512];
	uint64_t distinct;

	for (int i = 0; i < 2; i++)
		t[i] = slice_of("layers.0.w", CKPT_BF16, 2, rows[i]);
	ck_assert_int_eq(check_slices(t, 2, &distinct, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	ck_assert_msg(strstr(err, "\"layers.0.w\"") &&
			      strstr(err, "host 0 and host 1") &&
			      strstr(err, "overlap"),
		      "%s", err);
	ck_assert_uint_eq(distinct, 0);

	for (int i = 0; i < 2; i++)
		t[i] = slice_of("c", CKPT_F32, 2, cols[i]);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	ck_assert_msg(strstr(err, "\"c\"") && strstr(err, "host 0 and host 1"),
		      "%s", err);

	for (int i = 0; i < 5; i++)
		t[i] = slice_of("g", CKPT_F32, 2, grid[i]);
	ck_assert_int_eq(check_slices(t, 4, &distinct, err, sizeof(err)), 0);
	ck_assert_uint_eq(distinct, 1);
	ck_assert_int_eq(check_slices(t, 5, NULL, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	/* the centre block (host 4) meets host 0's block first */
	ck_assert_msg(strstr(err, "host 0 and host 4"), "%s", err);
	/* one element in common is enough: a 1x1 slice at the corner */
	const uint64_t corner[6] = { 8, 3, 1, 8, 3, 1 };
	t[1] = slice_of("g", CKPT_F32, 2, corner);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)),
			 CKPT_E_MISMATCH);
}
END_TEST

START_TEST(test_slices_touching)
{
	/* rows, columns and a 2x2 grid that share edges but no element,
	 * and slices that overlap in dim 0 but only touch in dim 1 */
	const uint64_t rows[2][6] = { { 8, 0, 4, 8, 0, 8 },
				      { 8, 4, 4, 8, 0, 8 } };
	const uint64_t cols[2][6] = { { 8, 0, 8, 8, 0, 4 },
				      { 8, 0, 8, 8, 4, 4 } };
	const uint64_t grid[4][6] = {
		{ 8, 0, 4, 8, 0, 4 }, { 8, 0, 4, 8, 4, 4 },
		{ 8, 4, 4, 8, 0, 4 }, { 8, 4, 4, 8, 4, 4 },
	};
	const uint64_t stagger[2][6] = { { 8, 0, 6, 8, 0, 3 },
					 { 8, 2, 6, 8, 3, 5 } };
	const uint64_t stagger2[2][6] = { { 8, 0, 6, 8, 3, 5 },
					  { 8, 2, 6, 8, 0, 3 } };
	fmt_tensor_entry t[4];
	char err[512];
	uint64_t distinct = 99;

	for (int i = 0; i < 2; i++)
		t[i] = slice_of("r", CKPT_F16, 2, rows[i]);
	ck_assert_int_eq(check_slices(t, 2, &distinct, err, sizeof(err)), 0);
	ck_assert_uint_eq(distinct, 1);
	for (int i = 0; i < 2; i++)
		t[i] = slice_of("c", CKPT_F16, 2, cols[i]);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)), 0);
	for (int i = 0; i < 4; i++)
		t[i] = slice_of("g", CKPT_F16, 2, grid[i]);
	ck_assert_int_eq(check_slices(t, 4, NULL, err, sizeof(err)), 0);
	for (int i = 0; i < 2; i++)
		t[i] = slice_of("s", CKPT_F16, 2, stagger[i]);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)), 0);
	for (int i = 0; i < 2; i++)
		t[i] = slice_of("s", CKPT_F16, 2, stagger2[i]);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)), 0);
	/* nothing at all */
	ck_assert_int_eq(check_slices(t, 0, &distinct, err, sizeof(err)), 0);
	ck_assert_uint_eq(distinct, 0);
}
END_TEST

START_TEST(test_slices_disagree)
{
	const uint64_t a[6] = { 8, 0, 4, 8, 0, 8 };
	const uint64_t b[6] = { 8, 4, 4, 8, 0, 8 };
	const uint64_t b_wide[6] = { 8, 4, 4, 9, 0, 8 };
	const uint64_t b_3d[9] = { 8, 4, 4, 8, 0, 8, 1, 0, 1 };
	fmt_tensor_entry t[3];
	char err[512];

	/* dtype */
	t[0] = slice_of("w", CKPT_BF16, 2, a);
	t[1] = slice_of("w", CKPT_F32, 2, b);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	ck_assert_msg(strstr(err, "\"w\"") && strstr(err, "host 0") &&
			      strstr(err, "host 1") &&
			      strstr(err, "bf16[8,8]") &&
			      strstr(err, "f32[8,8]"),
		      "%s", err);
	/* global shape */
	t[1] = slice_of("w", CKPT_BF16, 2, b_wide);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	ck_assert_msg(strstr(err, "bf16[8,9]"), "%s", err);
	/* ndim, with the odd one last: host 2 */
	t[1] = slice_of("w", CKPT_BF16, 2, b);
	t[2] = slice_of("w", CKPT_BF16, 3, b_3d);
	ck_assert_int_eq(check_slices(t, 3, NULL, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	ck_assert_msg(strstr(err, "host 0") && strstr(err, "host 2") &&
			      strstr(err, "bf16[8,8,1]"),
		      "%s", err);
	/* a same-shaped tensor of another name is no concern */
	t[2] = slice_of("w2", CKPT_F32, 2, a);
	ck_assert_int_eq(check_slices(t, 3, NULL, err, sizeof(err)), 0);
}
END_TEST

START_TEST(test_slices_bounds)
{
	const uint64_t ok[6] = { 8, 0, 4, 8, 0, 8 };
	const uint64_t past[6] = { 8, 4, 5, 8, 0, 8 };
	const uint64_t huge[6] = { 8, 4, UINT64_MAX, 8, 0, 8 };
	fmt_tensor_entry t[2];
	fmt_slice v[2];
	char err[512];

	t[0] = slice_of("w", CKPT_U8, 2, ok);
	t[1] = slice_of("w", CKPT_U8, 2, past);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)),
			 CKPT_E_CORRUPT);
	ck_assert_msg(strstr(err, "\"w\"") && strstr(err, "host 1"), "%s",
		      err);
	/* offset + extent would wrap: still outside, never "no overlap" */
	t[1] = slice_of("w", CKPT_U8, 2, huge);
	ck_assert_int_eq(check_slices(t, 2, NULL, err, sizeof(err)),
			 CKPT_E_CORRUPT);
	/* a lone slice is checked too */
	ck_assert_int_eq(check_slices(&t[1], 1, NULL, err, sizeof(err)),
			 CKPT_E_CORRUPT);
	/* NULL entries, NULL error buffer */
	ck_assert_int_eq(fmt_slices_check(NULL, 1, NULL, NULL, 0), -EINVAL);
	v[0].t = &t[0];
	v[0].host = 0;
	v[1].t = NULL;
	v[1].host = 1;
	ck_assert_int_eq(fmt_slices_check(v, 2, NULL, NULL, 0), -EINVAL);
	v[1].t = &t[1];
	ck_assert_int_eq(fmt_slices_check(v, 2, NULL, NULL, 0),
			 CKPT_E_CORRUPT);
}
END_TEST

START_TEST(test_slices_scalars)
{
	fmt_tensor_entry t[3];
	char err[512];
	uint64_t distinct;

	t[0] = slice_of("step", CKPT_I64, 0, NULL);
	t[1] = slice_of("lr", CKPT_F32, 0, NULL);
	t[2] = slice_of("seed", CKPT_U64, 0, NULL);
	ck_assert_int_eq(check_slices(t, 3, &distinct, err, sizeof(err)), 0);
	ck_assert_uint_eq(distinct, 3);
	/* two hosts storing one scalar both store its one element */
	t[2] = slice_of("step", CKPT_I64, 0, NULL);
	ck_assert_int_eq(check_slices(t, 3, &distinct, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	ck_assert_msg(strstr(err, "\"step\"") &&
			      strstr(err, "host 0 and host 2"),
		      "%s", err);
	/* a scalar against a 1-element vector of the same name */
	const uint64_t one[3] = { 1, 0, 1 };
	t[2] = slice_of("step", CKPT_I64, 1, one);
	ck_assert_int_eq(check_slices(t, 3, NULL, err, sizeof(err)),
			 CKPT_E_MISMATCH);
	ck_assert_msg(strstr(err, "i64[]") && strstr(err, "i64[1]"), "%s",
		      err);
}
END_TEST

START_TEST(test_slices_empty)
{
	/* empty slices hold no element: they overlap nothing, not even a
	 * full slice or each other at the same place */
	const uint64_t full[6] = { 8, 0, 8, 8, 0, 8 };
	const uint64_t empty0[6] = { 8, 3, 0, 8, 0, 8 };
	const uint64_t empty1[6] = { 8, 0, 8, 8, 5, 0 };
	const uint64_t at_end[6] = { 8, 8, 0, 8, 0, 8 };
	/* a tensor with no elements at all, stored by three hosts */
	const uint64_t none[6] = { 0, 0, 0, 4, 0, 4 };
	fmt_tensor_entry t[4];
	char err[512];
	uint64_t distinct;

	t[0] = slice_of("w", CKPT_F32, 2, full);
	t[1] = slice_of("w", CKPT_F32, 2, empty0);
	t[2] = slice_of("w", CKPT_F32, 2, empty1);
	t[3] = slice_of("w", CKPT_F32, 2, at_end);
	ck_assert_int_eq(check_slices(t, 4, &distinct, err, sizeof(err)), 0);
	ck_assert_uint_eq(distinct, 1);
	t[0] = t[1];
	ck_assert_int_eq(check_slices(t, 4, NULL, err, sizeof(err)), 0);
	for (int i = 0; i < 3; i++)
		t[i] = slice_of("e", CKPT_U8, 2, none);
	ck_assert_int_eq(check_slices(t, 3, &distinct, err, sizeof(err)), 0);
	ck_assert_uint_eq(distinct, 1);
}
END_TEST

/*
 * Many slices: NT tensors of NH slices each, sharded by rows (tensor k
 * even) or by columns (k odd: the offsets differ only in dim 1, where a
 * sweep along dim 0 alone would compare every pair), given in a shuffled
 * order. Then one slice is moved by one row or column in each of a few
 * places and the overlap must be found and attributed to the right hosts.
 */
#define SL_NT 64
#define SL_NH 512
START_TEST(test_slices_many)
{
	size_t n = (size_t)SL_NT * SL_NH;
	fmt_tensor_entry *t = calloc(n, sizeof(*t));
	fmt_slice *v = calloc(n, sizeof(*v));
	char(*names)[16] = calloc(SL_NT, sizeof(*names));
	char err[512], want[64];
	uint64_t distinct;

	ck_assert(t && v && names);
	for (size_t k = 0; k < SL_NT; k++) {
		snprintf(names[k], sizeof(names[k]), "t%03zu", k);
		for (size_t h = 0; h < SL_NH; h++) {
			uint64_t dims[6] = { 4 * SL_NH, 4 * h, 4,
					     2 * SL_NH, 0, 2 * SL_NH };
			fmt_tensor_entry *e = &t[k * SL_NH + h];

			if (k % 2) {
				dims[0] = 2 * SL_NH;
				dims[1] = 0;
				dims[2] = 2 * SL_NH;
				dims[3] = 4 * SL_NH;
				dims[4] = 4 * h;
				dims[5] = 4;
			}
			*e = slice_of(names[k], CKPT_BF16, 2, dims);
		}
	}
	for (int round = 0; round < 4; round++) {
		/* round 0: all fine; then tensor k's slice of host h moves
		 * one row/column back into host h-1's */
		size_t k = (size_t)(round * 21) % SL_NT, h = 1 + 97 * round;
		int d = (int)(k % 2);

		if (round > 0)
			t[k * SL_NH + h].offset[d] -= 1;
		for (size_t i = 0; i < n; i++) {
			v[i].t = &t[i];
			v[i].host = (uint32_t)(i % SL_NH);
		}
		for (size_t i = n - 1; i > 0; i--) {
			size_t j = (size_t)(rnd() % (i + 1));
			fmt_slice x = v[i];

			v[i] = v[j];
			v[j] = x;
		}
		err[0] = 0;
		if (round == 0) {
			ck_assert_int_eq(fmt_slices_check(v, n, &distinct, err,
							  sizeof(err)),
					 0);
			ck_assert_uint_eq(distinct, SL_NT);
			/* every slice still there, grouped by name */
			for (size_t i = 1; i < n; i++)
				ck_assert(strcmp(v[i - 1].t->name,
						 v[i].t->name) <= 0);
			continue;
		}
		ck_assert_int_eq(fmt_slices_check(v, n, &distinct, err,
						  sizeof(err)),
				 CKPT_E_MISMATCH);
		snprintf(want, sizeof(want), "\"%s\"", names[k]);
		ck_assert_msg(strstr(err, want), "%s", err);
		snprintf(want, sizeof(want), "host %zu and host %zu", h - 1,
			 h);
		ck_assert_msg(strstr(err, want), "round %d: %s", round, err);
		t[k * SL_NH + h].offset[d] += 1;
	}
	free(t);
	free(v);
	free(names);
}
END_TEST

static Suite *format_suite(void)
{
	Suite *s = suite_create("format");
	TCase *tc = tcase_create("bytes");

	tcase_add_test(tc, test_le_and_hash);
	tcase_add_test(tc, test_names);
	tcase_add_test(tc, test_name_valid);
	tcase_add_test(tc, test_shape_and_tables);
	tcase_add_test(tc, test_shard_hdr);
	tcase_add_test(tc, test_chunk_hdr);
	tcase_add_test(tc, test_meta_frame);
	suite_add_tcase(s, tc);

	tc = tcase_create("codec");
	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_codec_roundtrip);
	tcase_add_test(tc, test_codec_garbage);
	tcase_add_test(tc, test_codec_parts);
	tcase_add_test(tc, test_float_layout);
	tcase_add_test(tc, test_bf16_ratio);
	tcase_add_test(tc, test_huf_roundtrip);
	tcase_add_test(tc, test_huf_hostile);
	suite_add_tcase(s, tc);

	tc = tcase_create("documents");
	tcase_add_test(tc, test_index_roundtrip);
	tcase_add_loop_test(tc, test_index_hostile, 0, N_HOSTILE_INDEX);
	tcase_add_test(tc, test_index_spec_example);
	tcase_add_test(tc, test_index_future_version);
	tcase_add_test(tc, test_commit_roundtrip);
	tcase_add_loop_test(tc, test_commit_hostile, 0, N_HOSTILE_COMMIT);
	tcase_add_test(tc, test_reason_roundtrip);
	suite_add_tcase(s, tc);

	tc = tcase_create("slices");
	tcase_add_test(tc, test_slices_overlap);
	tcase_add_test(tc, test_slices_touching);
	tcase_add_test(tc, test_slices_disagree);
	tcase_add_test(tc, test_slices_bounds);
	tcase_add_test(tc, test_slices_scalars);
	tcase_add_test(tc, test_slices_empty);
	tcase_add_test(tc, test_slices_many);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(format_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed != 0;
}
