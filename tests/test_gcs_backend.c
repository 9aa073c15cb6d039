/*
 * test_gcs_backend.c - the Cloud Storage backend (engine/backend_gcs.c)
 * against the loopback fake server (tests/servers/fake_gcs.py, started
 * once by main with a data directory of our own, reached through
 * STORAGE_EMULATOR_HOST as the engine would be).
 *
 * What is checked: every backend operation on gs://BUCKET/PREFIX (create
 * create-only, replace, get, read_range, size, list with sub-prefixes,
 * remove, remove_all, sync, lock); two processes creating one COMMIT get
 * exactly one winner; a listing of more step prefixes than a page holds
 * is walked whole; hostile bytes: a document whose stored bytes no longer
 * match its crc32c is CKPT_E_CORRUPT with nothing returned, and an object
 * missing is -ENOENT / CKPT_E_NOTFOUND. Counts, never times.
 */
#include "test_gcs_util.h"
#include "testutil.h"

#include "gcs.h"
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUCKET "ckpt-back"

static tu_server srv;
static char datadir[256];

static eng_loc *open_loc(const char *prefix)
{
	char where[256], err[ENG_ERRMSG_MAX] = "";
	eng_loc *l = NULL;

	snprintf(where, sizeof(where), "gs://" BUCKET "/%s", prefix);
	ck_assert_msg(eng_loc_open(where, &l, err) == 0, "%s", err);
	ck_assert_str_eq(l->be->name, "gcs");
	return l;
}

struct names {
	char v[2048][64];
	int is_prefix[2048];
	uint64_t size[2048];
	int n;
};

static int collect(void *arg, const eng_list_ent *e)
{
	struct names *w = arg;

	ck_assert_int_lt(w->n, 2048);
	snprintf(w->v[w->n], sizeof(w->v[0]), "%s", e->name);
	w->is_prefix[w->n] = e->is_prefix;
	w->size[w->n] = e->size;
	w->n++;
	return 0;
}

static int find(const struct names *w, const char *name)
{
	for (int i = 0; i < w->n; i++)
		if (!strcmp(w->v[i], name))
			return i;
	return -1;
}

START_TEST(every_op)
{
	eng_loc *l = open_loc("ops/run");
	char err[ENG_ERRMSG_MAX] = "";
	uint8_t *out = NULL, buf[16];
	size_t len = 0;
	uint64_t sz = 0, freed = 0;
	struct names *w = calloc(1, sizeof(*w));

	/* create-only: the second create keeps the first content */
	ck_assert_int_eq(l->be->create(l, "step-1/COMMIT", "first", 5, err), 0);
	ck_assert_int_eq(l->be->create(l, "step-1/COMMIT", "second", 6, err),
			 CKPT_E_EXISTS);
	ck_assert_msg(strstr(err, "step-1/COMMIT"), "%s", err);
	ck_assert_int_eq(l->be->get(l, "step-1/COMMIT", 100, &out, &len, err),
			 0);
	ck_assert_int_eq(len, 5);
	ck_assert_int_eq(memcmp(out, "first", 5), 0);
	free(out);

	/* get bounded by max_len */
	ck_assert_int_eq(l->be->get(l, "step-1/COMMIT", 4, &out, &len, err),
			 CKPT_E_CORRUPT);
	ck_assert_ptr_null(out);

	/* replace, twice (the second under the first's generation) */
	ck_assert_int_eq(l->be->replace(l, "latest", "1", 1, err), 0);
	ck_assert_int_eq(l->be->replace(l, "latest", "22", 2, err), 0);
	ck_assert_int_eq(l->be->get(l, "latest", 100, &out, &len, err), 0);
	ck_assert_int_eq(len, 2);
	ck_assert_int_eq(memcmp(out, "22", 2), 0);
	free(out);

	/* size and ranges */
	unsigned char *pat = gt_pattern(100000, 3);

	ck_assert_int_eq(
		l->be->create(l, "step-1/h0-f0.shard", pat, 100000, err), 0);
	ck_assert_int_eq(l->be->size(l, "step-1/h0-f0.shard", &sz), 0);
	ck_assert_int_eq(sz, 100000);
	ck_assert_int_eq(l->be->read_range(l, "step-1/h0-f0.shard", 99990, buf,
					   10, err),
			 0);
	ck_assert_int_eq(memcmp(buf, pat + 99990, 10), 0);
	ck_assert_int_ne(l->be->read_range(l, "step-1/h0-f0.shard", 99995, buf,
					   10, err),
			 0);
	ck_assert_msg(strstr(err, "h0-f0.shard"), "%s", err);
	ck_assert_int_eq(l->be->size(l, "step-1/nothing", &sz), -ENOENT);
	ck_assert_int_eq(l->be->get(l, "step-1/nothing", 100, &out, &len, err),
			 -ENOENT);

	/* list: objects with sizes and sub-prefixes, nothing deeper */
	ck_assert_int_eq(l->be->create(l, "step-1/sub/deep", "x", 1, err), 0);
	ck_assert_int_eq(l->be->list(l, "", ENG_LIST_SIZES, collect, w, err),
			 0);
	ck_assert_int_eq(w->n, 2);
	ck_assert_int_ge(find(w, "latest"), 0);
	ck_assert_int_eq(w->is_prefix[find(w, "step-1")], 1);
	w->n = 0;
	ck_assert_int_eq(
		l->be->list(l, "step-1/", ENG_LIST_SIZES, collect, w, err), 0);
	ck_assert_int_eq(w->n, 3);
	ck_assert_int_eq(w->size[find(w, "h0-f0.shard")], 100000);
	ck_assert_int_eq(w->is_prefix[find(w, "sub")], 1);
	ck_assert_int_eq(w->is_prefix[find(w, "COMMIT")], 0);
	w->n = 0;
	ck_assert_int_eq(l->be->list(l, "step-9", 0, collect, w, err),
			 CKPT_E_NOTFOUND);

	/* remove, sync, lock, remove_all */
	ck_assert_int_eq(l->be->remove(l, "latest", err), 0);
	ck_assert_int_eq(l->be->remove(l, "latest", err), -ENOENT);
	ck_assert_int_eq(l->be->sync(l, "step-1/", err), 0);
	int tok = l->be->lock(l);

	l->be->unlock(l, tok);
	ck_assert_int_eq(l->be->remove_all(l, "step-1/", &freed, err), 0);
	ck_assert_int_eq(freed, 5 + 100000 + 1);
	ck_assert_int_eq(l->be->size(l, "step-1/COMMIT", &sz), -ENOENT);
	ck_assert_int_eq(l->be->remove_all(l, "step-1/", &freed, err), 0);
	ck_assert_int_eq(freed, 0);
	free(pat);
	free(w);
	eng_loc_close(l);
}
END_TEST

