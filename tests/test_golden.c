/*
 * test_golden.c - checkpoints of format v1 frozen in tests/golden/v1 must
 * keep loading, byte for byte, with every future version of the library.
 *
 * The files were generated ONCE with
 *     build/tests/test_golden --generate /work/main/tests/golden/v1
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
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* ---- generator ---- */

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
	if (rc)
		fprintf(stderr, "generation failed: %d %s: %s\n", rc,
			ckpt_strerror(rc), ckpt_errmsg(NULL));
	else
		fprintf(stderr, "golden checkpoints written to %s\n", out);
	free(single);
	free(multi);
	return rc ? 1 : 0;
}

/* ---- checks ---- */

static char *golden_dir(const char *sub)
{
	const char *src = getenv("CKPT_TEST_SRCDIR");
	ck_assert_msg(src && *src, "CKPT_TEST_SRCDIR is not set (run through "
				   "meson test)");
	char *p = tu_path("%s/golden/v1/%s", src, sub);
	struct stat st;
	ck_assert_msg(!stat(p, &st) && S_ISDIR(st.st_mode),
		      "golden checkpoint %s is missing", p);
	return p;
}

/* The reader must not write into the tree: work on a copy. */
static char *golden_copy(const char *sub)
{
	char *src = golden_dir(sub);
	char *dst = tu_path("%s/%s", tu_tmpdir(), sub);
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

START_TEST(test_golden_single)
{
	char *root = golden_copy("single");
	char *lp = tu_path("%s/latest", root);
	uint8_t *lb;
	size_t ln;
	ck_assert_int_eq(tu_read_file(lp, &lb, &ln), 0);
	ck_assert_msg(ln == 26 && !memcmp(lb, "step-00000000000000000003\n", 26),
		      "latest pointer changed format");
	free(lb);
	free(lp);
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
	char *root = golden_copy("multi");
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

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--generate"))
		return generate(argv[2]);
	if (argc != 1) {
		fprintf(stderr, "usage: %s [--generate DIR]\n", argv[0]);
		return 2;
	}
	Suite *s = suite_create("golden");
	TCase *tc = tu_tcase("golden", 60);
	tcase_add_test(tc, test_golden_single);
	tcase_add_test(tc, test_golden_multi);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
