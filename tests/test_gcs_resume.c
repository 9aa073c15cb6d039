/*
 * test_gcs_resume.c - an uploading process killed at random moments and
 * restarted: the upload resumes from the journal (DIR/.upload) and the
 * step commits in the bucket; nothing committed is ever incomplete.
 *
 * Each round forks a child that saves one step to DIR and gs:// ("both")
 * and waits for the upload; the parent kills it with SIGKILL after a
 * random delay (within the time a whole run takes), then forks a second child that only opens the handle on
 * DIR (which resumes what the journal lists) and waits for the uploads.
 * The parent then checks, with its own client: a step committed locally is
 * committed in the bucket, its objects equal the local files, and every
 * step committed in the bucket is complete by its indexes; no journal is
 * left. Rounds: CKPT_GCS_RESUME_ROUNDS (default 30). The count of rounds
 * that really resumed something is printed, not asserted (timing).
 * close_silent: a close while the bucket does not answer, then a resume.
 */
#include "test_gcs_ckpt.h"
#include "test_gcs_util.h"
#include "testutil.h"

#include "ckpt.h"
#include "fmt.h"
#include "gcs.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BUCKET "ckpt-resume"
#define REMOTE "gs://" BUCKET "/run"

static ckpt *open_at(const char *dir, const char *remote)
{
	ckpt_settings s;
	ckpt *c = NULL;

	ckpt_settings_default(&s);
	s.staging_bytes = 16u << 20;
	s.chunk_bytes = 1u << 20;
	s.threads = 1;
	s.codec = CKPT_CODEC_NONE;
	s.remote = remote;
	if (ckpt_open(&c, dir, &s) < 0) {
		fprintf(stderr, "ckpt_open: %s\n", ckpt_errmsg(NULL));
		_exit(2);
	}
	return c;
}

static ckpt *open_both(const char *dir)
{
	return open_at(dir, REMOTE);
}

static void make_set(tu_set *set, uint64_t step)
{
	uint64_t shape[1] = { (12u << 20) / 4 + step };

	tu_set_init(set);
	tu_set_add(set, "w", CKPT_F32, 1, shape, step);
	shape[0] = (6u << 20) / 4 + 7;
	tu_set_add(set, "b", CKPT_F32, 1, shape, step + 1000);
}

static void child_save(const char *dir, uint64_t step)
{
	ckpt *c = open_both(dir);
	tu_set set;

	make_set(&set, step);
	if (tu_save(c, step, &set) < 0 || ckpt_upload_wait(c, -1) < 0)
		_exit(3);
	ckpt_close(c);
	_exit(0);
}

static void child_resume(const char *dir)
{
	ckpt *c = open_both(dir);
	int r = ckpt_upload_wait(c, -1);

	if (r < 0)
		fprintf(stderr, "resume: %s\n", ckpt_errmsg(c));
	ckpt_close(c);
	_exit(r < 0 ? 4 : 0);
}

static int run(void (*fn)(const char *, uint64_t), const char *dir,
	       uint64_t step, long kill_after_us)
{
	pid_t p = fork();
	int st = 0;

	ck_assert_int_ge(p, 0);
	if (p == 0)
		fn(dir, step);
	if (kill_after_us >= 0) {
		usleep((useconds_t)kill_after_us);
		kill(p, SIGKILL);
	}
	ck_assert_int_eq(waitpid(p, &st, 0), p);
	return st;
}

static void resume_fn(const char *dir, uint64_t step)
{
	(void)step;
	child_resume(dir);
}

static int journal_count(const char *dir)
{
	char *jd = tu_path("%s/.upload", dir);
	DIR *d = opendir(jd);
	struct dirent *e;
	int n = 0;

	free(jd);
	while (d && (e = readdir(d)))
		n += strstr(e->d_name, ".journal") != NULL &&
		     !strstr(e->d_name, ".tmp");
	if (d)
		closedir(d);
	return n;
}

