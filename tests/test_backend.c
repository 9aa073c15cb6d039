/*
 * test_backend.c - locations, the POSIX backend, and finding the newest
 * step in a large root.
 *
 * 1. Location parsing: directories, gs://BUCKET/PREFIX (served by the
 *    Cloud Storage backend, tested in test_gcs_backend.c; saving there is
 *    refused until the upload sink exists), unknown schemes.
 * 2. Every operation of the POSIX backend: create-if-absent (second create
 *    CKPT_E_EXISTS, content of the first kept), the link fallback where
 *    RENAME_NOREPLACE is EINVAL, a failed directory fsync takes back only a
 *    record that is still ours, replace, get, read_range, size, list,
 *    remove, remove_all, sync.
 * 3. 10,000 committed steps: ckpt_latest and opening the latest step
 *    decode one or two commit records, not 10,000 (counted, not timed;
 *    the times are printed).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char why[1024];

START_TEST(test_locations)
{
	char *b, *p, err[ENG_ERRMSG_MAX];
	eng_loc *l = NULL;

	ck_assert_int_eq(eng_loc_parse("/data/run1", &b, &p, NULL),
			 ENG_LOC_POSIX);
	ck_assert_ptr_null(b);
	ck_assert_int_eq(eng_loc_parse("rel/dir:x", &b, &p, NULL),
			 ENG_LOC_POSIX);
	ck_assert_int_eq(eng_loc_parse("gs://bkt/a/b//", &b, &p, NULL),
			 ENG_LOC_GCS);
	ck_assert_str_eq(b, "bkt");
	ck_assert_str_eq(p, "a/b/");
	free(b);
	free(p);
	ck_assert_int_eq(eng_loc_parse("gs://bkt", &b, &p, NULL), ENG_LOC_GCS);
	ck_assert_str_eq(b, "bkt");
	ck_assert_str_eq(p, "");
	free(b);
	free(p);
	ck_assert_int_eq(eng_loc_parse("gs:///x", &b, &p, NULL), -EINVAL);
	ck_assert_int_eq(eng_loc_parse("", &b, &p, NULL), -EINVAL);
	ck_assert_int_eq(eng_loc_parse("s3://bkt/x", &b, &p, NULL),
			 -EPROTONOSUPPORT);

	ck_assert_int_eq(eng_loc_open("gs://bkt/run1", &l, err), 0);
	ck_assert_str_eq(l->be->name, "gcs");
	ck_assert_str_eq(l->bucket, "bkt");
	ck_assert_str_eq(l->prefix, "run1/");
	eng_loc_close(l);

	/* a handle saving there (sink_gcs.c) makes nothing local */
	char *cwd = getcwd(NULL, 0);
	ck_assert_int_eq(chdir(tu_tmpdir()), 0);
	ckpt *c = NULL;
	ck_assert_msg(ckpt_open(&c, "gs://bkt/run1", NULL) == 0, "%s",
		      ckpt_errmsg(NULL));
	ck_assert_int_eq(ckpt_close(c), 0);
	ck_assert(!tu_exists("gs:"));
	ck_assert_int_eq(chdir(cwd), 0);
	free(cwd);

	ck_assert_int_eq(eng_loc_open(tu_tmpdir(), &l, NULL), 0);
	ck_assert_str_eq(l->be->name, "posix");
	eng_loc_close(l);
}
END_TEST

/* ---- fault hooks for the backend test ---- */

static atomic_int noreplace_einval, dirsync_fail, swap_before_fail;
static char swap_path[512];

static int h_rename_noreplace(const char *from, const char *to)
{
	if (atomic_load(&noreplace_einval))
		return -EINVAL;
	return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) ?
		       -errno :
		       0;
}

static int h_fsync(int fd)
{
	struct stat st;

	if (atomic_load(&dirsync_fail) && fstat(fd, &st) == 0 &&
	    S_ISDIR(st.st_mode)) {
		if (atomic_load(&swap_before_fail)) {
			/* another process replaced the record meanwhile */
			char *t = tu_path("%s.other", swap_path);
			ck_assert_int_eq(tu_write_file(t, "theirs", 6), 0);
			ck_assert_int_eq(rename(t, swap_path), 0);
			free(t);
		}
		return -EIO;
	}
	return fsync(fd) ? -errno : 0;
}

static const eng_io hooks = {
	.rename_noreplace = h_rename_noreplace,
	.fsync = h_fsync,
};

static int collect(void *arg, const eng_list_ent *e)
{
	char *s = arg;
	char one[300];

	snprintf(one, sizeof(one), "%s%s:%llu ", e->name,
		 e->is_prefix ? "/" : "", (unsigned long long)e->size);
	strcat(s, one);
	return 0;
}

static void expect_content(eng_loc *l, const char *key, const char *want)
{
	uint8_t *buf = NULL;
	size_t len = 0;

	ck_assert_int_eq(l->be->get(l, key, 1024, &buf, &len, NULL), 0);
	ck_assert_msg(len == strlen(want) && !memcmp(buf, want, len),
		      "%s: \"%.*s\", want \"%s\"", key, (int)len, (char *)buf,
		      want);
	free(buf);
}

