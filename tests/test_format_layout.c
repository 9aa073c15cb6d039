/*
 * test_format_layout.c - format v1 (format/), its byte layouts: the
 * little-endian and hash helpers, step and tensor names, shapes and dtype
 * tables, shard and chunk headers, metadata frames (each with the
 * rejection of hostile bytes); and the slice rule across hosts
 * (fmt_slices_check). Codecs: test_format_codec.c; index and commit
 * documents: test_format_docs.c. Uses only fmt.h / ckpt.h (no testutil).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "fmt.h"
#include "tu_format.h"

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
			size_t j = (size_t)(tf_rnd() % (i + 1));
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

static Suite *format_layout_suite(void)
{
	Suite *s = suite_create("format_layout");
	TCase *tc = tcase_create("bytes");

	tcase_add_test(tc, test_le_and_hash);
	tcase_add_test(tc, test_names);
	tcase_add_test(tc, test_name_valid);
	tcase_add_test(tc, test_shape_and_tables);
	tcase_add_test(tc, test_shard_hdr);
	tcase_add_test(tc, test_chunk_hdr);
	tcase_add_test(tc, test_meta_frame);
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
	return tf_main(format_layout_suite());
}
