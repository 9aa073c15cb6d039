/*
 * test_golden.c - checkpoints frozen in tests/golden must keep loading,
 * byte for byte, with every future version of the library. See
 * tests/golden/README for what each set holds and how it was made.
 *
 * The files were generated ONCE with
 *     build/tests/test_golden --generate /work/main/tests/golden/v1
 *     build/tests/test_golden --generate-huffman tests/golden/v1-huffman
 *     build/tests/test_golden --generate-dedup tests/golden/v2-dedup
 * and committed. NEVER regenerate them: they freeze the format (a change
 * that breaks this test breaks every checkpoint users have on disk). The
 * tensor contents are a deterministic function of (step, name) and are
 * regenerated here to compare; save ids and timestamps inside the files
 * are whatever they were at generation time.
 *
 * Layout:
 *   v1/single/  steps 1, 2, 3: one host, codec none, zstd, float; every
 *               dtype, scalar, empty, chunk-spanning tensors (chunk 64 KiB),
 *               2 shard files.
 *   v1/multi/   step 5: two hosts (float / zstd codec) with slices of global
 *               arrays split along dim 0 and dim 1, plus private tensors.
 *   v1-huffman/ step 7: one host, float codec, bf16/f32/f64 tensors with
 *               weight-like exponents, so that exponent planes are
 *               Huffman-coded (plane mode 2); the test counts the plane
 *               modes in the shard files' bytes to prove it.
 *   v2-dedup/   steps 1, 2, 3: format version 2 (SPEC.md section 16),
 *               one host, float codec, chunk 64 KiB, 2 shard files; a
 *               frozen 256 KiB tensor stored once in step 1 and referred
 *               to by steps 2 and 3, a head that changes every step.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fmt.h"
#include "testutil.h"

static char why[1024];

/* ---- the frozen content ---- */

static uint64_t golden_seed(uint64_t step, const char *name)
{
	return tu_hash_str(name) ^ (step * 0x9e3779b97f4a7c15ull);
}

static void single_set(tu_set *set, uint64_t step)
{
	tu_set_init(set);
	for (int d = 1; d < CKPT_DTYPE_COUNT; d++) {
		char name[64];
		uint64_t sh[2] = {5, 7};
		snprintf(name, sizeof(name), "dtype.%s", ckpt_dtype_name(d));
		tu_set_add(set, name, d, 2, sh, golden_seed(step, name));
	}
	uint64_t e[2] = {0, 3}, b1[2] = {128, 200}, b2[2] = {64, 200},
		 b3[1] = {1001}, t3[1] = {3};
	tu_set_add(set, "scalar", CKPT_F32, 0, NULL, golden_seed(step, "scalar"));
	tu_set_add(set, "empty", CKPT_I32, 2, e, golden_seed(step, "empty"));
	tu_set_add(set, "big.bf16", CKPT_BF16, 2, b1,
		   golden_seed(step, "big.bf16"));
	tu_set_add(set, "big.f32", CKPT_F32, 2, b2, golden_seed(step, "big.f32"));
	tu_set_add(set, "name with spaces/ünïcødé", CKPT_F64, 1, b3,
		   golden_seed(step, "f64"));
	tu_set_add(set, "tail.bf16", CKPT_BF16, 1, t3,
		   golden_seed(step, "tail.bf16"));
}

#define MULTI_STEP 5
static const uint64_t w_shape[2] = {64, 64}, e_shape[2] = {32, 300};

static void multi_set(tu_set *set, uint32_t h)
{
	tu_set_init(set);
	uint64_t wo[2][2] = {{0, 0}, {40, 0}}, we[2][2] = {{40, 64}, {24, 64}};
	uint64_t eo[2][2] = {{0, 0}, {0, 100}}, ee[2][2] = {{32, 100}, {32, 200}};
	tu_set_add_slice(set, "w", CKPT_F32, 2, w_shape, wo[h], we[h],
			 golden_seed(MULTI_STEP, "w"));
	tu_set_add_slice(set, "e", CKPT_BF16, 2, e_shape, eo[h], ee[h],
			 golden_seed(MULTI_STEP, "e"));
	char name[32];
	uint64_t p[1] = {50 + h};
	snprintf(name, sizeof(name), "h%u.priv", h);
	tu_set_add(set, name, CKPT_I16, 1, p, golden_seed(MULTI_STEP, name));
}