START_TEST(test_posix_backend)
{
	const char *dir = tu_tmpdir();
	char err[ENG_ERRMSG_MAX], *p;
	eng_loc *l = NULL;
	uint64_t size = 0;
	uint8_t *buf = NULL;
	size_t len = 0;
	char rng[4];

	ck_assert_int_eq(eng_loc_open(dir, &l, NULL), 0);
	p = tu_path("%s/step-1", dir);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	free(p);
	eng_io_set(&hooks);

	/* create-if-absent, with and without RENAME_NOREPLACE */
	for (int fb = 0; fb < 2; fb++) {
		const char *key = fb ? "step-1/B" : "step-1/A";
		atomic_store(&noreplace_einval, fb);
		ck_assert_int_eq(l->be->create(l, key, "first", 5, NULL), 0);
		err[0] = 0;
		ck_assert_int_eq(l->be->create(l, key, "second", 6, err),
				 CKPT_E_EXISTS);
		ck_assert_msg(strstr(err, key), "message: %s", err);
		expect_content(l, key, "first");
	}
	atomic_store(&noreplace_einval, 0);

	/* a failed directory fsync takes back our own record ... */
	atomic_store(&dirsync_fail, 1);
	ck_assert_int_eq(l->be->create(l, "step-1/C", "x", 1, NULL), -EIO);
	ck_assert_int_eq(l->be->size(l, "step-1/C", &size), -ENOENT);
	/* ... but never one another process put there */
	p = tu_path("%s/step-1/D", dir);
	snprintf(swap_path, sizeof(swap_path), "%s", p);
	free(p);
	atomic_store(&swap_before_fail, 1);
	ck_assert_int_eq(l->be->create(l, "step-1/D", "ours", 4, NULL), -EIO);
	expect_content(l, "step-1/D", "theirs");
	atomic_store(&swap_before_fail, 0);
	atomic_store(&dirsync_fail, 0);

	/* replace, size, read_range */
	ck_assert_int_eq(l->be->replace(l, "latest", "one", 3, NULL), 0);
	ck_assert_int_eq(l->be->replace(l, "latest", "twotwo", 6, NULL), 0);
	expect_content(l, "latest", "twotwo");
	ck_assert_int_eq(l->be->size(l, "latest", &size), 0);
	ck_assert_uint_eq(size, 6);
	ck_assert_int_eq(l->be->read_range(l, "latest", 2, rng, 3, NULL), 0);
	ck_assert_int_eq(memcmp(rng, "otw", 3), 0);
	ck_assert_int_ne(l->be->read_range(l, "latest", 4, rng, 4, NULL), 0);
	ck_assert_int_eq(l->be->get(l, "latest", 5, &buf, &len, NULL),
			 CKPT_E_CORRUPT);
	ck_assert_int_eq(l->be->get(l, "nothing", 5, &buf, &len, NULL),
			 -ENOENT);
	ck_assert_int_eq(l->be->sync(l, "step-1", NULL), 0);
	ck_assert_int_eq(l->be->sync(l, "", NULL), 0);

	/* list: no temporaries left by any of the above */
	char s[2048] = "";
	ck_assert_int_eq(
		l->be->list(l, "step-1", ENG_LIST_SIZES, collect, s, NULL), 0);
	ck_assert_msg(strstr(s, "A:5 ") && strstr(s, "B:5 ") &&
			      strstr(s, "D:6 ") && !strstr(s, ".tmp") &&
			      !strstr(s, "C:"),
		      "list: %s", s);
	s[0] = 0;
	ck_assert_int_eq(l->be->list(l, "", 0, collect, s, NULL), 0);
	ck_assert_msg(strstr(s, "step-1/:0 ") && strstr(s, "latest:") &&
			      !strstr(s, ".tmp"),
		      "list: %s", s);
	ck_assert_int_eq(l->be->list(l, "none", 0, collect, s, NULL),
			 CKPT_E_NOTFOUND);

	/* remove, remove_all */
	ck_assert_int_eq(l->be->remove(l, "step-1/A", NULL), 0);
	ck_assert_int_eq(l->be->remove(l, "step-1/A", NULL), -ENOENT);
	uint64_t freed = 0;
	ck_assert_int_eq(l->be->remove_all(l, "step-1", &freed, NULL), 0);
	ck_assert_uint_eq(freed, 5 + 6);
	p = tu_path("%s/step-1", dir);
	ck_assert(!tu_exists(p));
	free(p);
	eng_io_set(NULL);
	eng_loc_close(l);
}
END_TEST

/* ---- 3. 10,000 committed steps ---- */

#define NSTEPS 10000

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void save_one(const char *dir, uint64_t step, tu_set *set)
{
	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 1u << 20;
	s.chunk_bytes = 64u << 10;
	s.files_per_host = 1;
	s.threads = 1;
	ckpt *c = NULL;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	ck_assert_int_eq(tu_save(c, step, set), 0);
	ck_assert_int_eq(ckpt_close(c), 0);
}

