/*
 * test_gcs_reader.c - the reader over gs:// locations and ckpt_reader_copy
 * between a directory and Cloud Storage, against the loopback fake server
 * (tests/servers/fake_gcs.py via STORAGE_EMULATOR_HOST, as the engine
 * would be configured).
 *
 * What is checked: a step saved locally, copied to gs:// with
 * ckpt_reader_copy, is listed (ckpt_list, ckpt_latest through a handle
 * opened with staging_bytes 0), read back from gs:// byte-identical
 * (whole tensors, slices), verified, and copied back down to a directory
 * byte-identical; the ranged reads are merged (fewer GETs than chunks,
 * counted by the server); a second copy of a committed step is
 * CKPT_E_EXISTS; an object overwritten on the server with one byte
 * changed is CKPT_E_CORRUPT with a message naming the object and the
 * offset, and an object whose size changed is named too; a copy from a
 * corrupt source leaves nothing committed at the destination; with 15% of
 * requests failing at random everything still lands byte-identical.
 */
#include "test_gcs_util.h"
#include "testutil.h"

#include "gcs.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUCKET "ckpt-read"

static tu_server srv;

static void make_set(tu_set *set)
{
	uint64_t a[2] = { 1000, 1000 }, b[1] = { 100000 }, c[3] = { 4, 5, 6 };

	tu_set_init(set);
	tu_set_add(set, "layer0/w", CKPT_BF16, 2, a, 1);
	tu_set_add(set, "layer0/b", CKPT_F32, 1, b, 2);
	tu_set_add(set, "small", CKPT_I32, 3, c, 3);
	tu_set_add(set, "bytes", CKPT_U8, 1, b, 4);
}