static const int single_codecs[3] = {CKPT_CODEC_NONE, CKPT_CODEC_ZSTD,
				     CKPT_CODEC_FLOAT};

/* ---- the frozen content of v1-huffman ---- */

/*
 * Float tensors whose exponent planes are skewed like trained weights, so
 * that the float codec codes them with Huffman (plane mode 2). The values
 * are integer-exact: a centred sum of four 32-bit draws of a private
 * splitmix64 (Irwin-Hall, close to normal) times a power of two. No libm,
 * no testutil generator: the expected bytes can never drift with the
 * machine, the C library or a change elsewhere in the tests.
 */
#define HUF_STEP 7

static uint64_t huf_rng(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Standard deviation about 2^31.2 * scale. */
static double huf_value(uint64_t *s, double scale)
{
	int64_t sum = -2 * (int64_t)UINT32_MAX;

	for (int k = 0; k < 4; k++)
		sum += (int64_t)(huf_rng(s) >> 32);
	return (double)sum * scale;
}

static void huf_fill(tu_tensor *t, uint64_t seed, double scale)
{
	uint64_t n = t->nbytes / ckpt_dtype_size(t->dtype), s = seed;
	uint8_t *p = t->data;

	for (uint64_t i = 0; i < n; i++) {
		double v = huf_value(&s, scale);
		float f = (float)v;
		uint32_t b;
		uint16_t h;

		switch (t->dtype) {
		case CKPT_F64:
			memcpy(p + 8 * i, &v, 8);
			break;
		case CKPT_F32:
			memcpy(p + 4 * i, &f, 4);
			break;
		case CKPT_BF16: /* round to nearest even (no NaN here) */
			memcpy(&b, &f, 4);
			h = (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
			memcpy(p + 2 * i, &h, 2);
			break;
		default: /* CKPT_U8 */
			p[i] = (uint8_t)(huf_rng(&s) >> 56);
		}
	}
}

/*
 * Stream (chunk 64 KiB): w.bf16 fills chunks 0-1 (elem_width 2), w.f32
 * starts chunk 3 (elem_width 4), w.f64 starts chunk 4 (elem_width 8), and
 * the 37 bytes of tail.u8 leave that last chunk 16421 bytes long: 5 tail
 * bytes after its planes.
 */
static void huf_set(tu_set *set)
{
	static const struct {
		const char *name;
		int dtype;
		uint64_t shape[2];
		double scale;
	} d[4] = {
		{ "w.bf16", CKPT_BF16, { 256, 256 }, 0x1p-37 }, /* sd 0.018 */
		{ "w.f32", CKPT_F32, { 96, 256 }, 0x1p-31 },    /* sd 1.2 */
		{ "w.f64", CKPT_F64, { 48, 128 }, 0x1p-40 },    /* sd 0.002 */
		{ "tail.u8", CKPT_U8, { 37, 1 }, 0 },
	};

	tu_set_init(set);
	for (int k = 0; k < 4; k++) {
		tu_tensor *t = tu_set_add_nofill(set, d[k].name, d[k].dtype,
						 k == 3 ? 1 : 2, d[k].shape);

		huf_fill(t, golden_seed(HUF_STEP, d[k].name), d[k].scale);
	}
}

/* v2-dedup: "frozen" is the same at every step, "head" is the step's. */
static void dedup_set(tu_set *set, uint64_t step)
{
	uint64_t fs[2] = { 256, 512 }, hs[1] = { 3000 };

	tu_set_init(set);
	tu_set_add(set, "frozen", CKPT_BF16, 2, fs, golden_seed(1, "frozen"));
	tu_set_add(set, "head", CKPT_F32, 1, hs, golden_seed(step, "head"));
}

/* ---- generators ---- */

/* Reports the outcome of a generator; the exit code. */
static int generated(int rc, const char *out)
{
	if (rc)
		fprintf(stderr, "generation failed: %d %s: %s\n", rc,
			ckpt_strerror(rc), ckpt_errmsg(NULL));
	else
		fprintf(stderr, "golden checkpoints written to %s\n", out);
	return rc ? 1 : 0;
}

static int generate(const char *out)
{
	struct stat st;
	if (!stat(out, &st)) {
		char *probe = tu_path("%s/single", out);
		int exists = !stat(probe, &st);
		free(probe);
		if (exists) {
			fprintf(stderr, "%s/single exists: golden files are "
					"never regenerated\n", out);
			return 1;
		}
	}
	mkdir(out, 0755);
	char *single = tu_path("%s/single", out), *multi = tu_path("%s/multi", out);
	int rc = 0;
	for (int k = 0; k < 3 && !rc; k++) {
		ckpt_settings s;
		ckpt_settings_default(&s);
		s.staging_bytes = 4u << 20;
		s.chunk_bytes = 64u << 10;
		s.files_per_host = 2;
		s.codec = single_codecs[k];
		s.level = 3;
		s.threads = 1;
		ckpt *c = NULL;
		rc = ckpt_open(&c, single, &s);
		if (rc)
			break;
		tu_set set;
		single_set(&set, (uint64_t)k + 1);
		rc = tu_save(c, (uint64_t)k + 1, &set);
		tu_set_free(&set);
		int rc2 = ckpt_close(c);
		if (!rc)
			rc = rc2;
	}
	for (uint32_t h = 0; h < 2 && !rc; h++) {
		ckpt_settings s;
		ckpt_settings_default(&s);
		s.staging_bytes = 4u << 20;
		s.chunk_bytes = 64u << 10;
		s.files_per_host = 1 + h;
		s.codec = h ? CKPT_CODEC_ZSTD : CKPT_CODEC_FLOAT;
		s.threads = 1;
		s.host_index = h;
		s.host_count = 2;
		ckpt *c = NULL;
		rc = ckpt_open(&c, multi, &s);
		if (rc)
			break;
		tu_set set;
		multi_set(&set, h);
		rc = tu_save(c, MULTI_STEP, &set);
		tu_set_free(&set);
		if (!rc && h == 1)
			rc = ckpt_commit(c, MULTI_STEP);
		int rc2 = ckpt_close(c);
		if (!rc)
			rc = rc2;
	}
	free(single);
	free(multi);
	return generated(rc, out);
}

/* Opens out for a generator with the small float-codec settings the
 * Huffman and dedup sets share (and `flags`); 1 if out already holds a
 * set: golden files are never regenerated. */
static int golden_open(const char *out, uint32_t flags, ckpt **c)
{
	char *probe = tu_path("%s/latest", out);
	int exists = tu_exists(probe);
	ckpt_settings s;

	free(probe);
	*c = NULL;
	if (exists) {
		fprintf(stderr, "%s/latest exists: golden files are never "
				"regenerated\n", out);
		return 1;
	}
	ckpt_settings_default(&s);
	s.staging_bytes = 4u << 20;
	s.chunk_bytes = 64u << 10;
	s.files_per_host = 2;
	s.codec = CKPT_CODEC_FLOAT;
	s.threads = 1;
	s.flags = flags;
	return ckpt_open(c, out, &s);
}

static int generate_huffman(const char *out)
{
	ckpt *c = NULL;
	tu_set set;
	int rc = golden_open(out, 0, &c);

	if (rc == 1)
		return 1;
	if (!rc) {
		huf_set(&set);
		rc = tu_save(c, HUF_STEP, &set);
		tu_set_free(&set);
		int rc2 = ckpt_close(c);
		if (!rc)
			rc = rc2;
	}
	return generated(rc, out);
}

static int generate_dedup(const char *out)
{
	ckpt *c = NULL;
	int rc = golden_open(out, CKPT_F_DEDUP, &c);

	if (rc == 1)
		return 1;
	for (uint64_t step = 1; step <= 3 && !rc; step++) {
		tu_set set;

		dedup_set(&set, step);
		rc = tu_save(c, step, &set);
		tu_set_free(&set);
	}
	if (c) {
		int rc2 = ckpt_close(c);
		if (!rc)
			rc = rc2;
	}
	return generated(rc, out);
}

/* ---- checks ---- */

/* tests/golden/<set>/<sub> */
static char *golden_dir(const char *set, const char *sub)
{
	const char *src = getenv("CKPT_TEST_SRCDIR");
	ck_assert_msg(src && *src, "CKPT_TEST_SRCDIR is not set (run through "
				   "meson test)");
	char *p = tu_path("%s/golden/%s/%s", src, set, sub);
	struct stat st;
	ck_assert_msg(!stat(p, &st) && S_ISDIR(st.st_mode),
		      "golden checkpoint %s is missing", p);
	return p;
}

/* The reader must not write into the tree: work on a copy, <tmp>/<as>. */
static char *golden_copy(const char *set, const char *sub, const char *as)
{
	char *src = golden_dir(set, sub);
	char *dst = tu_path("%s/%s", tu_tmpdir(), as);
	ck_assert_int_eq(tu_copy_tree(src, dst), 0);
	free(src);
	return dst;
}

static void check_tensor_list(ckpt_reader *r, const tu_set *set)
{
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), set->n);
	for (size_t i = 0; i < set->n; i++) {
		const tu_tensor *t = &set->t[i];
		size_t ix;
		ckpt_tensor_info ti;
		ck_assert_msg(ckpt_reader_find(r, t->name, &ix) == 0,
			      "tensor \"%s\" missing", t->name);
		ck_assert_int_eq(ckpt_reader_tensor(r, ix, &ti), 0);
		ck_assert_int_eq(ti.dtype, t->dtype);
		ck_assert_uint_eq(ti.ndim, t->ndim);
		for (uint32_t d = 0; d < t->ndim; d++)
			ck_assert_uint_eq(ti.shape[d], t->shape[d]);
		ck_assert_uint_eq(ti.nbytes, t->nbytes);
	}
}