/*
 * Step `step` as a copy of committed step 1: its files hard-linked, its
 * commit record re-encoded with the step changed. (Their index and shard
 * headers still say step 1: only the newest step, a real save, is read.)
 */
static void copy_step(const char *dir, const fmt_commit *one, uint64_t step)
{
	char *src = tu_step_dir(dir, 1), *dst = tu_step_dir(dir, step);
	fmt_commit cm = *one;
	uint8_t *out = NULL;
	size_t len = 0;

	ck_assert_int_eq(mkdir(dst, 0755), 0);
	for (size_t i = 0; i < one->nfiles; i++) {
		char *a = tu_path("%s/%s", src, one->files[i].name);
		char *b = tu_path("%s/%s", dst, one->files[i].name);
		ck_assert_int_eq(link(a, b), 0);
		free(a);
		free(b);
	}
	cm.step = step;
	ck_assert_int_eq(fmt_commit_encode(&cm, &out, &len), 0);
	char *p = tu_path("%s/COMMIT", dst);
	ck_assert_int_eq(tu_write_file(p, out, len), 0);
	free(p);
	free(out);
	free(src);
	free(dst);
}

START_TEST(test_many_steps)
{
	const char *dir = tu_tmpdir();
	uint64_t shape[1] = { 1000 };
	tu_set set;
	fmt_commit one;

	tu_set_init(&set);
	tu_set_add(&set, "w", CKPT_F32, 1, shape, 7);
	double t0 = now_ms();
	save_one(dir, 1, &set);
	ck_assert_int_eq(eng_load_commit(dir, 1, &one, NULL), 0);
	for (uint64_t s = 2; s < NSTEPS; s++)
		copy_step(dir, &one, s);
	fmt_commit_free(&one);
	save_one(dir, NSTEPS, &set);
	/* newer debris: an uncommitted step and one with a broken record */
	char *p = tu_path("%s/step-%020d", dir, NSTEPS + 1);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	free(p);
	p = tu_path("%s/step-%020d", dir, NSTEPS + 2);
	ck_assert_int_eq(mkdir(p, 0755), 0);
	free(p);
	p = tu_path("%s/step-%020d/COMMIT", dir, NSTEPS + 2);
	ck_assert_int_eq(tu_write_file(p, "not a commit record", 19), 0);
	free(p);
	double t1 = now_ms();

	ckpt_settings s;
	tu_settings(&s);
	s.staging_bytes = 0;
	ckpt *c = NULL;
	ck_assert_int_eq(ckpt_open(&c, dir, &s), 0);
	unsigned long d0 = eng_commit_decodes();
	uint64_t latest = 0;
	double t2 = now_ms();
	ck_assert_int_eq(ckpt_latest(c, &latest), 0);
	double t3 = now_ms();
	unsigned long d1 = eng_commit_decodes();
	ck_assert_uint_eq(latest, NSTEPS);
	/* the broken record of NSTEPS+2, then NSTEPS's */
	ck_assert_uint_eq(d1 - d0, 2);

	ckpt_reader *r = NULL;
	double t4 = now_ms();
	ck_assert_int_eq(ckpt_reader_open(&r, dir, CKPT_LATEST, NULL), 0);
	double t5 = now_ms();
	unsigned long d2 = eng_commit_decodes();
	ck_assert_uint_le(d2 - d1, 2);
	ck_assert_uint_eq(ckpt_reader_step(r), NSTEPS);
	int rc = tu_check_set(r, &set, why, sizeof(why));
	ck_assert_msg(rc == 0, "latest step: %s", why);
	ckpt_reader_close(r);
	/* the same step named explicitly: no listing at all */
	double t8 = now_ms();
	ck_assert_int_eq(ckpt_reader_open(&r, dir, NSTEPS, NULL), 0);
	double t9 = now_ms();
	ckpt_reader_close(r);

	/* listing stays complete (and decodes every record once) */
	ckpt_step_info *li = NULL;
	size_t n = 0;
	double t6 = now_ms();
	ck_assert_int_eq(ckpt_list(c, &li, &n), 0);
	double t7 = now_ms();
	ck_assert_uint_eq(n, NSTEPS);
	ck_assert_uint_eq(li[0].step, 1);
	ck_assert_uint_eq(li[n - 1].step, NSTEPS);
	ckpt_free(li);
	ck_assert_int_eq(ckpt_close(c), 0);
	tu_set_free(&set);
	fprintf(stderr,
		"%d steps: created in %.0f ms; ckpt_latest %.2f ms (%lu "
		"commit decodes), reader open latest %.2f ms (%lu; step "
		"named: %.2f ms), ckpt_list %.0f ms\n",
		NSTEPS, t1 - t0, t3 - t2, d1 - d0, t5 - t4, d2 - d1, t9 - t8,
		t7 - t6);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("backend");
	TCase *tc = tu_tcase("backend", 120);
	tcase_add_test(tc, test_locations);
	tcase_add_test(tc, test_posix_backend);
	tcase_add_test(tc, test_many_steps);
	suite_add_tcase(s, tc);
	return tu_main(s);
}
