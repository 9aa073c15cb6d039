/*
 * test_dedup_gcs.c - deduplication with Cloud Storage (dedup.c, SPEC.md
 * section 16), against the loopback fake server: a push of deduplicated
 * steps to gs://, a directory with a remote (it refers only to a base its
 * upload committed in the bucket, and after a restart only to one the
 * bucket holds), and a gs:// root (it refers to the step it committed
 * last). The local cases are in test_dedup.c; the shared helpers in
 * tu_dedup.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_gcs_util.h"
#include "tu_dedup.h"

static char why[1024];

/* Push (a copy to gs://) of deduplicated steps: step 2 only after step
 * 1 is committed in the bucket, and then without its frozen bytes; it
 * reads back and verifies from the bucket, and the bucket's gc keeps step
 * 1 while step 2 refers to it. A bucket that cannot be asked is an error
 * of its own, not "copy step 1 there first". */
START_TEST(test_push_gcs)
{
	const char *dir = tu_tmpdir(), *dst = "gs://dedup/run";
	ckpt *c = open_dedup(dir, CKPT_F_DEDUP, 0);
	ckpt_reader *r1 = NULL, *r2 = NULL, *r3 = NULL;
	ckpt_step_info *li = NULL;
	ckpt_gc_report rep;
	ckpt_settings s;
	tu_server srv;
	size_t n = 0;
	char *url;
	int rc;

	save_step(c, 1, 0);
	save_step(c, 2, 0);
	ckpt_close(c);
	ck_assert_int_eq(ckpt_reader_open(&r1, dir, 1, NULL), 0);
	ck_assert_int_eq(ckpt_reader_open(&r2, dir, 2, NULL), 0);

	setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1", 1);
	setenv("CKPT_GCS_DEADLINE", "1", 1);
	rc = ckpt_reader_copy(r2, dst, NULL, NULL);
	ck_assert_msg(rc < 0 && rc != CKPT_E_NOTFOUND &&
			      !strstr(ckpt_reader_errmsg(r2), "first"),
		      "%d %s", rc, ckpt_reader_errmsg(r2));
	unsetenv("CKPT_GCS_DEADLINE");

	gt_server_start(&srv, "dedup");
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	rc = ckpt_reader_copy(r2, dst, NULL, NULL);
	ck_assert_msg(rc == CKPT_E_NOTFOUND &&
			      strstr(ckpt_reader_errmsg(r2),
				     "copy step 1 there first"),
		      "%d %s", rc, ckpt_reader_errmsg(r2));
	ck_assert_int_eq(ckpt_reader_open(&r3, dst, 2, NULL), CKPT_E_NOTFOUND);
	ck_assert_int_eq(ckpt_reader_copy(r1, dst, NULL, NULL), 0);
	rc = ckpt_reader_copy(r2, dst, NULL, NULL);
	ck_assert_msg(rc == 0, "%d %s", rc, ckpt_reader_errmsg(r2));
	ckpt_reader_close(r1);
	ckpt_reader_close(r2);
	check_step(dst, 1);
	check_step(dst, 2);

	tu_settings(&s);
	ck_assert_int_eq(ckpt_open(&c, dst, &s), 0);
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 2);
	/* the frozen megabyte is stored once, in step 1 */
	ck_assert_msg(li[1].stored_bytes < li[0].stored_bytes / 4,
		      "step 2 stores %llu bytes, step 1 %llu",
		      (unsigned long long)li[1].stored_bytes,
		      (unsigned long long)li[0].stored_bytes);
	ck_assert_uint_eq(li[0].referenced_by, 2);
	ckpt_free(li);
	ck_assert_int_eq(ckpt_gc(c, 1, 0, 0, NULL, NULL, &rep), 0);
	ck_assert_uint_eq(rep.steps_removed, 0);
	ck_assert_int_eq(ckpt_close(c), 0);
	check_step(dst, 2);
	/* the bytes step 2 refers to are checked in the bucket too */
	url = tu_path("%s/storage/v1/b/dedup/o/run%%2Fstep-%020d%%2F"
		      "h00000-f000.shard", srv.url, 1);
	ck_assert_int_eq(gt_http("DELETE", url, NULL, NULL), 204);
	ck_assert_int_ne(verify(dst, 2, why, sizeof(why)), 0);
	ck_assert_msg(strstr(why, "step 2 refers to step 1/h00000-f000.shard"
				  ": missing"),
		      "%s", why);
	free(url);
	tu_server_stop(&srv);
	unsetenv("STORAGE_EMULATOR_HOST");
}
END_TEST

