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

static ckpt *open_both(const char *dir)
{
	ckpt_settings s;
	ckpt *c = NULL;

	ckpt_settings_default(&s);
	s.staging_bytes = 16u << 20;
	s.chunk_bytes = 1u << 20;
	s.threads = 1;
	s.codec = CKPT_CODEC_NONE;
	s.remote = REMOTE;
	if (ckpt_open(&c, dir, &s) < 0) {
		fprintf(stderr, "ckpt_open: %s\n", ckpt_errmsg(NULL));
		_exit(2);
	}
	return c;
}

static void child_save(const char *dir, uint64_t step)
{
	ckpt *c = open_both(dir);
	tu_set set;
	uint64_t shape[1] = { (12u << 20) / 4 + step };

	tu_set_init(&set);
	tu_set_add(&set, "w", CKPT_F32, 1, shape, step);
	shape[0] = (6u << 20) / 4 + 7;
	tu_set_add(&set, "b", CKPT_F32, 1, shape, step + 1000);
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

int main(void)
{
	const TTest *const tests[] = { kill_and_resume };

	return gk_main(BUCKET, "gcs_resume", 900, tests,
		       sizeof(tests) / sizeof(tests[0]));
}