static void check_magic(const char *path, const char *magic)
{
	uint8_t *b;
	size_t n;
	ck_assert_int_eq(tu_read_file(path, &b, &n), 0);
	ck_assert_msg(n >= strlen(magic) && !memcmp(b, magic, strlen(magic)),
		      "%s does not start with %s", path, magic);
	free(b);
}

/* `latest` holds "step-%020llu\n" of `step`, byte for byte. */
static void check_latest(const char *root, uint64_t step)
{
	char *lp = tu_path("%s/latest", root), want[32];
	uint8_t *lb;
	size_t ln;

	snprintf(want, sizeof(want), "step-%020llu\n", (unsigned long long)step);
	ck_assert_int_eq(tu_read_file(lp, &lb, &ln), 0);
	ck_assert_msg(ln == 26 && !memcmp(lb, want, 26),
		      "latest pointer changed format");
	free(lb);
	free(lp);
}

START_TEST(test_golden_single)
{
	char *root = golden_copy("v1", "single", "single");
	check_latest(root, 3);
	for (int k = 0; k < 3; k++) {
		uint64_t step = (uint64_t)k + 1;
		tu_set set;
		single_set(&set, step);
		ck_assert_msg(tu_check_root(root, step, &set, why, sizeof(why)) == 0,
			      "step %llu: %s", (unsigned long long)step, why);
		ckpt_reader *r = NULL;
		ck_assert_int_eq(ckpt_reader_open(&r, root, step, NULL), 0);
		ck_assert_uint_eq(ckpt_reader_host_count(r), 1);
		check_tensor_list(r, &set);
		void *p;
		uint64_t nb;
		for (size_t i = 0; i < set.n; i++) {
			ck_assert_int_eq(ckpt_read_alloc(r, set.t[i].name, &p, &nb), 0);
			ck_assert_uint_eq(nb, set.t[i].nbytes);
			ck_assert(!nb || !memcmp(p, set.t[i].data, nb));
			ckpt_free(p);
		}
		ckpt_stats st;
		ck_assert_int_eq(ckpt_reader_stats(r, &st), 0);
		ck_assert_uint_ge(st.chunks, 2);
		if (single_codecs[k] == CKPT_CODEC_NONE)
			ck_assert_uint_eq(st.chunks_by_codec[CKPT_CODEC_NONE],
					  st.chunks);
		else
			ck_assert_uint_gt(st.chunks_by_codec[single_codecs[k]], 0);
		/* a box inside a chunk-spanning tensor */
		uint64_t off[2] = {60, 13}, ext[2] = {50, 101};
		uint64_t bn = 50 * 101 * 2;
		uint8_t *want = malloc(bn), *got = malloc(bn);
		const tu_tensor *bt = NULL;
		for (size_t i = 0; i < set.n; i++)
			if (!strcmp(set.t[i].name, "big.bf16"))
				bt = &set.t[i];
		tu_extract_box(bt->data, 2, bt->shape, 2, off, ext, want);
		ck_assert_int_eq(ckpt_read_slice(r, "big.bf16", off, ext, got, bn), 0);
		ck_assert(!memcmp(got, want, bn));
		free(want);
		free(got);
		/* frozen magics */
		size_t nf = ckpt_reader_file_count(r);
		char *sd = tu_step_dir(root, step);
		for (size_t i = 0; i < nf; i++) {
			ckpt_file_info fi;
			ck_assert_int_eq(ckpt_reader_file(r, i, &fi), 0);
			char *fp = tu_path("%s/%s", sd, fi.name);
			check_magic(fp, fi.kind == CKPT_FILE_SHARD ? "CKPTSHRD"
								    : "CKPTMETA");
			free(fp);
		}
		char *cp = tu_path("%s/COMMIT", sd);
		check_magic(cp, "CKPTMETA");
		free(cp);
		free(sd);
		ckpt_reader_close(r);
		tu_set_free(&set);
	}
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, root, CKPT_LATEST, NULL), 0);
	ck_assert_uint_eq(ckpt_reader_step(r), 3);
	ckpt_reader_close(r);
	free(root);
}
END_TEST