/* c lists steps 1, 2, 3, and steps 2 and 3 store under a quarter of
 * step 1's bytes (the frozen part is stored once, in step 1). */
static void check_three_steps(ckpt *c)
{
	ckpt_step_info *li = NULL;
	size_t n = 0;

	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	ck_assert_uint_eq(n, 3);
	ck_assert_msg(li[1].stored_bytes < li[0].stored_bytes / 4 &&
			      li[2].stored_bytes < li[0].stored_bytes / 4,
		      "steps 2, 3 store %llu, %llu bytes, step 1 %llu",
		      (unsigned long long)li[1].stored_bytes,
		      (unsigned long long)li[2].stored_bytes,
		      (unsigned long long)li[0].stored_bytes);
	ckpt_free(li);
}

static ckpt *open_remote(const char *dir, const char *remote)
{
	ckpt_settings s;
	ckpt *c = NULL;
	int rc;

	tu_settings(&s);
	s.flags |= CKPT_F_DEDUP;
	s.remote = remote;
	rc = ckpt_open(&c, dir, &s);
	ck_assert_msg(rc == 0, "ckpt_open: %d %s", rc, ckpt_errmsg(NULL));
	return c;
}

static void upload_wait(ckpt *c)
{
	int rc = ckpt_upload_wait(c, 60000);

	ck_assert_msg(rc == 0, "upload: %d %s", rc, ckpt_errmsg(c));
}

/* A directory with a remote. Its base not committed in the bucket (every
 * upload fails): the next save is written in full. Once this handle has
 * committed the base in the bucket, the frozen chunks are neither written
 * nor uploaded again, and the bucket's copy of the step refers to the
 * bucket's base, reads back and verifies there. After a restart, the
 * bucket's copy of the newest step serves as the base at once, unless the
 * bucket no longer has it committed. */
