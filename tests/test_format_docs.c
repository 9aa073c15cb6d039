/*
 * test_format_docs.c - format v1 (format/), its index and commit
 * documents: round trips, SPEC.md section 13's example byte for byte, a
 * future version, hostile documents (one mutation of a valid one per loop
 * iteration), and the optional "reason" of both. Uses only fmt.h /
 * ckpt.h (no testutil).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "ckpt.h"
#include "fmt.h"
#include "tu_format.h"

static char errbuf[1024];

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

static Suite *format_docs_suite(void)
{
	Suite *s = suite_create("format_docs");
	TCase *tc = tcase_create("documents");

	tcase_add_test(tc, test_index_roundtrip);
	tcase_add_loop_test(tc, test_index_hostile, 0, N_HOSTILE_INDEX);
	tcase_add_test(tc, test_index_spec_example);
	tcase_add_test(tc, test_index_future_version);
	tcase_add_test(tc, test_commit_roundtrip);
	tcase_add_loop_test(tc, test_commit_hostile, 0, N_HOSTILE_COMMIT);
	tcase_add_test(tc, test_reason_roundtrip);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tf_main(format_docs_suite());
}