START_TEST(test_golden_multi)
{
	char *root = golden_copy("v1", "multi", "multi");
	ckpt_reader *r = NULL;
	int rc = ckpt_reader_open(&r, root, CKPT_LATEST, NULL);
	ck_assert_msg(rc == 0, "open: %d %s", rc, ckpt_reader_errmsg(NULL));
	ck_assert_uint_eq(ckpt_reader_step(r), MULTI_STEP);
	ck_assert_uint_eq(ckpt_reader_host_count(r), 2);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), 0);
	ck_assert_uint_eq(ckpt_reader_tensor_count(r), 4);
	for (uint32_t h = 0; h < 2; h++) {
		tu_set set;
		multi_set(&set, h);
		ck_assert_msg(tu_check_set(r, &set, why, sizeof(why)) == 0, "%s",
			      why);
		tu_set_free(&set);
	}
	struct {
		const char *name;
		int dtype;
		const uint64_t *shape;
	} g[2] = {{"w", CKPT_F32, w_shape}, {"e", CKPT_BF16, e_shape}};
	for (int k = 0; k < 2; k++) {
		uint64_t nb;
		void *want = tu_global_data(g[k].dtype, 2, g[k].shape,
					    golden_seed(MULTI_STEP, g[k].name), &nb);
		void *got = malloc(nb);
		ck_assert_int_eq(ckpt_read(r, g[k].name, got, nb), 0);
		ck_assert_msg(!memcmp(got, want, nb), "%s differs", g[k].name);
		size_t ix;
		ckpt_tensor_info ti;
		ck_assert_int_eq(ckpt_reader_find(r, g[k].name, &ix), 0);
		ck_assert_int_eq(ckpt_reader_tensor(r, ix, &ti), 0);
		ck_assert_uint_eq(ti.slice_count, 2);
		free(got);
		free(want);
	}
	ckpt_reader_close(r);
	free(root);
}
END_TEST