/* Saves `set` as step 5 of a new local root; returns the root. */
static char *save_local(const tu_set *set)
{
	char *root = tu_path("%s/local", tu_tmpdir());
	ckpt_settings s;
	ckpt *c = NULL;

	tu_settings(&s);
	ck_assert_int_eq(ckpt_open(&c, root, &s), 0);
	ck_assert_int_eq(tu_save(c, 5, set), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	return root;
}

static void copy_step(const char *from, uint64_t step, const char *to,
		      int expect)
{
	ckpt_reader *r = NULL;
	int rc;

	ck_assert_msg(ckpt_reader_open(&r, from, step, NULL) == 0, "%s",
		      ckpt_reader_errmsg(NULL));
	rc = ckpt_reader_copy(r, to, NULL, NULL);
	ck_assert_msg(rc == expect, "copy %s -> %s: %d %s", from, to, rc,
		      ckpt_reader_errmsg(r));
	ckpt_reader_close(r);
}

static long fake_stat(const char *method)
{
	char url[256], *body = NULL;
	json_t *j, *m;
	long n = 0;

	snprintf(url, sizeof(url), "%s/_fake/stats", srv.url);
	ck_assert_int_eq(gt_http("GET", url, NULL, &body), 200);
	j = json_loads(body, 0, NULL);
	ck_assert_ptr_nonnull(j);
	m = json_object_get(json_object_get(j, "methods"), method);
	if (m)
		n = (long)json_integer_value(m);
	json_decref(j);
	free(body);
	return n;
}

static void same_files(const char *d1, const char *d2)
{
	char **a, **b;
	int na = tu_list_files(d1, &a), nb = tu_list_files(d2, &b);

	ck_assert_int_gt(na, 2);
	ck_assert_int_eq(na, nb);
	for (int i = 0; i < na; i++) {
		char *p1 = tu_path("%s/%s", d1, a[i]);
		char *p2 = tu_path("%s/%s", d2, b[i]);
		uint8_t *x, *y;
		size_t lx, ly;

		ck_assert_str_eq(a[i], b[i]);
		ck_assert_int_eq(tu_read_file(p1, &x, &lx), 0);
		ck_assert_int_eq(tu_read_file(p2, &y, &ly), 0);
		ck_assert_int_eq(lx, ly);
		ck_assert_msg(memcmp(x, y, lx) == 0, "%s differs", a[i]);
		free(x);
		free(y);
		free(p1);
		free(p2);
	}
	tu_free_names(a, na);
	tu_free_names(b, nb);
}

START_TEST(roundtrip)
{
	const char *gs = "gs://" BUCKET "/run1";
	char why[1024] = "", *local, *down, *d1, *d2;
	ckpt_step_info *info = NULL;
	size_t n = 0;
	uint64_t step = 0, chunks = 0;
	ckpt_settings s;
	ckpt_reader *r = NULL;
	ckpt *c = NULL;
	tu_set set;
	long gets;

	make_set(&set);
	local = save_local(&set);
	copy_step(local, 5, gs, 0);

	/* list and latest through a handle that cannot save */
	ckpt_settings_default(&s);
	s.staging_bytes = 0;
	ck_assert_msg(ckpt_open(&c, gs, &s) == 0, "%s", ckpt_errmsg(NULL));
	ck_assert_int_eq(ckpt_list(c, &info, &n), 0);
	ck_assert_int_eq(n, 1);
	ck_assert_int_eq(info[0].step, 5);
	ck_assert_int_eq(info[0].tensor_count, 4);
	ckpt_free(info);
	ck_assert_int_eq(ckpt_latest(c, &step), 0);
	ck_assert_int_eq(step, 5);
	ck_assert_int_eq(ckpt_close(c), 0);
	/* a handle that saves there (the upload sink, sink_gcs.c) */
	s.staging_bytes = 1u << 20;
	ck_assert_msg(ckpt_open(&c, gs, &s) == 0, "%s", ckpt_errmsg(NULL));
	ck_assert_int_eq(ckpt_close(c), 0);

	/* read everything back from gs://, verify; count the GETs */
	ck_assert_msg(ckpt_reader_open(&r, gs, CKPT_LATEST, NULL) == 0, "%s",
		      ckpt_reader_errmsg(NULL));
	ck_assert_int_eq(ckpt_reader_step(r), 5);
	{
		ckpt_stats st;

		ck_assert_int_eq(ckpt_reader_stats(r, &st), 0);
		chunks = st.chunks;
	}
	ck_assert_int_gt(chunks, 30);
	ck_assert_int_eq(tu_check_set(r, &set, why, sizeof(why)), 0);
	gets = fake_stat("storage.objects.get");
	ck_assert_msg(ckpt_reader_verify(r, NULL, NULL) == 0, "%s",
		      ckpt_reader_errmsg(r));
	gets = fake_stat("storage.objects.get") - gets;
	/* merged: far fewer requests than chunks */
	printf("verify: %ld GETs for %llu chunks\n", gets,
	       (unsigned long long)chunks);
	ck_assert_msg(gets < (long)chunks / 2, "%ld GETs for %llu chunks", gets,
		      (unsigned long long)chunks);
	ckpt_reader_close(r);
	ck_assert_int_eq(tu_check_root(gs, 5, &set, why, sizeof(why)), 0);
	/* many small merged requests in flight at once, finishing in any
	 * order */
	setenv("CKPT_GCS_MERGE_MAX", "140000", 1);
	setenv("CKPT_GCS_STREAMS", "6", 1);
	ck_assert_msg(tu_check_root(gs, 5, &set, why, sizeof(why)) == 0, "%s",
		      why);
	unsetenv("CKPT_GCS_MERGE_MAX");
	unsetenv("CKPT_GCS_STREAMS");

	/* down again, byte-identical to the original */
	down = tu_path("%s/down", tu_tmpdir());
	copy_step(gs, 5, down, 0);
	d1 = tu_step_dir(local, 5);
	d2 = tu_step_dir(down, 5);
	same_files(d1, d2);
	ck_assert_int_eq(
		tu_check_root(down, CKPT_LATEST, &set, why, sizeof(why)), 0);

	/* a committed step is not copied again */
	copy_step(local, 5, gs, CKPT_E_EXISTS);
	free(d1);
	free(d2);
	free(down);
	free(local);
	tu_set_free(&set);
}
END_TEST

/* Replaces object `name` with its bytes, one flipped at `off`, or cut to
 * `len` bytes (len < size). */
static void tamper(const char *name, uint64_t off, size_t len)
{
	struct gcs_config cfg = { 0 };
	struct gcs_client *gc;
	void *data = NULL;
	size_t n = 0;

	cfg.endpoint = srv.url;
	ck_assert_int_eq(gcs_client_new(&gc, &cfg), 0);
	ck_assert_int_eq(gcs_get(gc, BUCKET, name, 0, &data, &n, NULL), 0);
	if (len < n)
		n = len;
	else
		((uint8_t *)data)[off] ^= 0x10;
	ck_assert_int_eq(gcs_put(gc, BUCKET, name, data, n, GCS_NO_COND, NULL),
			 0);
	free(data);
	gcs_client_free(gc);
}

START_TEST(corrupt_object)
{
	const char *gs = "gs://" BUCKET "/run2";
	char *local, *down, obj[128], want[128];
	ckpt_reader *r = NULL;
	tu_set set;
	void *buf = NULL;
	uint64_t nb;

	make_set(&set);
	local = save_local(&set);
	copy_step(local, 5, gs, 0);

	/* a byte in the payload of the second chunk of file 0 */
	snprintf(obj, sizeof(obj), "run2/step-%020d/h00000-f000.shard", 5);
	tamper(obj, 70000, SIZE_MAX);
	ck_assert_int_eq(ckpt_reader_open(&r, gs, 5, NULL), 0);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), CKPT_E_CORRUPT);
	snprintf(want, sizeof(want), "step-%020d/h00000-f000.shard offset", 5);
	ck_assert_msg(strstr(ckpt_reader_errmsg(r), want), "%s",
		      ckpt_reader_errmsg(r));
	/* the tensor stored there fails to read as well; others still do */
	{
		int bad = 0;

		for (size_t i = 0; i < set.n; i++) {
			int rc = ckpt_read_alloc(r, set.t[i].name, &buf, &nb);

			if (rc == CKPT_E_CORRUPT) {
				bad++;
				ck_assert_msg(strstr(ckpt_reader_errmsg(r),
						     "h00000-f000.shard"),
					      "%s", ckpt_reader_errmsg(r));
			} else {
				ck_assert_int_eq(rc, 0);
			}
			ckpt_free(buf);
			buf = NULL;
		}
		ck_assert_int_ge(bad, 1);
	}
	ckpt_reader_close(r);

	/* a copy from it fails and leaves nothing committed behind */
	down = tu_path("%s/down2", tu_tmpdir());
	copy_step(gs, 5, down, CKPT_E_CORRUPT);
	ck_assert_int_eq(ckpt_reader_open(&r, down, 5, NULL), CKPT_E_NOTFOUND);

	/* an object cut short: named with both sizes */
	tamper(obj, 0, 1000);
	ck_assert_int_eq(ckpt_reader_open(&r, gs, 5, NULL), 0);
	ck_assert_int_eq(ckpt_reader_verify(r, NULL, NULL), CKPT_E_CORRUPT);
	ck_assert_msg(strstr(ckpt_reader_errmsg(r), "h00000-f000.shard") &&
			      strstr(ckpt_reader_errmsg(r), "1000 bytes"),
		      "%s", ckpt_reader_errmsg(r));
	ckpt_reader_close(r);
	free(down);
	free(local);
	tu_set_free(&set);
}
END_TEST