/* Two processes create one COMMIT at once: exactly one wins. */
START_TEST(create_race)
{
	for (int round = 0; round < 8; round++) {
		char key[64];
		int pipefd[2], wins = 0, exists = 0;
		pid_t pid[2];

		snprintf(key, sizeof(key), "step-%d/COMMIT", round);
		ck_assert_int_eq(pipe(pipefd), 0);
		for (int i = 0; i < 2; i++) {
			pid[i] = fork();
			ck_assert_int_ge(pid[i], 0);
			if (pid[i] == 0) {
				eng_loc *l = open_loc("race");
				char c, err[ENG_ERRMSG_MAX];
				int r;

				close(pipefd[1]);
				/* start together: wait for the pipe to close */
				while (read(pipefd[0], &c, 1) > 0)
					;
				r = l->be->create(l, key, i ? "B" : "A", 1,
						  err);
				eng_loc_close(l);
				_exit(r == 0 ? 0 : r == CKPT_E_EXISTS ? 1 : 2);
			}
		}
		close(pipefd[0]);
		close(pipefd[1]);
		for (int i = 0; i < 2; i++) {
			int st;

			ck_assert_int_eq(waitpid(pid[i], &st, 0), pid[i]);
			ck_assert(WIFEXITED(st));
			wins += WEXITSTATUS(st) == 0;
			exists += WEXITSTATUS(st) == 1;
		}
		ck_assert_int_eq(wins, 1);
		ck_assert_int_eq(exists, 1);
	}
}
END_TEST