/*
 * The plane modes of the float-codec chunks of a step's shard files, read
 * from the bytes as SPEC.md sections 4.2 and 5.3 lay them out, not through
 * format/: a golden set that claims to freeze Huffman planes must be seen
 * to hold them. census[w][j][mode] counts plane j of chunks of element
 * width w; *tails counts float chunks with tail bytes. Every mode-2 plane
 * is checked for its structure (complete prefix code of lengths <= 11,
 * stream sizes adding up).
 */
static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static void check_huffman_plane(const uint8_t *p, uint32_t len)
{
	uint32_t kraft = 0, streams = 0;

	ck_assert_uint_ge(len, 144);
	for (int x = 0; x < 256; x++) {
		unsigned l = (p[x / 2] >> (4 * (x % 2))) & 15u;

		ck_assert_uint_le(l, 11);
		if (l)
			kraft += 1u << (11 - l);
	}
	ck_assert_uint_eq(kraft, 1u << 11);
	for (int s = 0; s < 4; s++)
		streams += le32(p + 128 + 4 * s);
	ck_assert_uint_eq(144 + streams, len);
}

static void plane_census(const char *stepdir, unsigned census[9][8][3],
			 unsigned *tails)
{
	char **names;
	int nn = tu_list_files(stepdir, &names);

	ck_assert_int_ge(nn, 1);
	for (int f = 0; f < nn; f++) {
		size_t nl = strlen(names[f]), len, off = 4096;
		uint8_t *b;

		if (nl < 6 || strcmp(names[f] + nl - 6, ".shard"))
			continue;
		char *path = tu_path("%s/%s", stepdir, names[f]);
		ck_assert_int_eq(tu_read_file(path, &b, &len), 0);
		while (off < len) {
			const uint8_t *h = b + off, *p = h + 64;
			uint32_t raw_len, stored, w;
			size_t pos;

			ck_assert(off + 64 <= len && !memcmp(h, "CKCH", 4));
			raw_len = le32(h + 8);
			stored = le32(h + 12);
			ck_assert(stored <= len - off - 64);
			off += (64 + stored + 4095) / 4096 * 4096;
			if (h[4] != CKPT_CODEC_FLOAT)
				continue;
			w = h[5];
			ck_assert(w == 2 || w == 4 || w == 8);
			ck_assert(p[0] == w && p[1] == w);
			pos = 2 + 5 * w;
			for (uint32_t j = 0; j < w; j++) {
				uint8_t mode = p[2 + 5 * j];
				uint32_t plen = le32(p + 3 + 5 * j);

				ck_assert_uint_le(mode, 2);
				ck_assert(plen <= stored - pos);
				if (mode == 0)
					ck_assert_uint_eq(plen, raw_len / w);
				if (mode == 2)
					check_huffman_plane(p + pos, plen);
				census[w][j][mode]++;
				pos += plen;
			}
			ck_assert_uint_eq(pos + raw_len % w, stored);
			if (raw_len % w)
				(*tails)++;
		}
		ck_assert_uint_eq(off, len);
		free(b);
		free(path);
	}
	tu_free_names(names, nn);
}