START_TEST(test_remote)
{
	const char *dir = tu_tmpdir(), *rem = "gs://dedup/both";
	char *d2 = tu_path("%s/dead", dir), *d1 = tu_path("%s/live", dir);
	ckpt_settings s;
	tu_server srv;
	fmt_index ix;
	uint64_t rs = 0;
	char *url;
	ckpt *c;

	setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1", 1);
	setenv("CKPT_GCS_DEADLINE", "1", 1);
	c = open_remote(d2, "gs://dedup/dead");
	save_step(c, 1, 0);
	ck_assert_int_ne(ckpt_upload_wait(c, 60000), 0);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	ckpt_close(c);
	unsetenv("CKPT_GCS_DEADLINE");
	/* the restart's question to a bucket that does not answer (retried
	 * for the default 600 s) does not hold up ckpt_close */
	{
		double t0;

		c = open_remote(d2, "gs://dedup/dead");
		usleep(500 * 1000); /* the upload thread is asking */
		t0 = tu_now_s();
		ckpt_close(c);
		ck_assert_msg(tu_now_s() - t0 < 60, "close took %.0f s",
			      tu_now_s() - t0);
	}
	load_index(d2, 2, &ix);
	ck_assert_uint_eq(count_refs(&ix, NULL), 0);
	fmt_index_free(&ix);
	check_step(d2, 2);

	gt_server_start(&srv, "dedup");
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	c = open_remote(d1, rem);
	save_step(c, 1, 0);
	upload_wait(c);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	ck_assert_uint_eq(sink_chunks(c, 1), 1);
	upload_wait(c);
	save_step(c, 3, 0);
	upload_wait(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	load_index(d1, 3, &ix);
	ck_assert_uint_eq(count_refs(&ix, &rs), FROZEN_BYTES / (64u << 10));
	ck_assert_uint_eq(rs, 1);
	fmt_index_free(&ix);
	for (uint64_t st = 1; st <= 3; st++) {
		check_step(rem, st);
		ck_assert_msg(verify(rem, st, why, sizeof(why)) == 0, "%s",
			      why);
	}
	tu_settings(&s);
	ck_assert_int_eq(ckpt_open(&c, rem, &s), 0);
	/* the frozen megabyte is in the bucket once, in step 1 */
	check_three_steps(c);
	ck_assert_int_eq(ckpt_close(c), 0);

	/* a restart: the bucket holds step 3, the same, so step 4 refers
	 * to it at once; after step 4's COMMIT is removed from the bucket,
	 * step 5 is sent in full */
	c = open_remote(d1, rem);
	upload_wait(c);
	save_step(c, 4, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	ck_assert_uint_eq(sink_chunks(c, 1), 1);
	upload_wait(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	url = tu_path("%s/storage/v1/b/dedup/o/both%%2Fstep-%020d%%2FCOMMIT",
		      srv.url, 4);
	ck_assert_int_eq(gt_http("DELETE", url, NULL, NULL), 204);
	c = open_remote(d1, rem);
	upload_wait(c);
	save_step(c, 5, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	upload_wait(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	check_step(rem, 5);
	ck_assert_msg(verify(rem, 5, why, sizeof(why)) == 0, "%s", why);
	free(url);
	tu_server_stop(&srv);
	unsetenv("STORAGE_EMULATOR_HOST");
	free(d1);
	free(d2);
}
END_TEST

/* A gs:// root: the handle refers to the step it committed last, so steps
 * 2 and 3 send one chunk of 17 and store a fraction of step 1 in the
 * bucket; the first save after opening again is written in full. A base
 * removed from the bucket since (its COMMIT deleted) fails the next save
 * at commit, naming it, and the save after that is written in full. */
START_TEST(test_gcs_root)
{
	const char *rem = "gs://dedup/root";
	tu_server srv;
	char *url;
	ckpt *c;
	int rc;

	gt_server_start(&srv, "dedup");
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	c = open_dedup(rem, CKPT_F_DEDUP, 0);
	save_step(c, 1, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	save_step(c, 2, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	save_step(c, 3, 1);
	ck_assert_uint_eq(sink_chunks(c, 0), 1);
	check_three_steps(c);
	ck_assert_int_eq(ckpt_close(c), 0);
	for (uint64_t st = 1; st <= 3; st++) {
		check_step(rem, st);
		ck_assert_msg(verify(rem, st, why, sizeof(why)) == 0, "%s",
			      why);
	}

	c = open_dedup(rem, CKPT_F_DEDUP, 0);
	save_step(c, 4, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	url = tu_path("%s/storage/v1/b/dedup/o/root%%2Fstep-%020d%%2FCOMMIT",
		      srv.url, 4);
	ck_assert_int_eq(gt_http("DELETE", url, NULL, NULL), 204);
	{
		tu_set set;
		ckpt_tensor *v;

		make_state(&set, 5);
		v = calloc(set.n, sizeof(*v));
		tu_set_view(&set, v);
		rc = ckpt_save(c, 5, v, set.n);
		if (rc == 0)
			rc = ckpt_wait(c);
		ck_assert_msg(rc < 0 && strstr(ckpt_errmsg(c), "step 4"),
			      "save 5 on a removed base: %d %s", rc,
			      ckpt_errmsg(c));
		free(v);
		tu_set_free(&set);
	}
	save_step(c, 6, 0);
	ck_assert_uint_eq(sink_chunks(c, 0), 17);
	ck_assert_int_eq(ckpt_close(c), 0);
	check_step(rem, 6);
	ck_assert_msg(verify(rem, 6, why, sizeof(why)) == 0, "%s", why);
	free(url);
	tu_server_stop(&srv);
	unsetenv("STORAGE_EMULATOR_HOST");
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("dedup_gcs");
	TCase *tc = tu_tcase("dedup_gcs", 120);

	tcase_add_test(tc, test_push_gcs);
	tcase_add_test(tc, test_remote);
	tcase_add_test(tc, test_gcs_root);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tu_main(suite());
}