/* A copy to gs:// that stopped before its COMMIT, run again: objects
 * already there with the right size and crc32c are kept, a changed one
 * is sent again (counted by the server), and the step then commits. */
START_TEST(resume_copy)
{
	const char *gs = "gs://" BUCKET "/res";
	char why[1024] = "", *local, obj[128];
	struct gcs_config cfg = { 0 };
	struct gcs_client *gc;
	ckpt_reader *r = NULL;
	long ins;
	tu_set set;

	make_set(&set);
	local = save_local(&set);
	copy_step(local, 5, gs, 0);
	cfg.endpoint = srv.url;
	ck_assert_int_eq(gcs_client_new(&gc, &cfg), 0);
	snprintf(obj, sizeof(obj), "res/step-%020d/COMMIT", 5);
	ck_assert_int_eq(gcs_delete(gc, BUCKET, obj, 0, GCS_NO_COND), 0);
	gcs_client_free(gc);
	snprintf(obj, sizeof(obj), "res/step-%020d/h00000-f001.shard", 5);
	tamper(obj, 100, SIZE_MAX);
	ck_assert_int_eq(ckpt_reader_open(&r, gs, 5, NULL), CKPT_E_NOTFOUND);

	ins = fake_stat("storage.objects.insert");
	copy_step(local, 5, gs, 0);
	ins = fake_stat("storage.objects.insert") - ins;
	/* the changed shard (one resumable upload: start + one piece),
	 * COMMIT and latest; not the other shard nor the index */
	ck_assert_msg(ins <= 4, "%ld uploads", ins);
	ck_assert_msg(tu_check_root(gs, 5, &set, why, sizeof(why)) == 0, "%s",
		      why);
	free(local);
	tu_set_free(&set);
}
END_TEST

/* A server failing 15% of requests at random (503, 429, resets, broken
 * streams, stalls of 1-3 s): the copy up and down and every read still
 * come out byte-identical, with requests finishing in any order. */
START_TEST(random_faults)
{
	const char *const extra[] = { "--fault-rate", "0.15", "--fault-seed",
				      "11", NULL };
	tu_server fsrv;
	char why[1024] = "", *local, *down, *d1, *d2;
	tu_set set;

	gt_server_start_args(&fsrv, BUCKET, extra);
	setenv("STORAGE_EMULATOR_HOST", fsrv.url, 1);
	make_set(&set);
	local = save_local(&set);
	copy_step(local, 5, "gs://" BUCKET "/f", 0);
	setenv("CKPT_GCS_MERGE_MAX", "140000", 1);
	ck_assert_msg(tu_check_root("gs://" BUCKET "/f", 5, &set, why,
				    sizeof(why)) == 0,
		      "%s", why);
	unsetenv("CKPT_GCS_MERGE_MAX");
	down = tu_path("%s/fdown", tu_tmpdir());
	copy_step("gs://" BUCKET "/f", 5, down, 0);
	d1 = tu_step_dir(local, 5);
	d2 = tu_step_dir(down, 5);
	same_files(d1, d2);
	tu_server_stop(&fsrv);
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	free(d1);
	free(d2);
	free(down);
	free(local);
	tu_set_free(&set);
}
END_TEST

static Suite *reader_suite(void)
{
	Suite *s = suite_create("gcs_reader");
	TCase *tc = tu_tcase("reader", 240);

	tcase_add_test(tc, roundtrip);
	tcase_add_test(tc, corrupt_object);
	tcase_add_test(tc, random_faults);
	tcase_add_test(tc, resume_copy);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int rc;

	gt_server_start(&srv, BUCKET);
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	rc = tu_main(reader_suite());
	tu_server_stop(&srv);
	return rc;
}