START_TEST(test_golden_huffman)
{
	char *root = golden_copy("v1-huffman", ".", "huffman");
	char *sd = tu_step_dir(root, HUF_STEP);
	unsigned census[9][8][3], tails = 0;
	tu_set set;

	huf_set(&set);
	ck_assert_msg(tu_check_root(root, HUF_STEP, &set, why,
				    sizeof(why)) == 0,
		      "%s", why);
	memset(census, 0, sizeof(census));
	plane_census(sd, census, &tails);
	if (getenv("CKPT_TEST_VERBOSE"))
		for (int w = 2; w <= 8; w *= 2)
			for (int j = 0; j < w; j++)
				printf("w %d plane %d: raw %u zstd %u huf %u\n",
				       w, j, census[w][j][0], census[w][j][1],
				       census[w][j][2]);
	/* Frozen facts about these bytes: chunks 0-1 have elem_width 2,
	 * 2-3 width 4, 4 width 8 (5 tail bytes); the exponent plane of every
	 * bf16 and f32 chunk is Huffman-coded; 8 planes in all are, and
	 * every mode occurs. */
	unsigned chunks_w[9] = { 0 }, by_mode[3] = { 0 };
	for (int w = 2; w <= 8; w *= 2) {
		for (int m = 0; m < 3; m++) {
			chunks_w[w] += census[w][0][m];
			for (int j = 0; j < w; j++)
				by_mode[m] += census[w][j][m];
		}
	}
	ck_assert_uint_eq(chunks_w[2], 2);
	ck_assert_uint_eq(chunks_w[4], 2);
	ck_assert_uint_eq(chunks_w[8], 1);
	ck_assert_uint_eq(census[2][0][2], 2);
	ck_assert_uint_eq(census[4][0][2], 2);
	ck_assert_uint_eq(by_mode[2], 8);
	ck_assert_uint_gt(by_mode[0], 0);
	ck_assert_uint_gt(by_mode[1], 0);
	ck_assert_uint_eq(tails, 1);
	/* the latest pointer, and a box read across a chunk boundary */
	check_latest(root, HUF_STEP);
	uint8_t got[8 * 4 * 2], want[8 * 4 * 2];
	uint64_t off[2] = { 124, 100 }, ext[2] = { 8, 4 };
	ckpt_reader *r = NULL;
	ck_assert_int_eq(ckpt_reader_open(&r, root, HUF_STEP, NULL), 0);
	tu_extract_box(set.t[0].data, 2, set.t[0].shape, 2, off, ext, want);
	ck_assert_int_eq(ckpt_read_slice(r, "w.bf16", off, ext, got,
					 sizeof(got)),
			 0);
	ck_assert(!memcmp(got, want, sizeof(got)));
	ckpt_reader_close(r);
	free(sd);
	free(root);
	tu_set_free(&set);
}
END_TEST