START_TEST(kill_and_resume)
{
	const char *e = getenv("CKPT_GCS_RESUME_ROUNDS");
	int rounds = e && atoi(e) > 0 ? atoi(e) : 30, i, resumed = 0,
	    committed = 0;
	char *dir = tu_path("%s/res", tu_tmpdir());
	struct gcs_client *gc = gk_client(gk_srv.url);
	struct timespec t0, t1;
	long span_us;
	tu_rng rng;

	tu_rng_seed(&rng, (uint64_t)time(NULL));
	/* step 1 unkilled: how long a whole run takes here, so the kills
	 * fall anywhere in it (sampling only: nothing is timed) */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	ck_assert_int_eq(run(child_save, dir, 1, -1), 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	span_us = (t1.tv_sec - t0.tv_sec) * 1000000L +
		  (t1.tv_nsec - t0.tv_nsec) / 1000 + 1;
	for (i = 1; i < rounds; i++) {
		uint64_t step = (uint64_t)i + 1, s;
		char why[512], dn[32], *lc, *obj;
		int st;

		run(child_save, dir, step,
		    (long)tu_rng_below(&rng, (uint64_t)span_us));
		/* a journal exists from the start of each save */
		resumed += journal_count(dir) > 0;
		st = run(resume_fn, dir, 0, -1);
		ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
			      "round %d: the restarted process failed (%d)", i,
			      st);
		ck_assert_int_eq(journal_count(dir), 0);
		fmt_step_dirname(step, dn);
		lc = tu_path("%s/%s/COMMIT", dir, dn);
		obj = gk_object("run", step, "COMMIT");
		if (access(lc, F_OK) == 0) {
			ck_assert_msg(gk_exists(gc, BUCKET, obj) == 1,
				      "round %d: committed locally, not in "
				      "the bucket",
				      i);
			ck_assert_msg(gk_same_as_local(gc, BUCKET, "run", dir,
						       step, 0, why,
						       sizeof(why)) == 0,
				      "round %d: %s", i, why);
			committed++;
		}
		/* nothing committed in the bucket is incomplete */
		for (s = 1; s <= step; s++) {
			char *o = gk_object("run", s, "COMMIT");

			if (gk_exists(gc, BUCKET, o) == 1)
				ck_assert_msg(gk_step_complete(
						      gc, BUCKET, "run", s, 1,
						      why, sizeof(why)) == 0,
					      "round %d step %" PRIu64 ": %s",
					      i, s, why);
			free(o);
		}
		free(lc);
		free(obj);
	}
	printf("kill/resume: %d rounds, %d killed with a journal left, %d "
	       "steps committed locally and in the bucket\n",
	       rounds, resumed, committed);
	gcs_client_free(gc);
	free(dir);
}
END_TEST

/* 1 if step's journal in dir records an error. */
static int journal_error(const char *dir, uint64_t step)
{
	char *p = tu_path("%s/.upload/step-%" PRIu64 ".journal", dir, step);
	char buf[8192];
	FILE *f = fopen(p, "r");
	size_t n;

	ck_assert_msg(f, "%s: %s", p, strerror(errno));
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	free(p);
	return strstr(buf, "\"error\"") != NULL;
}

/*
 * A bucket that stops answering (the fake's "silent" rule holds every
 * request about the object) while the upload commits a step: ckpt_close
 * returns at once rather than wait out the operation's deadline (600 s by
 * default), the step stays journaled with no error recorded, and the next
 * ckpt_open commits it once the bucket answers again. Once on the host
 * index (put by the upload's own client), once on COMMIT (the bucket
 * commit's client).
 */
START_TEST(close_silent)
{
	static const char *const match[] = { "h00000.index", "COMMIT" };
	struct gcs_client *gc = gk_client(gk_srv.url);
	char why[512];

	for (unsigned k = 0; k < 2; k++) {
		char *dir = tu_path("%s/silent%u", tu_tmpdir(), k);
		char *remote = tu_path("gs://" BUCKET "/silent%u", k);
		char *prefix = tu_path("silent%u", k);
		char *obj = gk_object(prefix, 1, "COMMIT");
		double t0;
		tu_set set;
		ckpt *c;

		gt_rule(gk_srv.url, "silent", match[k]);
		c = open_at(dir, remote);
		make_set(&set, 1);
		ck_assert_int_eq(tu_save(c, 1, &set), 0);
		t0 = tu_now_s();
		while (gt_rules_fired(gk_srv.url) == 0) {
			ck_assert_msg(tu_now_s() - t0 < 120,
				      "%s: the upload never got there",
				      match[k]);
			usleep(20 * 1000);
		}
		t0 = tu_now_s();
		ckpt_close(c);
		ck_assert_msg(tu_now_s() - t0 < 30,
			      "%s: ckpt_close took %.0f s", match[k],
			      tu_now_s() - t0);
		ck_assert_int_eq(journal_count(dir), 1);
		ck_assert_msg(!journal_error(dir, 1),
			      "%s: the close is recorded as a failure",
			      match[k]);
		gt_rules_clear(gk_srv.url);
		ck_assert_int_eq(gk_exists(gc, BUCKET, obj), 0);
		c = open_at(dir, remote);
		ck_assert_msg(ckpt_upload_wait(c, 120000) == 0, "%s",
			      ckpt_errmsg(c));
		ck_assert_int_eq(ckpt_close(c), 0);
		ck_assert_int_eq(journal_count(dir), 0);
		ck_assert_int_eq(gk_exists(gc, BUCKET, obj), 1);
		ck_assert_msg(gk_same_as_local(gc, BUCKET, prefix, dir, 1, 0,
					       why, sizeof(why)) == 0,
			      "%s", why);
		tu_set_free(&set);
		free(obj);
		free(prefix);
		free(remote);
		free(dir);
	}
	gcs_client_free(gc);
}
END_TEST

int main(void)
{
	const TTest *const tests[] = { kill_and_resume, close_silent };

	return gk_main(BUCKET, "gcs_resume", 900, tests,
		       sizeof(tests) / sizeof(tests[0]));
}