/* More step prefixes than one list page (1000) holds. */
START_TEST(list_pages)
{
	struct gcs_config cfg = { 0 };
	struct gcs_client *c;
	eng_loc *l = open_loc("many");
	char err[ENG_ERRMSG_MAX] = "";
	struct names *w = calloc(1, sizeof(*w));
	enum { N = 1234 };

	cfg.endpoint = srv.url;
	ck_assert_int_eq(gcs_client_new(&c, &cfg), 0);
	for (int i = 0; i < N; i++) {
		char name[64];

		snprintf(name, sizeof(name), "many/step-%05d/COMMIT", i);
		ck_assert_int_eq(
			gcs_put(c, BUCKET, name, "c", 1, GCS_NO_COND, NULL), 0);
	}
	ck_assert_int_eq(gcs_put(c, BUCKET, "many/latest", "7", 1, GCS_NO_COND,
				 NULL),
			 0);
	gcs_client_free(c);
	ck_assert_int_eq(l->be->list(l, "", 0, collect, w, err), 0);
	ck_assert_int_eq(w->n, N + 1);
	for (int i = 0; i < N; i++) {
		char name[64];
		int k;

		snprintf(name, sizeof(name), "step-%05d", i);
		k = find(w, name);
		ck_assert_int_ge(k, 0);
		ck_assert_int_eq(w->is_prefix[k], 1);
	}
	free(w);
	eng_loc_close(l);
}
END_TEST

/* The file of the live object `name` in the fake's data directory. */
static void corrupt_object(const char *name)
{
	struct gcs_config cfg = { 0 };
	struct gcs_object o = { 0 };
	struct gcs_client *c;
	char dir[300], path[600], pre[32];
	struct dirent *de;
	DIR *d;
	int fd, found = 0;
	unsigned char b;

	cfg.endpoint = srv.url;
	ck_assert_int_eq(gcs_client_new(&c, &cfg), 0);
	ck_assert_int_eq(gcs_stat(c, BUCKET, name, &o), 0);
	snprintf(pre, sizeof(pre), "%lld-", (long long)o.generation);
	snprintf(dir, sizeof(dir), "%s/objects", datadir);
	d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	while ((de = readdir(d)) != NULL) {
		if (strncmp(de->d_name, pre, strlen(pre)))
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
		fd = open(path, O_RDWR);
		ck_assert_int_ge(fd, 0);
		ck_assert_int_eq(pread(fd, &b, 1, 0), 1);
		b ^= 0x40;
		ck_assert_int_eq(pwrite(fd, &b, 1, 0), 1);
		close(fd);
		found = 1;
	}
	closedir(d);
	ck_assert(found);
	gcs_object_clear(&o);
	gcs_client_free(c);
}

START_TEST(hostile_crc)
{
	eng_loc *l = open_loc("bad");
	char err[ENG_ERRMSG_MAX] = "";
	uint8_t *out = (uint8_t *)1;
	size_t len = 7;

	ck_assert_int_eq(
		l->be->create(l, "step-1/h0.index", "index bytes", 11, err), 0);
	corrupt_object("bad/step-1/h0.index");
	ck_assert_int_eq(l->be->get(l, "step-1/h0.index", 100, &out, &len, err),
			 CKPT_E_CORRUPT);
	ck_assert_ptr_null(out);
	ck_assert_int_eq(len, 0);
	ck_assert_msg(strstr(err, "step-1/h0.index") && strstr(err, "crc32c"),
		      "%s", err);
	/* through the engine's own document reader, as reader_open does */
	ck_assert_int_eq(eng_get_doc("gs://" BUCKET "/bad", "step-1",
				     "h0.index", 100, &out, &len, err),
			 CKPT_E_CORRUPT);
	ck_assert_ptr_null(out);
	eng_loc_close(l);
}
END_TEST

/* A bucket that does not exist: -ENOENT naming it. */
START_TEST(missing_bucket)
{
	eng_loc *l = NULL;
	char err[ENG_ERRMSG_MAX] = "";
	uint8_t *out = NULL;
	size_t len;

	ck_assert_int_eq(eng_loc_open("gs://no-such-bucket/x", &l, err), 0);
	ck_assert_int_eq(l->be->get(l, "latest", 100, &out, &len, err),
			 -ENOENT);
	ck_assert_msg(strstr(err, "no-such-bucket"), "%s", err);
	eng_loc_close(l);
}
END_TEST

static Suite *backend_suite(void)
{
	Suite *s = suite_create("gcs_backend");
	TCase *tc = tu_tcase("backend", 120);

	tcase_add_test(tc, every_op);
	tcase_add_test(tc, create_race);
	tcase_add_test(tc, list_pages);
	tcase_add_test(tc, hostile_crc);
	tcase_add_test(tc, missing_bucket);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	const char *extra[3] = { "--data-dir", datadir, NULL };
	int rc;

	snprintf(datadir, sizeof(datadir), "%s/gcs-back-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(datadir))
		return 99;
	gt_server_start_args(&srv, BUCKET, extra);
	setenv("STORAGE_EMULATOR_HOST", srv.url, 1);
	rc = tu_main(backend_suite());
	tu_server_stop(&srv);
	tu_rm_rf(datadir);
	return rc;
}