START_TEST(test_golden_dedup)
{
	char *root = golden_copy("v2-dedup", ".", "dedup");

	check_latest(root, 3);
	for (uint64_t step = 1; step <= 3; step++) {
		char *sd = tu_step_dir(root, step);
		char *ip = tu_path("%s/h00000.index", sd);
		char err[512];
		uint8_t *b;
		size_t n, refs = 0;
		fmt_index ix;
		tu_set set;
		ckpt_reader *r = NULL;

		dedup_set(&set, step);
		ck_assert_msg(tu_check_root(root, step, &set, why,
					    sizeof(why)) == 0, "%s", why);
		ck_assert_int_eq(ckpt_reader_open(&r, root, step, NULL), 0);
		ck_assert_msg(ckpt_reader_verify(r, NULL, NULL) == 0, "%s",
			      ckpt_reader_errmsg(r));
		ckpt_reader_close(r);
		ck_assert_int_eq(tu_read_file(ip, &b, &n), 0);
		ck_assert_uint_eq(fmt_get_u32(b + 8), 2);
		ck_assert_int_eq(fmt_index_decode(b, n, &ix, err, sizeof(err)),
				 0);
		for (size_t k = 0; k < ix.nchunks; k++)
			refs += ix.chunks[k].file >= ix.nfiles;
		/* frozen: 256 KiB in 4 chunks, stored by step 1 only */
		ck_assert_uint_eq(refs, step == 1 ? 0 : 4);
		for (size_t k = 0; k < ix.nrefs; k++)
			ck_assert_uint_eq(ix.refs[k].step, 1);
		fmt_index_free(&ix);
		free(b);
		free(ip);
		free(sd);
		tu_set_free(&set);
	}
	free(root);
}
END_TEST

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--generate"))
		return generate(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "--generate-huffman"))
		return generate_huffman(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "--generate-dedup"))
		return generate_dedup(argv[2]);
	if (argc != 1) {
		fprintf(stderr, "usage: %s [--generate DIR | "
				"--generate-huffman DIR | --generate-dedup DIR]\n",
			argv[0]);
		return 2;
	}
	Suite *s = suite_create("golden");
	TCase *tc = tu_tcase("golden", 60);
	tcase_add_test(tc, test_golden_single);
	tcase_add_test(tc, test_golden_multi);
	tcase_add_test(tc, test_golden_huffman);
	tcase_add_test(tc, test_golden_dedup);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
